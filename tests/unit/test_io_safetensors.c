/* test_io_safetensors.c - the safetensors reader on every golden file, dtype conversion against the
 * golden code tables, and the streaming writer (round trip, padding, abort, misuse). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/safetensors.h"
#include "testutil.h"

/* Checks every invariant the reader promises on an opened file. */
static void check_file_invariants(const dr_st_file *f) {
    size_t data_len = dr_st_file_size(f) - 8 - dr_st_header_len(f);
    uint64_t sum = 0;
    assert_true(dr_st_count(f) > 0);
    for (int64_t i = 0; i < dr_st_count(f); i++) {
        const dr_tensor *t = dr_st_at(f, i);
        assert_non_null(t);
        assert_ptr_equal(dr_st_find(f, t->name), t);
        assert_int_equal((int64_t)t->nbytes, dr_tensor_numel(t) * (int64_t)dr_dtype_size(t->dtype));
        sum += t->nbytes;
    }
    assert_int_equal(sum, data_len);
    assert_null(dr_st_at(f, dr_st_count(f)));
    assert_null(dr_st_find(f, "no.such.tensor"));
}

/* Opens every *.safetensors in a golden folder; returns how many. */
static int open_all_in(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        dr_st_file *f = NULL;
        drama_error err = {0};
        drama_status st = dr_st_open(path, &f, &err);
        if (st != DRAMA_OK) fail_msg("%s", err.message);
        check_file_invariants(f);
        printf("  %-60s %6lld tensors, header %zu bytes\n", e->d_name, (long long)dr_st_count(f),
               dr_st_header_len(f));
        dr_st_close(f);
        n++;
    }
    closedir(d);
    return n;
}

static void test_open_golden(void **state) {
    (void)state;
    const char *dirs[] = {"tiny-drama3", "ref", "codec", "variants/fp8-block", "variants/fused-experts",
                          "variants/mlx-affine4", "variants/nvfp4", "variants/pruned"};
    int total = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        printf("%s:\n", dirs[i]);
        int n = open_all_in(tu_model_dir(dirs[i]));
        assert_true(n > 0);
        total += n;
    }
    printf("opened %d golden safetensors files\n", total);
}

/* The MLX-style shard: unpadded header, unaligned data, metadata format=mlx. */
static void test_mlx_unpadded(void **state) {
    (void)state;
    char path[8192];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", tu_model_dir("variants/mlx-affine4"));
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_OK);
    assert_string_equal(dr_st_metadata(f, "format"), "mlx");
    assert_true(dr_st_header_len(f) % 8 != 0);
    int unaligned = 0;
    for (int64_t i = 0; i < dr_st_count(f); i++) {
        const dr_tensor *t = dr_st_at(f, i);
        if (((uintptr_t)t->data & 3) != 0) unaligned++;
        if (t->dtype == DR_DT_BF16) { /* converts from unaligned storage without faults */
            float *v = malloc((size_t)dr_tensor_numel(t) * sizeof *v);
            assert_int_equal(dr_st_to_f32(t, v, &err), DRAMA_OK);
            for (int64_t k = 0; k < dr_tensor_numel(t); k++) assert_true(isfinite(v[k]));
            free(v);
        }
    }
    printf("mlx shard: header %zu bytes, %d tensors at unaligned addresses\n", dr_st_header_len(f), unaligned);
    assert_true(unaligned > 0);
    dr_st_close(f);
}

static dr_tensor make_view(dr_dtype dt, int64_t n, const void *data) {
    dr_tensor t = {.name = "view", .dtype = dt, .ndim = 1, .shape = {n}, .data = data};
    t.nbytes = (size_t)n * dr_dtype_size(dt);
    return t;
}

