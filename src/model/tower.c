/* tower.c - binding of the tower tensors and the H1 math (TOWER-H1.md). */
#include "model/tower.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/alloc.h"
#include "io/safetensors.h"

#define SHARED_PREFIX "audio_decoder_mtp_shared.layers."
#define CB_PREFIX "audio_decoder_mtp.layers."
#define HEAD_PREFIX "audio_decoder_mtp.heads."

drama_status dr_tower_dims_from_config(const dr_config *cfg, dr_tower_dims *d, drama_error *err) {
    const dr_audio_config *a = &cfg->audio;
    const dr_switches *sw = &cfg->sw;
    memset(d, 0, sizeof *d);
    d->dim = a->dim;
    d->n_head = a->n_head;
    d->n_kv_head = a->n_local_heads;
    d->head_dim = a->head_dim;
    d->ffn = a->intermediate_size;
    d->eps = a->norm_eps;
    d->num_codebooks = a->num_codebooks;
    d->n_shared = a->shared_enrichment_layers;
    d->code_stride = sw->tower_code_stride;
    d->head_vocab = sw->tower_head_vocab;
    dr_switch_source src = DR_SRC_BUILTIN;
    char text[32];
    d->head_vocab_auto = dr_config_switch_text(cfg, "tower.head_vocab", text, sizeof text, &src) && src == DR_SRC_BUILTIN;
    d->rope_dims = sw->tower_rope_dims;
    d->rope_base = a->rope_base;
    d->rope_half = sw->tower_rope_half;
    d->rope_freq_head_dim = sw->tower_rope_freq_head_dim;
    d->norm_offset = sw->tower_norm_offset;
    d->concat_hidden_first = sw->tower_concat_hidden_first;
    d->shared_code_none = sw->tower_shared_code_none;
    d->qk_norm = sw->tower_qk_norm;
    d->prefill_same_row = sw->tower_prefill_same_row;
    d->input_pre_norm = sw->tower_input_pre_norm;
    d->code_table = sw->tower_code_table;
    const char *k = a->key[0] ? a->key : "audio_decoder_config";
    if (d->dim <= 0 || d->n_head <= 0 || d->n_kv_head <= 0 || d->head_dim <= 0)
        return dr_fail(err, DRAMA_EFORMAT, "config.json: %s: dim, n_head, n_local_heads, head_dim must be positive", k);
    if (d->n_head % d->n_kv_head)
        return dr_fail(err, DRAMA_EFORMAT, "config.json: %s: n_head %d is not a multiple of n_local_heads %d", k,
                       d->n_head, d->n_kv_head);
    if (d->num_codebooks < 2 || d->n_shared < 0)
        return dr_fail(err, DRAMA_EFORMAT, "config.json: %s: num_codebooks %d / shared_enrichment_layers %d unusable",
                       k, d->num_codebooks, d->n_shared);
    if (d->num_codebooks - 1 > 14)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "config.json: %s: num_codebooks %d exceeds the 15 the RNG slots allow",
                       k, d->num_codebooks);
    if (d->code_stride <= 0) return dr_fail(err, DRAMA_EFORMAT, "switch tower.code_stride: must be positive");
    if (d->head_vocab <= 0) return dr_fail(err, DRAMA_EFORMAT, "switch tower.head_vocab: must be positive");
    if (d->rope_dims < 0 || d->rope_dims > d->head_dim || d->rope_dims % 2)
        return dr_fail(err, DRAMA_EFORMAT, "switch tower.rope_dims: %d must be even and within head_dim %d",
                       d->rope_dims, d->head_dim);
    if (!(d->eps > 0) || !(d->rope_base > 0))
        return dr_fail(err, DRAMA_EFORMAT, "config.json: %s: norm_eps and rope_base must be positive", k);
    if (!d->code_table || !d->code_table[0]) return dr_fail(err, DRAMA_EFORMAT, "switch tower.code_table: empty");
    return DRAMA_OK;
}

