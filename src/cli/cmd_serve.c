/* cmd_serve.c - `drama serve`: flags into dr_serve_options, then start, load, wait for
 * SIGTERM/SIGINT, drain, exit 0 (src/serve/server.h does the work; docs/serve.md). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "serve/request.h"
#include "serve/server.h"

#define MAX_SETS 64
#define MAX_FILE_KEYS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama serve --model DIR [options]\n\n"
            "HTTP server: fish-speech /v1/tts, OpenAI /v1/audio/speech, /v1/voices, /v1/models, /health,\n"
            "/metrics, a playground page at / (docs/serve.md, API.md). Prints \"listening on http://HOST:PORT\"\n"
            "when bound.\n\n"
            "  --model DIR                 model directory (required)\n"
            "  --host ADDR                 listen address (127.0.0.1); a non-loopback address needs a key\n"
            "  --port N                    port (8080); 0 = any free port (the line above names it)\n"
            "  --parallel N                lanes stepped together (1)\n"
            "  --queue N                   requests waiting for a lane (16); more: 429\n"
            "  --queue-timeout S           seconds a request may wait (30); then 503 queue_timeout\n"
            "  --max-body-bytes N          request body limit (20971520); more: 413\n"
            "  --max-text-length N         code points of text/input (10000)\n"
            "  --max-frames N              frame cap per text batch (750)\n"
            "  --max-reference-seconds S   reference clip limit (30)\n"
            "  --voices-dir DIR            voice catalog storage (default: in memory only)\n"
            "  --prompt-cache-mib N        voice prompt state cache (0 = off)\n"
            "  --memory-budget-mib N       memory for request state + prompt cache (default: 3/4 of\n"
            "                              physical memory minus the model; -1 = no limit)\n"
            "  --reference-cache-mib N     codes of inline references by content hash (16)\n"
            "  --cfg-gamma G               guidance strength for requests with a reference (0 = off)\n"
            "  --cfg-allow-request-gamma   accept a per-request cfg_gamma\n"
            "  --cfg-max-gamma G           largest per-request cfg_gamma (5)\n"
            "  --stream-first-frames N     frames of the first streamed chunk (latency: normal 10, balanced 4)\n"
            "  --stream-chunk-frames N     frames of later chunks (normal 25, balanced 16)\n"
            "  --api-key KEY               accepted key (repeatable): Authorization: Bearer KEY or X-Api-Key\n"
            "  --api-key-file FILE         keys, one per line (# comments)\n"
            "  --allow-no-auth             allow a non-loopback address without a key\n"
            "  --metrics-public            /metrics without a key\n"
            "  --cors-origin ORIGIN        send CORS headers for this origin (off by default)\n"
            "  --voice-alias NAME=ID       OpenAI voice NAME means stored voice ID (repeatable)\n"
            "  --model-alias NAME          another accepted OpenAI model id (repeatable; drama-3, tts-1,\n"
            "                              tts-1-hd, gpt-4o-mini-tts are always accepted)\n"
            "  --drain-timeout S           on SIGTERM/SIGINT, seconds running requests may finish (30)\n"
            "  --threads N                 model worker threads (0 = physical cores)\n"
            "  --backend B                 cpu | cuda | auto (default auto: CUDA when a usable GPU is present)\n"
            "  --device N                  GPU index for cuda (default 0); one replica per GPU (docs/deploy.md)\n"
            "  --replica-id ID             this replica's name in X-Served-By and drama_replica_info\n"
            "                              (1-64 of [A-Za-z0-9._:-]; default HOSTNAME:PORT)\n"
            "  --test-load-delay S         test hook: stay \"loading\" S seconds before loading the model\n"
            "  --test-step-delay S         test hook: pause S seconds (<= 10) after every engine step\n"
            "  --set SWITCH=VALUE          model switch (MODEL.md 10; repeatable)\n"
            "  --no-ui                     no playground page at GET / (docs/serve.md \"Playground\")\n"
            "  -q, --quiet                 no access log\n");
}

static int bad(const char *flag, const char *v, const char *why) {
    fprintf(stderr, "drama serve: %s: invalid value '%s': %s\n", flag, v ? v : "(missing)", why);
    return DR_EXIT_USAGE;
}

static int get_ll(const char *flag, const char *v, long long lo, long long hi, int64_t *out) {
    long long x;
    if (!dr_cli_int("serve", flag, v, lo, hi, &x)) return DR_EXIT_USAGE;
    *out = x;
    return 0;
}

static int get_int(const char *flag, const char *v, int lo, int hi, int *out) {
    int64_t x;
    int rc = get_ll(flag, v, lo, hi, &x);
    if (!rc) *out = (int)x;
    return rc;
}

static int get_num(const char *flag, const char *v, double lo, double hi, double *out) {
    return dr_cli_num("serve", flag, v, lo, hi, 0, out) ? 0 : DR_EXIT_USAGE;
}

typedef struct serve_args {
    dr_serve_options o;
    const char *sets[MAX_SETS + 1];
    int n_sets, n_models;
    char *key_file_text;
} serve_args;

static int read_key_file(serve_args *a, const char *path) {
    drama_error err = {0};
    char *text = NULL;
    if (dr_read_text_file(path, 1 << 20, &text, &err) != DRAMA_OK) {
        fprintf(stderr, "drama serve: --api-key-file: %s\n", err.message);
        return DR_EXIT_USAGE;
    }
    free(a->key_file_text);
    a->key_file_text = text;
    for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        while (*line == ' ' || *line == '\t') line++;
        char *end = line + strlen(line);
        while (end > line && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
        if (!*line || *line == '#') continue;
        if (a->o.n_api_keys >= DR_SERVE_MAX_KEYS) return bad("--api-key-file", path, "too many keys");
        a->o.api_keys[a->o.n_api_keys++] = line;
    }
    return 0;
}

/* Returns -1 when parsing succeeded, else the exit status. */
static int parse_args(int argc, char **argv, serve_args *a) {
    dr_serve_options *o = &a->o;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        if (!strcmp(f, "--cfg-allow-request-gamma")) { o->cfg_allow_request_gamma = 1; continue; }
        if (!strcmp(f, "--allow-no-auth")) { o->allow_no_auth = 1; continue; }
        if (!strcmp(f, "--metrics-public")) { o->metrics_public = 1; continue; }
        if (!strcmp(f, "-q") || !strcmp(f, "--quiet")) { o->quiet = 1; continue; }
        if (!strcmp(f, "--no-ui")) { o->no_ui = 1; continue; }
        if (strncmp(f, "--", 2)) {
            fprintf(stderr, "drama serve: unexpected argument '%s' (see --help)\n", f);
            return DR_EXIT_USAGE;
        }
        char name[64];
        const char *v = NULL, *eq = strchr(f, '=');
        if (eq && (size_t)(eq - f) < sizeof name) {
            memcpy(name, f, (size_t)(eq - f));
            name[eq - f] = 0;
            v = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", f);
            if (i + 1 < argc) v = argv[++i];
        }
        int64_t ll = 0;
        int rc = 0;
        if (!v) return bad(name, NULL, "needs a value");
        if (!strcmp(name, "--model")) o->model_dir = v;
        else if (!strcmp(name, "--host")) o->host = v;
        else if (!strcmp(name, "--port")) rc = get_int(name, v, 0, 65535, &o->port);
        else if (!strcmp(name, "--parallel")) rc = get_int(name, v, 1, 256, &o->parallel);
        else if (!strcmp(name, "--queue")) rc = get_int(name, v, 0, 100000, &o->queue);
        else if (!strcmp(name, "--queue-timeout")) rc = get_num(name, v, 0, 86400, &o->queue_timeout_s);
        else if (!strcmp(name, "--max-body-bytes")) rc = get_ll(name, v, 1024, (long long)1 << 32, &ll), o->max_body_bytes = (size_t)ll;
        else if (!strcmp(name, "--max-text-length")) rc = get_int(name, v, 1, 10000000, &o->max_text_length);
        else if (!strcmp(name, "--max-frames")) rc = get_int(name, v, 1, 1000000, &o->max_frames);
        else if (!strcmp(name, "--max-reference-seconds")) rc = get_num(name, v, 0.1, 3600, &o->max_reference_seconds);
        else if (!strcmp(name, "--voices-dir")) o->voices_dir = v;
        else if (!strcmp(name, "--prompt-cache-mib")) rc = get_ll(name, v, 0, (long long)1 << 30, &o->prompt_cache_mib);
        else if (!strcmp(name, "--memory-budget-mib")) rc = get_ll(name, v, -1, (long long)1 << 30, &o->memory_budget_mib);
        else if (!strcmp(name, "--reference-cache-mib")) rc = get_ll(name, v, 0, (long long)1 << 20, &o->reference_cache_mib);
        else if (!strcmp(name, "--cfg-gamma")) rc = get_num(name, v, 0, 5, &o->cfg_gamma);
        else if (!strcmp(name, "--cfg-max-gamma")) rc = get_num(name, v, 0, 5, &o->cfg_max_gamma);
        else if (!strcmp(name, "--stream-first-frames")) rc = get_int(name, v, 1, 10000, &o->stream_first_frames);
        else if (!strcmp(name, "--stream-chunk-frames")) rc = get_int(name, v, 1, 10000, &o->stream_chunk_frames);
        else if (!strcmp(name, "--api-key")) {
            if (!*v) return bad(name, v, "empty key");
            if (o->n_api_keys >= DR_SERVE_MAX_KEYS) return bad(name, v, "too many keys");
            o->api_keys[o->n_api_keys++] = v;
        } else if (!strcmp(name, "--api-key-file")) rc = read_key_file(a, v);
        else if (!strcmp(name, "--cors-origin")) o->cors_origin = v;
        else if (!strcmp(name, "--voice-alias")) {
            const char *sep = strchr(v, '=');
            if (!sep || sep == v || !sep[1]) return bad(name, v, "expected NAME=ID");
            if (o->n_voice_aliases >= DR_SERVE_MAX_ALIASES) return bad(name, v, "too many aliases");
            char *n = strndup(v, (size_t)(sep - v));
            if (!n) return DR_EXIT_ERROR;
            o->voice_alias_names[o->n_voice_aliases] = n; /* lives for the process */
            o->voice_alias_ids[o->n_voice_aliases++] = sep + 1;
        } else if (!strcmp(name, "--model-alias")) {
            if (!*v) return bad(name, v, "empty id");
            if (a->n_models >= DR_SERVE_MAX_ALIASES) return bad(name, v, "too many aliases");
            o->model_ids[a->n_models++] = v;
        } else if (!strcmp(name, "--drain-timeout")) rc = get_num(name, v, 0, 86400, &o->drain_timeout_s);
        else if (!strcmp(name, "--replica-id")) {
            size_t n = strlen(v), ok = n >= 1 && n <= 64;
            for (size_t k = 0; k < n && ok; k++) ok = dr_replica_id_char(v[k]);
            if (!ok) return bad(name, v, "expected 1-64 characters of [A-Za-z0-9._:-]");
            o->replica_id = v;
        } else if (!strcmp(name, "--test-load-delay")) rc = get_num(name, v, 0, 3600, &o->load_delay_s);
        else if (!strcmp(name, "--test-step-delay")) rc = get_num(name, v, 0, 10, &o->step_delay_s);
        else if (!strcmp(name, "--threads")) rc = get_int(name, v, 0, 4096, &o->threads);
        else if (!strcmp(name, "--backend") || !strcmp(name, "--device")) {
            dr_backend_choice bc = {(dr_backend_want)o->backend, o->device}; /* drama_backend's values */
            if (dr_cli_backend_value("serve", name, v, &bc) < 0) return DR_EXIT_USAGE;
            o->backend = (drama_backend)bc.want;
            o->device = bc.device;
        }
        else if (!strcmp(name, "--set")) {
            if (a->n_sets >= MAX_SETS) return bad(name, v, "too many --set");
            a->sets[a->n_sets++] = v;
        } else {
            fprintf(stderr, "drama serve: unknown option '%s' (see --help)\n", name);
            return DR_EXIT_USAGE;
        }
        if (rc) return rc;
    }
    if (!o->model_dir) {
        fprintf(stderr, "drama serve: --model DIR is required (see --help)\n");
        return DR_EXIT_USAGE;
    }
    if (o->cfg_gamma > o->cfg_max_gamma) return bad("--cfg-gamma", "", "must not exceed --cfg-max-gamma");
    o->set = a->n_sets ? a->sets : NULL;
    return -1;
}

