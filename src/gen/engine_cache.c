/* engine_cache.c - the voice prompt cache: generation sessions snapshotted right after a voice
 * prefix, keyed by the prefix rows themselves (conditional, and unconditional when guided), LRU
 * bounded by bytes. The key is content: a voice deleted and recreated with other audio has other
 * rows and never meets a stale entry. A SHA-256 of the rows finds candidates; the rows are then
 * compared in full, so a hash collision cannot hand out a wrong state. */
#include <stdlib.h>
#include <string.h>

#include "base/sha256.h"
#include "gen/engine_internal.h"

typedef struct pc_entry {
    char hash[65];
    int32_t *rows;           /* cond rows then uncond rows */
    int64_t nc, nu;
    int W;
    dr_gen_session *snap;
    int64_t bytes;
    struct pc_entry *prev, *next; /* prev = more recently used */
} pc_entry;

struct dr_pcache {
    int64_t max_bytes, bytes, entries;
    pc_entry *head, *tail;   /* head = most recently used */
};

dr_pcache *dr_pcache_create(int64_t max_bytes) {
    dr_pcache *c = calloc(1, sizeof *c);
    if (c) c->max_bytes = max_bytes;
    return c;
}

static void unlink_entry(dr_pcache *c, pc_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(dr_pcache *c, pc_entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static void free_entry(pc_entry *e) {
    dr_gen_session_free(e->snap);
    free(e->rows);
    free(e);
}

int dr_pcache_evict_one(dr_pcache *c) {
    if (!c || !c->tail) return 0;
    pc_entry *e = c->tail;
    unlink_entry(c, e);
    c->bytes -= e->bytes;
    c->entries--;
    free_entry(e);
    return 1;
}

void dr_pcache_free(dr_pcache *c) {
    if (!c) return;
    while (dr_pcache_evict_one(c)) {
    }
    free(c);
}

/* SHA-256 over (counts, width, rows): two keys with the same rows but another split differ. */
static void key_hash(const int32_t *cond, int64_t nc, const int32_t *uncond, int64_t nu, int W, char hex[65],
                     int32_t **joined) {
    size_t n = (size_t)(nc + nu) * (size_t)W;
    int32_t *buf = malloc((n + 6) * sizeof *buf);
    *joined = NULL;
    if (!buf) {
        hex[0] = 0;
        return;
    }
    int64_t head[3] = {nc, nu, W};
    memcpy(buf, head, sizeof head);
    memcpy(buf + 6, cond, (size_t)nc * W * sizeof *buf);
    if (nu) memcpy(buf + 6 + (size_t)nc * W, uncond, (size_t)nu * W * sizeof *buf);
    dr_sha256_hex(buf, (n + 6) * sizeof *buf, hex);
    *joined = buf;
}

static pc_entry *find(dr_pcache *c, const char *hex, const int32_t *joined, int64_t nc, int64_t nu, int W) {
    for (pc_entry *e = c->head; e; e = e->next)
        if (e->nc == nc && e->nu == nu && e->W == W && !strcmp(e->hash, hex) &&
            !memcmp(e->rows, joined + 6, (size_t)(nc + nu) * W * sizeof(int32_t)))
            return e;
    return NULL;
}

const dr_gen_session *dr_pcache_get(dr_pcache *c, const int32_t *cond, int64_t nc, const int32_t *uncond, int64_t nu,
                                    int W) {
    if (!c || !c->head) return NULL;
    char hex[65];
    int32_t *joined;
    key_hash(cond, nc, uncond, nu, W, hex, &joined);
    pc_entry *e = joined ? find(c, hex, joined, nc, nu, W) : NULL;
    free(joined);
    if (!e) return NULL;
    unlink_entry(c, e);
    push_front(c, e);
    return e->snap;
}

int dr_pcache_put(dr_pcache *c, const int32_t *cond, int64_t nc, const int32_t *uncond, int64_t nu, int W,
                  dr_gen_session *snap, int64_t bytes) {
    if (!c || bytes > c->max_bytes) {
        dr_gen_session_free(snap);
        return 0;
    }
    char hex[65];
    int32_t *joined;
    key_hash(cond, nc, uncond, nu, W, hex, &joined);
    pc_entry *e = joined ? calloc(1, sizeof *e) : NULL;
    if (!e || find(c, hex, joined, nc, nu, W)) { /* out of memory, or already there: keep the old one */
        free(e);
        free(joined);
        dr_gen_session_free(snap);
        return 0;
    }
    while (c->bytes + bytes > c->max_bytes && dr_pcache_evict_one(c)) {
    }
    memmove(joined, joined + 6, (size_t)(nc + nu) * W * sizeof *joined); /* keep the rows only */
    memcpy(e->hash, hex, sizeof e->hash);
    e->rows = joined;
    e->nc = nc;
    e->nu = nu;
    e->W = W;
    e->snap = snap;
    e->bytes = bytes;
    push_front(c, e);
    c->bytes += bytes;
    c->entries++;
    return 1;
}

int64_t dr_pcache_bytes(const dr_pcache *c) { return c ? c->bytes : 0; }
int64_t dr_pcache_entries(const dr_pcache *c) { return c ? c->entries : 0; }
int64_t dr_pcache_max_bytes(const dr_pcache *c) { return c ? c->max_bytes : 0; }
