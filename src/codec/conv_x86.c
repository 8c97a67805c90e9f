/* conv_x86.c - AVX2/FMA and AVX-512 conv and Snake kernels of the codec (kernels.h).
 *
 * A conv tile keeps a block of outputs x time steps in registers (AVX-512: 8 outputs x 48 steps,
 * 24 accumulators; AVX2: 4 outputs x 24 steps, 12) and runs over input channels, then taps: per
 * tap it loads the time vectors once and broadcasts each output's weight, so it is bound by the
 * FMA units, not by loads. Remainders use masked loads and stores of the same code, so every
 * output is the same FMA chain wherever it falls. Functions carry their own target attribute
 * and only run where ops.c found the instruction set (cd_isa_best). */
#include <math.h>
#include <string.h>

#include "codec/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma")))
#define T5 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))
#define INL static inline __attribute__((always_inline))
#define PF_ROWS 4 /* block256 without unrolled taps: input rows prefetched this far ahead (1x1 convs: +3-5%) */

/* sin(y)^2 = sin(r)^2 or cos(r)^2 for y = n pi/2 + r, |r| <= pi/4 (three-part pi/2, minimax
 * polynomials of sin and cos on [-pi/4, pi/4]); lanes past 8192 or non-finite go to libm. */
#define PIO2_1 1.5707963705062866f
#define PIO2_2 -4.371138828673793e-08f
#define PIO2_3 -1.7151245100058819e-15f
#define TWO_OVER_PI 0.6366197466850281f
#define S1 -1.6666654611e-1f
#define S2 8.3321608736e-3f
#define S3 -1.9515295891e-4f
#define C1 4.166664568298827e-2f
#define C2 -1.388731625493765e-3f
#define C3 2.443315711809948e-5f
#define BIG 8192.0f

static float sin2_libm(float y) {
    float s = sinf(y);
    return s * s;
}

T5 INL __m512 snake512(__m512 v, __m512 alpha, __m512 inv, int plant) {
    __m512 y = _mm512_mul_ps(alpha, v);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(TWO_OVER_PI)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PIO2_1), y);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PIO2_2), r);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PIO2_3), r);
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 ps = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(S3), r2, _mm512_set1_ps(S2)), r2, _mm512_set1_ps(S1));
    __m512 s = _mm512_fmadd_ps(_mm512_mul_ps(r, r2), ps, r);
    __m512 pc = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(C3), r2, _mm512_set1_ps(C2)), r2, _mm512_set1_ps(C1));
    __m512 c = _mm512_fmadd_ps(_mm512_mul_ps(r2, r2), pc, _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), r2, _mm512_set1_ps(1.0f)));
    __m512i q = _mm512_xor_si512(_mm512_cvtps_epi32(n), _mm512_set1_epi32(plant == CD_PLANT_PARITY));
    __mmask16 odd = _mm512_test_epi32_mask(q, _mm512_set1_epi32(1));
    __m512 sv = _mm512_mask_blend_ps(odd, s, c);
    __m512 sq = _mm512_mul_ps(sv, sv);
    __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(y), _mm512_set1_ps(BIG), _CMP_GT_OQ);
    if (big) {
        float yl[16], sl[16];
        _mm512_storeu_ps(yl, y);
        _mm512_storeu_ps(sl, sq);
        for (int e = 0; e < 16; e++)
            if (big >> e & 1) sl[e] = sin2_libm(yl[e]);
        sq = _mm512_loadu_ps(sl);
    }
    return _mm512_fmadd_ps(inv, sq, v);
}

