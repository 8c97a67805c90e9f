/* test_model_backbone_cli.c - `drama forward` end to end ($DRAMA_BIN): the golden rows as ROWS.json
 * (20 prefill + 8 decode rows) against ref/backbone.safetensors and each variant golden; the dump's
 * shapes and the interface's error exits. Skipped (passes with a note) when $DRAMA_BIN is unset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <math.h>

#include "model/config.h"

#include "io/safetensors.h"
#include "testutil.h"

static const char *bin(void) { return getenv("DRAMA_BIN"); }

static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Write ROWS.json from the golden prefill.rows + decode.rows; returns total rows. */
static int64_t write_rows(const char *golden, const char *path, int64_t *prefill, int *width) {
    int64_t np_el, nd_el;
    int32_t *p = tu_load_i32(golden, "prefill.rows", &np_el);
    int32_t *d = tu_load_i32(golden, "decode.rows", &nd_el);
    *width = 11;
    int64_t np = np_el / *width, nd = nd_el / *width;
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"rows\": [");
    for (int64_t r = 0; r < np + nd; r++) {
        const int32_t *row = r < np ? p + r * *width : d + (r - np) * *width;
        fprintf(f, "%s[", r ? "," : "");
        for (int c = 0; c < *width; c++) fprintf(f, "%s%d", c ? "," : "", row[c]);
        fprintf(f, "]");
    }
    fprintf(f, "], \"prefill\": %lld}\n", (long long)np);
    fclose(f);
    free(p);
    free(d);
    *prefill = np;
    return np + nd;
}

