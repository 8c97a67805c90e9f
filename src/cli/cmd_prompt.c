/* cmd_prompt.c - `drama prompt`: text (+ references) to the prompt rows, ROWS.json (docs/text.md).
 *
 *   drama prompt --model DIR (--text T | --text-file F)
 *                [--reference-codes C.json (--reference-text R | --reference-text-file RF)]...
 *                [--speaker N] [--set prompt.NAME=VALUE]... [--out ROWS.json]
 *
 * References pair up in order (the i-th --reference-codes with the i-th transcript) and
 * reference i is speaker i. --speaker N prepends <|speaker:N|> to the text unless it already
 * starts (after whitespace) with a speaker tag. The prompt switches come from DIR/config.json
 * ("drama_engine"), DIR/drama-engine.json and --set, as for every command. The output has
 * "prefill" = number of rows (the whole prompt is one prefill call). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "gen/pipeline.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "model/config.h"
#include "text/prompt.h"

#define MAX_REFS DR_PROMPT_SPEAKERS
#define MAX_SETS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama prompt --model DIR (--text T | --text-file F)\n"
            "         [--reference-codes C.json (--reference-text R | --reference-text-file RF)]...\n"
            "         [--speaker N] [--set prompt.NAME=VALUE]... [--out ROWS.json]\n"
            "  prints ROWS.json {\"rows\": [[token, c0..], ...], \"prefill\": rows} (default: stdout)\n");
}

static int fail(const drama_error *err) {
    fprintf(stderr, "drama prompt: %s\n", err->message);
    return DR_EXIT_ERROR;
}

int cmd_prompt(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *text_file = NULL, *out_path = "-";
    const char *ref_codes[MAX_REFS], *ref_text[MAX_REFS];
    int ref_text_is_file[MAX_REFS];
    const char *sets[MAX_SETS];
    int n_codes = 0, n_texts = 0, n_sets = 0, speaker = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        } else if (!strcmp(a, "--model") && has_value) model = argv[++i];
        else if (!strcmp(a, "--text") && has_value) text = argv[++i];
        else if (!strcmp(a, "--text-file") && has_value) text_file = argv[++i];
        else if (!strcmp(a, "--out") && has_value) out_path = argv[++i];
        else if (!strcmp(a, "--reference-codes") && has_value && n_codes < MAX_REFS) ref_codes[n_codes++] = argv[++i];
        else if ((!strcmp(a, "--reference-text") || !strcmp(a, "--reference-text-file")) && has_value &&
                 n_texts < MAX_REFS) {
            ref_text_is_file[n_texts] = !strcmp(a, "--reference-text-file");
            ref_text[n_texts++] = argv[++i];
        } else if (!strcmp(a, "--set") && has_value && n_sets < MAX_SETS) sets[n_sets++] = argv[++i];
        else if (!strcmp(a, "--speaker") && has_value) {
            long long v;
            if (!dr_cli_int("prompt", a, argv[++i], 0, DR_PROMPT_SPEAKERS - 1, &v)) return DR_EXIT_USAGE;
            speaker = (int)v;
        } else {
            fprintf(stderr, "drama prompt: unknown, incomplete or repeated too often: '%s'\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    if (model && !*model) { /* "" would mean the root directory */
        fprintf(stderr, "drama prompt: --model: empty directory name\n");
        return DR_EXIT_USAGE;
    }
    if (!model || (!text == !text_file) || n_codes != n_texts) {
        fprintf(stderr, "drama prompt: need --model, exactly one of --text/--text-file, and one transcript per "
                        "--reference-codes (got %d codes, %d transcripts)\n", n_codes, n_texts);
        usage(stderr);
        return DR_EXIT_USAGE;
    }

    drama_error err = {0};
    int rc = DR_EXIT_ERROR;
    dr_config *cfg = NULL;
    dr_tok *tok = NULL;
    char *user_text = NULL, *tok_path = NULL;
    char *transcripts[MAX_REFS] = {0};
    dr_codes codes[MAX_REFS];
    dr_reference refs[MAX_REFS];
    dr_rows rows = {0};
    memset(codes, 0, sizeof codes);

    if (dr_config_load(model, sets, n_sets, &cfg, &err)) goto done;
    size_t n = strlen(model) + 32;
    tok_path = malloc(n);
    if (!tok_path) {
        dr_fail(&err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    snprintf(tok_path, n, "%s/tokenizer.json", model);
    if (dr_tok_load(tok_path, &tok, &err)) goto done;

    int64_t n_codebooks = cfg->audio.num_codebooks;
    int32_t upper[1024];
    if (n_codebooks < 1 || n_codebooks > 1024 || cfg->audio.vocab_size < 1 || cfg->audio.vocab_size > INT32_MAX) {
        dr_fail(&err, DRAMA_EFORMAT, "%s/config.json: audio config: num_codebooks %d / vocab_size %lld out of range",
                model, cfg->audio.num_codebooks, (long long)cfg->audio.vocab_size);
        goto done;
    }
    /* every code indexes the backbone's code table, whose stride is the audio vocab_size */
    for (int64_t k = 0; k < n_codebooks; k++) upper[k] = (int32_t)cfg->audio.vocab_size;

    dr_prompt_ids ids;
    if (dr_prompt_resolve_ids(tok, &ids, &err)) goto done;
    /* the config's token ids must agree with the tokenizer (MODEL.md 3.4); the eos warning is inspect's */
    int32_t end_id = cfg->sw.end_token ? dr_tok_id(tok, cfg->sw.end_token) : ids.im_end;
    if (dr_config_check_token_ids(cfg, ids.semantic_start, ids.n_semantic, end_id < 0 ? ids.im_end : end_id, NULL,
                                  &err))
        goto done;

    for (int i = 0; i < n_codes; i++) {
        if (dr_codes_read(ref_codes[i], n_codebooks, upper, &codes[i], &err)) goto done;
        if (ref_text_is_file[i]) {
            if (dr_read_text_file(ref_text[i], DR_FILE_MAX_BYTES, &transcripts[i], &err)) goto done;
        } else if (!(transcripts[i] = strdup(ref_text[i]))) {
            dr_fail(&err, DRAMA_ENOMEM, "out of memory");
            goto done;
        }
        refs[i] = (dr_reference){transcripts[i], &codes[i]};
    }

    if (text_file) {
        if (dr_read_text_file(text_file, DR_FILE_MAX_BYTES, &user_text, &err)) goto done;
    } else if (!(user_text = strdup(text))) {
        dr_fail(&err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    if (speaker >= 0) {
        size_t lead = strspn(user_text, " \t\r\n");
        if (!dr_prompt_speaker_tag_at(user_text, strlen(user_text), lead, NULL)) {
            size_t len = strlen(user_text) + 32;
            char *tagged = malloc(len);
            if (!tagged) {
                dr_fail(&err, DRAMA_ENOMEM, "out of memory");
                goto done;
            }
            snprintf(tagged, len, "<|speaker:%d|>%s", speaker, user_text);
            free(user_text);
            user_text = tagged;
        }
    }

    dr_prompt_options opt;
    dr_prompt_options_from_switches(&cfg->sw, &opt);
    if (dr_prompt_build(tok, &opt, n_codebooks, refs, n_codes, user_text, &rows, &err)) goto done;
    if (dr_rows_write(out_path, &rows, &err)) goto done;
    rc = DR_EXIT_OK;
done:
    if (rc != DR_EXIT_OK) fail(&err);
    dr_rows_free(&rows);
    for (int i = 0; i < n_codes; i++) {
        dr_codes_free(&codes[i]);
        free(transcripts[i]);
    }
    free(user_text);
    free(tok_path);
    dr_tok_free(tok);
    dr_config_free(cfg);
    return rc;
}
