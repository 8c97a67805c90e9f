#!/usr/bin/env bash
# Failure paths publish nothing: the frame cap (exit 3, clear message), bad flags (exit 2 naming
# the flag), bad model directory, unwritable output, invalid text.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"

# The tiny random model never emits the end token, so without --frames it hits the cap.
synth cap.wav --max-frames 3 --seed 1 --receipt cap.json
[ $rc -eq 3 ] || fail "frame cap: exit $rc, expected 3: $(cat last.err)"
[ ! -e cap.wav ] || fail "frame cap: output published"
grep -qi "frame" last.err || fail "frame cap message unclear: $(cat last.err)"
[ "$(jq -r .finish_reason cap.json)" = frame_limit ] || fail "receipt finish_reason $(jq -r .finish_reason cap.json)"
no_leftovers "$WORK"
ok "frame cap: exit 3, no file ($(cat last.err))"
synth caps.wav --max-frames 6 --seed 1 --stream
[ $rc -eq 3 ] && [ ! -e caps.wav ] || fail "frame cap while streaming published a file (exit $rc)"
no_leftovers "$WORK"
ok "frame cap while streaming: exit 3, no file"

expect_usage() { # flag-substring, args...
    local want=$1; shift
    set +e
    "$DRAMA_BIN" synthesize "$@" 2>"$WORK/u.err"
    local r=$?
    set -e
    [ $r -eq 2 ] || fail "'$*': exit $r, expected 2"
    grep -q -- "$want" "$WORK/u.err" || fail "'$*': message does not name $want: $(cat "$WORK/u.err")"
}
expect_usage --temperature --model "$MODEL" --text hi -o x.wav --temperature 3
expect_usage --temperature --model "$MODEL" --text hi -o x.wav --temperature nan
expect_usage --top-p --model "$MODEL" --text hi -o x.wav --top-p 0
expect_usage --cfg-gamma --model "$MODEL" --text hi -o x.wav --cfg-gamma 6
expect_usage --seed --model "$MODEL" --text hi -o x.wav --seed 12x
expect_usage --max-frames --model "$MODEL" --text hi -o x.wav --max-frames 0
expect_usage --frames --model "$MODEL" --text hi -o x.wav --frames 10 --max-frames 5
expect_usage --speaker --model "$MODEL" --text hi -o x.wav --speaker 16
expect_usage --format --model "$MODEL" --text hi -o x.wav --format mp3
expect_usage --reference-text --model "$MODEL" --text hi -o x.wav --reference a.wav
expect_usage --model --text hi -o x.wav
expect_usage --text --model "$MODEL" -o x.wav
expect_usage --bogus --model "$MODEL" --text hi -o x.wav --bogus 1
expect_usage "same file" --model "$MODEL" --text hi -o x.wav --receipt x.wav
expect_usage "same file" --model "$MODEL" --text hi -o x.wav --save-codes c.json --receipt c.json
[ ! -e x.wav ] || fail "usage error wrote a file"
ok "bad flags: exit 2 naming the flag"

set +e
"$DRAMA_BIN" synthesize --model "$WORK/nope" --text hi -o x.wav 2>e1; r1=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text hi -o "$WORK/no/such/dir/x.wav" --frames 2 2>e2; r2=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text '<|im_end|> hi' -o x.wav --frames 2 2>e3; r3=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text '   ' -o x.wav --frames 2 2>e4; r4=$?
set -e
[ $r1 -eq 1 ] && grep -q nope e1 || fail "bad model dir: exit $r1: $(cat e1)"
[ $r2 -eq 1 ] && grep -q "no/such/dir" e2 || fail "bad output dir: exit $r2: $(cat e2)"
[ $r3 -eq 1 ] && grep -q reserved_token e3 || fail "reserved token: exit $r3: $(cat e3)"
[ $r4 -eq 1 ] && grep -q empty_text e4 || fail "empty text: exit $r4: $(cat e4)"
[ ! -e x.wav ] || fail "a failed run published x.wav"
no_leftovers "$WORK"
ok "bad model / output dir / reserved token / empty text: exit 1, clear message, no file"

# Side outputs are checked before any work: an unwritable --receipt / --save-codes path fails
# first (no generation, no audio published); a text file that cannot be read is named.
set +e
"$DRAMA_BIN" synthesize --model "$MODEL" --text hi -o x.wav --frames 2 --receipt "$WORK/no/dir/r.json" \
    --progress-json 2>e5; r5=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text hi -o x.wav --frames 2 --save-codes "$WORK/no/dir/c.json" \
    --progress-json 2>e6; r6=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text hi -o x.wav --frames 2 --receipt "$WORK" 2>e7; r7=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text-file "$WORK/none.txt" -o x.wav --frames 2 2>e8; r8=$?
set -e
[ $r5 -eq 1 ] && grep -q -- "--receipt.*no/dir" e5 || fail "bad --receipt folder: exit $r5: $(cat e5)"
[ $r6 -eq 1 ] && grep -q -- "--save-codes.*no/dir" e6 || fail "bad --save-codes folder: exit $r6: $(cat e6)"
[ $r7 -eq 1 ] && grep -q -- "--receipt.*directory" e7 || fail "--receipt naming a folder: exit $r7: $(cat e7)"
[ $r8 -eq 1 ] && grep -q -- "--text-file.*none.txt" e8 || fail "missing --text-file: exit $r8: $(cat e8)"
if grep -q '"event":"frames"' e5 e6; then fail "generation ran before the side-output check"; fi
[ ! -e x.wav ] || fail "a run with a bad side output published x.wav"
no_leftovers "$WORK"
ok "unwritable --receipt / --save-codes, missing --text-file: exit 1 before generation, no file"
echo PASS
