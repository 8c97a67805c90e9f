#!/usr/bin/env bash
# `drama bench decode`: one full-width layer (experts pruned to fit a small budget) runs through the
# real decode step, prints its table ending in `ratio_to_floor X`, and refuses bad options naming
# the flag (speed itself is recorded in bench/RESULTS.md, not asserted here).
set -euo pipefail
: "${DRAMA_BIN:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

for fmt in q4 fp8 nvfp4; do
    "$DRAMA_BIN" bench decode --layers 1 --experts $fmt --steps 2 --context 2 --threads 2 --max-gib 0.5 >"$T/out" \
        || { echo "FAIL: bench decode --experts $fmt"; cat "$T/out"; exit 1; }
    last=$(tail -n 1 "$T/out")
    awk -v l="$last" 'BEGIN { split(l, f, " "); exit !(f[1] == "ratio_to_floor" && f[2] > 0 && f[2] < 1e4) }' \
        || { echo "FAIL: $fmt: last line '$last'"; cat "$T/out"; exit 1; }
    p=$(awk '$1 == "experts_distinct_per_layer" { print $2 }' "$T/out")
    [ "$p" -ge 8 ] && [ "$p" -lt 256 ] || { echo "FAIL: $fmt: $p distinct experts in 0.5 GiB"; cat "$T/out"; exit 1; }
done

expect_usage() { # expect status $1 and the message naming the flag
    local rc_want=$1 want=$2; shift 2
    set +e; "$DRAMA_BIN" bench decode "$@" >/dev/null 2>"$T/err"; local rc=$?; set -e
    [ "$rc" = "$rc_want" ] && grep -q -- "$want" "$T/err" || { echo "FAIL: bench decode $* -> rc $rc"; cat "$T/err"; exit 1; }
}
expect_usage 2 "--experts 'q5'" --experts q5
expect_usage 2 "--layers: invalid value '0'" --layers 0
expect_usage 2 "--lanes: invalid value 'x'" --lanes x
expect_usage 2 "unknown option '--nope'" --nope
expect_usage 1 "use fewer --layers or a larger --max-gib" --layers 2 --max-gib 0.3
echo "bench_decode: ok"
