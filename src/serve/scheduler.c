/* scheduler.c - admission, the queue and the tick thread over one drama_engine (scheduler.h).
 *
 * One mutex guards the queue, the job states and the counters; the engine is touched only by the
 * scheduler thread, and no sink callback runs with the mutex held (a callback may call back in).
 * A job is referenced twice: by the caller until dr_sched_job_release, by the scheduler until its
 * on_done has returned; the last reference frees it. */
#include "serve/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/receipt.h"

typedef enum job_state { JOB_QUEUED = 0, JOB_RUNNING, JOB_DONE } job_state;

struct dr_sched_job {
    dr_sched *s;
    atomic_int refs;
    atomic_int cancel;            /* dr_sched_cancel */
    dr_sched_sink sink;
    drama_request *req;           /* the copy, while queued */
    job_state state;              /* under s->lock */
    drama_lane lane;
    double t_submit, t_start, t_first_audio;
    int waited_for_memory;        /* the last refusal of the engine was memory, not lanes */
    int gone;                     /* is_gone said so, or on_audio returned nonzero */
    atomic_int drain_cancel;      /* set by dr_sched_drain / dr_sched_free */
    dr_sched_job *next;           /* queue order */
};

#define FPS_SAMPLES 32

struct dr_sched {
    drama_model *model;
    dr_sched_options o;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;          /* the scheduler thread waits here when idle */
    pthread_cond_t changed;       /* drain waits here for running jobs to finish */
    dr_sched_state state;
    drama_error load_err;
    int stop;
    drama_engine *engine;
    dr_sched_job *head, *tail;    /* queued jobs, FIFO */
    int queued, running;
    dr_sched_job **run;           /* [lanes] running jobs */
    dr_sched_stats st;
    double avg_request_s;         /* running mean of request durations, for Retry-After */
    double fps_t[FPS_SAMPLES];
    int64_t fps_frames[FPS_SAMPLES];
    int fps_n, fps_at;
    int64_t fps_latest;           /* frames at the last tick */
};

static const char *const reject_names[DR_REJECT_COUNT] = {"queue_full", "loading", "draining", "queue_timeout",
                                                          "insufficient_memory", "invalid"};
static const char *const cancel_names[DR_CANCEL_COUNT] = {"client_gone", "requested", "drain"};
static const char *const finish_names[DR_SCHED_FIN_COUNT] = {"end_token", "frames", "frame_limit", "empty_generation",
                                                             "cancelled", "numerical_error", "error"};

const char *dr_sched_reject_name(dr_sched_reject_reason r) {
    return r >= 0 && r < DR_REJECT_COUNT ? reject_names[r] : "unknown";
}
const char *dr_sched_cancel_name(dr_sched_cancel_reason r) {
    return r >= 0 && r < DR_CANCEL_COUNT ? cancel_names[r] : "unknown";
}
const char *dr_sched_finish_name(dr_sched_finish f) {
    return f >= 0 && f < DR_SCHED_FIN_COUNT ? finish_names[f] : "unknown";
}

void dr_sched_options_default(dr_sched_options *o) {
    memset(o, 0, sizeof *o);
    o->lanes = 1;
    o->queue_size = 16;
    o->queue_timeout_s = 30;
    o->drain_timeout_s = 30;
}

/* ---- jobs ---- */

static void job_unref(dr_sched_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    drama_request_free(j->req);
    free(j);
}

void dr_sched_job_release(dr_sched_job *job) { job_unref(job); }

void dr_sched_cancel(dr_sched_job *job) {
    if (!job) return;
    atomic_store(&job->cancel, 1);
    pthread_cond_signal(&job->s->wake);
}

/* Retry-After for a refusal: the time the queue ahead would take, from the mean request time. */
static int retry_after(const dr_sched *s) {
    double per = s->avg_request_s > 0 ? s->avg_request_s : 1.0;
    double t = per * (double)(s->queued + 1) / (double)(s->o.lanes > 0 ? s->o.lanes : 1);
    if (!(t >= 1)) t = 1;
    if (t > 60) t = 60;
    return (int)ceil(t);
}

static void reject(dr_sched_reject *r, dr_sched_reject_reason why, int http, int retry) {
    r->reason = why;
    r->http_status = http;
    r->retry_after_s = retry;
}

