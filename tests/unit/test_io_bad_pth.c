/* Bad-input tests of the torch-zip reader and the restricted unpickler (CODEC.md section 10):
 * every malformed archive or hostile pickle gives a named error, never a crash. Archives are
 * built in memory by a tiny stored-zip writer below. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <zlib.h>

#include "io/torchzip.h"
#include "io/unpickle.h"
#include "testutil.h"

typedef struct buf {
    uint8_t d[1 << 16];
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
    assert_true(b->n + n <= sizeof b->d);
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void op(buf *b, uint8_t o) { put(b, &o, 1); }
static void le(buf *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) op(b, (uint8_t)(v >> (8 * i)));
}
static void sstr(buf *b, const char *s) { /* SHORT_BINUNICODE */
    op(b, 0x8c);
    op(b, (uint8_t)strlen(s));
    put(b, s, strlen(s));
}
static void glob(buf *b, const char *mod, const char *name) {
    op(b, 'c');
    put(b, mod, strlen(mod));
    op(b, '\n');
    put(b, name, strlen(name));
    op(b, '\n');
}
static void int1(buf *b, int v) { op(b, 'K'), op(b, (uint8_t)v); }

/* rebuild_tensor_v2(storage(key, numel), offset, size, stride, False, {}) with 1-D or 2-D shape */
static void tensor(buf *b, const char *key, int numel, int offset, int ndim, const int *shape, const int *stride) {
    glob(b, "torch._utils", "_rebuild_tensor_v2");
    op(b, '(');
    op(b, '(');
    sstr(b, "storage");
    glob(b, "torch", "FloatStorage");
    sstr(b, key);
    sstr(b, "cpu");
    int1(b, numel);
    op(b, 't');
    op(b, 'Q');
    int1(b, offset);
    op(b, '(');
    for (int i = 0; i < ndim; i++) int1(b, shape[i]);
    op(b, 't');
    op(b, '(');
    for (int i = 0; i < ndim; i++) int1(b, stride[i]);
    op(b, 't');
    op(b, 0x89);
    op(b, '}');
    op(b, 't');
    op(b, 'R');
}

/* {"w": tensor over storage "0" of 4 floats} */
static void good_pickle(buf *b) {
    int shape[1] = {4}, stride[1] = {1};
    op(b, 0x80), op(b, 2);
    glob(b, "collections", "OrderedDict");
    op(b, ')'), op(b, 'R');
    op(b, '(');
    sstr(b, "w");
    tensor(b, "0", 4, 0, 1, shape, stride);
    op(b, 'u');
    op(b, '.');
}

typedef struct zent {
    const char *name;
    const void *data;
    size_t size;
    int method;
} zent;

/* A stored zip of the entries; offsets of the central directory records go to cd_at[]. */
static void zip(buf *z, const zent *e, int n, size_t *cd_at) {
    size_t lho[16];
    z->n = 0;
    for (int i = 0; i < n; i++) {
        lho[i] = z->n;
        le(z, 0x04034b50, 4), le(z, 20, 2), le(z, 0, 2), le(z, (uint64_t)e[i].method, 2), le(z, 0, 4), le(z, 0, 4);
        le(z, e[i].size, 4), le(z, e[i].size, 4), le(z, strlen(e[i].name), 2), le(z, 0, 2);
        put(z, e[i].name, strlen(e[i].name));
        put(z, e[i].data, e[i].size);
    }
    size_t cd = z->n;
    for (int i = 0; i < n; i++) {
        if (cd_at) cd_at[i] = z->n;
        le(z, 0x02014b50, 4), le(z, 20, 2), le(z, 20, 2), le(z, 0, 2), le(z, (uint64_t)e[i].method, 2);
        le(z, 0, 4), le(z, crc32(0L, e[i].data, (uInt)e[i].size), 4), le(z, e[i].size, 4), le(z, e[i].size, 4);
        le(z, strlen(e[i].name), 2), le(z, 0, 2), le(z, 0, 2), le(z, 0, 2), le(z, 0, 2), le(z, 0, 4), le(z, lho[i], 4);
        put(z, e[i].name, strlen(e[i].name));
    }
    size_t cds = z->n - cd;
    le(z, 0x06054b50, 4), le(z, 0, 2), le(z, 0, 2), le(z, (uint64_t)n, 2), le(z, (uint64_t)n, 2);
    le(z, cds, 4), le(z, cd, 4), le(z, 0, 2);
}

