/* value.c - request bodies (JSON, msgpack, form fields) into one dr_val tree; field readers. */
#include "serve/value.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <msgpack.h>

static void val_free_inner(dr_val *v) {
    if (!v) return;
    free(v->s);
    if (v->type == DR_VAL_ARRAY || v->type == DR_VAL_MAP) {
        for (size_t k = 0; k < v->len; k++) {
            val_free_inner(&v->items[k]);
            if (v->keys) free(v->keys[k]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
}

void dr_val_free(dr_val *v) {
    val_free_inner(v);
    free(v);
}

const char *dr_val_type_name(dr_val_type t) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "binary", "array", "object"};
    return names[t];
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Members are allocated once with their final count, so no resizing (a map built field by field
 * from a form grows by one). Duplicate keys are refused by the callers before adding. */
static int alloc_members(dr_val *v, size_t n, int map) {
    v->len = 0;
    if (!n) return 0;
    v->items = calloc(n, sizeof *v->items);
    if (map) {
        v->keys = calloc(n, sizeof *v->keys);
        v->key_lens = calloc(n, sizeof *v->key_lens);
    }
    return (!v->items || (map && (!v->keys || !v->key_lens))) ? -1 : 0;
}

static int has_key(const dr_val *map, const char *key, size_t klen) {
    for (size_t k = 0; k < map->len; k++)
        if (map->key_lens[k] == klen && !memcmp(map->keys[k], key, klen)) return 1;
    return 0;
}

/* ---- JSON ---- */

static int from_json(const json_t *j, dr_val *v, int depth, dr_api_error *e) {
    if (depth > DR_VAL_MAX_DEPTH)
        return dr_api_fail(e, 400, "invalid_json", NULL, "body nests deeper than %d levels", DR_VAL_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: v->type = DR_VAL_NULL; return 0;
    case JSON_TRUE: v->type = DR_VAL_BOOL; v->b = 1; return 0;
    case JSON_FALSE: v->type = DR_VAL_BOOL; v->b = 0; return 0;
    case JSON_INTEGER: v->type = DR_VAL_INT; v->i = json_integer_value(j); return 0;
    case JSON_REAL: v->type = DR_VAL_REAL; v->r = json_real_value(j); return 0;
    case JSON_STRING:
        v->type = DR_VAL_STR;
        v->len = json_string_length(j);
        v->s = dup_bytes(json_string_value(j), v->len);
        return v->s ? 0 : dr_api_fail(e, 500, "internal", NULL, "out of memory");
    case JSON_ARRAY: {
        v->type = DR_VAL_ARRAY;
        size_t n = json_array_size(j);
        if (alloc_members(v, n, 0)) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
        for (size_t k = 0; k < n; k++) {
            v->len = k + 1;
            if (from_json(json_array_get(j, k), &v->items[k], depth + 1, e)) return e->status;
        }
        return 0;
    }
    case JSON_OBJECT: {
        v->type = DR_VAL_MAP;
        if (alloc_members(v, json_object_size(j), 1)) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            size_t k = v->len++;
            v->key_lens[k] = strlen(key);
            v->keys[k] = dup_bytes(key, v->key_lens[k]);
            if (!v->keys[k]) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
            if (from_json(val, &v->items[k], depth + 1, e)) return e->status;
        }
        return 0;
    }
    }
    return dr_api_fail(e, 400, "invalid_json", NULL, "unexpected JSON value");
}

dr_val *dr_val_parse_json(const void *data, size_t n, dr_api_error *e) {
    json_error_t je;
    /* jansson refuses NaN/Infinity literals, invalid UTF-8 and NUL bytes in strings itself; its
     * own depth bound (2048) keeps its recursion small; ours (32) is checked on the tree. */
    json_t *j = json_loadb(data, n, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        dr_api_fail(e, 400, "invalid_json", NULL, "body is not valid JSON: %s (line %d, column %d, byte %d)",
                    je.text, je.line, je.column, je.position);
        return NULL;
    }
    dr_val *v = calloc(1, sizeof *v);
    if (!v) {
        json_decref(j);
        dr_api_fail(e, 500, "internal", NULL, "out of memory");
        return NULL;
    }
    int rc = from_json(j, v, 1, e);
    json_decref(j);
    if (rc) {
        dr_val_free(v);
        return NULL;
    }
    return v;
}

/* ---- msgpack ----
 * msgpack-c allocates an array's or map's members for the count its header states before
 * reading them, so a 5-byte header could ask for 96 GiB. This walk checks every count against
 * the bytes left (each member takes at least one) and the depth, before msgpack-c runs. */
static uint64_t be_read(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int k = 0; k < n; k++) x = x << 8 | p[k];
    return x;
}

