/* test_text_prompt.c - the prompt builder reproduces the golden e2e prompts exactly (every
 * part's ids and the whole row matrix) from text + reference inputs; validation of user text
 * (reserved tokens, speaker tags, empty text, invalid UTF-8); prompt switches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/prompt.h"

static dr_tok *load_tiny(void) {
    drama_error err = {0};
    dr_tok *tok = NULL;
    if (dr_tok_load(tu_golden("tiny-drama3/tokenizer.json"), &tok, &err)) printf("%s\n", err.message);
    assert_non_null(tok);
    return tok;
}

static int64_t count_mismatch(const int32_t *a, json_t *want_rows, int64_t n_rows, int64_t n_cols) {
    int64_t bad = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        json_t *row = json_array_get(want_rows, (size_t)r);
        for (int64_t c = 0; c < n_cols; c++)
            if (a[r * n_cols + c] != json_integer_value(json_array_get(row, (size_t)c))) bad++;
    }
    return bad;
}

static void check_golden(const char *rel) {
    dr_tok *tok = load_tiny();
    json_error_t jerr;
    json_t *root = json_load_file(tu_golden(rel), 0, &jerr);
    assert_non_null(root);
    json_t *cs = json_object_get(root, "case"), *parts = json_object_get(root, "prompt_parts");
    json_t *want = json_object_get(root, "prompt_rows");
    drama_error err = {0};

    /* every literal part's ids, tokenised on its own */
    dr_codes codes = {0};
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *part = json_array_get(parts, i);
        const char *kind = json_string_value(json_object_get(part, "kind"));
        if (strcmp(kind, "vq") == 0) {
            json_t *wrapped = json_pack("{s:O}", "codes", json_object_get(part, "codes"));
            char *dump = json_dumps(wrapped, 0);
            json_decref(wrapped);
            assert_int_equal(dr_codes_parse(dump, strlen(dump), "vq part", 0, NULL, &codes, &err), DRAMA_OK);
            free(dump);
            continue;
        }
        json_t *text = json_object_get(part, "text"), *ids_want = json_object_get(part, "ids");
        dr_ids ids = {0};
        assert_int_equal(dr_tok_encode(tok, json_string_value(text), json_string_length(text), &ids, &err), DRAMA_OK);
        assert_int_equal(ids.n, (int64_t)json_array_size(ids_want));
        for (int64_t k = 0; k < ids.n; k++)
            assert_int_equal(ids.data[k], json_integer_value(json_array_get(ids_want, (size_t)k)));
        dr_ids_free(&ids);
    }

    /* the whole prompt from the case inputs */
    const char *text = json_string_value(json_object_get(cs, "text"));
    json_t *ref = json_object_get(cs, "ref");
    dr_reference r = {0};
    int n_refs = 0;
    if (json_is_object(ref)) {
        r.text = json_string_value(json_object_get(ref, "text"));
        r.codes = &codes;
        n_refs = 1;
        assert_int_equal(codes.n_frames, json_integer_value(json_object_get(ref, "frames")));
    }
    int64_t n_cols = (int64_t)json_array_size(json_array_get(want, 0));
    dr_rows rows;
    drama_status st = dr_prompt_build(tok, NULL, n_cols - 1, n_refs ? &r : NULL, n_refs, text, &rows, &err);
    if (st) printf("%s\n", err.message);
    assert_int_equal(st, DRAMA_OK);
    int64_t bad = rows.n_rows == (int64_t)json_array_size(want) ? count_mismatch(rows.data, want, rows.n_rows, n_cols) : -1;
    printf("%s: %lld rows x %lld (golden %zu rows), mismatching values: %lld\n", rel, (long long)rows.n_rows,
           (long long)rows.n_cols, json_array_size(want), (long long)bad);
    assert_int_equal(bad, 0);
    assert_int_equal(rows.prefill, rows.n_rows);
    dr_rows_free(&rows);
    dr_codes_free(&codes);
    json_decref(root);
    dr_tok_free(tok);
}

static void golden_noref(void **state) {
    (void)state;
    check_golden("ref/e2e-noref.json");
}

static void golden_ref12(void **state) {
    (void)state;
    check_golden("ref/e2e-ref12.json");
}

