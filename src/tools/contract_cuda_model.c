/* contract_cuda_model.c - `drama contract` entries for the CUDA kernels of the model's layers
 * (backend/cuda/cuda_ops.h): the DeltaNet conv and recurrence, the whole MoE layer for every
 * stored expert format (per-expert, fused 3-D, pruned), the SwiGLU product pair, and the sampler,
 * whose draws must equal the CPU's (gen/sampler.c) exactly. References are float64 with running
 * error bounds (contract_ev.h) on weights decoded from their stored bytes (contract_matmul.c);
 * controls plant defects through the kernels' arguments. docs/contract.md "CUDA kernels". */
#include "tools/contract_cuda_internal.h"

#ifndef DRAMA_HAVE_CUDA

int ct_cuda_model_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}
int ct_cuda_model_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "base/philox.h"
#include "backend/cpu/cpu_backend.h"
#include "gen/sampler.h"
#include "num/expf_det.h"
#include "tools/contract_ev.h"

#define U CT_U32

enum { CM_CONV, CM_RECUR, CM_SWIGLU, CM_SAMPLE, CM_FRAME, CM_MOE, CM_COUNT = CM_MOE + CT_CUDA_MOE_VARIANTS };
static const char *cm_name(int v) {
    static const char *const n[CM_MOE] = {"gdn_conv", "gdn_recur", "swiglu_matmul", "sample", "sample_frame"};
    return v < CM_MOE ? n[v] : ct_cuda_moe_name(v - CM_MOE);
}
static const char *cm_precision(int v) {
    switch (v) {
    case CM_CONV: return "fp32 bias + K products in order, then silu; window shifted exactly; tol = 2x running bound";
    case CM_RECUR:
        return ("l2-normalised q/k, gates, fp32 delta-rule recurrence (two partial sums per column), gated rms norm; "
                "tol = 2x running bound");
    case CM_SWIGLU: return "silu(x Wg^T) * (x Wu^T), products as dr_cuda_matmul; tol = 2x running bound";
    case CM_SAMPLE: return "exact: the CPU's dr_sample draw for the same logits, spec and u (tol 0)";
    case CM_FRAME: return "exact: the lane ops (guidance, semantic draw + redraw window, acoustic draws, counters, statuses) as the CPU backend's";
    default:
        return ("router, softmax/top-k (exact ids), experts' SwiGLU, down, weights, gated shared expert, residual; "
                "tol = 2x running bound over the stored weights");
    }
}

enum { KC_NONE = 0, KC_NO_SHIFT, KC_NO_DECAY, KC_SWAP, KC_RULES, KC_NO_RAS };
_Static_assert(CM_MOE == CT_CUDA_MOE_FIRST, "the MoE variants follow the other entries");

static void *xm(size_t n) { return calloc(n ? n : 1, 1); }
static void fillr(uint64_t *s, float *x, int64_t n, double scale, int positive) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(positive ? 0.5 + 0.5 * ct_rand_uniform(s) : scale * ct_rand_normal(s));
}
static void cu_call(cu_t *t, drama_status st) {
    if (st) t->failed = 1;
}

/* ---- gdn_conv ---- */

static void conv_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int nk, int dk, int nv, int dv, int K,
                      int prefill, int discr, int bias) {
    const int64_t C = 2 * (int64_t)nk * dk + (int64_t)nv * dv, uld = C + 2, wn = (int64_t)(K > 1 ? K - 1 : 1) * C;
    const int n = prefill ? 5 : 3, nwin = prefill ? 1 : 3;
    int32_t skip[5] = {0, prefill ? 0 : 1, 0, 0, 0};
    float *u = xm((size_t)(n * uld) * 4), *w = xm((size_t)(C * K) * 4), *b = xm((size_t)C * 4);
    float *win = xm((size_t)(nwin * wn) * 4), *cur = xm((size_t)(nwin * wn) * 4);
    fillr(s, u, n * uld, 1, discr);
    fillr(s, w, C * K, discr ? 1 : 0.5, discr);
    fillr(s, b, C, 0.1, 0);
    if (!bias) memset(b, 0, (size_t)C * 4); /* no conv1d.bias: the kernel starts from 0 */
    fillr(s, win, nwin * wn, 1, discr);
    memcpy(cur, win, (size_t)(nwin * wn) * 4);
    int64_t no = n * C + nwin * wn;
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    for (int i = 0; i < n; i++) {
        float *wi = cur + (prefill ? 0 : i) * wn;
        for (int64_t c = 0; c < C; c++) {
            ev acc = ev_in(b[c]);
            float h = b[c];
            for (int j = 0; j < K; j++) {
                float xv = j < K - 1 ? wi[(int64_t)j * C + c] : u[i * uld + c];
                acc = ev_add(acc, ev_mul(ev_in(w[c * K + j]), ev_in(xv)));
                h = ct_h(h + w[c * K + j] * xv);
            }
            ev yv = ev_silu(acc);
            ref[i * C + c] = yv.v;
            tol[i * C + c] = ev_tol(yv);
            alt[i * C + c] = h / (1.0f + expf(-h));
            if (!skip[i] && K > 1) {
                for (int j = 0; j + 1 < K - 1; j++) wi[(int64_t)j * C + c] = wi[(int64_t)(j + 1) * C + c];
                wi[(int64_t)(K - 2) * C + c] = u[i * uld + c];
            }
        }
    }
    for (int64_t e = 0; e < nwin * wn; e++) ref[n * C + e] = cur[e], tol[n * C + e] = 0, alt[n * C + e] = cur[e];
    float *du = cu_put(t, u, (size_t)(n * uld) * 4), *dw = cu_put(t, w, (size_t)(C * K) * 4), *db = cu_put(t, b, (size_t)C * 4);
    float *dy = cu_poison(t, (size_t)(n * C) * 4);
    void *wins[5];
    for (int i = 0; i < nwin; i++) wins[i] = cu_put(t, win + i * wn, (size_t)wn * 4);
    for (int i = nwin; i < n; i++) wins[i] = wins[0];
    void *dwins = cu_ptrs(t, wins, n);
    int32_t all[5] = {1, 1, 1, 1, 1};
    int32_t *dskip = cu_put(t, k->control == KC_NO_SHIFT ? all : skip, sizeof skip);
    dr_cuda_gdn_shape sh = {nk, dk, nv, dv, K, dw, bias ? db : NULL, NULL, NULL, NULL, 0, 1e-6};
    if (!t->failed) cu_call(t, dr_cuda_gdn_conv(t->c, &sh, n, du, uld, (float *const *)dwins, dskip, dy, &t->err));
    cu_get(t, y, dy, (size_t)(n * C) * 4);
    for (int i = 0; i < nwin; i++) cu_get(t, y + n * C + i * wn, wins[i], (size_t)wn * 4);
    char name[128];
    snprintf(name, sizeof name, "%s C=%lld K=%d%s %s", discr ? "fp16-discriminating" : "random", (long long)C, K,
             bias ? "" : " no bias", prefill ? "prefill (5 rows, one window)" : "3 sessions (one skipped)");
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        if (discr) ct_discriminate(res, name, alt, ref, tol, n * C);
    }
    free(u), free(w), free(b), free(win), free(cur), free(y), free(alt), free(ref), free(tol);
}

