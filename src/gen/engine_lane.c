/* engine_lane.c - one request in a lane, one step per tick (engine_internal.h lists the phases).
 *
 * The steps are those of a request run alone: text -> batches, references -> codes, the prompt of
 * each batch, its prefill, frames until the end token / the exact count / the cap, the codec's
 * streaming decode on the request's chunk schedule. Only the cutting into ticks differs, and it
 * changes no result: prefill extends a state exactly, a batched frame step gives each session the
 * codes of stepping it alone, and the codec gives the same samples for any chunking.
 *
 * Failure rule (TEXT.md 6): any failure, the frame cap or a cancellation fails the whole request;
 * audio already delivered in stream mode is the caller's to discard. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/receipt.h"
#include "gen/engine_internal.h"

drama_lane dr_lane_handle(const dr_lane *l) { return (uint64_t)l->serial << 16 | (uint64_t)(l->index + 1); }

int dr_lane_cancelled(const dr_lane *l) {
    return atomic_load(&l->cancel) == dr_lane_handle(l) || (l->ext_cancel && atomic_load(l->ext_cancel));
}

static void request_cancel(dr_lane *l) { atomic_store(&l->cancel, dr_lane_handle(l)); }

static int emit_event(dr_lane *l, drama_event_type type) {
    if (!l->on_event) return 0;
    drama_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = type;
    ev.phase = l->clock.phase;
    ev.batch = l->batch;
    ev.n_batches = l->n_batches;
    ev.frames = l->n_frames;
    ev.frames_target = l->frames_target;
    ev.samples_total = l->res.samples;
    ev.audio_seconds = l->res.sample_rate ? (double)l->n_frames * l->res.samples_per_frame / l->res.sample_rate : 0;
    ev.elapsed_s = dr_clock_s() - l->clock.t_request;
    ev.rss_bytes = dr_mem_rss_bytes();
    return l->on_event(l->user, &ev);
}

static void phase(dr_lane *l, int p) {
    dr_phase_begin(&l->clock, &l->res, p);
    if (emit_event(l, DRAMA_EVENT_PHASE)) request_cancel(l);
}

static drama_status deliver(dr_lane *l, const float *x, int64_t n, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (l->res.time_to_first_audio_s <= 0) l->res.time_to_first_audio_s = dr_clock_s() - l->clock.t_request;
    l->res.samples += n;
    int stop = l->on_audio ? l->on_audio(l->user, x, (size_t)n) : 0;
    if (emit_event(l, DRAMA_EVENT_CHUNK)) stop = 1;
    if (stop) {
        request_cancel(l);
        return dr_fail(err, DRAMA_ECANCELLED, "cancelled by the audio consumer after %lld samples",
                       (long long)l->res.samples);
    }
    return DRAMA_OK;
}

static drama_status ensure_pcm(dr_lane *l, int64_t samples, drama_error *err) {
    if (samples <= l->pcm_cap) return DRAMA_OK;
    size_t bytes;
    if (!dr_mul_size((size_t)samples, sizeof(float), &bytes)) return dr_fail(err, DRAMA_ENOMEM, "audio buffer size overflow");
    float *p = realloc(l->pcm, bytes);
    if (!p) return dr_fail(err, DRAMA_ENOMEM, "out of memory for %lld samples of audio", (long long)samples);
    l->pcm = p;
    l->pcm_cap = samples;
    return DRAMA_OK;
}

/* Decodes the next chunk of the schedule when enough frames are waiting (`final`: a short last
 * one too). Stream mode delivers it; whole mode appends it to the request's audio. *did = 1
 * when a chunk was decoded. */
static drama_status decode_chunk(dr_lane *l, int final, int *did, drama_error *err) {
    *did = 0;
    int64_t pending = l->n_frames - l->frames_decoded;
    int want = dr_stream_schedule(l->chunk_index, l->req->stream_first_frames, l->req->stream_chunk_frames);
    if (pending <= 0 || (pending < want && !final)) return DRAMA_OK;
    int64_t n = pending < want ? pending : want, spf = l->res.samples_per_frame;
    int64_t at = l->req->stream ? 0 : l->pcm_len;
    drama_status st = ensure_pcm(l, at + n * spf, err);
    if (st == DRAMA_OK) st = dr_codec_stream_feed(l->stream, l->codes + l->frames_decoded * l->nc, n, l->pcm + at, err);
    if (st != DRAMA_OK) return st;
    l->frames_decoded += n;
    l->chunk_index++;
    *did = 1;
    if (!l->req->stream) {
        l->pcm_len += n * spf;
        return DRAMA_OK;
    }
    return deliver(l, l->pcm, n * spf, err);
}

