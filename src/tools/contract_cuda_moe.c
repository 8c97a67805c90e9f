/* contract_cuda_moe.c - `drama contract` entries for the CUDA MoE layer (dr_cuda_moe_run), one per
 * stored expert format and layout (per-expert, fused 3-D gate_up, pruned): router, routing,
 * experts, shared expert and the residual add against a float64 reference over the stored bytes,
 * with running error bounds (contract_ev.h). The selected ids must equal the reference's; fixtures
 * keep the k-th and (k+1)-th scores apart by more than their error bounds, so the choice is
 * well defined. docs/contract.md "CUDA kernels". */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "tools/contract_ev.h"

#define U CT_U32

static const struct {
    const char *name;
    int f, fused, pruned;
} moe_v[CT_CUDA_MOE_VARIANTS] = {
    {"moe.bf16", CT_F_BF16, 0, 0},      {"moe.fp8_block", CT_F_FP8B, 0, 0}, {"moe.fp8_tensor", CT_F_FP8T, 0, 0},
    {"moe.nvfp4", CT_F_NVFP4, 0, 0},    {"moe.affine4", CT_F_AFF4, 0, 0},   {"moe.affine8", CT_F_AFF8, 0, 0},
    {"moe.fused_fp8", CT_F_FP8B, 1, 0}, {"moe.pruned_nvfp4", CT_F_NVFP4, 0, 1},
};

const char *ct_cuda_moe_name(int i) { return moe_v[i].name; }

enum { E = 16, TOPK = 4, TOPK_MAX = 8, H0 = 128, HMAX = 2048, I = 64, IS = 32 }; /* TOPK: the moe.* entries'; H0: their width */

static void *xm(size_t n) { return calloc(n ? n : 1, 1); }
static void fillr(uint64_t *s, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * ct_rand_normal(s));
}

typedef struct moe_w {
    ct_w router, sg, su, sd, sgp;
    ct_w gate[E], up[E], gu[E], down[E];
    int n_kept, kept[E], slot[E], ok;
} moe_w;

/* scale > 0: normal weights times scale; scale < 0: positive weights in [0.5, 1] * 2 / cols (the
 * fp16-discriminating fixture: long positive sums, no cancellation) */
static int make_w(ct_w *t, int f, uint64_t *s, int64_t rows, int64_t cols, double scale) {
    float *src = xm((size_t)(rows * cols) * 4);
    if (scale > 0) fillr(s, src, rows * cols, scale);
    else
        for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)((0.5 + 0.5 * ct_rand_uniform(s)) * 2.0 / (double)cols);
    int r = ct_w_make(t, f, src, rows, cols);
    free(src);
    return r;
}

static void moe_w_make(moe_w *m, int f, int fused, int pruned, int positive, uint64_t *s, int H) {
    const double ws = positive ? -1.0 : 0.15;
    memset(m, 0, sizeof *m);
    /* small router weights: scores of order 0.1, so their bounds (K + 8) u sum|x w| stay below the
     * fp16 rounding of the routing weights that the discriminating variant makes */
    int ok = make_w(&m->router, CT_F_BF16, s, E, H, 0.01) == 0;
    ok = make_w(&m->sg, CT_F_BF16, s, IS, H, ws) == 0 && ok;
    ok = make_w(&m->su, CT_F_BF16, s, IS, H, ws) == 0 && ok;
    ok = make_w(&m->sd, CT_F_BF16, s, H, IS, ws) == 0 && ok;
    ok = make_w(&m->sgp, CT_F_BF16, s, 1, H, 0.1) == 0 && ok;
    for (int e = 0; e < E; e++) {
        int keep = !pruned || (e % 3 != 2);
        m->slot[e] = keep ? m->n_kept : -1;
        if (keep) m->kept[m->n_kept++] = e;
    }
    for (int k = 0; k < m->n_kept && ok; k++) {
        if (fused) ok = make_w(&m->gu[k], f, s, 2 * I, H, ws) == 0;
        else ok = make_w(&m->gate[k], f, s, I, H, ws) == 0 && make_w(&m->up[k], f, s, I, H, ws) == 0;
        ok = ok && make_w(&m->down[k], f, s, H, I, ws) == 0;
    }
    m->ok = ok;
}

static void moe_w_free(moe_w *m, int fused) {
    ct_w_free(&m->router), ct_w_free(&m->sg), ct_w_free(&m->su), ct_w_free(&m->sd), ct_w_free(&m->sgp);
    for (int k = 0; k < m->n_kept; k++) {
        if (fused) ct_w_free(&m->gu[k]);
        else ct_w_free(&m->gate[k]), ct_w_free(&m->up[k]);
        ct_w_free(&m->down[k]);
    }
}

