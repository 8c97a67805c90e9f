/* config_switch.c - the registry of engine switches (MODEL.md 10, TEXT.md 2.4) and their layered
 * resolution: built-in -> config.json "drama_engine" -> drama-engine.json -> --set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "base/error.h"
#include "model/config.h"
#include "model/config_internal.h"

#define SW_STR_(x) #x
#define SW_STR(x) SW_STR_(x) /* the DeltaNet block as text */

static const dr_switch_def SWITCHES[] = {
    {"backbone.prefix", DR_SWT_STRING, "null", NULL,
     "backbone tensor name prefix; auto: unique P with P+embed_tokens.weight and P+layers.0.input_layernorm.weight"},
    {"backbone.norm_offset", DR_SWT_FLOAT, "1.0", NULL, "RMSNorm weight offset o in x/rms*(o+w) for backbone norms"},
    {"audio_config_key", DR_SWT_STRING, "null", NULL,
     "top-level key of the audio decoder config; auto: audio_decoder_config, else the only object with num_codebooks"},
    {"end_token", DR_SWT_STRING, "\"<|im_end|>\"", NULL, "added token that ends generation"},
    {"input.code_table", DR_SWT_STRING, "\"audio_decoder.codebook_embeddings.weight\"", NULL,
     "code embedding table summed into audio input rows"},
    {"input.codebooks", DR_SWT_INT, "null", NULL,
     "codebooks summed into an audio input row; auto: vq_backbone_codebooks, else num_codebooks"},
    {"input.code_scale", DR_SWT_ENUM, "\"rsqrt\"", "rsqrt|none", "audio row scale: rsqrt = 1/sqrt(n+1), none = 1"},
    {"input.add_token_embedding", DR_SWT_BOOL, "true", NULL, "add the token embedding at audio rows"},
    {"deltanet.prefill", DR_SWT_ENUM, "\"chunked\"", "chunked|recurrent",
     "DeltaNet prefill: chunked = aligned " SW_STR(DR_GDN_CHUNK_ROWS) "-row blocks in the chunked form (fp32-close "
     "to the recurrence; prefill pieces cut at multiples of " SW_STR(DR_GDN_CHUNK_ROWS) ", so slicing changes no "
     "bit), recurrent = row by row (bit-identical to steps)"},
    {"tower.input", DR_SWT_ENUM, "\"final_norm\"", "final_norm|pre_norm", "backbone hidden fed to the tower"},
    {"tower.code_table", DR_SWT_STRING, "\"audio_decoder_mtp.codebook_embeddings.weight\"", NULL,
     "tower code embedding table"},
    {"tower.code_stride", DR_SWT_INT, "null", NULL, "row stride per codebook in the tower table; auto: audio vocab_size"},
    {"tower.norm_offset", DR_SWT_FLOAT, "0.0", NULL, "RMSNorm weight offset of tower norms"},
    {"tower.concat_order", DR_SWT_ENUM, "\"emb_first\"", "emb_first|hidden_first", "order of the eh_proj input halves"},
    {"tower.shared_code", DR_SWT_ENUM, "\"c0\"", "c0|none", "code fed to the shared tower layers"},
    {"tower.prefill_codes", DR_SWT_ENUM, "\"next_row\"", "next_row|same_row", "codes paired with h_p during prefill"},
    {"tower.qk_norm", DR_SWT_BOOL, "false", NULL, "tower q/k norm (needs attention.q_norm/k_norm.weight)"},
    {"tower.rope_pairing", DR_SWT_ENUM, "\"interleaved\"", "interleaved|half", "tower RoPE pairing"},
    {"tower.rope_dims", DR_SWT_INT, "null", NULL, "tower rotary dims; auto: round(rotary_percent * head_dim)"},
    {"tower.rope_freq_dims", DR_SWT_ENUM, "\"rope_dims\"", "rope_dims|head_dim", "denominator of the RoPE exponent"},
    {"tower.head_vocab", DR_SWT_INT, "1024", NULL, "tower head logits sampled (<= head rows)"},
    {"names.rename", DR_SWT_LIST, "[]", "pairs", "list of [regex, replacement] applied to checkpoint names"},
    {"loader.strict", DR_SWT_BOOL, "false", NULL, "unexpected tensors are fatal"},
    {"loader.allow_model_type", DR_SWT_LIST, "[]", "strings", "model_type values accepted besides fish_omni"},
    {"prompt.plain_instruction", DR_SWT_STRING, "\"convert the provided text to speech\"", NULL,
     "system message without a reference"},
    {"prompt.reference_instruction", DR_SWT_STRING,
     "\"convert the provided text to speech reference to the following:\"", NULL, "system message with a reference"},
    {"prompt.reference_text_header", DR_SWT_STRING, "\"\\n\\nText:\\n\"", NULL, "before the reference transcripts"},
    {"prompt.reference_speech_header", DR_SWT_STRING, "\"\\n\\nSpeech:\\n\"", NULL, "before the reference codes"},
    {"prompt.transcript_joiner", DR_SWT_STRING, "\"\\n\"", NULL, "between reference transcripts"},
    {"prompt.reference_speaker_tags", DR_SWT_BOOL, "true", NULL, "prefix reference transcripts with <|speaker:i|>"},
    {"prompt.default_speaker_tag", DR_SWT_BOOL, "false", NULL, "add <|speaker:0|> to untagged text"},
    {"prompt.system_without_reference", DR_SWT_BOOL, "true", NULL, "emit the system message when there is no reference"},
};

