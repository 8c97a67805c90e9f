/* contract_ops.c - `drama contract` entries for the CPU ops of backend/cpu/ops.h: float64
 * references, tolerances from each op's precision contract (docs/contract.md), fp16 variants
 * for the precision-discriminating fixtures, and planted controls. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "num/formats.h"
#include "tools/contract_internal.h"

#define U CT_U32
#define TINY 0x1p-140

enum { OP_RMS, OP_L2, OP_SOFTMAX, OP_ROPE_HALF, OP_ROPE_INTER, OP_ATTEND, OP_CONV, OP_GDN, OP_TOPK, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"rms_norm",  "l2norm",    "softmax",  "rope_half", "rope_interleaved",
                                               "attend",    "conv_step", "gdn_step", "topk"};
static const char *const op_precision[OP_COUNT] = {
    "sum of squares in double, r = fp32(1/sqrt(ss/n + eps)), y = (x r) w in fp32; tol = 6u|y|",
    "sum of squares in double, x *= fp32(1/sqrt(ss + eps)) * scale; tol = 6u|y|",
    "max-subtracted expf, sum in double; tol = u y (|x-max| + sum_j y_j|x_j-max| + 6) + 2^-148",
    "cos/sin of pos*inv_freq in double rounded to fp32, rotation in fp32; tol = 4u(|a|+|b|)",
    "as rope_half with (2i, 2i+1) pairs; tol = 4u(|a|+|b|)",
    ("scores in double rounded to fp32 then scaled, softmax, fp32 sum over positions; tol from the "
     "score, softmax and (n_pos+2)u sum_t p_t|v_t| bounds"),
    "fp32 sum of bias + K products; tol = (K+2)u(|bias| + sum|w x|); window shifted exactly",
    "fp32 recurrence; tol = 2x the first-order bound of decay, k^T S (dk+2)u, rank-1 update, q^T S",
    "exact: the k largest of p >= 0 in descending order, ties to the lower index, -1 when too few",
};

enum { OC_NONE = 0, OC_NO_EPS, OC_NO_MAX, OC_NO_SHIFT, OC_NO_DECAY, OC_TIES_HIGH, OC_WRONG_PAIRS, OC_DROP_LAST };

static void fill_vec(uint64_t *s, int kind, float *x, int64_t n) {
    ct_fill_kind(s, kind, x, n);
    if (kind == X_NONFINITE && n > 2) x[n / 2] = NAN;
}

/* ---- rms_norm / l2norm ---- */

static void norm_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int64_t n, int with_w) {
    int op = k->variant;
    float eps = 1e-6f, scale = op == OP_L2 ? 0.125f : 1.0f;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w), *y = malloc((size_t)n * sizeof *y);
    float *alt = malloc((size_t)n * sizeof *alt);
    double *ref = malloc((size_t)n * sizeof *ref), *tol = malloc((size_t)n * sizeof *tol);
    fill_vec(s, kind, x, n);
    for (int64_t i = 0; i < n; i++) w[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
    const float *wp = with_w && op == OP_RMS ? w : NULL;
    double ss = 0;
    float hs = 0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        hs = ct_h(hs + x[i] * x[i]);
    }
    double r = op == OP_RMS ? 1.0 / sqrt(ss / (double)n + eps) : scale / sqrt(ss + eps);
    float hr = op == OP_RMS ? (float)(1.0 / sqrt((double)hs / (double)n + eps))
                            : (float)(scale / sqrt((double)hs + eps));
    for (int64_t i = 0; i < n; i++) {
        ref[i] = (double)x[i] * r * (wp ? wp[i] : 1.0);
        tol[i] = 6 * U * fabs(ref[i]) + TINY;
        alt[i] = x[i] * hr * (wp ? wp[i] : 1.0f);
    }
    if (op == OP_RMS) {
        ct_poison(y, n);
        if (k->control == OC_NO_EPS) { /* planted: epsilon left out */
            double s2 = 0;
            for (int64_t i = 0; i < n; i++) s2 += (double)x[i] * x[i];
            float rr = (float)(1.0 / sqrt(s2 / (double)n));
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * rr * (wp ? wp[i] : 1.0f);
        } else {
            dr_op_rms_norm(x, wp, eps, n, y);
        }
    } else {
        memcpy(y, x, (size_t)n * sizeof *y); /* in place: every element must be rewritten */
        if (k->control == OC_NO_EPS) { /* planted: epsilon left out */
            double s2 = 0;
            for (int64_t i = 0; i < n; i++) s2 += (double)x[i] * x[i];
            float rr = (float)(scale / sqrt(s2));
            for (int64_t i = 0; i < n; i++) y[i] *= rr;
        } else {
            dr_op_l2norm(y, n, eps, scale);
        }
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld%s", ct_x_kind[kind], (long long)n, wp ? " weighted" : "");
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(x), free(w), free(y), free(alt), free(ref), free(tol);
}

