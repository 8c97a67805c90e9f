/* config.c - config.json -> dr_config (MODEL.md 3), with the switch layers of MODEL.md 10.
 * Every field error names the file and the dotted field path. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/file.h"
#include "model/config.h"
#include "model/config_internal.h"

#define MAX_CONFIG_BYTES ((size_t)64 << 20) /* config.json and drama-engine.json are a few KiB */

/* Reading one field: absent -> default (or error when required), wrong type -> error. */
typedef struct reader {
    const char *label;   /* "config.json" */
    const char *section; /* "text_config" or "" */
    drama_error *err;
    int failed;
} reader;

static void field_fail(reader *r, const char *key, const char *what) {
    if (!r->failed)
        dr_fail(r->err, DRAMA_EFORMAT, "%s: %s%s%s: %s", r->label, r->section, r->section[0] ? "." : "", key, what);
    r->failed = 1;
}

/* Integer-valued JSON number (an integral real like 4.0 is accepted). */
static int json_as_int64(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && fabs(d) < 9e15) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

/* min: smallest accepted value; required: absent is an error. Values capped at `max` keep
 * every derived size product in range (a malicious config must not overflow sizes later). */
static int64_t get_int(reader *r, const json_t *obj, const char *key, int required, int64_t dflt, int64_t min,
                       int64_t max) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) field_fail(r, key, min > 0 ? "missing (expected positive integer)" : "missing (expected integer)");
        return dflt;
    }
    int64_t x;
    if (!json_as_int64(v, &x) || x < min || x > max) {
        char msg[96];
        if (min > 0)
            snprintf(msg, sizeof msg, "expected positive integer (at most %lld)", (long long)max);
        else
            snprintf(msg, sizeof msg, "expected integer in [%lld, %lld]", (long long)min, (long long)max);
        field_fail(r, key, msg);
        return dflt;
    }
    return x;
}

static double get_num(reader *r, const json_t *obj, const char *key, int required, double dflt, int positive) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) field_fail(r, key, "missing (expected number)");
        return dflt;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || (positive && json_number_value(v) <= 0)) {
        field_fail(r, key, positive ? "expected positive number" : "expected number");
        return dflt;
    }
    if (fabs(json_number_value(v)) > FLT_MAX) { /* used as fp32: it would become inf */
        field_fail(r, key, "outside the fp32 range");
        return dflt;
    }
    return json_number_value(v);
}

static int get_bool(reader *r, const json_t *obj, const char *key, int dflt) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return dflt;
    if (!json_is_boolean(v)) {
        field_fail(r, key, "expected true or false");
        return dflt;
    }
    return json_is_true(v);
}

static void get_str(reader *r, const json_t *obj, const char *key, char *buf, size_t buflen) {
    const json_t *v = json_object_get(obj, key);
    buf[0] = 0;
    if (!v || json_is_null(v)) return;
    if (!json_is_string(v)) {
        field_fail(r, key, "expected string");
        return;
    }
    snprintf(buf, buflen, "%s", json_string_value(v));
}

static int add_str(int *n, char ***list, const char *s) {
    char **nl = realloc(*list, (size_t)(*n + 1) * sizeof(char *));
    if (!nl) return 0;
    *list = nl;
    nl[*n] = strdup(s);
    if (!nl[*n]) return 0;
    (*n)++;
    return 1;
}

/* Record keys of obj that are not in `known` (NULL-terminated) as "section.key". */
static void note_unknown(dr_config *c, const json_t *obj, const char *section, const char *const *known) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int found = 0;
        for (int i = 0; known[i]; i++)
            if (strcmp(known[i], key) == 0) found = 1;
        if (found) continue;
        char path[512];
        snprintf(path, sizeof path, "%s%s%s", section, section[0] ? "." : "", key);
        add_str(&c->n_unknown, &c->unknown, path);
    }
}

