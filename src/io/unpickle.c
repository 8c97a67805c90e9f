/* unpickle.c - restricted pickle interpreter (see unpickle.h). The opcode list and the allowed
 * globals are those of CODEC.md section 10.2; the interpreter never calls anything it reads. */
#include "io/unpickle.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct dr_pk {
    dr_pk_value **all; /* every value created, freed together (memo may share them) */
    int64_t n_all, cap_all;
};

typedef struct pk_state {
    dr_pk *pk;
    const uint8_t *p;
    size_t size, pos, op_pos;
    const char *label;
    dr_pk_limits lim;
    dr_pk_value **stack;
    int64_t sp, stack_cap;
    int64_t *marks;
    int64_t n_marks, marks_cap;
    dr_pk_value **memo;
    int64_t memo_len; /* highest index + 1 */
    int64_t memo_cap;
    int64_t n_tensors;
    drama_error *err;
} pk_state;

const char *dr_pk_kind_name(dr_pk_kind k) {
    static const char *names[] = {"None", "bool", "int", "float", "str", "tuple", "list", "dict",
                                  "global", "storage", "tensor"};
    return (k >= 0 && (size_t)k < sizeof names / sizeof names[0]) ? names[k] : "?";
}

static drama_status pk_fail(pk_state *s, drama_status code, const char *what) {
    return dr_fail(s->err, code, "%s: %s (at byte %zu)", s->label, what, s->op_pos);
}

/* grow a pointer array to hold at least need entries */
static int grow(void **arr, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 1;
    int64_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*arr, (size_t)nc * elem);
    if (!q) return 0;
    *arr = q;
    *cap = nc;
    return 1;
}

static dr_pk_value *new_value(pk_state *s, dr_pk_kind kind) {
    dr_pk *pk = s->pk;
    if (pk->n_all >= s->lim.max_values) {
        pk_fail(s, DRAMA_ENOMEM, "too many values (limit reached)");
        return NULL;
    }
    if (!grow((void **)&pk->all, &pk->cap_all, pk->n_all + 1, sizeof *pk->all)) {
        pk_fail(s, DRAMA_ENOMEM, "out of memory");
        return NULL;
    }
    dr_pk_value *v = calloc(1, sizeof *v);
    if (!v) {
        pk_fail(s, DRAMA_ENOMEM, "out of memory");
        return NULL;
    }
    v->kind = kind;
    pk->all[pk->n_all++] = v;
    return v;
}

static int push(pk_state *s, dr_pk_value *v) {
    if (!v) return 0;
    if (s->sp + s->n_marks >= s->lim.max_stack) {
        pk_fail(s, DRAMA_ENOMEM, "stack depth limit reached");
        return 0;
    }
    if (!grow((void **)&s->stack, &s->stack_cap, s->sp + 1, sizeof *s->stack)) {
        pk_fail(s, DRAMA_ENOMEM, "out of memory");
        return 0;
    }
    s->stack[s->sp++] = v;
    return 1;
}

static int64_t mark_base(pk_state *s) { return s->n_marks ? s->marks[s->n_marks - 1] : 0; }

static dr_pk_value *pop(pk_state *s) {
    if (s->sp <= mark_base(s)) {
        pk_fail(s, DRAMA_EFORMAT, "stack underflow");
        return NULL;
    }
    return s->stack[--s->sp];
}

static dr_pk_value *top(pk_state *s) {
    if (s->sp <= mark_base(s)) {
        pk_fail(s, DRAMA_EFORMAT, "stack underflow");
        return NULL;
    }
    return s->stack[s->sp - 1];
}

static int append_item(pk_state *s, dr_pk_value *c, dr_pk_value *item) {
    if (!grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items)) {
        pk_fail(s, DRAMA_ENOMEM, "out of memory");
        return 0;
    }
    c->items[c->n++] = item;
    return 1;
}

/* Pop everything above the last mark into a new tuple (or list) value. */
static dr_pk_value *pop_mark_to(pk_state *s, dr_pk_kind kind) {
    if (!s->n_marks) {
        pk_fail(s, DRAMA_EFORMAT, "no MARK on the stack");
        return NULL;
    }
    int64_t base = s->marks[--s->n_marks];
    dr_pk_value *t = new_value(s, kind);
    if (!t) return NULL;
    for (int64_t i = base; i < s->sp; i++)
        if (!append_item(s, t, s->stack[i])) return NULL;
    s->sp = base;
    return t;
}

