/* test_serve_voices_shared_io.c - one --voices-dir served by several replicas (issue 16): two
 * catalogs opened on one directory stand for two processes. A voice added by one is found by
 * the other's next lookup and list; a re-created id (new audio, or the same audio again) is
 * reloaded, never served from a stale cache; deletes are atomic across catalogs (one 204, one
 * 404) and leave a holder's copy intact; a create racing a create of the same id gives one 201
 * and one 409; a reader racing delete + re-create sees either no voice or one whole version (the
 * writer waits, bounded, for a whole lookup of the reader in each state, so a busy machine that
 * never schedules the reader fails loudly instead of proving nothing);
 * stale temporaries are removed at open, fresh ones (another replica's write) are kept. The codec
 * is a counting encoder (codes = the audio bytes), so a voice is consistent when its codes match
 * its audio and its text names that audio. Runs under valgrind. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include <cmocka.h>

#include "serve/voices.h"
#include "testutil.h"

static int enc(void *user, const uint8_t *audio, size_t n, const char *param, int32_t **codes, int64_t *n_frames,
               double *duration_s, dr_api_error *e) {
    (void)user;
    (void)param;
    (void)e;
    *codes = malloc((2 * n + 1) * sizeof **codes);
    for (size_t k = 0; k < n; k++) {
        (*codes)[2 * k] = audio[k];
        (*codes)[2 * k + 1] = (int32_t)k;
    }
    *n_frames = (int64_t)n;
    *duration_s = (double)n / 10;
    return 0;
}

static dr_voices *open_dir(const char *dir) {
    dr_voices *v = NULL;
    drama_error err = {0};
    assert_int_equal(dr_voices_open(&v, dir, "fp", 2, enc, NULL, &err), DRAMA_OK);
    return v;
}

static int add(dr_voices *v, const char *id, const char *text, const char *audio) {
    dr_api_error e = {0};
    return dr_voices_add(v, id, text, (const uint8_t *)audio, strlen(audio), NULL, &e);
}

/* 1 when the voice's text is "t:" + its audio and its codes are the audio's bytes. */
static int consistent(const dr_voice *voice) {
    if (strncmp(voice->text, "t:", 2) || strlen(voice->text + 2) != voice->audio_len) return 0;
    if (memcmp(voice->text + 2, voice->audio, voice->audio_len) || voice->n_frames != (int64_t)voice->audio_len) return 0;
    for (size_t k = 0; k < voice->audio_len; k++)
        if (voice->codes[2 * k] != voice->audio[k]) return 0;
    return 1;
}

static void test_visibility(void **st) {
    (void)st;
    const char *tmp = tu_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/voices", tmp);
    dr_voices *a = open_dir(dir), *b = open_dir(dir);
    assert_int_equal(add(a, "ann", "t:aaaa", "aaaa"), 0);
    dr_voice *vb = dr_voices_get(b, "ann"); /* b never saw the upload */
    assert_non_null(vb);
    assert_true(consistent(vb));
    json_t *list = dr_voices_list_json(b);
    assert_int_equal(json_array_size(json_object_get(list, "voices")), 1);
    json_decref(list);
    assert_int_equal(add(b, "ann", "t:bb", "bb"), 409); /* b's disk check, not its cache */

    /* b holds ann; a deletes it; b's second delete is a clean "none"; b's copy stays whole */
    assert_int_equal(dr_voices_delete(a, "ann"), 0);
    assert_int_equal(dr_voices_delete(b, "ann"), -1);
    assert_null(dr_voices_get(b, "ann"));
    assert_true(consistent(vb));
    list = dr_voices_list_json(b);
    assert_int_equal(json_array_size(json_object_get(list, "voices")), 0);
    json_decref(list);

    /* a caches ann (new audio), b re-creates it with other audio: a's next lookup has b's */
    assert_int_equal(add(b, "ann", "t:cc", "cc"), 0);
    dr_voice *va = dr_voices_get(a, "ann");
    assert_non_null(va);
    assert_int_equal(va->audio[0], 'c');
    assert_int_equal(dr_voices_delete(a, "ann"), 0);
    assert_int_equal(add(a, "ann", "t:dddd", "dddd"), 0);
    dr_voice *vb2 = dr_voices_get(b, "ann");
    assert_non_null(vb2);
    assert_int_equal(vb2->audio[0], 'd');
    assert_true(consistent(vb2));
    /* the same audio and text again (same second, maybe): a new uid, so another voice */
    char uid[17];
    snprintf(uid, sizeof uid, "%s", vb2->uid);
    assert_int_equal(dr_voices_delete(b, "ann"), 0);
    assert_int_equal(add(b, "ann", "t:dddd", "dddd"), 0);
    dr_voice *va2 = dr_voices_get(a, "ann");
    assert_non_null(va2);
    assert_string_not_equal(va2->uid, uid);
    dr_voice_release(vb);
    dr_voice_release(va);
    dr_voice_release(vb2);
    dr_voice_release(va2);
    dr_voices_free(a);
    dr_voices_free(b);

    /* leftovers: an old .tmp- / .trash- entry goes at open; a fresh one may be a live write */
    char p[600];
    struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}};
    snprintf(p, sizeof p, "%s/.tmp-zed-0123456789abcdef", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(utimes(p, old), 0);
    snprintf(p, sizeof p, "%s/.trash-zed-0123456789abcdef", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(utimes(p, old), 0);
    snprintf(p, sizeof p, "%s/.tmp-live-fedcba9876543210", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    a = open_dir(dir);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/.tmp-zed-0123456789abcdef", dir);
    assert_int_not_equal(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/.trash-zed-0123456789abcdef", dir);
    assert_int_not_equal(stat(p, &sb), 0);
    dr_voices_free(a);
    tu_rm_rf(tmp);
}

typedef struct race {
    dr_voices *v;
    pthread_barrier_t *go;
    const char *audio;
    int rc, seen_none, seen_some, bad;
    atomic_int *done;
    atomic_int lookups; /* the reader's finished lookups: the writer waits on it */
} race;

static void *create_one(void *arg) {
    race *r = arg;
    pthread_barrier_wait(r->go);
    dr_api_error e = {0};
    r->rc = dr_voices_add(r->v, "zoe", r->audio, (const uint8_t *)r->audio + 2, strlen(r->audio) - 2, NULL, &e);
    return NULL;
}

static void *read_loop(void *arg) {
    race *r = arg;
    pthread_barrier_wait(r->go);
    while (!atomic_load(r->done)) {
        dr_voice *voice = dr_voices_get(r->v, "zoe");
        if (!voice) {
            r->seen_none++;
            atomic_fetch_add(&r->lookups, 1);
            continue;
        }
        r->seen_some++;
        r->bad += !consistent(voice);
        dr_voice_release(voice);
        atomic_fetch_add(&r->lookups, 1);
    }
    return NULL;
}

/* Waits until the reader has finished a lookup that began after now: the lookup in flight may
 * predate the writer's last change, the one after it cannot. Bounded (60 s, for a loaded
 * machine under a sanitizer); 0 if the reader never got there. */
static int reader_caught_up(race *r) {
    int from = atomic_load(&r->lookups);
    struct timespec t0, now, nap = {0, 100000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&r->lookups) < from + 2) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60) return 0;
        nanosleep(&nap, NULL);
    }
    return 1;
}

