/* serve_request_check.h - what the request-body fuzzers (fuzz_serve_json.c, fuzz_serve_msgpack.c)
 * assert on every parsed tree: a failure carries a status, a code and a message; a success obeys
 * the ranges of API.md 3.1, 4 and 5. */
#ifndef DRAMA_FUZZ_SERVE_REQUEST_CHECK_H
#define DRAMA_FUZZ_SERVE_REQUEST_CHECK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/request.h"
#include "serve/value.h"

static void check_failure(const dr_api_error *e) {
    if (e->status < 400 || !e->code[0] || !e->message[0]) abort();
}

static void check_synth(const dr_synth_req *r, int openai) {
    if (!r->text || r->temperature < 0 || r->temperature > 2 || !(r->top_p > 0) || r->top_p > 1) abort();
    if (r->chunk_length < 100 || r->chunk_length > 1000 || r->max_frames < 1 || r->max_frames > 750) abort();
    if (r->frames < 0 || r->frames > 750 || r->n_refs > DR_MAX_REFERENCES || r->n_voice_ids > DR_MAX_REFERENCES) abort();
    if (r->n_refs && r->n_voice_ids) abort();
    for (int k = 0; k < r->n_refs; k++)
        if (!r->refs[k].audio || !r->refs[k].audio_len || !r->refs[k].text) abort();
    for (int k = 0; k < r->n_voice_ids; k++)
        if (!dr_voice_id_valid(r->voice_ids[k], strlen(r->voice_ids[k]))) abort();
    if (openai && !r->streaming) abort();
}

static void check_request(const dr_val *v) {
    static const char *const names[] = {"alloy", NULL}, *const ids[] = {"v1", NULL};
    const dr_parse_limits lim = {750, 0, 1, 5, dr_default_model_ids, names, ids};
    for (int openai = 0; openai < 2; openai++) {
        dr_api_error e = {0};
        dr_synth_req r;
        int rc = openai ? dr_parse_speech(v, &lim, &r, &e) : dr_parse_tts(v, &lim, &r, &e);
        if (rc) check_failure(&e);
        else check_synth(&r, openai);
        dr_synth_req_free(&r);
    }
    dr_api_error e = {0};
    dr_voice_upload up;
    if (dr_parse_voice_upload(v, &up, &e)) check_failure(&e);
    else if (!dr_voice_id_valid(up.id, strlen(up.id)) || !up.text || !up.audio_len) abort();
    free(up.audio);
}

/* One fuzz input through a body reader, then the checks above. */
static int check_body(dr_val *(*reader)(const void *, size_t, dr_api_error *), const uint8_t *data, size_t size) {
    dr_api_error e = {0};
    dr_val *v = reader(data, size, &e);
    if (!v) {
        check_failure(&e);
        return 0;
    }
    check_request(v);
    dr_val_free(v);
    return 0;
}

#endif
