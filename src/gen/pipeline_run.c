/* pipeline_run.c - one request, start to end (see pipeline.h for the order of the phases).
 *
 * Failure rule: any failure, the frame cap or a cancellation returns an error; the caller (the
 * CLI, the server) then publishes nothing. Audio handed to on_audio before a failure (stream
 * mode) must be discarded by the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/receipt.h"
#include "gen/pipeline_adapt.h"
#include "gen/pipeline_internal.h"
#include "io/codes_json.h"

typedef struct run_ctx {
    drama_session *s;
    drama_model *m;
    const drama_request *req;
    drama_audio_fn on_audio;
    drama_event_fn on_event;
    void *user;
    drama_result *res;
    dr_phase_clock clock;
    int n_batches, batch;
    int64_t frames_target;
    /* generated frames, all batches, frame-major */
    int32_t *codes;
    int64_t n_frames, cap_frames;
    int nc;
    /* streaming */
    dr_codec_stream *stream;
    int64_t frames_decoded;
    int chunk_index;
    float *pcm;
    int64_t pcm_cap;
} run_ctx;

static int cancelled(run_ctx *c) { return atomic_load(&c->s->cancel) != 0; }

static int emit_event(run_ctx *c, drama_event_type type) {
    if (!c->on_event) return 0;
    drama_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = type;
    ev.phase = c->clock.phase;
    ev.batch = c->batch;
    ev.n_batches = c->n_batches;
    ev.frames = c->n_frames;
    ev.frames_target = c->frames_target;
    ev.samples_total = c->res->samples;
    ev.audio_seconds = c->res->sample_rate ? (double)c->n_frames * c->res->samples_per_frame / c->res->sample_rate : 0;
    ev.elapsed_s = dr_clock_s() - c->clock.t_request;
    ev.rss_bytes = dr_mem_rss_bytes();
    return c->on_event(c->user, &ev);
}

static void phase(run_ctx *c, int p) {
    dr_phase_begin(&c->clock, c->res, p);
    if (emit_event(c, DRAMA_EVENT_PHASE)) drama_session_cancel(c->s);
}

static drama_status deliver(run_ctx *c, const float *x, int64_t n, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (c->res->time_to_first_audio_s <= 0) c->res->time_to_first_audio_s = dr_clock_s() - c->clock.t_request;
    c->res->samples += n;
    int stop = c->on_audio ? c->on_audio(c->user, x, (size_t)n) : 0;
    if (emit_event(c, DRAMA_EVENT_CHUNK)) stop = 1;
    if (stop) {
        drama_session_cancel(c->s);
        return dr_fail(err, DRAMA_ECANCELLED, "cancelled by the audio consumer after %lld samples",
                       (long long)c->res->samples);
    }
    return DRAMA_OK;
}

static drama_status ensure_pcm(run_ctx *c, int64_t frames, drama_error *err) {
    int64_t need = frames * c->res->samples_per_frame;
    if (need <= c->pcm_cap) return DRAMA_OK;
    size_t bytes;
    if (!dr_mul_size((size_t)need, sizeof(float), &bytes)) return dr_fail(err, DRAMA_ENOMEM, "audio buffer size overflow");
    float *p = realloc(c->pcm, bytes);
    if (!p) return dr_fail(err, DRAMA_ENOMEM, "out of memory for %lld samples of audio", (long long)need);
    c->pcm = p;
    c->pcm_cap = need;
    return DRAMA_OK;
}

/* Stream mode: decode and deliver the frames not yet decoded, in schedule-sized chunks
 * (`final` flushes a short last chunk). */
static drama_status stream_flush(run_ctx *c, int final, drama_error *err) {
    for (;;) {
        int64_t pending = c->n_frames - c->frames_decoded;
        int want = dr_stream_chunk_frames(c->chunk_index, c->req->stream_chunk_frames);
        if (pending <= 0 || (pending < want && !final)) return DRAMA_OK;
        int64_t n = pending < want ? pending : want;
        drama_status st = ensure_pcm(c, n, err);
        if (st != DRAMA_OK) return st;
        st = dr_codec_stream_feed(c->stream, c->codes + c->frames_decoded * c->nc, n, c->pcm, err);
        if (st != DRAMA_OK) return st;
        c->frames_decoded += n;
        c->chunk_index++;
        st = deliver(c, c->pcm, n * c->res->samples_per_frame, err);
        if (st != DRAMA_OK) return st;
    }
}

