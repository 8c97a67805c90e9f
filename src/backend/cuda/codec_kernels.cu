/* codec_kernels.cu - the codec decoder's kernels (codec_kernels.cuh).
 *
 * The conv is an implicit GEMM on the SIMT fp32 units: a block computes a BM x BN tile of
 * outputs (16 x 16 threads, TM x TN outputs each), staging bki input channels of weights and their
 * input columns (history first) in shared memory. Every output is one fmaf chain over its input
 * channels in order, taps in order within a channel, from 0 (the CPU's order: codec/ops.c), split
 * at fixed channel boundaries when splits > 1; so a value never depends on the tile, the number of
 * time steps of the call or which block computed it, and a stream in any chunking equals the whole
 * decode bit for bit. */
#include <math.h>

#include "backend/cuda/codec_kernels.cuh"

__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float fdiv(float a, float b) { return __fdiv_rn(a, b); }

static inline unsigned nblk(int64_t n, int b) { return (unsigned)((n + b - 1) / b); }

/* the epilogue of ops.c's put() plus the fused steps of the callers (ConvNeXt / transformer
 * residuals with their scales, SwiGLU, GELU, tanh), each rounded as the CPU rounds it */
__device__ __forceinline__ void epi_store(const ck_epi &e, int o, int64_t t, float a) {
    float v = fadd(a, e.bias ? e.bias[o] : 0.0f);
    int64_t at = (int64_t)o * e.ldy + t; /* t: the output column (phase-interleaved for transposed convs) */
    switch (e.act) {
    case CK_ACT_SNAKE: {
        float s = sinf(fmul(e.alpha[o], v));
        v = fadd(v, fmul(e.inv[o], fmul(s, s)));
        break;
    }
    case CK_ACT_TANH: v = tanhf(v); break;
    case CK_ACT_GELU: v = fmul(fmul(0.5f, v), fadd(1.0f, erff(fmul(v, (float)M_SQRT1_2)))); break;
    case CK_ACT_SILU_MUL: v = fmul(fdiv(v, fadd(1.0f, expf(-v))), e.aux[at]); break;
    default: break;
    }
    if (e.gamma) v = fmul(e.gamma[o], v);
    if (e.res) v = fadd(e.res[at], v);
    e.y[at] = v;
}