static dr_sched_finish finish_of(const char *reason) {
    for (int i = 0; i < DR_SCHED_FIN_COUNT; i++)
        if (!strcmp(reason, finish_names[i])) return (dr_sched_finish)i;
    return DR_SCHED_FIN_ERROR;
}

/* ---- callbacks of the engine, on the scheduler thread ---- */

static int job_on_audio(void *user, const float *x, size_t n) {
    dr_sched_job *j = user;
    if (j->t_first_audio <= 0) j->t_first_audio = dr_clock_s();
    int stop = j->sink.on_audio ? j->sink.on_audio(j->sink.user, x, n) : 0;
    if (stop) j->gone = 1;
    return stop;
}

/* on_done for a job that never ran (the lock is not held). */
static void done_rejected(dr_sched *s, dr_sched_job *j, dr_sched_reject_reason why, const char *msg) {
    dr_sched_done d;
    memset(&d, 0, sizeof d);
    d.status = DRAMA_EBUSY;
    d.rejected = 1;
    pthread_mutex_lock(&s->lock);
    reject(&d.reject, why, 503, retry_after(s));
    s->st.rejected[why]++;
    j->state = JOB_DONE;
    pthread_mutex_unlock(&s->lock);
    dr_fail_reason(&d.reject.error, DRAMA_EBUSY, why == DR_REJECT_INVALID ? "" : reject_names[why], "%s", msg);
    d.error = &d.reject.error;
    double now = dr_clock_s();
    d.queued_s = d.total_s = now - j->t_submit;
    j->sink.on_done(j->sink.user, &d);
    job_unref(j);
}

/* A finished lane: result, counters, on_done, the lane back (the lock is not held). */
static void done_ran(dr_sched *s, dr_sched_job *j) {
    drama_result res;
    drama_error err = {0};
    drama_status st = drama_lane_result(s->engine, j->lane, &res, &err);
    drama_lane_release(s->engine, j->lane);
    j->lane = 0;
    dr_sched_done d;
    memset(&d, 0, sizeof d);
    d.status = st;
    d.result = &res;
    d.error = &err;
    double now = dr_clock_s();
    d.queued_s = j->t_start - j->t_submit;
    d.total_s = now - j->t_submit;
    d.first_audio_s = j->t_first_audio > 0 ? j->t_first_audio - j->t_submit : 0;
    int cancelled = st == DRAMA_ECANCELLED;
    if (cancelled) {
        d.cancelled = 1;
        d.cancel_reason = atomic_load(&j->drain_cancel) ? DR_CANCEL_DRAIN : j->gone ? DR_CANCEL_CLIENT_GONE : DR_CANCEL_REQUESTED;
    }
    pthread_mutex_lock(&s->lock);
    if (cancelled) s->st.cancelled[d.cancel_reason]++;
    s->st.finished[cancelled ? DR_SCHED_FIN_CANCELLED : finish_of(res.finish_reason)]++;
    if (st == DRAMA_OK) s->st.audio_seconds += res.audio_seconds;
    s->avg_request_s = s->avg_request_s > 0 ? 0.8 * s->avg_request_s + 0.2 * d.total_s : d.total_s;
    j->state = JOB_DONE;
    pthread_mutex_unlock(&s->lock);
    j->sink.on_done(j->sink.user, &d);
    drama_result_free(&res);
    job_unref(j);
}

/* ---- the scheduler thread ---- */

