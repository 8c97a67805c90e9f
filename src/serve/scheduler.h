/* scheduler.h - admission and the tick loop of `drama serve` over one drama_engine (API.md 8).
 *
 * Note for the HTTP layer:
 * - Threads. dr_sched_create starts one scheduler thread. It loads the engine (weights, codec,
 *   manifest check: state LOADING, then READY or FAILED) and then drives it: every tick it expires
 *   queued jobs, polls every job's is_gone, admits queued jobs into free lanes (FIFO; a job waits
 *   while the lanes or the memory budget are full), and steps the engine. dr_sched_submit,
 *   dr_sched_cancel, dr_sched_job_release, dr_sched_stats and dr_sched_drain are called from any
 *   other thread (HTTP connection threads, the main thread); they never run model work.
 * - Callbacks. Every sink callback runs on the scheduler thread, one job at a time, and must not
 *   block for long (they stall every lane): on_audio copies or encodes a chunk and returns,
 *   is_gone is a cheap poll. Order for one job: zero or more on_audio, then exactly one on_done,
 *   then nothing. A job refused by dr_sched_submit gets no callback at all.
 * - Ownership. dr_sched_submit copies the request (text, transcripts, reference audio bytes and
 *   codes): the caller's buffers may be freed when it returns. The sink struct is copied; its
 *   `user` pointer must stay valid until on_done has returned. The job handle is the caller's
 *   reference: valid (for dr_sched_cancel) until the caller passes it to dr_sched_job_release,
 *   which it must do exactly once, before or after on_done. The result passed to on_done (codes
 *   included) is only valid during the call.
 * - Cancellation. is_gone (client hung up) is polled while queued, at every prefill tick and at
 *   every frame; on_audio returning nonzero and dr_sched_cancel cancel too. A cancelled job's lane,
 *   state and reservation are freed within one tick and on_done reports "cancelled".
 * - Metrics. dr_sched_stats has this layer's series (queue, lanes, rejections, cancellations,
 *   finishes, frames, audio seconds, frames/s, prompt cache, memory). Histograms (request duration,
 *   time to first audio by voice_cached, real-time factor) and requests_total are recorded by the
 *   HTTP layer from on_done (dr_sched_done has what they need).
 */
#ifndef DRAMA_SERVE_SCHEDULER_H
#define DRAMA_SERVE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "drama.h"

typedef struct dr_sched dr_sched;
typedef struct dr_sched_job dr_sched_job;

typedef struct dr_sched_options {
    int lanes;                   /* --parallel (default 1) */
    int queue_size;              /* --queue: jobs waiting for a lane (default 16) */
    double queue_timeout_s;      /* --queue-timeout (default 30) */
    int64_t memory_budget_bytes; /* 0: the engine's default (drama_engine_options); < 0: no limit */
    int64_t prompt_cache_bytes;  /* --prompt-cache-mib (default 0: no cache) */
    int prefill_slice_rows;      /* 0: the engine's default */
    double drain_timeout_s;      /* --drain-timeout: dr_sched_drain's default (30) */
    double step_delay_s;         /* --test-step-delay: test hook, a pause after every engine step */
} dr_sched_options;

void dr_sched_options_default(dr_sched_options *o);

typedef enum dr_sched_state {
    DR_SCHED_LOADING = 0,        /* the engine is being created */
    DR_SCHED_READY = 1,
    DR_SCHED_DRAINING = 2,       /* dr_sched_drain was called: nothing new is admitted */
    DR_SCHED_FAILED = 3          /* loading failed (dr_sched_load_error says why) */
} dr_sched_state;

/* Why a job was refused (at submit or later through on_done). */
typedef enum dr_sched_reject_reason {
    DR_REJECT_QUEUE_FULL = 0,    /* 429 at submit */
    DR_REJECT_LOADING,           /* 503 at submit */
    DR_REJECT_DRAINING,          /* 503 at submit, or queued when draining began (on_done) */
    DR_REJECT_QUEUE_TIMEOUT,     /* 503 via on_done: no lane came free in time */
    DR_REJECT_INSUFFICIENT_MEMORY, /* 503 via on_done (waited for memory), or at submit when it can
                                      never fit the budget */
    DR_REJECT_INVALID,           /* 400 at submit: error.reason / message say what */
    DR_REJECT_COUNT
} dr_sched_reject_reason;
const char *dr_sched_reject_name(dr_sched_reject_reason r); /* "queue_full", "loading", ... */

typedef enum dr_sched_cancel_reason {
    DR_CANCEL_CLIENT_GONE = 0,   /* is_gone or on_audio nonzero */
    DR_CANCEL_REQUESTED,         /* dr_sched_cancel */
    DR_CANCEL_DRAIN,             /* still running when the drain timeout ran out */
    DR_CANCEL_COUNT
} dr_sched_cancel_reason;
const char *dr_sched_cancel_name(dr_sched_cancel_reason r); /* "client_gone", "requested", "drain" */

