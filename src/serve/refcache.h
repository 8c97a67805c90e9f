/* refcache.h - codes of reference audio by content (CODEC.md 7): the key is the SHA-256 of the
 * audio bytes together with the codec fingerprint, so the same inline reference is encoded once
 * and a codec change never reuses stale codes. LRU, bounded by bytes. Thread-safe: connection
 * threads look up and insert concurrently (two threads may encode the same clip at once; the
 * second insert is dropped). */
#ifndef DRAMA_SERVE_REFCACHE_H
#define DRAMA_SERVE_REFCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dr_refcache dr_refcache;

dr_refcache *dr_refcache_create(int64_t max_bytes);
void dr_refcache_free(dr_refcache *c);
/* Key of audio bytes under a fingerprint (64 hex digits + NUL). */
void dr_refcache_key(const void *audio, size_t n, const char *fingerprint, char key[65]);
/* Copies the cached codes into a malloc'd array; returns 1 on a hit, 0 on a miss. */
int dr_refcache_get(dr_refcache *c, const char *key, int32_t **codes, int64_t *n_frames, double *duration_s);
/* Stores a copy (dropped when it alone exceeds the bound or memory runs out). */
void dr_refcache_put(dr_refcache *c, const char *key, const int32_t *codes, int64_t n_frames, int n_codebooks,
                     double duration_s);
int64_t dr_refcache_bytes(dr_refcache *c);

#endif
