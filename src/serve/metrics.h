/* metrics.h - the Prometheus series of API.md 8. The HTTP layer records what it sees
 * (requests by endpoint and status, request duration, time to first audio by voice_cached,
 * real-time factor, reference-codes cache hits); the scheduler's counters and gauges come in a
 * snapshot at render time (dr_metrics_engine), so nothing is counted twice. Thread-safe. */
#ifndef DRAMA_SERVE_METRICS_H
#define DRAMA_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/bytes.h"

typedef struct dr_metrics dr_metrics;

/* What the engine side reports (filled from the scheduler's stats by the server). */
typedef struct dr_metrics_engine {
    int64_t frames_generated;
    double audio_seconds;
    double frames_per_second;
    int64_t queue_depth, lanes_active, lanes_total;
    int64_t rejected_queue_full, rejected_loading, rejected_draining, rejected_queue_timeout,
        rejected_insufficient_memory;
    int64_t cancelled_client_gone, cancelled_server, cancelled_drain;
    int64_t finish_end_token, finish_frames, finish_frame_limit, finish_empty_generation, finish_cancelled,
        finish_numerical_error, finish_error;
    int64_t voice_cache_hits, voice_cache_misses, prompt_cache_bytes;
    int64_t memory_host_bytes, memory_device_bytes;
    const char *replica_id;   /* drama_replica_info labels (characters of dr_replica_id_char) */
    const char *backend;      /* --backend as given: auto | cpu | cuda */
    int device;               /* --device */
} dr_metrics_engine;

dr_metrics *dr_metrics_create(void);
void dr_metrics_free(dr_metrics *m);

/* One finished HTTP request: endpoint label ("/v1/tts", ...), status, wall seconds. */
void dr_metrics_request(dr_metrics *m, const char *endpoint, int status, double seconds);
/* One successful synthesis. */
void dr_metrics_synthesis(dr_metrics *m, double time_to_first_audio_s, int voice_cached, double real_time_factor);
void dr_metrics_reference_cache(dr_metrics *m, int hit);

/* Appends the exposition text (text/plain; version=0.0.4). */
int dr_metrics_render(dr_metrics *m, const dr_metrics_engine *eng, dr_bytes *out);

#endif
