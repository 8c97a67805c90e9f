/* Unit tests of `drama make-model` (src/tools/make_model*.c): the codec inventory against the
 * golden real-codec inventory, the tiny codec.pth and the codec engine's expected list; a
 * generated tiny model loads through the engine's readers with realistic weight scales; every
 * expert format dequantises to its BF16 source within the format's bound; same seed gives
 * identical files; pruning; option validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "codec/codec.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/torchzip.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/state.h"
#include "num/weight.h"
#include "testutil.h"
#include "text/tokenizer.h"
#include "tools/make_model.h"

/* Fails the test with the error message (needs a drama_error e in scope). */
#define OK(call)                                                      \
    do {                                                              \
        drama_status st_ = (call);                                    \
        if (st_ != DRAMA_OK) fail_msg("%s: %s", #call, e.message);    \
    } while (0)

/* ---- inventories as sorted "name [d0, d1, ...]" lines ---- */

typedef struct lines {
    int n, cap;
    char **s;
} lines;

static void push(lines *l, const char *name, int ndim, const int64_t *shape) {
    char buf[512];
    int o = snprintf(buf, sizeof buf, "%s [", name);
    for (int i = 0; i < ndim; i++) o += snprintf(buf + o, sizeof buf - (size_t)o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + o, sizeof buf - (size_t)o, "]");
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 512;
        l->s = realloc(l->s, (size_t)l->cap * sizeof *l->s);
        assert_non_null(l->s);
    }
    l->s[l->n++] = strdup(buf);
}
static void codec_cb(void *ctx, const char *name, int ndim, const int64_t *shape) { push(ctx, name, ndim, shape); }
static int cmp_s(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static void sort_lines(lines *l) { qsort(l->s, (size_t)l->n, sizeof *l->s, cmp_s); }
static void free_lines(lines *l) {
    for (int i = 0; i < l->n; i++) free(l->s[i]);
    free(l->s);
    memset(l, 0, sizeof *l);
}
static void assert_same(lines *a, lines *b, const char *what) {
    sort_lines(a);
    sort_lines(b);
    int diffs = 0;
    for (int i = 0; i < a->n && i < b->n && diffs < 5; i++)
        if (strcmp(a->s[i], b->s[i])) printf("%s: %s vs %s\n", what, a->s[i], b->s[i]), diffs++;
    printf("%s: %d vs %d entries, %d differences shown\n", what, a->n, b->n, diffs);
    assert_int_equal(a->n, b->n);
    assert_int_equal(diffs, 0);
}

/* The real codec: the engine's expected list equals the golden real inventory, and the
 * codec.json make-model writes for the real dims parses to the engine's built-in defaults. */
static void test_codec_inventory_real(void **state) {
    (void)state;
    dr_mm_options o;
    assert_true(dr_mm_shape_defaults("full", &o));
    lines gold = {0}, eng = {0};
    json_error_t je;
    json_t *inv = json_load_file(tu_golden("codec/codec-real-inventory.json"), 0, &je);
    assert_non_null(inv);
    json_t *ts = json_object_get(inv, "tensors"), *t;
    size_t i;
    json_array_foreach(ts, i, t) {
        int64_t shape[8];
        json_t *sh = json_object_get(t, "shape"), *d;
        size_t k;
        json_array_foreach(sh, k, d) shape[k] = json_integer_value(d);
        push(&gold, json_string_value(json_object_get(t, "name")), (int)json_array_size(sh), shape);
    }
    json_decref(inv);
    dr_codec_config def, mine;
    dr_codec_config_default(&def);
    dr_codec_config_default(&mine);
    drama_error e = {0};
    OK(dr_codec_expected(&def, codec_cb, &eng, &e));
    assert_same(&eng, &gold, "dr_codec_expected (defaults) vs codec-real-inventory.json");
    const char *dir = tu_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/codec.json", dir);
    OK(dr_mm_write_codec_json(path, &o.dims.codec, &e));
    OK(dr_codec_config_read(path, &mine, &e));
    assert_true(dr_codec_config_equal(&mine, &def));
    free_lines(&gold);
    free_lines(&eng);
    tu_rm_rf(dir);
}

/* The tiny codec: codec.safetensors holds the golden tiny codec.pth's names and shapes, and its
 * codec.json parses like the golden tiny codec.json. */
static void test_codec_tiny(void **state) {
    (void)state;
    dr_mm_options o;
    assert_true(dr_mm_shape_defaults("tiny", &o));
    lines mine = {0}, gold = {0};
    const char *dir = tu_tmpdir();
    drama_error e = {0};
    OK(dr_mm_write_codec(dir, &o.dims.codec, 9, &e));
    char path[4200];
    snprintf(path, sizeof path, "%s/codec.safetensors", dir);
    dr_st_file *f = NULL;
    OK(dr_st_open(path, &f, &e));
    for (int64_t k = 0; k < dr_st_count(f); k++) {
        assert_int_equal(dr_st_at(f, k)->dtype, DR_DT_F32);
        push(&mine, dr_st_at(f, k)->name, dr_st_at(f, k)->ndim, dr_st_at(f, k)->shape);
    }
    dr_st_close(f);
    dr_pth *p = NULL;
    OK(dr_pth_open(tu_golden("tiny-drama3/codec.pth"), &p, &e));
    for (int64_t k = 0; k < dr_pth_count(p); k++) push(&gold, dr_pth_at(p, k)->name, dr_pth_at(p, k)->ndim, dr_pth_at(p, k)->shape);
    dr_pth_close(p);
    assert_same(&mine, &gold, "generated tiny codec vs golden codec.pth");
    dr_codec_config a, b;
    dr_codec_config_default(&a);
    dr_codec_config_default(&b);
    snprintf(path, sizeof path, "%s/codec.json", dir);
    OK(dr_codec_config_read(path, &a, &e));
    OK(dr_codec_config_read(tu_golden("tiny-drama3/codec.json"), &b, &e));
    assert_true(dr_codec_config_equal(&a, &b));
    free_lines(&mine);
    free_lines(&gold);
    tu_rm_rf(dir);
}

/* ---- generated models ---- */

static dr_mm_options small_opts(dr_mm_format f) {
    dr_mm_options o;
    dr_mm_shape_defaults("custom", &o);
    /* non-square, not the golden shape: hidden 96, expert width 64, 6 layers, 8 experts top-2 */
    o.dims.hidden = 96;
    o.dims.layers = 6;
    o.dims.full_attention_interval = 3;
    o.dims.experts = 8;
    o.dims.top_k = 2;
    o.dims.moe_inter = 64;
    o.dims.shared_inter = 32;
    o.dims.head_dim = 32;
    o.experts = f;
    o.q4_group = 32;
    o.seed = 42;
    o.with_codec = 0;
    return o;
}

static const dr_tensor *find(const dr_ckpt *c, const char *name) {
    const dr_tensor *t = dr_ckpt_find(c, name);
    if (!t) fail_msg("tensor %s not found", name);
    return t;
}

static float *to_f32(const dr_tensor *t) {
    float *v = malloc((size_t)dr_tensor_numel(t) * sizeof *v);
    drama_error e = {0};
    assert_non_null(v);
    assert_int_equal(dr_st_to_f32(t, v, &e), DRAMA_OK);
    return v;
}

static void stats(const dr_tensor *t, double *mean, double *sd, double *mn, double *mx) {
    float *v = to_f32(t);
    int64_t n = dr_tensor_numel(t);
    double s = 0, s2 = 0;
    *mn = INFINITY, *mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(v[i]));
        s += v[i], s2 += (double)v[i] * v[i];
        if (v[i] < *mn) *mn = v[i];
        if (v[i] > *mx) *mx = v[i];
    }
    *mean = s / (double)n;
    *sd = sqrt(fmax(s2 / (double)n - *mean * *mean, 0));
    free(v);
}

