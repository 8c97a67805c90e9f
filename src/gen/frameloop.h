/* frameloop.h - a generation session: prefill, then frames (MODEL.md 8, TEXT.md 5-6).
 *
 *   prefill(rows 0..L-1)       backbone over every row; tower teacher-forced over 0..L-2 (MODEL.md 7.4)
 *   per frame:                 guided or plain restricted logits -> semantic draw (slot 0, redraw slot 1)
 *                              -> end token: finish | cap reached: DRAMA_EFRAMELIMIT
 *                              -> tower chain at the last position (slots 2..NC) -> frame [c0..c(NC-1)]
 *                              -> the frame is appended as the next row of every backbone state
 *
 * Reproducibility: draw n = 16*f + slot with f = draw_base + the semantic draws of this session
 * (the end-token draw included), so a seed gives the same codes whatever the thread count, the
 * other sessions stepped in the same batch, or how frames are pulled.
 *
 * Guidance (TEXT.md 5.5): with cfg_gamma > 0 and a reference voice, a second backbone state runs
 * the unconditional rows; logits = cond + gamma*(cond - uncond) for the semantic draw only; the
 * tower sees the conditional branch only; every frame is appended to both states. "paired" runs
 * both states in one batched backbone call, "separate" in two; the codes are identical.
 *
 * Cancellation: dr_gen_cancel may be called from any thread; it takes effect between two frames
 * (the next dr_gen_next returns DRAMA_ECANCELLED). A cancelled or failed session is invalid until
 * dr_gen_reset. Frames already handed out are the caller's to discard ("nothing published").
 *
 * Backends: a session lives in backend memory of the model's backend (states, tower cache,
 * logits, the pending hidden, the sampler's window and draw counter); a frame of every session
 * of a dr_gen_next_many call is one frame step (gen/framestep.h) that issues backend ops only,
 * inside a capturable region, and the host reads the frames' codes and flags after it.
 */
#ifndef DRAMA_GEN_FRAMELOOP_H
#define DRAMA_GEN_FRAMELOOP_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/error.h"
#include "base/pool.h"
#include "gen/sampler.h"
#include "model/backbone.h"
#include "model/tower.h"

/* The backbone as the frame loop reads it. */
typedef struct dr_gen_backbone {
    const dr_backbone *model;
    int64_t hidden_dim;     /* width of the hidden the tower consumes */
    int n_candidates;       /* restricted logits: n_semantic ids then the end token */
    int64_t semantic_start; /* token id of semantic code 0 */
} dr_gen_backbone;

typedef struct dr_gen_cache dr_gen_cache;

/* What a session runs on: shared by every session. The model is driven by one thread at a time
 * (its workspaces and the pool are not reentrant): batch sessions with dr_gen_next_many. */
typedef struct dr_gen_model {
    dr_gen_backbone bb;
    const dr_tower *tower;
    dr_pool *pool;          /* CPU threads (the CPU backend's; NULL = inline) */
    dr_backend *be;         /* where sessions live and frames are computed (bb and tower uploaded) */
    dr_gen_cache *cache;    /* workspaces reused by prefills and frame steps */
} dr_gen_model;

/* m over a bound backbone (token ids set) and tower already uploaded to be (model/upload.h). */
drama_status dr_gen_model_init(dr_gen_model *m, dr_backend *be, const dr_backbone *bb, const dr_tower *tower,
                               dr_pool *pool, drama_error *err);
void dr_gen_model_release(dr_gen_model *m);

typedef enum dr_cfg_mode { DR_CFG_PAIRED = 0, DR_CFG_SEPARATE = 1 } dr_cfg_mode;

typedef enum dr_gen_finish {
    DR_FINISH_NONE = 0,     /* still running */
    DR_FINISH_END_TOKEN,    /* the semantic draw returned the end token */
    DR_FINISH_FRAMES        /* the requested exact frame count was reached */
} dr_gen_finish;

typedef struct dr_gen_options {
    dr_sampler_params sp;   /* validated at create; frame_cap applies per session (per batch) */
    int frames;             /* > 0: finish successfully after exactly this many frames */
    uint64_t draw_base;     /* semantic draws made earlier in the request (earlier batches) */
    dr_cfg_mode cfg_mode;
    int has_reference;      /* -1: any audio row in the prefill rows; 0 / 1: as given */
    int allow_empty;        /* 0: a first draw that is the end token fails with DRAMA_EEMPTY */
} dr_gen_options;

void dr_gen_options_default(dr_gen_options *o);

