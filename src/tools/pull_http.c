/* pull_http.c - libcurl for `drama pull`: JSON requests and resumable, verified downloads, with
 * huggingface_hub's retry rule (5 retries without progress, backoff 1 s doubling to 8 s, on
 * network errors and 408/429/5xx; Retry-After honoured). The token is a header curl sends only to
 * the endpoint's origin; it never reaches a message. */
#include "tools/pull_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "drama.h"

#define JSON_MAX_BYTES ((size_t)64 << 20)
#define ERR_BODY_MAX 2048
#define HASH_BLOCK ((size_t)1 << 20)

struct dr_http {
    CURL *curl;
    struct curl_slist *headers;
    char origin[512];
    int retries;
    double retry_wait_s;
    long timeout_s;
    int have_token;
    uint64_t enospc_after, written; /* test hook */
    void (*on_event)(const dr_pull_event *ev, void *user);
    void *user;
};

/* What the headers of one request chain said (reset per response where it is the final one's). */
typedef struct resp {
    long status;
    int responses;
    char link[4096];
    char repo_commit[64];
    char etag[160];        /* X-Linked-Etag of any response, else the first response's ETag */
    int etag_linked;
    int64_t linked_size;   /* X-Linked-Size, -1 */
    int64_t content_length;/* final response, -1 */
    char content_range[160];
    char content_encoding[64];
    char error_code[64], error_message[256];
    double retry_after;    /* seconds, -1 */
} resp;

/* Printable ASCII only, so a server cannot put control sequences into our messages. */
static void copy_clean(char *dst, size_t n, const char *src, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < n; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (n) dst[o] = 0;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *user) {
    resp *r = user;
    size_t n = size * nitems;
    while (n && (buf[n - 1] == '\r' || buf[n - 1] == '\n')) n--;
    if (n >= 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response of the chain */
        const char *sp = memchr(buf, ' ', n);
        r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        r->responses++;
        r->link[0] = r->content_range[0] = r->content_encoding[0] = 0;
        r->error_code[0] = r->error_message[0] = 0;
        r->content_length = -1;
        r->retry_after = -1;
        return size * nitems;
    }
    const char *colon = memchr(buf, ':', n);
    if (!colon) return size * nitems;
    size_t kn = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vn = n - kn - 1;
    while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
    char val[4096];
    copy_clean(val, sizeof val, v, vn);
#define IS(name) (kn == sizeof name - 1 && !strncasecmp(buf, name, kn))
    if (IS("Link")) snprintf(r->link, sizeof r->link, "%s", val);
    else if (IS("X-Repo-Commit")) snprintf(r->repo_commit, sizeof r->repo_commit, "%s", val);
    else if (IS("X-Linked-Etag")) snprintf(r->etag, sizeof r->etag, "%s", val), r->etag_linked = 1;
    else if (IS("ETag") && r->responses == 1 && !r->etag_linked) snprintf(r->etag, sizeof r->etag, "%s", val);
    else if (IS("X-Linked-Size")) r->linked_size = strtoll(val, NULL, 10);
    else if (IS("Content-Length")) r->content_length = strtoll(val, NULL, 10);
    else if (IS("Content-Range")) snprintf(r->content_range, sizeof r->content_range, "%s", val);
    else if (IS("Content-Encoding")) snprintf(r->content_encoding, sizeof r->content_encoding, "%s", val);
    else if (IS("X-Error-Code")) snprintf(r->error_code, sizeof r->error_code, "%s", val);
    else if (IS("X-Error-Message")) snprintf(r->error_message, sizeof r->error_message, "%s", val);
    else if (IS("Retry-After")) {
        char *end;
        double s = strtod(val, &end);
        if (end != val && s >= 0) r->retry_after = s;
    }
#undef IS
    return size * nitems;
}

static void resp_reset(resp *r) {
    memset(r, 0, sizeof *r);
    r->linked_size = r->content_length = -1;
    r->retry_after = -1;
}

