/* tower_run.c - the tower's arithmetic (TOWER-H1.md "One layer") over the backend seam: the
 * chain a frame step runs, and the host calls (teacher-forced prefill, generation with a host
 * pick). Activations fp32; sums of squares and attention weights accumulate in double so the
 * result does not depend on how rows are grouped. Row i of every op depends only on row i of its
 * input, and attention is computed per (row, head), so a row's result is identical whether it
 * runs alone, in a prefill batch, or with another session. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/alloc.h"
#include "model/tower.h"

/* ---------------- workspace ---------------- */

drama_status dr_tower_ws_create(dr_backend *be, const dr_tower *t, int64_t rows, dr_tower_ws **out, drama_error *err) {
    *out = NULL;
    const dr_tower_dims *d = &t->d;
    dr_tower_ws *w = calloc(1, sizeof *w);
    if (!w) return dr_fail(err, DRAMA_ENOMEM, "tower workspace: out of memory");
    w->be = be;
    w->rows = rows > 0 ? rows : 1;
    int64_t de = t->layers[0].de, dh = t->input_dim > d->dim ? t->input_dim : d->dim;
    int64_t qkv = (int64_t)(d->n_head + 2 * d->n_kv_head) * d->head_dim;
    struct {
        void **p;
        int64_t count;
        size_t size;
    } parts[] = {
        {(void **)&w->e, de, 4},         {(void **)&w->x, de + dh, 4},   {(void **)&w->u, d->dim, 4},
        {(void **)&w->a, d->dim, 4},     {(void **)&w->qkv, qkv, 4},     {(void **)&w->o, (int64_t)d->n_head * d->head_dim, 4},
        {(void **)&w->tmp, d->dim, 4},   {(void **)&w->g1, t->ffn, 4},  {(void **)&w->g3, t->ffn, 4},
        {(void **)&w->heads, d->head_vocab, 4}, {(void **)&w->ga, d->dim, 4}, {(void **)&w->gb, d->dim, 4},
        {(void **)&w->h, t->input_dim, 4}, {(void **)&w->codes, d->num_codebooks, 4}, {(void **)&w->mask, 1, 1},
        {(void **)&w->seq, 1, sizeof(dr_seq_row)}, {(void **)&w->status, 1, sizeof(dr_op_status)},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t count;
        drama_status st = dr_mul_size((size_t)w->rows, (size_t)(parts[i].count > 0 ? parts[i].count : 1), &count)
                              ? dr_bk_alloc_scratch(be, count, parts[i].size, parts[i].p, err)
                              : dr_fail(err, DRAMA_ENOMEM, "tower workspace: %lld rows overflow", (long long)rows);
        if (st) {
            dr_tower_ws_free(w);
            return dr_fail(err, st, "tower: cannot allocate activations for %lld rows", (long long)rows);
        }
    }
    *out = w;
    return DRAMA_OK;
}

void dr_tower_ws_free(dr_tower_ws *w) {
    if (!w) return;
    void *ps[] = {w->e, w->x, w->u, w->a, w->qkv, w->o, w->tmp, w->g1, w->g3, w->heads, w->ga, w->gb,
                  w->h, w->codes, w->mask, w->seq, w->status};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) dr_bk_free(w->be, ps[i]);
    free(w);
}

/* ---------------- one layer, the chain ---------------- */

/* One layer over n rows at seq[r]; in [n][L->dh] -> out [n][D]. codes[r * codes_ld]: the code
 * embedded by row r (table slot `slot`), unless mask[r] == 0 or masked_all. */
