#!/bin/bash
# ptxas_report.sh - compile-time figures of the n = 1 product and MoE down kernels, no GPU needed:
# registers, spills and static shared memory per kernel (nvcc -Xptxas -v, sm_90, the CMake build's
# flags) for matvec1_kernel with x staged transposed (template argument true, DRAMA_CUDA_XT=1) or
# plain (false), gate_up_decode_kernel and moe_down_decode_kernel vs moe_down_lean_kernel
# (DRAMA_CUDA_MOE_DOWN), moe_persist.cuh's and moe_persist2.cu's kernels (DRAMA_CUDA_MOE_PERSIST=1 / 2) and the grouped walk kernels (moe_grouped_walk.cuh) (the SASS counts need cuobjdump: device_frame.sh SASS=1). Run from the
# repository root; about 6 min of CPU (moe.cu and matvec.cu dominate). Usage: src/backend/cuda/ptxas_report.sh [OUT_DIR]
set -euo pipefail
O=${1:-/tmp/ptxas-report}
mkdir -p "$O"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
F=(-O2 -g -DNDEBUG -D_GNU_SOURCE "--generate-code=arch=compute_90,code=[compute_90,sm_90]" -std=c++17 -Iinclude -Isrc)
for f in matvec moe moe_prefill moe_persist2; do
  "$NVCC" "${F[@]}" -Xptxas -v -c "src/backend/cuda/$f.cu" -o "$O/$f.o" >"$O/$f.txt" 2>&1 &
done
wait
echo "kernel (FMT: 0 f32 1 f16 2 bf16 3 fp8_block 4 fp8_tensor 5 nvfp4 6 affine4 7 affine8) | registers | spill stores/loads | static smem"
cat "$O"/matvec.txt "$O"/moe.txt "$O"/moe_prefill.txt "$O"/moe_persist2.txt | awk '
  /Compiling entry function/ { k = $7; gsub(/[\047]/, "", k) }
  /spill stores/ { sp = $5 "/" $9 }
  /Used [0-9]+ registers/ { s = 0; for (i = 1; i <= NF; i++) if ($(i + 1) == "bytes" && $(i + 2) == "smem") s = $i;
    if (k ~ /matvec1_kernel|moe_down|gate_up_decode|gate_up_persist|moe_route|walk_kernel|gate_up_p2/) printf "%-70s | %s | %s | %s\n", k, $5, sp, s }' | sort
