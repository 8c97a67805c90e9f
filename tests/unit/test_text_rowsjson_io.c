/* test_text_rowsjson_io.c - ROWS.json and CODES.json readers/writers: round trips, golden
 * prompt rows, and rejection of malformed input with messages naming row/frame and column. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "testutil.h"

static void rows_round_trip(void **state) {
    (void)state;
    dr_rows rows;
    drama_error err = {0};
    assert_int_equal(dr_rows_create(&rows, 3, 4, &err), DRAMA_OK);
    for (int i = 0; i < 12; i++) rows.data[i] = i * 1000 + 7;
    rows.prefill = 2;
    char path[] = "/tmp/drama_rows_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(dr_rows_write(path, &rows, &err), DRAMA_OK);
    dr_rows back;
    assert_int_equal(dr_rows_read(path, 4, &back, &err), DRAMA_OK);
    assert_int_equal(back.n_rows, 3);
    assert_int_equal(back.n_cols, 4);
    assert_int_equal(back.prefill, 2);
    assert_memory_equal(back.data, rows.data, 12 * sizeof(int32_t));
    dr_rows_free(&back);
    dr_rows_free(&rows);
    remove(path);
}

static void rows_parse_defaults(void **state) {
    (void)state;
    dr_rows rows;
    drama_error err = {0};
    const char *j = "{\"rows\": [[5, 1, 2], [6, 3, 4]]}";
    assert_int_equal(dr_rows_parse(j, strlen(j), "t", 0, &rows, &err), DRAMA_OK);
    assert_int_equal(rows.n_cols, 3);
    assert_int_equal(rows.prefill, 2); /* absent prefill = all rows */
    assert_int_equal(rows.data[5], 4);
    dr_rows_free(&rows);
    const char *empty = "{\"rows\": [], \"prefill\": 0}";
    assert_int_equal(dr_rows_parse(empty, strlen(empty), "t", 11, &rows, &err), DRAMA_OK);
    assert_int_equal(rows.n_rows, 0);
    dr_rows_free(&rows);
}

static void expect_rows_error(const char *j, int64_t cols, const char *needle) {
    dr_rows rows;
    drama_error err = {0};
    drama_status st = dr_rows_parse(j, strlen(j), "bad.json", cols, &rows, &err);
    printf("  %-50s -> %s\n", j, err.message);
    assert_int_not_equal(st, DRAMA_OK);
    assert_null(rows.data);
    assert_non_null(strstr(err.message, needle));
}

static void rows_bad(void **state) {
    (void)state;
    expect_rows_error("{\"rows\": [[1, 2], [3]]}", 0, "rows[1]");
    expect_rows_error("{\"rows\": [[1, 2], [3, -1]]}", 0, "rows[1][1]");
    expect_rows_error("{\"rows\": [[1, 2], [3, 2.5]]}", 0, "rows[1][1]");
    expect_rows_error("{\"rows\": [[1, 2], [3, 4294967296]]}", 0, "rows[1][1]");
    expect_rows_error("{\"rows\": [[1, 2]], \"prefill\": 2}", 0, "prefill");
    expect_rows_error("{\"rows\": [[1, 2]], \"prefill\": -1}", 0, "prefill");
    expect_rows_error("{\"rows\": [[1, 2]]}", 11, "rows[0]");
    expect_rows_error("{\"rows\": [[]]}", 0, "rows[0]");
    expect_rows_error("{\"rows\": [[1]], \"rows\": []}", 0, "bad.json");
    expect_rows_error("{\"rows\": 3}", 0, "rows");
    expect_rows_error("[1, 2]", 0, "rows");
    expect_rows_error("{\"rows\": [[1, 2]", 0, "byte");
}

/* The golden prompt rows (stored under "prompt_rows" in the e2e JSON) parse as ROWS.json
 * once wrapped, and the row count matches. */
static void rows_golden(void **state) {
    (void)state;
    char *text;
    size_t len;
    drama_error err = {0};
    assert_int_equal(dr_read_file(tu_golden("ref/e2e-ref12.json"), DR_FILE_MAX_BYTES, &text, &len, &err), DRAMA_OK);
    const char *start = strstr(text, "\"prompt_rows\"");
    assert_non_null(start);
    start = strchr(start, '[');
    int depth = 0;
    const char *end = start;
    for (; *end; end++) {
        if (*end == '[') depth++;
        if (*end == ']' && --depth == 0) break;
    }
    size_t n = (size_t)(end - start) + 1;
    char *wrapped = malloc(n + 32);
    snprintf(wrapped, n + 32, "{\"rows\": %.*s}", (int)n, start);
    dr_rows rows;
    assert_int_equal(dr_rows_parse(wrapped, strlen(wrapped), "golden", 11, &rows, &err), DRAMA_OK);
    printf("  golden ref12 prompt rows: %lld x %lld\n", (long long)rows.n_rows, (long long)rows.n_cols);
    assert_int_equal(rows.n_rows, 85);
    dr_rows_free(&rows);
    free(wrapped);
    free(text);
}

