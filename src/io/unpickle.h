/* unpickle.h - a restricted pickle interpreter for torch.save state dicts (CODEC.md section 10.2).
 *
 * A pickle can run arbitrary code in Python; this reader has no path to code execution. It
 * understands only the opcodes a plain state_dict of tensors needs and only a fixed list of
 * globals (collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the
 * torch *Storage types). Everything else is refused with an error naming the opcode or global and
 * its byte offset. The result is a tree of plain values; storages are not resolved here (the
 * torch-zip reader maps their keys to archive entries). Resource limits bound every table so a
 * hostile file becomes an error, never an exhaustion. */
#ifndef DRAMA_IO_UNPICKLE_H
#define DRAMA_IO_UNPICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"

typedef enum dr_pk_kind {
    DR_PK_NONE = 0,
    DR_PK_BOOL,
    DR_PK_INT,
    DR_PK_FLOAT,
    DR_PK_STR,
    DR_PK_TUPLE,
    DR_PK_LIST,
    DR_PK_DICT,    /* items hold key, value, key, value, ... (n = 2 * entries) */
    DR_PK_GLOBAL,  /* one of the allowed globals (glob) */
    DR_PK_STORAGE, /* a persistent id ('storage', type, key, location, numel) */
    DR_PK_TENSOR   /* _rebuild_tensor_v2(storage, offset, size, stride, ...) */
} dr_pk_kind;

typedef enum dr_pk_global {
    DR_PKG_ORDERED_DICT = 1,
    DR_PKG_REBUILD_TENSOR_V2,
    DR_PKG_REBUILD_PARAMETER,
    DR_PKG_STORAGE_TYPE /* dtype says which */
} dr_pk_global;

typedef struct dr_pk_value dr_pk_value;
struct dr_pk_value {
    dr_pk_kind kind;
    int64_t i;              /* BOOL, INT */
    double f;               /* FLOAT */
    char *s;                /* STR (NUL-terminated; no interior NUL), STORAGE key */
    size_t slen;
    dr_pk_value **items;    /* TUPLE, LIST, DICT */
    int64_t n, cap;
    dr_pk_global glob;      /* GLOBAL */
    dr_dtype dtype;         /* GLOBAL storage type, STORAGE, TENSOR */
    int64_t numel;          /* STORAGE: elements */
    const dr_pk_value *storage; /* TENSOR */
    int64_t offset;         /* TENSOR: storage offset in elements */
    int ndim;               /* TENSOR */
    int64_t shape[DR_MAX_DIMS], stride[DR_MAX_DIMS];
};

typedef struct dr_pk_limits {
    size_t max_pickle_bytes; /* 0: 256 MiB */
    int64_t max_values;      /* values created in total; 0: 16M */
    int64_t max_stack;       /* stack depth (incl. marks); 0: 1M */
    int64_t max_memo;        /* memo index bound; 0: 4M */
    size_t max_string;       /* bytes per string; 0: 1 MiB */
    int64_t max_tensors;     /* 0: 1M */
} dr_pk_limits;

typedef struct dr_pk dr_pk; /* owns every value of one load */

/* Interpret `data` (a pickle). `label` names it in messages ("codec.pth:codec/data.pkl").
 * On success *out owns the values and *root is the unpickled object. lim may be NULL. */
drama_status dr_pk_load(const uint8_t *data, size_t size, const char *label, const dr_pk_limits *lim,
                        dr_pk **out, const dr_pk_value **root, drama_error *err);
void dr_pk_free(dr_pk *pk);

/* DICT lookup by string key; NULL when absent or not a dict. */
const dr_pk_value *dr_pk_dict_get(const dr_pk_value *dict, const char *key);
const char *dr_pk_kind_name(dr_pk_kind k);

#endif