static void warn(dr_config *c, const char *fmt, ...) DR_PRINTF(2, 3);
static void warn(dr_config *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    add_str(&c->n_warnings, &c->warnings, msg);
}

#define MAX_DIM ((int64_t)1 << 24)   /* any single dimension */
#define MAX_COUNT ((int64_t)1 << 16) /* layers, heads, experts, codebooks */
#define MAX_VOCAB ((int64_t)1 << 31)

static const char *const TEXT_KNOWN[] = {
    "vocab_size", "hidden_size", "num_hidden_layers", "layer_types", "full_attention_interval",
    "num_attention_heads", "num_key_value_heads", "head_dim", "attn_output_gate", "rms_norm_eps",
    "rope_parameters", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved",
    "linear_conv_kernel_dim", "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
    "linear_value_head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "norm_topk_prob", "tie_word_embeddings", "max_position_embeddings",
    "mlp_only_layers", "decoder_sparse_step", "model_type", "hidden_act", "attention_bias", "dtype",
    "initializer_range", "mamba_ssm_dtype", "mtp_num_hidden_layers", "rope_scaling", NULL};

static void parse_text(dr_config *c, const json_t *t, reader *r) {
    dr_text_config *x = &c->text;
    x->vocab_size = get_int(r, t, "vocab_size", 1, 0, 1, MAX_VOCAB);
    x->hidden_size = get_int(r, t, "hidden_size", 1, 0, 1, MAX_DIM);
    x->n_layers = (int)get_int(r, t, "num_hidden_layers", 1, 0, 1, MAX_COUNT);
    x->n_heads = (int)get_int(r, t, "num_attention_heads", 1, 0, 1, MAX_COUNT);
    x->n_kv_heads = (int)get_int(r, t, "num_key_value_heads", 0, x->n_heads, 1, MAX_COUNT);
    int64_t hd_default = x->n_heads > 0 ? x->hidden_size / x->n_heads : 0;
    x->head_dim = (int)get_int(r, t, "head_dim", 0, hd_default, 1, MAX_COUNT);
    x->attn_output_gate = get_bool(r, t, "attn_output_gate", 1);
    x->rms_norm_eps = get_num(r, t, "rms_norm_eps", 0, 1e-6, 1);
    x->full_attention_interval = (int)get_int(r, t, "full_attention_interval", 0, 0, 1, MAX_COUNT);
    if (r->failed) return;
    if (x->n_heads % x->n_kv_heads != 0) field_fail(r, "num_key_value_heads", "must divide num_attention_heads");

    /* RoPE: nested rope_parameters wins; flat keys are accepted (MODEL.md 3.2). */
    const json_t *rp = json_object_get(t, "rope_parameters");
    if (rp && !json_is_object(rp) && !json_is_null(rp)) field_fail(r, "rope_parameters", "expected object");
    const json_t *rsrc = json_is_object(rp) ? rp : t;
    reader rr = *r;
    rr.section = json_is_object(rp) ? "text_config.rope_parameters" : "text_config";
    const json_t *theta_obj = json_object_get(rsrc, "rope_theta") ? rsrc : t;
    const json_t *prf_obj = json_object_get(rsrc, "partial_rotary_factor") ? rsrc : t;
    x->rope_theta = get_num(&rr, theta_obj, "rope_theta", 1, 0, 1);
    x->partial_rotary_factor = get_num(&rr, prf_obj, "partial_rotary_factor", 0, 1.0, 1);
    x->mrope_interleaved = get_bool(&rr, rsrc, "mrope_interleaved", 0);
    const json_t *ms = json_object_get(rsrc, "mrope_section");
    if (json_is_array(ms))
        for (size_t i = 0; i < 3 && i < json_array_size(ms); i++) {
            int64_t v;
            if (json_as_int64(json_array_get(ms, i), &v) && v >= 0 && v < MAX_COUNT) x->mrope_section[i] = (int)v;
        }
    if (rr.failed) {
        r->failed = 1;
        return;
    }
    if (x->partial_rotary_factor > 1.0) {
        field_fail(r, "partial_rotary_factor", "expected a value in (0, 1]");
        return;
    }
    x->rope_dims = (int)lround(x->partial_rotary_factor * x->head_dim);
    if (x->rope_dims % 2 != 0 || x->rope_dims <= 0) {
        field_fail(r, "partial_rotary_factor", "partial_rotary_factor * head_dim must be a positive even integer");
        return;
    }

    x->conv_kernel = (int)get_int(r, t, "linear_conv_kernel_dim", 1, 0, 1, 1024);
    x->lin_k_heads = (int)get_int(r, t, "linear_num_key_heads", 1, 0, 1, MAX_COUNT);
    x->lin_k_dim = (int)get_int(r, t, "linear_key_head_dim", 1, 0, 1, MAX_COUNT);
    x->lin_v_heads = (int)get_int(r, t, "linear_num_value_heads", 1, 0, 1, MAX_COUNT);
    x->lin_v_dim = (int)get_int(r, t, "linear_value_head_dim", 1, 0, 1, MAX_COUNT);
    x->n_experts = (int)get_int(r, t, "num_experts", 1, 0, 1, MAX_COUNT);
    x->n_experts_per_tok = (int)get_int(r, t, "num_experts_per_tok", 1, 0, 1, MAX_COUNT);
    x->moe_intermediate = get_int(r, t, "moe_intermediate_size", 1, 0, 1, MAX_DIM);
    x->shared_intermediate = get_int(r, t, "shared_expert_intermediate_size", 1, 0, 1, MAX_DIM);
    x->norm_topk_prob = get_bool(r, t, "norm_topk_prob", 1);
    x->max_position_embeddings = get_int(r, t, "max_position_embeddings", 0, 0, 0, INT64_MAX / 2);
    x->decoder_sparse_step = (int)get_int(r, t, "decoder_sparse_step", 0, 1, 0, MAX_COUNT);
    const json_t *mol = json_object_get(t, "mlp_only_layers");
    if (mol && !json_is_null(mol)) {
        if (!json_is_array(mol)) field_fail(r, "mlp_only_layers", "expected list");
        else x->n_mlp_only_layers = (int)json_array_size(mol);
    }
    if (r->failed) return;
    if (x->lin_v_heads % x->lin_k_heads != 0)
        field_fail(r, "linear_num_value_heads", "must be a multiple of linear_num_key_heads");
    if (x->n_experts_per_tok > x->n_experts) field_fail(r, "num_experts_per_tok", "must not exceed num_experts");
    if (r->failed) return;

    x->layer_types = calloc((size_t)x->n_layers, sizeof(dr_layer_kind));
    if (!x->layer_types) {
        field_fail(r, "layer_types", "out of memory");
        return;
    }
    const json_t *lt = json_object_get(t, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)x->n_layers) {
            field_fail(r, "layer_types", "expected a list of num_hidden_layers strings");
            return;
        }
        for (int i = 0; i < x->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && strcmp(s, "linear_attention") == 0) x->layer_types[i] = DR_LAYER_LINEAR;
            else if (s && strcmp(s, "full_attention") == 0) x->layer_types[i] = DR_LAYER_FULL;
            else {
                char key[64];
                snprintf(key, sizeof key, "layer_types[%d]", i);
                field_fail(r, key, "expected \"linear_attention\" or \"full_attention\"");
                return;
            }
        }
    } else {
        /* MODEL.md 3.2: without layer_types, layer i is full attention iff (i+1) % interval == 0. */
        int interval = x->full_attention_interval;
        if (interval <= 0) {
            field_fail(r, "layer_types", "missing (and no full_attention_interval)");
            return;
        }
        for (int i = 0; i < x->n_layers; i++) x->layer_types[i] = ((i + 1) % interval == 0) ? DR_LAYER_FULL : DR_LAYER_LINEAR;
    }
}

