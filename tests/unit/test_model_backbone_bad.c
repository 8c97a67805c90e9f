/* test_model_backbone_bad.c - broken checkpoints give every finding at once (MODEL.md 4.5), pruned
 * metadata in both encodings and its errors (FORMATS.md 5), names.rename, routing edge cases
 * (ties to the lower id, non-finite router scores). Checkpoints are rewritten from the golden
 * tiny model into temporary directories with the engine's own safetensors writer. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/loader.h"
#include "model/state.h"
#include "testutil.h"

/* Per tensor: return 0 to drop it; may change the shape (ndim/shape) and point *data at other
 * bytes of *nbytes. */
typedef int (*edit_fn)(const char *name, int *ndim, int64_t *shape, const uint8_t **data, size_t *nbytes,
                       void *ctx);

typedef struct extra {
    const char *name;
    dr_dtype dt;
    int ndim;
    int64_t shape[3];
    size_t nbytes;
} extra;

/* Rewrite the checkpoint of golden `rel` into dir/model.safetensors (or `shard` + an index with
 * `index_meta` JSON when given), config.json copied. */
static void rewrite(const char *rel, const char *dir, edit_fn fn, void *ctx, const extra *extras, int n_extras,
                    const char *index_meta) {
    const char *src = tu_model_dir(rel);
    dr_ckpt *ck = NULL;
    drama_error e = {0};
    assert_int_equal(dr_ckpt_open(src, &ck, &e), DRAMA_OK);
    char path[4200], cfgp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, index_meta ? "model-00001-of-00001.safetensors" : "model.safetensors");
    dr_st_writer *w = NULL;
    assert_int_equal(dr_st_writer_create(path, &w, &e), DRAMA_OK);
    int64_t n = dr_ckpt_count(ck);
    const uint8_t **datas = calloc((size_t)n, sizeof *datas);
    size_t *sizes = calloc((size_t)n, sizeof *sizes);
    int *keep = calloc((size_t)n, sizeof *keep);
    char *names = calloc((size_t)(n + n_extras) * 256, 1);
    int n_names = 0;
    for (int64_t i = 0; i < n; i++) {
        const dr_tensor *t = dr_ckpt_at(ck, i);
        int ndim = t->ndim;
        int64_t shape[DR_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        datas[i] = t->data;
        sizes[i] = t->nbytes;
        keep[i] = fn ? fn(t->name, &ndim, shape, &datas[i], &sizes[i], ctx) : 1;
        if (!keep[i]) continue;
        assert_int_equal(dr_st_writer_declare(w, t->name, t->dtype, ndim, shape, &e), DRAMA_OK);
        snprintf(names + 256 * n_names++, 256, "%s", t->name);
    }
    for (int i = 0; i < n_extras; i++) {
        assert_int_equal(dr_st_writer_declare(w, extras[i].name, extras[i].dt, extras[i].ndim, extras[i].shape, &e),
                         DRAMA_OK);
        snprintf(names + 256 * n_names++, 256, "%s", extras[i].name);
    }
    for (int64_t i = 0; i < n; i++)
        if (keep[i]) assert_int_equal(dr_st_writer_write(w, datas[i], sizes[i], &e), DRAMA_OK);
    for (int i = 0; i < n_extras; i++) {
        uint8_t *z = calloc(extras[i].nbytes + 1, 1);
        assert_int_equal(dr_st_writer_write(w, z, extras[i].nbytes, &e), DRAMA_OK);
        free(z);
    }
    if (dr_st_writer_finish(w, &e)) {
        printf("%s\n", e.message);
        fail();
    }
    if (index_meta) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "{\"metadata\": %s, \"weight_map\": {", index_meta);
        for (int i = 0; i < n_names; i++)
            fprintf(f, "%s\"%s\": \"model-00001-of-00001.safetensors\"", i ? ", " : "", names + 256 * i);
        fprintf(f, "}}\n");
        fclose(f);
    }
    snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
    size_t cl;
    char *cfg = tu_read_file(cfgp, &cl);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    tu_write_file(cfgp, cfg, cl);
    free(cfg);
    free(datas);
    free(sizes);
    free(keep);
    free(names);
    dr_ckpt_close(ck);
}

typedef struct opened {
    dr_config *cfg;
    dr_ckpt *ck;
    dr_loader *ld;
    dr_backbone bb;
    drama_status bind_status;
    drama_error err;
} opened;

