/* contract_cuda_pdl.c - `drama contract` entry for the ordering under programmatic dependent launch
 * (backend/cuda/pdl.cuh, DRAMA_CUDA_PDL): a producer kernel spins SPIN_US, then writes x (it lets its
 * dependent start at once), and the BF16 product that follows it on the stream reads that x: the
 * n = 1 kernel (matvec1_kernel, 8- and 16-warp blocks) and the general one (n = 3), against the float64
 * reference. With PDL on, only a pdl_wait before the first read of x keeps the product from reading
 * the old x (NaN here). The planted control stages x BEFORE pdl_wait: red only with PDL on (with
 * DRAMA_CUDA_PDL=0 or below sm_90 it is NOT RUN / a case error, never green). docs/contract.md. */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"

#define CUDA_CHAIN 8 /* contract_cuda.c's: (K + 8) u sum |x| m */
#define SPIN_US 200  /* the producer's spin: far beyond a dependent's launch latency */

/* one case: the product of a [rows, cols] BF16 fixture with nx rows of x written by the slow producer
 * into a buffer that held NaN */
static void order_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *seed, int64_t rows, int64_t cols,
                       int64_t nx) {
    ct_mm_fixture fx;
    ct_mm_fixture_make(&fx, CT_F_BF16, seed, rows, cols, nx, CUDA_CHAIN);
    char name[128];
    snprintf(name, sizeof name, "[%lld, %lld] x %lld row(s) written by the previous kernel", (long long)rows,
             (long long)cols, (long long)nx);
    if (!fx.ok) {
        ct_case_error(res, name, "could not build the weights");
        ct_mm_fixture_free(&fx);
        return;
    }
    const size_t xb = (size_t)(nx * fx.cols) * 4, yb = (size_t)(nx * rows) * 4;
    float *y = malloc(yb);
    dr_cuda_weight *dw = cu_weight(t, &fx.t.w);
    float *src = cu_put(t, fx.x, xb), *dx = cu_poison(t, xb), *dy = cu_poison(t, yb);
    dr_cuda_job j = {dw, dx, nx, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
    if (!t->failed && dr_cuda_pdl_order_check(t->c, src, dx, nx * fx.cols, SPIN_US, &j, 1, k->control, &t->err))
        t->failed = 1;
    cu_get(t, y, dy, yb);
    if (!cu_case_end(t, res, name)) ct_mm_compare_rows(res, name, &fx, 0, nx, 0, rows, y);
    cu_free_all(t);
    free(y);
    ct_mm_fixture_free(&fx);
}

/* the matmul entries' fp16-discriminating fixture (long positive sums, [8, 4096] n = 1) through the
 * same producer / product pair: the precision check every entry carries */
static void discr_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *seed) {
    const int64_t rows = 8, cols = 4096;
    float *wsrc = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)cols * 4), *y = malloc((size_t)rows * 4);
    float *alt = malloc((size_t)rows * 4);
    double *ref = malloc((size_t)rows * 8), *tol = malloc((size_t)rows * 8);
    const char *name = "fp16-discriminating [8, 4096] x 1 row written by the previous kernel";
    ct_matmul_fill(CT_K_DISCR, CT_F_BF16, seed, wsrc, rows, cols, x, 1);
    ct_w w;
    if (ct_w_make(&w, CT_F_BF16, wsrc, rows, cols) != 0) {
        ct_case_error(res, name, "could not build the weight");
    } else {
        ct_matmul_reference(&w.w, x, 1, CUDA_CHAIN, ref, tol, alt);
        dr_cuda_weight *dw = cu_weight(t, &w.w);
        float *src = cu_put(t, x, (size_t)cols * 4), *dx = cu_poison(t, (size_t)cols * 4), *dy = cu_poison(t, (size_t)rows * 4);
        dr_cuda_job j = {dw, dx, 1, dy, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
        if (!t->failed && dr_cuda_pdl_order_check(t->c, src, dx, cols, SPIN_US, &j, 1, k->control, &t->err)) t->failed = 1;
        cu_get(t, y, dy, (size_t)rows * 4);
        if (!cu_case_end(t, res, name)) {
            ct_compare(res, name, y, ref, tol, rows);
            ct_discriminate(res, name, alt, ref, tol, rows);
        }
        cu_free_all(t);
    }
    ct_w_free(&w);
    free(wsrc), free(x), free(y), free(alt), free(ref), free(tol);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    if (k->control && !dr_cuda_pdl(t.c)) { /* a control that cannot go red proves nothing: say so */
        ct_case_error(res, "PDL", "programmatic dependent launch is off (DRAMA_CUDA_PDL=0 or below sm_90)");
        cu_close(&t);
        return;
    }
    uint64_t seed = ctx->seed ^ 0x50444c4full;
    order_case(k, &t, res, &seed, 300, 2048, 1);  /* n = 1: 8-warp blocks */
    order_case(k, &t, res, &seed, 4096, 1024, 1); /* n = 1: 16-warp blocks (>= 16 rows per SM) */
    order_case(k, &t, res, &seed, 300, 2048, 3);  /* the general kernel */
    discr_case(k, &t, res, &seed);
    cu_close(&t);
}

/* the control also needs PDL: with DRAMA_CUDA_PDL=0 it is NOT RUN */
static const char *pdl_unavailable(char *why, size_t why_size) {
    if (cu_unavailable(why, why_size)) return why;
    const char *e = getenv("DRAMA_CUDA_PDL");
    if (!e || strcmp(e, "0")) return NULL;
    snprintf(why, why_size, "DRAMA_CUDA_PDL=0: the control can go red only with programmatic dependent launch on");
    return why;
}

static const char *k_precision = "matvec's arithmetic on x written by the kernel just before (PDL ordering); "
                                 "tol = (K+8) u sum|x||w|";

int ct_cuda_pdl_kernels(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = "pdl_order.bf16", .backend = "cuda", .precision = k_precision, .check = check,
                         .unavailable = cu_unavailable};
    return 1;
}

int ct_cuda_pdl_controls(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = "pdl_order.bf16", .backend = "cuda/control", .precision = k_precision,
                         .check = check, .control = DR_CUDA_DEFECT_PDL_EARLY_X,
                         .control_desc = "device: n = 1 product stages x before pdl_wait (PDL on only)",
                         .unavailable = pdl_unavailable};
    return 1;
}

#endif
