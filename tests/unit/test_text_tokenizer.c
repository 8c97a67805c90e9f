/* test_text_tokenizer.c - the BPE tokenizer against the golden encodings of the real Qwen3
 * tokenizer (gzip) and the tiny Drama 3 tokenizer: ids exact, token strings, decoded text,
 * decode round trips, invalid UTF-8 offsets, the piece cache, and long pieces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/tokenizer.h"

/* Encode every golden item with the tokenizer loaded for `threads` (2+: the NFC table built on a
 * thread beside the parse); returns the number of mismatching items (printed). */
static int check_encodings_t(const char *tokenizer_rel, const char *golden_rel, int threads) {
    drama_error err = {0};
    dr_tok *tok = NULL;
    if (dr_tok_load_threads(tu_golden(tokenizer_rel), threads, &tok, &err) != DRAMA_OK) {
        printf("load failed: %s\n", err.message);
        return -1;
    }
    printf("%s: %lld vocab, %lld merges, %lld added, size %lld\n", tokenizer_rel, (long long)dr_tok_n_vocab(tok),
           (long long)dr_tok_n_merges(tok), (long long)dr_tok_n_added(tok), (long long)dr_tok_vocab_size(tok));
    json_error_t jerr;
    json_t *root = json_load_file(tu_golden(golden_rel), 0, &jerr);
    if (!root) {
        printf("golden %s: %s\n", golden_rel, jerr.text);
        dr_tok_free(tok);
        return -1;
    }
    json_t *items = json_object_get(root, "items");
    int bad = 0, total = 0;
    for (int pass = 0; pass < 2; pass++) { /* the second pass runs from the piece cache */
        for (size_t i = 0; i < json_array_size(items); i++) {
            json_t *it = json_array_get(items, i);
            const char *text = json_string_value(json_object_get(it, "text"));
            size_t text_len = json_string_length(json_object_get(it, "text"));
            json_t *want = json_object_get(it, "ids"), *tokens = json_object_get(it, "tokens");
            dr_ids ids = {0};
            int ok = dr_tok_encode(tok, text, text_len, &ids, &err) == DRAMA_OK;
            ok = ok && ids.n == (int64_t)json_array_size(want);
            for (int64_t k = 0; ok && k < ids.n; k++) {
                ok = ids.data[k] == json_integer_value(json_array_get(want, (size_t)k));
                const char *s = dr_tok_token(tok, ids.data[k]);
                ok = ok && s && strcmp(s, json_string_value(json_array_get(tokens, (size_t)k))) == 0;
            }
            char *decoded = NULL;
            size_t dlen = 0;
            ok = ok && dr_tok_decode(tok, ids.data, ids.n, &decoded, &dlen, &err) == DRAMA_OK;
            json_t *want_dec = json_object_get(it, "decoded");
            ok = ok && dlen == json_string_length(want_dec) && memcmp(decoded, json_string_value(want_dec), dlen) == 0;
            if (!ok) {
                printf("  MISMATCH item %zu %s: text %s -> got", i, err.message, text);
                for (int64_t k = 0; k < ids.n; k++) printf(" %d", ids.data[k]);
                printf("\n");
                bad++;
                dr_error_clear(&err);
            }
            total++;
            free(decoded);
            dr_ids_free(&ids);
        }
    }
    printf("%s: %d/%d items exact (ids, tokens, decoded; twice, second time cached)\n", golden_rel, total - bad, total);
    json_decref(root);
    dr_tok_free(tok);
    return total > 0 ? bad : -1;
}

static int check_encodings(const char *tokenizer_rel, const char *golden_rel) {
    return check_encodings_t(tokenizer_rel, golden_rel, 1);
}

/* The goldens again with the NFC table built on its own thread, and texts that NFC changes
 * (decomposed accents, a singleton) encode as their composed forms either way. */
