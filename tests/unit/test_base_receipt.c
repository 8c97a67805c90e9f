/* Unit tests of base/receipt: SHA-256 of files (known answer), the size+mtime cache (hit, and
 * invalidation on change), directory listing, receipt publication, peak-memory windows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/receipt.h"

static char g_dir[256];

static void put_file(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/drama-receipt-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char c[300];
    snprintf(c, sizeof c, "%s/cache", g_dir);
    setenv("DRAMA_CACHE_DIR", c, 1);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_sha256_known_answer_and_cache(void **state) {
    (void)state;
    mkdir(g_dir, 0755);
    char m[300];
    snprintf(m, sizeof m, "%s/model", g_dir);
    mkdir(m, 0755);
    put_file("model/abc.txt", "abc");
    char p[512];
    snprintf(p, sizeof p, "%s/model/abc.txt", g_dir);
    char hex[65];
    drama_error e = {0};
    assert_int_equal(dr_sha256_file_hex(p, hex, &e), DRAMA_OK);
    /* FIPS 180-2 test vector for "abc". */
    const char *want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_string_equal(hex, want);
    int cached = -1;
    assert_int_equal(dr_sha256_file_cached_hex(p, hex, &cached, &e), DRAMA_OK);
    assert_string_equal(hex, want);
    assert_int_equal(cached, 0);
    assert_int_equal(dr_sha256_file_cached_hex(p, hex, &cached, &e), DRAMA_OK);
    assert_int_equal(cached, 1);
    assert_string_equal(hex, want);
    /* A changed file (different size) is rehashed, never served from the cache. */
    put_file("model/abc.txt", "abcd");
    assert_int_equal(dr_sha256_file_cached_hex(p, hex, &cached, &e), DRAMA_OK);
    assert_int_equal(cached, 0);
    assert_string_equal(hex, "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
    /* Directory listing: sorted, regular files only. */
    put_file("model/a.json", "{}");
    json_t *files = NULL;
    assert_int_equal(dr_receipt_dir_files(m, &files, &e), DRAMA_OK);
    assert_int_equal(json_array_size(files), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(files, 0), "file")), "a.json");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(files, 1), "bytes")), 4);
    json_decref(files);
    /* Missing file and missing directory: errors naming them. */
    assert_int_equal(dr_sha256_file_hex("/nonexistent/zz", hex, &e), DRAMA_EIO);
    assert_non_null(strstr(e.message, "/nonexistent/zz"));
    dr_error_clear(&e);
    assert_int_equal(dr_receipt_dir_files("/nonexistent/dir", &files, &e), DRAMA_EIO);
    assert_null(files);
}

static void test_receipt_write(void **state) {
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/r.json", g_dir);
    json_t *j = json_pack("{s:s, s:i}", "finish_reason", "frames", "frames", 7);
    drama_error e = {0};
    assert_int_equal(dr_receipt_write(p, j, &e), DRAMA_OK);
    json_t *back = json_load_file(p, 0, NULL);
    assert_non_null(back);
    assert_true(json_equal(j, back));
    json_decref(back);
    snprintf(p, sizeof p, "/nonexistent-dir-q/r.json");
    assert_int_equal(dr_receipt_write(p, j, &e), DRAMA_EIO);
    assert_non_null(strstr(e.message, "/nonexistent-dir-q/r.json"));
    json_decref(j);
}

static void test_memory_windows(void **state) {
    (void)state;
    int64_t rss0 = dr_mem_rss_bytes();
    assert_true(rss0 > 0);
    enum { MB = 1 << 20 };
    size_t n = 64 * (size_t)MB;
    /* mmap, not malloc: munmap really returns the pages (also under ASan's quarantine). */
    char *big = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(big != MAP_FAILED);
    memset(big, 1, n);
    int64_t peak = dr_mem_peak_bytes();
    printf("rss before %lld, peak with 64 MiB touched %lld\n", (long long)rss0, (long long)peak);
    assert_true(peak >= rss0 + 60 * (int64_t)MB);
    munmap(big, n);
    if (dr_mem_peak_reset()) {
        /* After release and reset, the new window's peak is well below the old one. */
        int64_t p2 = dr_mem_peak_bytes();
        printf("peak after reset %lld\n", (long long)p2);
        assert_true(p2 < peak - 32 * (int64_t)MB);
    }
    double t0 = dr_clock_s(), t1 = dr_clock_s();
    assert_true(t1 >= t0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_known_answer_and_cache),
        cmocka_unit_test(test_receipt_write),
        cmocka_unit_test(test_memory_windows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
