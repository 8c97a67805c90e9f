/* test_io_bad_manifest.c - manifests that must be refused (FORMATS.md section 7 rule 1) and
 * verification failures: hash mismatch, size mismatch, missing file, each named with details. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/sha256.h"
#include "io/manifest.h"
#include "testutil.h"

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void expect_parse_fail(const char *text, drama_status code, const char *needle) {
    dr_manifest *m = (dr_manifest *)1;
    drama_error err = {0};
    drama_status st = dr_manifest_parse(text, strlen(text), "m.json", &m, &err);
    printf("-> %s: %s\n", drama_status_name(st), err.message);
    assert_null(m);
    assert_int_equal(st, code);
    if (!strstr(err.message, needle)) fail_msg("message '%s' lacks '%s'", err.message, needle);
    assert_non_null(strstr(err.message, "m.json"));
}

static void test_bad_manifests(void **state) {
    (void)state;
    const char *head = "{\"format\": \"drama-manifest\", \"version\": 1, \"files\": [";
    struct {
        const char *files;
        const char *needle;
    } cases[] = {
        {"{\"path\": \"../x\", \"size\": 1, \"sha256\": \"" H64 "\"}", "has a '..' component"},
        {"{\"path\": \"a/../../x\", \"size\": 1, \"sha256\": \"" H64 "\"}", "has a '..' component"},
        {"{\"path\": \"/etc/passwd\", \"size\": 1, \"sha256\": \"" H64 "\"}", "absolute"},
        {"{\"path\": \"a\\\\b\", \"size\": 1, \"sha256\": \"" H64 "\"}", "backslash"},
        {"{\"path\": \"\", \"size\": 1, \"sha256\": \"" H64 "\"}", "is empty"},
        {"{\"path\": \"a\", \"size\": 1, \"sha256\": \"" H64 "\"}, {\"path\": \"a\", \"size\": 1, \"sha256\": \"" H64 "\"}",
         "listed twice"},
        {"{\"path\": \"a\", \"size\": -1, \"sha256\": \"" H64 "\"}", "'size' is not a non-negative integer"},
        {"{\"path\": \"a\", \"size\": 1, \"sha256\": \"ABC\"}", "'sha256' is not 64 lowercase hex digits"},
        {"{\"path\": \"a\", \"size\": 1}", "'sha256' is not 64"},
        {"{\"size\": 1, \"sha256\": \"" H64 "\"}", "'path' is missing"},
        {"7", "'path' is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[2048];
        snprintf(text, sizeof text, "%s%s]}", head, cases[i].files);
        expect_parse_fail(text, DRAMA_EFORMAT, cases[i].needle);
    }
    expect_parse_fail("{\"format\": \"other\", \"version\": 1, \"files\": []}", DRAMA_EFORMAT, "'format'");
    expect_parse_fail("{\"format\": \"drama-manifest\", \"version\": 2, \"files\": []}", DRAMA_EUNSUPPORTED,
                      "version 2");
    expect_parse_fail("{\"format\": \"drama-manifest\", \"files\": []}", DRAMA_EFORMAT, "'version'");
    expect_parse_fail("{\"format\": \"drama-manifest\", \"version\": 1}", DRAMA_EFORMAT, "'files'");
    expect_parse_fail("{\"format\": \"drama-manifest\", \"format\": \"drama-manifest\"}", DRAMA_EFORMAT, "duplicate");
    expect_parse_fail("[", DRAMA_EFORMAT, "invalid JSON");
    dr_manifest *m = NULL;
    drama_error err = {0};
    assert_int_equal(dr_manifest_load("/nonexistent/drama-manifest.json", &m, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "/nonexistent/drama-manifest.json"));
}

typedef struct seen {
    int ok, missing, size, sha;
} seen;

static void on_finding(const dr_manifest_finding *f, void *user) {
    seen *s = user;
    if (!strcmp(f->kind, "ok")) s->ok++;
    if (!strcmp(f->kind, "missing")) s->missing++;
    if (!strcmp(f->kind, "size")) s->size++;
    if (!strcmp(f->kind, "sha256")) s->sha++;
}

/* Every kind of mismatch in one run: all reported, the first named in the error. */
static void test_mismatches(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char p[4096], mpath[4096];
    const char *names[] = {"a.bin", "b.bin", "c.bin", "d.bin"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        tu_write_file(p, names[i], 5);
    }
    snprintf(mpath, sizeof mpath, "%s/drama-manifest.json", dir);
    drama_error err = {0};
    assert_int_equal(dr_manifest_write(dir, names, 4, mpath, &err), DRAMA_OK);
    dr_manifest *m = NULL;
    assert_int_equal(dr_manifest_load(mpath, &m, &err), DRAMA_OK);
    char good_b[65];
    memcpy(good_b, dr_manifest_find(m, "b.bin")->sha256, 65);
    /* a.bin: same size, other bytes; c.bin: other size; d.bin: gone */
    snprintf(p, sizeof p, "%s/a.bin", dir);
    tu_write_file(p, "A.bin", 5);
    snprintf(p, sizeof p, "%s/c.bin", dir);
    tu_write_file(p, "c.bin++", 7);
    snprintf(p, sizeof p, "%s/d.bin", dir);
    assert_int_equal(unlink(p), 0);
    seen s = {0};
    drama_status st = dr_manifest_verify(m, dir, NULL, on_finding, &s, &err);
    printf("-> %s: %s\n", drama_status_name(st), err.message);
    assert_int_equal(st, DRAMA_EHASH);
    assert_int_equal(s.ok, 1);
    assert_int_equal(s.sha, 1);
    assert_int_equal(s.size, 1);
    assert_int_equal(s.missing, 1);
    assert_non_null(strstr(err.message, "3 of 4 files failed"));
    /* only a hash mismatch: expected and actual digest named */
    snprintf(p, sizeof p, "%s/c.bin", dir);
    tu_write_file(p, "c.bin", 5);
    snprintf(p, sizeof p, "%s/d.bin", dir);
    tu_write_file(p, "d.bin", 5);
    err = (drama_error){0};
    s = (seen){0};
    assert_int_equal(dr_manifest_verify(m, dir, NULL, on_finding, &s, &err), DRAMA_EHASH);
    printf("-> %s\n", err.message);
    char actual[65];
    dr_sha256_hex("A.bin", 5, actual);
    assert_non_null(strstr(err.message, "a.bin: SHA-256 mismatch"));
    assert_non_null(strstr(err.message, dr_manifest_find(m, "a.bin")->sha256));
    assert_non_null(strstr(err.message, actual));
    assert_int_equal(s.ok, 3);
    assert_string_equal(dr_manifest_find(m, "b.bin")->sha256, good_b);
    dr_manifest_free(m);
    /* the loader entry point refuses the folder; without a manifest it passes with none */
    setenv("DRAMA_CACHE_DIR", dir, 1);
    err = (drama_error){0};
    m = (dr_manifest *)1;
    assert_int_equal(dr_manifest_verify_dir(dir, 0, &m, &err), DRAMA_EHASH);
    assert_null(m);
    assert_non_null(strstr(err.message, "a.bin: SHA-256 mismatch"));
    snprintf(p, sizeof p, "%s/a.bin", dir);
    tu_write_file(p, "a.bin", 5);
    err = (drama_error){0};
    assert_int_equal(dr_manifest_verify_dir(dir, 0, &m, &err), DRAMA_OK);
    assert_non_null(m);
    assert_null(dr_manifest_find(m, "verified-sha256.json"));
    dr_manifest_free(m);
    assert_int_equal(unlink(mpath), 0);
    assert_int_equal(dr_manifest_verify_dir(dir, 1, &m, &err), DRAMA_OK);
    assert_null(m);
    assert_int_equal(tu_rm_rf(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_manifests),
        cmocka_unit_test(test_mismatches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
