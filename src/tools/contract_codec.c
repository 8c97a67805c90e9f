/* contract_codec.c - `drama contract` entries for the codec's own kernels (src/codec/ops.c,
 * transformer.c, through codec/internal.h): causal, strided, grouped and transposed convs (plus
 * the history carried between chunks), Snake, the ConvNeXt layer norm, the transformer's RMS
 * norm, RoPE, windowed attention (and its KV window), SwiGLU gate, ConvNeXt GELU, output tanh and the VQ search.
 * Float64 references, tolerances from each op's operation sequence (docs/contract.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "codec/kernels.h"
#include "tools/contract_internal.h"

#define U CT_U32
#define TINY 0x1p-140

enum { K_CONV, K_STRIDED, K_GROUPED, K_TRANSPOSED, K_SNAKE, K_LN, K_RMS, K_ROPE, K_ROPE_F32,
       K_ATTEND, K_SWIGLU, K_TANH, K_VQ, K_GELU, K_FUSED, K_COUNT };
/* variant = kernel | instruction set << 8 (CD_ISA_*: the SIMD entries of the conv and Snake kernels) */
#define KV(k) ((k)->variant & 0xff)
#define KISA(k) ((k)->variant >> 8 & 0xf)
/* variant bit 12: the AVX2 GEMM blocking forced small (contraction blocks of 3 input channels, 3
 * weight blocks per task), so every shape runs several blocks with partial sums carried */
#define KGEMM(k) ((k)->variant >> 12 & 1)
static const char *const k_names[K_COUNT] = {
    "codec.conv1d", "codec.conv_strided", "codec.conv_grouped", "codec.conv_transposed", "codec.snake",
    "codec.layernorm", "codec.rms_norm", "codec.rope", "codec.rope_f32", "codec.attend", "codec.swiglu",
    "codec.tanh", "codec.vq_nearest", "codec.gelu", "codec.conv_fused"};
static const char *const k_precision[K_COUNT] = {
    "fp32 sum of cin*K products in order, then + bias; tol = (cin*K+2)u(|b| + sum|w x|); chunked run == whole",
    "as conv1d on inputs t*s - (span - s) + k*d; tol = (cin*K+2)u(|b| + sum|w x|); chunked run == whole",
    "as conv1d over the group's cin/groups inputs; tol = (cin_g*K+2)u(|b| + sum|w x|); chunked run == whole",
    "per output phase a stride-1 conv of cin*ceil(K/s) terms; tol = (cin*R+2)u(|b| + sum|w x|); chunks == whole",
    "x + inv*sin(alpha x)^2, inv = fp32 1/(alpha+1e-9); tol = 2(u|y| + |T|(rel_inv+6u) + 2u|inv sin cos p|)",
    "fp32 mean and variance over channels in order; tol = 2x the first-order bound (mean, variance, rsqrt, affine)",
    "fp32 sum of squares over D channels; tol = 2|y|(dV/2V + 4u), dV = (D+2)u ms + u(ms+eps)",
    "fp32 angle pos*base^(-2i/hd), cos/sin rounded to bf16; tol from the angle bound (bf16: determined or 1 step)",
    "as codec.rope with fp32 cos/sin; tol = 2(|a|dc + |b|ds + 2u(|a c| + |b s|) + u|y|)",
    "fp32 scores, max-subtracted expf, fp32 sums; tol = 2x first-order bound; KV window carried: chunks == whole",
    "g = a / (1 + expf(-a)) * u in fp32; tol = 10u|y| + 2^-120|u| (expf overflow for a < -88.7 gives 0)",
    "libm tanhf (<= 2 ulp); tol = 4u|y| + 2^-140",
    "argmin of |e^|^2 - 2 e^.c^ + |c^|^2 within the fp32 bound E = (2 dim + 16)u(sum of magnitudes); ties: lowest",
    "0.5 x (1 + erff(x fp32(1/sqrt2))) in fp32, erff <= 1 ulp; tol = 2(|x|/2 (u|1+e| + 2u|e| + 2u|t| E'(t)) + u|y|)",
    "r + snake(conv1d): tol = 2(|1 + inv a sin(2 a v)| tol_conv + tol_snake(v) + u|y|); chunked run == whole"};

enum { CC_NONE = 0, CC_TAPS_REV, CC_DIL, CC_FP16, CC_NO_HIST, CC_PHASE, CC_SNAKE_ALPHA, CC_SNAKE_NO_EPS, CC_NO_EPS,
       CC_WIDE, CC_TIES_HIGH, CC_GELU_TANH, CC_ROPE_BASE, CC_SWAP, CC_HALF, CC_SIMD_TAP, CC_SIMD_PARITY, CC_SIMD_KC };

enum { X_RANDOM, X_RANGE, X_TINY, X_NONFINITE, X_DISCR, X_KINDS };
static const char *const x_kind[X_KINDS] = {"random", "dynamic-range", "tiny", "nan-inf", "fp16-discriminating"};

static void fill(uint64_t *s, int kind, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = ct_rand_normal(s);
        if (kind == X_RANGE) v *= ldexp(1.0, (int)(ct_rand_u64(s) % 41) - 20);
        if (kind == X_TINY) v *= 1e-4;
        if (kind == X_DISCR) v = 0.5 + 0.5 * ct_rand_uniform(s);
        x[i] = (float)v;
    }
}

static float *fvec(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }
static double *dvec(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }

/* ---- convolutions ---- */

typedef struct conv_geo {
    int cin, cout, k, dil, stride, groups, transposed;
    int64_t L;
} conv_geo;

static int64_t conv_out_len(const conv_geo *g) { return g->transposed ? g->L * g->stride : g->L / g->stride; }

/* Float64 reference of a run from zero history (CODEC.md 3.2-3.3 read directly, not through the
 * packed layout), its tolerance, and the fp16-accumulated variant (alt). */
static void conv_ref(const conv_geo *g, const float *w, const float *b, const float *x, double *ref, double *tol,
                     float *alt) {
    int cin_g = g->cin / g->groups, cout_g = g->cout / g->groups, s = g->stride, K = g->k;
    int span = (K - 1) * g->dil + 1, hist = span - s > 0 ? span - s : 0, R = (K + s - 1) / s;
    int64_t L = g->L, Lo = conv_out_len(g);
    for (int o = 0; o < g->cout; o++)
        for (int64_t j = 0; j < Lo; j++) {
            double acc = 0, m = 0;
            float h = 0;
            int nterms = g->transposed ? g->cin * R : cin_g * K;
            for (int i = 0; i < (g->transposed ? g->cin : cin_g); i++)
                for (int k = 0; k < (g->transposed ? R : K); k++) {
                    double wv, xv;
                    if (g->transposed) { /* y[o][t s + tap] += x[i][t] W[i][o][tap] */
                        int64_t t = j / s - (R - 1) + k;
                        int tap = (int)(j % s) + (R - 1 - k) * s;
                        if (t < 0 || tap >= K) continue;
                        wv = w[((int64_t)i * g->cout + o) * K + tap], xv = x[(int64_t)i * L + t];
                    } else { /* causal: left zero padding of span - s */
                        int64_t pos = j * s + (int64_t)k * g->dil - hist;
                        wv = w[((int64_t)o * cin_g + i) * K + k];
                        xv = pos >= 0 ? x[(int64_t)(o / cout_g * cin_g + i) * L + pos] : 0.0;
                    }
                    acc += wv * xv;
                    m += fabs(wv * xv);
                    h = ct_h(h + (float)wv * (float)xv);
                }
            ref[o * Lo + j] = acc + b[o];
            tol[o * Lo + j] = (nterms + 2) * U * (fabs(b[o]) + m) + TINY;
            alt[o * Lo + j] = ct_h(h + b[o]);
        }
}