static void layer_forward(dr_backend *be, const dr_tower *t, dr_tower_ws *w, const dr_seq_row *seq, int l, int64_t n,
                          const float *in, const int32_t *codes, int64_t codes_ld, const uint8_t *mask, int masked_all,
                          int slot, float *out, dr_op_status *status) {
    const dr_tower_dims *d = &t->d;
    const dr_tower_layer *L = &t->layers[l];
    int64_t D = d->dim, hd = d->head_dim, qkv_dim = (int64_t)(d->n_head + 2 * d->n_kv_head) * hd;
    int64_t kvd = (int64_t)d->n_kv_head * hd;
    /* u = eh_proj(concat(enorm(e), hnorm(h))) */
    dr_tower_in_args ti = {&t->code_table, d->code_stride, slot, l, codes, codes_ld, mask, masked_all, L->enorm,
                           L->hnorm, d->eps, L->de, L->dh, d->concat_hidden_first, in, w->x, w->e, n, status};
    be->ops->tower_input(be, &ti);
    dr_bk_matmul(be, &L->eh_proj, w->x, n, w->u);
    dr_bk_rms_norm(be, w->u, L->attention_norm, d->eps, D, n, w->a);
    dr_bk_matmul(be, &L->wqkv, w->a, n, w->qkv);
    dr_attn_args at = {.rows = seq, .n = n, .layer = l, .nh = d->n_head, .nkv = d->n_kv_head, .hd = (int)hd,
                       .q = w->qkv, .q_stride = qkv_dim, .q_head_stride = hd,
                       .k = w->qkv + (int64_t)d->n_head * hd, .v = w->qkv + (int64_t)d->n_head * hd + kvd,
                       .kv_stride = qkv_dim, .q_norm = L->q_norm, .k_norm = L->k_norm, .eps = d->eps,
                       .rope_freq = t->rope_freq, .rope_half = d->rope_dims / 2, .rope_interleaved = !d->rope_half,
                       .gated = 0, .f64 = 1, .out = w->o};
    be->ops->attention(be, &at);
    dr_bk_matmul(be, &L->wo, w->o, n, w->tmp);
    dr_bk_add(be, w->u, w->tmp, n * D);
    dr_bk_rms_norm(be, w->u, L->ffn_norm, d->eps, D, n, w->a);
    dr_bk_matmul(be, &L->w1, w->a, n, w->g1);
    dr_bk_matmul(be, &L->w3, w->a, n, w->g3);
    dr_bk_swiglu(be, w->g1, w->g3, n * t->ffn, w->g1);
    dr_bk_matmul(be, &L->w2, w->g1, n, w->tmp);
    dr_bk_add(be, w->u, w->tmp, n * D);
    dr_bk_rms_norm(be, w->u, L->out_norm, d->eps, D, n, out);
}

void dr_tower_chain(dr_backend *be, const dr_tower *t, dr_tower_ws *w, const dr_seq_row *seq, int64_t n,
                    const float *h, int32_t *codes, int64_t codes_ld, dr_op_status *status, dr_tower_chain_pick pick,
                    void *ctx) {
    const dr_tower_dims *d = &t->d;
    const float *in = h;
    for (int l = 0; l < t->n_layers; l++) {
        int shared = l < d->n_shared, slot = shared ? 0 : l - d->n_shared;
        float *out = (l % 2) ? w->gb : w->ga;
        layer_forward(be, t, w, seq, l, n, in, codes + slot, codes_ld, NULL, shared && d->shared_code_none, slot, out,
                      status);
        if (!shared) {
            /* head slot predicts code slot+1 of every row, chosen before the next layer embeds it */
            dr_bk_matmul_rows(be, &t->heads[slot], 0, d->head_vocab, out, n, w->heads);
            pick(ctx, slot, w->heads);
        }
        in = out;
    }
    be->ops->advance(be, seq, n);
}

drama_status dr_tower_status_fail(const dr_tower *t, const dr_op_status *s, drama_error *err) {
    if (s->fault == DR_FAULT_CODE) {
        int l = (int)s->c;
        return dr_fail(err, (drama_status)s->code, "tower layer %s: code %d of codebook %d out of range [0, %lld)",
                       l >= 0 && l < t->n_layers ? t->layers[l].prefix : "?", s->a, s->b, (long long)t->d.code_stride);
    }
    if (s->fault == DR_FAULT_HIDDEN)
        return dr_fail(err, (drama_status)s->code, "tower: input hidden value %d is not finite", s->a);
    if (s->fault == DR_FAULT_DRAW) return dr_draw_fail(s, NULL, err);
    return dr_fail(err, s->code ? (drama_status)s->code : DRAMA_EINTERNAL, "tower: failure %d", s->fault);
}

/* ---------------- host calls ---------------- */

static drama_status check_finite(const float *x, int64_t n, const char *what, drama_error *err) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return dr_fail(err, DRAMA_ENUMERIC, "tower: %s value %lld is not finite", what, (long long)i);
    return DRAMA_OK;
}