static const float k_vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static void archive(buf *z, const buf *pkl, size_t *cd_at) {
    zent e[2] = {{"arch/data.pkl", pkl->d, pkl->n, 0}, {"arch/data/0", k_vals, sizeof k_vals, 0}};
    zip(z, e, 2, cd_at);
}

static drama_status open_buf(const buf *z, drama_error *e, dr_pth **p) {
    dr_error_clear(e);
    drama_status rc = dr_pth_open_memory(z->d, z->n, "test.pth", p, e);
    if (rc) printf("  error (expected): %s\n", e->message);
    return rc;
}

static void expect_fail(const buf *z, drama_status code, const char *needle) {
    drama_error e = {0};
    dr_pth *p = NULL;
    drama_status rc = open_buf(z, &e, &p);
    assert_int_equal(rc, code);
    assert_null(p);
    if (needle && !strstr(e.message, needle)) fail_msg("message '%s' lacks '%s'", e.message, needle);
}

static void test_good_minimal(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    good_pickle(&pkl);
    archive(&z, &pkl, NULL);
    drama_error e = {0};
    dr_pth *p = NULL;
    assert_int_equal(open_buf(&z, &e, &p), DRAMA_OK);
    assert_int_equal(dr_pth_count(p), 1);
    const dr_tensor *t = dr_pth_find(p, "w");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 4);
    float v[4];
    memcpy(v, t->data, 16);
    assert_true(v[0] == 1 && v[3] == 4);
    assert_string_equal(dr_pth_prefix(p), "arch");
    dr_pth_close(p);
}

static void test_strided_view_copied_and_wrapper(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    int shape[2] = {2, 3}, stride[2] = {1, 2}; /* a transposed [3,2] */
    op(&pkl, 0x80), op(&pkl, 2);
    op(&pkl, '}');
    sstr(&pkl, "state_dict");
    op(&pkl, '}');
    sstr(&pkl, "t");
    tensor(&pkl, "0", 8, 1, 2, shape, stride);
    op(&pkl, 's');
    op(&pkl, 's');
    op(&pkl, '.');
    archive(&z, &pkl, NULL);
    drama_error e = {0};
    dr_pth *p = NULL;
    assert_int_equal(open_buf(&z, &e, &p), DRAMA_OK);
    const dr_tensor *t = dr_pth_find(p, "t");
    assert_non_null(t);
    float v[6];
    memcpy(v, t->data, sizeof v);
    /* element (i, j) = storage[1 + i + 2 j] = 2 + i + 2 j */
    float want[6] = {2, 4, 6, 3, 5, 7};
    for (int i = 0; i < 6; i++) assert_true(v[i] == want[i]);
    dr_pth_close(p);
}

