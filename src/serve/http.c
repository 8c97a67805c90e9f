/* http.c - the libmicrohttpd side: routes table, per-request context, body reading (bounded,
 * typed), auth, responses with the common headers. See server_internal.h for the request path. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "base/log.h"
#include "serve/server_internal.h"

/* The routes (API.md 2). Order does not matter: paths are distinct. */
/* Bytes of an over-limit chunked body read (and dropped) to answer 413 at its end. */
#define DISCARD_MAX ((size_t)16 << 20)

static const dr_route k_routes[] = {
    {"/v1/tts", 0, "/v1/tts", DR_AUTH_KEY, NULL, dr_handle_tts, NULL, DR_BODY_JSON | DR_BODY_MSGPACK},
    {"/v1/audio/speech", 0, "/v1/audio/speech", DR_AUTH_KEY, NULL, dr_handle_speech, NULL, DR_BODY_JSON},
    {"/v1/voices", 0, "/v1/voices", DR_AUTH_KEY, dr_handle_voices_list, dr_handle_voice_create, NULL,
     DR_BODY_JSON | DR_BODY_MSGPACK | DR_BODY_MULTIPART},
    {"/v1/voices/", 1, "/v1/voices/{id}", DR_AUTH_KEY, dr_handle_voice_get, NULL, dr_handle_voice_delete, 0},
    {"/v1/models", 0, "/v1/models", DR_AUTH_KEY, dr_handle_models, NULL, NULL, 0},
    {"/health", 0, "/health", DR_AUTH_NONE, dr_handle_health, NULL, NULL, 0},
    {"/health/live", 0, "/health/live", DR_AUTH_NONE, dr_handle_live, NULL, NULL, 0},
    {"/v1/health", 0, "/v1/health", DR_AUTH_NONE, dr_handle_health, dr_handle_health, NULL, 0},
    {"/metrics", 0, "/metrics", DR_AUTH_METRICS, dr_handle_metrics, NULL, NULL, 0},
    {"/", 0, "/", DR_AUTH_NONE, dr_handle_ui, NULL, NULL, 0},            /* the playground (ui.c) */
    {"/ui/", 1, "/ui/{file}", DR_AUTH_NONE, dr_handle_ui, NULL, NULL, 0},
};

double dr_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const dr_route *find_route(const char *url) {
    for (size_t k = 0; k < sizeof k_routes / sizeof k_routes[0]; k++) {
        const dr_route *r = &k_routes[k];
        if (r->prefix ? !strncmp(url, r->path, strlen(r->path)) : !strcmp(url, r->path)) return r;
    }
    return NULL;
}

static unsigned route_methods(const dr_route *r) {
    return (r->get ? DR_M_GET : 0) | (r->post ? DR_M_POST : 0) | (r->del ? DR_M_DELETE : 0);
}

