/* engine_internal.h - the structs behind drama_engine (include/drama.h) and the steps of one lane
 * (engine_lane.c), the prompt cache (engine_cache.c) and request plans (engine_plan.c). Private
 * to src/gen/engine*.c and pipeline*.c.
 *
 * A lane runs one request as a small state machine, one step per tick:
 *   PREPARE   text checked and split into batches, references encoded, weights and codec
 *             acquired (drama_synthesize's low-memory phases), batch 0's prompt built
 *   PREFILL   prompt rows into the state, a slice per tick (the voice prefix from the prompt cache
 *             when it is there, else snapshotted into it at the prefix boundary)
 *   GENERATE  one frame per tick in the engine's batched step; streamed chunks decoded and
 *             delivered; at a batch's end the next batch's prompt is built (back to PREFILL)
 *   DECODE    whole mode: frames decoded a chunk per tick, the audio delivered at the end
 *   DONE      result kept until drama_lane_result / drama_lane_release; state already freed */
#ifndef DRAMA_GEN_ENGINE_INTERNAL_H
#define DRAMA_GEN_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "codec/codec.h"
#include "gen/frameloop.h"
#include "gen/pipeline_adapt.h"
#include "gen/pipeline_internal.h"

typedef enum dr_lane_phase {
    DR_LANE_FREE = 0, DR_LANE_PREPARE, DR_LANE_PREFILL, DR_LANE_GENERATE, DR_LANE_DECODE, DR_LANE_DONE
} dr_lane_phase;

/* The prompt cache: voice prefix snapshots keyed by their rows (engine_cache.c). */
typedef struct dr_pcache dr_pcache;
dr_pcache *dr_pcache_create(int64_t max_bytes);
void dr_pcache_free(dr_pcache *c);
/* The snapshot whose key rows equal these (cond [nc][W], uncond [nu][W], nu = 0 unguided), moved
 * to the most recently used place; NULL when none. */
const dr_gen_session *dr_pcache_get(dr_pcache *c, const int32_t *cond, int64_t nc, const int32_t *uncond, int64_t nu,
                                    int W);
/* Takes ownership of snap (freed on failure too). Returns 1 when kept. */
int dr_pcache_put(dr_pcache *c, const int32_t *cond, int64_t nc, const int32_t *uncond, int64_t nu, int W,
                  dr_gen_session *snap, int64_t bytes);
int dr_pcache_evict_one(dr_pcache *c); /* drops the least recently used entry; 0 when empty */
int64_t dr_pcache_bytes(const dr_pcache *c);
int64_t dr_pcache_entries(const dr_pcache *c);
int64_t dr_pcache_max_bytes(const dr_pcache *c);

/* A lane's codec decode on its own thread, overlapped with generation (engine_decoder.c; whole
 * mode of drama_synthesize). dr_decoder_queue_frames: frames generation may run ahead, from
 * DRAMA_DECODE_OVERLAP (unset or 1: 128; N: N frames, at least 8; 0: no overlap -> 0). */
typedef struct dr_decoder dr_decoder;
int dr_decoder_queue_frames(void);
/* lm: the language model's pool (its thread count is the decoder's; told to yield its idle
 * cores while a feed runs, dr_pool_yield_to) */
drama_status dr_decoder_start(const dr_codec *c, dr_pool *lm, int queue_frames, int nc, int64_t spf, dr_decoder **out,
                              drama_error *err);
/* Queues one frame (waits while the queue is full); the thread's error once it has failed. */
drama_status dr_decoder_push(dr_decoder *d, const int32_t *frame, drama_error *err);
/* No more frames: decodes the rest and joins; the audio (malloc'd, the caller's) in *pcm. */
drama_status dr_decoder_finish(dr_decoder *d, float **pcm, int64_t *samples, drama_error *err);
void dr_decoder_free(dr_decoder *d); /* stops and joins (frames not decoded yet are dropped); NULL ok */

/* Request copies: every string and buffer a request points to, owned by the lane. */
typedef struct dr_req_copy {
    drama_request req;           /* first: drama_request_free finds the copy from it */
    drama_reference refs[16];
    void *owned[1 + 16 * 4];
    int n_owned;
} dr_req_copy;
drama_status dr_req_copy_make(const drama_request *src, int nc, dr_req_copy *out, drama_error *err);
void dr_req_copy_free(dr_req_copy *c);

