/* Golden test of src/model/tower (hypothesis H1, ../shared/golden/TOWER-H1.md): feed h_bb of
 * ref/tower.safetensors with its codes and mask, teacher-forced, all rows in one call and again
 * one row per call through the KV caches; compare every layer output (bound 2e-4) and every head
 * logit (bound 5e-4) in float64. Also: generation with argmax picks equals the teacher-forced
 * logits, threads 1 vs 3 bit-identical, and bad input fails with a message. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/config.h"
#include "model/tower.h"
#include "testbackend.h"
#include "testutil.h"

/* Tensors come through the engine's checkpoint reader and loader (every shard of the index,
 * no shard name assumed), as in a real load. */
typedef struct shards {
    dr_ckpt *ckpt;
    dr_loader *ld;
} shards;

static const dr_tensor *find_in_shards(void *ctx, const char *name) {
    shards *s = ctx;
    return dr_loader_peek(s->ld, name);
}

static void open_shards(const char *dir, const dr_config *cfg, shards *s) {
    drama_error e = {0};
    memset(s, 0, sizeof *s);
    if (dr_ckpt_open(dir, &s->ckpt, &e)) fail_msg("%s", e.message);
    if (dr_loader_create(s->ckpt, cfg, &s->ld, &e)) fail_msg("%s", e.message);
}

static void close_shards(shards *s) {
    dr_loader_free(s->ld);
    dr_ckpt_close(s->ckpt);
}

typedef struct fixture {
    dr_config *cfg;
    shards sh;
    dr_tower tower;
    dr_backend *be; /* the test backend (NULL: CPU memory, calls with the test's pools) */
    int T, D, NC, L, HV;
    float *h, *mask_f, *layer_out, *logits;
    int32_t *codes;
    uint8_t *mask;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    const char *dir = tu_model_dir("tiny-drama3");
    drama_error e = {0};
    if (dr_config_load(dir, NULL, 0, &f->cfg, &e)) fail_msg("%s", e.message);
    open_shards(dir, f->cfg, &f->sh);
    dr_tower_dims d;
    if (dr_tower_dims_from_config(f->cfg, &d, &e)) fail_msg("%s", e.message);
    if (dr_tower_bind(&f->tower, &d, find_in_shards, &f->sh, &e)) fail_msg("%s", e.message);
    f->be = tu_backend_open(NULL, &f->tower);
    const char *g = tu_golden("ref/tower.safetensors");
    int64_t n;
    f->h = tu_load_f32(g, "h_bb", &n);
    f->D = f->tower.input_dim;
    f->T = (int)(n / f->D);
    f->NC = d.num_codebooks;
    f->L = f->tower.n_layers;
    f->HV = d.head_vocab;
    f->codes = tu_load_i32(g, "codes", &n);
    assert_int_equal(n, (int64_t)f->T * f->NC);
    f->mask_f = tu_load_f32(g, "mask", &n);
    assert_int_equal(n, f->T);
    f->mask = calloc((size_t)f->T, 1);
    for (int r = 0; r < f->T; r++) f->mask[r] = f->mask_f[r] != 0;
    f->layer_out = tu_load_f32(g, "layer_out", &n);
    assert_int_equal(n, (int64_t)f->L * f->T * f->tower.d.dim);
    f->logits = tu_load_f32(g, "logits", &n);
    assert_int_equal(n, (int64_t)f->T * (f->NC - 1) * f->HV);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dr_backend_free(f->be);
    dr_tower_release(&f->tower);
    close_shards(&f->sh);
    dr_config_free(f->cfg);
    free(f->h);
    free(f->mask_f);
    free(f->mask);
    free(f->layer_out);
    free(f->logits);
    free(f->codes);
    free(f);
    return 0;
}

static void compare_all(fixture *f, const float *lo, const float *lg, const char *how) {
    char label[128];
    int ok = 1;
    int64_t per = (int64_t)f->T * f->tower.d.dim;
    for (int l = 0; l < f->L; l++) {
        snprintf(label, sizeof label, "tower %s layer_out[%d]", how, l);
        ok &= tu_report(label, tu_compare_f32(lo + l * per, f->layer_out + l * per, per), 2e-4);
    }
    snprintf(label, sizeof label, "tower %s logits", how);
    ok &= tu_report(label, tu_compare_f32(lg, f->logits, (int64_t)f->T * (f->NC - 1) * f->HV), 5e-4);
    assert_true(ok);
}

