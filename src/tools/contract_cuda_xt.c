/* contract_cuda_xt.c - `drama contract` entries for the n = 1 product (matvec1_kernel) in its
 * non-default modes: x staged in the plain layout (DRAMA_CUDA_XT=0; the default is chunk-transposed),
 * `matmul_xt0.<fmt>`, and one row per warp (DRAMA_CUDA_MV1_PERSIST=0; the default: persistent warps
 * walking rows), `matmul_row1.<fmt>`, for every stored format of the matmul entries. Cases: every matmul fixture (contract_matmul.c: ragged shapes
 * x kinds and the fp16-discriminating one), each activation row as its own n = 1 job of one batch;
 * rows of up to MV1_MAX_COLS columns (a ragged last chunk), dead warps, a row range, a batch over two
 * weights, the fused residual add and second store; all against the float64 reference, and each also
 * bit for bit against the default kernel with the default layout on the same inputs, as is the fused
 * norm's case (its float64 check is matmul_norm.*'s: the staging is the same function). The
 * transposed layout's control (`matmul_xt.bf16`) dots each chunk with the next chunk's x (inside the
 * new indexing). A walk case, [9000, 2160] (more rows than the device holds warps twice over, two
 * batches of loads a row for 16- and 32-bit weights, the last batch holding chunks for only some lanes:
 * 270 and 540 chunks), makes the persistent warps prefetch across rows; its
 * control (`matmul_walk.fp8_block`, default modes) loads each warp's next row from the row after it.
 * `matmul_l2pf.<fmt>`: the same cases with the L2 prefetch before the wait (DRAMA_CUDA_MV1_L2PF); it
 * holds no value, so it has no control of its own: the cases check it changes no bit and faults nowhere.
 * docs/contract.md "CUDA entries". */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"

#define CUDA_CHAIN 8  /* contract_cuda.c's: (K + 8) u sum |x| m */
#define MAX_COLS 11776 /* matvec1_kernel's widest row (MV1_MAX_COLS) */

/* mode: the staging of x (dr_cuda_set_xt) and the rows per warp (dr_cuda_set_mv1_one_row); 0 = the
 * defaults; 2 and 4 are the controls' names */
#define NMODE 6
static const char *const mode_name[NMODE] = {"", "xt0", "xt", "row1", "walk", "l2pf"};
static const int mode_xt[NMODE] = {1, 0, 1, 1, 1, 1}, mode_one_row[NMODE] = {0, 0, 0, 1, 0, 0};
/* mode 5 ("l2pf"): DRAMA_CUDA_MV1_L2PF=4, the first 4 MiB of a launch's rows prefetched into L2 (the
 * small fixtures whole, the walk's 39 MB in part): a prefetch changes no value, so bit for bit mode 0 */
static const int64_t mode_l2pf[NMODE] = {0, 0, 0, 0, 0, (int64_t)4 << 20};
static char names[NMODE][CT_F_COUNT][40];

static void make_names(void) {
    for (int mode = 1; mode < NMODE; mode++)
        for (int f = 0; f < CT_F_COUNT; f++) /* "matmul.bf16" -> "matmul_xt0.bf16" */
            snprintf(names[mode][f], sizeof names[mode][f], "matmul_%s.%s", mode_name[mode], ct_matmul_names[f] + 7);
}

static int mode_of(const ct_kernel *k) { return (k->variant >> 8) & 7; }

static drama_status set_mode(cu_t *t, int mode) {
    drama_status st = dr_cuda_set_xt(t->c, mode_xt[mode], &t->err);
    if (!st) st = dr_cuda_set_mv1_l2pf(t->c, mode_l2pf[mode], &t->err);
    return st ? st : dr_cuda_set_mv1_one_row(t->c, mode_one_row[mode], &t->err);
}

/* The products of `jobs` in mode 1 .. NMODE-1 (with the entry's planted defect, if any), or with the
 * default layout in mode 0. */