static void check_conv(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x43434f4eull;
    const int Ks[] = {1, 2, 4, 7, 10}; /* 10: a window beyond the kernel's registers (CONV_MAX_WIN), from memory */
    for (int i = 0; i < 5; i++)
        for (int prefill = 0; prefill < 2; prefill++)
            conv_case(k, &t, res, &s, i % 2 ? 1 : 2, i % 2 ? 5 : 8, i % 2 ? 3 : 4, i % 2 ? 7 : 8, Ks[i], prefill, 0, i != 1);
    conv_case(k, &t, res, &s, 4, 128, 8, 128, 7, 0, 1, 1);
    cu_close(&t);
}

/* ---- gdn_recur ---- */

static void rec_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int nk, int dk, int nv, int dv,
                     int prefill, int kind) {
    const int64_t qk = (int64_t)nk * dk, C = 2 * qk + (int64_t)nv * dv, vd = (int64_t)nv * dv, zld = vd + 1, abld = nv + 2;
    const int64_t sd = (int64_t)nv * dk * dv;
    const int n = prefill ? 4 : 2, nst = prefill ? 1 : 2, per_ch = dv % 2;
    int32_t skip[4] = {0, prefill ? 0 : 1, 0, 0};
    const int pos = kind == 4; /* fp16-discriminating: positive inputs, long positive sums */
    float *y = xm((size_t)(n * C) * 4), *z = xm((size_t)(n * zld) * 4), *a = xm((size_t)(n * abld) * 4);
    float *b = xm((size_t)(n * abld) * 4), *negA = xm((size_t)nv * 4), *dt = xm((size_t)nv * 4);
    float *nw = xm((size_t)vd * 4), *S0 = xm((size_t)(nst * sd) * 4);
    fillr(s, y, n * C, 1, pos);
    fillr(s, z, n * zld, 1, 0);
    fillr(s, a, n * abld, 1, 0);
    fillr(s, b, n * abld, 1, 0);
    for (int h = 0; h < nv; h++) negA[h] = -expf((float)(0.5 * ct_rand_normal(s))), dt[h] = (float)(0.5 * ct_rand_normal(s));
    for (int64_t i = 0; i < vd; i++) nw[i] = (float)(1 + 0.1 * ct_rand_normal(s));
    fillr(s, S0, nst * sd, 0.1, pos);
    if (kind == 3) y[(int64_t)(n - 1) * C + 1] = NAN; /* a q value of key head 0 in the last row */
    const float qscale = 1.0f / sqrtf((float)dk);
    int64_t no = n * vd + nst * sd;
    float *out = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    ev *st = xm((size_t)(nst * sd) * sizeof(ev)), *q = xm((size_t)dk * sizeof(ev)), *kk = xm((size_t)dk * sizeof(ev));
    ev *o = xm((size_t)dv * sizeof(ev));
    for (int64_t e = 0; e < nst * sd; e++) st[e] = ev_in(S0[e]);
    for (int i = 0; i < n; i++) {
        ev *S = st + (prefill ? 0 : i) * sd;
        ev *Ssave = NULL;
        if (skip[i]) { /* the skipped session's state must come back unchanged */
            Ssave = xm((size_t)sd * sizeof(ev));
            memcpy(Ssave, S, (size_t)sd * sizeof(ev));
        }
        const float *yi = y + (int64_t)i * C;
        for (int h = 0; h < nv; h++) {
            int kh = h / (nv / nk);
            ev_acc sq = {0}, sk = {0};
            for (int e = 0; e < dk; e++) {
                float qv = yi[(int64_t)kh * dk + e], kv = yi[qk + (int64_t)kh * dk + e];
                ev_acc_add(&sq, ev_in((double)qv * qv));
                ev_acc_add(&sk, ev_in((double)kv * kv));
            }
            ev ssq = ev_acc_get(&sq), ssk = ev_acc_get(&sk);
            ev rq = ev_mul(ev_rsqrt_of((ev){ssq.v + (double)1e-6f, ssq.e}), ev_in(qscale));
            ev rk = ev_rsqrt_of((ev){ssk.v + (double)1e-6f, ssk.e});
            for (int e = 0; e < dk; e++) {
                q[e] = ev_mul(ev_in(yi[(int64_t)kh * dk + e]), rq);
                kk[e] = ev_mul(ev_in(yi[qk + (int64_t)kh * dk + e]), rk);
            }
            ev g = ev_mul(ev_in(negA[h]), ev_softplus(ev_add(ev_in(a[i * abld + h]), ev_in(dt[h]))));
            ev beta = ev_sigmoid(ev_in(b[i * abld + h]));
            ev decay = ev_exp(g);
            ev_acc ss = {0};
            for (int j = 0; j < dv; j++) {
                ev_acc m = {0};
                float hm = 0;
                for (int e = 0; e < dk; e++) {
                    ev *se = &S[((int64_t)h * dk + e) * dv + j];
                    *se = ev_mul(*se, decay);
                    ev_acc_add(&m, ev_mul(*se, kk[e]));
                    hm = ct_h(hm + (float)se->v * (float)kk[e].v);
                }
                ev mv = ev_acc_get_f32(&m);
                ev dl = ev_mul(ev_sub(ev_in(yi[2 * qk + (int64_t)h * dv + j]), mv), beta);
                float hdl = (yi[2 * qk + (int64_t)h * dv + j] - hm) * (float)beta.v;
                ev_acc oa = {0};
                float ho = 0;
                for (int e = 0; e < dk; e++) {
                    ev *se = &S[((int64_t)h * dk + e) * dv + j];
                    float hs = (float)se->v + (float)kk[e].v * hdl;
                    *se = ev_add(*se, ev_mul(kk[e], dl));
                    ev_acc_add(&oa, ev_mul(*se, q[e]));
                    ho = ct_h(ho + hs * (float)q[e].v);
                }
                o[j] = ev_acc_get_f32(&oa);
                alt[(int64_t)i * vd + (int64_t)h * dv + j] = ho; /* fp16 sums, before the norm: scaled below */
                ev_acc_add(&ss, (ev){o[j].v * o[j].v, 2 * fabs(o[j].v) * o[j].e + o[j].e * o[j].e});
            }
            ev sv = ev_acc_get(&ss);
            ev r2 = ev_rsqrt_of((ev){sv.v / dv + 1e-6, sv.e / dv});
            for (int j = 0; j < dv; j++) {
                int64_t idx = (int64_t)i * vd + (int64_t)h * dv + j;
                float wj = nw[per_ch ? (int64_t)h * dv + j : j];
                ev yo = ev_mul(ev_mul(ev_mul(o[j], r2), ev_in(wj)), ev_silu(ev_in(z[i * zld + (int64_t)h * dv + j])));
                ref[idx] = yo.v;
                tol[idx] = ev_tol(yo);
                alt[idx] = (float)(alt[idx] * r2.v * wj * (z[i * zld + (int64_t)h * dv + j] /
                                                           (1.0 + exp(-(double)z[i * zld + (int64_t)h * dv + j]))));
            }
        }
        if (Ssave) {
            memcpy(S, Ssave, (size_t)sd * sizeof(ev));
            free(Ssave);
        }
    }
    for (int64_t e = 0; e < nst * sd; e++) {
        ref[n * vd + e] = st[e].v;
        tol[n * vd + e] = ev_tol(st[e]);
        alt[n * vd + e] = (float)st[e].v;
    }
    float *dy = cu_put(t, y, (size_t)(n * C) * 4), *dz = cu_put(t, z, (size_t)(n * zld) * 4);
    float *da = cu_put(t, a, (size_t)(n * abld) * 4), *db = cu_put(t, b, (size_t)(n * abld) * 4);
    float zero[64] = {0};
    float *dnegA = k->control == KC_NO_DECAY ? cu_put(t, zero, sizeof zero) : cu_put(t, negA, (size_t)nv * 4);
    float *ddt = cu_put(t, dt, (size_t)nv * 4), *dnw = cu_put(t, nw, (size_t)vd * 4), *dout = cu_poison(t, (size_t)(n * vd) * 4);
    void *sts[4];
    for (int i = 0; i < nst; i++) sts[i] = cu_put(t, S0 + i * sd, (size_t)sd * 4);
    for (int i = nst; i < n; i++) sts[i] = sts[0];
    void *dsts = cu_ptrs(t, sts, n);
    int32_t *dskip = cu_put(t, skip, sizeof skip);
    dr_cuda_gdn_shape sh = {nk, dk, nv, dv, 4, NULL, NULL, dnegA, ddt, dnw, per_ch, 1e-6};
    if (!t->failed)
        cu_call(t, dr_cuda_gdn_recur(t->c, &sh, n, prefill, dy, dz, zld, da, db, abld, (float *const *)dsts,
                                     prefill ? NULL : dskip, dout, &t->err));
    cu_get(t, out, dout, (size_t)(n * vd) * 4);
    for (int i = 0; i < nst; i++) cu_get(t, out + n * vd + i * sd, sts[i], (size_t)sd * 4);
    static const char *const kinds[] = {"random", "", "", "nan-in-q", "fp16-discriminating"};
    char name[128];
    snprintf(name, sizeof name, "%s nk=%d dk=%d nv=%d dv=%d%s %s", kinds[kind], nk, dk, nv, dv, per_ch ? " per-channel norm" : "",
             prefill ? "prefill (4 rows)" : "2 sessions (one skipped)");
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, out, ref, tol, no);
        if (kind == 4) ct_discriminate(res, name, alt, ref, tol, n * vd);
    }
    free(y), free(z), free(a), free(b), free(negA), free(dt), free(nw), free(S0), free(out), free(alt), free(ref);
    free(tol), free(st), free(q), free(kk), free(o);
}

