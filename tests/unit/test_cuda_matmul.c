/* test_cuda_matmul.c - the CUDA backend's products (src/backend/cuda) against a float64
 * reference built from dr_weight_dequant_row and against dr_cpu_matmul, for every stored format,
 * ragged shapes, n = 1..21, row ranges, unaligned activations and batched launches.
 *
 * Bound: both sides sum the same fp32 products w*x of the dequantised weights in different
 * orders, so |gpu - ref| <= gamma_k * sum|w*x| with gamma_k ~ k*u, u = 2^-24 and k the longest
 * chain of roundings (a lane's serial chain plus the 5-level shuffle tree, < cols + 5; we use
 * cols + 8). The dequantisation itself must match the reference exactly, so a decode bug (wrong
 * nibble, scale or block) shows as errors of the size of the weights, far over the bound.
 * Also exact: row i of y is bit-identical for any n, row range, alignment of x or batching.
 *
 * Plain C (no cmocka) so that the device machine, which lacks the engine's other libraries, can
 * build it: exit 0 = pass, 1 = fail, 77 = skipped (printed why: no CUDA device). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda_backend.h"
#include "num/formats.h"
#include "num/weight.h"

static int failures;
#define CHECK(cond, ...)                                                                                            \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            failures++;                                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                           \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
        }                                                                                                          \
    } while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static float randn(void) { return (float)((unif() + unif() + unif() - 1.5) * 2.0); }

/* A host weight with its own buffers (data placed at an odd offset: stored files are unaligned). */
typedef struct hweight {
    dr_weight w;
    uint8_t *data_mem, *scale_mem, *bias_mem;
} hweight;