/* ---------------- binding ---------------- */

/* Where binding problems go: the first one fails the bind (findings == NULL), or every one
 * becomes a loader finding (MODEL.md 4.5: one load reports everything) and the bind fails at
 * the end. */
typedef struct binder {
    dr_tower_find_fn find;
    void *ctx;
    dr_findings *findings;
    int problems;
    drama_error *err;
} binder;

static drama_status problem(binder *b, dr_finding_kind kind, const char *name, const char *fmt, ...) DR_PRINTF(4, 5);
static drama_status problem(binder *b, dr_finding_kind kind, const char *name, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    b->problems++;
    if (b->findings) dr_findings_add(b->findings, kind, name, "%s", detail);
    if (kind == DR_FIND_MISSING) return dr_fail(b->err, DRAMA_ESHAPE, "tower tensor %s: missing", name);
    return dr_fail(b->err, kind == DR_FIND_UNSUPPORTED ? DRAMA_EUNSUPPORTED : DRAMA_ESHAPE, "tower tensor %s: %s", name,
                   detail);
}

static drama_status bind_vec(binder *b, const char *name, int64_t expect, int64_t *got, float offset, float **out) {
    const dr_tensor *t = b->find(b->ctx, name);
    if (!t) return problem(b, DR_FIND_MISSING, name, "%s", "");
    if (t->ndim != 1 || (expect > 0 && t->shape[0] != expect))
        return problem(b, DR_FIND_MISSHAPED, name, "expected [%lld], found %d-D [%lld%s]", (long long)expect, t->ndim,
                       (long long)(t->ndim ? t->shape[0] : 0), t->ndim > 1 ? ", ..." : "");
    *out = dr_alloc((size_t)t->shape[0] * sizeof(float));
    if (!*out) return dr_fail(b->err, DRAMA_ENOMEM, "tower tensor %s: out of memory", name);
    drama_error e = {0};
    if (dr_st_to_f32(t, *out, &e)) return problem(b, DR_FIND_UNSUPPORTED, name, "%s", e.message);
    for (int64_t i = 0; i < t->shape[0]; i++) (*out)[i] += offset;
    if (got) *got = t->shape[0];
    return DRAMA_OK;
}

/* A matrix [rows, cols] in any stored format (rows < 0: at least -rows; 0: any); companions
 * found by their conventional names. */
static drama_status bind_mat(binder *b, const char *name, int64_t rows, int64_t cols, dr_weight *w) {
    const dr_tensor *t = b->find(b->ctx, name);
    if (!t) return problem(b, DR_FIND_MISSING, name, "%s", "");
    char base[256], buf[300];
    snprintf(base, sizeof base, "%s", name);
    size_t bl = strlen(base);
    if (bl > 7 && !strcmp(base + bl - 7, ".weight")) base[bl - 7] = 0;
    snprintf(buf, sizeof buf, "%s.weight_scale_inv", base);
    const dr_tensor *scale = b->find(b->ctx, buf);
    if (!scale) {
        snprintf(buf, sizeof buf, "%s.weight_scale", base);
        scale = b->find(b->ctx, buf);
    }
    if (!scale) {
        snprintf(buf, sizeof buf, "%s.scales", base);
        scale = b->find(b->ctx, buf);
    }
    snprintf(buf, sizeof buf, "%s.weight_scale_2", base);
    const dr_tensor *scale2 = b->find(b->ctx, buf);
    snprintf(buf, sizeof buf, "%s.biases", base);
    const dr_tensor *bias = b->find(b->ctx, buf);
    /* a dense matrix shows its logical shape: name a wrong one before the format checks do */
    int dense = t->dtype == DR_DT_BF16 || t->dtype == DR_DT_F32 || t->dtype == DR_DT_F16;
    if (dense && t->ndim == 2 &&
        ((rows > 0 && t->shape[0] != rows) || (rows < 0 && t->shape[0] < -rows) || (cols > 0 && t->shape[1] != cols)))
        return problem(b, DR_FIND_MISSHAPED, name, "expected [%s%lld, %lld], found [%lld, %lld]", rows < 0 ? ">= " : "",
                       (long long)(rows < 0 ? -rows : rows), (long long)cols, (long long)t->shape[0],
                       (long long)t->shape[1]);
    drama_error e = {0};
    if (dr_weight_bind_ex(t, scale, scale2, bias, -1, 0, 0, cols > 0 ? cols : 0, w, &e))
        return problem(b, DR_FIND_UNSUPPORTED, name, "%s", e.message);
    if ((rows > 0 && w->rows != rows) || (rows < 0 && w->rows < -rows) || (cols > 0 && w->cols != cols))
        return problem(b, DR_FIND_MISSHAPED, name, "expected [%s%lld, %lld], found [%lld, %lld]", rows < 0 ? ">= " : "",
                       (long long)(rows < 0 ? -rows : rows), (long long)cols, (long long)w->rows, (long long)w->cols);
    return DRAMA_OK;
}

