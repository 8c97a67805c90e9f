/* test_model_backbone.c - the backbone (on the backend of DRAMA_TEST_BACKEND, CPU by default) against the transformers goldens (golden/README.md
 * "ref/backbone" and "Variants"): embeddings, per-layer outputs, hidden and restricted logits for
 * prefill, decode steps and all 28 rows at once; every variant; thread-count and batching
 * invariance; snapshot/restore. Bounds: logits 5e-4, hidden/layers 2e-4, embeddings 1e-6. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/pool.h"
#include "io/checkpoint.h"
#include "model/backbone.h"
#include "model/loader.h"
#include "model/state.h"
#include "testbackend.h"
#include "testutil.h"

typedef struct model {
    dr_config *cfg;
    dr_ckpt *ck;
    dr_loader *ld;
    dr_backbone bb;
    dr_backend *be; /* the test backend (NULL: CPU memory, calls with the test's pools) */
} model;

static void model_open_sets(model *m, const char *rel, const char *const *sets, int n_sets) {
    memset(m, 0, sizeof *m);
    const char *dir = tu_model_dir(rel);
    drama_error e = {0};
    if (dr_config_load(dir, sets, n_sets, &m->cfg, &e) || dr_ckpt_open(dir, &m->ck, &e) ||
        dr_loader_create(m->ck, m->cfg, &m->ld, &e) || dr_backbone_bind(&m->bb, m->ld, &e)) {
        printf("%s: %s\n", rel, e.message);
        fail();
    }
    dr_loader_finish(m->ld);
    dr_findings *f = dr_loader_findings(m->ld);
    /* only the tower (not bound here) may be left over */
    int bad = dr_findings_fatal(f, 0);
    for (int i = 0; i < f->n; i++) {
        if (f->items[i].kind == DR_FIND_UNEXPECTED && strncmp(f->items[i].name, "audio_decoder_mtp", 17) == 0) continue;
        printf("%s: finding %s: %s %s\n", rel, dr_finding_kind_name(f->items[i].kind), f->items[i].name,
               f->items[i].detail);
        if (f->items[i].kind == DR_FIND_UNEXPECTED) bad++;
    }
    assert_int_equal(bad, 0);
    /* ids from config.json (the tiny tokenizer agrees, golden/README.md) */
    int64_t S = m->cfg->tokens.semantic_start, n_sem = m->cfg->tokens.semantic_end - S + 1;
    assert_int_equal(dr_backbone_set_tokens(&m->bb, S, n_sem, m->cfg->tokens.eos[0], &e), DRAMA_OK);
    m->be = tu_backend_open(&m->bb, NULL);
}

static void model_open(model *m, const char *rel) { model_open_sets(m, rel, NULL, 0); }

static void model_close(model *m) {
    dr_backend_free(m->be);
    dr_backbone_release(&m->bb);
    dr_loader_free(m->ld);
    dr_ckpt_close(m->ck);
    dr_config_free(m->cfg);
}

/* Golden full-vocabulary logits [rows][vocab] -> restricted [rows][n_sem + 1]. */
static float *restrict_cols(const model *m, const float *full, int64_t rows, int64_t vocab) {
    int64_t nl = dr_backbone_n_logits(&m->bb), S = m->bb.sem_start;
    float *r = malloc((size_t)(rows * nl) * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < nl - 1; j++) r[i * nl + j] = full[i * vocab + S + j];
        r[i * nl + nl - 1] = full[i * vocab + m->bb.end_id];
    }
    return r;
}

static int check(const char *label, const float *a, const float *ref, int64_t n, double bound) {
    tu_cmp c = tu_compare_f32(a, ref, n);
    return tu_report(label, c, bound);
}

