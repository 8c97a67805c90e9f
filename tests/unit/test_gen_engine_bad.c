/* Bad input to the engine API (also under valgrind): every refusal names what is wrong and carries
 * the machine reason a server maps to API.md 7; misuse of lane handles is harmless; nothing
 * leaks. The golden tiny model; little generation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "drama.h"
#include "testutil.h"

static drama_model *g_m;

static int setup(void **state) {
    (void)state;
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = 1;
    drama_error e = {0};
    if (drama_model_open(&g_m, tu_golden("tiny-drama3"), &mo, &e) != DRAMA_OK) fail_msg("model open: %s", e.message);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    drama_model_close(g_m);
    return 0;
}

static void expect_reason(drama_status st, drama_status want, const drama_error *e, const char *reason,
                          const char *in_message) {
    if (st != want) fail_msg("status %s, expected %s (%s)", drama_status_name(st), drama_status_name(want), e->message);
    assert_string_equal(e->reason, reason);
    if (in_message && !strstr(e->message, in_message)) fail_msg("message \"%s\" lacks \"%s\"", e->message, in_message);
    printf("%-20s %s\n", reason[0] ? reason : "(no reason)", e->message);
}

static void test_validate_text(void **state) {
    (void)state;
    struct {
        const char *text;
        int64_t max;
        drama_status st;
        const char *reason;
        const char *msg;
    } cases[] = {
        {"   \n\t ", 0, DRAMA_EEMPTY, "empty_text", "empty"},
        {"<|speaker:0|>  ", 0, DRAMA_EEMPTY, "empty_text", "speaker"},
        {"abc\xff", 0, DRAMA_EINVAL, "invalid_utf8", "offset"},
        {"hi <|im_end|> there", 0, DRAMA_EINVAL, "reserved_token", "<|im_end|>"},
        {"hi <|speaker:16|> there", 0, DRAMA_EINVAL, "invalid_speaker_tag", "<|speaker:16|>"},
        {"hi <|speaker:01|> there", 0, DRAMA_EINVAL, "invalid_speaker_tag", "byte offset 3"},
        {"h\xc3\xa9llo", 4, DRAMA_EINVAL, "text_too_long", "5 code points"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        drama_error e = {0};
        expect_reason(drama_validate_text(g_m, cases[i].text, cases[i].max, &e), cases[i].st, &e, cases[i].reason,
                      cases[i].msg);
    }
    drama_error e = {0};
    assert_int_equal(drama_validate_text(g_m, "h\xc3\xa9llo", 5, &e), DRAMA_OK);
    assert_string_equal(e.reason, "");
    assert_int_equal(drama_validate_text(g_m, "<|speaker:15|>fine", 0, &e), DRAMA_OK);
    assert_int_equal(drama_validate_text(g_m, NULL, 0, &e), DRAMA_EINVAL);
}

static void test_encode_audio_bad(void **state) {
    (void)state;
    int32_t *codes = (int32_t *)1;
    int64_t frames = 7;
    double dur = 1;
    drama_error e = {0};
    expect_reason(drama_encode_audio(g_m, "", 0, 0, &codes, &frames, &dur, &e), DRAMA_EEMPTY, &e, "bad_audio", "no bytes");
    assert_null(codes);
    assert_int_equal(frames, 0);
    const char junk[] = "this is not audio at all, only some text bytes";
    memset(&e, 0, sizeof e);
    assert_int_not_equal(drama_encode_audio(g_m, junk, sizeof junk, 0, &codes, &frames, &dur, &e), DRAMA_OK);
    assert_string_equal(e.reason, "bad_audio");
    printf("not audio: %s\n", e.message);
    assert_null(codes);
    /* a WAV header that promises more data than it has */
    unsigned char wav[60] = "RIFF\x34\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x44\xac\x00\x00\x88\x58\x01\x00"
                            "\x02\x00\x10\x00"
                            "data\x00\x10\x00\x00";
    memset(&e, 0, sizeof e);
    drama_status st = drama_encode_audio(g_m, wav, sizeof wav, 0, &codes, &frames, &dur, &e);
    assert_int_not_equal(st, DRAMA_OK);
    assert_string_equal(e.reason, "bad_audio");
    printf("truncated wav: %s\n", e.message);
    memset(&e, 0, sizeof e);
    assert_int_equal(drama_encode_audio(g_m, junk, sizeof junk, 0, NULL, &frames, &dur, &e), DRAMA_EINVAL);
    assert_non_null(drama_model_codec_fingerprint(g_m));
    assert_int_equal(strlen(drama_model_codec_fingerprint(g_m)), 64);
}

