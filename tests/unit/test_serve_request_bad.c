/* test_serve_request_bad.c - request bodies (API.md 1, 3.1, 4, 5, 7): strict JSON and msgpack,
 * every field rule with its status, code and param; base64 and voice ids. Runs under valgrind. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/request.h"
#include "serve/value.h"

static const dr_parse_limits k_lim = {750, 0, 0, 5, dr_default_model_ids, NULL, NULL};
static const dr_parse_limits k_lim_gamma = {750, 0, 1, 2, dr_default_model_ids, NULL, NULL};

/* Parses a JSON /v1/tts or /v1/audio/speech body; expects `status` (0 = success) with code and param. */
static void expect(int openai, const dr_parse_limits *lim, const char *json, int status, const char *code,
                   const char *param) {
    dr_api_error e = {0};
    dr_val *v = dr_val_parse_json(json, strlen(json), &e);
    dr_synth_req r;
    if (v) {
        if (openai) dr_parse_speech(v, lim, &r, &e);
        else dr_parse_tts(v, lim, &r, &e);
        dr_synth_req_free(&r);
    }
    dr_val_free(v);
    if (e.status != status || (code && strcmp(e.code, code)) || (param && strcmp(e.param, param)))
        fail_msg("%s\n  expected %d %s param=%s, got %d %s param=%s (%s)", json, status, code ? code : "-",
                 param ? param : "-", e.status, e.code, e.param, e.message);
}

#define TTS(json, st, code, param) expect(0, &k_lim, json, st, code, param)
#define SPEECH(json, st, code, param) expect(1, &k_lim, json, st, code, param)

static void test_json_strict(void **st) {
    TTS("{\"text\": \"a\", \"text\": \"b\"}", 400, "invalid_json", "");
    TTS("{\"text\": \"a\", \"temperature\": NaN}", 400, "invalid_json", "");
    TTS("{\"text\": \"a\", \"temperature\": Infinity}", 400, "invalid_json", "");
    TTS("{\"text\": \"a\"", 400, "invalid_json", "");
    TTS("", 400, "invalid_json", "");
    TTS("[1]", 400, "wrong_type", "");
    TTS("{\"text\": \"\\u0000\"}", 400, "invalid_json", "");
    /* nesting: 32 levels parse (the object and 31 arrays; unknown field ignored), 33 do not */
    char deep[200] = "{\"text\":\"a\",\"x\":", deeper[200];
    for (int k = 0; k < 31; k++) strcat(deep, "[");
    for (int k = 0; k < 31; k++) strcat(deep, "]");
    strcat(deep, "}");
    TTS(deep, 0, NULL, NULL);
    snprintf(deeper, sizeof deeper, "%s", deep);
    char *p = strstr(deeper, "[");
    memmove(p + 1, p, strlen(p) + 1);
    p = strrchr(deeper, ']');
    memmove(p + 1, p, strlen(p) + 1);
    TTS(deeper, 400, "invalid_json", "");
}

static void test_tts_fields(void **st) {
    TTS("{\"text\": \"hello\"}", 0, NULL, NULL);
    TTS("{}", 400, "missing_field", "text");
    TTS("{\"text\": null}", 400, "missing_field", "text");
    TTS("{\"text\": 5}", 400, "wrong_type", "text");
    TTS("{\"text\": \"a\", \"format\": \"flac\"}", 400, "unsupported_format", "format");
    TTS("{\"text\": \"a\", \"format\": 3}", 400, "wrong_type", "format");
    TTS("{\"text\": \"a\", \"streaming\": \"yes\"}", 400, "wrong_type", "streaming");
    TTS("{\"text\": \"a\", \"chunk_length\": 99}", 400, "out_of_range", "chunk_length");
    TTS("{\"text\": \"a\", \"chunk_length\": 1001}", 400, "out_of_range", "chunk_length");
    TTS("{\"text\": \"a\", \"chunk_length\": 200.0}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"chunk_length\": 200.5}", 400, "wrong_type", "chunk_length");
    TTS("{\"text\": \"a\", \"chunk_length\": \"200\"}", 400, "wrong_type", "chunk_length");
    TTS("{\"text\": \"a\", \"temperature\": 2.5}", 400, "out_of_range", "temperature");
    TTS("{\"text\": \"a\", \"temperature\": -0.1}", 400, "out_of_range", "temperature");
    TTS("{\"text\": \"a\", \"temperature\": 0}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"top_p\": 0}", 400, "out_of_range", "top_p");
    TTS("{\"text\": \"a\", \"top_p\": 1}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"top_p\": 1.01}", 400, "out_of_range", "top_p");
    TTS("{\"text\": \"a\", \"repetition_penalty\": 0.8}", 400, "out_of_range", "repetition_penalty");
    TTS("{\"text\": \"a\", \"max_new_tokens\": -1}", 400, "out_of_range", "max_new_tokens");
    TTS("{\"text\": \"a\", \"normalize\": 1}", 400, "wrong_type", "normalize");
    TTS("{\"text\": \"a\", \"latency\": \"fast\"}", 400, "unsupported_value", "latency");
    TTS("{\"text\": \"a\", \"use_memory_cache\": \"maybe\"}", 400, "unsupported_value", "use_memory_cache");
    TTS("{\"text\": \"a\", \"frames\": 0}", 400, "out_of_range", "frames");
    TTS("{\"text\": \"a\", \"frames\": 751}", 400, "out_of_range", "frames");
    TTS("{\"text\": \"a\", \"frames\": null}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"seed\": -5}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"seed\": 1.5}", 400, "wrong_type", "seed");
    TTS("{\"text\": \"a\", \"seed\": \"1\"}", 400, "wrong_type", "seed");
    TTS("{\"text\": \"a\", \"unknown_field\": {\"x\": [1, 2]}}", 0, NULL, NULL);
}

