/* Golden test of the torch-zip reader: tiny-drama3/codec.pth loads through the restricted
 * unpickler with its 382 entries, every view lies inside the archive and holds finite floats. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "io/torchzip.h"
#include "testutil.h"

static void test_golden_codec_pth(void **state) {
    (void)state;
    drama_error e = {0};
    dr_pth *p = NULL;
    drama_status rc = dr_pth_open(tu_golden("tiny-drama3/codec.pth"), &p, &e);
    if (rc) fprintf(stderr, "%s\n", e.message);
    assert_int_equal(rc, DRAMA_OK);
    printf("codec.pth: %lld entries, prefix '%s'\n", (long long)dr_pth_count(p), dr_pth_prefix(p));
    assert_int_equal(dr_pth_count(p), 382);
    int64_t params = 0, nonfinite = 0;
    for (int64_t i = 0; i < dr_pth_count(p); i++) {
        const dr_tensor *t = dr_pth_at(p, i);
        assert_int_equal(t->dtype, DR_DT_F32);
        assert_int_equal((int64_t)t->nbytes, dr_tensor_numel(t) * 4);
        assert_ptr_equal(dr_pth_find(p, t->name), t);
        for (int64_t k = 0; k < dr_tensor_numel(t); k++) {
            float v;
            memcpy(&v, t->data + 4 * k, 4);
            if (!isfinite(v)) nonfinite++;
        }
        params += dr_tensor_numel(t);
    }
    printf("codec.pth: %lld parameters\n", (long long)params);
    assert_int_equal(params, 640686);
    assert_int_equal(nonfinite, 0);
    const dr_tensor *t = dr_pth_find(p, "quantizer.semantic_quantizer.quantizers.0.codebook.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 4096);
    assert_int_equal(t->shape[1], 8);
    t = dr_pth_find(p, "decoder.model.1.block.1.conv.parametrizations.weight.original0");
    assert_non_null(t);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[1], 1);
    assert_null(dr_pth_find(p, "no.such.tensor"));
    dr_pth_close(p);
}

/* A protocol-4 pickle (FRAME, MEMOIZE, STACK_GLOBAL, SHORT_BINUNICODE), a {"state_dict": ...}
 * wrapper with other keys, _rebuild_parameter, a BF16 storage viewed with transposed strides and
 * an unusual directory name (tests/fuzz/seeds/fuzz_unpickle/proto4.pth, written by Python's own
 * pickler with stand-in torch globals). */
static void test_protocol4_wrapper(void **state) {
    (void)state;
    const char *src = getenv("DRAMA_SRC");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fuzz/seeds/fuzz_unpickle/proto4.pth", src ? src : ".");
    drama_error e = {0};
    dr_pth *p = NULL;
    if (dr_pth_open(path, &p, &e)) fail_msg("%s", e.message);
    assert_string_equal(dr_pth_prefix(p), "weird_name-9");
    assert_int_equal(dr_pth_count(p), 3);
    const dr_tensor *w = dr_pth_find(p, "generator.a.weight"), *b = dr_pth_find(p, "generator.a.bias"),
                    *t = dr_pth_find(p, "generator.b.t");
    assert_non_null(w), assert_non_null(b), assert_non_null(t);
    float fw[6], fb[2];
    memcpy(fw, w->data, sizeof fw);
    memcpy(fb, b->data, sizeof fb);
    assert_true(fw[0] == 1 && fw[5] == 6 && w->shape[0] == 2 && w->shape[1] == 3);
    assert_true(fb[0] == 5 && fb[1] == 6);
    assert_int_equal(t->dtype, DR_DT_BF16);
    assert_int_equal(t->nbytes, 8);
    uint16_t h[4];
    memcpy(h, t->data, sizeof h);
    float want[4] = {1.5f, -3.0f, 2.5f, 0.25f};
    for (int i = 0; i < 4; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        assert_true(f == want[i]);
    }
    dr_pth_close(p);
}

static void test_missing_file(void **state) {
    (void)state;
    drama_error e = {0};
    dr_pth *p = NULL;
    assert_int_equal(dr_pth_open("/nonexistent/codec.pth", &p, &e), DRAMA_EIO);
    assert_null(p);
    assert_non_null(strstr(e.message, "/nonexistent/codec.pth"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_codec_pth),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_protocol4_wrapper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
