/* moe_internal.h - INTERNAL to the CUDA MoE (moe.cu: the per-row layer, moe_prefill.cu: the rows
 * grouped by expert): the device layer's tables and its workspace layout. C++ only. */
#ifndef DRAMA_BACKEND_CUDA_MOE_INTERNAL_H
#define DRAMA_BACKEND_CUDA_MOE_INTERNAL_H

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/l2_prefetch.cuh"

/* values per 16-byte chunk of a stored format (matvec_kernel.cuh's fmt_traits<F>::EPC, checked in
 * moe.cu), host and device: the one table the MoE kernels' run-time format code uses */
__host__ __device__ constexpr int moe_epc(int fmt) {
    return fmt == MV_F32 ? 4 : (fmt == MV_F16 || fmt == MV_BF16) ? 8 : (fmt == MV_NVFP4 || fmt == MV_AFF4) ? 32 : 16;
}

struct moe_expert {
    mv_job gate, up, down;
    int64_t up_row0;        /* fused gate_up: the up rows start at I */
};

struct dr_cuda_moe {
    dr_cuda *c;
    int E, topk, norm_topk, n_kept;
    int64_t H, I, Is, W;    /* W: act row stride, max(I, Is) rounded up to 4 floats */
    int32_t *slot_dev;      /* [E] */
    moe_expert *experts;    /* device [n_kept] */
    moe_expert shared;
    const dr_cuda_weight *router, *sh_gate_proj;
    int64_t group_min_n;    /* calls of at least this many rows take the grouped experts (moe_prefill.cu) */
    int group_defect;       /* the contract's planted defect of the grouped path (cuda_contract.h); 0 */
    int group_kind;         /* the grouped path's expert kernels (DRAMA_CUDA_MOE_GROUPED): MOE_GROUP_WALK (default), _OLD, _STAGED */
    mutable int64_t walk_calls; /* calls that ran the walk kernels (the contract checks its fixtures reach them) */
    int walk_blocks;        /* > 0: the walk kernels on at most that many blocks (the contract's long walks); 0: one wave */
    int down_fmt;           /* the routed experts' one down format (gate = up format per expert), -1: mixed */
    int defect;             /* the contract's planted decode defects (moe_decode.cuh), 0 in production */
    int down_lean;          /* 1 (default): the decode down kernel at <= 128 registers (moe_down_lean.cuh); 0: DRAMA_CUDA_MOE_DOWN=decode */
    int gu_fmt;             /* the routed experts' one gate (= up) format, -1: mixed (moe_persist.cuh and the staged grouped kernels need one) */
    int persist;            /* 2 (default): moe_persist2.cu's expert kernels; 1: moe_persist.cuh's; 0: DRAMA_CUDA_MOE_PERSIST=0 */
    int router_tc;          /* 1 (DRAMA_CUDA_ROUTER_TC=1): a prefill's router products on the tensor cores */
    int persist_blocks;     /* > 0: at most that many blocks per row in moe_persist.cuh (the contract's long walks) */
    int down_stage;         /* 1 (default): the second persistent down kernel stages a row's act in shared memory; 0: DRAMA_CUDA_MOE_DOWN_STAGE=0 */
    int route_in_gu;        /* 1 (default): with those kernels the gate/up kernel routes its row (no routing launch); 0: DRAMA_CUDA_MOE_ROUTE=kernel */
    int l2pf;               /* 1 (DRAMA_CUDA_MOE_L2PF=1, opt-in): the second persistent gate/up kernel prefetches the chosen experts into L2 */
};

enum { MOE_GROUP_WALK = 0, MOE_GROUP_OLD = 1, MOE_GROUP_STAGED = 2 };

#define MOE_MAX_TOPK 15 /* dr_cuda_moe_create refuses more (moe.cu's down block has topk + 1 warps) */

/* part `part` of `parts` of rows [r0, r0 + rows) of J into L2: the codes and, for FP8 blocks and the
 * affine formats, the scales (and biases) that cover them (other formats' scales are left) */
__device__ __forceinline__ void moe_l2pf_rows(const mv_job &J, int64_t r0, int64_t rows, int64_t part, int64_t parts) {
    l2_prefetch_part(J.data + r0 * J.pitch, rows * J.pitch, part, parts);
    if (!J.scales || part != 0) return;
    const int64_t esz = J.scale_dt == MV_S_F32 ? 4 : 2;
    if (J.fmt == MV_FP8_BLOCK && J.block_rows > 0) {
        const int64_t b0 = r0 / J.block_rows, b1 = (r0 + rows + J.block_rows - 1) / J.block_rows;
        l2_prefetch(J.scales + b0 * J.scale_cols * esz, (b1 - b0) * J.scale_cols * esz);
    } else if (J.fmt == MV_AFF4 || J.fmt == MV_AFF8) {
        l2_prefetch(J.scales + r0 * J.scale_cols * esz, rows * J.scale_cols * esz);
        if (J.biases) l2_prefetch(J.biases + r0 * J.scale_cols * esz, rows * J.scale_cols * esz);
    }
}

/* part `part` of `parts` of an expert's weights into L2: gate and up rows [0, rows) (up from
 * up_row0) and the down weight's H rows; a hint, no value changes */
__device__ __forceinline__ void moe_l2pf_expert(const moe_expert &e, int64_t rows, int64_t H, int64_t part,
                                                int64_t parts) {
    moe_l2pf_rows(e.gate, 0, rows, part, parts);
    moe_l2pf_rows(e.up, e.up_row0, rows, part, parts);
    moe_l2pf_rows(e.down, 0, H, part, parts);
}