static void open_dir(opened *o, const char *dir, const char *const *sets, int n_sets) {
    memset(o, 0, sizeof *o);
    assert_int_equal(dr_config_load(dir, sets, n_sets, &o->cfg, &o->err), DRAMA_OK);
    if (dr_ckpt_open(dir, &o->ck, &o->err)) {
        printf("%s\n", o->err.message);
        fail();
    }
    assert_int_equal(dr_loader_create(o->ck, o->cfg, &o->ld, &o->err), DRAMA_OK);
    o->bind_status = dr_backbone_bind(&o->bb, o->ld, &o->err);
    if (o->bind_status == DRAMA_OK) {
        dr_loader_finish(o->ld);
        int64_t S = o->cfg->tokens.semantic_start;
        dr_backbone_set_tokens(&o->bb, S, o->cfg->tokens.semantic_end - S + 1, o->cfg->tokens.eos[0], NULL);
    }
}

static void close_dir(opened *o) {
    dr_backbone_release(&o->bb);
    dr_loader_free(o->ld);
    dr_ckpt_close(o->ck);
    dr_config_free(o->cfg);
}

static int has_finding(dr_findings *f, dr_finding_kind k, const char *name_part, const char *detail_part) {
    for (int i = 0; i < f->n; i++)
        if (f->items[i].kind == k && strstr(f->items[i].name, name_part) &&
            (!detail_part || strstr(f->items[i].detail, detail_part)))
            return 1;
    return 0;
}

/* ---- every finding in one report ---- */

static int edit_broken(const char *name, int *ndim, int64_t *shape, const uint8_t **data, size_t *nbytes, void *ctx) {
    (void)data;
    (void)ctx;
    if (strstr(name, "layers.1.linear_attn.in_proj_z.weight")) return 0;               /* missing */
    if (strstr(name, "layers.3.self_attn.q_norm.weight")) {                            /* mis-shaped */
        shape[0] /= 2;
        *nbytes /= 2;
    }
    if (strstr(name, "layers.2.mlp.experts.5.up_proj.weight_scale_inv")) return 0;      /* incomplete */
    if (strstr(name, "layers.0.mlp.shared_expert.down_proj.weight")) {                  /* mis-shaped 2-D */
        *ndim = 2;
        shape[1] /= 2;
        *nbytes /= 2;
    }
    return 1;
}

static void test_findings_all_at_once(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    extra ex[3] = {{"model.language_model.layers.0.mlp.gate.bias", DR_DT_F32, 1, {16}, 64},
                   {"model.language_model.layers.6.mlp.experts.down_proj", DR_DT_BF16, 3, {16, 64, 64}, 16 * 64 * 64 * 2},
                   {"model.language_model.layers.4.mlp.experts.99.gate_proj.scales", DR_DT_BF16, 2, {64, 1}, 128}};
    rewrite("variants/fp8-block", dir, edit_broken, NULL, ex, 3, NULL);
    opened o;
    open_dir(&o, dir, NULL, 0);
    assert_int_equal(o.bind_status, DRAMA_OK);
    dr_findings *f = dr_loader_findings(o.ld);
    for (int i = 0; i < f->n; i++)
        if (strncmp(f->items[i].name, "audio_decoder", 13) != 0)
            printf("%s: %s: %s\n", dr_finding_kind_name(f->items[i].kind), f->items[i].name, f->items[i].detail);
    assert_true(has_finding(f, DR_FIND_MISSING, "layers.1.linear_attn.in_proj_z.weight", NULL));
    assert_true(has_finding(f, DR_FIND_MISSHAPED, "layers.3.self_attn.q_norm.weight", "expected [64], found [32]"));
    assert_true(has_finding(f, DR_FIND_INCOMPLETE, "layers.2.mlp.experts.5.up_proj.weight", "_scale_inv"));
    assert_true(has_finding(f, DR_FIND_MISSHAPED, "layers.0.mlp.shared_expert.down_proj.weight",
                            "expected [64, 64], found [64, 32]"));
    assert_true(has_finding(f, DR_FIND_UNEXPECTED, "layers.0.mlp.gate.bias", NULL));
    assert_true(has_finding(f, DR_FIND_INCOMPLETE, "experts.99.gate_proj.scales", "without its weight"));
    assert_true(has_finding(f, DR_FIND_UNSUPPORTED, "layers.6.mlp.experts.down_proj", "per-expert"));
    assert_true(dr_findings_fatal(f, 0) >= 6);
    drama_error e = {0};
    assert_int_not_equal(dr_findings_check(f, 0, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "load finding"));
    close_dir(&o);
    tu_rm_rf(dir);
}