static void test_races(void **st) {
    (void)st;
    const char *tmp = tu_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/voices", tmp);
    dr_voices *a = open_dir(dir), *b = open_dir(dir);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    for (int round = 0; round < 10; round++) {
        race ra = {a, &go, "t:xxxxxx", 0, 0, 0, 0, NULL, 0}, rb = {b, &go, "t:yy", 0, 0, 0, 0, NULL, 0};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, create_one, &ra);
        pthread_create(&tb, NULL, create_one, &rb);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        assert_true((ra.rc == 0 && rb.rc == 409) || (ra.rc == 409 && rb.rc == 0));
        dr_voice *va = dr_voices_get(a, "zoe"), *vb = dr_voices_get(b, "zoe");
        assert_non_null(va);
        assert_non_null(vb);
        assert_string_equal(va->uid, vb->uid); /* both see the winner */
        assert_int_equal(va->audio[0], ra.rc == 0 ? 'x' : 'y');
        dr_voice_release(va);
        dr_voice_release(vb);
        /* both delete: exactly one succeeds */
        int da = dr_voices_delete(a, "zoe"), db = dr_voices_delete(b, "zoe");
        assert_int_equal(da + db, -1);
    }
    /* a reader on b while a deletes and re-creates with alternating versions */
    atomic_int done = 0;
    race rd = {b, &go, NULL, 0, 0, 0, 0, &done, 0};
    pthread_t tr;
    pthread_create(&tr, NULL, read_loop, &rd);
    pthread_barrier_wait(&go);
    int caught = 0;
    for (int k = 0; k < 60; k++) {
        assert_int_equal(add(a, "zoe", k % 2 ? "t:pqrs" : "t:uvwxyz12", k % 2 ? "pqrs" : "uvwxyz12"), 0);
        caught += reader_caught_up(&rd); /* a lookup wholly after the add: it must find a whole voice */
        assert_int_equal(dr_voices_delete(a, "zoe"), 0);
        caught += reader_caught_up(&rd); /* and one wholly after the delete: none */
    }
    atomic_store(&done, 1);
    pthread_join(tr, NULL);
    print_message("reader: %d whole voices, %d none\n", rd.seen_some, rd.seen_none);
    assert_int_equal(rd.bad, 0);
    assert_int_equal(caught, 120); /* the reader ran in every state, not starved */
    assert_true(rd.seen_some >= 60); /* a lookup after each add saw it (another replica's write is visible) */
    assert_true(rd.seen_none >= 60);
    pthread_barrier_destroy(&go);
    dr_voices_free(a);
    dr_voices_free(b);
    tu_rm_rf(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_visibility), cmocka_unit_test(test_races)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