static void test_hostile_globals(void **state) {
    (void)state;
    static const char *bad[][2] = {{"os", "system"}, {"builtins", "eval"}, {"posix", "system"},
                                   {"torch", "load"}, {"collections", "defaultdict"}, {"__builtin__", "exec"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        buf pkl = {0}, z = {0};
        op(&pkl, 0x80), op(&pkl, 2);
        glob(&pkl, bad[i][0], bad[i][1]);
        sstr(&pkl, "echo pwned");
        op(&pkl, 0x85);
        op(&pkl, 'R');
        op(&pkl, '.');
        archive(&z, &pkl, NULL);
        char want[128];
        snprintf(want, sizeof want, "'%s.%s' is not allowed", bad[i][0], bad[i][1]);
        expect_fail(&z, DRAMA_EUNSUPPORTED, want);
        /* the same through STACK_GLOBAL */
        pkl.n = 0;
        op(&pkl, 0x80), op(&pkl, 4);
        sstr(&pkl, bad[i][0]);
        sstr(&pkl, bad[i][1]);
        op(&pkl, 0x93);
        op(&pkl, '.');
        archive(&z, &pkl, NULL);
        expect_fail(&z, DRAMA_EUNSUPPORTED, want);
    }
}

static void test_disallowed_opcodes(void **state) {
    (void)state;
    static const struct { uint8_t op; const char *name; } ops[] = {
        {'i', "INST"}, {'o', "OBJ"}, {0x81, "NEWOBJ"}, {0x92, "NEWOBJ_EX"}, {'P', "PERSID"},
        {0x82, "EXT1"}, {0xff, "0xff"}, {'S', "STRING"}, {0x8f, "EMPTY_SET"}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        buf pkl = {0}, z = {0};
        op(&pkl, 0x80), op(&pkl, 2);
        op(&pkl, '}');
        op(&pkl, ops[i].op);
        op(&pkl, '.');
        archive(&z, &pkl, NULL);
        expect_fail(&z, DRAMA_EUNSUPPORTED, ops[i].name);
        expect_fail(&z, DRAMA_EUNSUPPORTED, "at byte 3");
    }
}

static void test_bad_pickle_structure(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    /* REDUCE on a non-global, BUILD on a non-dict, memo get of an unset index, stack underflow */
    const uint8_t cases[][8] = {{0x80, 2, ')', ')', 'R', '.'}, {0x80, 2, ']', '}', 'b', '.'},
                                {0x80, 2, 'h', 7, '.'},        {0x80, 2, 's', '.'},
                                {0x80, 2, '.'},                {0x80, 9, '}', '.'},
                                {0x80, 2, '}', '}', '.'}};
    const size_t lens[] = {6, 6, 5, 4, 3, 4, 5};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        pkl.n = 0;
        put(&pkl, cases[i], lens[i]);
        archive(&z, &pkl, NULL);
        expect_fail(&z, i < 2 ? DRAMA_EUNSUPPORTED : i == 5 ? DRAMA_EUNSUPPORTED : DRAMA_EFORMAT, "arch/data.pkl");
    }
    /* a dict value that is not a tensor */
    pkl.n = 0;
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, '}'), sstr(&pkl, "x"), int1(&pkl, 3), op(&pkl, 's'), op(&pkl, '.');
    archive(&z, &pkl, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "'x' is a int, not a tensor");
}

static void test_storage_and_view_bounds(void **state) {
    (void)state;
    int shape[1] = {4}, stride[1] = {1};
    buf pkl = {0}, z = {0};
    /* storage claims 9 elements, entry holds 8 */
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, '}'), sstr(&pkl, "w");
    tensor(&pkl, "0", 9, 0, 1, shape, stride);
    op(&pkl, 's'), op(&pkl, '.');
    archive(&z, &pkl, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "fewer than 9 elements");
    /* view runs past the storage */
    pkl.n = 0;
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, '}'), sstr(&pkl, "w");
    tensor(&pkl, "0", 8, 6, 1, shape, stride);
    op(&pkl, 's'), op(&pkl, '.');
    archive(&z, &pkl, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "outside its storage");
    /* missing storage entry */
    pkl.n = 0;
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, '}'), sstr(&pkl, "w");
    tensor(&pkl, "7", 4, 0, 1, shape, stride);
    op(&pkl, 's'), op(&pkl, '.');
    archive(&z, &pkl, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "arch/data/7");
}

