/* Unit tests of the CPU matmul (src/backend/cpu): every stored format, ragged shapes, against a
 * float64 reference; bit-identical results across thread counts, batch sizes n, row subsets and
 * code paths (portable / AVX2); the golden quantisation units multiplied through the kernels. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "io/safetensors.h"
#include "num/formats.h"
#include "num/quant.h"
#include "num/weight.h"
#include "testutil.h"

static uint32_t rng_state = 1;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

/* A weight of each format built from random fp32 values with our encoders; owns its buffers. */
typedef struct test_weight {
    dr_weight w;
    uint8_t *data, *scales, *biases;
} test_weight;

static int g_affine_bits = 4;
static int g_block_cols = 40; /* FP8 block width of the next weight: 40 is ragged, 64 takes the fused path */

static void make_weight(test_weight *t, dr_wfmt fmt, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = frand() * (1.0f + (float)(i % 5));
    drama_error err = {0};
    dr_tensor tw = {.name = "test.weight", .ndim = 2, .shape = {rows, cols}};
    dr_tensor ts = {.name = "test.scale", .ndim = 2}, tb = {.name = "test.biases", .ndim = 2};
    dr_tensor t2 = {.name = "test.weight_scale_2", .dtype = DR_DT_F32, .ndim = 0, .nbytes = 4};
    float gs = 0;
    const dr_tensor *ps = NULL, *p2 = NULL, *pb = NULL;
    int br = 0, bc = 0;
    switch (fmt) {
    case DR_WF_F32:
        t->data = malloc((size_t)(rows * cols) * 4);
        memcpy(t->data, src, (size_t)(rows * cols) * 4);
        tw.dtype = DR_DT_F32;
        tw.nbytes = (size_t)(rows * cols) * 4;
        break;
    case DR_WF_BF16:
    case DR_WF_F16:
        t->data = malloc((size_t)(rows * cols) * 2);
        for (int64_t i = 0; i < rows * cols; i++) {
            uint16_t h = fmt == DR_WF_BF16 ? dr_f32_to_bf16(src[i]) : dr_f32_to_f16(src[i]);
            memcpy(t->data + 2 * i, &h, 2);
        }
        tw.dtype = fmt == DR_WF_BF16 ? DR_DT_BF16 : DR_DT_F16;
        tw.nbytes = (size_t)(rows * cols) * 2;
        break;
    case DR_WF_FP8_BLOCK: {
        br = 32, bc = g_block_cols; /* ragged blocks (40: width not a multiple of 8) */
        int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
        t->data = malloc((size_t)(rows * cols));
        t->scales = malloc((size_t)(sr * sc) * 4);
        assert_int_equal(dr_quant_fp8_block(src, rows, cols, br, bc, t->data, (float *)(void *)t->scales, &err), 0);
        tw.dtype = DR_DT_F8_E4M3;
        tw.nbytes = (size_t)(rows * cols);
        ts.dtype = DR_DT_F32;
        ts.shape[0] = sr;
        ts.shape[1] = sc;
        ts.data = t->scales;
        ts.nbytes = (size_t)(sr * sc) * 4;
        ps = &ts;
        break;
    }
    case DR_WF_FP8_TENSOR:
        t->data = malloc((size_t)(rows * cols));
        gs = dr_quant_amax(src, rows * cols) / 448.0f;
        for (int64_t i = 0; i < rows * cols; i++) t->data[i] = dr_e4m3_from_f64((double)src[i] / gs);
        tw.dtype = DR_DT_F8_E4M3;
        tw.nbytes = (size_t)(rows * cols);
        t->scales = malloc(4);
        memcpy(t->scales, &gs, 4);
        t2.name = "test.weight_scale";
        t2.data = t->scales;
        ps = &t2;
        break;
    case DR_WF_NVFP4:
        gs = dr_quant_nvfp4_global_scale(dr_quant_amax(src, rows * cols));
        t->data = malloc((size_t)(rows * cols / 2));
        t->scales = malloc((size_t)(rows * cols / 16));
        t->biases = malloc(4); /* holds weight_scale_2 */
        memcpy(t->biases, &gs, 4);
        assert_int_equal(dr_quant_nvfp4(src, rows, cols, gs, t->data, t->scales, &err), 0);
        tw.dtype = DR_DT_U8;
        tw.shape[1] = cols / 2;
        tw.nbytes = (size_t)(rows * cols / 2);
        ts.dtype = DR_DT_F8_E4M3;
        ts.shape[0] = rows;
        ts.shape[1] = cols / 16;
        ts.data = t->scales;
        ts.nbytes = (size_t)(rows * cols / 16);
        t2.data = t->biases;
        ps = &ts;
        p2 = &t2;
        break;
    case DR_WF_AFFINE: {
        int g = 32, bits = g_affine_bits;
        t->data = malloc((size_t)(rows * cols * bits / 8));
        t->scales = malloc((size_t)(rows * cols / g) * 2);
        t->biases = malloc((size_t)(rows * cols / g) * 2);
        assert_int_equal(dr_quant_affine(src, rows, cols, bits, g, DR_DT_BF16, t->data, t->scales, t->biases, &err), 0);
        tw.dtype = DR_DT_U32;
        tw.shape[1] = cols * bits / 32;
        tw.nbytes = (size_t)(rows * cols * bits / 8);
        ts.dtype = tb.dtype = DR_DT_BF16;
        ts.shape[0] = tb.shape[0] = rows;
        ts.shape[1] = tb.shape[1] = cols / g;
        ts.data = t->scales;
        tb.data = t->biases;
        ts.nbytes = tb.nbytes = (size_t)(rows * cols / g) * 2;
        ps = &ts;
        pb = &tb;
        break;
    }
    default: fail_msg("format %d", fmt);
    }
    tw.data = t->data;
    if (dr_weight_bind_ex(&tw, ps, p2, pb, -1, br, bc, cols, &t->w, &err) != DRAMA_OK) fail_msg("bind: %s", err.message);
    assert_int_equal(t->w.fmt, fmt);
    free(src);
}

