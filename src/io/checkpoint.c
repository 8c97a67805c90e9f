/* checkpoint.c - a model directory's weights: model.safetensors, or shards through
 * model.safetensors.index.json (FORMATS.md section 2), plus backbone prefix detection (MODEL.md 4.1).
 *
 * The index is trusted for nothing: every shard it names is opened and validated, and the map is
 * cross-checked against the shard headers in both directions. All disagreements are collected
 * into one error so that a broken checkpoint is diagnosed in one run. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/log.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_INDEX_BYTES ((size_t)1 << 30) /* an index is a few MB even for the largest models */

typedef struct ckpt_entry {
    const dr_tensor *t;
    int shard;
} ckpt_entry;

struct dr_ckpt {
    char *dir;
    int nshards;
    dr_st_file **shards;
    char **shard_names;
    int64_t count;
    ckpt_entry *entries; /* sorted by name */
    dr_ckpt_index *index;
    int nwarn;
    char **warnings;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

/* ---- index ---- */

void dr_ckpt_index_free(dr_ckpt_index *ix) {
    if (!ix) return;
    json_decref(ix->root);
    free(ix->names);
    free(ix->shard_of);
    free(ix->shards);
    free(ix);
}

/* FORMATS.md 2 rule 2: a plain file name ending in .safetensors. */
static const char *bad_shard_name(const char *s) {
    if (!ends_with(s, ".safetensors")) return "does not end in .safetensors";
    if (strchr(s, '/')) return "contains '/'";
    if (strchr(s, '\\')) return "contains '\\'";
    if (!strcmp(s, ".") || !strcmp(s, "..")) return "is a directory name";
    return NULL;
}

drama_status dr_ckpt_parse_index(const char *text, size_t len, const char *label, dr_ckpt_index **out,
                                 drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_ckpt_parse_index: out is NULL");
    *out = NULL;
    if (!label) label = INDEX_NAME;
    if (!text && len) return dr_fail(err, DRAMA_EINVAL, "dr_ckpt_parse_index: text is NULL");
    dr_ckpt_index *ix = calloc(1, sizeof *ix);
    if (!ix) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    json_error_t jerr;
    drama_status st = DRAMA_OK;
    json_t *shard_ids = NULL; /* shard name -> index, to number shards in O(1) */
    ix->root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!ix->root) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d (byte offset %d): %s", label,
                     jerr.line, jerr.column, jerr.position, jerr.text);
        goto done;
    }
    if (!json_is_object(ix->root)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: top level is not a JSON object", label);
        goto done;
    }
    json_t *meta = json_object_get(ix->root, "metadata");
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: 'metadata' is not a JSON object", label);
        goto done;
    }
    ix->metadata = json_is_object(meta) ? meta : NULL;
    json_t *total = ix->metadata ? json_object_get(ix->metadata, "total_size") : NULL;
    if (json_is_integer(total) && json_integer_value(total) >= 0) {
        ix->has_total_size = 1;
        ix->total_size = (uint64_t)json_integer_value(total);
    }
    json_t *map = json_object_get(ix->root, "weight_map");
    if (!map) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: missing 'weight_map'", label);
        goto done;
    }
    if (!json_is_object(map)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: 'weight_map' is not a JSON object", label);
        goto done;
    }
    size_t n = json_object_size(map);
    if (n == 0) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: 'weight_map' is empty", label);
        goto done;
    }
    ix->names = calloc(n, sizeof *ix->names);
    ix->shard_of = calloc(n, sizeof *ix->shard_of);
    ix->shards = calloc(n, sizeof *ix->shards);
    shard_ids = json_object();
    if (!ix->names || !ix->shard_of || !ix->shards || !shard_ids) {
        st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory for %zu entries", label, n);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: weight_map['%s'] is not a string", label, key);
            goto done;
        }
        const char *shard = json_string_value(val);
        const char *why = bad_shard_name(shard);
        if (why) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: weight_map['%s']: shard name '%s' %s (must be a plain file name)",
                         label, key, shard, why);
            goto done;
        }
        json_t *id = json_object_get(shard_ids, shard);
        int sid;
        if (id) {
            sid = (int)json_integer_value(id);
        } else {
            sid = ix->nshards++;
            ix->shards[sid] = shard;
            json_object_set_new(shard_ids, shard, json_integer(sid));
        }
        ix->names[ix->count] = key;
        ix->shard_of[ix->count] = sid;
        ix->count++;
    }
