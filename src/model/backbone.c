/* backbone.c - one backbone call over the backend seam: input embedding (MODEL.md 6), the decoder
 * layers (5.2) with their mixers (gated attention 5.3, Gated DeltaNet 5.4) and the MoE (5.5),
 * final norm and restricted logits (5.6); then the host calls that chunk a prefill and batch a
 * decode step. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/state.h"

drama_status dr_backbone_check_row(const dr_backbone *bb, const int32_t *row, int64_t r, drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int64_t tok = row[0];
    if (tok < 0 || tok >= bb->embed.rows)
        return dr_fail(err, DRAMA_EINVAL, "row %lld: token id %lld outside the embedding's %lld rows", (long long)r,
                       (long long)tok, (long long)bb->embed.rows);
    int audio = bb->sem_start >= 0 && tok >= bb->sem_start && tok < bb->sem_start + bb->n_sem;
    if (!audio) return DRAMA_OK; /* text row: code columns are ignored */
    if (row[1] != tok - bb->sem_start)
        return dr_fail(err, DRAMA_EINVAL, "row %lld: semantic token %lld but c0 = %d (expected %lld)", (long long)r,
                       (long long)tok, row[1], (long long)(tok - bb->sem_start));
    for (int k = 0; k < d->n_codebooks; k++)
        if (row[1 + k] < 0 || row[1 + k] >= d->code_stride)
            return dr_fail(err, DRAMA_EINVAL, "row %lld: code c%d = %d outside [0, %lld)", (long long)r, k, row[1 + k],
                           (long long)d->code_stride);
    return DRAMA_OK;
}

dr_embed_args dr_backbone_embed_args(const dr_backbone *bb) {
    const dr_bb_dims *d = &bb->d;
    dr_embed_args a = {&bb->embed, &bb->code_table, d->H, bb->sem_start, bb->n_sem, d->code_stride,
                       dr_backbone_row_width(bb), d->in_codebooks, d->add_token_embedding, d->code_scale_rsqrt};
    return a;
}

/* ---------------- workspace ---------------- */

drama_status dr_bb_ws_create(dr_backend *be, const dr_backbone *bb, int64_t rows, dr_bb_ws **out, drama_error *err) {
    *out = NULL;
    const dr_bb_dims *d = &bb->d;
    dr_bb_ws *w = calloc(1, sizeof *w);
    if (!w) return dr_fail(err, DRAMA_ENOMEM, "backbone workspace: out of memory");
    w->be = be;
    w->rows = rows > 0 ? rows : 1;
    size_t r = (size_t)w->rows;
    int64_t q_stride = (int64_t)d->nh * d->hd * (d->attn_gate ? 2 : 1), kvd = (int64_t)d->nkv * d->hd;
    int64_t vd = (int64_t)d->nv * d->dv, C = 2 * (int64_t)d->nk * d->dk + vd;
    struct {
        void **p;
        int64_t count; /* per row */
        size_t size;
    } parts[] = {
        {(void **)&w->x, d->H, 4},   {(void **)&w->xn, d->H, 4},    {(void **)&w->mix, d->H, 4},
        {(void **)&w->q, q_stride, 4}, {(void **)&w->k, kvd, 4},    {(void **)&w->v, kvd, 4},
        {(void **)&w->o, (int64_t)d->nh * d->hd, 4},               {(void **)&w->u, C, 4},
        {(void **)&w->y, C, 4},      {(void **)&w->z, vd, 4},       {(void **)&w->ga, d->nv, 4},
        {(void **)&w->gb, d->nv, 4}, {(void **)&w->go, vd, 4},      {(void **)&w->hidden, d->H, 4},
        {(void **)&w->logits, dr_backbone_n_logits(bb), 4},        {(void **)&w->tok, dr_backbone_row_width(bb), 4},
        {(void **)&w->seq, 1, sizeof(dr_seq_row)},                  {(void **)&w->status, 1, sizeof(dr_op_status)},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t count;
        drama_status st = dr_mul_size(r, (size_t)(parts[i].count > 0 ? parts[i].count : 1), &count)
                              ? dr_bk_alloc_scratch(be, count, parts[i].size, parts[i].p, err)
                              : dr_fail(err, DRAMA_ENOMEM, "backbone workspace: %lld rows overflow", (long long)rows);
        if (st) {
            dr_bb_ws_free(w);
            return st;
        }
    }
    *out = w;
    return DRAMA_OK;
}