T2 INL __m256 snake256(__m256 v, __m256 alpha, __m256 inv, int plant) {
    __m256 y = _mm256_mul_ps(alpha, v);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(TWO_OVER_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PIO2_1), y);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PIO2_2), r);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PIO2_3), r);
    __m256 r2 = _mm256_mul_ps(r, r);
    __m256 ps = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(S3), r2, _mm256_set1_ps(S2)), r2, _mm256_set1_ps(S1));
    __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(r, r2), ps, r);
    __m256 pc = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(C3), r2, _mm256_set1_ps(C2)), r2, _mm256_set1_ps(C1));
    __m256 c = _mm256_fmadd_ps(_mm256_mul_ps(r2, r2), pc, _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), r2, _mm256_set1_ps(1.0f)));
    __m256i q = _mm256_xor_si256(_mm256_cvtps_epi32(n), _mm256_set1_epi32(plant == CD_PLANT_PARITY));
    __m256 odd = _mm256_castsi256_ps(_mm256_slli_epi32(q, 31)); /* sign bit = parity */
    __m256 sv = _mm256_blendv_ps(s, c, odd);
    __m256 sq = _mm256_mul_ps(sv, sv);
    __m256 ay = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), y);
    int big = _mm256_movemask_ps(_mm256_cmp_ps(ay, _mm256_set1_ps(BIG), _CMP_GT_OQ));
    if (big) {
        float yl[8], sl[8];
        _mm256_storeu_ps(yl, y);
        _mm256_storeu_ps(sl, sq);
        for (int e = 0; e < 8; e++)
            if (big >> e & 1) sl[e] = sin2_libm(yl[e]);
        sq = _mm256_loadu_ps(sl);
    }
    return _mm256_fmadd_ps(inv, sq, v);
}

/* ---- short remainders (both instruction sets): across outputs ----
 * Fewer than 8 steps left: a vector holds the 8 outputs of block ob at one step (the packed
 * weights' own layout), one accumulator per step, each output the same FMA chain as in the
 * time-vectorised blocks; the epilogue runs the same lane-wise operations (bias, snake256 equals
 * snake512 lane for lane, residual), so a value does not depend on the path that computed it.
 * Streaming one frame per call and the transformer's few positions land here. */
#define R7(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6)
/* the epilogue of the N steps from t of block ob (accumulators v[e]) */
T2 INL void across_put(const cd_conv_job *j, int ob, int64_t t, const __m256 *v, const int N) {
    int o0 = ob * 8, no = j->cout - o0 < 8 ? j->cout - o0 : 8;
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(no), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 bias = j->b ? _mm256_maskload_ps(j->b + o0, m) : _mm256_setzero_ps(), alpha = bias, inv = bias;
    if (j->snake) alpha = _mm256_maskload_ps(j->snake->alpha + o0, m), inv = _mm256_maskload_ps(j->snake->inv + o0, m);
    float l[8], r[8] = {0};
    for (int e = 0; e < N; e++) {
        __m256 u = _mm256_add_ps(v[e], bias);
        if (j->snake) u = snake256(u, alpha, inv, j->snake->plant);
        if (j->res) {
            for (int q = 0; q < no; q++) r[q] = j->res[(int64_t)(o0 + q) * j->ldy + j->yoff + t + e];
            u = _mm256_add_ps(_mm256_loadu_ps(r), u);
        }
        _mm256_storeu_ps(l, u);
        for (int q = 0; q < no; q++) j->y[(int64_t)(o0 + q) * j->ldy + j->yoff + (t + e) * j->ystep] = l[q];
    }
}

/* N steps from t of the NB weight blocks ob .. ob+NB-1 (1, 2 or 4): NB x N independent chains,
 * so that a few steps (a stream fed one frame: N = 1) still keep both FMA pipes busy instead of
 * waiting on one chain's latency; the broadcast input value is shared by the blocks */
