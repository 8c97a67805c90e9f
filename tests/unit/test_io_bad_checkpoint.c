/* test_io_bad_checkpoint.c - broken sharded checkpoints (FORMATS.md section 2): missing shards, shard
 * name path tricks, index/header disagreements, malformed indexes. Each gives a clear error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/checkpoint.h"
#include "testutil.h"

static void write_shard(const char *dir, const char *file, const char *const *names, int n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    dr_st_writer *w = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    int64_t shape[1] = {1};
    for (int i = 0; i < n; i++) assert_int_equal(dr_st_writer_declare(w, names[i], DR_DT_F32, 1, shape, &err), DRAMA_OK);
    float v = 1;
    for (int i = 0; i < n; i++) assert_int_equal(dr_st_writer_write(w, &v, 4, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_finish(w, &err), DRAMA_OK);
}

static void write_index(const char *dir, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    tu_write_file(path, text, strlen(text));
}

/* Opening dir must fail with code and every needle in the message. */
static void expect_fail(const char *dir, drama_status code, const char *const *needles, int n) {
    dr_ckpt *c = (dr_ckpt *)1;
    drama_error err = {0};
    drama_status st = dr_ckpt_open(dir, &c, &err);
    printf("-> %s: %s\n", drama_status_name(st), err.message);
    assert_null(c);
    assert_int_equal(st, code);
    for (int i = 0; i < n; i++)
        if (!strstr(err.message, needles[i])) fail_msg("message '%s' lacks '%s'", err.message, needles[i]);
}

static const char *k_s1[] = {"a", "b"};
static const char *k_s2[] = {"c"};

