/* test_text_chunk.c - long text chunking (TEXT.md section 4): nothing is dropped (all text, in
 * order, including text before the first speaker tag), budgets hold except for indivisible
 * units, turn limits, re-tagging of continued turns, CJK sentence ends, directions kept whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/chunk.h"
#include "text/prompt.h"

static dr_tok *g_tok;

static int setup(void **state) {
    (void)state;
    drama_error err = {0};
    if (dr_tok_load(tu_golden("tiny-drama3/tokenizer.json"), &g_tok, &err)) printf("%s\n", err.message);
    return g_tok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    dr_tok_free(g_tok);
    return 0;
}

/* text without whitespace and without speaker tags: what must survive, in order */
static char *speech_of(const char *s) {
    size_t n = strlen(s), o = 0;
    char *r = malloc(n + 1);
    for (size_t i = 0; i < n;) {
        size_t tag = dr_prompt_speaker_tag_at(s, n, i, NULL);
        if (tag) {
            i += tag;
            continue;
        }
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') r[o++] = s[i];
        i++;
    }
    r[o] = '\0';
    return r;
}

static int64_t count_tokens(const char *s) {
    dr_ids ids = {0};
    assert_int_equal(dr_tok_encode(g_tok, s, strlen(s), &ids, NULL), DRAMA_OK);
    int64_t n = ids.n;
    dr_ids_free(&ids);
    return n;
}

static int count_tags(const char *s) {
    int n = 0;
    for (size_t i = 0; s[i]; i++) n += dr_prompt_speaker_tag_at(s, strlen(s), i, NULL) ? 1 : 0;
    return n;
}

/* Chunk, then check: every batch valid; budgets (unless `oversize_ok` batches); nothing dropped. */
static dr_chunks chunk_checked(const char *text, const dr_chunk_options *opt, int64_t *max_tokens_seen) {
    dr_chunks c;
    drama_error err = {0};
    drama_status st = dr_chunk_text(g_tok, text, strlen(text), opt, &c, &err);
    if (st) printf("chunk failed: %s\n", err.message);
    assert_int_equal(st, DRAMA_OK);
    assert_true(c.n >= 1);
    size_t total = 0;
    *max_tokens_seen = 0;
    for (int64_t i = 0; i < c.n; i++) {
        assert_int_equal(strlen(c.text[i]), c.len[i]);
        assert_int_equal(dr_prompt_validate_text(g_tok, c.text[i], c.len[i], "batch", NULL), DRAMA_OK);
        int64_t t = count_tokens(c.text[i]);
        if (t > *max_tokens_seen) *max_tokens_seen = t;
        total += c.len[i] + 1;
    }
    char *joined = calloc(total + 1, 1);
    for (int64_t i = 0; i < c.n; i++) strcat(strcat(joined, c.text[i]), " ");
    char *a = speech_of(text), *b = speech_of(joined);
    if (strcmp(a, b)) printf("DROPPED OR REORDERED:\n in:  %s\n out: %s\n", a, b);
    assert_string_equal(a, b);
    free(a);
    free(b);
    free(joined);
    return c;
}

static void print_batches(const char *label, const dr_chunks *c) {
    printf("%s: %lld batches\n", label, (long long)c->n);
    for (int64_t i = 0; i < c->n && i < 6; i++) printf("  [%lld] %lld tok: %s\n", (long long)i, (long long)count_tokens(c->text[i]), c->text[i]);
}

static void short_text_unchanged(void **state) {
    (void)state;
    const char *t = "  <|speaker:0|>Nice to meet you! 你好。\n";
    int64_t mx;
    dr_chunks c = chunk_checked(t, NULL, &mx);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.text[0], t);
    dr_chunks_free(&c);
}

static void long_english(void **state) {
    (void)state;
    const char *t =
        "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin nuzzled "
        "into his breast in an effort to escape the vile wind, slipped quickly through the glass doors of Victory "
        "Mansions, though not quickly enough to prevent a swirl of gritty dust from entering along with him. "
        "The hallway smelt of boiled cabbage and old rag mats!\n\nAt one end of it a coloured poster, too large for "
        "indoor display, had been tacked to the wall? \"It depicted simply an enormous face.\" (more than a metre wide)";
    dr_chunk_options opt;
    dr_chunk_options_default(&opt);
    opt.max_tokens = 24;
    int64_t mx;
    dr_chunks c = chunk_checked(t, &opt, &mx);
    print_batches("english, 24 tokens", &c);
    assert_true(c.n >= 6);
    assert_true(mx <= 24);
    /* the first batch ends at a sentence or clause end, not mid-word */
    char last = c.text[0][c.len[0] - 1];
    assert_true(last == '.' || last == ',' || last == '!' || last == '?');
    dr_chunks_free(&c);

    opt.max_tokens = 0;
    opt.max_bytes = 80;
    c = chunk_checked(t, &opt, &mx);
    for (int64_t i = 0; i < c.n; i++) assert_true(c.len[i] <= 80);
    printf("english, 80 bytes: %lld batches\n", (long long)c.n);
    dr_chunks_free(&c);
}