static const char *const AUDIO_KNOWN[] = {"dim", "n_head", "n_local_heads", "head_dim", "intermediate_size",
                                          "norm_eps", "num_codebooks", "vocab_size", "shared_enrichment_layers",
                                          "rope_base", "rotary_percent", "vq_backbone_codebooks", NULL};

static void parse_audio(dr_config *c, const json_t *a, reader *r) {
    dr_audio_config *x = &c->audio;
    x->dim = (int)get_int(r, a, "dim", 1, 0, 1, MAX_DIM);
    x->n_head = (int)get_int(r, a, "n_head", 1, 0, 1, MAX_COUNT);
    x->n_local_heads = (int)get_int(r, a, "n_local_heads", 0, x->n_head, 1, MAX_COUNT);
    x->head_dim = (int)get_int(r, a, "head_dim", 0, x->n_head > 0 ? x->dim / x->n_head : 0, 1, MAX_COUNT);
    x->intermediate_size = get_int(r, a, "intermediate_size", 1, 0, 1, MAX_DIM);
    x->norm_eps = get_num(r, a, "norm_eps", 0, 1e-6, 1);
    x->num_codebooks = (int)get_int(r, a, "num_codebooks", 1, 0, 1, MAX_COUNT);
    x->vocab_size = get_int(r, a, "vocab_size", 1, 0, 1, MAX_DIM);
    x->shared_enrichment_layers = (int)get_int(r, a, "shared_enrichment_layers", 1, 0, 0, MAX_COUNT);
    x->rope_base = get_num(r, a, "rope_base", 0, -1.0, 1); /* absent: the CONFIRMED 1e7, with a warning */
    x->rotary_percent = get_num(r, a, "rotary_percent", 0, -1.0, 1);
    x->vq_backbone_codebooks = (int)get_int(r, a, "vq_backbone_codebooks", 0, -1, 0, MAX_COUNT);
    if (r->failed) return;
    if (x->n_head % x->n_local_heads != 0) field_fail(r, "n_local_heads", "must divide n_head");
    if (x->rotary_percent > 1.0) field_fail(r, "rotary_percent", "expected a value in (0, 1]");
    if (x->vq_backbone_codebooks > x->num_codebooks)
        field_fail(r, "vq_backbone_codebooks", "must not exceed num_codebooks");
    x->n_layers = x->shared_enrichment_layers + x->num_codebooks - 1;
    if (x->rope_base < 0) {
        x->rope_base = 1e7;
        warn(c, "%s.rope_base absent: using 1e7 (MODEL.md 3.3, CONFIRMED value)", x->key);
    }
}

