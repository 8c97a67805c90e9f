/* contract_codec.c - `drama contract` entries for the codec's own kernels (src/codec/ops.c,
 * transformer.c, through codec/internal.h): causal, strided, grouped and transposed convs (plus
 * the history carried between chunks), Snake, the ConvNeXt layer norm, the transformer's RMS
 * norm and the registration of every codec entry; RoPE, windowed attention (and its KV window), SwiGLU
 * gate, ConvNeXt GELU, output tanh and the VQ search are in contract_codec_tf.c.
 * Float64 references, tolerances from each op's operation sequence (docs/contract.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "codec/kernels.h"
#include "tools/contract_codec_internal.h"

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
    ct_fill_kind(s, kind == X_NONFINITE ? X_RANDOM : kind, w, wn);
    ct_fill_kind(s, kind == X_DISCR ? X_DISCR : X_RANDOM, b, g->cout);
    ct_fill_kind(s, kind, x, xn);
    if (kind == X_NONFINITE) x[(int64_t)(g->cin / 2) * g->L + g->L / 2] = NAN, x[g->L - 1] = INFINITY;
    conv_ref(g, w, b, x, ref, tol, alt);
    ct_poison(y, no);
    conv_lib(g, k->control, KISA(k), KGEMM(k), NULL, NULL, w, b, x, NULL, 0, y, pool);
    char name[128];
    snprintf(name, sizeof name, "%s cin=%d cout=%d k=%d dil=%d s=%d g=%d L=%lld", ct_x_kind[kind], g->cin, g->cout, g->k,
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
    ct_fill_kind(s, kind == X_NONFINITE ? X_RANDOM : kind, w, wn);
    ct_fill_kind(s, kind == X_DISCR ? X_DISCR : X_RANDOM, b, g->cout);
    ct_fill_kind(s, kind, x, xn);
    ct_fill_kind(s, X_RANDOM, r, no);
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
    snprintf(name, sizeof name, "%s cin=%d cout=%d k=%d dil=%d L=%lld", ct_x_kind[kind], g->cin, g->cout, g->k, g->dil,
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
    ct_fill_kind(s, kind, x, n);
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
    snprintf(name, sizeof name, "%s C=%d L=%lld", ct_x_kind[kind], C, (long long)L);
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
    ct_fill_kind(s, kind, x, n);
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
    snprintf(name, sizeof name, "%s C=%d L=%lld", ct_x_kind[kind], C, (long long)L);
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
    case K_ROPE: case K_ROPE_F32: return ct_codec_check_rope;
    case K_ATTEND: return ct_codec_check_attend;
    case K_SWIGLU: case K_TANH: case K_GELU: return ct_codec_check_elementwise;
    default: return ct_codec_check_vq;
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