static void test_tiny_model_loads(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    dr_mm_options o;
    assert_true(dr_mm_shape_defaults("tiny", &o));
    o.seed = 3;
    drama_error e = {0};
    OK(dr_make_model(dir, &o, &e));
    dr_ckpt *c = NULL;
    OK(dr_ckpt_open(dir, &c, &e));
    assert_int_equal(dr_ckpt_count(c), 663); /* the golden tiny inventory's count (INVENTORY.md) */
    /* the only checkpoint warning: codec.safetensors is not a shard of the index */
    for (int i = 0; i < dr_ckpt_warning_count(c); i++) {
        printf("checkpoint warning: %s\n", dr_ckpt_warning(c, i));
        assert_non_null(strstr(dr_ckpt_warning(c, i), "codec.safetensors"));
    }
    dr_config *cfg = NULL;
    OK(dr_config_load(dir, NULL, 0, &cfg, &e));
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    dr_tok *tok = NULL;
    OK(dr_tok_load(path, &tok, &e));
    int32_t s0 = dr_tok_id(tok, "<|semantic:0|>");
    assert_int_equal(s0, cfg->tokens.semantic_start);
    assert_int_equal(dr_tok_id(tok, "<|semantic:4095|>"), cfg->tokens.semantic_end);
    assert_int_equal(dr_tok_id(tok, "<|im_end|>"), cfg->tokens.eos[0]);
    assert_int_equal(dr_tok_id(tok, "<|speaker:15|>"), cfg->tokens.semantic_end + 16);
    assert_int_equal(dr_tok_vocab_size(tok), cfg->text.vocab_size);
    dr_ids ids = {0};
    OK(dr_tok_encode(tok, "<|im_start|>the cat<|im_end|>", 29, &ids, &e));
    assert_true(ids.n >= 4 && ids.n < 9); /* merges apply: fewer ids than bytes */
    dr_ids_free(&ids);
    dr_tok_free(tok);

    double mean, sd, mn, mx, H = (double)cfg->text.hidden_size;
    stats(find(c, "model.language_model.layers.0.input_layernorm.weight"), &mean, &sd, &mn, &mx);
    printf("input_layernorm: mean %.4f range [%.4f, %.4f]\n", mean, mn, mx);
    assert_true(mn >= -0.0501 && mx <= 0.0501 && sd > 0.01);       /* zero-centred, 0 +- 0.05 */
    stats(find(c, "model.language_model.layers.0.linear_attn.norm.weight"), &mean, &sd, &mn, &mx);
    assert_true(mn >= 0.949 && mx <= 1.051);                         /* plain GDN norm ~ 1 */
    stats(find(c, "model.language_model.layers.0.linear_attn.A_log"), &mean, &sd, &mn, &mx);
    assert_true(mn >= 0.0 && mx <= log(16.0) + 1e-6);                /* log U(1, 16) */
    stats(find(c, "model.language_model.layers.1.linear_attn.dt_bias"), &mean, &sd, &mn, &mx);
    assert_true(log1p(exp(mn)) >= 0.99e-3 && log1p(exp(mx)) <= 1.01e-1); /* softplus(dt_bias) in [1e-3, 1e-1] */
    stats(find(c, "lm_head.weight"), &mean, &sd, &mn, &mx);
    printf("lm_head: sd %.5f (x sqrt(H) = %.3f, target logit sd 2)\n", sd, sd * sqrt(H));
    assert_true(fabs(sd * sqrt(H) - 2.0) < 0.1);
    stats(find(c, "audio_decoder_mtp.heads.3.weight"), &mean, &sd, &mn, &mx);
    assert_true(fabs(sd * sqrt((double)cfg->audio.dim) - 2.0) < 0.15);
    stats(find(c, "audio_decoder_mtp.layers.0.out_norm.weight"), &mean, &sd, &mn, &mx);
    assert_true(mn >= 0.949 && mx <= 1.051);
    dr_config_free(cfg);
    dr_ckpt_close(c);

    /* the codec loads through the codec engine */
    dr_codec *codec = NULL;
    OK(dr_codec_open(dir, DR_CODEC_LOAD_ALL, &codec, &e));
    /* decoding random codes gives audio that is neither silent nor clipped by the final tanh */
    const dr_codec_config *cc = dr_codec_cfg(codec);
    enum { F = 8 };
    int32_t codes[F * DR_CODEC_MAX_BOOKS];
    for (int f = 0; f < F; f++)
        for (int k = 0; k < cc->num_codebooks; k++)
            codes[f * cc->num_codebooks + k] = (int32_t)((37 * f + 11 * k + 5) % (k ? cc->codebook_size : cc->semantic_codebook_size));
    int64_t ns = (int64_t)F * cc->frame_length;
    float *wav = malloc((size_t)ns * sizeof *wav);
    assert_non_null(wav);
    OK(dr_codec_decode(codec, codes, F, wav, &e));
    double ss = 0, peak = 0;
    for (int64_t i = 0; i < ns; i++) {
        assert_true(isfinite(wav[i]));
        ss += (double)wav[i] * wav[i];
        peak = fmax(peak, fabs(wav[i]));
    }
    printf("codec decode of %d random frames: rms %.4f, peak %.4f\n", F, sqrt(ss / (double)ns), peak);
    assert_true(sqrt(ss / (double)ns) > 0.01 && peak < 0.99);
    free(wav);
    dr_codec_free(codec);
    tu_rm_rf(dir);
}