#define N_SWITCHES ((int)(sizeof(SWITCHES) / sizeof(SWITCHES[0])))

int dr_switch_def_count(void) { return N_SWITCHES; }

const dr_switch_def *dr_switch_def_at(int i) { return (i >= 0 && i < N_SWITCHES) ? &SWITCHES[i] : NULL; }

static int switch_index(const char *name) {
    for (int i = 0; i < N_SWITCHES; i++)
        if (strcmp(SWITCHES[i].name, name) == 0) return i;
    return -1;
}

const dr_switch_def *dr_switch_def_find(const char *name) {
    int i = name ? switch_index(name) : -1;
    return i < 0 ? NULL : &SWITCHES[i];
}

const char *dr_switch_source_name(dr_switch_source s) {
    switch (s) {
    case DR_SRC_BUILTIN: return "built-in";
    case DR_SRC_CONFIG: return "config.json drama_engine";
    case DR_SRC_ENGINE_FILE: return "drama-engine.json";
    case DR_SRC_CLI: return "--set";
    }
    return "?";
}

/* Is `v` an acceptable value for switch `d`? null is accepted only where the default is auto. */
static drama_status check_value(const dr_switch_def *d, const json_t *v, const char *where, drama_error *err) {
    int auto_ok = strcmp(d->default_json, "null") == 0;
    if (json_is_null(v)) {
        if (auto_ok) return DRAMA_OK;
        return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: null is not allowed (no automatic value)", where, d->name);
    }
    switch (d->type) {
    case DR_SWT_BOOL:
        if (!json_is_boolean(v)) return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected true or false", where, d->name);
        return DRAMA_OK;
    case DR_SWT_INT:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected non-negative integer", where, d->name);
        return DRAMA_OK;
    case DR_SWT_FLOAT:
        if (!json_is_number(v)) return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected number", where, d->name);
        return DRAMA_OK;
    case DR_SWT_STRING:
        if (!json_is_string(v)) return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected string", where, d->name);
        return DRAMA_OK;
    case DR_SWT_ENUM: {
        if (!json_is_string(v)) goto bad_enum;
        const char *s = json_string_value(v);
        size_t n = strlen(s);
        const char *c = d->choices;
        while (*c) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            if (len == n && strncmp(c, s, n) == 0) return DRAMA_OK;
            if (!bar) break;
            c = bar + 1;
        }
    bad_enum:
        return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected one of %s", where, d->name, d->choices);
    }
    case DR_SWT_LIST: {
        if (!json_is_array(v)) return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: expected a JSON list", where, d->name);
        size_t i;
        json_t *e;
        int pairs = strcmp(d->choices, "pairs") == 0;
        json_array_foreach(v, i, e) {
            if (pairs) {
                if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(json_array_get(e, 0)) ||
                    !json_is_string(json_array_get(e, 1)))
                    return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: item %zu: expected [regex, replacement]", where,
                                   d->name, i);
            } else if (!json_is_string(e)) {
                return dr_fail(err, DRAMA_EINVAL, "%s: switch %s: item %zu: expected string", where, d->name, i);
            }
        }
        return DRAMA_OK;
    }
    }
    return dr_fail(err, DRAMA_EINTERNAL, "switch %s: bad type", d->name);
}

