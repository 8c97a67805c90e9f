/* contract_cuda_gdn.c - `drama contract` entry for the seam's DeltaNet in one launch (gdn_fused.cu,
 * dr_cuda_gdn_step with fused = 1, DRAMA_CUDA_GDN_FUSED): on the same inputs and the same carried
 * windows and states, over three steps (one session held in the second), the fused kernel against
 * the separate conv, recurrence and gated-norm launches bit for bit (y, g, beta, out every step; the
 * windows and states of both DeltaNet slots at the end), and against a float64 reference of the
 * whole chain with running error bounds (contract_ev.h). Shapes: the model's (nk 16, dk 128, nv 32,
 * dv 128, K 4) for a frame (2 sessions) and a run of 3 rows of one session; nv == nk, dk 64, K 2,
 * a per-head norm with a conv bias; 4 and 8 value heads per key head; dk beyond the block's threads;
 * K 10 (beyond the kernel's window: the fused path must refuse it). Controls plant defects inside
 * the kernel (dr_cuda_gdn_plant_defect). docs/contract.md "CUDA kernels". */
#include "tools/contract_cuda_internal.h"

#ifndef DRAMA_HAVE_CUDA

int ct_cuda_gdn_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}
int ct_cuda_gdn_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "tools/contract_ev.h"

#define GF_STEPS 3
#define GF_LAYER 1 /* the slot under test: slot 0 of every sequence must stay as it was */
#define GF_EPS 1e-6

typedef struct gf_case {
    int nk, dk, nv, dv, K, per_head, bias;
    int n, ns;          /* rows, sessions */
    const int *sess;    /* the session of each row (runs consecutive) */
    const char *what;
} gf_case;

static void *gz(size_t n) { return calloc(n ? n : 1, 1); }
static void gfill(uint64_t *s, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * ct_rand_normal(s));
}

/* the float64 reference of one row of session state (window W [K-1][C] as floats: shifting is
 * exact; state S [nv][dk][dv] as ev): y, g, beta and out of the row, as the seam computes them */
static void ref_row(const gf_case *g, const float *cw, const float *cb, const float *negA, const float *dt,
                    const float *nw, const float *u, const float *z, const float *a, const float *b, int held, float *W,
                    ev *S, ev *y, ev *ga, ev *gb, ev *out) {
    const int dk = g->dk, dv = g->dv, K = g->K;
    const int64_t qk = (int64_t)g->nk * dk, C = 2 * qk + (int64_t)g->nv * dv;
    for (int64_t c = 0; c < C; c++) {
        ev acc = ev_in(cb ? cb[c] : 0.0f);
        for (int j = 0; j < K; j++)
            acc = ev_add(acc, ev_mul(ev_in(cw[c * K + j]), ev_in(j < K - 1 ? W[(int64_t)j * C + c] : u[c])));
        y[c] = held ? ev_in(0.0) : ev_silu(acc);
        if (!held && K > 1) {
            for (int j = 0; j + 1 < K - 1; j++) W[(int64_t)j * C + c] = W[(int64_t)(j + 1) * C + c];
            W[(int64_t)(K - 2) * C + c] = u[c];
        }
    }
    if (held) { /* state untouched, gates not written, out the norm of zeros: 0 */
        for (int h = 0; h < g->nv; h++) ga[h] = ev_in(a[h]), gb[h] = ev_in(b[h]);
        for (int64_t e = 0; e < (int64_t)g->nv * dv; e++) out[e] = ev_in(0.0);
        return;
    }
    const float qscale = 1.0f / sqrtf((float)dk);
    ev *q = gz((size_t)dk * sizeof(ev)), *kk = gz((size_t)dk * sizeof(ev)), *o = gz((size_t)dv * sizeof(ev));
    for (int h = 0; h < g->nv; h++) {
        const int kh = h / (g->nv / g->nk);
        ev_acc sq = {0}, sk = {0};
        for (int e = 0; e < dk; e++) {
            ev qv = y[(int64_t)kh * dk + e], kv = y[qk + (int64_t)kh * dk + e];
            ev_acc_add(&sq, (ev){qv.v * qv.v, 2 * fabs(qv.v) * qv.e + qv.e * qv.e});
            ev_acc_add(&sk, (ev){kv.v * kv.v, 2 * fabs(kv.v) * kv.e + kv.e * kv.e});
        }
        ev ssq = ev_acc_get(&sq), ssk = ev_acc_get(&sk);
        ev rq = ev_mul(ev_rsqrt_of((ev){ssq.v + (double)1e-6f, ssq.e}), ev_in(qscale));
        ev rk = ev_rsqrt_of((ev){ssk.v + (double)1e-6f, ssk.e});
        for (int e = 0; e < dk; e++) q[e] = ev_mul(y[(int64_t)kh * dk + e], rq), kk[e] = ev_mul(y[qk + (int64_t)kh * dk + e], rk);
        ev gg = ev_mul(ev_in(negA[h]), ev_softplus(ev_add(ev_in(a[h]), ev_in(dt[h]))));
        ev beta = ev_sigmoid(ev_in(b[h]));
        ga[h] = gg, gb[h] = beta;
        ev decay = ev_exp(gg);
        ev_acc ss = {0};
        for (int j = 0; j < dv; j++) {
            ev_acc m = {0}, oa = {0};
            for (int e = 0; e < dk; e++) {
                ev *se = &S[((int64_t)h * dk + e) * dv + j];
                *se = ev_mul(*se, decay);
                ev_acc_add(&m, ev_mul(*se, kk[e]));
            }
            ev dl = ev_mul(ev_sub(y[2 * qk + (int64_t)h * dv + j], ev_acc_get_f32(&m)), beta);
            for (int e = 0; e < dk; e++) {
                ev *se = &S[((int64_t)h * dk + e) * dv + j];
                *se = ev_add(*se, ev_mul(kk[e], dl));
                ev_acc_add(&oa, ev_mul(*se, q[e]));
            }
            o[j] = ev_acc_get_f32(&oa);
            ev_acc_add(&ss, (ev){o[j].v * o[j].v, 2 * fabs(o[j].v) * o[j].e + o[j].e * o[j].e});
        }
        ev sv = ev_acc_get(&ss);
        const double eps = (double)(float)GF_EPS;
        ev r2 = ev_rsqrt_of((ev){sv.v / dv + eps, sv.e / dv + EV_D * (sv.v / dv + eps)});
        for (int j = 0; j < dv; j++) {
            float wj = nw[g->per_head ? (int64_t)h * dv + j : j];
            out[(int64_t)h * dv + j] =
                ev_mul(ev_mul(ev_mul(o[j], r2), ev_in(wj)), ev_silu(ev_in(z[(int64_t)h * dv + j])));
        }
    }
    free(q), free(kk), free(o);
}

