/* test_base_testutil.c - the shared float comparison of tests/common/testutil: a NaN or Inf on
 * either side fails (the reference's was once skipped), unless stated as expected; the verdicts
 * and the worst index. Every test's tolerance check rests on these. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "testutil.h"

static void test_nonfinite_either_side(void **s) {
    (void)s;
    float ref[4] = {1, 2, 3, 4}, a[4] = {1, 2, 3, 4};
    assert_true(tu_report("equal", tu_compare_f32(a, ref, 4), 0));
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        a[2] = bad[k];
        tu_cmp c = tu_compare_f32(a, ref, 4);
        assert_int_equal(c.nonfinite, 1);
        assert_int_equal(c.first_nonfinite, 2);
        assert_false(tu_report("non-finite value", c, 1e30));
        assert_false(tu_report_differs("non-finite value, must differ", c, 0));
        a[2] = 3, ref[2] = bad[k];
        c = tu_compare_f32(a, ref, 4);
        assert_int_equal(c.nonfinite, 1);
        assert_false(tu_report("non-finite reference", c, 1e30));
        assert_false(tu_report_rel("non-finite reference (rel)", c, 1e30));
        a[2] = bad[k]; /* the same NaN/Inf on both sides fails too unless stated */
        assert_false(tu_report("same non-finite, not stated", tu_compare_f32(a, ref, 4), 1e30));
        tu_cmp_opts o = {.nonfinite_same = 1};
        c = tu_compare_f32_opts(a, ref, 4, &o);
        assert_int_equal(c.nonfinite_same, 1);
        assert_true(tu_report("same non-finite, stated", c, 0));
        a[2] = k ? -bad[k] : 0; /* stated: a different Inf, or a finite value, still fails */
        assert_false(tu_report("stated, other value", tu_compare_f32_opts(a, ref, 4, &o), 1e30));
        a[2] = 3, ref[2] = 3;
    }
    double ad[2] = {1, NAN}, rd[2] = {1, 1};
    assert_false(tu_report("f64 NaN", tu_compare_f64(ad, rd, 2), 1e30));
    assert_false(tu_report("f32 vs f64 NaN reference", tu_compare_f32_f64(a, (double[]){1, NAN, 3, 4}, 4), 1e30));
}

static void test_verdicts(void **s) {
    (void)s;
    float ref[4] = {1, -2, 4, 0}, a[4] = {1.5f, -2, 4, 0};
    tu_cmp c = tu_compare_f32(a, ref, 4);
    assert_int_equal(c.worst, 0);
    assert_true(c.max_abs == 0.5 && c.max_ref == 4 && c.max_rel == 0.125 && c.max_elem_rel == 0.5);
    assert_true(tu_report("abs within", c, 0.5));
    assert_false(tu_report("abs past", c, 0.4));
    assert_true(tu_report_rel("rel within", c, 0.125));
    assert_false(tu_report_elem_rel("elem rel past", c, 0.4));
    assert_true(tu_report_differs("differs", c, 0.4));
    assert_false(tu_report_differs("does not differ enough", c, 0.5));
    double tol[4] = {0.5, 0, 0, 0};
    tu_cmp_opts o = {.tol = tol};
    assert_true(tu_report_tol("per-element tol", tu_compare_f32_opts(a, ref, 4, &o)));
    tol[0] = 0.25;
    c = tu_compare_f32_opts(a, ref, 4, &o);
    assert_int_equal(c.worst_tol, 0);
    assert_false(tu_report_tol("per-element tol past", c));
    tol[0] = NAN; /* a NaN tolerance never passes */
    assert_false(tu_report_tol("NaN tol", tu_compare_f32_opts(a, ref, 4, &o)));
    a[3] = 1e-30f; /* against a zero reference any error is relatively infinite */
    assert_true(isinf(tu_compare_f32(a, ref, 4).max_elem_rel));
}

static void test_affine_bound(void **s) {
    (void)s;
    float w[4] = {-1, 0, 0.5f, 1};
    double b = tu_affine_bound(w, 4, 8, 0x1p-8);
    /* 1.5 steps of 2/255 (widened by 1/256) + 2^-8 (1 + 255 step): about 0.0118 + 0.0118 */
    assert_true(b > 1.5 * 2 / 255.0 && b < 0.03);
    w[1] = NAN;
    assert_true(isnan(tu_affine_bound(w, 4, 8, 0x1p-8)));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nonfinite_either_side), cmocka_unit_test(test_verdicts),
                                       cmocka_unit_test(test_affine_bound)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
