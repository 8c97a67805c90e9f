/* server_internal.h - the server's shared structs, private to src/serve (http.c: daemon, routes,
 * bodies, auth, responses; handlers.c: health, models, metrics, voices; synth.c: synthesis).
 *
 * Request path, in one pass on the connection's own thread (MHD thread per connection):
 *   route (static table) -> auth -> Content-Length / Content-Type -> body (bounded) -> parse
 *   (dr_val) -> validate (request.h, then text and voices against the model) -> admit
 *   (dr_sched_submit) -> stream (content reader fed by the scheduler's sink) -> account
 *   (metrics at request completion). */
#ifndef DRAMA_SERVE_SERVER_INTERNAL_H
#define DRAMA_SERVE_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "drama.h"
#include "serve/api_error.h"
#include "serve/bytes.h"
#include "serve/metrics.h"
#include "serve/refcache.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "serve/value.h"
#include "serve/voices.h"

enum { DR_HEALTH_LOADING = 0, DR_HEALTH_OK = 1, DR_HEALTH_DRAINING = 2, DR_HEALTH_FAILED = 3 };

struct dr_server {
    dr_serve_options opt;
    struct MHD_Daemon *daemon;
    int port;
    int loopback;
    char replica_id[80];         /* X-Served-By and drama_replica_info{replica_id} */
    atomic_int health;
    drama_model *model;
    dr_sched *sched;
    dr_voices *voices;
    dr_refcache *refcache;
    dr_metrics *metrics;
    unsigned char key_digests[DR_SERVE_MAX_KEYS][32]; /* SHA-256 of each API key */
    int n_keys;
    dr_parse_limits limits;
    const char *model_ids[DR_SERVE_MAX_ALIASES + 8]; /* built-in ids + --model-alias */
    int sample_rate, samples_per_frame, n_codebooks;
    const char *fingerprint;
    atomic_uint_fast64_t request_counter;
    atomic_int active_requests;  /* between MHD's first call and its completion callback */
};

enum { DR_M_GET = 1, DR_M_POST = 2, DR_M_DELETE = 4, DR_M_OPTIONS = 8 };
enum { DR_BODY_JSON = 1, DR_BODY_MSGPACK = 2, DR_BODY_MULTIPART = 4 };
enum { DR_AUTH_NONE = 0, DR_AUTH_KEY = 1, DR_AUTH_METRICS = 2 };

typedef struct dr_conn dr_conn;
typedef enum MHD_Result (*dr_handler_fn)(dr_server *s, dr_conn *c);

/* One row of the static routes table (http.c): later endpoints (a playground at GET /, issue
 * 15) are one more row. */
typedef struct dr_route {
    const char *path;            /* exact path, or a prefix when `prefix` */
    int prefix;                  /* the rest of the path is the resource id (voices) */
    const char *label;           /* endpoint label in metrics */
    int auth;
    dr_handler_fn get, post, del;
    unsigned bodies;             /* body types POST accepts (0: none read) */
} dr_route;

struct dr_job;

/* One HTTP request (MHD's per-request context). */
struct dr_conn {
    dr_server *srv;
    struct MHD_Connection *mc;
    const dr_route *route;
    int method;
    char request_id[80];
    double t_start;
    int status;                  /* status of the response queued */
    dr_bytes body;
    unsigned body_kind;          /* one DR_BODY_* */
    int body_too_large;
    size_t received;             /* body bytes so far */
    size_t discarded;            /* bytes of an over-limit body read and dropped */
    struct MHD_PostProcessor *pp;
    dr_val *form;                /* multipart fields */
    dr_bytes form_audio, form_id, form_text;
    unsigned form_seen;          /* fields present: 1 id, 2 text, 4 audio */
    int form_audio_is_file, form_bad;
    char id[80];                 /* resource id from the URL (percent-decoded by MHD) */
    struct dr_job *job;          /* synthesis in flight */
    int counted;                 /* metrics recorded */
};

/* ---- http.c ---- */
/* Starts libmicrohttpd on addr (thread per connection; see docs/serve.md). */
struct MHD_Daemon *dr_http_start(dr_server *s, const struct sockaddr *addr, int ipv6, drama_error *err);
double dr_now_s(void);
/* Responses with X-Request-Id (and CORS) set; they record c->status. */
enum MHD_Result dr_respond_bytes(dr_conn *c, int status, const char *content_type, const void *data, size_t n);
enum MHD_Result dr_respond_json(dr_conn *c, int status, json_t *body); /* steals body */
enum MHD_Result dr_respond_error(dr_conn *c, const dr_api_error *e);
/* Queues r (common headers added, c->status set) and releases it. */
enum MHD_Result dr_respond(dr_conn *c, int status, struct MHD_Response *r);
/* Adds the headers every response carries (X-Request-Id, X-Served-By, CORS). */
void dr_response_common_headers(dr_conn *c, struct MHD_Response *r);
/* The parsed body of a POST (JSON, msgpack, multipart), or NULL with e set. */
dr_val *dr_conn_body(dr_conn *c, dr_api_error *e);

/* ---- handlers.c ---- */
enum MHD_Result dr_handle_health(dr_server *s, dr_conn *c);
/* Liveness (GET /health/live): 200 whenever the process answers HTTP; never asks the engine. */
enum MHD_Result dr_handle_live(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_models(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_metrics(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_voices_list(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_voice_create(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_voice_get(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_voice_delete(dr_server *s, dr_conn *c);
/* 503 loading / draining when the server cannot take model work now; 0 when it can. */
int dr_server_unavailable(dr_server *s, dr_api_error *e);
/* Text rules (TEXT.md 2.3) through drama_validate_text, mapped to API.md 7 codes. */
int dr_check_text(dr_server *s, const char *text, size_t len, const char *param, int64_t max_code_points,
                  dr_api_error *e);
/* Reference audio bytes -> codes through the content-hash cache (dr_voice_encode_fn). */
int dr_encode_reference(void *server, const uint8_t *audio, size_t n, const char *param, int32_t **codes,
                        int64_t *n_frames, double *duration_s, dr_api_error *e);

/* ---- ui.c ---- */
/* GET / and GET /ui/<file>: the embedded playground (serve/ui.h). */
enum MHD_Result dr_handle_ui(dr_server *s, dr_conn *c);

/* ---- synth.c ---- */
enum MHD_Result dr_handle_tts(dr_server *s, dr_conn *c);
enum MHD_Result dr_handle_speech(dr_server *s, dr_conn *c);
/* Called when MHD finishes a request: a job still running is cancelled and released. */
void dr_synth_conn_closed(dr_conn *c);

#endif
