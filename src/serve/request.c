/* request.c - /v1/tts, /v1/audio/speech and voice-upload bodies (API.md 3.1, 4, 5). */
#include "serve/request.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

const char *const dr_default_model_ids[] = {"drama-3", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", NULL};

int dr_replica_id_char(int ch) { return isalnum((unsigned char)ch) || (ch && strchr("-_.:", ch) != NULL); }

int dr_voice_id_valid(const char *id, size_t len) {
    if (len < 1 || len > 64 || (len == 7 && !memcmp(id, "default", 7))) return 0;
    for (size_t k = 0; k < len; k++) {
        char c = id[k];
        int alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (k == 0 || (c != '_' && c != '-'))) return 0;
    }
    return 1;
}

int dr_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    char *clean = malloc(n + 4);
    if (!clean) return -1;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        char c = s[k];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        clean[m++] = c;
    }
    size_t pad = 0;
    while (pad < 2 && m > pad && clean[m - 1 - pad] == '=') pad++;
    int inner_pad = memchr(clean, '=', m - pad) != NULL;
    if (inner_pad || m % 4 == 1 || (pad && m % 4)) { /* '=' inside, a lone symbol, padding not ending a group */
        free(clean);
        return -1;
    }
    while (m % 4) clean[m++] = '=', pad++;
    uint8_t *buf = malloc(m / 4 * 3 + 1);
    int got = buf && m ? EVP_DecodeBlock(buf, (const unsigned char *)clean, (int)m) : 0;
    free(clean);
    if (!buf || got < 0 || (size_t)got < pad) {
        free(buf);
        return -1;
    }
    *out = buf;
    *out_len = (size_t)got - pad;
    return 0;
}

char *dr_base64_encode(const void *data, size_t n) {
    if (n > (size_t)1 << 30) return NULL;
    char *s = malloc(4 * ((n + 2) / 3) + 1);
    if (s) s[EVP_EncodeBlock((unsigned char *)s, data, (int)n)] = 0;
    return s;
}

void dr_synth_req_free(dr_synth_req *r) {
    if (!r) return;
    for (int k = 0; k < r->n_refs; k++) free(r->refs[k].audio);
    r->n_refs = 0;
}

/* audio: a base64 string (JSON and msgpack) or raw bytes (msgpack bin, form file). */
static int read_audio(const dr_val *map, const char *param, uint8_t **out, size_t *len, dr_api_error *e) {
    const dr_val *a = dr_val_get(map, "audio");
    if (!a || a->type == DR_VAL_NULL) return dr_api_fail(e, 400, "missing_field", param, "%s is required", param);
    if (a->type == DR_VAL_BIN) {
        *out = malloc(a->len ? a->len : 1);
        if (!*out) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
        memcpy(*out, a->s, a->len);
        *len = a->len;
    } else if (a->type == DR_VAL_STR) {
        if (dr_base64_decode(a->s, a->len, out, len))
            return dr_api_fail(e, 400, "bad_audio", param, "%s is not valid base64", param);
    } else {
        return dr_api_fail(e, 400, "wrong_type", param, "%s must be a base64 string or binary, got %s", param,
                           dr_val_type_name(a->type));
    }
    if (*len == 0) return dr_api_fail(e, 400, "bad_audio", param, "%s is empty", param);
    return 0;
}

static int check_voice_id(const char *id, size_t len, const char *param, dr_api_error *e) {
    if (!dr_voice_id_valid(id, len))
        return dr_api_fail(e, 400, "invalid_voice_id", param,
                           "%s must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ and not be 'default'", param);
    return 0;
}

