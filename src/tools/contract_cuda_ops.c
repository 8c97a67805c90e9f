/* contract_cuda_ops.c - `drama contract` entries for the CUDA activation kernels of
 * backend/cuda/cuda_ops.h that carry no weights of their own: RMS norm, the input embedding, the
 * tower layer input, guidance, the attention preparation (q/k norm, RoPE, K/V append), the split
 * attention, and dr_expf_det on the device. References are float64 from MODEL.md's formulas with
 * running error bounds (contract_ev.h); controls plant a defect through the kernel's own
 * arguments (epsilon 0, the other RoPE pairing, ...), as the CPU op controls do.
 * docs/contract.md "CUDA kernels". */
#include "tools/contract_cuda_internal.h"

#ifndef DRAMA_HAVE_CUDA

int ct_cuda_ops_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}
int ct_cuda_ops_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "num/expf_det.h"
#include "tools/contract_ev.h"

#define U CT_U32
#define TINY 0x1p-140

/* a device call's status into the case: a failure marks the case */
static void cu_call(cu_t *t, drama_status st) {
    if (st) t->failed = 1;
}

/* ---- fixtures ---- */

enum { CO_RMS, CO_EMBED, CO_TIN, CO_GUIDE, CO_PREP, CO_ATTN, CO_EXPF, CO_COUNT };
static const char *const co_names[CO_COUNT] = {"rms_norm", "embed", "tower_input", "guidance",
                                               "attn_prep", "attention", "expf_det"};
static const char *const co_precision[CO_COUNT] = {
    "dr_op_rms_norm on the device: double sum of squares, r rounded once, two fp32 products; tol = 2x running bound",
    "token row / double sum of token and code rows times scale, rounded once; tol = u|y| + scale (sum u m_t + (m+2) 2^-53 sum|t|)",
    "concat(enorm(E[code]), hnorm(h)) (mask, order); rms norms as rms_norm; tol = 2x running bound",
    "c + gamma (c - u) in fp32, -inf cond kept; tol = 2x running bound",
    "q/k rms norm, RoPE (double angle, fp32 cos/sin, fp32 rotation), K/V at pos; tol = 2x running bound, V exact",
    ("fp32 scores (dot, xor tree, scale), softmax and sums in double, split over 256-position blocks and merged, "
     "sigmoid gate; tol = 2 (sum_t p_t|v_t|(e_t + E) + (n+4) 2^-52 sum p|v| + u|o|)"),
    "one fixed double sequence (num/expf_det.h): device bits == host bits, and within 1 ulp of exp",
};

enum { CC_NONE = 0, CC_NO_EPS, CC_NO_SCALE, CC_SWAP_CONCAT, CC_GAMMA_SIGN, CC_PAIRING, CC_DROP_LAST, CC_DEVICE_EXPF, CC_STAGE_NEXT_V };


static void fill(uint64_t *s, int kind, float *x, int64_t n) {
    ct_fill_kind(s, kind, x, n);
    if (kind == X_NONFINITE && n > 2) x[n / 2] = NAN;
}

static void *xm(size_t n) { return calloc(n ? n : 1, 1); }

/* ---- rms_norm ---- */

static void rms_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int kind, int64_t dim, int with_w) {
    const int64_t n = 3, xld = dim + 3, yld = dim + 5;
    const double eps = 1e-6;
    float *x = xm((size_t)(n * xld) * 4), *w = xm((size_t)dim * 4), *y = xm((size_t)(n * yld) * 4);
    float *alt = xm((size_t)(n * yld) * 4);
    double *ref = xm((size_t)(n * yld) * 8), *tol = xm((size_t)(n * yld) * 8);
    ev *xe = xm((size_t)dim * sizeof(ev));
    fill(s, kind, x, n * xld);
    for (int64_t i = 0; i < dim; i++) w[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * xld;
        int has_nan = 0;
        float hs = 0;
        for (int64_t i = 0; i < dim; i++) {
            xe[i] = ev_in(xr[i]);
            has_nan |= isnan(xr[i]);
            hs = ct_h(hs + xr[i] * xr[i]);
        }
        ev rr = ev_rms_r(xe, dim, eps);
        float hr = (float)(1.0 / sqrt((double)hs / (double)dim + eps));
        for (int64_t i = 0; i < yld; i++) {
            int64_t o = r * yld + i;
            if (i >= dim) { /* the gap between rows: never written, the poison stays */
                ref[o] = NAN;
                tol[o] = 0;
                alt[o] = NAN;
                continue;
            }
            ev yv = ev_mul(xe[i], rr);
            if (with_w) yv = ev_mul(yv, ev_in(w[i]));
            ref[o] = has_nan ? NAN : yv.v;
            tol[o] = ev_tol(yv);
            alt[o] = xr[i] * hr * (with_w ? w[i] : 1.0f);
        }
    }
    float *dx = cu_put(t, x, (size_t)(n * xld) * 4), *dw = cu_put(t, w, (size_t)dim * 4);
    float *dy = cu_poison(t, (size_t)(n * yld) * 4);
    if (!t->failed)
        cu_call(t, dr_cuda_rms_norm(t->c, dx, xld, with_w ? dw : NULL, k->control == CC_NO_EPS ? 0.0 : eps, n, dim, dy,
                                    yld, &t->err));
    cu_get(t, y, dy, (size_t)(n * yld) * 4);
    char name[96];
    snprintf(name, sizeof name, "%s dim=%lld%s (3 strided rows)", ct_x_kind[kind], (long long)dim, with_w ? " weighted" : "");
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, n * yld);
        if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n * yld);
    }
    free(x), free(w), free(y), free(alt), free(ref), free(tol), free(xe);
}

