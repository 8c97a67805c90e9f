/* test_text_cli.c - `drama tokenize` and `drama prompt` through the real binary ($DRAMA_BIN):
 * golden ids, the golden e2e prompt rows from text + reference codes, decode round trip, exit
 * statuses. Skipped when the binary is not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "text/tokenizer.h"

static const char *bin(void) {
    const char *b = getenv("DRAMA_BIN");
    return b && access(b, X_OK) == 0 ? b : NULL;
}

/* Run a shell command; stdout into a malloc'd string, exit status into *rc. */
static char *run(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) out = realloc(out, cap *= 2);
    }
    out[n] = '\0';
    int status = pclose(p);
    *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

/* Every `step`-th golden item through the CLI, encode and decode (the tokenizer test covers all). */
static void tokenize_golden_file(const char *tokenizer, const char *golden, size_t step) {
    json_error_t jerr;
    json_t *root = json_load_file(tu_golden(golden), 0, &jerr);
    assert_non_null(root);
    json_t *items = json_object_get(root, "items");
    char path[] = "/tmp/drama_cli_text_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int checked = 0;
    for (size_t i = 1; i < json_array_size(items); i += step) {
        json_t *it = json_array_get(items, i);
        FILE *f = fopen(path, "wb");
        fwrite(json_string_value(json_object_get(it, "text")), 1, json_string_length(json_object_get(it, "text")), f);
        fclose(f);
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --text-file '%s'", bin(),
                 tu_golden(tokenizer), path);
        int rc;
        char *out = run(cmd, &rc);
        assert_int_equal(rc, 0);
        json_t *got = json_loads(out, 0, &jerr);
        assert_non_null(got);
        assert_true(json_equal(json_object_get(got, "ids"), json_object_get(it, "ids")));
        /* and back */
        char *ids = json_dumps(got, 0);
        f = fopen(path, "wb");
        fputs(ids, f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --text-file '%s' --decode", bin(),
                 tu_golden(tokenizer), path);
        char *text = run(cmd, &rc);
        assert_int_equal(rc, 0);
        assert_string_equal(text, json_string_value(json_object_get(it, "decoded")));
        free(text);
        free(ids);
        json_decref(got);
        free(out);
        checked++;
    }
    printf("drama tokenize %s: %d golden items exact (encode and decode)\n", tokenizer, checked);
    remove(path);
    json_decref(root);
}

static void tokenize_golden(void **state) {
    (void)state;
    if (!bin()) skip();
    tokenize_golden_file("tiny-drama3/tokenizer.json", "tokenizer/tiny-encodings.json", 8);
    tokenize_golden_file("tokenizer/qwen3-tokenizer.json.gz", "tokenizer/qwen3-encodings.json", 50);
}

static void prompt_golden(void **state) {
    (void)state;
    if (!bin()) skip();
    const char *cases[] = {"ref/e2e-noref.json", "ref/e2e-ref12.json"};
    for (int c = 0; c < 2; c++) {
        json_error_t jerr;
        json_t *root = json_load_file(tu_golden(cases[c]), 0, &jerr);
        assert_non_null(root);
        json_t *cs = json_object_get(root, "case"), *ref = json_object_get(cs, "ref");
        char text_path[] = "/tmp/drama_cli_prompt_XXXXXX", codes_path[] = "/tmp/drama_cli_codes_XXXXXX";
        char ref_path[] = "/tmp/drama_cli_ref_XXXXXX";
        close(mkstemp(text_path));
        close(mkstemp(codes_path));
        close(mkstemp(ref_path));
        FILE *f = fopen(text_path, "wb");
        fputs(json_string_value(json_object_get(cs, "text")), f);
        fclose(f);
        char cmd[8192];
        int n = snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text-file '%s'", bin(), tu_golden("tiny-drama3"),
                         text_path);
        if (json_is_object(ref)) {
            json_t *parts = json_object_get(root, "prompt_parts");
            for (size_t i = 0; i < json_array_size(parts); i++) {
                json_t *part = json_array_get(parts, i);
                if (strcmp(json_string_value(json_object_get(part, "kind")), "vq")) continue;
                json_t *doc = json_pack("{sO}", "codes", json_object_get(part, "codes"));
                json_dump_file(doc, codes_path, 0);
                json_decref(doc);
            }
            f = fopen(ref_path, "wb");
            fputs(json_string_value(json_object_get(ref, "text")), f);
            fclose(f);
            snprintf(cmd + n, sizeof cmd - (size_t)n, " --reference-codes '%s' --reference-text-file '%s'", codes_path,
                     ref_path);
        }
        int rc;
        char *out = run(cmd, &rc);
        assert_int_equal(rc, 0);
        json_t *got = json_loads(out, 0, &jerr);
        assert_non_null(got);
        json_t *want = json_object_get(root, "prompt_rows");
        int same = json_equal(json_object_get(got, "rows"), want);
        printf("drama prompt %s: %zu rows, prefill %lld, equal to golden prompt_rows: %s\n", cases[c],
               json_array_size(json_object_get(got, "rows")), (long long)json_integer_value(json_object_get(got, "prefill")),
               same ? "yes" : "NO");
        assert_true(same);
        assert_int_equal(json_integer_value(json_object_get(got, "prefill")), json_array_size(want));
        json_decref(got);
        free(out);
        remove(text_path);
        remove(codes_path);
        remove(ref_path);
        json_decref(root);
    }
}

