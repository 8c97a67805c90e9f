/* Unit tests of the public synthesis API (include/drama.h, src/gen/pipeline*.c): defaults and
 * validation (each error names the field), the streaming schedule, and whole requests on the
 * golden tiny model: stream == whole sample for sample, chunk sizes add up, cancellation from
 * the audio callback, the frame cap, exact frame counts, threads agree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "drama.h"
#include "gen/pipeline.h"
#include "testutil.h"

static void test_defaults_and_validation(void **state) {
    (void)state;
    drama_request r;
    drama_request_default(&r);
    assert_true(r.temperature == 1.0f);
    assert_true(fabsf(r.top_p - 0.9f) < 1e-7f);
    assert_int_equal(r.max_frames, 750);
    assert_int_equal(r.speaker, -1);
    drama_error e = {0};
    assert_int_equal(dr_request_validate(&r, &e), DRAMA_EINVAL); /* text missing */
    assert_non_null(strstr(e.message, "text"));
    r.text = "hi";
    dr_error_clear(&e);
    assert_int_equal(dr_request_validate(&r, &e), DRAMA_OK);
    drama_request b = r;
    b.temperature = NAN;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "temperature"));
    dr_error_clear(&e);
    b = r; b.top_p = 0;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "top_p"));
    dr_error_clear(&e);
    b = r; b.cfg_gamma = 5.5f;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "cfg_gamma"));
    dr_error_clear(&e);
    b = r; b.frames = 800;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "frames"));
    dr_error_clear(&e);
    b = r; b.speaker = 16;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "speaker"));
    dr_error_clear(&e);
    drama_reference ref = {.audio_path = "a.wav", .codes_path = "c.json", .transcript = "x"};
    b = r; b.references = &ref; b.n_references = 1;
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "reference 0"));
    dr_error_clear(&e);
    ref.codes_path = NULL; ref.transcript = "";
    assert_int_equal(dr_request_validate(&b, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "transcript"));
    assert_string_equal(drama_phase_name(DRAMA_PHASE_DECODE), "decode");
}

static void test_stream_schedule(void **state) {
    (void)state;
    assert_int_equal(dr_stream_chunk_frames(0, 0), DR_STREAM_FIRST_CHUNK);
    assert_int_equal(dr_stream_chunk_frames(1, 0), DR_STREAM_NEXT_CHUNK);
    assert_int_equal(dr_stream_chunk_frames(7, 0), DR_STREAM_NEXT_CHUNK);
    assert_true(DR_STREAM_FIRST_CHUNK < DR_STREAM_NEXT_CHUNK);
    assert_int_equal(dr_stream_chunk_frames(0, 3), 3);
    assert_int_equal(dr_stream_chunk_frames(5, 3), 3);
}

/* ---- whole requests on the golden tiny model ---- */

typedef struct sink {
    float *x;
    size_t n, cap;
    int calls;
    int cancel_after; /* > 0: return nonzero on that call */
    size_t chunk[64];
} sink;

static int collect(void *user, const float *s, size_t n) {
    sink *k = user;
    if (k->n + n > k->cap) {
        k->cap = (k->n + n) * 2;
        k->x = realloc(k->x, k->cap * sizeof *k->x);
    }
    memcpy(k->x + k->n, s, n * sizeof *s);
    k->n += n;
    if (k->calls < 64) k->chunk[k->calls] = n;
    k->calls++;
    return k->cancel_after > 0 && k->calls >= k->cancel_after;
}

static drama_status run(drama_model *m, const drama_request *r, sink *k, drama_result *res, drama_error *e) {
    drama_session *s = NULL;
    drama_status st = drama_session_create(&s, m, e);
    if (st == DRAMA_OK) st = drama_synthesize(s, r, collect, NULL, k, res, e);
    drama_session_free(s);
    return st;
}

