/* test_io_manifest.c - SHA-256 (known answers, golden MANIFEST.sha256), the digest cache, and
 * drama-manifest.json parse / verify / write. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/sha256.h"
#include "io/manifest.h"
#include "testutil.h"

static void test_known_answers(void **state) {
    (void)state;
    char hex[65];
    dr_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    dr_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* a file larger than the 1 MiB read block, against the in-memory digest */
    const char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/big.bin", dir);
    size_t n = (3u << 20) + 12345;
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    tu_write_file(path, buf, n);
    char want[65];
    dr_sha256_hex(buf, n, want);
    uint64_t size = 0;
    dr_progress prog;
    dr_progress_begin(&prog, "test", n, 0);
    assert_int_equal(dr_sha256_file(path, hex, &size, &prog, NULL), DRAMA_OK);
    assert_string_equal(hex, want);
    assert_int_equal(size, n);
    free(buf);
    drama_error err = {0};
    snprintf(path, sizeof path, "%s/absent", dir);
    assert_int_equal(dr_sha256_file(path, hex, NULL, NULL, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "absent"));
    assert_true(dr_sha256_is_hex(want));
    assert_false(dr_sha256_is_hex("E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"));
    assert_int_equal(tu_rm_rf(dir), 0);
}

/* Builds a drama-manifest.json for golden folder `sub` from the golden MANIFEST.sha256. */
static char *manifest_from_golden(const char *sub, int *nfiles) {
    char *list = tu_read_file(tu_golden("MANIFEST.sha256"), NULL);
    size_t cap = 1 << 16, used = 0;
    char *out = malloc(cap);
    used += (size_t)snprintf(out, cap, "{\"format\": \"drama-manifest\", \"version\": 1, \"files\": [");
    *nfiles = 0;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "./%s/", sub);
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        char hex[65], name[1024];
        if (sscanf(line, "%64s %1023s", hex, name) != 2 || strncmp(name, prefix, strlen(prefix))) continue;
        const char *rel = name + strlen(prefix);
        char full[4096];
        struct stat sb;
        snprintf(full, sizeof full, "%s/%s", tu_golden(sub), rel);
        assert_int_equal(stat(full, &sb), 0);
        used += (size_t)snprintf(out + used, cap - used, "%s{\"path\": \"%s\", \"size\": %lld, \"sha256\": \"%s\"}",
                                 *nfiles ? ", " : "", rel, (long long)sb.st_size, hex);
        assert_true(used < cap);
        (*nfiles)++;
    }
    snprintf(out + used, cap - used, "]}");
    free(list);
    return out;
}

typedef struct counts {
    int ok, missing, size, sha, cached;
} counts;

static void count_finding(const dr_manifest_finding *f, void *user) {
    counts *c = user;
    if (!strcmp(f->kind, "ok")) c->ok++;
    else if (!strcmp(f->kind, "missing")) c->missing++;
    else if (!strcmp(f->kind, "size")) c->size++;
    else if (!strcmp(f->kind, "sha256")) c->sha++;
    c->cached += f->from_cache;
}

/* The golden tiny model verifies against digests computed by sha256sum (MANIFEST.sha256). */
static void test_golden_digests(void **state) {
    (void)state;
    int n = 0;
    char *text = manifest_from_golden("tiny-drama3", &n);
    assert_true(n >= 5);
    dr_manifest *m = NULL;
    drama_error err = {0};
    if (dr_manifest_parse(text, strlen(text), "golden", &m, &err) != DRAMA_OK) fail_msg("%s", err.message);
    assert_int_equal(m->count, n);
    assert_non_null(dr_manifest_find(m, "config.json"));
    counts c = {0};
    if (dr_manifest_verify(m, tu_golden("tiny-drama3"), NULL, count_finding, &c, &err) != DRAMA_OK)
        fail_msg("%s", err.message);
    printf("tiny-drama3: %d files match MANIFEST.sha256\n", c.ok);
    assert_int_equal(c.ok, n);
    dr_manifest_free(m);
    free(text);
}

