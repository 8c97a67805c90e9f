/* inspect.h - `drama inspect DIR`: what a model directory holds and how it differs from what the
 * engine expects (MODEL.md 4.5 and 11).
 *
 * The report prints: files; config summary, unknown fields and warnings; every switch with value
 * and source; the special token ids of tokenizer.json and their cross-checks; shards (header size,
 * alignment, metadata, symlinks), index metadata and checkpoint warnings (unreferenced shards);
 * the tensor inventory folded like golden/INVENTORY.md; the detected backbone prefix and the
 * expert layout and format of every layer; the codec inventory and codec findings; the chat
 * template; and every finding (missing, mis-shaped, unsupported, incomplete, unexpected,
 * ignored) of the engine's own loader. The model is "loadable" when nothing fatal was found.
 */
#ifndef DRAMA_TOOLS_INSPECT_H
#define DRAMA_TOOLS_INSPECT_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef struct dr_inspect_options {
    const char *const *sets;   /* "name=value" switch overrides (--set) */
    int n_sets;
    int max_template_bytes;    /* chat template printed up to this many bytes (0 = 65536) */
} dr_inspect_options;

/* Print the report on `out`. *loadable = 1 when the checkpoint loads (no fatal finding).
 * Returns an error only when nothing could be inspected (e.g. DIR unreadable). */
drama_status dr_inspect(const char *dir, const dr_inspect_options *opts, FILE *out, int *loadable,
                        drama_error *err);

/* ---- folded inventories (inspect_fold.c) ---- */
typedef struct dr_fold_item {
    const char *name;
    const char *dtype;         /* "BF16", ... */
    int ndim;
    const int64_t *shape;
    const char *group;         /* shard column ("00001"), or NULL */
    uint64_t bytes;
} dr_fold_item;

/* Markdown table "| `pattern` | DTYPE [shape] group | count | bytes |", rows sorted by their
 * first name. Returns the number of rows. */
int dr_fold_print(FILE *out, const dr_fold_item *items, int64_t n);
void dr_shape_text(int ndim, const int64_t *shape, char *out, size_t cap);

#endif
