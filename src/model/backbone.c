/* backbone.c - one backbone call: input embedding (MODEL.md 6), the decoder layers (5.2), final
 * norm and restricted logits (5.6). Mixers and MoE are in backbone_{attention,deltanet,moe}.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/backbone_internal.h"

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

/* x = E_tok[token] at text rows; at audio rows (E_tok[token] if add_token_embedding +
 * sum_{k<n} E_code[c_k + k*V]) * scale. Summed in double, rounded once. */
static void embed_row(const dr_backbone *bb, const int32_t *row, float *x, float *tmp, double *acc) {
    const dr_bb_dims *d = &bb->d;
    int64_t H = d->H, tok = row[0];
    int audio = bb->sem_start >= 0 && tok >= bb->sem_start && tok < bb->sem_start + bb->n_sem;
    if (!audio) {
        dr_weight_dequant_row(&bb->embed, tok, x);
        return;
    }
    for (int64_t j = 0; j < H; j++) acc[j] = 0.0;
    if (d->add_token_embedding) {
        dr_weight_dequant_row(&bb->embed, tok, tmp);
        for (int64_t j = 0; j < H; j++) acc[j] += tmp[j];
    }
    int n = d->in_codebooks;
    for (int k = 0; k < n; k++) {
        dr_weight_dequant_row(&bb->code_table, (int64_t)row[1 + k] + (int64_t)k * d->code_stride, tmp);
        for (int64_t j = 0; j < H; j++) acc[j] += tmp[j];
    }
    double scale = d->code_scale_rsqrt ? 1.0 / sqrt((double)n + 1.0) : 1.0;
    for (int64_t j = 0; j < H; j++) x[j] = (float)(acc[j] * scale);
}

static void restricted_logits(const dr_backbone *bb, const float *hidden, int64_t n, float *logits, float *tmp,
                              dr_pool *pool) {
    int64_t ns = bb->n_sem, nl = ns + 1;
    dr_cpu_matmul_rows(&bb->head, bb->head_sem_row, bb->head_sem_row + ns, hidden, n, tmp, pool);
    for (int64_t i = 0; i < n; i++) memcpy(logits + i * nl, tmp + i * ns, (size_t)ns * sizeof(float));
    dr_cpu_matmul_rows(&bb->head, bb->head_end_row, bb->head_end_row + 1, hidden, n, tmp, pool);
    for (int64_t i = 0; i < n; i++) logits[i * nl + ns] = tmp[i];
}