static void test_cache(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[4096], cache[4096];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    snprintf(cache, sizeof cache, "%s/sub/cache.json", dir); /* folder created on demand */
    tu_write_file(path, "hello", 5);
    char hex[65], want[65];
    dr_sha256_hex("hello", 5, want);
    int from = -1;
    assert_int_equal(dr_sha256_file_cached(path, cache, hex, &from, NULL, NULL), DRAMA_OK);
    assert_string_equal(hex, want);
    assert_int_equal(from, 0);
    assert_int_equal(dr_sha256_file_cached(path, cache, hex, &from, NULL, NULL), DRAMA_OK);
    assert_string_equal(hex, want);
    assert_int_equal(from, 1);
    /* same size, new content and mtime: the entry no longer matches */
    tu_write_file(path, "HELLO", 5);
    struct timespec ts[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_sec = 1000000000, .tv_nsec = 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
    assert_int_equal(dr_sha256_file_cached(path, cache, hex, &from, NULL, NULL), DRAMA_OK);
    dr_sha256_hex("HELLO", 5, want);
    assert_string_equal(hex, want);
    assert_int_equal(from, 0);
    /* a corrupt cache is ignored and rewritten */
    tu_write_file(cache, "{not json", 9);
    assert_int_equal(dr_sha256_file_cached(path, cache, hex, &from, NULL, NULL), DRAMA_OK);
    assert_string_equal(hex, want);
    assert_int_equal(from, 0);
    assert_int_equal(dr_sha256_file_cached(path, cache, hex, &from, NULL, NULL), DRAMA_OK);
    assert_int_equal(from, 1);
    /* no cache path: plain hashing */
    assert_int_equal(dr_sha256_file_cached(path, NULL, hex, &from, NULL, NULL), DRAMA_OK);
    assert_int_equal(from, 0);
    assert_int_equal(tu_rm_rf(dir), 0);
}

/* write -> parse -> verify round trip, including a file in a subfolder and the cache. */
static void test_write_verify(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char p[4096];
    snprintf(p, sizeof p, "%s/b.txt", dir);
    tu_write_file(p, "bbb", 3);
    snprintf(p, sizeof p, "%s/a.bin", dir);
    tu_write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/sub/c", dir);
    tu_write_file(p, "c", 1);
    const char *files[] = {"b.txt", "sub/c", "a.bin"};
    char mpath[4096], cache[4096];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, DR_MANIFEST_NAME);
    snprintf(cache, sizeof cache, "%s/cache.json", dir);
    drama_error err = {0};
    assert_int_equal(dr_manifest_write(dir, files, 3, mpath, &err), DRAMA_OK);
    dr_manifest *m = NULL;
    assert_int_equal(dr_manifest_load(mpath, &m, &err), DRAMA_OK);
    assert_int_equal(m->count, 3);
    assert_string_equal(m->files[0].path, "a.bin"); /* sorted */
    assert_int_equal(m->files[2].size, 1);
    counts c = {0};
    assert_int_equal(dr_manifest_verify(m, dir, cache, count_finding, &c, &err), DRAMA_OK);
    assert_int_equal(c.ok, 3);
    assert_int_equal(c.cached, 0);
    c = (counts){0};
    assert_int_equal(dr_manifest_verify(m, dir, cache, count_finding, &c, &err), DRAMA_OK);
    assert_int_equal(c.cached, 3);
    dr_manifest_free(m);
    const char *dup[] = {"x", "x"};
    assert_int_equal(dr_manifest_write(dir, dup, 2, mpath, &err), DRAMA_EINVAL);
    assert_int_equal(tu_rm_rf(dir), 0);
}

static void test_path_rules(void **state) {
    (void)state;
    const char *good[] = {"config.json", "a/b/c.bin", "..hidden", "x..y"};
    const char *bad[] = {"", "/etc/passwd", "a/../b", "..", "a\\b", "a//b", "./a", "a/", "a/."};
    const char *why = NULL;
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) assert_true(dr_manifest_path_ok(good[i], &why));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_false(dr_manifest_path_ok(bad[i], &why));
        assert_non_null(why);
    }
}

/* The bar (forced on, as on a terminal) goes to stderr only: label, fraction and sizes, one line
 * finished by a newline; disabled, it writes nothing. Redraw timing never changes the last line. */
static void test_progress_bar(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, STDERR_FILENO);
    close(fd);
    dr_progress p;
    dr_progress_begin(&p, "verifying", 4000000, 1);
    dr_progress_label(&p, "model-00001.safetensors");
    dr_progress_add(&p, 1000000);
    dr_progress_add(&p, 3000000);
    dr_progress_end(&p);
    dr_progress_add(&p, 5); /* after end: a no-op */
    dr_progress off;
    dr_progress_begin(&off, "quiet", 10, 0);
    dr_progress_add(&off, 10);
    dr_progress_end(&off);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    printf("progress output (%zu bytes): %s", n, strrchr(text, '\r') ? strrchr(text, '\r') + 1 : text);
    const char *last = strrchr(text, '\r');
    assert_non_null(last);
    assert_non_null(strstr(last, "model-00001.safetensors"));
    assert_non_null(strstr(last, "100.0%"));
    assert_non_null(strstr(last, "4.0/4.0 MB"));
    assert_true(n > 0 && text[n - 1] == '\n');
    assert_null(strstr(text, "quiet"));
    free(text);
    assert_int_equal(tu_rm_rf(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers), cmocka_unit_test(test_golden_digests), cmocka_unit_test(test_cache),
        cmocka_unit_test(test_write_verify),  cmocka_unit_test(test_path_rules), cmocka_unit_test(test_progress_bar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
