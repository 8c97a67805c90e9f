/* pull_hub.c - what `drama pull` reads from a Hugging Face-compatible hub: the revision answer,
 * pages of the recursive tree, the Link header, repo ids, globs and git blob ids. No I/O. */
#include "tools/pull.h"

#include <fnmatch.h>
#include <strings.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sha256.h"
#include "io/manifest.h"
#include "tools/pull_internal.h"

#define TREE_MAX_FILES 1000000 /* far above any checkpoint (the Drama 3 release: about a hundred files) */
#define PATH_MAX_LEN 1024

/* ASCII only: names and URLs must not depend on the locale. */
static int alnum(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static json_t *parse_json(const char *text, size_t len, const char *label, drama_error *err) {
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) dr_fail(err, DRAMA_EFORMAT, "%s: not JSON: line %d column %d: %s", label, je.line, je.column, je.text);
    return j;
}

static int is_hex(const char *s, size_t n, int allow_upper) {
    if (!s || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (allow_upper && c >= 'A' && c <= 'F'))) return 0;
    }
    return 1;
}

int dr_pull_is_commit(const char *rev) { return is_hex(rev, 40, 1); }

drama_status dr_pull_parse_revision(const char *text, size_t len, const char *label, char commit[41],
                                    drama_error *err) {
    commit[0] = 0;
    json_t *j = parse_json(text, len, label, err);
    if (!j) return DRAMA_EFORMAT;
    drama_status st = DRAMA_OK;
    const char *sha = json_string_value(json_object_get(j, "sha"));
    if (!json_is_object(j)) st = dr_fail(err, DRAMA_EFORMAT, "%s: expected a JSON object", label);
    else if (!sha) st = dr_fail(err, DRAMA_EFORMAT, "%s: no string field \"sha\" (the commit id)", label);
    else if (!is_hex(sha, 40, 0))
        st = dr_fail(err, DRAMA_EFORMAT, "%s: \"sha\" is not 40 lowercase hex digits: '%.60s'", label, sha);
    else memcpy(commit, sha, 41);
    json_decref(j);
    return st;
}

void dr_pull_tree_clear(dr_pull_tree *t) {
    if (!t) return;
    for (int64_t i = 0; i < t->count; i++) free(t->files[i].path);
    free(t->files);
    memset(t, 0, sizeof *t);
}

/* A JSON integer in [0, 2^53) (a byte count). */
static int get_size(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > ((json_int_t)1 << 53)) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static drama_status parse_entry(json_t *e, size_t k, const char *label, dr_pull_tree *tree, drama_error *err) {
    if (!json_is_object(e)) return dr_fail(err, DRAMA_EFORMAT, "%s: entry %zu is not an object", label, k);
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *path = json_string_value(json_object_get(e, "path"));
    if (!type || !path) return dr_fail(err, DRAMA_EFORMAT, "%s: entry %zu: no string \"type\" or \"path\"", label, k);
    if (strcmp(type, "file")) return DRAMA_OK; /* "directory": its files are listed themselves */
    const char *why = NULL;
    if (strlen(path) > PATH_MAX_LEN || !dr_manifest_path_ok(path, &why))
        return dr_fail(err, DRAMA_EFORMAT, "%s: entry %zu: path '%.200s' refused: %s", label, k, path,
                       why ? why : "too long");
    if (!strcmp(path, DR_PULL_PARTIAL_DIR) || !strncmp(path, DR_PULL_PARTIAL_DIR "/", sizeof DR_PULL_PARTIAL_DIR))
        return dr_fail(err, DRAMA_EFORMAT, "%s: entry %zu: path '%s' is where downloads are staged", label, k, path);
    dr_pull_entry f;
    memset(&f, 0, sizeof f);
    const char *oid = json_string_value(json_object_get(e, "oid"));
    if (!is_hex(oid, 40, 0))
        return dr_fail(err, DRAMA_EFORMAT, "%s: '%s': \"oid\" is not a 40-hex git blob id", label, path);
    memcpy(f.git_oid, oid, 41);
    if (!get_size(json_object_get(e, "size"), &f.size))
        return dr_fail(err, DRAMA_EFORMAT, "%s: '%s': \"size\" is not a byte count", label, path);
    json_t *lfs = json_object_get(e, "lfs");
    if (lfs && !json_is_null(lfs)) {
        const char *sha = json_string_value(json_object_get(lfs, "oid"));
        uint64_t lsize = 0;
        if (!json_is_object(lfs) || !dr_sha256_is_hex(sha))
            return dr_fail(err, DRAMA_EFORMAT, "%s: '%s': \"lfs.oid\" is not a 64-hex SHA-256", label, path);
        if (!get_size(json_object_get(lfs, "size"), &lsize))
            return dr_fail(err, DRAMA_EFORMAT, "%s: '%s': \"lfs.size\" is not a byte count", label, path);
        if (lsize != f.size)
            return dr_fail(err, DRAMA_EFORMAT, "%s: '%s': \"lfs.size\" %llu differs from \"size\" %llu", label, path,
                           (unsigned long long)lsize, (unsigned long long)f.size);
        f.lfs = 1;
        memcpy(f.sha256, sha, 65);
    }
    if (tree->count >= TREE_MAX_FILES)
        return dr_fail(err, DRAMA_EFORMAT, "%s: more than %d files", label, TREE_MAX_FILES);
    if (tree->count == tree->cap) {
        int64_t cap = tree->cap ? 2 * tree->cap : 64;
        dr_pull_entry *nf = realloc(tree->files, (size_t)cap * sizeof *nf);
        if (!nf) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
        tree->files = nf;
        tree->cap = cap;
    }
    f.path = strdup(path);
    if (!f.path) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    tree->files[tree->count++] = f;
    return DRAMA_OK;
}