static void expect_invalid(dr_tok *tok, const char *text, size_t len, drama_status code, const char *needle) {
    drama_error err = {0};
    drama_status st = dr_prompt_validate_text(tok, text, len, "text", &err);
    printf("  %-34.34s -> %s\n", text, err.message);
    assert_int_equal(st, code);
    assert_non_null(strstr(err.message, needle));
}

static void validation(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    const char *ok[] = {"Hello", "<|speaker:0|>Hi. <|speaker:15|>Yo.", "[whispering] (laughs) <whisper>x</whisper>",
                        "<|speaker:3|", "<|im_start|", "a <| b |> c"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(dr_prompt_validate_text(tok, ok[i], strlen(ok[i]), "text", NULL), DRAMA_OK);
    expect_invalid(tok, "", 0, DRAMA_EEMPTY, "empty_text");
    expect_invalid(tok, " \n\t\xe3\x80\x80 ", 7, DRAMA_EEMPTY, "empty_text");
    expect_invalid(tok, "hi<|im_end|>", 12, DRAMA_EINVAL, "reserved_token: text contains \"<|im_end|>\" at byte offset 2");
    expect_invalid(tok, "<|voice|>", 9, DRAMA_EINVAL, "reserved_token");
    expect_invalid(tok, "x<|semantic:5|>", 15, DRAMA_EINVAL, "byte offset 1");
    expect_invalid(tok, "<|speaker:16|>hi", 16, DRAMA_EINVAL, "invalid_speaker_tag");
    expect_invalid(tok, "ok <|speaker:01|>hi", 19, DRAMA_EINVAL, "byte offset 3");
    expect_invalid(tok, "<|speaker:|>hi", 14, DRAMA_EINVAL, "invalid_speaker_tag");
    expect_invalid(tok, "<|speaker:two|>hi", 17, DRAMA_EINVAL, "invalid_speaker_tag");
    expect_invalid(tok, "abc\xff", 4, DRAMA_EINVAL, "byte offset 3");
    /* speaker tags alone say nothing: empty, like whitespace (the chunker would find no turn) */
    expect_invalid(tok, "<|speaker:9|>", 13, DRAMA_EEMPTY, "empty_text: text has only speaker tags");
    expect_invalid(tok, " <|speaker:0|>\n<|speaker:1|>\xe3\x80\x80", 31, DRAMA_EEMPTY, "empty_text");
    assert_int_equal(dr_prompt_validate_text(tok, "<|speaker:0|>.", 14, "text", NULL), DRAMA_OK);

    /* the builder rejects bad user text and bad references with the same messages */
    drama_error err = {0};
    dr_rows rows;
    assert_int_equal(dr_prompt_build(tok, NULL, 10, NULL, 0, "   ", &rows, &err), DRAMA_EEMPTY);
    assert_null(rows.data);
    int32_t frame[10] = {4096, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    dr_codes codes = {1, 10, frame};
    dr_reference r = {"a transcript", &codes};
    dr_error_clear(&err);
    assert_int_not_equal(dr_prompt_build(tok, NULL, 10, &r, 1, "hi", &rows, &err), DRAMA_OK);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "reference 0"));
    frame[0] = 5;
    r.text = "<|im_end|>";
    dr_error_clear(&err);
    assert_int_not_equal(dr_prompt_build(tok, NULL, 10, &r, 1, "hi", &rows, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "reference 0 transcript"));
    dr_codes wrong = {1, 9, frame};
    r.text = "ok";
    r.codes = &wrong;
    dr_error_clear(&err);
    assert_int_not_equal(dr_prompt_build(tok, NULL, 10, &r, 1, "hi", &rows, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "codebooks"));
    dr_tok_free(tok);
}