/* The library conv (with a planted defect when control != 0) over x in chunks of chunk[i]
 * input steps (times the stride; NULL: one call), from zero history; y [cout][Lo]. */
static void conv_lib(const conv_geo *g, int control, int isa, int gemm, const cd_snake *sn, const float *resid,
                     const float *w, float *b, const float *x, const int *chunk, int n_chunk, float *y, dr_pool *pool) {
    int K = g->k, s = g->stride;
    int64_t wn = (int64_t)g->cout * (g->cin / g->groups) * K, Lo = conv_out_len(g);
    float *wp = fvec(wn);
    memcpy(wp, w, (size_t)wn * sizeof *wp);
    if (control == CC_TAPS_REV) /* planted: kernel taps in reverse order */
        for (int64_t r = 0; r < wn / K; r++)
            for (int k = 0; k < K; k++) wp[r * K + k] = w[r * K + K - 1 - k];
    if (control == CC_PHASE) /* planted: output phase q computed with the taps of phase q+1 */
        for (int64_t r = 0; r < wn / K; r++)
            for (int k = 0; k < K; k++) {
                int src = (k % s + 1) % s + k / s * s;
                wp[r * K + k] = src < K ? w[r * K + src] : 0.0f;
            }
    cd_conv cv;
    cd_conv_init(&cv, g->cin, g->cout, K, g->dil + (control == CC_DIL), s, g->groups, g->transposed);
    cv.isa = isa;
    cv.plant = control == CC_SIMD_TAP ? CD_PLANT_TAP : 0; /* planted inside the SIMD loop */
    if (control == CC_SIMD_KC) cv.plant = CD_PLANT_KC;     /* planted inside the blocked SIMD loop */
    if (gemm == 1) cv.gemm = 1, cv.kcb = 3, cv.nob = 3; /* forced small blocks */
    if (gemm == 2) cv.gemm = 0;                          /* the unblocked kernel order */
    float *packed = dr_alloc((size_t)cd_conv_weight_len(&cv) * sizeof(float));
    float *hist = calloc((size_t)g->cin * (size_t)cv.hist + 1, sizeof(float));
    float *xc = fvec((int64_t)g->cin * g->L), *yc = fvec((int64_t)g->cout * Lo);
    cd_conv_pack(&cv, wp, packed);
    cv.w = packed, cv.b = b;
    if (control == CC_FP16) { /* planted: fp16 accumulation (the sum rounded to fp16 after every add) */
        double *r = dvec((int64_t)g->cout * Lo), *t = dvec((int64_t)g->cout * Lo);
        conv_ref(g, w, b, x, r, t, y);
        free(r), free(t);
    } else {
        int64_t t0 = 0, yo = 0;
        for (int ci = 0; t0 < g->L; ci++) {
            int64_t n = chunk ? (int64_t)chunk[ci % n_chunk] * s : g->L;
            if (n > g->L - t0) n = g->L - t0;
            int64_t no = g->transposed ? n * s : n / s;
            for (int i = 0; i < g->cin; i++) memcpy(xc + i * n, x + i * g->L + t0, (size_t)n * sizeof *xc);
            if (control == CC_NO_HIST) memset(hist, 0, (size_t)g->cin * (size_t)cv.hist * sizeof *hist); /* planted */
            ct_poison(yc, (int64_t)g->cout * no);
            if (resid) /* fused: residual in place (y starts as resid), Snake on the conv output */
                for (int o = 0; o < g->cout; o++) memcpy(yc + o * no, resid + o * Lo + yo, (size_t)no * sizeof *yc);
            cd_conv_run_ex(&cv, hist, xc, n, yc, sn, resid ? yc : NULL, pool, NULL);
            for (int o = 0; o < g->cout; o++) memcpy(y + o * Lo + yo, yc + o * no, (size_t)no * sizeof *y);
            t0 += n, yo += no;
        }
    }
    free(wp), dr_free(packed), free(hist), free(xc), free(yc);
}

static void conv_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, const conv_geo *g, dr_pool *pool) {
    static const int chunks[] = {1, 3, 8, 2, 13};
    int64_t wn = (int64_t)g->cout * (g->cin / g->groups) * g->k, xn = (int64_t)g->cin * g->L;
    int64_t no = (int64_t)g->cout * conv_out_len(g);
    float *w = fvec(wn), *b = fvec(g->cout), *x = fvec(xn), *y = fvec(no), *yc = fvec(no), *alt = fvec(no);
    double *ref = dvec(no), *tol = dvec(no), *whole = dvec(no), *zero = dvec(no);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, w, wn);
    fill(s, kind == X_DISCR ? X_DISCR : X_RANDOM, b, g->cout);
    fill(s, kind, x, xn);
    if (kind == X_NONFINITE) x[(int64_t)(g->cin / 2) * g->L + g->L / 2] = NAN, x[g->L - 1] = INFINITY;
    conv_ref(g, w, b, x, ref, tol, alt);
    ct_poison(y, no);
    conv_lib(g, k->control, KISA(k), KGEMM(k), NULL, NULL, w, b, x, NULL, 0, y, pool);
    char name[128];
    snprintf(name, sizeof name, "%s cin=%d cout=%d k=%d dil=%d s=%d g=%d L=%lld", x_kind[kind], g->cin, g->cout, g->k,
             g->dil, g->stride, g->groups, (long long)g->L);
    ct_compare(res, name, y, ref, tol, no);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    /* the history carry: chunks of 1, 3, 8, 2, 13 (x stride) steps give the whole run exactly */
    for (int64_t i = 0; i < no; i++) whole[i] = y[i], zero[i] = 0;
    ct_poison(yc, no);
    conv_lib(g, k->control, KISA(k), KGEMM(k), NULL, NULL, w, b, x, chunks, 5, yc, pool);
    size_t nl = strlen(name);
    snprintf(name + nl, sizeof name - nl, " chunked");
    ct_compare(res, name, yc, whole, zero, no);
    if (KGEMM(k)) { /* blocked == unblocked, bit for bit: the same FMA chains */
        ct_poison(yc, no);
        conv_lib(g, 0, KISA(k), 2, NULL, NULL, w, b, x, NULL, 0, yc, pool);
        snprintf(name + nl, sizeof name - nl, " == unblocked");
        ct_compare(res, name, yc, whole, zero, no);
    }
    free(w), free(b), free(x), free(y), free(yc), free(alt), free(ref), free(tol), free(whole), free(zero);
}

static void check_conv(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x43434f4eull ^ (uint64_t)KV(k);
    /* cin, cout, k, dil, stride, groups, transposed, L; the last row is the fp16-discriminating one
     * (cin/groups * taps >= 4096 positive terms). L = 269: full 8-step blocks, a remainder and two tiles. */
    static const conv_geo geo[4][6] = {
        {{13, 11, 7, 1, 1, 1, 0, 269}, {5, 19, 7, 3, 1, 1, 0, 37}, {9, 4, 7, 9, 1, 1, 0, 100},
         {16, 8, 1, 1, 1, 1, 0, 23}, {1, 13, 3, 1, 1, 1, 0, 7}, {586, 9, 7, 1, 1, 1, 0, 11}},
        {{7, 14, 4, 1, 2, 1, 0, 38}, {5, 10, 16, 1, 8, 1, 0, 72}, {6, 6, 2, 1, 2, 1, 0, 30},
         {4, 5, 6, 1, 3, 1, 0, 27}, {3, 2, 4, 1, 2, 1, 0, 2}, {1025, 5, 4, 1, 2, 1, 0, 14}},
        {{19, 19, 7, 1, 1, 19, 0, 45}, {9, 6, 3, 2, 1, 3, 0, 31}, {8, 8, 7, 1, 1, 8, 0, 300},
         {4, 4, 1, 1, 1, 4, 0, 9}, {6, 6, 7, 1, 1, 6, 0, 3}, {1758, 6, 7, 1, 1, 3, 0, 5}},
        {{11, 5, 4, 1, 2, 1, 1, 37}, {6, 3, 16, 1, 8, 1, 1, 9}, {7, 7, 2, 1, 2, 1, 1, 13},
         {5, 4, 6, 1, 3, 1, 1, 10}, {3, 9, 4, 1, 2, 1, 1, 1}, {2050, 5, 4, 1, 2, 1, 1, 5}},
    };
    const conv_geo *gs = geo[KV(k) - K_CONV];
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            conv_case(k, res, &s, kind, &gs[5], ctx->pool);
            continue;
        }
        for (int i = 0; i < 5; i++) conv_case(k, res, &s, kind, &gs[i], ctx->pool);
    }
}

