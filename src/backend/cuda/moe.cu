/* moe.cu - the MoE layer on the device (MODEL.md 5.5) in four launches: the router and shared-gate
 * products (one dr_cuda_matmul_batch), routing (softmax over the finite, unpruned scores, top-k with
 * ties to the lower id, renormalisation in double: dr_op_moe_route's steps), gate/up/SwiGLU of
 * every selected expert and the shared expert of every row (one launch: a warp per output, the
 * expert read from the routing result on the device), and down + routing weights + the
 * sigmoid-gated shared expert + the residual add (one launch: a block per output element, one warp
 * per rank, summed in rank order as dr_op_moe_combine).
 *
 * Every expert product is warp_row_dot, i.e. dr_cuda_matmul's arithmetic for that row, in any
 * stored format (a run-time switch per warp, so routed and shared experts may differ). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_seam_kernels.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/moe_internal.h"

#define GU_WARPS 4          /* outputs per gate/up block */

#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_persist.cuh"

/* moe_internal.h's run-time table agrees with the kernels' compile-time one */
static_assert(moe_epc(MV_F32) == fmt_traits<MV_F32>::EPC && moe_epc(MV_F16) == fmt_traits<MV_F16>::EPC &&
                  moe_epc(MV_BF16) == fmt_traits<MV_BF16>::EPC && moe_epc(MV_FP8_BLOCK) == fmt_traits<MV_FP8_BLOCK>::EPC &&
                  moe_epc(MV_FP8_TENSOR) == fmt_traits<MV_FP8_TENSOR>::EPC && moe_epc(MV_NVFP4) == fmt_traits<MV_NVFP4>::EPC &&
                  moe_epc(MV_AFF4) == fmt_traits<MV_AFF4>::EPC && moe_epc(MV_AFF8) == fmt_traits<MV_AFF8>::EPC,
              "moe_epc and fmt_traits disagree");

static size_t al(size_t b) { return (b + 255) / 256 * 256; }

moe_ws dr_cuda_moe_ws_layout(const dr_cuda_moe *m, int64_t n, void *base) {
    moe_ws w;
    uint8_t *p = (uint8_t *)base;
    size_t off = 0;
    w.scores = (float *)(p + off), off += al((size_t)n * m->E * 4);
    w.sg = (float *)(p + off), off += al((size_t)n * 4);
    w.ids = (int32_t *)(p + off), off += al((size_t)n * m->topk * 4);
    w.slots = (int32_t *)(p + off), off += al((size_t)n * m->topk * 4);
    w.wsel = (float *)(p + off), off += al((size_t)n * m->topk * 4);
    w.act = (float *)(p + off), off += al((size_t)n * (m->topk + 1) * m->W * 4);
    w.ydn = w.act, w.used = w.ustart = w.ucount = w.pairs = w.vt = NULL;
    if (n >= m->group_min_n) { /* the grouped path's lists and per-pair down outputs */
        w.ydn = (float *)(p + off), off += al((size_t)n * (m->topk + 1) * m->H * 4);
        w.used = (int32_t *)(p + off), off += al((size_t)(m->n_kept + 2) * 4);
        w.ustart = (int32_t *)(p + off), off += al((size_t)m->n_kept * 4);
        w.ucount = (int32_t *)(p + off), off += al((size_t)m->n_kept * 4);
        w.pairs = (int32_t *)(p + off), off += al((size_t)n * m->topk * 4);
        w.vt = (int32_t *)(p + off), off += al((size_t)3 * n * m->topk * 4);
    }
    w.bytes = off;
    return w;
}

extern "C" size_t dr_cuda_moe_ws_bytes(const dr_cuda_moe *m, int64_t n) { return dr_cuda_moe_ws_layout(m, n, NULL).bytes; }

extern "C" void dr_cuda_moe_last_route(const dr_cuda_moe *m, int64_t n, void *ws, int32_t **ids, float **weights) {
    moe_ws w = dr_cuda_moe_ws_layout(m, n, ws);
    if (ids) *ids = w.ids;
    if (weights) *weights = w.wsel;
}

