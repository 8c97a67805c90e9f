#!/usr/bin/env bash
# Truncated reference clips: a WAV cut mid-data or mid-header fails before generation (exit 1, the
# failure status for a bad file: docs/cli.md), naming the reference and the declared vs present
# bytes, and publishes nothing (`drama codec encode` too); a streamed WAV (0xFFFFFFFF sizes) and
# one with a trailing LIST chunk are accepted.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"
N=4

synth voice.wav --frames 22 --seed 9
[ $rc -eq 0 ] || fail "making the reference clip failed: $(cat last.err)"
size=$(stat -c %s voice.wav)

bad_ref() { # label file needle
    local label=$1 file=$2 needle=$3
    set +e
    "$DRAMA_BIN" synthesize --model "$MODEL" --text "$TEXT" -o bad.wav --frames $N --seed 3 \
        --reference "$file" --reference-text "Hello." --progress-json 2>bad.log
    local r=$?
    set -e
    [ $r -eq 1 ] || fail "$label: exit $r, expected 1: $(tail -1 bad.log)"
    [ ! -e bad.wav ] || fail "$label: output published"
    grep -q "reference 0" bad.log || fail "$label: message does not name the reference: $(tail -1 bad.log)"
    grep -q "$file" bad.log || fail "$label: message does not name the file: $(tail -1 bad.log)"
    grep -q "$needle" bad.log || fail "$label: '$needle' not in: $(tail -1 bad.log)"
    if grep -q '"phase":"generate"' bad.log; then fail "$label: generation started"; fi
    ok "$label: $(grep -v '^{' bad.log | tail -1)"
}
head -c $((size - 100)) voice.wav > middata.wav
bad_ref "cut mid-data" middata.wav "bytes of audio but the file holds only"
head -c 30 voice.wav > midheader.wav
bad_ref "cut mid-header" midheader.wav "header declares $size bytes but the file has 30"
# the old e2e corrupt clip: 60 header bytes then noise
{ head -c 60 voice.wav; head -c 3000 /dev/zero | tr '\0' '\1'; } > noisy.wav
bad_ref "header + foreign bytes" noisy.wav "truncated"

# the same clip through `drama codec encode`: exit 1, the file named, no CODES.json
set +e
"$DRAMA_BIN" codec encode --codec "$MODEL" middata.wav -o enc.json 2>enc.log
r=$?
set -e
[ $r -eq 1 ] || fail "codec encode of a cut WAV: exit $r, expected 1"
[ ! -e enc.json ] || fail "codec encode of a cut WAV published enc.json"
grep -q "middata.wav: the 'data' chunk" enc.log || fail "codec encode message: $(tail -1 enc.log)"
ok "codec encode of a cut WAV: $(tail -1 enc.log)"

le32() { local n=$1; printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8 & 255)))\\x$(printf %02x $((n >> 16 & 255)))\\x$(printf %02x $((n >> 24 & 255)))"; }
# a LIST INFO chunk after the data (tag editors add them), RIFF size updated
cp voice.wav list.wav
printf 'LIST\x12\x00\x00\x00INFOISFT\x06\x00\x00\x00drama\x00' >> list.wav
le32 $((size + 26 - 8)) | dd of=list.wav bs=1 seek=4 conv=notrunc status=none
synth list-out.wav --frames $N --seed 3 --reference list.wav --reference-text "Hello there."
[ $rc -eq 0 ] || fail "WAV with a trailing LIST chunk refused: $(cat last.err)"
synth plain-ref.wav --frames $N --seed 3 --reference voice.wav --reference-text "Hello there."
cmp -s list-out.wav plain-ref.wav || fail "the LIST chunk changed the result"
ok "trailing LIST chunk accepted, same audio"

# a WAV written to a pipe by a streaming writer carries 0xFFFFFFFF sizes ("up to the end of the file")
data_at=$(LC_ALL=C grep -obUa data voice.wav | head -1 | cut -d: -f1)
[ "$data_at" -ge 12 ] || fail "no data chunk in voice.wav"
cp voice.wav stream.wav
printf '\xff\xff\xff\xff' | dd of=stream.wav bs=1 seek=4 conv=notrunc status=none
printf '\xff\xff\xff\xff' | dd of=stream.wav bs=1 seek=$((data_at + 4)) conv=notrunc status=none
synth stream-out.wav --frames $N --seed 3 --reference stream.wav --reference-text "Hello there."
[ $rc -eq 0 ] || fail "streamed WAV (unknown sizes) refused: $(cat last.err)"
cmp -s stream-out.wav plain-ref.wav || fail "the streamed reference gave other audio than the same clip with sizes"
ok "streamed WAV with 0xFFFFFFFF sizes accepted, same audio as the file"
no_leftovers "$WORK"
echo PASS