static drama_status run(const ct_kernel *k, cu_t *t, int mode, const dr_cuda_job *jobs, int count) {
    if (t->failed) return DRAMA_EINTERNAL;
    drama_status st = set_mode(t, mode);
    if (!st) st = mode && k->control ? dr_cuda_matmul_batch_defect(t->c, jobs, count, k->control, &t->err)
                                     : dr_cuda_matmul_batch(t->c, jobs, count, &t->err);
    if (st) t->failed = 1;
    return st;
}

/* ct_matmul_run_fn: the fixture's n activation rows as n jobs of n = 1 in one batch */
static int run_rows(const ct_kernel *k, ct_ctx *ctx, const dr_weight *w, const float *x, int64_t n, float *y, void *arg,
                    char *msg, size_t msg_size) {
    (void)ctx;
    cu_t *t = arg;
    dr_cuda_job jobs[DR_CUDA_MAX_BATCH];
    dr_cuda_weight *dw = cu_weight(t, w);
    float *dx = cu_put(t, x, (size_t)(n * w->cols) * 4), *dy = cu_poison(t, (size_t)(n * w->rows) * 4);
    for (int64_t r = 0; r < n && r < DR_CUDA_MAX_BATCH; r++)
        jobs[r] = (dr_cuda_job){dw, dx ? dx + r * w->cols : NULL, 1, dy ? dy + r * w->rows : NULL, 0, 0, 0, 0,
                                NULL, NULL, 0, 0, NULL};
    if (n > DR_CUDA_MAX_BATCH) t->failed = 1, snprintf(t->err.message, sizeof t->err.message, "n=%lld rows", (long long)n);
    if (!t->failed) run(k, t, mode_of(k), jobs, (int)n);
    cu_get(t, y, dy, (size_t)(n * w->rows) * 4);
    int bad = t->failed;
    if (bad) snprintf(msg, msg_size, "%s", t->err.message);
    t->failed = 0;
    cu_free_all(t);
    return bad ? -1 : 0;
}

/* y0 + p and its bound: p within tol of ref, then one fp32 addition */
static void add_ref(const float *y0, const double *ref, const double *tol, int64_t m, double *ra, double *ta) {
    for (int64_t i = 0; i < m; i++) {
        ra[i] = (double)y0[i] + ref[i];
        ta[i] = tol[i] + CT_U32 * (fabs(ra[i]) + tol[i]);
    }
}

/* out must equal want bit for bit (NaN where want is NaN) */
static void same_bits(ct_result *res, const char *name, const float *out, const float *want, int64_t m) {
    double *r = calloc((size_t)m, 8), *z = calloc((size_t)m, 8);
    for (int64_t i = 0; i < m; i++) r[i] = want[i];
    ct_compare(res, name, out, r, z, m);
    free(r), free(z);
}

/* The structure: fixture a [37, long] (ragged last chunk for the 1-byte-granule formats; warps dead
 * in the last block), fixture b [130, 1000]; one batch of jobs: a whole, b whole, a rows [3, 30), b
 * with add, a with the second store; then a fused norm on b. Each launch runs in the entry's mode and
 * in the default one from the same poisoned / prefilled buffers. */
