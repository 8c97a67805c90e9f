/* The exactness conditions of the AVX2 / AVX-512 fast paths (matmul_avx2.c, matmul_avx512.c), at the values where they switch:
 * affine scales BF16 / F16 / F32 (one fma only where s * q is exact), huge, tiny and zero scales,
 * NaN / Inf biases; NVFP4 with non-finite global scales and NaN block-scale codes (the product
 * table's fallback; bind refuses both, so they are set in the bound struct); FP8 blocks whose scale is at or past the fused path's 2^7 limit, and NaN
 * codes in some rows only. Every dequantised row must equal dr_weight_dequant_row bit for bit
 * (NaN bits included) and every product must equal the portable path's bits, for n = 1 and 3; the
 * affine fixtures keep rows with finite products (a NaN equals a NaN, so all-NaN outputs would
 * compare nothing) and the planted paths must differ there. */
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
#include "backend/cpu/prefetch.h"
#include "num/formats.h"
#include "num/weight.h"

static uint32_t rng_state = 11;
static uint32_t urand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static float frand(void) { return (float)urand() / 8388608.0f - 1.0f; } /* [-1, 1) */

/* products of w through path against the portable path's, n = 1 and 3: the mismatches (NaN equals
 * NaN); *finite_min gets the fewest finite outputs one comparison saw (a check of NaNs only
 * compares nothing) */
static int64_t product_mismatches(const dr_weight *w, dr_cpu_path path, const char *label, int report, int64_t *finite_min) {
    int64_t rows = w->rows, cols = w->cols, n = 3, bad = 0;
    float *x = malloc((size_t)(n * cols) * sizeof *x);
    float *y0 = malloc((size_t)(n * rows) * sizeof *y0), *y1 = malloc((size_t)(n * rows) * sizeof *y1);
    for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
    *finite_min = INT64_MAX;
    for (int64_t nn = 1; nn <= n; nn += 2) {
        dr_cpu_matmul_path(w, 0, rows, x, nn, y0, NULL, DR_CPU_PORTABLE);
        dr_cpu_matmul_path(w, 0, rows, x, nn, y1, NULL, path);
        int64_t finite = 0;
        for (int64_t i = 0; i < nn * rows; i++) {
            finite += isfinite(y0[i]) && isfinite(y1[i]);
            if (dr_f32_bits(y0[i]) != dr_f32_bits(y1[i]) && !(isnan(y0[i]) && isnan(y1[i]))) {
                if (report)
                    fail_msg("%s: %s n=%lld y[%lld] = %a, portable %a", label, dr_cpu_path_name(path), (long long)nn,
                             (long long)i, (double)y1[i], (double)y0[i]);
                bad++;
            }
        }
        if (finite < *finite_min) *finite_min = finite;
    }
    free(x), free(y0), free(y1);
    return bad;
}

/* both paths: dequantised rows bit-identical to the reference, products bit-identical to portable;
 * returns the fewest finite products one comparison saw */
static int64_t check_paths(const dr_weight *w, const char *label) {
    int64_t rows = w->rows, cols = w->cols, fewest = INT64_MAX;
    float *a = malloc((size_t)cols * sizeof *a), *b = malloc((size_t)cols * sizeof *b);
    for (int64_t r = 0; r < rows; r++) {
        dr_weight_dequant_row(w, r, a);
        dr_cpu_dequant_row_path(w, r, b, DR_CPU_AVX2);
        for (int64_t c = 0; c < cols; c++)
            if (dr_f32_bits(a[c]) != dr_f32_bits(b[c]))
                fail_msg("%s: row %lld col %lld dequantised to %a (0x%08x), reference %a (0x%08x)", label, (long long)r,
                         (long long)c, (double)b[c], dr_f32_bits(b[c]), (double)a[c], dr_f32_bits(a[c]));
    }
    const dr_cpu_path vec[2] = {DR_CPU_AVX2, DR_CPU_AVX512};
    for (int p = 0; p < 2; p++) {
        int64_t finite;
        product_mismatches(w, vec[p], label, 1, &finite);
        if (finite < fewest) fewest = finite;
    }
    free(a), free(b);
    return fewest;
}

