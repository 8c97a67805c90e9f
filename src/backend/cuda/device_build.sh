#!/bin/bash
# device_build.sh - build the CUDA backend's test and bench WITHOUT the engine's other libraries
# (jansson, pcre2, sndfile, cmocka... are not on the GPU machine), straight with gcc + nvcc.
# CMake is the real build (DRAMA_CUDA=AUTO); this is for a bare CUDA image. Usage, from the
# repository root: src/backend/cuda/device_build.sh [build-dir]   -> <dir>/test_cuda_matmul,
# <dir>/bench_cuda_matmul
set -euo pipefail
B=${1:-build-cuda-dev}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-gcc}
mkdir -p "$B/obj"
CFLAGS="-O2 -g -std=c11 -D_GNU_SOURCE -DDRAMA_GIT_COMMIT=\"device\" -Iinclude -Isrc -Wall -Wextra -Wno-unused-parameter"
C_SRCS="src/base/error.c src/base/alloc.c src/base/log.c src/base/pool.c src/base/tensor.c
        src/num/formats.c src/num/weight.c src/backend/cpu/matmul.c src/backend/cpu/matmul_avx2.c
        src/backend/cpu/matmul_avx2_plant1.c src/backend/cpu/matmul_avx2_plant2.c src/backend/cpu/matmul_avx2_plant3.c
        src/backend/cpu/matmul_avx2_plant4.c src/backend/cpu/matmul_avx512.c src/backend/cpu/matmul_avx512_plant1.c
        src/backend/cpu/matmul_avx512_plant2.c src/backend/cpu/matmul_avx512_plant3.c src/backend/cpu/matmul_avx512_plant4.c"
objs=()
for f in $C_SRCS; do
  o="$B/obj/$(echo "$f" | tr / _).o"
  $CC $CFLAGS -c "$f" -o "$o" &
  objs+=("$o")
done
for f in src/backend/cuda/*.cu; do
  case "$f" in *codec_*) continue ;; esac # the codec decoder needs src/codec (CMake builds it)
  o="$B/obj/$(basename "$f").o"
  "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
    -Xptxas -v -Iinclude -Isrc -Xcompiler -Wall,-Wextra -c "$f" -o "$o" 2> "$B/ptxas_$(basename "$f").txt" &
  objs+=("$o")
done
wait
for t in tests/unit/test_cuda_matmul.c bench/bench_cuda_matmul.c; do
  n=$(basename "$t" .c)
  $CC $CFLAGS -I/usr/local/cuda/include -c "$t" -o "$B/obj/$n.o"
  "$NVCC" -o "$B/$n" "$B/obj/$n.o" "${objs[@]}" -lm -lpthread
done
echo "built $B/test_cuda_matmul $B/bench_cuda_matmul"
