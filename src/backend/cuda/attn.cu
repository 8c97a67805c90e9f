/* attn.cu - attention with a KV cache (MODEL.md 5.3, 7.2): the per-row preparation (q/k RMS norm,
 * partial RoPE in either pairing, the K/V append) and the attention itself, split over S blocks of
 * positions per (row, KV head) and merged (flash-decoding), for a decode step (rows of distinct
 * sessions) and a prefill (rows of one session at consecutive positions) alike. S depends only on
 * the number of rows, never on positions, so a captured launch stays valid as the context grows;
 * each block walks its share of positions in tiles with a running maximum.
 *
 * Arithmetic: the preparation is the CPU's op for op (double sum of squares, fp32 products, cos/sin
 * of the double angle rounded to fp32, the fp32 rotation). Scores are fp32 dot products times an
 * fp32 scale (dr_op_attend's form); the softmax and the weighted sum of V accumulate in double (as
 * dr_op_attend_f64 does). Both CPU forms are within the contract's tolerance of the result. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_seam_kernels.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/dev_rows.cuh"

#define PREP_THREADS 256
#define ATT_P 256        /* positions per tile (one per thread for the weights) */
#define ATT_THREADS 256
#define ATT_G 8          /* query heads scored per pass over a key row */
#define ATT_MAXG 16      /* query heads per KV head */
#define ATT_MAXD 2       /* head dims per thread: hd <= 512 */
#define ATT_MAX_SPLIT 32
#define ATT_SUB 32       /* positions per K or V sub-tile staged in shared memory */

/* head elements per thread kept in registers (hd <= PREP_REG * PREP_THREADS): the head, its norm
 * weights and V are loaded at the kernel's start, before the position and the cos/sin table */
#define PREP_REG 2

__device__ __forceinline__ void prep_load(const float *x, int n, float fill, float *v) {
#pragma unroll
    for (int k = 0; k < PREP_REG; k++) {
        const int d = threadIdx.x + k * PREP_THREADS;
        v[k] = x && d < n ? x[d] : fill;
    }
}

/* One head: RMS norm (w != NULL) into buf, then RoPE of the first 2*half dims into dst, the rest
 * copied (dst may be src). The whole block calls it. reg: the head is in xv, the weights in wv
 * (block_rms_norm's sum order and products either way). */
__device__ void head_prep(const float *src, float *dst, const float *w, const dr_cuda_attn_shape &s, const float *cs,
                          const float *sn, float *buf, double *sh, bool reg, const float *xv, const float *wv) {
    if (reg && w) {
        double ss = 0.0;
#pragma unroll
        for (int k = 0; k < PREP_REG; k++)
            if (threadIdx.x + k * PREP_THREADS < s.hd) ss += (double)xv[k] * (double)xv[k];
        ss = block_sum_d(ss, sh);
        float r = (float)(1.0 / sqrt(ss / (double)s.hd + s.eps));
#pragma unroll
        for (int k = 0; k < PREP_REG; k++) {
            const int d = threadIdx.x + k * PREP_THREADS;
            if (d < s.hd) buf[d] = fmul(fmul(xv[k], r), wv[k]);
        }
    } else if (reg) {
#pragma unroll
        for (int k = 0; k < PREP_REG; k++)
            if (threadIdx.x + k * PREP_THREADS < s.hd) buf[threadIdx.x + k * PREP_THREADS] = xv[k];
    } else if (w)
        block_rms_norm(src, w, s.eps, s.hd, buf, sh);
    else
        for (int d = threadIdx.x; d < s.hd; d += blockDim.x) buf[d] = src[d];
    __syncthreads();
    int half = s.rope_half;
    for (int t = threadIdx.x; t < half; t += blockDim.x) {
        int ia = s.rope_interleaved ? 2 * t : t, ib = s.rope_interleaved ? 2 * t + 1 : t + half;
        float a = buf[ia], b = buf[ib];
        dst[ia] = fsub(fmul(a, cs[t]), fmul(b, sn[t]));
        dst[ib] = fadd(fmul(b, cs[t]), fmul(a, sn[t]));
    }
    for (int d = 2 * half + threadIdx.x; d < s.hd; d += blockDim.x) dst[d] = buf[d];
    __syncthreads();
}

