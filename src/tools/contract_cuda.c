/* contract_cuda.c - `drama contract` entries for the CUDA kernels (src/backend/cuda): the matvec
 * product for every stored format, on the same fixtures and against the same float64 reference as
 * the CPU entries (contract_matmul.c), plus cases for the kernel's own structure (activation tile
 * widths, row ranges, batched launches), and planted defects compiled into the device kernel
 * (backend/cuda/cuda_contract.h). Without a usable device every entry is reported NOT RUN.
 * Tolerance derivation: docs/contract.md ("CUDA"). */
#include "tools/contract_cuda_internal.h"

#ifndef DRAMA_HAVE_CUDA

int ct_cuda_kernels(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

int ct_cuda_controls(ct_kernel *out, int max) {
    (void)out, (void)max;
    return 0;
}

const char *ct_cuda_build_note(void) {
    return "cuda: backend not built (no nvcc at configure time, or a sanitizer build): no cuda entries";
}

#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_contract.h"

/* Extra roundings beyond K in the tolerance (K + CUDA_CHAIN) u sum|x| m: a lane's fmaf chain has at
 * most K roundings, the shuffle tree 5 more, the dequantisation at most 1 (FP8 code * scale, NVFP4
 * value * global scale; affine's two are in m); 2 for the second-order terms of gamma. */
#define CUDA_CHAIN 8

const char *ct_cuda_build_note(void) { return NULL; }

/* ---- device buffers of one case ---- */

const char *cu_unavailable(char *why, size_t why_size) {
    char reason[160] = "";
    if (dr_cuda_device_count(reason, sizeof reason) > 0) return NULL;
    snprintf(why, why_size, "no CUDA device (%s)", reason);
    return why;
}

int cu_open(cu_t *t, ct_result *res) {
    memset(t, 0, sizeof *t);
    if (dr_cuda_open(0, &t->c, &t->err) == DRAMA_OK) return 0;
    ct_case_error(res, "dr_cuda_open", t->err.message);
    return -1;
}

void cu_free_all(cu_t *t) {
    for (int i = 0; i < t->nbuf; i++) dr_cuda_free(t->c, t->buf[i]);
    for (int i = 0; i < t->nw; i++) dr_cuda_weight_free(t->w[i]);
    t->nbuf = t->nw = 0;
}

void cu_close(cu_t *t) {
    cu_free_all(t);
    dr_cuda_close(t->c);
    t->c = NULL;
}

void *cu_alloc(cu_t *t, size_t bytes) {
    if (t->failed) return NULL;
    if (t->nbuf == CU_MAX_BUF) {
        t->failed = 1;
        dr_fail(&t->err, DRAMA_EINTERNAL, "contract: too many device buffers in one case");
        return NULL;
    }
    void *d = NULL;
    if (dr_cuda_malloc(t->c, bytes, &d, &t->err)) {
        t->failed = 1;
        return NULL;
    }
    t->buf[t->nbuf++] = d;
    return d;
}

void *cu_put(cu_t *t, const void *host, size_t bytes) {
    void *d = cu_alloc(t, bytes);
    if (d && dr_cuda_to_device(t->c, d, host, bytes, &t->err)) t->failed = 1;
    return t->failed ? NULL : d;
}

static void *cu_fill(cu_t *t, size_t bytes, int byte) {
    void *d = cu_alloc(t, bytes);
    if (d && dr_cuda_memset(t->c, d, byte, bytes, &t->err)) t->failed = 1;
    return t->failed ? NULL : d;
}
void *cu_poison(cu_t *t, size_t bytes) { return cu_fill(t, bytes, 0xFF); }
void *cu_zero(cu_t *t, size_t bytes) { return cu_fill(t, bytes, 0); }

dr_cuda_weight *cu_weight(cu_t *t, const dr_weight *w) {
    if (t->failed) return NULL;
    dr_cuda_weight *d = NULL;
    if (t->nw == CU_MAX_BUF || dr_cuda_weight_upload(t->c, w, &d, &t->err)) {
        t->failed = 1;
        return NULL;
    }
    t->w[t->nw++] = d;
    return d;
}

void *cu_ptrs(cu_t *t, void *const *ptrs, int n) { return cu_put(t, ptrs, (size_t)n * sizeof(void *)); }

int cu_get(cu_t *t, void *host, const void *dev, size_t bytes) {
    if (t->failed) return -1;
    if (dr_cuda_sync(t->c, &t->err) || dr_cuda_to_host(t->c, host, dev, bytes, &t->err)) t->failed = 1;
    return t->failed ? -1 : 0;
}

int cu_case_end(cu_t *t, ct_result *res, const char *name) {
    int bad = t->failed;
    if (bad) ct_case_error(res, name, t->err.message);
    t->failed = 0;
    cu_free_all(t);
    return bad ? -1 : 0;
}

double cu_time(cu_t *t, drama_status (*fn)(void *arg), void *arg) {
    double ms = INFINITY, best = INFINITY;
    if (t->failed || dr_cuda_time(t->c, fn, arg, 5, &ms, &t->err)) return INFINITY;
    for (int rep = 0; rep < 5; rep++)
        if (!dr_cuda_time(t->c, fn, arg, 20, &ms, &t->err) && ms < best) best = ms;
    return best;
}

/* The product under test: the real kernel through the public API, or the planted defect. */
static drama_status product(const ct_kernel *k, dr_cuda *c, const dr_cuda_job *jobs, int count, drama_error *err) {
    if (k->control) return dr_cuda_matmul_batch_defect(c, jobs, count, k->control, err);
    if (count > 1) return dr_cuda_matmul_batch(c, jobs, count, err);
    if (jobs[0].r0 == 0 && jobs[0].r1 == 0) return dr_cuda_matmul(c, jobs[0].w, jobs[0].x, jobs[0].n, jobs[0].y, err);
    return dr_cuda_matmul_rows(c, jobs[0].w, jobs[0].r0, jobs[0].r1, jobs[0].x, jobs[0].n, jobs[0].y, err);
}

/* Device buffers of one case. */
typedef struct cu_case {
    dr_cuda_weight *w[2];
    float *x, *y;
} cu_case;

static void cu_case_free(dr_cuda *c, cu_case *cc) {
    for (int i = 0; i < 2; i++) dr_cuda_weight_free(cc->w[i]);
    dr_cuda_free(c, cc->x);
    dr_cuda_free(c, cc->y);
    memset(cc, 0, sizeof *cc);
}

/* x to the device, y allocated and poisoned with the all-ones NaN pattern (0xFFFFFFFF) on the device */
static drama_status cu_buffers(dr_cuda *c, cu_case *cc, const float *x, int64_t nx, int64_t ny, drama_error *err) {
    size_t xb = (size_t)nx * sizeof(float), yb = (size_t)ny * sizeof(float);
    drama_status st = dr_cuda_malloc(c, xb, (void **)&cc->x, err);
    if (!st) st = dr_cuda_malloc(c, yb, (void **)&cc->y, err);
    if (!st) st = dr_cuda_to_device(c, cc->x, x, xb, err);
    if (!st) st = dr_cuda_memset(c, cc->y, 0xFF, yb, err);
    return st;
}

/* ct_matmul_run_fn: one product of the shared fixtures on the device; arg is the dr_cuda context */
static int cu_run(const ct_kernel *k, ct_ctx *ctx, const dr_weight *w, const float *x, int64_t n, float *y, void *arg,
                  char *msg, size_t msg_size) {
    (void)ctx;
    dr_cuda *c = arg;
    drama_error err = {0};
    cu_case cc = {0};
    drama_status st = dr_cuda_weight_upload(c, w, &cc.w[0], &err);
    if (!st) st = cu_buffers(c, &cc, x, n * w->cols, n * w->rows, &err);
    dr_cuda_job j = {cc.w[0], cc.x, n, cc.y, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
    if (!st) st = product(k, c, &j, 1, &err);
    if (!st) st = dr_cuda_sync(c, &err);
    if (!st) st = dr_cuda_to_host(c, y, cc.y, (size_t)(n * w->rows) * sizeof(float), &err);
    cu_case_free(c, &cc);
    if (st) snprintf(msg, msg_size, "%s", err.message);
    return st ? -1 : 0;
}

/* The kernel's structure: tile widths 4 and 16 with partial tiles (n = 4, 5, 16, 17), a row range
 * (dr_cuda_matmul_rows), and one batch of 18 jobs over two weights (two launches of at most
 * DR_CUDA_MAX_BATCH) with different n, activation offsets (unaligned x) and row ranges. */
static void structure_cases(const ct_kernel *k, dr_cuda *c, ct_result *res, uint64_t *seed) {
    int f = k->variant & 0xFF;
    char name[96];
    ct_mm_fixture a, b;
    ct_mm_fixture_make(&a, f, seed, 37, 101, 34, CUDA_CHAIN);
    ct_mm_fixture_make(&b, f, seed, 130, 200, 34, CUDA_CHAIN);
    if (!a.ok || !b.ok) {
        ct_case_error(res, "structure", "could not build the weights");
        ct_mm_fixture_free(&a);
        ct_mm_fixture_free(&b);
        return;
    }
    /* tile widths, and a row range; each run poisons y afresh */
    const int64_t runs[][3] = {{4, 0, 0}, {5, 0, 0}, {16, 0, 0}, {17, 0, 0}, {17, 3, 97}, {2, 129, 130}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int64_t n = runs[i][0], r0 = runs[i][1], r1 = runs[i][2];
        const ct_mm_fixture *fx = r1 ? &b : &a;
        int64_t m = r1 ? r1 - r0 : fx->rows;
        snprintf(name, sizeof name, "%s [%lld,%lld] n=%lld rows [%lld,%lld)", r1 ? "row-range" : "tile-width",
                 (long long)fx->rows, (long long)fx->cols, (long long)n, (long long)r0, (long long)(r1 ? r1 : m));
        drama_error err = {0};
        cu_case cc = {0};
        float *y = malloc((size_t)(n * m) * sizeof *y);
        ct_poison(y, n * m);
        drama_status st = dr_cuda_weight_upload(c, &fx->t.w, &cc.w[0], &err);
        if (!st) st = cu_buffers(c, &cc, fx->x, n * fx->cols, n * m, &err);
        dr_cuda_job j = {cc.w[0], cc.x, n, cc.y, r0, r1, 0, 0, NULL, NULL, 0, 0, NULL};
        if (!st) st = product(k, c, &j, 1, &err);
        if (!st) st = dr_cuda_sync(c, &err);
        if (!st) st = dr_cuda_to_host(c, y, cc.y, (size_t)(n * m) * sizeof(float), &err);
        if (st) ct_case_error(res, name, err.message);
        else ct_mm_compare_rows(res, name, fx, 0, n, r0, r1 ? r1 : m, y);
        cu_case_free(c, &cc);
        free(y);
    }
    /* one batch: job i on weight a or b, x rows from offset i % 7, n from {1, 2, 3, 5, 17}, rows all / a
     * suffix / a prefix; y blocks laid end to end */
    enum { NJOB = 18 };
    const int64_t ns[5] = {1, 2, 3, 5, 17};
    int64_t xoff[NJOB], r0s[NJOB], r1s[NJOB], yoff[NJOB + 1];
    yoff[0] = 0;
    for (int i = 0; i < NJOB; i++) {
        const ct_mm_fixture *fx = (i % 2) ? &b : &a;
        xoff[i] = i % 7;
        r0s[i] = (i % 3 == 1) ? (i * 5) % fx->rows : 0;
        r1s[i] = (i % 3 == 2) ? fx->rows / 2 + i : fx->rows;
        yoff[i + 1] = yoff[i] + ns[i % 5] * (r1s[i] - r0s[i]);
    }
    drama_error err = {0};
    cu_case cc = {0};
    float *y = malloc((size_t)yoff[NJOB] * sizeof *y);
    ct_poison(y, yoff[NJOB]);
    drama_status st = dr_cuda_weight_upload(c, &a.t.w, &cc.w[0], &err);
    if (!st) st = dr_cuda_weight_upload(c, &b.t.w, &cc.w[1], &err);
    float *xb = NULL; /* b's activations next to a's: one x buffer, x pointers at row offsets */
    if (!st) {
        size_t na = (size_t)(a.nx * a.cols), nb = (size_t)(b.nx * b.cols);
        float *xh = malloc((na + nb) * sizeof *xh);
        memcpy(xh, a.x, na * sizeof *xh);
        memcpy(xh + na, b.x, nb * sizeof *xh);
        st = cu_buffers(c, &cc, xh, (int64_t)(na + nb), yoff[NJOB], &err);
        xb = cc.x ? cc.x + na : NULL;
        free(xh);
    }
    if (!st) {
        dr_cuda_job jobs[NJOB];
        for (int i = 0; i < NJOB; i++) {
            const ct_mm_fixture *fx = (i % 2) ? &b : &a;
            const float *xbase = (i % 2) ? xb : cc.x;
            int full = r0s[i] == 0 && r1s[i] == fx->rows && i % 4 == 0; /* some as r0 == r1 == 0 */
            jobs[i] = (dr_cuda_job){cc.w[i % 2], xbase + xoff[i] * fx->cols, ns[i % 5], cc.y + yoff[i],
                                    full ? 0 : r0s[i], full ? 0 : r1s[i], 0, 0, NULL, NULL, 0, 0, NULL};
        }
        st = product(k, c, jobs, NJOB, &err);
    }
    if (!st) st = dr_cuda_sync(c, &err);
    if (!st) st = dr_cuda_to_host(c, y, cc.y, (size_t)yoff[NJOB] * sizeof(float), &err);
    if (st) {
        ct_case_error(res, "batch of 18 jobs", err.message);
    } else {
        for (int i = 0; i < NJOB; i++) {
            const ct_mm_fixture *fx = (i % 2) ? &b : &a;
            snprintf(name, sizeof name, "batch job %d [%lld,%lld] n=%lld x+%lld rows [%lld,%lld)", i,
                     (long long)fx->rows, (long long)fx->cols, (long long)ns[i % 5], (long long)xoff[i],
                     (long long)r0s[i], (long long)r1s[i]);
            ct_mm_compare_rows(res, name, fx, xoff[i], ns[i % 5], r0s[i], r1s[i], y + yoff[i]);
        }
    }
    cu_case_free(c, &cc);
    free(y);
    ct_mm_fixture_free(&a);
    ct_mm_fixture_free(&b);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    dr_cuda *c = NULL;
    drama_error err = {0};
    if (dr_cuda_open(0, &c, &err) != DRAMA_OK) {
        ct_case_error(res, "dr_cuda_open", err.message); /* a control that could not run is MISSED */
        return;
    }
    ct_matmul_cases(k, ctx, res, CUDA_CHAIN, cu_run, c);
    uint64_t seed = ctx->seed ^ ((uint64_t)(uint32_t)k->variant * 104729u + 5u); /* unsigned: no int overflow */
    structure_cases(k, c, res, &seed);
    dr_cuda_close(c);
}

/* ---- timing: [2048, 2048], n = 1, CUDA events, best of 5 x 20 launches ---- */

typedef struct cu_timed {
    dr_cuda *c;
    dr_cuda_job job;
    drama_error err;
} cu_timed;

static drama_status timed_call(void *arg) {
    cu_timed *t = arg;
    return dr_cuda_matmul(t->c, t->job.w, t->job.x, 1, t->job.y, &t->err);
}

static double time_kernel(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    int f = k->variant & 0xFF;
    int64_t rows = 2048, cols = 2048;
    uint64_t s = 99;
    float *src = malloc((size_t)(rows * cols) * sizeof *src), *x = malloc((size_t)cols * sizeof *x);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)(ct_rand_normal(&s) * 0.02);
    for (int64_t i = 0; i < cols; i++) x[i] = (float)ct_rand_normal(&s);
    double best = INFINITY;
    ct_w t;
    cu_timed tm = {0};
    cu_case cc = {0};
    if (ct_w_make(&t, f, src, rows, cols) == 0 && dr_cuda_open(0, &tm.c, &tm.err) == DRAMA_OK) {
        drama_status st = dr_cuda_weight_upload(tm.c, &t.w, &cc.w[0], &tm.err);
        if (!st) st = cu_buffers(tm.c, &cc, x, cols, rows, &tm.err);
        tm.job = (dr_cuda_job){cc.w[0], cc.x, 1, cc.y, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
        if (!st) st = dr_cuda_time(tm.c, timed_call, &tm, 5, &(double){0}, &tm.err); /* warm-up */
        for (int rep = 0; rep < 5 && !st; rep++) {
            double ms = INFINITY;
            st = dr_cuda_time(tm.c, timed_call, &tm, 20, &ms, &tm.err);
            if (!st && ms < best) best = ms;
        }
        cu_case_free(tm.c, &cc);
        dr_cuda_close(tm.c);
    }
    ct_w_free(&t);
    free(src);
    free(x);
    return best;
}

/* Stated limit: the bytes a [2048, 2048] product must read (weights with their scales, x, y) at
 * 4.0 TB/s (the H200's HBM3e peak is 4.8), times 2, plus 10 us for the launch. */
double ct_cuda_matmul_limit_ms(int f) {
    double n = 2048.0 * 2048.0, g = (double)ct_matmul_granule(f), bytes;
    switch (f) {
    case CT_F_F32: bytes = 4 * n; break;
    case CT_F_F16:
    case CT_F_BF16: bytes = 2 * n; break;
    case CT_F_FP8B: bytes = n + 4 * n / (128.0 * 128.0); break;
    case CT_F_FP8T: bytes = n; break;
    case CT_F_NVFP4: bytes = n / 2 + n / 16; break;
    default: bytes = n * (f == CT_F_AFF8 || f == CT_F_AFF8_G128 ? 1.0 : 0.5) + 4 * n / g; break; /* BF16 s, b */
    }
    bytes += 2 * 2048 * 4;
    return 2.0 * bytes / 4.0e12 * 1e3 + 0.010;
}

static const char *k_precision_cuda =
    "weights dequantised exactly to fp32 in registers, fmaf per lane over 16-byte chunks, 5-level "
    "shuffle tree; tol = (K+8) u sum|x||w| (affine: |w| -> |s q|+|w|), u = 2^-24; NaN/Inf propagate";

int ct_cuda_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int f = 0; f < CT_F_COUNT && n < max; f++, n++)
        out[n] = (ct_kernel){.name = ct_matmul_names[f],
                             .backend = "cuda",
                             .precision = k_precision_cuda,
                             .check = check,
                             .time = time_kernel,
                             .time_shape = "[2048,2048] n=1 (CUDA events)",
                             .limit_ms = ct_cuda_matmul_limit_ms(f),
                             .variant = f,
                             .unavailable = cu_unavailable};
    n += ct_cuda_ops_kernels(out + n, max - n);
    n += ct_cuda_model_kernels(out + n, max - n);
    n += ct_cuda_codec_kernels(out + n, max - n);
    n += ct_cuda_gemm_kernels(out + n, max - n);
    n += ct_cuda_norm_kernels(out + n, max - n);
    n += ct_cuda_xt_kernels(out + n, max - n);
    n += ct_cuda_moe_lean_kernels(out + n, max - n);
    n += ct_cuda_pdl_kernels(out + n, max - n);
    n += ct_cuda_moe_persist_kernels(out + n, max - n);
    n += ct_cuda_moe_persist2_kernels(out + n, max - n);
    n += ct_cuda_sample_kernels(out + n, max - n);
    return n;
}