static void test_zip_faults(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    size_t cd[2];
    good_pickle(&pkl);
    /* compressed entry */
    zent e[3] = {{"arch/data.pkl", pkl.d, pkl.n, 0}, {"arch/data/0", k_vals, sizeof k_vals, 8}, {0}};
    zip(&z, e, 2, NULL);
    expect_fail(&z, DRAMA_EUNSUPPORTED, "compressed");
    /* entry size beyond the file */
    archive(&z, &pkl, cd);
    z.d[cd[1] + 20] = 0xff, z.d[cd[1] + 23] = 0x7f;
    z.d[cd[1] + 24] = 0xff, z.d[cd[1] + 27] = 0x7f;
    expect_fail(&z, DRAMA_EFORMAT, "outside the file");
    /* local header offset beyond the file */
    archive(&z, &pkl, cd);
    z.d[cd[1] + 45] = 0x40;
    expect_fail(&z, DRAMA_EFORMAT, "local header");
    /* duplicate names */
    e[1] = (zent){"arch/data.pkl", pkl.d, pkl.n, 0};
    zip(&z, e, 2, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "duplicate");
    /* no data.pkl; two top directories; big-endian byteorder */
    e[0] = (zent){"arch/other", pkl.d, pkl.n, 0};
    e[1] = (zent){"arch/data/0", k_vals, sizeof k_vals, 0};
    zip(&z, e, 2, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "data.pkl");
    e[0] = (zent){"a/b/data.pkl", pkl.d, pkl.n, 0};
    zip(&z, e, 2, NULL);
    expect_fail(&z, DRAMA_EFORMAT, "single top directory");
    e[0] = (zent){"arch/data.pkl", pkl.d, pkl.n, 0};
    e[2] = (zent){"arch/byteorder", "big", 3, 0};
    zip(&z, e, 3, NULL);
    expect_fail(&z, DRAMA_EUNSUPPORTED, "byteorder");
    /* legacy torch format and garbage */
    buf legacy = {0};
    op(&legacy, 0x80), op(&legacy, 2), put(&legacy, "\x8a\x0a" "0123456789", 12);
    expect_fail(&legacy, DRAMA_EUNSUPPORTED, "legacy");
    buf junk = {0};
    put(&junk, "PK\x03\x04 not really a zip archive at all ....", 40);
    expect_fail(&junk, DRAMA_EFORMAT, "end-of-central-directory");
}

/* Central directory entries whose sizes and offset live in a ZIP64 extra field (0xFFFFFFFF in
 * the fixed fields), and a ZIP64 end record + locator, as large torch.save files have. */
static void test_zip64_fields(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    good_pickle(&pkl);
    zent e[2] = {{"arch/data.pkl", pkl.d, pkl.n, 0}, {"arch/data/0", k_vals, sizeof k_vals, 0}};
    size_t lho[2];
    for (int i = 0; i < 2; i++) {
        lho[i] = z.n;
        le(&z, 0x04034b50, 4), le(&z, 45, 2), le(&z, 0, 2), le(&z, 0, 2), le(&z, 0, 4), le(&z, 0, 4);
        le(&z, e[i].size, 4), le(&z, e[i].size, 4), le(&z, strlen(e[i].name), 2), le(&z, 0, 2);
        put(&z, e[i].name, strlen(e[i].name));
        put(&z, e[i].data, e[i].size);
    }
    size_t cd = z.n;
    for (int i = 0; i < 2; i++) {
        le(&z, 0x02014b50, 4), le(&z, 45, 2), le(&z, 45, 2), le(&z, 0, 2), le(&z, 0, 2), le(&z, 0, 4);
        le(&z, crc32(0L, e[i].data, (uInt)e[i].size), 4);
        le(&z, 0xFFFFFFFFu, 4), le(&z, 0xFFFFFFFFu, 4); /* csize, usize in the extra field */
        le(&z, strlen(e[i].name), 2), le(&z, 28, 2), le(&z, 0, 2), le(&z, 0, 2), le(&z, 0, 2), le(&z, 0, 4);
        le(&z, 0xFFFFFFFFu, 4); /* local header offset in the extra field */
        put(&z, e[i].name, strlen(e[i].name));
        le(&z, 1, 2), le(&z, 24, 2), le(&z, e[i].size, 8), le(&z, e[i].size, 8), le(&z, lho[i], 8);
    }
    size_t cds = z.n - cd, z64 = z.n;
    le(&z, 0x06064b50, 4), le(&z, 44, 8), le(&z, 45, 2), le(&z, 45, 2), le(&z, 0, 4), le(&z, 0, 4);
    le(&z, 2, 8), le(&z, 2, 8), le(&z, cds, 8), le(&z, cd, 8);
    le(&z, 0x07064b50, 4), le(&z, 0, 4), le(&z, z64, 8), le(&z, 1, 4);
    le(&z, 0x06054b50, 4), le(&z, 0, 2), le(&z, 0, 2), le(&z, 0xFFFF, 2), le(&z, 0xFFFF, 2);
    le(&z, 0xFFFFFFFFu, 4), le(&z, 0xFFFFFFFFu, 4), le(&z, 0, 2);
    drama_error err = {0};
    dr_pth *p = NULL;
    assert_int_equal(open_buf(&z, &err, &p), DRAMA_OK);
    const dr_tensor *t = dr_pth_find(p, "w");
    assert_non_null(t);
    float v[4];
    memcpy(v, t->data, 16);
    assert_true(v[0] == 1 && v[3] == 4);
    dr_pth_close(p);
    /* a ZIP64 record pointing outside the file */
    z.d[z64 + 48] = 0xff, z.d[z64 + 53] = 0x7f;
    expect_fail(&z, DRAMA_EFORMAT, "outside the file");
}