/* Block (row i, head j): j < nh the query head j, else KV head j - nh (its K through the norm and
 * RoPE into the cache, its V copied), unless the row is held. Heads are independent, so a block per
 * head gives the per-row kernel's values with the heads' syncs in parallel (it was 30 us a row). */
template <class R>
__global__ void __launch_bounds__(PREP_THREADS)
attn_prep_kernel(dr_cuda_attn_shape s, const float *q_in, int64_t q_ld, int64_t q_hs, const float *k_in, const float *v_in,
                 int64_t kv_ld, R rows, float *q_out, int64_t qo_ld, int64_t qo_hs) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float sm[]; /* cos [half] | sin [half] | buf [hd] */
    __shared__ double sh[32];
    const int64_t i = blockIdx.x;
    const int j = blockIdx.y;
    if (j >= s.nh && rows.held(i)) return; /* uniform over the block: the cache keeps its contents */
    const int m = j - s.nh;
    const float *src = j < s.nh ? q_in + i * q_ld + (int64_t)j * q_hs : k_in + i * kv_ld + (int64_t)m * s.hd;
    const float *nw = j < s.nh ? s.q_norm : s.k_norm;
    const bool reg = s.hd <= PREP_REG * PREP_THREADS;
    float xv[PREP_REG], wv[PREP_REG], vv[PREP_REG];
    if (reg) {
        prep_load(src, s.hd, 0.0f, xv);
        prep_load(nw, s.hd, 1.0f, wv);
        prep_load(j < s.nh ? NULL : v_in + i * kv_ld + (int64_t)m * s.hd, s.hd, 0.0f, vv);
    }
    const int64_t p = rows.p(i);
    float *cs = sm, *sn = sm + s.rope_half, *buf = sm + 2 * s.rope_half;
    for (int t = threadIdx.x; t < s.rope_half; t += blockDim.x) {
        double a = (double)p * (double)s.inv_freq[t];
        cs[t] = (float)cos(a);
        sn[t] = (float)sin(a);
    }
    if (j < s.nh) {
        __syncthreads();
        head_prep(src, q_out + i * qo_ld + (int64_t)j * qo_hs, nw, s, cs, sn, buf, sh, reg, xv, wv);
        return;
    }
    const int64_t kvd = (int64_t)s.nkv * s.hd;
    float *kd = rows.k(i) + p * kvd, *vd = rows.v(i) + p * kvd; /* the cache rows, before the barriers */
    __syncthreads();
    head_prep(src, kd + (int64_t)m * s.hd, nw, s, cs, sn, buf, sh, reg, xv, wv);
    if (reg) {
#pragma unroll
        for (int k = 0; k < PREP_REG; k++) {
            const int d = threadIdx.x + k * PREP_THREADS;
            if (d < s.hd) vd[(int64_t)m * s.hd + d] = vv[k];
        }
    } else
        for (int64_t d = threadIdx.x; d < s.hd; d += blockDim.x)
            vd[(int64_t)m * s.hd + d] = v_in[i * kv_ld + (int64_t)m * s.hd + d];
}

