/* metrics.c - counters and histograms; Prometheus text exposition (API.md 8). */
#include "serve/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 12
#define MAX_SERIES 128

typedef struct hist {
    const double *le;   /* N_BUCKETS upper bounds */
    int64_t counts[N_BUCKETS];
    int64_t total;
    double sum;
} hist;

typedef struct req_series {
    char endpoint[32];
    int status;
    int64_t count;
} req_series;

struct dr_metrics {
    pthread_mutex_t mu;
    req_series reqs[MAX_SERIES];
    int n_reqs;
    hist duration, ttfa[2], rtf;
    int64_t ref_hits, ref_misses;
};

static const double k_seconds[N_BUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
static const double k_rtf[N_BUCKETS] = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10};

dr_metrics *dr_metrics_create(void) {
    dr_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->duration.le = m->ttfa[0].le = m->ttfa[1].le = k_seconds;
    m->rtf.le = k_rtf;
    return m;
}

void dr_metrics_free(dr_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(hist *h, double x) {
    for (int k = 0; k < N_BUCKETS; k++)
        if (x <= h->le[k]) h->counts[k]++;
    h->total++;
    h->sum += x;
}

void dr_metrics_request(dr_metrics *m, const char *endpoint, int status, double seconds) {
    pthread_mutex_lock(&m->mu);
    req_series *s = NULL;
    for (int k = 0; k < m->n_reqs && !s; k++)
        if (m->reqs[k].status == status && !strcmp(m->reqs[k].endpoint, endpoint)) s = &m->reqs[k];
    if (!s && m->n_reqs < MAX_SERIES) { /* endpoints are the route table's, statuses few: bounded */
        s = &m->reqs[m->n_reqs++];
        snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
        s->status = status;
    }
    if (s) s->count++;
    observe(&m->duration, seconds);
    pthread_mutex_unlock(&m->mu);
}

void dr_metrics_synthesis(dr_metrics *m, double ttfa, int voice_cached, double rtf) {
    pthread_mutex_lock(&m->mu);
    observe(&m->ttfa[voice_cached ? 1 : 0], ttfa);
    observe(&m->rtf, rtf);
    pthread_mutex_unlock(&m->mu);
}

void dr_metrics_reference_cache(dr_metrics *m, int hit) {
    pthread_mutex_lock(&m->mu);
    if (hit) m->ref_hits++;
    else m->ref_misses++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct out_ctx {
    dr_bytes *b;
    int failed;
} out_ctx;

static void put(out_ctx *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out_ctx *o, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || dr_bytes_append(o->b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1)) o->failed = 1;
}

static void head(out_ctx *o, const char *name, const char *type, const char *help) {
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_lines(out_ctx *o, const char *name, const char *labels, const hist *h) {
    const char *sep = labels[0] ? "," : "";
    for (int k = 0; k < N_BUCKETS; k++)
        put(o, "%s_bucket{%s%sle=\"%g\"} %lld\n", name, labels, sep, h->le[k], (long long)h->counts[k]);
    put(o, "%s_bucket{%s%sle=\"+Inf\"} %lld\n", name, labels, sep, (long long)h->total);
    if (labels[0]) {
        put(o, "%s_sum{%s} %.6f\n%s_count{%s} %lld\n", name, labels, h->sum, name, labels, (long long)h->total);
    } else {
        put(o, "%s_sum %.6f\n%s_count %lld\n", name, h->sum, name, (long long)h->total);
    }
}

static void counter(out_ctx *o, const char *name, const char *help, long long v) {
    head(o, name, "counter", help);
    put(o, "%s %lld\n", name, v);
}

static void gauge(out_ctx *o, const char *name, const char *help, double v) {
    head(o, name, "gauge", help);
    put(o, "%s %.17g\n", name, v);
}

int dr_metrics_render(dr_metrics *m, const dr_metrics_engine *e, dr_bytes *b) {
    out_ctx o = {b, 0};
    if (e->replica_id) {
        head(&o, "drama_replica_info", "gauge", "this replica (--replica-id) and its device (--backend, --device); always 1");
        put(&o, "drama_replica_info{replica_id=\"%s\",backend=\"%s\",device=\"%d\"} 1\n", e->replica_id,
            e->backend ? e->backend : "auto", e->device);
    }
    pthread_mutex_lock(&m->mu);
    head(&o, "drama_requests_total", "counter", "HTTP requests by endpoint and status");
    for (int k = 0; k < m->n_reqs; k++)
        put(&o, "drama_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n", m->reqs[k].endpoint, m->reqs[k].status,
            (long long)m->reqs[k].count);
    head(&o, "drama_request_duration_seconds", "histogram", "wall time of HTTP requests");
    hist_lines(&o, "drama_request_duration_seconds", "", &m->duration);
    head(&o, "drama_time_to_first_audio_seconds", "histogram",
         "request arrival to first audio, by whether the voice prompt came from the cache");
    hist_lines(&o, "drama_time_to_first_audio_seconds", "voice_cached=\"false\"", &m->ttfa[0]);
    hist_lines(&o, "drama_time_to_first_audio_seconds", "voice_cached=\"true\"", &m->ttfa[1]);
    head(&o, "drama_real_time_factor", "histogram", "wall seconds per audio second of successful syntheses");
    hist_lines(&o, "drama_real_time_factor", "", &m->rtf);
    long long ref_hits = (long long)m->ref_hits, ref_misses = (long long)m->ref_misses;
    pthread_mutex_unlock(&m->mu);

    counter(&o, "drama_frames_generated_total", "frames generated (all requests, all batches)", (long long)e->frames_generated);
    head(&o, "drama_audio_seconds_total", "counter", "seconds of audio generated");
    put(&o, "drama_audio_seconds_total %.6f\n", e->audio_seconds);
    gauge(&o, "drama_frames_per_second", "aggregate frames per second over the last interval", e->frames_per_second);
    gauge(&o, "drama_queue_depth", "requests waiting for a lane", (double)e->queue_depth);
    gauge(&o, "drama_lanes_active", "lanes running a request", (double)e->lanes_active);
    gauge(&o, "drama_lanes_total", "lanes (--parallel)", (double)e->lanes_total);
    head(&o, "drama_admission_rejected_total", "counter", "requests refused at admission, by reason");
    put(&o, "drama_admission_rejected_total{reason=\"queue_full\"} %lld\n", (long long)e->rejected_queue_full);
    put(&o, "drama_admission_rejected_total{reason=\"loading\"} %lld\n", (long long)e->rejected_loading);
    put(&o, "drama_admission_rejected_total{reason=\"draining\"} %lld\n", (long long)e->rejected_draining);
    put(&o, "drama_admission_rejected_total{reason=\"queue_timeout\"} %lld\n", (long long)e->rejected_queue_timeout);
    put(&o, "drama_admission_rejected_total{reason=\"insufficient_memory\"} %lld\n",
        (long long)e->rejected_insufficient_memory);
    head(&o, "drama_cancelled_total", "counter", "requests cancelled, by reason");
    put(&o, "drama_cancelled_total{reason=\"client_gone\"} %lld\n", (long long)e->cancelled_client_gone);
    put(&o, "drama_cancelled_total{reason=\"server\"} %lld\n", (long long)e->cancelled_server);
    put(&o, "drama_cancelled_total{reason=\"drain\"} %lld\n", (long long)e->cancelled_drain);
    head(&o, "drama_finish_total", "counter", "finished generations, by finish reason");
    static const char *const reasons[] = {"end_token", "frames", "frame_limit", "empty_generation", "cancelled",
                                          "numerical_error", "error"};
    const int64_t counts[] = {e->finish_end_token, e->finish_frames, e->finish_frame_limit, e->finish_empty_generation,
                              e->finish_cancelled, e->finish_numerical_error, e->finish_error};
    for (int k = 0; k < 7; k++) put(&o, "drama_finish_total{reason=\"%s\"} %lld\n", reasons[k], (long long)counts[k]);
    counter(&o, "drama_voice_cache_hits_total", "voice prompts restored from the prompt cache", (long long)e->voice_cache_hits);
    counter(&o, "drama_voice_cache_misses_total", "voice prompts prefilled (not in the prompt cache)",
            (long long)e->voice_cache_misses);
    gauge(&o, "drama_prompt_cache_bytes", "bytes held by the voice prompt cache", (double)e->prompt_cache_bytes);
    head(&o, "drama_memory_bytes", "gauge", "memory reserved for request state, by kind");
    put(&o, "drama_memory_bytes{kind=\"host\"} %lld\n", (long long)e->memory_host_bytes);
    put(&o, "drama_memory_bytes{kind=\"device\"} %lld\n", (long long)e->memory_device_bytes);
    counter(&o, "drama_reference_cache_hits_total", "reference audio whose codes came from the content-hash cache", ref_hits);
    counter(&o, "drama_reference_cache_misses_total", "reference audio encoded by the codec", ref_misses);
    return o.failed ? -1 : 0;
}