static void check_rms(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x43524d53ull;
    const int64_t dims[] = {1, 7, 64, 1000, 2048};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            rms_case(k, &t, res, &s, kind, 4096, 1);
            continue;
        }
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) rms_case(k, &t, res, &s, kind, dims[i], (int)(i % 2));
    }
    cu_close(&t);
}

/* ---- embed ---- */

/* Tables: token [vocab][H] BF16, code table [NC V][H] in format f; rows are text and audio rows. */
static void embed_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int f, int64_t H, int kind,
                       int in_cb, int add_tok, int rsqrt_scale) {
    enum { VOCAB = 40, NC = 4, V = 6, SEM0 = 30, NSEM = 10, NROW = 7, W = 1 + NC };
    float *tsrc = xm((size_t)(VOCAB * H) * 4), *csrc = xm((size_t)(NC * V * H) * 4);
    fill(s, kind == X_RANGE ? X_RANGE : X_RANDOM, tsrc, VOCAB * H);
    fill(s, kind == X_RANGE ? X_RANGE : (kind == X_DISCR ? X_DISCR : X_RANDOM), csrc, NC * V * H);
    ct_w tw, cw;
    int ok = ct_w_make(&tw, CT_F_BF16, tsrc, VOCAB, H) == 0;
    ok = ct_w_make(&cw, f, csrc, NC * V, H) == 0 && ok;
    int32_t rows[NROW * W];
    for (int r = 0; r < NROW; r++) {
        int audio = r % 3 != 0;
        int32_t c0 = (int32_t)(ct_rand_u64(s) % V);
        rows[r * W] = audio ? SEM0 + c0 : (int32_t)(ct_rand_u64(s) % SEM0);
        rows[r * W + 1] = audio ? c0 : 0;
        for (int j = 1; j < NC; j++) rows[r * W + 1 + j] = audio ? (int32_t)(ct_rand_u64(s) % V) : 0;
    }
    double scale = rsqrt_scale ? 1.0 / sqrt((double)in_cb + 1.0) : 1.0;
    int64_t no = NROW * H;
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    for (int r = 0; r < NROW && ok; r++) {
        const int32_t *row = rows + r * W;
        int audio = row[0] >= SEM0 && row[0] < SEM0 + NSEM;
        for (int64_t j = 0; j < H; j++) {
            /* each row's fp32 dequantisation rounds once per product (scale, global scale; affine
             * twice: its magnitude counts both): u mag per term, then the double sum and scale */
            double sum = 0, mag = 0, dq = 0;
            float h = 0;
            int m = 0;
            if (!audio || add_tok) {
                double mg, v = ct_weight_ref(&tw.w, row[0], j, &mg);
                sum += v, mag += fabs(v), dq += U * mg, m++;
                h = ct_h(h + (float)v);
            }
            for (int c = 0; audio && c < in_cb; c++) {
                double mg, v = ct_weight_ref(&cw.w, row[1 + c] + (int64_t)c * V, j, &mg);
                sum += v, mag += fabs(v), dq += U * mg, m++;
                h = ct_h(h + (float)v);
            }
            int64_t o = (int64_t)r * H + j;
            ref[o] = audio ? sum * scale : sum;
            tol[o] = audio ? U * fabs(ref[o]) + (m + 2) * 0x1p-53 * scale * mag + dq * scale + TINY : dq + TINY;
            alt[o] = audio ? (float)(h * scale) : h;
        }
    }
    dr_cuda_embed_params p = {SEM0, NSEM, W, in_cb, V, add_tok, k->control == CC_NO_SCALE ? 1.0 : scale};
    dr_cuda_weight *dt = ok ? cu_weight(t, &tw.w) : NULL, *dc = ok ? cu_weight(t, &cw.w) : NULL;
    int32_t *drows = cu_put(t, rows, sizeof rows);
    float *dy = cu_poison(t, (size_t)no * 4);
    dr_cuda_status *dst = cu_zero(t, sizeof(dr_cuda_status));
    if (ok && !t->failed) cu_call(t, dr_cuda_embed(t->c, dt, dc, &p, drows, NROW, dy, dst, &t->err));
    cu_get(t, y, dy, (size_t)no * 4);
    if (!t->failed) cu_call(t, dr_cuda_status_check(t->c, dst, "embed", &t->err));
    /* a token outside the table and a code outside its codebook must be reported */
    int32_t bad[2 * W];
    memcpy(bad, rows + W, sizeof(int32_t) * W);
    memcpy(bad + W, rows + W, sizeof(int32_t) * W);
    bad[0] = VOCAB + 3;
    bad[W + 2] = V;
    int reported = 0;
    for (int b = 0; b < 2 && ok && !t->failed; b++) {
        int32_t *db = cu_put(t, bad + b * W, sizeof(int32_t) * W);
        if (!t->failed) cu_call(t, dr_cuda_embed(t->c, dt, dc, &p, db, 1, dy, dst, &t->err));
        drama_error e = {0};
        if (!t->failed) reported += dr_cuda_status_check(t->c, dst, "embed", &e) != DRAMA_OK;
    }
    char name[128];
    snprintf(name, sizeof name, "%s codes=%s H=%lld n=%d add_token=%d scale=%s", ct_x_kind[kind], ct_matmul_names[f] + 7,
             (long long)H, in_cb, add_tok, rsqrt_scale ? "rsqrt" : "1");
    if (!ok) ct_case_error(res, name, "could not build the tables");
    else if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
        /* the bad code sits in codebook 1: summed only when in_cb >= 2 */
        float rep = (float)reported;
        double want = 1 + (in_cb >= 2), zero = 0;
        ct_compare(res, "bad token and bad code reported", &rep, &want, &zero, 1);
    }
    cu_free_all(t);
    if (ok) ct_w_free(&tw), ct_w_free(&cw);
    free(tsrc), free(csrc), free(y), free(alt), free(ref), free(tol);
}

