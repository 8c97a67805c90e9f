/* contract_cuda_gemm.c - `drama contract` entry for the tensor-core BF16 product of the CUDA prefill
 * (backend/cuda/gemm.h): the matmul fixtures' kinds (random, wide range, cancellation, format
 * limits, non-finite) on ragged shapes that exercise partial 16-row tiles, partial 32-column chunks,
 * one and two passes over n, and a batch with row ranges, y_ld, the fused residual add and the
 * second store; against the float64 reference with the bound of docs/cuda.md ("Prefill"):
 * tol = (19 2^-23 + (K/128 + 8) 2^-24) sum |w x| (+ 2^-133 sum |w| over |x| < 2^-100). Row independence is checked exactly: a row's value equals
 * itself computed among 8 rows. Planted, inside the kernel's loop: the third BF16 term of x dropped,
 * the weight's k-steps swapped, and the running sum kept in the mma's accumulator (the old kernel's
 * truncating accumulation). */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/gemm.h"
#include "num/formats.h"

/* x = hi + mid + lo exactly (|x| >= 2^-100), so the error is the sums': a k-step's three mma start
 * from zero; each truncates at most 17 addends (16 products and its C) and its normalisation by an
 * ulp (2^-23) of that k-step's partial, S_step = its sum |w x|: <= 18 2^-23 S_step for the hi mma,
 * 18 2^-23 (2^-8 + 2^-16) S_step and less for the mid and lo ones (lo first), so < 19 2^-23 S_step,
 * summed over the k-steps < 19 2^-23 sum |w x|. Then IEEE adds, each <= 2^-24 of a partial <= sum
 * |w x| (1 + 2^-19): K/128 per thread into its running sum (a warp takes K/8 columns, 16 a k-step),
 * 7 for the 8 warps in order, 1 to spare: (K/128 + 8) 2^-24. K = 2048: 31 2^-23 = 3.7e-6 (was
 * (2^-17 + (K/3 + 16) 2^-23) = 9.1e-5, the mma truncating the whole running sum). */
static double gemm_rel(int64_t K) { return 19.0 * 0x1p-23 + ((double)K / 128.0 + 8.0) * 0x1p-24; }

/* ref [n][rows] and tol for y = x W^T (the stored weight) */
static void gemm_ref(const dr_weight *w, const float *x, int64_t n, double *ref, double *tol) {
    int64_t K = w->cols, R = w->rows;
    double *ax = malloc((size_t)(n * K) * sizeof *ax), *t0 = malloc((size_t)(n * R) * sizeof *t0);
    ct_matmul_reference(w, x, n, (int)-K, ref, t0, NULL); /* (K + chain) = 0: the value only */
    for (int64_t i = 0; i < n * K; i++) ax[i] = fabs((double)x[i]);
    ct_matmul_abs(w, ax, n, tol);
    for (int64_t i = 0; i < n * K; i++) ax[i] = fabs((double)x[i]) < 0x1p-100 ? 0x1p-133 : 0.0; /* lo underflows */
    ct_matmul_abs(w, ax, n, t0);
    for (int64_t i = 0; i < n * R; i++) tol[i] = gemm_rel(K) * tol[i] + t0[i] + 0x1p-140;
    free(ax), free(t0);
}

static drama_status run_jobs(const ct_kernel *k, cu_t *t, dr_cuda_job *jobs, int count) {
    if (t->failed) return DRAMA_EINTERNAL;
    drama_status st = dr_cuda_gemm_batch(t->c, jobs, count, k->control, &t->err);
    if (st) t->failed = 1;
    return st;
}

