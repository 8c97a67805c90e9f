/* pipeline_run.c - drama_synthesize's request: a one-lane engine (engine.c) stepped until the
 * request is done, so the CLI, library users and the server run requests the same way. The
 * private engine keeps what only a lone request can do: the low-memory phases (weights unmapped
 * before decoding) and the session's cancel flag.
 *
 * Failure rule: any failure, the frame cap or a cancellation returns an error; the caller (the
 * CLI, the server) then publishes nothing. Audio handed to on_audio before a failure (stream
 * mode) must be discarded by the caller. */
#include <string.h>

#include "gen/engine_internal.h"

drama_status dr_pl_run(drama_session *s, const drama_request *req, drama_audio_fn on_audio, drama_event_fn on_event,
                       void *user, drama_result *res, drama_error *err) {
    drama_engine *e = NULL;
    drama_lane lane = 0;
    drama_status st = dr_engine_create_private(s->model, &e, err);
    if (st == DRAMA_OK) st = dr_engine_start_ext(e, req, on_audio, on_event, user, &s->cancel, &lane, err);
    while (st == DRAMA_OK && !drama_lane_done(e, lane)) st = dr_engine_tick(e, err);
    if (st == DRAMA_OK) st = drama_lane_result(e, lane, res, err);
    drama_engine_free(e);
    return st;
}