/* MODEL.md 3.1: switch audio_config_key; else audio_decoder_config; else the only top-level
 * object with num_codebooks. */
static drama_status find_audio_key(dr_config *c, const char *label, const json_t **out, drama_error *err) {
    const json_t *root = c->root;
    if (c->sw.audio_config_key) {
        const json_t *a = json_object_get(root, c->sw.audio_config_key);
        if (!json_is_object(a))
            return dr_fail(err, DRAMA_EFORMAT, "%s: %s (switch audio_config_key): missing or not an object", label,
                           c->sw.audio_config_key);
        snprintf(c->audio.key, sizeof c->audio.key, "%s", c->sw.audio_config_key);
        *out = a;
        return DRAMA_OK;
    }
    const json_t *a = json_object_get(root, "audio_decoder_config");
    if (a) {
        if (!json_is_object(a)) return dr_fail(err, DRAMA_EFORMAT, "%s: audio_decoder_config: expected object", label);
        snprintf(c->audio.key, sizeof c->audio.key, "audio_decoder_config");
        *out = a;
        return DRAMA_OK;
    }
    char names[512] = "";
    int n = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (json_is_object(v) && json_object_get(v, "num_codebooks")) {
            if (n == 0) {
                snprintf(c->audio.key, sizeof c->audio.key, "%s", key);
                *out = v;
            }
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", n ? ", " : "", key);
            n++;
        }
    }
    if (n == 1) {
        warn(c, "audio decoder config read from key \"%s\" (no audio_decoder_config)", c->audio.key);
        return DRAMA_OK;
    }
    if (n == 0)
        return dr_fail(err, DRAMA_EFORMAT,
                       "%s: no audio decoder config: no audio_decoder_config and no top-level object with num_codebooks "
                       "(set switch audio_config_key)",
                       label);
    return dr_fail(err, DRAMA_EFORMAT,
                   "%s: several candidate audio decoder configs (%s): set switch audio_config_key", label, names);
}

