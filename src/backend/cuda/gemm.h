/* gemm.h - INTERNAL to the CUDA backend: products of many activation rows with BF16 weights on the
 * tensor cores (gemm.cu), for the prefill (the seam's queued products, cuda_seam_ops.cu) and the
 * contract. Not dr_cuda_matmul: that one is bit-identical for any n; this one reads each weight
 * once for up to 64 rows and sums in another order, within the bound documented in docs/cuda.md
 * ("Prefill"). */
#ifndef DRAMA_BACKEND_CUDA_GEMM_H
#define DRAMA_BACKEND_CUDA_GEMM_H

#include "backend/cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of x at which the seam takes this path (DRAMA_CUDA_TC=0 turns it off). */
#define DR_CUDA_GEMM_MIN_N 8

typedef enum dr_cuda_gemm_defect {
    DR_CUDA_GEMM_EXACT = 0,
    DR_CUDA_GEMM_DEFECT_NO_LO,     /* planted: the third BF16 term of x's split (lo) dropped */
    DR_CUDA_GEMM_DEFECT_SWAP_K,    /* planted: the weight's two k-steps of a 32-column chunk swapped */
    DR_CUDA_GEMM_DEFECT_COUNT
} dr_cuda_gemm_defect;

/* 1 when job j can take the tensor-core path: BF16 weight, cols a multiple of 8, x 16-byte aligned. */
int dr_cuda_gemm_ok(const dr_cuda_job *j);
/* The jobs' products (each dr_cuda_gemm_ok), one launch per DR_CUDA_MAX_BATCH jobs: y (+)= x W^T as
 * dr_cuda_matmul_batch's job fields say (rows, y_ld, add, y2). x is split as hi + mid + lo BF16 (x
 * exactly), each k-step's three mma.sync m16n8k16 into a fresh fp32 accumulator added to a running
 * sum with IEEE adds. Queued. */
drama_status dr_cuda_gemm_batch(dr_cuda *c, const dr_cuda_job *jobs, int count, int defect, drama_error *err);

#ifdef __cplusplus
}
#endif

#endif
