/* contract_cuda_codec.c - `drama contract` entries for the codec decoder's device conv
 * (backend/cuda/codec_kernels.cu through dr_cuda_codec_conv_test): the implicit-GEMM conv with its
 * history columns, every tile shape (cout <= 16, small grids, >= 264 tiles of 64 x 64) and the
 * fixed channel splits 1, 2, 4, 8 with their in-order sum, plain, with the residual unit's fused
 * Snake + residual epilogue, and with the decoder's tanh. Float64 references; chunked calls (the
 * history of the second chunk = the first chunk's last columns) must equal the whole call bit for
 * bit. The control skips the last tap inside the tiled loop. docs/contract.md "CUDA kernels". */
#include "tools/contract_cuda_internal.h"

#ifndef DRAMA_HAVE_CUDA

int ct_cuda_codec_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}
int ct_cuda_codec_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_codec.h"

#define U CT_U32
#define TINY 0x1p-140

enum { CX_CONV, CX_FUSED, CX_TANH, CX_COUNT };
static const char *const cx_names[CX_COUNT] = {"codec.conv1d", "codec.conv_fused", "codec.conv_tanh"};
static const char *const cx_precision[CX_COUNT] = {
    "fmaf chain over cin*K terms per split, splits summed in order, + bias; tol = (cin*K+splits+2)u(|b| + sum|w x|); chunks == whole",
    "r + snake(conv): tol = 2(|1 + inv a sin(2 a v)| tol_conv + (|a| tol_conv)^2 |inv| + 8u(|v| + |inv s^2|) + u|y|); chunks == whole",
    "tanh(conv): tol = tol_conv (1 - tanh^2) + 4u|tanh|; chunks == whole"};

typedef struct geo {
    int cin, cout, K, dil, splits;
    int64_t L;
} geo;