/* The first failure among status[n] (backend memory) as an error. */
static drama_status check_status(dr_backend *be, const dr_tower *t, const dr_op_status *status, int64_t n,
                                 drama_error *err) {
    dr_op_status *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "tower: out of memory");
    drama_status st = dr_bk_download(be, s, status, (size_t)n * sizeof *s, err);
    for (int64_t i = 0; !st && i < n; i++)
        if (s[i].code) st = dr_tower_status_fail(t, &s[i], err);
    free(s);
    return st;
}

/* Teacher-forced rows: h in ws->h unless h_dev is given. */
static drama_status forward_core(dr_backend *be, const dr_tower *t, dr_tower_ws *w, dr_tower_cache *c, int64_t n,
                                 const float *h_dev, const int32_t *codes, const uint8_t *mask, float *layer_out,
                                 float *logits, drama_error *err) {
    const dr_tower_dims *d = &t->d;
    int64_t D = d->dim, nc = d->num_codebooks, hv = d->head_vocab;
    dr_seq_row *seq = malloc((size_t)n * sizeof *seq);
    float *heads = logits ? malloc((size_t)(n * hv) * sizeof(float)) : NULL;
    drama_status st = (!seq || (logits && !heads)) ? dr_fail(err, DRAMA_ENOMEM, "tower: cannot allocate %lld rows", (long long)n)
                                                   : DRAMA_OK;
    for (int64_t r = 0; !st && r < n; r++) seq[r] = (dr_seq_row){c->seq, r, NULL};
    if (!st) st = dr_bk_upload(be, w->seq, seq, (size_t)n * sizeof *seq, err);
    if (!st) st = dr_bk_upload(be, w->codes, codes, (size_t)(n * nc) * sizeof(int32_t), err);
    if (!st) st = dr_bk_upload(be, w->mask, mask, (size_t)n, err);
    if (!st) dr_bk_zero(be, w->status, (size_t)n * sizeof(dr_op_status));
    const float *in = h_dev ? h_dev : w->h;
    for (int l = 0; !st && l < t->n_layers; l++) {
        int shared = l < d->n_shared, slot = shared ? 0 : l - d->n_shared;
        float *out = (l % 2) ? w->gb : w->ga;
        layer_forward(be, t, w, w->seq, l, n, in, w->codes + slot, nc, w->mask, shared && d->shared_code_none, slot,
                      out, w->status);
        if (layer_out) st = dr_bk_download(be, layer_out + (int64_t)l * n * D, out, (size_t)(n * D) * sizeof(float), err);
        if (!st && !shared && logits) {
            dr_bk_matmul_rows(be, &t->heads[slot], 0, hv, out, n, w->heads);
            st = dr_bk_download(be, heads, w->heads, (size_t)(n * hv) * sizeof(float), err);
            for (int64_t r = 0; !st && r < n; r++)
                memcpy(logits + (r * (nc - 1) + slot) * hv, heads + r * hv, (size_t)hv * sizeof(float));
        }
        in = out;
    }
    if (!st) st = check_status(be, t, w->status, n, err);
    if (!st) {
        be->ops->advance(be, w->seq, n);
        c->len += n;
        st = dr_bk_sync(be, err);
    }
    free(seq);
    free(heads);
    return st;
}

/* Teacher-forced forward with the input hidden in host memory (h) or backend memory (h_dev). */
static drama_status tower_forward(const dr_tower *t, dr_tower_ws *ws, dr_tower_cache *c, int n, const float *h,
                                  const float *h_dev, const int32_t *codes, const uint8_t *mask, float *layer_out,
                                  float *logits, dr_pool *pool, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    drama_status st = h ? check_finite(h, (int64_t)n * t->input_dim, "input hidden", err) : DRAMA_OK;
    if (st || (st = dr_tower_cache_reserve(c, c->len + n, err))) return st;
    dr_cpu_call hb;
    dr_backend *be = dr_cpu_call_begin(&hb, c->be, pool);
    dr_tower_ws *w = ws && ws->rows >= n ? ws : NULL;
    if (!w) st = dr_tower_ws_create(be, t, n, &w, err);
    if (!st && h) st = dr_bk_upload(be, w->h, h, (size_t)n * t->input_dim * sizeof(float), err);
    if (!st) st = forward_core(be, t, w, c, n, h ? NULL : h_dev, codes, mask, layer_out, logits, err);
    if (w != ws) dr_tower_ws_free(w);
    dr_cpu_call_end(&hb);
    return st;
}

