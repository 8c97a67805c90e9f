/* attn.cu - attention with a KV cache (MODEL.md 5.3, 7.2): the per-row preparation (q/k RMS norm,
 * partial RoPE in either pairing, the K/V append) and the attention itself, split over blocks of
 * ATT_P positions and merged (flash-decoding), for a decode step (rows of distinct sessions) and a
 * prefill (rows of one session at consecutive positions) alike.
 *
 * Arithmetic: the preparation is the CPU's op for op (double sum of squares, fp32 products, cos/sin
 * of the double angle rounded to fp32, the fp32 rotation). Scores are fp32 dot products times an
 * fp32 scale (dr_op_attend's form); the softmax and the weighted sum of V accumulate in double (as
 * dr_op_attend_f64 does). Both CPU forms are within the contract's tolerance of the result. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"

#define PREP_THREADS 256
#define ATT_P 256        /* positions per block of the split attention */
#define ATT_THREADS 256  /* one position (scores) or one head dimension (values) per thread */
#define ATT_G 8          /* query heads scored per pass over a key row */

/* One head: RMS norm (w != NULL) into buf, then RoPE of the first 2*half dims into dst, the rest
 * copied. The whole block calls it. */
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

__global__ void __launch_bounds__(PREP_THREADS)
attn_prep_kernel(dr_cuda_attn_shape s, const float *q_in, int64_t q_ld, int64_t q_hs, const float *k_in, const float *v_in,
                 int64_t kv_ld, const int32_t *pos, float *const *kc, float *const *vc, const int32_t *skip, float *q_out) {
    extern __shared__ float sm[]; /* cos [half] | sin [half] | buf [hd] */
    __shared__ double sh[32];
    const int64_t i = blockIdx.x;
    const int64_t p = pos[i];
    float *cs = sm, *sn = sm + s.rope_half, *buf = sm + 2 * s.rope_half;
    for (int t = threadIdx.x; t < s.rope_half; t += blockDim.x) {
        double a = (double)p * (double)s.inv_freq[t];
        cs[t] = (float)cos(a);
        sn[t] = (float)sin(a);
    }
    __syncthreads();
    for (int j = 0; j < s.nh; j++)
        head_prep(q_in + i * q_ld + (int64_t)j * q_hs, q_out + (i * s.nh + j) * s.hd, s.q_norm, s, cs, sn, buf, sh);
    if (skip && skip[i]) return; /* uniform over the block */
    const int64_t kvd = (int64_t)s.nkv * s.hd;
    float *kd = kc[i] + p * kvd, *vd = vc[i] + p * kvd;
    for (int m = 0; m < s.nkv; m++) head_prep(k_in + i * kv_ld + (int64_t)m * s.hd, kd + (int64_t)m * s.hd, s.k_norm, s, cs, sn, buf, sh);
    for (int64_t d = threadIdx.x; d < kvd; d += blockDim.x) vd[d] = v_in[i * kv_ld + d];
}

extern "C" drama_status dr_cuda_attn_prep(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q_in,
                                          int64_t q_ld, int64_t q_hs, const float *k_in, const float *v_in,
                                          int64_t kv_ld, const int32_t *pos, float *const *kc, float *const *vc,
                                          const int32_t *skip, float *q_out, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!s || !q_in || !k_in || !v_in || !pos || !kc || !vc || !q_out || s->nh <= 0 || s->nkv <= 0 || s->hd <= 0 ||
        s->nh % s->nkv || s->rope_half < 0 || 2 * s->rope_half > s->hd || (s->rope_half && !s->inv_freq))
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_attn_prep: bad shape or pointers");
    size_t shm = (size_t)(2 * s->rope_half + s->hd) * sizeof(float);
    if (shm > 48 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_attn_prep: head_dim %d too large", s->hd);
    attn_prep_kernel<<<(unsigned)n, PREP_THREADS, shm, c->stream>>>(*s, q_in, q_ld, q_hs, k_in, v_in, kv_ld, pos, kc, vc,
                                                                    skip, q_out);
    return dr_cuda_check(cudaGetLastError(), "attention prep launch", err);
}

/* ---- split attention ---- */

static int64_t n_splits(int64_t max_pos) { return (max_pos + ATT_P - 1) / ATT_P; }

extern "C" size_t dr_cuda_attn_ws_bytes(const dr_cuda_attn_shape *s, int64_t n, int64_t max_pos) {
    return (size_t)n * (size_t)s->nh * (size_t)n_splits(max_pos) * (size_t)(s->hd + 2) * sizeof(double);
}

/* Block (split, kv head m, row i): scores of the G query heads of m over positions [t0, t1), their
 * maximum, exp(s - max) and its sum, and the weighted sum of V, as partials for the merge. */
