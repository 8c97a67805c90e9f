/* handlers.c - health, models, metrics and the voice catalog endpoints (API.md 2, 5, 6, 8),
 * plus the checks shared with synthesis: availability, text rules, reference encoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "serve/server_internal.h"

int dr_server_unavailable(dr_server *s, dr_api_error *e) {
    int h = atomic_load(&s->health);
    if (h == DR_HEALTH_OK) return 0;
    e->retry_after_s = h == DR_HEALTH_LOADING ? 5 : 30;
    if (h == DR_HEALTH_LOADING) return dr_api_fail(e, 503, "loading", NULL, "the model is still loading");
    if (h == DR_HEALTH_DRAINING) return dr_api_fail(e, 503, "draining", NULL, "the server is shutting down");
    return dr_api_fail(e, 503, "loading", NULL, "the model failed to load (see the server log)");
}

int dr_check_text(dr_server *s, const char *text, size_t len, const char *param, int64_t max_code_points,
                  dr_api_error *e) {
    size_t nul = strlen(text);
    if (nul != len)
        return dr_api_fail(e, 400, "invalid_utf8", param, "%s contains a NUL byte at byte %zu", param, nul);
    drama_error err = {0};
    if (drama_validate_text(s->model, text, max_code_points, &err) == DRAMA_OK) return 0;
    const char *code = err.reason[0] ? err.reason : "invalid_utf8";
    return dr_api_fail(e, 400, code, param, "%s: %s", param, err.message);
}

int dr_encode_reference(void *server, const uint8_t *audio, size_t n, const char *param, int32_t **codes,
                        int64_t *n_frames, double *duration_s, dr_api_error *e) {
    dr_server *s = server;
    char key[65];
    dr_refcache_key(audio, n, s->fingerprint, key);
    if (dr_refcache_get(s->refcache, key, codes, n_frames, duration_s)) {
        dr_metrics_reference_cache(s->metrics, 1);
        return 0;
    }
    dr_metrics_reference_cache(s->metrics, 0);
    drama_error err = {0};
    int32_t *enc = NULL;
    if (drama_encode_audio(s->model, audio, n, s->opt.max_reference_seconds, &enc, n_frames, duration_s, &err) !=
        DRAMA_OK) {
        if (!strcmp(err.reason, "bad_audio") || err.code == DRAMA_EFORMAT || err.code == DRAMA_EEMPTY ||
            err.code == DRAMA_ENUMERIC)
            return dr_api_fail(e, 400, "bad_audio", param, "%s: %s", param, err.message);
        DR_WARN("serve: encoding %s failed: %s", param, err.message);
        return dr_api_fail(e, 500, "internal", param, "%s could not be encoded: %s", param, err.message);
    }
    size_t count = (size_t)*n_frames * (size_t)s->n_codebooks;
    *codes = malloc((count ? count : 1) * sizeof **codes);
    if (!*codes) {
        drama_codes_free(enc);
        return dr_api_fail(e, 500, "internal", NULL, "out of memory");
    }
    memcpy(*codes, enc, count * sizeof **codes);
    drama_codes_free(enc);
    dr_refcache_put(s->refcache, key, *codes, *n_frames, s->n_codebooks, *duration_s);
    return 0;
}

enum MHD_Result dr_handle_health(dr_server *s, dr_conn *c) {
    int h = atomic_load(&s->health);
    const char *status = h == DR_HEALTH_OK ? "ok" : h == DR_HEALTH_DRAINING ? "draining" : "loading";
    return dr_respond_json(c, h == DR_HEALTH_OK ? 200 : 503, json_pack("{s:s}", "status", status));
}

enum MHD_Result dr_handle_live(dr_server *s, dr_conn *c) {
    (void)s;
    return dr_respond_json(c, 200, json_pack("{s:s}", "status", "alive"));
}

enum MHD_Result dr_handle_models(dr_server *s, dr_conn *c) {
    json_t *data = json_array();
    /* "drama": server limits a client (the playground) adapts to (docs/serve.md, Decisions) */
    json_t *ext = json_pack("{s:b, s:f, s:f, s:i, s:i, s:i, s:i}", "cfg_allow_request_gamma",
                            s->opt.cfg_allow_request_gamma, "cfg_max_gamma", s->opt.cfg_max_gamma, "cfg_gamma",
                            s->opt.cfg_gamma, "max_frames", s->opt.max_frames, "max_text_length",
                            s->opt.max_text_length, "sample_rate", s->sample_rate, "samples_per_frame",
                            s->samples_per_frame);
    json_array_append_new(data, json_pack("{s:s, s:s, s:s, s:o}", "id", "drama-3", "object", "model", "owned_by",
                                          "drama.c", "drama", ext));
    return dr_respond_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