/* ---- conv with the fused epilogue (residual unit: Snake on the conv output, residual add) ---- */

static void fused_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, const conv_geo *g, dr_pool *pool) {
    static const int chunks[] = {1, 3, 8, 2, 13};
    const double eps = 1e-9;
    int64_t wn = (int64_t)g->cout * g->cin * g->k, xn = (int64_t)g->cin * g->L, no = (int64_t)g->cout * g->L;
    float *w = fvec(wn), *b = fvec(g->cout), *x = fvec(xn), *r = fvec(no), *y = fvec(no), *yc = fvec(no);
    float *alt = fvec(no), *alpha = fvec(g->cout), *inv = fvec(g->cout);
    double *ref = dvec(no), *tol = dvec(no), *whole = dvec(no), *zero = dvec(no);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, w, wn);
    fill(s, kind == X_DISCR ? X_DISCR : X_RANDOM, b, g->cout);
    fill(s, kind, x, xn);
    fill(s, X_RANDOM, r, no);
    if (kind == X_NONFINITE) x[(int64_t)(g->cin / 2) * g->L + g->L / 2] = NAN, x[g->L - 1] = INFINITY;
    for (int c = 0; c < g->cout; c++) alpha[c] = (float)((0.05 + 1.95 * ct_rand_uniform(s)) * (c % 4 == 3 ? -1 : 1));
    conv_ref(g, w, b, x, ref, tol, alt);
    for (int o = 0; o < g->cout; o++) {
        double a = alpha[o], iv = 1.0 / (a + eps), rel_inv = 3 * U + U * eps / fabs(a + eps);
        float inv32 = 1.0f / (alpha[o] + (float)eps);
        for (int64_t t = 0; t < g->L; t++) {
            int64_t i = o * g->L + t;
            double v = ref[i], p = a * v, sv = sin(p), T = iv * sv * sv, sn = v + T, yv = r[i] + sn;
            double ts = 2 * (U * fabs(sn) + fabs(T) * (rel_inv + 6 * U) + 2 * U * fabs(iv * sv * cos(p) * p));
            /* a conv error dv moves inv sin^2 by at most |inv| min(1, |d sin 2p| + d^2), d = |a| dv */
            double dl = fabs(a) * tol[i], dT = fabs(iv) * fmin(1.0, dl * fabs(sin(2 * p)) + dl * dl);
            tol[i] = 2 * (tol[i] + dT + ts + U * fabs(yv)) + TINY;
            ref[i] = yv;
            float h = alt[i], sh = sinf(alpha[o] * h); /* fp16-accumulated conv, then the fp32 epilogue */
            alt[i] = r[i] + (h + inv32 * (sh * sh));
        }
    }
    cd_snake sn = {.c = g->cout, .inv = inv, .alpha = alpha};
    cd_snake_prepare(&sn, eps);
    sn.isa = KISA(k);
    sn.plant = k->control == CC_SIMD_PARITY ? CD_PLANT_PARITY : 0; /* planted inside the conv's SIMD epilogue */
    ct_poison(y, no);
    conv_lib(g, k->control, KISA(k), KGEMM(k), &sn, r, w, b, x, NULL, 0, y, pool);
    char name[128];
    snprintf(name, sizeof name, "%s cin=%d cout=%d k=%d dil=%d L=%lld", x_kind[kind], g->cin, g->cout, g->k, g->dil,
             (long long)g->L);
    ct_compare(res, name, y, ref, tol, no);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    for (int64_t i = 0; i < no; i++) whole[i] = y[i], zero[i] = 0;
    ct_poison(yc, no);
    conv_lib(g, k->control, KISA(k), KGEMM(k), &sn, r, w, b, x, chunks, 5, yc, pool);
    size_t nl = strlen(name);
    snprintf(name + nl, sizeof name - nl, " chunked");
    ct_compare(res, name, yc, whole, zero, no);
    if (KGEMM(k)) { /* blocked == unblocked, bit for bit: the same FMA chains */
        ct_poison(yc, no);
        conv_lib(g, 0, KISA(k), 2, &sn, r, w, b, x, NULL, 0, yc, pool);
        snprintf(name + nl, sizeof name - nl, " == unblocked");
        ct_compare(res, name, yc, whole, zero, no);
    }
    free(w), free(b), free(x), free(r), free(y), free(yc), free(alt), free(alpha), free(inv);
    free(ref), free(tol), free(whole), free(zero);
}

static void check_fused(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x46555345ull;
    /* stride-1 shapes of the residual units: 8-output blocks with remainders, tails of every vector width */
    static const conv_geo geo[6] = {{13, 11, 7, 1, 1, 1, 0, 269}, {5, 19, 7, 3, 1, 1, 0, 37}, {9, 4, 7, 9, 1, 1, 0, 100},
                                    {16, 8, 1, 1, 1, 1, 0, 23},   {24, 16, 7, 1, 1, 1, 0, 50}, {586, 9, 7, 1, 1, 1, 0, 11}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            fused_case(k, res, &s, kind, &geo[5], ctx->pool);
            continue;
        }
        for (int i = 0; i < 5; i++) fused_case(k, res, &s, kind, &geo[i], ctx->pool);
    }
}

/* ---- snake ---- */

static void snake_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int C, int64_t L, dr_pool *pool) {
    const double eps = 1e-9;
    int64_t n = (int64_t)C * L;
    float *alpha = fvec(C), *inv = fvec(C), *x = fvec(n), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    for (int c = 0; c < C; c++) alpha[c] = (float)((0.05 + 1.95 * ct_rand_uniform(s)) * (c % 4 == 3 ? -1 : 1));
    alpha[0] = 0.0f;                  /* 1/(0 + eps): finite only with the epsilon */
    if (C > 1) alpha[1] = 1e-9f;      /* the epsilon is half the denominator */
    fill(s, kind, x, n);
    if (C > 1)
        for (int64_t t = 0; t < L; t++) x[L + t] *= 1e9f; /* alpha x of order 1 in that channel */
    if (kind == X_NONFINITE && C > 4) x[3 * L + L / 2] = NAN, x[4 * L + L - 1] = INFINITY;
    cd_snake sn = {.c = C, .inv = inv, .alpha = alpha};
    cd_snake_prepare(&sn, eps);
    sn.isa = KISA(k);
    sn.plant = k->control == CC_SIMD_PARITY ? CD_PLANT_PARITY : 0; /* planted inside the SIMD loop */
    for (int c = 0; c < C; c++) {
        if (k->control == CC_SNAKE_ALPHA) inv[c] = alpha[c];           /* planted: alpha, not 1/(alpha+eps) */
        if (k->control == CC_SNAKE_NO_EPS) inv[c] = 1.0f / alpha[c];   /* planted: epsilon left out */
    }
    for (int c = 0; c < C; c++) {
        double a = alpha[c], iv = 1.0 / (a + eps), rel_inv = 3 * U + U * eps / fabs(a + eps);
        float inv32 = 1.0f / (alpha[c] + (float)eps);
        for (int64_t t = 0; t < L; t++) {
            int64_t i = c * L + t;
            double xv = x[i], p = a * xv, sv = sin(p), T = iv * sv * sv;
            ref[i] = xv + T;
            tol[i] = 2 * (U * fabs(ref[i]) + fabs(T) * (rel_inv + 6 * U) + 2 * U * fabs(iv * sv * cos(p) * p)) + TINY;
            float v = ct_h(sinf(alpha[c] * x[i])); /* fp16 sin */
            alt[i] = x[i] + inv32 * (v * v);
        }
    }
    memcpy(y, x, (size_t)n * sizeof *y); /* in place */
    cd_snake_run(&sn, y, L, pool);
    char name[96];
    snprintf(name, sizeof name, "%s C=%d L=%lld", x_kind[kind], C, (long long)L);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(alpha), free(inv), free(x), free(y), free(alt), free(ref), free(tol);
}

