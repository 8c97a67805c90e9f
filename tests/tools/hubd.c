/* hubd.c - a test hub for `drama pull` (tests/e2e/pull.sh): serves the files of a folder as one
 * repository at one commit, in the shapes of the Hugging Face Hub API, on 127.0.0.1 only:
 *   GET /api/models/ORG/NAME/revision/REV   {"id", "sha", "siblings"}; REV = branch, tag or commit
 *   GET /api/models/ORG/NAME/tree/REV?recursive=true[&cursor=N]   pages of --page-size entries,
 *       the next one named by a Link: <...>; rel="next" header
 *   GET /ORG/NAME/resolve/REV/PATH   git files: the bytes (ETag = blob id); LFS files (at least
 *       --lfs-min bytes): 302 to a second listener (another port, so another host to curl) at
 *       /cdn-lfs/SHA256, with X-Linked-Etag / X-Linked-Size / X-Repo-Commit
 * Both honour "Range: bytes=N-" (206, 416 past the end). Fault switches (PATH = repo path):
 *   --token T        hub requests need "Authorization: Bearer T" (401 otherwise)
 *   --forbid         every hub request is 403         --fail-first N   the first N hub requests are 503
 *   --corrupt PATH   one byte of PATH is served flipped
 *   --cut PATH       the first transfer of PATH stops at half its bytes (the connection is closed)
 *   --cut-all PATH   every transfer of PATH stops at half the file (a resumed one gets nothing)
 *   --lie-size PATH  the tree (and X-Linked-Size) announce 4096 bytes more than PATH holds
 *   --extra PATH     PATH is served with 4096 bytes more, without Content-Length
 *   --slow PATH      the first transfer of PATH sleeps 20 ms per 16 KiB block
 *   --ignore-range   answer Range requests with 200 and the whole file
 * Every request is logged to --log FILE as "hub|cdn METHOD PATH cursor=C range=R auth=A" (A: ok,
 * none, bad on the hub; none or present on the CDN). "PORT CDN_PORT COMMIT" goes to --port-file.
 * Exits on SIGTERM/SIGINT or after --max-seconds (default 600). Test code: no Python on CI. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LIE_BYTES 4096
#define MAX_FILES 4096

typedef struct hub_file {
    char path[1024];
    unsigned char *data;
    size_t size;
    char oid[41], sha256[65];
    int lfs;
    int transfers; /* content responses started (the "first transfer" faults) */
} hub_file;

typedef struct hub {
    char repo[256], branch[128], tag[128], commit[41];
    hub_file files[MAX_FILES];
    int n;
    int page_size;
    size_t lfs_min;
    const char *token, *corrupt, *cut, *cut_all, *lie_size, *extra, *slow;
    int forbid, fail_first, ignore_range, requests;
    int port, cdn_port;
    FILE *log;
    pthread_mutex_t lock;
} hub;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { (void)s; g_stop = 1; }

static void hex(const unsigned char *md, int n, char *out) {
    for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static void digest(const EVP_MD *md, const void *a, size_t an, const void *b, size_t bn, char *out) {
    unsigned char m[EVP_MAX_MD_SIZE];
    unsigned mn = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, md, NULL);
    EVP_DigestUpdate(c, a, an);
    EVP_DigestUpdate(c, b, bn);
    EVP_DigestFinal_ex(c, m, &mn);
    EVP_MD_CTX_free(c);
    hex(m, (int)mn, out);
}

static int add_dir(hub *h, const char *root, const char *rel) {
    char p[2048];
    snprintf(p, sizeof p, "%s%s%s", root, rel[0] ? "/" : "", rel);
    DIR *d = opendir(p);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2]))) continue;
        char r[1024], full[3072];
        snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
        snprintf(full, sizeof full, "%s/%s", root, r);
        struct stat sb;
        if (stat(full, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            if (!add_dir(h, root, r)) return 0;
            continue;
        }
        if (h->n == MAX_FILES) return 0;
        hub_file *f = &h->files[h->n++];
        snprintf(f->path, sizeof f->path, "%s", r);
        f->size = (size_t)sb.st_size;
        f->data = malloc(f->size ? f->size : 1);
        FILE *in = fopen(full, "rb");
        if (!f->data || !in || fread(f->data, 1, f->size, in) != f->size) return 0;
        fclose(in);
        char head[64];
        int hn = snprintf(head, sizeof head, "blob %zu", f->size);
        digest(EVP_sha1(), head, (size_t)hn + 1, f->data, f->size, f->oid);
        digest(EVP_sha256(), f->data, f->size, "", 0, f->sha256);
        f->lfs = f->size >= h->lfs_min;
    }
    closedir(d);
    return 1;
}