/* a planted copy of a vector path (kernels.h) must differ from the portable products somewhere:
 * the comparison above can fail */
static void check_planted_differs(const dr_weight *w, dr_cpu_path planted, const char *label) {
    if (!dr_cpu_path_supported(planted)) return;
    int64_t finite;
    if (product_mismatches(w, planted, label, 0, &finite) == 0)
        fail_msg("%s: planted path %d gives the portable bits: the check cannot fail", label, (int)planted);
}

static void put_scale(uint8_t *base, dr_dtype dt, int64_t i, float v) {
    if (dt == DR_DT_F32) memcpy(base + 4 * i, &v, 4);
    else {
        uint16_t h = dt == DR_DT_BF16 ? dr_f32_to_bf16(v) : dr_f32_to_f16(v);
        memcpy(base + 2 * i, &h, 2);
    }
}

/* Scale and bias of group i of a row of kind `kind` (row % 4): 0 ordinary values only, 1 also
 * zero, negative and subnormal scales (products stay finite), 2 also scales whose s * q overflows
 * (huge ones only in F32/BF16; their groups' codes set to 4) with a bias that would make
 * fma(s, q, b) finite, 3 also NaN / -Inf /
 * -0 biases. Kinds 0 and 1 keep finite products for the comparison to look at. */
static float affine_scale(dr_dtype dt, int64_t i, int kind) {
    if (kind == 1 && i % 11 == 3) return 0.0f;
    if (kind == 1 && i % 11 == 5) return -frand() * 0.01f;
    if (kind == 1 && i % 11 == 7) return dt == DR_DT_F16 ? 6.0e-8f : 0x1p-130f; /* subnormal in the stored dtype */
    if (kind == 2 && i % 11 == 9) return dt == DR_DT_F16 ? 60000.0f : 0x1p126f; /* past the fma limit (2^100) */
    return frand() * 0.03f;
}

static float affine_bias(int64_t i, int kind) {
    /* with the overflowing scale and q = 4: s * q rounds to +Inf, fma(s, q, b) = 2^120 (the largest
     * BF16 below 2^128, so the sums stay finite where an fma was wrongly taken) */
    if (kind == 2 && i % 11 == 9) return -0x1.fep127f;
    if (kind == 3 && i % 13 == 4) return NAN;
    if (kind == 3 && i % 13 == 8) return -INFINITY;
    if (kind == 3 && i % 13 == 10) return -0.0f;
    return frand();
}

