/* test_io_bad_safetensors.c - every malformed safetensors case of FORMATS.md section 1 gives a clear
 * error (code + a message naming the problem), and no input crashes the reader: all truncations
 * and single-byte corruptions of a valid image are tried. Runs under valgrind too (name has _bad). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "io/safetensors.h"
#include "testutil.h"

/* Image = 8-byte length (header_len, or strlen(header) when UINT64_MAX) + header + data_len bytes. */
static uint8_t *make_image(const char *header, uint64_t header_len, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    if (header_len == UINT64_MAX) header_len = h;
    *size = 8 + h + data_len;
    uint8_t *img = calloc(1, *size);
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)(header_len >> (8 * i));
    memcpy(img + 8, header, h);
    for (size_t i = 0; i < data_len; i++) img[8 + h + i] = (uint8_t)i;
    return img;
}

/* Opens the image both from memory and from a file; both must fail with `code` and `needle`. */
static void expect_bad(const char *header, uint64_t header_len, size_t data_len, drama_status code,
                       const char *needle) {
    size_t size;
    uint8_t *img = make_image(header, header_len, data_len, &size);
    dr_st_file *f = (dr_st_file *)1;
    drama_error err = {0};
    drama_status st = dr_st_open_memory(img, size, "case.safetensors", &f, &err);
    printf("%-28s -> %s: %s\n", needle, drama_status_name(st), err.message);
    assert_null(f);
    assert_int_equal(st, code);
    if (!strstr(err.message, needle)) fail_msg("message '%s' lacks '%s'", err.message, needle);
    assert_non_null(strstr(err.message, "case.safetensors"));

    const char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    tu_write_file(path, img, size);
    err = (drama_error){0};
    assert_int_equal(dr_st_open(path, &f, &err), code);
    assert_null(f);
    assert_non_null(strstr(err.message, needle));
    assert_non_null(strstr(err.message, path));
    free(img);
    assert_int_equal(tu_rm_rf(dir), 0);
}

#define AUTO UINT64_MAX

static void test_length_bounds(void **state) {
    (void)state;
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open_memory(tiny, sizeof tiny, "short", &f, &err), DRAMA_EFORMAT);
    assert_non_null(strstr(err.message, "shorter than the 8-byte"));
    expect_bad("{}", 3, 0, DRAMA_EFORMAT, "runs past the end");
    expect_bad("{}", 100000001, 0, DRAMA_EFORMAT, "exceeds the limit");
    expect_bad("{}", (uint64_t)-1 - 3, 0, DRAMA_EFORMAT, "exceeds the limit"); /* 8 + N would wrap */
    expect_bad("", AUTO, 0, DRAMA_EFORMAT, "does not start with '{'");
}

static void test_header_syntax(void **state) {
    (void)state;
    expect_bad("{\"a\": ", AUTO, 0, DRAMA_EFORMAT, "header JSON invalid");
    expect_bad("[1, 2]", AUTO, 0, DRAMA_EFORMAT, "does not start with '{'");
    expect_bad(" {}", AUTO, 0, DRAMA_EFORMAT, "does not start with '{'");
    expect_bad("{} x", AUTO, 0, DRAMA_EFORMAT, "header JSON invalid");
    expect_bad("{\"\xC3\x28\": 1}", AUTO, 0, DRAMA_EFORMAT, "not valid UTF-8 at byte offset 10");
    expect_bad("{\"\xED\xA0\x80\": 1}", AUTO, 0, DRAMA_EFORMAT, "not valid UTF-8"); /* surrogate */
    expect_bad("{\"\xC0\xAF\": 1}", AUTO, 0, DRAMA_EFORMAT, "not valid UTF-8");     /* overlong '/' */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               AUTO, 2, DRAMA_EFORMAT, "duplicate");
    expect_bad("{\"__metadata__\": {\"k\": 1}}", AUTO, 0, DRAMA_EFORMAT, "__metadata__ value of key 'k'");
    expect_bad("{\"__metadata__\": [1]}", AUTO, 0, DRAMA_EFORMAT, "__metadata__ is not a JSON object");
    expect_bad("{\"t\": 5}", AUTO, 0, DRAMA_EFORMAT, "tensor 't': entry is not a JSON object");
}

static void test_entry_fields(void **state) {
    (void)state;
    expect_bad("{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT, "missing field 'dtype'");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT, "missing field 'shape'");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", AUTO, 1, DRAMA_EFORMAT, "missing field 'data_offsets'");
    expect_bad("{\"t\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT,
               "unknown dtype 'Q7'");
    expect_bad("{\"t\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT,
               "'dtype' is not a string");
    expect_bad("{\"t\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", AUTO, 2, DRAMA_EFORMAT,
               "3 F4 elements do not fill whole bytes");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT,
               "shape[0] is not a non-negative integer");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", AUTO, 1, DRAMA_EFORMAT,
               "shape[0]");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", AUTO, 3, DRAMA_EFORMAT,
               "'shape' is not an array");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", AUTO, 1,
               DRAMA_EUNSUPPORTED, "9 dimensions");
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", AUTO, 0,
               DRAMA_EFORMAT, "overflows");
    expect_bad("{\"t\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", AUTO, 0,
               DRAMA_EFORMAT, "overflows");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", AUTO, 1, DRAMA_EFORMAT,
               "data_offsets is not two integers");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", AUTO, 1, DRAMA_EFORMAT,
               "not 0 <= begin <= end");
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", AUTO, 1, DRAMA_EFORMAT,
               "not 0 <= begin <= end");
}