static void exit_statuses(void **state) {
    (void)state;
    if (!bin()) skip();
    char cmd[4096];
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text 'hi<|im_end|>' 2>/dev/null", bin(), tu_golden("tiny-drama3"));
    free(run(cmd, &rc));
    assert_int_equal(rc, 1);
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text '   ' 2>/dev/null", bin(), tu_golden("tiny-drama3"));
    free(run(cmd, &rc));
    assert_int_equal(rc, 1);
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text hi --speaker 16 2>/dev/null", bin(), tu_golden("tiny-drama3"));
    free(run(cmd, &rc));
    assert_int_equal(rc, 2);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --text hi 2>/dev/null", bin());
    free(run(cmd, &rc));
    assert_int_equal(rc, 2);
    /* --speaker 3 puts <|speaker:3|> (its id read through tokenize) right after "<|im_start|>user\n" */
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --text '<|speaker:3|>'", bin(), tu_golden("tiny-drama3"));
    char *ids = run(cmd, &rc);
    assert_int_equal(rc, 0);
    json_t *doc = json_loads(ids, 0, NULL);
    assert_non_null(doc);
    assert_int_equal(json_array_size(json_object_get(doc, "ids")), 1);
    char want[64];
    snprintf(want, sizeof want, "[%lld, 0, 0", (long long)json_integer_value(json_array_get(json_object_get(doc, "ids"), 0)));
    json_decref(doc);
    free(ids);
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text hi --speaker 3", bin(), tu_golden("tiny-drama3"));
    char *out = run(cmd, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, want));
    free(out);
}

/* Encode one literal segment with the library and append its text rows [id, 0, ...] to `want`. */
static void want_text(dr_tok *tok, const char *seg, json_t *want, int n_codebooks) {
    dr_ids ids = {0};
    assert_int_equal(dr_tok_encode(tok, seg, strlen(seg), &ids, NULL), DRAMA_OK);
    for (int64_t i = 0; i < ids.n; i++) {
        json_t *row = json_array();
        json_array_append_new(row, json_integer(ids.data[i]));
        for (int k = 0; k < n_codebooks; k++) json_array_append_new(row, json_integer(0));
        json_array_append_new(want, row);
    }
    dr_ids_free(&ids);
}

/* A model written by `drama make-model` with another shape (4 codebooks) and speaker tags that are
 * not tokens (plain text split by BPE, the S2-Pro case): its tokenizer round-trips any text through
 * `drama tokenize`, and `drama prompt` with three references and several speakers gives exactly the
 * rows of TEXT.md 2.1 worked out segment by segment with the library. */
