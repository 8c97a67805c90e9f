/* cpu_moe.c - the MoE op on the CPU (MODEL.md 5.5; backend.h dr_moe_args): fp32 router softmax
 * with pruned experts and non-finite scores at -inf, deterministic top-k (ties to the lower id),
 * renormalisation, SwiGLU experts in their stored format, sigmoid-gated shared expert.
 *
 * Rows are grouped by expert ("groups": each selected expert with the rows that chose it, plus the
 * shared expert with every row), so each expert's weights are read once per call. All groups run
 * in two pool passes (gate/up, then down), split into blocks of output rows: a decode step's 8
 * small experts then share the threads instead of taking turns. Matmul outputs depend only on
 * their own input row and weight row, so neither grouping nor blocking changes a bit; each row
 * sums its experts in rank order, which depends on nothing but the row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"

#define BLOCK 32 /* output rows per task */

typedef struct group {
    const dr_weight *gate, *up, *gate_up, *down; /* gate_up: fused [2I, H] (gate and up NULL) */
    int64_t width;     /* I of this expert */
    int64_t first;     /* first row in xs / ys */
    int64_t cnt;       /* rows */
    int64_t act_off;   /* offset of its [cnt][width] block in act */
} group;

typedef struct moe_ctx {
    group *g;
    int ng;
    int64_t H;
    const float *xs;   /* [R][H] gathered inputs */
    float *act;        /* per group [cnt][width] */
    float *ys;         /* [R][H] outputs */
    int64_t *t1, *t2;  /* prefix sums of blocks per group, passes 1 and 2 */
    float *scratch;    /* per worker 2 * max_cnt * BLOCK */
    int64_t scratch_ld;
} moe_ctx;