static void nfc_table_on_a_thread(void **state) {
    (void)state;
    assert_int_equal(check_encodings_t("tokenizer/qwen3-tokenizer.json.gz", "tokenizer/qwen3-encodings.json", 2), 0);
    assert_int_equal(check_encodings_t("tiny-drama3/tokenizer.json", "tokenizer/tiny-encodings.json", 3), 0);
    const char *pairs[][2] = {{"Cafe\xcc\x81 au lait", "Caf\xc3\xa9 au lait"}, {"\xe2\x84\xab ngstr", "\xc3\x85 ngstr"}};
    for (int threads = 1; threads <= 2; threads++) {
        drama_error err = {0};
        dr_tok *tok = NULL;
        assert_int_equal(dr_tok_load_threads(tu_golden("tokenizer/qwen3-tokenizer.json.gz"), threads, &tok, &err), DRAMA_OK);
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
            dr_ids a = {0}, b = {0};
            assert_int_equal(dr_tok_encode(tok, pairs[i][0], strlen(pairs[i][0]), &a, &err), DRAMA_OK);
            assert_int_equal(dr_tok_encode(tok, pairs[i][1], strlen(pairs[i][1]), &b, &err), DRAMA_OK);
            assert_int_equal(a.n, b.n);
            for (int64_t k = 0; k < a.n; k++) assert_int_equal(a.data[k], b.data[k]);
            dr_ids_free(&a);
            dr_ids_free(&b);
        }
        dr_tok_free(tok);
    }
}

static void qwen3_golden(void **state) {
    (void)state;
    assert_int_equal(check_encodings("tokenizer/qwen3-tokenizer.json.gz", "tokenizer/qwen3-encodings.json"), 0);
}

static void tiny_golden(void **state) {
    (void)state;
    assert_int_equal(check_encodings("tiny-drama3/tokenizer.json", "tokenizer/tiny-encodings.json"), 0);
}

static dr_tok *load_tiny(void) {
    drama_error err = {0};
    dr_tok *tok = NULL;
    assert_int_equal(dr_tok_load(tu_golden("tiny-drama3/tokenizer.json"), &tok, &err), DRAMA_OK);
    return tok;
}

/* decode(encode(x)) == NFC(x) for texts without added tokens; NFC is the identity here. */
static void round_trip(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    const char *texts[] = {"Hello, world!  \n\n tabs\tand spaces   ", "Grüße aus Köln — “quoted” …",
                           "今天天气很好。こんにちは。안녕하세요", "emoji 👨‍👩‍👧‍👦 🇯🇵 ❤️", "<|im_start|>user\n<|speaker:3|>hi<|im_end|>",
                           "a\r\nb\r\n\r\n", "<|im_start|", "x\x01y\x7f"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        drama_error err = {0};
        dr_ids ids = {0};
        assert_int_equal(dr_tok_encode(tok, texts[i], strlen(texts[i]), &ids, &err), DRAMA_OK);
        char *back = NULL;
        assert_int_equal(dr_tok_decode(tok, ids.data, ids.n, &back, NULL, &err), DRAMA_OK);
        assert_string_equal(back, texts[i]);
        free(back);
        dr_ids_free(&ids);
    }
    dr_tok_free(tok);
}

static void special_ids_and_matching(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    assert_string_equal(dr_tok_pattern_kind(tok), "qwen2"); /* the golden files carry Qwen3's pattern */
    int32_t im_start = dr_tok_id(tok, "<|im_start|>"), sp15 = dr_tok_id(tok, "<|speaker:15|>");
    assert_true(im_start >= 0);
    assert_true(sp15 >= 0);
    assert_int_equal(dr_tok_id(tok, "<|speaker:16|>"), -1);
    const char *t = "ab<|speaker:15|>";
    int32_t id;
    size_t ml;
    assert_int_equal(dr_tok_match_added(tok, t, strlen(t), 2, &id, &ml), 1);
    assert_int_equal(id, sp15);
    assert_int_equal(ml, strlen("<|speaker:15|>"));
    assert_int_equal(dr_tok_match_added(tok, t, strlen(t), 1, &id, &ml), 0);
    dr_tok_free(tok);
}