typedef struct dr_lane {
    int index;
    uint32_t serial;             /* bumped at every start: handle = serial << 16 | (index + 1) */
    _Atomic uint64_t cancel;     /* the handle asked to stop (0 none) */
    const atomic_int *ext_cancel;/* drama_synthesize: the session's flag, else NULL */
    dr_lane_phase phase;
    int64_t order;               /* start order: prefill is served first come, first served */
    dr_req_copy rq;
    const drama_request *req;    /* &rq.req */
    drama_audio_fn on_audio;
    drama_event_fn on_event;
    void *user;
    drama_result res;
    drama_status status;
    drama_error err;
    int result_taken;
    int64_t reserved;            /* bytes reserved in the engine */
    int64_t planned_rows;        /* plan.max_rows: the state never grows past it */
    dr_phase_clock clock;
    int n_batches, batch;
    int64_t frames_target, budget;
    dr_pl_text text;
    dr_pl_refs refs;
    dr_pl_gen *gen;
    int32_t *codes;              /* frames of all batches, frame-major */
    int64_t n_frames, cap_frames;
    int nc;
    dr_codec_stream *stream;     /* stream mode, and whole mode's decode */
    dr_decoder *dec;             /* whole mode, overlapped: the decode running beside generation */
    int64_t frames_decoded;
    int chunk_index;
    float *pcm;                  /* a chunk (stream mode) or the whole audio (whole mode) */
    int64_t pcm_cap, pcm_len;
    /* prompt cache: 1 = snapshot the state when the prefix is in, 2 = restored from the cache */
    int cache_todo;
    int64_t prefix_c, prefix_u;
} dr_lane;

struct drama_engine {
    drama_model *m;
    drama_engine_options o;
    int private_;                /* drama_synthesize's own: low-memory phases, never cached */
    int counted;                 /* counted in the model's engines (weights and codec held) */
    dr_lane *lanes;
    int n_lanes;
    int64_t next_order;
    int64_t reserved;            /* sum of running lanes' reservations */
    int64_t budget;              /* < 0: no limit */
    dr_pcache *cache;            /* NULL without a prompt cache */
    double frame_step_s;         /* running means: one batched frame step, one prefill row */
    double prefill_row_s;
    int64_t last_slice;          /* rows of the last auto slice */
    drama_engine_stats st;
    int32_t *frames_buf;         /* [n_lanes][nc] */
    dr_gen_finish *fin_buf;
    drama_status *st_buf;
    drama_error *err_buf;
    dr_gen_session **sess_buf;
    dr_lane **lane_buf;
};

/* engine.c: a private one-lane engine for drama_synthesize (low-memory phases, the session's
 * cancel flag), stepped without the model lock (the caller holds it). */
drama_status dr_engine_create_private(drama_model *m, drama_engine **out, drama_error *err);
drama_status dr_engine_start_ext(drama_engine *e, const drama_request *req, drama_audio_fn on_audio,
                                 drama_event_fn on_event, void *user, const atomic_int *ext_cancel, drama_lane *lane,
                                 drama_error *err);
drama_status dr_engine_tick(drama_engine *e, drama_error *err);

/* engine_lane.c */
void dr_lane_begin(drama_engine *e, dr_lane *l);               /* after the request is copied */
void dr_lane_prepare(drama_engine *e, dr_lane *l);
drama_status dr_lane_prefill(drama_engine *e, dr_lane *l, int64_t budget, int64_t *used);
void dr_lane_frame(drama_engine *e, dr_lane *l, const int32_t *frame, dr_gen_finish fin, drama_status st,
                   const drama_error *err);
void dr_lane_decode(drama_engine *e, dr_lane *l);
int dr_lane_cancelled(const dr_lane *l);
void dr_lane_finish(drama_engine *e, dr_lane *l, drama_status st);   /* -> DONE, state freed */
void dr_lane_drop(drama_engine *e, dr_lane *l);                      /* everything freed -> FREE */
drama_lane dr_lane_handle(const dr_lane *l);

/* engine_plan.c: what a request needs; also used by drama_request_plan. Needs the language model
 * (m->lm) and the codec for exact sizes. */
drama_status dr_plan_request(drama_model *m, const drama_request *req, int64_t prefill_rows_max, drama_plan *plan,
                             drama_error *err);
/* Bytes a voice prefix snapshot of these rows holds (the cache's accounting). */
int64_t dr_plan_snapshot_bytes(drama_model *m, int64_t cond_rows, int64_t uncond_rows);

#endif
