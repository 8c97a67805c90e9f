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
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_golden),
        cmocka_unit_test(test_forward_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
