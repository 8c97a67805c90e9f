#!/usr/bin/env bash
# Runs every benchmark program built in $1/bench and prints their tables.
set -euo pipefail
build=${1:-build}
shopt -s nullglob
for b in "$build"/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b"
done
