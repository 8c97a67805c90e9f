/* pipeline.c - the public synthesis API of include/drama.h: request defaults and validation,
 * phases (clocks, memory), cancellation, result bookkeeping. The model-facing work (loading,
 * prompt, frame loop, codec) is in pipeline_run.c. */
#include "gen/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/receipt.h"
#include "gen/pipeline_internal.h"

void drama_model_options_default(drama_model_options *opt) {
    memset(opt, 0, sizeof *opt);
}

void drama_request_default(drama_request *req) {
    memset(req, 0, sizeof *req);
    req->speaker = -1;
    req->temperature = 1.0f;
    req->top_p = 0.9f;
    req->cfg_gamma = 0.0f;
    req->max_frames = 750;
}

const char *drama_phase_name(int phase) {
    switch (phase) {
    case DRAMA_PHASE_LOAD: return "load";
    case DRAMA_PHASE_ENCODE: return "encode";
    case DRAMA_PHASE_GENERATE: return "generate";
    case DRAMA_PHASE_DECODE: return "decode";
    }
    return "none";
}

void drama_result_free(drama_result *res) {
    if (!res) return;
    free(res->codes);
    res->codes = NULL;
}

int dr_stream_chunk_frames(int k, int requested) { return dr_stream_schedule(k, 0, requested); }

int dr_stream_schedule(int k, int first, int next) {
    if (k == 0 && first > 0) return first;
    if (next > 0) return next;
    return k == 0 ? DR_STREAM_FIRST_CHUNK : DR_STREAM_NEXT_CHUNK;
}

drama_status dr_request_validate(const drama_request *req, drama_error *err) {
    if (!req) return dr_fail(err, DRAMA_EINVAL, "request is NULL");
    if (!req->text) return dr_fail(err, DRAMA_EINVAL, "text: missing");
    if (!isfinite(req->temperature) || req->temperature < 0 || req->temperature > 2)
        return dr_fail(err, DRAMA_EINVAL, "temperature: %g is outside 0..2", (double)req->temperature);
    if (!isfinite(req->top_p) || req->top_p <= 0 || req->top_p > 1)
        return dr_fail(err, DRAMA_EINVAL, "top_p: %g is outside (0, 1]", (double)req->top_p);
    if (!isfinite(req->cfg_gamma) || req->cfg_gamma < 0 || req->cfg_gamma > 5)
        return dr_fail(err, DRAMA_EINVAL, "cfg_gamma: %g is outside 0..5", (double)req->cfg_gamma);
    if (req->max_frames < 1) return dr_fail(err, DRAMA_EINVAL, "max_frames: %d must be at least 1", req->max_frames);
    if (req->frames < 0) return dr_fail(err, DRAMA_EINVAL, "frames: %d must not be negative", req->frames);
    if (req->frames > req->max_frames)
        return dr_fail(err, DRAMA_EINVAL, "frames: %d exceeds max_frames %d", req->frames, req->max_frames);
    if (req->frames_per_batch < 0 || req->frames_per_batch > req->max_frames)
        return dr_fail(err, DRAMA_EINVAL, "frames_per_batch: %d is outside 0..max_frames (%d)", req->frames_per_batch,
                       req->max_frames);
    if (req->frames > 0 && req->frames_per_batch > 0)
        return dr_fail(err, DRAMA_EINVAL, "frames_per_batch: cannot be combined with frames");
    if (req->speaker < -1 || req->speaker > 15)
        return dr_fail(err, DRAMA_EINVAL, "speaker: %d is outside 0..15", req->speaker);
    if (req->stream_chunk_frames < 0)
        return dr_fail(err, DRAMA_EINVAL, "stream_chunk_frames: %d must not be negative", req->stream_chunk_frames);
    if (req->stream_first_frames < 0)
        return dr_fail(err, DRAMA_EINVAL, "stream_first_frames: %d must not be negative", req->stream_first_frames);
    if (req->context < 0) return dr_fail(err, DRAMA_EINVAL, "context: %d must not be negative", req->context);
    if (req->chunk_tokens < 0) return dr_fail(err, DRAMA_EINVAL, "chunk_tokens: %d must not be negative", req->chunk_tokens);
    if (req->chunk_bytes < 0) return dr_fail(err, DRAMA_EINVAL, "chunk_bytes: %d must not be negative", req->chunk_bytes);
    if (req->n_references < 0 || req->n_references > 16)
        return dr_fail(err, DRAMA_EINVAL, "references: %d given, at most 16", req->n_references);
    if (req->n_references > 0 && !req->references) return dr_fail(err, DRAMA_EINVAL, "references: NULL array");
    for (int i = 0; i < req->n_references; i++) {
        const drama_reference *r = &req->references[i];
        int sources = (r->audio_path != NULL) + (r->codes_path != NULL) + (r->audio_data != NULL) + (r->codes != NULL);
        if (sources != 1)
            return dr_fail(err, DRAMA_EINVAL,
                           "reference %d: give exactly one of an audio file, audio bytes, a codes file and codes", i);
        if (r->audio_data && r->audio_bytes == 0)
            return dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "reference %d: audio bytes: empty", i);
        if (r->codes && r->n_code_frames <= 0)
            return dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "reference %d: codes: no frames", i);
        if (!r->transcript || !r->transcript[0])
            return dr_fail(err, DRAMA_EINVAL, "reference %d: the transcript is empty", i);
    }
    return DRAMA_OK;
}