void dr_bb_ws_free(dr_bb_ws *w) {
    if (!w) return;
    void *ps[] = {w->x, w->xn, w->mix, w->q, w->k, w->v, w->o, w->u, w->y, w->z, w->ga, w->gb, w->go,
                  w->hidden, w->logits, w->tok, w->seq, w->status};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) dr_bk_free(w->be, ps[i]);
    free(w);
}

/* ---------------- one call ---------------- */

/* Gated full attention with q/k norm, partial rotate-half RoPE, GQA and the K/V cache (5.3). */
static void attention(dr_backend *be, const dr_backbone *bb, const dr_bb_layer *ly, dr_bb_ws *w, const dr_bb_call *c) {
    const dr_bb_dims *d = &bb->d;
    int64_t n = c->n, kvd = (int64_t)d->nkv * d->hd, head_stride = (int64_t)d->hd * (d->attn_gate ? 2 : 1);
    dr_bk_matmul(be, &ly->attn.q, w->xn, n, w->q);
    dr_bk_matmul(be, &ly->attn.k, w->xn, n, w->k);
    dr_bk_matmul(be, &ly->attn.v, w->xn, n, w->v);
    dr_attn_args a = {.rows = c->seq, .n = n, .layer = ly->idx, .nh = d->nh, .nkv = d->nkv, .hd = d->hd,
                      .q = w->q, .q_stride = d->nh * head_stride, .q_head_stride = head_stride,
                      .k = w->k, .v = w->v, .kv_stride = kvd, .q_norm = ly->attn.q_norm, .k_norm = ly->attn.k_norm,
                      .eps = d->eps, .rope_freq = bb->rope_inv_freq, .rope_half = d->rope_dims / 2,
                      .rope_interleaved = 0, .gated = d->attn_gate, .f64 = 0, .out = w->o};
    be->ops->attention(be, &a);
    dr_bk_matmul(be, &ly->attn.o, w->o, n, w->mix);
}

/* Gated DeltaNet: projections, the conv / gates / recurrence op, gated output norm, out_proj (5.4). */
static void deltanet(dr_backend *be, const dr_backbone *bb, const dr_bb_layer *ly, dr_bb_ws *w, const dr_bb_call *c) {
    const dr_bb_dims *d = &bb->d;
    const dr_bb_gdn *g = &ly->gdn;
    int64_t n = c->n;
    dr_bk_matmul(be, &g->qkv, w->xn, n, w->u);
    dr_bk_matmul(be, &g->z, w->xn, n, w->z);
    dr_bk_matmul(be, &g->b, w->xn, n, w->gb);
    dr_bk_matmul(be, &g->a, w->xn, n, w->ga);
    dr_gdn_args a = {.rows = c->seq, .n = n, .layer = ly->idx, .nk = d->nk, .dk = d->dk, .nv = d->nv, .dv = d->dv,
                     .K = d->K, .conv_w = g->conv_w, .conv_b = g->conv_b, .neg_A = g->neg_A, .dt_bias = g->dt_bias,
                     .u = w->u, .y = w->y, .a = w->ga, .b = w->gb, .out = w->go,
                     .recurrent = d->gdn_recurrent};
    be->ops->deltanet(be, &a);
    /* o_h = rms_norm_plain(o_h, norm) * silu(z_h) */
    be->ops->gated_rms_norm(be, w->go, g->norm, g->norm_per_channel, w->z, d->eps, d->nv, d->dv, n);
    dr_bk_matmul(be, &g->out, w->go, n, w->mix);
}

static void moe(dr_backend *be, const dr_backbone *bb, const dr_bb_layer *ly, int layer, dr_bb_ws *w,
                const dr_bb_call *c) {
    const dr_bb_dims *d = &bb->d;
    dr_moe_args a = {&ly->moe, d->E, d->topk, d->norm_topk, d->H, d->I, d->Is, layer, w->xn, c->n, w->mix, c->status};
    be->ops->moe(be, &a);
}

