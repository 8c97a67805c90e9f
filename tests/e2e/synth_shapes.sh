#!/usr/bin/env bash
# Nothing in the pipeline is tied to the golden shape: other dimensions, shard layouts and expert
# formats synthesize, and stream = whole = low-memory still holds. A model whose codec does not
# match its frame width either works the same way or fails cleanly (never reads past a frame).
set -euo pipefail
. "$(dirname "$0")/synth_lib.bash"
cd "$WORK"

run_shape() { # label, make-model flags...
    local label=$1; shift
    local dir="$WORK/m-$label"
    "$DRAMA_BIN" make-model "$dir" --shape custom --seed 11 "$@" >/dev/null 2>mm.err || fail "$label: make-model: $(cat mm.err)"
    local t="Other shapes, other seeds."
    set +e
    "$DRAMA_BIN" synthesize --model "$dir" --text "$t" --frames 7 --seed 5 -q -o "$label-w.wav" 2>"$label.err"
    local r=$?
    set -e
    if [ $r -ne 0 ]; then
        echo "$label: failed with exit $r: $(cat "$label.err")"
        [ $r -eq 1 ] || fail "$label: exit $r"
        [ ! -e "$label-w.wav" ] || fail "$label: failed run published a file"
        return 1
    fi
    "$DRAMA_BIN" synthesize --model "$dir" --text "$t" --frames 7 --seed 5 -q -o "$label-s.wav" --stream \
        --stream-chunk-frames 2 --threads 1 || fail "$label: stream run failed"
    "$DRAMA_BIN" synthesize --model "$dir" --text "$t" --frames 7 --seed 5 -q -o "$label-l.wav" --low-memory \
        || fail "$label: low-memory run failed"
    cmp "$label-w.wav" "$label-s.wav" && cmp "$label-w.wav" "$label-l.wav" || fail "$label: stream/low-memory differ"
    return 0
}
run_shape narrow --hidden 96 --heads 3 --kv-heads 1 --layers 5 --full-attention-interval 5 --tower-dim 48 \
    --num-experts 6 --top-k 2 --shards 3 || fail "narrow shape failed"
ok "hidden 96, 5 layers, 6 experts, 3 shards: whole = stream(2) = low-memory"
run_shape fp8 --experts fp8 --shards 2 || fail "fp8 experts failed"
run_shape fused --layout fused || fail "fused experts failed"
ok "fp8 experts, fused bf16 experts: whole = stream(2) = low-memory"
run_shape books6 --codebooks 6 || fail "6 codebooks failed (make-model must write a matching codec)"
ok "6 codebooks: whole = stream(2) = low-memory"
# A codec that disagrees with the model (the 10-codebook codec of another model) fails before generation,
# also with --low-memory, which loads the decoder only after generation.
cp "$WORK/m-narrow/codec.safetensors" "$WORK/m-narrow/codec.json" "$WORK/m-books6/"
set +e
"$DRAMA_BIN" synthesize --model "$WORK/m-books6" --text "Other shapes." --frames 7 --seed 5 -o b6.wav -q 2>b6.err
r=$?
"$DRAMA_BIN" synthesize --model "$WORK/m-books6" --text "Other shapes." --frames 7 --seed 5 -o b6l.wav \
    --low-memory --progress-json --receipt b6l.json 2>b6l.log
rl=$?
set -e
[ $r -eq 1 ] && [ ! -e b6.wav ] || fail "books6 mismatched codec: exit $r or a file was published"
grep -q codebooks b6.err || fail "codebook mismatch message unclear: $(cat b6.err)"
[ $rl -eq 1 ] && [ ! -e b6l.wav ] || fail "books6 --low-memory: exit $rl or a file was published"
grep -q codebooks b6l.log || fail "books6 --low-memory: message does not name the codebooks"
if grep -q '"event":"frames"' b6l.log; then fail "books6 --low-memory: generation ran before the codec check"; fi
[ "$(jq -r .finish_reason b6l.json)" = error ] || fail "books6 --low-memory: finish_reason $(jq -r .finish_reason b6l.json)"
ok "6-codebook model with a 10-codebook codec: clean error naming the codebooks"
no_leftovers "$WORK"
echo PASS