static void check_norm(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x4e4f524dull ^ (uint64_t)k->variant;
    const int64_t ns[] = {1, 7, 64, 1000};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            norm_case(k, res, &s, kind, 4096, 1);
            continue;
        }
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) norm_case(k, res, &s, kind, ns[i], (int)(i % 2));
    }
}

/* ---- softmax ---- */

static void softmax_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int64_t n) {
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *alt = malloc((size_t)n * sizeof *alt);
    double *ref = malloc((size_t)n * sizeof *ref), *tol = malloc((size_t)n * sizeof *tol);
    for (int64_t i = 0; i < n; i++) {
        double v = 3 * ct_rand_normal(s);
        if (kind == X_RANGE) v *= 300; /* logits of +-1000: exp overflows without the max */
        if (kind == X_TINY) v = (i % 3 == 1) ? -INFINITY : v; /* masked entries (never all of them) */
        if (kind == X_DISCR) v = 0.25;
        x[i] = (float)v;
    }
    if (kind == X_NONFINITE && n > 1) x[n - 1] = NAN;
    double mx = -INFINITY, sum = 0;
    int has_nan = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) has_nan = 1;
        else if (x[i] > mx) mx = x[i];
    }
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    double spread = 0;
    for (int64_t i = 0; i < n; i++) {
        ref[i] = has_nan ? NAN : exp((double)x[i] - mx) / sum;
        if (!has_nan && isfinite(x[i])) spread += ref[i] * fabs(x[i] - mx);
    }
    float hsum = 0;
    for (int64_t i = 0; i < n; i++) hsum = ct_h(hsum + expf(x[i] - (float)mx));
    for (int64_t i = 0; i < n; i++) {
        double d = isfinite(x[i]) ? fabs(x[i] - mx) : 0;
        tol[i] = U * fabs(ref[i]) * (d + spread + 6) + 0x1p-148;
        alt[i] = expf(x[i] - (float)mx) / hsum;
    }
    memcpy(y, x, (size_t)n * sizeof *y); /* in place */
    if (k->control == OC_NO_MAX) { /* planted: no max subtraction */
        double sm = 0;
        for (int64_t i = 0; i < n; i++) {
            y[i] = expf(y[i]);
            sm += y[i];
        }
        for (int64_t i = 0; i < n; i++) y[i] = (float)(y[i] / sm);
    } else {
        dr_op_softmax(y, n);
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld", kind == X_TINY ? "masked(-inf)" : ct_x_kind[kind], (long long)n);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(x), free(y), free(alt), free(ref), free(tol);
}

static void check_softmax(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x534d4158ull;
    const int64_t ns[] = {1, 5, 64, 1000};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            softmax_case(k, res, &s, kind, 4096);
            continue;
        }
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) softmax_case(k, res, &s, kind, ns[i]);
    }
}

/* ---- rope ---- */