static void check_snake(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x534e414bull;
    for (int kind = 0; kind < X_KINDS; kind++) {
        snake_case(k, res, &s, kind, 13, 37, ctx->pool);
        snake_case(k, res, &s, kind, 1, 5, ctx->pool);
        if (kind != X_DISCR) snake_case(k, res, &s, kind, 6, 300, ctx->pool);
    }
}

/* ---- layer norm (ConvNeXt) and RMS norm (transformer): over channels, per time step ---- */

static void norm_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int C, int64_t L, dr_pool *pool) {
    int ln = KV(k) == K_LN;
    double eps = ln ? 1e-6 : 1e-5;
    int64_t n = (int64_t)C * L;
    float *x = fvec(n), *w = fvec(C), *b = fvec(C), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    fill(s, kind, x, n);
    for (int c = 0; c < C; c++) w[c] = (float)(1 + 0.1 * ct_rand_normal(s)), b[c] = (float)(0.1 * ct_rand_normal(s));
    if (kind == X_NONFINITE && L > 1) x[(int64_t)(C / 2) * L] = NAN, x[L - 1] = INFINITY;
    for (int64_t t = 0; t < L; t++) {
        double mu = 0, sa = 0, sd = 0, sq = 0;
        float hm = 0, hv = 0;
        for (int c = 0; c < C; c++) mu += x[c * L + t], sa += fabs(x[c * L + t]), hm = ct_h(hm + x[c * L + t]);
        mu = ln ? mu / C : 0;
        float hmu = ln ? hm / (float)C : 0.0f;
        for (int c = 0; c < C; c++) {
            double d = x[c * L + t] - mu;
            sd += fabs(d), sq += d * d;
            float hd = x[c * L + t] - hmu;
            hv = ct_h(hv + hd * hd);
        }
        double ms = sq / C, V = ms + eps, r = 1 / sqrt(V);
        double emu = ln ? (C + 1) * U * sa / C : 0; /* fp32 mean: C adds and a division */
        double dV = (2 * emu * sd + (C + 4) * U * sq) / C + U * V, rel_r = dV / (2 * V) + 2 * U;
        float hr = 1.0f / sqrtf(hv / (float)C + (float)eps);
        for (int c = 0; c < C; c++) {
            int64_t i = c * L + t;
            double d = x[i] - mu, yv = d * r * w[c] + (ln ? b[c] : 0);
            ref[i] = yv;
            tol[i] = 2 * (fabs(w[c]) * r * (emu + U * fabs(d)) + fabs(w[c] * d) * r * (rel_r + 2 * U) + U * fabs(yv) +
                          (ln ? U * fabs(b[c]) : 0)) + TINY;
            if (isinf(V)) tol[i] = TINY; /* an infinite input makes r exactly 0: finite channels give exactly 0 */
            alt[i] = (x[i] - hmu) * hr * w[c] + (ln ? b[c] : 0.0f);
        }
    }
    float e = k->control == CC_NO_EPS ? 0.0f : (float)eps; /* planted: epsilon left out */
    if (ln) {
        memcpy(y, x, (size_t)n * sizeof *y); /* in place */
        cd_layernorm_ct(y, C, L, w, b, e, pool);
    } else {
        ct_poison(y, n);
        cd_rmsnorm_ct(x, y, C, L, w, e, pool);
    }
    char name[96];
    snprintf(name, sizeof name, "%s C=%d L=%lld", x_kind[kind], C, (long long)L);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(x), free(w), free(b), free(y), free(alt), free(ref), free(tol);
}

static void check_norm(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x4c4e4f52ull ^ (uint64_t)KV(k);
    static const int shapes[][2] = {{19, 269}, {1024, 3}, {7, 2}, {1, 4}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            norm_case(k, res, &s, kind, 4096, 3, ctx->pool);
            continue;
        }
        for (int i = 0; i < 4; i++) norm_case(k, res, &s, kind, shapes[i][0], shapes[i][1], ctx->pool);
    }
}

/* ---- RoPE ---- */

static double bf16_round64(double v) { /* round to 8 significant bits, ties to even */
    int e;
    if (v == 0 || !isfinite(v)) return v;
    frexp(v, &e);
    return ldexp(nearbyint(ldexp(v, 8 - e)), e - 8);
}

/* the table value the kernel may produce: its reference and its allowed error, given the
 * fp32 value's error bound dv around the exact v */
static void table_value(double v, double dv, int bf16, double *val, double *err) {
    if (!bf16) {
        *val = v, *err = dv;
        return;
    }
    double lo = bf16_round64(v - dv), hi = bf16_round64(v + dv);
    *val = bf16_round64(v);
    *err = hi - lo; /* 0 when the rounding is determined; else one bf16 step */
}

static void rope_case(const ct_kernel *k, ct_result *res, dr_pool *pool, uint64_t *s, int kind, int H, int hd, int64_t L,
                      int64_t pos0) {
    int bf16 = KV(k) == K_ROPE, Dq = H * hd;
    dr_codec_tf_config cf = {.n_head = H, .head_dim = hd, .rope_base = 10000, .rope_bf16 = bf16};
    int64_t n = 3 * (int64_t)Dq * L;
    float *x = fvec(n), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    fill(s, kind, x, n);
    if (kind == X_NONFINITE) x[(int64_t)(Dq + 1) * L] = NAN, x[L - 1] = INFINITY; /* rotated / untouched row */
    for (int64_t i = 0; i < n; i++) ref[i] = x[i], tol[i] = 0, alt[i] = x[i]; /* rows outside: unchanged */
    double lnb = log(cf.rope_base);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int64_t t = 0; t < L; t++) {
                double e = 2.0 * i / hd, ang = (double)(pos0 + t) * pow(cf.rope_base, -e);
                double da = fabs(ang) * (lnb * e + 4) * U; /* exponent, powf, reciprocal, product in fp32 */
                double c, dc, sn, ds, cv = cos(ang), sv = sin(ang);
                table_value(cv, fabs(sv) * da + da * da / 2 + 2 * U, bf16, &c, &dc);
                table_value(sv, fabs(cv) * da + da * da / 2 + 2 * U, bf16, &sn, &ds);
                int64_t i0 = (int64_t)(Dq + h * hd + 2 * i) * L + t, i1 = i0 + L;
                double a = x[i0], b = x[i1];
                ref[i0] = a * c - b * sn;
                ref[i1] = b * c + a * sn;
                double m0 = fabs(a * c) + fabs(b * sn), m1 = fabs(b * c) + fabs(a * sn);
                tol[i0] = 2 * (fabs(a) * dc + fabs(b) * ds + 2 * U * m0 + U * fabs(ref[i0])) + TINY;
                tol[i1] = 2 * (fabs(b) * dc + fabs(a) * ds + 2 * U * m1 + U * fabs(ref[i1])) + TINY;
                float hc = ct_h((float)cv), hs = ct_h((float)sv); /* fp16 tables */
                alt[i0] = x[i0] * hc - x[i1] * hs;
                alt[i1] = x[i1] * hc + x[i0] * hs;
            }
    memcpy(y, x, (size_t)n * sizeof *y); /* in place on the k rows of a qkv buffer */
    dr_codec_tf_config run_cf = cf;
    if (k->control == CC_ROPE_BASE) run_cf.rope_base = 500000; /* planted: another model's RoPE base */
    cd_rope_ct(y, Dq, &run_cf, L, pos0, pool);
    char name[96];
    snprintf(name, sizeof name, "%s heads=%d hd=%d L=%lld pos=%lld", x_kind[kind], H, hd, (long long)L,
             (long long)pos0);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(x), free(y), free(alt), free(ref), free(tol);
}