static drama_status check_w(const dr_cuda_weight *w, int64_t rows, int64_t cols, const char *what, int slot,
                            drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "CUDA MoE: %s of slot %d missing", what, slot);
    if (w->rows < rows || w->cols != cols)
        return dr_fail(err, DRAMA_ESHAPE, "CUDA MoE: %s is [%lld, %lld], expected [%lld, %lld]", w->name,
                       (long long)w->rows, (long long)w->cols, (long long)rows, (long long)cols);
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_moe_create(dr_cuda *c, const dr_cuda_moe_desc *d, dr_cuda_moe **out,
                                           drama_error *err) {
    *out = NULL;
    if (!c || !d || d->E <= 0 || d->topk <= 0 || d->n_kept <= 0 || !d->slot || d->H <= 0 || d->I <= 0 || d->Is < 0)
        return dr_fail(err, DRAMA_EINVAL, "CUDA MoE: bad description");
    if (d->topk > MOE_MAX_TOPK)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA MoE: %d experts per row (at most %d)", d->topk, MOE_MAX_TOPK);
    drama_status st;
    if ((st = check_w(d->router, d->E, d->H, "router", -1, err))) return st;
    if ((st = check_w(d->sh_gate, d->Is, d->H, "shared gate", -1, err)) ||
        (st = check_w(d->sh_up, d->Is, d->H, "shared up", -1, err)) ||
        (st = check_w(d->sh_down, d->H, d->Is, "shared down", -1, err)) ||
        (st = check_w(d->sh_gate_proj, 1, d->H, "shared expert gate", -1, err)))
        return st;
    moe_expert *host = (moe_expert *)calloc((size_t)d->n_kept, sizeof *host);
    int32_t *slot = (int32_t *)malloc((size_t)d->E * sizeof *slot);
    dr_cuda_moe *m = (dr_cuda_moe *)calloc(1, sizeof *m);
    if (!host || !slot || !m) {
        free(host), free(slot), free(m);
        return dr_fail(err, DRAMA_ENOMEM, "CUDA MoE: out of host memory");
    }
    for (int e = 0; e < d->E; e++) {
        slot[e] = d->slot[e] >= 0 && d->slot[e] < d->n_kept ? d->slot[e] : -1;
    }
    m->down_fmt = d->down[0] ? d->down[0]->fmt : -1;
    for (int k = 0; k < d->n_kept && !st; k++) {
        if (!d->down[k] || d->down[k]->fmt != m->down_fmt || (!d->fused && (!d->gate[k] || !d->up[k] ||
                                                                           d->gate[k]->fmt != d->up[k]->fmt)))
            m->down_fmt = -1; /* the decode kernels need one down format and gate = up */
    }
    if (d->sh_gate->fmt != d->sh_up->fmt) m->down_fmt = -1;
    m->gu_fmt = d->fused ? (d->gate_up[0] ? d->gate_up[0]->fmt : -1) : (d->gate[0] ? d->gate[0]->fmt : -1);
    for (int k = 0; k < d->n_kept; k++) { /* one routed gate (= up) format: the persistent and staged kernels need it */
        const dr_cuda_weight *g = d->fused ? d->gate_up[k] : d->gate[k];
        if (!g || g->fmt != m->gu_fmt || (!d->fused && (!d->up[k] || d->up[k]->fmt != m->gu_fmt))) m->gu_fmt = -1;
    }
    for (int k = 0; k < d->n_kept && !st; k++) {
        if (d->fused) {
            if (!(st = check_w(d->gate_up[k], 2 * d->I, d->H, "gate_up", k, err))) {
                host[k].gate = host[k].up = dr_cuda_weight_view(d->gate_up[k]);
                host[k].up_row0 = d->I;
            }
        } else if (!(st = check_w(d->gate[k], d->I, d->H, "gate", k, err)) &&
                   !(st = check_w(d->up[k], d->I, d->H, "up", k, err))) {
            host[k].gate = dr_cuda_weight_view(d->gate[k]);
            host[k].up = dr_cuda_weight_view(d->up[k]);
        }
        if (!st && !(st = check_w(d->down[k], d->H, d->I, "down", k, err))) host[k].down = dr_cuda_weight_view(d->down[k]);
    }
    m->c = c;
    m->E = d->E, m->topk = d->topk, m->norm_topk = d->norm_topk, m->n_kept = d->n_kept;
    m->H = d->H, m->I = d->I, m->Is = d->Is;
    m->W = ((d->I > d->Is ? d->I : d->Is) + 3) / 4 * 4;
    m->router = d->router, m->sh_gate_proj = d->sh_gate_proj;
    /* 0: every call per row; old / staged: the grouped path's first or staged kernels; else (walk) moe_grouped_walk.cuh */
    const char *grp = getenv("DRAMA_CUDA_MOE_GROUPED");
    m->group_min_n = grp && !strcmp(grp, "0") ? ((int64_t)1 << 40) : DR_CUDA_MOE_GROUP_MIN_N;
    m->group_kind = grp && !strcmp(grp, "old") ? MOE_GROUP_OLD : grp && !strcmp(grp, "staged") ? MOE_GROUP_STAGED : MOE_GROUP_WALK;
    m->walk_calls = 0;
    const char *dn = getenv("DRAMA_CUDA_MOE_DOWN"); /* default lean (H200: 7.72 vs 8.30 ms a frame); decode: the old kernel */
    m->down_lean = !(dn && !strcmp(dn, "decode"));
    /* default 2: moe_persist2.cu's expert kernels (H200: 5.51 vs 5.84 ms a frame, the same bytes); 1:
     * moe_persist.cuh's; 0: moe_route_kernel and moe_decode.cuh's kernels */
    const char *ps = getenv("DRAMA_CUDA_MOE_PERSIST");
    m->persist = ps && !strcmp(ps, "0") ? 0 : ps && !strcmp(ps, "1") ? 1 : 2;
    /* DRAMA_CUDA_ROUTER_TC=1: a prefill's router on the tensor cores (opt-in: the scores then differ from
     * the CPU's in the last bits, and one seeded golden run of 24 diverged on the H200) */
    const char *rt = getenv("DRAMA_CUDA_ROUTER_TC");
    m->router_tc = rt && !strcmp(rt, "1");
    /* default 1: moe_persist2.cu's down kernel stages a row's act rows in shared memory; 0: reads them from L2 */
    const char *ds = getenv("DRAMA_CUDA_MOE_DOWN_STAGE");
    m->down_stage = !(ds && !strcmp(ds, "0"));
    /* default: with the second persistent kernels each gate/up block routes its row (no routing launch); kernel: the routing kernel */
    const char *ro = getenv("DRAMA_CUDA_MOE_ROUTE");
    m->route_in_gu = !(ro && !strcmp(ro, "kernel"));
    /* 1 (opt-in until measured on a GPU): the gate/up kernel prefetches the chosen experts' weights into L2 */
    const char *pf = getenv("DRAMA_CUDA_MOE_L2PF");
    m->l2pf = pf && !strcmp(pf, "1");
    m->shared.gate = dr_cuda_weight_view(d->sh_gate);
    m->shared.up = dr_cuda_weight_view(d->sh_up);
    m->shared.down = dr_cuda_weight_view(d->sh_down);
    if (!st) st = dr_cuda_malloc(c, (size_t)d->n_kept * sizeof *host, (void **)&m->experts, err);
    if (!st) st = dr_cuda_malloc(c, (size_t)d->E * sizeof *slot, (void **)&m->slot_dev, err);
    if (!st) st = dr_cuda_to_device(c, m->experts, host, (size_t)d->n_kept * sizeof *host, err);
    if (!st) st = dr_cuda_to_device(c, m->slot_dev, slot, (size_t)d->E * sizeof *slot, err);
    free(host);
    free(slot);
    if (st) {
        dr_cuda_moe_free(m);
        return st;
    }
    *out = m;
    return DRAMA_OK;
}