/* rows [r0, r1) of a product in float64 with its bound: x [K] floats, exact input errors ex (NULL: 0);
 * alt (may be NULL): the fp16-accumulated product of the same x */
static void prod(const dr_weight *w, const float *x, const double *ex, int64_t r0, int64_t r1, ev *out, float *alt) {
    int64_t R = w->rows;
    double *ref = xm((size_t)R * 8), *tol = xm((size_t)R * 8), *pe = xm((size_t)R * 8);
    float *al = xm((size_t)R * 4);
    ct_matmul_reference(w, x, 1, 8, ref, tol, al);
    if (ex) ct_matmul_abs(w, ex, 1, pe);
    for (int64_t r = r0; r < r1; r++) {
        out[r - r0] = (ev){ref[r], tol[r] + pe[r]};
        if (alt) alt[r - r0] = al[r];
    }
    free(ref), free(tol), free(pe), free(al);
}

/* The selection of one row: ids by score (softmax is monotonic), ties to the lower id. Returns the
 * gap between the k-th and (k+1)-th eligible scores minus their bounds (<= 0: ambiguous). */
static double choose(const ev *sc, const int *slot, int *ids, int tk) {
    int used[E] = {0};
    for (int q = 0; q < tk; q++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (slot[e] >= 0 && !used[e] && (b < 0 || sc[e].v > sc[b].v)) b = e;
        ids[q] = b;
        if (b >= 0) used[b] = 1;
    }
    int nx = -1;
    for (int e = 0; e < E; e++)
        if (slot[e] >= 0 && !used[e] && (nx < 0 || sc[e].v > sc[nx].v)) nx = e;
    if (nx < 0 || ids[tk - 1] < 0) return INFINITY;
    return sc[ids[tk - 1]].v - sc[nx].v - 4 * (sc[ids[tk - 1]].e + sc[nx].e);
}

/* positive: the fp16-discriminating fixture (positive x and expert weights); its variant accumulates
 * every expert product in fp16 (the reference's alt sums) */
/* wb > 0: the grouped path's walk kernels on at most wb blocks (every warp walks many tiles: the x
 * kept across items and the loads issued across tiles); lean: bit 0 the lean down kernel, bit 1 the
 * plain layout (XT=0), bit 2 (with pb >= 0) moe_persist2.cu's expert kernels instead of
 * moe_persist.cuh's (with it, bit 3 the down kernel's act from L2, bit 4 the routing kernel first,
 * bit 5 the gate/up kernel's L2 prefetch of the chosen experts); pb < 0: routing and decode
 * kernels as before (DRAMA_CUDA_MOE_PERSIST=0), pb >= 0: moe_persist.cuh's (pb > 0: at most pb blocks
 * per row, so every warp walks many items), then also the old kernels on the same inputs, bit for bit */
