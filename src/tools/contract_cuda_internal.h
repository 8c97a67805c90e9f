/* contract_cuda_internal.h - shared by the CUDA contract files (contract_cuda*.c): device buffers
 * of one case, freed together, and the registries of the activation kernels. */
#ifndef DRAMA_TOOLS_CONTRACT_CUDA_INTERNAL_H
#define DRAMA_TOOLS_CONTRACT_CUDA_INTERNAL_H

#include "tools/contract_internal.h"

#ifdef DRAMA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"

#define CU_MAX_BUF 96
typedef struct cu_t {
    dr_cuda *c;
    drama_error err;
    int failed;              /* a device call failed: err holds why */
    void *buf[CU_MAX_BUF];   /* device allocations of the current case */
    dr_cuda_weight *w[CU_MAX_BUF];
    int nbuf, nw;
} cu_t;

/* Opens device 0; on failure records a case error (a control then is MISSED) and returns -1. */
int cu_open(cu_t *t, ct_result *res);
void cu_close(cu_t *t);
void *cu_alloc(cu_t *t, size_t bytes);                   /* uninitialised */
void *cu_put(cu_t *t, const void *host, size_t bytes);   /* device copy of host bytes */
void *cu_poison(cu_t *t, size_t bytes);                  /* bytes of 0xFF: the NaN pattern */
void *cu_zero(cu_t *t, size_t bytes);
dr_cuda_weight *cu_weight(cu_t *t, const dr_weight *w); /* uploaded, freed with the case */
/* device array of n device pointers base + i * stride_bytes */
void *cu_ptrs(cu_t *t, void *const *ptrs, int n);
int cu_get(cu_t *t, void *host, const void *dev, size_t bytes); /* syncs; 0 or -1 */
/* Ends a case: on a failed device call records a case error under `name` and returns -1. */
int cu_case_end(cu_t *t, ct_result *res, const char *name);
void cu_free_all(cu_t *t);
/* Best of 5 x 20 calls of fn(arg) (CUDA events, after 5 warm-up calls), in ms per call. */
double cu_time(cu_t *t, drama_status (*fn)(void *arg), void *arg);
/* "no CUDA device (...)" when there is none (the entries are then NOT RUN), else NULL */
const char *cu_unavailable(char *why, size_t why_size);
#endif

/* The MoE entries (contract_cuda_moe.c): variant k->variant - CT_CUDA_MOE_FIRST selects the expert
 * format and layout; control CT_CUDA_NO_RENORM creates the device layer with norm_topk flipped,
 * CT_CUDA_MOE_UP_NEXT / _WSEL_NEXT plant the few-row kernels' defects (dr_cuda_moe_plant_defect),
 * CT_CUDA_MOE_LEAN_NEXT the lean down kernel's (moe_lean.* entries), CT_CUDA_MOE_XT_NEXT the decode
 * gate/up kernel's transposed SwiGLU layout (defect 4), CT_CUDA_GROUPED_STAGE the staged grouped
 * down kernel's tile staging (group defect 2), CT_CUDA_MOE_STALE_VIEW / _STALE_ROW the persistent
 * kernels' item walks (defects 5, 6; moe_persist.* entries), CT_CUDA_GROUPED_WALK_GU / _DN the
 * grouped walk kernels' x kept across tiles (group defects 3, 4; moe_grouped_walk.cuh),
 * CT_CUDA_MOE_P2_NEXT_ROW / _STALE_SHARED the second persistent kernels' walks (defects 7, 8;
 * moe_persist2.* entries). */
#define CT_CUDA_MOE_VARIANTS 8
#define CT_CUDA_MOE_FIRST 5 /* CM_MOE of contract_cuda_model.c */
enum { CT_CUDA_NO_RENORM = 100, CT_CUDA_GROUPED_TILE = 101, CT_CUDA_MOE_UP_NEXT, CT_CUDA_MOE_WSEL_NEXT,
       CT_CUDA_MOE_LEAN_NEXT, CT_CUDA_MOE_XT_NEXT, CT_CUDA_GROUPED_STAGE, CT_CUDA_MOE_STALE_VIEW,
       CT_CUDA_MOE_STALE_ROW, CT_CUDA_GROUPED_WALK_GU, CT_CUDA_GROUPED_WALK_DN, CT_CUDA_MOE_P2_NEXT_ROW,
       CT_CUDA_MOE_P2_STALE_SHARED, CT_CUDA_MOE_P2_STAGE_NEXT, CT_CUDA_MOE_P2_SCALE_ROW,
       CT_CUDA_MOE_P2_ROUTE_NEXT };
const char *ct_cuda_moe_name(int i);
void ct_cuda_check_moe(const ct_kernel *k, ct_ctx *ctx, ct_result *res);

/* The tensor-core BF16 product of the prefill (contract_cuda_gemm.c). */
int ct_cuda_gemm_kernels(ct_kernel *out, int max);
int ct_cuda_gemm_controls(ct_kernel *out, int max);

/* Registries of the activation kernels (contract_cuda_ops.c, contract_cuda_model.c); without the
 * CUDA backend they register nothing. */
int ct_cuda_ops_kernels(ct_kernel *out, int max);
int ct_cuda_ops_controls(ct_kernel *out, int max);
int ct_cuda_model_kernels(ct_kernel *out, int max);
int ct_cuda_model_controls(ct_kernel *out, int max);
int ct_cuda_codec_kernels(ct_kernel *out, int max); /* contract_cuda_codec.c */
int ct_cuda_codec_controls(ct_kernel *out, int max);
int ct_cuda_norm_kernels(ct_kernel *out, int max); /* contract_cuda_norm.c: the norm-fused product */
int ct_cuda_norm_controls(ct_kernel *out, int max);
/* contract_cuda_xt.c: the n = 1 product with x staged plain (DRAMA_CUDA_XT=0); contract_cuda_moe.c:
 * the MoE down kernel at <= 128 registers (DRAMA_CUDA_MOE_DOWN). */
int ct_cuda_xt_kernels(ct_kernel *out, int max);
int ct_cuda_xt_controls(ct_kernel *out, int max);
int ct_cuda_moe_lean_kernels(ct_kernel *out, int max);
int ct_cuda_moe_lean_controls(ct_kernel *out, int max);
/* contract_cuda_pdl.c: the ordering under programmatic dependent launch (DRAMA_CUDA_PDL) */
int ct_cuda_pdl_kernels(ct_kernel *out, int max);
int ct_cuda_pdl_controls(ct_kernel *out, int max);
int ct_cuda_moe_persist_kernels(ct_kernel *out, int max); /* contract_cuda_moe.c: moe_persist.cuh */
int ct_cuda_moe_persist_controls(ct_kernel *out, int max);
int ct_cuda_moe_persist2_kernels(ct_kernel *out, int max); /* contract_cuda_moe.c: moe_persist2.cu */
int ct_cuda_moe_persist2_controls(ct_kernel *out, int max);
/* contract_cuda_sample.c: the faster draw (DRAMA_CUDA_SAMPLE) vs the CPU and the sort-all kernels */
int ct_cuda_sample_kernels(ct_kernel *out, int max);
int ct_cuda_sample_controls(ct_kernel *out, int max);
/* the matmul.* entries' stated time limit for format f (contract_cuda.c) */
double ct_cuda_matmul_limit_ms(int f);

#endif