static drama_status stream_flush(dr_lane *l, int final, drama_error *err) {
    for (int did = 1; did;) {
        drama_status st = decode_chunk(l, final, &did, err);
        if (st != DRAMA_OK) return st;
    }
    return DRAMA_OK;
}

static void set_reason(dr_lane *l, const char *why) {
    snprintf(l->res.finish_reason, sizeof l->res.finish_reason, "%s", why);
}

/* Frees what the request used while running; the result stays. */
static void free_work(drama_engine *e, dr_lane *l) {
    dr_decoder_free(l->dec); /* joined before anything it reads goes */
    l->dec = NULL;
    dr_pl_gen_free(l->gen);
    l->gen = NULL;
    dr_pl_refs_free(&l->refs);
    dr_pl_text_free(&l->text);
    dr_codec_stream_free(l->stream);
    l->stream = NULL;
    free(l->codes);
    l->codes = NULL;
    free(l->pcm);
    l->pcm = NULL;
    l->pcm_cap = l->pcm_len = 0;
    e->reserved -= l->reserved;
    l->reserved = 0;
}

void dr_lane_finish(drama_engine *e, dr_lane *l, drama_status st) {
    if (l->phase == DR_LANE_DONE || l->phase == DR_LANE_FREE) return;
    drama_model *m = e->m;
    drama_result *res = &l->res;
    if (st != DRAMA_OK && l->err.code == DRAMA_OK) dr_fail(&l->err, st, "request failed (%s)", drama_status_name(st));
    dr_phase_end(&l->clock, res);
    if (st == DRAMA_EFRAMELIMIT) set_reason(l, "frame_limit");
    if (st == DRAMA_EEMPTY && !res->finish_reason[0]) set_reason(l, "empty_generation");
    /* A failure after the last frame (decoding, delivery) is not a successful finish. */
    if (st != DRAMA_OK && (!strcmp(res->finish_reason, "frames") || !strcmp(res->finish_reason, "end_token")))
        set_reason(l, st == DRAMA_ECANCELLED ? "cancelled" : "error");
    if (!res->finish_reason[0]) {
        const char *why = "error";
        if (st == DRAMA_OK) why = "end_token";
        else if (st == DRAMA_ECANCELLED) why = "cancelled";
        else if (st == DRAMA_ENUMERIC) why = "numerical_error";
        set_reason(l, why);
    }
    res->wall_s = dr_clock_s() - l->clock.t_request;
    res->audio_seconds = res->sample_rate ? (double)res->samples / res->sample_rate : 0;
    if (res->audio_seconds > 0) res->real_time_factor = res->wall_s / res->audio_seconds;
    if (st == DRAMA_OK) { /* the codes are the caller's on success only */
        res->codes = l->codes;
        l->codes = NULL;
    }
    l->status = st;
    free_work(e, l);
    if (e->private_ && m->low_memory) {
        dr_pl_lm_release(m);
        dr_pl_codec_release(m);
    }
    l->phase = DR_LANE_DONE;
}

void dr_lane_drop(drama_engine *e, dr_lane *l) {
    if (l->phase == DR_LANE_FREE) return;
    free_work(e, l);
    drama_result_free(&l->res);
    dr_req_copy_free(&l->rq);
    memset(&l->res, 0, sizeof l->res);
    memset(&l->err, 0, sizeof l->err);
    l->phase = DR_LANE_FREE;
    l->ext_cancel = NULL;
    l->on_audio = NULL;
    l->on_event = NULL;
    l->user = NULL;
}

void dr_lane_begin(drama_engine *e, dr_lane *l) {
    drama_model *m = e->m;
    l->req = &l->rq.req;
    l->clock.phase = -1;
    l->clock.t_request = dr_clock_s();
    l->frames_target = l->req->frames > 0 ? l->req->frames : l->req->max_frames;
    l->res.seed = l->req->seed_set ? l->req->seed : dr_pl_random_seed();
    l->res.sample_rate = m->sample_rate;
    l->res.samples_per_frame = m->samples_per_frame;
    l->res.n_codebooks = l->nc = m->n_codebooks;
    l->res.guided = l->req->n_references > 0 && l->req->cfg_gamma > 0;
    l->status = DRAMA_OK;
    l->result_taken = 0;
    l->batch = 0;
    l->phase = DR_LANE_PREPARE;
}