static void one(const char *model, const char *golden_rel, const char *tag) {
    char dir[4096], rows[4200], out[4200], cmd[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(rows, sizeof rows, "%s/rows.json", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    const char *g = tu_golden(golden_rel);
    int64_t np;
    int width;
    int64_t n = write_rows(g, rows, &np, &width);
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' --threads 2", bin(), tu_model_dir(model),
             rows, out);
    assert_int_equal(run_cmd(cmd), 0);
    int64_t nh, nlg;
    float *hidden = tu_load_f32(out, "hidden", &nh);
    float *logits = tu_load_f32(out, "logits", &nlg);
    int64_t H = nh / n, nl = nlg / n;
    assert_int_equal(nh, n * H);
    /* token ids the dump was made with (from the tokenizer) */
    dr_st_file *df = NULL;
    assert_int_equal(dr_st_open(out, &df, NULL), DRAMA_OK);
    const char *ms = dr_st_metadata(df, "semantic_start"), *me = dr_st_metadata(df, "end_id");
    assert_non_null(ms);
    assert_non_null(me);
    int64_t S = atoll(ms), end_id = atoll(me);
    dr_st_close(df);
    /* golden: prefill.hidden (all rows), prefill.logits (rows in logits_row_index), decode.* */
    int64_t n_idx, n_gl, n_dl;
    float *gph = tu_load_f32(g, "prefill.hidden", NULL);
    float *gdh = tu_load_f32(g, "decode.hidden", NULL);
    int32_t *idx = tu_load_i32(g, "prefill.logits_row_index", &n_idx);
    float *gpl = tu_load_f32(g, "prefill.logits", &n_gl);
    float *gdl = tu_load_f32(g, "decode.logits", &n_dl);
    int64_t V = n_gl / n_idx, nd = n - np;
    float *ref_h = malloc((size_t)(n * H) * sizeof(float));
    memcpy(ref_h, gph, (size_t)(np * H) * sizeof(float));
    memcpy(ref_h + np * H, gdh, (size_t)(nd * H) * sizeof(float));
    int64_t nr = n_idx + nd;
    float *ref_l = malloc((size_t)(nr * nl) * sizeof(float)), *got_l = malloc((size_t)(nr * nl) * sizeof(float));
    for (int64_t i = 0; i < nr; i++) {
        const float *src = i < n_idx ? gpl + i * V : gdl + (i - n_idx) * V;
        int64_t row = i < n_idx ? idx[i] : np + (i - n_idx);
        for (int64_t j = 0; j < nl; j++) ref_l[i * nl + j] = src[j < nl - 1 ? S + j : end_id];
        memcpy(got_l + i * nl, logits + row * nl, (size_t)nl * sizeof(float));
    }
    char label[128];
    snprintf(label, sizeof label, "forward %s hidden", tag);
    int ok = tu_report(label, tu_compare_f32(hidden, ref_h, n * H), 2e-4);
    snprintf(label, sizeof label, "forward %s logits", tag);
    ok &= tu_report(label, tu_compare_f32(got_l, ref_l, nr * nl), 5e-4);
    assert_true(ok);
    free(hidden); free(logits); free(gph); free(gdh); free(idx); free(gpl); free(gdl);
    free(ref_h); free(ref_l); free(got_l);
    tu_rm_rf(dir);
}

/* --nll: row r holds -log softmax(logits[r])[next semantic index], -1 where row r+1 is not audio. */
static void test_forward_nll(void **s) {
    (void)s;
    if (!bin()) return;
    char dir[4096], rows[4200], out[4200], cmd[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(rows, sizeof rows, "%s/rows.json", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    int64_t np;
    int width;
    int64_t n = write_rows(tu_golden("ref/backbone.safetensors"), rows, &np, &width);
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' --nll >/dev/null", bin(),
             tu_model_dir("tiny-drama3"), rows, out);
    assert_int_equal(run_cmd(cmd), 0);
    int64_t nn, nlg, nr;
    float *nll = tu_load_f32(out, "nll", &nn);
    float *logits = tu_load_f32(out, "logits", &nlg);
    int32_t *in = tu_load_i32(tu_golden("ref/backbone.safetensors"), "prefill.rows", &nr);
    int32_t *dec = tu_load_i32(tu_golden("ref/backbone.safetensors"), "decode.rows", NULL);
    assert_int_equal(nn, n);
    int64_t nl = nlg / n, audio = 0;
    dr_st_file *df = NULL;
    assert_int_equal(dr_st_open(out, &df, NULL), DRAMA_OK);
    int64_t S = atoll(dr_st_metadata(df, "semantic_start"));
    dr_st_close(df);
    for (int64_t r = 0; r + 1 < n; r++) {
        const int32_t *next = r + 1 < np ? in + (r + 1) * width : dec + (r + 1 - np) * width;
        int64_t t = next[0] - S;
        if (t < 0 || t >= nl - 1) {
            assert_true(nll[r] == -1.0f);
            continue;
        }
        double mx = -1e300, se = 0;
        for (int64_t j = 0; j < nl; j++) mx = logits[r * nl + j] > mx ? logits[r * nl + j] : mx;
        for (int64_t j = 0; j < nl; j++) se += exp(logits[r * nl + j] - mx);
        double want = mx + log(se) - logits[r * nl + t];
        assert_true(fabs(nll[r] - want) < 1e-4);
        audio++;
    }
    assert_true(audio > 0);
    assert_true(nll[n - 1] == -1.0f);
    free(nll); free(logits); free(in); free(dec);
    tu_rm_rf(dir);
}

static void test_forward_golden(void **s) {
    (void)s;
    if (!bin()) {
        printf("DRAMA_BIN not set: skipped\n");
        return;
    }
    one("tiny-drama3", "ref/backbone.safetensors", "base");
    one("variants/fused-experts", "ref/backbone.safetensors", "fused-experts");
    one("variants/fp8-block", "ref/variant-fp8-block.safetensors", "fp8-block");
    one("variants/nvfp4", "ref/variant-nvfp4.safetensors", "nvfp4");
    one("variants/mlx-affine4", "ref/variant-mlx-affine4.safetensors", "mlx-affine4");
    one("variants/pruned", "ref/variant-pruned.safetensors", "pruned");
}

static void test_forward_errors(void **s) {
    (void)s;
    if (!bin()) return;
    char dir[4096], p[4200], out[4200], cmd[16384];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(p, sizeof p, "%s/rows.json", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    const char *model = tu_model_dir("tiny-drama3");
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' 2>/dev/null", bin(), model, p);
    assert_int_equal(run_cmd(cmd), 2); /* no --dump: usage */
    /* a semantic token whose c0 disagrees: error, no dump left behind */
    const char *bad = "{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0],[2020,7,0,0,0,0,0,0,0,0,0]], \"prefill\": 2}";
    tu_write_file(p, bad, strlen(bad));
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>/dev/null", bin(), model, p, out);
    assert_int_equal(run_cmd(cmd), 1);
    FILE *f = fopen(out, "rb");
    assert_null(f);
    /* wrong row width */
    const char *narrow = "{\"rows\": [[2003,0,0]], \"prefill\": 1}";
    tu_write_file(p, narrow, strlen(narrow));
    assert_int_equal(run_cmd(cmd), 1);
    /* unknown switch */
    const char *ok = "{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0]], \"prefill\": 0}";
    tu_write_file(p, ok, strlen(ok));
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' --set no.such=1 2>/dev/null", bin(),
             model, p, out);
    assert_int_equal(run_cmd(cmd), 1);
    /* prefill 0: every row a decode step */
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>/dev/null", bin(), model, p, out);
    assert_int_equal(run_cmd(cmd), 0);
    int64_t n;
    float *l = tu_load_f32(out, "logits", &n);
    assert_int_equal(n, 4097);
    free(l);
    remove(out);
    /* bad input a user may hand us: exit 1, a message naming the problem, no dump left behind */
    char model_copy[4300], shard[4400], err_path[4300];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    const struct { const char *rows, *needle; } cases[] = {
        {"{\"rows\": [], \"prefill\": 0}", "empty"},
        {"{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0],[2017,5,0,0,0,0,0,0,0,0,4096]], \"prefill\": 1}",
         "rows[1] (decode step): row 0: code c9 = 4096"},
        {"{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0],[-5,0,0,0,0,0,0,0,0,0,0]], \"prefill\": 2}", "rows[1][0]"},
        {"{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0]], \"prefill\": 2}", "prefill"},
        {"{\"rows\": [[2003,0,0,0,0,0,0,0,0,0,0]], \"prefill\": 1", "invalid JSON"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tu_write_file(p, cases[c].rows, strlen(cases[c].rows));
        snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>'%s'", bin(), model, p, out,
                 err_path);
        assert_int_equal(run_cmd(cmd), 1);
        char *msg = tu_read_file(err_path, NULL);
        printf("bad rows -> %s", msg);
        if (!strstr(msg, cases[c].needle)) fail_msg("'%s' lacks '%s'", msg, cases[c].needle);
        free(msg);
        assert_null(fopen(out, "rb"));
    }
    /* a dump path that is a directory, and a truncated shard (error names the file) */
    tu_write_file(p, ok, strlen(ok));
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>/dev/null", bin(), model, p, dir);
    assert_int_equal(run_cmd(cmd), 1);
    snprintf(model_copy, sizeof model_copy, "%s/model", dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", model, model_copy);
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", model_copy);
    size_t len = 0;
    char *bytes = tu_read_file(shard, &len);
    assert_non_null(bytes);
    tu_write_file(shard, bytes, len / 2);
    free(bytes);
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>'%s'", bin(), model_copy, p, out,
             err_path);
    assert_int_equal(run_cmd(cmd), 1);
    char *msg = tu_read_file(err_path, NULL);
    printf("truncated shard -> %s", msg);
    assert_non_null(strstr(msg, "model-00002-of-00002.safetensors"));
    free(msg);
    assert_null(fopen(out, "rb"));
    tu_rm_rf(dir);
}

/* Other shapes (non-square, 2:1 GQA, 3:1 DeltaNet heads, conv 3, interval 3) through
 * `drama make-model --shape custom`: every format binds and runs, fused == per-expert bit for bit,
 * and prefill of all rows == prefill + decode steps bit for bit. */
static void test_other_shapes(void **s) {
    (void)s;
    if (!bin()) return;
    char dir[4096], cmd[16384], p[4300], rows[4300], rows_all[4300];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    const char *dims = "--shape custom --hidden 96 --layers 6 --full-attention-interval 3 --heads 6 --kv-heads 2 "
                       "--head-dim 32 --partial-rotary 0.5 --linear-key-heads 2 --linear-key-dim 24 "
                       "--linear-value-heads 6 --linear-value-dim 16 --conv-kernel 3 --num-experts 12 --top-k 3 "
                       "--moe-inter 80 --shared-inter 48 --codec none --seed 11";
    /* same_as: a variant whose logits must be bit-identical (same weights, other layout/sharding) */
    const struct { const char *tag, *args; int same_as; } variants[] = {
        {"bf16", "--experts bf16", -1},
        {"fused", "--experts bf16 --layout fused", 0},
        {"single", "--experts bf16 --shards 1", 0}, /* becomes a lone model.safetensors, no index */
        {"fp8", "--experts fp8", -1},
        {"nvfp4", "--experts nvfp4 --prune 5 --shards 3", -1},
        {"bf16_pruned", "--experts bf16 --prune 4 --shards 2", -1},
        /* make-model writes the fused layout in BF16 only; fused quantised slices: test_num_weight_bad */
        {"bf16_pruned_fused", "--experts bf16 --prune 4 --layout fused --shards 3", 5},
        {"q4", "--experts q4 --q4-group 32 --moe-inter 64", -1},
        /* group 128 needs widths that are multiples of 128 */
        {"q4_g128", "--experts q4 --q4-group 128 --hidden 128 --moe-inter 128 --shared-inter 128", -1},
    };
    enum { NV = sizeof variants / sizeof variants[0] };
    float *logits[NV] = {0};
    int64_t nlog[NV] = {0};
    /* rows from the generated config: semantic_start_token_id and num_codebooks */
    snprintf(cmd, sizeof cmd, "'%s' make-model '%s/bf16' %s --experts bf16 >/dev/null 2>&1", bin(), dir, dims);
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(p, sizeof p, "%s/bf16/config.json", dir);
    dr_config *cfg = NULL;
    drama_error e = {0};
    char mdir[4200];
    snprintf(mdir, sizeof mdir, "%s/bf16", dir);
    assert_int_equal(dr_config_load(mdir, NULL, 0, &cfg, &e), DRAMA_OK);
    int64_t S = cfg->tokens.semantic_start;
    int nc = cfg->audio.num_codebooks;
    dr_config_free(cfg);
    snprintf(rows, sizeof rows, "%s/rows.json", dir);
    snprintf(rows_all, sizeof rows_all, "%s/rows_all.json", dir);
    for (int pass = 0; pass < 2; pass++) {
        FILE *f = fopen(pass ? rows_all : rows, "w");
        assert_non_null(f);
        fprintf(f, "{\"rows\": [");
        for (int r = 0; r < 12; r++) {
            int audio = r >= 3 && r % 3 != 0, c0 = (r * 977) % 4096;
            fprintf(f, "%s[%lld", r ? "," : "", audio ? (long long)(S + c0) : (long long)(r * 13 % 200));
            for (int k = 0; k < nc; k++) fprintf(f, ",%d", audio ? (k == 0 ? c0 : (r * 31 + k * 7) % 1024) : 0);
            fprintf(f, "]");
        }
        fprintf(f, "], \"prefill\": %d}\n", pass ? 12 : 7);
        fclose(f);
    }
    for (int v = 0; v < NV; v++) {
        snprintf(mdir, sizeof mdir, "%s/%s", dir, variants[v].tag);
        if (v > 0) {
            snprintf(cmd, sizeof cmd, "'%s' make-model '%s' %s %s >/dev/null 2>&1", bin(), mdir, dims, variants[v].args);
            assert_int_equal(run_cmd(cmd), 0);
        }
        if (!strcmp(variants[v].tag, "single")) { /* a single model.safetensors without an index */
            char from[4400], to[4400];
            snprintf(from, sizeof from, "%s/model.safetensors.index.json", mdir);
            assert_int_equal(remove(from), 0);
            snprintf(from, sizeof from, "%s/model-00001-of-00001.safetensors", mdir);
            snprintf(to, sizeof to, "%s/model.safetensors", mdir);
            assert_int_equal(rename(from, to), 0);
        }
        int64_t n1, n2;
        float *a = tu_forward_logits(bin(), dir, mdir, rows, variants[v].tag, &n1);
        char tag[64];
        snprintf(tag, sizeof tag, "%s_all", variants[v].tag);
        float *b = tu_forward_logits(bin(), dir, mdir, rows_all, tag, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, (size_t)n1 * sizeof(float)); /* prefill == prefill + steps */
        int same = variants[v].same_as;
        if (same >= 0) { /* same weights, other layout or file layout */
            assert_int_equal(n1, nlog[same]);
            assert_memory_equal(a, logits[same], (size_t)n1 * sizeof(float));
        }
        if (v > 0 && same < 0 && nlog[0] == n1) { /* other weights: the logits must differ */
            assert_true(tu_report_differs("other weights: logits differ", tu_compare_f32(a, logits[0], n1), 0));
        }
        logits[v] = a;
        nlog[v] = n1;
        free(b);
        printf("other shape, %s: ok\n", variants[v].tag);
    }
    for (int v = 0; v < NV; v++) free(logits[v]);
    /* a pruned checkpoint reduced to a lone model.safetensors loses its kept-expert list: the
     * error says so first (FORMATS.md 5 keeps it in the index only) */
    snprintf(mdir, sizeof mdir, "%s/pruned_single", dir);
    snprintf(cmd, sizeof cmd, "'%s' make-model '%s' %s --experts fp8 --prune 4 --shards 1 >/dev/null 2>&1 && "
             "rm '%s/model.safetensors.index.json' && mv '%s/model-00001-of-00001.safetensors' '%s/model.safetensors'",
             bin(), mdir, dims, mdir, mdir, mdir);
    assert_int_equal(run_cmd(cmd), 0);
    char out[4300], err_path[4300];
    snprintf(out, sizeof out, "%s/pruned_single.out.safetensors", dir);
    snprintf(err_path, sizeof err_path, "%s/pruned_single.err", dir);
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' 2>'%s'", bin(), mdir, rows, out, err_path);
    assert_int_equal(run_cmd(cmd), 1);
    char *msg = tu_read_file(err_path, NULL);
    printf("pruned single file -> %.200s\n", msg);
    assert_non_null(strstr(msg, "load findings: missing: model.safetensors.index.json: metadata.drama_experts: absent"));
    free(msg);
    assert_null(fopen(out, "rb"));
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_golden),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_forward_nll),
        cmocka_unit_test(test_other_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
