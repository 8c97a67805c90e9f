/* Bad input through the public synthesis API (also run under valgrind: "_bad"): every failure
 * is an error naming what is at fault, delivers no audio, and leaks nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/error.h"
#include "drama.h"
#include "testutil.h"

static char g_dir[256];
static drama_model *g_model;

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/drama-plbad-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    drama_error e = {0};
    drama_model_options o;
    drama_model_options_default(&o);
    o.threads = 1;
    if (drama_model_open(&g_model, tu_golden("tiny-drama3"), &o, &e) != DRAMA_OK) {
        fprintf(stderr, "%s\n", e.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    drama_model_close(g_model);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *put(const char *name, const void *data, size_t n) {
    static char p[4][512];
    static int slot;
    char *path = p[slot++ & 3];
    snprintf(path, sizeof p[0], "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    return path;
}

typedef struct counts {
    int audio_calls, frame_events, phase_events;
    int cancel_on_phase; /* return nonzero on this phase's event (-1 never) */
} counts;

static int on_audio(void *user, const float *x, size_t n) {
    (void)x;
    (void)n;
    ((counts *)user)->audio_calls++;
    return 0;
}

static int on_event(void *user, const drama_event *ev) {
    counts *c = user;
    if (ev->type == DRAMA_EVENT_FRAMES) c->frame_events++;
    if (ev->type == DRAMA_EVENT_PHASE) {
        c->phase_events++;
        if (ev->phase == c->cancel_on_phase) return 1;
    }
    return 0;
}

/* Runs req; expects failure `want` (DRAMA_OK: any failure) whose message contains `needle`, and
 * no audio. */
static void expect_fail(const drama_request *req, drama_status want, const char *needle, counts *c) {
    drama_session *s = NULL;
    drama_error e = {0};
    assert_int_equal(drama_session_create(&s, g_model, &e), DRAMA_OK);
    drama_result res;
    drama_status st = drama_synthesize(s, req, on_audio, on_event, c, &res, &e);
    printf("  -> %s: %s [%s]\n", drama_status_name(st), e.message, res.finish_reason);
    if (want == DRAMA_OK) assert_int_not_equal(st, DRAMA_OK);
    else assert_int_equal(st, want);
    assert_non_null(strstr(e.message, needle));
    assert_int_equal(c->audio_calls, 0);
    assert_null(res.codes);
    drama_result_free(&res);
    drama_session_free(s);
}

static void base_request(drama_request *r) {
    drama_request_default(r);
    r->text = "Hello there.";
    r->seed = 1;
    r->seed_set = 1;
    r->frames = 2;
}