/* The prompt of batch b, then the prefill phase (batch 0: the prompt cache decides how). */
static drama_status begin_batch(drama_engine *e, dr_lane *l, int b, drama_error *err) {
    const drama_request *q = l->req;
    l->batch = b;
    if (dr_lane_cancelled(l))
        return dr_fail(err, DRAMA_ECANCELLED, "cancelled before batch %d (%lld frames)", b, (long long)l->n_frames);
    int64_t prompt_rows = 0;
    l->budget = q->frames > 0 ? q->frames - l->n_frames : q->frames_per_batch; /* 0 = until the end token */
    int64_t ahead = l->budget > 0 && l->budget < q->max_frames ? l->budget : q->max_frames;
    int64_t context = q->context > 0 ? q->context : DR_DEFAULT_CONTEXT;
    drama_status st = dr_pl_gen_prompt(l->gen, e->m, &l->text, b, &l->refs, context, ahead, &prompt_rows, err);
    if (st != DRAMA_OK) return st;
    if (b == 0) l->res.prompt_tokens = prompt_rows;
    l->cache_todo = 0;
    dr_pl_gen_prefix(l->gen, &l->prefix_c, &l->prefix_u);
    int guided = dr_pl_gen_is_guided(l->gen);
    if (e->cache && l->prefix_c > 0 && (!guided || l->prefix_u > 0)) {
        int64_t n;
        const int32_t *rows = dr_pl_gen_rows(l->gen, 0, &n), *urows = dr_pl_gen_rows(l->gen, 1, &n);
        const dr_gen_session *snap = dr_pcache_get(e->cache, rows, l->prefix_c, urows, guided ? l->prefix_u : 0, 1 + l->nc);
        if (snap) {
            st = dr_pl_gen_restore(l->gen, snap, l->prefix_c, l->prefix_u, err);
            if (st != DRAMA_OK) return st;
            l->res.voice_cached = 1;
            e->st.prompt_cache_hits++;
        } else {
            l->cache_todo = 1;
            e->st.prompt_cache_misses++;
        }
    }
    l->phase = DR_LANE_PREFILL;
    return DRAMA_OK;
}