static void speakers_and_turns(void **state) {
    (void)state;
    const char *t = "Narrator text before any tag. <|speaker:0|>First speaker says one thing. Then another thing "
                    "that is long enough to continue. <|speaker:1|>Second. <|speaker:0|>   <|speaker:2|>Third!";
    dr_chunk_options opt;
    dr_chunk_options_default(&opt);
    opt.max_tokens = 20;
    int64_t mx;
    dr_chunks c = chunk_checked(t, &opt, &mx);
    print_batches("speakers, 20 tokens", &c);
    assert_true(mx <= 20);
    /* the untagged intro is kept and stays untagged; a continued turn is re-tagged */
    assert_non_null(strstr(c.text[0], "Narrator"));
    int seen_cont = 0;
    for (int64_t i = 1; i < c.n; i++)
        if (strstr(c.text[i], "another") || strstr(c.text[i], "continue")) {
            assert_int_equal(strncmp(c.text[i], "<|speaker:0|>", 13), 0);
            seen_cont = 1;
        }
    assert_true(seen_cont);
    dr_chunks_free(&c);

    /* default_speaker_tag tags the intro */
    opt.default_speaker_tag = 1;
    c = chunk_checked(t, &opt, &mx);
    assert_int_equal(strncmp(c.text[0], "<|speaker:0|>Narrator", 21), 0);
    dr_chunks_free(&c);

    /* at most max_turns turns per batch, joined by newlines */
    const char *many = "<|speaker:0|>a. <|speaker:1|>b. <|speaker:2|>c. <|speaker:3|>d. <|speaker:4|>e. "
                       "<|speaker:5|>f. <|speaker:6|>g. <|speaker:7|>h.";
    dr_chunk_options_default(&opt);
    opt.max_tokens = 1000;
    c = chunk_checked(many, &opt, &mx);
    print_batches("8 turns", &c);
    assert_int_equal(c.n, 2);
    assert_int_equal(count_tags(c.text[0]), 5);
    assert_int_equal(count_tags(c.text[1]), 3);
    assert_non_null(strstr(c.text[0], "a.\n<|speaker:1|>b."));
    dr_chunks_free(&c);
}

static void cjk_and_indivisible(void **state) {
    (void)state;
    const char *t = "今天天气很好。我们去公园散步吧！你觉得怎么样？好的，那我们走吧。";
    dr_chunk_options opt;
    dr_chunk_options_default(&opt);
    opt.max_tokens = 16;
    int64_t mx;
    dr_chunks c = chunk_checked(t, &opt, &mx);
    print_batches("cjk, 16 tokens", &c);
    assert_true(c.n >= 2);
    assert_true(mx <= 16);
    dr_chunks_free(&c);

    /* a direction is never split, even over budget; a long word is cut between code points */
    const char *d = "Hello there. [whispering very quietly to the person next to me] Then silence.";
    opt.max_tokens = 6;
    c = chunk_checked(d, &opt, &mx);
    print_batches("direction, 6 tokens", &c);
    int whole = 0;
    for (int64_t i = 0; i < c.n; i++) whole |= strstr(c.text[i], "[whispering very quietly to the person next to me]") != NULL;
    assert_true(whole);
    dr_chunks_free(&c);

    char word[3001];
    for (int i = 0; i < 3000; i++) word[i] = "abcdefghij"[i % 10];
    word[3000] = '\0';
    opt.max_tokens = 32;
    c = chunk_checked(word, &opt, &mx);
    printf("3000-letter word, 32 tokens: %lld batches, max %lld tokens\n", (long long)c.n, (long long)mx);
    assert_true(mx <= 32);
    assert_true(c.n > 3000 / (32 * 8));
    dr_chunks_free(&c);
}

/* Random texts (held-out style: any language, emoji, directions, tags, line breaks, long words)
 * under random budgets: nothing dropped or reordered (chunk_checked), at most max_turns turns per
 * batch, a batch over its byte or token budget holds a single indivisible unit (one code point or
 * one direction of at most 64 bytes, after its tag), and when the text starts with a speaker tag
 * every batch starts with one (continued turns are re-tagged). Fixed seed: reproducible. */