/* F8_E8M0 and F4 are known dtypes (FORMATS.md 3): the file opens; a role that cannot use them
 * refuses them when the tensor is bound. */
static void test_known_unusual_dtypes_open(void **state) {
    (void)state;
    size_t size;
    uint8_t *img = make_image("{\"a\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[0,3]},"
                              "\"b\":{\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[3,5]}}",
                              AUTO, 5, &size);
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open_memory(img, size, "ok.safetensors", &f, &err), DRAMA_OK);
    const dr_tensor *a = dr_st_find(f, "a"), *b = dr_st_find(f, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->dtype, DR_DT_F4);
    assert_int_equal(a->nbytes, 3);
    assert_int_equal(b->dtype, DR_DT_F8_E8M0);
    float out[6];
    assert_int_equal(dr_st_to_f32(b, out, &err), DRAMA_OK); /* bytes 3, 4: 2^(e-127) */
    assert_true(out[0] == ldexpf(1.0f, 3 - 127) && out[1] == ldexpf(1.0f, 4 - 127));
    err = (drama_error){0};
    assert_int_not_equal(dr_st_to_f32(a, out, &err), DRAMA_OK); /* no float role for packed F4 */
    assert_non_null(strstr(err.message, "'a'"));
    dr_st_close(f);
    free(img);
}

static void test_tiling(void **state) {
    (void)state;
    /* shape/size mismatch: 3 F32 need 12 bytes */
    expect_bad("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", AUTO, 8, DRAMA_EFORMAT,
               "hold 8 bytes but F32 shape needs 12");
    /* out of range */
    expect_bad("{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]},"
               "\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
               AUTO, 4, DRAMA_EFORMAT, "tensor 't': data_offsets [2, 6] beyond the data buffer of 4 bytes");
    /* overlap */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
               AUTO, 6, DRAMA_EFORMAT, "overlap");
    /* gap */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}",
               AUTO, 6, DRAMA_EFORMAT, "gap in the data buffer: bytes [2, 4)");
    /* first tensor not at 0 */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", AUTO, 3, DRAMA_EFORMAT, "gap");
    /* trailing bytes */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", AUTO, 5, DRAMA_EFORMAT,
               "3 trailing bytes");
    expect_bad("{}", AUTO, 1, DRAMA_EFORMAT, "1 trailing bytes");
}

static void test_not_a_file(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open(dir, &f, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "not a regular file"));
    char path[4096];
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    err = (drama_error){0};
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "absent.safetensors"));
    /* a symlink stored as text (git without symlinks) gets a hint */
    snprintf(path, sizeof path, "%s/link.safetensors", dir);
    tu_write_file(path, "../../tiny/model.safetensors", 28);
    err = (drama_error){0};
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_EFORMAT);
    assert_non_null(strstr(err.message, "symbolic link"));
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    tu_write_file(path, "", 0);
    err = (drama_error){0};
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_EFORMAT);
    assert_non_null(strstr(err.message, "shorter"));
    assert_int_equal(tu_rm_rf(dir), 0);
}

/* Every prefix and every single-byte change of a valid image: either a valid file whose views lie
 * inside the image, or an error with a message. Never a crash or an out-of-bounds read. */
static void test_truncations_and_corruptions(void **state) {
    (void)state;
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]}}";
    size_t size;
    uint8_t *img = make_image(hdr, AUTO, 16, &size);
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open_memory(img, size, "ok", &f, &err), DRAMA_OK);
    dr_st_close(f);
    int ok = 0, bad = 0;
    for (size_t n = 0; n < size; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* exact-size copy so valgrind/ASan see overreads */
        memcpy(cut, img, n);
        err = (drama_error){0};
        assert_int_equal(dr_st_open_memory(cut, n, "cut", &f, &err), DRAMA_EFORMAT);
        assert_true(err.message[0] != 0);
        free(cut);
        bad++;
    }
    static const uint8_t repl[] = {0x00, 0xFF, '"', '}', '9', '[', 0x80};
    for (size_t pos = 0; pos < size; pos++) {
        for (size_t r = 0; r < sizeof repl; r++) {
            uint8_t *mut = malloc(size);
            memcpy(mut, img, size);
            if (mut[pos] == repl[r]) {
                free(mut);
                continue;
            }
            mut[pos] = repl[r];
            err = (drama_error){0};
            f = NULL;
            drama_status st = dr_st_open_memory(mut, size, "mut", &f, &err);
            if (st == DRAMA_OK) {
                ok++;
                for (int64_t i = 0; i < dr_st_count(f); i++) {
                    const dr_tensor *t = dr_st_at(f, i);
                    assert_true(t->data >= mut + 8 && t->data + t->nbytes <= mut + size);
                    float v[64];
                    if (dr_tensor_numel(t) <= 64) assert_int_equal(dr_st_to_f32(t, v, NULL), DRAMA_OK);
                }
                dr_st_close(f);
            } else {
                assert_null(f);
                assert_true(err.message[0] != 0);
                bad++;
            }
            free(mut);
        }
    }
    printf("robustness: %d corrupted images accepted (data bytes), %d rejected with a message\n", ok, bad);
    free(img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_length_bounds), cmocka_unit_test(test_header_syntax),
        cmocka_unit_test(test_entry_fields),  cmocka_unit_test(test_tiling),
        cmocka_unit_test(test_known_unusual_dtypes_open),
        cmocka_unit_test(test_not_a_file),    cmocka_unit_test(test_truncations_and_corruptions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