static void check_rope(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x524f5045ull ^ (uint64_t)k->variant;
    const int halves[] = {1, 8, 32};
    const int64_t positions[] = {0, 1, 17, 5000, 262143};
    for (size_t hi = 0; hi < sizeof halves / sizeof halves[0]; hi++) {
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
            int half = halves[hi], dim = 2 * half + 3; /* 3 trailing pass-through dims */
            int64_t pos = positions[pi];
            float inv[32], cs[32], sn[32], x[67], y[67], alt[67];
            double ref[67], tol[67];
            for (int i = 0; i < half; i++) inv[i] = (float)pow(1e7, -(double)i / half);
            fill_vec(&s, pi == 3 ? X_RANGE : X_RANDOM, x, dim);
            dr_op_rope_cos_sin(inv, half, pos, cs, sn);
            memcpy(y, x, sizeof x);
            int as_half = k->variant == OP_ROPE_HALF;
            if (k->control == OC_WRONG_PAIRS) as_half = !as_half; /* planted: the other pairing */
            if (as_half) dr_op_rope_half(y, half, cs, sn);
            else dr_op_rope_interleaved(y, half, cs, sn);
            for (int i = 0; i < dim; i++) {
                ref[i] = x[i];
                tol[i] = TINY;
                alt[i] = x[i];
            }
            for (int i = 0; i < half; i++) {
                int ia = k->variant == OP_ROPE_HALF ? i : 2 * i, ib = k->variant == OP_ROPE_HALF ? i + half : 2 * i + 1;
                double a = x[ia], b = x[ib], ang = (double)pos * (double)inv[i], c = cos(ang), sv = sin(ang);
                ref[ia] = a * c - b * sv;
                ref[ib] = b * c + a * sv;
                tol[ia] = tol[ib] = 4 * U * (fabs(a) + fabs(b)) + TINY;
                float hc = ct_h((float)c), hs = ct_h((float)sv); /* fp16 tables */
                alt[ia] = x[ia] * hc - x[ib] * hs;
                alt[ib] = x[ib] * hc + x[ia] * hs;
            }
            char name[96];
            snprintf(name, sizeof name, "half=%d pos=%lld", half, (long long)pos);
            ct_compare(res, name, y, ref, tol, dim);
            if (half == 32 && pos == 17) ct_discriminate(res, name, alt, ref, tol, dim);
        }
    }
}

/* ---- attend ---- */

static void attend_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int64_t n_pos, int hd) {
    int64_t stride = hd + 5; /* rows of a wider cache: the op must honour the stride */
    float *q = malloc((size_t)hd * sizeof *q), *kc = malloc((size_t)(n_pos * stride) * sizeof *kc);
    float *vc = malloc((size_t)(n_pos * stride) * sizeof *vc), *scratch = malloc((size_t)n_pos * sizeof *scratch);
    float *out = malloc((size_t)hd * sizeof *out), *alt = malloc((size_t)hd * sizeof *alt);
    double *ref = malloc((size_t)hd * sizeof *ref), *tol = malloc((size_t)hd * sizeof *tol);
    double *p = malloc((size_t)n_pos * sizeof *p), *sc = malloc((size_t)n_pos * sizeof *sc);
    fill_vec(s, kind == X_DISCR ? X_RANDOM : kind, q, hd);
    fill_vec(s, kind == X_NONFINITE ? X_RANDOM : kind, kc, n_pos * stride);
    fill_vec(s, kind == X_NONFINITE ? X_RANDOM : kind, vc, n_pos * stride);
    if (kind == X_DISCR) /* equal scores, positive values: a long sum of small equal terms */
        for (int64_t i = 0; i < n_pos * stride; i++) kc[i] = 0.0f;
    float scale = 1.0f / sqrtf((float)hd);
    double mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n_pos; t++) {
        double d = 0;
        for (int j = 0; j < hd; j++) d += (double)q[j] * kc[t * stride + j];
        sc[t] = d * scale;
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < n_pos; t++) sum += exp(sc[t] - mx);
    double E = 0;
    for (int64_t t = 0; t < n_pos; t++) {
        p[t] = exp(sc[t] - mx) / sum;
        E += p[t] * U * (2 * fabs(sc[t]) + fabs(sc[t] - mx) + 4);
    }
    for (int j = 0; j < hd; j++) {
        double o = 0, m = 0;
        float h = 0;
        for (int64_t t = 0; t < n_pos; t++) {
            double v = vc[t * stride + j];
            double rel = U * (2 * fabs(sc[t]) + fabs(sc[t] - mx) + 4) + E + 2 * U;
            o += p[t] * v;
            m += p[t] * fabs(v) * (rel + (double)(n_pos + 2) * U);
            h = ct_h(h + (float)p[t] * (float)v);
        }
        ref[j] = o;
        tol[j] = m + TINY;
        alt[j] = h;
    }
    ct_poison(out, hd);
    /* planted: the newest position left out (an off-by-one cache length) */
    int64_t used = k->control == OC_DROP_LAST && n_pos > 1 ? n_pos - 1 : n_pos;
    dr_op_attend(q, kc, vc, used, stride, hd, scale, scratch, out);
    char name[96];
    snprintf(name, sizeof name, "%s n_pos=%lld hd=%d", ct_x_kind[kind], (long long)n_pos, hd);
    ct_compare(res, name, out, ref, tol, hd);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, hd);
    free(q), free(kc), free(vc), free(scratch), free(out), free(alt), free(ref), free(tol), free(p), free(sc);
}