static void made_model(void **state) {
    (void)state;
    if (!bin()) skip();
    enum { K = 4 };
    char tmp[1024], dir[1100], cmd[8192], path[1200];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(dir, sizeof dir, "%s/m", tmp);
    snprintf(cmd, sizeof cmd, "'%s' make-model '%s' --shape custom --codebooks %d --speakers 0 --seed 5 --codec none >/dev/null",
             bin(), dir, K);
    int rc;
    free(run(cmd, &rc));
    assert_int_equal(rc, 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    dr_tok *tok = NULL;
    drama_error err = {0};
    assert_int_equal(dr_tok_load(path, &tok, &err), DRAMA_OK);
    assert_int_equal(dr_tok_id(tok, "<|speaker:0|>"), -1);

    /* encode + decode through the CLI gives the text back (NFC input) */
    const char *text = "<|speaker:0|>Grüße, 你好。 [whispering] (laughs) 👩‍👩‍👧 \"ok?\"\n<|speaker:2|>¿Qué tal? مرحبا  ";
    char text_path[1200], ids_path[1200];
    snprintf(text_path, sizeof text_path, "%s/text.txt", tmp);
    snprintf(ids_path, sizeof ids_path, "%s/ids.json", tmp);
    tu_write_file(text_path, text, strlen(text));
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' --text-file '%s' > '%s' && '%s' tokenize --tokenizer '%s' --decode --text-file '%s'",
             bin(), dir, text_path, ids_path, bin(), dir, ids_path);
    char *back = run(cmd, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(back, text);
    free(back);

    /* three references (the third transcript carries its own tag), two speakers in the text */
    const char *transcripts[3] = {"First voice.", "Second, 第二。", "<|speaker:1|>Third."};
    const int frames[3] = {2, 1, 3};
    char codes_path[3][1200], ref_path[3][1200];
    json_t *want = json_array();
    want_text(tok, "<|im_start|>system\n", want, K);
    want_text(tok, "convert the provided text to speech reference to the following:\n\nText:\n", want, K);
    want_text(tok, "<|speaker:0|>First voice.\n<|speaker:1|>Second, 第二。\n<|speaker:1|>Third.", want, K);
    want_text(tok, "\n\nSpeech:\n", want, K);
    int32_t S = dr_tok_id(tok, "<|semantic:0|>");
    assert_true(S >= 0);
    int n = snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text '<|speaker:0|>Hi there. <|speaker:1|>Hello!'", bin(), dir);
    for (int r = 0; r < 3; r++) {
        json_t *codes = json_array();
        for (int f = 0; f < frames[r]; f++) {
            json_t *frame = json_array(), *row = json_array();
            for (int k = 0; k < K; k++) json_array_append_new(frame, json_integer(100 * r + 10 * f + k));
            json_array_append_new(row, json_integer(S + 100 * r + 10 * f));
            for (int k = 0; k < K; k++) json_array_append_new(row, json_integer(100 * r + 10 * f + k));
            json_array_append_new(codes, frame);
            json_array_append_new(want, row);
        }
        snprintf(codes_path[r], sizeof codes_path[r], "%s/codes%d.json", tmp, r);
        snprintf(ref_path[r], sizeof ref_path[r], "%s/ref%d.txt", tmp, r);
        json_t *doc = json_pack("{so}", "codes", codes);
        assert_int_equal(json_dump_file(doc, codes_path[r], 0), 0);
        json_decref(doc);
        tu_write_file(ref_path[r], transcripts[r], strlen(transcripts[r]));
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " --reference-codes '%s' --reference-text-file '%s'", codes_path[r],
                      ref_path[r]);
    }
    want_text(tok, "<|im_end|>\n", want, K);
    want_text(tok, "<|im_start|>user\n", want, K);
    want_text(tok, "<|speaker:0|>Hi there. <|speaker:1|>Hello!", want, K);
    want_text(tok, "<|im_end|>\n", want, K);
    want_text(tok, "<|im_start|>assistant\n<|voice|>", want, K);
    char *out = run(cmd, &rc);
    assert_int_equal(rc, 0);
    json_error_t jerr;
    json_t *got = json_loads(out, 0, &jerr);
    assert_non_null(got);
    int same = json_equal(json_object_get(got, "rows"), want);
    printf("drama prompt on a made model (%d codebooks, 3 references): %zu rows, as TEXT.md 2.1: %s\n", K,
           json_array_size(json_object_get(got, "rows")), same ? "yes" : "NO");
    assert_true(same);
    assert_int_equal(json_integer_value(json_object_get(got, "prefill")), json_array_size(want));
    json_decref(got);
    json_decref(want);
    free(out);

    /* a reference code outside the model's audio vocabulary, and a speaker tag out of range */
    snprintf(cmd, sizeof cmd, "printf '{\"codes\": [[1, 2, 3, 99999]]}' > '%s'; '%s' prompt --model '%s' --text hi --reference-codes '%s' --reference-text x 2>&1",
             codes_path[0], bin(), dir, codes_path[0]);
    out = run(cmd, &rc);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "frame 0 codebook 3"));
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' prompt --model '%s' --text 'a <|speaker:16|> b' 2>&1", bin(), dir);
    out = run(cmd, &rc);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "invalid_speaker_tag"));
    free(out);
    dr_tok_free(tok);
    tu_rm_rf(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tokenize_golden), cmocka_unit_test(prompt_golden),
                                       cmocka_unit_test(exit_statuses), cmocka_unit_test(made_model)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