/* The rows of b; trace rows are written at [row0, row0 + n) of arrays holding trace_rows rows. */
static drama_status run(const bb_batch *b, const int32_t *rows, float *hidden, float *logits, const dr_bb_trace *trace,
                        int64_t row0, int64_t trace_rows, drama_error *err) {
    const dr_backbone *bb = b->bb;
    const dr_bb_dims *d = &bb->d;
    int64_t n = b->n, H = d->H;
    int width = dr_backbone_row_width(bb);
    if (logits && (bb->sem_start < 0 || bb->end_id < 0 || bb->n_sem <= 0))
        return dr_fail(err, DRAMA_EINVAL, "backbone: semantic/end token ids not set (dr_backbone_set_tokens)");
    for (int64_t i = 0; i < n; i++) {
        drama_status st = dr_backbone_check_row(bb, rows + i * width, i, err);
        if (st) return st;
    }
    size_t nh;
    if (!dr_mul_size((size_t)n, (size_t)H * sizeof(float), &nh)) return dr_fail(err, DRAMA_ENOMEM, "backbone: too many rows");
    float *x = dr_alloc(nh), *xn = dr_alloc(nh), *mix = dr_alloc(nh);
    float *tmp = dr_alloc((size_t)(H > bb->n_sem ? H : bb->n_sem) * sizeof(float) * (size_t)(n > 0 ? n : 1));
    double *acc = malloc((size_t)H * sizeof(double));
    drama_status st = DRAMA_OK;
    if (!x || !xn || !mix || !tmp || !acc) {
        st = dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory for %lld rows", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) embed_row(bb, rows + i * width, x + i * H, tmp, acc);
    if (trace && trace->embeds) memcpy(trace->embeds + row0 * H, x, nh);

    for (int L = 0; L < d->n_layers; L++) {
        const dr_bb_layer *ly = &bb->layers[L];
        for (int64_t i = 0; i < n; i++) dr_op_rms_norm(x + i * H, ly->in_norm, d->eps, H, xn + i * H);
        st = ly->kind == DR_LAYER_FULL ? dr_bb_attention_run(b, ly, xn, mix, err) : dr_bb_deltanet_run(b, ly, xn, mix, err);
        if (st) goto done;
        for (int64_t j = 0; j < n * H; j++) x[j] += mix[j];
        for (int64_t i = 0; i < n; i++) dr_op_rms_norm(x + i * H, ly->post_norm, d->eps, H, xn + i * H);
        if ((st = dr_bb_moe_run(b, ly, L, xn, mix, err))) goto done;
        for (int64_t j = 0; j < n * H; j++) x[j] += mix[j];
        if (trace && trace->layer_out) memcpy(trace->layer_out + ((int64_t)L * trace_rows + row0) * H, x, nh);
    }
    if (trace && trace->pre_norm) memcpy(trace->pre_norm + row0 * H, x, nh);
    for (int64_t i = 0; i < n; i++) dr_op_rms_norm(x + i * H, bb->final_norm, d->eps, H, xn + i * H);
    if (hidden) memcpy(hidden, xn, nh);
    if (logits) restricted_logits(bb, xn, n, logits, tmp, b->pool);
done:
    dr_free(x);
    dr_free(xn);
    dr_free(mix);
    dr_free(tmp);
    free(acc);
    return st;
}

/* Long prefills run in chunks of CHUNK rows: results do not depend on how rows are grouped into
 * calls (see backbone.h), and the transient buffers (MoE gathers ~ 9 rows of H per row) stay bounded. */
#define CHUNK 256

drama_status dr_backbone_forward(const dr_backbone *bb, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden, float *logits, const dr_bb_trace *trace, dr_pool *pool,
                                 drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!st || !rows) return dr_fail(err, DRAMA_EINVAL, "backbone forward: state and rows are required");
    int width = dr_backbone_row_width(bb);
    for (int64_t i = 0; i < n; i++) { /* every row is checked before the state changes */
        drama_status s = dr_backbone_check_row(bb, rows + i * width, i, err);
        if (s) return s;
    }
    drama_status s = dr_bb_state_reserve(st, st->pos + n, err);
    if (s) return s;
    int64_t m = n < CHUNK ? n : CHUNK, H = bb->d.H, nl = dr_backbone_n_logits(bb);
    dr_bb_state **sts = malloc((size_t)m * sizeof *sts);
    int64_t *pos = malloc((size_t)m * sizeof *pos);
    if (!sts || !pos) {
        free(sts);
        free(pos);
        return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    }
    for (int64_t r0 = 0; r0 < n && s == DRAMA_OK; r0 += m) {
        int64_t c = n - r0 < m ? n - r0 : m;
        for (int64_t i = 0; i < c; i++) {
            sts[i] = st;
            pos[i] = st->pos + i;
        }
        bb_batch b = {bb, c, sts, pos, pool, pool ? dr_pool_threads(pool) : 1};
        s = run(&b, rows + r0 * width, hidden ? hidden + r0 * H : NULL, logits ? logits + r0 * nl : NULL, trace, r0,
                n, err);
        if (s == DRAMA_OK) st->pos += c;
    }
    /* A failure inside the layers leaves the state partly updated: the caller resets or restores it. */
    free(sts);
    free(pos);
    return s;
}

drama_status dr_backbone_step_batch(const dr_backbone *bb, dr_bb_state *const *states, int n, const int32_t *rows,
                                    float *hidden, float *logits, dr_pool *pool, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!states || !rows) return dr_fail(err, DRAMA_EINVAL, "backbone step: states and rows are required");
    for (int i = 0; i < n; i++) {
        if (!states[i]) return dr_fail(err, DRAMA_EINVAL, "backbone step: state %d is NULL", i);
        for (int j = 0; j < i; j++)
            if (states[j] == states[i])
                return dr_fail(err, DRAMA_EINVAL, "backbone step: sessions %d and %d share one state", j, i);
        drama_status s = dr_bb_state_reserve(states[i], states[i]->pos + 1, err);
        if (s) return s;
    }
    int64_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    for (int i = 0; i < n; i++) pos[i] = states[i]->pos;
    bb_batch b = {bb, n, states, pos, pool, pool ? dr_pool_threads(pool) : 1};
    drama_status s = run(&b, rows, hidden, logits, NULL, 0, n, err);
    if (s == DRAMA_OK)
        for (int i = 0; i < n; i++) states[i]->pos++;
    free(pos);
    return s;
}
