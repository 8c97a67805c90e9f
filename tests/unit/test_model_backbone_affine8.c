/* test_model_backbone_affine8.c - `drama forward` ($DRAMA_BIN) on a checkpoint with 8-bit MLX
 * affine experts, which `drama make-model` does not write. A BF16 random model (other shape) is
 * converted here: every routed expert matrix becomes 8-bit affine at group 32 (U32 codes +
 * BF16 .scales/.biases) in checkpoint A, and the exact dequantisation of those codes becomes F32 in
 * checkpoint B (a lone model.safetensors each, no index). The kernels dequantise to fp32 before the
 * canonical dot product, so A and B must give bit-identical logits; A must also differ from the
 * BF16 source (the experts really changed), and A's dequantised experts must lie within the 8-bit
 * quantisation bound (tu_affine_bound) of the BF16 source values, which catches an encoder fault
 * that A and B would share. Skipped (passes with a note) without $DRAMA_BIN. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <math.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "num/quant.h"
#include "num/weight.h"
#include "testutil.h"

enum { BITS = 8, GROUP = 32 };

static const char *bin(void) { return getenv("DRAMA_BIN"); }

static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int is_routed_expert(const dr_tensor *t) {
    size_t n = strlen(t->name);
    return t->ndim == 2 && strstr(t->name, ".mlp.experts.") && n > 12 && !strcmp(t->name + n - 12, "_proj.weight");
}

/* One output tensor: name, dtype, shape and owned bytes. */
typedef struct out_t {
    char name[512];
    dr_dtype dtype;
    int ndim;
    int64_t shape[DR_MAX_DIMS];
    uint8_t *bytes;
    size_t n;
} out_t;

static void write_file(const char *path, const out_t *t, int n) {
    drama_error e = {0};
    dr_st_writer *w = NULL;
    assert_int_equal(dr_st_writer_create(path, &w, &e), DRAMA_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(dr_st_writer_declare(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, &e), DRAMA_OK);
    for (int i = 0; i < n; i++) assert_int_equal(dr_st_writer_write(w, t[i].bytes, t[i].n, &e), DRAMA_OK);
    assert_int_equal(dr_st_writer_finish(w, &e), DRAMA_OK);
}

static void add(out_t *list, int *n, const char *name, dr_dtype dt, int ndim, const int64_t *shape, uint8_t *bytes,
                size_t nbytes) {
    out_t *o = &list[(*n)++];
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dtype = dt;
    o->ndim = ndim;
    memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
    o->bytes = bytes;
    o->n = nbytes;
}

/* Every converted matrix, dequantised, and its BF16 source with the bound of each value's group. */
typedef struct deq_check {
    float *deq, *src;
    double *tol;
    int64_t n, cap;
} deq_check;

static void check_add(deq_check *k, const float *deq, const float *src, int64_t rows, int64_t cols) {
    int64_t m = rows * cols;
    if (k->n + m > k->cap) {
        k->cap = 2 * (k->n + m);
        k->deq = realloc(k->deq, (size_t)k->cap * sizeof *k->deq);
        k->src = realloc(k->src, (size_t)k->cap * sizeof *k->src);
        k->tol = realloc(k->tol, (size_t)k->cap * sizeof *k->tol);
        assert_true(k->deq && k->src && k->tol);
    }
    memcpy(k->deq + k->n, deq, (size_t)m * sizeof *deq);
    memcpy(k->src + k->n, src, (size_t)m * sizeof *src);
    tu_affine_tol(src, m, GROUP, BITS, 0x1p-8, k->tol + k->n); /* groups along rows; BF16 scales, biases */
    k->n += m;
}

/* src (any layout) -> dir_q (8-bit affine experts) and dir_f (their exact F32 dequantisation);
 * the dequantised experts must lie within the 8-bit bound of their BF16 source values. */
static void convert(const char *src, const char *dir_q, const char *dir_f) {
    drama_error e = {0};
    dr_ckpt *ck = NULL;
    assert_int_equal(dr_ckpt_open(src, &ck, &e), DRAMA_OK);
    int64_t nt = dr_ckpt_count(ck);
    out_t *q = calloc((size_t)(3 * nt), sizeof *q), *f = calloc((size_t)nt, sizeof *f);
    int nq = 0, nf = 0, converted = 0;
    deq_check chk = {0};
    for (int64_t i = 0; i < nt; i++) {
        const dr_tensor *t = dr_ckpt_at(ck, i);
        if (!is_routed_expert(t) || t->shape[1] % GROUP) {
            uint8_t *b = malloc(t->nbytes ? t->nbytes : 1), *c = malloc(t->nbytes ? t->nbytes : 1);
            memcpy(b, t->data, t->nbytes);
            memcpy(c, t->data, t->nbytes);
            add(q, &nq, t->name, t->dtype, t->ndim, t->shape, b, t->nbytes);
            add(f, &nf, t->name, t->dtype, t->ndim, t->shape, c, t->nbytes);
            continue;
        }
        int64_t rows = t->shape[0], cols = t->shape[1], ng = cols / GROUP;
        float *src32 = malloc((size_t)(rows * cols) * sizeof *src32);
        assert_int_equal(dr_st_to_f32(t, src32, &e), DRAMA_OK);
        size_t wbytes = (size_t)(rows * cols) * BITS / 8, sbytes = (size_t)(rows * ng) * 2;
        uint8_t *words = malloc(wbytes), *sc = malloc(sbytes), *bi = malloc(sbytes);
        assert_int_equal(dr_quant_affine(src32, rows, cols, BITS, GROUP, DR_DT_BF16, words, sc, bi, &e), DRAMA_OK);
        /* the exact dequantisation, through the library's reference path */
        dr_tensor tw = {.name = t->name, .dtype = DR_DT_U32, .ndim = 2, .shape = {rows, cols * BITS / 32},
                        .data = words, .nbytes = wbytes};
        dr_tensor ts = {.name = "s", .dtype = DR_DT_BF16, .ndim = 2, .shape = {rows, ng}, .data = sc, .nbytes = sbytes};
        dr_tensor tb = {.name = "b", .dtype = DR_DT_BF16, .ndim = 2, .shape = {rows, ng}, .data = bi, .nbytes = sbytes};
        dr_weight w;
        assert_int_equal(dr_weight_bind_ex(&tw, &ts, NULL, &tb, -1, 0, 0, cols, &w, &e), DRAMA_OK);
        assert_int_equal(w.bits, BITS);
        assert_int_equal(w.group, GROUP);
        float *deq = malloc((size_t)(rows * cols) * sizeof *deq);
        for (int64_t r = 0; r < rows; r++) dr_weight_dequant_row(&w, r, deq + r * cols);
        check_add(&chk, deq, src32, rows, cols);
        char base[512], name[540];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name); /* drop ".weight" */
        add(q, &nq, t->name, DR_DT_U32, 2, tw.shape, words, wbytes);
        snprintf(name, sizeof name, "%s.scales", base);
        add(q, &nq, name, DR_DT_BF16, 2, ts.shape, sc, sbytes);
        snprintf(name, sizeof name, "%s.biases", base);
        add(q, &nq, name, DR_DT_BF16, 2, tb.shape, bi, sbytes);
        add(f, &nf, t->name, DR_DT_F32, 2, t->shape, (uint8_t *)deq, (size_t)(rows * cols) * sizeof *deq);
        free(src32);
        converted++;
    }
    assert_true(converted > 0);
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir_q);
    write_file(path, q, nq);
    snprintf(path, sizeof path, "%s/model.safetensors", dir_f);
    write_file(path, f, nf);
    for (int i = 0; i < nq; i++) free(q[i].bytes);
    for (int i = 0; i < nf; i++) free(f[i].bytes);
    free(q), free(f);
    dr_ckpt_close(ck);
    printf("converted %d expert matrices to %d-bit affine, group %d\n", converted, BITS, GROUP);
    tu_cmp_opts o = {.tol = chk.tol};
    assert_true(tu_report_tol("affine8 dequantised vs BF16 source", tu_compare_f32_opts(chk.deq, chk.src, chk.n, &o)));
    free(chk.deq), free(chk.src), free(chk.tol);
}

