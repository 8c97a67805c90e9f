#!/usr/bin/env bash
# drama optimize from the command line: each format of tiny-drama3 is loadable by drama inspect
# (no finding, the expected expert format), passes drama verify (its manifest), carries the receipt
# and the side files; the q8 experts dequantise within the 8-bit bound of their BF16 source;
# --prune-experts writes drama_experts; bad requests exit non-zero with a message
# naming the problem and leave neither DST nor DST.partial; usage errors exit 2.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
[ -n "${DRAMA_GOLDEN:-}" ] && [ -d "$DRAMA_GOLDEN/tiny-drama3" ] || { echo "DRAMA_GOLDEN not set"; exit 77; }
SRC="$DRAMA_GOLDEN/tiny-drama3"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

run_ok() { # name want-format-regex optimize-args...
    local name=$1 want=$2
    shift 2
    "$DRAMA_BIN" optimize --model "$SRC" --out "$T/$name" "$@" > "$T/$name.log" 2>&1 || { bad "$name: exit $?: $(cat "$T/$name.log")"; return; }
    [ -d "$T/$name.partial" ] && bad "$name: DST.partial left behind"
    "$DRAMA_BIN" inspect "$T/$name" > "$T/$name.out" 2>&1 || { bad "$name: inspect exit non-zero"; sed -n '/^## findings/,$p' "$T/$name.out"; return; }
    grep -q '^LOADABLE: 0 fatal findings$' "$T/$name.out" || bad "$name: not loadable"
    grep -qx '(tensors: 0 missing, 0 mis-shaped, 0 unsupported, 0 incomplete, 0 unexpected, 0 ignored)' "$T/$name.out" || bad "$name: findings"
    local n
    n=$(grep -cE "^  - [0-9]+: (linear|full)_attention, $want\$" "$T/$name.out")
    [ "$n" -eq 8 ] || bad "$name: expert layout '$want' on $n of 8 layers"
    "$DRAMA_BIN" verify "$T/$name" --reverify > "$T/$name.verify" 2>&1 || bad "$name: drama verify: $(tail -3 "$T/$name.verify")"
    for f in drama-optimize.json drama-manifest.json NOTICE tokenizer.json tokenizer_config.json chat_template.jinja codec.pth codec.json; do
        [ -f "$T/$name/$f" ] || bad "$name: $f missing"
    done
    grep -q '"sha256"' "$T/$name/drama-optimize.json" || bad "$name: receipt without digests"
    cmp -s "$DRAMA_GOLDEN/tiny-drama3/codec.pth" "$T/$name/codec.pth" || bad "$name: codec.pth not copied byte for byte"
    echo "$name: loadable, '$want' on all 8 layers, manifest verified"
}

run_ok fp8 'per-expert, 16/16, block FP8 128x128' --experts fp8 --threads 2
run_ok nvfp4 'per-expert, 16/16, NVFP4' --experts nvfp4
run_ok q4 'per-expert, 16/16, affine 4-bit group 64' --experts q4
run_ok q8 'per-expert, 16/16, affine 8-bit group 32' --experts q4 --q4-bits 8 --q4-group 32
run_ok bf16 'per-expert, 16/16, BF16' --experts bf16 --shard-size 4000000
printf '{"0": [0, 1, 2, 3, 4], "5": [1, 3, 5, 7, 9, 11]}' > "$T/keep.json"
# the FORMATS.md 6 spelling: SRC first, --output
"$DRAMA_BIN" optimize "$SRC" --output "$T/positional" --experts fp8 --quiet > /dev/null 2>&1 && [ -f "$T/positional/drama-manifest.json" ] || bad "drama optimize SRC --output DST failed"
# mere.run / MLX spelling: SRC first, --output, --group-size; the same bytes as --model/--out/--q4-group
"$DRAMA_BIN" optimize "$SRC" --output "$T/gs32" --experts q4 --group-size 32 --quiet > /dev/null 2>&1 || bad "SRC --output --group-size failed"
"$DRAMA_BIN" optimize --model "$SRC" --out "$T/q4g32" --experts q4 --q4-group 32 --quiet > /dev/null 2>&1 || bad "--q4-group 32 failed"
for f in "$T"/q4g32/model-*.safetensors "$T/q4g32/config.json" "$T/q4g32/model.safetensors.index.json"; do
    cmp -s "$f" "$T/gs32/$(basename "$f")" || bad "--group-size 32 differs from --q4-group 32 in $(basename "$f")"
done
grep -q '"group_size": 32' "$T/gs32/config.json" || bad "--group-size 32 not in config.json"
"$DRAMA_BIN" optimize --help | grep -q -- '--group-size' || bad "--help does not name --group-size"
"$DRAMA_BIN" optimize --help | grep -q -- 'SRC --output DST' || bad "--help does not name SRC --output DST"
run_ok pruned 'per-expert, (16|5|6)/16, BF16' --prune-experts "$T/keep.json"