/* Called by the generator for every new frame: keep it, report, stream, check cancellation. */
static drama_status on_frame(void *ctx, const int32_t *frame, drama_error *err) {
    run_ctx *c = ctx;
    if (c->n_frames == c->cap_frames) {
        int64_t cap = c->cap_frames ? 2 * c->cap_frames : 256;
        int32_t *p = realloc(c->codes, (size_t)cap * (size_t)c->nc * sizeof *p);
        if (!p) return dr_fail(err, DRAMA_ENOMEM, "out of memory keeping %lld frames", (long long)cap);
        c->codes = p;
        c->cap_frames = cap;
    }
    memcpy(c->codes + c->n_frames * c->nc, frame, (size_t)c->nc * sizeof *frame);
    c->n_frames++;
    c->res->frames = c->n_frames;
    if (emit_event(c, DRAMA_EVENT_FRAMES)) drama_session_cancel(c->s);
    if (c->stream) {
        drama_status st = stream_flush(c, 0, err);
        if (st != DRAMA_OK) return st;
    }
    if (cancelled(c)) return dr_fail(err, DRAMA_ECANCELLED, "cancelled after %lld frames", (long long)c->n_frames);
    return DRAMA_OK;
}

/* References -> codes (the encode phase). Errors name the reference and its file, and come
 * before any generation. */