static void check_recur(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x52454355ull;
    /* {1, 100, 2, 8}: more key dims than threads (2 dv rounded to a warp): q / k loaded by the loop */
    const int dims[][4] = {{1, 8, 1, 5}, {2, 32, 4, 32}, {1, 33, 2, 17}, {2, 128, 4, 128}, {1, 100, 2, 8}};
    for (int i = 0; i < 5; i++)
        for (int prefill = 0; prefill < 2; prefill++)
            rec_case(k, &t, res, &s, dims[i][0], dims[i][1], dims[i][2], dims[i][3], prefill, 0);
    rec_case(k, &t, res, &s, 2, 32, 4, 32, 1, 3);
    rec_case(k, &t, res, &s, 2, 128, 4, 128, 0, 4);
    cu_close(&t);
}

/* ---- swiglu_matmul ---- */

static void swiglu_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int f, int64_t F, int64_t D, int n) {
    float *wg = xm((size_t)(F * D) * 4), *wu = xm((size_t)(F * D) * 4), *x = xm((size_t)(n * D) * 4);
    fillr(s, wg, F * D, 0.2, 0);
    fillr(s, wu, F * D, 0.2, 0);
    fillr(s, x, n * D, 1, 0);
    ct_w g, u;
    int ok = ct_w_make(&g, f, wg, F, D) == 0;
    ok = ct_w_make(&u, f, wu, F, D) == 0 && ok;
    int64_t no = n * F;
    double *gr = xm((size_t)no * 8), *gt = xm((size_t)no * 8), *ur = xm((size_t)no * 8), *ut = xm((size_t)no * 8);
    double *ref = xm((size_t)no * 8), *tol = xm((size_t)no * 8);
    float *y = xm((size_t)no * 4), *alt = xm((size_t)no * 4);
    if (ok) {
        ct_matmul_reference(&g.w, x, n, 8, gr, gt, NULL);
        ct_matmul_reference(&u.w, x, n, 8, ur, ut, NULL);
        for (int64_t i = 0; i < no; i++) {
            ev a = ev_mul(ev_silu((ev){gr[i], gt[i]}), (ev){ur[i], ut[i]});
            ref[i] = a.v;
            tol[i] = ev_tol(a);
            alt[i] = (float)(gr[i] / (1.0 + ct_h((float)exp(-gr[i]))) * ur[i]);
        }
    }
    dr_cuda_weight *dg = ok ? cu_weight(t, &g.w) : NULL, *du = ok ? cu_weight(t, &u.w) : NULL;
    float *dx = cu_put(t, x, (size_t)(n * D) * 4), *dy = cu_poison(t, (size_t)no * 4);
    if (ok && !t->failed)
        cu_call(t, k->control == KC_SWAP ? dr_cuda_swiglu_matmul(t->c, du, dg, dx, n, dy, &t->err)
                                         : dr_cuda_swiglu_matmul(t->c, dg, du, dx, n, dy, &t->err));
    cu_get(t, y, dy, (size_t)no * 4);
    char name[96];
    snprintf(name, sizeof name, "%s [%lld,%lld] n=%d", ct_matmul_names[f], (long long)F, (long long)D, n);
    if (!ok) ct_case_error(res, name, "could not build the weights");
    else if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, no);
        ct_discriminate(res, name, alt, ref, tol, no);
    }
    cu_free_all(t);
    if (ok) ct_w_free(&g), ct_w_free(&u);
    free(wg), free(wu), free(x), free(gr), free(gt), free(ur), free(ut), free(ref), free(tol), free(y), free(alt);
}