static void put_scale(uint8_t *p, dr_dtype dt, int64_t i, float v) {
    if (dt == DR_DT_F32) memcpy(p + 4 * i, &v, 4);
    else {
        uint16_t h = dt == DR_DT_BF16 ? dr_f32_to_bf16(v) : dr_f32_to_f16(v);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* fmt, rows, cols; sdt: scale dtype; a, b: FP8 block rows/cols or affine bits/group. */
static void make_weight(hweight *h, dr_wfmt fmt, int64_t rows, int64_t cols, dr_dtype sdt, int a, int b) {
    memset(h, 0, sizeof *h);
    dr_weight *w = &h->w;
    w->fmt = fmt;
    w->rows = rows;
    w->cols = cols;
    w->global_scale = 1.0f;
    w->scale_dtype = sdt;
    w->name = "test.weight";
    size_t need = 0, sbytes = 0, el = sdt == DR_DT_F32 ? 4 : 2;
    switch (fmt) {
    case DR_WF_F32: need = cols * 4; break;
    case DR_WF_F16: case DR_WF_BF16: need = cols * 2; break;
    case DR_WF_FP8_TENSOR: need = cols; w->global_scale = 0.0123f; break;
    case DR_WF_FP8_BLOCK:
        need = cols;
        w->block_rows = a, w->block_cols = b;
        w->scale_cols = (cols + b - 1) / b;
        sbytes = (size_t)((rows + a - 1) / a) * w->scale_cols * el;
        break;
    case DR_WF_NVFP4:
        need = cols / 2;
        w->scale_cols = cols / 16;
        sbytes = rows * w->scale_cols;
        w->global_scale = 0.00731f;
        break;
    case DR_WF_AFFINE:
        w->bits = a, w->group = b;
        need = cols * a / 8;
        w->scale_cols = cols / b;
        sbytes = rows * w->scale_cols * el;
        break;
    default: break;
    }
    w->row_bytes = need + 3; /* a stride wider than the row: upload must use row_bytes */
    h->data_mem = malloc(rows * w->row_bytes + 1);
    uint8_t *d = h->data_mem + 1;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = d + r * w->row_bytes;
        for (size_t i = 0; i < w->row_bytes; i++) row[i] = (uint8_t)rnd();
        for (int64_t c = 0; c < cols; c++) {
            float v = randn();
            if (fmt == DR_WF_F32) memcpy(row + 4 * c, &v, 4);
            if (fmt == DR_WF_F16) { uint16_t x = dr_f32_to_f16(v); memcpy(row + 2 * c, &x, 2); }
            if (fmt == DR_WF_BF16) { uint16_t x = dr_f32_to_bf16(v); memcpy(row + 2 * c, &x, 2); }
            if ((fmt == DR_WF_FP8_BLOCK || fmt == DR_WF_FP8_TENSOR) && (row[c] & 0x7F) == 0x7F) row[c] ^= 1; /* no NaN */
        }
    }
    w->data = d;
    if (sbytes) {
        h->scale_mem = malloc(sbytes + 1);
        w->scales = h->scale_mem + 1;
        uint8_t *s = h->scale_mem + 1;
        if (fmt == DR_WF_NVFP4)
            for (size_t i = 0; i < sbytes; i++) s[i] = (uint8_t)(rnd() % 0x7F) | (uint8_t)(rnd() & 0x80); /* sign ignored */
        else
            for (size_t i = 0; i < sbytes / el; i++) put_scale(s, sdt, i, (float)(0.01 + 0.05 * unif()));
        if (fmt == DR_WF_AFFINE) {
            h->bias_mem = malloc(sbytes + 1);
            w->biases = h->bias_mem + 1;
            for (size_t i = 0; i < sbytes / el; i++) put_scale(h->bias_mem + 1, sdt, i, randn() * 0.1f);
        }
    }
}

static void free_weight(hweight *h) {
    free(h->data_mem);
    free(h->scale_mem);
    free(h->bias_mem);
}

#define NMAX 21

static void *dmalloc(dr_cuda *c, size_t bytes) {
    void *p = NULL;
    drama_error e = {0};
    if (dr_cuda_malloc(c, bytes, &p, &e)) {
        printf("FAIL dr_cuda_malloc: %s\n", e.message);
        exit(1);
    }
    return p;
}

/* GPU product into host y (poisoned with NaN first so an unwritten element shows). */
static int gpu_rows(dr_cuda *c, dr_cuda_weight *dw, int64_t r0, int64_t r1, const float *dx, int64_t n, float *dy,
                    float *y) {
    drama_error e = {0};
    size_t bytes = (size_t)n * (r1 - r0) * 4;
    if (dr_cuda_memset(c, dy, 0xFF, bytes ? bytes : 4, &e) || dr_cuda_matmul_rows(c, dw, r0, r1, dx, n, dy, &e) ||
        dr_cuda_sync(c, &e) || dr_cuda_to_host(c, y, dy, bytes, &e)) {
        printf("FAIL CUDA product: %s\n", e.message);
        failures++;
        return 0;
    }
    return 1;
}

static const char *fmt_name(dr_wfmt f) {
    static const char *n[] = {"invalid", "f32", "f16", "bf16", "fp8-block", "fp8-tensor", "nvfp4", "affine"};
    return n[f];
}

static void run_case(dr_cuda *c, dr_wfmt fmt, int64_t rows, int64_t cols, dr_dtype sdt, int a, int b) {
    char label[160];
    snprintf(label, sizeof label, "%s[%lld,%lld]%s a=%d b=%d", fmt_name(fmt), (long long)rows, (long long)cols,
             sdt == DR_DT_F32 ? " f32-scales" : sdt == DR_DT_BF16 ? " bf16-scales" : " f16-scales", a, b);
    hweight h;
    make_weight(&h, fmt, rows, cols, sdt, a, b);
    drama_error e = {0};
    dr_cuda_weight *dw = NULL;
    if (dr_cuda_weight_upload(c, &h.w, &dw, &e)) {
        CHECK(0, "%s: upload: %s", label, e.message);
        free_weight(&h);
        return;
    }
    float *x = malloc(sizeof(float) * NMAX * cols);
    for (int64_t i = 0; i < NMAX * cols; i++) x[i] = randn();
    /* float64 reference and the magnitude sum of the bound */
    double *ref = malloc(sizeof(double) * NMAX * rows), *mag = malloc(sizeof(double) * NMAX * rows);
    float *wrow = malloc(sizeof(float) * cols);
    for (int64_t r = 0; r < rows; r++) {
        dr_weight_dequant_row(&h.w, r, wrow);
        for (int i = 0; i < NMAX; i++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < cols; k++) {
                double p = (double)wrow[k] * (double)x[i * cols + k];
                s += p;
                m += fabs(p);
            }
            ref[i * rows + r] = s;
            mag[i * rows + r] = m;
        }
    }
    float *dx = dmalloc(c, sizeof(float) * (NMAX * cols + 4));
    float *dy = dmalloc(c, sizeof(float) * NMAX * rows);
    if (dr_cuda_to_device(c, dx, x, sizeof(float) * NMAX * cols, &e)) CHECK(0, "%s: %s", label, e.message);
    float *y[NMAX + 1] = {0};
    const int ns[] = {1, 3, 16, NMAX};
    double max_abs = 0, max_ratio = 0, max_rel = 0;
    for (int t = 0; t < 4; t++) {
        int n = ns[t];
        y[n] = malloc(sizeof(float) * n * rows);
        if (!gpu_rows(c, dw, 0, rows, dx, n, dy, y[n])) continue;
        for (int64_t i = 0; i < (int64_t)n * rows; i++) {
            double d = fabs((double)y[n][i] - ref[i]);
            double tol = (double)(cols + 8) * 0x1p-24 * mag[i] + 1e-30;
            if (!(d <= tol)) { /* NaN fails here */
                CHECK(0, "%s n=%d: y[%lld][%lld]=%.9g ref=%.9g |diff|=%.3g > %.3g", label, n, (long long)(i / rows),
                      (long long)(i % rows), y[n][i], ref[i], d, tol);
                break;
            }
            if (d > max_abs) max_abs = d;
            if (fabs(ref[i]) > 0 && d / fabs(ref[i]) > max_rel) max_rel = d / fabs(ref[i]);
            if (d / (0x1p-24 * mag[i] + 1e-30) > max_ratio) max_ratio = d / (0x1p-24 * mag[i] + 1e-30);
        }
    }
    /* independent of n: every output row bit-identical to the n=21 run */
    for (int t = 0; t < 3; t++) {
        int n = ns[t];
        if (y[n] && y[NMAX]) CHECK(memcmp(y[n], y[NMAX], sizeof(float) * n * rows) == 0, "%s: n=%d differs from n=%d", label, n, NMAX);
    }
    /* the CPU backend: same function, another summation order */
    float *ycpu = malloc(sizeof(float) * NMAX * rows);
    dr_cpu_matmul(&h.w, x, NMAX, ycpu, NULL);
    double cpu_abs = 0;
    for (int64_t i = 0; i < (int64_t)NMAX * rows && y[NMAX]; i++) {
        double d = fabs((double)y[NMAX][i] - ycpu[i]);
        double tol = 2.0 * (double)(cols + 8) * 0x1p-24 * mag[i] + 1e-30;
        if (!(d <= tol)) {
            CHECK(0, "%s: vs CPU y[%lld]=%.9g cpu=%.9g", label, (long long)i, y[NMAX][i], ycpu[i]);
            break;
        }
        if (d > cpu_abs) cpu_abs = d;
    }
    /* a row range: bit-identical to those columns of the full product */
    int64_t r0 = rows / 3, r1 = rows / 3 + (rows - rows / 3 + 1) / 2;
    float *yr = malloc(sizeof(float) * 3 * (r1 - r0));
    if (y[3] && gpu_rows(c, dw, r0, r1, dx, 3, dy, yr))
        for (int i = 0; i < 3; i++)
            CHECK(memcmp(yr + i * (r1 - r0), y[3] + i * rows + r0, sizeof(float) * (r1 - r0)) == 0,
                  "%s: rows [%lld,%lld) differ from the full product", label, (long long)r0, (long long)r1);
    /* x at an address that is not 16-byte aligned (scalar loads): the same bits */
    if (dr_cuda_to_device(c, dx + 1, x, sizeof(float) * 3 * cols, &e)) CHECK(0, "%s: %s", label, e.message);
    float *yu = malloc(sizeof(float) * 3 * rows);
    if (y[3] && gpu_rows(c, dw, 0, rows, dx + 1, 3, dy, yu))
        CHECK(memcmp(yu, y[3], sizeof(float) * 3 * rows) == 0, "%s: unaligned x gives other bits", label);
    printf("%-44s max_abs=%.3g max_rel=%.3g err/(u*sum|wx|)=%.2f (bound %lld) vs-cpu max_abs=%.3g\n", label, max_abs,
           max_rel, max_ratio, (long long)cols + 8, cpu_abs);
    for (int t = 0; t < 4; t++) free(y[ns[t]]);
    free(yu);
    free(yr);
    free(ycpu);
    free(wrow);
    free(ref);
    free(mag);
    free(x);
    dr_cuda_free(c, dx);
    dr_cuda_free(c, dy);
    dr_cuda_weight_free(dw);
    free_weight(&h);
}