static void test_affine_scale_dtypes(void **state) {
    (void)state;
    const dr_dtype dts[] = {DR_DT_BF16, DR_DT_F16, DR_DT_F32};
    const int groups[] = {32, 64, 128};
    for (int di = 0; di < 3; di++)
        for (int bits = 4; bits <= 8; bits += 4)
            for (int gi = 0; gi < 3; gi++) {
                int g = groups[gi];
                int64_t rows = 7, cols = 3 * 128 + (int64_t)g * 70; /* more than 64 groups: two spans */
                size_t el = dr_dtype_size(dts[di]), nb = (size_t)(rows * cols * bits / 8), ns = (size_t)(rows * cols / g);
                uint8_t *codes = malloc(nb), *sc = malloc(ns * el), *bi = malloc(ns * el);
                for (size_t i = 0; i < nb; i++) codes[i] = (uint8_t)urand();
                for (size_t i = 0; i < ns; i++) {
                    int kind = (int)((int64_t)i / (cols / g) % 4); /* by row */
                    put_scale(sc, dts[di], (int64_t)i, affine_scale(dts[di], (int64_t)i, kind));
                    put_scale(bi, dts[di], (int64_t)i, affine_bias((int64_t)i, kind));
                    if (kind == 2 && i % 11 == 9) /* codes 4: s * q overflows, fma(s, q, b) would not */
                        for (int64_t c = (int64_t)(i % (size_t)(cols / g)) * g, e = c + g; c < e; c++) {
                            int64_t at = (int64_t)i / (cols / g) * cols + c; /* element of the matrix */
                            uint8_t q = 4;
                            if (bits == 8) codes[at] = q;
                            else codes[at / 2] = (uint8_t)(at & 1 ? (codes[at / 2] & 0x0F) | (q << 4) : (codes[at / 2] & 0xF0) | q);
                        }
                }
                dr_tensor tw = {.name = "aff.weight", .dtype = DR_DT_U32, .ndim = 2, .shape = {rows, cols * bits / 32},
                                .data = codes, .nbytes = nb};
                dr_tensor ts = {.name = "aff.scales", .dtype = dts[di], .ndim = 2, .shape = {rows, cols / g},
                                .data = sc, .nbytes = ns * el};
                dr_tensor tb = ts;
                tb.name = "aff.biases";
                tb.data = bi;
                dr_weight w;
                drama_error err = {0};
                if (dr_weight_bind_ex(&tw, &ts, NULL, &tb, -1, 0, 0, cols, &w, &err) != DRAMA_OK)
                    fail_msg("bind: %s", err.message);
                assert_int_equal(w.bits, bits);
                assert_int_equal(w.group, g);
                char label[64];
                snprintf(label, sizeof label, "affine %s %d-bit g%d", dr_dtype_name(dts[di]), bits, g);
                /* rows 0, 1, 4, 5 (kinds 0 and 1) have finite products, for n = 1 and n = 3 */
                int64_t finite = check_paths(&w, label);
                if (finite < 4 && dr_cpu_path_supported(DR_CPU_AVX2))
                    fail_msg("%s: only %lld finite products compared", label, (long long)finite);
                check_planted_differs(&w, bits == 4 ? DR_CPU_AVX2_PLANT1 : DR_CPU_AVX2_PLANT4, label);
                check_planted_differs(&w, DR_CPU_AVX512_PLANT1, label);
                free(codes), free(sc), free(bi);
            }
}

static void test_nvfp4_fallbacks(void **state) {
    (void)state;
    enum { R = 5, C = 16 * 21 }; /* 21 blocks: a 16-column tail after the 32-column body */
    uint8_t packed[R * C / 2], scales[R * C / 16];
    for (int i = 0; i < R * C / 2; i++) packed[i] = (uint8_t)urand();
    const float globals[] = {0.37f, -2.5f, INFINITY, -INFINITY, NAN, 0.0f, 3.0e38f, 1e-40f};
    for (int nan_scales = 0; nan_scales < 2; nan_scales++)
        for (size_t gi = 0; gi < sizeof globals / sizeof globals[0]; gi++) {
            for (int i = 0; i < R * C / 16; i++) scales[i] = (uint8_t)(urand() % 0x7F); /* finite codes */
            float g = 1.0f; /* bind refuses a non-finite weight_scale_2: set it in the struct below */
            dr_tensor tw = {.name = "nv.weight", .dtype = DR_DT_U8, .ndim = 2, .shape = {R, C / 2}, .data = packed,
                            .nbytes = sizeof packed};
            dr_tensor ts = {.name = "nv.weight_scale", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {R, C / 16},
                            .data = scales, .nbytes = sizeof scales};
            dr_tensor t2 = {.name = "nv.weight_scale_2", .dtype = DR_DT_F32, .ndim = 0, .data = (uint8_t *)&g, .nbytes = 4};
            dr_weight w;
            drama_error err = {0};
            if (dr_weight_bind(&tw, &ts, &t2, NULL, -1, 0, 0, &w, &err) != DRAMA_OK) fail_msg("bind: %s", err.message);
            /* bind refuses NaN block scales too: planted after it, in rows 0 and 1 (its tail block) */
            if (nan_scales) scales[3] = 0x7F, scales[C / 16 + 20] = 0xFF;
            g = w.global_scale = globals[gi];
            char label[64];
            snprintf(label, sizeof label, "nvfp4 g=%a nan-scales=%d", (double)g, nan_scales);
            check_paths(&w, label);
            if (gi == 0) { /* an ordinary global scale: the planted tables must show */
                check_planted_differs(&w, DR_CPU_AVX2_PLANT3, label);
                check_planted_differs(&w, DR_CPU_AVX512_PLANT3, label);
            }
        }
}