done:
    json_decref(shard_ids);
    if (st != DRAMA_OK) {
        dr_ckpt_index_free(ix);
        return st;
    }
    *out = ix;
    return DRAMA_OK;
}

/* ---- checkpoint ---- */

void dr_ckpt_close(dr_ckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->nshards; i++) {
        dr_st_close(c->shards[i]);
        free(c->shard_names[i]);
    }
    for (int i = 0; i < c->nwarn; i++) free(c->warnings[i]);
    free(c->shards);
    free(c->shard_names);
    free(c->entries);
    free(c->warnings);
    dr_ckpt_index_free(c->index);
    free(c->dir);
    free(c);
}

static void add_warning(dr_ckpt *c, const char *fmt, ...) DR_PRINTF(2, 3);
static void add_warning(dr_ckpt *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **nw = realloc(c->warnings, (size_t)(c->nwarn + 1) * sizeof *nw);
    if (!nw) return; /* a lost warning is not worth failing the load */
    c->warnings = nw;
    if ((c->warnings[c->nwarn] = dup_str(buf))) c->nwarn++;
}

/* Collected disagreements, reported as one error: the first few in full, then a count. */
typedef struct problems {
    char text[900];
    size_t used;
    int count;
} problems;

static void problem(problems *p, const char *fmt, ...) DR_PRINTF(2, 3);
static void problem(problems *p, const char *fmt, ...) {
    p->count++;
    char item[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    if (p->used + 4 >= sizeof p->text) {
        dr_log(DR_LOG_ERROR, "%s", item); /* every disagreement is reported: the rest go to the log */
        return;
    }
    int w = snprintf(p->text + p->used, sizeof p->text - p->used, "%s%s", p->count > 1 ? "; " : "", item);
    if (w > 0) p->used = (size_t)w + p->used >= sizeof p->text ? sizeof p->text - 1 : p->used + (size_t)w;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const ckpt_entry *)a)->t->name, ((const ckpt_entry *)b)->t->name);
}

static drama_status open_shard(dr_ckpt *c, const char *name, drama_error *err) {
    char *path = join_path(c->dir, name);
    if (!path) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        drama_status st = dr_fail(err, DRAMA_EIO, "%s: shard '%s' named by the index is missing: %s", c->dir,
                                  name, strerror(e));
        free(path);
        return st;
    }
    int i = c->nshards;
    drama_status st = dr_st_open(path, &c->shards[i], err);
    free(path);
    if (st != DRAMA_OK) return st;
    if (!(c->shard_names[i] = dup_str(name))) {
        dr_st_close(c->shards[i]);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    c->nshards++;
    return DRAMA_OK;
}

/* Sorted table of every tensor; a name in two shards is an error. */
static drama_status build_table(dr_ckpt *c, problems *pr, drama_error *err) {
    int64_t total = 0;
    for (int i = 0; i < c->nshards; i++) total += dr_st_count(c->shards[i]);
    c->entries = calloc((size_t)(total ? total : 1), sizeof *c->entries);
    if (!c->entries) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory for %lld tensors", c->dir, (long long)total);
    for (int i = 0; i < c->nshards; i++)
        for (int64_t k = 0; k < dr_st_count(c->shards[i]); k++)
            c->entries[c->count++] = (ckpt_entry){dr_st_at(c->shards[i], k), i};
    qsort(c->entries, (size_t)c->count, sizeof *c->entries, cmp_entry);
    for (int64_t k = 1; k < c->count; k++)
        if (!strcmp(c->entries[k].t->name, c->entries[k - 1].t->name))
            problem(pr, "tensor '%s' is in two shards ('%s' and '%s')", c->entries[k].t->name,
                    c->shard_names[c->entries[k - 1].shard], c->shard_names[c->entries[k].shard]);
    return DRAMA_OK;
}

/* FORMATS.md 2 rule 3: the map and the shard headers must agree in both directions. */
static void cross_check(dr_ckpt *c, problems *pr) {
    dr_ckpt_index *ix = c->index;
    json_t *map = json_object_get(ix->root, "weight_map");
    for (int i = 0; i < c->nshards; i++) {
        for (int64_t k = 0; k < dr_st_count(c->shards[i]); k++) {
            const char *name = dr_st_at(c->shards[i], k)->name;
            json_t *where = json_object_get(map, name);
            if (!where)
                problem(pr, "tensor '%s' in shard '%s' is not in weight_map", name, c->shard_names[i]);
            else if (strcmp(json_string_value(where), c->shard_names[i]) != 0)
                problem(pr, "tensor '%s' is in shard '%s' but weight_map names '%s'", name, c->shard_names[i],
                        json_string_value(where));
        }
    }
    for (int64_t k = 0; k < ix->count; k++) {
        /* shards are opened in index order, so index shard id == our shard position */
        if (!dr_st_find(c->shards[ix->shard_of[k]], ix->names[k]))
            problem(pr, "weight_map names shard '%s' for tensor '%s' but that shard does not contain it",
                    ix->shards[ix->shard_of[k]], ix->names[k]);
    }
}