static void parse_tokens(dr_config *c, const json_t *root, reader *r) {
    dr_token_config *t = &c->tokens;
    t->semantic_start = get_int(r, root, "semantic_start_token_id", 0, -1, 0, MAX_VOCAB);
    t->semantic_end = get_int(r, root, "semantic_end_token_id", 0, -1, 0, MAX_VOCAB);
    t->pad = get_int(r, root, "pad_token_id", 0, -1, 0, MAX_VOCAB);
    t->audio_pad = get_int(r, root, "audio_pad_token_id", 0, -1, 0, MAX_VOCAB);
    const json_t *e = json_object_get(root, "eos_token_id");
    if (!e || json_is_null(e)) return;
    if (json_is_array(e)) {
        size_t i;
        json_t *v;
        json_array_foreach(e, i, v) {
            int64_t id;
            if (!json_as_int64(v, &id) || id < 0) {
                field_fail(r, "eos_token_id", "expected integer or list of integers");
                return;
            }
            if (t->n_eos < (int)(sizeof t->eos / sizeof t->eos[0])) t->eos[t->n_eos++] = id;
        }
    } else {
        int64_t id;
        if (!json_as_int64(e, &id) || id < 0) {
            field_fail(r, "eos_token_id", "expected integer or list of integers");
            return;
        }
        t->eos[t->n_eos++] = id;
    }
}

static void parse_quant_obj(dr_config *c, const json_t *q, reader *r) {
    dr_quant_config *x = &c->quant;
    x->present = 1;
    char buf[32];
    get_str(r, q, "quant_method", buf, sizeof buf);
    if (buf[0]) snprintf(x->quant_method, sizeof x->quant_method, "%s", buf);
    get_str(r, q, "quant_algo", buf, sizeof buf);
    if (buf[0]) snprintf(x->quant_algo, sizeof x->quant_algo, "%s", buf);
    get_str(r, q, "fmt", buf, sizeof buf);
    if (buf[0]) snprintf(x->fmt, sizeof x->fmt, "%s", buf);
    get_str(r, q, "mode", buf, sizeof buf);
    if (buf[0]) snprintf(x->mode, sizeof x->mode, "%s", buf);
    int64_t g = get_int(r, q, "group_size", 0, 0, 1, MAX_DIM);
    if (g) x->group_size = (int)g;
    int64_t b = get_int(r, q, "bits", 0, 0, 1, 64);
    if (b) x->bits = (int)b;
    const json_t *bs = json_object_get(q, "weight_block_size");
    if (bs && !json_is_null(bs)) {
        int64_t br, bc;
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_as_int64(json_array_get(bs, 0), &br) ||
            !json_as_int64(json_array_get(bs, 1), &bc) || br <= 0 || bc <= 0 || br > MAX_DIM || bc > MAX_DIM) {
            field_fail(r, "weight_block_size", "expected [rows, cols] of positive integers");
            return;
        }
        x->block_rows = (int)br;
        x->block_cols = (int)bc;
    }
}