static int need(pk_state *s, size_t n) {
    if (s->size - s->pos < n) {
        pk_fail(s, DRAMA_EFORMAT, "truncated pickle");
        return 0;
    }
    return 1;
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static dr_pk_value *make_int(pk_state *s, int64_t x) {
    dr_pk_value *v = new_value(s, DR_PK_INT);
    if (v) v->i = x;
    return v;
}

static dr_pk_value *make_str(pk_state *s, const uint8_t *b, uint64_t n) {
    if (n > s->lim.max_string) {
        pk_fail(s, DRAMA_ENOMEM, "string longer than the limit");
        return NULL;
    }
    if (memchr(b, 0, (size_t)n)) {
        pk_fail(s, DRAMA_EFORMAT, "string with a NUL byte");
        return NULL;
    }
    dr_pk_value *v = new_value(s, DR_PK_STR);
    if (!v) return NULL;
    v->s = malloc((size_t)n + 1);
    if (!v->s) {
        pk_fail(s, DRAMA_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(v->s, b, (size_t)n);
    v->s[n] = '\0';
    v->slen = (size_t)n;
    return v;
}

static int memo_put(pk_state *s, uint64_t idx, dr_pk_value *v) {
    if (idx >= (uint64_t)s->lim.max_memo) return pk_fail(s, DRAMA_ENOMEM, "memo index above the limit"), 0;
    if (!grow((void **)&s->memo, &s->memo_cap, (int64_t)idx + 1, sizeof *s->memo))
        return pk_fail(s, DRAMA_ENOMEM, "out of memory"), 0;
    for (int64_t i = s->memo_len; i <= (int64_t)idx; i++) s->memo[i] = NULL;
    if ((int64_t)idx >= s->memo_len) s->memo_len = (int64_t)idx + 1;
    s->memo[idx] = v;
    return 1;
}

static dr_pk_value *memo_get(pk_state *s, uint64_t idx) {
    if (idx >= (uint64_t)s->memo_len || !s->memo[idx]) {
        pk_fail(s, DRAMA_EFORMAT, "memo GET of an index never PUT");
        return NULL;
    }
    return s->memo[idx];
}

/* GLOBAL module.name -> one of the allowed values, or an error naming it. */
static dr_pk_value *make_global(pk_state *s, const char *module, const char *name) {
    static const struct { const char *name; dr_dtype dt; } storages[] = {
        {"FloatStorage", DR_DT_F32}, {"BFloat16Storage", DR_DT_BF16}, {"HalfStorage", DR_DT_F16},
        {"DoubleStorage", DR_DT_F64}, {"BoolStorage", DR_DT_BOOL},    {"LongStorage", DR_DT_I64},
        {"IntStorage", DR_DT_I32},    {"ByteStorage", DR_DT_U8},
    };
    dr_pk_global g = 0;
    dr_dtype dt = DR_DT_INVALID;
    if (!strcmp(module, "collections") && !strcmp(name, "OrderedDict")) g = DR_PKG_ORDERED_DICT;
    else if (!strcmp(module, "torch._utils") && !strcmp(name, "_rebuild_tensor_v2")) g = DR_PKG_REBUILD_TENSOR_V2;
    else if (!strcmp(module, "torch._utils") && !strcmp(name, "_rebuild_parameter")) g = DR_PKG_REBUILD_PARAMETER;
    else if (!strcmp(module, "torch")) {
        for (size_t i = 0; i < sizeof storages / sizeof storages[0]; i++)
            if (!strcmp(name, storages[i].name)) g = DR_PKG_STORAGE_TYPE, dt = storages[i].dt;
    }
    if (!g) {
        dr_fail(s->err, DRAMA_EUNSUPPORTED, "%s: global '%.100s.%.100s' is not allowed (at byte %zu)",
                s->label, module, name, s->op_pos);
        return NULL;
    }
    dr_pk_value *v = new_value(s, DR_PK_GLOBAL);
    if (v) v->glob = g, v->dtype = dt;
    return v;
}

static int as_int(const dr_pk_value *v, int64_t *out) {
    if (!v || (v->kind != DR_PK_INT && v->kind != DR_PK_BOOL)) return 0;
    *out = v->i;
    return 1;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) */
static dr_pk_value *rebuild_tensor(pk_state *s, const dr_pk_value *args) {
    if (args->n < 6 || args->n > 7) return pk_fail(s, DRAMA_EFORMAT, "_rebuild_tensor_v2 needs 6 or 7 arguments"), NULL;
    const dr_pk_value *st = args->items[0], *size = args->items[2], *stride = args->items[3];
    int64_t off;
    if (st->kind != DR_PK_STORAGE) return pk_fail(s, DRAMA_EFORMAT, "_rebuild_tensor_v2: argument 0 is not a storage"), NULL;
    if (!as_int(args->items[1], &off) || off < 0)
        return pk_fail(s, DRAMA_EFORMAT, "_rebuild_tensor_v2: bad storage offset"), NULL;
    if (size->kind != DR_PK_TUPLE || stride->kind != DR_PK_TUPLE || size->n != stride->n)
        return pk_fail(s, DRAMA_EFORMAT, "_rebuild_tensor_v2: size and stride must be tuples of one length"), NULL;
    if (size->n > DR_MAX_DIMS) return pk_fail(s, DRAMA_EUNSUPPORTED, "_rebuild_tensor_v2: too many dimensions"), NULL;
    if (++s->n_tensors > s->lim.max_tensors) return pk_fail(s, DRAMA_ENOMEM, "too many tensors"), NULL;
    dr_pk_value *t = new_value(s, DR_PK_TENSOR);
    if (!t) return NULL;
    t->storage = st;
    t->dtype = st->dtype;
    t->offset = off;
    t->ndim = (int)size->n;
    for (int d = 0; d < t->ndim; d++) {
        if (!as_int(size->items[d], &t->shape[d]) || !as_int(stride->items[d], &t->stride[d]) ||
            t->shape[d] < 0 || t->stride[d] < 0 || t->shape[d] > ((int64_t)1 << 40) ||
            t->stride[d] > ((int64_t)1 << 40))
            return pk_fail(s, DRAMA_EFORMAT, "_rebuild_tensor_v2: bad size or stride entry"), NULL;
    }
    return t;
}

static dr_pk_value *do_reduce(pk_state *s, dr_pk_value *fn, dr_pk_value *args) {
    if (args->kind != DR_PK_TUPLE) return pk_fail(s, DRAMA_EFORMAT, "REDUCE arguments are not a tuple"), NULL;
    if (fn->kind != DR_PK_GLOBAL) {
        dr_fail(s->err, DRAMA_EUNSUPPORTED, "%s: REDUCE on a %s is not allowed (at byte %zu)", s->label,
                dr_pk_kind_name(fn->kind), s->op_pos);
        return NULL;
    }
    switch (fn->glob) {
    case DR_PKG_ORDERED_DICT:
        if (args->n != 0) return pk_fail(s, DRAMA_EUNSUPPORTED, "collections.OrderedDict called with arguments"), NULL;
        return new_value(s, DR_PK_DICT);
    case DR_PKG_REBUILD_TENSOR_V2:
        return rebuild_tensor(s, args);
    case DR_PKG_REBUILD_PARAMETER:
        if (args->n != 3 || args->items[0]->kind != DR_PK_TENSOR)
            return pk_fail(s, DRAMA_EFORMAT, "_rebuild_parameter needs (tensor, requires_grad, hooks)"), NULL;
        return args->items[0];
    case DR_PKG_STORAGE_TYPE:
        return pk_fail(s, DRAMA_EUNSUPPORTED, "a torch storage type may only appear in a persistent id"), NULL;
    }
    return pk_fail(s, DRAMA_EINTERNAL, "unknown global"), NULL;
}

/* BINPERSID: ('storage', <storage type>, key, location, numel) */
static dr_pk_value *persistent_load(pk_state *s, const dr_pk_value *pid) {
    if (pid->kind != DR_PK_TUPLE || pid->n != 5 || pid->items[0]->kind != DR_PK_STR ||
        strcmp(pid->items[0]->s, "storage") != 0)
        return pk_fail(s, DRAMA_EFORMAT, "persistent id is not ('storage', type, key, location, numel)"), NULL;
    const dr_pk_value *type = pid->items[1], *key = pid->items[2];
    int64_t numel;
    if (type->kind != DR_PK_GLOBAL || type->glob != DR_PKG_STORAGE_TYPE)
        return pk_fail(s, DRAMA_EFORMAT, "persistent id: element 1 is not a torch storage type"), NULL;
    if (key->kind != DR_PK_STR || key->slen == 0 || strchr(key->s, '/') || strstr(key->s, ".."))
        return pk_fail(s, DRAMA_EFORMAT, "persistent id: bad storage key"), NULL;
    if (!as_int(pid->items[4], &numel) || numel < 0)
        return pk_fail(s, DRAMA_EFORMAT, "persistent id: bad element count"), NULL;
    dr_pk_value *v = new_value(s, DR_PK_STORAGE);
    if (!v) return NULL;
    v->dtype = type->dtype;
    v->s = key->s; /* shared: owned by the key value */
    v->slen = key->slen;
    v->numel = numel;
    return v;
}

static void set_limits(dr_pk_limits *l, const dr_pk_limits *in) {
    dr_pk_limits z = {0};
    *l = in ? *in : z;
    if (!l->max_pickle_bytes) l->max_pickle_bytes = (size_t)256 << 20;
    if (!l->max_values) l->max_values = (int64_t)16 << 20;
    if (!l->max_stack) l->max_stack = (int64_t)1 << 20;
    if (!l->max_memo) l->max_memo = (int64_t)4 << 20;
    if (!l->max_string) l->max_string = (size_t)1 << 20;
    if (!l->max_tensors) l->max_tensors = (int64_t)1 << 20;
}

static const char *opcode_name(uint8_t op) {
    switch (op) {
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 'V': return "UNICODE";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'p': return "PUT";
    case 'g': return "GET";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'l': return "LIST";
    case 'd': return "DICT";
    case 0x8a + 1: return "LONG4";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    }
    return NULL;
}

/* One opcode. Returns 1 to continue, 0 on error, 2 on STOP. */
static int step(pk_state *s, const dr_pk_value **result) {
    if (!need(s, 1)) return 0;
    s->op_pos = s->pos;
    uint8_t op = s->p[s->pos++];
    const uint8_t *a = s->p + s->pos;
    dr_pk_value *v, *w, *x;
    switch (op) {
    case 0x80: /* PROTO */
        if (!need(s, 1)) return 0;
        if (a[0] < 2 || a[0] > 5) return pk_fail(s, DRAMA_EUNSUPPORTED, "pickle protocol outside 2..5"), 0;
        s->pos += 1;
        return 1;
    case 0x95: /* FRAME: advisory length, the data follows inline */
        if (!need(s, 8)) return 0;
        s->pos += 8;
        return 1;
    case '.': /* STOP */
        if (s->n_marks) return pk_fail(s, DRAMA_EFORMAT, "STOP with a MARK still open"), 0;
        if (s->sp != 1) return pk_fail(s, DRAMA_EFORMAT, "STOP with a stack that does not hold one value"), 0;
        *result = s->stack[0];
        return 2;
    case '(': /* MARK */
        if (s->sp + s->n_marks >= s->lim.max_stack) return pk_fail(s, DRAMA_ENOMEM, "stack depth limit reached"), 0;
        if (!grow((void **)&s->marks, &s->marks_cap, s->n_marks + 1, sizeof *s->marks))
            return pk_fail(s, DRAMA_ENOMEM, "out of memory"), 0;
        s->marks[s->n_marks++] = s->sp;
        return 1;
    case '}': return push(s, new_value(s, DR_PK_DICT));  /* EMPTY_DICT */
    case ']': return push(s, new_value(s, DR_PK_LIST));  /* EMPTY_LIST */
    case ')': return push(s, new_value(s, DR_PK_TUPLE)); /* EMPTY_TUPLE */
    case 't': return push(s, pop_mark_to(s, DR_PK_TUPLE)); /* TUPLE */
    case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
        int n = op - 0x84;
        if (s->sp - mark_base(s) < n) return pk_fail(s, DRAMA_EFORMAT, "stack underflow"), 0;
        if (!(v = new_value(s, DR_PK_TUPLE))) return 0;
        for (int i = 0; i < n; i++)
            if (!append_item(s, v, s->stack[s->sp - n + i])) return 0;
        s->sp -= n;
        return push(s, v);
    }
    case 's': /* SETITEM */
        if (!(w = pop(s)) || !(x = pop(s)) || !(v = top(s))) return 0;
        if (v->kind != DR_PK_DICT) return pk_fail(s, DRAMA_EFORMAT, "SETITEM on a non-dict"), 0;
        return append_item(s, v, x) && append_item(s, v, w);
    case 'u': { /* SETITEMS */
        if (!s->n_marks) return pk_fail(s, DRAMA_EFORMAT, "SETITEMS without MARK"), 0;
        int64_t base = s->marks[--s->n_marks];
        if (base < 1 || ((s->sp - base) & 1)) return pk_fail(s, DRAMA_EFORMAT, "SETITEMS: bad stack"), 0;
        v = s->stack[base - 1];
        if (v->kind != DR_PK_DICT) return pk_fail(s, DRAMA_EFORMAT, "SETITEMS on a non-dict"), 0;
        for (int64_t i = base; i < s->sp; i++)
            if (!append_item(s, v, s->stack[i])) return 0;
        s->sp = base;
        return 1;
    }
    case 'a': /* APPEND */
        if (!(w = pop(s)) || !(v = top(s))) return 0;
        if (v->kind != DR_PK_LIST) return pk_fail(s, DRAMA_EFORMAT, "APPEND on a non-list"), 0;
        return append_item(s, v, w);
    case 'e': { /* APPENDS */
        if (!s->n_marks) return pk_fail(s, DRAMA_EFORMAT, "APPENDS without MARK"), 0;
        int64_t base = s->marks[--s->n_marks];
        if (base < 1) return pk_fail(s, DRAMA_EFORMAT, "APPENDS: bad stack"), 0;
        v = s->stack[base - 1];
        if (v->kind != DR_PK_LIST) return pk_fail(s, DRAMA_EFORMAT, "APPENDS on a non-list"), 0;
        for (int64_t i = base; i < s->sp; i++)
            if (!append_item(s, v, s->stack[i])) return 0;
        s->sp = base;
        return 1;
    }
    case 'q': case 'r': { /* BINPUT, LONG_BINPUT */
        int n = op == 'q' ? 1 : 4;
        if (!need(s, (size_t)n) || !(v = top(s))) return 0;
        s->pos += (size_t)n;
        return memo_put(s, rd_le(a, n), v);
    }
    case 0x94: /* MEMOIZE */
        if (!(v = top(s))) return 0;
        return memo_put(s, (uint64_t)s->memo_len, v);
    case 'h': case 'j': { /* BINGET, LONG_BINGET */
        int n = op == 'h' ? 1 : 4;
        if (!need(s, (size_t)n)) return 0;
        s->pos += (size_t)n;
        return push(s, memo_get(s, rd_le(a, n)));
    }
    case 'N': return push(s, new_value(s, DR_PK_NONE));
    case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
        if (!(v = new_value(s, DR_PK_BOOL))) return 0;
        v->i = op == 0x88;
        return push(s, v);
    case 'J': /* BININT */
        if (!need(s, 4)) return 0;
        s->pos += 4;
        return push(s, make_int(s, (int32_t)(uint32_t)rd_le(a, 4)));
    case 'K': /* BININT1 */
        if (!need(s, 1)) return 0;
        s->pos += 1;
        return push(s, make_int(s, a[0]));
    case 'M': /* BININT2 */
        if (!need(s, 2)) return 0;
        s->pos += 2;
        return push(s, make_int(s, (int64_t)rd_le(a, 2)));
    case 0x8a: { /* LONG1: n bytes little-endian two's complement */
        if (!need(s, 1)) return 0;
        int n = a[0];
        if (n > 8) return pk_fail(s, DRAMA_EUNSUPPORTED, "LONG1 wider than 64 bits"), 0;
        if (!need(s, 1 + (size_t)n)) return 0;
        uint64_t u = n ? rd_le(a + 1, n) : 0;
        if (n > 0 && n < 8 && (a[n] & 0x80)) u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
        s->pos += 1 + (size_t)n;
        return push(s, make_int(s, (int64_t)u));
    }
    case 'G': { /* BINFLOAT: big-endian double */
        if (!need(s, 8)) return 0;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = (u << 8) | a[i];
        s->pos += 8;
        if (!(v = new_value(s, DR_PK_FLOAT))) return 0;
        memcpy(&v->f, &u, 8);
        return push(s, v);
    }
    case 'X': case 0x8c: case 0x8d: { /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
        int n = op == 'X' ? 4 : op == 0x8c ? 1 : 8;
        if (!need(s, (size_t)n)) return 0;
        uint64_t len = rd_le(a, n);
        s->pos += (size_t)n;
        if (len > s->size - s->pos) return pk_fail(s, DRAMA_EFORMAT, "string runs past the end of the pickle"), 0;
        v = make_str(s, s->p + s->pos, len);
        s->pos += (size_t)len;
        return push(s, v);
    }
    case 'c': { /* GLOBAL "module\nname\n" */
        char mod[256], name[256];
        size_t i = 0;
        for (int part = 0; part < 2; part++) {
            char *dst = part ? name : mod;
            size_t k = 0;
            while (1) {
                if (s->pos + i >= s->size) return pk_fail(s, DRAMA_EFORMAT, "truncated GLOBAL"), 0;
                char ch = (char)s->p[s->pos + i++];
                if (ch == '\n') break;
                if (k + 1 >= sizeof mod) return pk_fail(s, DRAMA_EFORMAT, "GLOBAL name too long"), 0;
                dst[k++] = ch;
            }
            dst[k] = '\0';
        }
        s->pos += i;
        return push(s, make_global(s, mod, name));
    }
    case 0x93: /* STACK_GLOBAL */
        if (!(w = pop(s)) || !(v = pop(s))) return 0;
        if (v->kind != DR_PK_STR || w->kind != DR_PK_STR)
            return pk_fail(s, DRAMA_EFORMAT, "STACK_GLOBAL needs two strings"), 0;
        return push(s, make_global(s, v->s, w->s));
    case 'R': /* REDUCE */
        if (!(w = pop(s)) || !(v = pop(s))) return 0;
        return push(s, do_reduce(s, v, w));
    case 'b': /* BUILD: only the _metadata state of an OrderedDict state_dict, ignored */
        if (!(w = pop(s)) || !(v = top(s))) return 0;
        if (v->kind != DR_PK_DICT) {
            dr_fail(s->err, DRAMA_EUNSUPPORTED, "%s: BUILD on a %s is not allowed (at byte %zu)", s->label,
                    dr_pk_kind_name(v->kind), s->op_pos);
            return 0;
        }
        return 1;
    case 'Q': /* BINPERSID */
        if (!(w = pop(s))) return 0;
        return push(s, persistent_load(s, w));
    default: {
        const char *nm = opcode_name(op);
        if (nm)
            dr_fail(s->err, DRAMA_EUNSUPPORTED, "%s: pickle opcode %s (0x%02x) is not allowed (at byte %zu)",
                    s->label, nm, op, s->op_pos);
        else
            dr_fail(s->err, DRAMA_EUNSUPPORTED, "%s: unknown or disallowed pickle opcode 0x%02x (at byte %zu)",
                    s->label, op, s->op_pos);
        return 0;
    }
    }
}

drama_status dr_pk_load(const uint8_t *data, size_t size, const char *label, const dr_pk_limits *lim,
                        dr_pk **out, const dr_pk_value **root, drama_error *err) {
    *out = NULL;
    *root = NULL;
    pk_state s = {0};
    s.p = data;
    s.size = size;
    s.label = label ? label : "pickle";
    s.err = err;
    set_limits(&s.lim, lim);
    if (size > s.lim.max_pickle_bytes)
        return dr_fail(err, DRAMA_ENOMEM, "%s: pickle of %zu bytes exceeds the limit", s.label, size);
    s.pk = calloc(1, sizeof *s.pk);
    if (!s.pk) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", s.label);
    int r;
    const dr_pk_value *res = NULL;
    while ((r = step(&s, &res)) == 1) {}
    free(s.stack);
    free(s.marks);
    free(s.memo);
    if (r != 2) {
        dr_pk_free(s.pk);
        if (err && err->code == DRAMA_OK) dr_fail(err, DRAMA_EINTERNAL, "%s: unpickling failed", s.label);
        return err ? err->code : DRAMA_EFORMAT;
    }
    *out = s.pk;
    *root = res;
    return DRAMA_OK;
}

void dr_pk_free(dr_pk *pk) {
    if (!pk) return;
    for (int64_t i = 0; i < pk->n_all; i++) {
        dr_pk_value *v = pk->all[i];
        if (v->kind == DR_PK_STR) free(v->s);
        free(v->items);
        free(v);
    }
    free(pk->all);
    free(pk);
}

const dr_pk_value *dr_pk_dict_get(const dr_pk_value *dict, const char *key) {
    if (!dict || dict->kind != DR_PK_DICT) return NULL;
    for (int64_t i = 0; i + 1 < dict->n; i += 2)
        if (dict->items[i]->kind == DR_PK_STR && !strcmp(dict->items[i]->s, key)) return dict->items[i + 1];
    return NULL;
}
