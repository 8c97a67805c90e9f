/* tower_run.c - the tower's arithmetic (TOWER-H1.md "One layer"), teacher-forced and generating.
 * Activations fp32; sums of squares and attention weights accumulate in double so the result
 * does not depend on how rows are grouped. Norms (w carries tower.norm_offset), RoPE, attention
 * and SwiGLU are the ops of backend/cpu/ops.h. Row i of every product depends only on row i of its
 * input (backend/cpu/matmul.h), and attention is computed per (row, head), so a row's result is
 * identical whether it runs alone, in a prefill batch, or with another session. */
#include <math.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/tower.h"

typedef struct scratch {
    int n;
    float *e, *x, *u, *a, *qkv, *o, *tmp, *g1, *g3, *heads;
    float *cs;      /* [rope_dims]: cos | sin of one position */
    float *scores;  /* [n_workers][max_len] */
    int n_workers;
    int64_t max_len;
} scratch;

static void scratch_free(scratch *s) {
    dr_free(s->e);
    dr_free(s->x);
    dr_free(s->u);
    dr_free(s->a);
    dr_free(s->qkv);
    dr_free(s->o);
    dr_free(s->tmp);
    dr_free(s->g1);
    dr_free(s->g3);
    dr_free(s->heads);
    dr_free(s->cs);
    dr_free(s->scores);
    memset(s, 0, sizeof *s);
}

static float *alloc_f(int64_t a, int64_t b) {
    size_t bytes;
    if (!dr_mul_size((size_t)a, (size_t)b * sizeof(float), &bytes)) return NULL;
    return dr_alloc(bytes ? bytes : sizeof(float));
}

static drama_status scratch_init(scratch *s, const dr_tower *t, int n, int64_t max_len, dr_pool *pool,
                                 drama_error *err) {
    memset(s, 0, sizeof *s);
    const dr_tower_dims *d = &t->d;
    int64_t de = t->layers[0].de, dh = t->input_dim > d->dim ? t->input_dim : d->dim;
    int64_t qkv = (int64_t)(d->n_head + 2 * d->n_kv_head) * d->head_dim;
    s->n = n;
    s->n_workers = pool ? dr_pool_threads(pool) : 1;
    s->max_len = max_len;
    s->e = alloc_f(n, de);
    s->x = alloc_f(n, de + dh);
    s->u = alloc_f(n, d->dim);
    s->a = alloc_f(n, d->dim);
    s->qkv = alloc_f(n, qkv);
    s->o = alloc_f(n, (int64_t)d->n_head * d->head_dim);
    s->tmp = alloc_f(n, d->dim);
    s->g1 = alloc_f(n, t->ffn);
    s->g3 = alloc_f(n, t->ffn);
    s->heads = alloc_f(n, d->head_vocab);
    s->cs = alloc_f(1, d->rope_dims > 0 ? d->rope_dims : 1);
    s->scores = alloc_f(s->n_workers, max_len);
    if (!s->e || !s->x || !s->u || !s->a || !s->qkv || !s->o || !s->tmp || !s->g1 || !s->g3 || !s->heads || !s->cs ||
        !s->scores) {
        scratch_free(s);
        return dr_fail(err, DRAMA_ENOMEM, "tower: cannot allocate activations for %d rows", n);
    }
    return DRAMA_OK;
}

/* cs holds the cos | sin tables of the row's position (dr_op_rope_cos_sin) */
static void rope(const dr_tower *t, float *x, const float *cs) {
    int half = t->d.rope_dims / 2;
    if (t->d.rope_half) dr_op_rope_half(x, half, cs, cs + half);
    else dr_op_rope_interleaved(x, half, cs, cs + half);
}

typedef struct attn_ctx {
    const dr_tower *t;
    dr_tower_cache *const *cs; /* cache of each row */
    const int64_t *pos;        /* position of each row */
    int layer;
    scratch *s;
    int64_t qkv_dim;
} attn_ctx;