static void moe_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int vi, int n, int norm, int positive,
                     int tk, int lean, int pb, int H, int wb) {
    const int f = moe_v[vi].f, fused = moe_v[vi].fused;
    moe_w m;
    moe_w_make(&m, f, fused, moe_v[vi].pruned, positive, s, H);
    float *x = xm((size_t)(n * H) * 4), *res0 = xm((size_t)(n * H) * 4), *y = xm((size_t)(n * H) * 4);
    float *alt = xm((size_t)(n * H) * 4);
    double *ref = xm((size_t)(n * H) * 8), *tol = xm((size_t)(n * H) * 8);
    int ids[64 * TOPK_MAX];
    if (n > 64) n = 64;
    fillr(s, res0, n * H, 1);
    ev sc[E], g[2 * I], uu[I], sgv;
    ev(*yr)[HMAX] = xm(sizeof(ev) * (TOPK_MAX + 1) * HMAX), *dummy = xm(sizeof(ev) * HMAX);
    float(*ya)[HMAX] = xm(sizeof(float) * (TOPK_MAX + 1) * HMAX); /* the fp16-accumulating variant's expert outputs */
    for (int i = 0; i < n && m.ok; i++) {
        float *xi = x + (int64_t)i * H;
        for (int tries = 0; tries < 200; tries++) { /* a well-defined top-k */
            fillr(s, xi, H, 1);
            if (positive)
                for (int j = 0; j < H; j++) xi[j] = (float)(0.5 + 0.5 * ct_rand_uniform(s));
            prod(&m.router.w, xi, NULL, 0, E, sc, NULL);
            if (choose(sc, m.slot, ids + i * tk, tk) > 0) break;
        }
        double M = -INFINITY, z = 0, zc = 0, emax = 0;
        for (int e = 0; e < E; e++)
            if (m.slot[e] >= 0) M = fmax(M, sc[e].v), emax = fmax(emax, sc[e].e);
        for (int e = 0; e < E; e++)
            if (m.slot[e] >= 0) z += exp(sc[e].v - M);
        for (int q = 0; q < tk; q++) zc += exp(sc[ids[i * tk + q]].v - M);
        prod(&m.sgp.w, xi, NULL, 0, 1, &sgv, NULL);
        ev gate = ev_sigmoid(sgv);
        /* routed experts (rank order), then the shared expert */
        double wr[TOPK_MAX];
        for (int q = 0; q <= tk; q++) {
            float ga[2 * I], ua[I];
            int sl = q < tk ? m.slot[ids[i * tk + q]] : -1;
            int width = q < tk ? I : IS;
            if (q < tk) {
                if (fused) {
                    prod(&m.gu[sl].w, xi, NULL, 0, 2 * I, g, ga);
                    memcpy(uu, g + I, sizeof(ev) * I);
                    memcpy(ua, ga + I, sizeof(float) * I);
                } else {
                    prod(&m.gate[sl].w, xi, NULL, 0, I, g, ga);
                    prod(&m.up[sl].w, xi, NULL, 0, I, uu, ua);
                }
                wr[q] = exp(sc[ids[i * tk + q]].v - M) / (norm ? zc : z);
            } else {
                prod(&m.sg.w, xi, NULL, 0, IS, g, ga);
                prod(&m.su.w, xi, NULL, 0, IS, uu, ua);
            }
            float fa[I], faa[I];
            double ea[I];
            for (int j = 0; j < width; j++) {
                ev a = ev_mul(ev_silu(g[j]), uu[j]);
                fa[j] = (float)a.v;
                ea[j] = a.e + fabs(a.v - (double)fa[j]);
                faa[j] = ga[j] / (1.0f + expf(-ga[j])) * ua[j];
            }
            prod(q < tk ? &m.down[sl].w : &m.sd.w, fa, ea, 0, H, yr[q], NULL);
            prod(q < tk ? &m.down[sl].w : &m.sd.w, faa, NULL, 0, H, dummy, ya[q]);
        }
        for (int h = 0; h < H; h++) {
            ev o = ev_in(0.0);
            float ha = 0;
            for (int q = 0; q < tk; q++) {
                ev w = {wr[q], wr[q] * (2 * emax + 12 * U)};
                o = ev_add(o, ev_mul(w, yr[q][h]));
                ha += (float)wr[q] * ya[q][h];
            }
            o = ev_add(o, ev_mul(gate, yr[tk][h]));
            ev out = ev_add(ev_in(res0[(int64_t)i * H + h]), o);
            ref[(int64_t)i * H + h] = out.v;
            tol[(int64_t)i * H + h] = ev_tol(out);
            alt[(int64_t)i * H + h] = res0[(int64_t)i * H + h] + ha + (float)gate.v * ya[tk][h];
        }
    }
    /* the device layer */
    dr_cuda_weight *gate_d[E], *up_d[E], *gu_d[E], *down_d[E];
    for (int q = 0; q < m.n_kept && m.ok; q++) {
        gate_d[q] = fused ? NULL : cu_weight(t, &m.gate[q].w);
        up_d[q] = fused ? NULL : cu_weight(t, &m.up[q].w);
        gu_d[q] = fused ? cu_weight(t, &m.gu[q].w) : NULL;
        down_d[q] = cu_weight(t, &m.down[q].w);
    }
    dr_cuda_moe_desc d = {E, tk, k->control == CT_CUDA_NO_RENORM ? !norm : norm, m.n_kept, H, I, IS, m.slot,
                          (const dr_cuda_weight *const *)gate_d, (const dr_cuda_weight *const *)up_d,
                          (const dr_cuda_weight *const *)gu_d, (const dr_cuda_weight *const *)down_d, fused,
                          m.ok ? cu_weight(t, &m.router.w) : NULL, m.ok ? cu_weight(t, &m.sg.w) : NULL,
                          m.ok ? cu_weight(t, &m.su.w) : NULL, m.ok ? cu_weight(t, &m.sd.w) : NULL,
                          m.ok ? cu_weight(t, &m.sgp.w) : NULL};
    dr_cuda_moe *dm = NULL;
    if (m.ok && !t->failed && dr_cuda_moe_create(t->c, &d, &dm, &t->err)) t->failed = 1;
    if (dm && k->control == CT_CUDA_GROUPED_TILE) dr_cuda_moe_set_group_defect(dm, 1);
    if (dm && k->control == CT_CUDA_GROUPED_STAGE) dr_cuda_moe_set_group_defect(dm, 2);
    if (dm && k->control == CT_CUDA_GROUPED_WALK_GU) dr_cuda_moe_set_group_defect(dm, 3);
    if (dm && k->control == CT_CUDA_GROUPED_WALK_DN) dr_cuda_moe_set_group_defect(dm, 4);
    if (dm) dr_cuda_moe_set_walk_blocks(dm, wb);
    /* both paths on the same rows: per row (the frame step's), then grouped by expert (the prefill's) */
    float *yg = xm((size_t)(n * H) * 4);
    if (dm && k->control == CT_CUDA_MOE_UP_NEXT) dr_cuda_moe_plant_defect(dm, 1);
    if (dm && k->control == CT_CUDA_MOE_WSEL_NEXT) dr_cuda_moe_plant_defect(dm, 2);
    if (dm) dr_cuda_moe_set_down(dm, lean & 1); /* moe.*: the decode down kernel; moe_lean.*: the lean one (the default) */
    if (dm && k->control == CT_CUDA_MOE_XT_NEXT) dr_cuda_moe_plant_defect(dm, 4);
    /* lean & 2: the decode kernels' plain layouts (DRAMA_CUDA_XT=0); the grouped path has none, so its
     * bit-for-bit check below ties both layouts to the same bits */
    if (!t->failed && dr_cuda_set_xt(t->c, !(lean & 2), &t->err)) t->failed = 1;
    if (dm && k->control == CT_CUDA_MOE_LEAN_NEXT) dr_cuda_moe_plant_defect(dm, 3);
    const int pon = (lean & 4) ? 2 : 1; /* lean & 4: moe_persist2.cu's expert kernels (DRAMA_CUDA_MOE_PERSIST=2) */
    if (dm) dr_cuda_moe_set_persist(dm, pb >= 0 ? pon : 0, pb > 0 ? pb : 0);
    if (dm && k->control == CT_CUDA_MOE_STALE_VIEW) dr_cuda_moe_plant_defect(dm, 5);
    if (dm && k->control == CT_CUDA_MOE_STALE_ROW) dr_cuda_moe_plant_defect(dm, 6);
    if (dm && k->control == CT_CUDA_MOE_P2_NEXT_ROW) dr_cuda_moe_plant_defect(dm, 7);
    if (dm && k->control == CT_CUDA_MOE_P2_STALE_SHARED) dr_cuda_moe_plant_defect(dm, 8);
    if (dm && k->control == CT_CUDA_MOE_P2_STAGE_NEXT) dr_cuda_moe_plant_defect(dm, 9);
    if (dm && k->control == CT_CUDA_MOE_P2_SCALE_ROW) dr_cuda_moe_plant_defect(dm, 10);
    if (dm && k->control == CT_CUDA_MOE_P2_ROUTE_NEXT) dr_cuda_moe_plant_defect(dm, 11);
    if (dm) dr_cuda_moe_set_down_stage(dm, !(lean & 8)); /* lean & 8: the second persistent down kernel reads act from L2 */
    if (dm) dr_cuda_moe_set_route_in_gu(dm, !(lean & 16)); /* lean & 16: the routing kernel before the second persistent ones */
    if (dm) dr_cuda_moe_set_l2pf(dm, (lean & 32) != 0); /* lean & 32: the gate/up kernel's L2 prefetch of the chosen experts */
    float *dx = cu_put(t, x, (size_t)(n * H) * 4), *dy = cu_put(t, res0, (size_t)(n * H) * 4);
    float *dyg = cu_put(t, res0, (size_t)(n * H) * 4);
    if (dm) dr_cuda_moe_set_group_min(dm, 1); /* the larger workspace: the grouped path's */
    size_t wsb = dm ? dr_cuda_moe_ws_bytes(dm, n) : 0;
    void *ws = dm ? cu_poison(t, wsb) : NULL;
    dr_cuda_status *dst = cu_zero(t, sizeof(dr_cuda_status));
    if (dm) dr_cuda_moe_set_group_min(dm, (int64_t)1 << 40);
    if (dm && !t->failed && dr_cuda_moe_run(t->c, dm, n, dx, dy, 1, ws, wsb, 3, dst, &t->err)) t->failed = 1;
    cu_get(t, y, dy, (size_t)(n * H) * 4);
    int32_t got[64 * TOPK_MAX];
    int32_t *dids = NULL;
    float *dwsel = NULL, wsel_p[64 * TOPK_MAX], wsel_o[64 * TOPK_MAX];
    if (dm) dr_cuda_moe_last_route(dm, n, ws, &dids, &dwsel);
    if (dids) cu_get(t, got, dids, (size_t)(n * tk) * 4);
    /* pb >= 0: the same call on the old routing and decode kernels, out and weights bit for bit */
    float *yo = xm((size_t)(n * H) * 4);
    if (pb >= 0 && dm && !t->failed) {
        float *dyo = cu_put(t, res0, (size_t)(n * H) * 4);
        if (dwsel) cu_get(t, wsel_p, dwsel, (size_t)(n * tk) * 4);
        dr_cuda_moe_set_persist(dm, 0, 0);
        if (!t->failed && dr_cuda_memset(t->c, ws, 0xFF, wsb, &t->err)) t->failed = 1;
        if (!t->failed && dr_cuda_moe_run(t->c, dm, n, dx, dyo, 1, ws, wsb, 3, dst, &t->err)) t->failed = 1;
        cu_get(t, yo, dyo, (size_t)(n * H) * 4);
        if (dwsel) cu_get(t, wsel_o, dwsel, (size_t)(n * tk) * 4);
        dr_cuda_moe_set_persist(dm, pon, pb > 0 ? pb : 0);
    }
    if (dm) dr_cuda_moe_set_group_min(dm, 1);
    /* poisoned again: the grouped path must write every SwiGLU row it reads, not find the per-row path's */
    if (ws && !t->failed && dr_cuda_memset(t->c, ws, 0xFF, wsb, &t->err)) t->failed = 1;
    const int64_t walk0 = dm ? dr_cuda_moe_walk_calls(dm) : -1;
    if (dm && !t->failed && dr_cuda_moe_run(t->c, dm, n, dx, dyg, 1, ws, wsb, 3, dst, &t->err)) t->failed = 1;
    const int64_t walked = walk0 >= 0 ? dr_cuda_moe_walk_calls(dm) - walk0 : -1; /* -1: not the walk kernels */
    cu_get(t, yg, dyg, (size_t)(n * H) * 4);
    if (dm && !t->failed && dr_cuda_status_check(t->c, dst, "moe", &t->err)) t->failed = 1;
    /* a row with a NaN input has no finite score: the router error (grouped path) */
    int reported = 0;
    if (dm && !t->failed) {
        x[5] = NAN;
        if (!dr_cuda_to_device(t->c, dx, x, (size_t)H * 4, &t->err) &&
            !dr_cuda_moe_run(t->c, dm, 1, dx, dy, 1, ws, wsb, 7, dst, &t->err)) {
            drama_error e = {0};
            reported = dr_cuda_status_check(t->c, dst, "moe", &e) == DRAMA_ENUMERIC && strstr(e.message, "layer 7");
        } else {
            t->failed = 1;
        }
        /* persistent cases: the same on the per-row path (the second persistent gate/up kernel routes itself) */
        if (pb >= 0 && !t->failed) {
            dr_cuda_moe_set_group_min(dm, (int64_t)1 << 40);
            drama_error e = {0};
            if (!dr_cuda_moe_run(t->c, dm, 1, dx, dy, 1, ws, wsb, 9, dst, &t->err))
                reported = reported && dr_cuda_status_check(t->c, dst, "moe", &e) == DRAMA_ENUMERIC &&
                           strstr(e.message, "layer 9");
            else
                t->failed = 1;
        }
    }
    dr_cuda_moe_free(dm);
    if (dr_cuda_set_xt(t->c, 1, &t->err)) t->failed = 1;
    char name[128];
    char grid[48] = "";
    if (pb > 0) snprintf(grid, sizeof grid, " persistent, <= %d blocks a row", pb);
    else if (pb == 0) snprintf(grid, sizeof grid, " persistent");
    if (H != H0) snprintf(grid + strlen(grid), sizeof grid - strlen(grid), " H=%d", H);
    if (wb > 0) snprintf(grid + strlen(grid), sizeof grid - strlen(grid), " walk <= %d blocks", wb);
    snprintf(name, sizeof name, "%s%s n=%d experts %d/%d top-%d norm_topk=%d%s%s", positive ? "fp16-discriminating " : "",
             k->name, n, m.n_kept, E, tk, norm, (lean & 2) ? " plain x (XT=0)" : "", grid);
    if (!m.ok) ct_case_error(res, name, "could not build the weights");
    else if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, (int64_t)n * H);
        if (positive) ct_discriminate(res, name, alt, ref, tol, (int64_t)n * H);
        ct_compare(res, "grouped by expert", yg, ref, tol, (int64_t)n * H);
        double *yrow = xm((size_t)(n * H) * 8), *z0 = xm((size_t)(n * H) * 8);
        for (int64_t i = 0; i < (int64_t)n * H; i++) yrow[i] = y[i];
        ct_compare(res, "grouped by expert == per row (bit for bit)", yg, yrow, z0, (int64_t)n * H);
        if (walked >= 0) { /* the fixtures reach the walk kernels (the default grouped kernels) */
            float ran = (float)walked;
            double once = 1, zero = 0;
            ct_compare(res, "the grouped call ran the walk kernels (moe_grouped_walk.cuh)", &ran, &once, &zero, 1);
        }
        if (pb >= 0) { /* the persistent kernels == the old routing and decode kernels */
            ct_compare(res, "persistent == DRAMA_CUDA_MOE_PERSIST=0 (bit for bit)", yo, yrow, z0, (int64_t)n * H);
            double wp[64 * TOPK_MAX], zw[64 * TOPK_MAX] = {0};
            for (int i = 0; i < n * tk; i++) wp[i] = wsel_p[i];
            ct_compare(res, "routing weights == moe_route_kernel's (bit for bit)", wsel_o, wp, zw, (int64_t)n * tk);
        }
        free(yrow), free(z0);
        float gi[64 * TOPK_MAX];
        double ri[64 * TOPK_MAX], zt[64 * TOPK_MAX] = {0};
        for (int i = 0; i < n * tk; i++) gi[i] = (float)got[i], ri[i] = ids[i];
        ct_compare(res, "selected expert ids (exact)", gi, ri, zt, (int64_t)n * tk);
        float rep = (float)reported;
        double one = 1, zero = 0;
        ct_compare(res, "a NaN row reports 'router produced no finite score' with its layer", &rep, &one, &zero, 1);
    }
    cu_free_all(t);
    if (m.ok) moe_w_free(&m, fused);
    free(x), free(res0), free(y), free(yg), free(yo), free(alt), free(ref), free(tol), free(yr), free(ya), free(dummy);
}