/* one case: both paths through GF_STEPS steps; compares fused vs separate (tol 0) and fused vs f64 */
static void gf_run(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, const gf_case *g) {
    const int n = g->n, ns = g->ns, K = g->K, nv = g->nv, dv = g->dv;
    const int64_t C = 2 * (int64_t)g->nk * g->dk + (int64_t)nv * dv, vd = (int64_t)nv * dv;
    const int64_t wn = (int64_t)(K - 1) * C, sd = (int64_t)nv * g->dk * dv, nwl = g->per_head ? vd : dv;
    char name[192];
    snprintf(name, sizeof name, "nk=%d dk=%d nv=%d dv=%d K=%d%s%s, %s", g->nk, g->dk, nv, dv, K,
             g->per_head ? " per-head norm" : "", g->bias ? " conv bias" : "", g->what);
    dr_cuda_gdn_shape sh = {g->nk, g->dk, nv, dv, K, NULL, NULL, NULL, NULL, NULL, g->per_head, GF_EPS};
    if (K - 1 > 7) { /* beyond the kernel's window: it must refuse (the seam then keeps the three launches) */
        drama_error e = {0};
        sh.conv_w = sh.neg_A = sh.dt_bias = (const float *)&sh; /* never read: the call must refuse first */
        float got = !dr_cuda_gdn_fused_ok(t->c, &sh, n) &&
                    dr_cuda_gdn_step(t->c, &sh, (const dr_seq_row *)&sh, GF_LAYER, n, (const float *)&sh, (float *)&sh,
                                     (float *)&sh, (float *)&sh, NULL, (float *)&sh, 1, &e) == DRAMA_EUNSUPPORTED;
        double ref = 1.0, tol = 0.0;
        ct_compare(res, name, &got, &ref, &tol, 1);
        return;
    }
    if (!dr_cuda_gdn_fused_ok(t->c, &sh, n)) {
        ct_case_error(res, name, "the fused kernel refuses the shape (below sm_90?)");
        return;
    }
    float *cw = gz((size_t)(C * K) * 4), *cb = gz((size_t)C * 4), *negA = gz((size_t)nv * 4), *dt = gz((size_t)nv * 4);
    float *nw = gz((size_t)nwl * 4);
    gfill(s, cw, C * K, 0.5);
    if (g->bias) gfill(s, cb, C, 0.1);
    for (int h = 0; h < nv; h++) negA[h] = -expf((float)(0.5 * ct_rand_normal(s))), dt[h] = (float)(0.5 * ct_rand_normal(s));
    for (int64_t i = 0; i < nwl; i++) nw[i] = (float)(1 + 0.1 * ct_rand_normal(s));
    /* per session: slots 0 and 1 of the window and the state (slot 0 must come back as it was) */
    const int64_t cl = wn > 0 ? wn : 1, cn = 2 * cl * ns, rn = 2 * sd * ns;
    float *conv0 = gz((size_t)cn * 4), *rec0 = gz((size_t)rn * 4);
    gfill(s, conv0, cn, 1), gfill(s, rec0, rn, 0.1);
    float *W = gz((size_t)cn * 4); /* the reference's windows */
    memcpy(W, conv0, (size_t)cn * 4);
    ev *S = gz((size_t)rn * sizeof(ev));
    for (int64_t e = 0; e < rn; e++) S[e] = ev_in(rec0[e]);
    sh.conv_w = cu_put(t, cw, (size_t)(C * K) * 4), sh.conv_b = g->bias ? cu_put(t, cb, (size_t)C * 4) : NULL;
    sh.neg_A = cu_put(t, negA, (size_t)nv * 4), sh.dt_bias = cu_put(t, dt, (size_t)nv * 4);
    sh.norm = cu_put(t, nw, (size_t)nwl * 4);
    int32_t *dhold = cu_zero(t, (size_t)ns * 4);
    float *dconv[2], *drec[2];
    void *drows[2];
    for (int p = 0; p < 2; p++) {
        dconv[p] = cu_put(t, conv0, (size_t)cn * 4), drec[p] = cu_put(t, rec0, (size_t)rn * 4);
        dr_seq hs[8];
        dr_seq_row hr[8];
        for (int q = 0; q < ns; q++)
            hs[q] = (dr_seq){NULL, dconv[p] + 2 * cl * q, drec[p] + 2 * sd * q, 0, 0, 0, cl, sd};
        dr_seq *dseq = cu_put(t, hs, sizeof(dr_seq) * (size_t)ns);
        for (int i = 0; i < n; i++) hr[i] = (dr_seq_row){dseq ? dseq + g->sess[i] : NULL, 0, dhold ? dhold + g->sess[i] : NULL};
        drows[p] = cu_put(t, hr, sizeof(dr_seq_row) * (size_t)n);
    }
    const int64_t no = n * (vd + C + 2 * nv); /* out | y | g | beta */
    float *u = gz((size_t)(n * C) * 4), *z = gz((size_t)(n * vd) * 4), *a = gz((size_t)(n * nv) * 4), *b = gz((size_t)(n * nv) * 4);
    float *got[2] = {gz((size_t)no * 4), gz((size_t)no * 4)}, *alt = gz((size_t)no * 4);
    double *ref = gz((size_t)no * 8), *tol = gz((size_t)no * 8), *fref = gz((size_t)no * 8), *ftol = gz((size_t)no * 8);
    ev *ey = gz((size_t)C * sizeof(ev)), *eo = gz((size_t)vd * sizeof(ev)), *ega = gz((size_t)nv * sizeof(ev));
    ev *egb = gz((size_t)nv * sizeof(ev));
    int bad = 0;
    for (int step = 0; step < GF_STEPS && !bad; step++) {
        int32_t hold[8] = {0};
        if (step == 1 && ns > 1) hold[1] = 1; /* a lane that ended: its session must not move */
        gfill(s, u, n * C, 1), gfill(s, z, n * vd, 1), gfill(s, a, n * nv, 1), gfill(s, b, n * nv, 1);
        if (!t->failed && dr_cuda_to_device(t->c, dhold, hold, (size_t)ns * 4, &t->err)) t->failed = 1;
        float *du = cu_put(t, u, (size_t)(n * C) * 4), *dz = cu_put(t, z, (size_t)(n * vd) * 4);
        for (int p = 0; p < 2; p++) {
            float *da = cu_put(t, a, (size_t)(n * nv) * 4), *db = cu_put(t, b, (size_t)(n * nv) * 4);
            float *dy = cu_poison(t, (size_t)(n * C) * 4), *dout = cu_poison(t, (size_t)(n * vd) * 4);
            if (!t->failed && dr_cuda_gdn_step(t->c, &sh, (const dr_seq_row *)drows[p], GF_LAYER, n, du, dy, da, db, dz,
                                               dout, p, &t->err))
                t->failed = 1;
            float *o = got[p];
            cu_get(t, o, dout, (size_t)(n * vd) * 4);
            cu_get(t, o + n * vd, dy, (size_t)(n * C) * 4);
            cu_get(t, o + n * (vd + C), da, (size_t)(n * nv) * 4);
            cu_get(t, o + n * (vd + C + nv), db, (size_t)(n * nv) * 4);
        }
        for (int i = 0; i < n; i++) { /* the reference, rows in order */
            int q = g->sess[i];
            ref_row(g, cw, g->bias ? cb : NULL, negA, dt, nw, u + i * C, z + i * vd, a + i * nv, b + i * nv, hold[q],
                    W + 2 * cl * q + cl, S + 2 * sd * q + sd, ey, ega, egb, eo);
            for (int64_t e = 0; e < vd; e++) fref[i * vd + e] = eo[e].v, ftol[i * vd + e] = ev_tol(eo[e]);
            for (int64_t c = 0; c < C; c++) fref[n * vd + i * C + c] = ey[c].v, ftol[n * vd + i * C + c] = ev_tol(ey[c]);
            for (int h = 0; h < nv; h++) {
                int64_t o1 = n * (vd + C) + i * nv + h, o2 = n * (vd + C + nv) + i * nv + h;
                fref[o1] = ega[h].v, ftol[o1] = ev_tol(ega[h]), fref[o2] = egb[h].v, ftol[o2] = ev_tol(egb[h]);
            }
        }
        char cname[256];
        snprintf(cname, sizeof cname, "%s: step %d out, y, g, beta", name, step + 1);
        if ((bad = cu_case_end(t, res, cname)) != 0) break;
        for (int64_t e = 0; e < no; e++) ref[e] = got[0][e], tol[e] = 0.0;
        snprintf(cname, sizeof cname, "%s: step %d fused == separate launches (bit for bit)", name, step + 1);
        ct_compare(res, cname, got[1], ref, tol, no);
        snprintf(cname, sizeof cname, "%s: step %d fused vs float64", name, step + 1);
        ct_compare(res, cname, got[1], fref, ftol, no);
        /* precision check: out and y stored through fp16 must break the bound */
        for (int64_t e = 0; e < n * (vd + C); e++) alt[e] = ct_h((float)fref[e]);
        ct_discriminate(res, cname, alt, fref, ftol, n * (vd + C));
    }
    if (!bad) { /* the carried windows and states of both slots */
        const int64_t ne = cn + rn;
        float *st[2] = {gz((size_t)ne * 4), gz((size_t)ne * 4)};
        double *sref = gz((size_t)ne * 8), *stol = gz((size_t)ne * 8);
        for (int p = 0; p < 2; p++) cu_get(t, st[p], dconv[p], (size_t)cn * 4), cu_get(t, st[p] + cn, drec[p], (size_t)rn * 4);
        char cname[256];
        snprintf(cname, sizeof cname, "%s: windows and states after %d steps", name, GF_STEPS);
        if (!cu_case_end(t, res, cname)) {
            for (int64_t e = 0; e < ne; e++) sref[e] = st[0][e], stol[e] = 0.0;
            snprintf(cname, sizeof cname, "%s: windows and states fused == separate (bit for bit)", name);
            ct_compare(res, cname, st[1], sref, stol, ne);
            for (int64_t e = 0; e < cn; e++) sref[e] = W[e], stol[e] = 0.0; /* a window is copied, never rounded */
            for (int64_t e = 0; e < rn; e++) sref[cn + e] = S[e].v, stol[cn + e] = ev_tol(S[e]);
            snprintf(cname, sizeof cname, "%s: windows and states fused vs float64", name);
            ct_compare(res, cname, st[1], sref, stol, ne);
        }
        free(st[0]), free(st[1]), free(sref), free(stol);
    }
    (void)k;
    cu_free_all(t);
    free(cw), free(cb), free(negA), free(dt), free(nw), free(conv0), free(rec0), free(W), free(S), free(u), free(z);
    free(a), free(b), free(got[0]), free(got[1]), free(alt), free(ref), free(tol), free(fref), free(ftol), free(ey), free(eo);
    free(ega), free(egb);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x47444e46ull;
    static const int frame[] = {0, 1}, run[] = {0, 0, 0, 1}, three[] = {0, 1, 2};
    const gf_case cases[] = {
        {16, 128, 32, 128, 4, 0, 0, 2, 2, frame, "the model's shape, a frame of 2 sessions"},
        {16, 128, 32, 128, 4, 0, 0, 4, 2, run, "the model's shape, a run of 3 rows of one session + 1 row"},
        {4, 64, 4, 64, 2, 1, 1, 3, 3, three, "nv == nk (no cluster), 3 sessions"},
        {2, 32, 8, 48, 3, 0, 1, 4, 2, run, "4 value heads per key head, 96 threads, a run"},
        {1, 100, 8, 8, 8, 1, 0, 2, 2, frame, "8 value heads per key head, dk beyond the block's 32 threads, K 8"},
        {1, 8, 1, 5, 4, 0, 1, 3, 3, three, "1 head, dv 5"},
        {2, 16, 4, 16, 10, 0, 0, 2, 2, frame, "K 10: refused by the fused kernel"},
    };
    dr_cuda_gdn_plant_defect(k->control);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) gf_run(k, &t, res, &s, &cases[i]);
    dr_cuda_gdn_plant_defect(0);
    cu_close(&t);
}

