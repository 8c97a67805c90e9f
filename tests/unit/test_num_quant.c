/* Unit tests of src/num/weight (bind + dequantise) and src/num/quant (encoders) against
 * ref/quant-units.safetensors: every unit dequantises to `.dequant` bit for bit, and encoding
 * `.source_bf16` reproduces the stored tensors bit for bit. Unit names are discovered from the
 * file (any `<fmt>.<k>.dequant`), so other unit sets work unchanged. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "io/safetensors.h"
#include "num/formats.h"
#include "num/quant.h"
#include "num/weight.h"
#include "testutil.h"

static dr_st_file *open_units(void) {
    drama_error err = {0};
    dr_st_file *f = NULL;
    if (dr_st_open(tu_golden("ref/quant-units.safetensors"), &f, &err) != DRAMA_OK)
        fail_msg("open quant-units: %s", err.message);
    return f;
}

static const dr_tensor *find(dr_st_file *f, const char *prefix, const char *suffix) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return dr_st_find(f, name);
}

/* Units "<fmt>.<k>" present in the file, found through their ".dequant" tensor. */
static int list_units(dr_st_file *f, const char *fmt, char names[][64], int max) {
    int n = 0;
    for (int64_t i = 0; i < dr_st_count(f) && n < max; i++) {
        const char *nm = dr_st_at(f, i)->name;
        size_t lf = strlen(fmt), ln = strlen(nm);
        if (strncmp(nm, fmt, lf) == 0 && nm[lf] == '.' && ln > 8 && strcmp(nm + ln - 8, ".dequant") == 0 &&
            ln - 8 < 64) {
            memcpy(names[n], nm, ln - 8);
            names[n][ln - 8] = 0;
            n++;
        }
    }
    return n;
}

static dr_weight bind_unit(dr_st_file *f, const char *u) {
    const dr_tensor *w = find(f, u, "weight");
    assert_non_null(w);
    const dr_tensor *scale = find(f, u, "weight_scale_inv");
    if (!scale) scale = find(f, u, "weight_scale");
    if (!scale) scale = find(f, u, "scales");
    const dr_tensor *scale2 = find(f, u, "weight_scale_2");
    const dr_tensor *bias = find(f, u, "biases");
    dr_weight wt;
    drama_error err = {0};
    if (dr_weight_bind(w, scale, scale2, bias, -1, 0, 0, &wt, &err) != DRAMA_OK) fail_msg("bind %s: %s", u, err.message);
    return wt;
}

static void check_dequant(const char *fmt, dr_wfmt want) {
    dr_st_file *f = open_units();
    char units[16][64];
    int nu = list_units(f, fmt, units, 16);
    assert_true(nu > 0);
    for (int k = 0; k < nu; k++) {
        dr_weight w = bind_unit(f, units[k]);
        assert_int_equal(w.fmt, want);
        const dr_tensor *dq = find(f, units[k], "dequant");
        assert_int_equal(dq->ndim, 2);
        assert_int_equal(w.rows, dq->shape[0]);
        assert_int_equal(w.cols, dq->shape[1]);
        float *row = malloc((size_t)w.cols * sizeof *row);
        int64_t mism = 0;
        for (int64_t r = 0; r < w.rows; r++) {
            dr_weight_dequant_row(&w, r, row);
            for (int64_t c = 0; c < w.cols; c++) {
                uint32_t g;
                memcpy(&g, dq->data + 4 * (r * w.cols + c), 4);
                if (dr_f32_bits(row[c]) != g) mism++;
            }
        }
        /* a row view (FP8: from the second block row; others: from row 1) dequantises the same rows */
        int64_t r0 = w.fmt == DR_WF_FP8_BLOCK ? (w.rows > w.block_rows ? w.block_rows : 0) : 1;
        dr_weight v;
        drama_error verr = {0};
        assert_int_equal(dr_weight_rows(&w, r0, w.rows, &v, &verr), DRAMA_OK);
        float *row2 = malloc((size_t)w.cols * sizeof *row2);
        for (int64_t r = r0; r < w.rows; r++) {
            dr_weight_dequant_row(&w, r, row);
            dr_weight_dequant_row(&v, r - r0, row2);
            assert_memory_equal(row, row2, (size_t)w.cols * sizeof *row);
        }
        free(row2);
        if (w.fmt == DR_WF_FP8_BLOCK && w.rows > w.block_rows)
            assert_int_not_equal(dr_weight_rows(&w, 1, w.rows, &v, &verr), DRAMA_OK); /* mid-block */
        printf("%s: [%lld, %lld] %s bits=%d group=%d: %lld of %lld dequantised values differ (bit-exact)\n", units[k],
               (long long)w.rows, (long long)w.cols, dr_dtype_name(w.scale_dtype), w.bits, w.group, (long long)mism,
               (long long)(w.rows * w.cols));
        assert_int_equal(mism, 0);
        free(row);
    }
    dr_st_close(f);
}

