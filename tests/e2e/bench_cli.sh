#!/usr/bin/env bash
# `drama bench`: the dispatcher and the shared bandwidth probe run, print their table, and refuse
# bad options with status 2 naming the flag (speed itself is measured in bench/, not asserted here).
set -euo pipefail
: "${DRAMA_BIN:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

"$DRAMA_BIN" bench --help >"$T/help" || { echo "FAIL: bench --help"; exit 1; }
grep -q '^  bandwidth ' "$T/help" || { echo "FAIL: bandwidth not listed"; cat "$T/help"; exit 1; }

"$DRAMA_BIN" bench bandwidth --threads 2 --mib 32 >"$T/bw" || { echo "FAIL: bench bandwidth"; exit 1; }
gbs=$(awk '$1 == "read_bandwidth" { print $2 }' "$T/bw")
awk -v g="$gbs" 'BEGIN { exit !(g > 0.1 && g < 1e5) }' || { echo "FAIL: read_bandwidth '$gbs'"; cat "$T/bw"; exit 1; }

expect_usage() { # expect status 2 and the message naming the flag
    local want=$1; shift
    set +e; "$DRAMA_BIN" bench "$@" >/dev/null 2>"$T/err"; local rc=$?; set -e
    [ "$rc" = 2 ] && grep -q -- "$want" "$T/err" || { echo "FAIL: bench $* -> rc $rc"; cat "$T/err"; exit 1; }
}
expect_usage "unknown benchmark 'nosuch'" nosuch
expect_usage "--threads: invalid value 'x'" bandwidth --threads x
expect_usage "--mib: invalid value '0'" bandwidth --mib 0
expect_usage "--mib: invalid value '(missing)'" bandwidth --mib
echo "bench_cli: ok ($gbs GB/s)"