static void check_embed(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x454d4244ull;
    const int fmts[] = {CT_F_BF16, CT_F_FP8B, CT_F_NVFP4, CT_F_F32};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_NONFINITE || kind == X_TINY) continue; /* tables hold what the checkpoint holds */
        for (int i = 0; i < 4; i++)
            embed_case(k, &t, res, &s, fmts[i], i % 2 ? 64 : 112, kind, (i + kind) % 5, (i + kind) % 2, i != 3);
    }
    cu_close(&t);
}

/* ---- tower_input ---- */

static void tin_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int kind, int de, int dh, int slot,
                     int hidden_first, int mask_off) {
    enum { N = 4, NC = 3, V = 5 };
    const double eps = 1e-6;
    float *tsrc = xm((size_t)(NC * V * de) * 4), *h = xm((size_t)(N * dh) * 4), *en = xm((size_t)de * 4);
    float *hn = xm((size_t)dh * 4);
    fill(s, kind == X_DISCR ? X_DISCR : X_RANDOM, tsrc, NC * V * de);
    fill(s, kind, h, N * dh);
    for (int i = 0; i < de; i++) en[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
    for (int i = 0; i < dh; i++) hn[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
    ct_w tw;
    int ok = ct_w_make(&tw, CT_F_BF16, tsrc, NC * V, de) == 0;
    int32_t codes[N * NC];
    uint8_t mask[N] = {1, 0, 1, 1};
    for (int i = 0; i < N * NC; i++) codes[i] = (int32_t)(ct_rand_u64(s) % V);
    int64_t xw = de + dh, no = N * xw;
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    ev *buf = xm((size_t)(de > dh ? de : dh) * sizeof(ev));
    for (int r = 0; r < N && ok; r++) {
        int on = !mask_off && mask[r];
        for (int part = 0; part < 2; part++) { /* 0: the embedding half, 1: the hidden half */
            int d = part ? dh : de;
            int64_t off = (part ? !hidden_first : hidden_first) ? (part ? de : dh) : 0;
            const float *wn = part ? hn : en;
            int has_nan = 0;
            float hs = 0;
            for (int i = 0; i < d; i++) {
                double v = part ? h[r * dh + i] : on ? ct_weight_ref(&tw.w, codes[r * NC + slot] + (int64_t)slot * V, i, NULL) : 0;
                buf[i] = ev_in(v);
                has_nan |= isnan(v);
                hs = ct_h(hs + (float)(v * v));
            }
            ev rr = ev_rms_r(buf, d, eps);
            float hr = (float)(1.0 / sqrt((double)hs / d + eps));
            for (int i = 0; i < d; i++) {
                int64_t o = r * xw + off + i;
                ev yv = ev_mul(ev_mul(buf[i], rr), ev_in(wn[i]));
                ref[o] = has_nan ? NAN : yv.v;
                tol[o] = ev_tol(yv);
                alt[o] = (float)buf[i].v * hr * wn[i];
            }
        }
    }
    dr_cuda_weight *dt = ok ? cu_weight(t, &tw.w) : NULL;
    float *den = cu_put(t, en, (size_t)de * 4), *dhn = cu_put(t, hn, (size_t)dh * 4), *dh_ = cu_put(t, h, (size_t)(N * dh) * 4);
    int32_t *dcodes = cu_put(t, codes, sizeof codes);
    uint8_t *dmask = cu_put(t, mask, sizeof mask);
    float *dx = cu_poison(t, (size_t)no * 4);
    dr_cuda_status *dst = cu_zero(t, sizeof(dr_cuda_status));
    int hf = k->control == CC_SWAP_CONCAT ? !hidden_first : hidden_first;
    dr_cuda_tower_in p = {dt, V, slot, den, dhn, de, dh, eps, hf, mask_off};
    if (ok && !t->failed) cu_call(t, dr_cuda_tower_input(t->c, &p, N, dcodes + slot, NC, dmask, dh_, dx, dst, &t->err));
    cu_get(t, y, dx, (size_t)no * 4);
    if (!t->failed) cu_call(t, dr_cuda_status_check(t->c, dst, "tower input", &t->err));
    char name[128];
    snprintf(name, sizeof name, "%s de=%d dh=%d slot=%d %s%s", ct_x_kind[kind], de, dh, slot,
             hidden_first ? "hidden_first" : "emb_first", mask_off ? " mask_off" : "");
    if (!ok) ct_case_error(res, name, "could not build the table");
    else if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    }
    cu_free_all(t);
    if (ok) ct_w_free(&tw);
    free(tsrc), free(h), free(en), free(hn), free(y), free(alt), free(ref), free(tol), free(buf);
}

static void check_tin(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x54494eull;
    for (int kind = 0; kind < X_KINDS; kind++) {
        tin_case(k, &t, res, &s, kind, 32, 64, 0, 0, 0);
        tin_case(k, &t, res, &s, kind, 48, 37, 2, 1, 0);
        if (kind == X_RANDOM) tin_case(k, &t, res, &s, kind, 32, 64, 1, 0, 1);
        if (kind == X_DISCR) tin_case(k, &t, res, &s, kind, 64, 4096, 1, 1, 0);
    }
    cu_close(&t);
}

/* ---- guidance ---- */

static void guide_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int kind, int64_t m, float gamma) {
    const int64_t n = 2, ld = m + 3, no = n * ld;
    float *c = xm((size_t)no * 4), *u = xm((size_t)no * 4), *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, c, no);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, u, no);
    if (kind == X_DISCR)
        for (int64_t i = 0; i < no; i++) u[i] = c[i] - 0.01f * u[i];
    for (int64_t i = 0; i < no; i += 5) c[i] = -INFINITY; /* excluded candidates */
    if (kind == X_NONFINITE && m > 3) u[2] = INFINITY, u[3] = NAN;
    for (int64_t i = 0; i < no; i++) {
        if (i % ld >= m) {
            ref[i] = c[i]; /* outside the m logits: the buffer is the cond input, left alone */
            tol[i] = 0;
            alt[i] = c[i];
            continue;
        }
        if (isinf(c[i]) && c[i] < 0) {
            ref[i] = -INFINITY, tol[i] = 0, alt[i] = -INFINITY;
            continue;
        }
        ev yv = ev_add(ev_in(c[i]), ev_mul(ev_in(gamma), ev_sub(ev_in(c[i]), ev_in(u[i]))));
        ref[i] = yv.v;
        tol[i] = ev_tol(yv);
        alt[i] = c[i] + gamma * ct_h(c[i] - u[i]);
    }
    float *dc = cu_put(t, c, (size_t)no * 4), *du = cu_put(t, u, (size_t)no * 4);
    if (!t->failed)
        cu_call(t, dr_cuda_guidance(t->c, dc, du, n, m, ld, k->control == CC_GAMMA_SIGN ? -gamma : gamma, dc, &t->err));
    cu_get(t, y, dc, (size_t)no * 4);
    char name[96];
    snprintf(name, sizeof name, "%s m=%lld gamma=%g (in place, 2 rows)", ct_x_kind[kind], (long long)m, (double)gamma);
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    }
    free(c), free(u), free(y), free(alt), free(ref), free(tol);
}