static drama_status prep_check(const dr_cuda_attn_shape *s, size_t *shm, drama_error *err) {
    if (!s || s->nh <= 0 || s->nkv <= 0 || s->hd <= 0 || s->nh % s->nkv || s->rope_half < 0 || 2 * s->rope_half > s->hd ||
        (s->rope_half && !s->inv_freq))
        return dr_fail(err, DRAMA_EINVAL, "CUDA attention: bad shape");
    *shm = (size_t)(2 * s->rope_half + s->hd) * sizeof(float);
    if (*shm > 48 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA attention: head_dim %d too large", s->hd);
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_attn_prep(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q_in,
                                          int64_t q_ld, int64_t q_hs, const float *k_in, const float *v_in,
                                          int64_t kv_ld, const int32_t *pos, float *const *kc, float *const *vc,
                                          const int32_t *skip, float *q_out, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    size_t shm;
    drama_status st = prep_check(s, &shm, err);
    if (st) return st;
    if (!q_in || !k_in || !v_in || !pos || !kc || !vc || !q_out) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_attn_prep: NULL pointer");
    rows_arr r = {pos, kc, vc, skip};
    const dim3 grid((unsigned)n, (unsigned)(s->nh + s->nkv));
    dr_launch(c->pdl, attn_prep_kernel<decltype(r)>, grid, PREP_THREADS, shm, c->stream, *s, q_in, q_ld, q_hs, k_in,
              v_in, kv_ld, r, q_out, (int64_t)s->nh * s->hd, s->hd);
    return dr_cuda_check(cudaGetLastError(), "attention prep launch", err);
}

drama_status dr_cuda_attn_init(drama_error *err);

/* ---- split attention ---- */

/* Blocks per (row, KV head): enough to fill the device at one row, one for long prefills. */
static int n_splits(int64_t n, int nkv) {
    int64_t s = (264 + n * nkv - 1) / (n * nkv);
    return (int)(s < 1 ? 1 : s > ATT_MAX_SPLIT ? ATT_MAX_SPLIT : s);
}

/* positions of split k out of S for npos positions: [k chunk, min((k + 1) chunk, npos)) */
__device__ __forceinline__ int split_chunk(int npos, int S) { return ((npos + S - 1) / S + 31) / 32 * 32; }

extern "C" size_t dr_cuda_attn_ws_bytes(const dr_cuda_attn_shape *s, int64_t n, int64_t max_pos) {
    (void)max_pos;
    return (size_t)n * (size_t)s->nh * (size_t)n_splits(n, s->nkv) * (size_t)(s->hd + 2) * sizeof(double);
}

/* ---- staging: asynchronous copies global -> shared (cp.async, sm_80+), no registers in between ---- */
__device__ __forceinline__ void cp_async16(float *dst, const float *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(float *dst, const float *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Rows t .. t+n-1 of a K or V cache (row stride kvd, hd floats each) into dst [n][hd], every thread
 * issuing its copies at once (one round trip for the sub-tile), as one commit group. shift (the
 * contract's planted control only) takes each row from the next position instead. */
__device__ __forceinline__ void stage_rows(float *dst, const float *src, int64_t kvd, int t, int n, int hd, bool vec,
                                           bool shift, int npos) {
    if (vec) {
        const int hq = hd >> 2;
        for (int e = threadIdx.x; e < n * hq; e += blockDim.x) {
            const int r = e / hq, c = 4 * (e - r * hq), p = t + r + (shift && t + r + 1 < npos);
            cp_async16(dst + r * hd + c, src + (int64_t)p * kvd + c);
        }
    } else
        for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
            const int r = e / hd, c = e - r * hd, p = t + r + (shift && t + r + 1 < npos);
            cp_async4(dst + r * hd + c, src + (int64_t)p * kvd + c);
        }
    cp_async_commit();
}

/* Block (split, kv head m, row i): for the G query heads of m over its positions, the running
 * maximum, the sum of exp(s - max) and the weighted sum of V, as partials for the merge.
 * The positions are walked in tiles of ATT_P (the softmax's unit) and each tile's K, then V, in
 * sub-tiles of ATT_SUB staged into shared memory through two buffers: the copy of the next stage
 * (the next K sub-tile, the tile's first V sub-tile, ..., the next tile's first K sub-tile) is in
 * flight while the current one is used, so a short chunk costs one round trip for q, K and V.
 * The arithmetic is the per-position kernel's: the same fp32 dots and xor trees, the same double
 * softmax (the G heads' block reductions share barriers, each with block_max_f's / block_sum_d's
 * tree), V accumulated over positions in ascending order. DEFECT 1 (the contract's control):
 * each V row staged from the next position. */
template <class R, int DEFECT>
__global__ void __launch_bounds__(ATT_THREADS)
attn_split_kernel(dr_cuda_attn_shape s, const float *q, int64_t q_ld, int64_t q_hs, R rows, int nsplit, double *ws_ml,
                  double *ws_acc) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ double wsm[]; /* w [G][ATT_P] doubles | q [G][hd] floats | 2 x [ATT_SUB][hd] floats */
    __shared__ double sh_sum[ATT_MAXG][32], m_run[ATT_MAXG], l_run[ATT_MAXG], alpha[ATT_MAXG], m_new[ATT_MAXG];
    __shared__ float sh_max[ATT_MAXG][32];
    const int split = blockIdx.x, m = blockIdx.y;
    const int64_t i = blockIdx.z;
    const int npos = (int)rows.p(i) + 1, chunk = split_chunk(npos, nsplit);
    const int c0 = split * chunk, c1 = min(npos, c0 + chunk), G = s.nh / s.nkv, hd = s.hd;
    const int64_t kvd = (int64_t)s.nkv * hd;
    const float *kb = rows.k(i) + (int64_t)m * hd, *vb = rows.v(i) + (int64_t)m * hd; /* read with the position */
    if (c0 >= c1) return; /* the merge counts only the splits that hold positions */
    double *w = wsm;
    float *qs = (float *)(wsm + (size_t)G * ATT_P), *stg = qs + G * hd;
    const int stg_n = ATT_SUB * hd; /* floats per staging buffer */
    const bool vec = (hd & 3) == 0 && !(((uintptr_t)kb | (uintptr_t)vb) & 15);
    /* q of the G heads and the first K sub-tile: the first commit group */
    const float *qb = q + i * q_ld + (int64_t)(m * G) * q_hs;
    if (vec && !(((uintptr_t)qb | (uintptr_t)(q_hs * 4)) & 15))
        for (int e = 4 * threadIdx.x; e < G * hd; e += 4 * blockDim.x) cp_async16(qs + e, qb + (int64_t)(e / hd) * q_hs + e % hd);
    else
        for (int e = threadIdx.x; e < G * hd; e += blockDim.x) cp_async4(qs + e, qb + (int64_t)(e / hd) * q_hs + e % hd);
    stage_rows(stg, kb, kvd, c0, min(ATT_SUB, c1 - c0), hd, vec, false, npos);
    if (threadIdx.x < G) m_run[threadIdx.x] = -INFINITY, l_run[threadIdx.x] = 0.0;
    double acc[ATT_MAXD][ATT_MAXG];
#pragma unroll
    for (int a = 0; a < ATT_MAXD; a++)
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++) acc[a][g] = 0.0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    int j = 0; /* stages used so far: stage j sits in buffer j & 1 */
    for (int t0 = c0; t0 < c1; t0 += ATT_P) {
        const int nt = min(ATT_P, c1 - t0), nsub = (nt + ATT_SUB - 1) / ATT_SUB;
        for (int kind = 0; kind < 2; kind++) { /* 0: K sub-tiles (scores), 1: V sub-tiles */
            if (kind == 1) {
                /* per head: the tile's maximum, the running maximum, exp(s - max), the running sum */
                for (int g = 0; g < G; g++) {
                    float v = threadIdx.x < nt ? (float)w[g * ATT_P + threadIdx.x] : -INFINITY;
                    v = warp_max_f(v);
                    if (lane == 0) sh_max[g][warp] = v;
                }
                __syncthreads();
                for (int g = 0; g < G; g++) {
                    float tmax = warp_max_f(lane < nwarp ? sh_max[g][lane] : -INFINITY);
                    double mnew = fmax(m_run[g], (double)tmax);
                    double e = 0.0;
                    if (threadIdx.x < nt) {
                        e = exp(w[g * ATT_P + threadIdx.x] - mnew);
                        w[g * ATT_P + threadIdx.x] = e;
                    }
                    e = warp_sum_d(e);
                    if (lane == 0) sh_sum[g][warp] = e;
                    if (threadIdx.x == 0) m_new[g] = mnew;
                }
                __syncthreads();
                for (int g = warp; g < G; g += nwarp) {
                    double l = warp_sum_d(lane < nwarp ? sh_sum[g][lane] : 0.0);
                    if (lane == 0) {
                        double al = exp(m_run[g] - m_new[g]); /* 0 at the first tile (-inf) */
                        alpha[g] = al;
                        l_run[g] = l_run[g] * al + l;
                        m_run[g] = m_new[g];
                    }
                }
                __syncthreads();
                /* the values so far rescaled by the new maximum */
#pragma unroll
                for (int a = 0; a < ATT_MAXD; a++) {
                    if (threadIdx.x + a * ATT_THREADS >= hd) break;
#pragma unroll
                    for (int g = 0; g < ATT_MAXG; g++)
                        if (g < G) acc[a][g] *= alpha[g];
                }
            }
            for (int u = 0; u < nsub; u++, j++) {
                /* the stage after this one, into the other buffer (used and released one stage ago) */
                int nk = kind, nu = u + 1, n0 = t0;
                if (nu == nsub) {
                    nu = 0;
                    if (kind == 0) nk = 1;
                    else nk = 0, n0 = t0 + ATT_P;
                }
                if (n0 < c1) {
                    const int r0 = n0 + nu * ATT_SUB, nr = min(ATT_SUB, min(c1, n0 + ATT_P) - r0);
                    stage_rows(stg + ((j + 1) & 1) * stg_n, nk ? vb : kb, kvd, r0, nr, hd, vec, DEFECT == 1 && nk, npos);
                    cp_async_wait<1>();
                } else
                    cp_async_wait<0>();
                __syncthreads();
                const float *sb = stg + (j & 1) * stg_n;
                const int s0 = u * ATT_SUB, ns = min(ATT_SUB, nt - s0);
                if (kind == 0) {
                    /* scores: warp w takes positions w, w + 8, ...; its lanes read the key row and
                     * form the G dot products in fp32, each reduced by a fixed xor tree */
                    for (int r = warp; r < ns; r += nwarp) {
                        const float *kr = sb + r * hd;
                        const int tt = s0 + r;
                        for (int g0 = 0; g0 < G; g0 += ATT_G) {
                            float a[ATT_G];
#pragma unroll
                            for (int e = 0; e < ATT_G; e++) a[e] = 0.0f;
                            for (int d = lane; d < hd; d += 32) {
                                float kv = kr[d];
#pragma unroll
                                for (int e = 0; e < ATT_G; e++)
                                    if (g0 + e < G) a[e] = fmaf(qs[(g0 + e) * hd + d], kv, a[e]);
                            }
#pragma unroll
                            for (int e = 0; e < ATT_G; e++) {
#pragma unroll
                                for (int off = 16; off > 0; off >>= 1) a[e] += __shfl_xor_sync(0xFFFFFFFFu, a[e], off);
                                if (lane == 0 && g0 + e < G) w[(g0 + e) * ATT_P + tt] = (double)fmul(a[e], (float)s.scale);
                            }
                        }
                    }
                } else {
                    /* values: thread d keeps sum_t w_t v_t[d] of every head, t ascending */
#pragma unroll
                    for (int a = 0; a < ATT_MAXD; a++) {
                        int d = threadIdx.x + a * ATT_THREADS;
                        if (d >= hd) break;
                        for (int r = 0; r < ns; r++) {
                            double vv = (double)sb[r * hd + d];
#pragma unroll
                            for (int g = 0; g < ATT_MAXG; g++)
                                if (g < G) acc[a][g] = fma(w[g * ATT_P + s0 + r], vv, acc[a][g]);
                        }
                    }
                }
                __syncthreads(); /* the buffer is refilled two stages on; w by the next tile */
            }
        }
    }
    if (threadIdx.x < G) {
        double *ml = ws_ml + (((i * s.nh) + (int64_t)m * G + threadIdx.x) * nsplit + split) * 2;
        ml[0] = m_run[threadIdx.x];
        ml[1] = l_run[threadIdx.x];
    }
#pragma unroll
    for (int a = 0; a < ATT_MAXD; a++) {
        int d = threadIdx.x + a * ATT_THREADS;
        if (d >= hd) break;
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++)
            if (g < G) ws_acc[((i * s.nh + (int64_t)m * G + g) * nsplit + split) * hd + d] = acc[a][g];
    }
}

/* Block (head j, row i): merges the splits that hold positions, divides, applies the gate. The
 * splits' (max, sum) pairs are loaded at once and each split's factor exp(m_k - M) computed once
 * into shared memory; the max, L and every d's sum run over them in the same order as before. */
template <class R>
__global__ void __launch_bounds__(ATT_THREADS)
attn_merge_kernel(dr_cuda_attn_shape s, R rows, int nsplit, const double *ws_ml, const double *ws_acc, const float *gate,
                  int64_t gate_ld, int64_t gate_hs, float *o, int64_t o_ld) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ double mk[ATT_MAX_SPLIT], lk[ATT_MAX_SPLIT], fk[ATT_MAX_SPLIT];
    const int j = blockIdx.x;
    const int64_t i = blockIdx.y;
    const double *ml = ws_ml + (i * s.nh + j) * nsplit * 2;
    /* every split's pair, loaded with the position (only the used ones are read) */
    if (threadIdx.x < nsplit) mk[threadIdx.x] = ml[2 * threadIdx.x], lk[threadIdx.x] = ml[2 * threadIdx.x + 1];
    const int npos = (int)rows.p(i) + 1, chunk = split_chunk(npos, nsplit);
    const int used = chunk > 0 ? min(nsplit, (npos + chunk - 1) / chunk) : 0; /* no positions (the contract's dropped one): none */
    __syncthreads();
    double M = -INFINITY;
    for (int k = 0; k < used; k++) M = fmax(M, mk[k]);
    if (threadIdx.x < used) fk[threadIdx.x] = exp(mk[threadIdx.x] - M);
    __syncthreads();
    double L = 0.0;
    for (int k = 0; k < used; k++) L += lk[k] * fk[k];
    for (int d = threadIdx.x; d < s.hd; d += blockDim.x) {
        const float gv = gate ? gate[i * gate_ld + (int64_t)j * gate_hs + d] : 0.0f;
        const double *ak = ws_acc + (i * s.nh + j) * nsplit * s.hd + d;
        double acc = 0.0;
#pragma unroll 8
        for (int k = 0; k < used; k++) acc += ak[(int64_t)k * s.hd] * fk[k];
        float v = (float)(acc / L);
        if (gate) v = fmul(v, dsigmoid(gv));
        o[i * o_ld + (int64_t)j * s.hd + d] = v;
    }
}

