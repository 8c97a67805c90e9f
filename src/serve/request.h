/* request.h - the synthesis and voice-upload bodies of API.md 3.1, 4 and 5, read from a dr_val
 * (JSON, msgpack or a form) into plain structs, every type and range checked and every error
 * naming its field. What needs the model (text rules of TEXT.md 2.3, voice ids that exist,
 * reference audio that decodes) is checked afterwards by the handlers; nothing here touches the
 * engine. A parsed request borrows the strings of the dr_val it was read from (keep the tree
 * alive) and owns its decoded reference audio (dr_synth_req_free). */
#ifndef DRAMA_SERVE_REQUEST_H
#define DRAMA_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "serve/api_error.h"
#include "serve/encoder.h"
#include "serve/value.h"

#define DR_MAX_REFERENCES 16
#define DR_MAX_MODEL_ALIASES 16

typedef struct dr_ref_in {
    uint8_t *audio;      /* decoded bytes (owned) */
    size_t audio_len;
    const char *text;    /* transcript (borrowed) */
} dr_ref_in;

typedef struct dr_synth_req {
    int openai;                       /* /v1/audio/speech */
    const char *text;                 /* text / input (borrowed) */
    size_t text_len;
    dr_ref_in refs[DR_MAX_REFERENCES];
    int n_refs;
    const char *voice_ids[DR_MAX_REFERENCES]; /* reference_id(s) or voice (after --voice-alias) */
    int n_voice_ids;
    dr_audio_format format;
    int streaming;                    /* /v1/tts streaming; always 1 on /v1/audio/speech */
    int sse;                          /* stream_format "sse" */
    int chunk_length;                 /* UTF-8 bytes per text batch (/v1/tts), 200 */
    uint64_t seed;
    int seed_set;
    double temperature, top_p, cfg_gamma;
    int max_frames;                   /* frame cap per batch, after the server cap */
    int frames;                       /* 0 or the exact frame count */
    int latency_balanced;             /* schedule 4/16 instead of 10/25 */
    const char *model;                /* OpenAI model id as sent */
} dr_synth_req;

/* Server settings the parser checks against (API.md 3.1, 4, TEXT.md 5.5). */
typedef struct dr_parse_limits {
    int max_frames;                   /* --max-frames (750) */
    double cfg_gamma_default;         /* --cfg-gamma (0) */
    int cfg_allow_request_gamma;      /* --cfg-allow-request-gamma */
    double cfg_max_gamma;             /* --cfg-max-gamma (5) */
    const char *const *model_ids;     /* NULL-terminated: served ids and aliases */
    const char *const *voice_alias_names; /* NULL-terminated --voice-alias NAME=ID pairs */
    const char *const *voice_alias_ids;
} dr_parse_limits;

/* The built-in model ids and aliases of API.md 4 (NULL-terminated). */
extern const char *const dr_default_model_ids[];

int dr_parse_tts(const dr_val *body, const dr_parse_limits *lim, dr_synth_req *out, dr_api_error *e);
int dr_parse_speech(const dr_val *body, const dr_parse_limits *lim, dr_synth_req *out, dr_api_error *e);
void dr_synth_req_free(dr_synth_req *r);

typedef struct dr_voice_upload {
    const char *id;          /* borrowed, valid id */
    const char *text;        /* borrowed */
    uint8_t *audio;          /* decoded (owned; free()) */
    size_t audio_len;
} dr_voice_upload;

int dr_parse_voice_upload(const dr_val *body, dr_voice_upload *out, dr_api_error *e);

/* Voice ids (API.md 5): ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ and not "default". */
int dr_voice_id_valid(const char *id, size_t len);
/* A character of an X-Request-Id or --replica-id value: [A-Za-z0-9._:-] (safe in a header and a
 * Prometheus label value). */
int dr_replica_id_char(int ch);

/* Strict base64 (standard alphabet, padding optional, whitespace between groups allowed) into a
 * malloc'd buffer; returns 0 or -1 (not base64 / out of memory). */
int dr_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len);
/* Base64 of n bytes, malloc'd NUL-terminated string, or NULL. */
char *dr_base64_encode(const void *data, size_t n);

#endif