static void test_tts_references(void **st) {
    TTS("{\"text\": \"a\", \"references\": {}}", 400, "wrong_type", "references");
    TTS("{\"text\": \"a\", \"references\": [5]}", 400, "wrong_type", "references[0]");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": \"AAAA\", \"text\": \"t\"}, {\"text\": \"t\"}]}", 400,
        "missing_field", "references[1].audio");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": \"AAAA\"}]}", 400, "missing_field", "references[0].text");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": \"!!!!\", \"text\": \"t\"}]}", 400, "bad_audio",
        "references[0].audio");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": \"\", \"text\": \"t\"}]}", 400, "bad_audio", "references[0].audio");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": 7, \"text\": \"t\"}]}", 400, "wrong_type", "references[0].audio");
    TTS("{\"text\": \"a\", \"references\": [{\"audio\": \"AAAA\", \"text\": \"t\"}]}", 0, NULL, NULL);
    char many[4096] = "{\"text\": \"a\", \"references\": [";
    for (int k = 0; k < 17; k++) strcat(many, k ? ",{\"audio\":\"AAAA\",\"text\":\"t\"}" : "{\"audio\":\"AAAA\",\"text\":\"t\"}");
    strcat(many, "]}");
    TTS(many, 400, "out_of_range", "references");
    TTS("{\"text\": \"a\", \"reference_id\": \"alice\"}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"reference_id\": [\"alice\", \"bob\"]}", 0, NULL, NULL);
    TTS("{\"text\": \"a\", \"reference_id\": [\"alice\", 3]}", 400, "wrong_type", "reference_id[1]");
    TTS("{\"text\": \"a\", \"reference_id\": [\"alice\", \"../x\"]}", 400, "invalid_voice_id", "reference_id[1]");
    TTS("{\"text\": \"a\", \"reference_id\": \"default\"}", 400, "invalid_voice_id", "reference_id");
    TTS("{\"text\": \"a\", \"reference_id\": 5}", 400, "wrong_type", "reference_id");
    TTS("{\"text\": \"a\", \"reference_id\": \"alice\", \"references\": [{\"audio\": \"AAAA\", \"text\": \"t\"}]}", 400,
        "unsupported_value", "reference_id");
    TTS("{\"text\": \"a\", \"reference_id\": \"alice\", \"references\": []}", 0, NULL, NULL);
}

static void test_guidance(void **st) {
    TTS("{\"text\": \"a\", \"cfg_gamma\": 1}", 400, "guidance_not_allowed", "cfg_gamma");
    TTS("{\"text\": \"a\", \"cfg_gamma\": null}", 0, NULL, NULL);
    expect(0, &k_lim_gamma, "{\"text\": \"a\", \"cfg_gamma\": 1}", 400, "guidance_not_allowed", "cfg_gamma");
    expect(0, &k_lim_gamma, "{\"text\": \"a\", \"cfg_gamma\": 0}", 0, NULL, NULL);
    expect(0, &k_lim_gamma, "{\"text\": \"a\", \"reference_id\": \"v\", \"cfg_gamma\": 1.5}", 0, NULL, NULL);
    expect(0, &k_lim_gamma, "{\"text\": \"a\", \"reference_id\": \"v\", \"cfg_gamma\": 2.5}", 400, "out_of_range", "cfg_gamma");
    expect(1, &k_lim_gamma, "{\"input\": \"a\", \"voice\": \"default\", \"cfg_gamma\": 1}", 400, "guidance_not_allowed",
           "cfg_gamma");
    expect(1, &k_lim_gamma, "{\"input\": \"a\", \"voice\": \"v1\", \"cfg_gamma\": 1}", 0, NULL, NULL);
}

