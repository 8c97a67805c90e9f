/* moe_route.cuh - the MoE routing of one row by one block of ROUTE_THREADS threads (issue 13): the
 * steps shared by moe.cu's moe_route_kernel and moe_route_rank_kernel, and the rank routing as a
 * device function that moe_persist2.cu's gate/up kernel also runs (each of its blocks routes its
 * row itself: no routing launch between the router product and the experts). The same threads
 * per block everywhere, so every reduction has the same tree and the results the same bits. */
#ifndef DRAMA_BACKEND_CUDA_MOE_ROUTE_CUH
#define DRAMA_BACKEND_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/moe_internal.h"

#define ROUTE_THREADS 256

/* row r has no eligible score: the router error (first failure kept; the seam's per-row status) and
 * no choice (ids and slots -1, weights 0); every thread of the block calls it */
__device__ __forceinline__ void route_fail(int64_t r, int k, int32_t *ids, int32_t *slots, float *wsel, int layer,
                                           dev_status *st, dr_op_status *rst) {
    if (threadIdx.x == 0) dev_fail(st, DR_CUDA_ERR_ROUTER, layer, (int)r);
    if (threadIdx.x == 0 && rst && !rst[r].code) /* the seam: per row, the first failure kept */
        rst[r].code = DRAMA_ENUMERIC, rst[r].fault = DR_FAULT_ROUTER, rst[r].a = layer;
    if (threadIdx.x < k) {
        ids[r * k + threadIdx.x] = slots[r * k + threadIdx.x] = -1;
        wsel[r * k + threadIdx.x] = 0.0f;
    }
}

/* dr_op_softmax over probs [E] (the eligible scores, -inf elsewhere; mx their max): expf(x - max),
 * the sum in double (block_sum_d), one reciprocal; then probs[e] = the probability of an eligible
 * expert, -1 for the others; ends with a barrier. Every thread of the block calls it. */
__device__ __forceinline__ void route_softmax(float *probs, const float *s, const int32_t *slot, int E, float mx,
                                              double *sh) {
    double sum = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float ex = expf(fsub(probs[e], mx));
        probs[e] = ex;
        sum += ex;
    }
    sum = block_sum_d(sum, sh);
    float inv = (float)(1.0 / sum);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = (slot[e] >= 0 && isfinite(s[e])) ? fmul(probs[e], inv) : -1.0f;
        probs[e] = v;
    }
    __syncthreads();
}

/* probs[e] = the score of an eligible expert (kept, finite), -inf for the others: pruned experts and
 * non-finite scores are excluded before the softmax; this thread's eligible count and max */
__device__ __forceinline__ void route_eligible(const float *s, int E, const int32_t *slot, float *probs, int &elig,
                                               float &mx) {
    elig = 0, mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = (slot[e] >= 0 && isfinite(s[e])) ? s[e] : -INFINITY;
        probs[e] = v;
        elig += v != -INFINITY;
        mx = fmaxf(mx, v);
    }
}

/* a block's routing scratch (shared memory) */
struct route_smem {
    double sh[32];
    float shf[32];
    int shc[32];
    int chosen[MOE_MAX_TOPK + 1];
    float chosen_p[MOE_MAX_TOPK + 1];
};

/* moe_route_kernel's choice for the scores s [E] of one row, with fewer barriers: R.chosen[q] /
 * R.chosen_p[q] the expert and probability of rank q (-1 / 0 past the eligible ones), valid in every
 * thread on return. The eligible count and the max share one pair of barriers (both order-free: an
 * exact integer count, fmaxf in block_max_f's tree), the softmax sum is the same block_sum_d, and the
 * k rounds of a block-wide max (3 barriers each) become one pass: each eligible expert's rank is the
 * number of eligible experts before it in prob_key's order (higher probability, or equal and a lower
 * id; p >= 0 and not NaN, so the float compare is the key's compare with +0 = -0), and rank q < k is
 * choice q. Returns 0 (R untouched past -1s) when no score is eligible. probs: [E] shared floats. */
__device__ __forceinline__ int route_rank_row(const float *s, int E, int k, const int32_t *slot, float *probs,
                                              route_smem &R) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int elig;
    float mx;
    route_eligible(s, E, slot, probs, elig, mx);
    if (threadIdx.x <= k) R.chosen[threadIdx.x] = -1, R.chosen_p[threadIdx.x] = 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) elig += __shfl_xor_sync(0xFFFFFFFFu, elig, off);
    mx = warp_max_f(mx);
    if (lane == 0) R.shc[w] = elig, R.shf[w] = mx;
    __syncthreads();
    int ne = lane < nw ? R.shc[lane] : 0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ne += __shfl_xor_sync(0xFFFFFFFFu, ne, off);
    mx = warp_max_f(lane < nw ? R.shf[lane] : -INFINITY);
    if (ne == 0) return 0;
    route_softmax(probs, s, slot, E, mx, R.sh); /* moe_route_kernel's steps */
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float p = probs[e];
        if (p < 0.0f) continue; /* not eligible */
        int rank = 0;
#pragma unroll 8
        for (int j = 0; j < E; j++) {
            const float pj = probs[j];
            rank += pj > p || (pj == p && j < e);
        }
        if (rank < k) R.chosen[rank] = e, R.chosen_p[rank] = p;
    }
    __syncthreads();
    return 1;
}

/* row r's routing outputs from R (threads < k write): ids, slots and the weights (each writer sums
 * the chosen in rank order: thread 0's double) */
__device__ __forceinline__ void route_write(const route_smem &R, int64_t r, int k, int norm_topk, const int32_t *slot,
                                           int32_t *ids, int32_t *slots, float *wsel) {
    if (threadIdx.x < k) {
        double tot = 0.0;
        for (int q = 0; q < k; q++) tot += R.chosen[q] >= 0 ? (double)R.chosen_p[q] : 0.0;
        const int q = threadIdx.x, id = R.chosen[q];
        const float p = R.chosen_p[q];
        ids[r * k + q] = id;
        slots[r * k + q] = id >= 0 ? slot[id] : -1;
        wsel[r * k + q] = norm_topk && tot > 0.0 ? (float)((double)p / tot) : p;
    }
}

#endif