static void check_swiglu(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x53574947ull;
    swiglu_case(k, &t, res, &s, CT_F_BF16, 96, 64, 3);
    swiglu_case(k, &t, res, &s, CT_F_FP8B, 130, 256, 2);
    swiglu_case(k, &t, res, &s, CT_F_NVFP4, 37, 160, 1);
    swiglu_case(k, &t, res, &s, CT_F_AFF4, 64, 128, 5);
    cu_close(&t);
}

/* ---- sampling ---- */

/* The CPU draw rule in fp16 (logits, weights and u rounded to fp16): the reduced-precision variant
 * that the exact comparison must tell apart (TEXT.md 5.1 otherwise). */
typedef struct { float l; int i; } alt_item;
static int alt_cmp(const void *a, const void *b) {
    const alt_item *x = a, *y = b;
    if (x->l > y->l) return -1;
    if (x->l < y->l) return 1;
    return (x->i > y->i) - (x->i < y->i);
}
static int alt_draw(const float *lg, int n, float T, float P, int K, int keep, double u) {
    alt_item *it = xm((size_t)n * sizeof *it);
    double *q = xm((size_t)n * 8);
    int m = 0, best = -1;
    for (int i = 0; i < n; i++)
        if (!isinf(lg[i])) {
            it[m].l = ct_h(lg[i]), it[m++].i = i;
            if (best < 0 || ct_h(lg[i]) > ct_h(lg[best])) best = i;
        }
    u = ct_h((float)u);
    int out = best;
    if (T > 0 && m > 0) {
        qsort(it, (size_t)m, sizeof *it, alt_cmp);
        int kept = K > 0 && K < m ? K : m;
        if (P < 1.0f) { /* dr_op_top_p_count over fp16-rounded weights */
            double z = 0, cum = 0;
            for (int r = 0; r < m; r++) q[r] = ct_h(dr_expf_det(it[r].l - it[0].l)), z += q[r];
            for (int r = 0; r < m; r++) {
                double prev = cum;
                cum += q[r] / z;
                if (keep ? (r > 0 && !(prev < P)) : (r > 0 && !(cum <= P))) {
                    if (r < kept) kept = r;
                    break;
                }
            }
        }
        double tot = 0, acc = 0;
        for (int r = 0; r < kept; r++) q[r] = ct_h(dr_expf_det((it[r].l - it[0].l) / T)), tot += q[r];
        out = it[kept - 1].i;
        for (int r = 0; r < kept; r++)
            if (u * tot < (acc += q[r])) {
                out = it[r].i;
                break;
            }
    }
    free(it), free(q);
    return out;
}