static void update_stats(dr_sched *s, double now) {
    drama_engine_stats es;
    drama_engine_get_stats(s->engine, &es);
    pthread_mutex_lock(&s->lock);
    s->st.lanes_total = es.lanes_total;
    s->st.frames_generated = es.frames_generated;
    s->st.prompt_cache_bytes = es.prompt_cache_bytes;
    s->st.prompt_cache_entries = es.prompt_cache_entries;
    s->st.voice_cache_hits = es.prompt_cache_hits;
    s->st.voice_cache_misses = es.prompt_cache_misses;
    s->st.memory_reserved_bytes = es.reserved_bytes + es.prompt_cache_bytes;
    s->st.memory_budget_bytes = es.memory_budget_bytes;
    /* frames per second over the last few seconds: a sample every quarter second */
    s->fps_latest = es.frames_generated;
    int last = (s->fps_at + FPS_SAMPLES - 1) % FPS_SAMPLES;
    if (s->fps_n == 0 || now - s->fps_t[last] >= 0.25) {
        s->fps_t[s->fps_at] = now;
        s->fps_frames[s->fps_at] = es.frames_generated;
        s->fps_at = (s->fps_at + 1) % FPS_SAMPLES;
        if (s->fps_n < FPS_SAMPLES) s->fps_n++;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Queued jobs: gone, cancelled, drained or (with timeouts) timed out leave the queue with on_done.
 * Timeouts are judged after an admission attempt, so a job that could start now never times out
 * and a job blocked by memory says so. */
static void sweep_queue(dr_sched *s, double now, int timeouts) {
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int n = s->queued;
        dr_sched_job **list = n ? malloc((size_t)n * sizeof *list) : NULL;
        int k = 0;
        for (dr_sched_job *j = s->head; j && list; j = j->next) list[k++] = j;
        int draining = s->state == DR_SCHED_DRAINING || s->stop;
        pthread_mutex_unlock(&s->lock);
        if (n && !list) return; /* out of memory: try again next tick */
        dr_sched_job *out = NULL;
        dr_sched_reject_reason why = DR_REJECT_QUEUE_TIMEOUT;
        for (int i = 0; i < k && !out; i++) {
            dr_sched_job *j = list[i];
            int gone = j->sink.is_gone && j->sink.is_gone(j->sink.user);
            if (draining) out = j, why = DR_REJECT_DRAINING;
            else if (gone || atomic_load(&j->cancel)) out = j, j->gone = gone;
            else if (timeouts && now - j->t_submit > s->o.queue_timeout_s)
                out = j, why = j->waited_for_memory ? DR_REJECT_INSUFFICIENT_MEMORY : DR_REJECT_QUEUE_TIMEOUT;
        }
        free(list);
        if (!out) return;
        pthread_mutex_lock(&s->lock);
        dr_sched_job **pp = &s->head, *prev = NULL;
        while (*pp && *pp != out) prev = *pp, pp = &(*pp)->next;
        if (*pp) {
            *pp = out->next;
            if (s->tail == out) s->tail = prev;
            s->queued--;
        }
        pthread_mutex_unlock(&s->lock);
        if (atomic_load(&out->cancel) || out->gone) {
            /* never started: counted as a cancellation, on_done reports it without a result */
            dr_sched_done d;
            memset(&d, 0, sizeof d);
            d.status = DRAMA_ECANCELLED;
            d.cancelled = 1;
            d.cancel_reason = out->gone ? DR_CANCEL_CLIENT_GONE : DR_CANCEL_REQUESTED;
            drama_error e = {0};
            dr_fail(&e, DRAMA_ECANCELLED, "cancelled while queued");
            d.error = &e;
            d.queued_s = d.total_s = now - out->t_submit;
            pthread_mutex_lock(&s->lock);
            s->st.cancelled[d.cancel_reason]++;
            out->state = JOB_DONE;
            pthread_mutex_unlock(&s->lock);
            out->sink.on_done(out->sink.user, &d);
            job_unref(out);
        } else {
            done_rejected(s, out, why,
                          why == DR_REJECT_DRAINING ? "draining: the server is shutting down"
                          : why == DR_REJECT_INSUFFICIENT_MEMORY
                              ? "insufficient_memory: no memory came free for the request within the queue timeout"
                              : "queue_timeout: no lane came free within the queue timeout");
        }
    }
}

/* Queue head into free lanes, first come first served. */
static void admit(dr_sched *s, double now) {
    for (;;) {
        pthread_mutex_lock(&s->lock);
        dr_sched_job *j = s->head;
        int ok = j && s->state == DR_SCHED_READY && !s->stop && s->running < s->o.lanes;
        pthread_mutex_unlock(&s->lock);
        if (!ok) return;
        drama_error err = {0};
        drama_lane lane = 0;
        drama_status st = drama_engine_start(s->engine, j->req, job_on_audio, NULL, j, &lane, &err);
        if (st == DRAMA_EBUSY) {
            j->waited_for_memory = !strcmp(err.reason, "insufficient_memory");
            return;
        }
        pthread_mutex_lock(&s->lock);
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--;
        j->next = NULL;
        if (st == DRAMA_OK) {
            j->state = JOB_RUNNING;
            j->lane = lane;
            j->t_start = now;
            for (int i = 0; i < s->o.lanes; i++)
                if (!s->run[i]) {
                    s->run[i] = j;
                    break;
                }
            s->running++;
        }
        pthread_mutex_unlock(&s->lock);
        if (st == DRAMA_OK) {
            drama_request_free(j->req); /* the engine has its own copy */
            j->req = NULL;
            continue;
        }
        /* refused by the engine for good (the budget can never hold it, or a check the plan at
         * submit did not see): on_done with the engine's error */
        dr_sched_done d;
        memset(&d, 0, sizeof d);
        d.status = st;
        d.error = &err;
        d.rejected = st == DRAMA_ENOMEM;
        d.reject.error = err;
        d.queued_s = d.total_s = now - j->t_submit;
        pthread_mutex_lock(&s->lock);
        if (d.rejected) reject(&d.reject, DR_REJECT_INSUFFICIENT_MEMORY, 503, retry_after(s));
        if (d.rejected) s->st.rejected[DR_REJECT_INSUFFICIENT_MEMORY]++;
        else s->st.finished[DR_SCHED_FIN_ERROR]++;
        j->state = JOB_DONE;
        pthread_mutex_unlock(&s->lock);
        j->sink.on_done(j->sink.user, &d);
        job_unref(j);
    }
}

/* Running jobs: polls and flags become lane cancellations; finished lanes report. */
static void service_running(dr_sched *s, int after_step) {
    for (int i = 0; i < s->o.lanes; i++) {
        dr_sched_job *j = s->run[i];
        if (!j) continue;
        if (!after_step) {
            if (!j->gone && j->sink.is_gone && j->sink.is_gone(j->sink.user)) j->gone = 1;
            if (j->gone || atomic_load(&j->cancel) || atomic_load(&j->drain_cancel)) drama_lane_cancel(s->engine, j->lane);
            continue;
        }
        if (!drama_lane_done(s->engine, j->lane)) continue;
        pthread_mutex_lock(&s->lock);
        s->run[i] = NULL;
        s->running--;
        pthread_mutex_unlock(&s->lock);
        done_ran(s, j);
        pthread_cond_broadcast(&s->changed);
    }
}

static void *thread_main(void *arg) {
    dr_sched *s = arg;
    drama_engine_options eo;
    drama_engine_options_default(&eo);
    eo.lanes = s->o.lanes;
    if (s->o.prefill_slice_rows > 0) eo.prefill_slice_rows = s->o.prefill_slice_rows;
    eo.prompt_cache_bytes = s->o.prompt_cache_bytes;
    eo.memory_budget_bytes = s->o.memory_budget_bytes;
    drama_error err = {0};
    drama_engine *e = NULL;
    drama_status st = drama_engine_create(&e, s->model, &eo, &err);
    pthread_mutex_lock(&s->lock);
    s->engine = e;
    if (st != DRAMA_OK) {
        s->load_err = err;
        s->state = DR_SCHED_FAILED;
    } else if (s->state == DR_SCHED_LOADING) {
        s->state = DR_SCHED_READY;
    }
    s->st.state = s->state;
    pthread_mutex_unlock(&s->lock);
    if (e) update_stats(s, dr_clock_s());
    pthread_cond_broadcast(&s->changed);
    for (;;) {
        double now = dr_clock_s();
        sweep_queue(s, now, 0);
        if (e) admit(s, now);
        sweep_queue(s, now, 1);
        pthread_mutex_lock(&s->lock);
        int running = s->running, stop = s->stop && s->running == 0 && s->queued == 0;
        if (s->stop)
            for (int i = 0; i < s->o.lanes; i++)
                if (s->run[i]) atomic_store(&s->run[i]->drain_cancel, 1);
        if (stop) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        if (!running) {
            /* idle: wake for a submit, a cancel, or the next queue deadline / is_gone poll */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long wait_ns = s->queued ? 20000000L : 200000000L;
            ts.tv_nsec += wait_ns;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&s->wake, &s->lock, &ts);
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        service_running(s, 0);
        drama_error se = {0};
        drama_engine_step(e, &se);
        service_running(s, 1);
        if (s->o.step_delay_s > 0) { /* the test hook: keeps a request running long enough to observe */
            struct timespec ts = {(time_t)s->o.step_delay_s, (long)((s->o.step_delay_s - (time_t)s->o.step_delay_s) * 1e9)};
            nanosleep(&ts, NULL);
        }
        update_stats(s, dr_clock_s());
    }
    if (e) update_stats(s, dr_clock_s());
    return NULL;
}

/* ---- API ---- */

drama_status dr_sched_create(drama_model *model, const dr_sched_options *opt, dr_sched **out, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_sched_create: out is NULL");
    *out = NULL;
    if (!model) return dr_fail(err, DRAMA_EINVAL, "dr_sched_create: model is NULL");
    dr_sched_options def;
    if (!opt) {
        dr_sched_options_default(&def);
        opt = &def;
    }
    if (opt->lanes < 1 || opt->lanes > 256) return dr_fail(err, DRAMA_EINVAL, "parallel: %d is outside 1..256", opt->lanes);
    if (opt->queue_size < 0) return dr_fail(err, DRAMA_EINVAL, "queue: %d must not be negative", opt->queue_size);
    if (!(opt->queue_timeout_s >= 0) || !(opt->drain_timeout_s >= 0))
        return dr_fail(err, DRAMA_EINVAL, "queue-timeout / drain-timeout: must be finite and not negative");
    dr_sched *s = calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "scheduler: out of memory");
    s->model = model;
    s->o = *opt;
    s->run = calloc((size_t)opt->lanes, sizeof *s->run);
    if (!s->run) {
        free(s);
        return dr_fail(err, DRAMA_ENOMEM, "scheduler: out of memory");
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->state = s->st.state = DR_SCHED_LOADING;
    s->st.lanes_total = opt->lanes;
    if (pthread_create(&s->thread, NULL, thread_main, s) != 0) {
        dr_sched_free(s);
        return dr_fail(err, DRAMA_ENOMEM, "scheduler: cannot start its thread");
    }
    s->thread_started = 1;
    *out = s;
    return DRAMA_OK;
}

void dr_sched_free(dr_sched *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_mutex_unlock(&s->lock);
        pthread_cond_signal(&s->wake);
        pthread_join(s->thread, NULL);
    }
    drama_engine_free(s->engine);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->changed);
    free(s->run);
    free(s);
}