static drama_status encode_references(run_ctx *c, dr_pl_refs *refs, drama_error *err) {
    const drama_request *q = c->req;
    if (q->n_references == 0) return DRAMA_OK;
    phase(c, DRAMA_PHASE_ENCODE);
    drama_status st = dr_pl_refs_encode(c->m, q->references, q->n_references, refs, err);
    if (st == DRAMA_OK && cancelled(c)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled while encoding references");
    return st;
}

static drama_status run(run_ctx *c, drama_error *err) {
    drama_model *m = c->m;
    const drama_request *q = c->req;
    drama_status st;
    dr_pl_refs refs;
    memset(&refs, 0, sizeof refs);
    dr_pl_text text;
    memset(&text, 0, sizeof text);
    dr_pl_gen *gen = NULL;

    /* Text first: a bad text fails before any heavy work. */
    st = dr_pl_text_prepare(m, q, &text, err);
    if (st != DRAMA_OK) goto out;
    c->n_batches = text.n_batches;
    c->res->n_batches = text.n_batches;
    /* Progress target over the whole request: the exact count, else the cap of every batch. */
    if (q->frames <= 0)
        c->frames_target = (int64_t)(q->frames_per_batch > 0 ? q->frames_per_batch : q->max_frames) * text.n_batches;

    st = encode_references(c, &refs, err);
    if (st != DRAMA_OK) goto out;

    phase(c, DRAMA_PHASE_LOAD);
    st = dr_pl_lm_acquire(m, err);
    if (st == DRAMA_OK && cancelled(c)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled while loading");
    if (st != DRAMA_OK) goto out;
    if (!m->codec && !m->low_memory) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
    else if (!q->stream) st = dr_pl_codec_check(m, err); /* low memory: decoder loads after generation */
    if (st != DRAMA_OK) goto out;

    phase(c, DRAMA_PHASE_GENERATE);
    if (q->stream) {
        if (!m->codec) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
        if (st == DRAMA_OK) st = dr_codec_stream_create(m->codec, &c->stream, err);
        if (st != DRAMA_OK) goto out;
    }
    dr_pl_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.temperature = q->temperature;
    gp.top_p = q->top_p;
    gp.cfg_gamma = q->n_references > 0 ? q->cfg_gamma : 0.0f; /* the model's own voice is never guided */
    gp.seed = c->res->seed;
    gp.frame_cap = q->max_frames;
    gp.has_reference = q->n_references > 0;
    st = dr_pl_gen_create(m, &gp, &gen, err);
    if (st != DRAMA_OK) goto out;
    for (int b = 0; b < text.n_batches; b++) {
        c->batch = b;
        if (cancelled(c)) {
            st = dr_fail(err, DRAMA_ECANCELLED, "cancelled before batch %d (%lld frames)", b, (long long)c->n_frames);
            goto out;
        }
        int64_t prompt_rows = 0;
        int64_t budget = q->frames > 0 ? q->frames - c->n_frames : q->frames_per_batch; /* 0 = until the end token */
        int64_t ahead = budget > 0 && budget < q->max_frames ? budget : q->max_frames;
        int64_t context = q->context > 0 ? q->context : DR_DEFAULT_CONTEXT;
        st = dr_pl_gen_prompt(gen, m, &text, b, &refs, context, ahead, &prompt_rows, err);
        if (st != DRAMA_OK) goto out;
        if (b == 0) c->res->prompt_tokens = prompt_rows;
        int ended = 0;
        st = dr_pl_gen_frames(gen, budget, on_frame, c, &ended, err);
        if (st == DRAMA_EEMPTY) snprintf(c->res->finish_reason, sizeof c->res->finish_reason, "empty_generation");
        if (st != DRAMA_OK) goto out;
        if (q->frames > 0 && c->n_frames >= q->frames) {
            snprintf(c->res->finish_reason, sizeof c->res->finish_reason, "frames");
            break;
        }
        if (!ended && q->frames_per_batch > 0 && b == text.n_batches - 1)
            snprintf(c->res->finish_reason, sizeof c->res->finish_reason, "frames");
    }
    if (!c->res->finish_reason[0]) snprintf(c->res->finish_reason, sizeof c->res->finish_reason, "end_token");
    if (c->n_frames == 0) {
        snprintf(c->res->finish_reason, sizeof c->res->finish_reason, "empty_generation");
        st = dr_fail(err, DRAMA_EEMPTY, "the model produced no audio (end token first)");
        goto out;
    }
    if (c->stream) {
        st = stream_flush(c, 1, err);
        if (st != DRAMA_OK) goto out;
    }
    dr_pl_gen_free(gen);
    gen = NULL;

    if (!c->stream) {
        if (m->low_memory) {
            /* Release the backbone and tower (unmap weights, free state) before decoding; the
             * generate phase closes first so its rss_end shows what was resident. */
            dr_phase_end(&c->clock, c->res);
            dr_pl_lm_release(m);
        }
        phase(c, DRAMA_PHASE_DECODE);
        if (!m->codec) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
        if (st == DRAMA_OK) st = ensure_pcm(c, c->n_frames, err);
        if (st == DRAMA_OK) st = dr_codec_decode(m->codec, c->codes, c->n_frames, c->pcm, err);
        if (st == DRAMA_OK && cancelled(c)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled before delivering audio");
        if (st == DRAMA_OK) st = deliver(c, c->pcm, c->n_frames * c->res->samples_per_frame, err);
        if (st != DRAMA_OK) goto out;
    }

out:
    dr_pl_gen_free(gen);
    dr_pl_refs_free(&refs);
    dr_pl_text_free(&text);
    return st;
}

drama_status dr_pl_run(drama_session *s, const drama_request *req, drama_audio_fn on_audio, drama_event_fn on_event,
                       void *user, drama_result *res, drama_error *err) {
    run_ctx c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.m = s->model;
    c.req = req;
    c.on_audio = on_audio;
    c.on_event = on_event;
    c.user = user;
    c.res = res;
    c.clock.phase = -1;
    c.clock.t_request = dr_clock_s();
    c.frames_target = req->frames > 0 ? req->frames : req->max_frames;
    res->seed = req->seed_set ? req->seed : dr_pl_random_seed();
    res->sample_rate = c.m->sample_rate;
    res->samples_per_frame = c.m->samples_per_frame;
    res->n_codebooks = c.nc = c.m->n_codebooks;
    drama_status st = run(&c, err);
    dr_phase_end(&c.clock, res);
    if (st == DRAMA_EFRAMELIMIT) snprintf(res->finish_reason, sizeof res->finish_reason, "frame_limit");
    /* A failure after the last frame (decoding, delivery) is not a successful finish. */
    if (st != DRAMA_OK && (!strcmp(res->finish_reason, "frames") || !strcmp(res->finish_reason, "end_token")))
        snprintf(res->finish_reason, sizeof res->finish_reason, "%s", st == DRAMA_ECANCELLED ? "cancelled" : "error");
    res->wall_s = dr_clock_s() - c.clock.t_request;
    res->audio_seconds = res->sample_rate ? (double)res->samples / res->sample_rate : 0;
    /* Keep the codes (for --save-codes) on success only. */
    if (st == DRAMA_OK) {
        res->codes = c.codes;
        c.codes = NULL;
    }
    dr_codec_stream_free(c.stream);
    free(c.codes);
    free(c.pcm);
    if (c.m->low_memory) {
        dr_pl_lm_release(c.m);
        dr_pl_codec_release(c.m);
    }
    return st;
}
