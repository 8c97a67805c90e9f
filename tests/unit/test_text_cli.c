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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tokenize_golden), cmocka_unit_test(prompt_golden),
                                       cmocka_unit_test(exit_statuses)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