void ct_cuda_check_moe(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    int vi = k->variant - CT_CUDA_MOE_FIRST;
    uint64_t s = ctx->seed ^ (0x4d4f45ull + (uint64_t)vi * 7919);
    moe_case(k, &t, res, &s, vi, 1, 1, 0, TOPK, 0, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 3, 1, 0, TOPK, 0, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 17, vi % 2 == 0, 0, TOPK, 0, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 2, 1, 1, TOPK, 0, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 40, 1, 0, TOPK, 0, -1, H0, 0); /* 10 pairs per expert: more than one tile of the grouped path */
    moe_case(k, &t, res, &s, vi, 3, 1, 0, TOPK, 2, -1, H0, 0);  /* the decode kernels with x in the plain layout */
    moe_case(k, &t, res, &s, vi, 16, 1, 0, TOPK, 2, -1, H0, 0);
    /* the walk kernels on one or two blocks: each warp crosses many tiles (and, at H = 2048, the
     * BF16 shared expert's two gate/up batches a row); the walk controls are red here */
    moe_case(k, &t, res, &s, vi, 40, 1, 0, TOPK, 0, -1, H0, 1);
    moe_case(k, &t, res, &s, vi, 17, 1, 0, TOPK, 0, -1, H0, 2);
    moe_case(k, &t, res, &s, vi, 9, 1, 0, TOPK, 0, -1, HMAX, 1);
    cu_close(&t);
}