static void free_weight(test_weight *t) {
    free(t->data);
    free(t->scales);
    free(t->biases);
}

static const char *fmt_name(dr_wfmt f) {
    static const char *n[] = {"invalid", "f32", "f16", "bf16", "fp8-block", "fp8-tensor", "nvfp4", "affine"};
    return n[f];
}

/* float64 reference: y[i][r] = sum_k x[i][k] * dequant(W)[r][k]; also sum |x||w| for the bound */
static void reference(const dr_weight *w, const float *x, int64_t n, double *y, double *mag) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        dr_weight_dequant_row(w, r, row);
        for (int64_t i = 0; i < n; i++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < w->cols; k++) {
                s += (double)x[i * w->cols + k] * row[k];
                m += fabs((double)x[i * w->cols + k] * row[k]);
            }
            y[i * w->rows + r] = s;
            mag[i * w->rows + r] = m;
        }
    }
    free(row);
}

static void check_format(dr_wfmt fmt, int64_t rows, int64_t cols) {
    test_weight t;
    make_weight(&t, fmt, rows, cols);
    const dr_weight *w = &t.w;
    int64_t n = 5;
    float *x = malloc((size_t)(n * cols) * sizeof *x);
    for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
    double *ref = malloc((size_t)(n * rows) * sizeof *ref), *mag = malloc((size_t)(n * rows) * sizeof *mag);
    reference(w, x, n, ref, mag);

    float *y0 = malloc((size_t)(n * rows) * sizeof *y0), *y = malloc((size_t)(n * rows) * sizeof *y);
    for (int64_t i = 0; i < n * rows; i++) y0[i] = NAN;
    dr_cpu_matmul_path(w, 0, rows, x, n, y0, NULL, DR_CPU_PORTABLE);

    /* accuracy: fp32 accumulation of `cols` products is within cols * 2^-24 * sum|x w| (with margin) */
    double worst_ratio = 0, max_abs = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        double err = fabs((double)y0[i] - ref[i]);
        double bound = (double)cols * 0x1p-24 * mag[i] + 1e-30;
        if (!isfinite(y0[i]) || !(err <= bound))
            fail_msg("%s [%lld,%lld] y[%lld] = %.9g, reference %.9g (bound %.3g)", fmt_name(fmt), (long long)rows,
                     (long long)cols, (long long)i, (double)y0[i], ref[i], bound);
        if (err / bound > worst_ratio) worst_ratio = err / bound;
        if (err > max_abs) max_abs = err;
    }
    tu_cmp c;
    float *reff = malloc((size_t)(n * rows) * sizeof *reff);
    for (int64_t i = 0; i < n * rows; i++) reff[i] = (float)ref[i];
    c = tu_compare_f32(y0, reff, n * rows);
    printf("%-10s [%4lld, %4lld] n=%lld: max_abs=%.3g max_rel=%.3g (worst %.3f of the fp32 bound)\n", fmt_name(fmt),
           (long long)rows, (long long)cols, (long long)n, max_abs, c.max_rel, worst_ratio);
    free(reff);

    /* determinism: every path, thread count, n and row subset gives the same bits */
    const dr_cpu_path paths[3] = {DR_CPU_PORTABLE, DR_CPU_AVX2, DR_CPU_AVX512};
    static const int thread_counts[4] = {1, 2, 3, 16}; /* 16: the pool's larger grain past 2 threads */
    for (int pi = 0; pi < 3; pi++) {
        for (int ti = 0; ti < 4; ti++) {
            int threads = thread_counts[ti];
            dr_pool *pool = dr_pool_create(threads);
            for (int64_t nn = 1; nn <= n; nn += 2) {
                for (int64_t i = 0; i < n * rows; i++) y[i] = NAN;
                dr_cpu_matmul_path(w, 0, rows, x + (n - nn) * cols, nn, y, pool, paths[pi]);
                if (memcmp(y, y0 + (n - nn) * rows, (size_t)(nn * rows) * sizeof *y) != 0)
                    fail_msg("%s: path %s threads %d n %lld differs from the portable single-thread result",
                             fmt_name(fmt), dr_cpu_path_name(paths[pi]), threads, (long long)nn);
            }
            /* a row subset (the restricted-logits use) */
            int64_t r0 = rows / 3, r1 = rows - 1;
            dr_cpu_matmul_path(w, r0, r1, x, n, y, pool, paths[pi]);
            for (int64_t i = 0; i < n; i++)
                for (int64_t r = r0; r < r1; r++)
                    if (dr_f32_bits(y[i * (r1 - r0) + (r - r0)]) != dr_f32_bits(y0[i * rows + r]))
                        fail_msg("%s: rows [%lld,%lld) differ at i=%lld r=%lld", fmt_name(fmt), (long long)r0,
                                 (long long)r1, (long long)i, (long long)r);
            dr_pool_free(pool);
        }
        /* dequantisation of each path equals the reference bit for bit */
        float *a = malloc((size_t)cols * sizeof *a), *b = malloc((size_t)cols * sizeof *b);
        for (int64_t r = 0; r < rows; r++) {
            dr_weight_dequant_row(w, r, a);
            dr_cpu_dequant_row_path(w, r, b, paths[pi]);
            assert_memory_equal(a, b, (size_t)cols * sizeof *a);
        }
        free(a);
        free(b);
    }
    /* the public entry point */
    dr_cpu_matmul(w, x, n, y, NULL);
    assert_memory_equal(y, y0, (size_t)(n * rows) * sizeof *y);

    free(x);
    free(ref);
    free(mag);
    free(y0);
    free(y);
    free_weight(&t);
}