/* Run one model against one golden file. full = golden has embeds/layer_out and all prefill logits. */
static void run_golden(const char *model_rel, const char *golden_rel, const char *tag, int full) {
    model m;
    model_open(&m, model_rel);
    const char *g = tu_golden(golden_rel);
    int64_t n_pre_el, n_dec_el, H = m.bb.d.H, nl = dr_backbone_n_logits(&m.bb);
    int width = dr_backbone_row_width(&m.bb);
    int32_t *pre_rows = tu_load_i32(g, "prefill.rows", &n_pre_el);
    int32_t *dec_rows = tu_load_i32(g, "decode.rows", &n_dec_el);
    int64_t np = n_pre_el / width, nd = n_dec_el / width, vocab;
    float *g_hidden = tu_load_f32(g, "prefill.hidden", NULL);
    int64_t n_lrows;
    int32_t *lrow_idx = tu_load_i32(g, "prefill.logits_row_index", &n_lrows);
    int64_t n_glog;
    float *g_logits_full = tu_load_f32(g, "prefill.logits", &n_glog);
    vocab = n_glog / n_lrows;
    float *g_logits = restrict_cols(&m, g_logits_full, n_lrows, vocab);
    float *g_dec_hidden = tu_load_f32(g, "decode.hidden", NULL);
    float *g_dec_logits_full = tu_load_f32(g, "decode.logits", NULL);
    float *g_dec_logits = restrict_cols(&m, g_dec_logits_full, nd, vocab);

    dr_pool *pool = dr_pool_create(2);
    dr_bb_state *st = NULL;
    drama_error e = {0};
    assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, 8, &st, &e), DRAMA_OK);
    float *hidden = malloc((size_t)(np + nd) * H * sizeof(float));
    float *logits = malloc((size_t)(np + nd) * nl * sizeof(float));
    float *embeds = malloc((size_t)np * H * sizeof(float));
    float *layers = malloc((size_t)m.bb.d.n_layers * np * H * sizeof(float));
    dr_bb_trace tr = {embeds, layers, NULL};
    if (dr_backbone_forward(&m.bb, st, pre_rows, np, hidden, logits, &tr, pool, &e)) {
        printf("%s\n", e.message);
        fail();
    }
    int ok = 1;
    char label[128];
    if (full) {
        float *g_emb = tu_load_f32(g, "prefill.embeds", NULL);
        float *g_lay = tu_load_f32(g, "prefill.layer_out", NULL);
        snprintf(label, sizeof label, "%s prefill.embeds", tag);
        ok &= check(label, embeds, g_emb, np * H, 1e-6);
        for (int L = 0; L < m.bb.d.n_layers; L++) {
            snprintf(label, sizeof label, "%s prefill.layer_out[%d]", tag, L);
            ok &= check(label, layers + (int64_t)L * np * H, g_lay + (int64_t)L * np * H, np * H, 2e-4);
        }
        free(g_emb);
        free(g_lay);
    }
    snprintf(label, sizeof label, "%s prefill.hidden", tag);
    ok &= check(label, hidden, g_hidden, np * H, 2e-4);
    float *sel = malloc((size_t)(n_lrows * nl) * sizeof(float));
    for (int64_t i = 0; i < n_lrows; i++) memcpy(sel + i * nl, logits + (int64_t)lrow_idx[i] * nl, (size_t)nl * sizeof(float));
    snprintf(label, sizeof label, "%s prefill.logits (%lld rows, restricted)", tag, (long long)n_lrows);
    ok &= check(label, sel, g_logits, n_lrows * nl, 5e-4);

    /* decode steps, one row each */
    float *dh = malloc((size_t)nd * H * sizeof(float)), *dl = malloc((size_t)nd * nl * sizeof(float));
    for (int64_t i = 0; i < nd; i++)
        assert_int_equal(dr_backbone_forward(&m.bb, st, dec_rows + i * width, 1, dh + i * H, dl + i * nl, NULL, pool, &e),
                         DRAMA_OK);
    assert_int_equal(st->pos, np + nd);
    snprintf(label, sizeof label, "%s decode.hidden", tag);
    ok &= check(label, dh, g_dec_hidden, nd * H, 2e-4);
    snprintf(label, sizeof label, "%s decode.logits", tag);
    ok &= check(label, dl, g_dec_logits, nd * nl, 5e-4);

    /* all rows in one prefill: last nd rows match decode (and are bit-identical: row-wise recurrence) */
    int32_t *all = malloc((size_t)(np + nd) * width * sizeof(int32_t));
    memcpy(all, pre_rows, (size_t)np * width * sizeof(int32_t));
    memcpy(all + np * width, dec_rows, (size_t)nd * width * sizeof(int32_t));
    dr_bb_state_reset(st);
    dr_pool *pool1 = dr_pool_create(1);
    assert_int_equal(dr_backbone_forward(&m.bb, st, all, np + nd, hidden, logits, NULL, pool1, &e), DRAMA_OK);
    snprintf(label, sizeof label, "%s all-rows prefill: decode.hidden", tag);
    ok &= check(label, hidden + np * H, g_dec_hidden, nd * H, 2e-4);
    snprintf(label, sizeof label, "%s all-rows prefill: decode.logits", tag);
    ok &= check(label, logits + np * nl, g_dec_logits, nd * nl, 5e-4);
    assert_memory_equal(hidden + np * H, dh, (size_t)nd * H * sizeof(float));
    assert_memory_equal(logits + np * nl, dl, (size_t)nd * nl * sizeof(float));
    assert_true(ok);

    dr_pool_free(pool1);
    dr_pool_free(pool);
    dr_bb_state_free(st);
    free(all); free(dh); free(dl); free(sel); free(hidden); free(logits); free(embeds); free(layers);
    free(pre_rows); free(dec_rows); free(g_hidden); free(lrow_idx); free(g_logits_full); free(g_logits);
    free(g_dec_hidden); free(g_dec_logits_full); free(g_dec_logits);
    model_close(&m);
}