/* ---- timing: one frame row on the model's shape, conv + recurrence + gated norm in one launch ---- */

typedef struct gf_timed {
    cu_t *t;
    dr_cuda_gdn_shape sh;
    const dr_seq_row *rows;
    float *u, *y, *a, *b, *z, *o;
} gf_timed;

static drama_status timed_step(void *arg) {
    gf_timed *m = arg;
    return dr_cuda_gdn_step(m->t->c, &m->sh, m->rows, 0, 1, m->u, m->y, m->a, m->b, m->z, m->o, 1, &m->t->err);
}

static double time_fused(const ct_kernel *k, ct_ctx *ctx) {
    (void)k, (void)ctx;
    cu_t t;
    ct_result r = {0};
    if (cu_open(&t, &r)) return INFINITY;
    const int64_t C = 8192, vd = 4096, sd = (int64_t)32 * 128 * 128;
    uint64_t s = 5;
    float *h = gz((size_t)C * 4 * 4);
    gfill(&s, h, C * 4, 0.5);
    gf_timed m = {0};
    m.t = &t;
    const float *w = cu_put(&t, h, (size_t)C * 4 * 4);
    m.sh = (dr_cuda_gdn_shape){16, 128, 32, 128, 4, w, NULL, w, w + 32, w + 64, 0, GF_EPS};
    float *conv = cu_zero(&t, (size_t)(3 * C) * 4), *rec = cu_zero(&t, (size_t)sd * 4);
    dr_seq hs = {NULL, conv, rec, 0, 0, 0, 3 * C, sd};
    dr_seq *dseq = cu_put(&t, &hs, sizeof hs);
    dr_seq_row hr = {dseq, 0, NULL};
    m.rows = cu_put(&t, &hr, sizeof hr);
    m.u = cu_put(&t, h, (size_t)C * 4), m.y = cu_zero(&t, (size_t)C * 4), m.z = cu_put(&t, h, (size_t)vd * 4);
    m.a = cu_put(&t, h, 32 * 4), m.b = cu_put(&t, h + 32, 32 * 4), m.o = cu_zero(&t, (size_t)vd * 4);
    double ms = t.failed || !dr_cuda_gdn_fused_ok(t.c, &m.sh, 1) ? INFINITY : cu_time(&t, timed_step, &m);
    free(h);
    cu_close(&t);
    return ms;
}

static const char *k_precision = "bit for bit the separate conv, recurrence and gated-norm launches (tol 0), and the "
                                 "float64 chain (tol = 2x running bound)";

int ct_cuda_gdn_kernels(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = "gdn_fused", .backend = "cuda", .precision = k_precision, .check = check,
                         .time = time_fused, .time_shape = "nk 16 dk 128 nv 32 dv 128 K 4, 1 row, with the gated norm",
                         .limit_ms = 0.03, .unavailable = cu_unavailable};
    return 1;
}

int ct_cuda_gdn_controls(ct_kernel *out, int max) {
    const struct { int defect; const char *desc; } c[] = {
        {1, "device: fused DeltaNet conv window not shifted (only the newest slot replaced)"},
        {2, "device: fused DeltaNet gated norm reads silu(z) of the next value head"},
    };
    int n = 0;
    for (int i = 0; i < 2 && n < max; i++, n++)
        out[n] = (ct_kernel){.name = "gdn_fused", .backend = "cuda/control", .precision = k_precision, .check = check,
                             .control = c[i].defect, .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