/* logit vectors of one kind */
static void sample_vec(uint64_t *s, int kind, float *x, int n) {
    for (int i = 0; i < n; i++) {
        double v = 3 * ct_rand_normal(s);
        switch (kind) {
        case 1: v = floor(v * 2) / 2; break;                    /* ties */
        case 2: v = (i % 7 == 3) ? -INFINITY : v; break;          /* excluded candidates */
        case 3: v = (i % 2) ? 0.0 : -0.0; break;                  /* all equal, signed zeros */
        case 4: v *= 1e29; break;                                 /* a huge range */
        case 5: v = (i == n / 3) ? 2.0 : -INFINITY; break;        /* one survivor */
        case 6: v = 0.05 * ct_rand_normal(s); break;              /* flat */
        default: break;
        }
        x[i] = (float)v;
    }
}

static void check_sample(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x53414d50ull;
    enum { NV = 9 }; /* 7 kinds + two extra random vectors with edge u */
    const int sizes[] = {1, 2, 7, 1024, 4097};
    const float Ts[] = {0.0f, 0.3f, 1.0f, 2.0f}, Ps[] = {0.5f, 0.9f, 1.0f};
    const int Ks[] = {0, 1, 30};
    dr_sample_ws ws;
    drama_error e = {0};
    if (dr_sample_ws_init(&ws, 4097, &e)) {
        ct_case_error(res, "workspace", e.message);
        cu_close(&t);
        return;
    }
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        float *lg = xm((size_t)(NV * n) * 4);
        double u[NV];
        for (int v = 0; v < NV; v++) {
            sample_vec(&s, v < 7 ? v : 0, lg + (int64_t)v * n, n);
            u[v] = v == 7 ? 0.0 : v == 8 ? 1.0 - 0x1p-53 : dr_philox_uniform(ctx->seed, (uint64_t)(si * 100 + v));
        }
        float *dl = cu_put(&t, lg, (size_t)(NV * n) * 4);
        double *du = cu_put(&t, u, sizeof u);
        int32_t *dout = cu_poison(&t, NV * 4);
        dr_cuda_status *dst = cu_zero(&t, sizeof(dr_cuda_status));
        float out[NV], alt[NV];
        double ref[NV], tol[NV] = {0};
        for (int ti = 0; ti < 4; ti++)
            for (int pi = 0; pi < 3; pi++)
                for (int ki = 0; ki < 3; ki++)
                    for (int rule = 0; rule < 4; rule++) { /* bit 1: the sequential sums only */
                        if (ti == 0 && (pi || ki || rule)) continue; /* argmax ignores the rest */
                        int32_t o[NV];
                        int drule = (k->control == KC_RULES ? !(rule & 1) : (rule & 1)) | (rule & 2);
                        if (!t.failed)
                            cu_call(&t, dr_cuda_sample_raw(t.c, dl, n, n, NV, Ts[ti], Ps[pi], Ks[ki], drule, du, dout, dst,
                                                           &t.err));
                        if (cu_get(&t, o, dout, sizeof o)) break;
                        dr_draw_spec sp = {Ts[ti], Ps[pi], Ks[ki], rule & 1 ? DR_TOPP_DROP_CROSSING : DR_TOPP_KEEP_CROSSING};
                        for (int v = 0; v < NV; v++) {
                            int r = -1;
                            if (dr_sample(lg + (int64_t)v * n, n, &sp, u[v], &ws, &r, "contract", &e)) r = -1;
                            ref[v] = r;
                            out[v] = (float)o[v];
                            alt[v] = (float)alt_draw(lg + (int64_t)v * n, n, Ts[ti], Ps[pi], Ks[ki], !(rule & 1), u[v]);
                        }
                        char name[112];
                        snprintf(name, sizeof name, "n=%d T=%g top_p=%g top_k=%d %s%s (9 vectors)", n, (double)Ts[ti],
                                 (double)Ps[pi], Ks[ki], rule & 1 ? "drop-crossing" : "keep-crossing",
                                 rule & 2 ? " sequential" : "");
                        ct_compare(res, name, out, ref, tol, NV);
                        if (n == 4097) ct_discriminate(res, name, alt, ref, tol, NV);
                    }
        /* a NaN after a +inf: the first of them is the one reported, as the CPU does */
        if (n >= 7 && !t.failed) {
            lg[2] = INFINITY, lg[5] = NAN;
            cu_call(&t, dr_cuda_to_device(t.c, dl, lg, (size_t)n * 4, &t.err));
            cu_call(&t, dr_cuda_sample_raw(t.c, dl, n, n, 1, 1.0f, 0.9f, 0, 0, du, dout, dst, &t.err));
            dr_cuda_status hs = {0};
            cu_get(&t, &hs, dst, sizeof hs);
            float got[2] = {(float)hs.code, (float)hs.a};
            double want[2] = {DR_CUDA_ERR_LOGIT_INF, 2}, z2[2] = {0, 0};
            ct_compare(res, "a +inf logit at 2 and a NaN at 5: error at candidate 2", got, want, z2, 2);
        }
        cu_case_end(&t, res, "sample");
        free(lg);
    }
    dr_sample_ws_free(&ws);
    cu_close(&t);
}


