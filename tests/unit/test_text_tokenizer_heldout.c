/* test_text_tokenizer_heldout.c - tokenizer.json files other than the golden ones (held-out
 * tokenizers carry other merges, added tokens and options). A small byte-level BPE is built in
 * memory with every accepted option of TEXT.md 1.1 varied, and each encoding is worked out by
 * hand from the rules of TEXT.md 1.2 (the reference library's behaviour):
 *   merges as "a b" strings or ["a", "b"] pairs, rank = position; ignore_merges;
 *   added tokens: leftmost-longest, lstrip/rstrip absorbing whitespace (not across an earlier
 *   match), single_word, contents with raw spaces (decoded as they are);
 *   normalizer null / NFC / Sequence; the Qwen3.5 split pattern ([\p{L}\p{M}]+) vs Qwen2's;
 *   non-contiguous ids (an unused id fails to decode, naming its index). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static const char QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                            "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                             "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The byte-level character of byte b (TEXT.md 1.2 step 5), as UTF-8. */
static void byte_char(int b, char out[3]) {
    int cp = b, next = 0x100;
    int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!keep) {
        for (int k = 0; k < b; k++)
            if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) next++;
        cp = next;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

enum { ID_HE = 256, ID_LL, ID_HELL, ID_HELLO, ID_E_ACUTE_LEAD, ID_EL, ID_X = 300, ID_Y, ID_CAT, ID_YY, ID_HI_THERE };

typedef struct variant {
    const char *pattern;
    const char *normalizer; /* NULL, "NFC" or "Sequence" (of one NFC) */
    int ignore_merges;
    int pair_merges;        /* merges as ["a", "b"] instead of "a b" */
    int el_first;           /* the merge e+l gets rank 0 instead of the last rank */
} variant;

/* Vocabulary: byte b has id b; then he, ll, hell, hello, e+"Ì" (the lead byte of U+0301), el.
 * Ids 262..299 are unused. Added tokens 300..304. */