static const char *const TOP_KNOWN[] = {"model_type", "architectures", "text_config", "semantic_start_token_id",
                                        "semantic_end_token_id", "eos_token_id", "pad_token_id", "audio_pad_token_id",
                                        "quantization_config", "quantization", "drama_engine", "tie_word_embeddings",
                                        "dtype", "transformers_version", "torch_dtype", NULL};

drama_status dr_config_from_memory(const char *config_json, size_t config_len, const char *label,
                                   const char *engine_json, size_t engine_len, const char *const *sets, int n_sets,
                                   dr_config **out, drama_error *err) {
    *out = NULL;
    if (!label) label = "config.json";
    dr_config *c = calloc(1, sizeof *c);
    if (!c) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    drama_status st = DRAMA_OK;
    json_error_t je;
    c->quant.block_rows = c->quant.block_cols = 128;
    c->root = json_loadb(config_json ? config_json : "", config_json ? config_len : 0, JSON_REJECT_DUPLICATES, &je);
    if (!c->root) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d (byte %d): %s", label, je.line,
                     je.column, je.position, je.text);
        goto fail;
    }
    if (!json_is_object(c->root)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: expected a JSON object", label);
        goto fail;
    }

    /* Switch layers first: audio_config_key and loader.allow_model_type affect parsing. */
    if ((st = dr_switches_init(c, err))) goto fail;
    const json_t *de = json_object_get(c->root, "drama_engine");
    if (de) {
        char where[256];
        snprintf(where, sizeof where, "%s: drama_engine", label);
        if ((st = dr_switches_apply_object(c, de, DR_SRC_CONFIG, where, err))) goto fail;
    }
    if (engine_json) {
        json_t *ej = json_loadb(engine_json, engine_len, JSON_REJECT_DUPLICATES, &je);
        if (!ej) {
            st = dr_fail(err, DRAMA_EFORMAT, "drama-engine.json: invalid JSON at line %d column %d: %s", je.line,
                         je.column, je.text);
            goto fail;
        }
        st = dr_switches_apply_object(c, ej, DR_SRC_ENGINE_FILE, "drama-engine.json", err);
        json_decref(ej);
        if (st) goto fail;
    }
    for (int i = 0; i < n_sets; i++)
        if ((st = dr_switches_apply_set(c, sets[i], err))) goto fail;
    if ((st = dr_switches_fill(c, err))) goto fail;

    /* model_type */
    const json_t *mt = json_object_get(c->root, "model_type");
    if (!json_is_string(mt)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: model_type: missing or not a string (expected \"fish_omni\")", label);
        goto fail;
    }
    c->model_type = strdup(json_string_value(mt));
    if (!c->model_type) {
        st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
        goto fail;
    }
    if (strcmp(c->model_type, "fish_omni") != 0) {
        int allowed = 0;
        for (int i = 0; i < c->sw.n_allow_model_type; i++)
            if (strcmp(c->sw.allow_model_type[i], c->model_type) == 0) allowed = 1;
        if (!allowed) {
            st = dr_fail(err, DRAMA_EUNSUPPORTED,
                         "%s: model_type: \"%s\" is not \"fish_omni\" (switch loader.allow_model_type can accept it)",
                         label, c->model_type);
            goto fail;
        }
    }

    reader r = {label, "text_config", err, 0};
    const json_t *tc = json_object_get(c->root, "text_config");
    if (!json_is_object(tc)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: text_config: missing or not an object", label);
        goto fail;
    }
    parse_text(c, tc, &r);
    if (r.failed) {
        st = err ? err->code : DRAMA_EFORMAT;
        goto fail;
    }
    note_unknown(c, tc, "text_config", TEXT_KNOWN);
    {
        reader rt = {label, "", err, 0};
        c->text.tie_word_embeddings = get_bool(&rt, tc, "tie_word_embeddings", get_bool(&rt, c->root, "tie_word_embeddings", 0));
        parse_tokens(c, c->root, &rt);
        if (rt.failed) {
            st = err ? err->code : DRAMA_EFORMAT;
            goto fail;
        }
    }

    const json_t *ac = NULL;
    if ((st = find_audio_key(c, label, &ac, err))) goto fail;
    reader ra = {label, c->audio.key, err, 0};
    parse_audio(c, ac, &ra);
    if (ra.failed) {
        st = err ? err->code : DRAMA_EFORMAT;
        goto fail;
    }
    note_unknown(c, ac, c->audio.key, AUDIO_KNOWN);

    /* Quantisation entries (cross-checks only). */
    const char *qkeys[2] = {"quantization_config", "quantization"};
    for (int i = 0; i < 2; i++) {
        const json_t *q = json_object_get(c->root, qkeys[i]);
        if (!q || json_is_null(q)) continue;
        reader rq = {label, qkeys[i], err, 0};
        if (!json_is_object(q)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: %s: expected object", label, qkeys[i]);
            goto fail;
        }
        parse_quant_obj(c, q, &rq);
        if (rq.failed) {
            st = err ? err->code : DRAMA_EFORMAT;
            goto fail;
        }
    }

    /* Unknown top-level keys (the audio config key is known once detected). */
    {
        const char *key;
        json_t *v;
        json_object_foreach(c->root, key, v) {
            int known = strcmp(key, c->audio.key) == 0;
            for (int i = 0; TOP_KNOWN[i] && !known; i++)
                if (strcmp(TOP_KNOWN[i], key) == 0) known = 1;
            if (!known) add_str(&c->n_unknown, &c->unknown, key);
        }
    }

    /* Resolve the automatic switch values (MODEL.md 10). */
    if (c->sw.input_codebooks < 0)
        c->sw.input_codebooks =
            c->audio.vq_backbone_codebooks >= 0 ? c->audio.vq_backbone_codebooks : c->audio.num_codebooks;
    if (c->sw.input_codebooks > c->audio.num_codebooks) {
        st = dr_fail(err, DRAMA_EINVAL, "switch input.codebooks: %d exceeds num_codebooks %d", c->sw.input_codebooks,
                     c->audio.num_codebooks);
        goto fail;
    }
    if (c->sw.tower_code_stride < 0) c->sw.tower_code_stride = c->audio.vocab_size;
    if (c->sw.tower_rope_dims < 0) {
        double rp = c->audio.rotary_percent;
        if (rp < 0) {
            /* 64 rotary dims are CONFIRMED for the tower (MODEL.md 3.3) */
            c->sw.tower_rope_dims = c->audio.head_dim < 64 ? c->audio.head_dim & ~1 : 64;
            warn(c, "%s.rotary_percent absent: tower.rope_dims = %d", c->audio.key, c->sw.tower_rope_dims);
        } else {
            c->sw.tower_rope_dims = (int)lround(rp * c->audio.head_dim);
        }
    }
    if (c->sw.tower_rope_dims % 2 != 0 || c->sw.tower_rope_dims > c->audio.head_dim) {
        st = dr_fail(err, DRAMA_EINVAL, "switch tower.rope_dims: %d must be even and at most head_dim %d",
                     c->sw.tower_rope_dims, c->audio.head_dim);
        goto fail;
    }

    /* Cross-check of config token ids among themselves (the tokenizer check lives in text/). */
    if (c->tokens.semantic_start >= 0 && c->tokens.semantic_end >= 0 &&
        c->tokens.semantic_end - c->tokens.semantic_start + 1 != c->audio.vocab_size)
        warn(c, "semantic_end_token_id - semantic_start_token_id + 1 differs from %s.vocab_size", c->audio.key);
    *out = c;
    return DRAMA_OK;
