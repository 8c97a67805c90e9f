#!/usr/bin/env bash
# drama make-model: every expert format, layout, pruning and sharding loads (drama inspect exit 0,
# no finding, the expected layout/format on every layer); the same seed gives identical files
# (sha256), another seed different weights; bad options fail with a message naming the flag;
# the `make demo` commands work.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
# a shape that is not the golden one: non-square experts, 6 layers with attention every 3rd
DIMS="--shape custom --hidden 96 --layers 6 --full-attention-interval 3 --num-experts 8 --top-k 2 --moe-inter 64 --shared-inter 32 --head-dim 32 --tower-dim 48 --tower-inter 80"

gen_check() { # name want-layout-regex make-model-args...
    local name=$1 want=$2
    shift 2
    "$DRAMA_BIN" make-model "$T/$name" $DIMS "$@" > "$T/$name.make" 2>&1 || { bad "$name: make-model: $(cat "$T/$name.make")"; return; }
    "$DRAMA_BIN" inspect "$T/$name" > "$T/$name.out" 2>&1 || { bad "$name: inspect exit non-zero"; sed -n '/^## findings/,$p' "$T/$name.out"; return; }
    grep -q '^LOADABLE: 0 fatal findings$' "$T/$name.out" || bad "$name: not loadable"
    grep -qx '(tensors: 0 missing, 0 mis-shaped, 0 unsupported, 0 incomplete, 0 unexpected, 0 ignored)' "$T/$name.out" || bad "$name: findings"
    local n
    n=$(grep -cE "^  - [0-9]+: (linear|full)_attention, $want\$" "$T/$name.out")
    [ "$n" -eq 6 ] || bad "$name: layout '$want' on $n of 6 layers"
    grep -q '^- codec loads: ' "$T/$name.out" || bad "$name: codec does not load"
    echo "$name: loadable, '$want' on all 6 layers"
}

gen_check bf16 'per-expert, 8/8, BF16' --seed 5
gen_check fp8 'per-expert, 8/8, block FP8 128x128' --seed 5 --experts fp8 --threads 3
gen_check nvfp4 'per-expert, 8/8, NVFP4' --seed 5 --experts nvfp4
gen_check q4 'per-expert, 8/8, affine 4-bit group 64' --seed 5 --experts q4 --hidden 128
gen_check q4g32 'per-expert, 8/8, affine 4-bit group 32' --seed 5 --experts q4 --q4-group 32
gen_check fused 'fused, 8/8, BF16' --seed 5 --layout fused
gen_check pruned 'per-expert, 3/8, BF16' --seed 5 --prune 3 --shards 4
gen_check fusedpruned 'fused, 4/8, BF16' --seed 5 --prune 4 --layout fused --shards 1

grep -q '^- drama_experts: {"0":\[' "$T/pruned.out" || bad "pruned: drama_experts not in the index"
[ "$(ls "$T"/pruned/model-0000?-of-00004.safetensors | wc -l)" -eq 4 ] || bad "pruned: not 4 shards"
grep -q '"quant_method": "fp8"' "$T/fp8/config.json" || bad "fp8: quantization_config missing"
[ -f "$T/nvfp4/hf_quant_config.json" ] || bad "nvfp4: hf_quant_config.json missing"

# determinism: same seed -> identical files (3 threads vs 1); another seed -> other weights
"$DRAMA_BIN" make-model "$T/fp8b" $DIMS --seed 5 --experts fp8 --threads 1 > /dev/null 2>&1 || bad "fp8b: make-model"
(cd "$T/fp8" && sha256sum * | sort) > "$T/fp8.sha"
(cd "$T/fp8b" && sha256sum * | sort) > "$T/fp8b.sha"
diff "$T/fp8.sha" "$T/fp8b.sha" > /dev/null || { bad "same seed gave different files"; diff "$T/fp8.sha" "$T/fp8b.sha"; }
"$DRAMA_BIN" make-model "$T/fp8c" $DIMS --seed 6 --experts fp8 > /dev/null 2>&1 || bad "fp8c: make-model"
cmp -s "$T/fp8/model-00002-of-00002.safetensors" "$T/fp8c/model-00002-of-00002.safetensors" && bad "another seed gave the same experts"
echo "same seed: $(wc -l < "$T/fp8.sha") files identical (sha256)"

