/* contract_cuda_norm.c - `drama contract` entry for the CUDA product with its RMS norm fused into the
 * staging of x (dr_cuda_job.norm: the frame's norm -> projection pairs, cuda_seam_ops.cu): y = W
 * rms_norm(x, w) and the normed x written beside it, against a float64 reference (the norm's running
 * bound carried into the product's, contract_ev.h), per stored format of the frame's projections.
 * The planted control drops the norm weight inside the kernel's staging. docs/contract.md. */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "tools/contract_ev.h"

static const struct {
    const char *name;
    int f;
} nv[] = {{"matmul_norm.bf16", CT_F_BF16}, {"matmul_norm.fp8_block", CT_F_FP8B}, {"matmul_norm.nvfp4", CT_F_NVFP4}};
#define NV_COUNT (int)(sizeof nv / sizeof nv[0])

static void *xm(size_t n) { return calloc(n ? n : 1, 1); }

/* one case: rows x cols weights of format f, x of `scale`, norm weight or none; positive: positive x
 * and weights in [0.5, 1] * 2 / cols (long positive sums), whose fp16-accumulated product must fail */
static void norm_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int f, int64_t rows, int64_t cols,
                      int with_w, double scale, int positive) {
    const double eps = 1e-6;
    float *src = xm((size_t)(rows * cols) * 4), *x = xm((size_t)cols * 4), *w = xm((size_t)cols * 4);
    float *xn = xm((size_t)cols * 4), *y = xm((size_t)rows * 4), *yn = xm((size_t)cols * 4), *alt = xm((size_t)rows * 4);
    double *exn = xm((size_t)cols * 8), *ref = xm((size_t)rows * 8), *tol = xm((size_t)rows * 8);
    double *nref = xm((size_t)cols * 8), *ntol = xm((size_t)cols * 8);
    double *pr = xm((size_t)rows * 8), *pt = xm((size_t)rows * 8), *pe = xm((size_t)rows * 8);
    ev *xe = xm((size_t)cols * sizeof(ev));
    for (int64_t i = 0; i < rows * cols; i++)
        src[i] = positive ? (float)((0.5 + 0.5 * ct_rand_uniform(s)) * 2.0 / (double)cols) : (float)(0.05 * ct_rand_normal(s));
    for (int64_t i = 0; i < cols; i++) {
        x[i] = positive ? (float)(scale * (0.5 + 0.5 * ct_rand_uniform(s))) : (float)(scale * ct_rand_normal(s));
        w[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
        xe[i] = ev_in(x[i]);
    }
    ev rr = ev_rms_r(xe, cols, eps);
    for (int64_t i = 0; i < cols; i++) { /* the normed x as the kernel rounds it, with its bound */
        ev v = ev_mul(xe[i], rr);
        if (with_w) v = ev_mul(v, ev_in(w[i]));
        xn[i] = (float)v.v;
        exn[i] = v.e + fabs(v.v - (double)xn[i]);
        nref[i] = v.v, ntol[i] = ev_tol(v);
    }
    ct_w W;
    int ok = ct_w_make(&W, f, src, rows, cols) == 0;
    if (ok) {
        ct_matmul_reference(&W.w, xn, 1, 8, pr, pt, alt);
        ct_matmul_abs(&W.w, exn, 1, pe);
        for (int64_t r = 0; r < rows; r++) {
            ev o = {pr[r], pt[r] + pe[r]};
            ref[r] = o.v, tol[r] = ev_tol(o);
        }
    }
    dr_cuda_weight *dw = ok ? cu_weight(t, &W.w) : NULL;
    float *dx = cu_put(t, x, (size_t)cols * 4), *dnw = cu_put(t, w, (size_t)cols * 4);
    float *dy = cu_poison(t, (size_t)rows * 4), *dyn = cu_poison(t, (size_t)cols * 4);
    dr_cuda_job j = {dw, dx, 1, dy, 0, 0, 0, 0, NULL, with_w ? dnw : NULL, eps, 1, dyn};
    if (dw && !t->failed) {
        drama_status st = k->control ? dr_cuda_matmul_batch_defect(t->c, &j, 1, k->control, &t->err)
                                     : dr_cuda_matmul_batch(t->c, &j, 1, &t->err);
        if (st) t->failed = 1;
    }
    cu_get(t, y, dy, (size_t)rows * 4);
    cu_get(t, yn, dyn, (size_t)cols * 4);
    char name[128];
    snprintf(name, sizeof name, "%s%s [%lld, %lld] x scale %g%s", positive ? "fp16-discriminating " : "",
             nv[k->variant].name, (long long)rows, (long long)cols, scale, with_w ? " weighted" : "");
    if (!ok) ct_case_error(res, name, "could not build the weights");
    else if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, rows);
        ct_compare(res, "the normed x written beside", yn, nref, ntol, cols);
        if (positive) ct_discriminate(res, name, alt, ref, tol, rows);
    }
    if (ok) ct_w_free(&W);
    cu_free_all(t);
    free(src), free(x), free(w), free(xn), free(y), free(yn), free(alt), free(exn), free(ref), free(tol), free(nref), free(ntol);
    free(pr), free(pt), free(pe), free(xe);
}

static void check_norm(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ (0x4e4f524dull + (uint64_t)k->variant * 131);
    const int f = nv[k->variant].f;
    const int64_t g = ct_matmul_granule(f) > 32 ? ct_matmul_granule(f) : 32;
    norm_case(k, &t, res, &s, f, 37, 2 * g, 1, 1.0, 0);
    norm_case(k, &t, res, &s, f, 300, 1024, 1, 3.0, 0);
    norm_case(k, &t, res, &s, f, 2200, 2048, 1, 0.01, 0); /* 16-warp blocks (>= 16 rows per SM) */
    norm_case(k, &t, res, &s, f, 130, 2048, 0, 1.0, 0);
    norm_case(k, &t, res, &s, f, 64, 2048, 1, 1.0, 1);
    cu_close(&t);
}

int ct_cuda_norm_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < NV_COUNT && n < max; v++, n++)
        out[n] = (ct_kernel){.name = nv[v].name, .backend = "cuda",
                             .precision = "rms_norm (double sum in rms_norm_kernel's order, r rounded once, two fp32 "
                                          "products) staged as x of the n=1 product; tol = 2x (the norm's bound carried "
                                          "through |W|, plus (K+8) u sum|x w|)",
                             .check = check_norm, .variant = v, .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_norm_controls(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = nv[0].name, .backend = "cuda/control", .precision = "see the entry",
                         .check = check_norm, .variant = 0, .control = DR_CUDA_DEFECT_NORM_NO_WEIGHT,
                         .control_desc = "device: the norm weight skipped in the staging", .unavailable = cu_unavailable};
    return 1;
}

#endif