static int mp_scan(const uint8_t *p, size_t n, size_t *off, int depth, dr_api_error *e) {
    if (depth > DR_VAL_MAX_DEPTH)
        return dr_api_fail(e, 400, "invalid_msgpack", NULL, "body nests deeper than %d levels", DR_VAL_MAX_DEPTH);
    if (*off >= n) return dr_api_fail(e, 400, "invalid_msgpack", NULL, "body ends early at byte %zu", *off);
    size_t at = *off;
    uint8_t b = p[(*off)++];
    uint64_t skip = 0, members = 0;
    int len_bytes = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        return 0;
    } else if (b <= 0x8f) {
        members = 2 * (uint64_t)(b & 0x0f);
    } else if (b <= 0x9f) {
        members = b & 0x0f;
    } else if (b <= 0xbf) {
        skip = b & 0x1f;
    } else if (b == 0xc4 || b == 0xd9) {
        len_bytes = 1;
    } else if (b == 0xc5 || b == 0xda) {
        len_bytes = 2;
    } else if (b == 0xc6 || b == 0xdb) {
        len_bytes = 4;
    } else if (b >= 0xc7 && b <= 0xc9) {
        len_bytes = 1 << (b - 0xc7);
        skip = 1;
    } else if (b == 0xca) {
        skip = 4;
    } else if (b == 0xcb) {
        skip = 8;
    } else if (b >= 0xcc && b <= 0xcf) {
        skip = (uint64_t)1 << (b - 0xcc);
    } else if (b >= 0xd0 && b <= 0xd3) {
        skip = (uint64_t)1 << (b - 0xd0);
    } else if (b >= 0xd4 && b <= 0xd8) {
        skip = 1 + ((uint64_t)1 << (b - 0xd4));
    } else if (b == 0xdc || b == 0xdd || b == 0xde || b == 0xdf) {
        int lb = (b == 0xdc || b == 0xde) ? 2 : 4;
        if (n - *off < (size_t)lb) return dr_api_fail(e, 400, "invalid_msgpack", NULL, "body ends early at byte %zu", at);
        members = be_read(p + *off, lb) * (b >= 0xde ? 2 : 1);
        *off += lb;
    } else {
        return dr_api_fail(e, 400, "invalid_msgpack", NULL, "invalid type byte 0x%02x at byte %zu", b, at);
    }
    if (len_bytes) {
        if (n - *off < (size_t)len_bytes)
            return dr_api_fail(e, 400, "invalid_msgpack", NULL, "body ends early at byte %zu", at);
        skip += be_read(p + *off, len_bytes);
        *off += len_bytes;
    }
    if (skip > n - *off || members > n - *off)
        return dr_api_fail(e, 400, "invalid_msgpack", NULL, "value at byte %zu is longer than the body", at);
    *off += skip;
    for (uint64_t k = 0; k < members; k++)
        if (mp_scan(p, n, off, depth + 1, e)) return e->status;
    return 0;
}