drama_status dr_switches_init(dr_config *c, drama_error *err) {
    c->switch_values = calloc((size_t)N_SWITCHES, sizeof(json_t *));
    c->switch_sources = calloc((size_t)N_SWITCHES, sizeof(dr_switch_source));
    if (!c->switch_values || !c->switch_sources) return dr_fail(err, DRAMA_ENOMEM, "switches: out of memory");
    for (int i = 0; i < N_SWITCHES; i++) {
        c->switch_values[i] = json_loads(SWITCHES[i].default_json, JSON_DECODE_ANY, NULL);
        if (!c->switch_values[i]) return dr_fail(err, DRAMA_EINTERNAL, "switch %s: bad default", SWITCHES[i].name);
        c->switch_sources[i] = DR_SRC_BUILTIN;
    }
    return DRAMA_OK;
}

static drama_status set_value(dr_config *c, const char *name, json_t *v, dr_switch_source src, const char *where,
                              drama_error *err) {
    int i = switch_index(name);
    if (i < 0) return dr_fail(err, DRAMA_EINVAL, "%s: unknown switch \"%s\"", where, name);
    if (check_value(&SWITCHES[i], v, where, err)) return err ? err->code : DRAMA_EINVAL;
    json_decref(c->switch_values[i]);
    c->switch_values[i] = json_incref(v);
    c->switch_sources[i] = src;
    return DRAMA_OK;
}

drama_status dr_switches_apply_object(dr_config *c, const json_t *obj, dr_switch_source src, const char *where,
                                      drama_error *err) {
    if (!json_is_object(obj)) return dr_fail(err, DRAMA_EFORMAT, "%s: expected an object of \"name\": value", where);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        drama_status st = set_value(c, key, v, src, where, err);
        if (st) return st;
    }
    return DRAMA_OK;
}

/* "--set name=value": the value is typed by the switch. Strings are taken raw (no quoting needed);
 * a value that is a JSON string literal ("...") is decoded so escapes like \n can be written. */
drama_status dr_switches_apply_set(dr_config *c, const char *set, drama_error *err) {
    const char *eq = set ? strchr(set, '=') : NULL;
    if (!eq || eq == set) return dr_fail(err, DRAMA_EINVAL, "--set %s: expected name=value", set ? set : "(null)");
    char name[128];
    size_t nlen = (size_t)(eq - set);
    if (nlen >= sizeof name) return dr_fail(err, DRAMA_EINVAL, "--set: switch name too long");
    memcpy(name, set, nlen);
    name[nlen] = 0;
    const char *val = eq + 1;
    int i = switch_index(name);
    if (i < 0) return dr_fail(err, DRAMA_EINVAL, "--set: unknown switch \"%s\"", name);
    const dr_switch_def *d = &SWITCHES[i];
    json_t *v = NULL;
    if ((d->type == DR_SWT_STRING || d->type == DR_SWT_ENUM) && val[0] != '"' && strcmp(val, "null") != 0)
        v = json_string(val);
    else
        v = json_loads(val, JSON_DECODE_ANY, NULL);
    if (!v) return dr_fail(err, DRAMA_EINVAL, "--set %s: cannot parse value \"%s\"", name, val);
    drama_status st = set_value(c, name, v, DR_SRC_CLI, "--set", err);
    json_decref(v);
    return st;
}

static const json_t *val(const dr_config *c, const char *name) { return c->switch_values[switch_index(name)]; }

