/* cmd_pull.c - `drama pull REPO[@REVISION]`: a checkpoint from a Hugging Face-compatible hub into
 * the model store, verified and resumable (docs/pull.md). The token is read here and handed to
 * the library; it is never printed. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/progress.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "tools/pull.h"

#define MAX_INCLUDE 256

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama pull REPO[@REVISION] [--dir DIR] [--endpoint URL] [--include GLOB]...\n"
            "                  [--allow-latest] [--token-file FILE] [--retries N] [--retry-wait S]\n"
            "                  [--timeout S] [--progress-json] [-q]\n\n"
            "Downloads the files of org/name at one commit into the model store\n"
            "($XDG_DATA_HOME/drama/models/org/name/COMMIT, or DIR), each verified against the hub's\n"
            "digest (LFS: SHA-256 while streaming; git files: blob id) before it is moved into place,\n"
            "then writes drama-manifest.json and the receipt drama-pull.json. An interrupted pull\n"
            "resumes where it stopped; files already verified are not downloaded again.\n\n"
            "  REVISION          a 40-hex commit (pinned), or a branch/tag (default main), which\n"
            "                    is refused unless --allow-latest; its commit is recorded\n"
            "  --dir DIR         download into DIR instead of the store\n"
            "  --endpoint URL    the hub (default $HF_ENDPOINT, else https://huggingface.co)\n"
            "  --include GLOB    only files matching GLOB (fnmatch; '*' crosses '/'; 'dir/' = all\n"
            "                    under dir); repeatable\n"
            "  --token-file FILE read the token from FILE (default: $HF_TOKEN); sent as\n"
            "                    'Authorization: Bearer' to the endpoint's host only\n"
            "  --retries N       retries per request without progress (default 5)\n"
            "  --retry-wait S    first backoff wait in seconds, doubling up to 8x (default 1)\n"
            "  --timeout S       connect timeout; a transfer silent for S seconds is retried (60)\n"
            "  --progress-json   JSON events on stderr, one per line (default: a bar on a terminal)\n"
            "  -q, --quiet       no progress and no per-file lines\n"
            "Prints the model directory on stdout. Exit 0 ok, 1 failure, 2 bad command line.\n");
}

typedef struct ui {
    int json, quiet, bar_on;
    dr_progress bar;
    uint64_t bar_done;
} ui;

static void on_event(const dr_pull_event *ev, void *user) {
    ui *u = user;
    if (u->json) {
        json_t *j = NULL;
        switch (ev->kind) {
        case DR_PULL_EV_RESOLVED:
            j = json_pack("{s:s, s:s, s:I, s:f}", "event", "resolved", "commit", ev->commit, "bytes",
                          (json_int_t)ev->total, "t", ev->t);
            break;
        case DR_PULL_EV_FILE:
            j = json_pack("{s:s, s:s, s:s, s:I, s:f}", "event", "file", "path", ev->path, "action", ev->action, "size",
                          (json_int_t)ev->file_size, "t", ev->t);
            break;
        case DR_PULL_EV_BYTES:
            j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:f}", "event", "bytes", "path", ev->path, "file_done",
                          (json_int_t)ev->file_done, "file_size", (json_int_t)ev->file_size, "done",
                          (json_int_t)ev->done, "total", (json_int_t)ev->total, "t", ev->t);
            break;
        case DR_PULL_EV_VERIFIED:
            j = json_pack("{s:s, s:s, s:I, s:f}", "event", "verified", "path", ev->path, "size",
                          (json_int_t)ev->file_size, "t", ev->t);
            break;
        case DR_PULL_EV_RETRY:
            j = json_pack("{s:s, s:s, s:i, s:f, s:f}", "event", "retry", "message", ev->message, "attempt",
                          ev->attempt, "wait_s", ev->wait_s, "t", ev->t);
            break;
        }
        dr_progress_json_event(j);
        return;
    }
    if (u->quiet) return;
    if (ev->kind == DR_PULL_EV_RESOLVED) {
        dr_progress_begin(&u->bar, "", ev->total, -1);
        u->bar_on = u->bar.enabled;
        fprintf(stderr, "commit %s, %.1f MB to check\n", ev->commit, (double)ev->total / 1e6);
        return;
    }
    if (ev->kind == DR_PULL_EV_RETRY) {
        if (u->bar_on) fprintf(stderr, "\r\033[K");
        fprintf(stderr, "retry %d in %.1f s: %s\n", ev->attempt, ev->wait_s, ev->message);
        return;
    }
    if (u->bar_on) {
        dr_progress_label(&u->bar, ev->path);
        if (ev->done > u->bar_done) dr_progress_add(&u->bar, ev->done - u->bar_done), u->bar_done = ev->done;
    } else if (ev->kind == DR_PULL_EV_VERIFIED || (ev->kind == DR_PULL_EV_FILE && !strcmp(ev->action, "reuse"))) {
        fprintf(stderr, "  %-10s %s (%llu bytes)\n", ev->kind == DR_PULL_EV_VERIFIED ? "verified" : "present",
                ev->path, (unsigned long long)ev->file_size);
    }
}

/* The token: --token-file's first line, else $HF_TOKEN. Refused when it could break the header. */
static int read_token(const char *file, char **out) {
    *out = NULL;
    char *t = NULL;
    if (file) {
        drama_error err = {0};
        if (dr_read_text_file(file, 65536, &t, &err) != DRAMA_OK) {
            fprintf(stderr, "drama pull: --token-file: %s\n", err.message);
            return 0;
        }
        t[strcspn(t, "\r\n")] = 0;
    } else {
        const char *e = getenv("HF_TOKEN");
        if (!e || !*e) return 1;
        t = strdup(e);
        if (!t) return 0;
    }
    size_t n = strlen(t);
    while (n && (t[n - 1] == ' ' || t[n - 1] == '\t')) t[--n] = 0;
    char *s = t + strspn(t, " \t");
    int ok = *s != 0;
    for (char *c = s; ok && *c; c++) ok = (unsigned char)*c > ' ' && *c != 0x7f;
    if (!ok) {
        fprintf(stderr, "drama pull: the token from %s is empty or holds spaces or control characters\n",
                file ? "--token-file" : "HF_TOKEN");
        free(t);
        return 0;
    }
    memmove(t, s, strlen(s) + 1);
    *out = t;
    return 1;
}