/* Task index -> (group, block) through a prefix-sum table. */
static int find_group(const int64_t *pre, int ng, int64_t t) {
    int lo = 0, hi = ng - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pre[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void gate_up_task(void *vc, int64_t t, int worker) {
    const moe_ctx *c = vc;
    int gi = find_group(c->t1, c->ng, t);
    const group *g = &c->g[gi];
    int64_t r0 = (t - c->t1[gi]) * BLOCK, r1 = r0 + BLOCK < g->width ? r0 + BLOCK : g->width, nb = r1 - r0;
    float *ga = c->scratch + (int64_t)worker * c->scratch_ld, *ua = ga + c->scratch_ld / 2;
    const float *x = c->xs + g->first * c->H;
    if (g->gate_up) {
        dr_cpu_matmul_rows(g->gate_up, r0, r1, x, g->cnt, ga, NULL);
        dr_cpu_matmul_rows(g->gate_up, g->width + r0, g->width + r1, x, g->cnt, ua, NULL);
    } else {
        dr_cpu_matmul_rows(g->gate, r0, r1, x, g->cnt, ga, NULL);
        dr_cpu_matmul_rows(g->up, r0, r1, x, g->cnt, ua, NULL);
    }
    float *act = c->act + g->act_off;
    for (int64_t i = 0; i < g->cnt; i++) dr_op_swiglu(ga + i * nb, ua + i * nb, nb, act + i * g->width + r0);
}

static void down_task(void *vc, int64_t t, int worker) {
    const moe_ctx *c = vc;
    int gi = find_group(c->t2, c->ng, t);
    const group *g = &c->g[gi];
    int64_t r0 = (t - c->t2[gi]) * BLOCK, r1 = r0 + BLOCK < c->H ? r0 + BLOCK : c->H, nb = r1 - r0;
    float *tmp = c->scratch + (int64_t)worker * c->scratch_ld;
    dr_cpu_matmul_rows(g->down, r0, r1, c->act + g->act_off, g->cnt, tmp, NULL);
    for (int64_t i = 0; i < g->cnt; i++)
        memcpy(c->ys + (g->first + i) * c->H + r0, tmp + i * nb, (size_t)nb * sizeof(float));
}

/* Routing of one row: fills ids[k] (original expert ids, -1 when fewer than k are eligible) and
 * weights[k]. s holds the row's router scores (pruned experts are set to -inf); probs is scratch [E].
 * A row without a finite score is marked in its status and routed to no expert. */
static void route(const dr_moe_args *a, float *s, float *probs, int *ids, float *weights, dr_op_status *st) {
    for (int e = 0; e < a->E; e++)
        if (a->w->slot[e] < 0) s[e] = -INFINITY;
    if (dr_op_moe_route(s, a->E, a->topk, a->norm_topk, probs, ids, weights) == 0 && !st->code) {
        st->code = DRAMA_ENUMERIC;
        st->fault = DR_FAULT_ROUTER;
        st->a = a->layer;
    }
}

void dr_cpu_op_moe(dr_backend *be, const dr_moe_args *a) {
    dr_pool *pool = dr_cpu_pool_of(be);
    const dr_moe_weights *m = a->w;
    const float *x = a->x;
    float *out = a->out;
    int64_t n = a->n, H = a->H, I = a->I, Is = a->Is;
    int E = a->E, k = a->topk;
    int n_workers = pool ? dr_pool_threads(pool) : 1;
    int64_t R = n * k + n; /* gathered rows: every (row, rank) plus the shared expert's n */
    float *scores = dr_alloc((size_t)(n * E) * sizeof(float));
    int *sel = malloc((size_t)(n * k) * sizeof(int));
    float *wsel = malloc((size_t)(n * k) * sizeof(float));
    int64_t *pos = malloc((size_t)(n * k) * sizeof(int64_t)); /* (row, rank) -> gathered row or -1 */
    const float **yr = malloc((size_t)k * sizeof *yr);         /* one row's expert outputs by rank */
    float *probs = malloc((size_t)E * sizeof(float));
    group *g = malloc((size_t)(m->n_kept + 1) * sizeof(group));
    int64_t *t1 = malloc((size_t)(m->n_kept + 2) * sizeof(int64_t)), *t2 = malloc((size_t)(m->n_kept + 2) * sizeof(int64_t));
    float *xs = dr_alloc((size_t)(R * H) * sizeof(float));
    float *ys = dr_alloc((size_t)(R * H) * sizeof(float));
    float *act = dr_alloc((size_t)(R * (I > Is ? I : Is)) * sizeof(float));
    float *sg = dr_alloc((size_t)n * sizeof(float));
    int64_t scratch_ld = 2 * n * BLOCK;
    float *scratch = dr_alloc((size_t)(n_workers * scratch_ld) * sizeof(float));
    if (!scores || !sel || !wsel || !pos || !yr || !probs || !g || !t1 || !t2 || !xs || !ys || !act || !sg || !scratch) {
        for (int64_t j = 0; j < n * H; j++) out[j] = NAN; /* no memory: loud, never silent */
        goto done;
    }

    dr_cpu_matmul(&m->router, x, n, scores, pool);
    for (int64_t i = 0; i < n; i++) route(a, scores + i * E, probs, sel + i * k, wsel + i * k, &a->status[i]);

    /* Groups: selected experts in id order, each with its rows in row order; then the shared expert. */
    int ng = 0;
    int64_t next = 0, act_off = 0;
    for (int64_t j = 0; j < n * k; j++) pos[j] = -1;
    for (int slot = 0; slot < m->n_kept; slot++) {
        int e = m->kept[slot];
        int64_t first = next;
        for (int64_t i = 0; i < n; i++)
            for (int r = 0; r < k; r++)
                if (sel[i * k + r] == e) {
                    pos[i * k + r] = next;
                    memcpy(xs + next * H, x + i * H, (size_t)H * sizeof(float));
                    next++;
                }
        if (next == first) continue;
        const dr_moe_expert *ex = &m->experts[slot];
        g[ng] = (group){ex->fused ? NULL : &ex->gate, ex->fused ? NULL : &ex->up, ex->fused ? &ex->gate_up : NULL,
                        &ex->down, I, first, next - first, act_off};
        act_off += (next - first) * I;
        ng++;
    }
    memcpy(xs + next * H, x, (size_t)(n * H) * sizeof(float));
    g[ng] = (group){&m->sh_gate, &m->sh_up, NULL, &m->sh_down, Is, next, n, act_off};
    int64_t shared_first = next;
    ng++;
    t1[0] = t2[0] = 0;
    double work = 0; /* multiply-adds of one pass (gate + up is twice the down's) */
    for (int i = 0; i < ng; i++) {
        work += (double)g[i].width * (double)H * (double)g[i].cnt;
        t1[i + 1] = t1[i] + (g[i].width + BLOCK - 1) / BLOCK;
        t2[i + 1] = t2[i] + (H + BLOCK - 1) / BLOCK;
    }
    moe_ctx c = {g, ng, H, xs, act, ys, t1, t2, scratch, scratch_ld};
    /* a task is a product of BLOCK rows; at a few rows its setup costs about what a block's
     * multiply-adds do (the tiny model's expert tasks measured ~3x a large product's cost per
     * multiply-add), so each task also counts 2 * BLOCK * H * n */
    double setup = (double)BLOCK * (double)H * 2.0 * (double)n;
    dr_pool_run_work(pool, t1[ng], gate_up_task, &c, 2 * work + setup * (double)t1[ng]);
    dr_pool_run_work(pool, t2[ng], down_task, &c, work + setup * (double)t2[ng]);

    /* Each row: routed experts in rank order, then the gated shared expert. */
    dr_cpu_matmul(&m->sh_gate_proj, x, n, sg, pool);
    for (int64_t i = 0; i < n; i++) {
        for (int r = 0; r < k; r++) yr[r] = pos[i * k + r] < 0 ? NULL : ys + pos[i * k + r] * H;
        dr_op_moe_combine(yr, wsel + i * k, k, ys + (shared_first + i) * H, sg[i], H, out + i * H);
    }
done:
    dr_free(scores);
    free(sel);
    free(wsel);
    free(pos);
    free(yr);
    free(probs);
    free(g);
    free(t1);
    free(t2);
    dr_free(xs);
    dr_free(ys);
    dr_free(act);
    dr_free(sg);
    dr_free(scratch);
}