/* drama_result.finish_reason values, counted in dr_sched_stats.finished. */
typedef enum dr_sched_finish {
    DR_SCHED_FIN_END_TOKEN = 0, DR_SCHED_FIN_FRAMES, DR_SCHED_FIN_FRAME_LIMIT, DR_SCHED_FIN_EMPTY_GENERATION,
    DR_SCHED_FIN_CANCELLED, DR_SCHED_FIN_NUMERICAL_ERROR, DR_SCHED_FIN_ERROR, DR_SCHED_FIN_COUNT
} dr_sched_finish;
const char *dr_sched_finish_name(dr_sched_finish f); /* "end_token", "frames", ... */

typedef struct dr_sched_reject {
    dr_sched_reject_reason reason;
    int http_status;             /* 429, 503 or 400 */
    int retry_after_s;           /* for 429/503: the Retry-After value */
    drama_error error;           /* message (and reason for DR_REJECT_INVALID) */
} dr_sched_reject;

/* What on_done reports. Exactly one of: rejected (never ran: queue_timeout, insufficient_memory,
 * draining; status DRAMA_EBUSY) or ran (status and result of the request). */
typedef struct dr_sched_done {
    drama_status status;
    int rejected;                /* 1: never started; reject says why */
    dr_sched_reject reject;
    int cancelled;               /* 1: cancelled; cancel_reason says by whom */
    dr_sched_cancel_reason cancel_reason;
    const drama_result *result;  /* NULL when rejected; valid during the call only */
    const drama_error *error;    /* the request's error when status != DRAMA_OK */
    double queued_s;             /* submit -> lane start (or -> rejection) */
    double total_s;              /* submit -> done */
    double first_audio_s;        /* submit -> first on_audio, 0 when none */
} dr_sched_done;

typedef struct dr_sched_sink {
    void *user;
    int (*on_audio)(void *user, const float *samples, size_t n); /* nonzero: cancel (client gone) */
    int (*is_gone)(void *user);                                  /* may be NULL */
    void (*on_done)(void *user, const dr_sched_done *done);      /* required */
} dr_sched_sink;

/* Starts the scheduler thread, which creates the engine over `model` (the model must outlive the
 * scheduler). Returns at once; dr_sched_get_state says when it is READY. */
drama_status dr_sched_create(drama_model *model, const dr_sched_options *opt, dr_sched **out, drama_error *err);
/* Cancels everything still queued or running (their on_done runs), stops the thread, frees the
 * engine. Call after the HTTP layer stopped submitting. */
void dr_sched_free(dr_sched *s);

dr_sched_state dr_sched_get_state(dr_sched *s);
/* FAILED: the load error (copied into *err). */
void dr_sched_load_error(dr_sched *s, drama_error *err);

/* Queues a request. DRAMA_OK: *job is the caller's handle (see the note above). Otherwise the
 * request was refused now (*rej says why: queue_full, loading, draining, invalid, or
 * insufficient_memory when it could never fit) and no callback will run. */
drama_status dr_sched_submit(dr_sched *s, const drama_request *req, const dr_sched_sink *sink, dr_sched_job **job,
                             dr_sched_reject *rej);
/* Cancels a queued or running job (on_done follows on the scheduler thread); no effect after done. */
void dr_sched_cancel(dr_sched_job *job);
/* Drops the caller's reference to a job. */
void dr_sched_job_release(dr_sched_job *job);

/* Stops admitting (submit refuses with draining; queued jobs end with draining), waits up to
 * timeout_s (< 0: the option's drain_timeout_s) for running jobs to finish, cancels the rest and
 * waits for their on_done. Returns the number of jobs cancelled by the drain. */
int dr_sched_drain(dr_sched *s, double timeout_s);

typedef struct dr_sched_stats {
    dr_sched_state state;
    int queue_depth;
    int lanes_active, lanes_total;
    int64_t rejected[DR_REJECT_COUNT];   /* by reason, at submit and later */
    int64_t cancelled[DR_CANCEL_COUNT];
    int64_t finished[DR_SCHED_FIN_COUNT];   /* requests that ran, by finish reason */
    int64_t frames_generated;
    double audio_seconds;                /* audio delivered by successful requests */
    double frames_per_second;            /* frames generated over the last few seconds */
    int64_t prompt_cache_bytes, prompt_cache_entries;
    int64_t voice_cache_hits, voice_cache_misses;
    int64_t memory_reserved_bytes;       /* host: lane reservations + prompt cache */
    int64_t memory_budget_bytes;         /* < 0: no limit */
} dr_sched_stats;
void dr_sched_stats_get(dr_sched *s, dr_sched_stats *out);

#endif
