/* cuda_seam_kernels.h - INTERNAL: launchers of the kernels in the seam's forms (backend.h: rows as
 * dr_seq_row tables, statuses as dr_op_status), used by the CUDA backend (cuda_seam*.cu). They run
 * the same device code as the cuda_ops.h entries the contract checks; only where a row's position,
 * caches and hold flag are read differs (dev_rows.cuh). */
#ifndef DRAMA_BACKEND_CUDA_SEAM_KERNELS_H
#define DRAMA_BACKEND_CUDA_SEAM_KERNELS_H

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_ops.h"

/* Attention (dr_attn_args): q (gate at q + hd when gated) normed and rotated in place, K/V written
 * at each row's position, out [n][nh hd]. ws: dr_cuda_attn_ws_bytes(s, n, 0). */
drama_status dr_cuda_seam_attention(dr_cuda *c, const dr_cuda_attn_shape *s, const dr_seq_row *rows, int layer, int64_t n,
                                    float *q, int64_t q_ld, int64_t q_hs, const float *k, const float *v, int64_t kv_ld,
                                    int gated, void *ws, size_t ws_bytes, float *out, drama_error *err);
/* DeltaNet (dr_gdn_args): conv + SiLU into y, gates into a/b, the recurrence into out (un-normed). */
drama_status dr_cuda_seam_deltanet(dr_cuda *c, const dr_cuda_gdn_shape *s, const dr_seq_row *rows, int layer,
                                   int64_t n, int one_session, const float *u, float *y, float *a, float *b,
                                   float *out, drama_error *err);
/* x[h] = rms_norm(x[h], w) * silu(z[h]) for n rows of heads x dv (w [dv], or [heads dv] per head). */
drama_status dr_cuda_seam_gated_norm(dr_cuda *c, float *x, const float *w, int per_head, const float *z, double eps,
                                     int64_t heads, int64_t dv, int64_t n, drama_error *err);
/* The MoE with per-row statuses (DR_FAULT_ROUTER, a = layer, ENUMERIC). tc = 1 (a prefill, outside a
 * frame step): the router and shared-gate products of calls of >= DR_CUDA_GEMM_MIN_N rows with BF16
 * weights on the tensor cores (gemm.h), as the seam's other prefill products. */
drama_status dr_cuda_seam_moe(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, void *ws,
                              size_t ws_bytes, int layer, int tc, dr_op_status *status, drama_error *err);
/* Element-wise and data movement (backend.h's ops of the same names). */
drama_status dr_cuda_seam_add(dr_cuda *c, float *x, const float *y, int64_t count, drama_error *err);
drama_status dr_cuda_seam_swiglu(dr_cuda *c, const float *g, const float *u, int64_t count, float *y, drama_error *err);
drama_status dr_cuda_seam_check_finite(dr_cuda *c, const float *x, int64_t width, int64_t n, dr_op_status *status,
                                       drama_error *err);
drama_status dr_cuda_seam_scatter_rows(dr_cuda *c, const float *src, int64_t width, int64_t n, float *const *dst,
                                       int64_t dst_off, const dr_seq_row *rows, drama_error *err);
drama_status dr_cuda_seam_gather_rows(dr_cuda *c, float *dst, int64_t width, int64_t n, const float *const *src,
                                      drama_error *err);
drama_status dr_cuda_seam_advance(dr_cuda *c, const dr_seq_row *rows, int64_t n, drama_error *err);
drama_status dr_cuda_seam_frame_rows(dr_cuda *c, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                                     int64_t sem_start, int32_t *rows, drama_error *err);

/* one-time kernel settings (shared memory opt-ins) */
drama_status dr_cuda_attn_init(drama_error *err);
drama_status dr_cuda_sample_init(drama_error *err);

#endif