static int read_references(const dr_val *body, dr_synth_req *r, dr_api_error *e) {
    const dr_val *refs = dr_val_get(body, "references");
    if (refs && refs->type != DR_VAL_NULL) {
        if (refs->type != DR_VAL_ARRAY)
            return dr_api_fail(e, 400, "wrong_type", "references", "references must be an array, got %s",
                               dr_val_type_name(refs->type));
        if (refs->len > DR_MAX_REFERENCES)
            return dr_api_fail(e, 400, "out_of_range", "references", "references holds %zu entries, at most %d",
                               refs->len, DR_MAX_REFERENCES);
        for (size_t k = 0; k < refs->len; k++) {
            char p[64];
            const dr_val *ref = &refs->items[k];
            snprintf(p, sizeof p, "references[%zu]", k);
            if (ref->type != DR_VAL_MAP)
                return dr_api_fail(e, 400, "wrong_type", p, "%s must be an object, got %s", p, dr_val_type_name(ref->type));
            dr_ref_in *in = &r->refs[r->n_refs++];
            snprintf(p, sizeof p, "references[%zu].audio", k);
            if (read_audio(ref, p, &in->audio, &in->audio_len, e)) return e->status;
            snprintf(p, sizeof p, "references[%zu].text", k);
            if (dr_field_string(ref, "text", p, &in->text, NULL, 1, e)) return e->status;
        }
    }
    const dr_val *ids = dr_val_get(body, "reference_id");
    if (!ids || ids->type == DR_VAL_NULL) return 0;
    if (ids->type == DR_VAL_STR) {
        if (check_voice_id(ids->s, ids->len, "reference_id", e)) return e->status;
        r->voice_ids[r->n_voice_ids++] = ids->s;
    } else if (ids->type == DR_VAL_ARRAY) {
        if (ids->len > DR_MAX_REFERENCES)
            return dr_api_fail(e, 400, "out_of_range", "reference_id", "reference_id holds %zu ids, at most %d",
                               ids->len, DR_MAX_REFERENCES);
        for (size_t k = 0; k < ids->len; k++) {
            char p[64];
            snprintf(p, sizeof p, "reference_id[%zu]", k);
            const dr_val *id = &ids->items[k];
            if (id->type != DR_VAL_STR)
                return dr_api_fail(e, 400, "wrong_type", p, "%s must be a string, got %s", p, dr_val_type_name(id->type));
            if (check_voice_id(id->s, id->len, p, e)) return e->status;
            r->voice_ids[r->n_voice_ids++] = id->s;
        }
    } else {
        return dr_api_fail(e, 400, "wrong_type", "reference_id", "reference_id must be a string, an array of strings or null, got %s",
                           dr_val_type_name(ids->type));
    }
    if (r->n_voice_ids && r->n_refs)
        return dr_api_fail(e, 400, "unsupported_value", "reference_id",
                           "reference_id cannot be combined with a non-empty references");
    return 0;
}