/* One (row, query head): softmax(q K^T / sqrt(hd)) V over positions 0..pos[row] of its cache. */
static void attn_one(void *vctx, int64_t idx, int worker) {
    attn_ctx *a = vctx;
    const dr_tower_dims *d = &a->t->d;
    int64_t row = idx / d->n_head;
    int h = (int)(idx % d->n_head);
    int hd = d->head_dim, kvh = h / (d->n_head / d->n_kv_head);
    const float *q = a->s->qkv + row * a->qkv_dim + (int64_t)h * hd;
    const dr_tower_cache *c = a->cs[row];
    float *o = a->s->o + row * (int64_t)d->n_head * hd + (int64_t)h * hd;
    dr_op_attend_f64(q, c->k[a->layer] + (int64_t)kvh * hd, c->v[a->layer] + (int64_t)kvh * hd, a->pos[row] + 1,
                     c->kv_dim, hd, 1.0 / sqrt((double)hd), a->s->scores + (int64_t)worker * a->s->max_len, o);
}

/* One layer over n rows; row r runs at position pos[r] of cache cs[r] (one cache at consecutive
 * positions for a prefill, one cache per session for batched generation). in [n][L->dh] -> out
 * [n][D]. codes[r] / mask[r]: the code embedded by row r (table slot `slot`). */
static drama_status layer_forward(const dr_tower *t, dr_tower_cache *const *cs, const int64_t *pos, int l, int n,
                                  const float *in, const int32_t *code, int64_t code_stride_rows, const uint8_t *mask,
                                  int slot, float *out, scratch *s, dr_pool *pool, drama_error *err) {
    const dr_tower_dims *d = &t->d;
    const dr_tower_layer *L = &t->layers[l];
    int64_t D = d->dim, de = L->de, dh = L->dh, hd = d->head_dim;
    int64_t qkv_dim = (int64_t)(d->n_head + 2 * d->n_kv_head) * hd, kvd = (int64_t)d->n_kv_head * hd;
    int64_t xw = de + dh;
    /* u = eh_proj(concat(enorm(e), hnorm(h))); rms(0) = 0, so a masked row contributes nothing */
    for (int r = 0; r < n; r++) {
        float *e = s->e + r * de;
        float *x = s->x + r * xw;
        float *xe = d->concat_hidden_first ? x + dh : x;
        float *xh = d->concat_hidden_first ? x : x + de;
        int on = mask[r] != 0;
        if (on) {
            int32_t cd = code[r * code_stride_rows];
            int64_t row = (int64_t)cd + (int64_t)slot * d->code_stride;
            if (cd < 0 || cd >= d->code_stride || row >= t->code_table.rows)
                return dr_fail(err, DRAMA_EINVAL, "tower layer %s: code %d of codebook %d out of range [0, %lld)",
                               L->prefix, (int)cd, slot, (long long)d->code_stride);
            dr_weight_dequant_row(&t->code_table, row, e);
            dr_op_rms_norm(e, L->enorm, d->eps, de, xe);
        } else {
            memset(xe, 0, (size_t)de * sizeof(float));
        }
        dr_op_rms_norm(in + r * dh, L->hnorm, d->eps, dh, xh);
    }
    dr_cpu_matmul(&L->eh_proj, s->x, n, s->u, pool);
    for (int r = 0; r < n; r++) dr_op_rms_norm(s->u + r * D, L->attention_norm, d->eps, D, s->a + r * D);
    dr_cpu_matmul(&L->wqkv, s->a, n, s->qkv, pool);
    double work = 0;
    for (int r = 0; r < n; r++) {
        float *q = s->qkv + r * qkv_dim, *k = q + (int64_t)d->n_head * hd, *v = k + kvd;
        dr_op_rope_cos_sin(t->rope_freq, d->rope_dims / 2, pos[r], s->cs, s->cs + d->rope_dims / 2);
        for (int h = 0; h < d->n_head; h++) {
            if (L->q_norm) dr_op_rms_norm(q + h * hd, L->q_norm, d->eps, hd, q + h * hd);
            rope(t, q + h * hd, s->cs);
        }
        for (int h = 0; h < d->n_kv_head; h++) {
            if (L->k_norm) dr_op_rms_norm(k + h * hd, L->k_norm, d->eps, hd, k + h * hd);
            rope(t, k + h * hd, s->cs);
        }
        memcpy(cs[r]->k[l] + pos[r] * kvd, k, (size_t)kvd * sizeof(float));
        memcpy(cs[r]->v[l] + pos[r] * kvd, v, (size_t)kvd * sizeof(float));
        work += (double)d->n_head * (double)(pos[r] + 1) * hd;
    }
    attn_ctx ac = {t, cs, pos, l, s, qkv_dim};
    /* small attention (short context, tiny heads) costs less than waking the workers; the
     * result is the same either way (one (row, head) per index) */
    dr_pool_run(work < 65536.0 ? NULL : pool, (int64_t)n * d->n_head, attn_one, &ac);
    dr_cpu_matmul(&L->wo, s->o, n, s->tmp, pool);
    for (int64_t i = 0; i < (int64_t)n * D; i++) s->u[i] += s->tmp[i];
    for (int r = 0; r < n; r++) dr_op_rms_norm(s->u + r * D, L->ffn_norm, d->eps, D, s->a + r * D);
    dr_cpu_matmul(&L->w1, s->a, n, s->g1, pool);
    dr_cpu_matmul(&L->w3, s->a, n, s->g3, pool);
    dr_op_swiglu(s->g1, s->g3, (int64_t)n * t->ffn, s->g1);
    dr_cpu_matmul(&L->w2, s->g1, n, s->tmp, pool);
    for (int64_t i = 0; i < (int64_t)n * D; i++) s->u[i] += s->tmp[i];
    for (int r = 0; r < n; r++) dr_op_rms_norm(s->u + r * D, L->out_norm, d->eps, D, out + r * D);
    return DRAMA_OK;
}

