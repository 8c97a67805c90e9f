/* refcache.c - reference codes by content hash, LRU (a doubly linked list, most recent first). */
#include "serve/refcache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "base/sha256.h"

typedef struct entry {
    char key[65];
    int32_t *codes;
    int64_t n_frames, n_codes, bytes;
    double duration_s;
    struct entry *prev, *next;
} entry;

struct dr_refcache {
    pthread_mutex_t mu;
    entry *head, *tail;
    int64_t bytes, max_bytes;
};

dr_refcache *dr_refcache_create(int64_t max_bytes) {
    dr_refcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->max_bytes = max_bytes;
    return c;
}

void dr_refcache_free(dr_refcache *c) {
    if (!c) return;
    for (entry *e = c->head, *n; e; e = n) {
        n = e->next;
        free(e->codes);
        free(e);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void dr_refcache_key(const void *audio, size_t n, const char *fingerprint, char key[65]) {
    char audio_hex[65];
    dr_sha256_hex(audio, n, audio_hex);
    char both[65 + 1 + 65];
    size_t len = (size_t)snprintf(both, sizeof both, "%s:%s", audio_hex, fingerprint ? fingerprint : "");
    dr_sha256_hex(both, len, key);
}

static void unlink_entry(dr_refcache *c, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(dr_refcache *c, entry *e) {
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

int dr_refcache_get(dr_refcache *c, const char *key, int32_t **codes, int64_t *n_frames, double *duration_s) {
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    for (entry *e = c->head; e; e = e->next) {
        if (strcmp(e->key, key)) continue;
        int32_t *copy = malloc((size_t)(e->n_codes ? e->n_codes : 1) * sizeof *copy);
        if (copy) {
            memcpy(copy, e->codes, (size_t)e->n_codes * sizeof *copy);
            *codes = copy;
            *n_frames = e->n_frames;
            *duration_s = e->duration_s;
            unlink_entry(c, e);
            push_front(c, e);
            hit = 1;
        }
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

void dr_refcache_put(dr_refcache *c, const char *key, const int32_t *codes, int64_t n_frames, int n_codebooks,
                     double duration_s) {
    int64_t n_codes = n_frames * n_codebooks, bytes = n_codes * (int64_t)sizeof(int32_t) + (int64_t)sizeof(entry);
    if (bytes > c->max_bytes || n_codes <= 0) return;
    entry *e = calloc(1, sizeof *e);
    int32_t *copy = malloc((size_t)n_codes * sizeof *copy);
    if (!e || !copy) {
        free(e);
        free(copy);
        return;
    }
    memcpy(copy, codes, (size_t)n_codes * sizeof *copy);
    memcpy(e->key, key, 65);
    e->codes = copy;
    e->n_frames = n_frames;
    e->n_codes = n_codes;
    e->bytes = bytes;
    e->duration_s = duration_s;
    pthread_mutex_lock(&c->mu);
    int dup = 0;
    for (entry *x = c->head; x && !dup; x = x->next) dup = !strcmp(x->key, key);
    if (dup) {
        pthread_mutex_unlock(&c->mu);
        free(copy);
        free(e);
        return;
    }
    while (c->tail && c->bytes + bytes > c->max_bytes) {
        entry *old = c->tail;
        unlink_entry(c, old);
        c->bytes -= old->bytes;
        free(old->codes);
        free(old);
    }
    push_front(c, e);
    c->bytes += bytes;
    pthread_mutex_unlock(&c->mu);
}

int64_t dr_refcache_bytes(dr_refcache *c) {
    pthread_mutex_lock(&c->mu);
    int64_t b = c->bytes;
    pthread_mutex_unlock(&c->mu);
    return b;
}