static void check_attend(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x4154544eull;
    const int64_t np[] = {1, 3, 40, 257};
    const int hds[] = {8, 64, 33, 128};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            attend_case(k, res, &s, kind, 4096, 16);
            continue;
        }
        if (kind == X_RANGE) continue; /* scores of 2^40 make every bound vacuous; covered by softmax */
        for (size_t i = 0; i < sizeof np / sizeof np[0]; i++) attend_case(k, res, &s, kind, np[i], hds[i]);
    }
}

/* ---- conv_step ---- */

static void check_conv(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x434f4e56ull;
    const int Ks[] = {1, 2, 4, 7};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        for (int kind = 0; kind < X_KINDS; kind++) {
            int K = Ks[ki];
            int64_t C = 37, c0 = 5, c1 = 30; /* a channel sub-range, as split by the caller's pool */
            int64_t wn = (int64_t)(K > 1 ? K - 1 : 1) * C;
            float *win = malloc((size_t)wn * sizeof *win), *win0 = malloc((size_t)wn * sizeof *win0);
            float *u = malloc((size_t)C * sizeof *u), *w = malloc((size_t)(C * K) * sizeof *w);
            float *b = malloc((size_t)C * sizeof *b);
            float *y = malloc((size_t)C * sizeof *y), *alt = malloc((size_t)C * sizeof *alt);
            int64_t no = C + wn;
            float *outs = malloc((size_t)no * sizeof *outs);
            double *ref = malloc((size_t)no * sizeof *ref), *tol = malloc((size_t)no * sizeof *tol);
            fill_vec(&s, kind, win, wn);
            fill_vec(&s, kind == X_NONFINITE ? X_RANDOM : kind, u, C);
            fill_vec(&s, X_RANDOM, w, C * K);
            fill_vec(&s, X_RANDOM, b, C);
            memcpy(win0, win, (size_t)wn * sizeof *win);
            for (int64_t c = 0; c < C; c++) {
                double acc = b[c], m = fabs(b[c]);
                float h = b[c];
                for (int j = 0; j < K; j++) {
                    double xv = j < K - 1 ? win0[(int64_t)j * C + c] : u[c];
                    acc += (double)w[c * K + j] * xv;
                    m += fabs((double)w[c * K + j] * xv);
                    h = ct_h(h + w[c * K + j] * (float)xv);
                }
                int inside = c >= c0 && c < c1;
                ref[c] = inside ? acc : NAN; /* outside the range: untouched (poison stays NaN) */
                tol[c] = (K + 2) * U * m + TINY;
                alt[c] = inside ? h : NAN;
                for (int j = 0; j < K - 1; j++) { /* shifted window; channels outside unchanged */
                    double nv = !inside      ? win0[(int64_t)j * C + c]
                                : j + 1 < K - 1 ? win0[(int64_t)(j + 1) * C + c]
                                                : u[c];
                    ref[C + (int64_t)j * C + c] = nv;
                    tol[C + (int64_t)j * C + c] = TINY;
                }
            }
            if (K == 1)
                for (int64_t c = 0; c < C; c++) ref[C + c] = win0[c], tol[C + c] = TINY;
            ct_poison(y, C);
            if (k->control == OC_NO_SHIFT) { /* planted: the window is not advanced */
                float *tmp = malloc((size_t)wn * sizeof *tmp);
                memcpy(tmp, win, (size_t)wn * sizeof *tmp);
                dr_op_conv_step(win, u, w, b, K, C, c0, c1, y);
                memcpy(win, tmp, (size_t)wn * sizeof *tmp);
                free(tmp);
            } else {
                dr_op_conv_step(win, u, w, b, K, C, c0, c1, y);
            }
            memcpy(outs, y, (size_t)C * sizeof *y);
            memcpy(outs + C, win, (size_t)wn * sizeof *win);
            char name[96];
            snprintf(name, sizeof name, "%s K=%d C=%lld [%lld,%lld)", ct_x_kind[kind], K, (long long)C, (long long)c0,
                     (long long)c1);
            ct_compare(res, name, outs, ref, tol, no);
            if (kind == X_DISCR && K == 7) {
                memcpy(outs, alt, (size_t)C * sizeof *alt);
                ct_discriminate(res, name, outs, ref, tol, C);
            }
            free(win), free(win0), free(u), free(w), free(b), free(y), free(alt), free(outs), free(ref), free(tol);
        }
    }
}

