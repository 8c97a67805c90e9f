/* json_matrix.c - dr_json_matrix_parse (see json_matrix.h). */
#include "io/json_matrix.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"

int32_t *dr_int_matrix_alloc(int64_t n_rows, int64_t n_cols) {
    size_t count;
    if (n_rows < 0 || n_cols < 0 || !dr_mul_size((size_t)n_rows, (size_t)n_cols, &count) || count > (size_t)1 << 40)
        return NULL;
    return calloc(count ? count : 1, sizeof(int32_t));
}

/* "codebook 3" or "token": what column c holds, for messages. */
static const char *column_name(const dr_json_matrix_spec *s, int64_t c, char *buf, size_t n) {
    if (s->token_column && c == 0) return "token";
    snprintf(buf, n, "codebook %lld", (long long)(c - (s->token_column ? 1 : 0)));
    return buf;
}

drama_status dr_json_matrix_parse(const char *json, size_t len, const char *label, const dr_json_matrix_spec *s,
                                  json_t **root_out, int32_t **data_out, int64_t *n_rows_out, int64_t *n_cols_out,
                                  drama_error *err) {
    *root_out = NULL;
    *data_out = NULL;
    *n_rows_out = *n_cols_out = 0;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d (byte %d): %s", label,
                       jerr.line, jerr.column, jerr.position, jerr.text);
    drama_status st = DRAMA_OK;
    int32_t *data = NULL;
    json_t *arrays = json_object_get(root, s->key);
    if (!json_is_object(root) || !json_is_array(arrays)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: expected an object with an array \"%s\" (one array of integers per %s)",
                     label, s->key, s->row_name);
        goto done;
    }
    int64_t n_rows = (int64_t)json_array_size(arrays);
    int64_t width = s->width;
    if (width <= 0) {
        json_t *first = json_array_get(arrays, 0);
        width = n_rows > 0 && json_is_array(first) ? (int64_t)json_array_size(first) : 0;
        if (n_rows > 0 && width < 1) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: %s[0]: expected a non-empty array of integers", label, s->key);
            goto done;
        }
    }
    if (width > 0) {
        if (!(data = dr_int_matrix_alloc(n_rows, width))) {
            st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory (%lld x %lld values)", label, (long long)n_rows,
                         (long long)width);
            goto done;
        }
    }
    for (int64_t r = 0; r < n_rows; r++) {
        json_t *row = json_array_get(arrays, (size_t)r);
        if (!json_is_array(row) || (int64_t)json_array_size(row) != width) {
            st = dr_fail(err, DRAMA_EFORMAT,
                         "%s: %s[%lld] (%s %lld): expected an array of %lld integers (%s%lld codes, one per codebook)", label, s->key, (long long)r, s->row_name, (long long)r, (long long)width,
                         s->token_column ? "a token + " : "", (long long)(width - (s->token_column ? 1 : 0)));
            goto done;
        }
        for (int64_t c = 0; c < width; c++) {
            json_t *v = json_array_get(row, (size_t)c);
            json_int_t bound = s->upper ? s->upper[c] : INT32_MAX + (json_int_t)1;
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= bound) {
                char name[48];
                st = dr_fail(err, DRAMA_EFORMAT, "%s: %s[%lld][%lld] (%s %lld %s): expected an integer in 0..%lld",
                             label, s->key, (long long)r, (long long)c, s->row_name, (long long)r,
                             column_name(s, c, name, sizeof name), (long long)(bound - 1));
                goto done;
            }
            data[r * width + c] = (int32_t)json_integer_value(v);
        }
    }
    *root_out = root;
    *data_out = data;
    *n_rows_out = n_rows;
    *n_cols_out = width;
    return DRAMA_OK;
done:
    free(data);
    json_decref(root);
    return st;
}