static void check_rope(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x524f5045ull ^ (uint64_t)KV(k);
    static const int shapes[][3] = {{2, 8, 5}, {1, 64, 3}, {3, 2, 37}};
    static const int64_t pos[] = {0, 1, 17, 5000, 100000};
    for (int i = 0; i < 3; i++)
        for (int p = 0; p < 5; p++) rope_case(k, res, ctx->pool, &s, X_RANDOM, shapes[i][0], shapes[i][1], shapes[i][2], pos[p]);
    for (int kind = X_RANGE; kind < X_DISCR; kind++) rope_case(k, res, ctx->pool, &s, kind, 2, 8, 5, 17);
    rope_case(k, res, ctx->pool, &s, X_DISCR, 2, 64, 3, 1);
}

/* ---- attention with a KV window ---- */

static void attend_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int H, int hd, int W, int64_t n_prev,
                        int64_t L, dr_pool *pool) {
    int Dq = H * hd;
    int64_t np = n_prev + L, no = (int64_t)Dq * L;
    float *q = fvec(L * Dq), *kk = fvec(np * Dq), *vv = fvec(np * Dq), *out = fvec(no), *alt = fvec(no);
    double *ref = dvec(no), *tol = dvec(no), *sc = dvec(np), *p = dvec(np), *ds = dvec(np);
    fill(s, kind == X_DISCR ? X_RANDOM : kind == X_RANGE ? X_RANDOM : kind, q, L * Dq);
    fill(s, kind == X_NONFINITE || kind == X_RANGE ? X_RANDOM : kind, kk, np * Dq);
    fill(s, kind == X_NONFINITE || kind == X_RANGE ? X_RANDOM : kind, vv, np * Dq);
    if (kind == X_RANGE) /* peaked: scores of a few tens, the softmax nearly one-hot */
        for (int64_t i = 0; i < L * Dq; i++) q[i] *= 6.0f;
    if (kind == X_DISCR) /* equal scores, positive values: a long sum of small equal terms */
        for (int64_t i = 0; i < np * Dq; i++) kk[i] = 0.0f;
    if (kind == X_NONFINITE) {
        if (H > 1) q[hd + 1] = NAN;                 /* head 1 of query 0 */
        vv[np / 2 * Dq] = NAN;                      /* seen only by queries whose window holds it */
    }
    double scale = 1 / sqrt((double)hd);
    for (int64_t t = 0; t < L; t++)
        for (int h = 0; h < H; h++) {
            int64_t last = n_prev + t, first = last - (W - 1) < 0 ? 0 : last - (W - 1), n = last - first + 1;
            double mx = -INFINITY, dmx = 0, sum = 0, rel_s = n * U;
            for (int64_t j = first; j <= last; j++) {
                double d = 0, m = 0;
                for (int e = 0; e < hd; e++) {
                    double pr = (double)q[t * Dq + h * hd + e] * kk[j * Dq + h * hd + e];
                    d += pr, m += fabs(pr);
                }
                sc[j] = d * scale;
                ds[j] = (hd + 1) * U * m * scale + 3 * U * fabs(sc[j]); /* dot, fp32 scale, product */
                if (sc[j] > mx) mx = sc[j];
                if (ds[j] > dmx) dmx = ds[j];
            }
            for (int64_t j = first; j <= last; j++) sum += exp(sc[j] - mx);
            for (int64_t j = first; j <= last; j++) {
                p[j] = exp(sc[j] - mx) / sum;
                ds[j] += dmx + U * fabs(sc[j] - mx) + 2 * U; /* now the relative error of exp(s - max) */
                rel_s += p[j] * ds[j];
            }
            for (int e = 0; e < hd; e++) {
                double o = 0, m = 0, mp = 0;
                float hsum = 0, hacc = 0;
                for (int64_t j = first; j <= last; j++) hsum = ct_h(hsum + expf((float)(sc[j] - mx)));
                for (int64_t j = first; j <= last; j++) {
                    double v = vv[j * Dq + h * hd + e];
                    o += p[j] * v;
                    m += p[j] * fabs(v) * (ds[j] + rel_s + U);
                    mp += p[j] * fabs(v);
                    hacc = ct_h(hacc + expf((float)(sc[j] - mx)) / hsum * (float)v);
                }
                int64_t i = (int64_t)(h * hd + e) * L + t;
                ref[i] = o;
                tol[i] = 2 * (m + (n + 1) * U * mp) + TINY;
                alt[i] = hacc;
            }
        }
    dr_codec_tf_config cf = {.n_head = H, .head_dim = hd, .window_size = W};
    if (k->control == CC_WIDE) cf.window_size = W + 1; /* planted: one key too many */
    ct_poison(out, no);
    cd_attend_ex(&cf, q, kk, vv, n_prev, L, out, pool, KISA(k), k->control == CC_SIMD_TAP ? CD_PLANT_TAP : 0);
    char name[96];
    snprintf(name, sizeof name, "%s heads=%d hd=%d W=%d cached=%lld L=%lld", x_kind[kind], H, hd, W,
             (long long)n_prev, (long long)L);
    ct_compare(res, name, out, ref, tol, no);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    free(q), free(kk), free(vv), free(out), free(alt), free(ref), free(tol), free(sc), free(p), free(ds);
}

/* The KV window carried by cd_tf_run: a small 2-layer transformer fed in chunks must give the
 * whole-sequence output exactly (CODEC.md 6). */