/* ---- gdn_step ---- */

static void gdn_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int dk, int dv) {
    int64_t ns = (int64_t)dk * dv;
    float *S = malloc((size_t)ns * sizeof *S), *q = malloc((size_t)dk * 4), *kk = malloc((size_t)dk * 4);
    float *v = malloc((size_t)dv * 4), *mem = malloc((size_t)dv * 4), *o = malloc((size_t)dv * 4);
    int64_t no = dv + ns;
    float *outs = malloc((size_t)no * sizeof *outs), *alt = malloc((size_t)no * sizeof *alt);
    double *ref = malloc((size_t)no * sizeof *ref), *tol = malloc((size_t)no * sizeof *tol);
    double *S1 = malloc((size_t)ns * sizeof *S1), *d = malloc((size_t)dv * sizeof *d), *ed = malloc((size_t)dv * 8);
    fill_vec(s, kind == X_NONFINITE ? X_RANDOM : kind, S, ns);
    fill_vec(s, kind, q, dk);
    fill_vec(s, kind == X_NONFINITE ? X_RANDOM : kind, kk, dk);
    fill_vec(s, kind == X_NONFINITE ? X_RANDOM : kind, v, dv);
    float g = -(float)(0.05 + ct_rand_uniform(s)), beta = (float)(0.2 + 0.6 * ct_rand_uniform(s));
    double decay = exp((double)g);
    for (int64_t i = 0; i < ns; i++) S1[i] = S[i] * decay;
    for (int j = 0; j < dv; j++) {
        double m = 0, mm = 0;
        for (int i = 0; i < dk; i++) {
            m += (double)kk[i] * S1[(int64_t)i * dv + j];
            mm += fabs((double)kk[i] * S1[(int64_t)i * dv + j]);
        }
        d[j] = ((double)v[j] - m) * beta;
        ed[j] = beta * U * ((dk + 4) * mm + 2 * fabs(v[j]) + 2 * fabs(v[j] - m));
    }
    float hm[512], ho[512];
    for (int j = 0; j < dv; j++) hm[j] = ho[j] = 0;
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) hm[j] = ct_h(hm[j] + (float)S1[(int64_t)i * dv + j] * kk[i]);
    for (int j = 0; j < dv; j++) {
        double o_ref = 0, m = 0;
        float hd = (v[j] - hm[j]) * beta;
        for (int i = 0; i < dk; i++) {
            int64_t ij = (int64_t)i * dv + j;
            double s2 = S1[ij] + (double)kk[i] * d[j];
            double es = 2 * U * (fabs(S1[ij]) * 2 + fabs(kk[i] * d[j]) * 2) + fabs(kk[i]) * ed[j];
            ref[dv + ij] = s2;
            tol[dv + ij] = 2 * es + TINY;
            alt[dv + ij] = (float)s2;
            o_ref += s2 * q[i];
            m += (dk + 2) * U * fabs(s2 * q[i]) + fabs(q[i]) * es;
            ho[j] = ct_h(ho[j] + ((float)S1[ij] + kk[i] * hd) * q[i]);
        }
        ref[j] = o_ref;
        tol[j] = 2 * m + TINY;
        alt[j] = ho[j];
    }
    ct_poison(o, dv);
    if (k->control == OC_NO_DECAY) dr_op_gdn_step(S, q, kk, v, 0.0f, beta, dk, dv, mem, o); /* planted */
    else dr_op_gdn_step(S, q, kk, v, g, beta, dk, dv, mem, o);
    memcpy(outs, o, (size_t)dv * 4);
    memcpy(outs + dv, S, (size_t)ns * 4);
    char name[96];
    snprintf(name, sizeof name, "%s dk=%d dv=%d", ct_x_kind[kind], dk, dv);
    ct_compare(res, name, outs, ref, tol, no);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, dv);
    free(S), free(q), free(kk), free(v), free(mem), free(o), free(outs), free(alt), free(ref), free(tol), free(S1);
    free(d), free(ed);
}

