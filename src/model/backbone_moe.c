/* backbone_moe.c - mixture of experts (MODEL.md 5.5): fp32 router softmax with pruned experts and
 * non-finite scores at -inf, deterministic top-k (ties to the lower id), renormalisation, SwiGLU
 * experts in their stored format, sigmoid-gated shared expert.
 *
 * Rows are grouped by expert so each expert's weights are read once per call; matmul results are
 * row-independent, so grouping never changes a row's result. Each row sums its experts in rank
 * order from a per-(row, rank) buffer: the sum order depends on nothing but the row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "model/backbone_internal.h"

static void swiglu(const dr_weight *gate, const dr_weight *up, const dr_weight *gate_up, const dr_weight *down,
                   int64_t I, const float *x, int64_t m, float *gu, float *act, float *y, dr_pool *pool) {
    if (gate_up) {
        dr_cpu_matmul(gate_up, x, m, gu, pool); /* [m][2I]: gate then up */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < I; j++) act[i * I + j] = dr_siluf(gu[i * 2 * I + j]) * gu[i * 2 * I + I + j];
    } else {
        dr_cpu_matmul(gate, x, m, gu, pool);
        dr_cpu_matmul(up, x, m, gu + m * I, pool);
        for (int64_t i = 0; i < m * I; i++) act[i] = dr_siluf(gu[i]) * gu[m * I + i];
    }
    dr_cpu_matmul(down, act, m, y, pool);
}

drama_status dr_bb_moe_run(const bb_batch *b, const dr_bb_layer *ly, int layer, const float *x, float *out,
                       drama_error *err) {
    const dr_bb_dims *d = &b->bb->d;
    const dr_bb_moe *m = &ly->moe;
    int64_t n = b->n, H = d->H, I = d->I, Is = d->Is, W = I > Is ? I : Is;
    int E = d->E, k = d->topk;
    float *scores = dr_alloc((size_t)(n * E) * sizeof(float));
    int *sel = malloc((size_t)(n * k) * sizeof(int));
    float *wsel = malloc((size_t)(n * k) * sizeof(float));
    float *ybuf = dr_alloc((size_t)(n * k * H) * sizeof(float));
    int64_t *rows_of = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    int *rank_of = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    float *xs = dr_alloc((size_t)(n * H) * sizeof(float));
    float *gu = dr_alloc((size_t)(n * 2 * W) * sizeof(float));
    float *act = dr_alloc((size_t)(n * W) * sizeof(float));
    float *ys = dr_alloc((size_t)(n * H) * sizeof(float));
    float *sg = dr_alloc((size_t)n * sizeof(float));
    unsigned char *excluded = malloc((size_t)E);
    drama_status st = DRAMA_OK;
    if (!excluded || !scores || !sel || !wsel || !ybuf || !rows_of || !rank_of || !xs || !gu || !act || !ys || !sg) {
        st = dr_fail(err, DRAMA_ENOMEM, "moe: out of memory for %lld rows", (long long)n);
        goto done;
    }

    /* Routing, one row at a time. */
    dr_cpu_matmul(&m->router, x, n, scores, b->pool);
    for (int64_t i = 0; i < n; i++) {
        float *s = scores + i * E;
        int finite = 0;
        for (int e = 0; e < E; e++) {
            if (m->slot[e] < 0 || !isfinite(s[e])) s[e] = -INFINITY; /* pruned or non-finite */
            else finite++;
        }
        if (finite == 0) {
            st = dr_fail(err, DRAMA_ENUMERIC, "layer %d, row %lld: router produced no finite score", layer, (long long)i);
            goto done;
        }
        for (int e = 0; e < E; e++) excluded[e] = s[e] == -INFINITY;
        dr_op_softmax(s, E);
        for (int e = 0; e < E; e++)
            if (excluded[e]) s[e] = -1.0f; /* never selectable, even with fewer finite scores than k */
        int *ids = sel + i * k;
        dr_op_topk(s, E, k, ids);
        double sum = 0.0;
        for (int r = 0; r < k; r++) sum += ids[r] >= 0 ? s[ids[r]] : 0.0f;
        for (int r = 0; r < k; r++) {
            float p = ids[r] >= 0 ? s[ids[r]] : 0.0f;
            wsel[i * k + r] = d->norm_topk ? (float)(p / sum) : p;
        }
    }

    /* Experts, grouped: gather the rows that chose expert e, run them together. */
    memset(ybuf, 0, (size_t)(n * k * H) * sizeof(float));
    for (int slot = 0; slot < m->n_kept; slot++) {
        int e = m->kept[slot];
        int64_t cnt = 0;
        for (int64_t i = 0; i < n; i++)
            for (int r = 0; r < k; r++)
                if (sel[i * k + r] == e) {
                    rows_of[cnt] = i;
                    rank_of[cnt] = r;
                    memcpy(xs + cnt * H, x + i * H, (size_t)H * sizeof(float));
                    cnt++;
                }
        if (cnt == 0) continue;
        const dr_bb_expert *ex = &m->experts[slot];
        swiglu(&ex->gate, &ex->up, ex->fused ? &ex->gate_up : NULL, &ex->down, I, xs, cnt, gu, act, ys, b->pool);
        for (int64_t c = 0; c < cnt; c++)
            memcpy(ybuf + (rows_of[c] * k + rank_of[c]) * H, ys + c * H, (size_t)H * sizeof(float));
    }
    for (int64_t i = 0; i < n; i++) {
        float *o = out + i * H;
        for (int64_t j = 0; j < H; j++) o[j] = 0.0f;
        for (int r = 0; r < k; r++) {
            float w = wsel[i * k + r];
            const float *y = ybuf + (i * k + r) * H;
            for (int64_t j = 0; j < H; j++) o[j] += w * y[j];
        }
    }

    /* Shared expert, gated by sigmoid(shared_expert_gate . x). */
    swiglu(&m->sh_gate, &m->sh_up, NULL, &m->sh_down, Is, x, n, gu, act, ys, b->pool);
    dr_cpu_matmul(&m->sh_gate_proj, x, n, sg, b->pool);
    for (int64_t i = 0; i < n; i++) {
        float g = dr_sigmoidf(sg[i]);
        for (int64_t j = 0; j < H; j++) out[i * H + j] += g * ys[i * H + j];
    }
done:
    dr_free(scores);
    free(sel);
    free(wsel);
    dr_free(ybuf);
    free(rows_of);
    free(rank_of);
    dr_free(xs);
    dr_free(gu);
    dr_free(act);
    dr_free(ys);
    dr_free(sg);
    free(excluded);
    return st;
}