drama_status dr_http_open(dr_http **out, const char *endpoint, const dr_pull_options *o, drama_error *err) {
    *out = NULL;
    const char *sep = strstr(endpoint, "://");
    if (!sep || (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "https://", 8)))
        return dr_fail(err, DRAMA_EINVAL, "endpoint '%s': expected an http:// or https:// URL", endpoint);
    const char *host = sep + 3;
    size_t hn = strcspn(host, "/?#");
    if (hn == 0 || memchr(host, '@', hn))
        return dr_fail(err, DRAMA_EINVAL, "endpoint: expected http(s)://host[:port][/path] without user "
                                          "credentials (give the token with HF_TOKEN or --token-file)");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return dr_fail(err, DRAMA_EINTERNAL, "libcurl: global initialisation failed");
    dr_http *h = calloc(1, sizeof *h);
    if (!h) {
        curl_global_cleanup();
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    snprintf(h->origin, sizeof h->origin, "%.*s", (int)(host + hn - endpoint), endpoint);
    h->retries = o->retries;
    h->retry_wait_s = o->retry_wait_s;
    h->timeout_s = o->timeout_s > 0 ? o->timeout_s : 60;
    h->enospc_after = o->test_enospc_after;
    h->on_event = o->on_event;
    h->user = o->user;
    h->curl = curl_easy_init();
    char ua[96];
    snprintf(ua, sizeof ua, "User-Agent: drama.c/%s", drama_version());
    struct curl_slist *hs = curl_slist_append(NULL, ua);
    if (hs && o->token && *o->token) {
        size_t tn = strlen(o->token) + 32;
        char *auth = malloc(tn);
        if (auth) {
            snprintf(auth, tn, "Authorization: Bearer %s", o->token);
            struct curl_slist *t = curl_slist_append(hs, auth);
            memset(auth, 0, tn);
            free(auth);
            hs = t;
            h->have_token = t != NULL;
        } else {
            curl_slist_free_all(hs);
            hs = NULL;
        }
    }
    h->headers = hs;
    if (!h->curl || !hs) {
        dr_http_close(h);
        return dr_fail(err, DRAMA_ENOMEM, "libcurl: cannot create a handle");
    }
    *out = h;
    return DRAMA_OK;
}

void dr_http_close(dr_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    curl_slist_free_all(h->headers);
    free(h);
    curl_global_cleanup();
}

/* Options of every request; the transfer callbacks are set by the caller. */
static void setup(dr_http *h, const char *url, resp *r, char *errbuf) {
    CURL *c = h->curl;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L); /* Authorization stays with the endpoint's host */
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, h->timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* no byte for timeout_s: the transfer is cut */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, h->timeout_s);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = 0;
}

static int transient_curl(CURLcode rc) {
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_CONNECT: case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT: case CURLE_SEND_ERROR: case CURLE_RECV_ERROR: case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2: case CURLE_HTTP2_STREAM: return 1;
    default: return 0;
    }
}

static int transient_status(long s) { return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504; }

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait before retry k (1-based): Retry-After when given (60 s at most), else base * 2^(k-1) up to 8x. */
static void backoff(dr_http *h, int k, const resp *r, const char *what, const char *why) {
    double w = h->retry_wait_s;
    for (int i = 1; i < k && w < 8 * h->retry_wait_s; i++) w *= 2;
    if (w > 8 * h->retry_wait_s) w = 8 * h->retry_wait_s;
    if (r && r->retry_after >= 0) w = r->retry_after < 60 ? r->retry_after : 60;
    if (h->on_event) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: %s", what, why);
        dr_pull_event ev = {.kind = DR_PULL_EV_RETRY, .message = msg, .attempt = k, .wait_s = w};
        h->on_event(&ev, h->user);
    }
    sleep_s(w);
}

