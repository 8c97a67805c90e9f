/* dr_weight_bind on bad and unusual inputs: every failure is an error naming the tensor, never a
 * crash (also run under valgrind: the name contains "_bad"). Plus fused 3-D slices and row views. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "num/formats.h"
#include "num/quant.h"
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

/* Fused 3-D quantised tensors (held-out layouts: FP8 blocks over a ragged row count, NVFP4 with a
 * per-expert global scale, MLX affine 4/8 bit at groups 32 and 128): slice e dequantises exactly as
 * expert e encoded and bound on its own. */
static void check_fused_equals_alone(const dr_tensor *w3, const dr_tensor *s3, const dr_tensor *s23,
                                     const dr_tensor *b3, const dr_tensor *w2, const dr_tensor *s2,
                                     const dr_tensor *s22, const dr_tensor *b2, int64_t ex, int64_t cols) {
    drama_error e = {0};
    dr_weight f, a;
    if (dr_weight_bind_ex(w3, s3, s23, b3, ex, 0, 0, cols, &f, &e) != DRAMA_OK) fail_msg("fused: %s", e.message);
    if (dr_weight_bind_ex(w2, s2, s22, b2, -1, 0, 0, cols, &a, &e) != DRAMA_OK) fail_msg("alone: %s", e.message);
    assert_int_equal(f.fmt, a.fmt);
    assert_int_equal(f.rows, a.rows);
    assert_int_equal(f.cols, cols);
    float *rf = malloc((size_t)cols * sizeof *rf), *ra = malloc((size_t)cols * sizeof *ra);
    for (int64_t r = 0; r < f.rows; r++) {
        dr_weight_dequant_row(&f, r, rf);
        dr_weight_dequant_row(&a, r, ra);
        assert_memory_equal(rf, ra, (size_t)cols * sizeof *rf);
    }
    free(rf), free(ra);
}