static void test_speech_fields(void **st) {
    SPEECH("{\"input\": \"a\", \"voice\": \"default\"}", 0, NULL, NULL);
    SPEECH("{\"model\": \"tts-1\", \"input\": \"a\", \"voice\": \"default\"}", 0, NULL, NULL);
    SPEECH("{\"model\": \"whisper\", \"input\": \"a\", \"voice\": \"default\"}", 400, "unknown_model", "model");
    SPEECH("{\"voice\": \"default\"}", 400, "missing_field", "input");
    SPEECH("{\"input\": \"a\"}", 400, "missing_field", "voice");
    SPEECH("{\"input\": \"a\", \"voice\": \"alloy!\"}", 400, "invalid_voice_id", "voice");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"response_format\": \"aac\"}", 400, "unsupported_format",
           "response_format");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"response_format\": \"flac\"}", 400, "unsupported_format",
           "response_format");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"speed\": 1.5}", 400, "unsupported_value", "speed");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"speed\": 5}", 400, "out_of_range", "speed");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"speed\": 1}", 0, NULL, NULL);
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"stream_format\": \"ws\"}", 400, "unsupported_value",
           "stream_format");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"instructions\": 5}", 400, "wrong_type", "instructions");
    SPEECH("{\"input\": \"a\", \"voice\": \"default\", \"temperature\": 3}", 400, "out_of_range", "temperature");
    /* aliases map OpenAI voice names to stored ids */
    const char *names[] = {"alloy", NULL}, *ids[] = {"v1", NULL};
    dr_parse_limits lim = k_lim;
    lim.voice_alias_names = names;
    lim.voice_alias_ids = ids;
    dr_api_error e = {0};
    const char *json = "{\"input\": \"a\", \"voice\": \"alloy\"}";
    dr_val *v = dr_val_parse_json(json, strlen(json), &e);
    dr_synth_req r;
    assert_int_equal(dr_parse_speech(v, &lim, &r, &e), 0);
    assert_int_equal(r.n_voice_ids, 1);
    assert_string_equal(r.voice_ids[0], "v1");
    assert_int_equal(r.format, DR_AF_MP3);
    assert_int_equal(r.streaming, 1);
    dr_synth_req_free(&r);
    dr_val_free(v);
}