static void check_guide(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x47554944ull;
    const int64_t ms[] = {1, 7, 4097};
    const float gs[] = {0.0f, 0.5f, 3.0f};
    for (int kind = 0; kind < X_KINDS; kind++)
        for (int i = 0; i < 3; i++) guide_case(k, &t, res, &s, kind, ms[i], kind == X_DISCR ? 5.0f : gs[(i + kind) % 3]);
    cu_close(&t);
}

/* ---- attn_prep ---- */

typedef struct prep_shape {
    int nh, nkv, hd, half, inter, qnorm, knorm, fused; /* fused: one qkv buffer (the tower's wqkv) */
} prep_shape;

static void prep_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, const prep_shape *ps, int prefill,
                      int kind) {
    enum { N = 3 };
    const int nh = ps->nh, nkv = ps->nkv, hd = ps->hd, half = ps->half;
    const int64_t kvd = (int64_t)nkv * hd, qw = ps->fused ? (int64_t)(nh + 2 * nkv) * hd : (int64_t)nh * 2 * hd;
    const int64_t q_hs = ps->fused ? hd : 2 * hd, kv_ld = ps->fused ? qw : kvd;
    int32_t pos[N], skip[N] = {0, prefill ? 0 : 1, 0};
    int64_t cap[N];
    for (int i = 0; i < N; i++) {
        pos[i] = prefill ? 4 + i : (i == 2 ? 70000 : 2 * i);
        cap[i] = prefill ? 8 : pos[i] + 1;
    }
    float *qin = xm((size_t)(N * qw) * 4), *kin = xm((size_t)(N * kvd) * 4), *vin = xm((size_t)(N * kvd) * 4);
    fill(s, kind, qin, N * qw);
    fill(s, kind, kin, N * kvd);
    fill(s, X_RANDOM, vin, N * kvd);
    if (ps->fused) /* k and v inside the qkv rows */
        for (int i = 0; i < N; i++) {
            memcpy(qin + i * qw + (int64_t)nh * hd, kin + i * kvd, (size_t)kvd * 4);
            memcpy(qin + i * qw + (int64_t)(nh + nkv) * hd, vin + i * kvd, (size_t)kvd * 4);
        }
    float *qn = xm((size_t)hd * 4), *kn = xm((size_t)hd * 4), *inv = xm((size_t)(half + 1) * 4);
    for (int i = 0; i < hd; i++) qn[i] = (float)(1 + 0.1 * ct_rand_normal(s)), kn[i] = (float)(1 + 0.1 * ct_rand_normal(s));
    for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(1e7, (double)i / half));
    /* outputs: q [N][nh][hd], then each row's cache K | V [cap][kvd] (the one cache once for a prefill) */
    int ncache = prefill ? 1 : N;
    int64_t nq = (int64_t)N * nh * hd, no = nq;
    int64_t coff[N];
    for (int i = 0; i < ncache; i++) coff[i] = no, no += 2 * cap[i] * kvd;
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    for (int64_t i = 0; i < no; i++) ref[i] = NAN, tol[i] = 0, alt[i] = NAN; /* untouched cache rows stay poison */
    ev *buf = xm((size_t)hd * sizeof(ev));
    for (int i = 0; i < N; i++) {
        for (int hh = 0; hh < nh + nkv; hh++) {
            int isk = hh >= nh;
            const float *src = isk ? (ps->fused ? qin + i * qw + (int64_t)nh * hd : kin + i * kvd) + (int64_t)(hh - nh) * hd
                                   : qin + i * qw + (int64_t)hh * q_hs;
            const float *w = isk ? (ps->knorm ? kn : NULL) : (ps->qnorm ? qn : NULL);
            if (isk && skip[i]) continue;
            for (int d = 0; d < hd; d++) buf[d] = ev_in(src[d]); /* a NaN propagates through the double values */
            if (w) {
                ev rr = ev_rms_r(buf, hd, 1e-6);
                for (int d = 0; d < hd; d++) buf[d] = ev_mul(ev_mul(buf[d], rr), ev_in(w[d]));
            }
            int64_t out = isk ? coff[prefill ? 0 : i] + (int64_t)pos[i] * kvd + (int64_t)(hh - nh) * hd
                              : ((int64_t)i * nh + hh) * hd;
            for (int d = 0; d < hd; d++) {
                ref[out + d] = buf[d].v;
                tol[out + d] = ev_tol(buf[d]);
                alt[out + d] = (float)buf[d].v;
            }
            for (int p = 0; p < half; p++) {
                int ia = ps->inter ? 2 * p : p, ib = ps->inter ? 2 * p + 1 : p + half;
                double ang = (double)pos[i] * (double)inv[p], cv = cos(ang), sv = sin(ang);
                ev c = {cv, U * fabs(cv) + 1e-15}, sn = {sv, U * fabs(sv) + 1e-15};
                ev a = buf[ia], b = buf[ib];
                ev ra = ev_sub(ev_mul(a, c), ev_mul(b, sn)), rb = ev_add(ev_mul(b, c), ev_mul(a, sn));
                ref[out + ia] = ra.v, tol[out + ia] = ev_tol(ra);
                ref[out + ib] = rb.v, tol[out + ib] = ev_tol(rb);
                float hc = ct_h((float)cv), hsn = ct_h((float)sv);
                alt[out + ia] = (float)a.v * hc - (float)b.v * hsn;
                alt[out + ib] = (float)b.v * hc + (float)a.v * hsn;
            }
        }
        if (!skip[i]) {
            const float *vs = ps->fused ? qin + i * qw + (int64_t)(nh + nkv) * hd : vin + i * kvd;
            int64_t out = coff[prefill ? 0 : i] + cap[prefill ? 0 : i] * kvd + (int64_t)pos[i] * kvd;
            for (int64_t d = 0; d < kvd; d++) ref[out + d] = vs[d], tol[out + d] = 0, alt[out + d] = vs[d];
        }
    }
    float *dq = cu_put(t, qin, (size_t)(N * qw) * 4), *dk = ps->fused ? NULL : cu_put(t, kin, (size_t)(N * kvd) * 4);
    float *dv = ps->fused ? NULL : cu_put(t, vin, (size_t)(N * kvd) * 4);
    float *dqn = cu_put(t, qn, (size_t)hd * 4), *dkn = cu_put(t, kn, (size_t)hd * 4), *dinv = cu_put(t, inv, (size_t)(half + 1) * 4);
    float *dqo = cu_poison(t, (size_t)nq * 4);
    void *kc[N], *vc[N];
    for (int i = 0; i < ncache; i++) {
        kc[i] = cu_poison(t, (size_t)(cap[i] * kvd) * 4);
        vc[i] = cu_poison(t, (size_t)(cap[i] * kvd) * 4);
    }
    for (int i = ncache; i < N; i++) kc[i] = kc[0], vc[i] = vc[0];
    void *dkc = cu_ptrs(t, kc, N), *dvc = cu_ptrs(t, vc, N);
    int32_t *dpos = cu_put(t, pos, sizeof pos), *dskip = cu_put(t, skip, sizeof skip);
    dr_cuda_attn_shape sh = {nh, nkv, hd, half, k->control == CC_PAIRING ? !ps->inter : ps->inter, dinv,
                             ps->qnorm ? dqn : NULL, ps->knorm ? dkn : NULL, 1e-6, 1.0 / sqrt((double)hd)};
    const float *kin_d = ps->fused ? dq + (int64_t)nh * hd : dk, *vin_d = ps->fused ? dq + (int64_t)(nh + nkv) * hd : dv;
    if (!t->failed)
        cu_call(t, dr_cuda_attn_prep(t->c, &sh, N, dq, qw, q_hs, kin_d, vin_d, kv_ld, dpos, (float *const *)dkc,
                                     (float *const *)dvc, dskip, dqo, &t->err));
    cu_get(t, y, dqo, (size_t)nq * 4);
    for (int i = 0; i < ncache; i++) {
        cu_get(t, y + coff[i], kc[i], (size_t)(cap[i] * kvd) * 4);
        cu_get(t, y + coff[i] + cap[i] * kvd, vc[i], (size_t)(cap[i] * kvd) * 4);
    }
    char name[128];
    snprintf(name, sizeof name, "%s nh=%d nkv=%d hd=%d R=%d %s%s%s%s", ct_x_kind[kind], nh, nkv, hd, 2 * half,
             ps->inter ? "interleaved" : "half", ps->qnorm ? " q_norm" : "", ps->fused ? " qkv" : "",
             prefill ? " prefill rows" : " 3 sessions (one skipped) pos 0,2,70000");
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (kind == X_DISCR || (kind == X_RANDOM && !prefill && hd == 64)) ct_discriminate(res, name, alt, ref, tol, no);
    }
    free(qin), free(kin), free(vin), free(qn), free(kn), free(inv), free(y), free(alt), free(ref), free(tol), free(buf);
}