static void warn_unreferenced(dr_ckpt *c) {
    DIR *d = opendir(c->dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        if (!strcmp(e->d_name, "codec.safetensors")) continue; /* the codec's own file, not a shard */
        int used = 0;
        for (int i = 0; i < c->nshards && !used; i++) used = !strcmp(c->shard_names[i], e->d_name);
        if (!used) add_warning(c, "%s: '%s' is not referenced by the index and is ignored", c->dir, e->d_name);
    }
    closedir(d);
}

static drama_status open_indexed(dr_ckpt *c, const char *index_path, drama_error *err) {
    char *text = NULL;
    size_t len = 0;
    drama_status st = dr_read_file(index_path, MAX_INDEX_BYTES, &text, &len, err);
    if (st != DRAMA_OK) {
        dr_error_prefix(err, "checkpoint index: ");
        return st;
    }
    st = dr_ckpt_parse_index(text, len, index_path, &c->index, err);
    free(text);
    if (st != DRAMA_OK) return st;
    int n = c->index->nshards;
    c->shards = calloc((size_t)n, sizeof *c->shards);
    c->shard_names = calloc((size_t)n, sizeof *c->shard_names);
    if (!c->shards || !c->shard_names) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if ((st = open_shard(c, c->index->shards[i], err)) != DRAMA_OK) return st;
    problems pr = {0};
    cross_check(c, &pr);
    if ((st = build_table(c, &pr, err)) != DRAMA_OK) return st;
    if (pr.count)
        return dr_fail(err, DRAMA_EFORMAT, "%s: index and shard headers disagree (%d problem%s): %s%s", index_path,
                       pr.count, pr.count > 1 ? "s" : "", pr.text, pr.used + 4 >= sizeof pr.text ? " ... (the rest are logged)" : "");
    if (c->index->has_total_size) {
        uint64_t sum = 0;
        for (int64_t k = 0; k < c->count; k++) sum += c->entries[k].t->nbytes;
        if (sum != c->index->total_size)
            add_warning(c, "%s: metadata.total_size is %llu but the tensors hold %llu bytes", index_path,
                        (unsigned long long)c->index->total_size, (unsigned long long)sum);
    }
    warn_unreferenced(c);
    return DRAMA_OK;
}

