/* checkpoint.h - a model directory's weights: one model.safetensors, or sharded through
 * model.safetensors.index.json (FORMATS.md section 2; shard names never assumed).
 * Tensor lookup is by full checkpoint name across shards. Prefix detection per MODEL.md 4.1. */
#ifndef DRAMA_IO_CHECKPOINT_H
#define DRAMA_IO_CHECKPOINT_H

#include <jansson.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"
#include "io/safetensors.h"

typedef struct dr_ckpt dr_ckpt;

/* Open every shard of the model in `dir` and cross-check index and headers.
 * Findings that are only warnings (total_size mismatch, unreferenced shards) go to the warnings list. */
drama_status dr_ckpt_open(const char *dir, dr_ckpt **out, drama_error *err);
void dr_ckpt_close(dr_ckpt *c);

const char *dr_ckpt_dir(const dr_ckpt *c);
int64_t dr_ckpt_count(const dr_ckpt *c);                       /* all tensors, sorted by name */
const dr_tensor *dr_ckpt_at(const dr_ckpt *c, int64_t i);
const dr_tensor *dr_ckpt_find(const dr_ckpt *c, const char *name);
const char *dr_ckpt_shard_of(const dr_ckpt *c, const char *name); /* shard file name, or NULL */
int dr_ckpt_shard_count(const dr_ckpt *c);
const dr_st_file *dr_ckpt_shard(const dr_ckpt *c, int i);
/* Index "metadata" object (borrowed; NULL if no index or none). Values may be any JSON. */
const json_t *dr_ckpt_index_metadata(const dr_ckpt *c);
int dr_ckpt_warning_count(const dr_ckpt *c);
const char *dr_ckpt_warning(const dr_ckpt *c, int i);

/* Backbone prefix (MODEL.md 4.1): `forced` (switch backbone.prefix) wins when non-NULL; else the
 * unique P such that P+"embed_tokens.weight" and P+"layers.0.input_layernorm.weight" exist
 * (names starting with "audio_decoder" excluded). Writes P (may be "") into buf. */
drama_status dr_ckpt_detect_prefix(const dr_ckpt *c, const char *forced, char *buf, size_t buflen,
                                   drama_error *err);

/* ---- index parsing (exposed for tests and fuzzing) ----
 * Parse model.safetensors.index.json text (FORMATS.md section 2, rules 1-2: weight_map required
 * and non-empty, values plain shard file names, metadata an object of any JSON, duplicate keys
 * rejected). `label` names the file in messages. */
typedef struct dr_ckpt_index {
    json_t *root;            /* owned */
    const json_t *metadata;  /* borrowed from root; NULL when absent */
    int64_t count;           /* weight_map entries, in file order */
    const char **names;      /* [count] tensor names (borrowed from root) */
    int *shard_of;           /* [count] index into shards */
    int nshards;
    const char **shards;     /* distinct shard names in order of first use (borrowed from root) */
    int has_total_size;      /* metadata.total_size present and a non-negative integer */
    uint64_t total_size;
} dr_ckpt_index;

drama_status dr_ckpt_parse_index(const char *text, size_t len, const char *label, dr_ckpt_index **out,
                                 drama_error *err);
void dr_ckpt_index_free(dr_ckpt_index *ix);

#endif