int ct_cuda_controls(ct_kernel *out, int max) {
    const struct { int f, defect; const char *desc; } c[] = {
        {CT_F_FP8B, DR_CUDA_DEFECT_NEXT_BLOCK_SCALE, "device: block scale of the next block column"},
        {CT_F_NVFP4, DR_CUDA_DEFECT_NIBBLE_HIGH_FIRST, "device: E2M1 nibbles read high-first"},
        {CT_F_BF16, DR_CUDA_DEFECT_FP16_ACCUM, "device: fp16 accumulation (lane chains and shuffle tree)"},
        {CT_F_F32, DR_CUDA_DEFECT_DROP_TAIL_CHUNK, "device: ragged last 16-byte chunk of a row dropped"},
        {CT_F_AFF4, DR_CUDA_DEFECT_PREV_GROUP, "device: scale and bias of the previous group"},
        {CT_F_AFF8, DR_CUDA_DEFECT_PREV_GROUP, "device: scale and bias of the previous group"},
        {CT_F_F16, DR_CUDA_DEFECT_SHUFFLE_LEVEL, "device: shuffle tree one level short (odd lanes lost)"},
        {CT_F_FP8T, DR_CUDA_DEFECT_TILE_TAIL, "device: last partial activation tile skipped when n > 16"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = ct_matmul_names[c[i].f], .backend = "cuda/control",
                             .precision = k_precision_cuda, .check = check, .variant = c[i].f,
                             .control = c[i].defect, .control_desc = c[i].desc, .unavailable = cu_unavailable};
    n += ct_cuda_ops_controls(out + n, max - n);
    n += ct_cuda_model_controls(out + n, max - n);
    n += ct_cuda_codec_controls(out + n, max - n);
    n += ct_cuda_gemm_controls(out + n, max - n);
    n += ct_cuda_norm_controls(out + n, max - n);
    n += ct_cuda_xt_controls(out + n, max - n);
    n += ct_cuda_moe_lean_controls(out + n, max - n);
    n += ct_cuda_pdl_controls(out + n, max - n);
    n += ct_cuda_moe_persist_controls(out + n, max - n);
    n += ct_cuda_moe_persist2_controls(out + n, max - n);
    n += ct_cuda_sample_controls(out + n, max - n);
    return n;
}

#endif