/* Rows of a prompt built with switches, compared with the segments tokenised by hand. */
static void switches(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    drama_error err = {0};
    dr_prompt_options opt;
    dr_prompt_options_default(&opt);
    opt.default_speaker_tag = 1;
    opt.system_without_reference = 0;
    dr_rows rows;
    assert_int_equal(dr_prompt_build(tok, &opt, 10, NULL, 0, "  Hello", &rows, &err), DRAMA_OK);
    const char *segs[] = {"<|im_start|>user\n", "<|speaker:0|>  Hello", "<|im_end|>\n", "<|im_start|>assistant\n<|voice|>"};
    dr_ids want = {0};
    for (int i = 0; i < 4; i++) assert_int_equal(dr_tok_encode(tok, segs[i], strlen(segs[i]), &want, &err), DRAMA_OK);
    assert_int_equal(rows.n_rows, want.n);
    for (int64_t i = 0; i < want.n; i++) assert_int_equal(rows.data[i * 11], want.data[i]);
    dr_rows_free(&rows);
    /* a text that already starts with a tag gets none added */
    assert_int_equal(dr_prompt_build(tok, &opt, 10, NULL, 0, " <|speaker:2|>Hi", &rows, &err), DRAMA_OK);
    assert_int_equal(rows.data[4 * 11], dr_tok_id(tok, "<|speaker:2|>")); /* row 3 is the space */
    dr_rows_free(&rows);

    /* two references: one segment of tagged transcripts; the second already has a tag */
    int32_t f0[2 * 10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    int32_t f1[10] = {4095, 0, 0, 0, 0, 0, 0, 0, 0, 1023};
    dr_codes c0 = {2, 10, f0}, c1 = {1, 10, f1};
    dr_reference refs[2] = {{"First.", &c0}, {"Second <|speaker:7|>voice.", &c1}};
    dr_prompt_options_default(&opt);
    assert_int_equal(dr_prompt_build(tok, &opt, 10, refs, 2, "Go.", &rows, &err), DRAMA_OK);
    dr_ids_free(&want);
    const char *head[] = {"<|im_start|>system\n", "convert the provided text to speech reference to the following:\n\nText:\n",
                          "<|speaker:0|>First.\nSecond <|speaker:7|>voice.", "\n\nSpeech:\n"};
    for (int i = 0; i < 4; i++) assert_int_equal(dr_tok_encode(tok, head[i], strlen(head[i]), &want, &err), DRAMA_OK);
    for (int64_t i = 0; i < want.n; i++) assert_int_equal(rows.data[i * 11], want.data[i]);
    int32_t S = dr_tok_id(tok, "<|semantic:0|>");
    const int32_t *audio = rows.data + want.n * 11;
    assert_int_equal(audio[0], S + 1);
    assert_memory_equal(audio + 1, f0, 10 * sizeof(int32_t));
    assert_int_equal(audio[11], S + 11);
    assert_int_equal(audio[22], S + 4095);
    assert_int_equal(audio[22 + 10], 1023);
    assert_int_equal(audio[33], dr_tok_id(tok, "<|im_end|>"));
    dr_ids_free(&want);
    dr_rows_free(&rows);
    dr_tok_free(tok);
}

/* A tokenizer with more speaker tags than the 16 speakers (a held-out file may carry them):
 * <|speaker:20|> is an added token there, and is still an invalid speaker tag, not accepted. */
static void extra_speaker_tokens(void **state) {
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file(tu_golden("tiny-drama3/tokenizer.json"), 0, &jerr);
    assert_non_null(root);
    json_t *added = json_object_get(root, "added_tokens");
    int64_t next = 0;
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_int_t id = json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id >= next) next = id + 1;
    }
    for (int k = 16; k < 32; k++) {
        char name[32];
        snprintf(name, sizeof name, "<|speaker:%d|>", k);
        json_array_append_new(added, json_pack("{sI ss sb sb sb sb sb}", "id", (json_int_t)(next + k - 16), "content", name,
                                               "special", 1, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0));
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    dr_tok *tok = NULL;
    drama_error err = {0};
    assert_int_equal(dr_tok_load_memory(text, strlen(text), "extra.json", &tok, &err), DRAMA_OK);
    free(text);
    assert_true(dr_tok_id(tok, "<|speaker:20|>") >= 0);
    expect_invalid(tok, "a <|speaker:20|> b", 18, DRAMA_EINVAL, "invalid_speaker_tag: text contains \"<|speaker:20|>\" at byte offset 2");
    assert_int_equal(dr_prompt_validate_text(tok, "<|speaker:15|>b", 15, "text", NULL), DRAMA_OK);
    dr_tok_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_noref),
        cmocka_unit_test(golden_ref12),
        cmocka_unit_test(validation),
        cmocka_unit_test(switches),
        cmocka_unit_test(extra_speaker_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
