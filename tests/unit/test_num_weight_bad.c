/* dr_weight_bind on bad and unusual inputs: every failure is an error naming the tensor, never a
 * crash (also run under valgrind: the name contains "_bad"). Plus fused 3-D slices and row views. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "num/formats.h"
#include "num/weight.h"

static uint8_t buf[4096];
static uint8_t sbuf[1024];
static uint8_t bbuf[1024];

static dr_tensor T(const char *name, dr_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, const uint8_t *data) {
    dr_tensor t = {.name = name, .dtype = dt, .ndim = ndim, .shape = {d0, d1, d2}, .data = data};
    uint64_t n = 1; /* unsigned: the "huge" case wraps here and sets nbytes itself */
    for (int i = 0; i < ndim; i++) n *= (uint64_t)t.shape[i];
    t.nbytes = (size_t)n * dr_dtype_size(dt);
    return t;
}

static void expect_fail(drama_status st, drama_error *e, drama_status code, const char *needle) {
    if (st == DRAMA_OK) fail_msg("expected failure mentioning '%s'", needle);
    assert_int_equal(st, code);
    if (!strstr(e->message, needle)) fail_msg("message '%s' lacks '%s'", e->message, needle);
    printf("ok: %s\n", e->message);
    dr_error_clear(e);
}