dr_sched_state dr_sched_get_state(dr_sched *s) {
    pthread_mutex_lock(&s->lock);
    dr_sched_state st = s->state;
    pthread_mutex_unlock(&s->lock);
    return st;
}

void dr_sched_load_error(dr_sched *s, drama_error *err) {
    if (!err) return;
    pthread_mutex_lock(&s->lock);
    *err = s->load_err;
    pthread_mutex_unlock(&s->lock);
}

drama_status dr_sched_submit(dr_sched *s, const drama_request *req, const dr_sched_sink *sink, dr_sched_job **job,
                             dr_sched_reject *rej) {
    dr_sched_reject local;
    if (!rej) rej = &local;
    memset(rej, 0, sizeof *rej);
    if (job) *job = NULL;
    if (!s || !req || !sink || !sink->on_done || !job) {
        reject(rej, DR_REJECT_INVALID, 400, 0);
        return dr_fail(&rej->error, DRAMA_EINVAL, "dr_sched_submit: scheduler, request, sink.on_done or job is NULL");
    }
    pthread_mutex_lock(&s->lock);
    dr_sched_state state = s->state;
    int stopping = s->stop;
    int64_t budget = s->st.memory_budget_bytes;
    pthread_mutex_unlock(&s->lock);
    if (state != DR_SCHED_READY || stopping) {
        int draining = state == DR_SCHED_DRAINING || stopping;
        dr_sched_reject_reason why = draining ? DR_REJECT_DRAINING : DR_REJECT_LOADING;
        pthread_mutex_lock(&s->lock);
        s->st.rejected[why]++;
        pthread_mutex_unlock(&s->lock);
        reject(rej, why, 503, draining ? (int)ceil(s->o.drain_timeout_s > 1 ? s->o.drain_timeout_s : 1) : 5);
        return dr_fail_reason(&rej->error, DRAMA_EBUSY, reject_names[why], "%s",
                              draining ? "draining: the server is shutting down"
                              : state == DR_SCHED_FAILED ? "loading: the model failed to load"
                                                         : "loading: the model is still loading");
    }
    /* the request's own checks and its size, on this thread, before it touches the queue */
    drama_plan plan;
    drama_status st = drama_request_plan(s->model, req, &plan, &rej->error);
    if (st != DRAMA_OK) {
        reject(rej, DR_REJECT_INVALID, 400, 0);
        pthread_mutex_lock(&s->lock);
        s->st.rejected[DR_REJECT_INVALID]++;
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    if (budget >= 0 && plan.state_bytes > budget) {
        pthread_mutex_lock(&s->lock);
        s->st.rejected[DR_REJECT_INSUFFICIENT_MEMORY]++;
        reject(rej, DR_REJECT_INSUFFICIENT_MEMORY, 503, retry_after(s));
        pthread_mutex_unlock(&s->lock);
        return dr_fail_reason(&rej->error, DRAMA_ENOMEM, "insufficient_memory",
                              "insufficient_memory: the request needs %lld bytes of state, the memory budget is %lld",
                              (long long)plan.state_bytes, (long long)budget);
    }
    dr_sched_job *j = calloc(1, sizeof *j);
    if (!j || (st = drama_request_copy(s->model, req, &j->req, &rej->error)) != DRAMA_OK) {
        free(j);
        reject(rej, DR_REJECT_INVALID, 400, 0);
        return dr_fail(&rej->error, DRAMA_ENOMEM, "scheduler: out of memory queueing the request");
    }
    j->s = s;
    atomic_init(&j->refs, 2);
    atomic_init(&j->cancel, 0);
    atomic_init(&j->drain_cancel, 0);
    j->sink = *sink;
    j->t_submit = dr_clock_s();
    pthread_mutex_lock(&s->lock);
    /* room: the queue, plus the lanes free now (a job waits in the queue until the next tick) */
    int free_lanes = s->o.lanes - s->running;
    if (s->state != DR_SCHED_READY || s->stop || s->queued >= s->o.queue_size + (free_lanes > 0 ? free_lanes : 0)) {
        int draining = s->state != DR_SCHED_READY || s->stop;
        dr_sched_reject_reason why = draining ? DR_REJECT_DRAINING : DR_REJECT_QUEUE_FULL;
        s->st.rejected[why]++;
        reject(rej, why, draining ? 503 : 429, retry_after(s));
        pthread_mutex_unlock(&s->lock);
        drama_request_free(j->req);
        free(j);
        return dr_fail_reason(&rej->error, DRAMA_EBUSY, reject_names[why], "%s",
                              draining ? "draining: the server is shutting down"
                                       : "queue_full: every lane is busy and the queue is full");
    }
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->queued++;
    pthread_mutex_unlock(&s->lock);
    pthread_cond_signal(&s->wake);
    *job = j;
    return DRAMA_OK;
}

int dr_sched_drain(dr_sched *s, double timeout_s) {
    if (!s) return 0;
    if (timeout_s < 0) timeout_s = s->o.drain_timeout_s;
    pthread_mutex_lock(&s->lock);
    if (s->state == DR_SCHED_READY || s->state == DR_SCHED_LOADING) s->state = DR_SCHED_DRAINING;
    s->st.state = s->state;
    pthread_cond_signal(&s->wake);
    double deadline = dr_clock_s() + timeout_s;
    while ((s->running > 0 || s->queued > 0) && dr_clock_s() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->changed, &s->lock, &ts);
    }
    int cancelled = 0;
    for (int i = 0; i < s->o.lanes; i++)
        if (s->run[i]) {
            atomic_store(&s->run[i]->drain_cancel, 1); /* the scheduler thread cancels the lane at its next tick */
            cancelled++;
        }
    while (s->running > 0 || s->queued > 0) { /* within a tick or two */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->changed, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
    return cancelled;
}

/* Frames per second over the last 5 s, from the samples the ticks left (0 once idle that long). */
static double frames_per_second(const dr_sched *s, double now) {
    int oldest = -1;
    for (int k = s->fps_n; k >= 1; k--) {
        int i = (s->fps_at + FPS_SAMPLES - k) % FPS_SAMPLES;
        if (now - s->fps_t[i] <= 5.0) {
            oldest = i;
            break;
        }
    }
    if (oldest < 0) return 0;
    double dt = now - s->fps_t[oldest];
    return dt > 0.05 ? (double)(s->fps_latest - s->fps_frames[oldest]) / dt : 0;
}

void dr_sched_stats_get(dr_sched *s, dr_sched_stats *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    double now = dr_clock_s();
    pthread_mutex_lock(&s->lock);
    s->st.frames_per_second = frames_per_second(s, now);
    *out = s->st;
    out->state = s->state;
    out->queue_depth = s->queued;
    out->lanes_active = s->running; /* exact now; the engine's figures follow at the end of the tick */
    pthread_mutex_unlock(&s->lock);
}