static void test_truncated(void **state) {
    (void)state;
    buf pkl = {0}, z = {0};
    good_pickle(&pkl);
    archive(&z, &pkl, NULL);
    buf cut;
    for (size_t n = 0; n < z.n; n++) { /* every prefix of a valid archive fails cleanly */
        memcpy(cut.d, z.d, n);
        cut.n = n;
        drama_error e = {0};
        dr_pth *p = NULL;
        assert_int_not_equal(dr_pth_open_memory(cut.d, cut.n, "cut.pth", &p, &e), DRAMA_OK);
        assert_null(p);
        assert_true(e.message[0] != '\0');
    }
    /* every prefix of the pickle itself */
    for (size_t n = 0; n < pkl.n; n++) {
        dr_pk *pk = NULL;
        const dr_pk_value *root = NULL;
        drama_error e = {0};
        assert_int_not_equal(dr_pk_load(pkl.d, n, "cut.pkl", NULL, &pk, &root, &e), DRAMA_OK);
        assert_null(pk);
    }
}

static void test_mutations_never_crash(void **state) {
    (void)state;
    buf pkl = {0}, z = {0}, m;
    good_pickle(&pkl);
    archive(&z, &pkl, NULL);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int ok = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(m.d, z.d, z.n);
        m.n = z.n;
        for (int k = 0; k < 1 + it % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            m.d[x % m.n] = (uint8_t)(x >> 32);
        }
        drama_error e = {0};
        dr_pth *p = NULL;
        if (dr_pth_open_memory(m.d, m.n, "mut.pth", &p, &e) == DRAMA_OK) ok++, dr_pth_close(p);
        else assert_true(e.message[0] != '\0');
    }
    printf("mutations: %d of 3000 still loaded\n", ok);
}

static void test_limits(void **state) {
    (void)state;
    buf pkl = {0};
    op(&pkl, 0x80), op(&pkl, 2);
    for (int i = 0; i < 300; i++) op(&pkl, '(');
    op(&pkl, '.');
    dr_pk_limits lim = {.max_stack = 100};
    dr_pk *pk = NULL;
    const dr_pk_value *root = NULL;
    drama_error e = {0};
    assert_int_equal(dr_pk_load(pkl.d, pkl.n, "deep.pkl", &lim, &pk, &root, &e), DRAMA_ENOMEM);
    assert_non_null(strstr(e.message, "stack depth"));
    /* memo index above the limit */
    pkl.n = 0;
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, '}'), op(&pkl, 'r'), le(&pkl, 0x7fffffff, 4), op(&pkl, '.');
    dr_error_clear(&e);
    assert_int_equal(dr_pk_load(pkl.d, pkl.n, "memo.pkl", NULL, &pk, &root, &e), DRAMA_ENOMEM);
    assert_non_null(strstr(e.message, "memo"));
    /* a string that claims more bytes than the pickle has */
    pkl.n = 0;
    op(&pkl, 0x80), op(&pkl, 2), op(&pkl, 'X'), le(&pkl, 0xfffffff0u, 4), op(&pkl, '.');
    dr_error_clear(&e);
    assert_int_equal(dr_pk_load(pkl.d, pkl.n, "str.pkl", NULL, &pk, &root, &e), DRAMA_EFORMAT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_minimal),          cmocka_unit_test(test_strided_view_copied_and_wrapper),
        cmocka_unit_test(test_hostile_globals),       cmocka_unit_test(test_disallowed_opcodes),
        cmocka_unit_test(test_bad_pickle_structure),  cmocka_unit_test(test_storage_and_view_bounds),
        cmocka_unit_test(test_zip_faults),            cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_zip64_fields),
        cmocka_unit_test(test_mutations_never_crash), cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