/* unsupported dtype, and loader.strict turns unexpected into fatal */
static int edit_unsupported(const char *name, int *ndim, int64_t *shape, const uint8_t **data, size_t *nbytes,
                            void *ctx) {
    (void)ndim; (void)shape; (void)data; (void)nbytes; (void)ctx;
    return strstr(name, "layers.0.mlp.gate.weight") == NULL;
}

static void test_strict_and_unsupported(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    extra ex[2] = {{"model.language_model.layers.0.mlp.gate.weight", DR_DT_I32, 2, {16, 64}, 16 * 64 * 4},
                   {"model.language_model.something_else", DR_DT_F32, 1, {3}, 12}};
    rewrite("tiny-drama3", dir, edit_unsupported, NULL, ex, 2, NULL);
    const char *strict[] = {"loader.strict=true"};
    opened o;
    open_dir(&o, dir, strict, 1);
    dr_findings *f = dr_loader_findings(o.ld);
    assert_true(has_finding(f, DR_FIND_UNSUPPORTED, "layers.0.mlp.gate.weight", "I32"));
    assert_true(has_finding(f, DR_FIND_UNEXPECTED, "something_else", NULL));
    int nonstrict = dr_findings_fatal(f, 0), strictn = dr_findings_fatal(f, 1);
    assert_true(strictn > nonstrict);
    close_dir(&o);
    tu_rm_rf(dir);
}

/* ---- names.rename and prefix ---- */

static void test_rename(void **s) {
    (void)s;
    const char *dir = tu_model_dir("tiny-drama3");
    const char *sets[] = {"names.rename=[[\"^model\\\\.language_model\\\\.(.*)$\", \"lm.\\\\1\"]]"};
    opened a, b;
    open_dir(&a, dir, NULL, 0);
    open_dir(&b, dir, sets, 1);
    assert_int_equal(b.bind_status, DRAMA_OK);
    assert_string_equal(a.bb.prefix, "model.language_model.");
    assert_string_equal(b.bb.prefix, "lm.");
    assert_int_equal(dr_findings_fatal(dr_loader_findings(b.ld), 0), 0);
    /* forced prefix that does not exist: prefix error */
    const char *bad[] = {"backbone.prefix=nope."};
    opened c;
    open_dir(&c, dir, bad, 1);
    assert_int_equal(c.bind_status, DRAMA_OK);
    assert_true(has_finding(dr_loader_findings(c.ld), DR_FIND_MISSING, "nope.embed_tokens.weight", NULL));
    /* a code table name that does not exist: missing, with the look-alike tensors named */
    const char *ct[] = {"input.code_table=no.such.table"};
    opened d;
    open_dir(&d, dir, ct, 1);
    assert_true(has_finding(dr_loader_findings(d.ld), DR_FIND_MISSING, "no.such.table",
                            "audio_decoder.codebook_embeddings.weight"));
    close_dir(&a);
    close_dir(&b);
    close_dir(&c);
    close_dir(&d);
}

/* ---- pruned metadata: object and string forms agree; bad sets fail naming the layer ---- */

static char *pruned_meta(void) {
    size_t n;
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tu_model_dir("variants/pruned"));
    char *text = tu_read_file(p, &n);
    /* the "metadata" object, verbatim */
    char *m = strstr(text, "\"metadata\"");
    assert_non_null(m);
    m = strchr(m, '{');
    int depth = 0;
    char *q = m;
    for (; *q; q++) {
        if (*q == '{') depth++;
        if (*q == '}' && --depth == 0) break;
    }
    size_t len = (size_t)(q - m + 1);
    char *out = malloc(len + 1);
    memcpy(out, m, len);
    out[len] = 0;
    free(text);
    return out;
}

static void forward_all(opened *o, float *hidden, const int32_t *rows, int64_t n) {
    dr_bb_state *st = NULL;
    drama_error e = {0};
    assert_int_equal(dr_bb_state_create(&o->bb, n, &st, &e), DRAMA_OK);
    if (dr_backbone_forward(&o->bb, st, rows, n, hidden, NULL, NULL, NULL, &e)) {
        printf("%s\n", e.message);
        fail();
    }
    dr_bb_state_free(st);
}