/* In findings mode a problem is recorded and binding goes on; out of memory always stops. */
#define TRY(x)                                                        \
    do {                                                              \
        drama_status s_ = (x);                                        \
        if (s_ && (!b->findings || s_ == DRAMA_ENOMEM)) return s_;    \
    } while (0)

static drama_status bind_layer(dr_tower *t, int l, binder *b) {
    const dr_tower_dims *d = &t->d;
    dr_tower_layer *L = &t->layers[l];
    if (l < d->n_shared) snprintf(L->prefix, sizeof L->prefix, SHARED_PREFIX "%d.", l);
    else snprintf(L->prefix, sizeof L->prefix, CB_PREFIX "%d.", l - d->n_shared);
    char n[256];
    float off = (float)d->norm_offset;
    int64_t de = 0, dh = 0;
#define NAME(s) (snprintf(n, sizeof n, "%s%s", L->prefix, s), n)
    TRY(bind_vec(b, NAME("enorm.weight"), l ? t->layers[0].de : 0, &de, off, &L->enorm));
    TRY(bind_vec(b, NAME("hnorm.weight"), l ? d->dim : 0, &dh, off, &L->hnorm));
    L->de = (int)de;
    L->dh = (int)dh;
    int64_t D = d->dim, hd = d->head_dim;
    int64_t qkv = (int64_t)(d->n_head + 2 * d->n_kv_head) * hd;
    /* widths unknown after a problem above: check the rows only (no cascade of findings) */
    TRY(bind_mat(b, NAME("eh_proj.weight"), D, (de && dh) ? de + dh : 0, &L->eh_proj));
    TRY(bind_vec(b, NAME("attention_norm.weight"), D, NULL, off, &L->attention_norm));
    TRY(bind_vec(b, NAME("ffn_norm.weight"), D, NULL, off, &L->ffn_norm));
    TRY(bind_vec(b, NAME("out_norm.weight"), D, NULL, off, &L->out_norm));
    TRY(bind_mat(b, NAME("attention.wqkv.weight"), qkv, D, &L->wqkv));
    TRY(bind_mat(b, NAME("attention.wo.weight"), D, (int64_t)d->n_head * hd, &L->wo));
    if (l == 0) t->ffn = d->ffn > 0 ? d->ffn : 0;
    TRY(bind_mat(b, NAME("feed_forward.w1.weight"), t->ffn, D, &L->w1));
    if (l == 0 && !t->ffn) t->ffn = L->w1.rows; /* no config value: the shape decides */
    TRY(bind_mat(b, NAME("feed_forward.w3.weight"), t->ffn, D, &L->w3));
    TRY(bind_mat(b, NAME("feed_forward.w2.weight"), D, t->ffn, &L->w2));
    if (d->qk_norm) {
        TRY(bind_vec(b, NAME("attention.q_norm.weight"), hd, NULL, off, &L->q_norm));
        TRY(bind_vec(b, NAME("attention.k_norm.weight"), hd, NULL, off, &L->k_norm));
    }
#undef NAME
    return DRAMA_OK;
}