# --expert-fill direct: random stored codes load in every format, are the same for any thread
# count, differ from the encoder's, and run (a frame step with non-finite logits would fail)
for f in fp8 nvfp4 q4; do
    gen_check direct-$f "per-expert, 8/8, $(case $f in fp8) echo 'block FP8 128x128';; nvfp4) echo NVFP4;; q4) echo 'affine 4-bit group 64';; esac)" \
        --seed 5 --experts $f --expert-fill direct --threads 3 --hidden 128
    "$DRAMA_BIN" make-model "$T/direct-$f-1" $DIMS --seed 5 --experts $f --expert-fill direct --threads 1 --hidden 128 \
        > /dev/null 2>&1 || bad "direct-$f-1: make-model"
    cmp -s "$T/direct-$f/model-00002-of-00002.safetensors" "$T/direct-$f-1/model-00002-of-00002.safetensors" ||
        bad "direct $f: 3 threads and 1 thread gave different experts"
    printf '{"rows": [[40,0,0,0,0,0,0,0,0,0,0],[41,0,0,0,0,0,0,0,0,0,0]], "prefill": 2}' > "$T/rows.json"
    "$DRAMA_BIN" generate --model "$T/direct-$f" --rows "$T/rows.json" --frames 4 --seed 1 --backend cpu \
        --codes-out "$T/direct-$f.codes" > "$T/direct-$f.gen" 2>&1 || bad "direct $f: generate: $(cat "$T/direct-$f.gen")"
done
"$DRAMA_BIN" make-model "$T/encode-fp8" $DIMS --seed 5 --experts fp8 --hidden 128 > /dev/null 2>&1 || bad "encode-fp8: make-model"
cmp -s "$T/direct-fp8/model-00002-of-00002.safetensors" "$T/encode-fp8/model-00002-of-00002.safetensors" &&
    bad "--expert-fill direct gave the encoder's experts"
echo "expert-fill direct: fp8, nvfp4, q4 load, thread-count independent, generate runs"

# bad options name the flag and exit 2
check_bad() { # want-substring args...
    local want=$1
    shift
    "$DRAMA_BIN" make-model "$T/bad" "$@" > "$T/bad.out" 2>&1
    local rc=$?
    [ $rc -eq 2 ] || bad "make-model $*: exit $rc, expected 2"
    grep -q -- "$want" "$T/bad.out" || bad "make-model $*: message lacks '$want': $(cat "$T/bad.out")"
    [ -z "$(ls -A "$T/bad" 2>/dev/null)" ] || bad "make-model $*: left files behind: $(ls -A "$T/bad")"
}
check_bad '--prune' --prune 1
check_bad '--q4-group' --experts q4 --q4-group 48
check_bad '--experts' --experts int3
check_bad '--expert-fill' --expert-fill random
check_bad '--layout' --layout fused --experts nvfp4
check_bad '--shape' --shape enormous
check_bad '--top-k' --top-k 99
check_bad 'unknown option' --frobnicate 1
check_bad '--partial-rotary' --partial-rotary 1e-300
check_bad '--partial-rotary' --partial-rotary nan
check_bad '--codebooks' --codebooks 16
# failures found while writing (after the options were accepted) leave nothing behind either
check_bad '--shards 50' --num-experts 2 --top-k 2 --shards 50
check_bad '--test-omit' --test-omit no.such.tensor

# a failed run into an existing model leaves it intact; a rerun replaces the generated files
"$DRAMA_BIN" make-model "$T/keep" --experts nvfp4 --shards 3 > /dev/null 2>&1 || bad "keep: make-model"
(cd "$T/keep" && sha256sum * | sort) > "$T/keep.sha"
"$DRAMA_BIN" make-model "$T/keep" --num-experts 2 --top-k 2 --shards 50 > /dev/null 2>&1 && bad "keep: bad run succeeded"
(cd "$T/keep" && sha256sum * | sort) | diff -q - "$T/keep.sha" > /dev/null || bad "keep: a failed run changed the model"
[ -z "$(ls -A "$T/keep" | grep partial)" ] || bad "keep: staging folder left behind"
"$DRAMA_BIN" make-model "$T/keep" --shards 2 > /dev/null 2>&1 || bad "keep: rerun"
[ ! -e "$T/keep/hf_quant_config.json" ] && [ ! -e "$T/keep/model-00003-of-00003.safetensors" ] || bad "keep: stale files of the earlier run"
"$DRAMA_BIN" inspect "$T/keep" > /dev/null 2>&1 || bad "keep: rerun not loadable"

# a link planted where the staging folder goes is removed, never followed
mkdir -p "$T/victim" "$T/planted" && echo precious > "$T/victim/keep.txt"
ln -s "$T/victim" "$T/planted/.make-model.partial"
"$DRAMA_BIN" make-model "$T/planted" > /dev/null 2>&1 || bad "planted: make-model"
[ -f "$T/victim/keep.txt" ] && [ "$(ls -A "$T/victim")" = keep.txt ] || bad "planted: the link target was changed"
[ -f "$T/planted/config.json" ] && [ ! -e "$T/planted/.make-model.partial" ] || bad "planted: output"

# the demo commands (Makefile `demo`)
"$DRAMA_BIN" make-model "$T/models/tiny-random" --shape tiny --seed 1 > /dev/null || bad "demo make-model"
"$DRAMA_BIN" inspect "$T/models/tiny-random" > "$T/demo.out" || bad "demo inspect exit non-zero"
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