static float *fv(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static double *dv(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static void fill(uint64_t *s, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(ct_rand_normal(s) * scale);
}

/* kind 0 random, 1 with NaN and inf inputs, 2 fp16-discriminating (positive terms, >= 4096 of them) */
static void one_case(const ct_kernel *k, ct_result *res, uint64_t *s, const geo *g, int kind) {
    int nonfinite = kind == 1;
    int H = (g->K - 1) * g->dil, act = k->variant == CX_FUSED ? 1 : k->variant == CX_TANH ? 2 : 0;
    int64_t L = g->L, HL = H + L, no = (int64_t)g->cout * L;
    float *w = fv((int64_t)g->cout * g->cin * g->K), *b = fv(g->cout), *x = fv((int64_t)g->cin * HL);
    float *al = fv(g->cout), *inv = fv(g->cout), *r = fv(no), *y = fv(no), *y1 = fv(no), *y2 = fv(no), *alt = fv(no);
    double *ref = dv(no), *tol = dv(no), *zero = dv(no), *whole = dv(no);
    fill(s, w, (int64_t)g->cout * g->cin * g->K, 1.0 / sqrt((double)g->cin * g->K));
    fill(s, b, g->cout, 0.5);
    fill(s, x, (int64_t)g->cin * HL, 1.0);
    fill(s, r, no, 1.0);
    if (nonfinite) x[(int64_t)(g->cin / 2) * HL + H + L / 2] = NAN, x[HL - 1] = INFINITY;
    if (kind == 2) {
        for (int64_t i = 0; i < (int64_t)g->cout * g->cin * g->K; i++) w[i] = (float)(2 * ct_rand_uniform(s) / (g->cin * g->K));
        for (int64_t i = 0; i < (int64_t)g->cin * HL; i++) x[i] = (float)(0.5 + 0.5 * ct_rand_uniform(s));
    }
    for (int o = 0; o < g->cout; o++) {
        al[o] = (float)((0.05 + 1.95 * ct_rand_uniform(s)) * (o % 4 == 3 ? -1 : 1));
        inv[o] = 1.0f / (al[o] + 1e-9f);
    }
    for (int o = 0; o < g->cout; o++)
        for (int64_t t = 0; t < L; t++) {
            double acc = b[o], m = fabs(b[o]);
            for (int i = 0; i < g->cin; i++)
                for (int kk = 0; kk < g->K; kk++) {
                    double p = (double)w[((int64_t)o * g->cin + i) * g->K + kk] * x[(int64_t)i * HL + t + (int64_t)kk * g->dil];
                    acc += p, m += fabs(p);
                }
            double tc = (double)(g->cin * g->K + g->splits + 2) * U * m + TINY, v = acc;
            int64_t at = o * L + t;
            float h = 0; /* the fp16-accumulated variant, then the fp32 epilogue */
            for (int i = 0; i < g->cin && kind == 2; i++)
                for (int kk = 0; kk < g->K; kk++)
                    h = ct_h(h + w[((int64_t)o * g->cin + i) * g->K + kk] * x[(int64_t)i * HL + t + (int64_t)kk * g->dil]);
            h = ct_h(h + b[o]);
            if (act == 1) {
                float sh = sinf(al[o] * h);
                alt[at] = r[at] + (h + inv[o] * (sh * sh));
            } else {
                alt[at] = act == 2 ? tanhf(h) : h;
            }
            if (act == 1) {
                double a = al[o], iv = inv[o], p = a * v, sv = sin(p), T = iv * sv * sv, dl = fabs(a) * tc;
                double yv = r[at] + (v + T);
                tol[at] = 2 * (fabs(1 + iv * a * sin(2 * p)) * tc + dl * dl * fabs(iv) + 8 * U * (fabs(v) + fabs(T)) +
                               U * fabs(yv)) + TINY;
                ref[at] = yv;
            } else if (act == 2) {
                double th = tanh(v);
                ref[at] = th, tol[at] = tc * (1 - th * th) + 4 * U * fabs(th) + TINY;
            } else {
                ref[at] = v, tol[at] = tc;
            }
        }
    drama_error err = {0};
    ct_poison(y, no);
    char name[160];
    snprintf(name, sizeof name, "%s cin=%d cout=%d K=%d dil=%d splits=%d L=%lld",
             kind == 1 ? "nan-inf" : kind == 2 ? "fp16-discriminating" : "random",
             g->cin, g->cout, g->K, g->dil, g->splits, (long long)L);
    if (dr_cuda_codec_conv_test(w, b, x, g->cin, g->cout, g->K, g->dil, L, act, al, inv, act == 1 ? r : NULL,
                                g->splits, k->control, y, &err)) {
        ct_case_error(res, name, err.message);
        goto out;
    }
    ct_compare(res, name, y, ref, tol, no);
    if (kind == 2) ct_discriminate(res, name, alt, ref, tol, no);
    /* chunked: steps [0, L1) then [L1, L) with the first chunk's last H input columns as history */
    int64_t L1 = L / 3 > 0 ? L / 3 : 1, L2 = L - L1;
    if (L2 > 0) {
        float *x2 = fv((int64_t)g->cin * (H + L2)), *r1 = fv((int64_t)g->cout * L1), *r2 = fv((int64_t)g->cout * L2);
        float *xa = fv((int64_t)g->cin * (H + L1));
        for (int i = 0; i < g->cin; i++) {
            memcpy(xa + (int64_t)i * (H + L1), x + (int64_t)i * HL, (size_t)(H + L1) * 4);
            memcpy(x2 + (int64_t)i * (H + L2), x + (int64_t)i * HL + L1, (size_t)(H + L2) * 4);
        }
        for (int o = 0; o < g->cout; o++) {
            memcpy(r1 + (int64_t)o * L1, r + (int64_t)o * L, (size_t)L1 * 4);
            memcpy(r2 + (int64_t)o * L2, r + (int64_t)o * L + L1, (size_t)L2 * 4);
        }
        int bad = dr_cuda_codec_conv_test(w, b, xa, g->cin, g->cout, g->K, g->dil, L1, act, al, inv, act == 1 ? r1 : NULL,
                                          g->splits, k->control, y1, &err) ||
                  dr_cuda_codec_conv_test(w, b, x2, g->cin, g->cout, g->K, g->dil, L2, act, al, inv, act == 1 ? r2 : NULL,
                                          g->splits, k->control, y2, &err);
        for (int64_t i = 0; i < no; i++) whole[i] = y[i];
        float *yc = fv(no);
        for (int o = 0; o < g->cout && !bad; o++) {
            memcpy(yc + (int64_t)o * L, y1 + (int64_t)o * L1, (size_t)L1 * 4);
            memcpy(yc + (int64_t)o * L + L1, y2 + (int64_t)o * L2, (size_t)L2 * 4);
        }
        snprintf(name + strlen(name), sizeof name - strlen(name), " chunked %lld+%lld", (long long)L1, (long long)L2);
        if (bad) ct_case_error(res, name, err.message);
        else ct_compare(res, name, yc, whole, zero, no);
        free(x2), free(r1), free(r2), free(xa), free(yc);
    }
out:
    free(w), free(b), free(x), free(al), free(inv), free(r), free(y), free(y1), free(y2), free(alt);
    free(ref), free(tol), free(zero), free(whole);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x43554344ull ^ (uint64_t)k->variant;
    /* cin, cout, K, dil, splits, L: cout <= 16 tiles, the 32 x 32 tiles, >= 264 tiles of 64 x 64
     * (cout 128, L 8400), dilations 3 and 9 with ragged ends, 1x1 and 2-tap convs, splits 1..8 */
    static const geo gs[] = {{13, 11, 7, 1, 1, 269}, {24, 19, 7, 3, 2, 37}, {9, 4, 7, 9, 1, 100},
                             {64, 40, 1, 1, 8, 23},  {32, 70, 2, 1, 4, 90}, {8, 128, 7, 1, 1, 8400},
                             {96, 1, 7, 1, 1, 300},  {48, 33, 7, 9, 4, 61}};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        if (k->variant != CX_CONV && i == 5) continue; /* the big grid once */
        one_case(k, res, &s, &gs[i], 0);
    }
    one_case(k, res, &s, &gs[1], 1);
    static const geo discr = {600, 9, 7, 1, 8, 11}; /* 4200 positive terms per output */
    one_case(k, res, &s, &discr, 2);
}

int ct_cuda_codec_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < CX_COUNT && n < max; v++, n++)
        out[n] = (ct_kernel){.name = cx_names[v], .backend = "cuda", .precision = cx_precision[v], .check = check,
                             .variant = v, .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_codec_controls(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < CX_COUNT && n < max; v++, n++)
        out[n] = (ct_kernel){.name = cx_names[v], .backend = "cuda/control", .precision = cx_precision[v],
                             .check = check, .variant = v, .control = 1,
                             .control_desc = "device: the last tap skipped inside the tiled loop",
                             .unavailable = cu_unavailable};
    return n;
}

#endif
