#!/usr/bin/env bash
# drama inspect straight on the golden folders, as a user would run it: the variants' shared
# files may be real symlinks or (git without symlink support) text files naming the target;
# either way every folder must be loadable with no finding.
set -u
[ -n "${DRAMA_BIN:-}" ] && [ -x "$DRAMA_BIN" ] || { echo "DRAMA_BIN not set"; exit 1; }
G=${DRAMA_GOLDEN:-}
[ -f "$G/INVENTORY.md" ] || { echo "golden data not found at '$G'"; exit 1; }
fail=0
for d in tiny-drama3 variants/fp8-block variants/nvfp4 variants/mlx-affine4 variants/fused-experts variants/pruned; do
    out=$("$DRAMA_BIN" inspect "$G/$d" 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | tail -n 1)
    if [ $rc -ne 0 ] || [ "$last" != "LOADABLE: 0 fatal findings" ]; then
        echo "FAIL: inspect $d: rc=$rc, last line: $last"
        printf '%s\n' "$out" | grep -E '^(error|warning)' | head -5
        fail=1
    elif printf '%s\n' "$out" | grep -q '^error'; then
        echo "FAIL: inspect $d printed an error line"; fail=1
    else
        echo "ok: $d"
    fi
done
exit $fail