/* 8 experts in one launch (plus a BF16 job and a row range: two formats, so two launches) must
 * equal the single products bit for bit. */
static void run_batch(dr_cuda *c) {
    enum { E = 10 };
    hweight h[E];
    dr_cuda_weight *dw[E] = {0};
    dr_cuda_job jobs[E];
    drama_error e = {0};
    const int64_t rows = 200, cols = 384;
    float *x = malloc(sizeof(float) * 2 * cols);
    for (int64_t i = 0; i < 2 * cols; i++) x[i] = randn();
    float *dx = dmalloc(c, sizeof(float) * 2 * cols), *dy = dmalloc(c, sizeof(float) * E * 2 * rows);
    dr_cuda_to_device(c, dx, x, sizeof(float) * 2 * cols, &e);
    for (int i = 0; i < E; i++) {
        make_weight(&h[i], i == 8 ? DR_WF_BF16 : DR_WF_FP8_BLOCK, rows, cols, DR_DT_F32, 128, 128);
        if (dr_cuda_weight_upload(c, &h[i].w, &dw[i], &e)) {
            CHECK(0, "batch upload: %s", e.message);
            return;
        }
        jobs[i] = (dr_cuda_job){dw[i], dx, 1 + i % 2, dy + i * 2 * rows, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL};
    }
    jobs[9].r0 = 17, jobs[9].r1 = 150;
    float *yb = malloc(sizeof(float) * E * 2 * rows), *ys = malloc(sizeof(float) * 2 * rows);
    dr_cuda_memset(c, dy, 0xFF, sizeof(float) * E * 2 * rows, &e);
    if (dr_cuda_matmul_batch(c, jobs, E, &e) || dr_cuda_sync(c, &e) ||
        dr_cuda_to_host(c, yb, dy, sizeof(float) * E * 2 * rows, &e))
        CHECK(0, "batch: %s", e.message);
    int same = 1;
    for (int i = 0; i < E; i++) {
        int64_t r0 = jobs[i].r0, r1 = jobs[i].r1 ? jobs[i].r1 : rows;
        if (gpu_rows(c, dw[i], r0, r1, dx, jobs[i].n, dy, ys))
            same &= memcmp(ys, yb + i * 2 * rows, sizeof(float) * jobs[i].n * (r1 - r0)) == 0;
    }
    CHECK(same, "batched products differ from single ones");
    printf("batch of %d jobs (fp8-block x9 incl. a row range, bf16 x1): %s\n", E, same ? "bit-identical to singles" : "DIFFERENT");
    for (int i = 0; i < E; i++) {
        dr_cuda_weight_free(dw[i]);
        free_weight(&h[i]);
    }
    free(x), free(yb), free(ys);
    dr_cuda_free(c, dx), dr_cuda_free(c, dy);
}