static void test_pruned_meta(void **s) {
    (void)s;
    char *meta = pruned_meta(); /* {"total_size": .., "drama_experts": {...}} */
    char *de = strstr(meta, "\"drama_experts\"");
    assert_non_null(de);
    char *obj = strchr(de, '{');
    int depth = 0;
    char *q = obj;
    for (; *q; q++) {
        if (*q == '{') depth++;
        if (*q == '}' && --depth == 0) break;
    }
    /* the same object as a JSON string */
    size_t olen = (size_t)(q - obj + 1);
    char *as_string = malloc(olen * 2 + 64);
    size_t k = 0;
    as_string[k++] = '"';
    for (size_t i = 0; i < olen; i++) {
        if (obj[i] == '\n' || obj[i] == '\r') continue;
        if (obj[i] == '"') as_string[k++] = '\\';
        as_string[k++] = obj[i];
    }
    as_string[k++] = '"';
    as_string[k] = 0;
    char *meta_str = malloc(strlen(as_string) + 64);
    sprintf(meta_str, "{\"drama_experts\": %s}", as_string);

    const char *g = tu_golden("ref/variant-pruned.safetensors");
    int64_t nr;
    int32_t *rows = tu_load_i32(g, "prefill.rows", &nr);
    nr /= 11;
    float *h1 = malloc((size_t)nr * 64 * 4 * 4), *h2 = malloc((size_t)nr * 64 * 4 * 4);

    opened a, b;
    open_dir(&a, tu_model_dir("variants/pruned"), NULL, 0);
    const char *dir = tu_tmpdir();
    rewrite("variants/pruned", dir, NULL, NULL, NULL, 0, meta_str);
    open_dir(&b, dir, NULL, 0);
    assert_int_equal(b.bind_status, DRAMA_OK);
    assert_true(b.bb.has_experts_meta);
    assert_int_equal(dr_findings_fatal(dr_loader_findings(b.ld), 0), 0);
    assert_true(a.bb.d.H <= 256);
    forward_all(&a, h1, rows, nr);
    forward_all(&b, h2, rows, nr);
    assert_memory_equal(h1, h2, (size_t)(nr * a.bb.d.H) * 4);
    /* the pruned model without its metadata: the absent experts are "missing" */
    char *dir2 = strdup(tu_tmpdir());
    rewrite("variants/pruned", dir2, NULL, NULL, NULL, 0, "{}");
    opened c;
    open_dir(&c, dir2, NULL, 0);
    assert_true(dr_findings_count(dr_loader_findings(c.ld), DR_FIND_MISSING) > 0);
    close_dir(&c);
    /* bad sets: not ascending; fewer than top-k; id out of range; a layer absent */
    const char *bads[] = {"{\"drama_experts\": {\"0\": [3, 1, 2, 4]}}", "{\"drama_experts\": {\"0\": [0, 1]}}",
                          "{\"drama_experts\": {\"0\": [0, 1, 2, 99]}}", "{\"drama_experts\": {\"1\": [0, 1, 2, 3]}}",
                          "{\"drama_experts\": \"not json\"}", "{\"drama_experts\": [1, 2]}"};
    for (int i = 0; i < 6; i++) {
        char *d3 = strdup(tu_tmpdir());
        rewrite("variants/pruned", d3, NULL, NULL, NULL, 0, bads[i]);
        opened x;
        open_dir(&x, d3, NULL, 0);
        printf("bad drama_experts %d: %s\n", i, x.err.message);
        assert_int_not_equal(x.bind_status, DRAMA_OK);
        assert_non_null(strstr(x.err.message, "drama_experts"));
        close_dir(&x);
        tu_rm_rf(d3);
        free(d3);
    }
    close_dir(&a);
    close_dir(&b);
    tu_rm_rf(dir);
    tu_rm_rf(dir2);
    free(dir2);
    free(rows); free(h1); free(h2); free(meta); free(as_string); free(meta_str);
}

/* ---- routing edge cases ---- */

static void test_topk_ties(void **s) {
    (void)s;
    float p[6] = {0.1f, 0.3f, 0.3f, -1.0f, 0.3f, 0.0f};
    int ids[4];
    dr_op_topk(p, 6, 4, ids);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 4);
    assert_int_equal(ids[3], 0);
    float q[3] = {-1.0f, 0.5f, NAN};
    dr_op_topk(q, 3, 3, ids);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], -1); /* excluded entries are never chosen */
}