/* ---- moe_lean.*: the decode down kernel at <= 128 registers (DRAMA_CUDA_MOE_DOWN=lean) ----
 * The decode path's row counts (n <= 16) with top-3 (fewer ranks than one pass of 4), top-5 (a
 * partial second pass) and top-8 (the model's: two passes); each case also compares the grouped
 * path, which equals the per-row one bit for bit, so lean == the decode kernel bit for bit. */
static char lean_names[CT_CUDA_MOE_VARIANTS][40];

static void make_lean_names(void) {
    for (int i = 0; i < CT_CUDA_MOE_VARIANTS; i++) /* "moe.bf16" -> "moe_lean.bf16" */
        snprintf(lean_names[i], sizeof lean_names[i], "moe_lean.%s", moe_v[i].name + 4);
}

static void check_moe_lean(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    int vi = k->variant;
    uint64_t s = ctx->seed ^ (0x4c45414eull + (uint64_t)vi * 7919);
    moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 1, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 1, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 16, vi % 2 == 0, 0, 8, 1, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 2, 1, 1, 8, 1, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 4, 1, 0, 3, 1, -1, H0, 0);
    moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 3, -1, H0, 0); /* lean, x in the plain layout */
    cu_close(&t);
}

/* ---- moe_persist.*: the routing and decode kernels with persistent warps (moe_persist.cuh) ----
 * moe.*'s reference and checks on the decode path's row counts, top-8 / 5 / 3, both layouts, the
 * grid sized to the SMs (at these shapes a warp gets at most an item or two) and capped at 1, 2 or 3
 * blocks a row (every warp walks many items across ranks, the shared expert and outputs: the
 * prefetch across items); each case also runs DRAMA_CUDA_MOE_PERSIST=0 on the same inputs (out and
 * routing weights bit for bit) and the grouped path (bit for bit per row). */