static void test_formats_ragged(void **state) {
    (void)state;
    printf("best path on this CPU: %s\n", dr_cpu_path_name(dr_cpu_best_path()));
    const dr_wfmt fmts[] = {DR_WF_F32, DR_WF_F16, DR_WF_BF16, DR_WF_FP8_BLOCK, DR_WF_FP8_TENSOR};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        check_format(fmts[f], 37, 101); /* tails of every kind */
        check_format(fmts[f], 70, 256);
        check_format(fmts[f], 3, 7);
    }
    g_block_cols = 64; /* block width a multiple of 32: the n = 1 fused path */
    check_format(DR_WF_FP8_BLOCK, 37, 200);
    check_format(DR_WF_FP8_BLOCK, 5, 64);
    g_block_cols = 40;
    check_format(DR_WF_NVFP4, 33, 80);
    check_format(DR_WF_NVFP4, 17, 272);
    check_format(DR_WF_NVFP4, 6, 4144); /* over two AVX-512 scale spans of 2048 columns, then a tail */
    check_format(DR_WF_AFFINE, 21, 96);
    check_format(DR_WF_AFFINE, 9, 320);
    g_affine_bits = 8;
    check_format(DR_WF_AFFINE, 11, 96);
    check_format(DR_WF_AFFINE, 6, 160);
    g_affine_bits = 4;
}