static void test_dequant_fp8(void **state) { (void)state; check_dequant("fp8", DR_WF_FP8_BLOCK); }
static void test_dequant_nvfp4(void **state) { (void)state; check_dequant("nvfp4", DR_WF_NVFP4); }
static void test_dequant_mlx(void **state) { (void)state; check_dequant("mlx", DR_WF_AFFINE); }

static float *source_f32(dr_st_file *f, const char *u, int64_t *rows, int64_t *cols) {
    const dr_tensor *s = find(f, u, "source_bf16");
    assert_non_null(s);
    assert_int_equal(s->ndim, 2);
    *rows = s->shape[0];
    *cols = s->shape[1];
    float *out = malloc((size_t)(*rows * *cols) * sizeof *out);
    drama_error err = {0};
    assert_int_equal(dr_st_to_f32(s, out, &err), DRAMA_OK);
    return out;
}

static int64_t count_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int64_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static void test_encode_fp8(void **state) {
    (void)state;
    dr_st_file *f = open_units();
    char units[16][64];
    int nu = list_units(f, "fp8", units, 16);
    assert_true(nu > 0);
    for (int k = 0; k < nu; k++) {
        int64_t rows, cols;
        float *src = source_f32(f, units[k], &rows, &cols);
        const dr_tensor *gw = find(f, units[k], "weight"), *gs = find(f, units[k], "weight_scale_inv");
        assert_int_equal(gs->dtype, DR_DT_F32);
        /* block size from the golden scale shape: the largest br with ceil(rows/br) = shape */
        int br = 128, bc = 128;
        assert_int_equal(gs->shape[0], (rows + br - 1) / br);
        assert_int_equal(gs->shape[1], (cols + bc - 1) / bc);
        uint8_t *codes = malloc((size_t)(rows * cols));
        float *scales = malloc(gs->nbytes);
        drama_error err = {0};
        assert_int_equal(dr_quant_fp8_block(src, rows, cols, br, bc, codes, scales, &err), DRAMA_OK);
        int64_t dc = count_diff(codes, gw->data, (size_t)(rows * cols));
        int64_t ds = count_diff((const uint8_t *)scales, gs->data, gs->nbytes);
        printf("%s encode: %lld code bytes, %lld scale bytes differ\n", units[k], (long long)dc, (long long)ds);
        assert_int_equal(dc, 0);
        assert_int_equal(ds, 0);
        free(codes);
        free(scales);
        free(src);
    }
    dr_st_close(f);
}

