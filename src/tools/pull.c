/* pull.c - `drama pull` (pull.h): revision -> commit, the recursive tree page by page, then every
 * selected file verified into place, the manifest from the verified digests, the receipt last
 * (its presence marks a complete pull in the store). Decisions: docs/pull.md. */
#include "tools/pull.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/receipt.h"
#include "base/sha256.h"
#include "drama.h"
#include "io/manifest.h"
#include "tools/pull_internal.h"

#define MAX_PAGES 100000
#define URL_MAX 8192

void dr_pull_options_default(dr_pull_options *o) {
    memset(o, 0, sizeof *o);
    o->retries = 5;
    o->retry_wait_s = 1.0;
    o->timeout_s = 60;
}

typedef struct pull_run {
    const dr_pull_options *o;
    dr_http *h;
    const char *endpoint;
    char commit[41];
    char dir[4096];
    dr_pull_tree tree;
    int *selected;        /* per tree entry */
    const char **action;  /* per tree entry: "download", "resume", "reuse" */
    uint64_t total, done_before; /* bytes of the selection; bytes of the files finished */
    double t0, last_event;
    dr_pull_result *res;
} pull_run;

static void emit(pull_run *r, dr_pull_event *ev) {
    if (!r->o->on_event) return;
    ev->commit = r->commit[0] ? r->commit : NULL;
    ev->total = r->total;
    ev->t = dr_clock_s() - r->t0;
    r->o->on_event(ev, r->o->user);
}

/* The file being downloaded, for the progress callback. */
typedef struct file_progress {
    pull_run *r;
    const dr_pull_entry *f;
} file_progress;

static void on_bytes(void *user, uint64_t file_done) {
    file_progress *fp = user;
    pull_run *r = fp->r;
    double now = dr_clock_s();
    if (now - r->last_event < 0.1 && file_done < fp->f->size) return; /* bounded event rate */
    r->last_event = now;
    dr_pull_event ev = {.kind = DR_PULL_EV_BYTES, .path = fp->f->path, .file_done = file_done,
                        .file_size = fp->f->size, .done = r->done_before + file_done};
    emit(r, &ev);
}

/* SHA-256 and git blob id of a file in one read (for a git file already in place). */
static int file_digests(const char *path, uint64_t size, char sha256[65], char git_oid[41]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    dr_pull_digest d;
    unsigned char *buf = malloc(1 << 20);
    int ok = buf && dr_pull_digest_start(&d, size);
    uint64_t total = 0;
    while (ok) {
        ssize_t got = read(fd, buf, 1 << 20);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            ok = got == 0;
            break;
        }
        dr_pull_digest_add(&d, buf, (size_t)got);
        total += (uint64_t)got;
    }
    ok = ok && total == size;
    dr_pull_digest_end(&d, ok ? sha256 : NULL, ok ? git_oid : NULL);
    free(buf);
    close(fd);
    return ok;
}