static void test_fused_quantised(void **state) {
    (void)state;
    enum { E = 3, R = 160, C = 256 };
    float *src = malloc((size_t)E * R * C * sizeof *src);
    for (int64_t i = 0; i < (int64_t)E * R * C; i++) src[i] = (float)sin(0.37 * (double)i) * (1.0f + (float)(i % 7));
    drama_error e = {0};
    /* block FP8: 160 rows = one full and one partial 128-row block */
    uint8_t *codes = malloc((size_t)E * R * C);
    float *sc = malloc((size_t)E * 2 * 2 * sizeof *sc);
    for (int ex = 0; ex < E; ex++)
        assert_int_equal(dr_quant_fp8_block(src + (size_t)ex * R * C, R, C, 128, 128, codes + (size_t)ex * R * C,
                                            sc + ex * 4, &e), DRAMA_OK);
    dr_tensor w3 = T("f.experts.down_proj", DR_DT_F8_E4M3, 3, E, R, C, codes);
    dr_tensor s3 = T("f.experts.down_proj_scale_inv", DR_DT_F32, 3, E, 2, 2, (const uint8_t *)sc);
    for (int ex = 0; ex < E; ex++) {
        dr_tensor w2 = T("f.w", DR_DT_F8_E4M3, 2, R, C, 0, codes + (size_t)ex * R * C);
        dr_tensor s2 = T("f.w_scale_inv", DR_DT_F32, 2, 2, 2, 0, (const uint8_t *)(sc + ex * 4));
        check_fused_equals_alone(&w3, &s3, NULL, NULL, &w2, &s2, NULL, NULL, ex, C);
    }
    /* NVFP4, global scale per expert ([E]) */
    uint8_t *packed = malloc((size_t)E * R * C / 2), *nsc = malloc((size_t)E * R * C / 16);
    float gs[E];
    for (int ex = 0; ex < E; ex++) {
        const float *x = src + (size_t)ex * R * C;
        gs[ex] = dr_quant_nvfp4_global_scale(dr_quant_amax(x, (int64_t)R * C));
        assert_int_equal(dr_quant_nvfp4(x, R, C, gs[ex], packed + (size_t)ex * R * C / 2,
                                        nsc + (size_t)ex * R * C / 16, &e), DRAMA_OK);
    }
    dr_tensor p3 = T("n.experts.down_proj", DR_DT_U8, 3, E, R, C / 2, packed);
    dr_tensor ns3 = T("n.experts.down_proj_scale", DR_DT_F8_E4M3, 3, E, R, C / 16, nsc);
    dr_tensor g3 = T("n.experts.down_proj_scale_2", DR_DT_F32, 1, E, 0, 0, (const uint8_t *)gs);
    for (int ex = 0; ex < E; ex++) {
        dr_tensor p2 = T("n.w", DR_DT_U8, 2, R, C / 2, 0, packed + (size_t)ex * R * C / 2);
        dr_tensor ns2 = T("n.w_scale", DR_DT_F8_E4M3, 2, R, C / 16, 0, nsc + (size_t)ex * R * C / 16);
        dr_tensor g2 = T("n.w_scale_2", DR_DT_F32, 0, 0, 0, 0, (const uint8_t *)(gs + ex));
        check_fused_equals_alone(&p3, &ns3, &g3, NULL, &p2, &ns2, &g2, NULL, ex, C);
    }
    /* MLX affine: 4 and 8 bits at groups 32 and 128 (scales/biases BF16) */
    const int cfgs[][2] = {{4, 32}, {4, 128}, {8, 32}, {8, 128}};
    for (int ci = 0; ci < 4; ci++) {
        int bits = cfgs[ci][0], g = cfgs[ci][1];
        int64_t wc = C * bits / 32, gc = C / g;
        uint8_t *words = malloc((size_t)E * R * wc * 4), *as = malloc((size_t)E * R * gc * 2);
        uint8_t *ab = malloc((size_t)E * R * gc * 2);
        for (int ex = 0; ex < E; ex++)
            assert_int_equal(dr_quant_affine(src + (size_t)ex * R * C, R, C, bits, g, DR_DT_BF16,
                                             words + (size_t)ex * R * wc * 4, as + (size_t)ex * R * gc * 2,
                                             ab + (size_t)ex * R * gc * 2, &e), DRAMA_OK);
        dr_tensor q3 = T("q.experts.down_proj", DR_DT_U32, 3, E, R, wc, words);
        dr_tensor qs3 = T("q.experts.down_proj.scales", DR_DT_BF16, 3, E, R, gc, as);
        dr_tensor qb3 = T("q.experts.down_proj.biases", DR_DT_BF16, 3, E, R, gc, ab);
        for (int ex = 0; ex < E; ex++) {
            dr_tensor q2 = T("q.w", DR_DT_U32, 2, R, wc, 0, words + (size_t)ex * R * wc * 4);
            dr_tensor qs2 = T("q.w.scales", DR_DT_BF16, 2, R, gc, 0, as + (size_t)ex * R * gc * 2);
            dr_tensor qb2 = T("q.w.biases", DR_DT_BF16, 2, R, gc, 0, ab + (size_t)ex * R * gc * 2);
            check_fused_equals_alone(&q3, &qs3, NULL, &qb3, &q2, &qs2, NULL, &qb2, ex, C);
        }
        dr_weight f;
        assert_int_equal(dr_weight_bind_ex(&q3, &qs3, NULL, &qb3, 1, 0, 0, C, &f, &e), DRAMA_OK);
        assert_int_equal(f.bits, bits);
        assert_int_equal(f.group, g);
        free(words), free(as), free(ab);
    }
    printf("ok: fused FP8 block, NVFP4, affine 4/8 bit at groups 32/128 slice == alone\n");
    free(src), free(codes), free(sc), free(packed), free(nsc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_errors),
        cmocka_unit_test(test_fused_slices_and_rows),
        cmocka_unit_test(test_fused_quantised),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