static void test_base(void **s) { (void)s; run_golden("tiny-drama3", "ref/backbone.safetensors", "base", 1); }
static void test_fused(void **s) {
    (void)s;
    run_golden("variants/fused-experts", "ref/backbone.safetensors", "fused-experts", 1);
}
static void test_fp8(void **s) { (void)s; run_golden("variants/fp8-block", "ref/variant-fp8-block.safetensors", "fp8-block", 0); }
static void test_nvfp4(void **s) { (void)s; run_golden("variants/nvfp4", "ref/variant-nvfp4.safetensors", "nvfp4", 0); }
static void test_mlx(void **s) {
    (void)s;
    run_golden("variants/mlx-affine4", "ref/variant-mlx-affine4.safetensors", "mlx-affine4", 0);
}
static void test_pruned(void **s) { (void)s; run_golden("variants/pruned", "ref/variant-pruned.safetensors", "pruned", 0); }

/* Thread count, batching and snapshot/restore never change a bit. */
static void test_invariance(void **s) {
    (void)s;
    model m;
    model_open(&m, "tiny-drama3");
    const char *g = tu_golden("ref/backbone.safetensors");
    int width = dr_backbone_row_width(&m.bb);
    int64_t n_el, nd_el, H = m.bb.d.H, nl = dr_backbone_n_logits(&m.bb);
    int32_t *rows = tu_load_i32(g, "prefill.rows", &n_el);
    int32_t *dec = tu_load_i32(g, "decode.rows", &nd_el);
    int64_t np = n_el / width;
    drama_error e = {0};
    dr_pool *p1 = dr_pool_create(1), *p3 = dr_pool_create(3);
    dr_bb_state *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, 4, &a, &e), DRAMA_OK);
    assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, 4, &b, &e), DRAMA_OK);
    float *h1 = malloc((size_t)np * H * 4), *h3 = malloc((size_t)np * H * 4);
    float *l1 = malloc((size_t)np * nl * 4), *l3 = malloc((size_t)np * nl * 4);
    assert_int_equal(dr_backbone_forward(&m.bb, a, rows, np, h1, l1, NULL, p1, &e), DRAMA_OK);
    assert_int_equal(dr_backbone_forward(&m.bb, b, rows, np, h3, l3, NULL, p3, &e), DRAMA_OK);
    assert_memory_equal(h1, h3, (size_t)np * H * 4);
    assert_memory_equal(l1, l3, (size_t)np * nl * 4);

    /* session b gets a different history: only the first 12 rows, then decode row 0 */
    dr_bb_state_reset(b);
    assert_int_equal(dr_backbone_forward(&m.bb, b, rows, 12, NULL, NULL, NULL, p1, &e), DRAMA_OK);
    assert_int_equal(dr_bb_state_clone(a, &c, &e), DRAMA_OK); /* snapshot of a */
    dr_bb_state *snap_b = NULL;
    assert_int_equal(dr_bb_state_clone(b, &snap_b, &e), DRAMA_OK);
    /* alone */
    float ha[256], hb[256], la[8192], lb[8192];
    assert_true(H <= 256 && nl <= 8192);
    assert_int_equal(dr_backbone_forward(&m.bb, a, dec, 1, ha, la, NULL, p1, &e), DRAMA_OK);
    assert_int_equal(dr_backbone_forward(&m.bb, b, dec + width, 1, hb, lb, NULL, p1, &e), DRAMA_OK);
    /* restore both, then batched */
    assert_int_equal(dr_bb_state_copy(a, c, &e), DRAMA_OK);
    assert_int_equal(dr_bb_state_copy(b, snap_b, &e), DRAMA_OK);
    int32_t two[64];
    memcpy(two, dec, (size_t)width * 4);
    memcpy(two + width, dec + width, (size_t)width * 4);
    dr_bb_state *sts[2] = {a, b};
    float hh[512], ll[16384];
    assert_int_equal(dr_backbone_step_batch(&m.bb, sts, 2, two, hh, ll, p3, &e), DRAMA_OK);
    assert_memory_equal(hh, ha, (size_t)H * 4);
    assert_memory_equal(hh + H, hb, (size_t)H * 4);
    assert_memory_equal(ll, la, (size_t)nl * 4);
    assert_memory_equal(ll + nl, lb, (size_t)nl * 4);
    assert_int_equal(a->pos, np + 1);
    assert_int_equal(b->pos, 13);
    /* the same state twice in one batch is refused */
    dr_bb_state *dup[2] = {a, a};
    assert_int_not_equal(dr_backbone_step_batch(&m.bb, dup, 2, two, hh, ll, p1, &e), DRAMA_OK);

    /* bad rows are errors naming the row, never crashes */
    int32_t bad[32] = {0};
    memcpy(bad, dec, (size_t)width * 4);
    bad[1] = bad[1] + 1; /* c0 disagrees with the semantic token */
    memset(&e, 0, sizeof e);
    assert_int_equal(dr_backbone_forward(&m.bb, a, bad, 1, NULL, NULL, NULL, p1, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "row 0"));
    bad[0] = 1 << 30;
    assert_int_equal(dr_backbone_forward(&m.bb, a, bad, 1, NULL, NULL, NULL, p1, &e), DRAMA_EINVAL);
    memcpy(bad, dec, (size_t)width * 4);
    bad[5] = 999999;
    assert_int_equal(dr_backbone_forward(&m.bb, a, bad, 1, NULL, NULL, NULL, p1, &e), DRAMA_EINVAL);
    assert_int_equal(a->pos, np + 1); /* untouched by refused rows */

    dr_bb_state_free(a); dr_bb_state_free(b); dr_bb_state_free(c); dr_bb_state_free(snap_b);
    dr_pool_free(p1); dr_pool_free(p3);
    free(h1); free(h3); free(l1); free(l3); free(rows); free(dec);
    model_close(&m);
}