static void test_plan_and_start_bad(void **state) {
    (void)state;
    drama_request r;
    drama_request_default(&r);
    r.text = "Hello.";
    drama_plan p;
    drama_error e = {0};
    /* chunk_bytes bounds the batches in bytes too (/v1/tts chunk_length) */
    drama_request lt = r;
    lt.text = "One sentence here. Another sentence there. And a third one to finish.";
    assert_int_equal(drama_request_plan(g_m, &lt, &p, &e), DRAMA_OK);
    int whole = p.n_batches;
    lt.chunk_bytes = 20;
    assert_int_equal(drama_request_plan(g_m, &lt, &p, &e), DRAMA_OK);
    assert_true(p.n_batches >= 3 && p.n_batches > whole);
    lt.chunk_bytes = -1;
    assert_int_equal(drama_request_plan(g_m, &lt, &p, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "chunk_bytes"));
    memset(&e, 0, sizeof e);
    /* field checks name the field */
    drama_request b = r;
    b.temperature = 3;
    assert_int_equal(drama_request_plan(g_m, &b, &p, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "temperature"));
    memset(&e, 0, sizeof e);
    b = r;
    b.text = "bad <|voice|> text";
    expect_reason(drama_request_plan(g_m, &b, &p, &e), DRAMA_EINVAL, &e, "reserved_token", "<|voice|>");
    /* references: two sources, empty codes, out-of-range codes, bad transcript */
    int nc = drama_model_codebooks(g_m);
    int32_t *codes = calloc((size_t)4 * nc, sizeof *codes);
    drama_reference ref = {.transcript = "Voice.", .codes = codes, .n_code_frames = 4, .codes_path = "x.json"};
    b = r;
    b.references = &ref;
    b.n_references = 1;
    memset(&e, 0, sizeof e);
    assert_int_equal(drama_request_plan(g_m, &b, &p, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "exactly one"));
    ref.codes_path = NULL;
    ref.transcript = "<|im_start|>";
    memset(&e, 0, sizeof e);
    expect_reason(drama_request_plan(g_m, &b, &p, &e), DRAMA_EINVAL, &e, "reserved_token", "reference 0 transcript");
    ref.transcript = "Voice.";
    codes[5] = 1 << 20;
    drama_engine *eng = NULL;
    drama_engine_options o;
    drama_engine_options_default(&o);
    o.lanes = 1;
    memset(&e, 0, sizeof e);
    assert_int_equal(drama_engine_create(&eng, g_m, &o, &e), DRAMA_OK);
    drama_lane h = 0;
    /* out-of-range codes pass the plan (sizes only) and fail the lane, naming the frame */
    assert_int_equal(drama_engine_start(eng, &b, NULL, NULL, NULL, &h, &e), DRAMA_OK);
    for (int t = 0; t < 100 && !drama_lane_done(eng, h); t++) assert_int_equal(drama_engine_step(eng, &e), DRAMA_OK);
    drama_result res;
    assert_int_equal(drama_lane_result(eng, h, &res, &e), DRAMA_EFORMAT);
    printf("bad codes: %s [%s]\n", e.message, res.finish_reason);
    assert_non_null(strstr(e.message, "reference 0"));
    assert_non_null(strstr(e.message, "frame 0 codebook 5"));
    assert_string_equal(res.finish_reason, "error");
    assert_int_equal(drama_lane_result(eng, h, &res, &e), DRAMA_EINVAL); /* once only */
    drama_lane_release(eng, h);
    /* stale and invalid handles are ignored */
    drama_lane_cancel(eng, h);
    drama_lane_release(eng, h);
    assert_int_equal(drama_lane_done(eng, h), 0);
    drama_lane_cancel(eng, 0);
    drama_lane_cancel(eng, (drama_lane)999 << 16 | 77);
    /* request_too_large: the prompt plus its frames cannot fit the context */
    codes[5] = 0;
    b.context = 40;
    b.frames = 30;
    memset(&e, 0, sizeof e);
    expect_reason(drama_engine_start(eng, &b, NULL, NULL, NULL, &h, &e), DRAMA_EINVAL, &e, "request_too_large", "context");
    /* a busy engine refuses with no_free_lane and changes nothing */
    b.context = 0;
    b.frames = 3;
    memset(&e, 0, sizeof e);
    assert_int_equal(drama_engine_start(eng, &b, NULL, NULL, NULL, &h, &e), DRAMA_OK);
    drama_lane h2 = 0;
    expect_reason(drama_engine_start(eng, &b, NULL, NULL, NULL, &h2, &e), DRAMA_EBUSY, &e, "no_free_lane", "lane");
    assert_int_equal(h2, 0);
    drama_engine_stats es;
    drama_engine_get_stats(eng, &es);
    assert_int_equal(es.lanes_busy, 1);
    drama_engine_free(eng); /* with a lane still running: dropped, nothing leaks */
    /* options */
    o.lanes = 0;
    memset(&e, 0, sizeof e);
    assert_int_equal(drama_engine_create(&eng, g_m, &o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "lanes"));
    assert_null(eng);
    /* copies of requests own their buffers */
    drama_request *copy = NULL;
    b.references = &ref;
    assert_int_equal(drama_request_copy(g_m, &b, &copy, &e), DRAMA_OK);
    codes[0] = 9;
    assert_int_equal(copy->references[0].codes[0], 0);
    assert_string_equal(copy->text, b.text);
    drama_request_free(copy);
    drama_request_free(NULL);
    drama_engine_free(NULL);
    free(codes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_text),
        cmocka_unit_test(test_encode_audio_bad),
        cmocka_unit_test(test_plan_and_start_bad),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
