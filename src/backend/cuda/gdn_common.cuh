/* gdn_common.cuh - what the DeltaNet kernels (gdn.cu, gdn_fused.cu) share: the recurrence's
 * block shape (two threads per state column), the conv's register window and the q/k l2 norm. */
#ifndef DRAMA_BACKEND_CUDA_GDN_COMMON_CUH
#define DRAMA_BACKEND_CUDA_GDN_COMMON_CUH

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"

#define REC_THREADS (2 * DR_CUDA_GDN_MAX_DV) /* two threads per state column */
#define GDN_ROWS (DR_CUDA_GDN_MAX_DK / 2)

#define CONV_MAX_WIN 7 /* K - 1 values of window held in registers across a call's rows (longer: from memory) */

/* x[0..d) *= fp32(1 / sqrt(sum x^2 + eps)) * scale (dr_op_l2norm) for x = q (scale qscale) and
 * x = k (scale 1), by the whole block; the two sums share the barriers of one reduction, each with
 * block_sum_d's tree, so the values are those of two separate norms. sh: 64 doubles. */
__device__ __forceinline__ void block_l2norm_qk(float *q, float *k, int d, float qscale, double *sh) {
    double sq = 0.0, sk = 0.0;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        sq += (double)q[e] * (double)q[e];
        sk += (double)k[e] * (double)k[e];
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    sq = warp_sum_d(sq);
    sk = warp_sum_d(sk);
    __syncthreads(); /* sh may still be read by a previous reduction */
    if (lane == 0) sh[w] = sq, sh[32 + w] = sk;
    __syncthreads();
    sq = warp_sum_d(lane < nw ? sh[lane] : 0.0);
    sk = warp_sum_d(lane < nw ? sh[32 + lane] : 0.0);
    const float rq = fmul((float)(1.0 / sqrt(sq + (double)1e-6f)), qscale);
    const float rk = fmul((float)(1.0 / sqrt(sk + (double)1e-6f)), 1.0f);
    __syncthreads(); /* every thread has read q and k before anyone rescales them */
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        q[e] = fmul(q[e], rq);
        k[e] = fmul(k[e], rk);
    }
    __syncthreads();
}

#endif