/* A router full of NaN: a clear error, never a silent pick. */
static int edit_nan_router(const char *name, int *ndim, int64_t *shape, const uint8_t **data, size_t *nbytes,
                           void *ctx) {
    (void)ndim; (void)shape;
    if (strstr(name, "layers.2.mlp.gate.weight")) {
        uint8_t *nan = ctx;
        for (size_t i = 0; i + 1 < *nbytes; i += 2) { nan[i] = 0xC0; nan[i + 1] = 0x7F; } /* BF16 NaN */
        *data = nan;
    }
    return 1;
}

static void test_router_nonfinite(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    uint8_t *buf = calloc(1 << 20, 1);
    rewrite("tiny-drama3", dir, edit_nan_router, buf, NULL, 0, NULL);
    opened o;
    open_dir(&o, dir, NULL, 0);
    assert_int_equal(dr_findings_fatal(dr_loader_findings(o.ld), 0), 0);
    dr_bb_state *st = NULL;
    drama_error e = {0};
    assert_int_equal(dr_bb_state_create(&o.bb, 4, &st, &e), DRAMA_OK);
    int32_t row[11] = {5, 0};
    assert_int_equal(dr_backbone_forward(&o.bb, st, row, 1, NULL, NULL, NULL, NULL, &e), DRAMA_ENUMERIC);
    assert_non_null(strstr(e.message, "layer 2"));
    assert_non_null(strstr(e.message, "router produced no finite score"));
    dr_bb_state_free(st);
    close_dir(&o);
    free(buf);
    tu_rm_rf(dir);
}

/* A head trimmed to the semantic rows + end row (MODEL.md 5.6) gives the same logits. */
typedef struct trim_ctx {
    int64_t S, n_sem, end_id;
    uint8_t *buf;
} trim_ctx;

static int edit_trim_head(const char *name, int *ndim, int64_t *shape, const uint8_t **data, size_t *nbytes,
                          void *vctx) {
    trim_ctx *c = vctx;
    if (strcmp(name, "lm_head.weight") != 0) return 1;
    assert_int_equal(*ndim, 2);
    size_t rb = (size_t)shape[1] * 2; /* BF16 */
    c->buf = malloc((size_t)(c->n_sem + 1) * rb);
    memcpy(c->buf, *data + (size_t)c->S * rb, (size_t)c->n_sem * rb);
    memcpy(c->buf + (size_t)c->n_sem * rb, *data + (size_t)c->end_id * rb, rb);
    shape[0] = c->n_sem + 1;
    *data = c->buf;
    *nbytes = (size_t)(c->n_sem + 1) * rb;
    return 1;
}

static void test_trimmed_head(void **s) {
    (void)s;
    opened a;
    open_dir(&a, tu_model_dir("tiny-drama3"), NULL, 0);
    trim_ctx c = {a.bb.sem_start, a.bb.n_sem, a.bb.end_id, NULL};
    const char *dir = tu_tmpdir();
    rewrite("tiny-drama3", dir, edit_trim_head, &c, NULL, 0, NULL);
    opened b;
    open_dir(&b, dir, NULL, 0);
    assert_int_equal(b.bb.head.rows, c.n_sem + 1);
    assert_int_equal(b.bb.head_sem_row, 0);
    assert_int_equal(b.bb.head_end_row, c.n_sem);
    int64_t nl = dr_backbone_n_logits(&a.bb);
    float *la = malloc((size_t)nl * 4), *lb = malloc((size_t)nl * 4);
    drama_error e = {0};
    dr_bb_state *sa = NULL, *sb = NULL;
    assert_int_equal(dr_bb_state_create(&a.bb, 4, &sa, &e), DRAMA_OK);
    assert_int_equal(dr_bb_state_create(&b.bb, 4, &sb, &e), DRAMA_OK);
    int32_t row[11] = {7};
    assert_int_equal(dr_backbone_forward(&a.bb, sa, row, 1, NULL, la, NULL, NULL, &e), DRAMA_OK);
    assert_int_equal(dr_backbone_forward(&b.bb, sb, row, 1, NULL, lb, NULL, NULL, &e), DRAMA_OK);
    assert_memory_equal(la, lb, (size_t)nl * 4);
    dr_bb_state_free(sa);
    dr_bb_state_free(sb);
    free(la);
    free(lb);
    free(c.buf);
    close_dir(&a);
    close_dir(&b);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_findings_all_at_once), cmocka_unit_test(test_strict_and_unsupported),
        cmocka_unit_test(test_rename),               cmocka_unit_test(test_pruned_meta),
        cmocka_unit_test(test_topk_ties),            cmocka_unit_test(test_router_nonfinite),
        cmocka_unit_test(test_trimmed_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
