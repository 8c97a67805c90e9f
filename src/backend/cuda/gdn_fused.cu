/* gdn_fused.cu - the seam's DeltaNet for a few rows (a frame step) in one launch (docs/cuda.md
 * "DeltaNet decode: one kernel"): block (value head h, run of rows of one sequence) convolves the
 * channels its head reads itself (q and k of key head h / (nv / nk), v of head h; the window in
 * shared memory, one slot per channel and thread), then runs gdn_recur_kernel's recurrence and,
 * with a norm, gated_norm_kernel's gated RMS norm on the head's output while it is on chip.
 * Every fp32 / double operation is the one of gdn_conv_kernel, gdn_recur_kernel and
 * gated_norm_kernel, in the same order (the norm's sum replays the 128-thread block's tree), so
 * y, a, b, out, the window and the state are bit for bit those of the three launches.
 *
 * The value heads of one key head read the same q/k window: they run as one thread-block cluster
 * (nv / nk blocks, sm_90). Each block stages the old window in its first row; after its rows every
 * block arrives on the cluster barrier and waits, then only the cluster's first block writes the
 * advanced q/k window back, so no block can read a window another has already shifted. v channels
 * are one block's own. */
#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_seam_kernels.h"
#include "backend/cuda/dev_rows.cuh"
#include "backend/cuda/gdn_common.cuh"

#define GN_THREADS 128 /* gated_norm_kernel's block (seam_ops.cu): its sum's tree is replayed */
#define FUSED_CH (2 * DR_CUDA_GDN_MAX_DK + DR_CUDA_GDN_MAX_DV) /* channels one block convolves */
#define FUSED_MAX_CLUSTER 8 /* the portable cluster size: value heads per key head (a power of two) */

static int g_defect; /* dr_cuda_gdn_plant_defect: the contract's planted controls */

extern "C" void dr_cuda_gdn_plant_defect(int defect) { g_defect = defect; }

/* barrier.cluster: arrive has release, wait acquire semantics (PTX ISA); below sm_90 compiled out
 * (dr_cuda_gdn_fused_ok refuses such devices) */
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;" ::: "memory");
#endif
}

/* DEFECT (contract only): 1 = the conv window not shifted (only its newest slot replaced),
 * 2 = the gated norm's silu(z) read from the next value head. */
template <int DEFECT>
__global__ void __launch_bounds__(REC_THREADS, 1)
gdn_fused_kernel(dr_cuda_gdn_shape s, int64_t n, const float *u, rows_seq rows, float *y, float *a, float *b,
                 const float *z, float *o) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ float qv[DR_CUDA_GDN_MAX_DK], kv[DR_CUDA_GDN_MAX_DK], vs[DR_CUDA_GDN_MAX_DV], os[DR_CUDA_GDN_MAX_DV];
    __shared__ float win[CONV_MAX_WIN][FUSED_CH];
    __shared__ double sh[64];
    const int h = blockIdx.x, j = threadIdx.x >> 1, half = threadIdx.x & 1, dk = s.dk, dv = s.dv, K = s.K;
    /* the run of consecutive rows of one sequence that starts at row blockIdx.y (gdn_recur_kernel's
     * mode 2); every block of a cluster has the same row, so a cluster leaves as a whole */
    const int64_t i0 = blockIdx.y;
    if (i0 > 0 && rows.same(i0, i0 - 1)) return;
    int64_t i1 = i0 + 1;
    while (i1 < n && rows.same(i1, i1 - 1)) i1++;
    const int ratio = s.nv / s.nk, kh = h / ratio;
    const bool qk_owner = h % ratio == 0; /* the cluster's first block: writes the q/k window and y */
    const int64_t qk = (int64_t)s.nk * dk, C = 2 * qk + (int64_t)s.nv * dv, vd = (int64_t)s.nv * dv;
    const int L = 2 * dk + dv; /* the block's channels: q, k of key head kh, then v of head h */
    auto chan = [&](int l) -> int64_t {
        return l < dk ? (int64_t)kh * dk + l : l < 2 * dk ? qk + (int64_t)kh * dk + (l - dk) : 2 * qk + (int64_t)h * dv + (l - 2 * dk);
    };
    const float qscale = fdiv(1.0f, __fsqrt_rn((float)dk));
    const bool col = j < dv;
    const float neg_a = s.neg_A[h], dt_bias = s.dt_bias[h];
    float st[GDN_ROWS]; /* the state's loads first: in flight while the window is staged */