extern "C" void dr_cuda_moe_set_group_min(dr_cuda_moe *m, int64_t min_rows) {
    if (m) m->group_min_n = min_rows > 0 ? min_rows : 1;
}

extern "C" void dr_cuda_moe_free(dr_cuda_moe *m) {
    if (!m) return;
    dr_cuda_free(m->c, m->experts);
    dr_cuda_free(m->c, m->slot_dev);
    free(m);
}

/* ---- routing: one block per row ---- */

/* Key of an eligible probability p >= 0 and id e: its bits are monotonic (+0 for a zero), the low
 * word 0xFFFFFFFF - e prefers the lower id on equal p and keeps every eligible key above 0. */
__device__ __forceinline__ unsigned long long prob_key(float p, int e) {
    unsigned bits = p == 0.0f ? 0u : __float_as_uint(p);
    return ((unsigned long long)bits << 32) | (0xFFFFFFFFu - (unsigned)e);
}

__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v, unsigned long long *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, v, off);
        v = o > v ? o : v;
    }
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    unsigned long long t = lane < nw ? sh[lane] : 0ull;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, t, off);
        t = o > t ? o : t;
    }
    return t;
}

__global__ void __launch_bounds__(ROUTE_THREADS)
moe_route_kernel(const float *scores, int E, int k, int norm_topk, const int32_t *slot, int32_t *ids, int32_t *slots,
                 float *wsel, int layer, dev_status *st, dr_op_status *rst) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float probs[]; /* [E] */
    __shared__ double sh[32];
    __shared__ float shf[32];
    __shared__ unsigned long long shk[32];
    __shared__ int chosen[MOE_MAX_TOPK + 1];
    __shared__ float chosen_p[MOE_MAX_TOPK + 1];
    const int64_t r = blockIdx.x;
    const float *s = scores + r * E;
    int elig;
    float mx;
    route_eligible(s, E, slot, probs, elig, mx);
    double ne = block_sum_d((double)elig, sh);
    mx = block_max_f(mx, shf);
    if (ne == 0.0) {
        route_fail(r, k, ids, slots, wsel, layer, st, rst);
        return;
    }
    route_softmax(probs, s, slot, E, mx, sh); /* dr_op_softmax (moe_route.cuh) */
    /* top-k: k rounds of the largest eligible probability, ties to the lower id */
    for (int q = 0; q < k; q++) {
        unsigned long long best = 0;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (probs[e] >= 0.0f) {
                unsigned long long key = prob_key(probs[e], e);
                best = key > best ? key : best;
            }
        best = block_max_u64(best, shk);
        int id = best ? (int)(0xFFFFFFFFu - (unsigned)(best & 0xFFFFFFFFull)) : -1;
        if (threadIdx.x == 0) {
            chosen[q] = id;
            chosen_p[q] = id >= 0 ? probs[id] : 0.0f;
            if (id >= 0) probs[id] = -1.0f; /* taken */
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int q = 0; q < k; q++) tot += chosen[q] >= 0 ? (double)chosen_p[q] : 0.0;
        for (int q = 0; q < k; q++) {
            int id = chosen[q];
            float p = chosen_p[q];
            ids[r * k + q] = id;
            slots[r * k + q] = id >= 0 ? slot[id] : -1;
            wsel[r * k + q] = norm_topk && tot > 0.0 ? (float)((double)p / tot) : p;
        }
    }
}