static drama_status bind_all(dr_tower *t, const dr_tower_dims *d, binder *b) {
    memset(t, 0, sizeof *t);
    t->d = *d;
    t->n_heads_out = d->num_codebooks - 1;
    t->n_layers = d->n_shared + t->n_heads_out;
    t->layers = dr_calloc((size_t)t->n_layers, sizeof *t->layers);
    t->heads = dr_calloc((size_t)t->n_heads_out, sizeof *t->heads);
    t->rope_freq = dr_calloc((size_t)(d->rope_dims / 2 + 1), sizeof(float));
    if (!t->layers || !t->heads || !t->rope_freq) return dr_fail(b->err, DRAMA_ENOMEM, "tower: out of memory");
    for (int l = 0; l < t->n_layers; l++) TRY(bind_layer(t, l, b));
    t->input_dim = t->layers[0].dh;
    TRY(bind_mat(b, d->code_table, -(int64_t)d->num_codebooks * d->code_stride, t->layers[0].de, &t->code_table));
    /* The default head_vocab (1024, the codec's residual codebook) cannot exceed the heads: a
     * model with smaller heads (its own residual codebook) samples all their rows. An explicit
     * tower.head_vocab is never changed. */
    const dr_tensor *head0 = b->find(b->ctx, HEAD_PREFIX "0.weight");
    if (d->head_vocab_auto && head0 && head0->ndim == 2 && head0->shape[0] > 0 && head0->shape[0] < d->head_vocab)
        t->d.head_vocab = (int)head0->shape[0];
    for (int j = 0; j < t->n_heads_out; j++) {
        char n[128];
        snprintf(n, sizeof n, HEAD_PREFIX "%d.weight", j);
        TRY(bind_mat(b, n, -(int64_t)t->d.head_vocab, d->dim, &t->heads[j]));
    }
    if (b->problems) {
        drama_status code = b->err ? b->err->code : DRAMA_ESHAPE;
        if (b->problems > 1) dr_error_prefix(b->err, "tower: %d problems, the first: ", b->problems);
        return code ? code : DRAMA_ESHAPE;
    }
    /* f_i = base^(-2i/R) with R = rope_dims, or head_dim with tower.rope_freq_dims = head_dim */
    double denom = d->rope_freq_head_dim ? d->head_dim : d->rope_dims;
    for (int i = 0; i < d->rope_dims / 2; i++) t->rope_freq[i] = (float)pow(d->rope_base, -2.0 * i / denom);
    return DRAMA_OK;
}
#undef TRY

drama_status dr_tower_bind(dr_tower *t, const dr_tower_dims *d, dr_tower_find_fn find, void *ctx,
                           drama_error *err) {
    return dr_tower_bind_findings(t, d, find, ctx, NULL, err);
}

drama_status dr_tower_bind_findings(dr_tower *t, const dr_tower_dims *d, dr_tower_find_fn find, void *ctx,
                                    dr_findings *findings, drama_error *err) {
    drama_error local = {0};
    binder b = {find, ctx, findings, 0, err ? err : &local};
    drama_status st = bind_all(t, d, &b);
    if (st) dr_tower_release(t);
    return st;
}

void dr_tower_release(dr_tower *t) {
    if (!t) return;
    for (int l = 0; t->layers && l < t->n_layers; l++) {
        dr_tower_layer *L = &t->layers[l];
        dr_free(L->enorm);
        dr_free(L->hnorm);
        dr_free(L->attention_norm);
        dr_free(L->ffn_norm);
        dr_free(L->out_norm);
        dr_free(L->q_norm);
        dr_free(L->k_norm);
    }
    dr_free(t->layers);
    dr_free(t->heads);
    dr_free(t->rope_freq);
    t->layers = NULL;
    t->heads = NULL;
    t->rope_freq = NULL;
}

