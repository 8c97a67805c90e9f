/* cmd_tokenize.c - `drama tokenize`: text to token ids, or ids back to text (docs/text.md).
 *
 *   drama tokenize --tokenizer FILE (--text T | --text-file F) [--tokens]
 *       prints {"ids": [...]} (with --tokens also "tokens": [...], the vocabulary strings)
 *   drama tokenize --tokenizer FILE (--text J | --text-file F) --decode
 *       the input is JSON, {"ids": [...]} or a bare [...]; prints the decoded text exactly
 *       (UTF-8, no newline added; invalid byte sequences become U+FFFD)
 *
 * FILE is a tokenizer.json, a tokenizer.json.gz, or a model directory holding tokenizer.json.
 * F may be "-" for stdin. Raw encoding: added tokens written in the text are matched, there is
 * no prompt validation and no BOS/EOS. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "cli/commands.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama tokenize --tokenizer FILE|DIR (--text T | --text-file F) [--tokens] [--decode]\n"
            "  encode: prints {\"ids\": [...]}; --tokens adds the token strings\n"
            "  --decode: input is {\"ids\": [...]} or [...]; prints the text (no newline added)\n");
}

static int fail(const drama_error *err) {
    fprintf(stderr, "drama tokenize: %s\n", err->message);
    return DR_EXIT_ERROR;
}

/* FILE, or DIR/tokenizer.json when a directory is given. Returns a malloc'd path. */
static char *tokenizer_path(const char *arg) {
    struct stat sb;
    if (stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(arg) + 32;
        char *p = malloc(n);
        if (p) snprintf(p, n, "%s/tokenizer.json", arg);
        return p;
    }
    return strdup(arg);
}

static int decode(dr_tok *tok, const char *input, size_t len, drama_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(input, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        dr_fail(err, DRAMA_EFORMAT, "ids input: invalid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return fail(err);
    }
    json_t *arr = json_is_array(root) ? root : json_object_get(root, "ids");
    int rc = DR_EXIT_OK;
    int32_t *ids = NULL;
    if (!json_is_array(arr)) {
        dr_fail(err, DRAMA_EFORMAT, "ids input: expected {\"ids\": [...]} or an array of integers");
        rc = fail(err);
        goto done;
    }
    size_t n = json_array_size(arr);
    ids = malloc((n + 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            dr_fail(err, DRAMA_EFORMAT, "ids input: ids[%zu]: expected an integer id in 0..%d", i, INT32_MAX);
            rc = fail(err);
            goto done;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text = NULL;
    size_t text_len = 0;
    if (!ids || dr_tok_decode(tok, ids, (int64_t)n, &text, &text_len, err)) {
        if (!ids) dr_fail(err, DRAMA_ENOMEM, "out of memory");
        rc = fail(err);
        goto done;
    }
    fwrite(text, 1, text_len, stdout);
    free(text);
done:
    free(ids);
    json_decref(root);
    return rc;
}

static int encode(dr_tok *tok, const char *input, size_t len, int with_tokens, drama_error *err) {
    dr_ids ids = {0};
    if (dr_tok_encode(tok, input, len, &ids, err)) return fail(err);
    fputs("{\"ids\": [", stdout);
    for (int64_t i = 0; i < ids.n; i++) printf(i ? ", %d" : "%d", (int)ids.data[i]);
    fputc(']', stdout);
    if (with_tokens) {
        fputs(", \"tokens\": [", stdout);
        for (int64_t i = 0; i < ids.n; i++) {
            json_t *s = json_string(dr_tok_token(tok, ids.data[i]));
            char *q = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
            printf("%s%s", i ? ", " : "", q ? q : "null");
            free(q);
            json_decref(s);
        }
        fputc(']', stdout);
    }
    fputs("}\n", stdout);
    dr_ids_free(&ids);
    return DR_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv) {
    const char *tok_arg = NULL, *text = NULL, *text_file = NULL;
    int do_decode = 0, with_tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        } else if (!strcmp(a, "--tokenizer") && has_value) tok_arg = argv[++i];
        else if (!strcmp(a, "--text") && has_value) text = argv[++i];
        else if (!strcmp(a, "--text-file") && has_value) text_file = argv[++i];
        else if (!strcmp(a, "--decode")) do_decode = 1;
        else if (!strcmp(a, "--tokens")) with_tokens = 1;
        else {
            fprintf(stderr, "drama tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    if (!tok_arg || (!text == !text_file)) {
        fprintf(stderr, "drama tokenize: need --tokenizer and exactly one of --text, --text-file\n");
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    drama_error err = {0};
    char *input = NULL;
    size_t len = 0;
    if (text_file) {
        if (dr_read_file(text_file, DR_FILE_MAX_BYTES, &input, &len, &err)) return fail(&err);
    } else {
        len = strlen(text);
    }
    char *path = tokenizer_path(tok_arg);
    dr_tok *tok = NULL;
    int rc;
    if (!path || dr_tok_load(path, &tok, &err)) {
        if (!path) dr_fail(&err, DRAMA_ENOMEM, "out of memory");
        rc = fail(&err);
    } else {
        const char *in = text_file ? input : text;
        rc = do_decode ? decode(tok, in, len, &err) : encode(tok, in, len, with_tokens, &err);
    }
    if (rc == DR_EXIT_OK && fflush(stdout) != 0) {
        fprintf(stderr, "drama tokenize: write error on stdout\n");
        rc = DR_EXIT_ERROR;
    }
    dr_tok_free(tok);
    free(path);
    free(input);
    return rc;
}
