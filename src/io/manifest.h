/* manifest.h - drama-manifest.json (FORMATS.md section 7): the files of a model directory with
 * size and SHA-256, checked before any of them is parsed. */
#ifndef DRAMA_IO_MANIFEST_H
#define DRAMA_IO_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DR_MANIFEST_NAME "drama-manifest.json"

typedef struct dr_manifest_file {
    char *path;       /* relative, '/'-separated, validated (no '..', no leading '/', no '\\') */
    uint64_t size;
    char sha256[65];  /* 64 lowercase hex digits */
} dr_manifest_file;

typedef struct dr_manifest {
    int64_t count;
    dr_manifest_file *files; /* in file order */
} dr_manifest;

/* Parse manifest text; `label` names it in messages. Checks format/version, every path rule,
 * duplicates, sizes and digests. */
drama_status dr_manifest_parse(const char *text, size_t len, const char *label, dr_manifest **out,
                               drama_error *err);
drama_status dr_manifest_load(const char *path, dr_manifest **out, drama_error *err);
void dr_manifest_free(dr_manifest *m);
const dr_manifest_file *dr_manifest_find(const dr_manifest *m, const char *rel_path);
/* 1 when rel_path obeys FORMATS.md 7 rule 1; otherwise 0 and *why says what is wrong. */
int dr_manifest_path_ok(const char *rel_path, const char **why);

/* One finding of a verification. kind: "ok", "missing", "size", "sha256". */
typedef struct dr_manifest_finding {
    const char *kind;
    const dr_manifest_file *file;
    uint64_t actual_size;     /* "size" */
    const char *actual_sha256;/* "sha256", and "ok" */
    int from_cache;           /* "ok"/"sha256": the digest came from the cache */
} dr_manifest_finding;
typedef void (*dr_manifest_report_fn)(const dr_manifest_finding *f, void *user);

/* Check every listed file under dir: existence, size first, then SHA-256 (cache_path NULL =
 * rehash everything; progress bar on a terminal). Every finding goes to `report` (may be NULL).
 * Any problem fails with DRAMA_EHASH naming the first bad file (expected and actual digest or
 * size) and the number of bad files; a read error is DRAMA_EIO. */
drama_status dr_manifest_verify(const dr_manifest *m, const char *dir, const char *cache_path,
                                dr_manifest_report_fn report, void *user, drama_error *err);

/* What a loader calls first (FORMATS.md 7 rule 2): when dir holds drama-manifest.json, verify every
 * listed file (default digest cache unless reverify) and return the manifest in *out (caller frees;
 * use dr_manifest_find to report files the load uses but the manifest lacks as "unverified");
 * without a manifest *out is NULL and the result is DRAMA_OK. */
drama_status dr_manifest_verify_dir(const char *dir, int reverify, dr_manifest **out, drama_error *err);

/* Write a manifest of the given files (relative to dir) to out_path (temp + rename). */
drama_status dr_manifest_write(const char *dir, const char *const *rel_paths, int64_t n, const char *out_path,
                               drama_error *err);

/* Same, from digests the caller already holds (e.g. checked while downloading): paths validated,
 * duplicates refused, sorted by path. */
drama_status dr_manifest_write_files(const dr_manifest_file *files, int64_t n, const char *out_path,
                                     drama_error *err);

#endif