template <int TM, int TN, int KT>
__global__ void __launch_bounds__(256) conv_kernel(ck_conv p) {
    constexpr int BM = 16 * TM, BN = 16 * TN;
    const int K = KT ? KT : p.K, dil = p.dil;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t t0 = (int64_t)blockIdx.x * BN;
    const int o0 = blockIdx.y * BM;
    const int q = blockIdx.z / p.splits, sp = blockIdx.z - q * p.splits; /* output phase, split */
    const int cps = p.cin / p.splits, ci0 = sp * cps, ci1 = ci0 + cps;
    const float *wq = p.w + (int64_t)q * p.phase_len;
    const int bki = p.bki, XW = BN + (K - 1) * dil;
    const int kend = p.plant == 1 ? K - 1 : K; /* contract control only */
    const int64_t HL = p.H + p.L;
    extern __shared__ float sm[];
    float *Ws = sm;                /* [bki * K][BM] */
    float *Xs = sm + bki * K * BM; /* [bki][XW] */
    float acc[TM][TN];
#pragma unroll
    for (int a = 0; a < TM; a++)
#pragma unroll
        for (int b = 0; b < TN; b++) acc[a][b] = 0.0f;
    for (int c0 = ci0; c0 < ci1; c0 += bki) {
        const int nc = min(bki, ci1 - c0), wrows = nc * K;
        for (int e = threadIdx.x; e < wrows * BM; e += 256) {
            int r = e / BM, m = e - r * BM, o = o0 + m;
            Ws[r * BM + m] = o < p.cout ? wq[((int64_t)c0 * K + r) * p.cout + o] : 0.0f;
        }
        for (int e = threadIdx.x; e < nc * XW; e += 256) {
            int ii = e / XW, c = e - ii * XW, i = c0 + ii;
            int64_t col = t0 + c;
            float v = 0.0f;
            if (col < p.H) v = p.hist[(int64_t)i * p.H + col];
            else if (col < HL) v = p.x[(int64_t)i * p.L + (col - p.H)];
            if (p.in_alpha) { /* the Snake in front of this conv, on its input (history included) */
                float sn = sinf(fmul(p.in_alpha[i], v));
                v = fadd(v, fmul(p.in_inv[i], fmul(sn, sn)));
            }
            Xs[ii * XW + c] = v;
        }
        __syncthreads();
        for (int ii = 0; ii < nc; ii++) {
            const float *xr = Xs + ii * XW + tx;
            const float *wr = Ws + ii * K * BM + ty * TM;
#pragma unroll
            for (int k = 0; k < (KT ? KT : 64); k++) {
                if (k >= kend) break;
                float wv[TM], xv[TN];
                if constexpr (TM % 4 == 0) {
#pragma unroll
                    for (int a = 0; a < TM; a += 4) {
                        float4 q = *reinterpret_cast<const float4 *>(wr + k * BM + a);
                        wv[a] = q.x, wv[a + 1] = q.y, wv[a + 2] = q.z, wv[a + 3] = q.w;
                    }
                } else {
#pragma unroll
                    for (int a = 0; a < TM; a++) wv[a] = wr[k * BM + a];
                }
#pragma unroll
                for (int b = 0; b < TN; b++) xv[b] = xr[16 * b + k * dil];
#pragma unroll
                for (int a = 0; a < TM; a++)
#pragma unroll
                    for (int b = 0; b < TN; b++) acc[a][b] = fmaf(wv[a], xv[b], acc[a][b]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < TM; a++) {
        int o = o0 + ty * TM + a;
        if (o >= p.cout) continue;
#pragma unroll
        for (int b = 0; b < TN; b++) {
            int64_t t = t0 + tx + 16 * b;
            if (t >= p.L) continue;
            if (p.splits > 1) p.part[((int64_t)blockIdx.z * p.cout + o) * p.L + t] = acc[a][b];
            else epi_store(p.e, o, t * p.phases + q, acc[a][b]);
        }
    }
}

template <int TM, int TN>
static cudaError_t launch_k(const ck_conv *p, cudaStream_t s) {
    constexpr int BM = 16 * TM, BN = 16 * TN;
    dim3 grid(nblk(p->L, BN), nblk(p->cout, BM), (unsigned)(p->splits * p->phases));
    ck_conv q = *p;
    /* channels per stage (bki 0: chosen here): ~128 weight rows (64 for the 64 x 64 tile), at most
     * the split's channels, within 40 KiB of shared memory. Fewer stages = fewer barriers and
     * global-load round trips, which is what a small grid waits on. */
    int cps = p->cin / p->splits;
    if (!q.bki) q.bki = (TM == 4 ? 64 : 128) / p->K > 1 ? (TM == 4 ? 64 : 128) / p->K : 1;
    if (q.bki > cps) q.bki = cps;
    auto bytes = [&](int b) { return (size_t)(b * p->K * BM + b * (BN + (p->K - 1) * p->dil)) * sizeof(float); };
    while (q.bki > 1 && bytes(q.bki) > 40 * 1024) q.bki /= 2;
    size_t smem = bytes(q.bki);
    if (smem > 48 * 1024) return cudaErrorInvalidValue;
    switch (p->K) {
    case 1: conv_kernel<TM, TN, 1><<<grid, 256, smem, s>>>(q); break;
    case 2: conv_kernel<TM, TN, 2><<<grid, 256, smem, s>>>(q); break;
    case 7: conv_kernel<TM, TN, 7><<<grid, 256, smem, s>>>(q); break;
    default:
        if (p->K > 64) return cudaErrorInvalidValue;
        conv_kernel<TM, TN, 0><<<grid, 256, smem, s>>>(q);
        break;
    }
    return cudaGetLastError();
}

/* The tile shape only changes which block computes a value, never the value. */
cudaError_t ck_conv_launch(const ck_conv *p, cudaStream_t s) {
    if (p->cout <= 16) return launch_k<1, 8>(p, s);
    int64_t tiles64 = (int64_t)nblk(p->L, 64) * nblk(p->cout, 64) * p->splits * p->phases;
    if (tiles64 >= 264) return launch_k<4, 4>(p, s); /* two waves of 132 SMs or more */
    return launch_k<2, 2>(p, s);
}

__global__ void reduce_kernel(const float *part, int splits, int phases, int cout, int64_t L, ck_epi e) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = (int64_t)cout * L;
    if (idx >= per * phases) return;
    int q = (int)(idx / per);
    int64_t r = idx - q * per;
    int o = (int)(r / L);
    int64_t t = r - (int64_t)o * L;
    const float *pq = part + (int64_t)q * splits * per + r;
    float v = pq[0];
    for (int s = 1; s < splits; s++) v = fadd(v, pq[(int64_t)s * per]);
    epi_store(e, o, t * phases + q, v);
}

cudaError_t ck_reduce_launch(const float *part, int splits, int phases, int cout, int64_t L, const ck_epi *e,
                             cudaStream_t s) {
    int64_t n = (int64_t)cout * L * phases;
    reduce_kernel<<<nblk(n, 256), 256, 0, s>>>(part, splits, phases, cout, L, *e);
    return cudaGetLastError();
}

__global__ void hist_kernel(const float *hist, const float *x, int cin, int H, int64_t L, float *keep) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)cin * H) return;
    int i = (int)(idx / H), j = (int)(idx - (int64_t)i * H);
    int64_t col = L + j;
    keep[idx] = col < H ? hist[(int64_t)i * H + col] : x[(int64_t)i * L + (col - H)];
}

