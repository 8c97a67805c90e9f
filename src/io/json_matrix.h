/* json_matrix.h - the shared reader behind ROWS.json and CODES.json: an object whose member `key`
 * is an array of equal-length arrays of integers, each checked against a range. Internal to io. */
#ifndef DRAMA_IO_JSON_MATRIX_H
#define DRAMA_IO_JSON_MATRIX_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct dr_json_matrix_spec {
    const char *key;      /* the member holding the arrays: "rows", "codes" */
    const char *row_name; /* one inner array in messages: "row", "frame" */
    int token_column;     /* 1: column 0 is a text token, column c >= 1 codebook c - 1 (ROWS.json) */
    int64_t width;        /* > 0: every array has this length; 0: the length of the first one */
    const int32_t *upper; /* `width` exclusive bounds, one per column; NULL: 0..INT32_MAX */
} dr_json_matrix_spec;

/* A zeroed n_rows x n_cols int32 matrix (calloc'd, never NULL for an empty one); NULL when the
 * shape is negative, over 2^40 values, or memory runs out. Behind dr_rows_create and dr_codes_create. */
int32_t *dr_int_matrix_alloc(int64_t n_rows, int64_t n_cols);

/* Parse `json` (`label` names it in messages). On success *data holds n_rows * n_cols values,
 * row-major (calloc'd, free with free(); NULL when n_cols is 0: no rows and no width given), and
 * *root is the parsed document for the caller's other members (json_decref it). On failure
 * nothing is left allocated and the message names the label, the array and the column at fault. */
drama_status dr_json_matrix_parse(const char *json, size_t len, const char *label, const dr_json_matrix_spec *spec,
                                  json_t **root, int32_t **data, int64_t *n_rows, int64_t *n_cols, drama_error *err);

#endif