static int cmp_file(const void *a, const void *b) { return strcmp(((const hub_file *)a)->path, ((const hub_file *)b)->path); }

static int is(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static hub_file *find_path(hub *h, const char *p) {
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->files[i].path, p)) return &h->files[i];
    return NULL;
}

static size_t announced(hub *h, const hub_file *f) { return f->size + (is(f->path, h->lie_size) ? LIE_BYTES : 0); }

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *body, const char *code,
                                 const char *message, const char *ctype) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", ctype ? ctype : "application/json");
    if (code) MHD_add_response_header(r, "X-Error-Code", code);
    if (message) MHD_add_response_header(r, "X-Error-Message", message);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j, const char *link) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (link) MHD_add_response_header(r, "Link", link);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

typedef struct body {
    hub_file *f;
    size_t start, end;  /* bytes [start, end) of the file, then `extra` junk bytes */
    size_t extra;
    long long cut_at;   /* absolute offset where the connection is dropped, -1 none */
    int corrupt, slow;
} body;

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
    body *b = cls;
    size_t abs = b->start + (size_t)pos;
    if (b->cut_at >= 0 && (long long)abs >= b->cut_at) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (b->slow) usleep(20000);
    if (abs >= b->end) {
        size_t junk = b->end + b->extra - abs;
        if (abs >= b->end + b->extra) return MHD_CONTENT_READER_END_OF_STREAM;
        size_t n = junk < max ? junk : max;
        memset(buf, 'J', n);
        return (ssize_t)n;
    }
    size_t n = b->end - abs;
    if (n > max) n = max;
    if (n > 16384) n = 16384;
    if (b->cut_at >= 0 && abs + n > (size_t)b->cut_at) n = (size_t)b->cut_at - abs;
    memcpy(buf, b->f->data + abs, n);
    size_t flip = b->f->size / 2;
    if (b->corrupt && flip >= abs && flip < abs + n) buf[flip - abs] ^= 0x5a;
    return (ssize_t)n;
}

/* The bytes of f, honouring Range and the fault switches. */
static enum MHD_Result send_content(hub *h, struct MHD_Connection *c, hub_file *f, const char *range,
                                    const char *etag) {
    size_t start = 0;
    int partial = 0;
    if (range && !h->ignore_range) {
        unsigned long long n = 0;
        char dash = 0, more = 0;
        if (sscanf(range, "bytes=%llu%c%c", &n, &dash, &more) != 2 || dash != '-')
            return send_text(c, 416, "{\"error\":\"only bytes=N- ranges\"}", NULL, NULL, NULL);
        if (n >= f->size) {
            char cr[64];
            snprintf(cr, sizeof cr, "bytes */%zu", f->size);
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, "Content-Range", cr);
            enum MHD_Result ok = MHD_queue_response(c, 416, r);
            MHD_destroy_response(r);
            return ok;
        }
        start = (size_t)n;
        partial = 1;
    }
    pthread_mutex_lock(&h->lock);
    int first = f->transfers++ == 0;
    pthread_mutex_unlock(&h->lock);
    body *b = calloc(1, sizeof *b);
    b->f = f, b->start = start, b->end = f->size, b->cut_at = -1;
    b->corrupt = is(f->path, h->corrupt);
    b->slow = first && is(f->path, h->slow);
    if ((first && is(f->path, h->cut)) || is(f->path, h->cut_all)) b->cut_at = (long long)(f->size / 2);
    int extra = is(f->path, h->extra);
    if (extra) b->extra = LIE_BYTES;
    struct MHD_Response *r = MHD_create_response_from_callback(extra ? MHD_SIZE_UNKNOWN : f->size - start, 65536,
                                                               read_body, b, free);
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    if (etag) { /* the hub's own answer for a git file (a CDN sends neither) */
        MHD_add_response_header(r, "ETag", etag);
        MHD_add_response_header(r, "X-Repo-Commit", h->commit);
    }
    if (partial) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %zu-%zu/%zu", start, f->size - 1, f->size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    enum MHD_Result ok = MHD_queue_response(c, partial ? 206 : 200, r);
    MHD_destroy_response(r);
    return ok;
}