typedef struct dr_gen_session dr_gen_session;

drama_status dr_gen_session_create(const dr_gen_model *m, const dr_gen_options *opt, dr_gen_session **out,
                                   drama_error *err);
void dr_gen_session_free(dr_gen_session *s);

/* Prefill (or extend) the conditional state with rows [n][1 + NC]. uncond_rows: the same request
 * without reference (used only when guidance is active; may be NULL otherwise). Guidance is
 * active when cfg_gamma > 0 and the request has a reference; its first prefill then requires
 * uncond_rows, later ones may pass none (n_uncond 0: the unconditional prompt is complete). */
drama_status dr_gen_prefill(dr_gen_session *s, const int32_t *rows, int64_t n_rows, const int32_t *uncond_rows,
                            int64_t n_uncond, drama_error *err);

/* Pull one frame: DRAMA_OK with *finish == DR_FINISH_NONE and frame[0..NC) filled, or DRAMA_OK
 * with *finish set (no frame), or an error (EFRAMELIMIT, ECANCELLED, ENUMERIC, EEMPTY, ...). */
drama_status dr_gen_next(dr_gen_session *s, int32_t *frame, dr_gen_finish *finish, drama_error *err);

/* The same for several sessions of one model: one batched backbone call appends every session's
 * frame. Per-session results in frames[i*NC..], finish[i], status[i], errs[i] (errs may be NULL).
 * Each session's codes are identical to stepping it alone. Returns the first failure's status. */
drama_status dr_gen_next_many(dr_gen_session *const *s, int n, int32_t *frames, dr_gen_finish *finish,
                              drama_status *status, drama_error *errs);

/* Callback API: run until a finish; on_frame gets every frame (frame index, codes); a nonzero
 * return from on_frame cancels. */
typedef int (*dr_gen_frame_fn)(void *ctx, int64_t index, const int32_t *frame);
drama_status dr_gen_run(dr_gen_session *s, dr_gen_frame_fn on_frame, void *ctx, dr_gen_finish *finish,
                        drama_error *err);

/* A copy of a valid session (backbone states, tower caches, counters, pending logits): the
 * snapshot of a voice prefix, continued independently. */
drama_status dr_gen_session_clone(const dr_gen_session *src, dr_gen_session **out, drama_error *err);
/* New sampling parameters for the following draws (validated; e.g. after cloning a snapshot). */
drama_status dr_gen_set_params(dr_gen_session *s, const dr_sampler_params *sp, drama_error *err);

void dr_gen_cancel(dr_gen_session *s);  /* thread-safe; effective between frames */
/* Drop every state (backbone, guidance, tower caches, counters): ready for a fresh prefill. */
drama_status dr_gen_reset(dr_gen_session *s, drama_error *err);

/* Teacher-forced tower scoring for bring-up (MODEL.md 11 step 3): while set, every prefill adds
 * -log p(c_j) of head j-1 for each tower position paired with an audio row, j = 1..NC-1. The
 * mean NLL per codebook (nll_sum[j-1] / count) compares tower switch settings on real data. */
#define DR_GEN_SCORE_MAX 15
typedef struct dr_gen_score {
    int n_codebooks;                  /* NC - 1 */
    int64_t count;                    /* scored positions */
    double nll_sum[DR_GEN_SCORE_MAX]; /* per predicted codebook 1..NC-1 */
} dr_gen_score;
void dr_gen_set_score(dr_gen_session *s, dr_gen_score *score); /* NULL stops scoring */

/* Introspection (for tests, dumps and the pipeline). */
int64_t dr_gen_frames(const dr_gen_session *s);        /* frames made by this session */
uint64_t dr_gen_draws(const dr_gen_session *s);        /* semantic draws made (for the next draw_base) */
int64_t dr_gen_position(const dr_gen_session *s);      /* rows in the conditional state */
int dr_gen_guided(const dr_gen_session *s);
int dr_gen_num_codebooks(const dr_gen_session *s);
/* The logits of the last semantic draw (after guidance) [n_candidates]; the conditional hidden
 * of the last row, which feeds the next draw and the tower [hidden_dim]; the head logits of the
 * last frame [NC-1][head_vocab]. */
const float *dr_gen_last_logits(const dr_gen_session *s);
const float *dr_gen_pending_hidden(const dr_gen_session *s);
const float *dr_gen_last_head_logits(const dr_gen_session *s);
/* Change the exact frame count for the next batch (0 = until the end token or the cap). */
void dr_gen_set_frames(dr_gen_session *s, int frames);

#endif
