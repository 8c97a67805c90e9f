#!/usr/bin/env bash
# drama inspect on broken checkpoints: a missing tensor, a mis-shaped tensor, an extra tensor, a
# quantised weight without its scale, a missing tower tensor (generated with make-model's test
# hooks, at a non-square shape), a golden copy whose config disagrees with its tokenizer, a
# manifest, and golden copies with corrupted shards, index and codec.pth.
# Each must give its specific finding line; fatal ones a non-zero exit.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
P=model.language_model.layers
DIMS="--shape custom --hidden 96 --layers 4 --num-experts 8 --top-k 2 --moe-inter 32 --shared-inter 48 --head-dim 32 --seed 11"

make() { # dir extra-args...
    local d=$1
    shift
    "$DRAMA_BIN" make-model "$T/$d" $DIMS "$@" > "$T/$d.make" 2>&1 || { bad "make-model $d: $(cat "$T/$d.make")"; return 1; }
}
expect() { # dir want-exit line-prefix [inspect args...]
    local d=$1 want=$2 line=$3
    shift 3
    "$DRAMA_BIN" inspect "$T/$d" "$@" > "$T/$d.out" 2> "$T/$d.err"
    local rc=$?
    # a signal (bash reports 128 + its number) is a crash, never the expected non-zero exit
    if [ $rc -gt 128 ]; then bad "$d: killed by signal $((rc - 128)) (exit $rc): $(tail -3 "$T/$d.err")"; fi
    if [ "$want" = 0 ] && [ $rc -ne 0 ]; then bad "$d: exit $rc, expected 0"; fi
    if [ "$want" != 0 ] && [ $rc -eq 0 ]; then bad "$d: exit 0, expected non-zero"; fi
    awk -v l="$line" 'index($0, l) == 1 { f = 1 } END { exit !f }' "$T/$d.out" || { bad "$d: no line '$line'"; sed -n '/^## findings/,$p' "$T/$d.out" | head -20; }
    echo "$d: exit $rc, found: $line"
}

make base && expect base 0 "(tensors: 0 missing, 0 mis-shaped, 0 unsupported, 0 incomplete, 0 unexpected, 0 ignored)"

make missing --test-omit $P.1.mlp.gate.weight &&
    expect missing 1 "missing: $P.1.mlp.gate.weight"

make misshaped --test-misshape $P.3.self_attn.k_proj.weight &&
    expect misshaped 1 "mis-shaped: $P.3.self_attn.k_proj.weight: expected [64, 96], found [65, 96]"

make extra --test-extra $P.0.mlp.extra.weight &&
    expect extra 0 "unexpected: $P.0.mlp.extra.weight: BF16 [4], not used" &&
    expect extra 1 "unexpected: $P.0.mlp.extra.weight: BF16 [4], not used" --set loader.strict=true

make noscale --experts fp8 --test-omit $P.2.mlp.experts.3.up_proj.weight_scale_inv &&
    expect noscale 1 "incomplete: $P.2.mlp.experts.3.up_proj.weight: F8_E4M3 weight without $P.2.mlp.experts.3.up_proj.weight_scale_inv or $P.2.mlp.experts.3.up_proj.weight_scale"

make notower --test-omit audio_decoder_mtp.layers.2.enorm.weight &&
    expect notower 1 "missing: audio_decoder_mtp.layers.2.enorm.weight"

make badtower --test-misshape audio_decoder_mtp_shared.layers.1.attention.wo.weight &&
    expect badtower 1 "mis-shaped: audio_decoder_mtp_shared.layers.1.attention.wo.weight: expected [64, 128], found [65, 128]"

# the tensor counts line must show the one finding of each fatal case
grep -qxF "(tensors: 1 missing, 0 mis-shaped, 0 unsupported, 0 incomplete, 0 unexpected, 0 ignored)" "$T/missing.out" ||
    bad "missing: counts line"
grep -q '^NOT LOADABLE: ' "$T/misshaped.out" || bad "misshaped: verdict"

# a switch from the command line is reported with its source
"$DRAMA_BIN" inspect "$T/base" --set tower.norm_offset=1.0 > "$T/set.out" 2>&1
grep -qxF "| tower.norm_offset | 1.0 | --set |" "$T/set.out" || bad "--set source not reported"
"$DRAMA_BIN" inspect "$T/base" --set no.such.switch=1 > "$T/unk.out" 2>&1 && bad "unknown switch accepted"