drama_status dr_ckpt_open(const char *dir, dr_ckpt **out, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_ckpt_open: out is NULL");
    *out = NULL;
    if (!dir) return dr_fail(err, DRAMA_EINVAL, "dr_ckpt_open: dir is NULL");
    struct stat sb;
    if (stat(dir, &sb) != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot open model directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return dr_fail(err, DRAMA_EIO, "%s: not a directory", dir);
    dr_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = dup_str(dir))) {
        free(c);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    char *index_path = join_path(dir, INDEX_NAME), *single_path = join_path(dir, SINGLE_NAME);
    drama_status st = DRAMA_OK;
    if (!index_path || !single_path) {
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    int has_index = stat(index_path, &sb) == 0, has_single = stat(single_path, &sb) == 0;
    if (has_index) {
        if (has_single)
            add_warning(c, "%s: both %s and %s present; the index wins", dir, INDEX_NAME, SINGLE_NAME);
        st = open_indexed(c, index_path, err);
    } else if (has_single) {
        c->shards = calloc(1, sizeof *c->shards);
        c->shard_names = calloc(1, sizeof *c->shard_names);
        if (!c->shards || !c->shard_names) st = dr_fail(err, DRAMA_ENOMEM, "out of memory");
        if (!st) st = open_shard(c, SINGLE_NAME, err);
        problems pr = {0};
        if (!st) st = build_table(c, &pr, err);
    } else {
        st = dr_fail(err, DRAMA_EIO, "%s: no %s or %s in the model directory", dir, SINGLE_NAME, INDEX_NAME);
    }
done:
    free(index_path);
    free(single_path);
    if (st != DRAMA_OK) {
        dr_ckpt_close(c);
        return st;
    }
    *out = c;
    return DRAMA_OK;
}

/* ---- accessors ---- */

const char *dr_ckpt_dir(const dr_ckpt *c) { return c ? c->dir : NULL; }
int64_t dr_ckpt_count(const dr_ckpt *c) { return c ? c->count : 0; }
const dr_tensor *dr_ckpt_at(const dr_ckpt *c, int64_t i) {
    return (c && i >= 0 && i < c->count) ? c->entries[i].t : NULL;
}

static const ckpt_entry *find_entry(const dr_ckpt *c, const char *name) {
    if (!c || !name) return NULL;
    int64_t lo = 0, hi = c->count - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(name, c->entries[mid].t->name);
        if (r == 0) return &c->entries[mid];
        if (r < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const dr_tensor *dr_ckpt_find(const dr_ckpt *c, const char *name) {
    const ckpt_entry *e = find_entry(c, name);
    return e ? e->t : NULL;
}

const char *dr_ckpt_shard_of(const dr_ckpt *c, const char *name) {
    const ckpt_entry *e = find_entry(c, name);
    return e ? c->shard_names[e->shard] : NULL;
}

int dr_ckpt_shard_count(const dr_ckpt *c) { return c ? c->nshards : 0; }
const dr_st_file *dr_ckpt_shard(const dr_ckpt *c, int i) {
    return (c && i >= 0 && i < c->nshards) ? c->shards[i] : NULL;
}
const json_t *dr_ckpt_index_metadata(const dr_ckpt *c) { return (c && c->index) ? c->index->metadata : NULL; }
int dr_ckpt_warning_count(const dr_ckpt *c) { return c ? c->nwarn : 0; }
const char *dr_ckpt_warning(const dr_ckpt *c, int i) {
    return (c && i >= 0 && i < c->nwarn) ? c->warnings[i] : NULL;
}

/* ---- backbone prefix (MODEL.md 4.1) ---- */

drama_status dr_ckpt_detect_prefix(const dr_ckpt *c, const char *forced, char *buf, size_t buflen,
                                   drama_error *err) {
    if (!c || !buf || buflen == 0) return dr_fail(err, DRAMA_EINVAL, "dr_ckpt_detect_prefix: NULL argument");
    buf[0] = 0;
    if (forced) {
        if (strlen(forced) >= buflen)
            return dr_fail(err, DRAMA_EINVAL, "backbone.prefix '%s' is too long", forced);
        snprintf(buf, buflen, "%s", forced);
        return DRAMA_OK;
    }
    static const char emb[] = "embed_tokens.weight", first[] = "layers.0.input_layernorm.weight";
    char found[1024] = "";
    int nfound = 0, nkept = 0;
    char list[700] = "";
    size_t used = 0;
    for (int64_t k = 0; k < c->count; k++) {
        const char *name = c->entries[k].t->name;
        if (!strncmp(name, "audio_decoder", 13) || !ends_with(name, emb)) continue;
        size_t plen = strlen(name) - (sizeof emb - 1);
        char probe[1024];
        if (plen + sizeof first > sizeof probe) continue;
        memcpy(probe, name, plen);
        memcpy(probe + plen, first, sizeof first);
        int kept = dr_ckpt_find(c, probe) != NULL;
        if (used < sizeof list - 1) {
            int w = snprintf(list + used, sizeof list - used, "%s'%.*s'%s", nfound ? ", " : "", (int)plen, name,
                             kept ? "" : " (no layers.0.input_layernorm.weight)");
            if (w > 0) used = used + (size_t)w < sizeof list ? used + (size_t)w : sizeof list - 1;
        }
        nfound++;
        if (kept) {
            if (nkept == 0) snprintf(found, sizeof found, "%.*s", (int)plen, name);
            nkept++;
        }
    }
    if (nkept != 1)
        return dr_fail(err, DRAMA_ESHAPE,
                       "%s: cannot detect the backbone prefix: %d candidate%s with embed_tokens.weight and "
                       "layers.0.input_layernorm.weight (exactly one needed; set switch backbone.prefix)%s%s",
                       c->dir, nkept, nkept == 1 ? "" : "s", nfound ? ": " : "", list);
    if (strlen(found) >= buflen)
        return dr_fail(err, DRAMA_EINVAL, "%s: backbone prefix '%s' does not fit the buffer", c->dir, found);
    snprintf(buf, buflen, "%s", found);
    return DRAMA_OK;
}
