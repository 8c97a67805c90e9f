#!/usr/bin/env bash
# Kernel contract (issue 7): `drama contract` must be green (every kernel passes, every planted
# control is red) and end with the exact SUMMARY line; --only must select; bad options exit 2.
set -u
[ -x "${DRAMA_BIN:-}" ] || { echo "DRAMA_BIN not set"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$DRAMA_BIN" contract --no-limits >"$out" 2>&1
rc=$?
cat "$out"
last=$(tail -n 1 "$out")
if ! [[ "$last" =~ ^SUMMARY\ ([0-9]+)\ kernels:\ ([0-9]+)\ pass,\ ([0-9]+)\ fail\;\ ([0-9]+)\ controls:\ ([0-9]+)\ red\ as\ planted,\ ([0-9]+)\ missed$ ]]; then
    echo "FAIL: last line is not the SUMMARY line: $last"; exit 1
fi
n=${BASH_REMATCH[1]} p=${BASH_REMATCH[2]} f=${BASH_REMATCH[3]} c=${BASH_REMATCH[4]} r=${BASH_REMATCH[5]} m=${BASH_REMATCH[6]}
[ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
[ "$f" -eq 0 ] && [ "$m" -eq 0 ] && [ "$p" -eq "$n" ] && [ "$r" -eq "$c" ] || { echo "FAIL: $last"; exit 1; }
# every stored format has a matmul entry, and the ops of backend/cpu are registered
for k in f32 f16 bf16 fp8_block fp8_tensor nvfp4 affine4 affine8 affine4_g32 affine4_g128 affine8_g128; do
    grep -q "^PASS matmul.$k " "$out" || { echo "FAIL: matmul.$k missing"; exit 1; }
done
ops="rms_norm l2norm softmax rope_half rope_interleaved attend conv_step gdn_step topk"
# the model-level ops (backbone, tower, sampler) and the codec's kernels
model_ops="silu swiglu sigmoid_mul gated_rms_norm gdn_gates moe_route moe_combine guidance exp_weights top_p_count attend_f64"
codec_ops="codec.conv1d codec.conv_strided codec.conv_grouped codec.conv_transposed codec.snake codec.layernorm
           codec.rms_norm codec.rope codec.rope_f32 codec.attend codec.swiglu codec.tanh codec.vq_nearest codec.gelu"
for k in $ops $model_ops $codec_ops; do grep -q "^PASS $k " "$out" || { echo "FAIL: $k missing"; exit 1; }; done
# every op and every quantised matmul format family has a planted control that went red
for k in $ops matmul.fp8_block matmul.nvfp4 matmul.affine4 matmul.affine8 matmul.bf16 matmul.f32 \
         matmul.f16 matmul.fp8_tensor matmul.affine4_g32 matmul.affine4_g128 matmul.affine8_g128 \
         $model_ops $codec_ops; do
    grep -q "^RED    control $k " "$out" || { echo "FAIL: no red control for $k"; exit 1; }
done
[ "$c" -ge 50 ] || { echo "FAIL: fewer than 50 planted controls"; exit 1; }
# with the golden data (ctest sets DRAMA_GOLDEN) the format fixtures of quant-units run too
if [ -f "${DRAMA_GOLDEN:-}/ref/quant-units.safetensors" ]; then
    for k in format.e4m3 format.e2m1 format.bf16 matmul.golden_units; do
        grep -q "^PASS $k " "$out" || { echo "FAIL: $k missing"; exit 1; }
    done
fi

# selection: only the CPU NVFP4 matmul entries and their control (the pattern also sees
# "<backend>/<name>"; a plain 'matmul.nvfp4' would add the CUDA entry on a GPU machine)
"$DRAMA_BIN" contract --only 'cpu*/matmul.nvfp4' --no-limits >"$out" 2>&1 || { cat "$out"; echo "FAIL: --only"; exit 1; }
grep -q "^PASS matmul.nvfp4 " "$out" && ! grep -q "^PASS matmul.bf16 " "$out" || { cat "$out"; echo "FAIL: --only selection"; exit 1; }
# one control of the portable path, plus one inside the AVX2 loops where the CPU has AVX2 and one
# inside the AVX-512 loops where it has AVX-512
tail -n 1 "$out" | grep -Eq '^SUMMARY [0-9]+ kernels: [0-9]+ pass, 0 fail; (1 controls: 1|2 controls: 2|3 controls: 3) red as planted, 0 missed$' ||
    { tail -n 1 "$out"; echo "FAIL: --only summary"; exit 1; }

"$DRAMA_BIN" contract --bogus >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: bad option must exit 2"; exit 1; }
"$DRAMA_BIN" contract --only no-such-kernel --no-limits >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: empty selection must exit 2"; exit 1; }
"$DRAMA_BIN" contract --only no-such-kernel --list >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: --list of an empty selection must exit 2"; exit 1; }
echo "contract e2e: ok ($last)"