static void check_prep(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x50524550ull;
    const prep_shape shapes[] = {{4, 2, 64, 8, 0, 1, 1, 0}, {4, 2, 32, 8, 1, 0, 0, 1}, {3, 1, 33, 5, 1, 1, 0, 0}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_RANGE || kind == X_DISCR) continue;
        for (int i = 0; i < 3; i++)
            for (int prefill = 0; prefill < 2; prefill++) prep_case(k, &t, res, &s, &shapes[i], prefill, kind);
    }
    cu_close(&t);
}

/* ---- attention ---- */

typedef struct attn_fx {
    int nh, nkv, hd, n, prefill, gated, special; /* special: 1 fp16-discriminating, 2 NaN value */
    int32_t np[4];        /* positions + 1 of each row (prefill: of the first row) */
    int64_t max_pos;
} attn_fx;

static void attn_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, const attn_fx *fx) {
    const int nh = fx->nh, nkv = fx->nkv, hd = fx->hd, n = fx->n, G = nh / nkv;
    const int64_t kvd = (int64_t)nkv * hd;
    int32_t pos[4];
    for (int i = 0; i < n; i++) pos[i] = fx->prefill ? fx->np[0] - 1 + i : fx->np[i] - 1;
    int ncache = fx->prefill ? 1 : n;
    int64_t cap = fx->max_pos;
    float *q = xm((size_t)(n * nh * hd) * 4), *gate = xm((size_t)(n * nh * hd) * 4);
    float *kcs[4], *vcs[4];
    for (int c = 0; c < ncache; c++) {
        kcs[c] = xm((size_t)(cap * kvd) * 4), vcs[c] = xm((size_t)(cap * kvd) * 4);
        fill(s, X_RANDOM, kcs[c], cap * kvd);
        fill(s, fx->special == 1 ? X_DISCR : X_RANDOM, vcs[c], cap * kvd);
        if (fx->special == 1) memset(kcs[c], 0, (size_t)(cap * kvd) * 4);
    }
    fill(s, X_RANDOM, q, n * nh * hd);
    for (int64_t i = 0; i < n * nh * hd; i++) q[i] *= 0.5f;
    fill(s, X_RANDOM, gate, n * nh * hd);
    if (fx->special == 2) vcs[n - 1][7 * kvd + 3] = NAN; /* inside the last row's window only */
    int64_t no = (int64_t)n * nh * hd;
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    double *sc = xm((size_t)cap * 8), *es = xm((size_t)cap * 8), *p = xm((size_t)cap * 8);
    for (int i = 0; i < n; i++) {
        const float *kc = kcs[fx->prefill ? 0 : i], *vc = vcs[fx->prefill ? 0 : i];
        int np = pos[i] + 1;
        for (int j = 0; j < nh; j++) {
            int m = j / G;
            const float *qj = q + ((int64_t)i * nh + j) * hd;
            double mx = -INFINITY, sum = 0, E = 0;
            double scale = 1.0 / sqrt((double)hd);
            for (int tt = 0; tt < np; tt++) {
                double d = 0, mag = 0;
                for (int e = 0; e < hd; e++) {
                    double pr = (double)qj[e] * kc[(int64_t)tt * kvd + (int64_t)m * hd + e];
                    d += pr, mag += fabs(pr);
                }
                sc[tt] = d * (double)(float)scale;
                es[tt] = U * fabs(sc[tt]) + (hd + 7) * U * mag * scale; /* fp32 dot, tree, scale */
                if (sc[tt] > mx) mx = sc[tt];
            }
            for (int tt = 0; tt < np; tt++) sum += exp(sc[tt] - mx);
            for (int tt = 0; tt < np; tt++) p[tt] = exp(sc[tt] - mx) / sum, E += p[tt] * es[tt];
            for (int e = 0; e < hd; e++) {
                double o = 0, dlt = 0, mag = 0;
                float h = 0;
                for (int tt = 0; tt < np; tt++) {
                    double v = vc[(int64_t)tt * kvd + (int64_t)m * hd + e];
                    o += p[tt] * v;
                    dlt += p[tt] * fabs(v) * (es[tt] + E);
                    mag += p[tt] * fabs(v);
                    h = ct_h(h + (float)p[tt] * (float)v);
                }
                ev ov = {o, dlt + (np + 4) * 0x1p-52 * mag + U * fabs(o)};
                int64_t idx = ((int64_t)i * nh + j) * hd + e;
                if (fx->gated) {
                    ov = ev_mul(ov, ev_sigmoid(ev_in(gate[idx])));
                    h = h * (float)(1.0 / (1.0 + exp(-(double)gate[idx])));
                }
                ref[idx] = ov.v;
                tol[idx] = ev_tol(ov);
                alt[idx] = h;
            }
        }
    }
    float *dq = cu_put(t, q, (size_t)no * 4), *dg = cu_put(t, gate, (size_t)no * 4), *dy = cu_poison(t, (size_t)no * 4);
    void *kc[4], *vc[4];
    for (int c = 0; c < ncache; c++) {
        kc[c] = cu_put(t, kcs[c], (size_t)(cap * kvd) * 4);
        vc[c] = cu_put(t, vcs[c], (size_t)(cap * kvd) * 4);
    }
    for (int c = ncache; c < n; c++) kc[c] = kc[0], vc[c] = vc[0];
    void *dkc = cu_ptrs(t, kc, n), *dvc = cu_ptrs(t, vc, n);
    int32_t dpos_h[4];
    for (int i = 0; i < n; i++) dpos_h[i] = k->control == CC_DROP_LAST ? pos[i] - 1 : pos[i];
    int32_t *dpos = cu_put(t, dpos_h, sizeof dpos_h);
    dr_cuda_attn_shape sh = {nh, nkv, hd, 0, 0, NULL, NULL, NULL, 1e-6, 1.0 / sqrt((double)hd)};
    size_t wsb = dr_cuda_attn_ws_bytes(&sh, n, fx->max_pos);
    void *ws = cu_alloc(t, wsb);
    dr_cuda_attn_plant_defect(k->control == CC_STAGE_NEXT_V);
    if (!t->failed)
        cu_call(t, dr_cuda_attn(t->c, &sh, n, dq, dpos, (float *const *)dkc, (float *const *)dvc, fx->max_pos,
                                fx->gated ? dg : NULL, (int64_t)nh * hd, hd, ws, wsb, dy, &t->err));
    dr_cuda_attn_plant_defect(0);
    cu_get(t, y, dy, (size_t)no * 4);
    char name[128];
    snprintf(name, sizeof name, "%s nh=%d nkv=%d hd=%d %s n_pos=%d%s%s max_pos=%lld",
             fx->special == 1 ? "fp16-discriminating" : fx->special == 2 ? "nan-in-v" : "random", nh, nkv, hd,
             fx->prefill ? "prefill" : "sessions", fx->np[fx->prefill ? 0 : n - 1], fx->prefill ? "+" : "",
             fx->gated ? " gated" : "", (long long)fx->max_pos);
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (fx->special == 1) ct_discriminate(res, name, alt, ref, tol, no);
    }
    for (int c = 0; c < ncache; c++) free(kcs[c]), free(vcs[c]);
    free(q), free(gate), free(y), free(alt), free(ref), free(tol), free(sc), free(es), free(p);
}