T2 INL void across256(const cd_conv_job *j, int ob, int64_t t, const int N, const int NB) {
    int cin = j->cin, K = j->k;
    const float *wb = j->w + (int64_t)ob * cin * K * 8;
    const int64_t bs = (int64_t)cin * K * 8; /* floats from one weight block to the next */
#define DECL(e) __m256 a0##e = _mm256_setzero_ps(), a1##e = a0##e, a2##e = a0##e, a3##e = a0##e;
    R7(DECL)
#undef DECL
    for (int i = 0; i < cin; i++) {
        const float *xr = j->x + (int64_t)i * j->lx + t - j->xt0;
        const float *wr = wb + (int64_t)i * K * 8;
        int kend = K - (i == 0 && j->plant == CD_PLANT_TAP); /* planted: the first input's last tap dropped */
        for (int k = 0; k < kend; k++) {
            const float *xk = xr + j->toff[k], *wk = wr + (int64_t)k * 8;
            __m256 w0 = _mm256_loadu_ps(wk), w1 = w0, w2 = w0, w3 = w0;
            if (NB > 1) w1 = _mm256_loadu_ps(wk + bs);
            if (NB > 2) w2 = _mm256_loadu_ps(wk + 2 * bs), w3 = _mm256_loadu_ps(wk + 3 * bs);
#define FMA(e)                                                          \
    if (e < N) {                                                        \
        __m256 xb = _mm256_broadcast_ss(xk + e);                        \
        a0##e = _mm256_fmadd_ps(w0, xb, a0##e);                         \
        if (NB > 1) a1##e = _mm256_fmadd_ps(w1, xb, a1##e);             \
        if (NB > 2) a2##e = _mm256_fmadd_ps(w2, xb, a2##e);             \
        if (NB > 2) a3##e = _mm256_fmadd_ps(w3, xb, a3##e);             \
    }
            R7(FMA)
#undef FMA
        }
    }
#define PUTB(b)                                                         \
    {                                                                   \
        __m256 v[7] = {a##b##0, a##b##1, a##b##2, a##b##3, a##b##4, a##b##5, a##b##6}; \
        across_put(j, ob + b, t, v, N);                                 \
    }
    PUTB(0)
    if (NB > 1) PUTB(1)
    if (NB > 2) PUTB(2)
    if (NB > 2) PUTB(3)
#undef PUTB
}

/* n < 8 steps from t of weight blocks ob .. ob+nob-1: 4 blocks at a time for 1-2 steps, 2 for 3-5
 * (the accumulators, weights and broadcast fit the 16 registers), else one */
#define ACROSS(NB)                                                      \
    switch (n) {                                                        \
    case 1: across256(j, ob, t, 1, NB); break;                          \
    case 2: across256(j, ob, t, 2, NB); break;                          \
    case 3: across256(j, ob, t, 3, NB); break;                          \
    case 4: across256(j, ob, t, 4, NB); break;                          \
    case 5: across256(j, ob, t, 5, NB); break;                          \
    case 6: across256(j, ob, t, 6, NB); break;                          \
    case 7: across256(j, ob, t, 7, NB); break;                          \
    default: break;                                                     \
    }
/* out of line: inlined into every tile variant it slowed their main loops down */
T2 static __attribute__((noinline)) void across_tail(const cd_conv_job *j, int ob0, int nob, int64_t t, int64_t n) {
    int wide = n <= 2 ? 4 : n <= 5 ? 2 : 1;
    for (int ob = ob0; ob < ob0 + nob;) {
        int left = ob0 + nob - ob;
        if (wide >= 4 && left >= 4) {
            ACROSS(4)
            ob += 4;
        } else if (wide >= 2 && left >= 2) {
            ACROSS(2)
            ob += 2;
        } else {
            ACROSS(1)
            ob += 1;
        }
    }
}
#undef ACROSS

/* The input-channel x tap loop of block512 / block256 around their own TAP(x, w) (expanded at the
 * use, so each gets its instruction set's TAP); KC > 0 unrolls the KC taps with offsets tk[]. */
#define PREFETCH_ROW(XR) /* a kernel's own hook at the start of each input row (block256: a prefetch) */
#define TAP_LOOP(I0, I1)                                                                         \
    const float *xr = j->x + t - j->xt0 + (int64_t)(I0) * j->lx, *wr = wb + (int64_t)(I0) * K * 8; \
    int i = (I0);                                                                                \
    if (j->plant == CD_PLANT_TAP && i == 0) { /* planted: the first input's last tap dropped */  \
        for (int k = 0; k < K - 1; k++) TAP(xr + to[k], wr + k * 8)                              \
        i = 1, xr += j->lx, wr += K * 8;                                                         \
    }                                                                                            \
    for (; i < (I1); i++, xr += j->lx, wr += K * 8) {                                            \
        PREFETCH_ROW(xr)                                                                         \
        if (KC) {                                                                                \
            _Pragma("GCC unroll 8") for (int k = 0; k < KC; k++) TAP(xr + tk[k], wr + k * 8)     \
        } else {                                                                                 \
            for (int k = 0; k < K; k++) TAP(xr + to[k], wr + k * 8)                              \
        }                                                                                        \
    }

/* ---- AVX-512 ---- */

T5 INL __mmask16 mask16(int64_t rem) { return rem >= 16 ? (__mmask16)0xffff : rem > 0 ? (__mmask16)((1u << rem) - 1) : 0; }

/* bias, fused Snake and residual, then the store of lanes m of output o at steps t.. */
T5 INL void put512(const cd_conv_job *j, int o, int64_t t, __m512 a, __mmask16 m) {
    __m512 v = _mm512_add_ps(a, _mm512_set1_ps(j->b ? j->b[o] : 0.0f));
    if (j->snake) v = snake512(v, _mm512_set1_ps(j->snake->alpha[o]), _mm512_set1_ps(j->snake->inv[o]), j->snake->plant);
    float *y = j->y + (int64_t)o * j->ldy + j->yoff;
    if (j->res) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, j->res + (int64_t)o * j->ldy + j->yoff + t), v);
    if (j->ystep == 1) {
        _mm512_mask_storeu_ps(y + t, m, v);
    } else {
        float l[16];
        _mm512_storeu_ps(l, v);
        for (int e = 0; e < 16; e++)
            if (m >> e & 1) y[(t + e) * j->ystep] = l[e];
    }
}