static void structure(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *seed) {
    const int f = k->variant & 0xFF, mode = mode_of(k);
    ct_mm_fixture a, b;
    ct_mm_fixture_make(&a, f, seed, 37, MAX_COLS - 5, 1, CUDA_CHAIN); /* rounded up to the granule, <= MAX_COLS */
    ct_mm_fixture_make(&b, f, seed, 130, 1000, 1, CUDA_CHAIN);
    char name[160];
    if (!a.ok || !b.ok || a.cols > MAX_COLS) {
        ct_case_error(res, "structure", "could not build the weights");
        ct_mm_fixture_free(&a), ct_mm_fixture_free(&b);
        return;
    }
    enum { NJ = 5 };
    const int64_t rows[NJ] = {a.rows, b.rows, 27, b.rows, a.rows}, ys[NJ + 1] = {0, 37, 167, 194, 324, 361};
    float *y0 = malloc((size_t)ys[NJ] * 4), *yv = malloc((size_t)ys[NJ] * 4), *yd = malloc((size_t)ys[NJ] * 4);
    float *y2v = malloc((size_t)a.rows * 4), *y2d = malloc((size_t)a.rows * 4), *y20 = malloc((size_t)a.rows * 4);
    ct_poison(y0, ys[NJ]);
    for (int64_t i = 0; i < b.rows; i++) y0[ys[3] + i] = (float)ct_rand_normal(seed); /* add: a residual */
    for (int64_t i = 0; i < a.rows; i++) y20[i] = (float)ct_rand_normal(seed);
    int ok = 1;
    for (int pass = 0; pass < 2 && ok; pass++) { /* 0: the entry's mode, 1: the default */
        dr_cuda_weight *wa = cu_weight(t, &a.t.w), *wb = cu_weight(t, &b.t.w);
        float *xa = cu_put(t, a.x, (size_t)a.cols * 4), *xb = cu_put(t, b.x, (size_t)b.cols * 4);
        float *dy = cu_put(t, y0, (size_t)ys[NJ] * 4), *dy2 = cu_put(t, y20, (size_t)a.rows * 4);
        dr_cuda_job j[NJ] = {
            {wa, xa, 1, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL},
            {wb, xb, 1, dy ? dy + ys[1] : NULL, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL},
            {wa, xa, 1, dy ? dy + ys[2] : NULL, 3, 30, 0, 0, NULL, NULL, 0, 0, NULL},
            {wb, xb, 1, dy ? dy + ys[3] : NULL, 0, 0, 0, 1, NULL, NULL, 0, 0, NULL},
            {wa, xa, 1, dy ? dy + ys[4] : NULL, 0, 0, 0, 0, dy2, NULL, 0, 0, NULL},
        };
        if (!t->failed) run(k, t, pass ? 0 : mode, j, NJ);
        cu_get(t, pass ? yd : yv, dy, (size_t)ys[NJ] * 4);
        cu_get(t, pass ? y2d : y2v, dy2, (size_t)a.rows * 4);
        ok = !cu_case_end(t, res, pass ? "structure batch, default kernel" : "structure batch");
    }
    if (ok) {
        const int64_t r0[NJ] = {0, 0, 3, 0, 0};
        const ct_mm_fixture *fx[NJ] = {&a, &b, &a, &b, &a};
        for (int i = 0; i < NJ; i++) {
            snprintf(name, sizeof name, "%s batch job %d [%lld,%lld] rows [%lld,%lld)%s", mode_name[mode], i,
                     (long long)fx[i]->rows, (long long)fx[i]->cols, (long long)r0[i], (long long)(r0[i] + rows[i]),
                     i == 3 ? " add" : i == 4 ? " y2" : "");
            if (i == 3) {
                double *ra = malloc((size_t)b.rows * 8), *ta = malloc((size_t)b.rows * 8);
                add_ref(y0 + ys[3], b.ref, b.tol, b.rows, ra, ta);
                ct_compare(res, name, yv + ys[3], ra, ta, b.rows);
                free(ra), free(ta);
            } else {
                ct_mm_compare_rows(res, name, fx[i], 0, 1, r0[i], r0[i] + rows[i], yv + ys[i]);
            }
        }
        double *ra = malloc((size_t)a.rows * 8), *ta = malloc((size_t)a.rows * 8);
        add_ref(y20, a.ref, a.tol, a.rows, ra, ta);
        ct_compare(res, "y2 += x W^T beside job 4", y2v, ra, ta, a.rows);
        free(ra), free(ta);
        same_bits(res, "batch == the default n = 1 kernel (bit for bit)", yv, yd, ys[NJ]);
        same_bits(res, "y2 == the default n = 1 kernel's (bit for bit)", y2v, y2d, a.rows);
    }
    /* the fused norm (dr_cuda_job.norm) on b: y and the normed x, the entry's == default bit for bit */
    float *nw = malloc((size_t)b.cols * 4), *yn[2], *xn[2];
    for (int pass = 0; pass < 2; pass++) yn[pass] = malloc((size_t)b.rows * 4), xn[pass] = malloc((size_t)b.cols * 4);
    for (int64_t i = 0; i < b.cols; i++) nw[i] = (float)(1.0 + 0.1 * ct_rand_normal(seed));
    ok = 1;
    for (int pass = 0; pass < 2 && ok; pass++) {
        dr_cuda_weight *wb = cu_weight(t, &b.t.w);
        float *xb = cu_put(t, b.x, (size_t)b.cols * 4), *dnw = cu_put(t, nw, (size_t)b.cols * 4);
        float *dy = cu_poison(t, (size_t)b.rows * 4), *dxn = cu_poison(t, (size_t)b.cols * 4);
        dr_cuda_job j = {wb, xb, 1, dy, 0, 0, 0, 0, NULL, dnw, 1e-6, 1, dxn};
        if (!t->failed) run(k, t, pass ? 0 : mode, &j, 1);
        cu_get(t, yn[pass], dy, (size_t)b.rows * 4);
        cu_get(t, xn[pass], dxn, (size_t)b.cols * 4);
        ok = !cu_case_end(t, res, pass ? "fused norm, default kernel" : "fused norm");
    }
    if (ok) {
        same_bits(res, "fused norm: y == the default n = 1 kernel's (bit for bit)", yn[0], yn[1], b.rows);
        same_bits(res, "fused norm: normed x == the default kernel's (bit for bit)", xn[0], xn[1], b.cols);
    }
    for (int pass = 0; pass < 2; pass++) free(yn[pass]), free(xn[pass]);
    t->failed = 0;
    cu_free_all(t);
    free(nw), free(y0), free(yv), free(yd), free(y2v), free(y2d), free(y20);
    ct_mm_fixture_free(&a), ct_mm_fixture_free(&b);
}