static void check_attn(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x4154544eull;
    const attn_fx fx[] = {
        {4, 2, 64, 2, 0, 1, 0, {1, 600}, 1024},      {8, 1, 33, 2, 0, 0, 0, {3, 257}, 300},
        {2, 2, 256, 4, 1, 1, 0, {38}, 64},           {16, 2, 256, 1, 0, 1, 0, {1000}, 4096},
        {1, 1, 16, 1, 0, 0, 1, {4096}, 4096},        {2, 1, 8, 2, 0, 0, 2, {5, 9}, 16},
        /* 32 splits of 320 positions: two tiles per block, the second of two staged sub-tiles */
        {4, 2, 64, 1, 0, 1, 0, {10000}, 10240},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) attn_case(k, &t, res, &s, &fx[i]);
    cu_close(&t);
}

/* ---- expf_det ---- */

static void check_expf(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    (void)ctx;
    cu_t t;
    if (cu_open(&t, res)) return;
    /* every 97th fp32 bit pattern from -104 to 89 and the special values */
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -103.97f, -103.972f, 88.72f, 88.7228f, 1e-40f, -1e-40f};
    int64_t nneg = (0xC2D00000u - 0x80000000u) / 97, npos = 0x42B20000u / 97, nsp = sizeof special / sizeof special[0];
    int64_t n = nneg + npos + nsp;
    float *x = xm((size_t)n * 4), *y = xm((size_t)n * 4);
    int64_t m = 0;
    for (int64_t i = 0; i < nneg; i++) {
        uint32_t b = 0x80000000u + (uint32_t)(i * 97);
        memcpy(&x[m++], &b, 4);
    }
    for (int64_t i = 0; i < npos; i++) {
        uint32_t b = (uint32_t)(i * 97);
        memcpy(&x[m++], &b, 4);
    }
    for (int64_t i = 0; i < nsp; i++) x[m++] = special[i];
    float *dx = cu_put(&t, x, (size_t)n * 4), *dy = cu_poison(&t, (size_t)n * 4);
    if (!t.failed) cu_call(&t, dr_cuda_expf_det_eval(t.c, dx, n, dy, k->control == CC_DEVICE_EXPF, &t.err));
    cu_get(&t, y, dy, (size_t)n * 4);
    if (!cu_case_end(&t, res, "expf_det over [-104, 89]")) {
        /* bit equality with the host, in chunks (one case per 2^22 values) */
        enum { CH = 1 << 22 };
        float *hb = xm((size_t)CH * 4), *alt = xm((size_t)CH * 4);
        double *ref = xm((size_t)CH * 8), *tol = xm((size_t)CH * 8), *tol0 = xm((size_t)CH * 8);
        for (int64_t c0 = 0; c0 < n; c0 += CH) {
            int64_t cn = n - c0 < CH ? n - c0 : CH;
            for (int64_t i = 0; i < cn; i++) {
                float xi = x[c0 + i], h = dr_expf_det(xi);
                hb[i] = h;
                double e = exp((double)xi);
                if (e >= 0x1.ffffffp127) e = INFINITY; /* beyond FLT_MAX + half an ulp: fp32 exp is inf */
                ref[i] = e;
                tol[i] = 2 * U * fabs(e) + 0x1p-149; /* one ulp */
                tol0[i] = 0;
                alt[i] = ct_h(h);
            }
            char name[96];
            snprintf(name, sizeof name, "values %lld..%lld: device bits == host bits", (long long)c0, (long long)(c0 + cn));
            double *hd = ref; /* reuse: the host bits as the reference of the exact case */
            double *hostref = xm((size_t)cn * 8);
            for (int64_t i = 0; i < cn; i++) hostref[i] = hb[i];
            ct_compare(res, name, y + c0, hostref, tol0, cn);
            snprintf(name, sizeof name, "values %lld..%lld: within 1 ulp of exp", (long long)c0, (long long)(c0 + cn));
            ct_compare(res, name, y + c0, hd, tol, cn);
            ct_discriminate(res, name, alt, hd, tol, cn);
            free(hostref);
        }
        free(hb), free(alt), free(ref), free(tol), free(tol0);
    }
    free(x), free(y);
    cu_close(&t);
}

