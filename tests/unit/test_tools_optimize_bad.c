/* test_tools_optimize_bad.c - `drama optimize` refuses bad requests with a message naming the
 * problem, and a failed run leaves neither DST nor DST.partial (also when it fails half way through
 * writing). Runs under valgrind (name contains _bad). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tools/optimize.h"
#include "testutil.h"

static int exists(const char *p) {
    struct stat s;
    return stat(p, &s) == 0;
}

/* Run with the given options into tmp/out; expect `code` and `needle` in the message, and no
 * output directory (nor its .partial) afterwards. */
static void expect_fail(const char *src_rel, dr_opt_format f, const char *prune_json, int bits, int group,
                        drama_status code, const char *needle) {
    char tmp[4096], dst[4200], partial[4300], prune[4200];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(dst, sizeof dst, "%s/out", tmp);
    snprintf(partial, sizeof partial, "%s.partial", dst);
    dr_opt_options o;
    memset(&o, 0, sizeof o);
    o.src = tu_model_dir(src_rel);
    o.dst = dst;
    o.experts = f;
    o.affine_bits = bits;
    o.affine_group = group;
    o.quiet = 1;
    o.threads = 2;
    if (prune_json) {
        snprintf(prune, sizeof prune, "%s/prune.json", tmp);
        tu_write_file(prune, prune_json, strlen(prune_json));
        o.prune_file = prune;
    }
    drama_error e = {0};
    drama_status st = dr_optimize(&o, NULL, &e);
    printf("%-60s -> %d: %s\n", needle, (int)st, e.message);
    assert_int_equal(st, code);
    assert_non_null(strstr(e.message, needle));
    assert_false(exists(dst));
    assert_false(exists(partial));
    assert_int_equal(tu_rm_rf(tmp), 0);
}

static void test_prune_files(void **s) {
    (void)s;
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"99\": [0, 1, 2, 3]}", 0, 0, DRAMA_EINVAL, "layer \"99\"");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"x\": [0, 1, 2, 3]}", 0, 0, DRAMA_EINVAL, "no such MoE layer");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"0\": [0, 1, 2, 16]}", 0, 0, DRAMA_EINVAL, "layer 0, entry 3");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"0\": [0, 1, 2, -1]}", 0, 0, DRAMA_EINVAL, "not an expert id");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"2\": [0, 1, 1, 3]}", 0, 0, DRAMA_EINVAL, "expert 1 listed twice");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"1\": [0, 5]}", 0, 0, DRAMA_EINVAL, "fewer than num_experts_per_tok");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"1\": 7}", 0, 0, DRAMA_EFORMAT, "expected an array");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "[1, 2]", 0, 0, DRAMA_EFORMAT, "expected an object");
    expect_fail("tiny-drama3", DR_OPT_KEEP, "{\"0\": [0, 1,", 0, 0, DRAMA_EFORMAT, "prune.json");
    /* variants/pruned does not store expert 3 of layer 0 */
    expect_fail("variants/pruned", DR_OPT_FP8, "{\"0\": [0, 1, 2, 3]}", 0, 0, DRAMA_EINVAL,
                "expert 3 is not stored in the source");
}

static void test_formats(void **s) {
    (void)s;
    /* quantising an already quantised source: fails inside the shard writer, after DST.partial exists */
    expect_fail("variants/fp8-block", DR_OPT_AFFINE, NULL, 0, 0, DRAMA_EUNSUPPORTED, "already quantised");
    expect_fail("variants/nvfp4", DR_OPT_FP8, NULL, 0, 0, DRAMA_EUNSUPPORTED, "already quantised");
    expect_fail("variants/mlx-affine4", DR_OPT_NVFP4, NULL, 0, 0, DRAMA_EUNSUPPORTED, "already quantised");
    /* group wider than the experts' 64 inputs */
    expect_fail("tiny-drama3", DR_OPT_AFFINE, NULL, 4, 128, DRAMA_EUNSUPPORTED, "multiple of the group size");
    expect_fail("tiny-drama3", DR_OPT_AFFINE, NULL, 5, 64, DRAMA_EINVAL, "--q4-bits 5");
    expect_fail("tiny-drama3", DR_OPT_AFFINE, NULL, 4, 48, DRAMA_EINVAL, "--q4-group 48");
    expect_fail("tiny-drama3", (dr_opt_format)42, NULL, 0, 0, DRAMA_EINVAL, "--experts");
    dr_opt_format f;
    assert_int_equal(dr_opt_format_parse("q3", &f), 0);
    assert_int_equal(dr_opt_format_parse("nvfp4", &f), 1);
    assert_int_equal(f, DR_OPT_NVFP4);
}

static void test_destinations(void **s) {
    (void)s;
    char tmp[4096], dst[4200], keepf[4300], partial[4300];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(dst, sizeof dst, "%s/out", tmp);
    snprintf(partial, sizeof partial, "%s.partial", dst);
    snprintf(keepf, sizeof keepf, "%s/precious.txt", dst);
    dr_opt_options o;
    memset(&o, 0, sizeof o);
    o.src = tu_model_dir("tiny-drama3");
    o.dst = dst;
    o.experts = DR_OPT_FP8;
    o.quiet = 1;
    o.threads = 1;
    drama_error e = {0};
    /* a non-empty DST is never overwritten */
    assert_int_equal(mkdir(dst, 0777), 0);
    tu_write_file(keepf, "x", 1);
    assert_int_equal(dr_optimize(&o, NULL, &e), DRAMA_EINVAL);
    printf("non-empty DST: %s\n", e.message);
    assert_non_null(strstr(e.message, "not an empty directory"));
    assert_true(exists(keepf));
    assert_false(exists(partial));
    /* an empty DST is taken; a stale DST.partial of a killed run is replaced */
    assert_int_equal(unlink(keepf), 0);
    assert_int_equal(mkdir(partial, 0777), 0);
    char stale[4400];
    snprintf(stale, sizeof stale, "%s/stale.safetensors", partial);
    tu_write_file(stale, "junk", 4);
    memset(&e, 0, sizeof e);
    dr_opt_report rep;
    assert_int_equal(dr_optimize(&o, &rep, &e), DRAMA_OK);
    assert_false(exists(partial));
    assert_int_equal(rep.experts_written, 128);
    char p[4400];
    snprintf(p, sizeof p, "%s/stale.safetensors", dst);
    assert_false(exists(p));
    /* missing source, and the prune K checks */
    char missing[4200], dst2[4200];
    snprintf(missing, sizeof missing, "%s/no-such-model", tmp);
    snprintf(dst2, sizeof dst2, "%s/m", tmp);
    o.src = missing;
    o.dst = dst2;
    memset(&e, 0, sizeof e);
    assert_int_not_equal(dr_optimize(&o, NULL, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "no-such-model"));
    o.src = tu_model_dir("tiny-drama3");
    snprintf(dst2, sizeof dst2, "%s/k", tmp);
    o.prune_k = 2;
    memset(&e, 0, sizeof e);
    assert_int_equal(dr_optimize(&o, NULL, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--calibration"));
    o.calibration = "rows.json";
    o.prune_k = 99;
    memset(&e, 0, sizeof e);
    assert_int_equal(dr_optimize(&o, NULL, &e), DRAMA_EINVAL);
    printf("prune 99: %s\n", e.message);
    assert_non_null(strstr(e.message, "--prune 99"));
    assert_false(exists(dst2));
    assert_int_equal(tu_rm_rf(tmp), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prune_files),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_destinations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