/* Signals: blocked in every thread and taken by one thread with sigwait, so the handler is
 * ordinary code (the drain takes locks, which a signal handler could not). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static volatile int g_stop;

static void *signal_thread(void *arg) {
    sigset_t *set = arg;
    int sig = 0;
    sigwait(set, &sig);
    pthread_mutex_lock(&g_mu);
    g_stop = 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    dr_log(DR_LOG_INFO, "serve: %s: draining", sig == SIGINT ? "SIGINT" : "SIGTERM");
    return NULL;
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    memset(&a, 0, sizeof a);
    dr_serve_options_default(&a.o);
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (dr_log_get_level() < DR_LOG_INFO) dr_log_set_level(DR_LOG_INFO);

    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_thread;
    pthread_create(&sig_thread, NULL, signal_thread, &set);
    pthread_detach(sig_thread);

    drama_error err = {0};
    dr_server *srv = NULL;
    if (dr_server_start(&srv, &a.o, &err) != DRAMA_OK) {
        fprintf(stderr, "drama serve: %s\n", err.message);
        return err.code == DRAMA_EINVAL ? DR_EXIT_USAGE : DR_EXIT_ERROR;
    }
    printf("drama serve: listening on http://%s:%d\n", a.o.host, dr_server_port(srv));
    fflush(stdout);
    int status = DR_EXIT_OK;
    if (dr_server_load(srv, &g_stop, &err) != DRAMA_OK) {
        if (!g_stop) {
            fprintf(stderr, "drama serve: %s\n", err.message);
            status = DR_EXIT_ERROR;
        }
    } else {
        pthread_mutex_lock(&g_mu);
        while (!g_stop) pthread_cond_wait(&g_cv, &g_mu);
        pthread_mutex_unlock(&g_mu);
    }
    int cancelled = dr_server_drain(srv);
    if (cancelled) dr_log(DR_LOG_WARN, "serve: %d request%s cancelled by the drain timeout", cancelled, cancelled == 1 ? "" : "s");
    dr_server_free(srv);
    free(a.key_file_text);
    for (int k = 0; k < a.o.n_voice_aliases; k++) free((char *)a.o.voice_alias_names[k]);
    return status;
}