/* The walk: [9000, 2160] as one n = 1 job, in the entry's mode and the default one, against the
 * float64 reference and bit for bit. 9000 rows exceed twice the warps an H200 holds (132 SMs x 64),
 * so every persistent warp walks two rows or more and prefetches across them; 2160 columns leave the
 * 16- and 32-bit rows' last batch of 256 chunks with chunks for lanes 0-13 (0-27) only, where a
 * per-lane end-of-row test would split the warp before its xor tree. */
static void walk(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *seed) {
    const int mode = mode_of(k);
    ct_mm_fixture c;
    ct_mm_fixture_make(&c, k->variant & 0xFF, seed, 9000, 2160, 1, CUDA_CHAIN);
    if (!c.ok) {
        ct_case_error(res, "walk", "could not build the weights");
        ct_mm_fixture_free(&c);
        return;
    }
    float *y[2] = {malloc((size_t)c.rows * 4), malloc((size_t)c.rows * 4)};
    int ok = 1;
    for (int pass = 0; pass < 2 && ok; pass++) { /* 0: the entry's mode, 1: the default */
        dr_cuda_weight *w = cu_weight(t, &c.t.w);
        float *x = cu_put(t, c.x, (size_t)c.cols * 4), *dy = cu_poison(t, (size_t)c.rows * 4);
        dr_cuda_job j = {w, x, 1, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
        if (!t->failed) run(k, t, pass ? 0 : mode, &j, 1);
        cu_get(t, y[pass], dy, (size_t)c.rows * 4);
        ok = !cu_case_end(t, res, pass ? "walk [9000,2160], default kernel" : "walk [9000,2160]");
    }
    if (ok) {
        ct_mm_compare_rows(res, "walk [9000,2160] n=1", &c, 0, 1, 0, c.rows, y[0]);
        same_bits(res, "walk == the default n = 1 kernel (bit for bit)", y[0], y[1], c.rows);
    }
    t->failed = 0;
    cu_free_all(t);
    free(y[0]), free(y[1]);
    ct_mm_fixture_free(&c);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    ct_matmul_cases(k, ctx, res, CUDA_CHAIN, run_rows, &t);
    uint64_t seed = ctx->seed ^ ((uint64_t)(uint32_t)k->variant * 2654435761u + 11u);
    structure(k, &t, res, &seed);
    walk(k, &t, res, &seed);
    cu_close(&t);
}

/* ---- timing: [2048, 2048] n = 1, as the matmul.* entries (bench_cuda_matmul has more shapes) ---- */

typedef struct st_timed {
    cu_t *t;
    dr_cuda_job job;
} st_timed;

static drama_status timed(void *arg) {
    st_timed *m = arg;
    return dr_cuda_matmul_batch(m->t->c, &m->job, 1, &m->t->err);
}

static double time_one(const ct_kernel *k, int64_t rows, int64_t cols) {
    cu_t t;
    ct_result r = {0};
    if (cu_open(&t, &r)) return INFINITY;
    uint64_t s = 99;
    float *src = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)cols * 4);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)(ct_rand_normal(&s) * 0.02);
    for (int64_t i = 0; i < cols; i++) x[i] = (float)ct_rand_normal(&s);
    ct_w w;
    double ms = INFINITY;
    if (ct_w_make(&w, k->variant & 0xFF, src, rows, cols) == 0) {
        st_timed m = {&t, {cu_weight(&t, &w.w), cu_put(&t, x, (size_t)cols * 4), 1, cu_alloc(&t, (size_t)rows * 4), 0, 0,
                           0, 0, NULL, NULL, 0, 0, NULL}};
        if (!t.failed && !set_mode(&t, mode_of(k))) ms = cu_time(&t, timed, &m);
        ct_w_free(&w);
    }
    free(src), free(x);
    cu_close(&t);
    return ms;
}