/* 1 when dir/path already holds f (size, then the digest the hub gave); its SHA-256 into sha256. */
static int already_there(const char *final, dr_pull_entry *f, const char *cache, char sha256[65]) {
    struct stat sb;
    if (lstat(final, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != f->size) return 0;
    if (f->lfs) return dr_sha256_file_cached(final, cache[0] ? cache : NULL, sha256, NULL, NULL, NULL) == DRAMA_OK &&
                       !strcmp(sha256, f->sha256);
    char oid[41];
    return file_digests(final, f->size, sha256, oid) && !strcmp(oid, f->git_oid);
}

static drama_status fetch_file(pull_run *r, int64_t i, const char *cache, drama_error *err) {
    dr_pull_entry *f = &r->tree.files[i];
    char final[PATH_MAX], partial[PATH_MAX], url[URL_MAX], esc[URL_MAX / 2];
    snprintf(final, sizeof final, "%s/%s", r->dir, f->path);
    snprintf(partial, sizeof partial, "%s/%s/%s.part", r->dir, DR_PULL_PARTIAL_DIR, f->lfs ? f->sha256 : f->git_oid);
    char sha256[65] = {0}, oid[41] = {0};
    if (already_there(final, f, cache, sha256)) {
        memcpy(f->sha256, sha256, 65);
        r->action[i] = "reuse";
        r->res->reused++;
        dr_pull_event ev = {.kind = DR_PULL_EV_FILE, .path = f->path, .action = "reuse", .file_size = f->size,
                            .file_done = f->size, .done = r->done_before + f->size};
        emit(r, &ev);
        return DRAMA_OK;
    }
    struct stat sb;
    r->action[i] = stat(partial, &sb) == 0 && sb.st_size > 0 ? "resume" : "download";
    dr_pull_event ev = {.kind = DR_PULL_EV_FILE, .path = f->path, .action = r->action[i], .file_size = f->size,
                        .done = r->done_before};
    emit(r, &ev);
    if (!dr_pull_url_escape(f->path, 1, esc, sizeof esc))
        return dr_fail(err, DRAMA_EINVAL, "%s: path too long for a URL", f->path);
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", r->endpoint, r->o->repo, r->commit, esc);
    file_progress fp = {r, f};
    int resumed = 0;
    uint64_t before = (uint64_t)(stat(partial, &sb) == 0 ? sb.st_size : 0);
    drama_status st = dr_http_download(r->h, url, f, r->commit, partial, sha256, oid, &resumed, on_bytes, &fp, err);
    if (st != DRAMA_OK) return st;
    const char *want = f->lfs ? f->sha256 : f->git_oid, *got = f->lfs ? sha256 : oid;
    if (strcmp(want, got)) {
        unlink(partial);
        return dr_fail(err, DRAMA_EHASH, "%s: %s mismatch: expected %s, got %s (%llu bytes from %s); the download "
                       "was deleted and nothing was put in place", f->path, f->lfs ? "SHA-256" : "git blob id", want,
                       got, (unsigned long long)f->size, url);
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", final);
    *strrchr(parent, '/') = 0; /* final is dir + "/" + path */
    drama_status ms = dr_make_dirs(parent, err); /* on failure the verified partial stays: a rerun moves it */
    if (ms != DRAMA_OK) return ms;
    if (rename(partial, final) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: cannot move the verified download into place: %s", final, strerror(errno));
    dr_sha256_cache_put(cache[0] ? cache : NULL, final, sha256); /* the first load need not rehash it */
    memcpy(f->sha256, sha256, 65);
    if (!resumed) before = 0;
    r->res->downloaded++;
    r->res->bytes_downloaded += f->size - before;
    dr_pull_event done = {.kind = DR_PULL_EV_VERIFIED, .path = f->path, .action = r->action[i], .file_size = f->size,
                          .file_done = f->size, .done = r->done_before + f->size};
    emit(r, &done);
    return DRAMA_OK;
}

static drama_status list_tree(pull_run *r, drama_error *err) {
    char url[URL_MAX], next[URL_MAX], what[512];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/%s?recursive=true", r->endpoint, r->o->repo, r->commit);
    snprintf(what, sizeof what, "%s@%s: file list", r->o->repo, r->commit);
    for (int page = 0;; page++) {
        if (page == MAX_PAGES) return dr_fail(err, DRAMA_EFORMAT, "%s: more than %d pages", what, MAX_PAGES);
        char *body = NULL;
        size_t len = 0;
        drama_status st = dr_http_get_json(r->h, url, what, &body, &len, next, sizeof next, err);
        if (st == DRAMA_OK) {
            char label[600];
            snprintf(label, sizeof label, "%s, page %d", what, page + 1);
            st = dr_pull_parse_tree(body, len, label, &r->tree, err);
        }
        free(body);
        if (st != DRAMA_OK) return st;
        if (!next[0]) return dr_pull_tree_finish(&r->tree, what, err);
        if (!strcmp(next, url)) return dr_fail(err, DRAMA_EFORMAT, "%s: the next page link points at the same page", what);
        snprintf(url, sizeof url, "%s", next);
    }
}

static drama_status resolve(pull_run *r, const char *rev, drama_error *err) {
    char url[URL_MAX], esc[1024], what[512];
    if (!dr_pull_url_escape(rev, 0, esc, sizeof esc)) return dr_fail(err, DRAMA_EINVAL, "revision too long");
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", r->endpoint, r->o->repo, esc);
    snprintf(what, sizeof what, "%s@%s", r->o->repo, rev);
    char *body = NULL;
    size_t len = 0;
    drama_status st = dr_http_get_json(r->h, url, what, &body, &len, NULL, 0, err);
    if (st == DRAMA_OK) st = dr_pull_parse_revision(body, len, what, r->commit, err);
    free(body);
    if (st != DRAMA_OK) return st;
    if (dr_pull_is_commit(rev) && strcasecmp(rev, r->commit))
        return dr_fail(err, DRAMA_EFORMAT, "%s: the hub resolved the commit to %s", what, r->commit);
    return DRAMA_OK;
}

static const char *reserved(const char *path) {
    if (!strcmp(path, DR_MANIFEST_NAME)) return "written by drama pull from the verified digests";
    if (!strcmp(path, DR_PULL_RECEIPT_NAME)) return "the receipt of drama pull";
    return NULL;
}

static void iso_utc(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static drama_status write_outputs(pull_run *r, const char *rev, const char *started, drama_error *err) {
    const dr_pull_options *o = r->o;
    int64_t n = 0;
    dr_manifest_file *mf = calloc((size_t)r->tree.count + 1, sizeof *mf);
    json_t *files = json_array(), *skipped = json_array(), *inc = json_array();
    if (!mf || !files || !skipped || !inc) {
        free(mf);
        json_decref(files), json_decref(skipped), json_decref(inc);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < r->tree.count; i++) {
        dr_pull_entry *f = &r->tree.files[i];
        if (reserved(f->path)) json_array_append_new(skipped, json_pack("{s:s, s:s}", "path", f->path, "why", reserved(f->path)));
        if (!r->selected[i]) continue;
        mf[n].path = f->path;
        mf[n].size = f->size;
        memcpy(mf[n].sha256, f->sha256, 65);
        n++;
        json_array_append_new(files, json_pack("{s:s, s:I, s:s, s:s, s:b, s:s}", "path", f->path, "size",
                                               (json_int_t)f->size, "sha256", f->sha256, "git_oid", f->git_oid, "lfs",
                                               f->lfs, "action", r->action[i]));
    }
    for (int k = 0; k < o->n_include; k++) json_array_append_new(inc, json_string(o->include[k]));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", r->dir, DR_MANIFEST_NAME);
    drama_status st = dr_manifest_write_files(mf, n, path, err);
    free(mf);
    char finished[32];
    iso_utc(finished, sizeof finished);
    r->res->seconds = dr_clock_s() - r->t0;
    json_t *j = json_pack("{s:s, s:i, s:{s:s, s:s, s:s}, s:s, s:s, s:s, s:s, s:b, s:b, s:o, s:o, s:o, s:I, s:I, s:I, "
                          "s:I, s:s, s:s, s:f}",
                          "format", "drama-pull", "version", 1, "engine", "name", "drama.c", "version", drama_version(),
                          "commit", drama_git_commit(), "endpoint", r->endpoint, "repo", o->repo, "revision", rev,
                          "commit", r->commit, "pinned", dr_pull_is_commit(rev), "allow_latest", o->allow_latest,
                          "include", inc, "files", files, "skipped", skipped, "bytes", (json_int_t)r->total,
                          "bytes_downloaded", (json_int_t)r->res->bytes_downloaded, "files_downloaded",
                          (json_int_t)r->res->downloaded, "files_reused", (json_int_t)r->res->reused, "started", started,
                          "finished", finished, "seconds", r->res->seconds);
    if (!j) return st != DRAMA_OK ? st : dr_fail(err, DRAMA_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/%s", r->dir, DR_PULL_RECEIPT_NAME);
    if (st == DRAMA_OK) st = dr_receipt_write(path, j, err);
    json_decref(j);
    return st;
}

/* A receipt or manifest of another commit (a reused --dir) no longer describes the folder. */
static void drop_stale(const char *dir, const char *commit) {
    char p[PATH_MAX];
    json_t *j = NULL;
    snprintf(p, sizeof p, "%s/%s", dir, DR_PULL_RECEIPT_NAME);
    if (dr_read_json_file(p, (size_t)1 << 26, 1, &j, NULL) == DRAMA_OK && !j) return; /* none */
    const char *c = json_string_value(json_object_get(j, "commit"));
    int same = c && !strcmp(c, commit);
    json_decref(j);
    if (same) return;
    unlink(p);
    snprintf(p, sizeof p, "%s/%s", dir, DR_MANIFEST_NAME);
    unlink(p);
}

drama_status dr_pull(const dr_pull_options *o, dr_pull_result *res, drama_error *err) {
    memset(res, 0, sizeof *res);
    const char *why = NULL;
    if (!o || !o->repo || !dr_pull_repo_ok(o->repo, &why))
        return dr_fail(err, DRAMA_EINVAL, "repo '%s' %s", o && o->repo ? o->repo : "", why ? why : "missing");
    const char *rev = o->revision && *o->revision ? o->revision : "main";
    char endpoint[2048];
    const char *ep = o->endpoint && *o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
    snprintf(endpoint, sizeof endpoint, "%s", ep && *ep ? ep : DR_PULL_DEFAULT_ENDPOINT);
    for (size_t n = strlen(endpoint); n && endpoint[n - 1] == '/'; n--) endpoint[n - 1] = 0;
    pull_run r;
    memset(&r, 0, sizeof r);
    r.o = o, r.endpoint = endpoint, r.res = res, r.t0 = dr_clock_s();
    char started[32], cache[4096];
    iso_utc(started, sizeof started);
    if (!dr_sha256_default_cache(cache, sizeof cache)) cache[0] = 0;
    drama_status st = dr_http_open(&r.h, endpoint, o, err);
    if (st == DRAMA_OK) st = resolve(&r, rev, err);
    if (st == DRAMA_OK && !dr_pull_is_commit(rev) && !o->allow_latest)
        st = dr_fail(err, DRAMA_EINVAL, "%s@%s is a branch or tag (a mutable reference; now commit %s): pull a pinned "
                     "commit with `drama pull %s@%s`, or pass --allow-latest to take it as it is now (the commit "
                     "is recorded either way)", o->repo, rev, r.commit, o->repo, r.commit);
    char root[4096];
    if (st == DRAMA_OK && !o->dir && !dr_pull_store_root(root, sizeof root))
        st = dr_fail(err, DRAMA_EINVAL, "no model store: set XDG_DATA_HOME or HOME, or give --dir");
    if (st == DRAMA_OK) {
        if (o->dir) snprintf(r.dir, sizeof r.dir, "%s", o->dir);
        else if (!dr_pull_store_dir(root, o->repo, r.commit, r.dir, sizeof r.dir))
            st = dr_fail(err, DRAMA_EINVAL, "store path too long");
    }
    if (st == DRAMA_OK) {
        memcpy(res->commit, r.commit, 41);
        snprintf(res->dir, sizeof res->dir, "%s", r.dir);
        st = list_tree(&r, err);
    }
    if (st == DRAMA_OK) {
        r.selected = calloc((size_t)r.tree.count + 1, sizeof *r.selected);
        r.action = calloc((size_t)r.tree.count + 1, sizeof *r.action);
        if (!r.selected || !r.action) st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; st == DRAMA_OK && i < r.tree.count; i++) {
        const char *p = r.tree.files[i].path;
        int sel = o->n_include == 0;
        for (int k = 0; !sel && k < o->n_include; k++) sel = dr_pull_glob_match(o->include[k], p);
        r.selected[i] = sel && !reserved(p);
        if (r.selected[i]) r.total += r.tree.files[i].size, res->files++;
    }
    if (st == DRAMA_OK && res->files == 0)
        st = dr_fail(err, DRAMA_EINVAL, "%s@%s: no file of the commit's %lld matches the --include patterns", o->repo,
                     r.commit, (long long)r.tree.count);
    res->bytes_total = r.total;
    if (st == DRAMA_OK) {
        char partial[PATH_MAX];
        snprintf(partial, sizeof partial, "%s/%s", r.dir, DR_PULL_PARTIAL_DIR);
        st = dr_make_dirs(partial, err);
        if (st == DRAMA_OK) drop_stale(r.dir, r.commit);
        dr_pull_event ev = {.kind = DR_PULL_EV_RESOLVED};
        if (st == DRAMA_OK) emit(&r, &ev);
    }
    for (int64_t i = 0; st == DRAMA_OK && i < r.tree.count; i++) {
        if (!r.selected[i]) continue;
        st = fetch_file(&r, i, cache, err);
        r.done_before += r.tree.files[i].size;
    }
    if (st == DRAMA_OK) st = write_outputs(&r, rev, started, err);
    if (st == DRAMA_OK && !o->dir && !dr_pull_is_commit(rev)) st = dr_pull_store_write_ref(root, o->repo, rev, r.commit, err);
    if (st == DRAMA_OK) {
        char partial[PATH_MAX];
        snprintf(partial, sizeof partial, "%s/%s", r.dir, DR_PULL_PARTIAL_DIR);
        rmdir(partial); /* only when empty: another pull's partials stay */
    }
    res->seconds = dr_clock_s() - r.t0;
    free(r.selected);
    free(r.action);
    dr_pull_tree_clear(&r.tree);
    dr_http_close(r.h);
    return st;
}