static int parse_num(const char *flag, const char *v, double lo, double hi, double *out) {
    return dr_cli_num("pull", flag, v, lo, hi, 0, out);
}

int cmd_pull(int argc, char **argv) {
    dr_pull_options o;
    dr_pull_options_default(&o);
    const char *spec = NULL, *token_file = NULL, *include[MAX_INCLUDE];
    ui u;
    memset(&u, 0, sizeof u);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        if (!strcmp(a, "--allow-latest")) { o.allow_latest = 1; continue; }
        if (!strcmp(a, "--progress-json")) { u.json = 1; continue; }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { u.quiet = 1; continue; }
        if (a[0] != '-') {
            if (spec) {
                fprintf(stderr, "drama pull: unexpected argument '%s' (one REPO[@REVISION])\n", a);
                return DR_EXIT_USAGE;
            }
            spec = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "drama pull: %s: missing value\n", a);
            return DR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        double d = 0;
        if (!strcmp(a, "--dir")) o.dir = v;
        else if (!strcmp(a, "--endpoint")) o.endpoint = v;
        else if (!strcmp(a, "--token-file")) token_file = v;
        else if (!strcmp(a, "--include")) {
            if (o.n_include == MAX_INCLUDE) {
                fprintf(stderr, "drama pull: at most %d --include patterns\n", MAX_INCLUDE);
                return DR_EXIT_USAGE;
            }
            include[o.n_include++] = v;
        } else if (!strcmp(a, "--retries")) {
            if (!parse_num(a, v, 0, 100, &d) || d != (int)d) return DR_EXIT_USAGE;
            o.retries = (int)d;
        } else if (!strcmp(a, "--retry-wait")) {
            if (!parse_num(a, v, 0, 600, &d)) return DR_EXIT_USAGE;
            o.retry_wait_s = d;
        } else if (!strcmp(a, "--timeout")) {
            if (!parse_num(a, v, 1, 86400, &d) || d != (long)d) return DR_EXIT_USAGE;
            o.timeout_s = (long)d;
        } else if (!strcmp(a, "--test-enospc-after")) { /* test hook: a disk that fills up */
            if (!parse_num(a, v, 1, 1e15, &d)) return DR_EXIT_USAGE;
            o.test_enospc_after = (uint64_t)d;
        } else {
            fprintf(stderr, "drama pull: unknown option '%s' (see --help)\n", a);
            return DR_EXIT_USAGE;
        }
    }
    if (!spec) {
        fprintf(stderr, "drama pull: REPO[@REVISION] is required\n");
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    char repo[128], rev[256];
    const char *why = NULL;
    if (!dr_pull_split_spec(spec, repo, sizeof repo, rev, sizeof rev, &why)) {
        fprintf(stderr, "drama pull: '%s' %s\n", spec, why);
        return DR_EXIT_USAGE;
    }
    for (int k = 0; k < o.n_include; k++)
        if (!*include[k]) {
            fprintf(stderr, "drama pull: --include: empty pattern\n");
            return DR_EXIT_USAGE;
        }
    char *token = NULL;
    if (!read_token(token_file, &token)) return DR_EXIT_USAGE;
    o.repo = repo;
    o.revision = rev;
    o.token = token;
    o.include = include;
    o.on_event = on_event;
    o.user = &u;
    dr_pull_result res;
    drama_error err = {0};
    drama_status st = dr_pull(&o, &res, &err);
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    if (u.bar_on) dr_progress_end(&u.bar);
    if (u.json) {
        json_t *j = json_pack("{s:s, s:s, s:s?, s:s?, s:I, s:I, s:I, s:I, s:I, s:f}", "event", "done", "status",
                              st == DRAMA_OK ? "ok" : drama_status_name(st), "commit", res.commit[0] ? res.commit : NULL,
                              "dir", res.dir[0] ? res.dir : NULL, "files", (json_int_t)res.files, "downloaded",
                              (json_int_t)res.downloaded, "reused", (json_int_t)res.reused, "bytes",
                              (json_int_t)res.bytes_total, "bytes_downloaded", (json_int_t)res.bytes_downloaded, "t",
                              res.seconds);
        if (j && st != DRAMA_OK) json_object_set_new(j, "error", json_string(err.message));
        dr_progress_json_event(j);
    }
    if (st != DRAMA_OK) {
        fprintf(stderr, "drama pull: %s\n", err.message);
        return DR_EXIT_ERROR;
    }
    if (!u.quiet && !u.json)
        fprintf(stderr, "%s@%s: commit %s, %lld files (%lld downloaded, %lld already present), %.1f MB, %.1f s\n",
                repo, rev[0] ? rev : "main", res.commit, (long long)res.files, (long long)res.downloaded,
                (long long)res.reused, (double)res.bytes_total / 1e6, res.seconds);
    printf("%s\n", res.dir);
    return DR_EXIT_OK;
}
