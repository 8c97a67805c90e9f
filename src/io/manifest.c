/* manifest.c - drama-manifest.json parsing, verification and writing (FORMATS.md section 7). */
#include "io/manifest.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/sha256.h"

#define MAX_MANIFEST_BYTES ((size_t)1 << 30) /* a manifest is small; refuse absurd sizes */

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

int dr_manifest_path_ok(const char *p, const char **why) {
    const char *w = NULL;
    if (!p || !*p) w = "is empty";
    else if (p[0] == '/') w = "is absolute (leading '/')";
    else if (strchr(p, '\\')) w = "contains a backslash";
    else {
        /* walk the components: none empty, '.' or '..' */
        const char *s = p;
        while (!w) {
            const char *slash = strchr(s, '/');
            size_t n = slash ? (size_t)(slash - s) : strlen(s);
            if (n == 0) w = "has an empty component";
            else if (n == 1 && s[0] == '.') w = "has a '.' component";
            else if (n == 2 && s[0] == '.' && s[1] == '.') w = "has a '..' component";
            if (!slash) break;
            s = slash + 1;
        }
    }
    if (why) *why = w;
    return w == NULL;
}

void dr_manifest_free(dr_manifest *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->count; i++) free(m->files[i].path);
    free(m->files);
    free(m);
}

drama_status dr_manifest_parse(const char *text, size_t len, const char *label, dr_manifest **out,
                               drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_parse: out is NULL");
    *out = NULL;
    if (!label) label = DR_MANIFEST_NAME;
    if (!text && len) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_parse: text is NULL");
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d: %s", label, jerr.line,
                       jerr.column, jerr.text);
    drama_status st = DRAMA_OK;
    dr_manifest *m = calloc(1, sizeof *m);
    json_t *seen = json_object();
    json_t *files = json_object_get(root, "files");
    if (!m || !seen) {
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    if (!json_is_object(root)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: top level is not a JSON object", label);
        goto done;
    }
    const char *format = json_string_value(json_object_get(root, "format"));
    if (!format || strcmp(format, "drama-manifest") != 0) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: field 'format' is not \"drama-manifest\"", label);
        goto done;
    }
    json_t *version = json_object_get(root, "version");
    if (!json_is_integer(version)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: field 'version' is missing or not an integer", label);
        goto done;
    }
    if (json_integer_value(version) != 1) {
        st = dr_fail(err, DRAMA_EUNSUPPORTED, "%s: manifest version %lld is not supported (1 is)", label,
                     (long long)json_integer_value(version));
        goto done;
    }
    if (!json_is_array(files)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: field 'files' is missing or not an array", label);
        goto done;
    }
    size_t n = json_array_size(files);
    m->files = calloc(n ? n : 1, sizeof *m->files);
    if (!m->files) {
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(files, i);
        json_t *jp = json_object_get(e, "path"), *js = json_object_get(e, "size"), *jh = json_object_get(e, "sha256");
        const char *why = NULL;
        if (!json_is_object(e) || !json_is_string(jp)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: files[%zu]: 'path' is missing or not a string", label, i);
            goto done;
        }
        const char *p = json_string_value(jp);
        if (!dr_manifest_path_ok(p, &why)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: files[%zu]: path '%s' %s", label, i, p, why);
            goto done;
        }
        if (json_object_get(seen, p)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: files[%zu]: path '%s' is listed twice", label, i, p);
            goto done;
        }
        json_object_set_new(seen, p, json_true());
        if (!json_is_integer(js) || json_integer_value(js) < 0) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: files[%zu] ('%s'): 'size' is not a non-negative integer", label, i, p);
            goto done;
        }
        if (!dr_sha256_is_hex(json_string_value(jh))) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: files[%zu] ('%s'): 'sha256' is not 64 lowercase hex digits", label,
                         i, p);
            goto done;
        }
        dr_manifest_file *f = &m->files[m->count];
        if (!(f->path = strdup(p))) {
            st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
            goto done;
        }
        f->size = (uint64_t)json_integer_value(js);
        memcpy(f->sha256, json_string_value(jh), 65);
        m->count++;
    }
done:
    json_decref(seen);
    json_decref(root);
    if (st != DRAMA_OK) {
        dr_manifest_free(m);
        return st;
    }
    *out = m;
    return DRAMA_OK;
}