/* ---- the frame step's lane ops: guidance, semantic draws with the redraw window, acoustic draws,
 * counters and flags, against the CPU backend's ops on the same lanes ---- */

static void check_frame(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    enum { NL = 3, NCAND = 4097, HV = 1024, NC = 10, FRAMES = 40, NO = NL * (DR_MAX_CODEBOOKS + 8 + DR_RAS_MAX) };
    uint64_t s = ctx->seed ^ 0x4652414dull;
    dr_gen_lane hg[NL], dg_init[NL];
    memset(hg, 0, sizeof hg);
    for (int l = 0; l < NL; l++) dr_sampler_params_default(&hg[l].sp);
    hg[0].sp.seed = 12345;
    hg[1].sp.temperature = 0.7f, hg[1].sp.top_p = 0.95f, hg[1].sp.acoustic_top_k = 0, hg[1].sp.ras_window = 3;
    hg[1].sp.ras_temperature = 1.5f, hg[1].sp.ras_top_p = 0.5f, hg[1].sp.cfg_gamma = 0.5f, hg[1].sp.seed = ~(uint64_t)0;
    hg[2].sp.temperature = 0.0f, hg[2].sp.seed = 7;
    hg[0].draw = 0, hg[1].draw = 100, hg[2].draw = 5;
    memcpy(dg_init, hg, sizeof hg);
    if (k->control == KC_NO_RAS)
        for (int l = 0; l < NL; l++) dg_init[l].sp.ras_window = 0;
    size_t lb = (size_t)NCAND * 4;
    float *hl = xm(lb * 3 * NL), *hd = xm((size_t)(NC - 1) * NL * HV * 4);
    dr_gen_lane *dg = cu_put(&t, dg_init, sizeof dg_init);
    float *dl = cu_zero(&t, lb * 3 * NL), *dhd = cu_poison(&t, (size_t)(NC - 1) * NL * HV * 4);
    int32_t *dcodes = cu_zero(&t, (size_t)NL * DR_MAX_CODEBOOKS * 4), *dended = cu_zero(&t, NL * 4);
    dr_op_status *dst = cu_zero(&t, NL * sizeof(dr_op_status));
    dr_step_lane hlanes[NL], dlanes_h[NL];
    for (int l = 0; l < NL; l++) { /* per lane: cond | uncond | the drawn logits */
        hlanes[l] = (dr_step_lane){&hg[l], hl + (3 * l) * NCAND, hl + (3 * l + 1) * NCAND, hl + (3 * l + 2) * NCAND,
                                   NULL, NULL, l == 1, 0};
        dlanes_h[l] = (dr_step_lane){dg ? dg + l : NULL, dl ? dl + (3 * l) * NCAND : NULL,
                                     dl ? dl + (3 * l + 1) * NCAND : NULL, dl ? dl + (3 * l + 2) * NCAND : NULL,
                                     NULL, NULL, l == 1, 0};
    }
    dr_step_lane *dlanes = cu_put(&t, dlanes_h, sizeof dlanes_h);
    int32_t hcodes[NL * DR_MAX_CODEBOOKS], hended[NL];
    dr_op_status hst[NL];
    dr_step_io hio = {hcodes, hended, hst}, dio = {dcodes, dended, dst};
    dr_backend *cpu = dr_backend_cpu_memory();
    for (int f = 0; f < FRAMES && !t.failed; f++) {
        for (int l = 0; l < NL; l++) {
            float *x = hlanes[l].logits_c, *xu = hlanes[l].logits_u;
            for (int i = 0; i < NCAND; i++) {
                x[i] = (float)(l == 1 ? 0.05 * ct_rand_normal(&s) : ct_rand_normal(&s));
                xu[i] = (float)(l == 1 ? 0.05 * ct_rand_normal(&s) : 0.0);
            }
            if (l != 1) /* a few tokens win often: repeats, hence redraws */
                for (int j = 0; j < 3; j++) x[10 + (int)(ct_rand_u64(&s) % 4)] += 6.0f;
            x[NCAND - 1] = (l == 0 && f % 13 == 12) ? 30.0f : -2.0f; /* lane 0 ends now and then */
            if (f == 21 && l == 2) x[7] = NAN;                     /* a failed draw */
        }
        for (int64_t i = 0; i < (int64_t)(NC - 1) * NL * HV; i++) hd[i] = (float)(2 * ct_rand_normal(&s));
        cu_call(&t, dr_cuda_to_device(t.c, dl, hl, lb * 3 * NL, &t.err));
        cu_call(&t, dr_cuda_to_device(t.c, dhd, hd, (size_t)(NC - 1) * NL * HV * 4, &t.err));
        cu_call(&t, dr_cuda_memset(t.c, dst, 0, NL * sizeof(dr_op_status), &t.err));
        if (!t.failed) cu_call(&t, dr_cuda_lanes_guidance(t.c, dlanes, NL, NCAND, &t.err));
        if (!t.failed) cu_call(&t, dr_cuda_sample_semantic(t.c, dlanes, NL, NCAND, dio, &t.err));
        for (int j = 1; j < NC && !t.failed; j++)
            cu_call(&t, dr_cuda_sample_acoustic(t.c, dlanes, NL, j, dhd + (int64_t)(j - 1) * NL * HV, HV, dio, &t.err));
        int32_t codes[NL * DR_MAX_CODEBOOKS], ended[NL];
        dr_op_status dstat[NL];
        dr_gen_lane got[NL];
        if (cu_get(&t, codes, dcodes, sizeof codes) || cu_get(&t, ended, dended, sizeof ended) ||
            cu_get(&t, dstat, dst, sizeof dstat) || cu_get(&t, got, dg, sizeof got))
            break;
        /* the CPU backend's ops on the host lanes */
        memset(hst, 0, sizeof hst);
        dr_cpu_op_guidance(cpu, hlanes, NL, NCAND);
        dr_cpu_op_sample_semantic(cpu, hlanes, NL, NCAND, hio);
        for (int j = 1; j < NC; j++) dr_cpu_op_sample_acoustic(cpu, hlanes, NL, j, hd + (int64_t)(j - 1) * NL * HV, HV, hio);
        float out[NO], alt[NO];
        double ref[NO], tol[NO] = {0};
        int m = 0;
        for (int l = 0; l < NL; l++) {
            const dr_sampler_params *p = &hg[l].sp;
            int a0 = alt_draw(hlanes[l].logits, NCAND, p->temperature, p->top_p, p->semantic_top_k, 1,
                              dr_philox_uniform(p->seed, (hg[l].draw - 1) * 16));
            for (int j = 0; j < NC; j++, m++) {
                ref[m] = hcodes[l * DR_MAX_CODEBOOKS + j], out[m] = (float)codes[l * DR_MAX_CODEBOOKS + j];
                alt[m] = j == 0 && !hended[l] && !hst[l].code ? (float)a0 : (float)ref[m];
            }
            const double hv[8] = {hended[l], hst[l].code, hst[l].fault, hst[l].a, hst[l].b, (double)hst[l].c,
                                  (double)hst[l].d, (double)hg[l].draw};
            const double dv[8] = {ended[l], dstat[l].code, dstat[l].fault, dstat[l].a, dstat[l].b, (double)dstat[l].c,
                                  (double)dstat[l].d, (double)got[l].draw};
            for (int e = 0; e < 8; e++, m++) ref[m] = hv[e], out[m] = (float)dv[e], alt[m] = (float)hv[e];
            ref[m] = hg[l].window_len, out[m] = (float)got[l].window_len, alt[m] = (float)ref[m], m++;
            for (int e = 0; e < hg[l].window_len; e++, m++)
                ref[m] = hg[l].window[e], out[m] = (float)got[l].window[e], alt[m] = (float)ref[m];
        }
        char name[96];
        snprintf(name, sizeof name, "frame %d: codes, end, status, draw index, window of 3 lanes (one guided)", f);
        ct_compare(res, name, out, ref, tol, m);
        ct_discriminate(res, name, alt, ref, tol, m);
    }
    cu_case_end(&t, res, "sample_frame");
    free(hl), free(hd);
    cu_close(&t);
}