/* Every expert format dequantises (dr_weight_bind + dequant_row) to the BF16 model's values. */
static void test_formats_match_bf16(void **state) {
    (void)state;
    const char *base = tu_tmpdir();
    char dirs[4][4096];
    static const char *names[4] = {"bf16", "fp8", "nvfp4", "q4"};
    drama_error e = {0};
    dr_ckpt *ck[4] = {0};
    for (int f = 0; f < 4; f++) {
        snprintf(dirs[f], sizeof dirs[f], "%s/%s", base, names[f]);
        dr_mm_options o = small_opts((dr_mm_format)f);
        OK(dr_make_model(dirs[f], &o, &e));
        OK(dr_ckpt_open(dirs[f], &ck[f], &e));
    }
    /* relative bounds of |dequant - source| / max|source| per format (FORMATS.md 4) */
    static const double bound[4] = {0, 1.0 / 16, 0.25, 2.0 / 15}; /* q4: one code step of the range */
    static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int f = 1; f < 4; f++) {
        double worst = 0;
        for (int p = 0; p < 3; p++) {
            char w[256], s1[256], s2[256], b[256];
            const char *pre = "model.language_model.layers.4.mlp.experts.5";
            snprintf(w, sizeof w, "%s.%s.weight", pre, projs[p]);
            const dr_tensor *src = find(ck[0], w), *tw = find(ck[f], w), *sc = NULL, *sc2 = NULL, *bi = NULL;
            if (f == 1) snprintf(s1, sizeof s1, "%s.%s.weight_scale_inv", pre, projs[p]), sc = find(ck[f], s1);
            if (f == 2) {
                snprintf(s1, sizeof s1, "%s.%s.weight_scale", pre, projs[p]), sc = find(ck[f], s1);
                snprintf(s2, sizeof s2, "%s.%s.weight_scale_2", pre, projs[p]), sc2 = find(ck[f], s2);
            }
            if (f == 3) {
                snprintf(s1, sizeof s1, "%s.%s.scales", pre, projs[p]), sc = find(ck[f], s1);
                snprintf(b, sizeof b, "%s.%s.biases", pre, projs[p]), bi = find(ck[f], b);
            }
            dr_weight wt;
            OK(dr_weight_bind(tw, sc, sc2, bi, -1, 0, 0, &wt, &e));
            float *ref = to_f32(src);
            int64_t rows = src->shape[0], cols = src->shape[1];
            assert_int_equal(wt.rows, rows);
            assert_int_equal(wt.cols, cols);
            float *deq = malloc((size_t)(rows * cols) * sizeof *deq);
            for (int64_t r = 0; r < rows; r++) dr_weight_dequant_row(&wt, r, deq + r * cols);
            char label[64];
            snprintf(label, sizeof label, "%-5s %s", names[f], projs[p]);
            tu_cmp cmp = tu_compare_f32(deq, ref, rows * cols); /* max_rel: relative to max |source| */
            assert_true(tu_report_rel(label, cmp, bound[f]));
            assert_true(cmp.max_abs > 0); /* it really is a different encoding */
            worst = fmax(worst, cmp.max_rel);
            free(deq);
            free(ref);
        }
        (void)worst;
    }
    for (int f = 0; f < 4; f++) dr_ckpt_close(ck[f]);
    tu_rm_rf(base);
}

