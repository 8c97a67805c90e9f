/* codes_json.h - CODES.json, codec frames as written by `drama codec encode` / read by
 * `drama prompt --reference-codes` and `drama codec decode`:
 *
 *     {"codes": [[c0, c1, ..., c9], ...]}      one inner list per frame
 *
 * Validation: every frame has the same number of codebooks; every code is an integer in
 * 0 .. upper[k]-1 for codebook k (bounds passed by the caller, e.g. 4096 for the semantic
 * codebook, 1024 for the others). Errors name the file, the frame and the codebook. */
#ifndef DRAMA_IO_CODES_JSON_H
#define DRAMA_IO_CODES_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef struct dr_codes {
    int64_t n_frames;
    int64_t n_codebooks;
    int32_t *data; /* n_frames * n_codebooks, frame-major: data[f * n_codebooks + k] */
} dr_codes;

/* Allocate a zeroed matrix; n_frames may be 0, n_codebooks >= 1. */
drama_status dr_codes_create(dr_codes *out, int64_t n_frames, int64_t n_codebooks, drama_error *err);
void dr_codes_free(dr_codes *codes); /* accepts NULL and zeroed structs */

/* Parse CODES.json text. n_codebooks > 0 requires that many codes per frame; 0 takes the width
 * of the first frame. `upper` (may be NULL: only 0..INT32_MAX is checked) holds n_codebooks
 * exclusive upper bounds and then requires n_codebooks > 0. `label` names the source in messages. */
drama_status dr_codes_parse(const char *json, size_t len, const char *label, int64_t n_codebooks,
                            const int32_t *upper, dr_codes *out, drama_error *err);
/* Read and parse a file ("-" = stdin). */
drama_status dr_codes_read(const char *path, int64_t n_codebooks, const int32_t *upper, dr_codes *out,
                           drama_error *err);

/* Check an in-memory matrix against bounds (messages name the frame and codebook, as the parser's do; label names it). */
drama_status dr_codes_check(const dr_codes *codes, const int32_t *upper, const char *label, drama_error *err);

/* Write as CODES.json, one frame per line. */
drama_status dr_codes_write_stream(FILE *f, const dr_codes *codes, drama_error *err);
/* Write to `path` ("-" = stdout) through "<path>.tmp" + rename. */
drama_status dr_codes_write(const char *path, const dr_codes *codes, drama_error *err);

#endif