cudaError_t ck_hist_next(const float *hist, const float *x, int cin, int H, int64_t L, float *keep, cudaStream_t s) {
    int64_t n = (int64_t)cin * H;
    hist_kernel<<<nblk(n, 256), 256, 0, s>>>(hist, x, cin, H, L, keep);
    return cudaGetLastError();
}

__global__ void snake_kernel(const float *x, float *y, const float *alpha, const float *inv, int C, int64_t L) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)C * L) return;
    int c = (int)(idx / L);
    float v = x[idx], sn = sinf(fmul(alpha[c], v));
    y[idx] = fadd(v, fmul(inv[c], fmul(sn, sn)));
}

cudaError_t ck_snake(const float *x, float *y, const float *alpha, const float *inv, int C, int64_t L, cudaStream_t s) {
    int64_t n = (int64_t)C * L;
    snake_kernel<<<nblk(n, 256), 256, 0, s>>>(x, y, alpha, inv, C, L);
    return cudaGetLastError();
}

__global__ void dw_kernel(const float *w, const float *b, const float *hist, const float *x, int C, int K, int dil,
                          int H, int64_t L, float *y) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)C * L) return;
    int c = (int)(idx / L);
    int64_t t = idx - (int64_t)c * L;
    float a = 0.0f;
    for (int k = 0; k < K; k++) {
        int64_t col = t + (int64_t)k * dil;
        float v = col < H ? hist[(int64_t)c * H + col] : x[(int64_t)c * L + (col - H)];
        a = fmaf(w[(int64_t)c * K + k], v, a);
    }
    y[idx] = fadd(a, b ? b[c] : 0.0f);
}

cudaError_t ck_dwconv(const float *w, const float *b, const float *hist, const float *x, int C, int K, int dil, int H,
                      int64_t L, float *y, cudaStream_t s) {
    int64_t n = (int64_t)C * L;
    dw_kernel<<<nblk(n, 256), 256, 0, s>>>(w, b, hist, x, C, K, dil, H, L, y);
    return cudaGetLastError();
}

/* Norms over the channels of one time step: one block of 256 threads per step; thread i sums
 * channels i, i + 256, ... in order, then a fixed tree adds the 256 partial sums. The order depends
 * only on the channel count, never on the number of steps, so chunked calls stay bit-identical
 * (the CPU sums channels in one chain: the two differ by rounding). */