static void run_teacher_forced(fixture *f, int rows_per_call, dr_pool *pool, float *lo, float *lg) {
    dr_tower_cache *c;
    drama_error e = {0};
    assert_int_equal(dr_tower_cache_create_on(f->be, &f->tower, 4, &c, &e), DRAMA_OK);
    int64_t D = f->tower.d.dim, per = (int64_t)f->T * D, hs = (int64_t)(f->NC - 1) * f->HV;
    float *lo1 = calloc((size_t)f->L * rows_per_call * D, sizeof(float));
    float *lg1 = calloc((size_t)rows_per_call * hs, sizeof(float));
    for (int r0 = 0; r0 < f->T; r0 += rows_per_call) {
        int n = f->T - r0 < rows_per_call ? f->T - r0 : rows_per_call;
        if (dr_tower_forward(&f->tower, c, n, f->h + (int64_t)r0 * f->D, f->codes + (int64_t)r0 * f->NC,
                             f->mask + r0, lo1, lg1, pool, &e))
            fail_msg("%s", e.message);
        for (int l = 0; l < f->L; l++)
            memcpy(lo + l * per + r0 * D, lo1 + (int64_t)l * n * D, (size_t)n * D * sizeof(float));
        memcpy(lg + r0 * hs, lg1, (size_t)n * hs * sizeof(float));
    }
    assert_int_equal(c->len, f->T);
    free(lo1);
    free(lg1);
    dr_tower_cache_free(c);
}

static void test_golden_all_rows(void **state) {
    fixture *f = *state;
    size_t nlo = (size_t)f->L * f->T * f->tower.d.dim, nlg = (size_t)f->T * (f->NC - 1) * f->HV;
    float *lo = calloc(nlo, sizeof(float)), *lg = calloc(nlg, sizeof(float));
    run_teacher_forced(f, f->T, NULL, lo, lg);
    compare_all(f, lo, lg, "all rows");
    /* one row per call, threads 3: must be bit-identical to the all-rows pass */
    float *lo2 = calloc(nlo, sizeof(float)), *lg2 = calloc(nlg, sizeof(float));
    dr_pool *pool = dr_pool_create(3);
    run_teacher_forced(f, 1, pool, lo2, lg2);
    compare_all(f, lo2, lg2, "row by row");
    assert_memory_equal(lo, lo2, nlo * sizeof(float));
    assert_memory_equal(lg, lg2, nlg * sizeof(float));
    /* uneven groups of 7 */
    run_teacher_forced(f, 7, pool, lo2, lg2);
    assert_memory_equal(lg, lg2, nlg * sizeof(float));
    dr_pool_free(pool);
    free(lo);
    free(lg);
    free(lo2);
    free(lg2);
}

/* Generation at the last row with the golden codes as picks reproduces the golden logits of
 * that row (the chain feeds c_j to layer j exactly as the teacher-forced pass does). */
typedef struct pick_ctx {
    const int32_t *codes;
    int calls;
} pick_ctx;

static drama_status pick_golden(void *ctx, int codebook, const float *logits, int n, int *code, drama_error *err) {
    pick_ctx *p = ctx;
    (void)logits;
    (void)n;
    (void)err;
    assert_int_equal(codebook, p->calls + 1);
    p->calls++;
    *code = p->codes[codebook];
    return DRAMA_OK;
}

static drama_status pick_argmax1(void *ctx, int codebook, const float *l, int n, int *code, drama_error *err) {
    (void)ctx; (void)codebook; (void)err;
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    *code = b;
    return DRAMA_OK;
}