/* Batches larger than the activation tile and weight blocks that end mid-block: every row of a
 * large-n product equals the same row computed alone, on every path and thread count. */
static void test_large_batches(void **state) {
    (void)state;
    /* the last entry is wide: only a few rows fit the per-worker block */
    const dr_wfmt fmts[] = {DR_WF_BF16, DR_WF_FP8_BLOCK, DR_WF_NVFP4, DR_WF_AFFINE, DR_WF_F16};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        test_weight t;
        int64_t rows = 41, cols = fmts[f] == DR_WF_BF16 ? 70 : fmts[f] == DR_WF_F16 ? 6001 : 96, n = 37;
        make_weight(&t, fmts[f], rows, cols);
        float *x = malloc((size_t)(n * cols) * sizeof *x), *y = malloc((size_t)(n * rows) * sizeof *y);
        float *one = malloc((size_t)rows * sizeof *one);
        for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
        const dr_cpu_path paths[3] = {DR_CPU_PORTABLE, DR_CPU_AVX2, DR_CPU_AVX512};
        for (int p = 0; p < 3; p++)
            for (int threads = 1; threads <= 3; threads += 2) {
                dr_pool *pool = dr_pool_create(threads);
                dr_cpu_matmul_path(&t.w, 0, rows, x, n, y, pool, paths[p]);
                for (int64_t b = 0; b < n; b++) {
                    dr_cpu_matmul_path(&t.w, 0, rows, x + b * cols, 1, one, NULL, DR_CPU_PORTABLE);
                    if (memcmp(one, y + b * rows, (size_t)rows * sizeof *one) != 0)
                        fail_msg("%s: row %lld of an n=%lld batch differs (path %d, %d threads)", fmt_name(fmts[f]),
                                 (long long)b, (long long)n, p, threads);
                }
                dr_pool_free(pool);
            }
        free(x), free(y), free(one);
        free_weight(&t);
    }
}

/* The E4M3 vector decode against the table for every code, NaN codes included. */
static void test_fp8_all_codes_paths(void **state) {
    (void)state;
    uint8_t codes[256 + 7];
    for (int i = 0; i < 256 + 7; i++) codes[i] = (uint8_t)i;
    float one = 1.0f;
    dr_tensor tw = {.name = "codes", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {1, 263}, .data = codes, .nbytes = 263};
    dr_tensor ts = {.name = "codes.weight_scale", .dtype = DR_DT_F32, .ndim = 0, .data = (uint8_t *)&one, .nbytes = 4};
    dr_weight w;
    drama_error err = {0};
    assert_int_equal(dr_weight_bind(&tw, &ts, NULL, NULL, -1, 0, 0, &w, &err), DRAMA_OK);
    float a[263], b[263];
    dr_weight_dequant_row(&w, 0, a);
    dr_cpu_dequant_row_path(&w, 0, b, DR_CPU_AUTO);
    for (int i = 0; i < 263; i++) {
        if (isnan(a[i])) assert_true(isnan(b[i]));
        else assert_int_equal(dr_f32_bits(a[i]), dr_f32_bits(b[i]));
    }
    /* NaN weights and NaN/Inf activations propagate */
    float x[263];
    for (int i = 0; i < 263; i++) x[i] = 0.0f;
    float y = 0;
    dr_cpu_matmul(&w, x, 1, &y, NULL);
    assert_true(isnan(y)); /* 0 * NaN */
    /* the NaN-free fast path, every finite code, at scales from subnormal to the fallback limit */
    uint8_t fin[254 + 9];
    int nf = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7F) != 0x7F) fin[nf++] = (uint8_t)c;
    for (int i = nf; i < 263; i++) fin[i] = (uint8_t)(i * 37);
    for (int i = nf; i < 263; i++)
        if ((fin[i] & 0x7F) == 0x7F) fin[i] = 0x11;
    const float scales[] = {1.0f, 0x1p-140f, 3.0e-30f, 0.0123f, 127.9f, 128.0f, 1e30f, -2.5f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        float sc = scales[si];
        dr_tensor tf = {.name = "fin", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {1, 263}, .data = fin, .nbytes = 263};
        dr_tensor tsc = {.name = "fin.weight_scale", .dtype = DR_DT_F32, .ndim = 0, .data = (uint8_t *)&sc, .nbytes = 4};
        assert_int_equal(dr_weight_bind(&tf, &tsc, NULL, NULL, -1, 0, 0, &w, &err), DRAMA_OK);
        dr_weight_dequant_row(&w, 0, a);
        dr_cpu_dequant_row_path(&w, 0, b, DR_CPU_AUTO);
        for (int i = 0; i < 263; i++)
            if (dr_f32_bits(a[i]) != dr_f32_bits(b[i]))
                fail_msg("code 0x%02x scale %a: %a vs reference %a", fin[i], (double)sc, (double)b[i], (double)a[i]);
    }
}

