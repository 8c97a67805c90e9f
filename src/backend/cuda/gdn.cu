/* gdn.cu - the Gated DeltaNet mixer between its projections (MODEL.md 5.4): the causal depthwise
 * conv with its carried window and SiLU (one thread per channel, rows in order), then per value
 * head the l2-normalised q/k, the decay and beta gates, the delta-rule recurrence and the gated
 * output norm (one block per value head; two threads per column keep the head's fp32 state in
 * registers, so the state is read once and written once per call, also for a prefill).
 *
 * A prefill runs the recurrence row by row inside one launch: that is the CPU's order, so a
 * prefill equals decoding the same rows one at a time (a chunked form would reassociate). Every
 * fp32 step is the CPU's (backend/cpu/ops.c) spelled without contraction; the remaining
 * differences are the device expf/log1pf (within 2 ulp) and the order of double sums. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_seam_kernels.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/dev_rows.cuh"

#define CONV_THREADS 256
#define REC_THREADS (2 * DR_CUDA_GDN_MAX_DV) /* two threads per state column */
#define GDN_ROWS (DR_CUDA_GDN_MAX_DK / 2)

#define CONV_MAX_WIN 7 /* K - 1 values of window held in registers across a call's rows (longer: from memory) */

/* held rows: the window is left alone and y is 0 (the seam's contract: outputs unspecified).
 * Rows in order; the window of consecutive rows of one sequence stays in registers (a prefill's 30
 * rows reloaded and shifted it in memory every row: 33 us a layer on the H200), written back when
 * the next row belongs to another window and at the end. Same products and sums in the same order. */
template <class R>
__global__ void __launch_bounds__(CONV_THREADS)
gdn_conv_kernel(dr_cuda_gdn_shape s, int64_t n, int64_t C, const float *u, int64_t u_ld, R rows, float *y) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int K = s.K;
    const float *wc = s.conv_w + c * K;
    const float bias = s.conv_b ? s.conv_b[c] : 0.0f;
    if (K - 1 <= CONV_MAX_WIN) {
        float wk[CONV_MAX_WIN + 1], win[CONV_MAX_WIN];
#pragma unroll
        for (int j = 0; j <= CONV_MAX_WIN; j++) wk[j] = j < K ? wc[j] : 0.0f;
        float *cur = nullptr;
        for (int64_t i = 0; i < n; i++) {
            float *w = rows.conv(i);
            if (w != cur) { /* another sequence's window: the current one back to memory, the new one in */
#pragma unroll
                for (int j = 0; j < CONV_MAX_WIN; j++)
                    if (j < K - 1) {
                        if (cur) cur[(int64_t)j * C + c] = win[j];
                        win[j] = w[(int64_t)j * C + c];
                    }
                cur = w;
            }
            const float uc = u[i * u_ld + c];
            float acc = bias;
#pragma unroll
            for (int j = 0; j < CONV_MAX_WIN; j++)
                if (j < K - 1) acc = fadd(acc, fmul(wk[j], win[j]));
#pragma unroll
            for (int j = 0; j <= CONV_MAX_WIN; j++)
                if (j == K - 1) acc = fadd(acc, fmul(wk[j], uc));
            if (!rows.held(i) && K > 1) {
#pragma unroll
                for (int j = 0; j + 1 < CONV_MAX_WIN; j++)
                    if (j + 1 < K - 1) win[j] = win[j + 1];
#pragma unroll
                for (int j = 0; j < CONV_MAX_WIN; j++)
                    if (j == K - 2) win[j] = uc;
            }
            y[i * C + c] = R::zero_held && rows.held(i) ? 0.0f : dsilu(acc);
        }
        if (cur) {
#pragma unroll
            for (int j = 0; j < CONV_MAX_WIN; j++)
                if (j < K - 1) cur[(int64_t)j * C + c] = win[j];
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float *w = rows.conv(i);
        float uc = u[i * u_ld + c];
        float acc = bias;
        for (int j = 0; j < K - 1; j++) acc = fadd(acc, fmul(wc[j], w[(int64_t)j * C + c]));
        acc = fadd(acc, fmul(wc[K - 1], uc));
        if (!rows.held(i)) {
            for (int j = 0; j + 1 < K - 1; j++) w[(int64_t)j * C + c] = w[(int64_t)(j + 1) * C + c];
            if (K > 1) w[(int64_t)(K - 2) * C + c] = uc;
        }
        y[i * C + c] = R::zero_held && rows.held(i) ? 0.0f : dsilu(acc);
    }
}

extern "C" drama_status dr_cuda_gdn_conv(dr_cuda *c, const dr_cuda_gdn_shape *s, int64_t n, const float *u,
                                         int64_t u_ld, float *const *win, const int32_t *skip, float *y,
                                         drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!s || !u || !win || !y || !s->conv_w || s->K < 1)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gdn_conv: bad shape or pointers");
    int64_t C = 2 * (int64_t)s->nk * s->dk + (int64_t)s->nv * s->dv;
    if (u_ld < C) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gdn_conv: u rows of %lld < %lld channels", (long long)u_ld, (long long)C);
    rows_arr r = {NULL, win, NULL, skip};
    dr_launch(c->pdl, gdn_conv_kernel<decltype(r)>, (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), CONV_THREADS, 0,
              c->stream, *s, n, C, u, u_ld, r, y);
    return dr_cuda_check(cudaGetLastError(), "deltanet conv launch", err);
}

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