/* All 256 E4M3 codes against the golden table (NaN codes compared by NaN-ness). */
static void test_e4m3_table(void **state) {
    (void)state;
    int64_t n = 0;
    float *want = tu_load_f32(tu_golden("ref/quant-units.safetensors"), "e4m3.all_codes_value", &n);
    assert_int_equal(n, 256);
    uint8_t codes[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    float got[256];
    dr_tensor t = make_view(DR_DT_F8_E4M3, 256, codes);
    assert_int_equal(dr_st_to_f32(&t, got, NULL), DRAMA_OK);
    int mismatches = 0;
    for (int i = 0; i < 256; i++) {
        if (isnan(want[i]) || isnan(got[i])) {
            if (isnan(want[i]) != isnan(got[i])) mismatches++;
        } else if (memcmp(&want[i], &got[i], 4) != 0) {
            mismatches++;
        }
    }
    printf("e4m3: %d of 256 codes differ from the golden table\n", mismatches);
    assert_int_equal(mismatches, 0);
    assert_true(got[0x38] == 1.0f && got[0x7E] == 448.0f && got[0x07] == 0.013671875f);
    assert_true(signbit(got[0x80]) && got[0x80] == 0.0f);
    free(want);
}

/* BF16 probe values: decoding the golden BF16 encodings of x = probe*1.0001 (fp32) lands within half
 * a BF16 ulp of x (the RNE rounding error): |bf - x| <= 2^(floor(log2 |x|) - 8), the exponent clamped
 * at -126 below which BF16 is subnormal. A non-finite x must decode to the same NaN/Inf, and an x at
 * or past BF16_MAX + half an ulp (2^119) to an Inf of its sign. */
static void test_bf16_probe(void **state) {
    (void)state;
    int64_t n = 0, m = 0;
    const char *qu = tu_golden("ref/quant-units.safetensors");
    float *probe = tu_load_f32(qu, "probe.f32", &n);
    float *bf = tu_load_f32(qu, "probe.to_bf16_rne", &m);
    assert_int_equal(n, m);
    float *want = malloc((size_t)n * sizeof *want);
    double *tol = malloc((size_t)n * sizeof *tol);
    const double bf16_max = 0x1.FEp127, overflow = bf16_max + 0x1p119;
    int64_t inf_expected = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = probe[i] * 1.0001f;
        int k = 0;
        if (isfinite(x)) frexp(x, &k); /* |x| in [2^(k-1), 2^k) */
        tol[i] = x == 0 || !isfinite(x) ? 0 : ldexp(1.0, (k - 1 < -126 ? -126 : k - 1) - 8);
        want[i] = isfinite(x) && fabs((double)x) >= overflow ? copysignf(INFINITY, x) : x;
        inf_expected += !isfinite(want[i]);
    }
    tu_cmp_opts o = {.tol = tol, .nonfinite_same = 1};
    tu_cmp c = tu_compare_f32_opts(bf, want, n, &o);
    printf("bf16 decode: %lld probes, %lld of them must decode to NaN/Inf\n", (long long)n, (long long)inf_expected);
    assert_true(tu_report_tol("bf16 decode vs probe*1.0001 (half ulp)", c));
    assert_int_equal(c.nonfinite_same, inf_expected); /* every stated NaN/Inf was checked */
    free(want);
    free(tol);
    free(probe);
    free(bf);
}

/* testutil's golden readers: ids as int32, values as float. */
static void test_tu_loaders(void **state) {
    (void)state;
    int64_t n = 0, m = 0;
    const char *bb = tu_golden("ref/backbone.safetensors");
    int32_t *rows = tu_load_i32(bb, "prefill.rows", &n);
    float *rows_f = tu_load_f32(bb, "prefill.rows", &m);
    assert_int_equal(n, m);
    assert_true(n > 0);
    for (int64_t i = 0; i < n; i++) {
        assert_true(rows[i] >= 0);
        assert_true((float)rows[i] == rows_f[i]);
    }
    free(rows);
    free(rows_f);
}

