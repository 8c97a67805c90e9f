/* synth.c - POST /v1/tts and POST /v1/audio/speech (API.md 3, 4): validate, encode references
 * (content-hash cache), admit through the scheduler, then answer whole, streamed or as SSE.
 *
 * Threads: the scheduler thread only queues float chunks into the job (on_audio) and marks it
 * done (on_done); the connection thread encodes (wav/pcm/mp3/opus) and writes. Each chunk is fed
 * to the encoder as it came, so a whole response (which waits, then encodes the same chunks)
 * has the bytes of the streamed one. A job is shared by three holders, each dropping one
 * reference: the scheduler (after on_done), the request (dr_synth_conn_closed) and a streamed
 * response (MHD's free callback). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/log.h"
#include "serve/encoder.h"
#include "serve/server_internal.h"

#define SSE_PING_S 15.0

typedef struct chunk {
    float *x;
    size_t n;
    struct chunk *next;
} chunk;

typedef struct dr_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    dr_server *srv;
    dr_sched_job *sj;
    int fd;                   /* the client's socket, polled for hang-up */
    int conn_closed;          /* the request is over: is_gone says so, the fd is not polled */
    /* from the scheduler */
    chunk *head, *tail;
    int n_chunks_in;
    int done;
    dr_api_error fail;        /* the failure when done and not successful */
    int64_t frames, prompt_tokens;
    double ttfa_s, rtf;
    int voice_cached;
    /* the connection side */
    dr_encoder *enc;
    dr_bytes out;             /* encoded bytes not yet written */
    int finished;             /* encoder flushed, done event queued */
    int openai, sse;
    dr_audio_format format;
    uint64_t seed;
    double t_submit, t_request, t_last_write;
} dr_job;