/* The message for an HTTP error status (huggingface_hub's reading of the Hub's answers). */
static drama_status status_error(dr_http *h, const resp *r, const char *what, const char *url, drama_error *err) {
    const char *m;
    if (!strcmp(r->error_code, "RevisionNotFound")) m = "revision not found";
    else if (!strcmp(r->error_code, "EntryNotFound")) m = "file not found in this commit";
    else if (!strcmp(r->error_code, "GatedRepo")) m = "gated repo: accept its terms on the hub, then use a token of that account";
    else if (!strcmp(r->error_code, "RepoNotFound") || r->status == 404)
        m = r->status == 404 && r->error_code[0] == 0 ? "not found (unknown repo, revision or file)"
                                                       : "repo not found (or private: a token with access is needed)";
    else if (r->status == 401)
        m = h->have_token ? "the token was refused, or the repo does not exist"
                          : "authentication required (private or gated repo, or no such repo): set HF_TOKEN or --token-file";
    else if (r->status == 403) m = "access denied: the token lacks read access to this repo (gated or disabled)";
    else if (r->status == 416) m = "range not satisfiable";
    else m = "unexpected answer";
    return dr_fail(err, r->status == 404 || r->status == 401 || r->status == 403 ? DRAMA_EINVAL : DRAMA_EIO,
                   "%s: %s (HTTP %ld%s%s%s%s) for %s", what, m, r->status, r->error_code[0] ? ", " : "", r->error_code,
                   r->error_message[0] ? ": " : "", r->error_message, url);
}

typedef struct body_sink {
    char *buf;
    size_t len, cap, max;
    int overflow;
} body_sink;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    body_sink *b = user;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->max) {
        b->overflow = 1;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, data, n);
    b->len += n;
    b->buf[b->len] = 0;
    return n;
}

drama_status dr_http_get_json(dr_http *h, const char *url, const char *what, char **body, size_t *len, char *next,
                              size_t next_len, drama_error *err) {
    *body = NULL;
    *len = 0;
    if (next_len) next[0] = 0;
    resp r;
    char errbuf[CURL_ERROR_SIZE];
    for (int attempt = 0;; attempt++) {
        body_sink b = {.max = JSON_MAX_BYTES};
        resp_reset(&r);
        setup(h, url, &r, errbuf);
        curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h->curl, CURLOPT_ACCEPT_ENCODING, ""); /* JSON may come compressed */
        CURLcode rc = curl_easy_perform(h->curl);
        char why[CURL_ERROR_SIZE + 64];
        if (rc == CURLE_OK && r.status == 200) {
            if (!b.buf) on_body("", 1, 0, &b);
            if (!b.buf) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", what);
            char nx[4096];
            if (next_len && dr_pull_link_next(r.link, nx, sizeof nx)) {
                if (nx[0] == '/') snprintf(next, next_len, "%s%s", h->origin, nx);
                else snprintf(next, next_len, "%s", nx);
                size_t on = strlen(h->origin);
                if (strncmp(next, h->origin, on) || (next[on] != '/' && next[on] != '?')) {
                    free(b.buf);
                    return dr_fail(err, DRAMA_EFORMAT, "%s: the next page link '%.200s' leaves the endpoint %s (refused: "
                                   "the token would follow it)", what, next, h->origin);
                }
            }
            *body = b.buf;
            *len = b.len;
            return DRAMA_OK;
        }
        free(b.buf);
        if (b.overflow) return dr_fail(err, DRAMA_EFORMAT, "%s: answer larger than %zu bytes (%s)", what, JSON_MAX_BYTES, url);
        if (rc != CURLE_OK && !transient_curl(rc))
            return dr_fail(err, DRAMA_EIO, "%s: %s (%s)", what, errbuf[0] ? errbuf : curl_easy_strerror(rc), url);
        if (rc == CURLE_OK && !transient_status(r.status)) return status_error(h, &r, what, url, err);
        if (rc == CURLE_OK) snprintf(why, sizeof why, "HTTP %ld", r.status);
        else snprintf(why, sizeof why, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
        if (attempt >= h->retries)
            return dr_fail(err, DRAMA_EIO, "%s: %s after %d retr%s (%s); check the network and rerun", what, why,
                           h->retries, h->retries == 1 ? "y" : "ies", url);
        backoff(h, attempt + 1, rc == CURLE_OK ? &r : NULL, what, why);
    }
}