# a manifest (FORMATS.md 7): verified before anything is parsed; a changed file refuses the model
export DRAMA_CACHE_DIR="$T/cache"
"$DRAMA_BIN" verify "$T/base" --write > /dev/null || bad "verify --write"
expect base 0 "- ok: config.json"
grep -q '^- ok: model-00001-of-00002.safetensors' "$T/base.out" || bad "manifest: shard not listed as ok"
echo note > "$T/base/notes.txt"
expect base 0 "warning: manifest: notes.txt is not listed (unverified)"
printf '\x01' | dd of="$T/base/model-00002-of-00002.safetensors" bs=1 seek=100000 conv=notrunc 2> /dev/null
expect base 1 "error: manifest: model-00002-of-00002.safetensors: SHA-256 mismatch: expected "
grep -q '^## checkpoint' "$T/base.out" && bad "manifest mismatch: the checkpoint was still parsed"
echo '{"format": "drama-manifest", "version": 1, "files": [{"path": "../x", "size": 1, "sha256": "00"}]}' > "$T/base/drama-manifest.json"
expect base 1 "error: manifest: $T/base/drama-manifest.json: files[0]: path '../x'"

# a golden copy whose config.json disagrees with tokenizer.json
G=${DRAMA_GOLDEN:-}
if [ -f "$G/tiny-drama3/config.json" ]; then
    mkdir -p "$T/cfgbad"
    for f in "$G"/tiny-drama3/*; do ln -s "$(realpath "$f")" "$T/cfgbad/$(basename "$f")"; done
    rm "$T/cfgbad/config.json"
    sed 's/"semantic_start_token_id": 2012/"semantic_start_token_id": 2013/' "$G/tiny-drama3/config.json" > "$T/cfgbad/config.json"
    expect cfgbad 1 "error: tokens: config.json semantic_start_token_id 2013 differs from tokenizer id(<|semantic:0|>) 2012"

    # corrupted files: each is named with the fault, exit 1, never a crash
    corrupt() { # name file want-line shell-command (run in the copy)
        local d=$1 f=$2 want=$3 cmd=$4
        mkdir -p "$T/$d"
        for g in "$G"/tiny-drama3/*; do ln -s "$(realpath "$g")" "$T/$d/$(basename "$g")"; done
        rm "$T/$d/$f"
        cp "$G/tiny-drama3/$f" "$T/$d/$f"
        chmod u+w "$T/$d/$f"
        (cd "$T/$d" && eval "$cmd")
        expect "$d" 1 "$want"
    }
    S1=model-00001-of-00002.safetensors
    S2=model-00002-of-00002.safetensors
    corrupt trunc $S2 "error: checkpoint: $T/trunc/$S2: tensor '" "truncate -s 1000000 $S2"
    corrupt hdrlen $S1 "error: checkpoint: $T/hdrlen/$S1: header length 9223372036854775807 exceeds the limit" \
        "printf '\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x7f' | dd of=$S1 conv=notrunc 2> /dev/null"
    corrupt hdrpast $S1 "error: checkpoint: $T/hdrpast/$S1: header length 16777216 runs past the end of the file" \
        "printf '\\x00\\x00\\x00\\x01\\x00\\x00\\x00\\x00' | dd of=$S1 conv=notrunc 2> /dev/null"
    corrupt hdrjson $S1 "error: checkpoint: $T/hdrjson/$S1: header JSON invalid near byte offset" \
        "printf 'X' | dd of=$S1 bs=1 seek=9 conv=notrunc 2> /dev/null"
    corrupt index model.safetensors.index.json "error: checkpoint: $T/index/model.safetensors.index.json: weight_map['a']: shard name '../x.safetensors' contains '/'" \
        "echo '{\"weight_map\": {\"a\": \"../x.safetensors\"}}' > model.safetensors.index.json"
    corrupt noshard model.safetensors.index.json "error: checkpoint: $T/noshard: shard 'model-00003-of-00003.safetensors' named by the index is missing" \
        "sed -i 's/model-00002-of-00002/model-00003-of-00003/' model.safetensors.index.json"
    corrupt codec codec.pth "error: codec: $T/codec/codec.pth: " "truncate -s 100000 codec.pth"
    for d in trunc hdrlen hdrpast hdrjson index noshard codec; do
        grep -q 'Sanitizer' "$T/$d.err" && bad "$d: sanitizer report: $(cat "$T/$d.err")" # a signal: expect()
    done
fi
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