/* NVFP4 over every code and block scale, with global scales that push the block tables of the
 * vector path out of their exact range (tiny, huge, negative): all paths agree bit for bit. */
static void test_nvfp4_extreme_scales(void **state) {
    (void)state;
    enum { R = 4, C = 256 };
    uint8_t packed[R * C / 2], scales[R * C / 16];
    for (int i = 0; i < R * C / 2; i++) packed[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < R * C / 16; i++) scales[i] = (uint8_t)((i * 5) % 127); /* 0x00..0x7E, never NaN */
    const float globals[] = {1.0f, -0.75f, 1e-36f, 3e-39f, 1e30f, 3.4e38f, 0x1p-10f};
    float x[3 * C];
    for (int i = 0; i < 3 * C; i++) x[i] = frand();
    for (size_t gi = 0; gi < sizeof globals / sizeof globals[0]; gi++) {
        float g = globals[gi];
        dr_tensor tw = {.name = "nv.weight", .dtype = DR_DT_U8, .ndim = 2, .shape = {R, C / 2}, .data = packed,
                        .nbytes = sizeof packed};
        dr_tensor ts = {.name = "nv.weight_scale", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {R, C / 16},
                        .data = scales, .nbytes = sizeof scales};
        dr_tensor t2 = {.name = "nv.weight_scale_2", .dtype = DR_DT_F32, .ndim = 0, .data = (uint8_t *)&g, .nbytes = 4};
        dr_weight w;
        drama_error err = {0};
        assert_int_equal(dr_weight_bind(&tw, &ts, &t2, NULL, -1, 0, 0, &w, &err), DRAMA_OK);
        float a[C], b[C];
        for (int r = 0; r < R; r++) {
            dr_weight_dequant_row(&w, r, a);
            dr_cpu_dequant_row_path(&w, r, b, DR_CPU_AUTO);
            for (int c = 0; c < C; c++)
                if (dr_f32_bits(a[c]) != dr_f32_bits(b[c]))
                    fail_msg("g=%a r=%d c=%d: %a vs reference %a", (double)g, r, c, (double)b[c], (double)a[c]);
        }
        float y1[3 * R], y2[3 * R];
        for (int nn = 1; nn <= 3; nn += 2) {
            dr_cpu_matmul_path(&w, 0, R, x, nn, y1, NULL, DR_CPU_PORTABLE);
            dr_cpu_matmul_path(&w, 0, R, x, nn, y2, NULL, DR_CPU_AUTO);
            for (int i = 0; i < nn * R; i++)
                if (dr_f32_bits(y1[i]) != dr_f32_bits(y2[i]) && !(isnan(y1[i]) && isnan(y2[i])))
                    fail_msg("g=%a n=%d y[%d]: %a vs portable %a", (double)g, nn, i, (double)y2[i], (double)y1[i]);
        }
    }
}