#define NT 256
__device__ __forceinline__ float block_sum(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = NT / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] = fadd(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(NT) layernorm_kernel(float *x, int C, int64_t L, const float *w, const float *b,
                                                       float eps) {
    __shared__ float sh[NT];
    const int64_t t = blockIdx.x;
    float part = 0.0f;
    for (int c = threadIdx.x; c < C; c += NT) part = fadd(part, x[(int64_t)c * L + t]);
    const float mean = fdiv(block_sum(part, sh), (float)C);
    part = 0.0f;
    for (int c = threadIdx.x; c < C; c += NT) {
        float d = fsub(x[(int64_t)c * L + t], mean);
        part = fadd(part, fmul(d, d));
    }
    const float r = fdiv(1.0f, sqrtf(fadd(fdiv(block_sum(part, sh), (float)C), eps)));
    for (int c = threadIdx.x; c < C; c += NT) {
        float *p = &x[(int64_t)c * L + t];
        *p = fadd(fmul(fmul(fsub(*p, mean), r), w[c]), b[c]);
    }
}

cudaError_t ck_layernorm(float *x, int C, int64_t L, const float *w, const float *b, float eps, cudaStream_t s) {
    layernorm_kernel<<<(unsigned)L, NT, 0, s>>>(x, C, L, w, b, eps);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(NT) rmsnorm_kernel(const float *x, float *y, int D, int64_t L, const float *w,
                                                     float eps) {
    __shared__ float sh[NT];
    const int64_t t = blockIdx.x;
    float part = 0.0f;
    for (int c = threadIdx.x; c < D; c += NT) {
        float v = x[(int64_t)c * L + t];
        part = fadd(part, fmul(v, v));
    }
    const float r = fdiv(1.0f, sqrtf(fadd(fdiv(block_sum(part, sh), (float)D), eps)));
    for (int c = threadIdx.x; c < D; c += NT) y[(int64_t)c * L + t] = fmul(fmul(x[(int64_t)c * L + t], r), w[c]);
}

cudaError_t ck_rmsnorm(const float *x, float *y, int D, int64_t L, const float *w, float eps, cudaStream_t s) {
    rmsnorm_kernel<<<(unsigned)L, NT, 0, s>>>(x, y, D, L, w, eps);
    return cudaGetLastError();
}

__global__ void vq_kernel(ck_tables tab, int K, const int32_t *codes, int Q, int T, float *z) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)Q * T) return;
    int o = (int)(idx / T), t = (int)(idx - (int64_t)o * T);
    float res = 0.0f;
    for (int k = 1; k < K; k++) res = fadd(res, tab.t[k][(int64_t)codes[t * K + k] * Q + o]);
    z[idx] = fadd(tab.t[0][(int64_t)codes[t * K] * Q + o], res);
}

cudaError_t ck_vq_sum(const ck_tables *tab, int K, const int32_t *codes, int Q, int T, float *z, cudaStream_t s) {
    vq_kernel<<<nblk((int64_t)Q * T, 256), 256, 0, s>>>(*tab, K, codes, Q, T, z);
    return cudaGetLastError();
}

__device__ __forceinline__ float bf16_round(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

__global__ void rope_kernel(float *qkv, int row0, int H, int hd, float base, int bf16, int64_t L, int64_t pos0) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int half = hd / 2;
    if (idx >= (int64_t)half * L * H) return;
    int i = (int)(idx % half);
    int64_t rest = idx / half, t = rest % L;
    int h = (int)(rest / L);
    float e = fdiv((float)(2 * i), (float)hd), freq = fdiv(1.0f, powf(base, e));
    float ang = fmul((float)(pos0 + t), freq), c = cosf(ang), sn = sinf(ang);
    if (bf16) c = bf16_round(c), sn = bf16_round(sn);
    float *x0 = qkv + (int64_t)(row0 + h * hd + 2 * i) * L + t, *x1 = x0 + L;
    float a = *x0, b = *x1;
    *x0 = fsub(fmul(a, c), fmul(b, sn));
    *x1 = fadd(fmul(b, c), fmul(a, sn));
}