/* one product [rows, cols] x n of fixture kind `kind`; keep (may be NULL): y [n][rows] for reuse */
static void one_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, int kind, int64_t rows, int64_t cols,
                     int64_t n, float **keep_y, float **keep_x, dr_weight **keep_w, ct_w *wt) {
    float *wsrc = malloc((size_t)(rows * cols) * sizeof *wsrc), *x = malloc((size_t)(n * cols) * sizeof *x);
    float *y = malloc((size_t)(n * rows) * sizeof *y);
    double *ref = malloc((size_t)(n * rows) * sizeof *ref), *tol = malloc((size_t)(n * rows) * sizeof *tol);
    char name[128];
    snprintf(name, sizeof name, "%s [%lld,%lld] n=%lld", ct_matmul_kinds[kind], (long long)rows, (long long)cols,
             (long long)n);
    ct_matmul_fill(kind, CT_F_BF16, s, wsrc, rows, cols, x, n);
    /* every x = hi + mid + lo with lo = 7 2^-20 of hi (just under half mid's ulp): dropping lo costs
     * 56 2^-23 of a positive sum, 1.8 x the tolerance at K = 2048 (31 2^-23) */
    if (kind == CT_K_DISCR)
        for (int64_t i = 0; i < n * cols; i++)
            x[i] = (float)ldexp(1.0 + 1.875 * 0x1p-9 + 7.0 * 0x1p-20, (int)(i % 5) - 2);
    if (ct_w_make(wt, CT_F_BF16, wsrc, rows, cols)) {
        ct_case_error(res, name, "could not build the weight");
        free(wsrc), free(x), free(y), free(ref), free(tol);
        return;
    }
    gemm_ref(&wt->w, x, n, ref, tol);
    float *alt = NULL; /* the discriminating fixture's x as two BF16 terms (hi + mid, no lo): must fail */
    if (kind == CT_K_DISCR && (alt = malloc((size_t)(n * rows) * sizeof *alt))) {
        float *xh = malloc((size_t)(n * cols) * sizeof *xh);
        for (int64_t i = 0; i < n * cols; i++) {
            float hi = dr_bf16_to_f32(dr_f32_to_bf16(x[i]));
            xh[i] = hi + dr_bf16_to_f32(dr_f32_to_bf16(x[i] - hi));
        }
        double *ah = malloc((size_t)(n * rows) * sizeof *ah), *th = malloc((size_t)(n * rows) * sizeof *th);
        gemm_ref(&wt->w, xh, n, ah, th);
        for (int64_t i = 0; i < n * rows; i++) alt[i] = (float)ah[i];
        free(xh), free(ah), free(th);
    }
    dr_cuda_weight *dw = cu_weight(t, &wt->w);
    float *dx = cu_put(t, x, (size_t)(n * cols) * 4), *dy = cu_poison(t, (size_t)(n * rows) * 4);
    dr_cuda_job j = {dw, dx, n, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
    run_jobs(k, t, &j, 1);
    cu_get(t, y, dy, (size_t)(n * rows) * 4);
    if (!cu_case_end(t, res, name)) {
        ct_compare(res, name, y, ref, tol, n * rows);
        if (alt) ct_discriminate(res, name, alt, ref, tol, n * rows);
    }
    free(alt);
    if (keep_y) *keep_y = y, *keep_x = x, *keep_w = &wt->w;
    else free(y), free(x), ct_w_free(wt);
    free(wsrc), free(ref), free(tol);
}

/* rows 3..10 of a product again, as a call of 8 rows: the same bits */
static void independence_case(const ct_kernel *k, cu_t *t, ct_result *res, const dr_weight *w, const float *x,
                              const float *y, int64_t n) {
    const int64_t m = 8, off = 3, R = w->rows, K = w->cols;
    if (n < off + m) return;
    float *y8 = malloc((size_t)(m * R) * sizeof *y8);
    double *ref = malloc((size_t)(m * R) * sizeof *ref), *zero = calloc((size_t)(m * R), sizeof *zero);
    for (int64_t i = 0; i < m * R; i++) ref[i] = y[off * R + i];
    dr_cuda_weight *dw = cu_weight(t, w);
    float *dx = cu_put(t, x + off * K, (size_t)(m * K) * 4), *dy = cu_poison(t, (size_t)(m * R) * 4);
    dr_cuda_job j = {dw, dx, m, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
    run_jobs(k, t, &j, 1);
    cu_get(t, y8, dy, (size_t)(m * R) * 4);
    const char *name = "rows 3..10 as a call of 8 rows == the same rows of the larger call (exact)";
    if (!cu_case_end(t, res, name)) ct_compare(res, name, y8, ref, zero, m * R);
    free(y8), free(ref), free(zero);
}

/* one batch: a row range written at y_ld, a residual add (y += ), and the second store (y2 += ) */
static void batch_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s) {
    const int64_t R = 70, K = 264, n = 11, r0 = 5, r1 = 53, ld = 60;
    float *wsrc = malloc((size_t)(R * K) * 4), *x = malloc((size_t)(n * K) * 4);
    ct_matmul_fill(CT_K_RANDOM, CT_F_BF16, s, wsrc, R, K, x, n);
    ct_w wt;
    if (ct_w_make(&wt, CT_F_BF16, wsrc, R, K)) {
        ct_case_error(res, "batch", "could not build the weight");
        free(wsrc), free(x);
        return;
    }
    double *ref = malloc((size_t)(n * R) * 8), *tol = malloc((size_t)(n * R) * 8);
    gemm_ref(&wt.w, x, n, ref, tol);
    /* y_a: rows [r0, r1) at stride ld, the rest poisoned; y_b, y2: initial values added to */
    float *ya = malloc((size_t)(n * ld) * 4), *yb = malloc((size_t)(n * R) * 4), *y2 = malloc((size_t)(n * R) * 4);
    float *ga = malloc((size_t)(n * ld) * 4), *gb = malloc((size_t)(n * R) * 4), *g2 = malloc((size_t)(n * R) * 4);
    ct_poison(ya, n * ld);
    for (int64_t i = 0; i < n * R; i++) yb[i] = (float)ct_rand_normal(s), y2[i] = (float)ct_rand_normal(s);
    dr_cuda_weight *dw = cu_weight(t, &wt.w);
    float *dx = cu_put(t, x, (size_t)(n * K) * 4), *dya = cu_put(t, ya, (size_t)(n * ld) * 4);
    float *dyb = cu_put(t, yb, (size_t)(n * R) * 4), *dy2 = cu_put(t, y2, (size_t)(n * R) * 4);
    dr_cuda_job jobs[2] = {{dw, dx, n, dya, r0, r1, ld, 0, NULL, NULL, 0, 0, NULL},
                           {dw, dx, n, dyb, 0, 0, 0, 1, dy2, NULL, 0, 0, NULL}};
    run_jobs(k, t, jobs, 2);
    cu_get(t, ga, dya, (size_t)(n * ld) * 4);
    cu_get(t, gb, dyb, (size_t)(n * R) * 4);
    cu_get(t, g2, dy2, (size_t)(n * R) * 4);
    const char *name = "batch: rows [5,53) at y_ld 60 | y += | y2 +=";
    if (!cu_case_end(t, res, name)) {
        double *ra = malloc((size_t)(n * (r1 - r0)) * 8), *ta = malloc((size_t)(n * (r1 - r0)) * 8);
        float *oa = malloc((size_t)(n * (r1 - r0)) * 4);
        double *rb = malloc((size_t)(n * R) * 8), *r2 = malloc((size_t)(n * R) * 8), *tb = malloc((size_t)(n * R) * 8);
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = r0; r < r1; r++) {
                ra[i * (r1 - r0) + r - r0] = ref[i * R + r], ta[i * (r1 - r0) + r - r0] = tol[i * R + r];
                oa[i * (r1 - r0) + r - r0] = ga[i * ld + r - r0];
            }
        for (int64_t i = 0; i < n * R; i++) {
            rb[i] = (double)yb[i] + ref[i], r2[i] = (double)y2[i] + ref[i];
            tb[i] = tol[i] + 0x1p-24 * (fabs(rb[i]) + tol[i]); /* one more fp32 rounding (the add) */
        }
        ct_compare(res, "row range at y_ld", oa, ra, ta, n * (r1 - r0));
        int untouched = 1;
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = r1 - r0; c < ld; c++) untouched &= !memcmp(&ga[i * ld + c], &ya[i * ld + c], 4);
        float u = (float)untouched;
        double one = 1, z = 0;
        ct_compare(res, "columns past r1 - r0 of a y_ld row untouched", &u, &one, &z, 1);
        ct_compare(res, "y += x W^T", gb, rb, tb, n * R);
        for (int64_t i = 0; i < n * R; i++) tb[i] = tol[i] + 0x1p-24 * (fabs(r2[i]) + tol[i]);
        ct_compare(res, "y2 += x W^T", g2, r2, tb, n * R);
        free(ra), free(ta), free(oa), free(rb), free(r2), free(tb);
    }
    ct_w_free(&wt);
    free(wsrc), free(x), free(ref), free(tol), free(ya), free(yb), free(y2), free(ga), free(gb), free(g2);
}