static void test_bad_references(void **state) {
    (void)state;
    drama_request r;
    base_request(&r);
    drama_reference ref = {.transcript = "A voice."};
    r.references = &ref;
    r.n_references = 1;
    struct { const char *name; const char *bytes; size_t n; int codes; const char *needle; } cases[] = {
        {"empty.wav", "", 0, 0, "empty.wav"},
        {"text.wav", "not audio, only words\n", 22, 0, "text.wav"},
        {"riff.wav", "RIFF\xff\xff\xff\xffWAVEfmt \x10\x00\x00\x00", 20, 0, "riff.wav"},
        {"missing.wav", NULL, 0, 0, "missing.wav"},
        {"bad.codes.json", "{\"codes\": [[1,2,3]]}", 19, 1, "bad.codes.json"},
        {"range.codes.json", "{\"codes\": [[0,0,0,0,0,0,0,0,0,4096]]}", 37, 1, "codebook 9"},
        {"junk.codes.json", "{\"codes\": [[0,0,", 16, 1, "junk.codes.json"},
        {"none.codes.json", "{\"codes\": []}", 13, 1, "no frames"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        if (cases[i].bytes) snprintf(path, sizeof path, "%s", put(cases[i].name, cases[i].bytes, cases[i].n));
        else snprintf(path, sizeof path, "%s/%s", g_dir, cases[i].name);
        ref.audio_path = cases[i].codes ? NULL : path;
        ref.codes_path = cases[i].codes ? path : NULL;
        counts c = {.cancel_on_phase = -1};
        printf("reference %s\n", cases[i].name);
        expect_fail(&r, DRAMA_OK, cases[i].needle, &c);
        assert_int_equal(c.frame_events, 0); /* failed before any generation */
    }
}

static void test_bad_text_and_settings(void **state) {
    (void)state;
    drama_request r;
    const char *texts[] = {"", "   \n\t ", "bad \xff utf8", "<|im_end|> injected", "<|speaker:16|>hi", "<|semantic:5|>"};
    const char *needles[] = {"empty_text", "empty_text", "invalid_utf8", "reserved_token", "invalid_speaker_tag",
                             "reserved_token"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        base_request(&r);
        r.text = texts[i];
        counts c = {.cancel_on_phase = -1};
        expect_fail(&r, DRAMA_OK, needles[i], &c);
        assert_int_equal(c.phase_events, 0); /* text is checked before any phase */
    }
    base_request(&r);
    r.top_p = 1.5f;
    counts c = {.cancel_on_phase = -1};
    expect_fail(&r, DRAMA_EINVAL, "top_p", &c);
    base_request(&r);
    drama_reference ref = {.codes_path = "x.json", .transcript = "<|voice|>"};
    r.references = &ref;
    r.n_references = 1;
    expect_fail(&r, DRAMA_OK, "reference 0 transcript", &c);
}

static void test_cancel_frame_cap_and_null_args(void **state) {
    (void)state;
    drama_request r;
    base_request(&r);
    /* Cancelled from the event callback when generation starts: no frame, no audio. */
    counts c = {.cancel_on_phase = DRAMA_PHASE_GENERATE};
    expect_fail(&r, DRAMA_ECANCELLED, "cancel", &c);
    assert_int_equal(c.frame_events, 0);
    /* The frame cap (the random model never ends). */
    r.frames = 0;
    r.max_frames = 2;
    counts k = {.cancel_on_phase = -1};
    expect_fail(&r, DRAMA_EFRAMELIMIT, "frame limit", &k);
    assert_int_equal(k.frame_events, 2);
    /* NULL arguments are errors, not crashes. */
    drama_error e = {0};
    assert_int_equal(drama_synthesize(NULL, &r, NULL, NULL, NULL, NULL, &e), DRAMA_EINVAL);
    drama_session *s = NULL;
    assert_int_equal(drama_session_create(&s, g_model, &e), DRAMA_OK);
    dr_error_clear(&e);
    assert_int_equal(drama_synthesize(s, NULL, NULL, NULL, NULL, NULL, &e), DRAMA_EINVAL);
    drama_session_free(s);
    assert_int_equal(drama_session_create(&s, NULL, &e), DRAMA_EINVAL);
    assert_int_equal(drama_model_open(NULL, "x", NULL, &e), DRAMA_EINVAL);
}

static void test_broken_model_dirs(void **state) {
    (void)state;
    char m[300], cmd[800];
    snprintf(m, sizeof m, "%s/model", g_dir);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && rm '%s/tokenizer.json'", tu_golden("tiny-drama3"), m, m);
    assert_int_equal(system(cmd), 0);
    drama_model *bad = NULL;
    drama_error e = {0};
    assert_int_not_equal(drama_model_open(&bad, m, NULL, &e), DRAMA_OK);
    printf("no tokenizer: %s\n", e.message);
    assert_non_null(strstr(e.message, "tokenizer.json"));
    assert_null(bad);
    /* A truncated weight shard opens (weights load per request) but the request fails cleanly. */
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/' && truncate -s 1000 '%s/model-00002-of-00002.safetensors'",
             tu_golden("tiny-drama3/tokenizer.json"), m, m);
    assert_int_equal(system(cmd), 0);
    dr_error_clear(&e);
    if (drama_model_open(&bad, m, NULL, &e) == DRAMA_OK) {
        drama_session *s = NULL;
        assert_int_equal(drama_session_create(&s, bad, &e), DRAMA_OK);
        drama_request r;
        base_request(&r);
        counts c = {.cancel_on_phase = -1};
        drama_result res;
        drama_status st = drama_synthesize(s, &r, on_audio, on_event, &c, &res, &e);
        printf("truncated shard: %s\n", e.message);
        assert_int_not_equal(st, DRAMA_OK);
        assert_non_null(strstr(e.message, "model-00002-of-00002.safetensors"));
        assert_int_equal(c.audio_calls, 0);
        drama_result_free(&res);
        drama_session_free(s);
        drama_model_close(bad);
    } else {
        assert_non_null(strstr(e.message, "model-00002-of-00002.safetensors"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_references),
        cmocka_unit_test(test_bad_text_and_settings),
        cmocka_unit_test(test_cancel_frame_cap_and_null_args),
        cmocka_unit_test(test_broken_model_dirs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