static drama_status trace_rows(dr_backend *be, float *host, const float *x, const dr_bb_call *c, int64_t H,
                               drama_error *err) {
    return dr_bk_download(be, host + c->trace_row0 * H, x, (size_t)(c->n * H) * sizeof(float), err);
}

drama_status dr_bb_run(dr_backend *be, const dr_backbone *bb, dr_bb_ws *w, const dr_bb_call *c, drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int64_t n = c->n, H = d->H;
    const dr_bb_trace *tr = c->trace;
    drama_status st = DRAMA_OK;
    if (n <= 0) return DRAMA_OK;
    if (n > w->rows) return dr_fail(err, DRAMA_EINTERNAL, "backbone: %lld rows for a workspace of %lld", (long long)n,
                                    (long long)w->rows);
    dr_embed_args ea = dr_backbone_embed_args(bb);
    be->ops->embed(be, &ea, c->rows, n, w->x);
    if (tr && tr->embeds && (st = trace_rows(be, tr->embeds, w->x, c, H, err))) return st;

    for (int L = 0; L < d->n_layers; L++) {
        const dr_bb_layer *ly = &bb->layers[L];
        dr_bk_rms_norm(be, w->x, ly->in_norm, d->eps, H, n, w->xn);
        if (ly->kind == DR_LAYER_FULL) attention(be, bb, ly, w, c);
        else deltanet(be, bb, ly, w, c);
        dr_bk_add(be, w->x, w->mix, n * H);
        dr_bk_rms_norm(be, w->x, ly->post_norm, d->eps, H, n, w->xn);
        moe(be, bb, ly, L, w, c);
        dr_bk_add(be, w->x, w->mix, n * H);
        if (tr && tr->layer_out) {
            dr_bb_call at = *c;
            at.trace_row0 = (int64_t)L * c->trace_rows + c->trace_row0;
            if ((st = trace_rows(be, tr->layer_out, w->x, &at, H, err))) return st;
        }
    }
    if (tr && tr->pre_norm && (st = trace_rows(be, tr->pre_norm, w->x, c, H, err))) return st;
    if (c->pre_norm) dr_bk_copy(be, c->pre_norm, w->x, (size_t)(n * H) * sizeof(float));
    dr_bk_rms_norm(be, w->x, bb->final_norm, d->eps, H, n, w->xn);
    if (c->hidden) dr_bk_copy(be, c->hidden, w->xn, (size_t)(n * H) * sizeof(float));
    if (c->logits)
        be->ops->restricted_logits(be, &bb->head, bb->head_sem_row, bb->n_sem, bb->head_end_row, w->xn, n, c->logits);
    return DRAMA_OK;
}

drama_status dr_bb_status_fail(const dr_op_status *s, int64_t row, drama_error *err) {
    if (s->fault == DR_FAULT_ROUTER)
        return dr_fail(err, (drama_status)s->code, "layer %d, row %lld: router produced no finite score", s->a,
                       (long long)row);
    return dr_fail(err, s->code ? (drama_status)s->code : DRAMA_EINTERNAL, "backbone row %lld: failure %d", (long long)row,
                   s->fault);
}

/* ---------------- host calls ---------------- */

/* Runs rows [n][W] (host) of the states sts[i] (row i at its state's position + off[i]) through ws;
 * hidden_dev / pre-norm go to backend memory, hidden / logits to host memory (each may be NULL).
 * On success every state advances by its rows. */
typedef struct host_out {
    float *hidden_dev;         /* [n][H]: final-normed, or pre-norm when pre_norm */
    int pre_norm;
    float *last_logits_dev;    /* logits of the last row */
    float *hidden, *logits;    /* host */
    const dr_bb_trace *trace;
    int64_t trace_row0, trace_rows;
} host_out;

