/* quant.h - encoders from fp32 weights to the stored formats `drama make-model` / `drama optimize`
 * write (FORMATS.md section 6 for block FP8 and NVFP4, section 4.4 for MLX affine).
 *
 * Sources are fp32 [rows, cols] row-major (dequantise BF16/FP8/... sources exactly first, e.g. with
 * dr_weight_dequant_row). Outputs are byte buffers holding exactly the little-endian bytes of the
 * stored tensors, ready for dr_st_writer_write; the caller allocates them with the sizes below.
 * Every intermediate expression is evaluated in fp64 from the fp32 operands and only the final
 * value is encoded (FORMATS.md 6), which the golden vectors ref/quant-units.safetensors follow
 * bit for bit. A non-finite source value is a DRAMA_ENUMERIC error naming the row and column.
 *
 * Typical use for one expert (gate, up, down of shape [out, in]):
 *   fp8:   codes = rows*cols bytes (F8_E4M3 [out, in]),
 *          scales = ceil(out/128)*ceil(in/128) floats (F32 weight_scale_inv);
 *          dr_quant_fp8_block(w, out, in, 128, 128, codes, scales, err)
 *   nvfp4: gs = dr_quant_nvfp4_global_scale(max(dr_quant_amax(gate), dr_quant_amax(up)))  (shared
 *          by gate and up; down uses its own amax), then dr_quant_nvfp4(w, out, in, gs, packed
 *          (out*in/2 bytes, U8), scales (out*in/16 bytes, F8_E4M3), err); store gs as F32 [].
 *   q4:    dr_quant_affine(w, out, in, 4, 64, DR_DT_BF16, words (out*in*4/32 U32 = out*in/2 bytes),
 *          scales, biases (out*in/64 elements each of 2 bytes), err)
 */
#ifndef DRAMA_NUM_QUANT_H
#define DRAMA_NUM_QUANT_H

#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"

/* max |src[i]| over n values (NaN is skipped here; the encoders reject it). */
float dr_quant_amax(const float *src, int64_t n);

/* Block FP8, blocks of br x bc (0 = 128): per block scale = f32(amax_blk / 448) (an all-zero block
 * stores 1.0), codes = e4m3_satfinite_rne(w / scale). codes: rows*cols bytes; scales:
 * ceil(rows/br) * ceil(cols/bc) floats, row-major (the F32 weight_scale_inv tensor). */
drama_status dr_quant_fp8_block(const float *src, int64_t rows, int64_t cols, int br, int bc, uint8_t *codes,
                                float *scales, drama_error *err);

/* NVFP4 global scale (weight_scale_2) for a tensor whose max |w| is amax: f32(amax / (6 * 448));
 * 1.0 when amax == 0. */
float dr_quant_nvfp4_global_scale(float amax);

/* NVFP4 with the given global scale: per 16 inputs s = e4m3_satfinite_rne((amax_blk / 6) / gs)
 * stored as a UE4M3 byte, codes e2m1_rne(w / (UE4M3(s) * gs)) (zero codes when s == 0), packed two
 * per byte, element 2j in the low nibble. cols % 16 == 0. packed: rows*cols/2 bytes; scales:
 * rows*cols/16 bytes. */
drama_status dr_quant_nvfp4(const float *src, int64_t rows, int64_t cols, float global_scale, uint8_t *packed,
                            uint8_t *scales, drama_error *err);

/* MLX affine, `bits` 4 or 8, `group` 32/64/128 (cols % group == 0), scales and biases stored in
 * scale_dtype (BF16, F16 or F32) with the rule of FORMATS.md 4.4. words: rows*cols*bits/8 bytes
 * (U32 [rows, cols*bits/32], little-endian); scales, biases: rows*(cols/group) elements of
 * scale_dtype each. */
drama_status dr_quant_affine(const float *src, int64_t rows, int64_t cols, int bits, int group, dr_dtype scale_dtype,
                             uint8_t *words, uint8_t *scales, uint8_t *biases, drama_error *err);

#endif
