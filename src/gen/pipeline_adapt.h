/* pipeline_adapt.h - the pipeline's view of the other stages: text (validation, batches, prompt
 * rows), references (codec encoder or CODES.json), the codec's lifetime, and the language model
 * (backbone + tower + frame loop). pipeline_run.c sees only these calls, so a stage's API change
 * touches one adapter function. Private to src/gen/pipeline*.c. */
#ifndef DRAMA_GEN_PIPELINE_ADAPT_H
#define DRAMA_GEN_PIPELINE_ADAPT_H

#include <stdint.h>

#include "gen/pipeline_internal.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "text/prompt.h"

/* ---- references ---- */
typedef struct dr_pl_refs {
    int n;
    dr_codes codes[16];
    const char *transcript[16];
} dr_pl_refs;

/* Audio references are read, mixed to mono, resampled and encoded; code references are read and
 * range-checked. Errors name "reference i (path)". */
drama_status dr_pl_refs_encode(drama_model *m, const drama_reference *refs, int n, dr_pl_refs *out, drama_error *err);
void dr_pl_refs_free(dr_pl_refs *r);
/* One audio file -> codes (read, mono, resample, encode). */
drama_status dr_pl_encode_audio_file(drama_model *m, const char *path, dr_codes *out, drama_error *err);

/* ---- text ---- */
typedef struct dr_pl_text {
    int n_batches;
    char **batch;        /* batch texts, NUL-terminated (owned) */
    char *full;          /* the text after --speaker (owned) */
} dr_pl_text;

/* Validates the whole text (TEXT.md 2.3) and splits it into batches (TEXT.md 4). */
drama_status dr_pl_text_prepare(drama_model *m, const drama_request *req, dr_pl_text *out, drama_error *err);
void dr_pl_text_free(dr_pl_text *t);
/* Fills out->batch from out->full (text already validated). */
drama_status dr_pl_text_batches(drama_model *m, const drama_request *req, dr_pl_text *out, drama_error *err);

/* ---- codec ---- */
drama_status dr_pl_codec_acquire(drama_model *m, unsigned parts, drama_error *err);
void dr_pl_codec_release(drama_model *m);
/* Checks the codec's tensors against the model (codebooks, rate, frame length) without loading
 * its weights: low-memory mode loads the decoder only after generation, and a mismatch must fail
 * before any generation. */
drama_status dr_pl_codec_check(drama_model *m, drama_error *err);
/* Sample rate, samples per frame and codes per frame, without loading the codec weights. */
drama_status dr_pl_codec_geometry(drama_model *m, int *sample_rate, int *samples_per_frame, int *n_codebooks,
                                  drama_error *err);

uint64_t dr_pl_random_seed(void); /* from the OS (getrandom), for requests without a seed */

/* ---- language model ---- */
drama_status dr_pl_lm_acquire(drama_model *m, drama_error *err); /* map + bind; no-op when held */
void dr_pl_lm_release(drama_model *m);                          /* unmap weights, free everything */
void dr_pl_lm_free(dr_pl_lm *lm);

typedef struct dr_pl_gen_params {
    float temperature, top_p, cfg_gamma;
    uint64_t seed;
    int frame_cap;
    int has_reference;
} dr_pl_gen_params;

typedef struct dr_pl_gen dr_pl_gen;
typedef drama_status (*dr_pl_frame_fn)(void *ctx, const int32_t *frame, drama_error *err);

drama_status dr_pl_gen_create(drama_model *m, const dr_pl_gen_params *p, dr_pl_gen **out, drama_error *err);
/* Extends the conditional (and, when guided, unconditional) prompt for batch b and prefills the
 * new rows into the live state: batch 0 is the whole prompt, later batches continue after the
 * earlier batches' frames (TEXT.md 4.5). When the prompt plus frames_ahead would exceed context
 * rows (> 0), the oldest batches leave the history and a fresh state is prefilled (TEXT.md 4.6).
 * *prompt_rows = rows of the conditional prompt. */
drama_status dr_pl_gen_prompt(dr_pl_gen *g, drama_model *m, const dr_pl_text *text, int b, const dr_pl_refs *refs,
                              int64_t context, int64_t frames_ahead, int64_t *prompt_rows, drama_error *err);
/* Generates frames of the current batch until the end token (*ended = 1), `budget` frames when
 * budget > 0, or the frame cap (DRAMA_EFRAMELIMIT). Each frame goes to fn, whose error stops
 * the loop (cancellation). */
drama_status dr_pl_gen_frames(dr_pl_gen *g, int64_t budget, dr_pl_frame_fn fn, void *ctx, int *ended,
                              drama_error *err);
void dr_pl_gen_free(dr_pl_gen *g);

#endif
