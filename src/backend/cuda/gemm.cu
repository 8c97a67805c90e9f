/* gemm.cu - y (+)= x W^T for BF16 weights and many activation rows on the tensor cores (gemm.h).
 *
 * Why: the matvec kernel reads W once per 16 rows of x and spends one fp32 load of x per FMA, so
 * a prefill of 30-100 rows is bound by those loads; here a block of 8 warps takes 16 output rows,
 * the warps split K in pairs of 32-column chunks (pair p to warp p mod 8) and each weight element
 * is read once for up to 64 rows of x (more rows: further passes over the same 16 rows, from L2).
 *
 * Precision: BF16 x BF16 products are exact in fp32, so x is split in three BF16 terms, hi =
 * bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid) (3 x 8 bits cover fp32's 24: x exactly, both
 * differences exact, for |x| >= 2^-100), and each k-step's three mma (lo, mid, hi: the small terms
 * first) go into a FRESH zero accumulator that is then added to the thread's running sum with an
 * IEEE fp32 add: the mma's truncating accumulation so only ever sees one k-step's 16 columns, never
 * the running sum. The 8 warps' partial sums are added in warp order (deterministic, independent of
 * n and of the other rows). The bound (docs/cuda.md "Prefill"): |y - exact| <= (19 2^-23 + (K/128 +
 * 8) 2^-24) sum |w x| (+ 2^-133 sum |w| over |x| < 2^-100, where lo underflows).
 *
 * Fragment layout: the dot product does not depend on the order of k, so thread (g = lane / 4,
 * c = lane % 4) loads the 16 contiguous bytes of columns [8c, 8c + 8) of its two weight rows (g,
 * g + 8) and of its x row; columns 8c .. 8c+3 are the mma's k = {2c, 2c+1, 2c+8, 2c+9} of the first
 * k-step and 8c+4 .. 8c+7 those of the second, for A and B alike. */
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/gemm.h"
#include "backend/cuda/matvec_kernel.cuh"

#define GM_WARPS 8
#define GM_ROWS 16
#define GM_SUB 2 /* 32-column chunks a warp takes together (16 B of each of its 2 weight rows per chunk) */

__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<unsigned *>(&v); }

/* (a, b) -> hi, mid and lo pairs, low half = a; an infinite x keeps mid = lo = 0 (x - hi would be NaN) */
template <int DEFECT>
__device__ __forceinline__ void split3(float a, float b, unsigned &h, unsigned &m, unsigned &l) {
    __nv_bfloat162 hh = __floats2bfloat162_rn(a, b);
    float ra = __fsub_rn(a, __low2float(hh)), rb = __fsub_rn(b, __high2float(hh)); /* exact */
    if (!isfinite(ra)) ra = 0.0f;
    if (!isfinite(rb)) rb = 0.0f;
    __nv_bfloat162 mm = __floats2bfloat162_rn(ra, rb);
    float sa = __fsub_rn(ra, __low2float(mm)), sb = __fsub_rn(rb, __high2float(mm)); /* exact, <= 8 bits */
    if constexpr (DEFECT == DR_CUDA_GEMM_DEFECT_NO_LO) sa = sb = 0.0f; /* planted: the third term dropped */
    h = bf2_bits(hh);
    m = bf2_bits(mm);
    l = bf2_bits(__floats2bfloat162_rn(sa, sb));
}

