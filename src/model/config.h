/* config.h - config.json as a typed struct, plus the engine switches (MODEL.md 3 and 10,
 * TEXT.md 2.4).
 *
 * Switches are read in this order, later wins: built-in default -> config.json "drama_engine"
 * -> drama-engine.json next to config.json -> `--set name=value`. Unknown switch names and
 * values of the wrong type are errors naming the switch and where it came from. Every switch
 * remembers its source so `drama inspect` can print it.
 *
 * Fields the engine does not know are kept (as dotted paths) for `drama inspect`; they never
 * fail a load. Values that the engine needs and that are missing or of the wrong type fail with
 * a message naming the field: "config.json: text_config.num_experts: expected positive integer".
 */
#ifndef DRAMA_MODEL_CONFIG_H
#define DRAMA_MODEL_CONFIG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum dr_layer_kind { DR_LAYER_LINEAR = 0, DR_LAYER_FULL = 1 } dr_layer_kind;

/* text_config: the backbone (MODEL.md 3.2). */
typedef struct dr_text_config {
    int64_t vocab_size;
    int64_t hidden_size;            /* H */
    int n_layers;                   /* num_hidden_layers */
    dr_layer_kind *layer_types;     /* [n_layers]; from layer_types or full_attention_interval */
    int full_attention_interval;    /* 0 when absent */
    int n_heads, n_kv_heads, head_dim;
    int attn_output_gate;           /* default 1 */
    double rms_norm_eps;
    double rope_theta;
    double partial_rotary_factor;
    int rope_dims;                  /* round(partial_rotary_factor * head_dim), even */
    int mrope_section[3];           /* informational */
    int mrope_interleaved;          /* informational */
    int conv_kernel;                /* linear_conv_kernel_dim K */
    int lin_k_heads, lin_k_dim;     /* linear_num_key_heads, linear_key_head_dim */
    int lin_v_heads, lin_v_dim;     /* linear_num_value_heads, linear_value_head_dim */
    int n_experts, n_experts_per_tok;
    int64_t moe_intermediate;       /* I */
    int64_t shared_intermediate;    /* Is */
    int norm_topk_prob;             /* default 1 */
    int tie_word_embeddings;        /* text_config or top level; default 0 */
    int64_t max_position_embeddings;/* informational, 0 when absent */
    int n_mlp_only_layers;          /* unsupported when > 0 (reported by the loader) */
    int decoder_sparse_step;        /* unsupported when != 1 */
} dr_text_config;

/* Audio decoder sub-config: the tower (MODEL.md 3.3). */
typedef struct dr_audio_config {
    char key[128];                  /* the top-level key it was read from */
    int dim, n_head, n_local_heads, head_dim;
    int64_t intermediate_size;
    double norm_eps;
    int num_codebooks;
    int64_t vocab_size;             /* V, code-table stride */
    int shared_enrichment_layers;
    double rope_base;
    double rotary_percent;          /* < 0 when absent */
    int vq_backbone_codebooks;      /* -1 when absent */
    int n_layers;                   /* shared_enrichment_layers + num_codebooks - 1 */
} dr_audio_config;

/* Token ids as written in config.json (cross-checks only; -1 when absent). */
typedef struct dr_token_config {
    int64_t semantic_start, semantic_end, pad, audio_pad;
    int n_eos;
    int64_t eos[8];                 /* eos_token_id: integer or list */
} dr_token_config;

/* Quantisation entries of FORMATS.md 4.6 (cross-checks only; the tensors decide). */
typedef struct dr_quant_config {
    int present;                    /* quantization_config or quantization seen */
    char quant_method[32];          /* "fp8", "modelopt", "" */
    char quant_algo[32];            /* "NVFP4", "MIXED_PRECISION", "" */
    char fmt[16];                   /* "e4m3" */
    char mode[16];                  /* "affine" */
    int block_rows, block_cols;     /* weight_block_size, default 128 x 128 */
    int group_size;                 /* 0 when absent */
    int bits;                       /* 0 when absent */
} dr_quant_config;

/* ---- switches ---- */

typedef enum dr_switch_source {
    DR_SRC_BUILTIN = 0, DR_SRC_CONFIG, DR_SRC_ENGINE_FILE, DR_SRC_CLI
} dr_switch_source;

typedef enum dr_switch_type {
    DR_SWT_BOOL, DR_SWT_INT, DR_SWT_FLOAT, DR_SWT_STRING, DR_SWT_ENUM, DR_SWT_LIST
} dr_switch_type;