/* NV vectors of 16 steps from t (n of them valid) for the 8 outputs of block ob. The 24
 * accumulators are named variables (an array would live on the stack). KC as in block256. */
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
T5 INL void block512(const cd_conv_job *j, int ob, int64_t t, int64_t n, const int NV, const int KC) {
    int cin = j->cin, K = KC ? KC : j->k, o0 = ob * 8, no = j->cout - o0 < 8 ? j->cout - o0 : 8;
    const float *wb = j->w + (int64_t)ob * cin * K * 8;
    const int64_t *to = j->toff;
    int64_t tk[8] = {0};
    for (int k = 0; k < KC; k++) tk[k] = to[k];
    __mmask16 m0 = mask16(n), m1 = mask16(n - 16), m2 = mask16(n - 32);
#define DECL(r) __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0;
    R8(DECL)
#undef DECL
#define FMA(r)                                                          \
    {                                                                   \
        __m512 wv = _mm512_set1_ps(w8[r]);                              \
        a##r##0 = _mm512_fmadd_ps(wv, x0, a##r##0);                     \
        if (NV > 1) a##r##1 = _mm512_fmadd_ps(wv, x1, a##r##1);         \
        if (NV > 2) a##r##2 = _mm512_fmadd_ps(wv, x2, a##r##2);         \
    }
#define TAP(XK, W8)                                                     \
    {                                                                   \
        const float *xk = (XK), *w8 = (W8);                             \
        __m512 x0 = _mm512_maskz_loadu_ps(m0, xk), x1 = x0, x2 = x0;    \
        if (NV > 1) x1 = _mm512_maskz_loadu_ps(m1, xk + 16);            \
        if (NV > 2) x2 = _mm512_maskz_loadu_ps(m2, xk + 32);            \
        R8(FMA)                                                         \
    }
    TAP_LOOP(0, cin)
#undef TAP
#undef FMA
#define PUT(r)                                                          \
    if (r < no) {                                                       \
        put512(j, o0 + r, t, a##r##0, m0);                              \
        if (NV > 1) put512(j, o0 + r, t + 16, a##r##1, m1);             \
        if (NV > 2) put512(j, o0 + r, t + 32, a##r##2, m2);             \
    }
    R8(PUT)
#undef PUT
}

T5 INL void tile512(const cd_conv_job *j, int ob, int64_t t0, int64_t nt, const int KC) {
    int64_t t = 0;
    for (; t + 48 <= nt; t += 48) block512(j, ob, t0 + t, 48, 3, KC);
    int64_t rem = nt - t;
    if (rem > 32) block512(j, ob, t0 + t, rem, 3, KC);
    else if (rem > 16) block512(j, ob, t0 + t, rem, 2, KC);
    else if (rem >= 8) block512(j, ob, t0 + t, rem, 1, KC);
    else if (rem > 0) across_tail(j, ob, 1, t0 + t, rem);
}

/* the residual units' 7 taps get their own unrolled copy */
T5 void cd_conv_tile_avx512(const cd_conv_job *j, int ob, int64_t t0, int64_t nt) {
    if (j->k == 7) tile512(j, ob, t0, nt, 7);
    else tile512(j, ob, t0, nt, 0);
}

T5 void cd_snake_row_avx512(float alpha, float inv, const float *x, float *y, int64_t L, int plant) {
    __m512 a = _mm512_set1_ps(alpha), iv = _mm512_set1_ps(inv);
    for (int64_t t = 0; t < L; t += 16) {
        __mmask16 m = mask16(L - t);
        _mm512_mask_storeu_ps(y + t, m, snake512(_mm512_maskz_loadu_ps(m, x + t), a, iv, plant));
    }
}

/* ---- AVX2 ---- */

T2 INL __m256i mask8(int64_t rem) {
    int64_t c = rem < 0 ? 0 : rem > 8 ? 8 : rem;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

T2 INL void put256(const cd_conv_job *j, int o, int64_t t, __m256 a, __m256i m, int64_t n) {
    __m256 v = _mm256_add_ps(a, _mm256_set1_ps(j->b ? j->b[o] : 0.0f));
    if (j->snake) v = snake256(v, _mm256_set1_ps(j->snake->alpha[o]), _mm256_set1_ps(j->snake->inv[o]), j->snake->plant);
    float *y = j->y + (int64_t)o * j->ldy + j->yoff;
    if (j->res) v = _mm256_add_ps(_mm256_maskload_ps(j->res + (int64_t)o * j->ldy + j->yoff + t, m), v);
    if (j->ystep == 1) {
        if (n >= 8) _mm256_storeu_ps(y + t, v); /* a masked store costs ~10x a plain one on Zen */
        else _mm256_maskstore_ps(y + t, m, v);
    } else {
        float l[8];
        _mm256_storeu_ps(l, v);
        for (int e = 0; e < 8 && e < n; e++) y[(t + e) * j->ystep] = l[e];
    }
}

/* NV vectors of 8 steps from t (n valid) for outputs o0 .. o0+3 (h: offset in the weight block),
 * input channels i0 .. i1-1: the sums start from zero (first) or from acc (row r at acc + r *
 * CD_TILE), and end in the epilogue (last) or back in acc.
 * KC > 0: the conv has KC taps, unrolled with their offsets in registers (no per-tap arithmetic
 * beside the loads and FMAs: integer uops would take the FMA ports); KC = 0: j->k taps. */
#define R4(X) X(0) X(1) X(2) X(3)
T2 INL void block256(const cd_conv_job *j, int ob, int h, int64_t t, int64_t n, const int NV, const int FULL,
                     const int KC, int i0, int i1, float *acc, int first, int last) {
    int cin = j->cin, K = KC ? KC : j->k, o0 = ob * 8 + h;
    int no = j->cout - o0 < 4 ? j->cout - o0 : 4;
    const float *wb = j->w + (int64_t)ob * cin * K * 8 + h;
    const int64_t *to = j->toff;
    int64_t tk[8] = {0};
    for (int k = 0; k < KC; k++) tk[k] = to[k];
    __m256i m0 = mask8(n), m1 = mask8(n - 8), m2 = mask8(n - 16);
    /* planted: the carried partial sums dropped at the second contraction block */
    int zero = first || (j->plant == CD_PLANT_KC && i0 == j->kcb);
#define DECL(r)                                                                                  \
    __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0;                    \
    if (!zero) {                                                                                 \
        a##r##0 = _mm256_loadu_ps(acc + r * CD_TILE);                                            \
        if (NV > 1) a##r##1 = _mm256_loadu_ps(acc + r * CD_TILE + 8);                            \
        if (NV > 2) a##r##2 = _mm256_loadu_ps(acc + r * CD_TILE + 16);                           \
    }
    R4(DECL)
#undef DECL
#define FMA(r)                                                          \
    {                                                                   \
        __m256 wv = _mm256_broadcast_ss(w4 + r);                        \
        a##r##0 = _mm256_fmadd_ps(wv, x0, a##r##0);                     \
        if (NV > 1) a##r##1 = _mm256_fmadd_ps(wv, x1, a##r##1);         \
        if (NV > 2) a##r##2 = _mm256_fmadd_ps(wv, x2, a##r##2);         \
    }
#define TAP(XK, W4)                                                                          \
    {                                                                                        \
        const float *xk = (XK), *w4 = (W4);                                                  \
        __m256 x0, x1, x2; /* full blocks: plain loads (the masks would spill a register) */ \
        x0 = FULL ? _mm256_loadu_ps(xk) : _mm256_maskload_ps(xk, m0), x1 = x2 = x0;          \
        if (NV > 1) x1 = FULL ? _mm256_loadu_ps(xk + 8) : _mm256_maskload_ps(xk + 8, m1);    \
        if (NV > 2) x2 = FULL ? _mm256_loadu_ps(xk + 16) : _mm256_maskload_ps(xk + 16, m2);  \
        R4(FMA)                                                                              \
    }
#undef PREFETCH_ROW
#define PREFETCH_ROW(XR)                                                                         \
    if (KC == 0 && j->gemm) {                                                                    \
        _mm_prefetch((const char *)((XR) + PF_ROWS * j->lx), _MM_HINT_T0);                       \
        _mm_prefetch((const char *)((XR) + PF_ROWS * j->lx + 16), _MM_HINT_T0);                  \
    }
    TAP_LOOP(i0, i1)
#undef PREFETCH_ROW
#define PREFETCH_ROW(XR)
#undef TAP
#undef FMA
#define PUT(r)                                                          \
    if (!last) {                                                        \
        _mm256_storeu_ps(acc + r * CD_TILE, a##r##0);                   \
        if (NV > 1) _mm256_storeu_ps(acc + r * CD_TILE + 8, a##r##1);   \
        if (NV > 2) _mm256_storeu_ps(acc + r * CD_TILE + 16, a##r##2);  \
    } else if (r < no) {                                                \
        put256(j, o0 + r, t, a##r##0, m0, n);                           \
        if (NV > 1) put256(j, o0 + r, t + 8, a##r##1, m1, n - 8);       \
        if (NV > 2) put256(j, o0 + r, t + 16, a##r##2, m2, n - 16);     \
    }
    R4(PUT)
#undef PUT
}

/* 8 steps from t for all 8 outputs of block ob, one vector each: 8 chains (two blocks of 4 outputs
 * x 1 vector would have 4 each, too few to hide the FMA latency); otherwise as block256 */
T2 INL void block256x8(const cd_conv_job *j, int ob, int64_t t, const int KC, int i0, int i1, float *acc, int first,
                       int last) {
    int cin = j->cin, K = KC ? KC : j->k, o0 = ob * 8;
    int no = j->cout - o0 < 8 ? j->cout - o0 : 8;
    const float *wb = j->w + (int64_t)ob * cin * K * 8;
    const int64_t *to = j->toff;
    int64_t tk[8] = {0};
    for (int k = 0; k < KC; k++) tk[k] = to[k];
    __m256i m0 = mask8(8);
    int zero = first || (j->plant == CD_PLANT_KC && i0 == j->kcb);
#define DECL(r) __m256 a##r = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * CD_TILE);
    R8(DECL)
#undef DECL
#define FMA(r) a##r = _mm256_fmadd_ps(_mm256_broadcast_ss(w8 + r), x0, a##r);
#define TAP(XK, W8)                                                     \
    {                                                                   \
        const float *w8 = (W8);                                         \
        __m256 x0 = _mm256_loadu_ps(XK);                                \
        R8(FMA)                                                         \
    }
    TAP_LOOP(i0, i1)
#undef TAP
#undef FMA
#define PUT(r)                                                          \
    if (!last) _mm256_storeu_ps(acc + r * CD_TILE, a##r);               \
    else if (r < no) put256(j, o0 + r, t, a##r, m0, 8);
    R8(PUT)
#undef PUT
}

/* weight blocks ob0 .. ob0+nob-1 on steps t0 .. t0+nt: contraction blocks outermost (a block's
 * weights and input window stay in L1 across the tile's steps and the block's two output
 * halves), then weight blocks, steps, halves; fewer than 8 steps left run across outputs */
T2 INL void tile256(const cd_conv_job *j, int ob0, int nob, int64_t t0, int64_t nt, const int KC) {
    int64_t full = nt / 24 * 24, rem = nt - full;
    int cin = j->cin, kcb = j->kcb > 0 && j->kcb < cin ? j->kcb : cin;
    for (int i0 = 0; i0 < cin; i0 += kcb) {
        int i1 = cin - i0 <= kcb ? cin : i0 + kcb, first = i0 == 0, last = i1 == cin;
        for (int ob = ob0; ob < ob0 + nob; ob++) {
            float *acc = j->acc ? j->acc + (int64_t)(ob - ob0) * 8 * CD_TILE : NULL;
#define BLK(T, N, NV, FULL)                                                                          \
    for (int h = 0; h < 8 && ob * 8 + h < j->cout; h += 4)                                           \
        block256(j, ob, h, t0 + (T), N, NV, FULL, KC, i0, i1, acc ? acc + h * CD_TILE + (T) : NULL, first, last);
            for (int64_t t = 0; t < full; t += 24) BLK(t, 24, 3, 1)
            if (rem > 16) BLK(full, rem, 3, 0)
            else if (rem > 8) BLK(full, rem, 2, rem == 16)
            else if (rem == 8 && j->gemm)
                block256x8(j, ob, t0 + full, KC, i0, i1, acc ? acc + full : NULL, first, last);
            else if (rem == 8) BLK(full, 8, 1, 1)
#undef BLK
        }
    }
    if (rem > 0 && rem < 8) across_tail(j, ob0, nob, t0 + full, rem); /* all 8 outputs at once */
}

/* the residual units' 7 taps get their own unrolled copy (1 and 2 taps ran slower unrolled) */
T2 void cd_conv_tile_avx2(const cd_conv_job *j, int ob, int nob, int64_t t0, int64_t nt) {
    switch (j->k) {
    case 7: tile256(j, ob, nob, t0, nt, 7); break;
    default: tile256(j, ob, nob, t0, nt, 0); break;
    }
}

T2 void cd_snake_row_avx2(float alpha, float inv, const float *x, float *y, int64_t L, int plant) {
    __m256 a = _mm256_set1_ps(alpha), iv = _mm256_set1_ps(inv);
    for (int64_t t = 0; t < L; t += 8) {
        __m256i m = mask8(L - t);
        _mm256_maskstore_ps(y + t, m, snake256(_mm256_maskload_ps(x + t, m), a, iv, plant));
    }
}

/* ---- attention of one query and head (transformer.c), the portable loop's operations ----
 * scores across 8 keys at once (kT: keys transposed, [hd][ldk]; each lane the same sequential sum
 * over dims of separately rounded products), softmax as the portable loop (scalar expf), values
 * across dims (each dim the same sum over keys in order): values equal the portable ones */
T2 void cd_attend_row_avx2(const float *q, const float *kT, int64_t ldk, const float *v, int64_t ldv, int64_t first,
                           int64_t last, int hd, float scale, float *sc, float *out, int64_t ldo, int plant) {
    int64_t n = last - first + 1;
    int dend = hd - (plant == CD_PLANT_TAP); /* planted: the scores' last dim dropped */
    for (int64_t p0 = 0; p0 < n; p0 += 8) {
        __m256i m = mask8(n - p0);
        __m256 a = _mm256_setzero_ps();
        const float *kp = kT + first + p0;
        for (int d = 0; d < dend; d++)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(q[d]), _mm256_maskload_ps(kp + (int64_t)d * ldk, m)));
        _mm256_maskstore_ps(sc + p0, m, _mm256_mul_ps(a, _mm256_set1_ps(scale)));
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t p = 0; p < n; p++)
        if (sc[p] > mx) mx = sc[p];
    for (int64_t p = 0; p < n; p++) sum += (sc[p] = expf(sc[p] - mx));
    int d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) { /* 4 vectors of dims in registers across the keys */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t p = 0; p < n; p++) {
            const float *vp = v + (first + p) * ldv + d0;
            __m256 w = _mm256_set1_ps(sc[p] / sum);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(w, _mm256_loadu_ps(vp)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(w, _mm256_loadu_ps(vp + 8)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(w, _mm256_loadu_ps(vp + 16)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(w, _mm256_loadu_ps(vp + 24)));
        }
        float l[32];
        _mm256_storeu_ps(l, a0), _mm256_storeu_ps(l + 8, a1);
        _mm256_storeu_ps(l + 16, a2), _mm256_storeu_ps(l + 24, a3);
        for (int d = 0; d < 32; d++) out[(int64_t)(d0 + d) * ldo] = l[d];
    }
    for (; d0 < hd; d0++) { /* the rest one dim at a time */
        float acc = 0.0f;
        for (int64_t p = 0; p < n; p++) acc += sc[p] / sum * v[(first + p) * ldv + d0];
        out[(int64_t)d0 * ldo] = acc;
    }
}

#else /* not x86-64: cd_isa_best never picks these */
void cd_attend_row_avx2(const float *q, const float *kT, int64_t ldk, const float *v, int64_t ldv, int64_t first,
                        int64_t last, int hd, float scale, float *sc, float *out, int64_t ldo, int plant) {
    (void)q, (void)kT, (void)ldk, (void)v, (void)ldv, (void)first, (void)last, (void)hd, (void)scale, (void)sc;
    (void)out, (void)ldo, (void)plant;
}
void cd_conv_tile_avx2(const cd_conv_job *j, int ob, int nob, int64_t t0, int64_t nt) {
    (void)j, (void)ob, (void)nob, (void)t0, (void)nt;
}
void cd_conv_tile_avx512(const cd_conv_job *j, int ob, int64_t t0, int64_t nt) { (void)j, (void)ob, (void)t0, (void)nt; }
void cd_snake_row_avx2(float alpha, float inv, const float *x, float *y, int64_t L, int plant) {
    (void)alpha, (void)inv, (void)x, (void)y, (void)L, (void)plant;
}
void cd_snake_row_avx512(float alpha, float inv, const float *x, float *y, int64_t L, int plant) {
    (void)alpha, (void)inv, (void)x, (void)y, (void)L, (void)plant;
}
#endif