/* ---------------- caches ---------------- */

dr_backend *dr_tower_cache_backend(const dr_tower_cache *c) { return c->be ? c->be : dr_backend_cpu_memory(); }

static drama_status write_seq(dr_tower_cache *c, drama_error *err) {
    dr_seq v = {c->kv, NULL, NULL, c->cap, c->len, c->kv_dim, 0, 0};
    return dr_bk_upload(dr_tower_cache_backend(c), c->seq, &v, sizeof v, err);
}

drama_status dr_tower_cache_reserve(dr_tower_cache *c, int64_t need, drama_error *err) {
    if (need <= c->cap) return DRAMA_OK;
    drama_status st = dr_bk_grow_kv(dr_tower_cache_backend(c), &c->kv, &c->cap, need, c->n_layers, c->kv_dim, c->len,
                                    "tower cache", err);
    return st ? st : write_seq(c, err);
}

drama_status dr_tower_cache_create_on(dr_backend *be, const dr_tower *t, int64_t reserve, dr_tower_cache **out,
                                      drama_error *err) {
    *out = NULL;
    dr_tower_cache *c = dr_calloc(1, sizeof *c);
    if (!c) return dr_fail(err, DRAMA_ENOMEM, "tower cache: out of memory");
    c->be = be;
    c->n_layers = t->n_layers;
    c->kv_dim = t->d.n_kv_head * t->d.head_dim;
    drama_status st = dr_bk_alloc(dr_tower_cache_backend(c), sizeof(dr_seq), (void **)&c->seq, err);
    if (!st) st = dr_tower_cache_reserve(c, reserve > 0 ? reserve : 64, err);
    if (st) {
        dr_tower_cache_free(c);
        return st;
    }
    *out = c;
    return DRAMA_OK;
}

drama_status dr_tower_cache_create(const dr_tower *t, int64_t reserve, dr_tower_cache **out, drama_error *err) {
    return dr_tower_cache_create_on(NULL, t, reserve, out, err);
}

void dr_tower_cache_free(dr_tower_cache *c) {
    if (!c) return;
    dr_backend *be = dr_tower_cache_backend(c);
    dr_bk_free(be, c->kv);
    dr_bk_free(be, c->seq);
    dr_free(c);
}

void dr_tower_cache_reset(dr_tower_cache *c) {
    if (!c) return;
    c->len = 0;
    dr_bk_zero(dr_tower_cache_backend(c), (char *)c->seq + offsetof(dr_seq, pos), sizeof(int64_t));
}

drama_status dr_tower_cache_truncate(dr_tower_cache *c, int64_t len) {
    if (!c || len < 0 || len >= c->len) return DRAMA_OK;
    c->len = len;
    return write_seq(c, NULL);
}

drama_status dr_tower_cache_copy(const dr_tower_cache *src, dr_tower_cache *dst, drama_error *err) {
    if (src->n_layers != dst->n_layers || src->kv_dim != dst->kv_dim)
        return dr_fail(err, DRAMA_EINTERNAL, "tower cache copy: caches of different towers");
    dr_backend *be = dr_tower_cache_backend(dst);
    if (be->kind != dr_tower_cache_backend(src)->kind)
        return dr_fail(err, DRAMA_EINTERNAL, "tower cache copy: caches on different backends");
    dst->len = 0;
    drama_status st = dr_tower_cache_reserve(dst, src->len, err);
    if (st) return st;
    dr_bk_copy_kv(be, dst->kv, dst->cap, src->kv, src->cap, src->n_layers, src->kv_dim, src->len);
    dst->len = src->len;
    return write_seq(dst, err);
}