/* ---- timing on the full model's shapes ---- */

typedef struct op_timed {
    cu_t *t;
    dr_cuda_attn_shape sh;
    float *x, *y, *w, *q;
    void *kc, *vc, *ws;
    size_t wsb;
    int32_t *pos;
} op_timed;

static drama_status timed_rms(void *arg) {
    op_timed *o = arg;
    return dr_cuda_rms_norm(o->t->c, o->x, 2048, o->w, 1e-6, 1, 2048, o->y, 2048, &o->t->err);
}

static drama_status timed_attn(void *arg) {
    op_timed *o = arg;
    return dr_cuda_attn(o->t->c, &o->sh, 1, o->q, o->pos, (float *const *)o->kc, (float *const *)o->vc, 4096, o->y,
                        512 * 16, 512, o->ws, o->wsb, o->x, &o->t->err);
}

static double time_op(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    cu_t t;
    ct_result r = {0};
    if (cu_open(&t, &r)) return INFINITY;
    op_timed o = {&t, {16, 2, 256, 32, 0, NULL, NULL, NULL, 1e-6, 1.0 / 16}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL};
    double ms = INFINITY;
    int32_t pos = 999;
    o.x = cu_zero(&t, 2048 * 16 * 4), o.y = cu_zero(&t, 2048 * 16 * 4), o.w = cu_zero(&t, 2048 * 4);
    o.q = cu_zero(&t, 16 * 256 * 4), o.pos = cu_put(&t, &pos, 4);
    if (k->variant == CO_RMS) ms = cu_time(&t, timed_rms, &o);
    if (k->variant == CO_ATTN) {
        void *kc = cu_zero(&t, (size_t)4096 * 512 * 4), *vc = cu_zero(&t, (size_t)4096 * 512 * 4);
        o.kc = cu_ptrs(&t, &kc, 1), o.vc = cu_ptrs(&t, &vc, 1);
        o.wsb = dr_cuda_attn_ws_bytes(&o.sh, 1, 4096);
        o.ws = cu_zero(&t, o.wsb);
        ms = cu_time(&t, timed_attn, &o);
    }
    cu_close(&t);
    return ms;
}