void dr_response_common_headers(dr_conn *c, struct MHD_Response *r) {
    MHD_add_response_header(r, "X-Request-Id", c->request_id);
    MHD_add_response_header(r, "X-Served-By", c->srv->replica_id);
    if (c->srv->opt.cors_origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", c->srv->opt.cors_origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Request-Id, X-Served-By, X-Seed, X-Audio-Frames");
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

static enum MHD_Result queue(dr_conn *c, int status, struct MHD_Response *r) {
    dr_response_common_headers(c, r);
    if ((status == 429 || status == 503) && !MHD_get_response_header(r, "Retry-After")) {
        /* every 429/503 tells balancers and clients when to come back (health included) */
        dr_api_error e = {0};
        char ra[24];
        snprintf(ra, sizeof ra, "%d", dr_server_unavailable(c->srv, &e) && e.retry_after_s > 0 ? e.retry_after_s : 1);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    c->status = status;
    enum MHD_Result rc = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result dr_respond(dr_conn *c, int status, struct MHD_Response *r) { return queue(c, status, r); }

enum MHD_Result dr_respond_bytes(dr_conn *c, int status, const char *content_type, const void *data, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (content_type) MHD_add_response_header(r, "Content-Type", content_type);
    return queue(c, status, r);
}

enum MHD_Result dr_respond_json(dr_conn *c, int status, json_t *body) {
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) {
        dr_api_error e = {0};
        dr_api_fail(&e, 500, "internal", NULL, "response could not be built");
        return dr_respond_error(c, &e);
    }
    enum MHD_Result rc = dr_respond_bytes(c, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

/* Errors whose request body was not read end the connection (the unread bytes would be taken
 * for the next request). */
static enum MHD_Result respond_error_ex(dr_conn *c, const dr_api_error *e, const char *allow, int close) {
    char *s = dr_api_error_json(e);
    const char *body = s ? s : "{\"error\":{\"type\":\"server_error\",\"code\":\"internal\",\"param\":null,\"message\":\"out of memory\"}}";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(s);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e->retry_after_s > 0) {
        char ra[24];
        snprintf(ra, sizeof ra, "%d", e->retry_after_s);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (close) MHD_add_response_header(r, "Connection", "close");
    return queue(c, e->status, r);
}

enum MHD_Result dr_respond_error(dr_conn *c, const dr_api_error *e) { return respond_error_ex(c, e, NULL, 0); }

/* ---- request ids, auth ---- */

static void make_request_id(dr_conn *c) {
    const char *given = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "X-Request-Id");
    if (given) {
        size_t n = strlen(given), ok = n >= 1 && n <= 64;
        for (size_t k = 0; k < n && ok; k++)
            ok = dr_replica_id_char(given[k]);
        if (ok) {
            snprintf(c->request_id, sizeof c->request_id, "%s", given);
            return;
        }
    }
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, 0, sizeof rnd);
    uint64_t n = atomic_fetch_add(&c->srv->request_counter, 1);
    snprintf(c->request_id, sizeof c->request_id, "req_%02x%02x%02x%02x%02x%02x%02x%02x%06llx", rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], (unsigned long long)(n & 0xffffff));
}

/* Constant time over every configured key: the presented key's SHA-256 against each digest. */
static int authorized(dr_server *s, dr_conn *c) {
    if (s->n_keys == 0) return 1;
    const char *key = NULL;
    const char *auth = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) key = auth + 7;
    if (!key) key = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "X-Api-Key");
    if (!key) return 0;
    unsigned char d[32];
    SHA256((const unsigned char *)key, strlen(key), d);
    int ok = 0;
    for (int k = 0; k < s->n_keys; k++) ok |= CRYPTO_memcmp(d, s->key_digests[k], 32) == 0;
    return ok;
}

/* ---- bodies ---- */

static unsigned media_type(const char *ct) {
    if (!ct) return 0;
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    if (n == 16 && !strncasecmp(ct, "application/json", n)) return DR_BODY_JSON;
    if ((n == 19 && !strncasecmp(ct, "application/msgpack", n)) || (n == 21 && !strncasecmp(ct, "application/x-msgpack", n)))
        return DR_BODY_MSGPACK;
    if (n == 19 && !strncasecmp(ct, "multipart/form-data", n)) return DR_BODY_MULTIPART;
    return 0;
}

/* The buffer of a known form field and its bit in c->form_seen. */
static dr_bytes *form_slot(dr_conn *c, const char *key, unsigned *bit) {
    if (!strcmp(key, "id")) return *bit = 1, &c->form_id;
    if (!strcmp(key, "text")) return *bit = 2, &c->form_text;
    if (!strcmp(key, "audio")) return *bit = 4, &c->form_audio;
    return NULL;
}

static enum MHD_Result form_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                  const char *content_type, const char *transfer_encoding, const char *data,
                                  uint64_t off, size_t size) {
    dr_conn *c = cls;
    unsigned bit = 0;
    dr_bytes *slot = key ? form_slot(c, key, &bit) : NULL;
    if (!slot) return MHD_YES; /* unknown fields are ignored (API.md 1) */
    if (off == 0) {
        if (c->form_seen & bit) c->form_bad = 1; /* the same field twice */
        c->form_seen |= bit;
    }
    if (slot == &c->form_audio && filename) c->form_audio_is_file = 1;
    if (size && dr_bytes_append(slot, data, size)) c->form_bad = 1;
    return MHD_YES;
}