/* One entry of the registry (static, built in). */
typedef struct dr_switch_def {
    const char *name;
    dr_switch_type type;
    const char *default_json;  /* JSON text of the default; "null" = auto (rule in doc) */
    const char *choices;       /* ENUM: "a|b|c"; LIST: "strings" or "pairs" */
    const char *doc;           /* one line: meaning and default rule */
} dr_switch_def;

int dr_switch_def_count(void);
const dr_switch_def *dr_switch_def_at(int i);
const dr_switch_def *dr_switch_def_find(const char *name);
const char *dr_switch_source_name(dr_switch_source s); /* "built-in", "config.json", ... */

typedef struct dr_rename_rule { char *pattern; char *replacement; } dr_rename_rule;

/* Typed view of the resolved switches. Strings are owned by the dr_config.
 * "auto" values: NULL string or -1 integer; the rule of MODEL.md 10 then applies. */
typedef struct dr_switches {
    const char *backbone_prefix;       /* NULL = auto */
    double backbone_norm_offset;
    const char *audio_config_key;      /* NULL = auto */
    const char *end_token;
    const char *input_code_table;
    int input_codebooks;               /* resolved: never -1 after dr_config_load */
    int input_code_scale_rsqrt;        /* 1: rsqrt, 0: none */
    int input_add_token_embedding;
    int deltanet_prefill_recurrent;    /* 1: recurrent (row by row), 0: chunked (default) */
    int tower_input_pre_norm;          /* 0: final_norm, 1: pre_norm */
    const char *tower_code_table;
    int64_t tower_code_stride;         /* resolved */
    double tower_norm_offset;
    int tower_concat_hidden_first;     /* 0: emb_first, 1: hidden_first */
    int tower_shared_code_none;        /* 0: c0, 1: none */
    int tower_prefill_same_row;        /* 0: next_row, 1: same_row */
    int tower_qk_norm;
    int tower_rope_half;               /* 0: interleaved, 1: half */
    int tower_rope_dims;               /* resolved */
    int tower_rope_freq_head_dim;      /* 0: rope_dims, 1: head_dim */
    int tower_head_vocab;
    int n_rename;
    dr_rename_rule *rename;
    int loader_strict;
    int n_allow_model_type;
    char **allow_model_type;
    const char *prompt_plain_instruction;
    const char *prompt_reference_instruction;
    const char *prompt_reference_text_header;
    const char *prompt_reference_speech_header;
    const char *prompt_transcript_joiner;
    int prompt_reference_speaker_tags;
    int prompt_default_speaker_tag;
    int prompt_system_without_reference;
} dr_switches;

typedef struct dr_config {
    char *model_type;
    dr_text_config text;
    dr_audio_config audio;
    dr_token_config tokens;
    dr_quant_config quant;
    dr_switches sw;
    /* For inspect: each switch's value (JSON, owned) and source, indexed like dr_switch_def_at. */
    json_t **switch_values;
    dr_switch_source *switch_sources;
    /* Unknown fields as dotted paths ("text_config.foo"), for inspect. */
    int n_unknown;
    char **unknown;
    /* Warnings (e.g. audio key guessed, quant entry disagreements). */
    int n_warnings;
    char **warnings;
    json_t *root;                      /* the parsed config.json (owned) */
} dr_config;

/* Load DIR/config.json, DIR/drama-engine.json (optional) and the `--set` overrides
 * ("name=value"; value parsed per the switch type: bools true/false, numbers, raw strings,
 * JSON for lists). */
drama_status dr_config_load(const char *dir, const char *const *sets, int n_sets, dr_config **out,
                            drama_error *err);

/* Same from memory. engine_json may be NULL (no drama-engine.json). `label` names config.json in
 * messages. */
drama_status dr_config_from_memory(const char *config_json, size_t config_len, const char *label,
                                   const char *engine_json, size_t engine_len, const char *const *sets,
                                   int n_sets, dr_config **out, drama_error *err);

void dr_config_free(dr_config *c);

/* MODEL.md 3.4: the tokenizer's semantic block [S, S + n_sem) and end id against the config's ids.
 * semantic_start_token_id != S or semantic_end_token_id != S + n_sem - 1 is an error naming both
 * values (the files do not belong together). *eos_warning (may be NULL) is set to 1 when an
 * eos_token_id is present and does not contain end_id (a warning for `drama inspect`). */
drama_status dr_config_check_token_ids(const dr_config *c, int64_t S, int64_t n_sem, int64_t end_id, int *eos_warning,
                                       drama_error *err);

/* Value of switch `name` as JSON text into buf (for printing); source into *src. Returns 0 if
 * unknown. */
int dr_config_switch_text(const dr_config *c, const char *name, char *buf, size_t buflen,
                          dr_switch_source *src);

#endif