static void test_generate_matches_teacher_forced(void **state) {
    fixture *f = *state;
    drama_error e = {0};
    dr_tower_cache *c;
    assert_int_equal(dr_tower_cache_create_on(f->be, &f->tower, 0, &c, &e), DRAMA_OK);
    int last = f->T - 1;
    assert_true(f->mask[last]); /* the extra random frame */
    assert_int_equal(dr_tower_forward(&f->tower, c, last, f->h, f->codes, f->mask, NULL, NULL, NULL, &e), DRAMA_OK);
    int32_t out[16];
    float *hl = calloc((size_t)(f->NC - 1) * f->HV, sizeof(float));
    pick_ctx pc = {f->codes + (int64_t)last * f->NC, 0};
    if (dr_tower_generate(&f->tower, c, f->h + (int64_t)last * f->D, pc.codes[0], pick_golden, &pc, out, hl, NULL, &e))
        fail_msg("%s", e.message);
    assert_int_equal(pc.calls, f->NC - 1);
    for (int j = 0; j < f->NC; j++) assert_int_equal(out[j], pc.codes[j]);
    int64_t hs = (int64_t)(f->NC - 1) * f->HV;
    assert_true(tu_report("tower generate head logits (last row)", tu_compare_f32(hl, f->logits + last * hs, hs), 5e-4));
    assert_int_equal(c->len, f->T);
    free(hl);
    dr_tower_cache_free(c);
}

static void test_bad_input(void **state) {
    fixture *f = *state;
    drama_error e = {0};
    dr_tower_cache *c;
    assert_int_equal(dr_tower_cache_create_on(f->be, &f->tower, 0, &c, &e), DRAMA_OK);
    int32_t codes[16] = {0};
    uint8_t m = 1;
    codes[0] = (int32_t)f->tower.d.code_stride; /* one past the codebook */
    assert_int_equal(dr_tower_forward(&f->tower, c, 1, f->h, codes, &m, NULL, NULL, NULL, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "out of range"));
    assert_int_equal(c->len, 0);
    dr_error_clear(&e);
    float *h = calloc((size_t)f->D, sizeof(float));
    h[3] = NAN;
    codes[0] = 0;
    assert_int_equal(dr_tower_forward(&f->tower, c, 1, h, codes, &m, NULL, NULL, NULL, &e), DRAMA_ENUMERIC);
    free(h);
    dr_tower_cache_free(c);
    /* a missing tensor is named */
    dr_error_clear(&e);
    dr_tower t2;
    dr_tower_dims d = f->tower.d;
    d.code_table = "audio_decoder_mtp.no_such_table.weight";
    assert_int_not_equal(dr_tower_bind(&t2, &d, find_in_shards, &f->sh, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "no_such_table"));
    /* a wrong head_vocab beyond the head rows is a shape error (set explicitly: only the built-in
     * default is lowered to the head rows, test_model_tower_switches) */
    dr_error_clear(&e);
    d = f->tower.d;
    d.head_vocab = (int)f->tower.heads[0].rows + 1;
    d.head_vocab_auto = 0;
    assert_int_equal(dr_tower_bind(&t2, &d, find_in_shards, &f->sh, &e), DRAMA_ESHAPE);
    assert_non_null(strstr(e.message, "heads.0"));
}

/* Batched generation over three caches of different lengths equals each alone, bit for bit;
 * a row with a non-finite input fails alone. */
static drama_status pick_max(void *ctx, int row, int codebook, const float *l, int n, int *code, drama_error *err) {
    (void)ctx; (void)row; (void)codebook; (void)err;
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    *code = b;
    return DRAMA_OK;
}