static dr_val *form_value(dr_conn *c, dr_api_error *e) {
    if (c->form_bad) {
        dr_api_fail(e, 400, "invalid_multipart", NULL, "the form is malformed or names a field twice");
        return NULL;
    }
    dr_val *map = dr_val_new_map();
    struct {
        const char *key;
        unsigned bit;
        dr_bytes *b;
        dr_val_type type;
    } fields[] = {{"id", 1, &c->form_id, DR_VAL_STR},
                  {"text", 2, &c->form_text, DR_VAL_STR},
                  {"audio", 4, &c->form_audio, c->form_audio_is_file ? DR_VAL_BIN : DR_VAL_STR}};
    for (int k = 0; map && k < 3; k++) {
        if (!(c->form_seen & fields[k].bit)) continue;
        if (!fields[k].b->data && dr_bytes_append(fields[k].b, "", 1) == 0) fields[k].b->len = 0; /* an empty field */
        if (!fields[k].b->data ||
            dr_val_map_add_bytes(map, fields[k].key, fields[k].type, (char *)fields[k].b->data, fields[k].b->len)) {
            dr_val_free(map);
            map = NULL;
            break;
        }
        memset(fields[k].b, 0, sizeof *fields[k].b); /* owned by the map now */
    }
    if (!map) dr_api_fail(e, 500, "internal", NULL, "out of memory");
    return map;
}

dr_val *dr_conn_body(dr_conn *c, dr_api_error *e) {
    switch (c->body_kind) {
    case DR_BODY_JSON: return dr_val_parse_json(c->body.data ? (const char *)c->body.data : "", c->body.len, e);
    case DR_BODY_MSGPACK: return dr_val_parse_msgpack(c->body.data, c->body.len, e);
    case DR_BODY_MULTIPART: return form_value(c, e);
    default: dr_api_fail(e, 415, "unsupported_media_type", NULL, "no body type"); return NULL;
    }
}

/* ---- the access handler ---- */

static int method_bit(const char *m) {
    if (!strcmp(m, "GET") || !strcmp(m, "HEAD")) return DR_M_GET;
    if (!strcmp(m, "POST")) return DR_M_POST;
    if (!strcmp(m, "DELETE")) return DR_M_DELETE;
    if (!strcmp(m, "OPTIONS")) return DR_M_OPTIONS;
    return 0;
}

static void allow_list(unsigned methods, int cors, char *out, size_t n) {
    out[0] = 0;
    static const struct { unsigned bit; const char *name; } names[] = {
        {DR_M_GET, "GET, HEAD"}, {DR_M_POST, "POST"}, {DR_M_DELETE, "DELETE"}, {DR_M_OPTIONS, "OPTIONS"}};
    for (int k = 0; k < 4; k++)
        if ((methods | (cors ? DR_M_OPTIONS : 0)) & names[k].bit)
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? ", " : "", names[k].name);
}

/* First call for a request: everything that can be decided from the headers. */
static enum MHD_Result begin(dr_server *s, dr_conn *c, const char *url, const char *method) {
    dr_api_error e = {0};
    char allow[64];
    c->route = find_route(url);
    c->method = method_bit(method);
    if (c->route && c->route->get == dr_handle_ui && s->opt.no_ui) c->route = NULL; /* --no-ui */
    if (!c->route) {
        dr_api_fail(&e, 404, "not_found", NULL, "no endpoint at %.200s", url);
        return respond_error_ex(c, &e, NULL, 1);
    }
    unsigned methods = route_methods(c->route);
    allow_list(methods, s->opt.cors_origin != NULL, allow, sizeof allow);
    if (c->method == DR_M_OPTIONS && s->opt.cors_origin) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, X-Api-Key, Content-Type, X-Request-Id");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        MHD_add_response_header(r, "Allow", allow);
        return queue(c, 204, r);
    }
    if (!(c->method & methods)) {
        dr_api_fail(&e, 405, "method_not_allowed", NULL, "%.16s is not allowed on %s (allowed: %s)", method,
                    c->route->path, allow);
        return respond_error_ex(c, &e, allow, 1);
    }
    if (c->route->prefix) snprintf(c->id, sizeof c->id, "%s", url + strlen(c->route->path));
    int needs_key = c->route->auth == DR_AUTH_KEY || (c->route->auth == DR_AUTH_METRICS && !s->opt.metrics_public);
    if (needs_key && !authorized(s, c)) {
        dr_api_fail(&e, 401, "unauthorized", NULL,
                    "a valid API key is required (Authorization: Bearer KEY or X-Api-Key: KEY)");
        return respond_error_ex(c, &e, NULL, 1);
    }
    const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end = NULL;
        unsigned long long n = strtoull(cl, &end, 10);
        if (end && *end == 0 && n > s->opt.max_body_bytes) {
            dr_api_fail(&e, 413, "body_too_large", NULL, "the body has %llu bytes, the limit is %zu (--max-body-bytes)", n,
                        s->opt.max_body_bytes);
            return respond_error_ex(c, &e, NULL, 1);
        }
    }
    if (c->method == DR_M_POST && c->route->bodies) {
        const char *ct = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Type");
        c->body_kind = media_type(ct) & c->route->bodies;
        if (!c->body_kind) {
            dr_api_fail(&e, 415, "unsupported_media_type", NULL, "Content-Type %.100s is not accepted here",
                        ct ? ct : "(none)");
            return respond_error_ex(c, &e, NULL, 1);
        }
        if (c->body_kind == DR_BODY_MULTIPART) {
            c->pp = MHD_create_post_processor(c->mc, 64 * 1024, form_field, c);
            if (!c->pp) {
                dr_api_fail(&e, 415, "unsupported_media_type", NULL, "multipart/form-data needs a boundary");
                return respond_error_ex(c, &e, NULL, 1);
            }
        }
    }
    return MHD_YES;
}