# other sources: fused dense (keep = sliced per expert), quantised (keep = copied, pruned), pruned
SRC="$DRAMA_GOLDEN/variants/fused-experts" run_ok fusedkeep 'per-expert, (16|5|6)/16, BF16' --prune-experts "$T/keep.json"
SRC="$DRAMA_GOLDEN/variants/nvfp4" run_ok nvkeep 'per-expert, (16|5|6)/16, NVFP4' --prune-experts "$T/keep.json"
SRC="$DRAMA_GOLDEN/variants/pruned" run_ok prunedfp8 'per-expert, [0-9]+/16, block FP8 128x128' --experts fp8
grep -q '^- drama_experts: {"0":\[0,1,2,4,5,' "$T/prunedfp8.out" || bad "prunedfp8: the source's drama_experts not carried over"
grep -q '"quant_algo": "NVFP4"' "$T/nvkeep/config.json" || bad "nvkeep: the source's quantization_config not kept"
grep -q '"quant_method": "fp8"' "$T/fp8/config.json" || bad "fp8: quantization_config missing"
grep -q '"quant_algo": "NVFP4"' "$T/nvfp4/hf_quant_config.json" 2>/dev/null || bad "nvfp4: hf_quant_config.json missing"
grep -q '"bits": 8' "$T/q8/config.json" || bad "q8: quantization bits 8 missing"
# q8 values: every dequantised expert within the 8-bit bound of its BF16 source (tu_affine_bound)
if [ -n "${DRAMA_TEST_WCHECK:-}" ]; then
    "$DRAMA_TEST_WCHECK" "$SRC" "$T/q8" 8 > "$T/q8.wcheck" 2>&1 || bad "q8: dequantised experts vs BF16 source: $(cat "$T/q8.wcheck")"
    echo "q8: $(cat "$T/q8.wcheck")"
else
    bad "q8: DRAMA_TEST_WCHECK not set, the values are not checked"
fi
grep -q 'quantization' "$T/bf16/config.json" && bad "bf16: a quantisation entry is left in config.json"
[ "$(ls "$T"/bf16/model-*-of-*.safetensors | wc -l)" -gt 1 ] || bad "bf16: --shard-size gave one shard"
grep -q '^- drama_experts: {"0":\[0,1,2,3,4\]' "$T/pruned.out" || bad "pruned: drama_experts not in the index: $(grep drama_experts "$T/pruned.out")"

# failures: message, exit status, nothing left behind
fails() { # name exit-status message-regex optimize-args...
    local name=$1 want=$2 re=$3
    shift 3
    "$DRAMA_BIN" optimize "$@" > "$T/$name.log" 2>&1
    local rc=$?
    [ "$rc" -eq "$want" ] || bad "$name: exit $rc, expected $want"
    grep -qE -e "$re" "$T/$name.log" || bad "$name: message does not match '$re': $(cat "$T/$name.log")"
    [ -e "$T/$name" ] && bad "$name: output directory left behind"
    [ -e "$T/$name.partial" ] && bad "$name: DST.partial left behind"
    echo "$name: exit $rc: $(head -1 "$T/$name.log")"
}
printf '{"3": [0, 1, 2, 99]}' > "$T/bad-id.json"
printf '{"12": [0, 1, 2, 3]}' > "$T/bad-layer.json"
fails badid 1 'layer 3, entry 3' --model "$SRC" --out "$T/badid" --prune-experts "$T/bad-id.json"
fails badlayer 1 'layer "12": no such MoE layer' --model "$SRC" --out "$T/badlayer" --prune-experts "$T/bad-layer.json"
fails requant 1 'already quantised' --model "$DRAMA_GOLDEN/variants/fp8-block" --out "$T/requant" --experts q4
fails group 1 'multiple of the group size' --model "$SRC" --out "$T/group" --experts q4 --q4-group 128
fails kbig 1 '--prune 17: must be in \[num_experts_per_tok 4, num_experts 16\]' --model "$SRC" --out "$T/kbig" --prune 17 --calibration "$T/keep.json"
fails fmt 2 "unknown format 'q3'" --model "$SRC" --out "$T/fmt" --experts q3
fails gsize 2 '--group-size 48: expected 32, 64 or 128' "$SRC" --output "$T/gsize" --experts q4 --group-size 48
fails gsfmt 2 'need --experts q4' "$SRC" --output "$T/gsfmt" --experts fp8 --group-size 32
fails bits 2 '--q4-bits 3' --model "$SRC" --out "$T/bits" --experts q4 --q4-bits 3
fails both 2 'exclude each other' --model "$SRC" --out "$T/both" --prune-experts "$T/keep.json" --prune 4 --calibration x
fails nocal 2 'go together' --model "$SRC" --out "$T/nocal" --prune 4
fails noout 2 'required' --model "$SRC"
fails nosrc 1 'no-such-dir' --model "$T/no-such-dir" --out "$T/nosrc"
# a non-empty DST is never overwritten
mkdir -p "$T/full" && echo keep > "$T/full/x"
"$DRAMA_BIN" optimize --model "$SRC" --out "$T/full" > "$T/full.log" 2>&1 && bad "non-empty DST accepted"
grep -q 'not an empty directory' "$T/full.log" || bad "non-empty DST: $(cat "$T/full.log")"
[ "$(cat "$T/full/x")" = keep ] || bad "non-empty DST was modified"
exit $fail