/* ---- registry ---- */

static ct_check_fn co_check(int v) {
    switch (v) {
    case CO_RMS: return check_rms;
    case CO_EMBED: return check_embed;
    case CO_TIN: return check_tin;
    case CO_GUIDE: return check_guide;
    case CO_PREP: return check_prep;
    case CO_ATTN: return check_attn;
    default: return check_expf;
    }
}

int ct_cuda_ops_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < CO_COUNT && n < max; v++, n++)
        out[n] = (ct_kernel){.name = co_names[v], .backend = "cuda", .precision = co_precision[v], .check = co_check(v),
                             .variant = v, .unavailable = cu_unavailable};
    /* times on the frame's shapes: reported, never a verdict (the limits are generous) */
    out[CO_RMS].time = out[CO_ATTN].time = time_op;
    out[CO_RMS].time_shape = "[1, 2048]";
    out[CO_RMS].limit_ms = 0.02;
    out[CO_ATTN].time_shape = "16 heads x 256, 2 KV heads, 1000 positions (cache 4096)";
    out[CO_ATTN].limit_ms = 0.1;
    return n;
}

int ct_cuda_ops_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {CO_RMS, CC_NO_EPS, "device: epsilon 0"},
        {CO_EMBED, CC_NO_SCALE, "device: code sum not scaled"},
        {CO_TIN, CC_SWAP_CONCAT, "device: halves concatenated in the other order"},
        {CO_GUIDE, CC_GAMMA_SIGN, "device: gamma with the wrong sign"},
        {CO_PREP, CC_PAIRING, "device: the other RoPE pairing"},
        {CO_ATTN, CC_DROP_LAST, "device: newest cache position left out"},
        {CO_ATTN, CC_STAGE_NEXT_V, "device: each staged V row taken from the next position"},
        {CO_EXPF, CC_DEVICE_EXPF, "device: the device's expf instead of dr_expf_det"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = co_names[c[i].v], .backend = "cuda/control", .precision = co_precision[c[i].v],
                             .check = co_check(c[i].v), .variant = c[i].v, .control = c[i].control,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