cudaError_t ck_rope(float *qkv, int row0, int H, int hd, float base, int bf16, int64_t L, int64_t pos0,
                    cudaStream_t s) {
    int64_t n = (int64_t)(hd / 2) * L * H;
    rope_kernel<<<nblk(n, 256), 256, 0, s>>>(qkv, row0, H, hd, base, bf16, L, pos0);
    return cudaGetLastError();
}

__global__ void kv_kernel(const float *qkv, int Dq, int64_t L, float *rk, float *rv, int cap, int64_t pos0) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)Dq * L) return;
    int c = (int)(idx / L);
    int64_t t = idx - (int64_t)c * L, row = (pos0 + t) % cap;
    rk[row * Dq + c] = qkv[(int64_t)(Dq + c) * L + t];
    rv[row * Dq + c] = qkv[(int64_t)(2 * Dq + c) * L + t];
}

cudaError_t ck_kv_store(const float *qkv, int Dq, int64_t L, float *rk, float *rv, int cap, int64_t pos0,
                        cudaStream_t s) {
    kv_kernel<<<nblk((int64_t)Dq * L, 256), 256, 0, s>>>(qkv, Dq, L, rk, rv, cap, pos0);
    return cudaGetLastError();
}

/* one block per (query, head): the window's K rows staged in shared memory (coalesced), scores
 * in parallel, max and sum in key order by one thread (the CPU's order), the weighted sum of V per
 * output dimension in key order */
__global__ void attend_kernel(const float *qkv, const float *rk, const float *rv, int cap, int H, int hd, int W,
                              int64_t L, int64_t pos0, float *out) {
    extern __shared__ float sh[];
    float *ks = sh, *sc = ks + (size_t)W * (hd + 1), *qs = sc + W, *tot = qs + hd; /* K rows padded: no bank conflicts */
    const int64_t t = blockIdx.x, P = pos0 + t, first = P - (W - 1) < 0 ? 0 : P - (W - 1);
    const int h = blockIdx.y, n = (int)(P - first + 1), Dq = H * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qkv[(int64_t)(h * hd + d) * L + t];
    for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
        int j = e / hd, d = e - j * hd;
        ks[j * (hd + 1) + d] = rk[((first + j) % cap) * Dq + h * hd + d];
    }
    __syncthreads();
    const float scale = fdiv(1.0f, sqrtf((float)hd));
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float *k = ks + (size_t)j * (hd + 1);
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s = fadd(s, fmul(qs[d], k[d]));
        sc[j] = fmul(s, scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int j = 0; j < n; j++)
            if (sc[j] > mx) mx = sc[j];
        tot[0] = mx;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) sc[j] = expf(fsub(sc[j], tot[0]));
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int j = 0; j < n; j++) sum = fadd(sum, sc[j]);
        tot[1] = sum;
    }
    __syncthreads();
    const float sum = tot[1];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int j = 0; j < n; j++)
            acc = fadd(acc, fmul(fdiv(sc[j], sum), rv[((first + j) % cap) * Dq + h * hd + d]));
        out[(int64_t)(h * hd + d) * L + t] = acc;
    }
}

size_t ck_attend_smem(int W, int hd) { return ((size_t)W * (hd + 1) + W + hd + 2) * sizeof(float); }

cudaError_t ck_attend(const float *qkv, const float *rk, const float *rv, int cap, int H, int hd, int W, int64_t L,
                      int64_t pos0, float *out, cudaStream_t s) {
    size_t smem = ck_attend_smem(W, hd);
    if (smem > 48 * 1024) return cudaErrorInvalidValue; /* window x head size beyond the staged K tile */
    attend_kernel<<<dim3((unsigned)L, (unsigned)H), 128, smem, s>>>(qkv, rk, rv, cap, H, hd, W, L, pos0, out);
    return cudaGetLastError();
}