static void random_texts(void **state) {
    (void)state;
    static const char *frags[] = {
        "Hello there, my friend. ", "What?! ", "[whispering] ", "(laughs) ", "<whisper>", "</whisper>", "\n",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82", "\xe6\x88\x91\xe4\xbb\xac\xe8\xb5\xb0\xe5\x90\xa7\xef\xbc\x81",
        "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd9\x83. ", "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 ",
        "\xe2\x80\x9cQuoted\xe2\x80\x9d \xe2\x80\xa6 ", "e\xcc\x81t\xc3\xa9, ", "supercalifragilisticexpialidocious",
        "12,345.67 ", "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe3\x80\x81", "a;b:c ",
        "<|speaker:0|>", "<|speaker:1|>", "<|speaker:15|>", "[a direction that is far too long to be kept whole by the chunker at all] ",
    };
    const int n_frags = (int)(sizeof frags / sizeof frags[0]);
    uint32_t rng = 20260101u;
    int64_t n_batches = 0, n_over = 0, n_retagged = 0;
    for (int iter = 0; iter < 60; iter++) {
        char text[4096];
        size_t o = 0;
        int n = 1 + (int)((rng = rng * 1664525u + 1013904223u) >> 26);
        for (int k = 0; k < n; k++) {
            rng = rng * 1664525u + 1013904223u;
            const char *f = frags[(rng >> 16) % (uint32_t)n_frags];
            size_t l = strlen(f);
            if (o + l + 2 >= sizeof text) break;
            memcpy(text + o, f, l);
            o += l;
        }
        memcpy(text + o, "ok", 3); /* never only tags and whitespace */
        dr_chunk_options opt;
        dr_chunk_options_default(&opt);
        rng = rng * 1664525u + 1013904223u;
        opt.max_tokens = 1 + (int64_t)((rng >> 8) % 40);
        opt.max_bytes = (rng >> 20) % 3 == 0 ? 0 : 8 + (int64_t)((rng >> 12) % 90);
        opt.max_turns = 1 + (int)((rng >> 4) % 5);
        opt.default_speaker_tag = (int)(rng >> 30) & 1;
        int64_t mx;
        dr_chunks c = chunk_checked(text, &opt, &mx);
        int tagged_start = dr_prompt_speaker_tag_at(text, strlen(text), 0, NULL) > 0 || opt.default_speaker_tag;
        for (int64_t i = 0; i < c.n; i++) {
            const char *b = c.text[i];
            assert_true(count_tags(b) <= opt.max_turns || c.n == 1);
            if (tagged_start && c.n > 1) assert_int_equal(strncmp(b, "<|speaker:", 10), 0);
            n_retagged += tagged_start && c.n > 1;
            n_batches++;
            int over = (opt.max_bytes > 0 && (int64_t)c.len[i] > opt.max_bytes) || count_tokens(b) > opt.max_tokens;
            if (!over) continue;
            size_t tag = dr_prompt_speaker_tag_at(b, c.len[i], 0, NULL);
            const char *u = b + tag;
            size_t ul = c.len[i] - tag;
            unsigned char lead = (unsigned char)u[0];
            size_t cp_len = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            int one_cp = ul == cp_len;
            int direction = ul <= 64 && strchr("[(<{", u[0]) != NULL;
            if (!one_cp && !direction)
                printf("OVER BUDGET (tokens %lld, bytes %lld): \"%s\" from \"%s\"\n", (long long)opt.max_tokens,
                       (long long)opt.max_bytes, b, text);
            assert_true(one_cp || direction);
            n_over++;
        }
        dr_chunks_free(&c);
    }
    printf("60 random texts: %lld batches (%lld tag-started checks, %lld single units over budget)\n",
           (long long)n_batches, (long long)n_retagged, (long long)n_over);
    assert_true(n_batches > 120 && n_retagged > 0 && n_over > 0); /* the checks above were exercised */
}

static void errors(void **state) {
    (void)state;
    dr_chunks c;
    drama_error err = {0};
    assert_int_equal(dr_chunk_text(g_tok, " \n ", 3, NULL, &c, &err), DRAMA_EEMPTY);
    assert_null(c.text);
    dr_error_clear(&err);
    const char *tags = "<|speaker:0|>  <|speaker:1|>";
    assert_int_equal(dr_chunk_text(g_tok, tags, strlen(tags), NULL, &c, &err), DRAMA_EEMPTY);
    printf("  %s\n", err.message);
    dr_error_clear(&err);
    const char *bad = "hi <|voice|>";
    assert_int_equal(dr_chunk_text(g_tok, bad, strlen(bad), NULL, &c, &err), DRAMA_EINVAL);
    assert_non_null(strstr(err.message, "reserved_token"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(short_text_unchanged), cmocka_unit_test(long_english), cmocka_unit_test(speakers_and_turns),
        cmocka_unit_test(cjk_and_indivisible),  cmocka_unit_test(errors), cmocka_unit_test(random_texts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