static void test_encode_nvfp4(void **state) {
    (void)state;
    dr_st_file *f = open_units();
    char units[16][64];
    int nu = list_units(f, "nvfp4", units, 16);
    assert_true(nu > 0);
    for (int k = 0; k < nu; k++) {
        int64_t rows, cols;
        float *src = source_f32(f, units[k], &rows, &cols);
        const dr_tensor *gw = find(f, units[k], "weight"), *gs = find(f, units[k], "weight_scale"),
                        *g2 = find(f, units[k], "weight_scale_2");
        float gs2 = dr_quant_nvfp4_global_scale(dr_quant_amax(src, rows * cols));
        float want2;
        memcpy(&want2, g2->data, 4);
        printf("%s: weight_scale_2 %a (golden %a)\n", units[k], (double)gs2, (double)want2);
        assert_int_equal(dr_f32_bits(gs2), dr_f32_bits(want2));
        uint8_t *packed = malloc((size_t)(rows * cols / 2)), *scales = malloc((size_t)(rows * cols / 16));
        drama_error err = {0};
        assert_int_equal(dr_quant_nvfp4(src, rows, cols, gs2, packed, scales, &err), DRAMA_OK);
        int64_t dc = count_diff(packed, gw->data, (size_t)(rows * cols / 2));
        int64_t ds = count_diff(scales, gs->data, (size_t)(rows * cols / 16));
        printf("%s encode: %lld packed bytes, %lld scale bytes differ\n", units[k], (long long)dc, (long long)ds);
        assert_int_equal(dc, 0);
        assert_int_equal(ds, 0);
        free(packed);
        free(scales);
        free(src);
    }
    dr_st_close(f);
}

static void test_encode_mlx(void **state) {
    (void)state;
    dr_st_file *f = open_units();
    char units[16][64];
    int nu = list_units(f, "mlx", units, 16);
    assert_true(nu > 0);
    for (int k = 0; k < nu; k++) {
        int64_t rows, cols;
        float *src = source_f32(f, units[k], &rows, &cols);
        dr_weight w = bind_unit(f, units[k]); /* bits and group from the stored shapes */
        const dr_tensor *gw = find(f, units[k], "weight"), *gs = find(f, units[k], "scales"),
                        *gb = find(f, units[k], "biases");
        uint8_t *words = malloc(gw->nbytes), *scales = malloc(gs->nbytes), *biases = malloc(gb->nbytes);
        drama_error err = {0};
        assert_int_equal(dr_quant_affine(src, rows, cols, w.bits, w.group, gs->dtype, words, scales, biases, &err),
                         DRAMA_OK);
        int64_t dw = count_diff(words, gw->data, gw->nbytes), ds = count_diff(scales, gs->data, gs->nbytes),
                db = count_diff(biases, gb->data, gb->nbytes);
        printf("%s encode (bits %d, group %d): %lld word, %lld scale, %lld bias bytes differ\n", units[k], w.bits,
               w.group, (long long)dw, (long long)ds, (long long)db);
        assert_int_equal(dw, 0);
        assert_int_equal(ds, 0);
        assert_int_equal(db, 0);
        free(words);
        free(scales);
        free(biases);
        free(src);
    }
    dr_st_close(f);
}

/* Round trips on shapes the golden file does not have: 8-bit affine, group 32/128, F32/F16
 * scales, ragged FP8 blocks of other sizes. Encode -> bind -> dequantise must stay within the
 * format's step of the source (1.5 steps for affine: the edge rule can move the far end of the
 * grid by up to 15/8 half-steps). */