static void test_same_seed_same_files(void **state) {
    (void)state;
    const char *base = tu_tmpdir();
    char a[4096], b[4096], c[4096];
    snprintf(a, sizeof a, "%s/a", base);
    snprintf(b, sizeof b, "%s/b", base);
    snprintf(c, sizeof c, "%s/c", base);
    dr_mm_options o = small_opts(DR_MM_FP8);
    o.with_codec = 1;
    o.shards = 3;
    drama_error e = {0};
    OK(dr_make_model(a, &o, &e));
    OK(dr_make_model(b, &o, &e));
    o.seed = 43;
    OK(dr_make_model(c, &o, &e));
    static const char *files[] = {"config.json", "tokenizer.json", "model.safetensors.index.json",
                                  "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                  "model-00003-of-00003.safetensors", "codec.safetensors", "codec.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char pa[4200], pb[4200], pc[4200];
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        snprintf(pc, sizeof pc, "%s/%s", c, files[i]);
        size_t na, nb, nc;
        char *da = tu_read_file(pa, &na), *db = tu_read_file(pb, &nb), *dc = tu_read_file(pc, &nc);
        assert_int_equal(na, nb);
        assert_memory_equal(da, db, na);
        int differs = na != nc || memcmp(da, dc, na) != 0;
        printf("%s: %zu bytes, identical for the same seed, %s for another seed\n", files[i], na,
               differs ? "different" : "same");
        size_t len = strlen(files[i]);
        if (len > 12 && !strcmp(files[i] + len - 12, ".safetensors")) assert_true(differs);
        free(da), free(db), free(dc);
    }
    tu_rm_rf(base);
}

