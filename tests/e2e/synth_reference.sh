#!/usr/bin/env bash
# Reference voices: a WAV reference is encoded and used (prompt grows, audio changes), CODES.json
# references work, guidance runs; corrupt, truncated, empty and non-audio references fail with a clear error
# before any generation; out-of-range reference codes are rejected.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"
N=6

# A reference clip: 1 s of audio made by the engine itself (any WAV works).
synth voice.wav --frames 22 --seed 9 --save-codes voice.codes.json
[ $rc -eq 0 ] || fail "making the reference clip failed: $(cat last.err)"

synth plain.wav --frames $N --seed 3 --receipt plain.json
[ $rc -eq 0 ] || fail "plain run failed: $(cat last.err)"
synth ref.wav --frames $N --seed 3 --reference voice.wav --reference-text "Hello there." --receipt ref.json
[ $rc -eq 0 ] || fail "WAV reference run failed: $(cat last.err)"
p0=$(jq .prompt_tokens plain.json); p1=$(jq .prompt_tokens ref.json)
[ "$p1" -ge $((p0 + 22)) ] || fail "reference frames not in the prompt ($p0 -> $p1 rows)"
jq -e '.phases.encode.wall_s' ref.json >/dev/null || fail "no encode phase in the receipt"
if cmp -s plain.wav ref.wav; then fail "the reference did not change the audio"; fi
ok "WAV reference encoded and used: prompt $p0 -> $p1 rows, audio differs"

synth refc.wav --frames $N --seed 3 --reference-codes voice.codes.json --reference-text "Hello there."
[ $rc -eq 0 ] || fail "CODES.json reference failed: $(cat last.err)"
ok "CODES.json reference accepted"

synth g.wav --frames $N --seed 3 --reference voice.wav --reference-text "Hello there." --cfg-gamma 1.5 --stream
[ $rc -eq 0 ] || fail "guided run failed: $(cat last.err)"
synth g2.wav --frames $N --seed 3 --reference voice.wav --reference-text "Hello there." --cfg-gamma 1.5
cmp g.wav g2.wav || fail "guided stream != guided whole"
ok "guidance (--cfg-gamma 1.5) runs; stream = whole"

bad_ref() { # label file [flag]
    local label=$1 file=$2 flag=${3:---reference}
    set +e
    "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" -o bad.wav --frames $N --seed 3 \
        $flag "$file" --reference-text "Hello." --progress-json 2>bad.log
    local r=$?
    set -e
    [ $r -eq 1 ] || fail "$label reference: exit $r, expected 1"
    [ ! -e bad.wav ] || fail "$label reference: output published"
    grep -q "reference 0" bad.log || fail "$label reference: message does not name the reference: $(tail -1 bad.log)"
    grep -q "$(basename "$file")" bad.log || fail "$label reference: message does not name the file"
    if grep -q '"phase":"generate"' bad.log; then fail "$label reference: generation started"; fi
    ok "$label reference: $(grep -v '^{' bad.log | tail -1)"
}
: > empty.wav
bad_ref empty empty.wav
echo "this is not audio at all, just text" > notaudio.wav
bad_ref non-audio notaudio.wav
head -c 60 voice.wav > trunc.wav; head -c 3000 /dev/urandom >> trunc.wav # header claims 1 s, 3 KB follow
bad_ref truncated trunc.wav
printf 'RIFF\xff\xff\xff\xffWAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00' > corrupt.wav
bad_ref corrupt corrupt.wav
bad_ref missing "$WORK/does-not-exist.wav"
echo '{"codes": [[0,0,0,0,0,0,0,0,0,5000]]}' > range.codes.json
bad_ref out-of-range-codes range.codes.json --reference-codes
no_leftovers "$WORK"
echo PASS