static void test_bind_errors(void **state) {
    (void)state;
    drama_error e = {0};
    dr_weight w;
    dr_tensor fp8 = T("m.w", DR_DT_F8_E4M3, 2, 200, 136, 0, buf);
    dr_tensor sc_ok = T("m.w_scale_inv", DR_DT_F32, 2, 2, 2, 0, sbuf);
    dr_tensor sc_bad = T("m.w_scale_inv", DR_DT_F32, 2, 2, 3, 0, sbuf);
    /* FP8 codes are not read at bind: the small buffer behind the 200x136 view is never touched */
    expect_fail(dr_weight_bind(&fp8, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "missing");
    expect_fail(dr_weight_bind(&fp8, &sc_bad, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "m.w_scale_inv");
    assert_int_equal(dr_weight_bind(&fp8, &sc_ok, NULL, NULL, -1, 0, 0, &w, &e), DRAMA_OK);
    assert_int_equal(w.fmt, DR_WF_FP8_BLOCK);
    /* block size from config changes the expected scale shape */
    expect_fail(dr_weight_bind(&fp8, &sc_ok, NULL, NULL, -1, 64, 64, &w, &e), &e, DRAMA_ESHAPE, "64x64");
    dr_tensor sc_u8 = T("m.w_scale_inv", DR_DT_U8, 2, 2, 2, 0, sbuf);
    expect_fail(dr_weight_bind(&fp8, &sc_u8, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "U8");

    /* truncated data */
    dr_tensor shortw = T("short.w", DR_DT_BF16, 2, 4, 8, 0, buf);
    shortw.nbytes = 10;
    expect_fail(dr_weight_bind(&shortw, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "short.w");
    /* dense with a stray companion */
    dr_tensor bf = T("d.w", DR_DT_BF16, 2, 4, 8, 0, buf);
    expect_fail(dr_weight_bind(&bf, &sc_ok, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "unexpected");
    /* rank */
    dr_tensor r1 = T("r.w", DR_DT_BF16, 1, 8, 0, 0, buf);
    expect_fail(dr_weight_bind(&r1, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "rank");
    dr_tensor i32 = T("i.w", DR_DT_I32, 2, 4, 8, 0, buf);
    expect_fail(dr_weight_bind(&i32, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_EUNSUPPORTED, "I32");
    dr_tensor neg = T("n.w", DR_DT_BF16, 2, 4, -8, 0, buf);
    expect_fail(dr_weight_bind(&neg, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "n.w");
    dr_tensor huge = T("h.w", DR_DT_BF16, 2, INT64_MAX / 2, 8, 0, buf);
    huge.nbytes = 64;
    expect_fail(dr_weight_bind(&huge, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "h.w");

    /* NVFP4: NaN block scale, width not /16, missing weight_scale_2 */
    memset(sbuf, 0x38, sizeof sbuf);
    float one = 1.0f;
    memcpy(bbuf, &one, 4);
    dr_tensor nv = T("q.weight", DR_DT_U8, 2, 4, 32, 0, buf);
    dr_tensor nvs = T("q.weight_scale", DR_DT_F8_E4M3, 2, 4, 4, 0, sbuf);
    dr_tensor nv2 = T("q.weight_scale_2", DR_DT_F32, 0, 0, 0, 0, bbuf);
    assert_int_equal(dr_weight_bind(&nv, &nvs, &nv2, NULL, -1, 0, 0, &w, &e), DRAMA_OK);
    assert_int_equal(w.fmt, DR_WF_NVFP4);
    assert_int_equal(w.cols, 64);
    expect_fail(dr_weight_bind(&nv, &nvs, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "weight_scale_2");
    sbuf[6] = 0xFF; /* UE4M3 NaN at [1, 2] */
    expect_fail(dr_weight_bind(&nv, &nvs, &nv2, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ENUMERIC, "[1, 2]");
    sbuf[6] = 0x38;
    dr_tensor nv_odd = T("q.weight", DR_DT_U8, 2, 4, 12, 0, buf);
    expect_fail(dr_weight_bind(&nv_odd, &nvs, &nv2, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "multiple of 16");
    float inf = INFINITY;
    memcpy(bbuf, &inf, 4);
    expect_fail(dr_weight_bind(&nv, &nvs, &nv2, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ENUMERIC, "not finite");

    /* affine: unsupported group, mismatched bias dtype, and bits/group from in_cols */
    dr_tensor aw = T("a.weight", DR_DT_U32, 2, 4, 16, 0, buf); /* 4-bit: in 128 */
    dr_tensor as = T("a.scales", DR_DT_BF16, 2, 4, 2, 0, sbuf), ab = T("a.biases", DR_DT_BF16, 2, 4, 2, 0, bbuf);
    assert_int_equal(dr_weight_bind(&aw, &as, NULL, &ab, -1, 0, 0, &w, &e), DRAMA_OK);
    assert_int_equal(w.bits, 4);
    assert_int_equal(w.group, 64);
    assert_int_equal(dr_weight_bind_ex(&aw, &as, NULL, &ab, -1, 0, 0, 64, &w, &e), DRAMA_OK);
    assert_int_equal(w.bits, 8);
    assert_int_equal(w.group, 32);
    expect_fail(dr_weight_bind_ex(&aw, &as, NULL, &ab, -1, 0, 0, 256, &w, &e), &e, DRAMA_EUNSUPPORTED, "bits=2");
    /* a width whose quotient by the group count truncates must not pass (in 129, 2 groups) */
    expect_fail(dr_weight_bind_ex(&aw, &as, NULL, &ab, -1, 0, 0, 129, &w, &e), &e, DRAMA_EUNSUPPORTED, "a.weight");
    dr_tensor as5 = T("a.scales", DR_DT_BF16, 2, 4, 5, 0, sbuf), ab5 = T("a.biases", DR_DT_BF16, 2, 4, 5, 0, bbuf);
    expect_fail(dr_weight_bind(&aw, &as5, NULL, &ab5, -1, 0, 0, &w, &e), &e, DRAMA_EUNSUPPORTED, "a.weight");
    dr_tensor abf = T("a.biases", DR_DT_F16, 2, 4, 2, 0, bbuf);
    expect_fail(dr_weight_bind(&aw, &as, NULL, &abf, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "a.biases");
    expect_fail(dr_weight_bind(&aw, &as, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "biases");

    /* slices */
    expect_fail(dr_weight_bind(&bf, NULL, NULL, NULL, 0, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "slice");
    dr_tensor f3 = T("e.gate_up_proj", DR_DT_BF16, 3, 4, 6, 8, buf);
    expect_fail(dr_weight_bind(&f3, NULL, NULL, NULL, 4, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "out of range");
    expect_fail(dr_weight_bind(&f3, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_ESHAPE, "rank 3");
    expect_fail(dr_weight_bind(NULL, NULL, NULL, NULL, -1, 0, 0, &w, &e), &e, DRAMA_EINVAL, "NULL");
}

/* Fused [E, 2I, H] slice + row views equal the per-expert dequantisation. */
static void test_fused_slices_and_rows(void **state) {
    (void)state;
    int64_t E = 3, R = 8, C = 16;
    uint16_t vals[3 * 8 * 16];
    for (int i = 0; i < 3 * 8 * 16; i++) vals[i] = dr_f32_to_bf16((float)i * 0.25f - 7.0f);
    dr_tensor t = T("m.experts.gate_up_proj", DR_DT_BF16, 3, E, R, C, (const uint8_t *)vals);
    drama_error e = {0};
    for (int64_t ex = 0; ex < E; ex++) {
        dr_weight w, gate, up;
        assert_int_equal(dr_weight_bind(&t, NULL, NULL, NULL, ex, 0, 0, &w, &e), DRAMA_OK);
        assert_int_equal(w.rows, R);
        assert_int_equal(w.cols, C);
        assert_int_equal(dr_weight_rows(&w, 0, R / 2, &gate, &e), DRAMA_OK);
        assert_int_equal(dr_weight_rows(&w, R / 2, R, &up, &e), DRAMA_OK);
        float row[16];
        for (int64_t r = 0; r < R; r++) {
            dr_weight_dequant_row(r < R / 2 ? &gate : &up, r < R / 2 ? r : r - R / 2, row);
            for (int64_t c = 0; c < C; c++)
                assert_true(row[c] == dr_bf16_to_f32(vals[(ex * R + r) * C + c]));
        }
    }
    dr_weight w, v;
    assert_int_equal(dr_weight_bind(&t, NULL, NULL, NULL, 0, 0, 0, &w, &e), DRAMA_OK);
    assert_int_not_equal(dr_weight_rows(&w, 3, 9, &v, &e), DRAMA_OK);
    printf("ok: %s\n", e.message);

    /* fused FP8 with a [E] per-tensor scale and a [E, 1, 1] block scale */
    uint8_t codes[2 * 4 * 8];
    for (int i = 0; i < 64; i++) codes[i] = (uint8_t)(0x30 + i % 8);
    float s2[2] = {0.5f, 2.0f};
    dr_tensor f8 = T("x.experts.down_proj", DR_DT_F8_E4M3, 3, 2, 4, 8, codes);
    dr_tensor st = T("x.experts.down_proj_scale", DR_DT_F32, 1, 2, 0, 0, (const uint8_t *)s2);
    dr_tensor sb = T("x.experts.down_proj_scale_inv", DR_DT_F32, 3, 2, 1, 1, (const uint8_t *)s2);
    dr_error_clear(&e);
    for (int ex = 0; ex < 2; ex++) {
        dr_weight a, b;
        assert_int_equal(dr_weight_bind(&f8, &st, NULL, NULL, ex, 0, 0, &a, &e), DRAMA_OK);
        assert_int_equal(a.fmt, DR_WF_FP8_TENSOR);
        assert_int_equal(dr_weight_bind(&f8, &sb, NULL, NULL, ex, 0, 0, &b, &e), DRAMA_OK);
        assert_int_equal(b.fmt, DR_WF_FP8_BLOCK);
        float ra[8], rb[8];
        for (int r = 0; r < 4; r++) {
            dr_weight_dequant_row(&a, r, ra);
            dr_weight_dequant_row(&b, r, rb);
            for (int c = 0; c < 8; c++) {
                float want = dr_e4m3_to_f32(codes[ex * 32 + r * 8 + c]) * s2[ex];
                assert_true(ra[c] == want && rb[c] == want);
            }
        }
    }
    /* [E, 1] is accepted as a per-expert scalar too */
    dr_tensor st21 = T("x.experts.down_proj_scale", DR_DT_F32, 2, 2, 1, 0, (const uint8_t *)s2);
    dr_weight a1;
    assert_int_equal(dr_weight_bind(&f8, &st21, NULL, NULL, 1, 0, 0, &a1, &e), DRAMA_OK);
    assert_int_equal(a1.fmt, DR_WF_FP8_TENSOR);
    assert_true(a1.global_scale == 2.0f);
    dr_tensor stbad = T("x.experts.down_proj_scale", DR_DT_F32, 1, 3, 0, 0, (const uint8_t *)s2);
    stbad.nbytes = 8;
    dr_weight a;
    assert_int_not_equal(dr_weight_bind(&f8, &stbad, NULL, NULL, 0, 0, 0, &a, &e), DRAMA_OK);
    printf("ok: %s\n", e.message);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_errors),
        cmocka_unit_test(test_fused_slices_and_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