static void job_unref(dr_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    for (chunk *k = j->head, *n; k; k = n) {
        n = k->next;
        free(k->x);
        free(k);
    }
    dr_encoder_free(j->enc);
    dr_bytes_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ---- scheduler-thread callbacks: copy, flag, signal; nothing slow ---- */

static int on_audio(void *user, const float *x, size_t n) {
    dr_job *j = user;
    chunk *k = malloc(sizeof *k);
    float *copy = malloc((n ? n : 1) * sizeof *copy);
    pthread_mutex_lock(&j->mu);
    int gone = j->conn_closed;
    if (!gone && k && copy) {
        memcpy(copy, x, n * sizeof *copy);
        k->x = copy;
        k->n = n;
        k->next = NULL;
        if (j->tail) j->tail->next = k;
        else j->head = k;
        j->tail = k;
        j->n_chunks_in++;
        k = NULL;
        copy = NULL;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    int failed = k != NULL; /* not queued: out of memory, or nobody to send it to */
    free(k);
    free(copy);
    return gone || failed;
}

static int is_gone(void *user) {
    dr_job *j = user;
    pthread_mutex_lock(&j->mu);
    int gone = j->conn_closed;
    if (!gone && j->fd >= 0) {
        struct pollfd p = {j->fd, POLLRDHUP, 0};
        gone = poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
    }
    pthread_mutex_unlock(&j->mu);
    return gone;
}

static void map_failure(const dr_sched_done *d, dr_api_error *e) {
    if (d->rejected) {
        e->retry_after_s = d->reject.retry_after_s;
        dr_api_fail(e, d->reject.http_status ? d->reject.http_status : 503, dr_sched_reject_name(d->reject.reason), NULL,
                    "%s", d->reject.error.message[0] ? d->reject.error.message : dr_sched_reject_name(d->reject.reason));
        return;
    }
    const char *msg = d->error && d->error->message[0] ? d->error->message : "generation failed";
    if (d->cancelled) {
        if (d->cancel_reason == DR_CANCEL_CLIENT_GONE) {
            dr_api_fail(e, 499, "client_gone", NULL, "the client closed the connection"); /* nginx's 499: nobody reads it */
        } else if (d->cancel_reason == DR_CANCEL_DRAIN) {
            e->retry_after_s = 30;
            dr_api_fail(e, 503, "draining", NULL, "cancelled: the server is shutting down");
        } else {
            dr_api_fail(e, 500, "internal", NULL, "cancelled (%s)", dr_sched_cancel_name(d->cancel_reason));
        }
        return;
    }
    switch (d->status) {
    case DRAMA_EFRAMELIMIT: dr_api_fail(e, 422, "frame_limit", NULL, "%s", msg); break;
    case DRAMA_EEMPTY: dr_api_fail(e, 422, "empty_generation", NULL, "%s", msg); break;
    case DRAMA_ENUMERIC: dr_api_fail(e, 500, "numerical_error", NULL, "%s", msg); break;
    default:
        if (d->error && d->error->reason[0] && d->status == DRAMA_EINVAL)
            dr_api_fail(e, 400, d->error->reason, NULL, "%s", msg);
        else
            dr_api_fail(e, 500, "internal", NULL, "%s", msg);
    }
}

static void on_done(void *user, const dr_sched_done *d) {
    dr_job *j = user;
    pthread_mutex_lock(&j->mu);
    if (d->status == DRAMA_OK && d->result) {
        j->frames = d->result->frames;
        j->prompt_tokens = d->result->prompt_tokens;
        j->voice_cached = d->result->voice_cached;
        j->rtf = d->result->real_time_factor;
        j->ttfa_s = (j->t_submit - j->t_request) + d->first_audio_s;
    } else {
        map_failure(d, &j->fail);
        if (!j->fail.status) dr_api_fail(&j->fail, 500, "internal", NULL, "generation failed");
    }
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

/* ---- validation and admission ---- */

typedef struct prepared {
    drama_request req;
    drama_reference refs[DR_MAX_REFERENCES];
    int32_t *codes[DR_MAX_REFERENCES];
    dr_voice *voices[DR_MAX_REFERENCES];
    int n;
} prepared;

static void prepared_free(prepared *p) {
    for (int k = 0; k < p->n; k++) {
        free(p->codes[k]);
        dr_voice_release(p->voices[k]);
    }
    p->n = 0;
}

static int prepare(dr_server *s, const dr_synth_req *r, prepared *p, dr_api_error *e) {
    if (dr_check_text(s, r->text, r->text_len, r->openai ? "input" : "text", s->opt.max_text_length, e)) return e->status;
    for (int k = 0; k < r->n_refs; k++) {
        char param[48];
        snprintf(param, sizeof param, "references[%d].text", k);
        if (dr_check_text(s, r->refs[k].text, strlen(r->refs[k].text), param, 0, e)) return e->status;
    }
    for (int k = 0; k < r->n_voice_ids; k++) {
        char param[48];
        if (r->openai) snprintf(param, sizeof param, "voice");
        else if (r->n_voice_ids == 1) snprintf(param, sizeof param, "reference_id");
        else snprintf(param, sizeof param, "reference_id[%d]", k);
        dr_voice *v = dr_voices_get(s->voices, r->voice_ids[k]);
        if (!v) return dr_api_fail(e, 400, "unknown_voice", param, "no voice '%s' (POST /v1/voices stores one)", r->voice_ids[k]);
        p->voices[p->n] = v;
        p->refs[p->n].codes = v->codes;
        p->refs[p->n].n_code_frames = v->n_frames;
        p->refs[p->n].transcript = v->text;
        p->n++;
    }
    for (int k = 0; k < r->n_refs; k++) {
        char param[48];
        snprintf(param, sizeof param, "references[%d].audio", k);
        int64_t frames = 0;
        double dur = 0;
        if (dr_encode_reference(s, r->refs[k].audio, r->refs[k].audio_len, param, &p->codes[p->n], &frames, &dur, e))
            return e->status;
        p->refs[p->n].codes = p->codes[p->n];
        p->refs[p->n].n_code_frames = frames;
        p->refs[p->n].transcript = r->refs[k].text;
        p->n++;
    }
    drama_request *q = &p->req;
    drama_request_default(q);
    q->text = r->text;
    q->references = p->n ? p->refs : NULL;
    q->n_references = p->n;
    q->temperature = (float)r->temperature;
    q->top_p = (float)r->top_p;
    q->cfg_gamma = (float)r->cfg_gamma;
    q->seed = r->seed;
    q->seed_set = 1;
    q->max_frames = r->max_frames;
    q->frames = r->frames;
    q->chunk_bytes = r->openai ? 0 : r->chunk_length; /* /v1/tts chunk_length (TEXT.md 4.4) */
    q->stream = 1; /* whole responses run the streamed schedule too (same chunks, same bytes) */
    q->stream_first_frames = s->opt.stream_first_frames ? s->opt.stream_first_frames : r->latency_balanced ? 4 : 10;
    q->stream_chunk_frames = s->opt.stream_chunk_frames ? s->opt.stream_chunk_frames : r->latency_balanced ? 16 : 25;
    return 0;
}

static dr_job *job_new(dr_server *s, dr_conn *c, const dr_synth_req *r) {
    dr_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->srv = s;
    j->refs = 1; /* the request's */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->openai = r->openai;
    j->sse = r->sse;
    j->format = r->format;
    j->seed = r->seed;
    j->t_request = c->t_start;
    return j;
}

/* Appends encoder output to what goes out: raw, or as one SSE delta event. */
static void emit(dr_job *j, const dr_bytes *piece) {
    if (!piece->len) return;
    int bad = 0;
    if (j->sse) {
        char *b64 = dr_base64_encode(piece->data, piece->len);
        json_t *ev = b64 ? json_pack("{s:s, s:s}", "type", "speech.audio.delta", "audio", b64) : NULL;
        char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
        bad = !s || dr_bytes_append(&j->out, "data: ", 6) || dr_bytes_append(&j->out, s, strlen(s)) ||
              dr_bytes_append(&j->out, "\n\n", 2);
        free(s);
        json_decref(ev);
        free(b64);
    } else {
        bad = dr_bytes_append(&j->out, piece->data, piece->len) != 0;
    }
    if (bad) {
        pthread_mutex_lock(&j->mu);
        dr_api_fail(&j->fail, 500, "internal", NULL, "out of memory");
        pthread_mutex_unlock(&j->mu);
    }
}

/* Encodes the next queued chunk (or the tail once done) into j->out, outside the lock. Returns
 * 1 when something was added or state changed, 0 when there is nothing to do yet. */
static int encode_step(dr_job *j) {
    chunk *k = NULL;
    int done;
    pthread_mutex_lock(&j->mu);
    if (j->head) {
        k = j->head;
        j->head = k->next;
        if (!j->head) j->tail = NULL;
    }
    done = j->done && !j->fail.status;
    pthread_mutex_unlock(&j->mu);
    drama_error err = {0};
    dr_bytes piece = {0};
    drama_status st = DRAMA_OK;
    if (k) {
        st = dr_encoder_feed(j->enc, k->x, k->n, &piece, &err);
        free(k->x);
        free(k);
    } else if (done && !j->finished) {
        st = dr_encoder_finish(j->enc, &piece, &err);
        j->finished = 1;
    } else {
        return 0;
    }
    if (st != DRAMA_OK) {
        pthread_mutex_lock(&j->mu);
        dr_api_fail(&j->fail, 500, "internal", NULL, "%s", err.message);
        pthread_mutex_unlock(&j->mu);
        DR_WARN("serve: encoding failed: %s", err.message);
    }
    emit(j, &piece);
    dr_bytes_free(&piece);
    if (j->sse && j->finished && !j->fail.status) {
        char ev[256];
        int n = snprintf(ev, sizeof ev,
                         "data: {\"type\":\"speech.audio.done\",\"usage\":{\"input_tokens\":%" PRId64
                         ",\"output_tokens\":%" PRId64 ",\"total_tokens\":%" PRId64 "}}\n\n",
                         j->prompt_tokens, j->frames, j->prompt_tokens + j->frames);
        dr_bytes_append(&j->out, ev, (size_t)n);
    }
    return 1;
}

static void sse_error_event(dr_job *j) {
    char *env = dr_api_error_json(&j->fail);
    /* the envelope is {"error": {...}}: the event is {"type": "error", "error": {...}} */
    if (env && env[0] == '{') {
        dr_bytes_append(&j->out, "data: {\"type\":\"error\",", 22);
        dr_bytes_append(&j->out, env + 1, strlen(env + 1));
        dr_bytes_append(&j->out, "\n\n", 2);
    }
    free(env);
}

/* MHD content reader for streamed and SSE bodies (the connection's thread; may block). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    dr_job *j = cls;
    for (;;) {
        if (j->out.len) {
            size_t n = j->out.len < max ? j->out.len : max;
            memcpy(buf, j->out.data, n);
            dr_bytes_consume(&j->out, n);
            j->t_last_write = dr_now_s();
            return (ssize_t)n;
        }
        pthread_mutex_lock(&j->mu);
        int failed = j->fail.status != 0, pending = j->head != NULL, done = j->done;
        pthread_mutex_unlock(&j->mu);
        if (failed && !pending) {
            if (j->sse && j->finished != 2) {
                j->finished = 2;
                sse_error_event(j);
                if (j->out.len) continue;
            }
            DR_WARN("serve: stream ended early: %s", j->fail.message);
            return MHD_CONTENT_READER_END_WITH_ERROR; /* no terminating chunk (API.md 3.3) */
        }
        if (encode_step(j)) continue;
        if (done && j->finished && !failed) return MHD_CONTENT_READER_END_OF_STREAM;
        /* wait for audio; SSE sends a comment every 15 s while nothing else goes out */
        pthread_mutex_lock(&j->mu);
        if (!j->head && !j->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        pthread_mutex_unlock(&j->mu);
        if (j->sse && dr_now_s() - j->t_last_write >= SSE_PING_S) dr_bytes_append(&j->out, ": ping\n\n", 8);
    }
}

static void stream_free(void *cls) { job_unref(cls); }

static void audio_headers(dr_job *j, struct MHD_Response *r) {
    char seed[32], disp[64];
    snprintf(seed, sizeof seed, "%" PRIu64, j->seed);
    MHD_add_response_header(r, "X-Seed", seed);
    if (j->sse) {
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        return;
    }
    MHD_add_response_header(r, "Content-Type", dr_audio_format_content_type(j->format, j->openai));
    snprintf(disp, sizeof disp, "attachment; filename=audio.%s", dr_audio_format_name(j->format));
    MHD_add_response_header(r, "Content-Disposition", disp);
}

static enum MHD_Result respond_stream(dr_conn *c, dr_job *j) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, stream_reader, j, stream_free);
    if (!r) return MHD_NO;
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the response's, dropped by stream_free */
    pthread_mutex_unlock(&j->mu);
    j->t_last_write = dr_now_s();
    audio_headers(j, r);
    dr_response_common_headers(c, r);
    c->status = 200;
    enum MHD_Result rc = MHD_queue_response(c->mc, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result respond_whole(dr_conn *c, dr_job *j) {
    while (encode_step(j)) {
    }
    if (j->fail.status) return dr_respond_error(c, &j->fail);
    if (j->format == DR_AF_WAV) dr_encoder_wav_patch(j->out.data, j->out.len);
    struct MHD_Response *r = MHD_create_response_from_buffer(j->out.len, j->out.data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    char frames[32];
    snprintf(frames, sizeof frames, "%" PRId64, j->frames);
    audio_headers(j, r);
    MHD_add_response_header(r, "X-Audio-Frames", frames);
    dr_response_common_headers(c, r);
    c->status = 200;
    enum MHD_Result rc = MHD_queue_response(c->mc, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result synthesize(dr_server *s, dr_conn *c, int openai) {
    dr_api_error e = {0};
    dr_synth_req r;
    memset(&r, 0, sizeof r);
    prepared p;
    memset(&p, 0, sizeof p);
    dr_val *body = NULL;
    if (dr_server_unavailable(s, &e) || !(body = dr_conn_body(c, &e)) ||
        (openai ? dr_parse_speech(body, &s->limits, &r, &e) : dr_parse_tts(body, &s->limits, &r, &e)) ||
        prepare(s, &r, &p, &e)) {
        prepared_free(&p);
        dr_synth_req_free(&r);
        dr_val_free(body);
        return dr_respond_error(c, &e);
    }
    if (!r.seed_set) {
        if (getrandom(&p.req.seed, sizeof p.req.seed, 0) != (ssize_t)sizeof p.req.seed)
            p.req.seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)c;
        p.req.seed >>= 1; /* within int64, so the X-Seed value can be sent back in JSON */
    }
    r.seed = p.req.seed;
    dr_job *j = job_new(s, c, &r);
    drama_error err = {0};
    dr_encoder_opts eo = {r.format, s->sample_rate, (openai && r.format == DR_AF_PCM) ? 24000 : 0, (uint32_t)r.seed};
    dr_bytes head = {0};
    if (!j || dr_encoder_create(&j->enc, &eo, &head, &err) != DRAMA_OK) {
        dr_bytes_free(&head);
        dr_api_fail(&e, 500, "internal", NULL, "%s", err.message[0] ? err.message : "out of memory");
        if (j) job_unref(j);
        prepared_free(&p);
        dr_synth_req_free(&r);
        dr_val_free(body);
        return dr_respond_error(c, &e);
    }
    emit(j, &head); /* the wav header / Ogg Opus headers */
    dr_bytes_free(&head);
    dr_sched_sink sink = {j, on_audio, is_gone, on_done};
    dr_sched_reject rej;
    memset(&rej, 0, sizeof rej);
    j->refs++; /* the scheduler's, dropped after on_done */
    j->t_submit = dr_now_s();
    drama_status st = dr_sched_submit(s->sched, &p.req, &sink, &j->sj, &rej);
    prepared_free(&p); /* the scheduler copied what it needs */
    dr_synth_req_free(&r);
    dr_val_free(body);
    if (st != DRAMA_OK) {
        job_unref(j); /* no callback will come */
        job_unref(j);
        if (rej.reason == DR_REJECT_INVALID)
            dr_api_fail(&e, 400, rej.error.reason[0] ? rej.error.reason : "out_of_range", NULL, "%s", rej.error.message);
        else
            dr_api_fail(&e, rej.http_status ? rej.http_status : 503, dr_sched_reject_name(rej.reason), NULL, "%s",
                        rej.error.message[0] ? rej.error.message : dr_sched_reject_name(rej.reason));
        e.retry_after_s = rej.retry_after_s;
        return dr_respond_error(c, &e);
    }
    c->job = j;
    if (j->sse) return respond_stream(c, j); /* status now: pings flow while queued */
    /* whole: wait for the end; streamed: for the first chunk (status 200 only with audio) */
    int streaming = r.streaming;
    pthread_mutex_lock(&j->mu);
    while (!j->done && !(streaming && j->head)) pthread_cond_wait(&j->cv, &j->mu);
    int failed = j->fail.status;
    pthread_mutex_unlock(&j->mu);
    if (failed == 499) { /* hung up: nothing to answer */
        c->status = 499;
        return MHD_NO;
    }
    if (failed) return dr_respond_error(c, &j->fail);
    return streaming ? respond_stream(c, j) : respond_whole(c, j);
}

enum MHD_Result dr_handle_tts(dr_server *s, dr_conn *c) { return synthesize(s, c, 0); }
enum MHD_Result dr_handle_speech(dr_server *s, dr_conn *c) { return synthesize(s, c, 1); }

void dr_synth_conn_closed(dr_conn *c) {
    dr_job *j = c->job;
    if (!j) return;
    c->job = NULL;
    pthread_mutex_lock(&j->mu);
    j->conn_closed = 1; /* from now on is_gone answers without the fd (MHD may reuse it) */
    int ok = j->done && !j->fail.status && j->finished;
    pthread_mutex_unlock(&j->mu);
    if (ok) dr_metrics_synthesis(c->srv->metrics, j->ttfa_s, j->voice_cached, j->rtf);
    dr_sched_job_release(j->sj);
    job_unref(j);
}