static drama_status attn_check(const dr_cuda_attn_shape *s, int64_t n, size_t ws_bytes, size_t *shm, drama_error *err) {
    if (!s || s->nh <= 0 || s->nkv <= 0 || s->nh % s->nkv || s->hd <= 0)
        return dr_fail(err, DRAMA_EINVAL, "CUDA attention: bad shape");
    int G = s->nh / s->nkv;
    if (G > ATT_MAXG || s->hd > ATT_MAXD * ATT_THREADS)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA attention: %d query heads per KV head (at most %d), head_dim %d (at most %d)",
                       G, ATT_MAXG, s->hd, ATT_MAXD * ATT_THREADS);
    if (n > 65535) return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA attention: %lld rows in one call", (long long)n);
    if (ws_bytes < dr_cuda_attn_ws_bytes(s, n, 0))
        return dr_fail(err, DRAMA_EINVAL, "CUDA attention: workspace of %zu bytes, %zu needed", ws_bytes,
                       dr_cuda_attn_ws_bytes(s, n, 0));
    *shm = (size_t)G * ATT_P * sizeof(double) + (size_t)(G + 2 * ATT_SUB) * s->hd * sizeof(float);
    if (*shm > 220 * 1024) /* the opt-in's 227 KiB less the kernel's static arrays */ return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA attention: %zu bytes of shared memory", *shm);
    return DRAMA_OK;
}

