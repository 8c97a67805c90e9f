/* backbone_attention.c - gated full attention with q/k norm, partial rotate-half RoPE, GQA and the
 * state's K/V cache (MODEL.md 5.3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/backbone_internal.h"

typedef struct attn_ctx {
    const bb_batch *b;
    const dr_bb_layer *ly;
    const float *q;     /* [n][q_stride], normed and rotated */
    int64_t q_stride;   /* nh * (2 or 1) * hd */
    float *o;           /* [n][nh*hd] */
    float *scratch;     /* [n_workers][max_pos] */
    int64_t max_pos;
} attn_ctx;

/* Task i = row * nh + head: attend over positions 0..pos of the row's state. */
static void attend_task(void *vctx, int64_t t, int worker) {
    const attn_ctx *c = vctx;
    const dr_bb_dims *d = &c->b->bb->d;
    int64_t row = t / d->nh;
    int j = (int)(t % d->nh);
    int m = j / (d->nh / d->nkv);
    const dr_bb_state *s = c->b->st[row];
    int64_t kvd = s->kv_dim;
    int gated = d->attn_gate;
    const float *q = c->q + row * c->q_stride + (int64_t)j * d->hd * (gated ? 2 : 1);
    float *o = c->o + row * (int64_t)d->nh * d->hd + (int64_t)j * d->hd;
    dr_op_attend(q, s->k[c->ly->idx] + (int64_t)m * d->hd, s->v[c->ly->idx] + (int64_t)m * d->hd, c->b->pos[row] + 1,
                 kvd, d->hd, 1.0f / sqrtf((float)d->hd), c->scratch + (int64_t)worker * c->max_pos, o);
    if (gated) dr_op_sigmoid_mul(o, q + d->hd, d->hd);
}

drama_status dr_bb_attention_run(const bb_batch *b, const dr_bb_layer *ly, const float *x, float *out, drama_error *err) {
    const dr_backbone *bb = b->bb;
    const dr_bb_dims *d = &bb->d;
    int64_t n = b->n, hd = d->hd;
    int64_t q_stride = (int64_t)d->nh * hd * (d->attn_gate ? 2 : 1), kvd = (int64_t)d->nkv * hd;
    int half = d->rope_dims / 2;
    int64_t max_pos = 0;
    for (int64_t i = 0; i < n; i++)
        if (b->pos[i] + 1 > max_pos) max_pos = b->pos[i] + 1;
    float *q = dr_alloc((size_t)(n * q_stride) * sizeof(float));
    float *k = dr_alloc((size_t)(n * kvd) * sizeof(float));
    float *v = dr_alloc((size_t)(n * kvd) * sizeof(float));
    float *o = dr_alloc((size_t)(n * d->nh * hd) * sizeof(float));
    float *scratch = dr_alloc((size_t)(b->n_workers * max_pos) * sizeof(float));
    float *cs = malloc((size_t)(2 * (half > 0 ? half : 1)) * sizeof(float));
    if (!q || !k || !v || !o || !scratch || !cs) {
        dr_free(q); dr_free(k); dr_free(v); dr_free(o); dr_free(scratch); free(cs);
        return dr_fail(err, DRAMA_ENOMEM, "attention: out of memory for %lld rows", (long long)n);
    }
    dr_cpu_matmul(&ly->attn.q, x, n, q, b->pool);
    dr_cpu_matmul(&ly->attn.k, x, n, k, b->pool);
    dr_cpu_matmul(&ly->attn.v, x, n, v, b->pool);
    /* Norm + RoPE per row, then append K/V at the row's position (all appends before any attend,
     * so rows of one prefill see each other causally). */
    for (int64_t i = 0; i < n; i++) {
        dr_op_rope_cos_sin(bb->rope_inv_freq, half, b->pos[i], cs, cs + half);
        for (int j = 0; j < d->nh; j++) {
            float *qh = q + i * q_stride + (int64_t)j * hd * (d->attn_gate ? 2 : 1);
            dr_op_rms_norm(qh, ly->attn.q_norm, d->eps, hd, qh);
            dr_op_rope_half(qh, half, cs, cs + half);
        }
        dr_bb_state *s = b->st[i];
        float *kd = s->k[ly->idx] + b->pos[i] * kvd, *vd = s->v[ly->idx] + b->pos[i] * kvd;
        for (int m = 0; m < d->nkv; m++) {
            float *kh = k + i * kvd + (int64_t)m * hd;
            dr_op_rms_norm(kh, ly->attn.k_norm, d->eps, hd, kh);
            dr_op_rope_half(kh, half, cs, cs + half);
        }
        memcpy(kd, k + i * kvd, (size_t)kvd * sizeof(float));
        memcpy(vd, v + i * kvd, (size_t)kvd * sizeof(float));
    }
    attn_ctx c = {b, ly, q, q_stride, o, scratch, max_pos};
    dr_pool_run(b->pool, n * d->nh, attend_task, &c);
    dr_cpu_matmul(&ly->attn.o, o, n, out, b->pool);
    dr_free(q); dr_free(k); dr_free(v); dr_free(o); dr_free(scratch); free(cs);
    return DRAMA_OK;
}
