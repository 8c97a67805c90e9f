/* test_serve_voices_io.c - the voice catalog (API.md 5): add / 409 / get / list sorted / delete
 * while a request holds the voice / persistence across reopen / re-encoding on a fingerprint
 * change / stale leftover temporary directories removed / invalid names ignored. The codec is
 * replaced by a counting encoder here (the catalog's contract is only "encode these bytes");
 * the real codec runs in the e2e tests. Runs under valgrind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <cmocka.h>

#include "serve/voices.h"
#include "testutil.h"

static int g_encodes;

/* One frame of 2 codes per audio byte: codes (byte, index). "BAD" fails as bad audio. */
static int count_encode(void *user, const uint8_t *audio, size_t n, const char *param, int32_t **codes,
                        int64_t *n_frames, double *duration_s, dr_api_error *e) {
    if (n == 3 && !memcmp(audio, "BAD", 3)) return dr_api_fail(e, 400, "bad_audio", param, "%s: unreadable", param);
    g_encodes++;
    *codes = malloc(2 * n * sizeof **codes);
    for (size_t k = 0; k < n; k++) {
        (*codes)[2 * k] = audio[k];
        (*codes)[2 * k + 1] = (int32_t)k + (user ? 1000 : 0);
    }
    *n_frames = (int64_t)n;
    *duration_s = (double)n / 10;
    return 0;
}

static void test_catalog(void **st) {
    const char *dir = tu_tmpdir();
    char vdir[512];
    snprintf(vdir, sizeof vdir, "%s/voices", dir);
    dr_voices *v = NULL;
    drama_error err = {0};
    g_encodes = 0;
    assert_int_equal(dr_voices_open(&v, vdir, "fp1", 2, count_encode, NULL, &err), DRAMA_OK);
    dr_api_error e = {0};
    dr_voice *bob = NULL;
    assert_int_equal(dr_voices_add(v, "bob", "hello bob", (const uint8_t *)"abcd", 4, &bob, &e), 0);
    assert_int_equal(bob->n_frames, 4);
    assert_string_equal(bob->sha256, "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
    assert_int_equal(dr_voices_add(v, "alice", "hi", (const uint8_t *)"xy", 2, NULL, &e), 0);
    assert_int_equal(dr_voices_add(v, "bob", "again", (const uint8_t *)"zz", 2, NULL, &e), 409);
    assert_string_equal(e.code, "voice_exists");
    memset(&e, 0, sizeof e);
    assert_int_equal(dr_voices_add(v, "carol", "x", (const uint8_t *)"BAD", 3, NULL, &e), 400);
    assert_string_equal(e.code, "bad_audio");
    assert_null(dr_voices_get(v, "carol"));
    json_t *list = dr_voices_list_json(v);
    json_t *arr = json_object_get(list, "voices");
    assert_int_equal(json_array_size(arr), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "id")), "alice");
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 1), "id")), "bob");
    json_decref(list);

    /* delete while held: the holder's copy stays intact, the catalog and disk forget it */
    assert_int_equal(dr_voices_delete(v, "bob"), 0);
    assert_int_equal(dr_voices_delete(v, "bob"), -1);
    assert_null(dr_voices_get(v, "bob"));
    assert_string_equal(bob->text, "hello bob");
    assert_int_equal(bob->codes[2 * 3], 'd');
    dr_voice_release(bob);
    char p[600];
    struct stat sb;
    snprintf(p, sizeof p, "%s/bob", vdir);
    assert_int_not_equal(stat(p, &sb), 0);
    dr_voices_free(v);

    /* reopen: alice comes back from disk without encoding; junk is ignored or cleaned */
    snprintf(p, sizeof p, "%s/.tmp-zed-1-1", vdir);
    assert_int_equal(mkdir(p, 0755), 0);
    struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}}; /* stale: not a live write of another replica */
    assert_int_equal(utimes(p, old), 0);
    snprintf(p, sizeof p, "%s/not..valid", vdir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/broken", vdir);
    assert_int_equal(mkdir(p, 0755), 0);
    g_encodes = 0;
    assert_int_equal(dr_voices_open(&v, vdir, "fp1", 2, count_encode, NULL, &err), DRAMA_OK);
    assert_int_equal(g_encodes, 0);
    assert_int_equal(dr_voices_count(v), 1);
    dr_voice *a = dr_voices_get(v, "alice");
    assert_non_null(a);
    assert_int_equal(a->n_frames, 2);
    assert_int_equal(a->codes[1], 0);
    assert_string_equal(a->text, "hi");
    dr_voice_release(a);
    dr_voices_free(v);
    snprintf(p, sizeof p, "%s/.tmp-zed-1-1", vdir);
    assert_int_not_equal(stat(p, &sb), 0);

    /* another codec: re-encoded from the stored audio (user != NULL marks the new codes) */
    g_encodes = 0;
    assert_int_equal(dr_voices_open(&v, vdir, "fp2", 2, count_encode, (void *)1, &err), DRAMA_OK);
    assert_int_equal(g_encodes, 1);
    a = dr_voices_get(v, "alice");
    assert_int_equal(a->codes[1], 1000);
    dr_voice_release(a);
    dr_voices_free(v);
    g_encodes = 0;
    assert_int_equal(dr_voices_open(&v, vdir, "fp2", 2, count_encode, (void *)1, &err), DRAMA_OK);
    assert_int_equal(g_encodes, 0); /* the rewrite recorded the new fingerprint */
    dr_voices_free(v);

    /* memory only */
    assert_int_equal(dr_voices_open(&v, NULL, "fp", 2, count_encode, NULL, &err), DRAMA_OK);
    assert_int_equal(dr_voices_add(v, "m1", "t", (const uint8_t *)"q", 1, NULL, &e), 0);
    assert_int_equal(dr_voices_count(v), 1);
    dr_voices_free(v);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_catalog)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