/* The input-row switches (MODEL.md 6): number of codebooks summed, the scale, the token embedding
 * at audio rows. The embedding of one audio row is recomputed here from the two tables. */
static void test_input_switches(void **s) {
    (void)s;
    const char *settings[][2] = {{NULL, NULL},
                                 {"input.codebooks=3", "input.code_scale=none"},
                                 {"input.add_token_embedding=false", "input.codebooks=1"}};
    float *first = NULL;
    for (int c = 0; c < 3; c++) {
        model m;
        int n_sets = settings[c][0] ? 2 : 0;
        model_open_sets(&m, "tiny-drama3", settings[c], n_sets);
        const dr_bb_dims *d = &m.bb.d;
        int width = dr_backbone_row_width(&m.bb), n = d->in_codebooks;
        int64_t H = d->H;
        int32_t *row = calloc((size_t)width, sizeof *row);
        row[1] = 5;
        row[0] = (int32_t)(m.bb.sem_start + row[1]);
        for (int k = 1; k < d->n_codebooks; k++) row[1 + k] = (int32_t)((k * 37 + 11) % d->code_stride);
        float *emb = malloc((size_t)H * sizeof *emb), *hid = malloc((size_t)H * sizeof *hid);
        float *tmp = malloc((size_t)H * sizeof *tmp);
        double *want = calloc((size_t)H, sizeof *want);
        dr_bb_state *st = NULL;
        drama_error e = {0};
        assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, 1, &st, &e), DRAMA_OK);
        dr_bb_trace tr = {emb, NULL, NULL};
        assert_int_equal(dr_backbone_forward(&m.bb, st, row, 1, hid, NULL, &tr, NULL, &e), DRAMA_OK);
        if (d->add_token_embedding) {
            dr_weight_dequant_row(&m.bb.embed, row[0], tmp);
            for (int64_t j = 0; j < H; j++) want[j] += tmp[j];
        }
        for (int k = 0; k < n; k++) {
            dr_weight_dequant_row(&m.bb.code_table, row[1 + k] + (int64_t)k * d->code_stride, tmp);
            for (int64_t j = 0; j < H; j++) want[j] += tmp[j];
        }
        double scale = d->code_scale_rsqrt ? 1.0 / sqrt(n + 1.0) : 1.0;
        for (int64_t j = 0; j < H; j++) want[j] *= scale;
        char label[96];
        snprintf(label, sizeof label, "input switches %d (codebooks %d, rsqrt %d, token %d)", c, n, d->code_scale_rsqrt,
                 d->add_token_embedding);
        assert_true(tu_report(label, tu_compare_f32_f64(emb, want, H), 1e-7));
        if (c == 0) {
            assert_int_equal(n, d->n_codebooks); /* auto: every codebook */
            first = emb;
            emb = NULL;
        } else {
            assert_true(tu_report_differs("the switch changed the row", tu_compare_f32(emb, first, H), 1e-3));
        }
        dr_bb_state_free(st);
        free(row), free(emb), free(hid), free(tmp), free(want);
        model_close(&m);
    }
    free(first);
}