/* the contract's planted control (cuda_contract.h): 1 = attn_split_kernel<R, 1> from then on */
static int attn_defect;
extern "C" void dr_cuda_attn_plant_defect(int defect) { attn_defect = defect; }

/* The split + merge launches for either accessor. */
template <class R>
static drama_status attn_launch(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q, int64_t q_ld,
                                int64_t q_hs, R rows, const float *gate, int64_t gate_ld, int64_t gate_hs, void *ws,
                                size_t ws_bytes, float *o, int64_t o_ld, drama_error *err) {
    size_t shm;
    drama_status st = attn_check(s, n, ws_bytes, &shm, err);
    if (!st) st = dr_cuda_attn_init(err); /* done already when the backend opened */
    if (st) return st;
    int ns = n_splits(n, s->nkv);
    double *ml = (double *)ws, *acc = ml + (size_t)n * s->nh * ns * 2;
    dim3 g1((unsigned)ns, (unsigned)s->nkv, (unsigned)n);
    if (attn_defect) dr_launch(c->pdl, attn_split_kernel<R, 1>, g1, ATT_THREADS, shm, c->stream, *s, q, q_ld, q_hs, rows, ns, ml, acc);
    else dr_launch(c->pdl, attn_split_kernel<R, 0>, g1, ATT_THREADS, shm, c->stream, *s, q, q_ld, q_hs, rows, ns, ml, acc);
    if ((st = dr_cuda_check(cudaGetLastError(), "attention launch", err))) return st;
    dim3 g2((unsigned)s->nh, (unsigned)n);
    dr_launch(c->pdl, attn_merge_kernel<R>, g2, ATT_THREADS, 0, c->stream, *s, rows, ns, ml, acc, gate, gate_ld,
              gate_hs, o, o_ld);
    return dr_cuda_check(cudaGetLastError(), "attention merge launch", err);
}