enum MHD_Result dr_handle_metrics(dr_server *s, dr_conn *c) {
    dr_metrics_engine m = {0};
    static const char *const backends[] = {"auto", "cpu", "cuda"};
    m.replica_id = s->replica_id;
    m.backend = (unsigned)s->opt.backend < 3 ? backends[s->opt.backend] : "auto";
    m.device = s->opt.device;
    if (s->sched) {
        dr_sched_stats st;
        dr_sched_stats_get(s->sched, &st);
        m.frames_generated = st.frames_generated;
        m.audio_seconds = st.audio_seconds;
        m.frames_per_second = st.frames_per_second;
        m.queue_depth = st.queue_depth;
        m.lanes_active = st.lanes_active;
        m.lanes_total = st.lanes_total;
        m.rejected_queue_full = st.rejected[DR_REJECT_QUEUE_FULL];
        m.rejected_loading = st.rejected[DR_REJECT_LOADING];
        m.rejected_draining = st.rejected[DR_REJECT_DRAINING];
        m.rejected_queue_timeout = st.rejected[DR_REJECT_QUEUE_TIMEOUT];
        m.rejected_insufficient_memory = st.rejected[DR_REJECT_INSUFFICIENT_MEMORY];
        m.cancelled_client_gone = st.cancelled[DR_CANCEL_CLIENT_GONE];
        m.cancelled_server = st.cancelled[DR_CANCEL_REQUESTED];
        m.cancelled_drain = st.cancelled[DR_CANCEL_DRAIN];
        m.finish_end_token = st.finished[DR_SCHED_FIN_END_TOKEN];
        m.finish_frames = st.finished[DR_SCHED_FIN_FRAMES];
        m.finish_frame_limit = st.finished[DR_SCHED_FIN_FRAME_LIMIT];
        m.finish_empty_generation = st.finished[DR_SCHED_FIN_EMPTY_GENERATION];
        m.finish_cancelled = st.finished[DR_SCHED_FIN_CANCELLED];
        m.finish_numerical_error = st.finished[DR_SCHED_FIN_NUMERICAL_ERROR];
        m.finish_error = st.finished[DR_SCHED_FIN_ERROR];
        m.voice_cache_hits = st.voice_cache_hits;
        m.voice_cache_misses = st.voice_cache_misses;
        m.prompt_cache_bytes = st.prompt_cache_bytes;
        m.memory_host_bytes = st.memory_reserved_bytes;
    } else {
        m.lanes_total = s->opt.parallel;
    }
    dr_bytes out = {0};
    enum MHD_Result rc;
    if (dr_metrics_render(s->metrics, &m, &out)) {
        dr_api_error e = {0};
        dr_api_fail(&e, 500, "internal", NULL, "out of memory");
        rc = dr_respond_error(c, &e);
    } else {
        rc = dr_respond_bytes(c, 200, "text/plain; version=0.0.4; charset=utf-8", out.data, out.len);
    }
    dr_bytes_free(&out);
    return rc;
}

enum MHD_Result dr_handle_voices_list(dr_server *s, dr_conn *c) {
    dr_api_error e = {0};
    if (dr_server_unavailable(s, &e)) return dr_respond_error(c, &e);
    return dr_respond_json(c, 200, dr_voices_list_json(s->voices));
}

enum MHD_Result dr_handle_voice_create(dr_server *s, dr_conn *c) {
    dr_api_error e = {0};
    dr_voice_upload up = {0};
    dr_val *body = NULL;
    dr_voice *voice = NULL;
    enum MHD_Result rc;
    if (dr_server_unavailable(s, &e) || !(body = dr_conn_body(c, &e)) || dr_parse_voice_upload(body, &up, &e) ||
        dr_check_text(s, up.text, strlen(up.text), "text", s->opt.max_text_length, &e) ||
        dr_voices_add(s->voices, up.id, up.text, up.audio, up.audio_len, &voice, &e)) {
        rc = dr_respond_error(c, &e);
    } else {
        rc = dr_respond_json(c, 201, json_pack("{s:s, s:s, s:I, s:f, s:s}", "id", voice->id, "text", voice->text, "frames",
                                               (json_int_t)voice->n_frames, "duration_s", voice->duration_s, "sha256",
                                               voice->sha256));
    }
    dr_voice_release(voice);
    free(up.audio);
    dr_val_free(body);
    return rc;
}

static int url_voice_id(dr_conn *c, dr_api_error *e) {
    if (!dr_voice_id_valid(c->id, strlen(c->id)))
        return dr_api_fail(e, 400, "invalid_voice_id", "id",
                           "the voice id in the path must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ and not be 'default'");
    return 0;
}

enum MHD_Result dr_handle_voice_get(dr_server *s, dr_conn *c) {
    dr_api_error e = {0};
    if (dr_server_unavailable(s, &e) || url_voice_id(c, &e)) return dr_respond_error(c, &e);
    dr_voice *voice = dr_voices_get(s->voices, c->id);
    if (!voice) {
        dr_api_fail(&e, 404, "not_found", "id", "no voice '%s'", c->id);
        return dr_respond_error(c, &e);
    }
    enum MHD_Result rc = dr_respond_json(c, 200, dr_voice_json(voice));
    dr_voice_release(voice);
    return rc;
}

enum MHD_Result dr_handle_voice_delete(dr_server *s, dr_conn *c) {
    dr_api_error e = {0};
    if (dr_server_unavailable(s, &e) || url_voice_id(c, &e)) return dr_respond_error(c, &e);
    if (dr_voices_delete(s->voices, c->id)) {
        dr_api_fail(&e, 404, "not_found", "id", "no voice '%s'", c->id);
        return dr_respond_error(c, &e);
    }
    return dr_respond_bytes(c, 204, NULL, "", 0);
}