static void tf_window_case(ct_result *res, uint64_t *s, dr_pool *pool) {
    enum { D = 16, H = 2, HD = 8, F = 24, W = 5, NL = 2, L = 23 };
    dr_codec_tf_config cf = {.n_layer = NL, .dim = D, .intermediate_size = F, .n_head = H, .n_local_heads = H,
                             .head_dim = HD, .window_size = W, .rope_base = 10000, .norm_eps = 1e-5,
                             .layer_scale = 1, .rope_bf16 = 1};
    cd_tlayer layers[NL];
    float *bufs[NL * 9 + 1]; /* every weight of the little transformer (dr_alloc) */
    int nb = 0;
    for (int l = 0; l < NL; l++) {
        cd_conv *lin[5] = {&layers[l].wqkv, &layers[l].wo, &layers[l].w1, &layers[l].w3, &layers[l].w2};
        const int dims[5][2] = {{3 * H * HD, D}, {D, H * HD}, {F, D}, {F, D}, {D, F}};
        for (int m = 0; m < 5; m++) {
            float *w = fvec(dims[m][0] * dims[m][1]);
            fill(s, X_RANDOM, w, dims[m][0] * dims[m][1]);
            for (int i = 0; i < dims[m][0] * dims[m][1]; i++) w[i] *= 0.3f;
            cd_conv_init(lin[m], dims[m][1], dims[m][0], 1, 1, 1, 1, 0);
            lin[m]->w = bufs[nb++] = dr_alloc((size_t)cd_conv_weight_len(lin[m]) * sizeof(float));
            cd_conv_pack(lin[m], w, lin[m]->w);
            free(w);
        }
        float **vecs[4] = {&layers[l].attn_norm, &layers[l].ffn_norm, &layers[l].g_attn, &layers[l].g_ffn};
        for (int m = 0; m < 4; m++) {
            *vecs[m] = bufs[nb++] = dr_alloc(D * sizeof(float));
            for (int i = 0; i < D; i++) (*vecs[m])[i] = (float)(1 + 0.2 * ct_rand_normal(s));
        }
    }
    float *norm = bufs[nb++] = dr_alloc(D * sizeof(float));
    for (int i = 0; i < D; i++) norm[i] = (float)(1 + 0.2 * ct_rand_normal(s));
    cd_tf tf = {.cfg = cf, .layers = layers, .norm = norm, .state = 0};
    int64_t kvn = (int64_t)NL * (W - 1) * H * HD;
    float *x = fvec(D * L), *y = fvec(D * L), *yc = fvec(D * L), *xc = fvec(D * L), *oc = fvec(D * L);
    double *whole = dvec(D * L), *zero = dvec(D * L);
    fill(s, X_RANDOM, x, D * L);
    cd_kv kv = {calloc((size_t)kvn, sizeof(float)), calloc((size_t)kvn, sizeof(float)), 0, 0};
    ct_poison(y, D * L);
    cd_tf_run(&tf, &kv, x, L, y, pool, NULL);
    kv.n = kv.pos = 0;
    static const int chunk[] = {1, 4, 2, 7, 9};
    for (int64_t t0 = 0, ci = 0, n = 0; t0 < L; t0 += n, ci++) {
        n = chunk[ci % 5] < L - t0 ? chunk[ci % 5] : L - t0;
        for (int c = 0; c < D; c++) memcpy(xc + c * n, x + c * L + t0, (size_t)n * sizeof *xc);
        ct_poison(oc, D * n);
        cd_tf_run(&tf, &kv, xc, n, oc, pool, NULL);
        for (int c = 0; c < D; c++) memcpy(yc + c * L + t0, oc + c * n, (size_t)n * sizeof *yc);
    }
    for (int i = 0; i < D * L; i++) whole[i] = y[i], zero[i] = 0;
    ct_compare(res, "transformer W=5 in chunks 1,4,2,7,9 == whole", yc, whole, zero, D * L);
    for (int i = 0; i < nb; i++) dr_free(bufs[i]);
    free(kv.k), free(kv.v), free(x), free(y), free(yc), free(xc), free(oc), free(whole), free(zero);
}

static void check_attend(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x41545457ull;
    static const int shapes[][5] = {{2, 8, 5, 0, 9}, {1, 64, 128, 127, 3}, {3, 33, 16, 4, 40}, {2, 32, 8, 7, 1}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            attend_case(k, res, &s, kind, 1, 16, 4096, 4095, 1, ctx->pool);
            continue;
        }
        for (int i = 0; i < 4; i++)
            attend_case(k, res, &s, kind, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4],
                        ctx->pool);
    }
    tf_window_case(res, &s, ctx->pool);
}

/* ---- element-wise: SwiGLU gate, tanh, GELU ---- */

/* The tanh approximation of GELU: a plausible wrong kernel (codec.json requires "erf"). */
static void gelu_tanh_approx(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

static void elementwise_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int64_t n, dr_pool *pool) {
    int glu = KV(k) == K_SWIGLU, gelu = KV(k) == K_GELU;
    float *a = fvec(n), *u = fvec(n), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    fill(s, kind, a, n);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, u, n);
    if (kind == X_RANGE && n > 4) a[0] = -100.0f, a[1] = -88.8f, a[2] = 89.0f, a[3] = -87.0f; /* expf overflow edges */
    if (kind == X_NONFINITE && n > 3) a[0] = NAN, a[1] = INFINITY, a[2] = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double av = a[i];
        if (gelu) { /* t = x fp32(1/sqrt2) carries 2u; erf' = 2/sqrt(pi) exp(-t^2) */
            double t = av * M_SQRT1_2, e = erf(t);
            ref[i] = 0.5 * av * (1 + e);
            double de = 2 * U * fabs(t) * 1.1283791670955126 * exp(-t * t);
            tol[i] = 2 * (0.5 * fabs(av) * (U * fabs(1 + e) + 2 * U * fabs(e) + de) + U * fabs(ref[i])) + TINY;
            alt[i] = ct_h(0.5f * a[i] * ct_h(1.0f + erff(a[i] * (float)M_SQRT1_2)));
        } else if (glu) {
            ref[i] = av / (1 + exp(-av)) * u[i];
            tol[i] = 10 * U * fabs(ref[i]) + 0x1p-120 * fabs(u[i]) + TINY;
            alt[i] = ct_h(a[i] / (1.0f + expf(-a[i]))) * u[i];
        } else {
            ref[i] = tanh(av);
            tol[i] = 4 * U * fabs(ref[i]) + TINY;
            alt[i] = ct_h(tanhf(a[i]));
        }
    }
    if (gelu) {
        memcpy(y, a, (size_t)n * sizeof *y); /* in place */
        if (k->control == CC_GELU_TANH) gelu_tanh_approx(y, n);
        else cd_gelu_erf(y, n, pool);
    } else if (glu && k->control == CC_SWAP) { /* planted: gate and up swapped */
        memcpy(y, u, (size_t)n * sizeof *y);
        cd_swiglu(y, a, n, pool);
    } else if (glu) {
        memcpy(y, a, (size_t)n * sizeof *y); /* in place */
        cd_swiglu(y, u, n, pool);
    } else {
        ct_poison(y, n);
        cd_tanh(a, y, n, pool);
        if (k->control == CC_HALF) /* planted: an fp16 tanh */
            for (int64_t i = 0; i < n; i++) y[i] = ct_h(y[i]);
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld", x_kind[kind], (long long)n);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(a), free(u), free(y), free(alt), free(ref), free(tol);
}

static void check_elementwise(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x454c454dull ^ (uint64_t)KV(k);
    static const int64_t ns[] = {1, 7, 1000, 4097};
    for (int kind = 0; kind < X_KINDS; kind++)
        for (int i = 0; i < 4; i++) elementwise_case(k, res, &s, kind, ns[i], ctx->pool);
}

/* ---- VQ nearest code (encoder) ---- */

/* a reduced-precision or planted search on the library's normalised codebook */
static int vq_search(const cd_vq *q, const float *e, int64_t stride, int fp16, int ties_high) {
    float eh[CD_VQ_MAX_DIM];
    float ee = cd_unit_vector(e, stride, q->dim, eh), best_d = INFINITY;
    int best = 0;
    for (int j = 0; j < q->n; j++) {
        float dot = 0.0f;
        for (int d = 0; d < q->dim; d++) {
            dot = dot + eh[d] * q->cb_hat[(int64_t)j * q->dim + d];
            if (fp16) dot = ct_h(dot);
        }
        float dist = ee - 2.0f * dot + q->cb_hat_sq[j];
        if (dist < best_d || (ties_high && dist == best_d)) best_d = dist, best = j;
    }
    return best;
}

enum { V_RANDOM, V_SPECIAL, V_TIES, V_TINY_E, V_NEAR, V_KINDS };
static const char *const v_kind[V_KINDS] = {"random", "zero/tiny/scaled rows", "ties (rows twice)",
                                            "e below 1e-12", "near-ties (fp16-discriminating)"};