static void check_gdn(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x47444eull;
    const int dims[][2] = {{1, 1}, {8, 5}, {32, 32}, {64, 128}, {128, 128}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_RANGE) continue; /* a state spanning 2^+-20 makes the bound vacuous */
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
            if (kind == X_DISCR && i != 4) continue;
            gdn_case(k, res, &s, kind, dims[i][0], dims[i][1]);
        }
    }
}

/* ---- topk ---- */

/* reference selection by (value descending, index ascending) among p >= 0; `round16` ranks the
 * fp16-rounded values (the discriminating variant), `ties_high` prefers the higher index */
static void topk_select(const float *p, int n, int k, int *ids, int round16, int ties_high) {
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int used = 0;
            for (int q = 0; q < r; q++) used |= ids[q] == e;
            float v = round16 ? ct_h(p[e]) : p[e];
            if (used || !(v >= 0.0f)) continue;
            float bv = best < 0 ? 0 : (round16 ? ct_h(p[best]) : p[best]);
            if (best < 0 || v > bv || (ties_high && v == bv)) best = e;
        }
        ids[r] = best;
    }
}

static void check_topk(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x544f504bull;
    const int ns[] = {1, 5, 16, 256};
    enum { T_RANDOM, T_TIES, T_NEG, T_NAN, T_NEAR, T_KINDS };
    static const char *const tk[T_KINDS] = {"random", "ties", "negatives", "nan", "near-ties (1 ulp)"};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        for (int kind = 0; kind < T_KINDS; kind++) {
            int n = ns[ni], kk = n < 8 ? n + 2 : 8; /* k > n: the tail must be -1 */
            float p[256];
            int ids[260], rid[260], aid[260];
            for (int e = 0; e < n; e++) {
                double u = ct_rand_uniform(&s);
                p[e] = (float)u;
                if (kind == T_TIES) p[e] = (float)((int)(u * 3) / 4.0);
                if (kind == T_NEG && e % 2) p[e] = -(float)u;
                if (kind == T_NAN && e % 3 == 1) p[e] = NAN;
                if (kind == T_NEAR) p[e] = dr_f32_from_bits(dr_f32_bits(0.3f) + (uint32_t)(ct_rand_u64(&s) % 16));
            }
            for (int r = 0; r < kk; r++) ids[r] = 0x7FFFFFF;
            if (k->control == OC_TIES_HIGH) topk_select(p, n, kk, ids, 0, 1);
            else dr_op_topk(p, n, kk, ids);
            topk_select(p, n, kk, rid, 0, 0);
            topk_select(p, n, kk, aid, 1, 0);
            float out[260], alt[260];
            double ref[260], tol[260];
            for (int r = 0; r < kk; r++) {
                out[r] = (float)ids[r];
                alt[r] = (float)aid[r];
                ref[r] = rid[r];
                tol[r] = 0;
            }
            char name[96];
            snprintf(name, sizeof name, "%s n=%d k=%d", tk[kind], n, kk);
            ct_compare(res, name, out, ref, tol, kk);
            if (kind == T_NEAR && n == 256) ct_discriminate(res, name, alt, ref, tol, kk);
        }
    }
}

