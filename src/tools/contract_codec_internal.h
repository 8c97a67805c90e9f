/* contract_codec_internal.h - INTERNAL to the codec's contract entries (contract_codec.c: the convs,
 * Snake and norms, the registration; contract_codec_tf.c: RoPE, attention, the element-wise ops and the
 * VQ search): the kernel and control ids and the small allocation helpers (the input kinds: contract_internal.h). */
#ifndef DRAMA_TOOLS_CONTRACT_CODEC_INTERNAL_H
#define DRAMA_TOOLS_CONTRACT_CODEC_INTERNAL_H

#include <math.h>
#include <stdlib.h>

#include "tools/contract_internal.h"

#define U CT_U32
#define TINY 0x1p-140

enum { K_CONV, K_STRIDED, K_GROUPED, K_TRANSPOSED, K_SNAKE, K_LN, K_RMS, K_ROPE, K_ROPE_F32,
       K_ATTEND, K_SWIGLU, K_TANH, K_VQ, K_GELU, K_FUSED, K_COUNT };
/* variant = kernel | instruction set << 8 (CD_ISA_*: the SIMD entries of the conv and Snake kernels) */
#define KV(k) ((k)->variant & 0xff)
#define KISA(k) ((k)->variant >> 8 & 0xf)
/* variant bit 12: the AVX2 GEMM blocking forced small (contraction blocks of 3 input channels, 3
 * weight blocks per task), so every shape runs several blocks with partial sums carried */
#define KGEMM(k) ((k)->variant >> 12 & 1)
enum { CC_NONE = 0, CC_TAPS_REV, CC_DIL, CC_FP16, CC_NO_HIST, CC_PHASE, CC_SNAKE_ALPHA, CC_SNAKE_NO_EPS, CC_NO_EPS,
       CC_WIDE, CC_TIES_HIGH, CC_GELU_TANH, CC_ROPE_BASE, CC_SWAP, CC_HALF, CC_SIMD_TAP, CC_SIMD_PARITY, CC_SIMD_KC };


static inline float *fvec(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }
static inline double *dvec(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

/* contract_codec_tf.c's checks (k_check in contract_codec.c) */
void ct_codec_check_rope(const ct_kernel *k, ct_ctx *ctx, ct_result *res);
void ct_codec_check_attend(const ct_kernel *k, ct_ctx *ctx, ct_result *res);
void ct_codec_check_elementwise(const ct_kernel *k, ct_ctx *ctx, ct_result *res);
void ct_codec_check_vq(const ct_kernel *k, ct_ctx *ctx, ct_result *res);

#endif