void dr_lane_prepare(drama_engine *e, dr_lane *l) {
    drama_model *m = e->m;
    const drama_request *q = l->req;
    drama_error *err = &l->err;
    /* Text first: a bad text fails before any heavy work. */
    drama_status st = dr_pl_text_prepare(m, q, &l->text, err);
    if (st == DRAMA_OK) {
        l->n_batches = l->res.n_batches = l->text.n_batches;
        /* Progress target over the whole request: the exact count, else the cap of every batch. */
        if (q->frames <= 0)
            l->frames_target = (int64_t)(q->frames_per_batch > 0 ? q->frames_per_batch : q->max_frames) * l->n_batches;
    }
    if (st == DRAMA_OK && q->n_references > 0) { /* references -> codes: errors name the reference */
        phase(l, DRAMA_PHASE_ENCODE);
        st = dr_pl_refs_encode(m, q->references, q->n_references, &l->refs, err);
        if (st == DRAMA_OK && dr_lane_cancelled(l)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled while encoding references");
    }
    if (st == DRAMA_OK) {
        phase(l, DRAMA_PHASE_LOAD);
        dr_pl_codec_preload *pre = dr_pl_codec_preload_start(m); /* 2+ threads: the codec loads alongside */
        st = dr_pl_lm_acquire(m, err);
        if (st == DRAMA_OK && dr_lane_cancelled(l)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled while loading");
        drama_status cst = dr_pl_codec_preload_finish(m, pre, st == DRAMA_OK, err);
        if (st == DRAMA_OK) st = cst;
    }
    if (st == DRAMA_OK) {
        if (!m->codec && !m->low_memory) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
        else if (!q->stream) st = dr_pl_codec_check(m, err); /* low memory: the decoder loads after generation */
    }
    if (st == DRAMA_OK) {
        phase(l, DRAMA_PHASE_GENERATE);
        if (q->stream) {
            if (!m->codec) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
            if (st == DRAMA_OK) st = dr_codec_stream_create(m->codec, &l->stream, err);
        } else if (e->private_ && m->codec && !m->low_memory && !strcmp(dr_codec_decoder_name(m->codec), "cpu") &&
                   dr_decoder_queue_frames() > 0) {
            /* whole mode, CPU decoder: decode beside generation, on a pool of the model's thread
             * count (a device decoder stays on the engine's thread: it is fast, and its device
             * context belongs to that thread) */
            st = dr_decoder_start(m->codec, m->pool, dr_decoder_queue_frames(), l->nc,
                                  l->res.samples_per_frame, &l->dec, err);
        }
    }
    if (st == DRAMA_OK) {
        dr_pl_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.temperature = q->temperature;
        gp.top_p = q->top_p;
        gp.cfg_gamma = q->n_references > 0 ? q->cfg_gamma : 0.0f; /* the model's own voice is never guided */
        gp.seed = l->res.seed;
        gp.frame_cap = q->max_frames;
        gp.has_reference = q->n_references > 0;
        st = dr_pl_gen_create(m, &gp, &l->gen, err);
    }
    if (st == DRAMA_OK) st = begin_batch(e, l, 0, err);
    if (st != DRAMA_OK) dr_lane_finish(e, l, st);
}

/* Snapshot of the state right after the voice prefix, into the cache when it fits the budget. */
static void snapshot(drama_engine *e, dr_lane *l) {
    int guided = dr_pl_gen_is_guided(l->gen);
    int64_t bytes = dr_plan_snapshot_bytes(e->m, l->prefix_c, guided ? l->prefix_u : 0);
    if (bytes > dr_pcache_max_bytes(e->cache)) return;
    /* never over the memory budget: entries give way first, then the snapshot is skipped */
    while (e->budget >= 0 && e->reserved + dr_pcache_bytes(e->cache) + bytes > e->budget &&
           dr_pcache_evict_one(e->cache))
        e->st.prompt_cache_evictions++;
    if (e->budget >= 0 && e->reserved + dr_pcache_bytes(e->cache) + bytes > e->budget) return;
    dr_gen_session *snap = NULL;
    drama_error ignored = {0};
    if (dr_gen_session_clone(dr_pl_gen_session(l->gen), &snap, &ignored) != DRAMA_OK) return; /* only a cache */
    int64_t n, before = dr_pcache_entries(e->cache);
    const int32_t *rows = dr_pl_gen_rows(l->gen, 0, &n), *urows = dr_pl_gen_rows(l->gen, 1, &n);
    int kept = dr_pcache_put(e->cache, rows, l->prefix_c, urows, guided ? l->prefix_u : 0, 1 + l->nc, snap, bytes);
    if (kept) e->st.prompt_cache_evictions += before + 1 - dr_pcache_entries(e->cache);
}

drama_status dr_lane_prefill(drama_engine *e, dr_lane *l, int64_t budget, int64_t *used) {
    *used = 0;
    drama_error *err = &l->err;
    if (dr_lane_cancelled(l)) {
        dr_fail(err, DRAMA_ECANCELLED, "cancelled while prefilling (%lld frames)", (long long)l->n_frames);
        dr_lane_finish(e, l, DRAMA_ECANCELLED);
        return DRAMA_ECANCELLED;
    }
    int64_t stop_c = l->cache_todo == 1 ? l->prefix_c : 0, stop_u = l->cache_todo == 1 ? l->prefix_u : 0;
    drama_status st = dr_pl_gen_prefill(l->gen, budget, stop_c, stop_u, used, err);
    if (st == DRAMA_OK && l->cache_todo == 1 && dr_pl_gen_fed(l->gen, 0) == l->prefix_c) {
        snapshot(e, l); /* the prefix is in, nothing after it */
        l->cache_todo = 0;
    }
    if (st == DRAMA_OK && dr_pl_gen_pending(l->gen) == 0) {
        dr_pl_gen_begin_frames(l->gen, l->budget);
        l->phase = DR_LANE_GENERATE;
    }
    if (st != DRAMA_OK) dr_lane_finish(e, l, st);
    return st;
}

/* The request's generation is over (every batch, or the exact count): flush or decode. */
static drama_status generation_done(drama_engine *e, dr_lane *l, drama_error *err) {
    drama_model *m = e->m;
    if (!l->res.finish_reason[0]) set_reason(l, "end_token");
    if (l->n_frames == 0) {
        set_reason(l, "empty_generation");
        return dr_fail(err, DRAMA_EEMPTY, "the model produced no audio (end token first)");
    }
    dr_pl_gen_free(l->gen);
    l->gen = NULL;
    if (l->req->stream) {
        drama_status st = stream_flush(l, 1, err);
        if (st == DRAMA_OK) dr_lane_finish(e, l, DRAMA_OK);
        return st;
    }
    if (e->private_ && m->low_memory) {
        /* Release the backbone and tower (unmap weights, free state) before decoding; the generate
         * phase closes first so its rss_end shows what was resident. */
        dr_phase_end(&l->clock, &l->res);
        dr_pl_lm_release(m);
    }
    phase(l, DRAMA_PHASE_DECODE);
    if (l->dec) { /* overlapped: what is left of the decode, then the audio */
        float *pcm;
        int64_t n;
        drama_status st = dr_decoder_finish(l->dec, &pcm, &n, err);
        dr_decoder_free(l->dec);
        l->dec = NULL;
        if (st != DRAMA_OK) return st;
        if (n != l->n_frames * l->res.samples_per_frame) {
            free(pcm);
            return dr_fail(err, DRAMA_EINTERNAL, "decoder: %lld samples for %lld frames", (long long)n, (long long)l->n_frames);
        }
        free(l->pcm);
        l->pcm = pcm, l->pcm_len = l->pcm_cap = n;
        l->frames_decoded = l->n_frames;
        l->phase = DR_LANE_DECODE;
        return DRAMA_OK;
    }
    drama_status st = m->codec ? DRAMA_OK : dr_pl_codec_acquire(m, DR_CODEC_LOAD_DECODER, err);
    if (st == DRAMA_OK) st = dr_codec_stream_create(m->codec, &l->stream, err);
    if (st == DRAMA_OK) st = ensure_pcm(l, l->n_frames * l->res.samples_per_frame, err); /* the whole audio, once */
    if (st == DRAMA_OK) l->phase = DR_LANE_DECODE;
    return st;
}

/* The end of batch l->batch (ended: by the end token): the next batch, or the end. */
static drama_status batch_done(drama_engine *e, dr_lane *l, int ended, drama_error *err) {
    const drama_request *q = l->req;
    if (q->frames > 0 && l->n_frames >= q->frames) {
        set_reason(l, "frames");
        return generation_done(e, l, err);
    }
    if (!ended && q->frames_per_batch > 0 && l->batch == l->n_batches - 1) set_reason(l, "frames");
    if (l->batch + 1 < l->n_batches) return begin_batch(e, l, l->batch + 1, err);
    return generation_done(e, l, err);
}

static drama_status keep_frame(dr_lane *l, const int32_t *frame, drama_error *err) {
    drama_status st = dr_pl_gen_keep(l->gen, frame, err);
    if (st != DRAMA_OK) return st;
    if (l->n_frames == l->cap_frames) {
        int64_t cap = l->cap_frames ? 2 * l->cap_frames : 256;
        int32_t *p = realloc(l->codes, (size_t)cap * (size_t)l->nc * sizeof *p);
        if (!p) return dr_fail(err, DRAMA_ENOMEM, "out of memory keeping %lld frames", (long long)cap);
        l->codes = p;
        l->cap_frames = cap;
    }
    memcpy(l->codes + l->n_frames * l->nc, frame, (size_t)l->nc * sizeof *frame);
    l->n_frames++;
    l->res.frames = l->n_frames;
    if (emit_event(l, DRAMA_EVENT_FRAMES)) request_cancel(l);
    if (l->stream) {
        st = stream_flush(l, 0, err);
        if (st != DRAMA_OK) return st;
    }
    if (l->dec && (st = dr_decoder_push(l->dec, frame, err)) != DRAMA_OK) return st;
    if (dr_lane_cancelled(l)) return dr_fail(err, DRAMA_ECANCELLED, "cancelled after %lld frames", (long long)l->n_frames);
    return DRAMA_OK;
}

void dr_lane_frame(drama_engine *e, dr_lane *l, const int32_t *frame, dr_gen_finish fin, drama_status gst,
                   const drama_error *gerr) {
    drama_error *err = &l->err;
    drama_status st = gst;
    if (st != DRAMA_OK) {
        dr_fail(err, st, "%s", gerr ? gerr->message : "generation failed");
        if (st == DRAMA_EEMPTY) set_reason(l, "empty_generation");
    } else if (fin == DR_FINISH_END_TOKEN) {
        st = batch_done(e, l, 1, err);
    } else if (fin != DR_FINISH_NONE) {
        st = batch_done(e, l, 0, err);
    } else {
        st = keep_frame(l, frame, err);
        if (st == DRAMA_OK) e->st.frames_generated++;
    }
    if (st != DRAMA_OK) dr_lane_finish(e, l, st);
}

void dr_lane_decode(drama_engine *e, dr_lane *l) {
    drama_error *err = &l->err;
    drama_status st = DRAMA_OK;
    if (dr_lane_cancelled(l)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled before delivering audio");
    int did = 0;
    if (st == DRAMA_OK) st = decode_chunk(l, 1, &did, err);
    if (st == DRAMA_OK && l->frames_decoded == l->n_frames) {
        if (dr_lane_cancelled(l)) st = dr_fail(err, DRAMA_ECANCELLED, "cancelled before delivering audio");
        if (st == DRAMA_OK) st = deliver(l, l->pcm, l->pcm_len, err);
        if (st == DRAMA_OK) {
            dr_lane_finish(e, l, DRAMA_OK);
            return;
        }
    }
    if (st != DRAMA_OK) dr_lane_finish(e, l, st);
}
