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

/* Audio references (file or bytes) are read, mixed to mono, resampled and encoded; code
 * references (CODES.json or in memory) are range-checked. Errors name "reference i (path)". */
drama_status dr_pl_refs_encode(drama_model *m, const drama_reference *refs, int n, dr_pl_refs *out, drama_error *err);
void dr_pl_refs_free(dr_pl_refs *r);
/* One audio file (path) or file image in memory (data, n bytes) -> codes with `codec` (the
 * model's or a view of it): read, mono, resample, encode. max_seconds as dr_audio_in_opts.
 * *duration_s (may be NULL): the clip's duration. Input failures carry reason "bad_audio". */
drama_status dr_pl_encode_audio(drama_model *m, const dr_codec *codec, const char *path, const void *data, size_t n,
                                double max_seconds, dr_codes *out, double *duration_s, drama_error *err);
/* Upper bounds of the codes of frame column k (c0 semantic, then the residual books). */
drama_status dr_pl_codes_bounds(drama_model *m, int nc, int32_t *upper, drama_error *err);

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
/* With a pool of 2+ threads and the codec not resident (and not low_memory), opens the codec's
 * files on a thread of its own, so that they load beside the language model; NULL when not
 * started. finish joins it; use = 1: installs the codec as dr_pl_codec_acquire does (same checks,
 * same errors), use = 0: drops it (the request failed meanwhile). NULL p: nothing to do. */
typedef struct dr_pl_codec_preload dr_pl_codec_preload;
dr_pl_codec_preload *dr_pl_codec_preload_start(drama_model *m);
drama_status dr_pl_codec_preload_finish(drama_model *m, dr_pl_codec_preload *p, int use, drama_error *err);
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
struct dr_gen_lm *dr_pl_lm_model(drama_model *m);               /* NULL while released */

typedef struct dr_pl_gen_params {
    float temperature, top_p, cfg_gamma;
    uint64_t seed;
    int frame_cap;
    int has_reference;
} dr_pl_gen_params;

typedef struct dr_pl_gen dr_pl_gen;
struct dr_gen_session;

drama_status dr_pl_gen_create(drama_model *m, const dr_pl_gen_params *p, dr_pl_gen **out, drama_error *err);
/* Extends the conditional (and, when guided, unconditional) prompt for batch b; its new rows are
 * then pending (dr_pl_gen_prefill puts them into the live state): batch 0 is the whole prompt,
 * later batches continue after the earlier batches' frames (TEXT.md 4.5). When the prompt plus
 * frames_ahead would exceed context rows (> 0), the oldest batches leave the history and a fresh
 * state will be prefilled (TEXT.md 4.6). *prompt_rows = rows of the conditional prompt. */
drama_status dr_pl_gen_prompt(dr_pl_gen *g, drama_model *m, const dr_pl_text *text, int b, const dr_pl_refs *refs,
                              int64_t context, int64_t frames_ahead, int64_t *prompt_rows, drama_error *err);
/* Rows not yet in the states (conditional + unconditional). */
int64_t dr_pl_gen_pending(const dr_pl_gen *g);
/* One prefill call over the next pending rows: about max_rows (conditional + unconditional; 0 =
 * all), never past conditional row stop_cond and unconditional row stop_uncond when stop_cond is
 * ahead (0 = no stop), nor past the voice prefix (always a cut). With deltanet.prefill=chunked
 * every other cut lands on a multiple of DR_GDN_CHUNK (16) positions, so a call can take up to
 * one block (16 rows) per prompt when max_rows is smaller. Guided calls advance both prompts in
 * proportion; the unconditional one may be complete first (later calls carry conditional rows
 * only), and the call that completes the conditional one (or its prefix) takes the rest of the
 * unconditional one. *used =
 * rows prefilled. The slicing never changes a result (aligned cuts; dr_gen_prefill extends a
 * state exactly). */
drama_status dr_pl_gen_prefill(dr_pl_gen *g, int64_t max_rows, int64_t stop_cond, int64_t stop_uncond, int64_t *used,
                               drama_error *err);
/* The voice prefix of the current prompts (batch 0 with references, nothing prefilled yet), else
 * 0 and 0; the whole prompt rows (for cache keys) and whether the prompts are guided. */
void dr_pl_gen_prefix(const dr_pl_gen *g, int64_t *cond_rows, int64_t *uncond_rows);
const int32_t *dr_pl_gen_rows(const dr_pl_gen *g, int uncond, int64_t *n_rows);
int dr_pl_gen_is_guided(const dr_pl_gen *g);
int64_t dr_pl_gen_fed(const dr_pl_gen *g, int uncond); /* rows already in the state */
/* Continues from a copy of snap, the state after the first cond_rows / uncond_rows rows of these
 * prompts (a voice prefix), with this request's sampling parameters. */
drama_status dr_pl_gen_restore(dr_pl_gen *g, const struct dr_gen_session *snap, int64_t cond_rows,
                               int64_t uncond_rows, drama_error *err);
struct dr_gen_session *dr_pl_gen_session(dr_pl_gen *g);
/* Before the first frame of a batch: exactly `budget` frames when > 0, else until the end token. */
void dr_pl_gen_begin_frames(dr_pl_gen *g, int64_t budget);
/* Keeps a frame of the current batch (the history of later batches). */
drama_status dr_pl_gen_keep(dr_pl_gen *g, const int32_t *frame, drama_error *err);
void dr_pl_gen_free(dr_pl_gen *g);

#endif