drama_status dr_manifest_load(const char *path, dr_manifest **out, drama_error *err) {
    if (out) *out = NULL;
    char *buf;
    size_t len;
    drama_status st = dr_read_file(path, MAX_MANIFEST_BYTES, &buf, &len, err);
    if (st) {
        dr_error_prefix(err, "manifest: ");
        return st;
    }
    st = dr_manifest_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

const dr_manifest_file *dr_manifest_find(const dr_manifest *m, const char *rel_path) {
    if (!m || !rel_path) return NULL;
    for (int64_t i = 0; i < m->count; i++)
        if (!strcmp(m->files[i].path, rel_path)) return &m->files[i];
    return NULL;
}

drama_status dr_manifest_verify(const dr_manifest *m, const char *dir, const char *cache_path,
                                dr_manifest_report_fn report, void *user, drama_error *err) {
    if (!m || !dir) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_verify: NULL argument");
    /* Pass 1: existence and sizes (cheap), which also gives the progress total. */
    uint64_t total = 0;
    int64_t bad = 0;
    char first[900] = "";
    drama_status first_code = DRAMA_OK;
    char **paths = calloc((size_t)(m->count ? m->count : 1), sizeof *paths);
    int *size_ok = calloc((size_t)(m->count ? m->count : 1), sizeof *size_ok);
    if (!paths || !size_ok) {
        free(paths);
        free(size_ok);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    drama_status st = DRAMA_OK;
    for (int64_t i = 0; i < m->count; i++) {
        const dr_manifest_file *f = &m->files[i];
        if (!(paths[i] = join_path(dir, f->path))) {
            st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
            goto done;
        }
        struct stat sb;
        dr_manifest_finding fd = {.file = f};
        if (stat(paths[i], &sb) != 0 || !S_ISREG(sb.st_mode)) {
            fd.kind = "missing";
            if (!bad++) snprintf(first, sizeof first, "%s: listed in the manifest but missing", paths[i]);
        } else if ((uint64_t)sb.st_size != f->size) {
            fd.kind = "size";
            fd.actual_size = (uint64_t)sb.st_size;
            if (!bad++)
                snprintf(first, sizeof first, "%s: size %llu, manifest says %llu", paths[i],
                         (unsigned long long)sb.st_size, (unsigned long long)f->size);
        } else {
            size_ok[i] = 1;
            total += f->size;
            continue;
        }
        if (report) report(&fd, user);
    }
    /* Pass 2: digests. */
    dr_progress prog;
    dr_progress_begin(&prog, "verifying", total, -1);
    for (int64_t i = 0; i < m->count; i++) {
        if (!size_ok[i]) continue;
        const dr_manifest_file *f = &m->files[i];
        char hex[65];
        int cached = 0;
        dr_progress_label(&prog, f->path);
        drama_error herr = {0};
        if (dr_sha256_file_cached(paths[i], cache_path, hex, &cached, &prog, &herr) != DRAMA_OK) {
            dr_progress_end(&prog);
            st = dr_fail(err, herr.code, "%s", herr.message);
            goto done;
        }
        dr_manifest_finding fd = {.kind = "ok", .file = f, .actual_size = f->size, .actual_sha256 = hex,
                                  .from_cache = cached};
        if (strcmp(hex, f->sha256) != 0) {
            fd.kind = "sha256";
            if (!bad++)
                snprintf(first, sizeof first, "%s: SHA-256 mismatch: expected %s, actual %s", paths[i], f->sha256, hex);
        }
        if (report) report(&fd, user);
    }
    dr_progress_end(&prog);
    if (bad) {
        first_code = DRAMA_EHASH;
        st = dr_fail(err, first_code, "%s (%lld of %lld files failed verification)", first, (long long)bad,
                     (long long)m->count);
    }
done:
    for (int64_t i = 0; i < m->count; i++) free(paths[i]);
    free(paths);
    free(size_ok);
    return st;
}

drama_status dr_manifest_verify_dir(const char *dir, int reverify, dr_manifest **out, drama_error *err) {
    if (!out || !dir) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_verify_dir: NULL argument");
    *out = NULL;
    char *path = join_path(dir, DR_MANIFEST_NAME);
    if (!path) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        free(path);
        return DRAMA_OK; /* no manifest: nothing to verify */
    }
    dr_manifest *m = NULL;
    drama_status st = dr_manifest_load(path, &m, err);
    free(path);
    if (st != DRAMA_OK) return st;
    char cache[4096];
    const char *cache_path = (!reverify && dr_sha256_default_cache(cache, sizeof cache)) ? cache : NULL;
    st = dr_manifest_verify(m, dir, cache_path, NULL, NULL, err);
    if (st != DRAMA_OK) {
        dr_manifest_free(m);
        return st;
    }
    *out = m;
    return DRAMA_OK;
}

static int cmp_file(const void *a, const void *b) {
    return strcmp((*(const dr_manifest_file *const *)a)->path, (*(const dr_manifest_file *const *)b)->path);
}

/* Pointers to files in path order (stable output whatever the caller's order), every path checked
 * and none given twice. */
static drama_status sort_checked(const dr_manifest_file *files, int64_t n, const dr_manifest_file **sorted,
                                 drama_error *err) {
    for (int64_t i = 0; i < n; i++) sorted[i] = &files[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_file);
    for (int64_t i = 0; i < n; i++) {
        const char *why = NULL;
        if (!dr_manifest_path_ok(sorted[i]->path, &why))
            return dr_fail(err, DRAMA_EINVAL, "manifest path '%s' %s", sorted[i]->path, why);
        if (i && !strcmp(sorted[i]->path, sorted[i - 1]->path))
            return dr_fail(err, DRAMA_EINVAL, "manifest path '%s' given twice", sorted[i]->path);
    }
    return DRAMA_OK;
}

drama_status dr_manifest_write_files(const dr_manifest_file *files, int64_t n, const char *out_path,
                                     drama_error *err) {
    if (!out_path || (n && !files)) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_write_files: NULL argument");
    drama_status st = DRAMA_OK;
    json_t *arr = json_array();
    const dr_manifest_file **sorted = calloc((size_t)(n ? n : 1), sizeof *sorted);
    if (!arr || !sorted) {
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    st = sort_checked(files, n, sorted, err);
    if (st != DRAMA_OK) goto done;
    for (int64_t i = 0; i < n; i++) {
        if (!dr_sha256_is_hex(sorted[i]->sha256)) {
            st = dr_fail(err, DRAMA_EINVAL, "manifest path '%s': digest is not 64 lowercase hex digits", sorted[i]->path);
            goto done;
        }
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "path", sorted[i]->path, "size",
                                             (json_int_t)sorted[i]->size, "sha256", sorted[i]->sha256));
    }
    json_t *root = json_pack("{s:s, s:i, s:O}", "format", "drama-manifest", "version", 1, "files", arr);
    char *tmp = malloc(strlen(out_path) + 32);
    if (!root || !tmp) {
        json_decref(root);
        free(tmp);
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    sprintf(tmp, "%s.tmp.%ld", out_path, (long)getpid());
    unlink(tmp); /* a stale temporary or a planted link is replaced, never written through */
    if (json_dump_file(root, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0 || rename(tmp, out_path) != 0) {
        st = dr_fail(err, DRAMA_EIO, "%s: cannot write: %s", out_path, strerror(errno));
        unlink(tmp);
    }
    json_decref(root);
    free(tmp);
done:
    json_decref(arr);
    free(sorted);
    return st;
}

drama_status dr_manifest_write(const char *dir, const char *const *rel_paths, int64_t n, const char *out_path,
                               drama_error *err) {
    if (!dir || !out_path || (n && !rel_paths)) return dr_fail(err, DRAMA_EINVAL, "dr_manifest_write: NULL argument");
    dr_manifest_file *files = calloc((size_t)(n ? n : 1), sizeof *files);
    const dr_manifest_file **sorted = calloc((size_t)(n ? n : 1), sizeof *sorted);
    drama_status st = files && sorted ? DRAMA_OK : dr_fail(err, DRAMA_ENOMEM, "out of memory");
    for (int64_t i = 0; st == DRAMA_OK && i < n; i++) files[i].path = (char *)rel_paths[i];
    if (st == DRAMA_OK) st = sort_checked(files, n, sorted, err); /* before anything is opened */
    for (int64_t i = 0; st == DRAMA_OK && i < n; i++) {
        char *p = join_path(dir, rel_paths[i]);
        st = p ? dr_sha256_file(p, files[i].sha256, &files[i].size, NULL, err) : dr_fail(err, DRAMA_ENOMEM, "out of memory");
        free(p);
    }
    if (st == DRAMA_OK) st = dr_manifest_write_files(files, n, out_path, err);
    free(files);
    free(sorted);
    return st;
}
