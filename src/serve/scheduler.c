/* scheduler.c - not implemented yet: every entry point refuses with DRAMA_EUNSUPPORTED until the
 * scheduler lands (scheduler.h is the interface the HTTP layer codes against). */
#include "serve/scheduler.h"

#include <string.h>

#include "base/error.h"

void dr_sched_options_default(dr_sched_options *o) {
    memset(o, 0, sizeof *o);
    o->lanes = 1;
    o->queue_size = 16;
    o->queue_timeout_s = 30;
    o->drain_timeout_s = 30;
}

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

drama_status dr_sched_create(drama_model *model, const dr_sched_options *opt, dr_sched **out, drama_error *err) {
    (void)model;
    (void)opt;
    *out = NULL;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "scheduler: not implemented yet");
}
void dr_sched_free(dr_sched *s) { (void)s; }
dr_sched_state dr_sched_get_state(const dr_sched *s) { (void)s; return DR_SCHED_FAILED; }
void dr_sched_load_error(const dr_sched *s, drama_error *err) {
    (void)s;
    dr_fail(err, DRAMA_EUNSUPPORTED, "scheduler: not implemented yet");
}
drama_status dr_sched_submit(dr_sched *s, const drama_request *req, const dr_sched_sink *sink, dr_sched_job **job,
                             dr_sched_reject *rej) {
    (void)s;
    (void)req;
    (void)sink;
    *job = NULL;
    memset(rej, 0, sizeof *rej);
    rej->reason = DR_REJECT_LOADING;
    rej->http_status = 503;
    rej->retry_after_s = 1;
    return dr_fail(&rej->error, DRAMA_EUNSUPPORTED, "scheduler: not implemented yet");
}
void dr_sched_cancel(dr_sched_job *job) { (void)job; }
void dr_sched_job_release(dr_sched_job *job) { (void)job; }
int dr_sched_drain(dr_sched *s, double timeout_s) {
    (void)s;
    (void)timeout_s;
    return 0;
}
void dr_sched_stats_get(dr_sched *s, dr_sched_stats *out) {
    (void)s;
    memset(out, 0, sizeof *out);
    out->state = DR_SCHED_FAILED;
}