static void test_generate_many(void **state) {
    fixture *f = *state;
    drama_error e = {0};
    int NC = f->NC, HV = f->HV;
    int lens[3] = {5, 12, 0};
    int32_t c0[3] = {17, 4000, 3};
    dr_tower_cache *solo[3], *many[3];
    int32_t want[3][16], got[3 * 16];
    float *wh = calloc((size_t)3 * (NC - 1) * HV, sizeof(float)), *gh = calloc((size_t)3 * (NC - 1) * HV, sizeof(float));
    float *h = calloc((size_t)3 * f->D, sizeof(float));
    dr_pool *pool = dr_pool_create(2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dr_tower_cache_create_on(f->be, &f->tower, 0, &solo[i], &e), DRAMA_OK);
        assert_int_equal(dr_tower_cache_create_on(f->be, &f->tower, 0, &many[i], &e), DRAMA_OK);
        if (lens[i]) {
            assert_int_equal(dr_tower_forward(&f->tower, solo[i], lens[i], f->h, f->codes, f->mask, NULL, NULL, NULL, &e), 0);
            assert_int_equal(dr_tower_forward(&f->tower, many[i], lens[i], f->h, f->codes, f->mask, NULL, NULL, NULL, &e), 0);
        }
        memcpy(h + i * f->D, f->h + (int64_t)(lens[i] + 1) * f->D, (size_t)f->D * sizeof(float));
        if (dr_tower_generate(&f->tower, solo[i], h + i * f->D, c0[i], pick_argmax1, NULL, want[i],
                              wh + (int64_t)i * (NC - 1) * HV, NULL, &e))
            fail_msg("%s", e.message);
    }
    drama_status rs[3];
    if (dr_tower_generate_many(&f->tower, many, 3, h, c0, pick_max, NULL, got, gh, rs, NULL, pool, &e))
        fail_msg("%s", e.message);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rs[i], DRAMA_OK);
        assert_memory_equal(want[i], got + i * NC, (size_t)NC * sizeof(int32_t));
        assert_int_equal(many[i]->len, lens[i] + 1);
    }
    assert_memory_equal(wh, gh, (size_t)3 * (NC - 1) * HV * sizeof(float));
    /* row 1 gets a NaN input: it alone fails, the others still equal their solo runs */
    for (int i = 0; i < 3; i++) dr_tower_cache_truncate(many[i], lens[i]);
    h[1 * f->D + 2] = NAN;
    drama_error errs[3] = {{0}, {0}, {0}};
    assert_int_equal(dr_tower_generate_many(&f->tower, many, 3, h, c0, pick_max, NULL, got, NULL, rs, errs, pool, &e), 0);
    assert_int_equal(rs[1], DRAMA_ENUMERIC);
    assert_non_null(strstr(errs[1].message, "not finite"));
    assert_int_equal(rs[0], DRAMA_OK);
    assert_int_equal(rs[2], DRAMA_OK);
    assert_memory_equal(want[0], got, (size_t)NC * sizeof(int32_t));
    assert_memory_equal(want[2], got + 2 * NC, (size_t)NC * sizeof(int32_t));
    for (int i = 0; i < 3; i++) {
        dr_tower_cache_free(solo[i]);
        dr_tower_cache_free(many[i]);
    }
    dr_pool_free(pool);
    free(wh); free(gh); free(h);
}

/* Findings mode: every tower problem is reported, not only the first. */
typedef struct hide_ctx {
    shards *sh;
    dr_tensor fake;
} hide_ctx;

static const dr_tensor *find_hiding(void *ctx, const char *name) {
    hide_ctx *h = ctx;
    if (!strcmp(name, "audio_decoder_mtp.layers.3.ffn_norm.weight")) return NULL;
    if (!strcmp(name, "audio_decoder_mtp.heads.2.weight")) return NULL;
    const dr_tensor *t = find_in_shards(h->sh, name);
    if (t && !strcmp(name, "audio_decoder_mtp_shared.layers.1.attention.wo.weight")) {
        h->fake = *t;
        h->fake.shape[0] += 1; /* one more row: mis-shaped */
        return &h->fake;
    }
    return t;
}

static void test_findings_collect_all(void **state) {
    fixture *f = *state;
    hide_ctx h = {&f->sh, {0}};
    dr_findings fnd = {0};
    drama_error e = {0};
    dr_tower t2;
    assert_int_equal(dr_tower_bind_findings(&t2, &f->tower.d, find_hiding, &h, &fnd, &e), DRAMA_ESHAPE);
    printf("tower findings: %d; error: %s\n", fnd.n, e.message);
    dr_findings_print(&fnd, stdout);
    assert_int_equal(fnd.n, 3);
    assert_int_equal(dr_findings_count(&fnd, DR_FIND_MISSING), 2);
    assert_int_equal(dr_findings_count(&fnd, DR_FIND_MISSHAPED), 1);
    assert_non_null(strstr(e.message, "3 problems"));
    dr_findings_clear(&fnd);
    /* without findings: the first problem only */
    dr_error_clear(&e);
    assert_int_equal(dr_tower_bind(&t2, &f->tower.d, find_hiding, &h, &e), DRAMA_ESHAPE);
    assert_non_null(strstr(e.message, "shared.layers.1.attention.wo"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_all_rows),
        cmocka_unit_test(test_generate_matches_teacher_forced),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_findings_collect_all),
        cmocka_unit_test(test_generate_many),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