static int from_msgpack(const msgpack_object *o, dr_val *v, dr_api_error *e) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: v->type = DR_VAL_NULL; return 0;
    case MSGPACK_OBJECT_BOOLEAN: v->type = DR_VAL_BOOL; v->b = o->via.boolean; return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        v->type = DR_VAL_INT;
        v->i = (int64_t)o->via.u64;
        v->is_u64 = o->via.u64 > (uint64_t)INT64_MAX;
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: v->type = DR_VAL_INT; v->i = o->via.i64; return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: v->type = DR_VAL_REAL; v->r = o->via.f64; return 0;
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN:
        v->type = o->type == MSGPACK_OBJECT_STR ? DR_VAL_STR : DR_VAL_BIN;
        v->len = o->type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
        v->s = dup_bytes(o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr, v->len);
        return v->s ? 0 : dr_api_fail(e, 500, "internal", NULL, "out of memory");
    case MSGPACK_OBJECT_ARRAY:
        v->type = DR_VAL_ARRAY;
        if (alloc_members(v, o->via.array.size, 0)) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
        for (uint32_t k = 0; k < o->via.array.size; k++) {
            v->len = k + 1;
            if (from_msgpack(&o->via.array.ptr[k], &v->items[k], e)) return e->status;
        }
        return 0;
    case MSGPACK_OBJECT_MAP:
        v->type = DR_VAL_MAP;
        if (alloc_members(v, o->via.map.size, 1)) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
        for (uint32_t k = 0; k < o->via.map.size; k++) {
            const msgpack_object *key = &o->via.map.ptr[k].key;
            if (key->type != MSGPACK_OBJECT_STR)
                return dr_api_fail(e, 400, "invalid_msgpack", NULL, "map key %u is not a string", k);
            if (has_key(v, key->via.str.ptr, key->via.str.size))
                return dr_api_fail(e, 400, "invalid_msgpack", NULL, "duplicate key '%.*s'",
                                   (int)(key->via.str.size > 64 ? 64 : key->via.str.size), key->via.str.ptr);
            v->len = k + 1;
            v->key_lens[k] = key->via.str.size;
            v->keys[k] = dup_bytes(key->via.str.ptr, key->via.str.size);
            if (!v->keys[k]) return dr_api_fail(e, 500, "internal", NULL, "out of memory");
            if (from_msgpack(&o->via.map.ptr[k].val, &v->items[k], e)) return e->status;
        }
        return 0;
    default:
        return dr_api_fail(e, 400, "invalid_msgpack", NULL, "extension types are not accepted");
    }
}

dr_val *dr_val_parse_msgpack(const void *data, size_t n, dr_api_error *e) {
    size_t end = 0;
    if (mp_scan(data, n, &end, 1, e)) return NULL;
    if (end != n) {
        dr_api_fail(e, 400, "invalid_msgpack", NULL, "trailing bytes after the value (byte %zu of %zu)", end, n);
        return NULL;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&up, data, n, &off);
    dr_val *v = NULL;
    if (r != MSGPACK_UNPACK_SUCCESS || off != n) {
        dr_api_fail(e, 400, "invalid_msgpack", NULL, "body is not valid msgpack (%s)",
                    r == MSGPACK_UNPACK_NOMEM_ERROR ? "too large" : "parse error");
    } else if (!(v = calloc(1, sizeof *v))) {
        dr_api_fail(e, 500, "internal", NULL, "out of memory");
    } else if (from_msgpack(&up.data, v, e)) {
        dr_val_free(v);
        v = NULL;
    }
    msgpack_unpacked_destroy(&up);
    return v;
}

/* ---- maps built by hand (multipart forms) ---- */

dr_val *dr_val_new_map(void) {
    dr_val *v = calloc(1, sizeof *v);
    if (v) v->type = DR_VAL_MAP;
    return v;
}

int dr_val_map_add_bytes(dr_val *map, const char *key, dr_val_type type, char *bytes, size_t len) {
    size_t klen = strlen(key);
    if (has_key(map, key, klen)) return -1;
    size_t n = map->len + 1;
    dr_val *items = realloc(map->items, n * sizeof *items);
    if (items) map->items = items;
    char **keys = realloc(map->keys, n * sizeof *keys);
    if (keys) map->keys = keys;
    size_t *lens = realloc(map->key_lens, n * sizeof *lens);
    if (lens) map->key_lens = lens;
    char *kcopy = dup_bytes(key, klen);
    if (!items || !keys || !lens || !kcopy) {
        free(kcopy);
        return -1;
    }
    memset(&map->items[map->len], 0, sizeof *items);
    map->items[map->len].type = type;
    map->items[map->len].s = bytes;
    map->items[map->len].len = len;
    map->keys[map->len] = kcopy;
    map->key_lens[map->len] = klen;
    map->len = n;
    return 0;
}

const dr_val *dr_val_get(const dr_val *map, const char *key) {
    if (!map || map->type != DR_VAL_MAP) return NULL;
    size_t klen = strlen(key);
    for (size_t k = 0; k < map->len; k++)
        if (map->key_lens[k] == klen && !memcmp(map->keys[k], key, klen)) return &map->items[k];
    return NULL;
}

/* ---- field readers ---- */

static const dr_val *present(const dr_val *map, const char *key) {
    const dr_val *v = dr_val_get(map, key);
    return (v && v->type != DR_VAL_NULL) ? v : NULL;
}