/* ---- timing on a fixed shape ---- */

static double time_op(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    enum { N = 4096 };
    static float a[N], b[N], c[N * 64], d[N * 64], sc[N];
    for (int i = 0; i < N; i++) a[i] = b[i] = (float)i / N;
    for (int i = 0; i < N * 64; i++) c[i] = d[i] = 0.001f * (float)(i % 97);
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ct_now_ms();
        switch (k->variant) {
        case OP_RMS: dr_op_rms_norm(a, b, 1e-6f, N, sc); break;
        case OP_L2: dr_op_l2norm(a, N, 1e-6f, 1.0f); break;
        case OP_SOFTMAX: dr_op_softmax(a, N); break;
        case OP_ROPE_HALF: dr_op_rope_half(a, 32, b, b + 32); break;
        case OP_ROPE_INTER: dr_op_rope_interleaved(a, 32, b, b + 32); break;
        case OP_ATTEND: dr_op_attend(a, c, d, 1024, 64, 64, 0.125f, sc, b); break;
        case OP_CONV: dr_op_conv_step(c, a, d, NULL, 4, N, 0, N, b); break;
        case OP_GDN: dr_op_gdn_step(c, a, b, a, -0.1f, 0.5f, 128, 128, sc, b + 1024); break;
        case OP_TOPK: {
            int ids[8];
            dr_op_topk(a, 256, 8, ids);
            break;
        }
        default: break;
        }
        double dt = ct_now_ms() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static const char *const op_time_shape[OP_COUNT] = {"n=4096",     "n=4096",  "n=4096",
                                                    "half=32",    "half=32", "n_pos=1024 hd=64",
                                                    "K=4 C=4096", "128x128", "n=256 k=8"};
static const double op_limit_ms[OP_COUNT] = {0.05, 0.05, 0.2, 0.01, 0.01, 0.5, 0.1, 0.2, 0.05};

static ct_check_fn op_check(int op) {
    switch (op) {
    case OP_RMS:
    case OP_L2: return check_norm;
    case OP_SOFTMAX: return check_softmax;
    case OP_ROPE_HALF:
    case OP_ROPE_INTER: return check_rope;
    case OP_ATTEND: return check_attend;
    case OP_CONV: return check_conv;
    case OP_TOPK: return check_topk;
    default: return check_gdn;
    }
}

int ct_ops_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int op = 0; op < OP_COUNT && n < max; op++, n++)
        out[n] = (ct_kernel){.name = op_names[op], .backend = "cpu", .precision = op_precision[op],
                             .check = op_check(op), .time = time_op, .time_shape = op_time_shape[op],
                             .limit_ms = op_limit_ms[op], .variant = op};
    return n;
}

int ct_ops_controls(ct_kernel *out, int max) {
    const struct { int op, control; const char *desc; } c[] = {
        {OP_RMS, OC_NO_EPS, "epsilon left out"},
        {OP_L2, OC_NO_EPS, "epsilon left out"},
        {OP_ROPE_HALF, OC_WRONG_PAIRS, "interleaved pairs instead of halves"},
        {OP_ROPE_INTER, OC_WRONG_PAIRS, "halves instead of interleaved pairs"},
        {OP_ATTEND, OC_DROP_LAST, "newest cache position left out"},
        {OP_SOFTMAX, OC_NO_MAX, "no max subtraction"},
        {OP_CONV, OC_NO_SHIFT, "window not advanced"},
        {OP_GDN, OC_NO_DECAY, "state decay skipped"},
        {OP_TOPK, OC_TIES_HIGH, "ties to the higher index"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = op_names[c[i].op], .backend = "cpu/control", .precision = op_precision[c[i].op],
                             .check = op_check(c[i].op), .variant = c[i].op, .control = c[i].control,
                             .control_desc = c[i].desc};
    return n;
}