/* One 600-row prefill (longer than the internal 256-row chunk) against the same rows split into
 * two calls at `cut`, traced layer outputs included: bit for bit when require_equal, else within
 * 2e-4 of each other (hidden, layers) / 5e-4 (logits) and visibly not bit-identical. sets: switches. */
static void long_prefill_split(const char *const *sets, int n_sets, int64_t cut, int require_equal) {
    model m;
    model_open_sets(&m, "tiny-drama3", sets, n_sets);
    const char *g = tu_golden("ref/backbone.safetensors");
    int width = dr_backbone_row_width(&m.bb);
    int64_t n_el, H = m.bb.d.H, nl = dr_backbone_n_logits(&m.bb), L = m.bb.d.n_layers;
    int32_t *base = tu_load_i32(g, "prefill.rows", &n_el);
    int64_t nb = n_el / width, n = 600;
    int32_t *rows = malloc((size_t)(n * width) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) memcpy(rows + i * width, base + (i % nb) * width, (size_t)width * sizeof(int32_t));
    float *h1 = malloc((size_t)(n * H) * 4), *h2 = malloc((size_t)(n * H) * 4);
    float *l1 = malloc((size_t)(n * nl) * 4), *l2 = malloc((size_t)(n * nl) * 4);
    float *t1 = malloc((size_t)(L * n * H) * 4), *ta = malloc((size_t)(L * cut * H) * 4),
          *tb = malloc((size_t)(L * (n - cut) * H) * 4), *t2 = malloc((size_t)(L * n * H) * 4);
    dr_pool *pool = dr_pool_create(2);
    drama_error e = {0};
    dr_bb_state *st = NULL;
    assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, 16, &st, &e), DRAMA_OK);
    dr_bb_trace tr = {NULL, t1, NULL};
    assert_int_equal(dr_backbone_forward(&m.bb, st, rows, n, h1, l1, &tr, pool, &e), DRAMA_OK);
    assert_int_equal(st->pos, n);
    dr_bb_state_reset(st);
    dr_bb_trace tra = {NULL, ta, NULL}, trb = {NULL, tb, NULL};
    assert_int_equal(dr_backbone_forward(&m.bb, st, rows, cut, h2, l2, &tra, pool, &e), DRAMA_OK);
    assert_int_equal(dr_backbone_forward(&m.bb, st, rows + cut * width, n - cut, h2 + cut * H, l2 + cut * nl, &trb,
                                         pool, &e), DRAMA_OK);
    for (int64_t l = 0; l < L; l++) { /* the split traces in the one call's layout */
        memcpy(t2 + l * n * H, ta + l * cut * H, (size_t)(cut * H) * 4);
        memcpy(t2 + (l * n + cut) * H, tb + l * (n - cut) * H, (size_t)((n - cut) * H) * 4);
    }
    char label[160];
    snprintf(label, sizeof label, "long prefill %s, split at %lld", n_sets ? sets[0] : "(default)", (long long)cut);
    assert_int_equal(m.bb.d.gdn_recurrent, n_sets > 0); /* chunked is the default */
    if (require_equal) {
        assert_memory_equal(h1, h2, (size_t)(n * H) * 4);
        assert_memory_equal(l1, l2, (size_t)(n * nl) * 4);
        assert_memory_equal(t1, t2, (size_t)(L * n * H) * 4);
    } else {
        int ok = tu_report(label, tu_compare_f32(h2, h1, n * H), 2e-4);
        ok &= tu_report(label, tu_compare_f32(t2, t1, L * n * H), 2e-4);
        ok &= tu_report(label, tu_compare_f32(l2, l1, n * nl), 5e-4);
        assert_true(ok);
        assert_true(memcmp(h1, h2, (size_t)(n * H) * 4) != 0); /* the two forms really differ */
    }
    for (int64_t i = 0; i < n * nl; i++) assert_true(isfinite(l1[i]));
    dr_bb_state_free(st);
    dr_pool_free(pool);
    free(base); free(rows); free(h1); free(h2); free(l1); free(l2); free(t1); free(ta); free(tb); free(t2);
    model_close(&m);
}