static dr_tok *make_tok(const variant *v) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    static const char *extra[] = {"he", "ll", "hell", "hello", "e\xC3\x8C", "el"};
    for (int i = 0; i < 6; i++) json_object_set_new(vocab, extra[i], json_integer(ID_HE + i));
    static const char *merge_pairs[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"e", "\xC3\x8C"}, {"e", "l"}};
    int order[5] = {0, 1, 2, 3, 4};
    if (v->el_first) order[0] = 4, order[1] = 0, order[2] = 1, order[3] = 2, order[4] = 3;
    json_t *merges = json_array();
    for (int i = 0; i < 5; i++) {
        const char **m = merge_pairs[order[i]];
        if (v->pair_merges) {
            json_array_append_new(merges, json_pack("[ss]", m[0], m[1]));
        } else {
            char s[32];
            snprintf(s, sizeof s, "%s %s", m[0], m[1]);
            json_array_append_new(merges, json_string(s));
        }
    }
    json_t *added = json_array();
    json_array_append_new(added, json_pack("{si ss sb sb sb sb sb}", "id", ID_X, "content", "<x>", "single_word", 0,
                                           "lstrip", 1, "rstrip", 1, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{si ss sb sb sb sb sb}", "id", ID_Y, "content", "<y>", "single_word", 0,
                                           "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{si ss sb sb sb sb sb}", "id", ID_CAT, "content", "cat", "single_word", 1,
                                           "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
    json_array_append_new(added, json_pack("{si ss sb sb sb sb sb}", "id", ID_YY, "content", "<y>>", "single_word", 0,
                                           "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{si ss sb sb sb sb sb}", "id", ID_HI_THERE, "content", "hi there",
                                           "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
    json_t *norm = json_null();
    if (v->normalizer && !strcmp(v->normalizer, "NFC")) norm = json_pack("{ss}", "type", "NFC");
    if (v->normalizer && !strcmp(v->normalizer, "Sequence"))
        norm = json_pack("{ss s[{ss}]}", "type", "Sequence", "normalizers", "type", "NFC");
    json_t *root = json_pack(
        "{ss s{ss so so sb sn sn sn sb sb} so so s{ss s[{ss s{ss} ss sb} {ss sb sb sb}]} s{ss sb sb sb} sn}", "version",
        "1.0", "model", "type", "BPE", "vocab", vocab, "merges", merges, "ignore_merges", v->ignore_merges,
        "dropout", "unk_token", "continuing_subword_prefix", "fuse_unk", 0, "byte_fallback", 0, "added_tokens", added,
        "normalizer", norm, "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        v->pattern, "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
        "use_regex", 0, "decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0,
        "post_processor");
    assert_non_null(root);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    dr_tok *tok = NULL;
    drama_error err = {0};
    drama_status st = dr_tok_load_memory(text, strlen(text), "heldout.json", &tok, &err);
    if (st) printf("load failed: %s\n", err.message);
    free(text);
    assert_int_equal(st, DRAMA_OK);
    return tok;
}

/* Encode and compare with the ids worked out by hand; print both on a mismatch. */
static void expect_ids(dr_tok *tok, const char *text, const int32_t *want, int64_t n) {
    dr_ids ids = {0};
    drama_error err = {0};
    drama_status st = dr_tok_encode(tok, text, strlen(text), &ids, &err);
    if (st) printf("encode failed: %s\n", err.message);
    assert_int_equal(st, DRAMA_OK);
    int same = ids.n == n;
    for (int64_t i = 0; same && i < n; i++) same = ids.data[i] == want[i];
    if (!same) {
        printf("  MISMATCH \"%s\": got", text);
        for (int64_t i = 0; i < ids.n; i++) printf(" %d", ids.data[i]);
        printf(", want");
        for (int64_t i = 0; i < n; i++) printf(" %d", want[i]);
        printf("\n");
    }
    assert_true(same);
    dr_ids_free(&ids);
}
#define EXPECT(tok, text, ...)                                                                       \
    do {                                                                                             \
        const int32_t want_[] = {__VA_ARGS__};                                                       \
        expect_ids((tok), (text), want_, (int64_t)(sizeof want_ / sizeof want_[0]));                 \
    } while (0)

static void merges_and_ranks(void **state) {
    (void)state;
    for (int pair = 0; pair < 2; pair++) {
        variant v = {QWEN2, "NFC", 0, pair, 0};
        dr_tok *tok = make_tok(&v);
        assert_int_equal(dr_tok_n_merges(tok), 5);
        assert_int_equal(dr_tok_vocab_size(tok), ID_HI_THERE + 1);
        EXPECT(tok, "hello", ID_HELL, 'o');   /* he, ll, then he+ll; "hello" itself has no merge */
        EXPECT(tok, "hell", ID_HELL);
        EXPECT(tok, "shell", 's', ID_HELL); /* one piece: s h e l l */
        dr_tok_free(tok);
        v.el_first = 1; /* e+l now merges first: h el l, and nothing joins those */
        tok = make_tok(&v);
        EXPECT(tok, "hell", 'h', ID_EL, 'l');
        dr_tok_free(tok);
        v.el_first = 0;
        v.ignore_merges = 1; /* a whole piece in the vocabulary is emitted as it is */
        tok = make_tok(&v);
        EXPECT(tok, "hello", ID_HELLO);
        EXPECT(tok, "hello!", ID_HELLO, '!');
        EXPECT(tok, "hell", ID_HELL);
        dr_tok_free(tok);
    }
}

static void added_token_rules(void **state) {
    (void)state;
    variant v = {QWEN2, "NFC", 0, 0, 0};
    dr_tok *tok = make_tok(&v);
    /* lstrip and rstrip absorb the whitespace around <x>; <y> keeps it in the text */
    EXPECT(tok, "a  <x>  b", 'a', ID_X, 'b');
    EXPECT(tok, "a  <y>  b", 'a', ' ', ' ', ID_Y, ' ', ' ', 'b');
    EXPECT(tok, "a\t\n<x>\xE3\x80\x80z", 'a', ID_X, 'z'); /* Unicode whitespace (U+3000) too */
    /* lstrip never reaches back across an earlier match */
    EXPECT(tok, "<y> <x>", ID_Y, ID_X);
    /* longest match at one position, leftmost first */
    EXPECT(tok, "<y>>", ID_YY);
    EXPECT(tok, "<y>", ID_Y);
    EXPECT(tok, "<<y>", '<', ID_Y);
    /* single_word: only between non-word characters */
    EXPECT(tok, "cat", ID_CAT);
    EXPECT(tok, "a cat.", 'a', ' ', ID_CAT, '.');
    EXPECT(tok, "cats", 'c', 'a', 't', 's');
    EXPECT(tok, "_cat", '_', 'c', 'a', 't');
    EXPECT(tok, "\xC3\xA9" "cat", 0xC3, 0xA9, 'c', 'a', 't'); /* a letter outside ASCII is a word character */
    /* a content with a raw space matches in the raw text and decodes as it is */
    EXPECT(tok, "say hi there", 's', 'a', 'y', ' ', ID_HI_THERE);
    const int32_t ids[] = {'s', 'a', 'y', ' ', ID_HI_THERE, ID_X, 0xC3, 0xA9};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(dr_tok_decode(tok, ids, 8, &text, &len, NULL), DRAMA_OK);
    assert_string_equal(text, "say hi there<x>\xC3\xA9");
    assert_int_equal(len, strlen(text));
    free(text);
    /* ids 262..299 are unused: decoding one fails and names its index */
    const int32_t unused[] = {'a', 280};
    drama_error err = {0};
    assert_int_not_equal(dr_tok_decode(tok, unused, 2, &text, NULL, &err), DRAMA_OK);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "ids[1]"));
    assert_null(dr_tok_token(tok, 280));
    assert_int_equal(dr_tok_id(tok, "cat"), ID_CAT);
    assert_int_equal(dr_tok_id(tok, "hello"), ID_HELLO);
    dr_tok_free(tok);
}

/* "e" + U+0301 (combining acute) + "x": the normaliser and the pattern decide the pieces. */
static void normalizers_and_patterns(void **state) {
    (void)state;
    const char *nfd = "e\xCC\x81x";
    /* no normaliser, Qwen2 pattern: "e" | U+0301 "x" (the mark is not \p{L}) */
    variant v = {QWEN2, NULL, 0, 0, 0};
    dr_tok *tok = make_tok(&v);
    assert_string_equal(dr_tok_pattern_kind(tok), "qwen2");
    EXPECT(tok, nfd, 'e', 0xCC, 0x81, 'x');
    dr_tok_free(tok);
    /* no normaliser, Qwen3.5 pattern: one piece "e" U+0301 "x", where e + 0xCC merges */
    v.pattern = QWEN35;
    tok = make_tok(&v);
    assert_string_equal(dr_tok_pattern_kind(tok), "qwen3.5");
    EXPECT(tok, nfd, ID_E_ACUTE_LEAD, 0x81, 'x');
    EXPECT(tok, "hello world", ID_HELL, 'o', ' ', 'w', 'o', 'r', 'l', 'd');
    dr_tok_free(tok);
    /* NFC (alone or in a Sequence) composes U+00E9 first */
    const char *norms[] = {"NFC", "Sequence"};
    for (int i = 0; i < 2; i++) {
        variant w = {QWEN35, norms[i], 0, 0, 0};
        tok = make_tok(&w);
        EXPECT(tok, nfd, 0xC3, 0xA9, 'x');
        EXPECT(tok, "\xC3\xA9x", 0xC3, 0xA9, 'x');
        dr_tok_free(tok);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(merges_and_ranks), cmocka_unit_test(added_token_rules),
                                       cmocka_unit_test(normalizers_and_patterns)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