static drama_status check_finite(const float *x, int64_t n, const char *what, drama_error *err) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return dr_fail(err, DRAMA_ENUMERIC, "tower: %s value %lld is not finite", what, (long long)i);
    return DRAMA_OK;
}

drama_status dr_tower_forward(const dr_tower *t, dr_tower_cache *c, int n, const float *h, const int32_t *codes,
                              const uint8_t *mask, float *layer_out, float *logits, dr_pool *pool,
                              drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    const dr_tower_dims *d = &t->d;
    int64_t D = d->dim, nc = d->num_codebooks, hv = d->head_vocab;
    drama_status st = check_finite(h, (int64_t)n * t->input_dim, "input hidden", err);
    if (st) return st;
    if ((st = dr_tower_cache_reserve(c, c->len + n, err))) return st;
    scratch s;
    if ((st = scratch_init(&s, t, n, c->len + n, pool, err))) return st;
    float *ga = alloc_f(n, D), *gb = alloc_f(n, D);
    uint8_t *m = dr_calloc((size_t)n, 1);
    dr_tower_cache **cs = dr_calloc((size_t)n, sizeof *cs);
    int64_t *pos = dr_calloc((size_t)n, sizeof *pos);
    if (!ga || !gb || !m || !cs || !pos) {
        st = dr_fail(err, DRAMA_ENOMEM, "tower: cannot allocate %d rows", n);
        goto done;
    }
    for (int r = 0; r < n; r++) {
        cs[r] = c;
        pos[r] = c->len + r;
    }
    const float *in = h;
    for (int l = 0; l < t->n_layers && !st; l++) {
        int shared = l < d->n_shared, slot = shared ? 0 : l - d->n_shared;
        for (int r = 0; r < n; r++) m[r] = (shared && d->shared_code_none) ? 0 : (mask[r] != 0);
        float *out = (l % 2) ? gb : ga;
        st = layer_forward(t, cs, pos, l, n, in, codes + slot, nc, m, slot, out, &s, pool, err);
        if (st) break;
        if (layer_out) memcpy(layer_out + (int64_t)l * n * D, out, (size_t)n * D * sizeof(float));
        if (!shared && logits) {
            dr_cpu_matmul_rows(&t->heads[slot], 0, hv, out, n, s.heads, pool);
            for (int r = 0; r < n; r++)
                memcpy(logits + ((int64_t)r * (nc - 1) + slot) * hv, s.heads + (int64_t)r * hv, (size_t)hv * sizeof(float));
        }
        in = out;
    }
    if (!st) c->len += n;
done:
    dr_free(ga);
    dr_free(gb);
    dr_free(m);
    dr_free(cs);
    dr_free(pos);
    scratch_free(&s);
    return st;
}