/* Hidden rows of a 600-row prefill (default switches: chunked) in calls cut at cuts[0..n_cuts). */
static void prefill_in_calls(model *m, const int32_t *rows, const int64_t *cuts, int n_cuts, float *hidden,
                             dr_pool *pool) {
    int width = dr_backbone_row_width(&m->bb);
    int64_t H = m->bb.d.H, n = 600, r0 = 0;
    drama_error e = {0};
    dr_bb_state *st = NULL;
    assert_int_equal(dr_bb_state_create_on(m->be, &m->bb, 16, &st, &e), DRAMA_OK);
    for (int i = 0; i <= n_cuts; i++) {
        int64_t r1 = i < n_cuts ? cuts[i] : n;
        assert_int_equal(dr_backbone_forward(&m->bb, st, rows + r0 * width, r1 - r0, hidden + r0 * H, NULL, NULL,
                                             pool, &e), DRAMA_OK);
        r0 = r1;
    }
    dr_bb_state_free(st);
}

/* DeltaNet prefill (docs/backbone.md, Determinism): row by row (deltanet.prefill=recurrent) every
 * split is bit for bit; chunked (the default) blocks are aligned to positions, so a split at a
 * multiple of 64 (here 256, also the internal chunk) changes no bit and a split at 257 changes
 * which rows take the chunked form (fp32-close, and not bit-identical). */
static void test_long_prefill(void **s) {
    (void)s;
    const char *recurrent[] = {"deltanet.prefill=recurrent"};
    long_prefill_split(recurrent, 1, 257, 1);
    long_prefill_split(NULL, 0, 256, 1);
    long_prefill_split(NULL, 0, 257, 0);
}

/* A call that starts off a multiple of 64 cuts its internal 256-row chunks at multiples of 64
 * positions: rows 100..600 in one call equal them in calls cut at 128 and 384 (and visibly
 * differ from a cut at 356, where the unaligned chunking would fall). */
