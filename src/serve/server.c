/* server.c - `drama serve` lifecycle: bind, load the model and the scheduler, drain, stop. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "base/log.h"
#include "serve/server_internal.h"

void dr_serve_options_default(dr_serve_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 1;
    o->queue = 16;
    o->queue_timeout_s = 30;
    o->max_body_bytes = (size_t)20 << 20;
    o->max_text_length = 10000;
    o->max_frames = 750;
    o->max_reference_seconds = 30;
    o->reference_cache_mib = 16;
    o->cfg_max_gamma = 5;
    o->drain_timeout_s = 30;
}

static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return 0;
}

/* --replica-id, else HOSTNAME:PORT (the bound port), characters outside the id set as '_'. */
static void set_replica_id(dr_server *s) {
    char host[64] = "";
    if (s->opt.replica_id) snprintf(s->replica_id, sizeof s->replica_id, "%s", s->opt.replica_id);
    else {
        if (gethostname(host, sizeof host - 1) || !host[0]) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = 0;
        snprintf(s->replica_id, sizeof s->replica_id, "%s:%d", host, s->port);
    }
    for (char *p = s->replica_id; *p; p++)
        if (!dr_replica_id_char(*p)) *p = '_';
}

drama_status dr_server_start(dr_server **out, const dr_serve_options *opt, drama_error *err) {
    *out = NULL;
    if (opt->port < 0 || opt->port > 65535) return dr_fail(err, DRAMA_EINVAL, "--port %d: must be 0..65535", opt->port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", opt->port);
    int gai = getaddrinfo(opt->host, port, &hints, &ai);
    if (gai) return dr_fail(err, DRAMA_EINVAL, "--host %s: %s", opt->host, gai_strerror(gai));
    int loopback = is_loopback(ai->ai_addr);
    if (!loopback && opt->n_api_keys == 0 && !opt->allow_no_auth) {
        freeaddrinfo(ai);
        return dr_fail(err, DRAMA_EINVAL,
                       "--host %s is not a loopback address: give --api-key/--api-key-file (or --allow-no-auth to "
                       "serve without authentication)", opt->host);
    }
    dr_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    s->opt = *opt;
    s->loopback = loopback;
    for (int k = 0; k < opt->n_api_keys && k < DR_SERVE_MAX_KEYS; k++)
        SHA256((const unsigned char *)opt->api_keys[k], strlen(opt->api_keys[k]), s->key_digests[s->n_keys++]);
    s->metrics = dr_metrics_create();
    s->refcache = dr_refcache_create(opt->reference_cache_mib << 20);
    s->limits.max_frames = opt->max_frames;
    s->limits.cfg_gamma_default = opt->cfg_gamma;
    s->limits.cfg_allow_request_gamma = opt->cfg_allow_request_gamma;
    s->limits.cfg_max_gamma = opt->cfg_max_gamma;
    int n_ids = 0;
    for (int k = 0; dr_default_model_ids[k]; k++) s->model_ids[n_ids++] = dr_default_model_ids[k];
    for (int k = 0; k < DR_SERVE_MAX_ALIASES && s->opt.model_ids[k]; k++) s->model_ids[n_ids++] = s->opt.model_ids[k];
    s->limits.model_ids = s->model_ids;
    s->limits.voice_alias_names = s->opt.voice_alias_names;
    s->limits.voice_alias_ids = s->opt.voice_alias_ids;
    atomic_store(&s->health, DR_HEALTH_LOADING);
    if (s->metrics && s->refcache) s->daemon = dr_http_start(s, ai->ai_addr, ai->ai_family == AF_INET6, err);
    freeaddrinfo(ai);
    if (!s->daemon) {
        if (!s->metrics || !s->refcache) dr_fail(err, DRAMA_ENOMEM, "out of memory");
        dr_server_free(s);
        return err ? err->code : DRAMA_EIO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? (int)info->port : opt->port;
    set_replica_id(s);
    *out = s;
    return DRAMA_OK;
}

int dr_server_port(const dr_server *s) { return s->port; }

const char *dr_server_replica_id(const dr_server *s) { return s->replica_id; }

drama_status dr_server_load(dr_server *s, volatile int *stop, drama_error *err) {
    drama_status st;
    for (double waited = 0; waited < s->opt.load_delay_s; waited += 0.02) { /* the test hook */
        if (stop && *stop) {
            st = dr_fail(err, DRAMA_ECANCELLED, "stopped while loading");
            goto failed;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = s->opt.threads;
    mo.backend = s->opt.backend;
    mo.device = s->opt.device;
    mo.set = s->opt.set;
    st = drama_model_open(&s->model, s->opt.model_dir, &mo, err);
    if (st != DRAMA_OK) goto failed;
    dr_sched_options so;
    dr_sched_options_default(&so);
    so.lanes = s->opt.parallel;
    so.queue_size = s->opt.queue;
    so.queue_timeout_s = s->opt.queue_timeout_s;
    so.prompt_cache_bytes = s->opt.prompt_cache_mib << 20;
    so.memory_budget_bytes = s->opt.memory_budget_mib < 0 ? -1 : s->opt.memory_budget_mib << 20;
    so.drain_timeout_s = s->opt.drain_timeout_s;
    so.step_delay_s = s->opt.step_delay_s;
    st = dr_sched_create(s->model, &so, &s->sched, err);
    if (st != DRAMA_OK) goto failed;
    while (dr_sched_get_state(s->sched) == DR_SCHED_LOADING) {
        if (stop && *stop) {
            st = dr_fail(err, DRAMA_ECANCELLED, "stopped while loading");
            goto failed;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (dr_sched_get_state(s->sched) != DR_SCHED_READY) {
        dr_sched_load_error(s->sched, err);
        st = err && err->code ? err->code : DRAMA_EINTERNAL;
        goto failed;
    }
    s->sample_rate = drama_model_sample_rate(s->model);
    s->samples_per_frame = drama_model_samples_per_frame(s->model);
    s->n_codebooks = drama_model_codebooks(s->model);
    s->fingerprint = drama_model_codec_fingerprint(s->model);
    st = dr_voices_open(&s->voices, s->opt.voices_dir, s->fingerprint, s->n_codebooks, dr_encode_reference, s, err);
    if (st != DRAMA_OK) goto failed;
    DR_INFO("serve: ready (%d lane%s, %d voice%s)", s->opt.parallel, s->opt.parallel == 1 ? "" : "s",
            dr_voices_count(s->voices), dr_voices_count(s->voices) == 1 ? "" : "s");
    atomic_store(&s->health, DR_HEALTH_OK);
    return DRAMA_OK;
failed:
    atomic_store(&s->health, DR_HEALTH_FAILED);
    return st;
}

/* Waits (bounded) until no HTTP request is in flight: a job that just finished still has its
 * response to write, and stopping the daemon would cut it. */
static void wait_requests(dr_server *s, double max_s) {
    for (double waited = 0; atomic_load(&s->active_requests) > 0 && waited < max_s; waited += 0.01) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int dr_server_drain(dr_server *s) {
    atomic_store(&s->health, DR_HEALTH_DRAINING);
    int n = s->sched ? dr_sched_drain(s->sched, s->opt.drain_timeout_s) : 0;
    wait_requests(s, 10);
    return n;
}

void dr_server_free(dr_server *s) {
    if (!s) return;
    atomic_store(&s->health, DR_HEALTH_DRAINING);
    /* every job ends first (its on_done wakes the connection waiting on it; a drain already done
     * makes this immediate and later submits are refused), then the connection threads are
     * joined, then the scheduler goes */
    if (s->sched) dr_sched_drain(s->sched, 0);
    wait_requests(s, 10);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    dr_sched_free(s->sched);
    dr_voices_free(s->voices);
    drama_model_close(s->model);
    dr_refcache_free(s->refcache);
    dr_metrics_free(s->metrics);
    free(s);
}