/* ---- gate / up / SwiGLU ---- */

/* Job jy of grid.y: mode 0 (MoE) jy < n k is (row jy / k, rank jy % k) with the routed expert of
 * that rank, jy >= n k the shared expert of row jy - n k; mode 1 (direct) row jy with `fixed`. */
__global__ void __launch_bounds__(GU_WARPS * 32)
gate_up_kernel(int mode, int64_t n, int k, const int32_t *slots, const moe_expert *experts, moe_expert fixed,
               int64_t I, int64_t Is, int64_t W, int64_t H, const float *x, float *act) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int lane = threadIdx.x & 31;
    const int64_t jy = blockIdx.y, r = (int64_t)blockIdx.x * GU_WARPS + (threadIdx.x >> 5);
    const moe_expert *ex = &fixed;
    int64_t row = jy, width = I;
    if (mode == 0) {
        if (jy < n * k) {
            int sl = slots[jy];
            if (sl < 0) return;
            ex = &experts[sl];
            row = jy / k;
        } else {
            row = jy - n * k;
            width = Is;
        }
    }
    if (r >= width) return; /* whole warps: the shuffles stay full */
    const float *xr = x + row * H;
    float g = warp_row_dot_any(ex->gate, r, xr, lane);
    float u = warp_row_dot_any(ex->up, ex->up_row0 + r, xr, lane);
    if (lane == 0) act[jy * W + r] = fmul(dsilu(g), u); /* dr_op_swiglu */
}

/* ---- down + combine: block (output h, row i), warp q < k = rank q, warp k = shared expert ---- */
__global__ void __launch_bounds__((MOE_MAX_TOPK + 1) * 32) moe_down_kernel(int64_t n, int k, const int32_t *slots, const float *wsel, const float *sg,
                                const moe_expert *experts, moe_expert shared, int64_t W, int64_t H, const float *act,
                                float *out, int add) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ float yq[MOE_MAX_TOPK + 1];
    __shared__ int okq[MOE_MAX_TOPK + 1];
    const int lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const int64_t h = blockIdx.x, i = blockIdx.y;
    if (q < k) {
        int sl = slots[i * k + q];
        float y = 0.0f;
        if (sl >= 0) y = warp_row_dot_any(experts[sl].down, h, act + (i * k + q) * W, lane);
        if (lane == 0) yq[q] = y, okq[q] = sl >= 0;
    } else {
        float y = warp_row_dot_any(shared.down, h, act + (n * k + i) * W, lane);
        if (lane == 0) yq[k] = y;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float o = 0.0f;
        for (int r = 0; r < k; r++)
            if (okq[r]) o = fadd(o, fmul(wsel[i * k + r], yq[r]));
        o = fadd(o, fmul(dsigmoid(sg[i]), yq[k]));
        float *dst = out + i * H + h;
        *dst = add ? fadd(*dst, o) : o;
    }
}