static double time_kernel(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    return time_one(k, 2048, 2048);
}

static const char *k_precision =
    "matvec1's arithmetic (chunk order per lane, fmaf chains, xor tree), x staged transposed or plain, persistent warps or one row each, with or without the L2 prefetch; tol = (K+8) u sum|x||w|, and bit for bit the default n = 1 kernel's; NaN/Inf propagate";

int ct_cuda_xt_kernels(ct_kernel *out, int max) {
    int n = 0;
    make_names();
    for (int mode = 1; mode <= 5; mode += 2) /* 1 ("xt0"), 3 ("row1"), 5 ("l2pf"); 2 and 4 are the controls' */
        for (int f = 0; f < CT_F_COUNT && n < max; f++, n++)
            out[n] = (ct_kernel){.name = names[mode][f], .backend = "cuda", .precision = k_precision, .check = check,
                                 .time = time_kernel, .time_shape = "[2048,2048] n=1 (CUDA events)",
                                 .limit_ms = ct_cuda_matmul_limit_ms(f), .variant = f | (mode << 8),
                                 .unavailable = cu_unavailable};
    return n;
}

int ct_cuda_xt_controls(ct_kernel *out, int max) {
    const struct { int f, mode, defect; const char *desc; } c[] = {
        {CT_F_BF16, 2, DR_CUDA_DEFECT_XT_SHIFT, "device: n = 1 product dots each chunk with the next chunk's staged x"},
        {CT_F_FP8B, 4, DR_CUDA_DEFECT_NEXT_ROW_PREFETCH,
         "device: n = 1 persistent warps load their next row from the row after it"},
    };
    int n = 0;
    make_names();
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = names[c[i].mode][c[i].f], .backend = "cuda/control", .precision = k_precision,
                             .check = check, .variant = c[i].f | (c[i].mode << 8), .control = c[i].defect,
                             .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
