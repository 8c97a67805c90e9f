/* weight.h - a 2-D weight matrix [rows=out, cols=in] in its stored format.
 *
 * The model binds every matrix it multiplies as a dr_weight pointing into the mmapped
 * checkpoint; kernels read the stored bytes directly and dequantise inside the dot product.
 * Nothing here owns memory. Pointers may be unaligned (MLX files are not padded).
 * Formats and their companions: ../shared/spec/FORMATS.md section 4.
 */
#ifndef DRAMA_NUM_WEIGHT_H
#define DRAMA_NUM_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"

typedef enum dr_wfmt {
    DR_WF_INVALID = 0,
    DR_WF_F32,       /* dense float32 */
    DR_WF_F16,       /* dense IEEE half */
    DR_WF_BF16,      /* dense bfloat16 */
    DR_WF_FP8_BLOCK, /* E4M3 codes + scale per (block_rows x block_cols) block, scale_dtype F32|BF16 */
    DR_WF_FP8_TENSOR,/* E4M3 codes * global_scale */
    DR_WF_NVFP4,     /* E2M1 pairs (low nibble first) + UE4M3 scale per 16 cols + global_scale */
    DR_WF_AFFINE     /* MLX affine: U32 words of `bits`-bit codes, scales/biases per `group` cols */
} dr_wfmt;

typedef struct dr_weight {
    dr_wfmt fmt;
    int64_t rows, cols;      /* logical [out, in] */
    const uint8_t *data;     /* codes / dense values, row-major; row r starts at data + r*row_bytes */
    size_t row_bytes;
    const uint8_t *scales;   /* FP8_BLOCK: [ceil(rows/br), ceil(cols/bc)]; NVFP4: [rows, cols/16] E4M3;
                                AFFINE: [rows, cols/group] in scale_dtype */
    const uint8_t *biases;   /* AFFINE only: same shape/dtype as scales */
    dr_dtype scale_dtype;    /* F32 / BF16 / F16 for FP8_BLOCK and AFFINE scales */
    int64_t scale_cols;      /* columns of the scales matrix */
    float global_scale;      /* FP8_TENSOR weight_scale, NVFP4 weight_scale_2; 1 otherwise */
    int block_rows, block_cols; /* FP8_BLOCK block size (default 128 x 128) */
    int bits, group;         /* AFFINE: 4 or 8 bits, group 32/64/128 */
    const char *name;        /* tensor name for messages (owned by the checkpoint) */
} dr_weight;

/* Dequantise one row of W into out[cols] exactly as FORMATS.md section 4 says (fp32).
 * The reference path, and the embedding lookup. */
void dr_weight_dequant_row(const dr_weight *w, int64_t r, float *out);

/* Build a dr_weight from a main tensor and its companions (NULL where the format has none):
 * scale = weight_scale_inv / weight_scale / scales, scale2 = weight_scale_2, bias = biases.
 * `slice` selects expert e of a fused 3-D tensor (-1 for 2-D). Checks every shape and dtype
 * and names the tensor at fault. block_rows/cols from the config (0 = 128). */
drama_status dr_weight_bind(const dr_tensor *w, const dr_tensor *scale, const dr_tensor *scale2,
                            const dr_tensor *bias, int64_t slice, int block_rows, int block_cols,
                            dr_weight *out, drama_error *err);

/* dr_weight_bind with the logical input width when the caller knows it (in_cols > 0; 0 = derive
 * from the shapes). MLX affine shapes alone are ambiguous (4-bit group 64 and 8-bit group 32
 * give the same shapes): without in_cols the 4-bit reading wins, as FORMATS.md 4.4 makes 4 bits
 * the required case. For the other formats a nonzero in_cols is checked against the shapes. */
drama_status dr_weight_bind_ex(const dr_tensor *w, const dr_tensor *scale, const dr_tensor *scale2,
                               const dr_tensor *bias, int64_t slice, int block_rows, int block_cols,
                               int64_t in_cols, dr_weight *out, drama_error *err);

/* A view of rows [r0, r1) of `w` (e.g. the gate and up halves of a fused gate_up_proj).
 * For FP8_BLOCK r0 must be a multiple of block_rows (the view keeps the scale rows it needs). */
drama_status dr_weight_rows(const dr_weight *w, int64_t r0, int64_t r1, dr_weight *out, drama_error *err);

/* Bytes of W that a full product reads (codes + scales + biases): the bench's GB/s numerator. */
size_t dr_weight_bytes(const dr_weight *w);

/* One scale/bias element of dtype F32, BF16 or F16 at index i of an unaligned array. */
float dr_weight_load_scale(const uint8_t *base, dr_dtype dt, int64_t i);

#endif