template <int NTL, int DEFECT>
__global__ void __launch_bounds__(GM_WARPS * 32) gemm_bf16_kernel(const __grid_constant__ mv_batch b) {
    __shared__ float red[GM_WARPS][GM_ROWS][NTL * 8 + 1];
    const mv_job &J = b.job[blockIdx.y];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t row0 = J.r0 + (int64_t)blockIdx.x * GM_ROWS;
    pdl_trigger();
    if (row0 >= J.r1) return; /* the whole block */
    const int64_t ra = row0 + g, rb = row0 + g + 8, K = J.cols;
    const bool oka = ra < J.r1, okb = rb < J.r1;
    const uint8_t *wa = J.data + (oka ? ra : row0) * J.pitch, *wb = J.data + (okb ? rb : row0) * J.pitch;
    const int64_t ystride = J.y_ld ? J.y_ld : J.r1 - J.r0;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    for (int64_t n0 = 0; n0 < J.n; n0 += NTL * 8) {
        float acc[NTL][4];
#pragma unroll
        for (int t = 0; t < NTL; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        /* warp w takes the chunk pairs w, w + 8, ... (chunks 2p and 2p + 1); the next pair's weights are
         * in flight while this one is multiplied */
        uint4 A[GM_SUB], B[GM_SUB], An[GM_SUB], Bn[GM_SUB];
        int64_t kp = warp;
#pragma unroll
        for (int u = 0; u < GM_SUB; u++) {
            const int64_t k = (kp * GM_SUB + u) * 32 + 8 * c;
            A[u] = (k < K && oka) ? ld_stream(wa + k * 2) : z4;
            B[u] = (k < K && okb) ? ld_stream(wb + k * 2) : z4;
        }
        if (n0 == 0) pdl_wait(); /* the first weight tile is in flight; x and y after */
        for (; kp * GM_SUB * 32 < K; kp += GM_WARPS) {
#pragma unroll
            for (int u = 0; u < GM_SUB; u++) {
                const int64_t kn = ((kp + GM_WARPS) * GM_SUB + u) * 32 + 8 * c;
                An[u] = (kn < K && oka) ? ld_stream(wa + kn * 2) : z4;
                Bn[u] = (kn < K && okb) ? ld_stream(wb + kn * 2) : z4;
            }
#pragma unroll
            for (int u = 0; u < GM_SUB; u++) {
                const int64_t k = (kp * GM_SUB + u) * 32 + 8 * c;
                uint4 Au = A[u], Bu = B[u];
                if constexpr (DEFECT == DR_CUDA_GEMM_DEFECT_SWAP_K) { /* planted: the weight's k-steps swapped */
                    Au = make_uint4(A[u].z, A[u].w, A[u].x, A[u].y);
                    Bu = make_uint4(B[u].z, B[u].w, B[u].x, B[u].y);
                }
#pragma unroll
                for (int t = 0; t < NTL; t++) {
                    const int64_t xr = n0 + t * 8 + g;
                    float xv[8];
                    if (xr < J.n && k + 8 <= K) {
                        const float4 *xp = reinterpret_cast<const float4 *>(J.x + xr * K + k);
                        float4 p = __ldg(xp), q = __ldg(xp + 1);
                        xv[0] = p.x, xv[1] = p.y, xv[2] = p.z, xv[3] = p.w, xv[4] = q.x, xv[5] = q.y, xv[6] = q.z,
                        xv[7] = q.w;
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; e++) xv[e] = 0.0f; /* K % 8 == 0: a chunk is all in or all out */
                    }
                    unsigned h[4], m[4], l[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) split3<DEFECT>(xv[2 * e], xv[2 * e + 1], h[e], m[e], l[e]);
#pragma unroll
                    for (int q = 0; q < 2; q++) { /* the chunk's two k-steps: columns 8c..8c+3, then 8c+4..8c+7 */
                        const unsigned a0 = q ? Au.z : Au.x, a2 = q ? Au.w : Au.y, b0 = q ? Bu.z : Bu.x,
                                       b2 = q ? Bu.w : Bu.y;
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* fresh: the truncation sees this k-step only */
                        mma_bf16(d, a0, b0, a2, b2, l[2 * q], l[2 * q + 1]);
                        mma_bf16(d, a0, b0, a2, b2, m[2 * q], m[2 * q + 1]);
                        mma_bf16(d, a0, b0, a2, b2, h[2 * q], h[2 * q + 1]);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[t][e] = __fadd_rn(acc[t][e], d[e]);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < GM_SUB; u++) A[u] = An[u], B[u] = Bn[u];
        }
#pragma unroll
        for (int t = 0; t < NTL; t++) {
            red[warp][g][t * 8 + 2 * c] = acc[t][0];
            red[warp][g][t * 8 + 2 * c + 1] = acc[t][1];
            red[warp][g + 8][t * 8 + 2 * c] = acc[t][2];
            red[warp][g + 8][t * 8 + 2 * c + 1] = acc[t][3];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < GM_ROWS * NTL * 8; i += blockDim.x) {
            const int r = i % GM_ROWS, t = i / GM_ROWS;
            const int64_t row = row0 + r, tt = n0 + t;
            if (row >= J.r1 || tt >= J.n) continue;
            float s = red[0][r][t];
#pragma unroll
            for (int w = 1; w < GM_WARPS; w++) s = __fadd_rn(s, red[w][r][t]);
            const int64_t off = tt * ystride + (row - J.r0);
            J.y[off] = J.add ? __fadd_rn(J.y[off], s) : s;
            if (J.y2) J.y2[off] = __fadd_rn(J.y2[off], s);
        }
        __syncthreads();
    }
}

template <int DEFECT> static void launch(const mv_batch *b, cudaStream_t s) {
    dim3 grid((unsigned)((b->max_rows + GM_ROWS - 1) / GM_ROWS), (unsigned)b->count);
    if (b->max_n <= 32) dr_launch(b->pdl, gemm_bf16_kernel<4, DEFECT>, grid, GM_WARPS * 32, 0, s, *b);
    else dr_launch(b->pdl, gemm_bf16_kernel<8, DEFECT>, grid, GM_WARPS * 32, 0, s, *b);
}

extern "C" int dr_cuda_gemm_ok(const dr_cuda_job *j) {
    return j && j->w && j->w->fmt == MV_BF16 && j->w->cols % 8 == 0 && j->x && (uintptr_t)j->x % 16 == 0;
}

extern "C" drama_status dr_cuda_gemm_batch(dr_cuda *c, const dr_cuda_job *jobs, int count, int defect, drama_error *err) {
    if (!c || (count > 0 && !jobs)) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gemm_batch: NULL argument");
    if (defect < 0 || defect >= DR_CUDA_GEMM_DEFECT_COUNT)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gemm_batch: unknown defect %d", defect);
    mv_batch *bp = (mv_batch *)calloc(1, sizeof *bp);
    if (!bp) return dr_fail(err, DRAMA_ENOMEM, "dr_cuda_gemm_batch: out of host memory");
    drama_status st = DRAMA_OK;
    for (int i = 0; i <= count && !st; i++) {
        if (i < count) {
            const dr_cuda_job *q = &jobs[i];
            if (!dr_cuda_gemm_ok(q) || !q->y || q->n < 0 || q->w->ctx != c) {
                st = dr_fail(err, DRAMA_EINVAL, "dr_cuda_gemm_batch: job %d (%s) is not a BF16 product of this context", i,
                             q->w ? q->w->name : "no weight");
                break;
            }
            int64_t r0 = q->r0, r1 = q->r1;
            if (r0 == 0 && r1 == 0) r1 = q->w->rows;
            if (r0 < 0 || r1 > q->w->rows || r0 >= r1 || (q->y_ld && q->y_ld < r1 - r0)) {
                st = dr_fail(err, DRAMA_EINVAL, "%s: rows [%lld, %lld) of %lld", q->w->name, (long long)r0, (long long)r1,
                             (long long)q->w->rows);
                break;
            }
            if (q->n == 0) continue;
            mv_job *j = &bp->job[bp->count++];
            *j = dr_cuda_weight_view(q->w);
            j->x = q->x, j->y = q->y, j->n = q->n, j->r0 = r0, j->r1 = r1, j->y_ld = q->y_ld, j->add = q->add, j->y2 = q->y2;
            if (r1 - r0 > bp->max_rows) bp->max_rows = r1 - r0;
            if (q->n > bp->max_n) bp->max_n = q->n;
        }
        if (bp->count && (bp->count == DR_CUDA_MAX_BATCH || i == count)) {
            bp->pdl = c->pdl;
            if (defect == DR_CUDA_GEMM_DEFECT_NO_LO) launch<DR_CUDA_GEMM_DEFECT_NO_LO>(bp, c->stream);
            else if (defect == DR_CUDA_GEMM_DEFECT_SWAP_K) launch<DR_CUDA_GEMM_DEFECT_SWAP_K>(bp, c->stream);
            else launch<DR_CUDA_GEMM_EXACT>(bp, c->stream);
            st = dr_cuda_check(cudaGetLastError(), "tensor-core product launch", err);
            memset(bp, 0, sizeof *bp);
        }
    }
    free(bp);
    return st;
}