static const char *str_or_null(const dr_config *c, const char *name) {
    const json_t *v = val(c, name);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int enum_is(const dr_config *c, const char *name, const char *choice) {
    const char *s = str_or_null(c, name);
    return s && strcmp(s, choice) == 0;
}

static int int_or(const dr_config *c, const char *name, int dflt) {
    const json_t *v = val(c, name);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

/* Fill the typed view; strings point into the JSON values (owned by c). Auto integers are -1
 * here; dr_config resolves them once the audio config is known. */
drama_status dr_switches_fill(dr_config *c, drama_error *err) {
    dr_switches *s = &c->sw;
    s->backbone_prefix = str_or_null(c, "backbone.prefix");
    s->backbone_norm_offset = json_number_value(val(c, "backbone.norm_offset"));
    s->audio_config_key = str_or_null(c, "audio_config_key");
    s->end_token = str_or_null(c, "end_token");
    s->input_code_table = str_or_null(c, "input.code_table");
    s->input_codebooks = int_or(c, "input.codebooks", -1);
    s->input_code_scale_rsqrt = enum_is(c, "input.code_scale", "rsqrt");
    s->input_add_token_embedding = json_is_true(val(c, "input.add_token_embedding"));
    s->deltanet_prefill_recurrent = enum_is(c, "deltanet.prefill", "recurrent");
    s->tower_input_pre_norm = enum_is(c, "tower.input", "pre_norm");
    s->tower_code_table = str_or_null(c, "tower.code_table");
    s->tower_code_stride = int_or(c, "tower.code_stride", -1);
    s->tower_norm_offset = json_number_value(val(c, "tower.norm_offset"));
    s->tower_concat_hidden_first = enum_is(c, "tower.concat_order", "hidden_first");
    s->tower_shared_code_none = enum_is(c, "tower.shared_code", "none");
    s->tower_prefill_same_row = enum_is(c, "tower.prefill_codes", "same_row");
    s->tower_qk_norm = json_is_true(val(c, "tower.qk_norm"));
    s->tower_rope_half = enum_is(c, "tower.rope_pairing", "half");
    s->tower_rope_dims = int_or(c, "tower.rope_dims", -1);
    s->tower_rope_freq_head_dim = enum_is(c, "tower.rope_freq_dims", "head_dim");
    s->tower_head_vocab = int_or(c, "tower.head_vocab", 1024);
    s->loader_strict = json_is_true(val(c, "loader.strict"));

    const json_t *ren = val(c, "names.rename");
    s->n_rename = (int)json_array_size(ren);
    if (s->n_rename > 0) {
        s->rename = calloc((size_t)s->n_rename, sizeof(dr_rename_rule));
        if (!s->rename) return dr_fail(err, DRAMA_ENOMEM, "switches: out of memory");
        for (int i = 0; i < s->n_rename; i++) {
            json_t *p = json_array_get(ren, (size_t)i);
            s->rename[i].pattern = (char *)json_string_value(json_array_get(p, 0));
            s->rename[i].replacement = (char *)json_string_value(json_array_get(p, 1));
        }
    }
    const json_t *allow = val(c, "loader.allow_model_type");
    s->n_allow_model_type = (int)json_array_size(allow);
    if (s->n_allow_model_type > 0) {
        s->allow_model_type = calloc((size_t)s->n_allow_model_type, sizeof(char *));
        if (!s->allow_model_type) return dr_fail(err, DRAMA_ENOMEM, "switches: out of memory");
        for (int i = 0; i < s->n_allow_model_type; i++)
            s->allow_model_type[i] = (char *)json_string_value(json_array_get(allow, (size_t)i));
    }
    s->prompt_plain_instruction = str_or_null(c, "prompt.plain_instruction");
    s->prompt_reference_instruction = str_or_null(c, "prompt.reference_instruction");
    s->prompt_reference_text_header = str_or_null(c, "prompt.reference_text_header");
    s->prompt_reference_speech_header = str_or_null(c, "prompt.reference_speech_header");
    s->prompt_transcript_joiner = str_or_null(c, "prompt.transcript_joiner");
    s->prompt_reference_speaker_tags = json_is_true(val(c, "prompt.reference_speaker_tags"));
    s->prompt_default_speaker_tag = json_is_true(val(c, "prompt.default_speaker_tag"));
    s->prompt_system_without_reference = json_is_true(val(c, "prompt.system_without_reference"));
    return DRAMA_OK;
}

void dr_switches_free(dr_config *c) {
    if (c->switch_values)
        for (int i = 0; i < N_SWITCHES; i++) json_decref(c->switch_values[i]);
    free(c->switch_values);
    free(c->switch_sources);
    free(c->sw.rename);
    free(c->sw.allow_model_type);
}

int dr_config_switch_text(const dr_config *c, const char *name, char *buf, size_t buflen, dr_switch_source *src) {
    int i = name ? switch_index(name) : -1;
    if (i < 0 || !c || !c->switch_values) return 0;
    if (buf && buflen) {
        char *s = json_dumps(c->switch_values[i], JSON_ENCODE_ANY | JSON_COMPACT);
        snprintf(buf, buflen, "%s", s ? s : "?");
        free(s);
    }
    if (src) *src = c->switch_sources[i];
    return 1;
}