extern "C" drama_status dr_cuda_attn(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q,
                                     const int32_t *pos, float *const *kc, float *const *vc, int64_t max_pos,
                                     const float *gate, int64_t gate_ld, int64_t gate_hs, void *ws, size_t ws_bytes,
                                     float *o, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!s || !q || !pos || !kc || !vc || !o || !ws || max_pos <= 0)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_attn: bad shape or pointers");
    rows_arr r = {pos, kc, vc, NULL};
    return attn_launch(c, s, n, q, (int64_t)s->nh * s->hd, s->hd, r, gate, gate_ld, gate_hs, ws, ws_bytes, o,
                       (int64_t)s->nh * s->hd, err);
}

/* ---- the seam's attention op: prep in place, then split + merge ---- */

drama_status dr_cuda_seam_attention(dr_cuda *c, const dr_cuda_attn_shape *s, const dr_seq_row *rows, int layer, int64_t n,
                                    float *q, int64_t q_ld, int64_t q_hs, const float *k, const float *v, int64_t kv_ld,
                                    int gated, void *ws, size_t ws_bytes, float *out, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    size_t shm;
    drama_status st = prep_check(s, &shm, err);
    if (st) return st;
    rows_seq r = {rows, layer};
    const dim3 grid((unsigned)n, (unsigned)(s->nh + s->nkv));
    dr_launch(c->pdl, attn_prep_kernel<decltype(r)>, grid, PREP_THREADS, shm, c->stream, *s, q, q_ld, q_hs, k, v, kv_ld,
              r, q, q_ld, q_hs);
    if ((st = dr_cuda_check(cudaGetLastError(), "attention prep launch", err))) return st;
    return attn_launch(c, s, n, q, q_ld, q_hs, r, gated ? q + s->hd : NULL, q_ld, q_hs, ws, ws_bytes, out,
                       (int64_t)s->nh * s->hd, err);
}

/* the split kernels' opt-in to large shared memory (dr_cuda_kernels_init: before any capture) */
static int attn_attr_done;
drama_status dr_cuda_attn_init(drama_error *err) {
    if (attn_attr_done) return DRAMA_OK;
    attn_attr_done = 1;
    const void *fns[] = {(const void *)attn_split_kernel<rows_arr, 0>, (const void *)attn_split_kernel<rows_seq, 0>,
                         (const void *)attn_split_kernel<rows_arr, 1>, (const void *)attn_split_kernel<rows_seq, 1>};
    drama_status st = DRAMA_OK;
    for (int k = 0; k < 4 && !st; k++) st = dr_cuda_smem_optin(fns[k], "attention shared memory", err);
    return st;
}
