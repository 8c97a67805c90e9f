/* sha256.h - SHA-256 of memory and of files (OpenSSL EVP, streamed in 1 MiB blocks so memory
 * stays bounded for 38 GB checkpoints), and a digest cache keyed by (absolute path, size,
 * modification time, inode) so repeat verifications do not rehash (FORMATS.md section 7 rule 4). */
#ifndef DRAMA_BASE_SHA256_H
#define DRAMA_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/progress.h"

/* Lowercase hex digest of n bytes. */
void dr_sha256_hex(const void *data, size_t n, char hex[65]);

/* Digest of a whole file; *size (may be NULL) gets the bytes hashed. Hashed bytes are added to
 * `progress` (may be NULL). Symbolic links are followed. */
drama_status dr_sha256_file(const char *path, char hex[65], uint64_t *size, dr_progress *progress,
                            drama_error *err);

/* Same, through a cache file (JSON) at cache_path: an entry is used only when the file's size,
 * mtime (ns) and inode still match; otherwise the file is hashed and the entry rewritten (temp +
 * rename). cache_path NULL hashes without a cache. A cache that cannot be read or written is
 * ignored (never an error). *from_cache (may be NULL) says whether the digest came from it. */
drama_status dr_sha256_file_cached(const char *path, const char *cache_path, char hex[65], int *from_cache,
                                   dr_progress *progress, drama_error *err);

/* Records a digest computed elsewhere (e.g. while a download streamed through it) for path as it
 * is now, so the next verification does not rehash it. Best effort, like the cache itself. */
void dr_sha256_cache_put(const char *cache_path, const char *path, const char hex[65]);

/* Default cache file: $DRAMA_CACHE_DIR, else $XDG_CACHE_HOME/drama, else $HOME/.cache/drama, plus
 * "/verified-sha256.json". Returns 0 (buf empty) when none of them is set. Does not create it. */
int dr_sha256_default_cache(char *buf, size_t buflen);

/* 1 when s is exactly 64 lowercase hex digits. */
int dr_sha256_is_hex(const char *s);

#endif