static void run_bad(dr_cuda *c) {
    drama_error e = {0};
    hweight h;
    dr_cuda_weight *dw = NULL;
    make_weight(&h, DR_WF_NVFP4, 8, 64, DR_DT_F32, 0, 0);
    h.w.cols = 40; /* not a multiple of 16 */
    CHECK(dr_cuda_weight_upload(c, &h.w, &dw, &e) == DRAMA_ESHAPE && strstr(e.message, "test.weight"),
          "NVFP4 with 40 columns accepted (%s)", e.message);
    printf("bad nvfp4 shape -> %s\n", e.message);
    free_weight(&h);
    memset(&e, 0, sizeof e);
    make_weight(&h, DR_WF_AFFINE, 8, 64, DR_DT_BF16, 4, 32);
    h.w.bits = 3;
    CHECK(dr_cuda_weight_upload(c, &h.w, &dw, &e) == DRAMA_EUNSUPPORTED, "affine 3-bit accepted (%s)", e.message);
    printf("affine 3-bit -> %s\n", e.message);
    h.w.bits = 4;
    h.w.row_bytes = 2; /* shorter than a row */
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_weight_upload(c, &h.w, &dw, &e) == DRAMA_ESHAPE, "short row stride accepted (%s)", e.message);
    h.w.row_bytes = 32 + 3;
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_weight_upload(c, &h.w, &dw, &e) == DRAMA_OK, "good affine refused: %s", e.message);
    float *d = dmalloc(c, 64 * 64 * 4);
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_matmul_rows(c, dw, 0, 9, d, 1, d, &e) == DRAMA_EINVAL, "row range past the end accepted");
    printf("rows [0,9) of 8 -> %s\n", e.message);
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_matmul_rows(c, dw, 12, 12, d, 1, d, &e) == DRAMA_EINVAL, "empty range past the end accepted");
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_matmul(c, dw, d, -1, d, &e) == DRAMA_EINVAL, "negative n accepted");
    memset(&e, 0, sizeof e);
    CHECK(dr_cuda_matmul(c, dw, NULL, 2, d, &e) == DRAMA_EINVAL, "NULL x accepted");
    CHECK(dr_cuda_matmul(c, dw, NULL, 0, NULL, NULL) == DRAMA_OK, "n=0 must be a no-op");
    CHECK(dr_cuda_sync(c, NULL) == DRAMA_OK, "sync after bad calls");
    dr_cuda_free(c, d);
    dr_cuda_weight_free(dw);
    free_weight(&h);
}

