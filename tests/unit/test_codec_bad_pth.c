/* codec.pth integrity (torchzip.h): one flipped byte in a stored tensor of a copy of the tiny
 * codec.pth fails dr_pth_open and dr_codec_open with the zip member named; the copy unmodified
 * loads. The golden file itself is only read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "codec/codec.h"
#include "io/torchzip.h"
#include "testutil.h"

static void test_flipped_tensor_byte(void **state) {
    (void)state;
    size_t len;
    uint8_t *orig = (uint8_t *)tu_read_file(tu_golden("tiny-drama3/codec.pth"), &len);
    dr_pth *p = NULL;
    drama_error e = {0};
    if (dr_pth_open_memory(orig, len, "codec.pth", &p, &e)) fail_msg("%s", e.message);
    int64_t n = dr_pth_count(p);
    assert_true(n > 2);
    const char *dir = tu_tmpdir();
    char pth[512], json[512];
    snprintf(pth, sizeof pth, "%s/codec.pth", dir);
    snprintf(json, sizeof json, "%s/codec.json", dir);
    size_t jlen;
    char *cfg = tu_read_file(tu_golden("tiny-drama3/codec.json"), &jlen);
    tu_write_file(json, cfg, jlen);
    free(cfg);
    tu_write_file(pth, orig, len);
    dr_codec *c = NULL;
    if (dr_codec_open(dir, DR_CODEC_LOAD_ALL, &c, &e)) fail_msg("the unmodified copy: %s", e.message);
    dr_codec_free(c);
    /* first, middle and last tensor with bytes: flip one byte in the middle of its storage */
    int64_t picks[3] = {0, n / 2, n - 1};
    for (int k = 0; k < 3; k++) {
        const dr_tensor *t = dr_pth_at(p, picks[k]);
        for (int64_t i = picks[k]; !t->nbytes && i < n; i++) t = dr_pth_at(p, i);
        assert_true(t->nbytes > 0);
        size_t off = (size_t)(t->data - orig) + t->nbytes / 2;
        uint8_t *bad = malloc(len);
        memcpy(bad, orig, len);
        bad[off] ^= 0xFF;
        tu_write_file(pth, bad, len);
        dr_pth *q = NULL;
        dr_error_clear(&e);
        assert_int_equal(dr_pth_open(pth, &q, &e), DRAMA_EFORMAT);
        assert_null(q);
        printf("%s (byte %zu of tensor '%s'): %s\n", pth, off, t->name, e.message);
        assert_non_null(strstr(e.message, "CRC-32"));
        assert_non_null(strstr(e.message, pth));
        /* the member named is a storage of the archive: <prefix>/data/<key> */
        char member[600];
        snprintf(member, sizeof member, "'%s/data/", dr_pth_prefix(p));
        assert_non_null(strstr(e.message, member));
        dr_error_clear(&e);
        assert_int_equal(dr_codec_open(dir, DR_CODEC_LOAD_ALL, &c, &e), DRAMA_EFORMAT);
        assert_null(c);
        assert_non_null(strstr(e.message, member));
        /* in memory the same check */
        dr_error_clear(&e);
        assert_int_equal(dr_pth_open_memory(bad, len, "mem.pth", &q, &e), DRAMA_EFORMAT);
        assert_non_null(strstr(e.message, "CRC-32"));
        free(bad);
    }
    /* a damaged stored CRC is caught too (the bytes are right, the record is not) */
    uint8_t *bad = malloc(len);
    memcpy(bad, orig, len);
    size_t cd = 0;
    for (size_t i = len - 22; i-- > 0;)
        if (bad[i] == 'P' && bad[i + 1] == 'K' && bad[i + 2] == 1 && bad[i + 3] == 2) cd = i; /* first central record */
    assert_true(cd > 0);
    bad[cd + 16] ^= 0x01;
    dr_pth *q = NULL;
    dr_error_clear(&e);
    assert_int_equal(dr_pth_open_memory(bad, len, "crcfield.pth", &q, &e), DRAMA_EFORMAT);
    printf("%s\n", e.message);
    assert_non_null(strstr(e.message, "CRC-32"));
    free(bad);
    dr_pth_close(p);
    free(orig);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flipped_tensor_byte),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