static drama_status host_rows(dr_backend *be, const dr_backbone *bb, dr_bb_ws *w, dr_bb_state *const *sts,
                              const int64_t *off, const int32_t *rows, int64_t n, int64_t row0, const host_out *o,
                              drama_error *err) {
    int64_t H = bb->d.H, nl = dr_backbone_n_logits(bb);
    int W = dr_backbone_row_width(bb);
    dr_seq_row *seq = malloc((size_t)n * sizeof *seq);
    if (!seq) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    for (int64_t i = 0; i < n; i++) seq[i] = (dr_seq_row){sts[i]->seq, off[i], NULL};
    drama_status st = dr_bk_upload(be, w->seq, seq, (size_t)n * sizeof *seq, err);
    if (!st) st = dr_bk_upload(be, w->tok, rows, (size_t)(n * W) * sizeof(int32_t), err);
    free(seq);
    if (st) return st;
    dr_bk_zero(be, w->status, (size_t)n * sizeof(dr_op_status));
    /* only the last row's logits wanted (a prefill before generation): computed for that row
     * alone below, not for all n (a row's logits depend on nothing but its row) */
    int last_only = !o->logits && o->last_logits_dev;
    dr_bb_call c = {n, w->tok, w->seq, NULL, NULL, o->logits ? w->logits : NULL, w->status, o->trace, o->trace_row0,
                    o->trace_rows};
    if (o->hidden_dev) {
        if (o->pre_norm) c.pre_norm = o->hidden_dev + row0 * H;
        else c.hidden = o->hidden_dev + row0 * H;
    }
    if (o->hidden) c.hidden = w->hidden;
    if ((st = dr_bb_run(be, bb, w, &c, err))) return st;
    if (last_only) { /* w->xn: the final-normed rows; DRAMA_PREFILL_ALL_LOGITS=1: every row's, as before */
        const int64_t r = getenv("DRAMA_PREFILL_ALL_LOGITS") ? 0 : n - 1;
        be->ops->restricted_logits(be, &bb->head, bb->head_sem_row, bb->n_sem, bb->head_end_row, w->xn + r * H, n - r,
                                   w->logits + r * nl);
    }
    dr_op_status *sts_host = malloc((size_t)n * sizeof *sts_host);
    if (!sts_host) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    st = dr_bk_download(be, sts_host, w->status, (size_t)n * sizeof *sts_host, err);
    for (int64_t i = 0; !st && i < n; i++)
        if (sts_host[i].code) st = dr_bb_status_fail(&sts_host[i], row0 + i, err);
    free(sts_host);
    /* a failure inside the layers leaves the states partly updated: the caller resets or restores them */
    if (st) return st;
    if (o->hidden) st = dr_bk_download(be, o->hidden + row0 * H, w->hidden, (size_t)(n * H) * sizeof(float), err);
    if (!st && o->logits) st = dr_bk_download(be, o->logits + row0 * nl, w->logits, (size_t)(n * nl) * sizeof(float), err);
    if (!st && o->last_logits_dev) dr_bk_copy(be, o->last_logits_dev, w->logits + (n - 1) * nl, (size_t)nl * sizeof(float));
    if (st) return st;
    be->ops->advance(be, w->seq, n);
    for (int64_t i = 0; i < n; i++) dr_bb_state_advanced(sts[i], 1);
    return dr_bk_sync(be, err);
}

/* Long prefills run in chunks of at most CHUNK rows, cut at multiples of DR_GDN_CHUNK positions:
 * results do not depend on how rows are grouped into such calls (see backbone.h), and the
 * transient buffers (MoE gathers ~ 9 rows of H per row) stay bounded. */
#define CHUNK 256