/* msgpack built by hand: {"text": "hi", "references": [{"audio": bin(4), "text": "t"}], "temperature": NaN} */
static void test_msgpack(void **st) {
    const uint8_t good[] = {0x83, 0xa4, 't', 'e', 'x', 't', 0xa2, 'h', 'i', 0xaa, 'r', 'e', 'f', 'e', 'r', 'e', 'n', 'c',
                            'e', 's', 0x91, 0x82, 0xa5, 'a', 'u', 'd', 'i', 'o', 0xc4, 0x04, 1, 2, 3, 4, 0xa4, 't', 'e', 'x',
                            't', 0xa1, 't', 0xa4, 's', 'e', 'e', 'd', 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    dr_api_error e = {0};
    dr_val *v = dr_val_parse_msgpack(good, sizeof good, &e);
    assert_non_null(v);
    dr_synth_req r;
    assert_int_equal(dr_parse_tts(v, &k_lim, &r, &e), 0);
    assert_int_equal(r.n_refs, 1);
    assert_int_equal(r.refs[0].audio_len, 4);
    assert_int_equal(r.refs[0].audio[3], 4);
    assert_true(r.seed_set);
    assert_true(r.seed == UINT64_MAX); /* uint64 seeds keep every bit */
    dr_synth_req_free(&r);
    dr_val_free(v);

    const uint8_t nan[] = {0x82, 0xa4, 't', 'e', 'x', 't', 0xa1, 'a', 0xab, 't', 'e', 'm', 'p', 'e', 'r', 'a', 't', 'u', 'r',
                           'e', 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0};
    memset(&e, 0, sizeof e);
    v = dr_val_parse_msgpack(nan, sizeof nan, &e);
    assert_non_null(v);
    assert_int_equal(dr_parse_tts(v, &k_lim, &r, &e), 400);
    assert_string_equal(e.code, "invalid_number");
    assert_string_equal(e.param, "temperature");
    dr_synth_req_free(&r);
    dr_val_free(v);

    struct {
        const uint8_t *b;
        size_t n;
    } bad[] = {
        {(const uint8_t[]){0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02}, 7},       /* duplicate key */
        {(const uint8_t[]){0xdd, 0xff, 0xff, 0xff, 0xff}, 5},                 /* array of 4 G entries, no bytes */
        {(const uint8_t[]){0xdf, 0x7f, 0xff, 0xff, 0xff, 0xc0}, 6},           /* map claims 2 G pairs */
        {(const uint8_t[]){0x81, 0x01, 0x02}, 3},                             /* integer key */
        {(const uint8_t[]){0x80, 0x00}, 2},                                   /* trailing byte */
        {(const uint8_t[]){0xd4, 0x01, 0x00}, 3},                             /* ext type */
        {(const uint8_t[]){0xc1}, 1},                                         /* never-used byte */
        {(const uint8_t[]){0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, 6},            /* str longer than the body */
        {(const uint8_t[]){0}, 0},                                            /* empty */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memset(&e, 0, sizeof e);
        v = dr_val_parse_msgpack(bad[k].b, bad[k].n, &e);
        if (v || e.status != 400 || strcmp(e.code, "invalid_msgpack")) fail_msg("bad msgpack %zu: %d %s", k, e.status, e.code);
    }
    /* 33 nested arrays are refused, 32 accepted */
    uint8_t nest[40];
    for (int depth = 32; depth <= 33; depth++) {
        memset(nest, 0x91, (size_t)depth);
        nest[depth - 1] = 0x90;
        memset(&e, 0, sizeof e);
        v = dr_val_parse_msgpack(nest, (size_t)depth, &e);
        assert_true(depth == 32 ? v != NULL : v == NULL);
        dr_val_free(v);
    }
}

static void test_voice_upload(void **st) {
    const char *cases[][3] = {
        {"{\"id\": \"alice\", \"text\": \"hi\", \"audio\": \"UklGRg==\"}", "", ""},
        {"{\"text\": \"hi\", \"audio\": \"UklGRg==\"}", "missing_field", "id"},
        {"{\"id\": \"../etc\", \"text\": \"hi\", \"audio\": \"UklGRg==\"}", "invalid_voice_id", "id"},
        {"{\"id\": \"default\", \"text\": \"hi\", \"audio\": \"UklGRg==\"}", "invalid_voice_id", "id"},
        {"{\"id\": \"alice\", \"audio\": \"UklGRg==\"}", "missing_field", "text"},
        {"{\"id\": \"alice\", \"text\": \"hi\"}", "missing_field", "audio"},
        {"{\"id\": \"alice\", \"text\": \"hi\", \"audio\": \"U\"}", "bad_audio", "audio"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dr_api_error e = {0};
        dr_val *v = dr_val_parse_json(cases[k][0], strlen(cases[k][0]), &e);
        dr_voice_upload up;
        dr_parse_voice_upload(v, &up, &e);
        if (strcmp(e.code, cases[k][1]) || strcmp(e.param, cases[k][2]))
            fail_msg("%s: got %s %s", cases[k][0], e.code, e.param);
        if (!e.status) {
            assert_int_equal(up.audio_len, 4);
            assert_memory_equal(up.audio, "RIFF", 4);
        }
        free(up.audio);
        dr_val_free(v);
    }
}

static void test_ids_base64(void **st) {
    assert_true(dr_voice_id_valid("a", 1));
    assert_true(dr_voice_id_valid("A-b_9", 5));
    assert_false(dr_voice_id_valid("", 0));
    assert_false(dr_voice_id_valid("-a", 2));
    assert_false(dr_voice_id_valid("_a", 2));
    assert_false(dr_voice_id_valid("a.b", 3));
    assert_false(dr_voice_id_valid("a/b", 3));
    assert_false(dr_voice_id_valid("..", 2));
    assert_false(dr_voice_id_valid("default", 7));
    assert_true(dr_voice_id_valid("Default", 7)); /* case-sensitive */
    char id[66];
    memset(id, 'a', 65);
    assert_true(dr_voice_id_valid(id, 64));
    assert_false(dr_voice_id_valid(id, 65));
    assert_false(dr_voice_id_valid("a\0b", 3));

    uint8_t *out;
    size_t n;
    assert_int_equal(dr_base64_decode("aGVsbG8=", 8, &out, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(out, "hello", 5);
    free(out);
    assert_int_equal(dr_base64_decode("aGVsbG8", 7, &out, &n), 0); /* padding optional */
    assert_int_equal(n, 5);
    free(out);
    assert_int_equal(dr_base64_decode("aGVs\nbG8=", 9, &out, &n), 0);
    assert_int_equal(n, 5);
    free(out);
    assert_int_equal(dr_base64_decode("aGVsb", 5, &out, &n), -1);
    assert_int_equal(dr_base64_decode("aG=sbG8=", 8, &out, &n), -1);
    assert_int_equal(dr_base64_decode("aGVs*G8=", 8, &out, &n), -1);
    char *enc = dr_base64_encode("hello", 5);
    assert_string_equal(enc, "aGVsbG8=");
    free(enc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_strict),   cmocka_unit_test(test_tts_fields),   cmocka_unit_test(test_tts_references),
        cmocka_unit_test(test_guidance),      cmocka_unit_test(test_speech_fields), cmocka_unit_test(test_msgpack),
        cmocka_unit_test(test_voice_upload),  cmocka_unit_test(test_ids_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