__global__ void __launch_bounds__(ATT_THREADS)
attn_split_kernel(dr_cuda_attn_shape s, const float *q, const int32_t *pos, float *const *kc, float *const *vc,
                  int nsplit, double *ws_ml, double *ws_acc) {
    extern __shared__ double wsm[]; /* w [G][ATT_P] doubles | q [G][hd] floats */
    __shared__ double sh[32];
    __shared__ float shf[32];
    const int split = blockIdx.x, m = blockIdx.y;
    const int64_t i = blockIdx.z;
    const int npos = pos[i] + 1, t0 = split * ATT_P;
    if (t0 >= npos) return;
    const int nt = min(npos - t0, ATT_P), G = s.nh / s.nkv, hd = s.hd;
    const int64_t kvd = (int64_t)s.nkv * hd;
    double *w = wsm;
    float *qs = (float *)(wsm + (size_t)G * ATT_P);
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x) qs[e] = q[(i * s.nh + (int64_t)m * G) * hd + e];
    __syncthreads();
    const float *kb = kc[i] + (int64_t)m * hd, *vb = vc[i] + (int64_t)m * hd;
    /* scores: warp w takes positions w, w + 8, ...; its lanes read the key row coalesced and form
     * the G dot products in fp32 (as dr_op_attend), each reduced by a fixed xor tree */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
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
    /* per head: max, weights, sum */
    for (int g = 0; g < G; g++) {
        float v = threadIdx.x < nt ? (float)w[g * ATT_P + threadIdx.x] : -INFINITY;
        float mx = block_max_f(v, shf);
        double e = 0.0;
        if (threadIdx.x < nt) {
            e = exp(w[g * ATT_P + threadIdx.x] - (double)mx);
            w[g * ATT_P + threadIdx.x] = e;
        }
        double l = block_sum_d(e, sh);
        if (threadIdx.x == 0) {
            double *ml = ws_ml + (((i * s.nh) + (int64_t)m * G + g) * nsplit + split) * 2;
            ml[0] = mx;
            ml[1] = l;
        }
    }
    __syncthreads();
    /* values: thread d sums w_t v_t[d] over the block's positions for ATT_G heads at a time */
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        for (int g0 = 0; g0 < G; g0 += ATT_G) {
            double a[ATT_G];
#pragma unroll
            for (int e = 0; e < ATT_G; e++) a[e] = 0.0;
            for (int tt = 0; tt < nt; tt++) {
                double vv = (double)vb[(int64_t)(t0 + tt) * kvd + d];
#pragma unroll
                for (int e = 0; e < ATT_G; e++)
                    if (g0 + e < G) a[e] = fma(w[(g0 + e) * ATT_P + tt], vv, a[e]);
            }
#pragma unroll
            for (int e = 0; e < ATT_G; e++)
                if (g0 + e < G) ws_acc[((i * s.nh + (int64_t)m * G + g0 + e) * nsplit + split) * hd + d] = a[e];
        }
    }
}

/* Block (head j, row i): merges the splits that hold positions, divides, applies the gate. */
__global__ void __launch_bounds__(ATT_THREADS)
attn_merge_kernel(dr_cuda_attn_shape s, const int32_t *pos, int nsplit, const double *ws_ml, const double *ws_acc,
                  const float *gate, int64_t gate_ld, int64_t gate_hs, float *o) {
    const int j = blockIdx.x;
    const int64_t i = blockIdx.y;
    const int used = (pos[i] + 1 + ATT_P - 1) / ATT_P;
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
        o[(i * s.nh + j) * s.hd + d] = v;
    }
}

static drama_status set_smem(const void *fn, size_t bytes, drama_error *err) {
    if (bytes <= 48 * 1024) return DRAMA_OK;
    if (bytes > 227 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "attention: %zu bytes of shared memory per block", bytes);
    return dr_cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                         "cudaFuncSetAttribute (attention)", err);
}

extern "C" drama_status dr_cuda_attn(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q,
                                     const int32_t *pos, float *const *kc, float *const *vc, int64_t max_pos,
                                     const float *gate, int64_t gate_ld, int64_t gate_hs, void *ws, size_t ws_bytes,
                                     float *o, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!s || !q || !pos || !kc || !vc || !o || !ws || s->nh <= 0 || s->nkv <= 0 || s->nh % s->nkv || s->hd <= 0 ||
        max_pos <= 0)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_attn: bad shape or pointers");
    if (ws_bytes < dr_cuda_attn_ws_bytes(s, n, max_pos))
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_attn: workspace of %zu bytes, %zu needed", ws_bytes,
                       dr_cuda_attn_ws_bytes(s, n, max_pos));
    int64_t ns = n_splits(max_pos);
    if (ns > 65535 || n > 65535) return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_attn: %lld positions", (long long)max_pos);
    int G = s->nh / s->nkv;
    size_t shm = (size_t)G * ATT_P * sizeof(double) + (size_t)G * s->hd * sizeof(float);
    drama_status st = set_smem((const void *)attn_split_kernel, shm, err);
    if (st) return st;
    double *ml = (double *)ws, *acc = ml + (size_t)n * s->nh * ns * 2;
    dim3 g1((unsigned)ns, (unsigned)s->nkv, (unsigned)n);
    attn_split_kernel<<<g1, ATT_THREADS, shm, c->stream>>>(*s, q, pos, kc, vc, (int)ns, ml, acc);
    if ((st = dr_cuda_check(cudaGetLastError(), "attention launch", err))) return st;
    dim3 g2((unsigned)s->nh, (unsigned)n);
    attn_merge_kernel<<<g2, ATT_THREADS, 0, c->stream>>>(*s, pos, (int)ns, ml, acc, gate, gate_ld, gate_hs, o);
    return dr_cuda_check(cudaGetLastError(), "attention merge launch", err);
}