/* ---- timing on the full model's shapes ---- */

typedef struct model_timed {
    cu_t *t;
    dr_cuda_gdn_shape sh;
    float *u, *y, *z, *a, *b, *o, *lg;
    void *win, *st, *lanes;
    int32_t *codes;
    double *uu;
} model_timed;

static drama_status timed_conv(void *arg) {
    model_timed *m = arg;
    return dr_cuda_gdn_conv(m->t->c, &m->sh, 1, m->u, 8192, (float *const *)m->win, NULL, m->y, &m->t->err);
}
static drama_status timed_recur(void *arg) {
    model_timed *m = arg;
    return dr_cuda_gdn_recur(m->t->c, &m->sh, 1, 0, m->y, m->z, 4096, m->a, m->b, 32, (float *const *)m->st, NULL, m->o,
                             &m->t->err);
}
static drama_status timed_sample(void *arg) {
    model_timed *m = arg;
    return dr_cuda_sample_raw(m->t->c, m->lg, 4097, 4097, 1, 1.0f, 0.9f, 0, 0, m->uu, m->codes, NULL, &m->t->err);
}

static double time_model(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    cu_t t;
    ct_result r = {0};
    if (cu_open(&t, &r)) return INFINITY;
    model_timed m = {0};
    m.t = &t;
    uint64_t s = 5;
    float *h = xm((size_t)8192 * 4 * 4);
    fillr(&s, h, 8192 * 4, 1, 0);
    float *conv_w = cu_put(&t, h, 8192 * 4 * 4);
    m.sh = (dr_cuda_gdn_shape){16, 128, 32, 128, 4, conv_w, NULL, conv_w, conv_w, conv_w, 0, 1e-6};
    m.u = cu_put(&t, h, 8192 * 4), m.y = cu_put(&t, h, 8192 * 4), m.z = cu_put(&t, h, 4096 * 4);
    m.a = cu_put(&t, h, 32 * 4), m.b = cu_put(&t, h + 32, 32 * 4), m.o = cu_zero(&t, 4096 * 4);
    m.lg = cu_put(&t, h, 4097 * 4);
    void *win = cu_zero(&t, (size_t)3 * 8192 * 4), *st = cu_zero(&t, (size_t)32 * 128 * 128 * 4);
    m.win = cu_ptrs(&t, &win, 1), m.st = cu_ptrs(&t, &st, 1);
    double u = 0.37;
    m.uu = cu_put(&t, &u, 8), m.codes = cu_zero(&t, 64);
    double ms = INFINITY;
    if (k->variant == CM_CONV) ms = cu_time(&t, timed_conv, &m);
    if (k->variant == CM_RECUR) ms = cu_time(&t, timed_recur, &m);
    if (k->variant == CM_SAMPLE) ms = cu_time(&t, timed_sample, &m);
    free(h);
    cu_close(&t);
    return ms;
}

