/* Unit tests of src/num/formats: every code of E4M3, E2M1, BF16 and F16 against independent
 * definitions (brute-force nearest-even search, ldexp formulas) and against the golden tables and
 * probes of ref/quant-units.safetensors. */
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
#include "testutil.h"

/* ---- independent definitions ---- */

static double e4m3_def(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static double e2m1_def(int c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

/* Nearest of the non-negative codes 0..maxcode (ascending values) to |x|, ties to the even code
 * (even mantissa = even code here, as the last bit of the code is the mantissa's). */
static int nearest_code(double a, double (*def)(int), int maxcode) {
    if (a >= def(maxcode)) return maxcode; /* saturation (and no precision loss for huge a) */
    int best = 0;
    for (int c = 1; c <= maxcode; c++) {
        double dc = fabs(def(c) - a), db = fabs(def(best) - a);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    return best;
}

static int e4m3_encode_def(double x) {
    if (isnan(x)) return 0x7F;
    int c = nearest_code(fabs(x), e4m3_def, 0x7E);
    return (signbit(x) ? 0x80 : 0) | c;
}

static int e2m1_encode_def(double x) {
    int c = nearest_code(fabs(x), e2m1_def, 7);
    if (c == 0) return 0;
    return (x < 0 ? 8 : 0) | c;
}

static double f16_def(int h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* ---- tests ---- */

static void test_e4m3_all_codes(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        double d = e4m3_def(c);
        float v = dr_e4m3_to_f32((uint8_t)c);
        if (isnan(d)) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == d);
        assert_true(!!signbit(v) == ((c & 0x80) != 0));
        /* round trip: every finite code encodes back to itself (-0 keeps its sign) */
        assert_int_equal(dr_f32_to_e4m3(v), c);
        assert_true(dr_ue4m3_to_f32((uint8_t)c) == fabsf(v));
    }
    assert_true(dr_e4m3_to_f32(0x38) == 1.0f);
    assert_true(dr_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(dr_e4m3_to_f32(0x07) == 0.013671875f);
    assert_true(dr_e4m3_to_f32(0x7E) == 448.0f);
    assert_int_equal(dr_f32_to_e4m3(1.0625f), 0x38);
    assert_int_equal(dr_f32_to_e4m3(1.1875f), 0x3A);
    assert_int_equal(dr_f32_to_e4m3(1e9f), 0x7E);
    assert_int_equal(dr_f32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(dr_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(dr_f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(dr_f32_to_e4m3(-1e-9f), 0x80);
}

/* Encode against the brute-force definition on every BF16 value (covers all E4M3 binades with
 * many points between codes), on all code midpoints and on their neighbours. */
static void test_e4m3_encode_exhaustive(void **state) {
    (void)state;
    int checked = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = dr_bf16_to_f32((uint16_t)h);
        if (isnan(x)) {
            assert_int_equal(dr_f32_to_e4m3(x), 0x7F);
            continue;
        }
        int want = e4m3_encode_def(x);
        if (dr_f32_to_e4m3(x) != want) fail_msg("e4m3(%a) = 0x%02x, want 0x%02x", (double)x, dr_f32_to_e4m3(x), want);
        checked++;
    }
    for (int c = 0; c < 0x7E; c++) {
        double mid = (e4m3_def(c) + e4m3_def(c + 1)) / 2;
        int even = (c & 1) ? c + 1 : c;
        assert_int_equal(dr_e4m3_from_f64(mid), even);
        assert_int_equal(dr_e4m3_from_f64(-mid), 0x80 | even);
        assert_int_equal(dr_e4m3_from_f64(nextafter(mid, 0)), c);
        assert_int_equal(dr_e4m3_from_f64(nextafter(mid, 1e9)), c + 1);
    }
    assert_int_equal(dr_e4m3_from_f64(464.0), 0x7E); /* beyond 448: saturate, never NaN */
    printf("e4m3 encode: %d bf16 inputs + all midpoints agree with brute force\n", checked);
}

static void test_e2m1_all_codes(void **state) {
    (void)state;
    for (int c = 0; c < 16; c++) {
        assert_true((double)dr_e2m1_to_f32((uint8_t)c) == e2m1_def(c));
        assert_true(!!signbit(dr_e2m1_to_f32((uint8_t)c)) == (c >= 8));
        assert_int_equal(dr_e2m1_from_f64(e2m1_def(c)), c == 8 ? 0 : c);
    }
    assert_int_equal(dr_e2m1_from_f64(2.5), 4);
    assert_int_equal(dr_e2m1_from_f64(5.0), 6);
    assert_int_equal(dr_e2m1_from_f64(0.25), 0);
    assert_int_equal(dr_e2m1_from_f64(7.0), 7);
    assert_int_equal(dr_e2m1_from_f64(-0.25), 0);
    assert_int_equal(dr_e2m1_from_f64(-100.0), 15);
    for (uint32_t h = 0; h < 65536; h++) {
        float x = dr_bf16_to_f32((uint16_t)h);
        if (isnan(x)) continue;
        int want = e2m1_encode_def(x);
        if (dr_e2m1_from_f64(x) != want) fail_msg("e2m1(%a) = %d, want %d", (double)x, dr_e2m1_from_f64(x), want);
    }
}

static void test_bf16_all_codes(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float v = dr_bf16_to_f32((uint16_t)h);
        uint16_t back = dr_f32_to_bf16(v);
        if (isnan(v)) {
            assert_true(isnan(dr_bf16_to_f32(back)));
            assert_int_equal(back, h | 0x40);
        } else {
            assert_int_equal(back, h);
        }
        /* midpoint to the next value rounds to the even one */
        if (!isnan(v) && !isinf(v) && (h & 0x7FFF) < 0x7F7F) {
            uint32_t u = (uint32_t)h << 16;
            float mid = dr_f32_from_bits(u | 0x8000u);
            uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            assert_int_equal(dr_f32_to_bf16(mid), want);
            assert_int_equal(dr_f32_to_bf16(dr_f32_from_bits(u | 0x8001u)), (uint16_t)(h + 1));
            assert_int_equal(dr_f32_to_bf16(dr_f32_from_bits(u | 0x7FFFu)), h);
        }
    }
    assert_int_equal(dr_f32_to_bf16(3.4e38f), 0x7F80); /* beyond BF16 range: infinity */
}

static void test_f16_all_codes(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double d = f16_def((int)h);
        float v = dr_f16_to_f32((uint16_t)h);
        if (isnan(d)) {
            assert_true(isnan(v));
            assert_true(isnan(dr_f16_to_f32(dr_f32_to_f16(v))));
            continue;
        }
        assert_true((double)v == d);
        assert_int_equal(dr_f32_to_f16(v), h);
        int e = (h >> 10) & 31;
        if (e < 30 || (e == 30 && (h & 1023) < 1023)) {
            double next = f16_def((int)h + 1);
            if ((h & 0x8000) == 0) {
                double mid = (d + next) / 2; /* exact in fp32 */
                uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
                assert_int_equal(dr_f32_to_f16((float)mid), want);
                assert_int_equal(dr_f32_to_f16(nextafterf((float)mid, 0)), h);
                assert_int_equal(dr_f32_to_f16(nextafterf((float)mid, INFINITY)), h + 1);
            }
        }
    }
    assert_int_equal(dr_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(dr_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(dr_f32_to_f16(65520.0f), 0x7C00);
    assert_int_equal(dr_f32_to_f16(-1e30f), 0xFC00);
}

/* ---- golden: ref/quant-units.safetensors ---- */

static void test_golden_tables(void **state) {
    (void)state;
    const char *path = tu_golden("ref/quant-units.safetensors");
    int64_t n = 0;
    float *e4 = tu_load_f32(path, "e4m3.all_codes_value", &n);
    assert_int_equal(n, 256);
    int64_t mism = 0;
    for (int c = 0; c < 256; c++) {
        float v = dr_e4m3_to_f32((uint8_t)c);
        if (isnan(e4[c]) != isnan(v)) mism++;
        else if (!isnan(v) && dr_f32_bits(v) != dr_f32_bits(e4[c])) mism++;
    }
    printf("e4m3 table: %lld of 256 codes differ from golden\n", (long long)mism);
    assert_int_equal(mism, 0);
    free(e4);
    float *e2 = tu_load_f32(path, "e2m1.all_codes_value", &n);
    assert_int_equal(n, 16);
    for (int c = 0; c < 16; c++) assert_int_equal(dr_f32_bits(dr_e2m1_to_f32((uint8_t)c)), dr_f32_bits(e2[c]));
    free(e2);
}

static void test_golden_probes(void **state) {
    (void)state;
    drama_error err = {0};
    dr_st_file *f = NULL;
    assert_int_equal(dr_st_open(tu_golden("ref/quant-units.safetensors"), &f, &err), DRAMA_OK);
    const dr_tensor *probe = dr_st_find(f, "probe.f32");
    const dr_tensor *e4 = dr_st_find(f, "probe.to_e4m3_satfinite_rne");
    const dr_tensor *e2 = dr_st_find(f, "probe.to_e2m1_rne");
    const dr_tensor *bf = dr_st_find(f, "probe.to_bf16_rne");
    assert_non_null(probe);
    assert_non_null(e4);
    assert_non_null(e2);
    assert_non_null(bf);
    int64_t n = dr_tensor_numel(probe);
    assert_true(n > 0);
    assert_int_equal(dr_tensor_numel(e4), n);
    assert_int_equal(dr_tensor_numel(e2), n);
    assert_int_equal(dr_tensor_numel(bf), n);
    int bad4 = 0, bad2 = 0, badb = 0;
    for (int64_t i = 0; i < n; i++) {
        float p;
        memcpy(&p, probe->data + 4 * i, 4);
        if (dr_f32_to_e4m3(p) != e4->data[i]) {
            bad4++;
            printf("  e4m3 probe %lld: %a -> 0x%02x, golden 0x%02x\n", (long long)i, (double)p, dr_f32_to_e4m3(p),
                   e4->data[i]);
        }
        float p10 = p / 10.0f; /* computed in fp32, as the golden states */
        if (dr_e2m1_from_f64(p10) != e2->data[i]) {
            bad2++;
            printf("  e2m1 probe %lld: %a -> %d, golden %d\n", (long long)i, (double)p10, dr_e2m1_from_f64(p10),
                   e2->data[i]);
        }
        float pb = p * 1.0001f;
        uint16_t g;
        memcpy(&g, bf->data + 2 * i, 2);
        uint16_t mine = dr_f32_to_bf16(pb);
        if (mine != g && !(isnan(pb) && isnan(dr_bf16_to_f32(g)))) {
            badb++;
            printf("  bf16 probe %lld: %a -> 0x%04x, golden 0x%04x\n", (long long)i, (double)pb, mine, g);
        }
    }
    printf("probes: %lld values; mismatches e4m3=%d e2m1=%d bf16=%d\n", (long long)n, bad4, bad2, badb);
    assert_int_equal(bad4, 0);
    assert_int_equal(bad2, 0);
    assert_int_equal(badb, 0);
    dr_st_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_all_codes),  cmocka_unit_test(test_e4m3_encode_exhaustive),
        cmocka_unit_test(test_e2m1_all_codes),  cmocka_unit_test(test_bf16_all_codes),
        cmocka_unit_test(test_f16_all_codes),   cmocka_unit_test(test_golden_tables),
        cmocka_unit_test(test_golden_probes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