/* Block = value head h (and row i0 when rows are distinct sessions). Thread t owns column
 * j = t / 2 of the state, rows e = 2 ee + (t & 1): two threads per column keep 64 state values each
 * in registers; their partial sums meet by one shuffle (commutative: both get the same bits). */
template <class R>
__global__ void __launch_bounds__(REC_THREADS)
gdn_recur_kernel(dr_cuda_gdn_shape s, int64_t n, int one_session, const float *y, const float *z, int64_t z_ld,
                 float *a, float *b, int64_t ab_ld, R rows, float *o) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ float qv[DR_CUDA_GDN_MAX_DK], kv[DR_CUDA_GDN_MAX_DK];
    __shared__ double sh[64];
    const int h = blockIdx.x, j = threadIdx.x >> 1, half = threadIdx.x & 1, dk = s.dk, dv = s.dv;
    /* one_session 1: every row, 0: row blockIdx.y alone; 2: the run of consecutive rows of one
     * sequence that starts at row blockIdx.y (blocks inside a run leave: its first block owns it) */
    int64_t i0 = one_session == 1 ? 0 : blockIdx.y, i1 = one_session == 1 ? n : i0 + 1;
    if (one_session == 2) {
        if (i0 > 0 && rows.same(i0, i0 - 1)) return;
        while (i1 < n && rows.same(i1, i1 - 1)) i1++;
    }
    const int kh = h / (s.nv / s.nk);
    const int64_t qk = (int64_t)s.nk * dk, C = 2 * qk + (int64_t)s.nv * dv, vd = (int64_t)s.nv * dv;
    const float qscale = fdiv(1.0f, __fsqrt_rn((float)dk));
    float *S = rows.rec(i0) + (int64_t)h * dk * dv;
    const bool col = j < dv;
    const float neg_a = s.neg_A[h], dt_bias = s.dt_bias[h]; /* the head's constants, read once */
    float st[GDN_ROWS];
#pragma unroll
    for (int ee = 0; ee < GDN_ROWS; ee++) {
        int e = 2 * ee + half;
        st[ee] = (col && e < dk) ? S[(int64_t)e * dv + j] : 0.0f;
    }
    /* a row's inputs (gates, v, and q / k when a thread holds one of each) are loaded while the row
     * before it is computed: a prefill's rows otherwise each began with a wait on global memory */
    const bool pre = dk <= (int)blockDim.x;
    float an = 0.0f, bn = 0.0f, vn = 0.0f, qn = 0.0f, kn = 0.0f;
    auto fetch = [&](int64_t i) {
        const float *yi = y + i * C;
        an = a[i * ab_ld + h], bn = b[i * ab_ld + h];
        vn = col ? yi[2 * qk + (int64_t)h * dv + j] : 0.0f;
        if (pre && (int)threadIdx.x < dk) qn = yi[(int64_t)kh * dk + threadIdx.x], kn = yi[qk + (int64_t)kh * dk + threadIdx.x];
    };
    if (i0 < i1) fetch(i0);
    for (int64_t i = i0; i < i1; i++) {
        const float *yi = y + i * C;
        const float a_in = an, b_in = bn, vj = vn, q_in = qn, k_in = kn;
        if (i + 1 < i1) fetch(i + 1); /* before this row's barriers: in flight while it is computed */
        if (R::zero_held && rows.held(i)) { /* a held row of the seam: state untouched, output 0 */
            if (col && !half) o[i * vd + (int64_t)h * dv + j] = 0.0f;
            continue;
        }
        if (pre) {
            if ((int)threadIdx.x < dk) qv[threadIdx.x] = q_in, kv[threadIdx.x] = k_in;
        } else {
            for (int e = threadIdx.x; e < dk; e += blockDim.x) {
                qv[e] = yi[(int64_t)kh * dk + e];
                kv[e] = yi[qk + (int64_t)kh * dk + e];
            }
        }
        __syncthreads();
        block_l2norm_qk(qv, kv, dk, qscale, sh);
        float g = fmul(neg_a, dsoftplus(fadd(a_in, dt_bias)));
        float beta = dsigmoid(b_in);
        if (R::gates_out) { /* the seam's op leaves g and beta in a and b (dr_op_gdn_gates in place) */
            __syncthreads(); /* every thread has read a and b */
            if (threadIdx.x == 0) a[i * ab_ld + h] = g, b[i * ab_ld + h] = beta;
        }
        float decay = expf(g), m = 0.0f;
#pragma unroll
        for (int ee = 0; ee < GDN_ROWS; ee++) {
            int e = 2 * ee + half;
            if (e < dk) {
                st[ee] = fmul(st[ee], decay);
                m = fadd(m, fmul(st[ee], kv[e]));
            }
        }
        m = fadd(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
        float dlt = col ? fmul(fsub(vj, m), beta) : 0.0f;
        float oj = 0.0f;
#pragma unroll
        for (int ee = 0; ee < GDN_ROWS; ee++) {
            int e = 2 * ee + half;
            if (e < dk) {
                st[ee] = fadd(st[ee], fmul(kv[e], dlt));
                oj = fadd(oj, fmul(st[ee], qv[e]));
            }
        }
        oj = fadd(oj, __shfl_xor_sync(0xFFFFFFFFu, oj, 1));
        if (!z) { /* the seam: the gated norm is its own op */
            if (col && !half) o[i * vd + (int64_t)h * dv + j] = oj;
            __syncthreads();
            continue;
        }
        /* o_h = rms_norm_plain(o_h, norm) * silu(z_h) (dr_op_gated_rms_norm) */
        double ss = block_sum_d((col && !half) ? (double)oj * (double)oj : 0.0, sh);
        float r = (float)(1.0 / sqrt(ss / (double)dv + s.eps));
        if (col && !half) {
            const float *nw = s.norm + (s.norm_per_channel ? (int64_t)h * dv : 0);
            float on = fmul(fmul(oj, r), nw[j]);
            o[i * vd + (int64_t)h * dv + j] = fmul(on, dsilu(z[i * z_ld + (int64_t)h * dv + j]));
        }
        __syncthreads(); /* qv / kv are refilled by the next row */
    }
    if (col && !(one_session != 1 && rows.held(i0))) {
#pragma unroll
        for (int ee = 0; ee < GDN_ROWS; ee++) {
            int e = 2 * ee + half;
            if (e < dk) S[(int64_t)e * dv + j] = st[ee];
        }
    }
}