static void test_prune_and_fused(void **state) {
    (void)state;
    const char *base = tu_tmpdir();
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/pruned", base);
    snprintf(b, sizeof b, "%s/fused", base);
    dr_mm_options o = small_opts(DR_MM_BF16);
    o.prune_keep = 3;
    o.layout = DR_MM_FUSED;
    drama_error e = {0};
    OK(dr_make_model(a, &o, &e));
    dr_ckpt *c = NULL;
    OK(dr_ckpt_open(a, &c, &e));
    const json_t *de = json_object_get(dr_ckpt_index_metadata(c), "drama_experts");
    assert_non_null(de);
    assert_int_equal(json_object_size(de), 6);
    json_t *l4 = json_object_get(de, "4");
    assert_int_equal(json_array_size(l4), 3);
    for (size_t i = 1; i < 3; i++)
        assert_true(json_integer_value(json_array_get(l4, i)) > json_integer_value(json_array_get(l4, i - 1)));
    const dr_tensor *gu = find(c, "model.language_model.layers.4.mlp.experts.gate_up_proj");
    assert_int_equal(gu->shape[0], 3);
    assert_int_equal(gu->shape[1], 128);
    assert_int_equal(gu->shape[2], 96);
    /* slot 1 of the fused tensor holds kept expert #1: same values as its per-expert source */
    int kept1 = (int)json_integer_value(json_array_get(l4, 1));
    dr_mm_options o2 = small_opts(DR_MM_BF16);
    OK(dr_make_model(b, &o2, &e));
    dr_ckpt *c2 = NULL;
    OK(dr_ckpt_open(b, &c2, &e));
    char name[256];
    snprintf(name, sizeof name, "model.language_model.layers.4.mlp.experts.%d.up_proj.weight", kept1);
    const dr_tensor *up = find(c2, name);
    size_t slot = (size_t)128 * 96 * 2, half = (size_t)64 * 96 * 2;
    assert_int_equal(up->nbytes, half);
    assert_memory_equal(gu->data + slot + half, up->data, half);
    dr_ckpt_close(c);
    dr_ckpt_close(c2);
    tu_rm_rf(base);
}

/* "Weights at realistic scales so activations stay finite": 40 layers (the real depth) at a small
 * width through the engine's backbone; every layer's residual stream and the logits are finite,
 * the residual grows slowly and the restricted logits are not degenerate. */