static void test_fp8_block_scale_limits(void **state) {
    (void)state;
    const int widths[] = {32, 64, 128};
    for (int wi = 0; wi < 3; wi++) {
        int bc = widths[wi], br = 4;
        int64_t rows = 12, cols = (int64_t)bc * 5 + 19; /* ragged last block */
        int64_t sr = rows / br, sc = (cols + bc - 1) / bc;
        uint8_t *codes = malloc((size_t)(rows * cols));
        float *scale = malloc((size_t)(sr * sc) * sizeof *scale);
        for (int64_t i = 0; i < rows * cols; i++) {
            codes[i] = (uint8_t)urand();
            if ((codes[i] & 0x7F) == 0x7F) codes[i] ^= 1; /* NaN codes only where planted below */
        }
        codes[5 * cols + 7] = 0x7F; /* row 5 holds a NaN code */
        codes[9 * cols + cols - 1] = 0xFF; /* row 9, in the tail */
        /* block row 0: scales below the 2^7 limit only (the fused loops run, the products stay
         * small enough to show a planted defect); 1: one at the limit; 2: one far past it */
        const float picks[] = {0.75f, 127.99f, -3.0f, 0x1p-140f, 0.0f};
        for (int64_t i = 0; i < sr * sc; i++) scale[i] = picks[i % 5];
        scale[1 * sc + 2] = 128.0f;
        scale[2 * sc + 3] = 1e30f;
        dr_tensor tw = {.name = "fp8.weight", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {rows, cols}, .data = codes,
                        .nbytes = (size_t)(rows * cols)};
        dr_tensor ts = {.name = "fp8.weight_scale_inv", .dtype = DR_DT_F32, .ndim = 2, .shape = {sr, sc},
                        .data = (uint8_t *)scale, .nbytes = (size_t)(sr * sc) * 4};
        dr_weight w;
        drama_error err = {0};
        if (dr_weight_bind_ex(&tw, &ts, NULL, NULL, -1, br, bc, cols, &w, &err) != DRAMA_OK)
            fail_msg("bind: %s", err.message);
        char label[64];
        snprintf(label, sizeof label, "fp8-block %dx%d", br, bc);
        check_paths(&w, label);
        check_planted_differs(&w, DR_CPU_AVX2_PLANT2, label);
        check_planted_differs(&w, DR_CPU_AVX512_PLANT2, label);
        free(codes), free(scale);
    }
}

/* DRAMA_CPU_PF_STREAM: a byte count in [0, PF_SPAN_MAX], anything else the CPU's default */
static void test_pf_stream_parse(void **state) {
    (void)state;
    assert_int_equal(dr_cpu_pf_stream_parse(NULL, 1024), 1024);
    assert_int_equal(dr_cpu_pf_stream_parse("", 7), 7);
    assert_int_equal(dr_cpu_pf_stream_parse("0", 1024), 0);
    assert_int_equal(dr_cpu_pf_stream_parse("512", 0), 512);
    assert_int_equal(dr_cpu_pf_stream_parse("16384", 0), PF_SPAN_MAX);
    assert_int_equal(dr_cpu_pf_stream_parse("16385", 5), 5);
    assert_int_equal(dr_cpu_pf_stream_parse("-64", 5), 5);
    assert_int_equal(dr_cpu_pf_stream_parse("64x", 5), 5);
    assert_int_equal(dr_cpu_pf_stream_parse("abc", 5), 5);
    assert_int_equal(dr_cpu_pf_stream_parse("99999999999999999999", 5), 5);
    assert_true(dr_cpu_pf_stream() >= 0); /* the process's choice, whatever the CPU */
}

int main(void) {
    if (!dr_cpu_path_supported(DR_CPU_AVX2)) /* the AVX2 requests then run the portable path */
        printf("no AVX2+FMA+F16C on this CPU: the fast paths are not exercised here\n");
    if (!dr_cpu_path_supported(DR_CPU_AVX512))
        printf("no AVX-512 F/BW/VL/DQ on this CPU: the AVX-512 loops are not exercised here\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affine_scale_dtypes),
        cmocka_unit_test(test_nvfp4_fallbacks),
        cmocka_unit_test(test_fp8_block_scale_limits),
        cmocka_unit_test(test_pf_stream_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