/* One of the listed strings, else `code` naming the field. */
static int read_choice(const dr_val *body, const char *key, const char *const *choices, const char *code, int *out,
                       dr_api_error *e) {
    const char *s = NULL;
    size_t n = 0;
    if (dr_field_string(body, key, key, &s, &n, 0, e)) return e->status;
    if (!s) return 0;
    for (int k = 0; choices[k]; k++)
        if (strlen(choices[k]) == n && !memcmp(choices[k], s, n)) {
            *out = k;
            return 0;
        }
    char list[128] = "";
    for (int k = 0; choices[k]; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", k ? ", " : "", choices[k]);
    return dr_api_fail(e, 400, code, key, "%s must be one of %s, got '%.*s'", key, list, (int)(n > 40 ? 40 : n), s);
}

static const char *const k_formats[] = {"wav", "pcm", "mp3", "opus", NULL};

/* Fields both endpoints share: seed, temperature, top_p, frames, cfg_gamma. */
static int read_sampling(const dr_val *body, const dr_parse_limits *lim, dr_synth_req *r, dr_api_error *e) {
    int64_t frames = 0;
    if (dr_field_seed(body, "seed", "seed", &r->seed, &r->seed_set, e) ||
        dr_field_number(body, "temperature", "temperature", 0, 0, 2, &r->temperature, NULL, e) ||
        dr_field_number(body, "top_p", "top_p", 0, 1, 1, &r->top_p, NULL, e) ||
        dr_field_int(body, "frames", "frames", 1, lim->max_frames, &frames, NULL, e))
        return e->status;
    r->frames = (int)frames;
    r->cfg_gamma = lim->cfg_gamma_default;
    const dr_val *g = dr_val_get(body, "cfg_gamma");
    if (g && g->type != DR_VAL_NULL) {
        if (!lim->cfg_allow_request_gamma)
            return dr_api_fail(e, 400, "guidance_not_allowed", "cfg_gamma",
                               "cfg_gamma is not accepted by this server (start it with --cfg-allow-request-gamma)");
        if (dr_field_number(body, "cfg_gamma", "cfg_gamma", 0, 0, lim->cfg_max_gamma, &r->cfg_gamma, NULL, e))
            return e->status;
        if (r->cfg_gamma != 0 && r->n_refs == 0 && r->n_voice_ids == 0)
            return dr_api_fail(e, 400, "guidance_not_allowed", "cfg_gamma",
                               "cfg_gamma %g needs a reference voice (the model's own voice is never guided)", r->cfg_gamma);
    }
    return 0;
}

static void defaults(dr_synth_req *r, const dr_parse_limits *lim) {
    memset(r, 0, sizeof *r);
    r->chunk_length = 200;
    r->temperature = 1.0;
    r->top_p = 0.9;
    r->max_frames = lim->max_frames;
}

int dr_parse_tts(const dr_val *body, const dr_parse_limits *lim, dr_synth_req *r, dr_api_error *e) {
    defaults(r, lim);
    r->format = DR_AF_WAV;
    if (!body || body->type != DR_VAL_MAP)
        return dr_api_fail(e, 400, "wrong_type", NULL, "the body must be an object");
    static const char *const latency[] = {"normal", "balanced", NULL};
    static const char *const onoff[] = {"on", "off", NULL};
    int fmt = DR_AF_WAV, lat = 0, cache = 1, normalize = 1;
    int64_t chunk = 200, max_new = 0;
    double rep = 1.1;
    if (dr_field_string(body, "text", "text", &r->text, &r->text_len, 1, e) || read_references(body, r, e) ||
        read_choice(body, "format", k_formats, "unsupported_format", &fmt, e) ||
        dr_field_bool(body, "streaming", "streaming", &r->streaming, e) ||
        dr_field_int(body, "chunk_length", "chunk_length", 100, 1000, &chunk, NULL, e) ||
        dr_field_number(body, "repetition_penalty", "repetition_penalty", 0.9, 0, 2.0, &rep, NULL, e) ||
        dr_field_int(body, "max_new_tokens", "max_new_tokens", 0, INT64_MAX, &max_new, NULL, e) ||
        dr_field_bool(body, "normalize", "normalize", &normalize, e) ||
        read_choice(body, "latency", latency, "unsupported_value", &lat, e) ||
        read_choice(body, "use_memory_cache", onoff, "unsupported_value", &cache, e) || read_sampling(body, lim, r, e))
        return e->status;
    r->format = (dr_audio_format)fmt;
    r->chunk_length = (int)chunk;
    r->latency_balanced = lat == 1;
    if (max_new > 0 && max_new < lim->max_frames) r->max_frames = (int)max_new;
    return 0;
}

int dr_parse_speech(const dr_val *body, const dr_parse_limits *lim, dr_synth_req *r, dr_api_error *e) {
    defaults(r, lim);
    r->openai = 1;
    r->streaming = 1; /* the body is always sent as it is produced (API.md 4) */
    r->latency_balanced = 1;
    r->format = DR_AF_MP3;
    if (!body || body->type != DR_VAL_MAP)
        return dr_api_fail(e, 400, "wrong_type", NULL, "the body must be an object");
    static const char *const stream_formats[] = {"audio", "sse", NULL};
    int fmt = DR_AF_MP3, sf = 0;
    double speed = 1.0;
    const char *voice = NULL, *instructions = NULL;
    size_t voice_len = 0, model_len = 0;
    r->model = "drama-3";
    if (dr_field_string(body, "model", "model", &r->model, &model_len, 0, e) ||
        dr_field_string(body, "input", "input", &r->text, &r->text_len, 1, e) ||
        dr_field_string(body, "voice", "voice", &voice, &voice_len, 1, e) ||
        read_choice(body, "response_format", k_formats, "unsupported_format", &fmt, e) ||
        dr_field_number(body, "speed", "speed", 0.25, 0, 4.0, &speed, NULL, e) ||
        read_choice(body, "stream_format", stream_formats, "unsupported_value", &sf, e) ||
        dr_field_string(body, "instructions", "instructions", &instructions, NULL, 0, e))
        return e->status;
    int known = 0;
    for (int k = 0; lim->model_ids && lim->model_ids[k]; k++) known |= !strcmp(lim->model_ids[k], r->model);
    if (!known || (model_len && strlen(r->model) != model_len))
        return dr_api_fail(e, 400, "unknown_model", "model", "model '%.64s' is not served here (GET /v1/models)", r->model);
    if (speed != 1.0)
        return dr_api_fail(e, 400, "unsupported_value", "speed", "speed must be 1.0 (the model has no speed control), got %g", speed);
    r->format = (dr_audio_format)fmt;
    r->sse = sf == 1;
    for (int k = 0; lim->voice_alias_names && lim->voice_alias_names[k]; k++)
        if (strlen(lim->voice_alias_names[k]) == voice_len && !memcmp(lim->voice_alias_names[k], voice, voice_len)) {
            voice = lim->voice_alias_ids[k];
            voice_len = strlen(voice);
            break;
        }
    if (!(voice_len == 7 && !memcmp(voice, "default", 7))) {
        if (check_voice_id(voice, voice_len, "voice", e)) return e->status;
        r->voice_ids[r->n_voice_ids++] = voice;
    }
    return read_sampling(body, lim, r, e);
}

int dr_parse_voice_upload(const dr_val *body, dr_voice_upload *out, dr_api_error *e) {
    memset(out, 0, sizeof *out);
    if (!body || body->type != DR_VAL_MAP)
        return dr_api_fail(e, 400, "wrong_type", NULL, "the body must be an object");
    size_t id_len = 0;
    if (dr_field_string(body, "id", "id", &out->id, &id_len, 1, e) || check_voice_id(out->id, id_len, "id", e) ||
        dr_field_string(body, "text", "text", &out->text, NULL, 1, e) ||
        read_audio(body, "audio", &out->audio, &out->audio_len, e)) {
        free(out->audio);
        out->audio = NULL;
        return e->status;
    }
    return 0;
}