static void vq_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int n, int dim, int T) {
    float *cb = fvec((int64_t)n * dim), *hat = fvec((int64_t)n * dim), *hsq = fvec(n), *e = fvec((int64_t)dim * T);
    float *out = fvec(2 * T), *alt = fvec(2 * T);
    double *ref = dvec(2 * T), *tol = dvec(2 * T), *dist = dvec(n), *err = dvec(n), *ch = dvec((int64_t)n * dim);
    fill(s, X_RANDOM, cb, (int64_t)n * dim);
    fill(s, X_RANDOM, e, (int64_t)dim * T);
    if (kind == V_SPECIAL && n > 3) {
        for (int d = 0; d < dim; d++) cb[d] = 0.0f, cb[dim + d] *= 1e-13f, cb[2 * dim + d] = 2.0f * cb[3 * dim + d];
    }
    if (kind == V_TIES) memcpy(cb + (int64_t)(n / 2) * dim, cb, (size_t)(n / 2) * dim * sizeof *cb);
    if (kind == V_TINY_E)
        for (int64_t i = 0; i < (int64_t)dim * T; i++) e[i] *= 1e-14f; /* the 1e-12 floor decides */
    if (kind == V_NEAR) /* every code within ~1e-2 of the direction of e column 0 */
        for (int j = 0; j < n; j++)
            for (int d = 0; d < dim; d++)
                cb[(int64_t)j * dim + d] = e[(int64_t)d * T] + 0.01f * (float)ct_rand_normal(s);
    for (int j = 0; j < n; j++) {
        double ss = 0;
        for (int d = 0; d < dim; d++) ss += (double)cb[(int64_t)j * dim + d] * cb[(int64_t)j * dim + d];
        double den = fmax(sqrt(ss), 1e-12);
        for (int d = 0; d < dim; d++) ch[(int64_t)j * dim + d] = cb[(int64_t)j * dim + d] / den;
    }
    cd_vq q = {.n = n, .dim = dim, .codebook = cb, .cb_hat = hat, .cb_hat_sq = hsq};
    cd_vq_normalise(&q);
    for (int t = 0; t < T; t++) {
        double ss = 0, eh[CD_VQ_MAX_DIM], ee = 0;
        for (int d = 0; d < dim; d++) ss += (double)e[(int64_t)d * T + t] * e[(int64_t)d * T + t];
        for (int d = 0; d < dim; d++) eh[d] = e[(int64_t)d * T + t] / fmax(sqrt(ss), 1e-12), ee += eh[d] * eh[d];
        int best = 0;
        for (int j = 0; j < n; j++) {
            double dot = 0, m = 0, hs = 0;
            for (int d = 0; d < dim; d++) {
                double c = ch[(int64_t)j * dim + d];
                dot += eh[d] * c, m += fabs(eh[d] * c), hs += c * c;
            }
            dist[j] = ee - 2 * dot + hs;
            err[j] = (2 * dim + 16) * U * (ee + 2 * m + hs);
            if (dist[j] < dist[best]) best = j;
        }
        int got = k->control == CC_TIES_HIGH ? vq_search(&q, e + t, T, 0, 1) /* planted: ties to the higher index */
                                             : cd_vq_nearest(&q, e + t, T);
        int a16 = vq_search(&q, e + t, T, 1, 0);
        int first = got; /* the lowest index holding the same raw row */
        for (int j = 0; j < n; j++)
            if (!memcmp(cb + (int64_t)j * dim, cb + (int64_t)got * dim, (size_t)dim * sizeof *cb)) {
                first = j;
                break;
            }
        out[2 * t] = got >= 0 && got < n ? (float)dist[got] : NAN; /* + u|dist| from the fp32 store */
        ref[2 * t] = dist[best];
        tol[2 * t] = (got >= 0 && got < n ? err[got] : 0) + err[best] + 2 * U * fabs(dist[best]) + TINY;
        out[2 * t + 1] = (float)got, ref[2 * t + 1] = first, tol[2 * t + 1] = 0;
        alt[2 * t] = (float)dist[a16], alt[2 * t + 1] = (float)first; /* judged by its distance only */
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%d dim=%d", v_kind[kind], n, dim);
    ct_compare(res, name, out, ref, tol, 2 * T);
    if (kind == V_NEAR) ct_discriminate(res, name, alt, ref, tol, 2 * T);
    free(cb), free(hat), free(hsq), free(e), free(out), free(alt), free(ref), free(tol), free(dist), free(err);
    free(ch);
}

static void check_vq(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x5651ull;
    static const int shapes[][2] = {{64, 8}, {7, 3}, {40, 64}, {4, 1}};
    for (int kind = 0; kind < V_KINDS; kind++) {
        if (kind == V_NEAR) {
            vq_case(k, res, &s, kind, 256, 8, 1);
            continue;
        }
        for (int i = 0; i < 4; i++) vq_case(k, res, &s, kind, shapes[i][0], shapes[i][1], 33);
    }
}

/* ---- timing on a fixed shape (reported only) ---- */

static double time_codec(const ct_kernel *k, ct_ctx *ctx) {
    enum { N = 1 << 16 };
    float *a = fvec(N), *b = fvec(N), *c = fvec(4 * N), *d = fvec(4 * N);
    for (int i = 0; i < N; i++) a[i] = b[i] = 0.5f + (float)(i % 61) / 64.0f;
    for (int i = 0; i < 4 * N; i++) c[i] = d[i] = 0.001f * (float)(i % 97);
    static const int geo[4][6] = {{64, 64, 7, 1, 1, 1}, {64, 128, 8, 1, 4, 1}, {1024, 1024, 7, 1, 1, 1024},
                                  {128, 64, 16, 1, 8, 1}}; /* cin, cout, k, dil, stride, groups */
    cd_conv cv = {0};
    float *packed = NULL, *hist = NULL;
    int kv = KV(k) == K_FUSED ? K_CONV : KV(k); /* the fused entry times the conv1d shape */
    int64_t L = kv == K_GROUPED ? 64 : kv == K_TRANSPOSED ? 128 : 1024;
    if (kv <= K_TRANSPOSED) {
        const int *g = geo[kv - K_CONV];
        cd_conv_init(&cv, g[0], g[1], g[2], g[3], g[4], g[5], kv == K_TRANSPOSED);
        cv.isa = KISA(k);
        packed = dr_alloc((size_t)cd_conv_weight_len(&cv) * sizeof(float));
        hist = calloc((size_t)g[0] * (size_t)cv.hist + 1, sizeof(float));
        for (int64_t i = 0; i < cd_conv_weight_len(&cv); i++) packed[i] = 0.01f * (float)(i % 13);
        cv.w = packed;
    }
    cd_snake sn = {.c = 64, .inv = b, .alpha = a, .isa = KISA(k)};
    dr_codec_tf_config cf = {.n_head = 16, .head_dim = 64, .window_size = 128, .rope_base = 10000, .rope_bf16 = 1};
    cd_vq q = {.n = 4096, .dim = 8, .cb_hat = c, .cb_hat_sq = a};
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ct_now_ms();
        switch (KV(k)) {
        case K_CONV: case K_STRIDED: case K_GROUPED: case K_TRANSPOSED:
            cd_conv_run(&cv, hist, c, L, d, ctx->pool, NULL);
            break;
        case K_SNAKE: cd_snake_run(&sn, c, 1024, ctx->pool); break;
        case K_FUSED: cd_conv_run_ex(&cv, hist, c, L, d, &sn, d, ctx->pool, NULL); break;
        case K_LN: cd_layernorm_ct(c, 1024, 64, a, b, 1e-6, ctx->pool); break;
        case K_RMS: cd_rmsnorm_ct(c, d, 1024, 64, a, 1e-5, ctx->pool); break;
        case K_ROPE: case K_ROPE_F32: cd_rope_ct(c, 0, &cf, 64, 1000, ctx->pool); break;
        case K_ATTEND: cd_attend_ex(&cf, a, c, d, 127, 16, b, ctx->pool, KISA(k), 0); break;
        case K_SWIGLU: cd_swiglu(c, d, 3072 * 16, ctx->pool); break;
        case K_TANH: cd_tanh(c, d, 32768, ctx->pool); break;
        case K_GELU: cd_gelu_erf(c, 32768, ctx->pool); break;
        case K_VQ:
            for (int t = 0; t < 16; t++) cd_vq_nearest(&q, b + t, 16);
            break;
        default: break;
        }
        double dt = ct_now_ms() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b), free(c), free(d), dr_free(packed), free(hist);
    return best;
}