static void check_gemm(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x47454d4dull;
    /* shapes: ragged 16-row tiles and 32-column chunks; n <= 32 (one pass of 4 tiles), n in (32, 64]
     * and n > 64 (passes of 8 tiles); n = 1 and n = 8 through the same kernel */
    const int64_t shapes[][3] = {{37, 104, 8}, {130, 2048, 30}, {64, 512, 1}, {48, 40, 33}, {300, 200, 69}, {16, 2056, 17}};
    for (int kind = 0; kind < CT_K_KINDS; kind++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            ct_w wt;
            if (kind == CT_K_DISCR && i != 1) continue; /* one long positive sum is the discriminating case */
            float *y = NULL, *x = NULL;
            dr_weight *w = NULL;
            int keep = kind == CT_K_RANDOM && i == 1;
            one_case(k, &t, res, &s, kind, shapes[i][0], shapes[i][1], shapes[i][2], keep ? &y : NULL, &x, &w, &wt);
            if (keep && y) {
                independence_case(k, &t, res, w, x, y, shapes[i][2]);
                free(y), free(x), ct_w_free(&wt);
            }
        }
    batch_case(k, &t, res, &s);
    cu_close(&t);
}

/* ---- timing: [2048, 2048] x 30 rows, the prefill's shape ---- */
typedef struct gemm_timed {
    cu_t *t;
    dr_cuda_job job;
} gemm_timed;