/* ---- downloads ---- */

typedef struct dl {
    dr_http *h;
    const dr_pull_entry *f;
    const char *commit;
    const char *partial;
    int fd;
    uint64_t have;       /* bytes in the partial, all hashed */
    dr_pull_digest dg;   /* over every byte of the partial */
    resp r;
    int body_started;    /* the first byte of this response's body was seen */
    int resumed;
    char errbody[ERR_BODY_MAX];
    size_t errlen;
    drama_error fail;    /* set by a callback that stopped the transfer */
    int keep_partial;    /* ... and whether a rerun can resume from the partial */
    dr_http_progress_fn progress;
    void *user;
} dl;

/* Back to an empty partial (a 200 answer to a Range request, or a stale prefix). */
static int restart(dl *d) {
    dr_pull_digest_end(&d->dg, NULL, NULL);
    if (ftruncate(d->fd, 0) != 0 || lseek(d->fd, 0, SEEK_SET) != 0 || !dr_pull_digest_start(&d->dg, d->f->size)) return 0;
    d->have = 0;
    return 1;
}

/* "W/\"abc\"" -> "abc" (huggingface_hub's _normalize_etag). */
static void etag_norm(const char *in, char *out, size_t n) {
    if (!strncmp(in, "W/", 2)) in += 2;
    size_t len = strlen(in);
    if (len >= 2 && in[0] == '"' && in[len - 1] == '"') in++, len -= 2;
    snprintf(out, n, "%.*s", (int)len, in);
}

/* The headers of the final response, checked before its first byte is written. */
static int check_headers(dl *d) {
    const dr_pull_entry *f = d->f;
    const resp *r = &d->r;
    drama_error *e = &d->fail;
    if (r->repo_commit[0] && strcasecmp(r->repo_commit, d->commit))
        return dr_fail(e, DRAMA_EFORMAT, "%s: the hub served it from commit %s, not the pinned %s", f->path,
                       r->repo_commit, d->commit), 0;
    char etag[160];
    etag_norm(r->etag, etag, sizeof etag);
    const char *want = f->lfs ? f->sha256 : f->git_oid;
    if (strlen(etag) == strlen(want) && strspn(etag, "0123456789abcdef") == strlen(want) && strcmp(etag, want))
        return dr_fail(e, DRAMA_EHASH, "%s: the hub's ETag %s differs from the tree's %s %s", f->path, etag,
                       f->lfs ? "SHA-256" : "blob id", want), 0;
    if (r->linked_size >= 0 && (uint64_t)r->linked_size != f->size)
        return dr_fail(e, DRAMA_EFORMAT, "%s: the hub announces %lld bytes (X-Linked-Size), the tree %llu", f->path,
                       (long long)r->linked_size, (unsigned long long)f->size), 0;
    if (r->status == 200) {
        if (d->have > 0 && !restart(d)) /* the Range was ignored: start again */
            return dr_fail(e, DRAMA_EIO, "%s: cannot truncate: %s", d->partial, strerror(errno)), 0;
        if (r->content_length >= 0 && !r->content_encoding[0] && (uint64_t)r->content_length != f->size)
            return dr_fail(e, DRAMA_EFORMAT, "%s: the server sends %lld bytes (Content-Length) but the tree says %llu",
                           f->path, (long long)r->content_length, (unsigned long long)f->size), 0;
        return 1;
    }
    /* 206: "bytes START-END/TOTAL" must continue exactly where the partial ends */
    unsigned long long a = 0, b = 0, total = 0;
    char star = 0;
    int n = sscanf(r->content_range, "bytes %llu-%llu/%llu", &a, &b, &total);
    if (n != 3 && sscanf(r->content_range, "bytes %llu-%llu/%c", &a, &b, &star) != 3)
        return dr_fail(e, DRAMA_EFORMAT, "%s: 206 answer with a bad Content-Range '%s'", f->path, r->content_range), 0;
    if (a != d->have)
        return dr_fail(e, DRAMA_EFORMAT, "%s: asked for bytes from %llu, the server sent from %llu", f->path,
                       (unsigned long long)d->have, a), 0;
    if (n == 3 && total != f->size)
        return dr_fail(e, DRAMA_EFORMAT, "%s: the server's Content-Range says %llu bytes but the tree says %llu",
                       f->path, total, (unsigned long long)f->size), 0;
    d->resumed = 1;
    return 1;
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *user) {
    dl *d = user;
    size_t n = size * nmemb;
    if (d->r.status != 200 && d->r.status != 206) { /* an error page: keep its start for the message */
        size_t k = n < ERR_BODY_MAX - 1 - d->errlen ? n : ERR_BODY_MAX - 1 - d->errlen;
        memcpy(d->errbody + d->errlen, data, k);
        d->errlen += k;
        return n;
    }
    if (!d->body_started) {
        d->body_started = 1;
        if (!check_headers(d)) return 0;
    }
    if (n > d->f->size - d->have) {
        dr_fail(&d->fail, DRAMA_EFORMAT, "%s: the server sent more than the %llu bytes the tree announces", d->f->path,
                (unsigned long long)d->f->size);
        return 0;
    }
    size_t off = 0;
    while (off < n) {
        size_t chunk = n - off;
        int fake_full = 0;
        if (d->h->enospc_after && d->h->written + chunk > d->h->enospc_after) {
            chunk = d->h->enospc_after > d->h->written ? (size_t)(d->h->enospc_after - d->h->written) : 0;
            fake_full = chunk == 0;
        }
        ssize_t w = fake_full ? -1 : write(d->fd, data + off, chunk);
        if (fake_full) errno = ENOSPC;
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            dr_fail(&d->fail, DRAMA_EIO, "%s: cannot write %s at byte %llu: %s%s", d->f->path, d->partial,
                    (unsigned long long)d->have, strerror(e),
                    e == ENOSPC ? " (the partial download is kept: free some space and rerun to resume)" : "");
            d->keep_partial = 1;
            return 0;
        }
        dr_pull_digest_add(&d->dg, data + off, (size_t)w);
        d->have += (uint64_t)w;
        d->h->written += (uint64_t)w;
        off += (size_t)w;
    }
    if (d->progress) d->progress(d->user, d->have);
    return n;
}

