/* server.h - `drama serve`: the HTTP server of API.md over the scheduler (serve/scheduler.h).
 *
 * Lifecycle: dr_server_start binds and answers at once (health 503 "loading", liveness
 * /health/live 200 from then on); dr_server_load
 * opens the model and starts the scheduler (health 200 once the engine is ready and the voices
 * are loaded); dr_server_drain stops admitting (health 503 "draining"), lets running requests
 * finish for up to drain_timeout_s and cancels the rest; dr_server_free stops the listener. The
 * CLI (src/cli/cmd_serve.c) only parses flags into dr_serve_options and calls these. */
#ifndef DRAMA_SERVE_SERVER_H
#define DRAMA_SERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DR_SERVE_MAX_KEYS 64
#define DR_SERVE_MAX_ALIASES 32

typedef struct dr_serve_options {
    const char *model_dir;
    const char *host;            /* "127.0.0.1" */
    int port;                    /* 8080; 0 = any free port (dr_server_port) */
    int parallel;                /* lanes (1) */
    int queue;                   /* waiting requests (16) */
    double queue_timeout_s;      /* 30 */
    size_t max_body_bytes;       /* 20 MiB */
    int max_text_length;         /* code points (10000) */
    int max_frames;              /* frame cap per batch (750) */
    double max_reference_seconds;/* 30 */
    const char *voices_dir;      /* NULL: voices live in memory only */
    int64_t prompt_cache_mib;    /* 0: no voice prompt cache */
    int64_t memory_budget_mib;   /* 0: the engine's default; < 0: no limit */
    int64_t reference_cache_mib; /* codes of inline references by content hash (16) */
    double cfg_gamma;            /* server default (0) */
    int cfg_allow_request_gamma;
    double cfg_max_gamma;        /* 5 */
    int stream_first_frames;     /* 0: by latency (normal 10, balanced 4) */
    int stream_chunk_frames;     /* 0: by latency (normal 25, balanced 16) */
    const char *api_keys[DR_SERVE_MAX_KEYS];
    int n_api_keys;
    int allow_no_auth;
    int metrics_public;
    const char *cors_origin;     /* NULL: no CORS headers */
    const char *voice_alias_names[DR_SERVE_MAX_ALIASES + 1]; /* --voice-alias NAME=ID */
    const char *voice_alias_ids[DR_SERVE_MAX_ALIASES + 1];
    int n_voice_aliases;
    const char *model_ids[DR_SERVE_MAX_ALIASES + 1]; /* --model-alias ids beyond the built-in ones */
    double drain_timeout_s;      /* 30 */
    int threads;                 /* model worker threads (0 = all) */
    drama_backend backend;       /* --backend (default auto) */
    int device;                  /* --device: GPU index */
    const char *replica_id;      /* --replica-id (NULL: HOSTNAME:PORT): X-Served-By, drama_replica_info */
    double load_delay_s;         /* --test-load-delay: test hook, seconds in "loading" before the load */
    double step_delay_s;         /* --test-step-delay: test hook, seconds of pause after every engine step */
    const char *const *set;      /* --set switch=value (NULL-terminated) or NULL */
    int quiet;                   /* no access log */
    int no_ui;                   /* --no-ui: no playground at GET / */
} dr_serve_options;

void dr_serve_options_default(dr_serve_options *o);

typedef struct dr_server dr_server;

/* Binds host:port and starts answering (503 loading). Refuses a non-loopback address without
 * an API key unless allow_no_auth (DRAMA_EINVAL naming --api-key). */
drama_status dr_server_start(dr_server **out, const dr_serve_options *opt, drama_error *err);
int dr_server_port(const dr_server *s);
/* The replica id (--replica-id, else HOSTNAME:PORT) sent in X-Served-By. */
const char *dr_server_replica_id(const dr_server *s);
/* Opens the model, starts the scheduler and waits until it is ready (or failed), then loads the
 * voice catalog. Runs on the caller's thread; requests are answered meanwhile. `stop` (may be
 * NULL) is polled: nonzero gives up (DRAMA_ECANCELLED). */
drama_status dr_server_load(dr_server *s, volatile int *stop, drama_error *err);
/* Graceful drain (API.md 8 "Shutdown"); returns the number of requests cancelled. */
int dr_server_drain(dr_server *s);
void dr_server_free(dr_server *s);

#endif
