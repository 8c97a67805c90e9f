/* Unit tests of the scheduler of `drama serve` (src/serve/scheduler.c) on the golden tiny model:
 * N >= 2 x lanes requests submitted together each equal their solo runs; loading, queue full
 * (429 with Retry-After), queue timeout, waiting for memory then insufficient_memory, client gone
 * while queued and while running (lanes back to idle, the next identical request identical),
 * drain. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "drama.h"
#include "gen/pipeline_internal.h"
#include "serve/scheduler.h"
#include "testutil.h"

static int g_nc; /* codes per frame of the model */

typedef struct job_sink {
    tu_pcm pcm;                /* first: solo runs collect into it directly */
    int chunks;
    atomic_int gone;           /* is_gone answers this */
    int gone_after_chunks;     /* > 0: is_gone turns 1 after that many chunks */
    atomic_int done;
    drama_status status;
    int rejected, cancelled;
    dr_sched_reject_reason reject_reason;
    dr_sched_cancel_reason cancel_reason;
    char finish[24];
    int32_t *codes;
    int64_t frames;
    int voice_cached;
    double first_audio_s;
} job_sink;

static int on_audio(void *user, const float *s, size_t n) {
    job_sink *k = user;
    tu_pcm_collect(&k->pcm, s, n);
    k->chunks++;
    if (k->gone_after_chunks > 0 && k->chunks >= k->gone_after_chunks) atomic_store(&k->gone, 1);
    return 0;
}

static int is_gone(void *user) { return atomic_load(&((job_sink *)user)->gone); }

static void on_done(void *user, const dr_sched_done *d) {
    job_sink *k = user;
    k->status = d->status;
    k->rejected = d->rejected;
    k->reject_reason = d->reject.reason;
    k->cancelled = d->cancelled;
    k->cancel_reason = d->cancel_reason;
    k->first_audio_s = d->first_audio_s;
    if (d->result) {
        snprintf(k->finish, sizeof k->finish, "%s", d->result->finish_reason);
        k->frames = d->result->frames;
        k->voice_cached = d->result->voice_cached;
        if (d->result->codes) {
            size_t b = (size_t)d->result->frames * d->result->n_codebooks * sizeof(int32_t);
            k->codes = malloc(b);
            memcpy(k->codes, d->result->codes, b);
        }
    }
    atomic_store(&k->done, 1);
}

static dr_sched_sink sink_of(job_sink *k) {
    dr_sched_sink s = {.user = k, .on_audio = on_audio, .is_gone = is_gone, .on_done = on_done};
    return s;
}

