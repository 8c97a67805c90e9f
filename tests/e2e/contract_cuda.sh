#!/usr/bin/env bash
# Kernel contract, CUDA entries (issue 7): `drama contract --only cuda` must be green on a GPU:
# every CUDA kernel passes and every planted device defect is red. Skipped (77) where the backend is
# not built or no CUDA device is present (the program says which), never counted as passed.
set -u
[ -x "${DRAMA_BIN:-}" ] || { echo "DRAMA_BIN not set"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$DRAMA_BIN" contract --only cuda >"$out" 2>&1
rc=$?
cat "$out"
if grep -q "backend not built" "$out"; then echo "SKIP: CUDA backend not built"; exit 77; fi
if [ "$rc" -eq 2 ] && grep -q "no CUDA device" "$out"; then
    grep -Eq "^NOT RUN  [^ ]+ cuda: no CUDA device" "$out" || { echo "FAIL: no NOT RUN line"; exit 1; }
    echo "SKIP: no CUDA device"; exit 77
fi
last=$(tail -n 1 "$out")
if ! [[ "$last" =~ ^SUMMARY\ ([0-9]+)\ kernels:\ ([0-9]+)\ pass,\ 0\ fail\;\ ([0-9]+)\ controls:\ ([0-9]+)\ red\ as\ planted,\ 0\ missed$ ]]; then
    echo "FAIL: $last"; exit 1
fi
[ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
n=${BASH_REMATCH[1]} p=${BASH_REMATCH[2]} c=${BASH_REMATCH[3]} r=${BASH_REMATCH[4]}
[ "$p" -eq "$n" ] && [ "$r" -eq "$c" ] && [ "$n" -ge 31 ] && [ "$c" -ge 22 ] || { echo "FAIL: $last"; exit 1; }
for k in f32 f16 bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 affine4_g32 affine4_g128 affine8_g128; do
    grep -Eq "^PASS matmul\.$k +cuda " "$out" || { echo "FAIL: cuda matmul.$k missing"; exit 1; }
done
# the frame step's kernels
for k in rms_norm embed tower_input guidance attn_prep attention expf_det gdn_conv gdn_recur swiglu_matmul \
         sample sample_frame sample_fast moe.bf16 moe.fp8_block moe.fp8_tensor moe.nvfp4 moe.affine4 moe.affine8 moe.fused_fp8 \
         moe.pruned_nvfp4 codec.conv1d codec.conv_fused codec.conv_tanh; do
    grep -Eq "^PASS $k +cuda " "$out" || { echo "FAIL: cuda $k missing"; exit 1; }
done
# the switchable variants (DRAMA_CUDA_XT=0: x staged plain; DRAMA_CUDA_MOE_DOWN; DRAMA_CUDA_MOE_PERSIST)
for k in f32 f16 bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 affine4_g32 affine4_g128 affine8_g128; do
    grep -Eq "^PASS matmul_xt0\.$k +cuda " "$out" || { echo "FAIL: cuda matmul_xt0.$k missing"; exit 1; }
    grep -Eq "^PASS matmul_l2pf\.$k +cuda " "$out" || { echo "FAIL: cuda matmul_l2pf.$k missing"; exit 1; }
done
for k in bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 fused_fp8 pruned_nvfp4; do
    grep -Eq "^PASS moe_lean\.$k +cuda " "$out" || { echo "FAIL: cuda moe_lean.$k missing"; exit 1; }
done
for k in bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 fused_fp8 pruned_nvfp4; do # the default decode path (DRAMA_CUDA_MOE_PERSIST)
    grep -Eq "^PASS moe_persist\.$k +cuda " "$out" || { echo "FAIL: cuda moe_persist.$k missing"; exit 1; }
done
for k in bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 fused_fp8 pruned_nvfp4; do # DRAMA_CUDA_MOE_PERSIST=2
    grep -Eq "^PASS moe_persist2\.$k +cuda " "$out" || { echo "FAIL: cuda moe_persist2.$k missing"; exit 1; }
done
grep -q "discr=NO" "$out" && { echo "FAIL: a fixture does not discriminate"; exit 1; }
# selection by backend/name picks one format and its control only
"$DRAMA_BIN" contract --only 'cuda/matmul.nvfp4' --no-limits >"$out" 2>&1 || { cat "$out"; echo "FAIL: --only cuda/matmul.nvfp4"; exit 1; }
tail -n 1 "$out" | grep -Eq '^SUMMARY 1 kernels: 1 pass, 0 fail; 0 controls' ||
    { cat "$out"; echo "FAIL: --only 'cuda/matmul.nvfp4' selection"; exit 1; }
echo "contract_cuda e2e: ok ($last)"
