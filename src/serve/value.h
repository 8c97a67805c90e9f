/* value.h - one tree for request bodies, whatever their encoding: JSON (jansson, strict),
 * msgpack (msgpack-c) and multipart form fields all become a dr_val, so every request is
 * validated by one set of field readers that name the field at fault (API.md 1, 7).
 *
 * Strictness (API.md 1): duplicate keys, NaN/Infinity literals and nesting over 32 levels are
 * parse errors; map keys must be strings; msgpack floats may be NaN/Inf (reported per field as
 * invalid_number by the readers). The tree owns all its bytes; free with dr_val_free. */
#ifndef DRAMA_SERVE_VALUE_H
#define DRAMA_SERVE_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "serve/api_error.h"

#define DR_VAL_MAX_DEPTH 32

typedef enum { DR_VAL_NULL, DR_VAL_BOOL, DR_VAL_INT, DR_VAL_REAL, DR_VAL_STR, DR_VAL_BIN, DR_VAL_ARRAY, DR_VAL_MAP } dr_val_type;

typedef struct dr_val dr_val;
struct dr_val {
    dr_val_type type;
    int b;              /* BOOL */
    int64_t i;          /* INT (two's complement bits when is_u64) */
    int is_u64;         /* INT above INT64_MAX (msgpack uint64) */
    double r;           /* REAL */
    char *s;            /* STR / BIN bytes, NUL-terminated (not counted) */
    size_t len;         /* STR / BIN length; ARRAY / MAP element count */
    char **keys;        /* MAP keys (NUL-terminated, key_lens bytes) */
    size_t *key_lens;
    dr_val *items;      /* ARRAY elements / MAP values */
};

/* Parse a body; on failure e gets 400 invalid_json / invalid_msgpack naming the offset. */
dr_val *dr_val_parse_json(const void *data, size_t n, dr_api_error *e);
dr_val *dr_val_parse_msgpack(const void *data, size_t n, dr_api_error *e);
void dr_val_free(dr_val *v);

/* An empty map, and adding a member that takes ownership of `bytes` (multipart fields).
 * Returns 0, or -1 when the key is already there (duplicate field) or memory runs out. */
dr_val *dr_val_new_map(void);
int dr_val_map_add_bytes(dr_val *map, const char *key, dr_val_type type, char *bytes, size_t len);

/* Member of a map by key, or NULL. */
const dr_val *dr_val_get(const dr_val *map, const char *key);
const char *dr_val_type_name(dr_val_type t);

/* ---- Field readers: each fails with 400 (wrong_type, invalid_number, out_of_range) naming
 * `param`; an absent or null member leaves *out unchanged and returns 0 (the default holds).
 * They return 0 on success or when absent, the status on failure. ---- */
int dr_field_string(const dr_val *map, const char *key, const char *param, const char **out, size_t *len,
                    int required, dr_api_error *e);
int dr_field_bool(const dr_val *map, const char *key, const char *param, int *out, dr_api_error *e);
/* A number within [lo, hi] (lo_open: lo itself excluded); finite. */
int dr_field_number(const dr_val *map, const char *key, const char *param, double lo, int lo_open, double hi,
                    double *out, int *given, dr_api_error *e);
/* An integer (or a number with an integral value) within [lo, hi]. */
int dr_field_int(const dr_val *map, const char *key, const char *param, int64_t lo, int64_t hi, int64_t *out,
                 int *given, dr_api_error *e);
/* A 64-bit seed: any int64 or uint64 value (negative values keep their two's-complement bits). */
int dr_field_seed(const dr_val *map, const char *key, const char *param, uint64_t *out, int *given,
                  dr_api_error *e);

#endif
