#!/usr/bin/env bash
# Long text: split into several batches (TEXT.md 4) with earlier batches kept in context; the
# frames of all batches form one audio stream (one codec stream), so --stream still equals the
# whole output; guidance across batches too. The random model never ends a batch by itself, so
# --frames-per-batch fixes each batch's length.
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"
LONG="Hello there, this is the first sentence. And here comes a second one, a bit longer than the first. Finally a third, to close."

set +e
"$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" --chunk-tokens 12 --frames-per-batch 3 --seed 3 -q \
    -o w.wav --receipt w.json 2>err.txt
r1=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" --chunk-tokens 12 --frames-per-batch 3 --seed 3 -q \
    -o s.wav --stream --stream-chunk-frames 2 2>>err.txt
r2=$?
"$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" --chunk-tokens 100000 --frames-per-batch 3 --seed 3 -q -o one.wav \
    --receipt one.json 2>>err.txt
r3=$?
set -e
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ] || fail "long text runs failed: $(cat err.txt)"
b=$(jq .batches w.json)
[ "$b" -ge 2 ] || fail "expected several batches with --chunk-tokens 12, got $b"
[ "$(jq .frames w.json)" -eq $((3 * b)) ] || fail "frames $(jq .frames w.json) != 3 x $b batches"
[ "$(jq .samples w.json)" -eq $((3 * b * $(jq .samples_per_frame w.json))) ] || fail "samples inconsistent"
cmp w.wav s.wav || fail "long text: --stream differs from whole"
[ "$(jq .batches one.json)" -eq 1 ] || fail "a huge budget should keep this text in one batch"
if cmp -s <(head -c $((44 + 6 * 2048 * 2)) w.wav | tail -c +45) <(head -c $((44 + 6 * 2048 * 2)) one.wav | tail -c +45); then
    fail "batching had no effect on the audio"
fi
ok "long text: $b batches x 3 frames, stream = whole; one batch with a huge budget"

# A small --context makes old batches leave the history (TEXT.md 4.6): still deterministic and
# stream = whole; the first batch (before any trimming) is unchanged, later audio differs.
for mode in "" --stream; do
    "$DRAMA_BIN" synthesize --model "$MODEL" --text "$LONG" --chunk-tokens 12 --frames-per-batch 3 --seed 3 -q \
        --context 60 -o "ctx$mode.wav" $mode || fail "--context 60 $mode failed"
done
cmp ctx.wav ctx--stream.wav || fail "--context 60: stream differs from whole"
first=$((44 + 3 * 2048 * 2))
cmp -s <(head -c $first ctx.wav | tail -c +45) <(head -c $first w.wav | tail -c +45) || fail "first batch changed by --context"
if cmp -s ctx.wav w.wav; then fail "--context 60 did not trim the history"; fi
ok "--context 60: history trimmed, deterministic, stream = whole, first batch unchanged"
echo PASS