drama_status dr_tower_forward(const dr_tower *t, dr_tower_cache *c, int n, const float *h, const int32_t *codes,
                              const uint8_t *mask, float *layer_out, float *logits, dr_pool *pool,
                              drama_error *err) {
    return tower_forward(t, NULL, c, n, h, NULL, codes, mask, layer_out, logits, pool, err);
}

drama_status dr_tower_prefill(const dr_tower *t, dr_tower_ws *ws, dr_tower_cache *c, int n, const float *h_dev,
                              const int32_t *codes, const uint8_t *mask, float *logits, dr_pool *pool,
                              drama_error *err) {
    return tower_forward(t, ws, c, n, NULL, h_dev, codes, mask, NULL, logits, pool, err);
}

/* The host pick of dr_tower_generate_many: head logits down, the caller's choice, codes up. */
typedef struct host_pick {
    dr_backend *be;
    const dr_tower *t;
    dr_tower_ws *w;
    int na, nc, hv;
    const int *act;            /* row of active k */
    float *lg;                 /* [na][hv] host */
    int32_t *cur;              /* [na][nc] host mirror of w->codes */
    int32_t *codes;            /* [n][nc] the caller's */
    float *head_logits;
    drama_status *row_status;
    drama_error *row_errs;
    dr_tower_pick_many_fn pick;
    void *pick_ctx;
    drama_status st;           /* a failure of the whole call */
    drama_error *err;
} host_pick;

static void pick_on_host(void *ctx, int slot, const float *logits) {
    host_pick *p = ctx;
    if (p->st) return;
    int64_t hv = p->hv, nc = p->nc;
    if ((p->st = dr_bk_download(p->be, p->lg, logits, (size_t)(p->na * hv) * sizeof(float), p->err))) return;
    for (int k = 0; k < p->na; k++) {
        int r = p->act[k], code = 0;
        const float *lg = p->lg + (int64_t)k * hv;
        if (p->head_logits) memcpy(p->head_logits + ((int64_t)r * (nc - 1) + slot) * hv, lg, (size_t)hv * sizeof(float));
        if (!p->row_status[r]) {
            drama_error *re = p->row_errs ? &p->row_errs[r] : NULL;
            p->row_status[r] = p->pick(p->pick_ctx, r, slot + 1, lg, (int)hv, &code, re);
            if (!p->row_status[r] && (code < 0 || code >= hv))
                p->row_status[r] = dr_fail(re, DRAMA_EINTERNAL, "tower: codebook %d pick %d outside [0, %lld)", slot + 1,
                                           code, (long long)hv);
            if (p->row_status[r]) code = 0; /* the row is lost; keep the others going */
        }
        p->cur[(int64_t)k * nc + slot + 1] = code;
        p->codes[(int64_t)r * nc + slot + 1] = code;
    }
    p->st = dr_bk_upload(p->be, p->w->codes, p->cur, (size_t)(p->na * nc) * sizeof(int32_t), p->err);
}