static drama_status moe_run(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, int add, void *ws,
                            size_t ws_bytes, int layer, int tc, dr_cuda_status *st, dr_op_status *rst, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!m || !x || !out || !ws) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_moe_run: NULL argument");
    moe_ws w = dr_cuda_moe_ws_layout(m, n, ws);
    if (ws_bytes < w.bytes)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_moe_run: workspace of %zu bytes, %zu needed", ws_bytes, w.bytes);
    if (n * (m->topk + 1) > 65535 || n > 65535)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_moe_run: %lld rows in one call", (long long)n);
    dr_cuda_job jobs[2] = {{m->router, x, n, w.scores, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL},
                           {m->sh_gate_proj, x, n, w.sg, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL}};
    /* a prefill's router on the tensor cores (opt-in): the matvec gives [256, H] x 30 rows too few blocks (127 us) */
    const bool on_tc = tc && m->router_tc && n >= DR_CUDA_GEMM_MIN_N && dr_cuda_gemm_ok(&jobs[0]) && dr_cuda_gemm_ok(&jobs[1]);
    drama_status s = on_tc ? dr_cuda_gemm_batch(c, jobs, 2, 0, err) : dr_cuda_matmul_batch(c, jobs, 2, err);
    if (s) return s;
    const bool p2 = n < m->group_min_n && n <= MOE_DECODE_MAX_N && m->down_fmt >= 0 && m->H % 32 == 0 &&
                    m->I % 32 == 0 && m->Is % 32 == 0 && m->persist == 2 && m->gu_fmt >= 0;
    p2_route rt = {};
    if (p2 && m->route_in_gu) /* the gate/up kernel routes (moe_persist2.cu): the same values, one launch fewer */
        rt = p2_route{w.scores, m->slot_dev, w.ids, w.wsel, (int)m->E, (int)m->norm_topk, layer, (dev_status *)st, rst};
    else if (m->persist) /* the same values with fewer barriers (moe_route.cuh) */
        dr_launch(c->pdl, moe_route_rank_kernel, (unsigned)n, ROUTE_THREADS, (size_t)m->E * sizeof(float), c->stream,
                  (const float *)w.scores, (int)m->E, (int)m->topk, (int)m->norm_topk, (const int32_t *)m->slot_dev, w.ids,
                  w.slots, w.wsel, layer, (dev_status *)st, rst);
    else
        dr_launch(c->pdl, moe_route_kernel, (unsigned)n, ROUTE_THREADS, (size_t)m->E * sizeof(float), c->stream, w.scores,
                  m->E, m->topk, m->norm_topk, m->slot_dev, w.ids, w.slots, w.wsel, layer, (dev_status *)st, rst);
    if ((s = dr_cuda_check(cudaGetLastError(), "MoE routing launch", err))) return s;
    if (n >= m->group_min_n) return dr_cuda_moe_grouped(c, m, n, x, out, add, &w, err);
    if (p2)
        return dr_cuda_check(moe_persist2_launch(c->stream, m->down_fmt, m->gu_fmt, n, m->topk, w.slots, w.wsel, w.sg,
                                                 m->experts, m->shared, m->I, m->Is, m->W, m->H, x, w.act, out, add,
                                                 m->defect, c->xt, m->persist_blocks, c->pdl, mp_sms(), m->down_stage, rt,
                                                 m->l2pf),
                             "MoE persistent expert launches (2)", err);
    if (n <= MOE_DECODE_MAX_N && m->down_fmt >= 0 && m->H % 32 == 0 && m->I % 32 == 0 && m->Is % 32 == 0 &&
        m->persist && m->gu_fmt >= 0)
        return dr_cuda_check(moe_persist_launch(c->stream, m->down_fmt, m->gu_fmt, n, m->topk, w.slots, w.wsel, w.sg,
                                                m->experts, m->shared, m->I, m->Is, m->W, m->H, x, w.act, out, add,
                                                m->defect, c->xt, m->persist_blocks, c->pdl),
                             "MoE persistent expert launches", err);
    if (n <= MOE_DECODE_MAX_N && m->down_fmt >= 0 && m->H % 32 == 0 && m->I % 32 == 0 && m->Is % 32 == 0)
        return dr_cuda_check(moe_decode_launch(c->stream, m->down_fmt, n, m->topk, w.slots, w.wsel, w.sg, m->experts,
                                               m->shared, m->I, m->Is, m->W, m->H, x, w.act, out, add, m->defect,
                                               m->down_lean, c->xt, c->pdl),
                             "MoE decode expert launches", err);
    int64_t wmax = m->I > m->Is ? m->I : m->Is;
    dim3 g1((unsigned)((wmax + GU_WARPS - 1) / GU_WARPS), (unsigned)(n * (m->topk + 1)));
    dr_launch(c->pdl, gate_up_kernel, g1, GU_WARPS * 32, 0, c->stream, 0, n, m->topk, w.slots, m->experts, m->shared,
              m->I, m->Is, m->W, m->H, x, w.act);
    if ((s = dr_cuda_check(cudaGetLastError(), "MoE gate/up launch", err))) return s;
    dim3 g2((unsigned)m->H, (unsigned)n);
    dr_launch(c->pdl, moe_down_kernel, g2, (m->topk + 1) * 32, 0, c->stream, n, m->topk, w.slots, w.wsel, w.sg,
              m->experts, m->shared, m->W, m->H, w.act, out, add);
    return dr_cuda_check(cudaGetLastError(), "MoE down launch", err);
}