static void test_roundtrip_other_shapes(void **state) {
    (void)state;
    int64_t rows = 37, cols = 256;
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    uint32_t s = 12345;
    for (int64_t i = 0; i < rows * cols; i++) {
        s = s * 1664525u + 1013904223u;
        src[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (1.0f + (float)(i % 7));
    }
    float *row = malloc((size_t)cols * sizeof *row);
    drama_error err = {0};
    const int bits_list[2] = {4, 8}, groups[3] = {32, 64, 128};
    const dr_dtype sdt[3] = {DR_DT_BF16, DR_DT_F16, DR_DT_F32};
    for (int bi = 0; bi < 2; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 3; di++) {
                int bits = bits_list[bi], g = groups[gi];
                size_t el = dr_dtype_size(sdt[di]);
                int64_t pc = cols * bits / 32, sc = cols / g;
                uint8_t *words = malloc((size_t)(rows * pc * 4)), *sca = malloc((size_t)(rows * sc) * el),
                        *bia = malloc((size_t)(rows * sc) * el);
                assert_int_equal(dr_quant_affine(src, rows, cols, bits, g, sdt[di], words, sca, bia, &err), DRAMA_OK);
                dr_tensor tw = {.name = "w", .dtype = DR_DT_U32, .ndim = 2, .shape = {rows, pc}, .data = words,
                                .nbytes = (size_t)(rows * pc * 4)};
                dr_tensor ts = {.name = "w.scales", .dtype = sdt[di], .ndim = 2, .shape = {rows, sc}, .data = sca,
                                .nbytes = (size_t)(rows * sc) * el};
                dr_tensor tb = ts;
                tb.name = "w.biases";
                tb.data = bia;
                dr_weight w;
                assert_int_equal(dr_weight_bind_ex(&tw, &ts, NULL, &tb, -1, 0, 0, cols, &w, &err), DRAMA_OK);
                assert_int_equal(w.bits, bits);
                assert_int_equal(w.group, g);
                double worst = 0;
                for (int64_t r = 0; r < rows; r++) {
                    dr_weight_dequant_row(&w, r, row);
                    for (int64_t c = 0; c < cols; c++) {
                        double step = fabs(dr_weight_load_scale(sca, sdt[di], r * sc + c / g));
                        double bias = fabs(dr_weight_load_scale(bia, sdt[di], r * sc + c / g));
                        /* the stored scale/bias carry the dtype's rounding: eps * (|bias| + qmax * step) */
                        double eps = sdt[di] == DR_DT_BF16 ? 0x1p-8 : sdt[di] == DR_DT_F16 ? 0x1p-11 : 0x1p-24;
                        double slack = eps * (bias + ((1 << bits) - 1) * step) / step;
                        double e = fabs(row[c] - src[r * cols + c]) / step - slack;
                        if (!(e <= 1.5)) fail_msg("affine b%d g%d r%lld c%lld: error %.3f steps", bits, g,
                                                         (long long)r, (long long)c, e);
                        if (e > worst) worst = e;
                    }
                }
                printf("affine bits %d group %d %s: worst %.3f quantisation steps\n", bits, g, dr_dtype_name(sdt[di]),
                       worst);
                free(words);
                free(sca);
                free(bia);
            }
    /* FP8 with 16x48 blocks (ragged in both directions), BF16 scales */
    int br = 16, bc = 48;
    int64_t sr = (rows + br - 1) / br, scn = (cols + bc - 1) / bc;
    uint8_t *codes = malloc((size_t)(rows * cols));
    float *scales = malloc((size_t)(sr * scn) * sizeof *scales);
    assert_int_equal(dr_quant_fp8_block(src, rows, cols, br, bc, codes, scales, &err), DRAMA_OK);
    uint16_t *sb = malloc((size_t)(sr * scn) * 2);
    for (int64_t i = 0; i < sr * scn; i++) sb[i] = dr_f32_to_bf16(scales[i]);
    dr_tensor tw = {.name = "w", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {rows, cols}, .data = codes,
                    .nbytes = (size_t)(rows * cols)};
    dr_tensor ts = {.name = "w_scale_inv", .dtype = DR_DT_BF16, .ndim = 2, .shape = {sr, scn},
                    .data = (const uint8_t *)sb, .nbytes = (size_t)(sr * scn) * 2};
    dr_weight w;
    assert_int_equal(dr_weight_bind(&tw, &ts, NULL, NULL, -1, br, bc, &w, &err), DRAMA_OK);
    assert_int_equal(w.fmt, DR_WF_FP8_BLOCK);
    for (int64_t r = 0; r < rows; r++) {
        dr_weight_dequant_row(&w, r, row);
        for (int64_t c = 0; c < cols; c++) {
            float want = dr_e4m3_to_f32(codes[r * cols + c]) * dr_bf16_to_f32(sb[(r / br) * scn + c / bc]);
            assert_int_equal(dr_f32_bits(row[c]), dr_f32_bits(want));
        }
    }
    free(codes);
    free(scales);
    free(sb);
    free(row);
    free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_fp8),  cmocka_unit_test(test_dequant_nvfp4),
        cmocka_unit_test(test_dequant_mlx),  cmocka_unit_test(test_encode_fp8),
        cmocka_unit_test(test_encode_nvfp4), cmocka_unit_test(test_encode_mlx),
        cmocka_unit_test(test_roundtrip_other_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