static drama_status forward_chunks(const dr_backbone *bb, dr_bb_ws *ws, dr_bb_state *st, const int32_t *rows,
                                   int64_t n, host_out *o, dr_pool *pool, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!st || !rows) return dr_fail(err, DRAMA_EINVAL, "backbone forward: state and rows are required");
    int width = dr_backbone_row_width(bb);
    for (int64_t i = 0; i < n; i++) { /* every row is checked before the state changes */
        drama_status s = dr_backbone_check_row(bb, rows + i * width, i, err);
        if (s) return s;
    }
    if (o->logits && (bb->sem_start < 0 || bb->end_id < 0 || bb->n_sem <= 0))
        return dr_fail(err, DRAMA_EINVAL, "backbone: semantic/end token ids not set (dr_backbone_set_tokens)");
    drama_status s = dr_bb_state_reserve(st, st->pos + n, err);
    if (s) return s;
    dr_cpu_call h;
    dr_backend *be = dr_cpu_call_begin(&h, st->be, pool);
    int64_t m = n < CHUNK ? n : CHUNK;
    dr_bb_ws *w = ws;
    if (w && w->rows < m) m = w->rows;
    dr_bb_state **sts = malloc((size_t)m * sizeof *sts);
    int64_t *off = malloc((size_t)m * sizeof *off);
    if (!sts || !off) s = dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    if (!s && !w) s = dr_bb_ws_create(be, bb, m, &w, err);
    for (int64_t i = 0; !s && i < m; i++) {
        sts[i] = st;
        off[i] = i;
    }
    const int64_t pos0 = st->pos; /* host_rows advances st->pos */
    for (int64_t r0 = 0, c; r0 < n && s == DRAMA_OK; r0 += c) {
        c = n - r0 < m ? n - r0 : m;
        /* an inner cut lands on a multiple of DR_GDN_CHUNK positions, so whole DeltaNet blocks
         * stay in one call (the chunked form) wherever the state started */
        int64_t tail = (pos0 + r0 + c) % DR_GDN_CHUNK;
        if (r0 + c < n && c > tail) c -= tail;
        host_out oc = *o;
        oc.last_logits_dev = r0 + c == n ? o->last_logits_dev : NULL;
        oc.trace_row0 = r0;
        oc.trace_rows = n;
        s = host_rows(be, bb, w, sts, off, rows + r0 * width, c, r0, &oc, err);
    }
    if (w != ws) dr_bb_ws_free(w);
    free(sts);
    free(off);
    dr_cpu_call_end(&h);
    return s;
}

drama_status dr_backbone_forward(const dr_backbone *bb, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden, float *logits, const dr_bb_trace *trace, dr_pool *pool,
                                 drama_error *err) {
    host_out o = {.hidden = hidden, .logits = logits, .trace = trace};
    return forward_chunks(bb, NULL, st, rows, n, &o, pool, err);
}

drama_status dr_backbone_prefill(const dr_backbone *bb, dr_bb_ws *ws, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden_dev, int pre_norm, float *last_logits_dev, dr_pool *pool,
                                 drama_error *err) {
    host_out o = {.hidden_dev = hidden_dev, .pre_norm = pre_norm, .last_logits_dev = last_logits_dev};
    return forward_chunks(bb, ws, st, rows, n, &o, pool, err);
}

drama_status dr_backbone_step_batch(const dr_backbone *bb, dr_bb_state *const *states, int n, const int32_t *rows,
                                    float *hidden, float *logits, dr_pool *pool, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!states || !rows) return dr_fail(err, DRAMA_EINVAL, "backbone step: states and rows are required");
    int width = dr_backbone_row_width(bb);
    for (int i = 0; i < n; i++) {
        if (!states[i]) return dr_fail(err, DRAMA_EINVAL, "backbone step: state %d is NULL", i);
        for (int j = 0; j < i; j++)
            if (states[j] == states[i])
                return dr_fail(err, DRAMA_EINVAL, "backbone step: sessions %d and %d share one state", j, i);
        if (states[i]->be != states[0]->be)
            return dr_fail(err, DRAMA_EINVAL, "backbone step: states %d and 0 live on different backends", i);
        drama_status s = dr_backbone_check_row(bb, rows + (int64_t)i * width, i, err);
        if (s) return s;
    }
    if (logits && (bb->sem_start < 0 || bb->end_id < 0 || bb->n_sem <= 0))
        return dr_fail(err, DRAMA_EINVAL, "backbone: semantic/end token ids not set (dr_backbone_set_tokens)");
    for (int i = 0; i < n; i++) {
        drama_status s = dr_bb_state_reserve(states[i], states[i]->pos + 1, err);
        if (s) return s;
    }
    dr_cpu_call h;
    dr_backend *be = dr_cpu_call_begin(&h, states[0]->be, pool);
    dr_bb_ws *w = NULL;
    int64_t *off = calloc((size_t)n, sizeof *off);
    drama_status s = off ? dr_bb_ws_create(be, bb, n, &w, err) : dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    host_out o = {.hidden = hidden, .logits = logits};
    if (!s) s = host_rows(be, bb, w, states, off, rows, n, 0, &o, err);
    dr_bb_ws_free(w);
    free(off);
    dr_cpu_call_end(&h);
    return s;
}