static char persist_names[CT_CUDA_MOE_VARIANTS][40];

static void make_persist_names(void) {
    for (int i = 0; i < CT_CUDA_MOE_VARIANTS; i++) /* "moe.bf16" -> "moe_persist.bf16" */
        snprintf(persist_names[i], sizeof persist_names[i], "moe_persist.%s", moe_v[i].name + 4);
}

/* p2 = 4: moe_persist2.cu's expert kernels (moe_persist2.* entries, the same cases), else 0 */
static void persist_cases(const ct_kernel *k, ct_ctx *ctx, ct_result *res, int p2) {
    cu_t t;
    if (cu_open(&t, res)) return;
    int vi = k->variant;
    uint64_t s = ctx->seed ^ (0x50455253ull + (uint64_t)vi * 7919 + (uint64_t)p2 * 104729);
    moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 1 | p2, 0, H0, 0);
    moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 1 | p2, 1, H0, 0);
    moe_case(k, &t, res, &s, vi, 2, 1, 1, 8, 1 | p2, 3, H0, 0);
    moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 1 | p2, 2, H0, 0);
    moe_case(k, &t, res, &s, vi, 16, vi % 2 == 0, 0, 8, 1 | p2, 1, H0, 0);
    moe_case(k, &t, res, &s, vi, 4, 1, 0, 3, 1 | p2, 0, H0, 0);
    moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 3 | p2, 1, H0, 0); /* x in the plain layout */
    moe_case(k, &t, res, &s, vi, 16, 1, 0, 8, 3 | p2, 0, H0, 0);
    /* H = 2048 (the model's): several batches a gate/up row (FP8: 2, the BF16 shared expert: 4), 2048 outputs */
    moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 1 | p2, 1, HMAX, 0);
    moe_case(k, &t, res, &s, vi, 2, 1, 0, 8, 3 | p2, 2, HMAX, 0);
    if (p2) { /* moe_persist2.cu's down kernel with act read from L2 (DRAMA_CUDA_MOE_DOWN_STAGE=0), as above */
        moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 9 | p2, 1, HMAX, 0);
        moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 11 | p2, 1, H0, 0);
        moe_case(k, &t, res, &s, vi, 2, 1, 0, 8, 17 | p2, 0, HMAX, 0); /* the routing kernel first (DRAMA_CUDA_MOE_ROUTE=kernel) */
        moe_case(k, &t, res, &s, vi, 1, 1, 0, 8, 33 | p2, 1, HMAX, 0); /* the L2 prefetch (DRAMA_CUDA_MOE_L2PF=1) */
        moe_case(k, &t, res, &s, vi, 3, 1, 0, 5, 49 | p2, 0, H0, 0);   /* the prefetch with the routing kernel first */
    }
    cu_close(&t);
}