static void test_activations_stay_finite(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    dr_mm_options o = small_opts(DR_MM_FP8);
    o.dims.layers = 40;
    o.dims.full_attention_interval = 4;
    drama_error e = {0};
    OK(dr_make_model(dir, &o, &e));
    dr_config *cfg = NULL;
    dr_ckpt *ck = NULL;
    dr_loader *ld = NULL;
    dr_backbone bb;
    memset(&bb, 0, sizeof bb);
    OK(dr_config_load(dir, NULL, 0, &cfg, &e));
    OK(dr_ckpt_open(dir, &ck, &e));
    OK(dr_loader_create(ck, cfg, &ld, &e));
    OK(dr_backbone_bind(&bb, ld, &e));
    dr_loader_finish(ld);
    OK(dr_findings_check(dr_loader_findings(ld), 0, &e)); /* tower not bound here: unexpected is fine */
    int64_t S = cfg->tokens.semantic_start, V = cfg->audio.vocab_size, end = cfg->tokens.eos[0];
    OK(dr_backbone_set_tokens(&bb, S, V, end, &e));
    dr_bb_state *st = NULL;
    OK(dr_bb_state_create(&bb, 16, &st, &e));
    enum { N = 12 };
    int W = dr_backbone_row_width(&bb);
    int32_t rows[N * 16];
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < N; r++) {
        if (r < 6) {
            rows[r * W] = 20 + 37 * r; /* text rows */
        } else {                       /* audio rows: token S + c0, codes c0..c9 */
            for (int k = 0; k < W - 1; k++) rows[r * W + 1 + k] = (97 * r + 13 * k) % (k ? 1024 : (int)V);
            rows[r * W] = (int32_t)(S + rows[r * W + 1]);
        }
    }
    int64_t H = bb.d.H, nl = dr_backbone_n_logits(&bb);
    float *hidden = malloc((size_t)(N * H) * sizeof *hidden), *logits = malloc((size_t)(N * nl) * sizeof *logits);
    float *layer_out = malloc((size_t)(40 * N * H) * sizeof *layer_out);
    dr_bb_trace tr = {.layer_out = layer_out};
    OK(dr_backbone_forward(&bb, st, rows, N, hidden, logits, &tr, NULL, &e));
    double first_rms = 0, last_rms = 0;
    for (int L = 0; L < 40; L++) {
        double ss = 0;
        for (int64_t i = 0; i < N * H; i++) {
            assert_true(isfinite(layer_out[(int64_t)L * N * H + i]));
            ss += (double)layer_out[(int64_t)L * N * H + i] * layer_out[(int64_t)L * N * H + i];
        }
        if (L == 0) first_rms = sqrt(ss / (double)(N * H));
        if (L == 39) last_rms = sqrt(ss / (double)(N * H));
    }
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < N * nl; i++) {
        assert_true(isfinite(logits[i]));
        s1 += logits[i], s2 += (double)logits[i] * logits[i];
    }
    double mean = s1 / (double)(N * nl), sd = sqrt(s2 / (double)(N * nl) - mean * mean);
    printf("40 layers: residual rms %.3f after layer 0, %.3f after layer 39; restricted logits sd %.3f\n", first_rms,
           last_rms, sd);
    assert_true(last_rms < 50 * first_rms);
    assert_true(sd > 0.5 && sd < 8);
    free(hidden), free(logits), free(layer_out);
    dr_bb_state_free(st);
    dr_backbone_release(&bb);
    dr_loader_free(ld);
    dr_ckpt_close(ck);
    dr_config_free(cfg);
    tu_rm_rf(dir);
}

static void test_validation(void **state) {
    (void)state;
    drama_error e = {0};
    dr_mm_options o = small_opts(DR_MM_BF16);
    o.prune_keep = 1; /* fewer than top-k */
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--prune"));
    o = small_opts(DR_MM_Q4);
    o.q4_group = 48;
    e = (drama_error){0};
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--q4-group"));
    o = small_opts(DR_MM_FP8);
    o.layout = DR_MM_FUSED;
    e = (drama_error){0};
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--layout"));
    o = small_opts(DR_MM_BF16);
    o.dims.heads = 3; /* not a multiple of kv heads 2 */
    e = (drama_error){0};
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--heads"));
    o = small_opts(DR_MM_BF16);
    o.dims.partial_rotary = 1e-300; /* rounds to 0 rotated dims: the loader would refuse the config */
    e = (drama_error){0};
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "--partial-rotary"));
    assert_int_equal(dr_mm_shape_defaults("huge", &o), 0);
    /* full shape: the dims of MODEL.md 3 */
    assert_true(dr_mm_shape_defaults("full", &o));
    assert_int_equal(o.dims.hidden, 2048);
    assert_int_equal(o.dims.layers, 40);
    assert_int_equal(o.dims.experts, 256);
    assert_int_equal(o.dims.top_k, 8);
    assert_int_equal(o.dims.shared_layers + o.dims.codebooks - 1, 13);
    assert_int_equal(dr_mm_validate(&o, &e), DRAMA_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_inventory_real), cmocka_unit_test(test_codec_tiny),
        cmocka_unit_test(test_tiny_model_loads),     cmocka_unit_test(test_formats_match_bf16),
        cmocka_unit_test(test_same_seed_same_files), cmocka_unit_test(test_prune_and_fused),
        cmocka_unit_test(test_activations_stay_finite), cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