static void codes_round_trip_and_bounds(void **state) {
    (void)state;
    int32_t upper[3] = {4096, 1024, 1024};
    dr_codes codes;
    drama_error err = {0};
    const char *j = "{\"codes\": [[4095, 0, 1023], [7, 8, 9]]}";
    assert_int_equal(dr_codes_parse(j, strlen(j), "c", 3, upper, &codes, &err), DRAMA_OK);
    assert_int_equal(codes.n_frames, 2);
    assert_int_equal(codes.data[0], 4095);
    assert_int_equal(codes.data[5], 9);
    char path[] = "/tmp/drama_codes_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(dr_codes_write(path, &codes, &err), DRAMA_OK);
    dr_codes back;
    assert_int_equal(dr_codes_read(path, 0, NULL, &back, &err), DRAMA_OK);
    assert_int_equal(back.n_codebooks, 3);
    assert_memory_equal(back.data, codes.data, 6 * sizeof(int32_t));
    dr_codes_free(&back);
    dr_codes_free(&codes);
    remove(path);

    const char *bad[][2] = {
        {"{\"codes\": [[4096, 0, 0]]}", "frame 0 codebook 0"},
        {"{\"codes\": [[1, 0, 0], [1, 1024, 0]]}", "frame 1 codebook 1"},
        {"{\"codes\": [[1, 0, 0], [1, 0]]}", "frame 1"},
        {"{\"codes\": [[1, 0, -3]]}", "frame 0 codebook 2"},
        {"{\"codes\": [[1, 0, \"2\"]]}", "frame 0 codebook 2"},
        {"{\"frames\": []}", "codes"},
        {"not json", "line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drama_error e = {0};
        assert_int_not_equal(dr_codes_parse(bad[i][0], strlen(bad[i][0]), "c.json", 3, upper, &codes, &e), DRAMA_OK);
        printf("  %-40s -> %s\n", bad[i][0], e.message);
        assert_non_null(strstr(e.message, bad[i][1]));
        assert_null(codes.data);
    }
}

/* Path tricks on output: a link planted at "<path>.tmp" is removed, never written through; an
 * empty name and a missing folder fail with the name and leave no file behind. */
static void write_path_tricks(void **state) {
    (void)state;
    char dir[1024], out[1100], tmp[1200], victim[1100];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(out, sizeof out, "%s/rows.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    tu_write_file(victim, "secret", 6);
    assert_int_equal(symlink(victim, tmp), 0);
    dr_rows rows;
    drama_error err = {0};
    assert_int_equal(dr_rows_create(&rows, 1, 3, &err), DRAMA_OK);
    rows.data[0] = 42;
    assert_int_equal(dr_rows_write(out, &rows, &err), DRAMA_OK);
    char *v = tu_read_file(victim, NULL);
    assert_string_equal(v, "secret");
    free(v);
    assert_int_not_equal(access(tmp, F_OK), 0);
    dr_rows back;
    assert_int_equal(dr_rows_read(out, 3, &back, &err), DRAMA_OK);
    assert_int_equal(back.data[0], 42);
    dr_rows_free(&back);
    /* the same for CODES.json */
    assert_int_equal(symlink(victim, tmp), 0);
    int32_t c[2] = {1, 2};
    dr_codes codes = {1, 2, c};
    assert_int_equal(dr_codes_write(out, &codes, &err), DRAMA_OK);
    v = tu_read_file(victim, NULL);
    assert_string_equal(v, "secret");
    free(v);
    assert_int_equal(dr_rows_write("", &rows, &err), DRAMA_EINVAL);
    assert_non_null(strstr(err.message, "empty file name"));
    dr_error_clear(&err);
    char missing[1200];
    snprintf(missing, sizeof missing, "%s/no/such/dir/rows.json", dir);
    assert_int_equal(dr_rows_write(missing, &rows, &err), DRAMA_EIO);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "no/such/dir/rows.json"));
    dr_rows_free(&rows);
    assert_int_equal(tu_rm_rf(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rows_round_trip),      cmocka_unit_test(rows_parse_defaults),
        cmocka_unit_test(rows_bad),             cmocka_unit_test(rows_golden),
        cmocka_unit_test(codes_round_trip_and_bounds), cmocka_unit_test(write_path_tricks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
