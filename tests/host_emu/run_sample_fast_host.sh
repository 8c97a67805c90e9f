#!/usr/bin/env bash
# Builds and runs sample_fast_host.cpp against build/'s CPU libraries (docs/cuda.md "The faster draw").
# usage: tests/host_emu/run_sample_fast_host.sh [cases (40)] [sort: the window sort alone]; SEED=n varies.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$root" "$tmp" <<'PY'
import sys
root, tmp = sys.argv[1], sys.argv[2]
s = open(root + '/src/backend/cuda/sample.cu').read()
a, b = s.index("struct draw_spec {"), s.index("__host__ __device__ static size_t smem_bytes")
c, d = s.index("__device__ fast_smem fast_layout"), s.index("static int pow2_at_least")
inc = '#include "' + root + '/src/backend/cuda/sample_fast.cuh"'
open(tmp + '/sample_extracted.inc', 'w').write(s[a:b] + s[b:c].replace('#include "backend/cuda/sample_fast.cuh"', inc) + s[c:d])
PY
B=$root/build
g++ -O1 -std=c++20 -ffp-contract=off -w -I "$tmp" -I "$root/src" -I "$root/include" "$root/tests/host_emu/sample_fast_host.cpp" \
    "$B/libdrama_backend_cpu.a" "$B/libdrama_backend.a" "$B/libdrama_num.a" "$B/libdrama_base.a" "$B/libdrama_backend_cpu.a" \
    "$B/libdrama_base.a" -lm -lpthread -o "$tmp/sample_fast_host"
"$tmp/sample_fast_host" "${1:-40}" ${2:+sort}