static void test_f16_e5m2_ints(void **state) {
    (void)state;
    const uint16_t h[] = {0x3C00, 0x0001, 0x7BFF, 0xFC00, 0x7E00, 0x8000, 0xC000, 0x0400};
    float v[8];
    dr_tensor t = make_view(DR_DT_F16, 8, h);
    assert_int_equal(dr_st_to_f32(&t, v, NULL), DRAMA_OK);
    assert_true(v[0] == 1.0f && v[1] == ldexpf(1, -24) && v[2] == 65504.0f && isinf(v[3]) && v[3] < 0);
    assert_true(isnan(v[4]) && v[5] == 0.0f && signbit(v[5]) && v[6] == -2.0f && v[7] == ldexpf(1, -14));
    const uint8_t e5[] = {0x3C, 0x7C, 0x01};
    dr_tensor t5 = make_view(DR_DT_F8_E5M2, 3, e5);
    assert_int_equal(dr_st_to_f32(&t5, v, NULL), DRAMA_OK);
    assert_true(v[0] == 1.0f && isinf(v[1]) && v[2] == ldexpf(1, -16));
    /* unaligned I32 / I64 / F64 */
    uint8_t raw[1 + 3 * 8];
    int32_t i32[2] = {-7, 123456};
    memcpy(raw + 1, i32, sizeof i32);
    dr_tensor ti = make_view(DR_DT_I32, 2, raw + 1);
    assert_int_equal(dr_st_to_f32(&ti, v, NULL), DRAMA_OK);
    assert_true(v[0] == -7.0f && v[1] == 123456.0f);
    double f64[3] = {0.5, -1e300, 3.25};
    memcpy(raw + 1, f64, sizeof f64);
    dr_tensor td = make_view(DR_DT_F64, 3, raw + 1);
    assert_int_equal(dr_st_to_f32(&td, v, NULL), DRAMA_OK);
    assert_true(v[0] == 0.5f && isinf(v[1]) && v[2] == 3.25f);
    /* a view whose byte count disagrees with its shape is refused */
    drama_error err = {0};
    td.nbytes--;
    assert_int_equal(dr_st_to_f32(&td, v, &err), DRAMA_ESHAPE);
    assert_non_null(strstr(err.message, "view"));
}