extern "C" drama_status dr_cuda_gdn_recur(dr_cuda *c, const dr_cuda_gdn_shape *s, int64_t n, int one_session,
                                          const float *y, const float *z, int64_t z_ld, const float *a, const float *b,
                                          int64_t ab_ld, float *const *state, const int32_t *skip, float *o,
                                          drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!s || !y || !z || !a || !b || !state || !o || !s->neg_A || !s->dt_bias || !s->norm || s->nk <= 0 ||
        s->nv % s->nk || s->dk <= 0 || s->dv <= 0)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gdn_recur: bad shape or pointers");
    if (s->dk > DR_CUDA_GDN_MAX_DK || s->dv > DR_CUDA_GDN_MAX_DV)
        return dr_fail(err, DRAMA_EUNSUPPORTED,
                       "CUDA DeltaNet: key head dim %d / value head dim %d beyond the kernel's %d / %d", s->dk, s->dv,
                       DR_CUDA_GDN_MAX_DK, DR_CUDA_GDN_MAX_DV);
    int threads = (2 * s->dv + 31) / 32 * 32;
    dim3 grid((unsigned)s->nv, one_session ? 1u : (unsigned)n);
    rows_arr r = {NULL, NULL, state, skip};
    dr_launch(c->pdl, gdn_recur_kernel<decltype(r)>, grid, threads, 0, c->stream, *s, n, one_session, y, z, z_ld,
              (float *)a, (float *)b, ab_ld, r, o);
    return dr_cuda_check(cudaGetLastError(), "deltanet recurrence launch", err);
}

/* ---- the seam's DeltaNet op: conv + SiLU, then the recurrence row by row (its rows are one
 * session in position order, or one row per session); the gated norm is a separate op ---- */
drama_status dr_cuda_seam_deltanet(dr_cuda *c, const dr_cuda_gdn_shape *s, const dr_seq_row *rows, int layer,
                                   int64_t n, int one_session, const float *u, float *y, float *a, float *b,
                                   float *out, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (s->dk > DR_CUDA_GDN_MAX_DK || s->dv > DR_CUDA_GDN_MAX_DV || s->nv % s->nk)
        return dr_fail(err, DRAMA_EUNSUPPORTED,
                       "CUDA DeltaNet: key head dim %d / value head dim %d beyond the kernel's %d / %d", s->dk, s->dv,
                       DR_CUDA_GDN_MAX_DK, DR_CUDA_GDN_MAX_DV);
    int64_t C = 2 * (int64_t)s->nk * s->dk + (int64_t)s->nv * s->dv;
    rows_seq r = {rows, layer};
    dr_launch(c->pdl, gdn_conv_kernel<decltype(r)>, (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), CONV_THREADS, 0,
              c->stream, *s, n, C, u, C, r, y);
    drama_status st = dr_cuda_check(cudaGetLastError(), "deltanet conv launch", err);
    if (st) return st;
    int threads = (2 * s->dv + 31) / 32 * 32;
    (void)one_session; /* the runs of one sequence are found on the device (mode 2) */
    dim3 grid((unsigned)s->nv, (unsigned)n);
    dr_launch(c->pdl, gdn_recur_kernel<decltype(r)>, grid, threads, 0, c->stream, *s, n, 2, y, nullptr, 0, a, b, s->nv,
              r, out);
    return dr_cuda_check(cudaGetLastError(), "deltanet recurrence launch", err);
}