static int wrong_type(const char *param, const char *want, const dr_val *v, dr_api_error *e) {
    return dr_api_fail(e, 400, "wrong_type", param, "%s must be %s, got %s", param, want, dr_val_type_name(v->type));
}

int dr_field_string(const dr_val *map, const char *key, const char *param, const char **out, size_t *len,
                    int required, dr_api_error *e) {
    const dr_val *v = present(map, key);
    if (!v) return required ? dr_api_fail(e, 400, "missing_field", param, "%s is required", param) : 0;
    if (v->type != DR_VAL_STR) return wrong_type(param, "a string", v, e);
    *out = v->s;
    if (len) *len = v->len;
    return 0;
}

int dr_field_bool(const dr_val *map, const char *key, const char *param, int *out, dr_api_error *e) {
    const dr_val *v = present(map, key);
    if (!v) return 0;
    if (v->type != DR_VAL_BOOL) return wrong_type(param, "a boolean", v, e);
    *out = v->b;
    return 0;
}

int dr_field_number(const dr_val *map, const char *key, const char *param, double lo, int lo_open, double hi,
                    double *out, int *given, dr_api_error *e) {
    const dr_val *v = present(map, key);
    if (!v) return 0;
    double x;
    if (v->type == DR_VAL_INT) x = v->is_u64 ? (double)(uint64_t)v->i : (double)v->i;
    else if (v->type == DR_VAL_REAL) x = v->r;
    else return wrong_type(param, "a number", v, e);
    if (!isfinite(x)) return dr_api_fail(e, 400, "invalid_number", param, "%s must be finite, got %g", param, x);
    if (x < lo || (lo_open && x == lo) || x > hi)
        return dr_api_fail(e, 400, "out_of_range", param, "%s must be within %c%g, %g], got %g", param,
                           lo_open ? '(' : '[', lo, hi, x);
    *out = x;
    if (given) *given = 1;
    return 0;
}

int dr_field_int(const dr_val *map, const char *key, const char *param, int64_t lo, int64_t hi, int64_t *out,
                 int *given, dr_api_error *e) {
    const dr_val *v = present(map, key);
    if (!v) return 0;
    int64_t x;
    if (v->type == DR_VAL_INT) {
        if (v->is_u64)
            return dr_api_fail(e, 400, "out_of_range", param, "%s must be within [%" PRId64 ", %" PRId64 "], got %" PRIu64,
                               param, lo, hi, (uint64_t)v->i);
        x = v->i;
    } else if (v->type == DR_VAL_REAL) {
        if (!isfinite(v->r)) return dr_api_fail(e, 400, "invalid_number", param, "%s must be finite", param);
        if (v->r != floor(v->r)) return dr_api_fail(e, 400, "wrong_type", param, "%s must be an integer, got %g", param, v->r);
        if (v->r < (double)lo || v->r > (double)hi)
            return dr_api_fail(e, 400, "out_of_range", param, "%s must be within [%" PRId64 ", %" PRId64 "], got %g",
                               param, lo, hi, v->r);
        x = (int64_t)v->r;
    } else {
        return wrong_type(param, "an integer", v, e);
    }
    if (x < lo || x > hi)
        return dr_api_fail(e, 400, "out_of_range", param, "%s must be within [%" PRId64 ", %" PRId64 "], got %" PRId64,
                           param, lo, hi, x);
    *out = x;
    if (given) *given = 1;
    return 0;
}

int dr_field_seed(const dr_val *map, const char *key, const char *param, uint64_t *out, int *given,
                  dr_api_error *e) {
    const dr_val *v = present(map, key);
    if (!v) return 0;
    if (v->type == DR_VAL_REAL) {
        /* an integral number is an integer (API.md 1); beyond 2^63 a double cannot be exact */
        if (!isfinite(v->r)) return dr_api_fail(e, 400, "invalid_number", param, "%s must be finite", param);
        if (v->r != floor(v->r)) return dr_api_fail(e, 400, "wrong_type", param, "%s must be an integer, got %g", param, v->r);
        if (v->r < -9223372036854775808.0 || v->r >= 9223372036854775808.0)
            return dr_api_fail(e, 400, "out_of_range", param, "%s must be a 64-bit integer, got %g", param, v->r);
        *out = (uint64_t)(int64_t)v->r;
    } else if (v->type == DR_VAL_INT) {
        *out = (uint64_t)v->i;
    } else {
        return wrong_type(param, "an integer", v, e);
    }
    if (given) *given = 1;
    return 0;
}