#pragma unroll
    for (int ee = 0; ee < GDN_ROWS; ee++) {
        int e = 2 * ee + half;
        st[ee] = (col && e < dk) ? rows.rec(i0)[(int64_t)h * dk * dv + (int64_t)e * dv + j] : 0.0f;
    }
    const float *cw0 = rows.conv(i0);
    for (int64_t i = i0; i < i1; i++) {
        const bool held = rows.held(i);
        const float a_in = a[i * s.nv + h], b_in = b[i * s.nv + h]; /* issued with the conv's loads */
        /* gdn_conv_kernel's expression for the block's channels, thread l owning slot l of the
         * shared window (staged from memory in the first row); loops unrolled so the window,
         * weights and u are loaded together; the same products and sums in the same order */
        for (int l = threadIdx.x; l < L; l += blockDim.x) {
            const int64_t c = chan(l);
            const float *wc = s.conv_w + c * K;
            if (i == i0) {
#pragma unroll
                for (int t = 0; t < CONV_MAX_WIN; t++)
                    if (t < K - 1) win[t][l] = cw0[(int64_t)t * C + c];
            }
            const float uc = u[i * C + c];
            float acc = s.conv_b ? s.conv_b[c] : 0.0f;
#pragma unroll
            for (int t = 0; t < CONV_MAX_WIN; t++)
                if (t < K - 1) acc = fadd(acc, fmul(wc[t], win[t][l]));
#pragma unroll
            for (int t = 0; t <= CONV_MAX_WIN; t++)
                if (t == K - 1) acc = fadd(acc, fmul(wc[t], uc));
            if (!held && K > 1) {
                if (DEFECT != 1) {
#pragma unroll
                    for (int t = 0; t + 1 < CONV_MAX_WIN; t++)
                        if (t + 1 < K - 1) win[t][l] = win[t + 1][l];
                }
#pragma unroll
                for (int t = 0; t < CONV_MAX_WIN; t++)
                    if (t == K - 2) win[t][l] = uc;
            }
            const float yv = held ? 0.0f : dsilu(acc);
            if (l < dk) qv[l] = yv;
            else if (l < 2 * dk) kv[l - dk] = yv;
            else vs[l - 2 * dk] = yv;
            if (l >= 2 * dk || qk_owner) y[i * C + c] = yv; /* the seam's scratch, as the conv kernel leaves it */
        }
        __syncthreads();
        float oj = 0.0f; /* a held row: state untouched, output 0 (then normed as the norm kernel does) */
        if (!held) { /* gdn_recur_kernel's row */
            const float vj = col ? vs[j] : 0.0f;
            block_l2norm_qk(qv, kv, dk, qscale, sh);
            float g = fmul(neg_a, dsoftplus(fadd(a_in, dt_bias)));
            float beta = dsigmoid(b_in);
            __syncthreads(); /* every thread has read a and b */
            if (threadIdx.x == 0) a[i * s.nv + h] = g, b[i * s.nv + h] = beta;
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
#pragma unroll
            for (int ee = 0; ee < GDN_ROWS; ee++) {
                int e = 2 * ee + half;
                if (e < dk) {
                    st[ee] = fadd(st[ee], fmul(kv[e], dlt));
                    oj = fadd(oj, fmul(st[ee], qv[e]));
                }
            }
            oj = fadd(oj, __shfl_xor_sync(0xFFFFFFFFu, oj, 1));
        }
        float *oi = o + i * vd + (int64_t)h * dv;
        if (!s.norm) { /* the norm follows as its own launch */
            if (col && !half) oi[j] = oj;
            __syncthreads(); /* qv / kv / vs are refilled by the next row */
            continue;
        }
        /* gated_norm_kernel's block (GN_THREADS threads) on the head: block_rms_norm, then * silu(z) */
        if (col && !half) os[j] = oj;
        __syncthreads();
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        for (int vw = w; vw < GN_THREADS / 32; vw += nw) { /* its warp vw, lane for lane */
            double ss = 0.0;
            for (int e = vw * 32 + lane; e < dv; e += GN_THREADS) ss += (double)os[e] * (double)os[e];
            ss = warp_sum_d(ss);
            if (lane == 0) sh[vw] = ss;
        }
        __syncthreads();
        const double ss = warp_sum_d(lane < GN_THREADS / 32 ? sh[lane] : 0.0);
        const float r = (float)(1.0 / sqrt(ss / (double)dv + s.eps));
        if (col && !half) {
            const float *nw_h = s.norm + (s.norm_per_channel ? (int64_t)h * dv : 0);
            const int zh = DEFECT == 2 ? (h + 1) % s.nv : h;
            const float on = fmul(fmul(oj, r), nw_h[j]);
            oi[j] = fmul(on, dsilu(z[i * vd + (int64_t)zh * dv + j]));
        }
        __syncthreads(); /* qv / kv / vs / sh are refilled by the next row */
    }
    if (ratio > 1) { /* every block of the key head is past its rows, so past reading the old q/k window */
        cluster_arrive();
        cluster_wait();
    }
    float *cw = rows.conv(i0); /* (reloaded: fewer registers live across the rows) */
    for (int l = threadIdx.x; l < L; l += blockDim.x)
        if (l >= 2 * dk || qk_owner)
            for (int t = 0; t < K - 1; t++) cw[(int64_t)t * C + chan(l)] = win[t][l];
    if (col && !rows.held(i0)) {
        float *S = rows.rec(i0) + (int64_t)h * dk * dv;
#pragma unroll
        for (int ee = 0; ee < GDN_ROWS; ee++) {
            int e = 2 * ee + half;
            if (e < dk) S[(int64_t)e * dv + j] = st[ee];
        }
    }
}