drama_status dr_tower_generate_many(const dr_tower *t, dr_tower_cache *const *caches, int n, const float *h,
                                    const int32_t *c0, dr_tower_pick_many_fn pick, void *pick_ctx, int32_t *codes,
                                    float *head_logits, drama_status *row_status, drama_error *row_errs,
                                    dr_pool *pool, drama_error *err) {
    const dr_tower_dims *d = &t->d;
    int64_t D = d->dim, hv = d->head_vocab, nc = d->num_codebooks, in_w = t->input_dim;
    if (n <= 0) return DRAMA_OK;
    drama_status st = DRAMA_OK;
    scratch s;
    memset(&s, 0, sizeof s);
    /* rows that can run: finite input; a failing row keeps its status and is left out */
    int *act = dr_calloc((size_t)n, sizeof(int));
    dr_tower_cache **cs = dr_calloc((size_t)n, sizeof *cs);
    int64_t *pos = dr_calloc((size_t)n, sizeof *pos);
    float *hin = alloc_f(n, in_w), *ga = alloc_f(n, D), *gb = alloc_f(n, D);
    int32_t *cur = dr_calloc((size_t)n * nc, sizeof(int32_t));
    uint8_t *m = dr_calloc((size_t)n, 1);
    if (!act || !cs || !pos || !hin || !ga || !gb || !cur || !m) {
        st = dr_fail(err, DRAMA_ENOMEM, "tower: out of memory for %d rows", n);
        goto done;
    }
    int na = 0;
    int64_t max_len = 1;
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < nc; j++) codes[(int64_t)r * nc + j] = 0;
        codes[(int64_t)r * nc] = c0[r];
        row_status[r] = check_finite(h + r * in_w, in_w, "input hidden", row_errs ? &row_errs[r] : NULL);
        if (!row_status[r]) row_status[r] = dr_tower_cache_reserve(caches[r], caches[r]->len + 1,
                                                                   row_errs ? &row_errs[r] : NULL);
        if (row_status[r]) continue;
        act[na] = r;
        cs[na] = caches[r];
        pos[na] = caches[r]->len;
        if (pos[na] + 1 > max_len) max_len = pos[na] + 1;
        memcpy(hin + (int64_t)na * in_w, h + r * in_w, (size_t)in_w * sizeof(float));
        cur[(int64_t)na * nc] = c0[r];
        na++;
    }
    if (!na) goto done;
    if ((st = scratch_init(&s, t, na, max_len, pool, err))) goto done;
    const float *in = hin;
    for (int l = 0; l < t->n_layers; l++) {
        int shared = l < d->n_shared, slot = shared ? 0 : l - d->n_shared;
        for (int k = 0; k < na; k++) m[k] = (shared && d->shared_code_none) ? 0 : 1;
        float *out = (l % 2) ? gb : ga;
        if ((st = layer_forward(t, cs, pos, l, na, in, cur + slot, nc, m, slot, out, &s, pool, err))) goto done;
        if (!shared) {
            /* head slot predicts code slot+1 of every row, chosen per row before the next layer */
            dr_cpu_matmul_rows(&t->heads[slot], 0, hv, out, na, s.heads, pool);
            for (int k = 0; k < na; k++) {
                int r = act[k], code = 0;
                const float *lg = s.heads + (int64_t)k * hv;
                if (head_logits) memcpy(head_logits + ((int64_t)r * (nc - 1) + slot) * hv, lg, (size_t)hv * sizeof(float));
                if (!row_status[r]) {
                    drama_error *re = row_errs ? &row_errs[r] : NULL;
                    row_status[r] = pick(pick_ctx, r, slot + 1, lg, (int)hv, &code, re);
                    if (!row_status[r] && (code < 0 || code >= hv))
                        row_status[r] = dr_fail(re, DRAMA_EINTERNAL, "tower: codebook %d pick %d outside [0, %lld)",
                                                slot + 1, code, (long long)hv);
                    if (row_status[r]) code = 0; /* the row is lost; keep the others going */
                }
                cur[(int64_t)k * nc + slot + 1] = code;
                codes[(int64_t)r * nc + slot + 1] = code;
            }
        }
        in = out;
    }
    for (int k = 0; k < na; k++) cs[k]->len += 1;
done:
    dr_free(act);
    dr_free(cs);
    dr_free(pos);
    dr_free(hin);
    dr_free(ga);
    dr_free(gb);
    dr_free(cur);
    dr_free(m);
    scratch_free(&s);
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