int main(void) {
    char why[256] = "";
    if (dr_cuda_device_count(why, sizeof why) == 0) {
        drama_error e = {0};
        dr_cuda *c = NULL;
        drama_status st = dr_cuda_open(0, &c, &e);
        printf("SKIP: no CUDA device (%s); dr_cuda_open says: %s [%s]\n", why, e.message, drama_status_name(st));
        if (st == DRAMA_OK || c || !e.message[0]) {
            printf("FAIL: dr_cuda_open must fail cleanly without a device\n");
            return 1;
        }
        return 77;
    }
    drama_error e = {0};
    dr_cuda *c = NULL;
    if (dr_cuda_open(0, &c, &e)) {
        printf("FAIL: dr_cuda_open: %s\n", e.message);
        return 1;
    }
    const dr_cuda_info *in = dr_cuda_get_info(c);
    printf("device: %s (sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB, driver %d, runtime %d)\n", in->name, in->cc_major,
           in->cc_minor, in->sm_count, in->global_mem / 1073741824.0, in->l2_bytes / 1048576.0, in->driver_version,
           in->runtime_version);
    run_case(c, DR_WF_F32, 37, 67, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_F32, 64, 1024, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_F16, 64, 300, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_BF16, 129, 1001, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_BF16, 512, 2048, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_FP8_TENSOR, 70, 333, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_FP8_BLOCK, 512, 2048, DR_DT_F32, 128, 128);
    run_case(c, DR_WF_FP8_BLOCK, 2048, 512, DR_DT_BF16, 128, 128);
    run_case(c, DR_WF_FP8_BLOCK, 300, 520, DR_DT_F32, 128, 128);  /* ragged edge blocks */
    run_case(c, DR_WF_FP8_BLOCK, 100, 250, DR_DT_F16, 48, 40);    /* block boundaries inside chunks */
    run_case(c, DR_WF_FP8_BLOCK, 65, 129, DR_DT_BF16, 64, 7);
    run_case(c, DR_WF_NVFP4, 96, 2048, DR_DT_F32, 0, 0);
    run_case(c, DR_WF_NVFP4, 33, 80, DR_DT_F32, 0, 0);             /* half a chunk at the end */
    const int groups[] = {32, 64, 128};
    const dr_dtype sdts[] = {DR_DT_BF16, DR_DT_F16, DR_DT_F32};
    for (int g = 0; g < 3; g++) {
        run_case(c, DR_WF_AFFINE, 77, 384, sdts[g], 4, groups[g]);
        run_case(c, DR_WF_AFFINE, 45, 384, sdts[(g + 1) % 3], 8, groups[g]);
    }
    run_case(c, DR_WF_AFFINE, 512, 2048, DR_DT_BF16, 4, 64);
    run_batch(c);
    run_bad(c);
    dr_cuda_close(c);
    printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
