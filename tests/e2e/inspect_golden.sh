#!/usr/bin/env bash
# drama inspect on the golden tiny model and every variant: exit 0, no finding, the tensor list
# equal to golden/INVENTORY.md (names folded, dtype, shape, shard, count), token ids and the
# detected expert layout/format per variant.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 77; }
G=${DRAMA_GOLDEN:-}
[ -f "$G/INVENTORY.md" ] || { echo "golden data not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# Link a model directory into $2, every entry a symlink to the real file. A variant's shared
# files are relative symlinks; a checkout that stored them as small text files is restored here.
restore() {
    local src=$1 dst=$2 f b t
    mkdir -p "$dst"
    for f in "$src"/*; do
        b=$(basename "$f")
        if [ ! -L "$f" ] && [ "$(stat -c %s "$f")" -lt 512 ] && head -c 3 "$f" | grep -q '^\.\./'; then
            t="$src/$(cat "$f")"
            if [ -e "$t" ]; then ln -s "$(realpath "$t")" "$dst/$b"; continue; fi
        fi
        ln -s "$(realpath "$f")" "$dst/$b"
    done
}

# Rows of one "### section" of INVENTORY.md, as "name|dtype shape shard|count".
inventory_rows() {
    awk -v sec="### $1" '
        $0 == sec { on = 1; next }
        /^### / { on = 0 }
        on && /^\| `/ { print }' "$G/INVENTORY.md" |
        awk -F'|' '{ gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print $2 "|" $3 "|" $4 }' | sort
}
# The same from inspect's checkpoint table (first three columns).
inspect_rows() {
    sed -n '/^### tensors:/,/^## /p' "$1" | grep '^| `' |
        awk -F'|' '{ gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); print $2 "|" $3 "|" $4 }' | sort
}

check_model() { # name dir
    local name=$1 dir=$2 out="$T/$1.txt"
    "$DRAMA_BIN" inspect "$dir" > "$out" 2> "$T/$1.err"
    local rc=$?
    [ $rc -eq 0 ] || { bad "$name: inspect exit $rc"; tail -20 "$out"; cat "$T/$1.err"; }
    grep -q '^(tensors: 0 missing, 0 mis-shaped, 0 unsupported, 0 incomplete, 0 unexpected, 0 ignored)$' "$out" ||
        bad "$name: tensor findings not empty"
    if grep -E '^(missing|mis-shaped|unsupported|incomplete|unexpected|ignored|error|warning): ' "$out"; then
        bad "$name: finding lines present"
    fi
    grep -q '^LOADABLE: 0 fatal findings$' "$out" || bad "$name: not LOADABLE"
    # token ids of the tiny tokenizer (golden/README.md "Token ids")
    grep -q '<|im_end|>=2003' "$out" || bad "$name: im_end id"
    grep -q 'semantic block: <|semantic:0|> .. <|semantic:4095|> = 2012 .. 6107 (contiguous)' "$out" || bad "$name: semantic block"
    grep -q 'speaker tags: <|speaker:0..15|> = 6108 .. (16 of them added tokens)' "$out" || bad "$name: speaker tags"
    grep -q '^- prefix: "model.language_model."$' "$out" || bad "$name: prefix"
    grep -q 'codec.pth: 382 entries' "$out" || bad "$name: codec inventory"
}

restore "$G/tiny-drama3" "$T/tiny-drama3"
check_model tiny-drama3 "$T/tiny-drama3"
inventory_rows tiny-drama3 > "$T/inv.tiny"
inspect_rows "$T/tiny-drama3.txt" > "$T/got.tiny"
[ "$(wc -l < "$T/inv.tiny")" -gt 40 ] || bad "INVENTORY.md tiny-drama3 section not parsed"
diff "$T/inv.tiny" "$T/got.tiny" > "$T/diff.tiny" || { bad "tiny-drama3: tensor list differs from INVENTORY.md"; cat "$T/diff.tiny"; }
echo "tiny-drama3: $(wc -l < "$T/got.tiny") folded rows equal INVENTORY.md"

for v in "$G"/variants/*/; do
    name=$(basename "$v")
    restore "$v" "$T/v-$name"
    check_model "$name" "$T/v-$name"
    inventory_rows "variants/$name" > "$T/inv.$name"
    inspect_rows "$T/$name.txt" > "$T/got.$name"
    [ -s "$T/inv.$name" ] || bad "INVENTORY.md section variants/$name not parsed"
    missing=$(comm -23 "$T/inv.$name" "$T/got.$name")
    [ -z "$missing" ] || { bad "$name: INVENTORY rows not reported:"; echo "$missing"; }
    # the variant's expert rows replace the base's: every other row is the base's
    others=$(comm -13 "$T/inv.$name" "$T/got.$name" | grep -v 'mlp\.experts' )
    base_others=$(grep -v 'mlp\.experts' "$T/inv.tiny")
    [ "$others" = "$base_others" ] || bad "$name: non-expert rows differ from the base"
    expert_rows=$(grep -c 'mlp\.experts' "$T/got.$name")
    [ "$expert_rows" -eq "$(wc -l < "$T/inv.$name")" ] || bad "$name: $expert_rows expert rows, INVENTORY has $(wc -l < "$T/inv.$name")"
    case $name in
    fp8-block) want='per-expert, 16/16, block FP8 128x128' ;;
    nvfp4) want='per-expert, 16/16, NVFP4' ;;
    mlx-affine4) want='per-expert, 16/16, affine 4-bit group 64' ;;
    fused-experts) want='fused, 16/16, BF16' ;;
    pruned) want='per-expert, ([0-9]|1[0-6])/16, BF16' ;;
    *) want='per-expert' ;;
    esac
    n=$(grep -cE "^  - [0-9]+: (linear|full)_attention, $want\$" "$T/$name.txt")
    [ "$n" -eq 8 ] || bad "$name: layout/format '$want' detected on $n of 8 layers"
    if [ "$name" = pruned ]; then
        grep -q '^- drama_experts: {"0":\[' "$T/$name.txt" || bad "pruned: drama_experts not printed"
        kept=$(grep -oE '^  - [0-9]+: [a-z_]+, per-expert, [0-9]+/' "$T/$name.txt" | grep -oE '[0-9]+/$' | tr -d / | awk '{ s += $1 } END { print s }')
        [ "$kept" = 101 ] || bad "pruned: $kept experts kept in total, golden says 101"
    fi
    echo "$name: $expert_rows expert rows match INVENTORY.md, layout '$want' on all layers"
done
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