static const char *const k_time_shape[K_COUNT] = {
    "64->64 k7 L=1024", "64->128 k8 s4 L=1024", "dw 1024 k7 L=64", "128->64 k16 s8 L=128", "C=64 L=1024",
    "C=1024 L=64", "D=1024 L=64", "16x64 L=64", "16x64 L=64", "16x64 W=128 L=16", "n=49152", "n=32768",
    "4096 codes x 16", "n=32768", "64->64 k7 L=1024 + snake + residual"};
static const double k_limit_ms[K_COUNT] = {20, 10, 2, 10, 2, 1, 1, 2, 2, 5, 1, 0.5, 2, 0.5, 20};

static ct_check_fn k_check(int v) {
    switch (v) {
    case K_CONV: case K_STRIDED: case K_GROUPED: case K_TRANSPOSED: return check_conv;
    case K_SNAKE: return check_snake;
    case K_FUSED: return check_fused;
    case K_LN: case K_RMS: return check_norm;
    case K_ROPE: case K_ROPE_F32: return check_rope;
    case K_ATTEND: return check_attend;
    case K_SWIGLU: case K_TANH: case K_GELU: return check_elementwise;
    default: return check_vq;
    }
}

static const char *no_avx2(char *why, size_t n) {
    if (cd_isa_supported(CD_ISA_AVX2)) return NULL;
    snprintf(why, n, "this CPU has no AVX2/FMA");
    return why;
}

static const char *no_avx512(char *why, size_t n) {
    if (cd_isa_supported(CD_ISA_AVX512)) return NULL;
    snprintf(why, n, "this CPU has no AVX-512 (F, DQ, VL)");
    return why;
}

/* the kernels with SIMD paths (conv_x86.c), each entry once per instruction set */
static const int k_simd[] = {K_CONV, K_STRIDED, K_TRANSPOSED, K_SNAKE, K_FUSED, K_ATTEND};
static const char *const isa_backend[CD_ISA_COUNT] = {"cpu", "cpu/avx2", "cpu/avx512"};
static const char *const isa_control[CD_ISA_COUNT] = {"cpu/control", "cpu/avx2/control", "cpu/avx512/control"};
/* the convs through the AVX2 GEMM blocking, forced to small blocks */
static const int k_gemm[] = {K_CONV, K_STRIDED, K_TRANSPOSED, K_FUSED};

static ct_kernel entry_ex(int v, int isa, int gemm, int control, const char *desc) {
    return (ct_kernel){.name = k_names[v],
                       .backend = gemm ? (control ? "cpu/avx2/gemm/control" : "cpu/avx2/gemm")
                                       : control ? isa_control[isa] : isa_backend[isa],
                       .precision = k_precision[v], .check = k_check(v), .time = control ? NULL : time_codec,
                       .time_shape = control ? NULL : k_time_shape[v], .limit_ms = control ? 0 : k_limit_ms[v],
                       .variant = v | isa << 8 | gemm << 12, .control = control, .control_desc = desc,
                       .unavailable = isa == CD_ISA_AVX2 ? no_avx2 : isa == CD_ISA_AVX512 ? no_avx512 : NULL};
}

static ct_kernel entry(int v, int isa, int control, const char *desc) { return entry_ex(v, isa, 0, control, desc); }

int ct_codec_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < K_COUNT && n < max; v++) out[n++] = entry(v, CD_ISA_PORTABLE, 0, NULL);
    for (int isa = CD_ISA_AVX2; isa < CD_ISA_COUNT; isa++)
        for (size_t i = 0; i < sizeof k_simd / sizeof k_simd[0] && n < max; i++) out[n++] = entry(k_simd[i], isa, 0, NULL);
    for (size_t i = 0; i < sizeof k_gemm / sizeof k_gemm[0] && n < max; i++)
        out[n++] = entry_ex(k_gemm[i], CD_ISA_AVX2, 1, 0, NULL);
    return n;
}

int ct_codec_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {K_CONV, CC_TAPS_REV, "kernel taps reversed"},
        {K_CONV, CC_DIL, "dilation off by one"},
        {K_CONV, CC_FP16, "fp16 accumulation"},
        {K_CONV, CC_NO_HIST, "history not carried between chunks"},
        {K_STRIDED, CC_NO_HIST, "history not carried between chunks"},
        {K_GROUPED, CC_TAPS_REV, "kernel taps reversed"},
        {K_TRANSPOSED, CC_PHASE, "output phase off by one"},
        {K_TRANSPOSED, CC_NO_HIST, "history not carried between chunks"},
        {K_SNAKE, CC_SNAKE_ALPHA, "alpha instead of 1/(alpha+eps)"},
        {K_SNAKE, CC_SNAKE_NO_EPS, "1/alpha: epsilon left out"},
        {K_LN, CC_NO_EPS, "epsilon left out"},
        {K_RMS, CC_NO_EPS, "epsilon left out"},
        {K_ATTEND, CC_WIDE, "window one position too long"},
        {K_VQ, CC_TIES_HIGH, "ties to the higher index"},
        {K_GELU, CC_GELU_TANH, "tanh approximation instead of erf"},
        {K_ROPE, CC_ROPE_BASE, "RoPE base 500000 instead of the configured one"},
        {K_ROPE_F32, CC_ROPE_BASE, "RoPE base 500000 instead of the configured one"},
        {K_SWIGLU, CC_SWAP, "gate and up swapped"},
        {K_TANH, CC_HALF, "tanh rounded to fp16"},
        {K_FUSED, CC_FP16, "fp16 accumulation"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++) out[n++] = entry(c[i].v, CD_ISA_PORTABLE, c[i].control, c[i].desc);
    /* inside the SIMD loops: a tap left out of the FMA chain, the vector sine's quadrants swapped */
    const struct { int v, control; const char *desc; } sc[] = {
        {K_CONV, CC_SIMD_TAP, "SIMD loop drops the first input's last tap"},
        {K_TRANSPOSED, CC_SIMD_TAP, "SIMD loop drops the first input's last tap"},
        {K_STRIDED, CC_SIMD_TAP, "SIMD loop drops the first input's last tap (phase-major input)"},
        {K_SNAKE, CC_SIMD_PARITY, "vector sine with sin and cos quadrants swapped"},
        {K_FUSED, CC_SIMD_PARITY, "fused Snake's vector sine with sin and cos quadrants swapped"},
        {K_FUSED, CC_SIMD_TAP, "SIMD loop drops the first input's last tap"},
        {K_ATTEND, CC_SIMD_TAP, "SIMD scores drop the last dim of the dot product"},
    };
    for (int isa = CD_ISA_AVX2; isa < CD_ISA_COUNT; isa++)
        for (size_t i = 0; i < sizeof sc / sizeof sc[0] && n < max; i++) out[n++] = entry(sc[i].v, isa, sc[i].control, sc[i].desc);
    /* inside the blocked loop: the partial sums dropped between contraction blocks, a tap left out */
    const struct { int v, control; const char *desc; } gc[] = {
        {K_CONV, CC_SIMD_KC, "blocked SIMD loop restarts the sums at the second contraction block"},
        {K_STRIDED, CC_SIMD_KC, "blocked SIMD loop restarts the sums at the second contraction block"},
        {K_TRANSPOSED, CC_SIMD_KC, "blocked SIMD loop restarts the sums at the second contraction block"},
        {K_FUSED, CC_SIMD_KC, "blocked SIMD loop restarts the sums at the second contraction block"},
        {K_CONV, CC_SIMD_TAP, "blocked SIMD loop drops the first input's last tap"},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0] && n < max; i++)
        out[n++] = entry_ex(gc[i].v, CD_ISA_AVX2, 1, gc[i].control, gc[i].desc);
    return n;
}