static void test_affine8_model(void **s) {
    (void)s;
    if (!bin()) {
        printf("DRAMA_BIN not set: skipped\n");
        return;
    }
    char dir[4096], cmd[16384], src[4200], dq[4200], df[4200], rows[4300];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(src, sizeof src, "%s/bf16", dir);
    snprintf(dq, sizeof dq, "%s/affine8", dir);
    snprintf(df, sizeof df, "%s/deq_f32", dir);
    /* other shape: widths multiples of 32 but not of 64 or 128 where the format allows */
    snprintf(cmd, sizeof cmd,
             "'%s' make-model '%s' --shape custom --hidden 96 --layers 4 --full-attention-interval 2 --heads 4 "
             "--kv-heads 1 --head-dim 32 --linear-key-heads 1 --linear-key-dim 16 --linear-value-heads 2 "
             "--linear-value-dim 24 --conv-kernel 4 --num-experts 10 --top-k 4 --moe-inter 96 --shared-inter 32 "
             "--codec none --seed 5 --experts bf16 >/dev/null 2>&1",
             bin(), src);
    assert_int_equal(run_cmd(cmd), 0);
    for (int k = 0; k < 2; k++) { /* config + tokenizer files, no index */
        const char *to = k ? df : dq;
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/*.json '%s'/ && rm -f '%s/model.safetensors.index.json'",
                 to, src, to, to);
        assert_int_equal(run_cmd(cmd), 0);
    }
    convert(src, dq, df);
    /* rows from the generated config: text rows, then audio rows */
    dr_config *cfg = NULL;
    drama_error e = {0};
    assert_int_equal(dr_config_load(src, NULL, 0, &cfg, &e), DRAMA_OK);
    int64_t S = cfg->tokens.semantic_start;
    int nc = cfg->audio.num_codebooks;
    dr_config_free(cfg);
    snprintf(rows, sizeof rows, "%s/rows.json", dir);
    FILE *fp = fopen(rows, "w");
    assert_non_null(fp);
    fprintf(fp, "{\"rows\": [");
    for (int r = 0; r < 9; r++) {
        int audio = r >= 3, c0 = (r * 613) % 4096;
        fprintf(fp, "%s[%lld", r ? "," : "", audio ? (long long)(S + c0) : (long long)(r * 17 % 200));
        for (int k = 0; k < nc; k++) fprintf(fp, ",%d", audio ? (k == 0 ? c0 : (r * 29 + k * 5) % 1024) : 0);
        fprintf(fp, "]");
    }
    fprintf(fp, "], \"prefill\": 5}\n");
    fclose(fp);
    int64_t na, nb, ns;
    float *a = tu_forward_logits(bin(), dir, dq, rows, "affine8", &na);
    float *b = tu_forward_logits(bin(), dir, df, rows, "deq_f32", &nb);
    float *o = tu_forward_logits(bin(), dir, src, rows, "bf16", &ns);
    assert_int_equal(na, nb);
    assert_int_equal(na, ns);
    int ok = tu_report("logits: affine8 vs its exact F32 twin", tu_compare_f32(a, b, na), 0.0);
    ok &= tu_report_differs("logits: affine8 vs the BF16 source", tu_compare_f32(a, o, na), 0.0);
    assert_true(ok);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    free(a), free(b), free(o);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_affine8_model)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