static void test_missing_shard(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    write_shard(dir, "s1.safetensors", k_s1, 2);
    write_index(dir, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    const char *n[] = {"shard 's2.safetensors'", "missing"};
    expect_fail(dir, DRAMA_EIO, n, 2);
    /* a dangling symlink is missing too; a valid one is followed */
    char link[4096];
    snprintf(link, sizeof link, "%s/s2.safetensors", dir);
    assert_int_equal(symlink("/nonexistent/x.safetensors", link), 0);
    expect_fail(dir, DRAMA_EIO, n, 2);
    unlink(link);
    const char *other = tu_tmpdir();
    write_shard(other, "real.safetensors", k_s2, 1);
    char target[4096];
    snprintf(target, sizeof target, "%s/real.safetensors", other);
    assert_int_equal(symlink(target, link), 0);
    dr_ckpt *c = NULL;
    drama_error err = {0};
    assert_int_equal(dr_ckpt_open(dir, &c, &err), DRAMA_OK);
    assert_string_equal(dr_ckpt_shard_of(c, "c"), "s2.safetensors");
    dr_ckpt_close(c);
    assert_int_equal(tu_rm_rf(dir), 0);
    assert_int_equal(tu_rm_rf(other), 0);
}

static void test_shard_name_tricks(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    write_shard(dir, "s1.safetensors", k_s1, 2);
    struct {
        const char *index, *needle;
    } cases[] = {
        {"{\"weight_map\": {\"a\": \"../s1.safetensors\"}}", "contains '/'"},
        {"{\"weight_map\": {\"a\": \"/etc/s1.safetensors\"}}", "contains '/'"},
        {"{\"weight_map\": {\"a\": \"sub\\\\s1.safetensors\"}}", "contains '\\'"},
        {"{\"weight_map\": {\"a\": \"..\"}}", "does not end in .safetensors"},
        {"{\"weight_map\": {\"a\": \".\"}}", "does not end in .safetensors"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\\u0000.safetensors\"}}", "invalid JSON"},
        {"{\"weight_map\": {\"a\": \"s1.bin\"}}", "does not end in .safetensors"},
        {"{\"weight_map\": {\"a\": 3}}", "weight_map['a'] is not a string"},
        {"{\"weight_map\": {}}", "'weight_map' is empty"},
        {"{\"weight_map\": []}", "'weight_map' is not a JSON object"},
        {"{\"metadata\": {}}", "missing 'weight_map'"},
        {"{\"metadata\": 5, \"weight_map\": {\"a\": \"s1.safetensors\"}}", "'metadata' is not a JSON object"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"a\": \"s1.safetensors\"}}", "duplicate"},
        {"[1]", "top level is not a JSON object"},
        {"{\"weight_map\": ", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_index(dir, cases[i].index);
        const char *n[] = {cases[i].needle, "model.safetensors.index.json"};
        expect_fail(dir, DRAMA_EFORMAT, n, 2);
        /* the memory parser (fuzzed) says the same */
        dr_ckpt_index *ix = (dr_ckpt_index *)1;
        drama_error err = {0};
        assert_int_equal(dr_ckpt_parse_index(cases[i].index, strlen(cases[i].index), "mem", &ix, &err), DRAMA_EFORMAT);
        assert_null(ix);
        assert_non_null(strstr(err.message, cases[i].needle));
    }
    assert_int_equal(tu_rm_rf(dir), 0);
}

static void test_disagreements(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    write_shard(dir, "s1.safetensors", k_s1, 2);
    write_shard(dir, "s2.safetensors", k_s2, 1);
    /* 'b' is in s1 but not in the map; 'x' is mapped to s2, which lacks it */
    write_index(dir, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\", \"x\": \"s2.safetensors\"}}");
    const char *n1[] = {"disagree (2 problems)", "tensor 'b' in shard 's1.safetensors' is not in weight_map",
                        "tensor 'x' but that shard does not contain it"};
    expect_fail(dir, DRAMA_EFORMAT, n1, 3);
    /* 'c' mapped to the wrong shard: both directions are reported */
    write_index(dir, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s1.safetensors\", "
                     "\"z\": \"s2.safetensors\"}}");
    const char *n2[] = {"tensor 'c' is in shard 's2.safetensors' but weight_map names 's1.safetensors'",
                        "weight_map names shard 's1.safetensors' for tensor 'c'"};
    expect_fail(dir, DRAMA_EFORMAT, n2, 2);
    /* a name in two shards */
    const char *dup[] = {"a"};
    write_shard(dir, "s3.safetensors", dup, 1);
    write_index(dir, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\", "
                     "\"q\": \"s3.safetensors\"}}");
    const char *n3[] = {"tensor 'a' is in two shards", "tensor 'a' is in shard 's3.safetensors' but weight_map names"};
    expect_fail(dir, DRAMA_EFORMAT, n3, 2);
    /* a broken shard names the shard file */
    char path[4096];
    snprintf(path, sizeof path, "%s/s2.safetensors", dir);
    tu_write_file(path, "\x02\0\0\0\0\0\0\0{}x", 11);
    write_index(dir, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    const char *n4[] = {"s2.safetensors", "trailing"};
    expect_fail(dir, DRAMA_EFORMAT, n4, 2);
    /* many problems: the message stays bounded and counts them */
    char big[16384] = "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"";
    for (int i = 0; i < 40; i++) {
        char item[64];
        snprintf(item, sizeof item, ", \"missing_tensor_%03d\": \"s1.safetensors\"", i);
        strcat(big, item);
    }
    strcat(big, "}}");
    write_index(dir, big);
    const char *n5[] = {"40 problems", "missing_tensor_000", " ..."};
    expect_fail(dir, DRAMA_EFORMAT, n5, 3);
    assert_int_equal(tu_rm_rf(dir), 0);
}

static void test_no_model(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    const char *n1[] = {"no model.safetensors or model.safetensors.index.json"};
    expect_fail(dir, DRAMA_EIO, n1, 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/not-a-dir", dir);
    tu_write_file(path, "x", 1);
    const char *n2[] = {"not a directory"};
    expect_fail(path, DRAMA_EIO, n2, 1);
    snprintf(path, sizeof path, "%s/absent", dir);
    const char *n3[] = {"absent", "cannot open model directory"};
    expect_fail(path, DRAMA_EIO, n3, 2);
    /* a single model.safetensors that is broken */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_file(path, "\x01\0\0\0", 4);
    const char *n4[] = {"model.safetensors", "shorter"};
    expect_fail(dir, DRAMA_EFORMAT, n4, 2);
    assert_int_equal(tu_rm_rf(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_shard),
        cmocka_unit_test(test_shard_name_tricks),
        cmocka_unit_test(test_disagreements),
        cmocka_unit_test(test_no_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