static void check_moe_persist(const ct_kernel *k, ct_ctx *ctx, ct_result *res) { persist_cases(k, ctx, res, 0); }

static const char *k_persist_precision =
    "moe.*'s contract (float64 reference over the stored weights, exact ids, tol = 2x running bound) with the "
    "persistent routing and decode kernels; == DRAMA_CUDA_MOE_PERSIST=0 and grouped == per row bit for bit";

int ct_cuda_moe_persist_kernels(ct_kernel *out, int max) {
    int n = 0;
    make_persist_names();
    for (int v = 0; v < CT_CUDA_MOE_VARIANTS && n < max; v++, n++)
        out[n] = (ct_kernel){.name = persist_names[v], .backend = "cuda", .precision = k_persist_precision,
                             .check = check_moe_persist, .variant = v, .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_moe_persist_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {1, CT_CUDA_MOE_STALE_VIEW, "device: persistent gate/up walk loads the next item's rows through the current item's expert view"},
        {3, CT_CUDA_MOE_STALE_ROW, "device: persistent down walk loads the next output's routed rows at the current output's row"},
        {5, CT_CUDA_MOE_WSEL_NEXT, "device: persistent down kernel weights a rank with the next rank's weight"},
    };
    int n = 0;
    make_persist_names();
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = persist_names[c[i].v], .backend = "cuda/control", .precision = k_persist_precision,
                             .check = check_moe_persist, .variant = c[i].v, .control = c[i].control,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

/* ---- moe_persist2.*: moe_persist2.cu's expert kernels (DRAMA_CUDA_MOE_PERSIST=2) ----
 * moe_persist.*'s cases with the second persistent kernels: the routed format a template argument,
 * the shared expert's items first (its loads before the PDL wait), decode's scale indices hoisted;
 * each case == DRAMA_CUDA_MOE_PERSIST=0 bit for bit, and the grouped path == per row. The capped
 * grids (1-3 blocks a row) make every warp cross many items and outputs, where the controls sit. */
static char persist2_names[CT_CUDA_MOE_VARIANTS][40];

static void make_persist2_names(void) {
    for (int i = 0; i < CT_CUDA_MOE_VARIANTS; i++) /* "moe.bf16" -> "moe_persist2.bf16" */
        snprintf(persist2_names[i], sizeof persist2_names[i], "moe_persist2.%s", moe_v[i].name + 4);
}

static void check_moe_persist2(const ct_kernel *k, ct_ctx *ctx, ct_result *res) { persist_cases(k, ctx, res, 4); }

static const char *k_persist2_precision =
    "moe.*'s contract (float64 reference over the stored weights, exact ids, tol = 2x running bound) with the "
    "second persistent decode kernels (moe_persist2.cu); == DRAMA_CUDA_MOE_PERSIST=0 and grouped == per row bit for bit";

int ct_cuda_moe_persist2_kernels(ct_kernel *out, int max) {
    int n = 0;
    make_persist2_names();
    for (int v = 0; v < CT_CUDA_MOE_VARIANTS && n < max; v++, n++)
        out[n] = (ct_kernel){.name = persist2_names[v], .backend = "cuda", .precision = k_persist2_precision,
                             .check = check_moe_persist2, .variant = v, .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_moe_persist2_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {1, CT_CUDA_MOE_P2_NEXT_ROW, "device: second persistent gate/up walk loads a routed next item's rows at the next output's row"},
        {4, CT_CUDA_MOE_P2_STALE_SHARED, "device: second persistent down walk loads the next output's shared-expert row at the current output's"},
        {6, CT_CUDA_MOE_WSEL_NEXT, "device: second persistent down kernel weights a rank with the next rank's weight"},
        {2, CT_CUDA_MOE_P2_STAGE_NEXT, "device: second persistent down kernel dots rank q with the next rank's staged SwiGLU row"},
        {7, CT_CUDA_MOE_P2_ROUTE_NEXT, "device: second persistent gate/up kernel's own routing gives a rank the next rank's expert"},
        {6, CT_CUDA_MOE_P2_SCALE_ROW, "device: second persistent down kernel's prefetched FP8 block scales taken from the next row block"},
    };
    int n = 0;
    make_persist2_names();
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = persist2_names[c[i].v], .backend = "cuda/control", .precision = k_persist2_precision,
                             .check = check_moe_persist2, .variant = c[i].v, .control = c[i].control,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

static const char *k_lean_precision =
    "moe.*'s contract (float64 reference over the stored weights, exact ids, tol = 2x running bound) with the "
    "down kernel at <= 128 registers; grouped == per row bit for bit";

int ct_cuda_moe_lean_kernels(ct_kernel *out, int max) {
    int n = 0;
    make_lean_names();
    for (int v = 0; v < CT_CUDA_MOE_VARIANTS && n < max; v++, n++)
        out[n] = (ct_kernel){.name = lean_names[v], .backend = "cuda", .precision = k_lean_precision,
                             .check = check_moe_lean, .variant = v, .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_moe_lean_controls(ct_kernel *out, int max) {
    const struct { int v, control; const char *desc; } c[] = {
        {1, CT_CUDA_MOE_LEAN_NEXT, "device: lean down kernel dots a rank's chunks with the next rank's SwiGLU row"},
        {3, CT_CUDA_MOE_WSEL_NEXT, "device: lean down kernel weights a rank with the next rank's weight"},
    };
    int n = 0;
    make_lean_names();
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = lean_names[c[i].v], .backend = "cuda/control", .precision = k_lean_precision,
                             .check = check_moe_lean, .variant = c[i].v, .control = c[i].control,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