drama_status dr_pull_parse_tree(const char *text, size_t len, const char *label, dr_pull_tree *tree,
                                drama_error *err) {
    json_t *j = parse_json(text, len, label, err);
    if (!j) return DRAMA_EFORMAT;
    drama_status st = DRAMA_OK;
    if (!json_is_array(j)) st = dr_fail(err, DRAMA_EFORMAT, "%s: expected a JSON array of entries", label);
    for (size_t k = 0; st == DRAMA_OK && k < json_array_size(j); k++)
        st = parse_entry(json_array_get(j, k), k, label, tree, err);
    json_decref(j);
    return st;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const dr_pull_entry *)a)->path, ((const dr_pull_entry *)b)->path);
}

drama_status dr_pull_tree_finish(dr_pull_tree *t, const char *label, drama_error *err) {
    if (t->count > 1) qsort(t->files, (size_t)t->count, sizeof *t->files, cmp_entry);
    for (int64_t i = 1; i < t->count; i++)
        if (!strcmp(t->files[i].path, t->files[i - 1].path))
            return dr_fail(err, DRAMA_EFORMAT, "%s: path '%s' listed twice", label, t->files[i].path);
    return DRAMA_OK;
}

/* Link: <url1>; rel="next", <url2>; rel="last" (a rel may hold several space-separated values). */
int dr_pull_link_next(const char *link, char *out, size_t outlen) {
    if (outlen) out[0] = 0;
    const char *p = link;
    while (p && *p) {
        const char *lt = strchr(p, '<');
        if (!lt) return 0;
        const char *gt = strchr(lt + 1, '>');
        if (!gt) return 0;
        const char *end = gt + 1; /* the link's parameters run to the next ',' outside quotes */
        int quoted = 0;
        while (*end && (quoted || *end != ',')) {
            if (*end == '"') quoted = !quoted;
            end++;
        }
        int inq = 0;
        for (const char *q = gt + 1; q < end; q++) {
            if (*q == '"') inq = !inq;
            /* a parameter named rel: after ';' (and blanks), never inside a quoted value */
            if (inq || *q != ';') continue;
            const char *name = q + 1;
            while (name < end && (*name == ' ' || *name == '\t')) name++;
            if (end - name < 3 || strncasecmp(name, "rel", 3)) continue;
            const char *v = name + 3;
            while (v < end && (*v == ' ' || *v == '\t')) v++;
            if (v >= end || *v != '=') continue;
            v++;
            while (v < end && (*v == ' ' || *v == '\t')) v++;
            int vq = v < end && *v == '"';
            if (vq) v++;
            const char *ve = v;
            while (ve < end && (vq ? *ve != '"' : (*ve != ';' && *ve != ' '))) ve++;
            for (const char *w = v; w < ve;) { /* space-separated relation types */
                const char *we = w;
                while (we < ve && *we != ' ') we++;
                if (we - w == 4 && !strncasecmp(w, "next", 4)) {
                    size_t n = (size_t)(gt - lt - 1);
                    if (n == 0 || n + 1 > outlen) return 0;
                    memcpy(out, lt + 1, n);
                    out[n] = 0;
                    return 1;
                }
                w = we + 1;
            }
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int name_part_ok(const char *s, size_t n) {
    if (n == 0 || s[0] == '.' || s[0] == '-' || s[n - 1] == '.' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(alnum(c) || c == '.' || c == '_' || c == '-')) return 0;
        if (i && c == '.' && s[i - 1] == '.') return 0;
    }
    return 1;
}

int dr_pull_repo_ok(const char *repo, const char **why) {
    const char *w = NULL;
    const char *slash = repo ? strchr(repo, '/') : NULL;
    if (!repo || !*repo) w = "is empty";
    else if (strlen(repo) > 96) w = "is longer than 96 characters";
    else if (!slash || strchr(slash + 1, '/')) w = "is not of the form org/name";
    else if (!name_part_ok(repo, (size_t)(slash - repo)) || !name_part_ok(slash + 1, strlen(slash + 1)))
        w = "may hold only letters, digits, '.', '_' and '-' (not first or last, no '..')";
    if (why) *why = w;
    return w == NULL;
}

int dr_pull_split_spec(const char *spec, char *repo, size_t repo_len, char *rev, size_t rev_len, const char **why) {
    const char *at = strchr(spec, '@');
    size_t n = at ? (size_t)(at - spec) : strlen(spec);
    repo[0] = rev[0] = 0;
    if (n + 1 > repo_len) {
        if (why) *why = "is longer than 96 characters";
        return 0;
    }
    memcpy(repo, spec, n);
    repo[n] = 0;
    if (!dr_pull_repo_ok(repo, why)) return 0;
    if (at) {
        const char *r = at + 1;
        if (!*r || strlen(r) + 1 > rev_len || strlen(r) > 255) {
            if (why) *why = "has an empty or overlong revision after '@'";
            return 0;
        }
        for (const char *c = r; *c; c++)
            if ((unsigned char)*c <= ' ' || *c == 0x7f) {
                if (why) *why = "has a revision with a space or control character";
                return 0;
            }
        snprintf(rev, rev_len, "%s", r);
    }
    return 1;
}

int dr_pull_glob_match(const char *pattern, const char *path) {
    size_t n = strlen(pattern);
    if (n && pattern[n - 1] == '/') { /* a trailing slash means everything under that folder (huggingface_hub) */
        char buf[2048];
        if (n + 2 > sizeof buf) return 0;
        memcpy(buf, pattern, n);
        buf[n] = '*';
        buf[n + 1] = 0;
        return fnmatch(buf, path, 0) == 0;
    }
    return fnmatch(pattern, path, 0) == 0;
}

int dr_pull_digest_start(dr_pull_digest *d, uint64_t size) {
    char head[32];
    int hn = snprintf(head, sizeof head, "blob %llu", (unsigned long long)size);
    d->sha256 = EVP_MD_CTX_new();
    d->sha1 = EVP_MD_CTX_new();
    return d->sha256 && d->sha1 && EVP_DigestInit_ex(d->sha256, EVP_sha256(), NULL) == 1 &&
           EVP_DigestInit_ex(d->sha1, EVP_sha1(), NULL) == 1 &&
           EVP_DigestUpdate(d->sha1, head, (size_t)hn + 1) == 1; /* "blob <size>\0" */
}

void dr_pull_digest_add(dr_pull_digest *d, const void *p, size_t n) {
    EVP_DigestUpdate(d->sha256, p, n);
    EVP_DigestUpdate(d->sha1, p, n);
}

static void hex_of(const unsigned char *md, int n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) out[2 * i] = digits[md[i] >> 4], out[2 * i + 1] = digits[md[i] & 15];
    out[2 * n] = 0;
}

void dr_pull_digest_end(dr_pull_digest *d, char sha256[65], char git_oid[41]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (d->sha256 && sha256 && EVP_DigestFinal_ex(d->sha256, md, &n) == 1) hex_of(md, 32, sha256);
    if (d->sha1 && git_oid && EVP_DigestFinal_ex(d->sha1, md, &n) == 1) hex_of(md, 20, git_oid);
    EVP_MD_CTX_free(d->sha256);
    EVP_MD_CTX_free(d->sha1);
    d->sha256 = d->sha1 = NULL;
}

void dr_pull_git_blob_id(const void *data, size_t n, char hex[41]) {
    dr_pull_digest d;
    hex[0] = 0;
    if (dr_pull_digest_start(&d, n)) dr_pull_digest_add(&d, data, n);
    dr_pull_digest_end(&d, NULL, hex);
}

int dr_pull_url_escape(const char *s, int keep_slash, char *out, size_t outlen) {
    static const char digits[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int keep = alnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~' || (keep_slash && *p == '/');
        if (o + (keep ? 1 : 3) + 1 > outlen) return 0;
        if (keep) out[o++] = (char)*p;
        else {
            out[o++] = '%';
            out[o++] = digits[*p >> 4];
            out[o++] = digits[*p & 15];
        }
    }
    if (!outlen) return 0;
    out[o] = 0;
    return 1;
}