/* ---- registry ---- */

static ct_check_fn cm_check(int v) {
    switch (v) {
    case CM_CONV: return check_conv;
    case CM_RECUR: return check_recur;
    case CM_SWIGLU: return check_swiglu;
    case CM_SAMPLE: return check_sample;
    case CM_FRAME: return check_frame;
    default: return ct_cuda_check_moe;
    }
}

int ct_cuda_model_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < CM_COUNT && n < max; v++, n++)
        out[n] = (ct_kernel){.name = cm_name(v), .backend = "cuda", .precision = cm_precision(v), .check = cm_check(v),
                             .variant = v, .unavailable = cu_unavailable};
    /* times on the frame's shapes: reported, never a verdict */
    const struct { int v; const char *shape; double limit; } tm[] = {
        {CM_CONV, "C = 8192, K = 4, 1 row", 0.02},
        {CM_RECUR, "32 value heads of 128 x 128, 1 row", 0.05},
        {CM_SAMPLE, "4097 candidates, T 1, top_p 0.9", 0.1},
    };
    for (int i = 0; i < 3 && tm[i].v < n; i++) {
        out[tm[i].v].time = time_model;
        out[tm[i].v].time_shape = tm[i].shape;
        out[tm[i].v].limit_ms = tm[i].limit;
    }
    return n;
}

int ct_cuda_model_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {CM_CONV, KC_NO_SHIFT, "device: conv window not advanced"},
        {CM_RECUR, KC_NO_DECAY, "device: state decay skipped"},
        {CM_SWIGLU, KC_SWAP, "device: gate and up swapped"},
        {CM_SAMPLE, KC_RULES, "device: keep- and drop-crossing rules swapped"},
        {CM_FRAME, KC_NO_RAS, "device: repetition-aware redraw off"},
        {CM_MOE + 1, CT_CUDA_NO_RENORM, "device: top-k weights not renormalised"},
        {CM_MOE + 6, CT_CUDA_NO_RENORM, "device: top-k weights not renormalised"},
        {CM_MOE + 3, CT_CUDA_GROUPED_TILE, "device: grouped experts: pairs past an expert's first tile dropped"},
        {CM_MOE + 1, CT_CUDA_GROUPED_STAGE, "device: staged grouped down: a tile's first SwiGLU row staged from its second pair"},
        {CM_MOE + 1, CT_CUDA_GROUPED_WALK_GU, "device: grouped walk gate/up: a warp keeps the previous tile's x in a new tile"},
        {CM_MOE + 3, CT_CUDA_GROUPED_WALK_DN, "device: grouped walk down: a warp keeps the previous tile's x in a new tile"},
        {CM_MOE + 1, CT_CUDA_MOE_UP_NEXT, "device: decode gate/up kernel reads the next output's up row"},
        {CM_MOE + 3, CT_CUDA_MOE_WSEL_NEXT, "device: decode down kernel weights a rank with the next rank's weight"},
        {CM_MOE + 1, CT_CUDA_MOE_XT_NEXT, "device: decode gate/up kernel writes each SwiGLU value one chunk over (XT)"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = cm_name(c[i].v), .backend = "cuda/control", .precision = cm_precision(c[i].v),
                             .check = cm_check(c[i].v), .variant = c[i].v, .control = c[i].control,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