static void invalid_utf8(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    const char *bad[] = {"ok\xff", "abc\xc3", "ab\xed\xa0\x80", "a\xc0\xaf", "abcd\xf4\x90\x80\x80"};
    const size_t offset[] = {2, 3, 2, 1, 4};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drama_error err = {0};
        dr_ids ids = {0};
        assert_int_not_equal(dr_tok_encode(tok, bad[i], strlen(bad[i]), &ids, &err), DRAMA_OK);
        char needle[64];
        snprintf(needle, sizeof needle, "byte offset %zu", offset[i]);
        printf("  %s\n", err.message);
        assert_non_null(strstr(err.message, needle));
        dr_ids_free(&ids);
    }
    /* decoding invalid byte sequences gives U+FFFD, never invalid UTF-8 */
    int32_t lone = dr_tok_id(tok, "\xc3\x83"); /* the mapped character of byte 0xC3 */
    assert_true(lone >= 0);
    char *text = NULL;
    assert_int_equal(dr_tok_decode(tok, &lone, 1, &text, NULL, NULL), DRAMA_OK);
    assert_string_equal(text, "\xEF\xBF\xBD");
    free(text);
    int32_t unknown = 1 << 23;
    drama_error err = {0};
    assert_int_not_equal(dr_tok_decode(tok, &unknown, 1, &text, NULL, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "ids[0]"));
    dr_tok_free(tok);
}

/* A 200 KB piece (one run of punctuation, one run of letters) must finish quickly and decode back. */
static void long_pieces(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    size_t n = 200000;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) text[i] = i < n / 2 ? "!?."[i % 3] : "abcab"[i % 5];
    text[n] = '\0';
    dr_ids ids = {0};
    drama_error err = {0};
    assert_int_equal(dr_tok_encode(tok, text, n, &ids, &err), DRAMA_OK);
    char *back = NULL;
    assert_int_equal(dr_tok_decode(tok, ids.data, ids.n, &back, NULL, &err), DRAMA_OK);
    assert_string_equal(back, text);
    printf("  200000 bytes -> %lld ids\n", (long long)ids.n);
    free(back);
    free(text);
    dr_ids_free(&ids);
    dr_tok_free(tok);
}

/* One tokenizer shared by threads (the piece cache has a lock): same ids as one thread. */
typedef struct job {
    dr_tok *tok;
    const char *text;
    size_t len;
    const dr_ids *want;
    int ok;
} job;

static void *encode_many(void *arg) {
    job *j = arg;
    j->ok = 1;
    for (int rep = 0; rep < 30; rep++) {
        if (rep % 10 == 0) dr_tok_clear_cache(j->tok);
        dr_ids ids = {0};
        if (dr_tok_encode(j->tok, j->text, j->len, &ids, NULL) != DRAMA_OK || ids.n != j->want->n ||
            memcmp(ids.data, j->want->data, (size_t)ids.n * sizeof(int32_t)) != 0)
            j->ok = 0;
        dr_ids_free(&ids);
    }
    return NULL;
}

static void threads_share_tokenizer(void **state) {
    (void)state;
    dr_tok *tok = load_tiny();
    const char *text = "Hello, world! 今天天气很好。 <|speaker:1|>Again and again, again. Привет, мир! 😀😂 1234 x\n\n  y";
    size_t len = strlen(text);
    dr_ids want = {0};
    assert_int_equal(dr_tok_encode(tok, text, len, &want, NULL), DRAMA_OK);
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){tok, text, len, &want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    dr_ids_free(&want);
    dr_tok_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3_golden),  cmocka_unit_test(tiny_golden),
        cmocka_unit_test(round_trip),    cmocka_unit_test(special_ids_and_matching),
        cmocka_unit_test(invalid_utf8),  cmocka_unit_test(long_pieces),
        cmocka_unit_test(threads_share_tokenizer), cmocka_unit_test(nfc_table_on_a_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