void dr_phase_begin(dr_phase_clock *pc, drama_result *res, int phase) {
    if (pc->phase >= 0) dr_phase_end(pc, res);
    pc->phase = phase;
    pc->t_start = dr_clock_s();
    dr_mem_peak_reset();
    if (res) res->phases[phase].ran = 1;
}

void dr_phase_end(dr_phase_clock *pc, drama_result *res) {
    if (pc->phase < 0) return;
    if (res) {
        drama_phase_stats *s = &res->phases[pc->phase];
        s->wall_s += dr_clock_s() - pc->t_start;
        int64_t peak = dr_mem_peak_bytes();
        if (peak > s->peak_rss_bytes) s->peak_rss_bytes = peak;
        s->rss_end_bytes = dr_mem_rss_bytes();
        s->rss_file_end_bytes = dr_mem_rss_file_bytes();
    }
    pc->phase = -1;
}

/* ---- models and sessions ---- */

drama_status drama_model_open(drama_model **out, const char *dir, const drama_model_options *opt,
                              drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "drama_model_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return dr_fail(err, DRAMA_EINVAL, "model directory: missing");
    drama_model_options def;
    if (!opt) {
        drama_model_options_default(&def);
        opt = &def;
    }
    if (opt->threads < 0) return dr_fail(err, DRAMA_EINVAL, "threads: %d must not be negative", opt->threads);
    if (opt->backend < DRAMA_BACKEND_AUTO || opt->backend > DRAMA_BACKEND_CUDA)
        return dr_fail(err, DRAMA_EINVAL, "backend: %d is not a drama_backend value", (int)opt->backend);
    if (opt->device < 0) return dr_fail(err, DRAMA_EINVAL, "device: %d must not be negative", opt->device);
    return dr_pl_model_open(out, dir, opt, err);
}

void drama_model_close(drama_model *model) { dr_pl_model_close(model); }

int drama_model_sample_rate(const drama_model *model) { return model ? model->sample_rate : 0; }
int drama_model_samples_per_frame(const drama_model *model) { return model ? model->samples_per_frame : 0; }

drama_status drama_session_create(drama_session **out, drama_model *model, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "drama_session_create: out is NULL");
    *out = NULL;
    if (!model) return dr_fail(err, DRAMA_EINVAL, "drama_session_create: model is NULL");
    drama_session *s = calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "out of memory creating a session");
    s->model = model;
    atomic_init(&s->cancel, 0);
    *out = s;
    return DRAMA_OK;
}

void drama_session_free(drama_session *session) {
    if (!session) return;
    dr_pl_session_release(session);
    free(session);
}

void drama_session_cancel(drama_session *session) {
    if (session) atomic_store(&session->cancel, 1);
}

drama_status drama_synthesize(drama_session *session, const drama_request *req, drama_audio_fn on_audio,
                              drama_event_fn on_event, void *user, drama_result *res, drama_error *err) {
    drama_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    if (!session) return dr_fail(err, DRAMA_EINVAL, "drama_synthesize: session is NULL");
    drama_status st = dr_request_validate(req, err);
    if (st != DRAMA_OK) {
        snprintf(res->finish_reason, sizeof res->finish_reason, "error");
        return st;
    }
    atomic_store(&session->cancel, 0);
    pthread_mutex_lock(&session->model->run_lock);
    st = dr_pl_run(session, req, on_audio, on_event, user, res, err);
    pthread_mutex_unlock(&session->model->run_lock);
    if (!res->finish_reason[0]) {
        const char *why = "error";
        if (st == DRAMA_OK) why = "end_token";
        else if (st == DRAMA_ECANCELLED) why = "cancelled";
        else if (st == DRAMA_EFRAMELIMIT) why = "frame_limit";
        else if (st == DRAMA_ENUMERIC) why = "numerical_error";
        snprintf(res->finish_reason, sizeof res->finish_reason, "%s", why);
    }
    if (res->audio_seconds > 0) res->real_time_factor = res->wall_s / res->audio_seconds;
    if (res == &local) drama_result_free(&local);
    return st;
}