/* Writer round trip with several dtypes, a scalar, an empty tensor and chunked writes. */
static void round_trip(int pad) {
    const char *dir = tu_tmpdir();
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    dr_st_writer *w = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    dr_st_writer_set_padding(w, pad);
    assert_int_equal(dr_st_writer_metadata(w, "format", "pt", &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_metadata(w, "note", "h\xC3\xA9llo", &err), DRAMA_OK);
    int64_t s_a[2] = {3, 5}, s_b[1] = {7}, s_e[2] = {0, 4};
    assert_int_equal(dr_st_writer_declare(w, "a.weight", DR_DT_F32, 2, s_a, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "b", DR_DT_BF16, 1, s_b, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "empty", DR_DT_I64, 2, s_e, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "scalar", DR_DT_U8, 0, NULL, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "b", DR_DT_F32, 1, s_b, &err), DRAMA_EINVAL); /* twice */
    err = (drama_error){0};
    float a[15];
    for (int i = 0; i < 15; i++) a[i] = (float)i * 0.25f - 1.0f;
    uint16_t b[7];
    for (int i = 0; i < 7; i++) b[i] = (uint16_t)(0x3F80 + i); /* 1.0, 1.0078125, ... */
    uint8_t sc = 42;
    assert_int_equal(dr_st_writer_write(w, a, 10, &err), DRAMA_OK);        /* split inside a value */
    assert_int_equal(dr_st_writer_write(w, (uint8_t *)a + 10, 50, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "late", DR_DT_U8, 0, NULL, &err), DRAMA_EINVAL);
    err = (drama_error){0};
    assert_int_equal(dr_st_writer_write(w, b, sizeof b, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_write(w, &sc, 1, &err), DRAMA_OK);
    assert_int_equal(access(path, F_OK), -1); /* nothing published before finish */
    assert_int_equal(dr_st_writer_finish(w, &err), DRAMA_OK);
    assert_int_equal(access(tmp, F_OK), -1);

    dr_st_file *f = NULL;
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_OK);
    check_file_invariants(f);
    if (pad) assert_int_equal(dr_st_header_len(f) % 8, 0);
    assert_int_equal(dr_st_count(f), 4);
    assert_string_equal(dr_st_at(f, 0)->name, "a.weight"); /* header order = declaration order */
    assert_string_equal(dr_st_at(f, 3)->name, "scalar");
    assert_string_equal(dr_st_metadata(f, "note"), "h\xC3\xA9llo");
    assert_int_equal(dr_st_metadata_count(f), 2);
    const dr_tensor *ta = dr_st_find(f, "a.weight");
    assert_int_equal(ta->ndim, 2);
    assert_int_equal(ta->shape[1], 5);
    assert_memory_equal(ta->data, a, sizeof a);
    const dr_tensor *tb = dr_st_find(f, "b");
    assert_memory_equal(tb->data, b, sizeof b);
    float bv[7];
    assert_int_equal(dr_st_to_f32(tb, bv, &err), DRAMA_OK);
    assert_true(bv[0] == 1.0f && bv[1] == 1.0078125f);
    assert_int_equal(dr_st_find(f, "empty")->nbytes, 0);
    const dr_tensor *ts = dr_st_find(f, "scalar");
    assert_int_equal(ts->ndim, 0);
    assert_int_equal(dr_tensor_numel(ts), 1);
    assert_int_equal(ts->data[0], 42);
    printf("round trip pad=%d: header %zu bytes, file %zu bytes\n", pad, dr_st_header_len(f), dr_st_file_size(f));
    dr_st_close(f);
    assert_int_equal(tu_rm_rf(dir), 0);
}

static void test_writer_round_trip(void **state) {
    (void)state;
    round_trip(1);
    round_trip(0);
}

/* abort and failed finish remove the temporary and publish nothing; misuse is refused. */
static void test_writer_abort(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    drama_error err = {0};
    dr_st_writer *w = NULL;
    int64_t shape[1] = {4};
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "t", DR_DT_F32, 1, shape, &err), DRAMA_OK);
    assert_int_equal(access(tmp, F_OK), 0);
    dr_st_writer_abort(w);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(path, F_OK), -1);

    /* too few bytes: finish fails, names the shortfall, nothing published */
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "t", DR_DT_F32, 1, shape, &err), DRAMA_OK);
    float v[5] = {1, 2, 3, 4, 5};
    assert_int_equal(dr_st_writer_write(w, v, 8, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_write(w, v, 12, &err), DRAMA_EINVAL); /* past the declared 16 */
    assert_non_null(strstr(err.message, "past"));
    err = (drama_error){0};
    assert_int_equal(dr_st_writer_finish(w, &err), DRAMA_EINVAL);
    assert_non_null(strstr(err.message, "8 of 16"));
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(path, F_OK), -1);

    /* a folder that does not exist */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/nope/x.safetensors", dir);
    err = (drama_error){0};
    assert_int_equal(dr_st_writer_create(bad, &w, &err), DRAMA_EIO);
    assert_null(w);
    assert_non_null(strstr(err.message, "nope"));
    dr_st_writer_abort(NULL);
    dr_st_close(NULL);

    /* a link planted at the temporary's name is replaced, its target never written */
    char victim[4200];
    snprintf(victim, sizeof victim, "%s/victim.txt", dir);
    tu_write_file(victim, "precious", 8);
    assert_int_equal(symlink(victim, tmp), 0);
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_declare(w, "t", DR_DT_F32, 1, shape, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_write(w, v, 16, &err), DRAMA_OK);
    assert_int_equal(dr_st_writer_finish(w, &err), DRAMA_OK);
    size_t vn = 0;
    char *vt = tu_read_file(victim, &vn);
    assert_true(vn == 8 && !memcmp(vt, "precious", 8));
    free(vt);
    dr_st_file *f = NULL;
    assert_int_equal(dr_st_open(path, &f, &err), DRAMA_OK);
    assert_int_equal(dr_st_count(f), 1);
    dr_st_close(f);
    assert_int_equal(tu_rm_rf(dir), 0);
}

/* An empty header "{}" with no data is a valid file with no tensors; open_memory labels errors. */
static void test_memory_and_empty(void **state) {
    (void)state;
    uint8_t img[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    dr_st_file *f = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_open_memory(img, sizeof img, "mem", &f, &err), DRAMA_OK);
    assert_int_equal(dr_st_count(f), 0);
    assert_string_equal(dr_st_path(f), "mem");
    dr_st_close(f);
    img[9] = ']';
    assert_int_equal(dr_st_open_memory(img, sizeof img, "mem", &f, &err), DRAMA_EFORMAT);
    assert_null(f);
    assert_non_null(strstr(err.message, "mem"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_golden),   cmocka_unit_test(test_mlx_unpadded),
        cmocka_unit_test(test_e4m3_table),    cmocka_unit_test(test_bf16_probe),
        cmocka_unit_test(test_f16_e5m2_ints), cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_writer_abort),  cmocka_unit_test(test_memory_and_empty),
        cmocka_unit_test(test_tu_loaders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