/* Reads what the partial already holds through the hashes (a resumed download is verified whole). */
static drama_status hash_prefix(dl *d, drama_error *err) {
    struct stat sb;
    if (fstat(d->fd, &sb) != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot stat: %s", d->partial, strerror(errno));
    if ((uint64_t)sb.st_size > d->f->size) { /* longer than the file can be: not ours */
        if (!restart(d)) return dr_fail(err, DRAMA_EIO, "%s: cannot truncate: %s", d->partial, strerror(errno));
        return DRAMA_OK;
    }
    unsigned char *buf = malloc(HASH_BLOCK);
    if (!buf) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    for (;;) {
        ssize_t got = read(d->fd, buf, HASH_BLOCK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            free(buf);
            return dr_fail(err, DRAMA_EIO, "%s: read failed at byte %llu: %s", d->partial, (unsigned long long)d->have,
                           strerror(errno));
        }
        if (got == 0) break;
        dr_pull_digest_add(&d->dg, buf, (size_t)got);
        d->have += (uint64_t)got;
    }
    free(buf);
    return DRAMA_OK;
}

drama_status dr_http_download(dr_http *h, const char *url, const dr_pull_entry *f, const char *commit,
                              const char *partial, char sha256[65], char git_oid[41], int *resumed,
                              dr_http_progress_fn progress, void *user, drama_error *err) {
    dl d;
    memset(&d, 0, sizeof d);
    d.h = h, d.f = f, d.commit = commit, d.partial = partial, d.progress = progress, d.user = user;
    *resumed = 0;
    d.fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d.fd < 0) return dr_fail(err, DRAMA_EIO, "%s: cannot open: %s", partial, strerror(errno));
    if (flock(d.fd, LOCK_EX | LOCK_NB) != 0) { /* two pulls into one folder must not write one file */
        int e = errno;
        close(d.fd);
        return dr_fail(err, DRAMA_EIO, "%s: %s", partial,
                       e == EWOULDBLOCK ? "another drama pull is downloading this file" : strerror(e));
    }
    drama_status st = DRAMA_OK;
    int keep = 0;
    if (!dr_pull_digest_start(&d.dg, f->size)) st = dr_fail(err, DRAMA_ENOMEM, "cannot start the digests");
    if (st == DRAMA_OK) st = hash_prefix(&d, err);
    char errbuf[CURL_ERROR_SIZE];
    int fresh_416 = 0;
    for (int stalled = 0; st == DRAMA_OK && d.have < f->size;) {
        uint64_t before = d.have;
        resp_reset(&d.r);
        d.body_started = 0;
        d.errlen = 0;
        setup(h, url, &d.r, errbuf);
        curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &d);
        char range[48];
        snprintf(range, sizeof range, "%llu-", (unsigned long long)d.have);
        if (d.have) curl_easy_setopt(h->curl, CURLOPT_RANGE, range);
        CURLcode rc = curl_easy_perform(h->curl);
        if (d.fail.code != DRAMA_OK) { /* a callback stopped it: its message is the cause */
            *err = d.fail;
            st = d.fail.code;
            keep = d.keep_partial;
            break;
        }
        char why[CURL_ERROR_SIZE + 64];
        if (rc == CURLE_OK && d.r.status == 416 && d.have && !fresh_416) { /* our prefix is not theirs */
            fresh_416 = 1;
            if (!restart(&d)) st = dr_fail(err, DRAMA_EIO, "%s: cannot truncate: %s", partial, strerror(errno));
            continue;
        }
        if (rc == CURLE_OK && d.r.status != 200 && d.r.status != 206 && !transient_status(d.r.status)) {
            st = status_error(h, &d.r, f->path, url, err);
            break;
        }
        if (rc == CURLE_OK && (d.r.status == 200 || d.r.status == 206)) {
            if (d.have < f->size) { /* a complete answer, short of the size the tree gives */
                st = dr_fail(err, DRAMA_EFORMAT, "%s: the server sent %llu bytes but the tree announces %llu", f->path,
                             (unsigned long long)d.have, (unsigned long long)f->size);
            }
            break;
        }
        if (rc != CURLE_OK && !transient_curl(rc)) {
            st = dr_fail(err, DRAMA_EIO, "%s: %s (%s)", f->path, errbuf[0] ? errbuf : curl_easy_strerror(rc), url);
            keep = 1;
            break;
        }
        if (rc == CURLE_OK) snprintf(why, sizeof why, "HTTP %ld", d.r.status);
        else snprintf(why, sizeof why, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
        stalled = d.have > before ? 0 : stalled + 1; /* progress resets the count (huggingface_hub) */
        if (stalled > h->retries) {
            st = dr_fail(err, DRAMA_EIO, "%s: %s after %d retr%s without progress; %llu of %llu bytes are kept in %s: "
                         "rerun the same command to resume", f->path, why, h->retries, h->retries == 1 ? "y" : "ies",
                         (unsigned long long)d.have, (unsigned long long)f->size, partial);
            keep = 1;
            break;
        }
        backoff(h, stalled ? stalled : 1, rc == CURLE_OK ? &d.r : NULL, f->path, why);
    }
    if (st == DRAMA_OK && fsync(d.fd) != 0) st = dr_fail(err, DRAMA_EIO, "%s: fsync: %s", partial, strerror(errno));
    dr_pull_digest_end(&d.dg, st == DRAMA_OK ? sha256 : NULL, st == DRAMA_OK ? git_oid : NULL);
    *resumed = d.resumed;
    close(d.fd);
    if (st != DRAMA_OK && !keep) unlink(partial);
    return st;
}
