/* test_tools_optimize.c - `drama optimize` against the golden variants (golden/README.md, row
 * "drama optimize"): optimising tiny-drama3 reproduces the expert tensors of variants/fp8-block,
 * nvfp4 (input_scale aside: its value is arbitrary and we do not write one) and mlx-affine4 bit for
 * bit, --prune-experts with the kept sets of variants/pruned reproduces that variant, every
 * non-expert tensor is the source's byte for byte, and each result passes its variant golden
 * through the backbone (run_golden of test_model_backbone.c, included below, not copied).
 * Also: the fused-experts source gives the same q4 experts; thread count never changes a byte. */
#define main test_model_backbone_main
#include "test_model_backbone.c"
#undef main

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/manifest.h"
#include "tools/make_model.h"
#include "tools/optimize.h"

/* run_golden takes a model directory relative to $DRAMA_GOLDEN: climb out of it to `abs`. */
static const char *golden_rel(const char *abs) {
    static char bufs[4][PATH_MAX * 2];
    static int slot;
    char *buf = bufs[slot++ & 3];
    char root[PATH_MAX];
    if (!realpath(tu_golden("."), root)) fail_msg("golden root: %s", tu_golden("."));
    size_t n = 0;
    buf[0] = 0;
    for (const char *p = root; *p; p++)
        if (*p == '/' && p[1]) n++;
    for (size_t i = 0; i < n; i++) strcat(buf, "../");
    strcat(buf, abs[0] == '/' ? abs + 1 : abs);
    return buf;
}

static void optimize(const char *src_rel, const char *dst, dr_opt_format f, const char *prune, int threads) {
    dr_opt_options o;
    memset(&o, 0, sizeof o);
    o.src = tu_model_dir(src_rel);
    o.dst = dst;
    o.experts = f;
    o.prune_file = prune;
    o.threads = threads;
    o.quiet = 1;
    drama_error e = {0};
    dr_opt_report rep;
    if (dr_optimize(&o, &rep, &e) != DRAMA_OK) fail_msg("optimize %s -> %s: %s", src_rel, dst, e.message);
    printf("optimize %s --experts %s: %lld copied, %lld experts written, %lld pruned, %lld tensors, %d shard(s)\n",
           src_rel, dr_opt_format_name(f), (long long)rep.tensors_copied, (long long)rep.experts_written,
           (long long)rep.experts_dropped, (long long)rep.tensors_written, rep.shards);
}

static int is_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }
static int is_input_scale(const char *name) {
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".input_scale");
}

static int same_tensor(const dr_tensor *a, const dr_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return memcmp(a->data, b->data, a->nbytes) == 0;
}

/* Our output `out` against the golden variant (expert tensors) and the source (all others). */
static void compare_with_variant(const char *out, const char *variant_rel, const char *src_rel) {
    drama_error e = {0};
    dr_ckpt *ours = NULL, *gold = NULL, *src = NULL;
    assert_int_equal(dr_ckpt_open(out, &ours, &e), DRAMA_OK);
    assert_int_equal(dr_ckpt_open(tu_model_dir(variant_rel), &gold, &e), DRAMA_OK);
    assert_int_equal(dr_ckpt_open(tu_model_dir(src_rel), &src, &e), DRAMA_OK);
    int64_t expert_equal = 0, expert_bad = 0, skipped = 0, other_equal = 0, other_bad = 0;
    for (int64_t i = 0; i < dr_ckpt_count(gold); i++) {
        const dr_tensor *g = dr_ckpt_at(gold, i);
        if (!is_expert(g->name)) continue;
        if (is_input_scale(g->name)) {
            skipped++;
            continue;
        }
        const dr_tensor *t = dr_ckpt_find(ours, g->name);
        if (t && same_tensor(t, g)) expert_equal++;
        else {
            if (expert_bad++ < 5) printf("  differs or missing: %s\n", g->name);
        }
    }
    for (int64_t i = 0; i < dr_ckpt_count(ours); i++) {
        const dr_tensor *t = dr_ckpt_at(ours, i);
        if (is_expert(t->name)) {
            if (!dr_ckpt_find(gold, t->name)) {
                if (expert_bad++ < 5) printf("  not in the variant: %s\n", t->name);
            }
            continue;
        }
        const dr_tensor *s = dr_ckpt_find(src, t->name);
        if (s && same_tensor(t, s)) other_equal++;
        else if (other_bad++ < 5) printf("  non-expert tensor changed: %s\n", t->name);
    }
    for (int64_t i = 0; i < dr_ckpt_count(src); i++)
        if (!is_expert(dr_ckpt_at(src, i)->name) && !dr_ckpt_find(ours, dr_ckpt_at(src, i)->name)) other_bad++;
    printf("%s: expert tensors bit-identical %lld, different/missing/extra %lld, input_scale skipped %lld; "
           "non-expert tensors identical to the source %lld, changed/missing %lld\n",
           variant_rel, (long long)expert_equal, (long long)expert_bad, (long long)skipped, (long long)other_equal,
           (long long)other_bad);
    assert_true(expert_equal > 0);
    assert_int_equal(expert_bad, 0);
    assert_int_equal(other_bad, 0);
    /* drama_experts: equal to the variant's when it has one, absent otherwise */
    const json_t *gm = dr_ckpt_index_metadata(gold), *om = dr_ckpt_index_metadata(ours);
    const json_t *gd = gm ? json_object_get(gm, "drama_experts") : NULL;
    const json_t *od = om ? json_object_get(om, "drama_experts") : NULL;
    if (gd) assert_true(od && json_equal((json_t *)gd, (json_t *)od));
    else assert_null(od);
    dr_ckpt_close(ours);
    dr_ckpt_close(gold);
    dr_ckpt_close(src);
}