static void test_requests_on_tiny_model(void **state) {
    (void)state;
    drama_error e = {0};
    drama_model *m = NULL;
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = 2;
    drama_status st = drama_model_open(&m, tu_golden("tiny-drama3"), &mo, &e);
    if (st != DRAMA_OK) fail_msg("model open: %s", e.message);

    drama_request r;
    drama_request_default(&r);
    r.text = "Hello there. This is a test.";
    r.seed = 1234;
    r.seed_set = 1;
    r.frames = 9;

    sink whole = {0}, streamed = {0};
    drama_result res1, res2;
    st = run(m, &r, &whole, &res1, &e);
    if (st != DRAMA_OK) fail_msg("whole: %s", e.message);
    assert_string_equal(res1.finish_reason, "frames");
    assert_int_equal(res1.frames, 9);
    assert_int_equal(res1.samples, 9 * res1.samples_per_frame);
    assert_int_equal(whole.n, (size_t)res1.samples);
    assert_int_equal(whole.calls, 1);
    assert_non_null(res1.codes);
    assert_true(res1.prompt_tokens > 0);
    for (size_t i = 0; i < whole.n; i++) assert_true(isfinite(whole.x[i]) && fabsf(whole.x[i]) < 1.0f);

    r.stream = 1;
    st = run(m, &r, &streamed, &res2, &e);
    if (st != DRAMA_OK) fail_msg("stream: %s", e.message);
    assert_int_equal(streamed.n, whole.n);
    /* Default schedule: 4 frames, then 16 (here the 5 left). */
    assert_int_equal(streamed.calls, 2);
    assert_int_equal(streamed.chunk[0], (size_t)DR_STREAM_FIRST_CHUNK * res2.samples_per_frame);
    assert_memory_equal(streamed.x, whole.x, whole.n * sizeof(float));
    assert_memory_equal(res1.codes, res2.codes, (size_t)res1.frames * res1.n_codebooks * sizeof(int32_t));
    printf("tiny model: 9 frames, %zu samples; stream (2 chunks) == whole bit for bit\n", whole.n);
    drama_result_free(&res2);

    /* Cancellation from the audio consumer after the first chunk. */
    sink c = {.cancel_after = 1};
    r.stream_chunk_frames = 2;
    st = run(m, &r, &c, &res2, &e);
    assert_int_equal(st, DRAMA_ECANCELLED);
    assert_string_equal(res2.finish_reason, "cancelled");
    assert_null(res2.codes);
    drama_result_free(&res2);
    dr_error_clear(&e);

    /* Frame cap: the random model never ends, so without --frames the cap fails the request. */
    drama_request cap = r;
    cap.frames = 0;
    cap.max_frames = 3;
    sink k3 = {0};
    st = run(m, &cap, &k3, &res2, &e);
    assert_int_equal(st, DRAMA_EFRAMELIMIT);
    assert_string_equal(res2.finish_reason, "frame_limit");
    printf("frame cap: %s\n", e.message);
    drama_result_free(&res2);
    dr_error_clear(&e);

    /* Thread count does not change a sample. */
    drama_model_close(m);
    mo.threads = 1;
    assert_int_equal(drama_model_open(&m, tu_golden("tiny-drama3"), &mo, &e), DRAMA_OK);
    sink t1 = {0};
    r.stream = 0;
    r.stream_chunk_frames = 0;
    st = run(m, &r, &t1, &res2, &e);
    if (st != DRAMA_OK) fail_msg("threads 1: %s", e.message);
    assert_int_equal(t1.n, whole.n);
    assert_memory_equal(t1.x, whole.x, whole.n * sizeof(float));
    drama_result_free(&res2);
    drama_result_free(&res1);
    drama_model_close(m);
    free(whole.x); free(streamed.x); free(c.x); free(k3.x); free(t1.x);
}

static void test_bad_model_dir(void **state) {
    (void)state;
    drama_error e = {0};
    drama_model *m = NULL;
    assert_int_not_equal(drama_model_open(&m, "/nonexistent/model", NULL, &e), DRAMA_OK);
    assert_null(m);
    assert_non_null(strstr(e.message, "/nonexistent/model"));
    drama_model_close(NULL);
    drama_session_free(NULL);
    drama_session_cancel(NULL);
    drama_result_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_validation),
        cmocka_unit_test(test_stream_schedule),
        cmocka_unit_test(test_bad_model_dir),
        cmocka_unit_test(test_requests_on_tiny_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