fail:
    dr_config_free(c);
    return st ? st : DRAMA_EFORMAT;
}

/* config.json is required, drama-engine.json optional: only its absence (not a read error) is skipped. */
static drama_status read_config_file(const char *path, int optional, char **text, size_t *len, drama_error *err) {
    struct stat sb;
    if (optional && stat(path, &sb) != 0 && errno == ENOENT) return DRAMA_OK;
    drama_status st = dr_read_file(path, MAX_CONFIG_BYTES, text, len, err);
    if (st) dr_error_prefix(err, "model config: ");
    return st;
}

drama_status dr_config_load(const char *dir, const char *const *sets, int n_sets, dr_config **out, drama_error *err) {
    *out = NULL;
    char path[4096], epath[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(epath, sizeof epath, "%s/drama-engine.json", dir);
    size_t len = 0, elen = 0;
    char *text = NULL, *etext = NULL;
    drama_status st = read_config_file(path, 0, &text, &len, err);
    if (!st) st = read_config_file(epath, 1, &etext, &elen, err);
    if (st) {
        free(text);
        return st;
    }
    st = dr_config_from_memory(text, len, path, etext, elen, sets, n_sets, out, err);
    free(text);
    free(etext);
    if (st) return st;
    /* hf_quant_config.json (ModelOpt exports): a cross-check source like quantization_config. */
    char qpath[4096];
    snprintf(qpath, sizeof qpath, "%s/hf_quant_config.json", dir);
    json_t *hq;
    st = dr_read_json_file(qpath, MAX_CONFIG_BYTES, 1, &hq, err);
    if (st) {
        dr_error_prefix(err, "model config: ");
        dr_config_free(*out);
        *out = NULL;
        return st;
    }
    const json_t *q = hq ? json_object_get(hq, "quantization") : NULL;
    if (json_is_object(q)) {
        reader rq = {qpath, "quantization", err, 0};
        dr_config *c = *out;
        dr_quant_config keep = c->quant;
        parse_quant_obj(c, q, &rq);
        if (rq.failed) {
            json_decref(hq);
            dr_config_free(c);
            *out = NULL;
            return err ? err->code : DRAMA_EFORMAT;
        }
        if (keep.present && keep.quant_algo[0] && strcmp(keep.quant_algo, c->quant.quant_algo) != 0)
            warn(c, "%s: quant_algo \"%s\" differs from config.json's \"%s\"", qpath, c->quant.quant_algo,
                 keep.quant_algo);
    }
    json_decref(hq);
    return DRAMA_OK;
}

void dr_config_free(dr_config *c) {
    if (!c) return;
    dr_switches_free(c);
    free(c->text.layer_types);
    free(c->model_type);
    for (int i = 0; i < c->n_unknown; i++) free(c->unknown[i]);
    free(c->unknown);
    for (int i = 0; i < c->n_warnings; i++) free(c->warnings[i]);
    free(c->warnings);
    json_decref(c->root);
    free(c);
}

drama_status dr_config_check_token_ids(const dr_config *c, int64_t S, int64_t n_sem, int64_t end_id, int *eos_warning,
                                       drama_error *err) {
    if (eos_warning) *eos_warning = 0;
    const dr_token_config *t = &c->tokens;
    if (t->semantic_start >= 0 && t->semantic_start != S)
        return dr_fail(err, DRAMA_EFORMAT,
                       "config.json semantic_start_token_id %lld differs from tokenizer id(<|semantic:0|>) %lld",
                       (long long)t->semantic_start, (long long)S);
    if (t->semantic_end >= 0 && t->semantic_end != S + n_sem - 1)
        return dr_fail(err, DRAMA_EFORMAT, "config.json semantic_end_token_id %lld differs from tokenizer's last semantic id %lld",
                       (long long)t->semantic_end, (long long)(S + n_sem - 1));
    if (t->n_eos > 0 && eos_warning) {
        int found = 0;
        for (int i = 0; i < t->n_eos; i++) found |= t->eos[i] == end_id;
        *eos_warning = !found;
    }
    return DRAMA_OK;
}
