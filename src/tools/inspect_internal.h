/* inspect_internal.h - shared between the inspect*.c files only. */
#ifndef DRAMA_TOOLS_INSPECT_INTERNAL_H
#define DRAMA_TOOLS_INSPECT_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "model/config.h"

typedef struct ins_problem_t {
    int fatal;
    char *text;
} ins_problem_t;

/* Problems found outside the tensor loader (config, tokenizer, codec). */
typedef struct ins_report {
    int n_problems, cap_problems;
    ins_problem_t *problems;
} ins_report;

void ins_problem(ins_report *r, int fatal, const char *fmt, ...) DR_PRINTF(3, 4);

/* Token ids resolved from tokenizer.json (MODEL.md 3.4). ok = all three found. */
typedef struct dr_tok_info {
    int ok;
    int64_t semantic_start, n_semantic, end_id;
} dr_tok_info;

/* "## tokenizer" section: special ids, semantic block contiguity, speaker tags, cross-checks with
 * config (cfg may be NULL). */
void ins_tokens(const char *dir, const dr_config *cfg, FILE *out, ins_report *r, dr_tok_info *info);

/* "## codec" section: codec.pth or codec.safetensors inventory, load check, ignored entries. */
void ins_codec(const char *dir, FILE *out, ins_report *r);

/* "## manifest" section when DIR/drama-manifest.json exists: every listed file's size and SHA-256
 * (digest cache as `drama verify`); mismatches are fatal, unlisted files warnings. Returns 0 when
 * the manifest refuses the model (the caller then parses nothing else), 1 otherwise. */
int ins_manifest(const char *dir, FILE *out, ins_report *r);

#endif
