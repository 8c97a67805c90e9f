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

/* One head: RMS norm (w != NULL) into buf, then RoPE of the first 2*half dims into dst, the rest
 * copied (dst may be src). The whole block calls it. */
__device__ void head_prep(const float *src, float *dst, const float *w, const dr_cuda_attn_shape &s, const float *cs,
                          const float *sn, float *buf, double *sh) {
    if (w) block_rms_norm(src, w, s.eps, s.hd, buf, sh);
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
    const int64_t p = rows.p(i);
    float *cs = sm, *sn = sm + s.rope_half, *buf = sm + 2 * s.rope_half;
    for (int t = threadIdx.x; t < s.rope_half; t += blockDim.x) {
        double a = (double)p * (double)s.inv_freq[t];
        cs[t] = (float)cos(a);
        sn[t] = (float)sin(a);
    }
    __syncthreads();
    if (j < s.nh) {
        head_prep(q_in + i * q_ld + (int64_t)j * q_hs, q_out + i * qo_ld + (int64_t)j * qo_hs, s.q_norm, s, cs, sn, buf, sh);
        return;
    }
    const int m = j - s.nh;
    const int64_t kvd = (int64_t)s.nkv * s.hd;
    float *kd = rows.k(i) + p * kvd, *vd = rows.v(i) + p * kvd;
    head_prep(k_in + i * kv_ld + (int64_t)m * s.hd, kd + (int64_t)m * s.hd, s.k_norm, s, cs, sn, buf, sh);
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

/* Block (split, kv head m, row i): for the G query heads of m over its positions, the running
 * maximum, the sum of exp(s - max) and the weighted sum of V, as partials for the merge. */
template <class R>
__global__ void __launch_bounds__(ATT_THREADS)
attn_split_kernel(dr_cuda_attn_shape s, const float *q, int64_t q_ld, int64_t q_hs, R rows, int nsplit, double *ws_ml,
                  double *ws_acc) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ double wsm[]; /* w [G][ATT_P] doubles | q [G][hd] floats */
    __shared__ double sh[32], m_run[ATT_MAXG], l_run[ATT_MAXG], alpha[ATT_MAXG];
    __shared__ float shf[32];
    const int split = blockIdx.x, m = blockIdx.y;
    const int64_t i = blockIdx.z;
    const int npos = (int)rows.p(i) + 1, chunk = split_chunk(npos, nsplit);
    const int c0 = split * chunk, c1 = min(npos, c0 + chunk), G = s.nh / s.nkv, hd = s.hd;
    const int64_t kvd = (int64_t)s.nkv * hd;
    if (c0 >= c1) return; /* the merge counts only the splits that hold positions */
    double *w = wsm;
    float *qs = (float *)(wsm + (size_t)G * ATT_P);
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x)
        qs[e] = q[i * q_ld + (int64_t)(m * G + e / hd) * q_hs + e % hd];
    if (threadIdx.x < G) m_run[threadIdx.x] = -INFINITY, l_run[threadIdx.x] = 0.0;
    double acc[ATT_MAXD][ATT_MAXG];
#pragma unroll
    for (int a = 0; a < ATT_MAXD; a++)
#pragma unroll
        for (int g = 0; g < ATT_MAXG; g++) acc[a][g] = 0.0;
    __syncthreads();
    const float *kb = rows.k(i) + (int64_t)m * hd, *vb = rows.v(i) + (int64_t)m * hd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
    for (int t0 = c0; t0 < c1; t0 += ATT_P) {
        const int nt = min(ATT_P, c1 - t0);
        /* scores: warp w takes positions w, w + 8, ...; its lanes read the key row coalesced and
         * form the G dot products in fp32, each reduced by a fixed xor tree */
        for (int tt = warp; tt < nt; tt += nwarp) {
            const float *kr = kb + (int64_t)(t0 + tt) * kvd;
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
        __syncthreads();
        /* per head: the tile's maximum, the running maximum, exp(s - max), the running sum */
        for (int g = 0; g < G; g++) {
            float v = threadIdx.x < nt ? (float)w[g * ATT_P + threadIdx.x] : -INFINITY;
            float tmax = block_max_f(v, shf);
            double mnew = fmax(m_run[g], (double)tmax);
            double e = 0.0;
            if (threadIdx.x < nt) {
                e = exp(w[g * ATT_P + threadIdx.x] - mnew);
                w[g * ATT_P + threadIdx.x] = e;
            }
            double l = block_sum_d(e, sh);
            if (threadIdx.x == 0) {
                double al = exp(m_run[g] - mnew); /* 0 at the first tile (-inf) */
                alpha[g] = al;
                l_run[g] = l_run[g] * al + l;
                m_run[g] = mnew;
            }
        }
        __syncthreads();
        /* values: thread d keeps sum_t w_t v_t[d] of every head, rescaled by the new maximum */
#pragma unroll
        for (int a = 0; a < ATT_MAXD; a++) {
            int d = threadIdx.x + a * ATT_THREADS;
            if (d >= hd) break;
#pragma unroll
            for (int g = 0; g < ATT_MAXG; g++)
                if (g < G) acc[a][g] *= alpha[g];
            for (int tt = 0; tt < nt; tt++) {
                double vv = (double)vb[(int64_t)(t0 + tt) * kvd + d];
#pragma unroll
                for (int g = 0; g < ATT_MAXG; g++)
                    if (g < G) acc[a][g] = fma(w[g * ATT_P + tt], vv, acc[a][g]);
            }
        }
        __syncthreads(); /* w is refilled by the next tile */
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

/* Block (head j, row i): merges the splits that hold positions, divides, applies the gate. */
template <class R>
__global__ void __launch_bounds__(ATT_THREADS)
attn_merge_kernel(dr_cuda_attn_shape s, R rows, int nsplit, const double *ws_ml, const double *ws_acc, const float *gate,
                  int64_t gate_ld, int64_t gate_hs, float *o, int64_t o_ld) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int j = blockIdx.x;
    const int64_t i = blockIdx.y;
    const int npos = (int)rows.p(i) + 1, chunk = split_chunk(npos, nsplit), used = (npos + chunk - 1) / chunk;
    const double *ml = ws_ml + (i * s.nh + j) * nsplit * 2;
    double M = -INFINITY;
    for (int k = 0; k < used; k++) M = fmax(M, ml[2 * k]);
    double L = 0.0;
    for (int k = 0; k < used; k++) L += ml[2 * k + 1] * exp(ml[2 * k] - M);
    for (int d = threadIdx.x; d < s.hd; d += blockDim.x) {
        double acc = 0.0;
        for (int k = 0; k < used; k++) acc += ws_acc[((i * s.nh + j) * nsplit + k) * s.hd + d] * exp(ml[2 * k] - M);
        float v = (float)(acc / L);
        if (gate) v = fmul(v, dsigmoid(gate[i * gate_ld + (int64_t)j * gate_hs + d]));
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
    *shm = (size_t)G * ATT_P * sizeof(double) + (size_t)G * s->hd * sizeof(float);
    if (*shm > 227 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA attention: %zu bytes of shared memory", *shm);
    return DRAMA_OK;
}

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
    dr_launch(c->pdl, attn_split_kernel<R>, g1, ATT_THREADS, shm, c->stream, *s, q, q_ld, q_hs, rows, ns, ml, acc);
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
    drama_status st = dr_cuda_smem_optin((const void *)attn_split_kernel<rows_arr>, "attention shared memory", err);
    return st ? st : dr_cuda_smem_optin((const void *)attn_split_kernel<rows_seq>, "attention shared memory", err);
}
