/* backbone_deltanet.c - Gated DeltaNet (MODEL.md 5.4): projections, causal depthwise conv with the
 * carried window, SiLU, l2-normalised q/k, decay and beta gates, the fp32 delta-rule recurrence,
 * gated output norm, out_proj.
 *
 * Prefill runs the recurrence row by row (the chunked form is an optimisation the spec allows but
 * does not need): this keeps prefill bit-identical to decoding the same rows one at a time.
 * Work is split by conv channel block and by value head; each task walks the rows in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/backbone_internal.h"

#define CONV_BLOCK 256

typedef struct gdn_ctx {
    const bb_batch *b;
    const dr_bb_layer *ly;
    int64_t C;
    float *u;        /* [n][C] pre-conv (input of the conv) */
    float *y;        /* [n][C] post-conv, post-SiLU: q | k | v */
    const float *g, *beta; /* [n][nv] */
    float *o;        /* [n][nv*dv] */
    float *mem;      /* [nv][dv] scratch, one per value head */
} gdn_ctx;

static void conv_task(void *vctx, int64_t blk, int worker) {
    (void)worker;
    const gdn_ctx *c = vctx;
    const dr_bb_dims *d = &c->b->bb->d;
    int64_t c0 = blk * CONV_BLOCK, c1 = c0 + CONV_BLOCK < c->C ? c0 + CONV_BLOCK : c->C;
    for (int64_t i = 0; i < c->b->n; i++) {
        dr_bb_state *s = c->b->st[i];
        float *y = c->y + i * c->C;
        dr_op_conv_step(s->conv[c->ly->idx], c->u + i * c->C, c->ly->gdn.conv_w, c->ly->gdn.conv_b, d->K, c->C, c0, c1,
                        y);
        dr_op_silu(y + c0, c1 - c0);
    }
}

static void head_task(void *vctx, int64_t h, int worker) {
    (void)worker;
    const gdn_ctx *c = vctx;
    const dr_bb_dims *d = &c->b->bb->d;
    int64_t qk = (int64_t)d->nk * d->dk;
    int kh = (int)(h / (d->nv / d->nk));
    for (int64_t i = 0; i < c->b->n; i++) {
        dr_bb_state *s = c->b->st[i];
        const float *y = c->y + i * c->C;
        float *S = s->rec[c->ly->idx] + h * (int64_t)d->dk * d->dv;
        dr_op_gdn_step(S, y + (int64_t)kh * d->dk, y + qk + (int64_t)kh * d->dk, y + 2 * qk + h * d->dv,
                       c->g[i * d->nv + h], c->beta[i * d->nv + h], d->dk, d->dv, c->mem + h * d->dv,
                       c->o + i * (int64_t)d->nv * d->dv + h * d->dv);
    }
}

drama_status dr_bb_deltanet_run(const bb_batch *b, const dr_bb_layer *ly, const float *x, float *out, drama_error *err) {
    const dr_bb_dims *d = &b->bb->d;
    const dr_bb_gdn *w = &ly->gdn;
    int64_t n = b->n, nv = d->nv, dv = d->dv, vd = nv * dv, qk = (int64_t)d->nk * d->dk, C = 2 * qk + vd;
    float *u = dr_alloc((size_t)(n * C) * sizeof(float));
    float *y = dr_alloc((size_t)(n * C) * sizeof(float));
    float *z = dr_alloc((size_t)(n * vd) * sizeof(float));
    float *o = dr_alloc((size_t)(n * vd) * sizeof(float));
    float *bb_ = dr_alloc((size_t)(n * nv) * sizeof(float));
    float *aa = dr_alloc((size_t)(n * nv) * sizeof(float));
    float *mem = dr_alloc((size_t)vd * sizeof(float));
    drama_status st = DRAMA_OK;
    if (!u || !y || !z || !o || !bb_ || !aa || !mem) {
        st = dr_fail(err, DRAMA_ENOMEM, "deltanet: out of memory for %lld rows", (long long)n);
        goto done;
    }
    dr_cpu_matmul(&w->qkv, x, n, u, b->pool);
    dr_cpu_matmul(&w->z, x, n, z, b->pool);
    dr_cpu_matmul(&w->b, x, n, bb_, b->pool);
    dr_cpu_matmul(&w->a, x, n, aa, b->pool);

    gdn_ctx c = {b, ly, C, u, y, aa, bb_, o, mem};
    dr_pool_run(b->pool, (C + CONV_BLOCK - 1) / CONV_BLOCK, conv_task, &c);

    /* q, k l2-normalised per key head (q also scaled by 1/sqrt(dk)); gates per value head. */
    float qscale = 1.0f / sqrtf((float)d->dk);
    for (int64_t i = 0; i < n; i++) {
        float *yi = y + i * C;
        for (int h = 0; h < d->nk; h++) {
            dr_op_l2norm(yi + (int64_t)h * d->dk, d->dk, 1e-6f, qscale);
            dr_op_l2norm(yi + qk + (int64_t)h * d->dk, d->dk, 1e-6f, 1.0f);
        }
        dr_op_gdn_gates(aa + i * nv, bb_ + i * nv, w->neg_A, w->dt_bias, nv); /* g (log decay <= 0), beta */
    }
    dr_pool_run(b->pool, nv, head_task, &c);

    /* o_h = rms_norm_plain(o_h, norm) * silu(z_h) */
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < nv; h++)
            dr_op_gated_rms_norm(o + i * vd + h * dv, w->norm + (w->norm_per_channel ? h * dv : 0), z + i * vd + h * dv,
                                 d->eps, dv);
    dr_cpu_matmul(&w->out, o, n, out, b->pool);
done:
    dr_free(u);
    dr_free(y);
    dr_free(z);
    dr_free(o);
    dr_free(bb_);
    dr_free(aa);
    dr_free(mem);
    return st;
}