/* a block's gate/up views of one row: q < k rank q (gate data NULL: no expert), q = k the shared expert */
struct mp_gu_views {
    mv_job g[MOE_MAX_TOPK + 1], u[MOE_MAX_TOPK + 1];
    int64_t u0[MOE_MAX_TOPK + 1], nch[MOE_MAX_TOPK + 1];
    int dfmt[MOE_MAX_TOPK + 1]; /* the down format of the rank (where act's XT layout comes from) */
};

/* rank q's gate/up views of row i into V (q = k: the shared expert; a pruned rank's gate data NULL),
 * x at xq (the staged x or the row itself); one thread per rank, before a barrier */
__device__ __forceinline__ void mp_gu_view_fill_slot(mp_gu_views &V, int q, int s, int k, const moe_expert *experts,
                                                     const moe_expert &shared, const float *xq) {
    mv_job G, U;
    int64_t u0;
    int df;
    if (q < k) { /* s: rank q's slot, -1 none */
        const moe_expert &e = experts[s >= 0 ? s : 0];
        G = e.gate, U = e.up, u0 = e.up_row0, df = e.down.fmt;
        if (s < 0) G.data = NULL;
    } else {
        G = shared.gate, U = shared.up, u0 = shared.up_row0, df = shared.down.fmt;
    }
    G.x = U.x = xq;
    V.g[q] = G, V.u[q] = U, V.u0[q] = u0, V.dfmt[q] = df;
    V.nch[q] = G.cols / moe_epc(G.fmt);
}
__device__ __forceinline__ void mp_gu_view_fill(mp_gu_views &V, int q, int64_t i, int k, const int32_t *slots,
                                                const moe_expert *experts, const moe_expert &shared, const float *xq) {
    mp_gu_view_fill_slot(V, q, q < k ? slots[i * k + q] : 0, k, experts, shared, xq);
}

/* a block's down views of one row: q < k rank q's down weight with its SwiGLU row as x (data NULL: no
 * expert) and routing weight, q = k the shared expert's */
struct mp_dn_views {
    mv_job j[MOE_MAX_TOPK + 1];
    float w[MOE_MAX_TOPK];
};

/* rank q's down view of row i into V (defect 2, the contract's: the next rank's routing weight) */
__device__ __forceinline__ void mp_dn_view_fill(mp_dn_views &V, int q, int64_t n, int64_t i, int k, const int32_t *slots,
                                                const float *wsel, const moe_expert *experts, const moe_expert &shared,
                                                const float *act, int64_t W, int defect) {
    mv_job J;
    if (q < k) {
        const int s = slots[i * k + q];
        J = experts[s >= 0 ? s : 0].down;
        if (s < 0) J.data = NULL;
        J.x = act + (i * k + q) * W;
        V.w[q] = wsel[i * k + (defect == 2 ? (q + 1) % k : q)]; /* planted: the next rank's routing weight */
    } else {
        J = shared.down;
        J.x = act + (n * k + i) * W;
    }
    V.j[q] = J;
}

/* workspace: scores [n][E] | sg [n] | ids [n][k] | slots [n][k] | wsel [n][k] | act [n (k+1)][W]
 * and, for the grouped path, ydn [n (k+1)][H] | used [n_kept + 2] | ustart [n_kept] | ucount
 * [n_kept] | pairs [n k] | vt [3 n k] (the walk kernels' tiles; moe_prefill.cu) */
struct moe_ws {
    float *scores, *sg;
    int32_t *ids, *slots;
    float *wsel, *act;
    float *ydn;
    int32_t *used, *ustart, *ucount, *pairs, *vt;
    size_t bytes;
};
moe_ws dr_cuda_moe_ws_layout(const dr_cuda_moe *m, int64_t n, void *base);

/* Rows grouped by expert, after routing filled w.slots / w.wsel / w.sg: each used expert's weights
 * are read once for all the rows that selected it (and the shared expert's once for all rows);
 * every value is the per-row path's (moe.cu) bit for bit: the same per-row dot products (chunk
 * order, fmaf chains, xor tree), SwiGLU and the rank-ordered combine. */
drama_status dr_cuda_moe_grouped(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, int add,
                                 const moe_ws *w, drama_error *err);

/* the routing moe_persist2.cu's gate/up kernel does itself (moe_route.cuh's route_rank_row, by each
 * block for its row; block x = 0 writes ids / slots / wsel for the down kernel), or none (scores NULL:
 * the routing kernel ran and slots holds its result) */
struct p2_route {
    const float *scores;   /* [n][E] router logits */
    const int32_t *slot;   /* [E] expert -> slot, -1 pruned */
    int32_t *ids;          /* [n][k] */
    float *wsel;           /* [n][k] */
    int E, norm_topk, layer;
    dev_status *st;
    dr_op_status *rst;
};

/* moe_persist2.cu (DRAMA_CUDA_MOE_PERSIST=2): moe_persist.cuh's moe_persist_launch with the second
 * persistent expert kernels; sms: the device's SM count; rt: the routing, when not launched before;
 * l2pf: the chosen experts prefetched into L2 by the gate/up kernel (dr_cuda_moe.l2pf) */
cudaError_t moe_persist2_launch(cudaStream_t stream, int routed_fmt, int gu_fmt, int64_t n, int k, int32_t *slots,
                                const float *wsel, const float *sg, const moe_expert *experts,
                                const moe_expert &shared, int64_t I, int64_t Is, int64_t W, int64_t H, const float *x,
                                float *act, float *out, int add, int defect, int xt, int max_blocks, int pdl, int sms,
                                int stage, const p2_route &rt, int l2pf);

#endif
