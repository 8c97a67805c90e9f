/* base/file: dr_read_file, the one whole-file reader (limits, errors, stdin, text placeholders). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "base/file.h"
#include "testutil.h"

static const char *path_in(const char *dir, const char *name) {
    static char p[4][1024];
    static int slot;
    slot = (slot + 1) % 4;
    snprintf(p[slot], sizeof p[slot], "%s/%s", dir, name);
    return p[slot];
}

static void test_empty_file(void **state) {
    (void)state;
    const char *p = path_in(tu_tmpdir(), "empty.json");
    tu_write_file(p, "", 0);
    char *buf = NULL;
    size_t len = 99;
    drama_error err = {0};
    assert_int_equal(dr_read_file(p, 100, &buf, &len, &err), DRAMA_OK);
    assert_non_null(buf);
    assert_int_equal(len, 0);
    assert_int_equal(buf[0], '\0');
    free(buf);
    /* an empty file is within even a zero limit */
    assert_int_equal(dr_read_file(p, 0, &buf, &len, &err), DRAMA_OK);
    free(buf);
}

static void test_exact_cap_and_one_over(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char data[101];
    for (int i = 0; i < 101; i++) data[i] = (char)(i % 7 == 3 ? 0 : 'a' + i % 26); /* NULs are kept */
    const char *p = path_in(dir, "exact.bin");
    tu_write_file(p, data, 100);
    char *buf = NULL;
    size_t len = 0;
    drama_error err = {0};
    assert_int_equal(dr_read_file(p, 100, &buf, &len, &err), DRAMA_OK);
    assert_int_equal(len, 100);
    assert_memory_equal(buf, data, 100);
    assert_int_equal(buf[100], '\0');
    free(buf);

    const char *q = path_in(dir, "over.bin");
    tu_write_file(q, data, 101);
    buf = (char *)q; /* must come back NULL */
    len = 7;
    assert_int_equal(dr_read_file(q, 100, &buf, &len, &err), DRAMA_EFORMAT);
    assert_null(buf);
    assert_int_equal(len, 0);
    char want[1200];
    snprintf(want, sizeof want, "%s: too large (101 bytes, limit 100)", q);
    assert_string_equal(err.message, want);
}

static void test_missing_and_directory(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    const char *p = path_in(dir, "absent.json");
    char *buf = NULL;
    size_t len = 0;
    drama_error err = {0};
    assert_int_equal(dr_read_file(p, 1 << 20, &buf, &len, &err), DRAMA_EIO);
    assert_null(buf);
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot read: No such file or directory", p);
    assert_string_equal(err.message, want);

    drama_error err2 = {0};
    assert_int_equal(dr_read_file(dir, 1 << 20, &buf, &len, &err2), DRAMA_EIO);
    assert_null(buf);
    snprintf(want, sizeof want, "%s: cannot read: Is a directory", dir);
    assert_string_equal(err2.message, want);

    drama_error err3 = {0};
    assert_int_equal(dr_read_file("", 10, &buf, &len, &err3), DRAMA_EINVAL);
    assert_non_null(strstr(err3.message, "empty file name"));
}

static void test_follows_text_placeholder(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    mkdir(path_in(dir, "real"), 0755);
    mkdir(path_in(dir, "variant"), 0755);
    tu_write_file(path_in(dir, "real/config.json"), "{\"a\": 1}", 8);
    const char *link = "../real/config.json\n";
    tu_write_file(path_in(dir, "variant/config.json"), link, strlen(link));
    char *buf = NULL;
    size_t len = 0;
    drama_error err = {0};
    assert_int_equal(dr_read_file(path_in(dir, "variant/config.json"), 100, &buf, &len, &err), DRAMA_OK);
    assert_string_equal(buf, "{\"a\": 1}");
    free(buf);
    /* the limit applies to the target, and the message names the path the caller gave */
    assert_int_equal(dr_read_file(path_in(dir, "variant/config.json"), 7, &buf, &len, &err), DRAMA_EFORMAT);
    assert_non_null(strstr(err.message, "variant/config.json: too large (8 bytes, limit 7)"));
}

/* stdin from a pipe fed by a child: the size is unknown, so the buffer grows past its first 64 KiB. */
/* dr_read_json_file: optional files may be absent; present ones must read and parse. */
static void test_json_file(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    json_t *root = (json_t *)1;
    drama_error err = {0};
    assert_int_equal(dr_read_json_file(path_in(dir, "absent.json"), 100, 1, &root, &err), DRAMA_OK);
    assert_null(root);
    assert_int_equal(dr_read_json_file(path_in(dir, "absent.json"), 100, 0, &root, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "absent.json: cannot read"));
    const char *good = path_in(dir, "good.json");
    tu_write_file(good, "{\"a\": [1, 2]}", 13);
    assert_int_equal(dr_read_json_file(good, 100, 1, &root, &err), DRAMA_OK);
    assert_int_equal(json_array_size(json_object_get(root, "a")), 2);
    json_decref(root);
    err = (drama_error){0};
    assert_int_equal(dr_read_json_file(good, 12, 1, &root, &err), DRAMA_EFORMAT); /* the cap still applies */
    assert_non_null(strstr(err.message, "too large (13 bytes, limit 12)"));
    const char *bad = path_in(dir, "bad.json");
    tu_write_file(bad, "{\"a\": 1,\n \"a\": 2}", 18);
    err = (drama_error){0};
    assert_int_equal(dr_read_json_file(bad, 100, 1, &root, &err), DRAMA_EFORMAT); /* duplicate key */
    assert_null(root);
    assert_non_null(strstr(err.message, "bad.json: line 2"));
    tu_write_file(bad, "{\"a\": ", 6);
    err = (drama_error){0};
    assert_int_equal(dr_read_json_file(bad, 100, 1, &root, &err), DRAMA_EFORMAT); /* truncated */
    assert_non_null(strstr(err.message, "bad.json: line 1"));
}

static void feed_stdin(size_t n) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        char block[4096];
        for (size_t i = 0; i < sizeof block; i++) block[i] = (char)('0' + i % 10);
        for (size_t done = 0; done < n;) {
            size_t take = n - done < sizeof block ? n - done : sizeof block;
            ssize_t w = write(fds[1], block, take);
            if (w <= 0) _exit(1);
            done += (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    assert_int_equal(dup2(fds[0], 0), 0);
    close(fds[0]);
    clearerr(stdin);
}

static void reap(void) {
    int status = 0;
    while (wait(&status) > 0) {}
}

static void test_stdin_stream(void **state) {
    (void)state;
    size_t n = 300000;
    feed_stdin(n);
    char *buf = NULL;
    size_t len = 0;
    drama_error err = {0};
    assert_int_equal(dr_read_file("-", n, &buf, &len, &err), DRAMA_OK);
    reap();
    assert_int_equal(len, n);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (char)('0' + i % 4096 % 10)) fail_msg("byte %zu differs", i);
    assert_int_equal(buf[n], '\0');
    free(buf);

    feed_stdin(n);
    drama_error err2 = {0};
    assert_int_equal(dr_read_file("-", n - 1, &buf, &len, &err2), DRAMA_EFORMAT);
    assert_null(buf);
    assert_string_equal(err2.message, "stdin: too large (over 299999 bytes, limit 299999)");
    close(0); /* the child may still be writing: a closed pipe ends it */
    reap();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_exact_cap_and_one_over),
        cmocka_unit_test(test_missing_and_directory),
        cmocka_unit_test(test_follows_text_placeholder),
        cmocka_unit_test(test_stdin_stream),
        cmocka_unit_test(test_json_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
