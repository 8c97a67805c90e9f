/* rows_json.h - ROWS.json, the prompt/row matrix exchanged by `drama prompt` and `drama forward`:
 *
 *     {"rows": [[token, c0, c1, ..., c9], ...], "prefill": K}
 *
 * Every row has the same width, 1 + number of codebooks (spec/TEXT.md section 3). The first K rows
 * are one prefill call, later rows one decode step each. Values are integers in 0..INT32_MAX.
 * "prefill" is optional on input (default: all rows); 0 <= K <= number of rows.
 * Errors name the file (or label), the row and the column at fault. */
#ifndef DRAMA_IO_ROWS_JSON_H
#define DRAMA_IO_ROWS_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef struct dr_rows {
    int64_t n_rows;   /* rows in the matrix */
    int64_t n_cols;   /* 1 + number of codebooks */
    int32_t *data;    /* n_rows * n_cols, row-major: data[r * n_cols + 0] is the token id */
    int64_t prefill;  /* the first `prefill` rows form one prefill call */
} dr_rows;

/* Allocate a zeroed n_rows x n_cols matrix (prefill = n_rows). n_rows may be 0; n_cols >= 1. */
drama_status dr_rows_create(dr_rows *out, int64_t n_rows, int64_t n_cols, drama_error *err);
/* Release data and zero the struct; accepts NULL and zeroed structs. */
void dr_rows_free(dr_rows *rows);

/* Parse ROWS.json text. `label` names the source in messages (a path, "stdin").
 * expect_cols > 0 requires that width (1 + codebooks); 0 accepts any width >= 1 (taken from
 * the first row; an empty matrix then has n_cols = 0). */
drama_status dr_rows_parse(const char *json, size_t len, const char *label, int64_t expect_cols,
                           dr_rows *out, drama_error *err);
/* Read and parse a file ("-" = stdin). */
drama_status dr_rows_read(const char *path, int64_t expect_cols, dr_rows *out, drama_error *err);

/* Write as ROWS.json, one row per line. */
drama_status dr_rows_write_stream(FILE *f, const dr_rows *rows, drama_error *err);
/* Write to `path` ("-" = stdout) through "<path>.tmp" + rename, so a failure leaves no file. */
drama_status dr_rows_write(const char *path, const dr_rows *rows, drama_error *err);

/* Write a file ("-" = stdout) through "<path>.tmp" + rename, so a failure leaves no file (a stale
 * temporary or a link planted at that name is removed first, never written through):
 * `write` puts the content on the stream. Shared by the small JSON writers (ROWS.json, CODES.json). */
typedef drama_status (*dr_io_writer)(FILE *f, const void *ctx, drama_error *err);
drama_status dr_io_write_file(const char *path, dr_io_writer write, const void *ctx, drama_error *err);

#endif