static void sink_free(job_sink *k) {
    tu_pcm_free(&k->pcm);
    free(k->codes);
    memset(k, 0, sizeof *k);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void wait_done(job_sink *k) {
    for (int i = 0; i < 60000 && !atomic_load(&k->done); i++) sleep_ms(1);
    if (!atomic_load(&k->done)) fail_msg("job did not finish within 60 s");
}

static void wait_state(dr_sched *s, dr_sched_state want) {
    for (int i = 0; i < 60000 && dr_sched_get_state(s) != want; i++) sleep_ms(1);
    assert_int_equal(dr_sched_get_state(s), want);
}

static void wait_idle(dr_sched *s) {
    dr_sched_stats st;
    for (int i = 0; i < 10000; i++) {
        dr_sched_stats_get(s, &st);
        if (st.lanes_active == 0 && st.queue_depth == 0 && st.memory_reserved_bytes == st.prompt_cache_bytes) return;
        sleep_ms(1);
    }
    fail_msg("scheduler not idle: %d lanes active, %d queued", st.lanes_active, st.queue_depth);
}

static drama_model *open_tiny(void) {
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = 2;
    drama_model *m = NULL;
    drama_error e = {0};
    if (drama_model_open(&m, tu_golden("tiny-drama3"), &mo, &e) != DRAMA_OK) fail_msg("model open: %s", e.message);
    g_nc = drama_model_codebooks(m);
    return m;
}

static void solo(drama_model *m, const drama_request *r, job_sink *k) {
    memset(k, 0, sizeof *k);
    drama_session *s = NULL;
    drama_error e = {0};
    drama_result res;
    assert_int_equal(drama_session_create(&s, m, &e), DRAMA_OK);
    k->status = drama_synthesize(s, r, on_audio, NULL, k, &res, &e);
    snprintf(k->finish, sizeof k->finish, "%s", res.finish_reason);
    k->frames = res.frames;
    k->codes = res.codes;
    res.codes = NULL;
    drama_session_free(s);
}

static void same(const job_sink *want, const job_sink *got, const char *what) {
    if (want->status != got->status) fail_msg("%s: status %d vs %d", what, want->status, got->status);
    assert_string_equal(want->finish, got->finish);
    assert_int_equal(want->frames, got->frames);
    if (want->status == DRAMA_OK) {
        assert_memory_equal(want->codes, got->codes, (size_t)want->frames * g_nc * sizeof(int32_t));
        if (want->pcm.n != got->pcm.n) fail_msg("%s: %zu vs %zu samples", what, want->pcm.n, got->pcm.n);
        assert_memory_equal(want->pcm.x, got->pcm.x, want->pcm.n * sizeof(float));
    }
}

static dr_sched *make(drama_model *m, int lanes, int queue, double timeout, int64_t budget, int64_t cache) {
    dr_sched_options o;
    dr_sched_options_default(&o);
    o.lanes = lanes;
    o.queue_size = queue;
    o.queue_timeout_s = timeout;
    o.memory_budget_bytes = budget;
    o.prompt_cache_bytes = cache;
    dr_sched *s = NULL;
    drama_error e = {0};
    if (dr_sched_create(m, &o, &s, &e) != DRAMA_OK) fail_msg("scheduler: %s", e.message);
    wait_state(s, DR_SCHED_READY);
    return s;
}

static int32_t g_codes[12 * 64];

static void base_request(drama_request *r, int i, drama_reference *ref) {
    drama_request_default(r);
    static const char *texts[4] = {"Hello there.", "A longer line of text for this one.", "Short.",
                                   "Three words here. And a second sentence."};
    r->text = texts[i % 4];
    r->seed = 300 + (uint64_t)i;
    r->seed_set = 1;
    r->frames = 3 + (i % 5);
    r->stream = i % 2;
    if (i % 3 == 1) {
        r->references = ref;
        r->n_references = 1;
        if (i % 2) r->cfg_gamma = 1.0f;
    }
}

/* 3 lanes, 8 requests submitted at once (from two threads), each equal to its solo run. */
#define N 8
typedef struct submitter {
    dr_sched *s;
    drama_request *r;
    job_sink *k;
    dr_sched_job **j;
    int from, to;
} submitter;

static void *submit_some(void *arg) {
    submitter *t = arg;
    for (int i = t->from; i < t->to; i++) {
        dr_sched_sink sk = sink_of(&t->k[i]);
        dr_sched_reject rej;
        if (dr_sched_submit(t->s, &t->r[i], &sk, &t->j[i], &rej) != DRAMA_OK) t->j[i] = NULL;
    }
    return NULL;
}

static void test_parallel_equals_solo(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    for (int i = 0; i < 12 * 64; i++) g_codes[i] = (i * 13) % 37;
    drama_reference ref = {.transcript = "A voice.", .codes = g_codes, .n_code_frames = 12};
    drama_request r[N];
    job_sink want[N], got[N];
    memset(got, 0, sizeof got);
    for (int i = 0; i < N; i++) {
        base_request(&r[i], i, &ref);
        solo(m, &r[i], &want[i]);
        assert_int_equal(want[i].status, DRAMA_OK);
    }
    dr_sched *s = make(m, 3, N, 30, -1, 16 << 20);
    dr_sched_job *j[N];
    submitter a = {s, r, got, j, 0, N / 2}, b = {s, r, got, j, N / 2, N};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, submit_some, &a);
    pthread_create(&tb, NULL, submit_some, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    for (int i = 0; i < N; i++) {
        assert_non_null(j[i]);
        wait_done(&got[i]);
        char what[32];
        snprintf(what, sizeof what, "request %d", i);
        same(&want[i], &got[i], what);
        assert_true(got[i].first_audio_s > 0);
        dr_sched_job_release(j[i]);
    }
    wait_idle(s);
    dr_sched_stats st;
    dr_sched_stats_get(s, &st);
    assert_int_equal(st.finished[DR_SCHED_FIN_FRAMES], N);
    assert_int_equal(st.lanes_total, 3);
    int64_t frames = 0;
    for (int i = 0; i < N; i++) frames += want[i].frames;
    assert_int_equal(st.frames_generated, frames);
    assert_true(st.audio_seconds > 0);
    printf("%d requests on 3 lanes equal to solo; %lld frames, cache hits %lld misses %lld\n", N,
           (long long)st.frames_generated, (long long)st.voice_cache_hits, (long long)st.voice_cache_misses);
    dr_sched_free(s);
    for (int i = 0; i < N; i++) {
        sink_free(&want[i]);
        sink_free(&got[i]);
    }
    drama_model_close(m);
}

/* Loading, queue full, queue timeout, insufficient memory, client gone, drain. */
static void test_admission(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    drama_request longr, shortr;
    drama_request_default(&longr);
    longr.text = "Runs for a while.";
    longr.seed = 1;
    longr.seed_set = 1;
    longr.frames = 750;
    shortr = longr;
    shortr.frames = 4;
    drama_error e = {0};

    /* loading: the engine cannot be created while the model is busy */
    pthread_mutex_lock(&m->run_lock);
    dr_sched_options o;
    dr_sched_options_default(&o);
    dr_sched *s = NULL;
    assert_int_equal(dr_sched_create(m, &o, &s, &e), DRAMA_OK);
    job_sink k0 = {0};
    dr_sched_sink sk0 = sink_of(&k0);
    dr_sched_job *j0 = NULL;
    dr_sched_reject rej;
    assert_int_equal(dr_sched_submit(s, &shortr, &sk0, &j0, &rej), DRAMA_EBUSY);
    assert_int_equal(rej.reason, DR_REJECT_LOADING);
    assert_int_equal(rej.http_status, 503);
    assert_string_equal(rej.error.reason, "loading");
    pthread_mutex_unlock(&m->run_lock);
    wait_state(s, DR_SCHED_READY);
    dr_sched_free(s);

    /* queue full: 1 lane, queue 1 */
    s = make(m, 1, 1, 30, -1, 0);
    job_sink kl = {0}, kq = {0}, kf = {0};
    dr_sched_sink skl = sink_of(&kl), skq = sink_of(&kq), skf = sink_of(&kf);
    dr_sched_job *jl, *jq, *jf = NULL;
    assert_int_equal(dr_sched_submit(s, &longr, &skl, &jl, &rej), DRAMA_OK);
    dr_sched_stats st;
    for (int i = 0; i < 10000; i++) {
        dr_sched_stats_get(s, &st);
        if (st.lanes_active == 1) break;
        sleep_ms(1);
    }
    assert_int_equal(st.lanes_active, 1);
    assert_int_equal(dr_sched_submit(s, &shortr, &skq, &jq, &rej), DRAMA_OK);
    assert_int_equal(dr_sched_submit(s, &shortr, &skf, &jf, &rej), DRAMA_EBUSY);
    assert_null(jf);
    assert_int_equal(rej.reason, DR_REJECT_QUEUE_FULL);
    assert_int_equal(rej.http_status, 429);
    assert_true(rej.retry_after_s >= 1);
    assert_string_equal(rej.error.reason, "queue_full");
    printf("queue full: 429, Retry-After %d: %s\n", rej.retry_after_s, rej.error.message);
    /* the client of the running request goes away: cancelled within a tick, the queued one runs */
    atomic_store(&kl.gone, 1);
    wait_done(&kl);
    assert_int_equal(kl.status, DRAMA_ECANCELLED);
    assert_true(kl.cancelled);
    assert_int_equal(kl.cancel_reason, DR_CANCEL_CLIENT_GONE);
    wait_done(&kq);
    assert_int_equal(kq.status, DRAMA_OK);
    dr_sched_job_release(jl);
    dr_sched_job_release(jq);
    wait_idle(s);
    dr_sched_stats_get(s, &st);
    assert_int_equal(st.rejected[DR_REJECT_QUEUE_FULL], 1);
    assert_int_equal(st.cancelled[DR_CANCEL_CLIENT_GONE], 1);
    assert_int_equal(st.finished[DR_SCHED_FIN_CANCELLED], 1);
    sink_free(&kl);
    sink_free(&kq);
    dr_sched_free(s);

    /* queue timeout, and a client gone while queued */
    s = make(m, 1, 4, 0.3, -1, 0);
    memset(&kl, 0, sizeof kl);
    memset(&kq, 0, sizeof kq);
    memset(&kf, 0, sizeof kf);
    skl = sink_of(&kl), skq = sink_of(&kq), skf = sink_of(&kf);
    assert_int_equal(dr_sched_submit(s, &longr, &skl, &jl, &rej), DRAMA_OK);
    assert_int_equal(dr_sched_submit(s, &shortr, &skq, &jq, &rej), DRAMA_OK);
    assert_int_equal(dr_sched_submit(s, &shortr, &skf, &jf, &rej), DRAMA_OK);
    atomic_store(&kf.gone, 1);
    wait_done(&kf);
    assert_true(kf.cancelled);
    assert_int_equal(kf.cancel_reason, DR_CANCEL_CLIENT_GONE);
    wait_done(&kq);
    assert_true(kq.rejected);
    assert_int_equal(kq.reject_reason, DR_REJECT_QUEUE_TIMEOUT);
    dr_sched_cancel(jl);
    wait_done(&kl);
    assert_int_equal(kl.cancel_reason, DR_CANCEL_REQUESTED);
    dr_sched_job_release(jl);
    dr_sched_job_release(jq);
    dr_sched_job_release(jf);
    wait_idle(s);
    sink_free(&kl);
    sink_free(&kq);
    sink_free(&kf);
    dr_sched_free(s);

    /* memory: room for one long request; a second waits for memory, then times out */
    drama_plan p;
    assert_int_equal(drama_request_plan(m, &longr, &p, &e), DRAMA_OK);
    s = make(m, 2, 4, 0.3, p.state_bytes + p.state_bytes / 2, 0);
    memset(&kl, 0, sizeof kl);
    memset(&kq, 0, sizeof kq);
    skl = sink_of(&kl), skq = sink_of(&kq);
    assert_int_equal(dr_sched_submit(s, &longr, &skl, &jl, &rej), DRAMA_OK);
    assert_int_equal(dr_sched_submit(s, &longr, &skq, &jq, &rej), DRAMA_OK);
    wait_done(&kq);
    assert_true(kq.rejected);
    assert_int_equal(kq.reject_reason, DR_REJECT_INSUFFICIENT_MEMORY);
    /* a request that can never fit is refused at submit */
    drama_request huge = longr;
    huge.frames = 750;
    huge.text = "A much longer text that makes a bigger prompt, and many frames.";
    dr_sched_job *jh = NULL;
    job_sink kh = {0};
    dr_sched_sink skh = sink_of(&kh);
    drama_plan ph;
    assert_int_equal(drama_request_plan(m, &huge, &ph, &e), DRAMA_OK);
    if (ph.state_bytes > p.state_bytes + p.state_bytes / 2) {
        assert_int_equal(dr_sched_submit(s, &huge, &skh, &jh, &rej), DRAMA_ENOMEM);
        assert_int_equal(rej.reason, DR_REJECT_INSUFFICIENT_MEMORY);
    }
    /* drain: the running request is cancelled when the timeout runs out; new ones are refused */
    assert_int_equal(dr_sched_drain(s, 0.05), 1);
    wait_done(&kl);
    assert_int_equal(kl.cancel_reason, DR_CANCEL_DRAIN);
    assert_int_equal(dr_sched_get_state(s), DR_SCHED_DRAINING);
    assert_int_equal(dr_sched_submit(s, &shortr, &skh, &jh, &rej), DRAMA_EBUSY);
    assert_int_equal(rej.reason, DR_REJECT_DRAINING);
    dr_sched_stats_get(s, &st);
    assert_int_equal(st.cancelled[DR_CANCEL_DRAIN], 1);
    assert_int_equal(st.rejected[DR_REJECT_INSUFFICIENT_MEMORY], ph.state_bytes > p.state_bytes + p.state_bytes / 2 ? 2 : 1);
    assert_int_equal(st.lanes_active, 0);
    dr_sched_job_release(jl);
    dr_sched_job_release(jq);
    sink_free(&kl);
    sink_free(&kq);
    sink_free(&kh);
    dr_sched_free(s);
    drama_model_close(m);
}

/* A client gone mid-stream: the lane frees within a frame, metrics return to idle, and the same
 * request afterwards equals its solo run. */
static void test_gone_mid_stream(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    for (int i = 0; i < 12 * 64; i++) g_codes[i] = (i * 13) % 37;
    drama_reference ref = {.transcript = "A voice.", .codes = g_codes, .n_code_frames = 12};
    drama_request r;
    base_request(&r, 1, &ref); /* voice, guided, stream */
    r.frames = 30;
    r.stream_first_frames = 2;
    r.stream_chunk_frames = 2;
    job_sink want;
    solo(m, &r, &want);
    dr_sched *s = make(m, 2, 4, 30, -1, 16 << 20);
    job_sink k = {0};
    k.gone_after_chunks = 3;
    dr_sched_sink sk = sink_of(&k);
    dr_sched_job *j;
    dr_sched_reject rej;
    assert_int_equal(dr_sched_submit(s, &r, &sk, &j, &rej), DRAMA_OK);
    wait_done(&k);
    assert_true(k.cancelled);
    assert_int_equal(k.cancel_reason, DR_CANCEL_CLIENT_GONE);
    assert_true(k.chunks <= 4); /* stopped within a frame of the hang-up */
    dr_sched_job_release(j);
    wait_idle(s);
    job_sink k2 = {0};
    sk = sink_of(&k2);
    assert_int_equal(dr_sched_submit(s, &r, &sk, &j, &rej), DRAMA_OK);
    wait_done(&k2);
    same(&want, &k2, "after a hang-up");
    assert_int_equal(k2.voice_cached, 1);
    dr_sched_job_release(j);
    wait_idle(s);
    dr_sched_stats st;
    dr_sched_stats_get(s, &st);
    assert_int_equal(st.voice_cache_hits, 1);
    assert_true(st.prompt_cache_bytes > 0);
    assert_int_equal(st.memory_reserved_bytes, st.prompt_cache_bytes);
    dr_sched_free(s);
    sink_free(&k);
    sink_free(&k2);
    sink_free(&want);
    drama_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_equals_solo),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_gone_mid_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
