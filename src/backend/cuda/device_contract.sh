#!/bin/bash
# device_contract.sh - run `drama contract` (all kernels, then --only cuda through
# tests/e2e/contract_cuda.sh, then compute-sanitizer memcheck) and test_cuda_matmul on the GPU
# machine, from the repository root, with binaries built on another machine and carried in DIR:
#   DIR/drama, DIR/test_cuda_matmul, the shared libraries `ldd` names (DIR/*.so*), glibc's
#   libc/libm/ld-linux in DIR/glibc (used only when the binary does not start with the machine's
#   own loader), and DIR/ref/quant-units.safetensors (the golden format fixtures).
# Logs go to $OUT (default ./device-out). Usage: src/backend/cuda/device_contract.sh [DIR]
set -u
. "$(dirname "$0")/device_env.sh"

echo "== drama contract --golden (all kernels, timed)"
/tmp/drama-dev contract --golden "$D" >"$O/contract_all.txt" 2>&1
echo "rc=$?" >>"$O/contract_all.txt"
grep -E "^(SUMMARY|NOT RUN|FAIL|MISSED|rc=)" "$O/contract_all.txt"

echo "== tests/e2e/contract_cuda.sh (drama contract --only cuda)"
DRAMA_BIN=/tmp/drama-dev bash tests/e2e/contract_cuda.sh >"$O/contract_cuda.txt" 2>&1
echo "rc=$?" >>"$O/contract_cuda.txt"
tail -n 2 "$O/contract_cuda.txt"

echo "== compute-sanitizer memcheck: drama contract --only cuda --no-limits"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "${PREFIX[@]}" "$D/drama" contract --only cuda \
    --no-limits >"$O/sanitizer.txt" 2>&1
echo "rc=$?" >>"$O/sanitizer.txt"
grep -E "ERROR SUMMARY|^SUMMARY|rc=" "$O/sanitizer.txt"

echo "== test_cuda_matmul"
"${PREFIX[@]}" "$D/test_cuda_matmul" >"$O/test_cuda_matmul.txt" 2>&1
echo "rc=$?" >>"$O/test_cuda_matmul.txt"
tail -n 3 "$O/test_cuda_matmul.txt"