static void one_variant(dr_opt_format f, const char *variant, const char *prune_rel) {
    char tmp[PATH_MAX], dst[PATH_MAX + 8], golden[256], tag[128];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(dst, sizeof dst, "%s/out", tmp);
    optimize("tiny-drama3", dst, f, prune_rel ? tu_golden(prune_rel) : NULL, 2);
    char variant_rel[256];
    snprintf(variant_rel, sizeof variant_rel, "variants/%s", variant);
    compare_with_variant(dst, variant_rel, "tiny-drama3");
    /* the result loads and matches the variant golden within the backbone bounds */
    snprintf(golden, sizeof golden, "ref/variant-%s.safetensors", variant);
    snprintf(tag, sizeof tag, "optimized->%s", variant);
    run_golden(golden_rel(dst), golden, tag, 0);
    /* manifest and receipt are there; nothing left behind */
    char p[PATH_MAX + 64];
    struct stat s;
    snprintf(p, sizeof p, "%s/drama-manifest.json", dst);
    assert_int_equal(stat(p, &s), 0);
    snprintf(p, sizeof p, "%s/drama-optimize.json", dst);
    assert_int_equal(stat(p, &s), 0);
    snprintf(p, sizeof p, "%s.partial", dst);
    assert_int_not_equal(stat(p, &s), 0);
    drama_error e = {0};
    dr_manifest *m = NULL;
    assert_int_equal(dr_manifest_verify_dir(dst, 1, &m, &e), DRAMA_OK);
    assert_non_null(m);
    dr_manifest_free(m);
    assert_int_equal(tu_rm_rf(tmp), 0);
}

static void opt_fp8(void **s) { (void)s; one_variant(DR_OPT_FP8, "fp8-block", NULL); }
static void opt_nvfp4(void **s) { (void)s; one_variant(DR_OPT_NVFP4, "nvfp4", NULL); }
static void opt_q4(void **s) { (void)s; one_variant(DR_OPT_AFFINE, "mlx-affine4", NULL); }
static void opt_pruned(void **s) {
    (void)s;
    /* the kept sets straight from the variant's index (metadata.drama_experts) */
    one_variant(DR_OPT_KEEP, "pruned", "variants/pruned/model.safetensors.index.json");
}