extern "C" int dr_cuda_gdn_fused_ok(const dr_cuda *c, const dr_cuda_gdn_shape *s, int64_t n) {
    return c && c->info.cc_major >= 9 && s && n >= 1 && n <= DR_CUDA_GDN_FUSED_MAX_ROWS && n <= 65535 && s->nk > 0 &&
           s->nv % s->nk == 0 && s->nv / s->nk <= FUSED_MAX_CLUSTER && !((s->nv / s->nk) & (s->nv / s->nk - 1)) && s->dk > 0 && s->dk <= DR_CUDA_GDN_MAX_DK &&
           s->dv > 0 && s->dv <= DR_CUDA_GDN_MAX_DV && s->K >= 1 && s->K - 1 <= CONV_MAX_WIN;
}

template <int D>
static cudaError_t launch_fused(dr_cuda *c, const dr_cuda_gdn_shape &s, int64_t n, const float *u, rows_seq r,
                                float *y, float *a, float *b, const float *z, float *o) {
    cudaLaunchAttribute at[2];
    int na = 0;
    const unsigned ratio = (unsigned)(s.nv / s.nk);
    if (ratio > 1) { /* the value heads of one key head: one cluster */
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = ratio, at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = 1;
        na++;
    }
    if (c->pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)s.nv, (unsigned)n);
    cfg.blockDim = dim3((unsigned)((2 * s.dv + 31) / 32 * 32));
    cfg.stream = c->stream;
    cfg.attrs = na ? at : NULL;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, gdn_fused_kernel<D>, s, n, u, r, y, a, b, z, o);
}

extern "C" drama_status dr_cuda_gdn_step(dr_cuda *c, const dr_cuda_gdn_shape *s, const dr_seq_row *rows, int layer,
                                         int64_t n, const float *u, float *y, float *a, float *b, const float *z,
                                         float *out, int fused, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!c || !s || !rows || !u || !y || !a || !b || !out || !s->conv_w || !s->neg_A || !s->dt_bias)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gdn_step: bad shape or pointers");
    if (s->norm && !z) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_gdn_step: a norm without z");
    if (!fused) { /* today's launches: conv, recurrence, then the norm op */
        drama_status st = dr_cuda_seam_deltanet(c, s, rows, layer, n, 2, u, y, a, b, out, err);
        if (st || !s->norm) return st;
        return dr_cuda_seam_gated_norm(c, out, s->norm, s->norm_per_channel, z, s->eps, s->nv, s->dv, n, err);
    }
    if (!dr_cuda_gdn_fused_ok(c, s, n))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA fused DeltaNet: %lld rows, nk %d dk %d nv %d dv %d K %d unsupported",
                       (long long)n, s->nk, s->dk, s->nv, s->dv, s->K);
    dr_cuda_gdn_shape sh = *s;
    sh.eps = (double)(float)s->eps; /* as dr_cuda_seam_gated_norm passes it */
    rows_seq r = {rows, layer};
    cudaError_t e = g_defect == 1   ? launch_fused<1>(c, sh, n, u, r, y, a, b, z, out)
                    : g_defect == 2 ? launch_fused<2>(c, sh, n, u, r, y, a, b, z, out)
                                    : launch_fused<0>(c, sh, n, u, r, y, a, b, z, out);
    return dr_cuda_check(e, "fused deltanet launch", err);
}