static const char *ref_commit(hub *h, const char *rev) {
    if (is(rev, h->branch) || is(rev, h->tag) || is(rev, h->commit)) return h->commit;
    return NULL;
}

static enum MHD_Result api(hub *h, struct MHD_Connection *c, const char *rest) {
    /* rest: "revision/REV" or "tree/REV" */
    if (!strncmp(rest, "revision/", 9)) {
        if (!ref_commit(h, rest + 9))
            return send_text(c, 404, "{\"error\":\"Invalid rev id\"}", "RevisionNotFound", "Invalid rev id", NULL);
        json_t *sib = json_array();
        for (int i = 0; i < h->n; i++) json_array_append_new(sib, json_pack("{s:s}", "rfilename", h->files[i].path));
        return send_json(c, 200, json_pack("{s:s, s:s, s:s, s:b, s:o}", "_id", "0", "id", h->repo, "sha", h->commit,
                                           "private", h->token != NULL, "siblings", sib), NULL);
    }
    if (strncmp(rest, "tree/", 5) || !ref_commit(h, rest + 5))
        return send_text(c, 404, "{\"error\":\"Invalid rev id\"}", "RevisionNotFound", "Invalid rev id", NULL);
    const char *rec = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "recursive");
    int recursive = rec && (!strcmp(rec, "true") || !strcmp(rec, "True") || !strcmp(rec, "1"));
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    long cursor = cur ? strtol(cur, NULL, 10) : 0;
    json_t *all = json_array(); /* directories (once each) and files, in path order */
    for (int i = 0; i < h->n; i++) {
        hub_file *f = &h->files[i];
        const char *slash = strchr(f->path, '/');
        if (slash) {
            char dir[1024];
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - f->path), f->path);
            int seen = 0;
            for (size_t k = 0; k < json_array_size(all); k++)
                seen |= is(json_string_value(json_object_get(json_array_get(all, k), "path")), dir);
            if (!seen) json_array_append_new(all, json_pack("{s:s, s:s, s:i, s:s}", "type", "directory", "oid",
                                                            "0000000000000000000000000000000000000000", "size", 0,
                                                            "path", dir));
            if (!recursive) continue;
        }
        json_t *e = json_pack("{s:s, s:s, s:I, s:s}", "type", "file", "oid", f->oid, "size",
                              (json_int_t)announced(h, f), "path", f->path);
        if (f->lfs)
            json_object_set_new(e, "lfs", json_pack("{s:s, s:I, s:i}", "oid", f->sha256, "size",
                                                    (json_int_t)announced(h, f), "pointerSize", 134));
        json_array_append_new(all, e);
    }
    json_t *page = json_array();
    long n = (long)json_array_size(all);
    for (long k = cursor; k < n && k < cursor + h->page_size; k++) json_array_append(page, json_array_get(all, (size_t)k));
    json_decref(all);
    char link[1024];
    int more = cursor + h->page_size < n;
    if (more)
        snprintf(link, sizeof link, "<http://127.0.0.1:%d/api/models/%s/%s?recursive=%s&cursor=%ld>; rel=\"next\"",
                 h->port, h->repo, rest, recursive ? "true" : "false", cursor + h->page_size);
    return send_json(c, 200, page, more ? link : NULL);
}