/* The fused layout gives the same per-expert q4 tensors; threads never change a byte. */
static void opt_fused_and_threads(void **s) {
    (void)s;
    char tmp[PATH_MAX], a[PATH_MAX + 8], b[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(a, sizeof a, "%s/fused", tmp);
    snprintf(b, sizeof b, "%s/t1", tmp);
    optimize("variants/fused-experts", a, DR_OPT_AFFINE, NULL, 3);
    compare_with_variant(a, "variants/mlx-affine4", "variants/fused-experts");
    optimize("tiny-drama3", b, DR_OPT_AFFINE, NULL, 1);
    char pa[PATH_MAX + 64], pb[PATH_MAX + 64];
    snprintf(pa, sizeof pa, "%s/model-00001-of-00001.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model-00001-of-00001.safetensors", b);
    size_t na, nb;
    char *da = tu_read_file(pa, &na), *db = tu_read_file(pb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(da, db, na);
    free(da);
    free(db);
    assert_int_equal(tu_rm_rf(tmp), 0);
}

/* Small shards: many shards named model-NNNNN-of-MMMMM, an expert's tensors never split across two,
 * and the sharded result still passes the variant golden. */
static void opt_small_shards(void **s) {
    (void)s;
    char tmp[PATH_MAX], dst[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(dst, sizeof dst, "%s/small", tmp);
    dr_opt_options o;
    memset(&o, 0, sizeof o);
    o.src = tu_model_dir("tiny-drama3");
    o.dst = dst;
    o.experts = DR_OPT_AFFINE;
    o.shard_size = 1 << 20;
    o.quiet = 1;
    drama_error e = {0};
    dr_opt_report rep;
    assert_int_equal(dr_optimize(&o, &rep, &e), DRAMA_OK);
    printf("shard-size 1 MiB: %d shards, %lld tensors\n", rep.shards, (long long)rep.tensors_written);
    assert_true(rep.shards > 4);
    dr_ckpt *ck = NULL;
    assert_int_equal(dr_ckpt_open(dst, &ck, &e), DRAMA_OK);
    assert_int_equal(dr_ckpt_shard_count(ck), rep.shards);
    assert_int_equal(dr_ckpt_count(ck), rep.tensors_written);
    char last[64];
    snprintf(last, sizeof last, "model-%05d-of-%05d.safetensors", rep.shards, rep.shards);
    int split = 0;
    for (int64_t i = 0; i < dr_ckpt_count(ck); i++) {
        const char *n = dr_ckpt_at(ck, i)->name;
        const char *x = strstr(n, ".mlp.experts.");
        if (!x) continue;
        char gate[512];
        snprintf(gate, sizeof gate, "%.*s", (int)(strchr(x + 13, '.') - n), n); /* "...experts.E" */
        strcat(gate, ".gate_proj.weight");
        if (strcmp(dr_ckpt_shard_of(ck, n), dr_ckpt_shard_of(ck, gate))) split++;
    }
    assert_int_equal(split, 0);
    dr_ckpt_close(ck);
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dst, last);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    run_golden(golden_rel(dst), "ref/variant-mlx-affine4.safetensors", "q4 in 1 MiB shards", 0);
    assert_int_equal(tu_rm_rf(tmp), 0);
}

/* --prune K --calibration: calibrated on one row with K = num_experts_per_tok, each layer keeps
 * exactly the experts that row is routed to, so the pruned model computes that row like the full
 * one (the renormalised top-k weights are the same). Wrong counting would change the output. */
static void opt_calibration(void **s) {
    (void)s;
    model full;
    model_open(&full, "tiny-drama3");
    int width = dr_backbone_row_width(&full.bb);
    int64_t n_el, H = full.bb.d.H, nl = dr_backbone_n_logits(&full.bb);
    int32_t *rows = tu_load_i32(tu_golden("ref/backbone.safetensors"), "prefill.rows", &n_el);
    int64_t nrows = n_el / width;
    char tmp[PATH_MAX], dst[PATH_MAX + 8], calib[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(calib, sizeof calib, "%s/calib.json", tmp);
    float *h_full = malloc((size_t)H * 4), *h_pruned = malloc((size_t)H * 4);
    float *l_full = malloc((size_t)nl * 4), *l_pruned = malloc((size_t)nl * 4);
    int64_t picks[2] = {nrows - 1, nrows / 2};
    for (int t = 0; t < 2; t++) {
        const int32_t *row = rows + picks[t] * width;
        FILE *f = fopen(calib, "w");
        assert_non_null(f);
        fprintf(f, "{\"rows\": [[");
        for (int c = 0; c < width; c++) fprintf(f, "%s%d", c ? ", " : "", row[c]);
        fprintf(f, "]]}\n");
        fclose(f);
        snprintf(dst, sizeof dst, "%s/k%d", tmp, t);
        dr_opt_options o;
        memset(&o, 0, sizeof o);
        o.src = tu_model_dir("tiny-drama3");
        o.dst = dst;
        o.prune_k = full.bb.d.topk;
        o.calibration = calib;
        o.quiet = 1;
        drama_error e = {0};
        dr_opt_report rep;
        if (dr_optimize(&o, &rep, &e)) fail_msg("%s", e.message);
        assert_int_equal(rep.experts_written, (int64_t)full.bb.d.n_layers * full.bb.d.topk);
        model pruned;
        model_open(&pruned, golden_rel(dst));
        dr_bb_state *a = NULL, *b = NULL;
        assert_int_equal(dr_bb_state_create(&full.bb, 1, &a, &e), DRAMA_OK);
        assert_int_equal(dr_bb_state_create(&pruned.bb, 1, &b, &e), DRAMA_OK);
        assert_int_equal(dr_backbone_forward(&full.bb, a, row, 1, h_full, l_full, NULL, NULL, &e), DRAMA_OK);
        assert_int_equal(dr_backbone_forward(&pruned.bb, b, row, 1, h_pruned, l_pruned, NULL, NULL, &e), DRAMA_OK);
        char label[96];
        snprintf(label, sizeof label, "calibrated on row %lld: hidden", (long long)picks[t]);
        int ok = tu_report(label, tu_compare_f32(h_pruned, h_full, H), 1e-5);
        snprintf(label, sizeof label, "calibrated on row %lld: logits", (long long)picks[t]);
        ok &= tu_report(label, tu_compare_f32(l_pruned, l_full, nl), 1e-5);
        assert_true(ok);
        dr_bb_state_free(a);
        dr_bb_state_free(b);
        model_close(&pruned);
    }
    free(h_full); free(h_pruned); free(l_full); free(l_pruned); free(rows);
    model_close(&full);
    assert_int_equal(tu_rm_rf(tmp), 0);
}

/* Another shape (non-square 192x128 experts, 8 experts top-2, ragged FP8 blocks): optimising a
 * BF16 `drama make-model` checkpoint gives the expert tensors make-model writes itself for the same
 * seed in each format (make_model.h: its experts are encoded from the same BF16 values). */
static void opt_other_shape(void **s) {
    (void)s;
    char tmp[PATH_MAX], src[PATH_MAX + 8], ref[PATH_MAX + 8], out[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s", tu_tmpdir());
    snprintf(src, sizeof src, "%s/bf16", tmp);
    dr_mm_options mo;
    assert_int_equal(dr_mm_shape_defaults("tiny", &mo), 1);
    mo.dims.hidden = 128;
    mo.dims.moe_inter = 192;
    mo.dims.experts = 8;
    mo.dims.top_k = 2;
    mo.dims.shared_inter = 32;
    mo.dims.layers = 4;
    mo.with_codec = 0;
    mo.threads = 2;
    mo.seed = 11;
    drama_error e = {0};
    if (dr_mm_validate(&mo, &e) || dr_make_model(src, &mo, &e)) fail_msg("make-model: %s", e.message);
    const dr_mm_format mm[3] = {DR_MM_FP8, DR_MM_NVFP4, DR_MM_Q4};
    const dr_opt_format of[3] = {DR_OPT_FP8, DR_OPT_NVFP4, DR_OPT_AFFINE};
    for (int i = 0; i < 3; i++) {
        snprintf(ref, sizeof ref, "%s/ref%d", tmp, i);
        snprintf(out, sizeof out, "%s/out%d", tmp, i);
        mo.experts = mm[i];
        if (dr_make_model(ref, &mo, &e)) fail_msg("make-model: %s", e.message);
        optimize(golden_rel(src), out, of[i], NULL, 2);
        compare_with_variant(out, golden_rel(ref), golden_rel(src));
    }
    assert_int_equal(tu_rm_rf(tmp), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(opt_fp8), cmocka_unit_test(opt_nvfp4), cmocka_unit_test(opt_q4),
        cmocka_unit_test(opt_pruned), cmocka_unit_test(opt_fused_and_threads),
        cmocka_unit_test(opt_small_shards),
        cmocka_unit_test(opt_calibration),
        cmocka_unit_test(opt_other_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