static enum MHD_Result dispatch(dr_server *s, dr_conn *c) {
    if (c->body_too_large) {
        dr_api_error e = {0};
        dr_api_fail(&e, 413, "body_too_large", NULL, "the body is larger than %zu bytes (--max-body-bytes)",
                    s->opt.max_body_bytes);
        return respond_error_ex(c, &e, NULL, 1);
    }
    dr_handler_fn fn = c->method == DR_M_POST ? c->route->post : c->method == DR_M_DELETE ? c->route->del : c->route->get;
    return fn(s, c);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    dr_server *s = cls;
    dr_conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->srv = s;
        c->mc = mc;
        c->t_start = dr_now_s();
        *con_cls = c;
        atomic_fetch_add(&s->active_requests, 1);
        make_request_id(c);
        return begin(s, c, url, method);
    }
    if (c->status) { /* answered from the headers: the rest of the body is not read */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->body_too_large) {
            /* a chunked body crossed the limit: read on (discarding, bounded) so that the 413
             * can be sent once the upload ends (MHD queues responses only then); past the
             * bound the connection is closed without one */
            c->discarded += n;
            return c->discarded > DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        c->received += n;
        if (c->received > s->opt.max_body_bytes) {
            c->body_too_large = 1;
            c->discarded = c->received;
            dr_bytes_free(&c->body);
            return MHD_YES;
        }
        if (c->pp) {
            if (MHD_post_process(c->pp, upload_data, n) != MHD_YES) c->form_bad = 1;
            return MHD_YES;
        }
        if (!c->route->bodies) return MHD_YES; /* a body nobody reads (POST /v1/health) */
        return dr_bytes_append(&c->body, upload_data, n) ? MHD_NO : MHD_YES;
    }
    return dispatch(s, c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    dr_server *s = cls;
    dr_conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    dr_synth_conn_closed(c);
    if (c->route && c->status)
        dr_metrics_request(s->metrics, c->route->label, c->status, dr_now_s() - c->t_start);
    else if (c->status)
        dr_metrics_request(s->metrics, "other", c->status, dr_now_s() - c->t_start);
    if (!s->opt.quiet)
        dr_log(DR_LOG_INFO, "%s %s %d %.3fs", c->request_id, c->route ? c->route->label : "-", c->status,
               dr_now_s() - c->t_start);
    if (c->pp) MHD_destroy_post_processor(c->pp);
    dr_val_free(c->form);
    dr_bytes_free(&c->body);
    dr_bytes_free(&c->form_audio);
    dr_bytes_free(&c->form_id);
    dr_bytes_free(&c->form_text);
    free(c);
    atomic_fetch_sub(&s->active_requests, 1);
}

struct MHD_Daemon *dr_http_start(dr_server *s, const struct sockaddr *addr, int ipv6, drama_error *err) {
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     (ipv6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, addr,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!d) dr_fail(err, DRAMA_EIO, "cannot listen on %s:%d (address in use or not available)", s->opt.host, s->opt.port);
    return d;
}