static void test_nonfinite_activations(void **state) {
    (void)state;
    test_weight t;
    make_weight(&t, DR_WF_BF16, 4, 40);
    float x[2 * 40];
    for (int i = 0; i < 80; i++) x[i] = 0.5f;
    x[3] = NAN;
    x[40 + 39] = INFINITY; /* in the tail */
    float y[8];
    const dr_cpu_path paths[3] = {DR_CPU_PORTABLE, DR_CPU_AVX2, DR_CPU_AVX512};
    for (int p = 0; p < 3; p++) {
        dr_cpu_matmul_path(&t.w, 0, 4, x, 2, y, NULL, paths[p]);
        for (int r = 0; r < 4; r++) {
            assert_true(isnan(y[r]));
            assert_false(isfinite(y[4 + r]));
        }
        dr_cpu_matmul_path(&t.w, 0, 4, x, 1, y, NULL, paths[p]); /* n = 1: the fused loops */
        dr_cpu_matmul_path(&t.w, 0, 4, x + 40, 1, y + 4, NULL, paths[p]);
        for (int r = 0; r < 4; r++) {
            assert_true(isnan(y[r]));
            assert_false(isfinite(y[4 + r]));
        }
    }
    free_weight(&t);
}

/* The golden units through the kernels: y = x * dequant^T against a float64 product with the
 * golden `.dequant` values. */
static void test_golden_units_matmul(void **state) {
    (void)state;
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open(tu_golden("ref/quant-units.safetensors"), &f, &err), DRAMA_OK);
    const char *units[] = {"fp8.0", "fp8.1", "fp8.2", "nvfp4.0", "nvfp4.1", "mlx.0", "mlx.1"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        char nm[5][96];
        const char *suf[5] = {"weight", "weight_scale_inv", "weight_scale", "weight_scale_2", "scales"};
        const dr_tensor *t[5];
        for (int i = 0; i < 5; i++) {
            snprintf(nm[i], sizeof nm[i], "%s.%s", units[u], suf[i]);
            t[i] = dr_st_find(f, nm[i]);
        }
        char bn[96], dn[96];
        snprintf(bn, sizeof bn, "%s.biases", units[u]);
        snprintf(dn, sizeof dn, "%s.dequant", units[u]);
        const dr_tensor *scale = t[1] ? t[1] : t[2] ? t[2] : t[4];
        dr_weight w;
        assert_int_equal(dr_weight_bind(t[0], scale, t[3], dr_st_find(f, bn), -1, 0, 0, &w, &err), DRAMA_OK);
        const dr_tensor *dq = dr_st_find(f, dn);
        assert_non_null(dq);
        int64_t n = 3;
        float *x = malloc((size_t)(n * w.cols) * sizeof *x), *y = malloc((size_t)(n * w.rows) * sizeof *y);
        float *ref = malloc((size_t)(n * w.rows) * sizeof *ref);
        for (int64_t i = 0; i < n * w.cols; i++) x[i] = frand();
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < w.rows; r++) {
                double s = 0;
                for (int64_t k = 0; k < w.cols; k++) {
                    float d;
                    memcpy(&d, dq->data + 4 * (r * w.cols + k), 4);
                    s += (double)x[i * w.cols + k] * d;
                }
                ref[i * w.rows + r] = (float)s;
            }
        dr_pool *pool = dr_pool_create(2);
        dr_cpu_matmul(&w, x, n, y, pool);
        dr_pool_free(pool);
        tu_cmp c = tu_compare_f32(y, ref, n * w.rows);
        char label[128];
        snprintf(label, sizeof label, "matmul %s [%lld, %lld]", units[u], (long long)w.rows, (long long)w.cols);
        assert_true(tu_report(label, c, 1e-5 * (c.max_ref > 1 ? c.max_ref : 1)));
        free(x);
        free(y);
        free(ref);
    }
    dr_st_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_ragged),
        cmocka_unit_test(test_large_batches),
        cmocka_unit_test(test_fp8_all_codes_paths),
        cmocka_unit_test(test_nvfp4_extreme_scales),
        cmocka_unit_test(test_nonfinite_activations),
        cmocka_unit_test(test_golden_units_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