drama_status dr_tower_generate_many(const dr_tower *t, dr_tower_cache *const *caches, int n, const float *h,
                                    const int32_t *c0, dr_tower_pick_many_fn pick, void *pick_ctx, int32_t *codes,
                                    float *head_logits, drama_status *row_status, drama_error *row_errs,
                                    dr_pool *pool, drama_error *err) {
    const dr_tower_dims *d = &t->d;
    int64_t hv = d->head_vocab, nc = d->num_codebooks, in_w = t->input_dim;
    if (n <= 0) return DRAMA_OK;
    for (int r = 1; r < n; r++)
        if (caches[r]->be != caches[0]->be)
            return dr_fail(err, DRAMA_EINVAL, "tower: caches %d and 0 live on different backends", r);
    drama_status st = DRAMA_OK;
    dr_cpu_call hb;
    dr_backend *be = dr_cpu_call_begin(&hb, caches[0]->be, pool);
    dr_tower_ws *w = NULL;
    /* rows that can run: finite input; a failing row keeps its status and is left out */
    int *act = calloc((size_t)n, sizeof(int));
    dr_seq_row *seq = calloc((size_t)n, sizeof *seq);
    float *hin = malloc((size_t)n * in_w * sizeof(float)), *lg = malloc((size_t)n * hv * sizeof(float));
    int32_t *cur = calloc((size_t)n * nc, sizeof(int32_t));
    dr_op_status *rs = NULL;
    if (!act || !seq || !hin || !lg || !cur) {
        st = dr_fail(err, DRAMA_ENOMEM, "tower: out of memory for %d rows", n);
        goto done;
    }
    int na = 0;
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < nc; j++) codes[(int64_t)r * nc + j] = 0;
        codes[(int64_t)r * nc] = c0[r];
        row_status[r] = check_finite(h + r * in_w, in_w, "input hidden", row_errs ? &row_errs[r] : NULL);
        if (!row_status[r])
            row_status[r] = dr_tower_cache_reserve(caches[r], caches[r]->len + 1, row_errs ? &row_errs[r] : NULL);
        if (row_status[r]) continue;
        act[na] = r;
        seq[na] = (dr_seq_row){caches[r]->seq, 0, NULL};
        memcpy(hin + (int64_t)na * in_w, h + r * in_w, (size_t)in_w * sizeof(float));
        cur[(int64_t)na * nc] = c0[r];
        na++;
    }
    if (!na) goto done;
    if ((st = dr_tower_ws_create(be, t, na, &w, err))) goto done;
    if ((st = dr_bk_upload(be, w->seq, seq, (size_t)na * sizeof *seq, err))) goto done;
    if ((st = dr_bk_upload(be, w->h, hin, (size_t)na * in_w * sizeof(float), err))) goto done;
    if ((st = dr_bk_upload(be, w->codes, cur, (size_t)na * nc * sizeof(int32_t), err))) goto done;
    dr_bk_zero(be, w->status, (size_t)na * sizeof(dr_op_status));
    host_pick hp = {be, t, w, na, (int)nc, (int)hv, act, lg, cur, codes, head_logits, row_status, row_errs,
                    pick, pick_ctx, DRAMA_OK, err};
    dr_tower_chain(be, t, w, w->seq, na, w->h, w->codes, nc, w->status, pick_on_host, &hp);
    if ((st = hp.st) || (st = dr_bk_sync(be, err))) goto done;
    if (!(rs = malloc((size_t)na * sizeof *rs))) {
        st = dr_fail(err, DRAMA_ENOMEM, "tower: out of memory for %d rows", n);
        goto done;
    }
    if ((st = dr_bk_download(be, rs, w->status, (size_t)na * sizeof *rs, err))) goto done;
    for (int k = 0; k < na; k++) {
        int r = act[k];
        if (rs[k].code && !row_status[r]) row_status[r] = dr_tower_status_fail(t, &rs[k], row_errs ? &row_errs[r] : NULL);
        caches[r]->len += 1;
    }
done:
    free(rs);
    dr_tower_ws_free(w);
    free(act);
    free(seq);
    free(hin);
    free(lg);
    free(cur);
    dr_cpu_call_end(&hb);
    return st;
}

typedef struct one_pick {
    dr_tower_pick_fn pick;
    void *ctx;
} one_pick;

static drama_status pick_one(void *ctx, int row, int codebook, const float *logits, int n, int *code,
                             drama_error *err) {
    one_pick *o = ctx;
    (void)row;
    return o->pick(o->ctx, codebook, logits, n, code, err);
}

drama_status dr_tower_generate(const dr_tower *t, dr_tower_cache *c, const float *h, int32_t c0,
                               dr_tower_pick_fn pick, void *pick_ctx, int32_t *codes, float *head_logits,
                               dr_pool *pool, drama_error *err) {
    one_pick o = {pick, pick_ctx};
    drama_status row_st = DRAMA_OK;
    drama_status st = dr_tower_generate_many(t, &c, 1, h, &c0, pick_one, &o, codes, head_logits, &row_st, err, pool,
                                             err);
    return st ? st : row_st;
}