static drama_status timed_gemm(void *arg) {
    gemm_timed *g = arg;
    return dr_cuda_gemm_batch(g->t->c, &g->job, 1, 0, &g->t->err);
}

static double time_gemm(const ct_kernel *k, ct_ctx *ctx) {
    (void)k, (void)ctx;
    cu_t t;
    ct_result r = {0};
    if (cu_open(&t, &r)) return INFINITY;
    const int64_t R = 2048, K = 2048, n = 30;
    uint64_t s = 17;
    float *w = malloc((size_t)(R * K) * 4), *x = malloc((size_t)(n * K) * 4);
    ct_matmul_fill(CT_K_RANDOM, CT_F_BF16, &s, w, R, K, x, n);
    ct_w wt;
    double ms = INFINITY;
    if (!ct_w_make(&wt, CT_F_BF16, w, R, K)) {
        gemm_timed g = {&t, {cu_weight(&t, &wt.w), cu_put(&t, x, (size_t)(n * K) * 4), n, cu_alloc(&t, (size_t)(n * R) * 4), 0,
                             0, 0, 0, NULL, NULL, 0, 0, NULL}};
        ms = cu_time(&t, timed_gemm, &g);
        ct_w_free(&wt);
    }
    free(w), free(x);
    cu_close(&t);
    return ms;
}

static const char *k_precision_gemm =
    "x split as BF16 hi + mid + lo (exact), each k-step's mma.sync m16n8k16 into a fresh fp32 accumulator, "
    "IEEE adds into the running sum, 8 K-slices summed in order; tol = (19 2^-23 + (K/128 + 8) 2^-24) sum|w x| "
    "(+ 2^-133 sum|w| over |x| < 2^-100); a row's value does not depend on the other rows";

int ct_cuda_gemm_kernels(ct_kernel *out, int max) {
    if (max < 1) return 0;
    /* limit: the [2048, 2048] BF16 weight (8 MiB) at 4.0 TB/s, times 2, plus 10 us */
    out[0] = (ct_kernel){.name = "gemm_tc.bf16", .backend = "cuda", .precision = k_precision_gemm,
                         .check = check_gemm, .time = time_gemm, .time_shape = "[2048,2048] x 30 rows (CUDA events)",
                         .limit_ms = 2.0 * 2048.0 * 2048.0 * 2.0 / 4.0e12 * 1e3 + 0.010, .unavailable = cu_unavailable};
    return 1;
}

int ct_cuda_gemm_controls(ct_kernel *out, int max) {
    const struct { int defect; const char *desc; } c[] = {
        {DR_CUDA_GEMM_DEFECT_NO_LO, "device: the third BF16 term of x's split (lo) dropped"},
        {DR_CUDA_GEMM_DEFECT_SWAP_K, "device: the weight's two k-steps of a chunk swapped"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = "gemm_tc.bf16", .backend = "cuda/control", .precision = k_precision_gemm,
                             .check = check_gemm, .control = c[i].defect, .control_desc = c[i].desc,
                             .unavailable = cu_unavailable};
    return n;
}

#else

int ct_cuda_gemm_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}
int ct_cuda_gemm_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

#endif
