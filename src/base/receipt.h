/* receipt.h - what a run records about itself: clocks, resident memory, file hashes (cached by
 * size + mtime so a repeat run does not rehash a 38 GB model), and writing the JSON receipt
 * through a temporary file + rename. */
#ifndef DRAMA_BASE_RECEIPT_H
#define DRAMA_BASE_RECEIPT_H

#include <jansson.h>
#include <stdint.h>

#include "base/error.h"

/* Monotonic seconds (CLOCK_MONOTONIC). */
double dr_clock_s(void);

/* Resident set now (VmRSS), in bytes; -1 when unknown. */
int64_t dr_mem_rss_bytes(void);
int64_t dr_mem_rss_file_bytes(void); /* resident file-backed pages (RssFile); -1 when unknown */
/* Peak resident set since the last dr_mem_peak_reset (VmHWM; falls back to getrusage's
 * process-lifetime maximum when the peak cannot be reset); -1 when unknown. */
int64_t dr_mem_peak_bytes(void);
/* Starts a new peak window (Linux: writes "5" to /proc/self/clear_refs). Returns 1 when the
 * reset worked, 0 when peaks are process-lifetime. */
int dr_mem_peak_reset(void);

/* SHA-256 of a file, lowercase hex. */
drama_status dr_sha256_file_hex(const char *path, char hex[65], drama_error *err);

/* Same, through base/sha256.h's cache (dr_sha256_default_cache: entries keyed by path, size,
 * mtime and inode). *cached says whether the hash came from it. A cache that cannot be read or
 * written is ignored (the hash is computed). */
drama_status dr_sha256_file_cached_hex(const char *path, char hex[65], int *cached, drama_error *err);

/* Every regular file directly in dir (sorted by name; symlinks followed), as a JSON array of
 * {"file", "bytes", "sha256", "cached"}. */
drama_status dr_receipt_dir_files(const char *dir, json_t **out, drama_error *err);

/* Writes JSON (indented, sorted as built) to path through "<path>.tmp.<pid>" + rename;
 * "-" writes to stderr. */
drama_status dr_receipt_write(const char *path, const json_t *receipt, drama_error *err);

#endif