static enum MHD_Result resolve(hub *h, struct MHD_Connection *c, const char *rest) {
    /* rest: "REV/PATH" */
    const char *slash = strchr(rest, '/');
    char rev[128];
    snprintf(rev, sizeof rev, "%.*s", slash ? (int)(slash - rest) : 0, rest);
    if (!slash || !ref_commit(h, rev))
        return send_text(c, 404, "Revision not found", "RevisionNotFound", "Invalid rev id", "text/plain");
    hub_file *f = find_path(h, slash + 1);
    if (!f) return send_text(c, 404, "Entry not found", "EntryNotFound", "Entry not found", "text/plain");
    char etag[80], size[32];
    snprintf(etag, sizeof etag, "\"%s\"", f->lfs ? f->sha256 : f->oid);
    if (!f->lfs) return send_content(h, c, f, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"), etag);
    char loc[512];
    snprintf(loc, sizeof loc, "http://127.0.0.1:%d/cdn-lfs/%s", h->cdn_port, f->sha256);
    snprintf(size, sizeof size, "%zu", announced(h, f));
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Location", loc);
    MHD_add_response_header(r, "ETag", etag);
    MHD_add_response_header(r, "X-Linked-Etag", etag);
    MHD_add_response_header(r, "X-Linked-Size", size);
    MHD_add_response_header(r, "X-Repo-Commit", h->commit);
    enum MHD_Result ok = MHD_queue_response(c, 302, r);
    MHD_destroy_response(r);
    return ok;
}

static void log_request(hub *h, const char *kind, struct MHD_Connection *c, const char *method, const char *url,
                        const char *auth) {
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    const char *cursor = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    pthread_mutex_lock(&h->lock);
    if (h->log) {
        fprintf(h->log, "%s %s %s cursor=%s range=%s auth=%s\n", kind, method, url, cursor ? cursor : "-",
                range ? range : "-", auth);
        fflush(h->log);
    }
    pthread_mutex_unlock(&h->lock);
}

static enum MHD_Result on_hub(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    hub *h = cls;
    (void)version, (void)upload, (void)upload_size, (void)con_cls;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    char want[512];
    snprintf(want, sizeof want, "Bearer %s", h->token ? h->token : "");
    const char *auth_state = !auth ? "none" : (h->token && !strcmp(auth, want)) ? "ok" : "bad";
    log_request(h, "hub", c, method, url, auth_state);
    pthread_mutex_lock(&h->lock);
    int nth = h->requests++;
    pthread_mutex_unlock(&h->lock);
    if (nth < h->fail_first) return send_text(c, 503, "{\"error\":\"busy\"}", NULL, NULL, NULL);
    if (h->token && strcmp(auth_state, "ok"))
        return send_text(c, 401, "{\"error\":\"Invalid credentials\"}", NULL,
                         auth ? "Invalid credentials in Authorization header" : NULL, NULL);
    if (h->forbid) return send_text(c, 403, "{\"error\":\"restricted\"}", NULL, "Access to this model is restricted", NULL);
    char prefix[400];
    snprintf(prefix, sizeof prefix, "/api/models/%s/", h->repo);
    if (!strncmp(url, prefix, strlen(prefix))) return api(h, c, url + strlen(prefix));
    snprintf(prefix, sizeof prefix, "/%s/resolve/", h->repo);
    if (!strncmp(url, prefix, strlen(prefix))) return resolve(h, c, url + strlen(prefix));
    if (!strncmp(url, "/api/models/", 12) || strstr(url, "/resolve/"))
        return send_text(c, 404, "{\"error\":\"Repository not found\"}", "RepoNotFound", "Repository not found", NULL);
    return send_text(c, 404, "not found", NULL, NULL, "text/plain");
}

static enum MHD_Result on_cdn(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    hub *h = cls;
    (void)version, (void)upload, (void)upload_size, (void)con_cls;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    log_request(h, "cdn", c, method, url, auth ? "present" : "none");
    if (!strncmp(url, "/cdn-lfs/", 9))
        for (int i = 0; i < h->n; i++)
            if (h->files[i].lfs && !strcmp(h->files[i].sha256, url + 9))
                return send_content(h, c, &h->files[i], MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"),
                                    NULL);
    return send_text(c, 404, "no such object", NULL, NULL, "text/plain");
}

static struct MHD_Daemon *listen_loopback(MHD_AccessHandlerCallback fn, hub *h, int *port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = 0; /* the OS picks a free port */
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
                                            NULL, fn, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (!d) return NULL;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : 0;
    return d;
}

int main(int argc, char **argv) {
    static hub h;
    memset(&h, 0, sizeof h);
    pthread_mutex_init(&h.lock, NULL);
    snprintf(h.branch, sizeof h.branch, "main");
    h.page_size = 1000;
    h.lfs_min = 65536;
    const char *dir = NULL, *log = NULL, *port_file = NULL;
    int max_seconds = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--forbid")) { h.forbid = 1; continue; }
        if (!strcmp(a, "--ignore-range")) { h.ignore_range = 1; continue; }
        if (!v) { fprintf(stderr, "hubd: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--repo")) snprintf(h.repo, sizeof h.repo, "%s", v);
        else if (!strcmp(a, "--branch")) snprintf(h.branch, sizeof h.branch, "%s", v);
        else if (!strcmp(a, "--tag")) snprintf(h.tag, sizeof h.tag, "%s", v);
        else if (!strcmp(a, "--page-size")) h.page_size = atoi(v);
        else if (!strcmp(a, "--lfs-min")) h.lfs_min = (size_t)atoll(v);
        else if (!strcmp(a, "--token")) h.token = v;
        else if (!strcmp(a, "--corrupt")) h.corrupt = v;
        else if (!strcmp(a, "--cut")) h.cut = v;
        else if (!strcmp(a, "--cut-all")) h.cut_all = v;
        else if (!strcmp(a, "--lie-size")) h.lie_size = v;
        else if (!strcmp(a, "--extra")) h.extra = v;
        else if (!strcmp(a, "--slow")) h.slow = v;
        else if (!strcmp(a, "--fail-first")) h.fail_first = atoi(v);
        else if (!strcmp(a, "--log")) log = v;
        else if (!strcmp(a, "--port-file")) port_file = v;
        else if (!strcmp(a, "--max-seconds")) max_seconds = atoi(v);
        else { fprintf(stderr, "hubd: unknown option %s\n", a); return 2; }
    }
    if (!dir || !h.repo[0] || !port_file || h.page_size < 1) {
        fprintf(stderr, "usage: hubd --dir DIR --repo ORG/NAME --port-file FILE [options]\n");
        return 2;
    }
    if (!add_dir(&h, dir, "") || h.n == 0) {
        fprintf(stderr, "hubd: cannot read the files of %s\n", dir);
        return 1;
    }
    qsort(h.files, (size_t)h.n, sizeof h.files[0], cmp_file);
    EVP_MD_CTX *cc = EVP_MD_CTX_new(); /* the commit id: over every (path, blob id) */
    EVP_DigestInit_ex(cc, EVP_sha1(), NULL);
    for (int i = 0; i < h.n; i++) {
        EVP_DigestUpdate(cc, h.files[i].path, strlen(h.files[i].path) + 1);
        EVP_DigestUpdate(cc, h.files[i].oid, 40);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mn = 0;
    EVP_DigestFinal_ex(cc, md, &mn);
    EVP_MD_CTX_free(cc);
    hex(md, 20, h.commit);
    if (log && !(h.log = fopen(log, "a"))) {
        fprintf(stderr, "hubd: cannot open %s\n", log);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    struct MHD_Daemon *cdn = listen_loopback(on_cdn, &h, &h.cdn_port);
    struct MHD_Daemon *d = listen_loopback(on_hub, &h, &h.port);
    if (!cdn || !d || !h.port || !h.cdn_port) {
        fprintf(stderr, "hubd: cannot listen on 127.0.0.1\n");
        return 1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *pf = fopen(tmp, "w");
    if (!pf || fprintf(pf, "%d %d %s\n", h.port, h.cdn_port, h.commit) < 0 || fclose(pf) != 0 || rename(tmp, port_file)) {
        fprintf(stderr, "hubd: cannot write %s\n", port_file);
        return 1;
    }
    for (int t = 0; !g_stop && t < max_seconds * 10; t++) usleep(100000);
    MHD_stop_daemon(d);
    MHD_stop_daemon(cdn);
    if (h.log) fclose(h.log);
    for (int i = 0; i < h.n; i++) free(h.files[i].data);
    return 0;
}