extern "C" drama_status dr_cuda_moe_run(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out,
                                        int add, void *ws, size_t ws_bytes, int layer, dr_cuda_status *st,
                                        drama_error *err) {
    return moe_run(c, m, n, x, out, add, ws, ws_bytes, layer, 0, st, NULL, err);
}

drama_status dr_cuda_seam_moe(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, void *ws,
                              size_t ws_bytes, int layer, int tc, dr_op_status *status, drama_error *err) {
    return moe_run(c, m, n, x, out, 0, ws, ws_bytes, layer, tc, NULL, status, err);
}

extern "C" void dr_cuda_moe_plant_defect(dr_cuda_moe *m, int defect) {
    if (m) m->defect = defect;
}

extern "C" void dr_cuda_moe_set_down(dr_cuda_moe *m, int lean) {
    if (m) m->down_lean = lean != 0;
}

extern "C" void dr_cuda_moe_set_l2pf(dr_cuda_moe *m, int on) {
    if (m) m->l2pf = on != 0;
}

extern "C" void dr_cuda_moe_set_down_stage(dr_cuda_moe *m, int on) {
    if (m) m->down_stage = on != 0;
}

extern "C" void dr_cuda_moe_set_route_in_gu(dr_cuda_moe *m, int on) {
    if (m) m->route_in_gu = on != 0;
}

extern "C" void dr_cuda_moe_set_persist(dr_cuda_moe *m, int on, int max_blocks) {
    if (m) m->persist = on == 2 ? 2 : on != 0, m->persist_blocks = max_blocks > 0 ? max_blocks : 0;
}

extern "C" drama_status dr_cuda_swiglu_matmul(dr_cuda *c, const dr_cuda_weight *gate, const dr_cuda_weight *up,
                                              const float *x, int64_t n, float *act, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!gate || !up || !x || !act || gate->rows != up->rows || gate->cols != up->cols)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_swiglu_matmul: gate and up must have one shape");
    if (n > 65535) return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_swiglu_matmul: %lld rows", (long long)n);
    moe_expert f;
    memset(&f, 0, sizeof f);
    f.gate = dr_cuda_weight_view(gate);
    f.up = dr_cuda_weight_view(up);
    f.gate.x_vec = f.up.x_vec = (gate->cols % 4 == 0) && ((uintptr_t)x % 16 == 0);
    dim3 g((unsigned)((gate->rows + GU_WARPS - 1) / GU_WARPS), (unsigned)n);
    dr_launch(c->pdl, gate_up_kernel, g, GU_WARPS * 32, 0, c->stream, 1, n, 0, nullptr, nullptr, f, gate->rows, 0,
              gate->rows, gate->cols, x, act);
    return dr_cuda_check(cudaGetLastError(), "SwiGLU launch", err);
}