static void test_prefill_inner_cuts(void **s) {
    (void)s;
    model m;
    model_open(&m, "tiny-drama3");
    int width = dr_backbone_row_width(&m.bb);
    int64_t n_el, H = m.bb.d.H, n = 600;
    int32_t *base = tu_load_i32(tu_golden("ref/backbone.safetensors"), "prefill.rows", &n_el);
    int64_t nb = n_el / width;
    int32_t *rows = malloc((size_t)(n * width) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) memcpy(rows + i * width, base + (i % nb) * width, (size_t)width * sizeof(int32_t));
    float *h1 = malloc((size_t)(n * H) * 4), *h2 = malloc((size_t)(n * H) * 4), *h3 = malloc((size_t)(n * H) * 4);
    dr_pool *pool = dr_pool_create(2);
    const int64_t one[] = {100}, aligned[] = {100, 128, 384}, other[] = {100, 356};
    prefill_in_calls(&m, rows, one, 1, h1, pool);
    prefill_in_calls(&m, rows, aligned, 3, h2, pool);
    prefill_in_calls(&m, rows, other, 2, h3, pool);
    assert_memory_equal(h1, h2, (size_t)(n * H) * 4);
    assert_true(memcmp(h1, h3, (size_t)(n * H) * 4) != 0);
    assert_true(tu_report("prefill cut at 356 vs aligned", tu_compare_f32(h3, h1, n * H), 2e-4));
    dr_pool_free(pool);
    free(base); free(rows); free(h1); free(h2); free(h3);
    model_close(&m);
}

/* Teacher-forced against the float64 reference of ref/e2e-*.safetensors: prefill prompt.rows,
 * then append each golden frame as a row. hidden[f] is the row that predicts frame f. */
static void run_e2e(const char *golden_rel, const char *tag) {
    model m;
    model_open(&m, "tiny-drama3");
    const char *g = tu_golden(golden_rel);
    int width = dr_backbone_row_width(&m.bb);
    int64_t n_p, n_f, n_h, H = m.bb.d.H, nl = dr_backbone_n_logits(&m.bb);
    int32_t *prompt = tu_load_i32(g, "prompt.rows", &n_p);
    int32_t *frames = tu_load_i32(g, "frames", &n_f);
    float *g_hidden = tu_load_f32(g, "hidden", &n_h);
    float *g_sem = tu_load_f32(g, "sem_logits", NULL);
    int64_t L = n_p / width, F = n_f / (width - 1);
    assert_int_equal(n_h, (F + 1) * H);
    drama_error e = {0};
    dr_bb_state *st = NULL;
    assert_int_equal(dr_bb_state_create_on(m.be, &m.bb, L + F, &st, &e), DRAMA_OK);
    float *hid = malloc((size_t)(L + F) * H * sizeof(float)), *lg = malloc((size_t)(L + F) * nl * sizeof(float));
    assert_int_equal(dr_backbone_forward(&m.bb, st, prompt, L, hid, lg, NULL, NULL, &e), DRAMA_OK);
    for (int64_t f = 0; f < F; f++) {
        int32_t row[64];
        row[0] = (int32_t)(m.bb.sem_start + frames[f * (width - 1)]);
        memcpy(row + 1, frames + f * (width - 1), (size_t)(width - 1) * sizeof(int32_t));
        assert_int_equal(dr_backbone_forward(&m.bb, st, row, 1, hid + (L + f) * H, lg + (L + f) * nl, NULL, NULL, &e),
                         DRAMA_OK);
    }
    char label[128];
    snprintf(label, sizeof label, "%s vs float64: hidden", tag);
    int ok = tu_report(label, tu_compare_f32(hid + (L - 1) * H, g_hidden, (F + 1) * H), 2e-4);
    snprintf(label, sizeof label, "%s vs float64: sem_logits", tag);
    tu_cmp c = tu_compare_f32(lg + (L - 1) * nl, g_sem, F * nl);
    ok &= tu_report(label, c, 5e-4);
    assert_true(ok);
    assert_true(c.max_rel < 1e-4); /* issue 8: within 1e-4 relative of the float64 reference */
    dr_bb_state_free(st);
    free(hid); free(lg); free(prompt); free(frames); free(g_hidden); free(g_sem);
    model_close(&m);
}

static void test_e2e_float64(void **s) {
    (void)s;
    run_e2e("ref/e2e-noref.safetensors", "e2e-noref");
    run_e2e("ref/e2e-ref12.safetensors", "e2e-ref12");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base),  cmocka_unit_test(test_fused),  cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_nvfp4), cmocka_unit_test(test_mlx),    cmocka_unit_test(test_pruned),
        cmocka_unit_test(test_invariance), cmocka_unit_test(test_e2e_float64),
        cmocka_unit_test(test_long_prefill), cmocka_unit_test(test_prefill_inner_cuts), cmocka_unit_test(test_input_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
