/* moe_persist2.cu - the MoE decode expert kernels, second persistent variant (issue 13): the default
 * (DRAMA_CUDA_MOE_PERSIST=2, dr_cuda_moe_set_persist(m, 2, ...)); 1 keeps moe_persist.cuh's, 0
 * moe_decode.cuh's. Routing: the gate/up kernel's own (below), or moe_route.cuh's routing kernel
 * first (DRAMA_CUDA_MOE_ROUTE=kernel). Run on the H200 (docs/cuda.md "Persistent MoE decode, variant 2").
 *
 * Why: on the H200 (notes of 2026-12-04) gate_up_persist_kernel streams ~20 MB in 30.9 us and
 * moe_down_persist_kernel ~10 MB in 23.7 us: 124 / 116 registers (2 blocks of 256 an SM), issue
 * slots 20-30% busy at 10-17 cycles an instruction, i.e. a latency-bound walk that does ~4x the
 * instructions its weight bytes need. Per 16-byte chunk chunk_dot's decode of FP8 block weights
 * does three 64-bit divisions (row / block_rows, c0 / block_cols, % scale_cols; the affine formats
 * one), reads every view field through the run-time format switch, and the gate and up rows of an
 * item read their x chunk from shared memory twice. Here:
 *  - the routed format is a template argument (the layer has one: gu_fmt / down_fmt), so a kernel
 *    carries one routed decode, not eight (registers), and only the shared expert's rows go through
 *    the run-time switch;
 *  - the per-row scale base is computed once per item in 32-bit arithmetic and a chunk's block or
 *    group index with one 32-bit division (p2_decode: the same scale element, so the same values);
 *  - gate and up of an item share each x float4 (one shared-memory read for both fmaf chains);
 *  - the shared expert's items / batches come FIRST in each walk and its first loads are issued
 *    BEFORE pdl_wait (its weights are constants: pdl.cuh's rule), so the wait, the routing result,
 *    the expert views and the x staging overlap real weight traffic;
 *  - launch bounds ask for P2_MINB blocks of 256 an SM (<= 80 registers) and the grid is the
 *    occupancy the driver reports for the kernel, shared by the rows.
 * Values: bit for bit moe_persist.cuh's (and so the per-row reference's): every row's dot is lane l
 * adding chunks l, l + 32, ... in order with decode()'s weights and chunk_dot's fmaf order, the same
 * xor tree, SwiGLU, act layout, rank-ordered combine, shared expert, gate and residual add; only the
 * order of independent items (outputs) and of independent accumulators (o for the ranks, as for the
 * shared row) changed.
 * Routing (issue 13, 2026-12-04): unless DRAMA_CUDA_MOE_ROUTE=kernel, every gate/up block routes its
 * row itself (moe_route.cuh's route_rank_row: the routing kernel's values) while its first shared
 * batch is in flight, and block x = 0 writes ids / slots / wsel for the down kernel: one launch a
 * layer fewer, and the views come from the block's own choice instead of slots in memory.
 * Scales and act (issue 13, 2026-12-04): the routed chunks' FP8 block scales are loaded with their
 * weights (a batch ahead), not at dot time, and the down kernel stages the row's k + 1 act rows in
 * shared memory once (DRAMA_CUDA_MOE_DOWN_STAGE=0: read from L2 as before); the same values, so the same bits.
 * `defect` (the contract's planted controls, 0 in production): 2 the next rank's routing weight (as
 * moe_persist.cuh); 7: inside the gate/up walk, a routed next item's rows are loaded at the next
 * output's row; 8: inside the down walk, the next output's shared-expert batches are loaded at the
 * current output's row (a stale row); 9: the staged act row of rank q is rank q + 1's; 10: the down
 * kernel's prefetched FP8 block scales come from the row block after the output's; 11: the gate/up
 * kernel's own routing (p2_route) gives rank q the views of rank q + 1's expert. */
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/moe_internal.h"
#include "backend/cuda/moe_route.cuh"

#define P2_WARPS 8     /* warps per block, both kernels */
#define P2_MINB 2      /* blocks of P2_WARPS warps an SM the launch bounds ask for (<= 128 registers; 3 spilled 640-950 bytes) */
#define P2_U 2         /* gate/up: chunks per lane of each of the item's two rows per batch */
#define P2_G 4         /* down: loads per lane per batch (routed ranks at one chunk step, or shared chunk steps) */
#define P2_SMEM_MAX (40 * 1024) /* moe_persist.cuh's MP_SMEM_MAX: the staged x within 48 KiB */

/* the per-row part of decode()'s scale index, once per row: FP8 block (row / block_rows) *
 * scale_cols, affine row * scale_cols (rows < 2^31: 32-bit division), else 0 */
__device__ __forceinline__ int64_t p2_sbase(const mv_job &J, int64_t row) {
    if (J.fmt == MV_FP8_BLOCK) return (int64_t)((unsigned)row / (unsigned)J.block_rows) * J.scale_cols;
    if (J.fmt == MV_AFF4 || J.fmt == MV_AFF8) return row * J.scale_cols;
    return 0;
}

/* The FP8 block scale of chunk ch of a row with scale base sb (decode()'s one-block branch, block_cols
 * a multiple of 16), else 0: loaded with the chunk's weights, so its round trip is not a second one
 * after them at dot time */
template <int FMT>
__device__ __forceinline__ float p2_scale(const mv_job &J, int64_t sb, int64_t ch) {
    if constexpr (FMT == MV_FP8_BLOCK) {
        if (J.block_cols % 16 == 0) {
            const unsigned blk0 = (unsigned)(ch * 16) / (unsigned)J.block_cols;
            return load_scale(J.scales, J.scale_dt, sb + (int64_t)(blk0 % (unsigned)J.scale_cols));
        }
    }
    return 0.0f;
}

/* decode<FMT, false, 0>(J, row, ch * EPC, v, EPC, w) with sb = p2_sbase(J, row): the same scale
 * element (block ch * 16 / block_cols % scale_cols of row block sb; group ch * EPC / group), each
 * index in 32 bits, so the same w bit for bit. A chunk of a FP8 block row whose block_cols is not a
 * multiple of 16 takes decode() itself (the boundary inside the chunk).
 * s: p2_scale<FMT>(J, sb, ch), loaded by the caller (used by the FP8 block branch only). */
template <int FMT>
__device__ __forceinline__ void p2_decode(const mv_job &J, int64_t row, int64_t sb, int64_t ch, uint4 v,
                                          float (&w)[fmt_traits<FMT>::EPC], float s) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    if constexpr (FMT == MV_FP8_BLOCK) {
        if (J.block_cols % 16 == 0) { /* decode()'s one-block branch: (blk0 + 1) block_cols >= c0 + 16 */
            const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 a = e4m3x2((unsigned short)(u[k] & 0xFFFFu)), b = e4m3x2((unsigned short)(u[k] >> 16));
                w[4 * k] = a.x * s, w[4 * k + 1] = a.y * s, w[4 * k + 2] = b.x * s, w[4 * k + 3] = b.y * s;
            }
        } else {
            decode<FMT, false, 0>(J, row, ch * EPC, v, EPC, w);
        }
    } else if constexpr (FMT == MV_AFF4 || FMT == MV_AFF8) {
        constexpr int BITS = FMT == MV_AFF4 ? 4 : 8;
        constexpr unsigned MASK = (1u << BITS) - 1u;
        constexpr int PER_WORD = 32 / BITS;
        const unsigned u[4] = {v.x, v.y, v.z, v.w};
        const int64_t si = sb + (int64_t)((unsigned)(ch * EPC) / (unsigned)J.group); /* the chunk lies in one group */
        const float s = load_scale(J.scales, J.scale_dt, si), bias = load_scale(J.biases, J.scale_dt, si);
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < PER_WORD; b++) {
                float q = (float)((u[k] >> (BITS * b)) & MASK);
                w[PER_WORD * k + b] = __fadd_rn(__fmul_rn(s, q), bias); /* decode()'s two roundings */
            }
        }
    } else {
        decode<FMT, false, 0>(J, row, ch * EPC, v, EPC, w);
    }
}

/* chunk_dot<FMT, 1, false, 0, SX, XT>'s fmaf steps for one full chunk of weights w: x at J.x (XT: the
 * transposed layout of nchp chunks; else plain, float4 loads when x_vec) */
template <int FMT, bool SX, bool XT>
__device__ __forceinline__ void p2_fma(const float *x, int x_vec, int64_t ch, int64_t nchp,
                                       const float (&w)[fmt_traits<FMT>::EPC], float &acc) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    if (XT || x_vec) {
        const float *xc = XT ? x + ch * 4 : x + ch * EPC;
#pragma unroll
        for (int e = 0; e < EPC; e += 4) {
            const float4 xv = ldx4<SX>(XT ? xc + (e >> 2) * nchp * 4 : xc + e);
            acc = fmaf(w[e], xv.x, acc);
            acc = fmaf(w[e + 1], xv.y, acc);
            acc = fmaf(w[e + 2], xv.z, acc);
            acc = fmaf(w[e + 3], xv.w, acc);
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPC; e++) acc = fmaf(w[e], ldx<SX>(x + ch * EPC + e), acc);
    }
}

/* the gate and up chunks of one item sharing each x float4 (two independent fmaf chains, each in
 * chunk_dot's order) */
template <int FMT, bool SX, bool XT>
__device__ __forceinline__ void p2_fma2(const float *x, int x_vec, int64_t ch, int64_t nchp,
                                        const float (&wg)[fmt_traits<FMT>::EPC],
                                        const float (&wu)[fmt_traits<FMT>::EPC], float &ag, float &au) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    if (XT || x_vec) {
        const float *xc = XT ? x + ch * 4 : x + ch * EPC;
#pragma unroll
        for (int e = 0; e < EPC; e += 4) {
            const float4 xv = ldx4<SX>(XT ? xc + (e >> 2) * nchp * 4 : xc + e);
            ag = fmaf(wg[e], xv.x, ag), au = fmaf(wu[e], xv.x, au);
            ag = fmaf(wg[e + 1], xv.y, ag), au = fmaf(wu[e + 1], xv.y, au);
            ag = fmaf(wg[e + 2], xv.z, ag), au = fmaf(wu[e + 2], xv.z, au);
            ag = fmaf(wg[e + 3], xv.w, ag), au = fmaf(wu[e + 3], xv.w, au);
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPC; e++) {
            const float xv = ldx<SX>(x + ch * EPC + e);
            ag = fmaf(wg[e], xv, ag), au = fmaf(wu[e], xv, au);
        }
    }
}

/* ---- gate / up / SwiGLU ---- */

/* DRAMA_CUDA_MOE_L2PF=1: as soon as a block knows a rank's expert it prefetches its part (of the row's
 * blocks) of that expert's gate, up and down weights into L2, so the DRAM stream runs ahead of the
 * walk's few loads in flight and the down kernel finds its weights in L2 (issue 13: both kernels ran
 * at 0.4-0.8 TB/s, latency bound). A hint: no value changes. */
__device__ __forceinline__ void p2_l2pf_rank(const moe_expert &e, int64_t I, int64_t H) {
    moe_l2pf_expert(e, I, H, blockIdx.x, gridDim.x);
}

/* item t: t < Is the shared expert's output t (q = k), else rank (t - Is) / I, output (t - Is) % I */
__device__ __forceinline__ void p2_gu_item(int t, int k, int I, int Is, int &q, int &r) {
    if (t < Is) q = k, r = t;
    else q = (t - Is) / I, r = (t - Is) - q * I;
}

/* batch b0 (chunks b0 + lane + 32 u, u < P2_U) of gate row rg of G and up row ru of U (nch chunks) */
__device__ __forceinline__ void p2_gu_load(const uint8_t *wg, const uint8_t *wu, int64_t nch, int64_t b0, int lane,
                                           uint4 (&vg)[P2_U], uint4 (&vu)[P2_U]) {
#pragma unroll
    for (int u = 0; u < P2_U; u++) {
        const int64_t ch = b0 + lane + 32 * u;
        if (ch < nch) vg[u] = ld_stream(wg + ch * 16), vu[u] = ld_stream(wu + ch * 16);
    }
}

/* the FP8 block scales of that batch's chunks (p2_scale), issued with its weights */
template <int FMT>
__device__ __forceinline__ void p2_gu_scales(const mv_job &G, const mv_job &U, int64_t sg, int64_t su, int64_t nch,
                                             int64_t b0, int lane, float (&cg)[P2_U], float (&cu)[P2_U]) {
#pragma unroll
    for (int u = 0; u < P2_U; u++) {
        const int64_t ch = b0 + lane + 32 * u;
        if (ch < nch) cg[u] = p2_scale<FMT>(G, sg, ch), cu[u] = p2_scale<FMT>(U, su, ch);
    }
}

/* one batch of an item: FMT its format, G / U its views (x set), rows rg / ru, scale bases sg / su;
 * PRE: the chunks' scales cg / cu came with the weights (p2_gu_scales), else they are loaded here */
template <int FMT, bool XT, bool PRE>
__device__ __forceinline__ void p2_gu_dot(const mv_job &G, const mv_job &U, int64_t rg, int64_t ru, int64_t sg,
                                          int64_t su, int64_t nch, int64_t b0, int lane, const uint4 (&vg)[P2_U],
                                          const uint4 (&vu)[P2_U], const float (&cg)[P2_U], const float (&cu)[P2_U],
                                          float &ag, float &au) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
#pragma unroll
    for (int u = 0; u < P2_U; u++) {
        const int64_t ch = b0 + lane + 32 * u;
        if (ch < nch) {
            const float sgu = PRE ? cg[u] : p2_scale<FMT>(G, sg, ch), suu = PRE ? cu[u] : p2_scale<FMT>(U, su, ch);
            if constexpr (EPC <= 16) { /* both rows' weights live: one x read for two chains */
                float wg[EPC], wu[EPC];
                p2_decode<FMT>(G, rg, sg, ch, vg[u], wg, sgu);
                p2_decode<FMT>(U, ru, su, ch, vu[u], wu, suu);
                p2_fma2<FMT, XT, XT>(G.x, G.x_vec, ch, nch, wg, wu, ag, au);
            } else { /* 32 values a chunk: one row at a time (64 live weights spilled), x read twice */
                float w[EPC];
                p2_decode<FMT>(G, rg, sg, ch, vg[u], w, sgu);
                p2_fma<FMT, XT, XT>(G.x, G.x_vec, ch, nch, w, ag);
                p2_decode<FMT>(U, ru, su, ch, vu[u], w, suu);
                p2_fma<FMT, XT, XT>(U.x, U.x_vec, ch, nch, w, au);
            }
        }
    }
}

/* gate_up_persist_kernel's act rows (mode 0 jobs: row i rank q at i k + q, the shared expert at
 * n k + i), GF the routed experts' gate (= up) format. XT: x [H] staged in dynamic shared memory in
 * GF's layout and, when the shared expert's chunk differs, in its own at xs_off floats. */
template <int GF, bool XT>
__global__ void __launch_bounds__(P2_WARPS * 32, P2_MINB)
gate_up_p2_kernel(int64_t n, int k, int32_t *slots, const moe_expert *experts, moe_expert shared, int I, int Is,
                  int64_t W, int64_t H, const float *x, float *act, int64_t xs_off, int defect, p2_route rt,
                  int64_t probs_off, int l2pf) {
    pdl_trigger();
    extern __shared__ float4 gx4[];
    __shared__ mp_gu_views V;
    __shared__ route_smem R;
    float *xs = reinterpret_cast<float *>(gx4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t i = blockIdx.y;
    const float *xr = x + i * H;
    const int N = Is + k * I, stride = (int)gridDim.x * P2_WARPS;
    int t = (int)blockIdx.x * P2_WARPS + warp, q = k, r = 0;
    int64_t b0 = 0;
    uint4 ga[P2_U], ua[P2_U], gb[P2_U], ub[P2_U];
    float csa[P2_U] = {}, cua[P2_U] = {}, csb[P2_U] = {}, cub[P2_U] = {}; /* routed items' FP8 block scales */
    int64_t sgb = 0, sub = 0; /* the current item's scale bases (p2_sbase) */
    const int64_t nchs = shared.gate.cols / moe_epc(shared.gate.fmt);
    if (t < Is) { /* the shared expert's first batch: constants, in flight across the wait */
        r = t;
        p2_gu_load(shared.gate.data + r * shared.gate.pitch, shared.up.data + (shared.up_row0 + r) * shared.up.pitch,
                   nchs, 0, lane, ga, ua);
    }
    if (l2pf && threadIdx.x == 0) /* the shared expert (constants), for this and the down kernel: the row blocks share it */
        moe_l2pf_expert(shared, Is, H, (int64_t)blockIdx.y * gridDim.x + blockIdx.x, (int64_t)gridDim.x * gridDim.y);
    pdl_wait(); /* everything below may read what the previous kernel wrote */
    const float *xq = XT ? xs + ((int)threadIdx.x < k ? 0 : xs_off) : xr;
    if (rt.scores) { /* the row's routing by this block (uniform: a kernel parameter), while the shared loads fly */
        const int ok = route_rank_row(rt.scores + i * rt.E, rt.E, k, rt.slot, xs + probs_off, R);
        if (blockIdx.x == 0) {
            if (ok) route_write(R, i, k, rt.norm_topk, rt.slot, rt.ids, slots, rt.wsel);
            else route_fail(i, k, rt.ids, slots, rt.wsel, rt.layer, rt.st, rt.rst);
        }
        if (threadIdx.x <= k) {
            const int qv = defect == 11 ? ((int)threadIdx.x + 1) % k : (int)threadIdx.x; /* 11: planted, the next rank's expert */
            const int e = (int)threadIdx.x < k && ok ? R.chosen[qv] : -1, s = e >= 0 ? rt.slot[e] : -1;
            mp_gu_view_fill_slot(V, threadIdx.x, s, k, experts, shared, xq);
            if (l2pf && s >= 0) p2_l2pf_rank(experts[s], I, H); /* rank q's expert, this block's part */
        }
    } else if (threadIdx.x <= k) { /* the views, once per block */
        mp_gu_view_fill(V, threadIdx.x, i, k, slots, experts, shared, xq);
        const int s = (int)threadIdx.x < k ? slots[i * k + threadIdx.x] : -1;
        if (l2pf && s >= 0) p2_l2pf_rank(experts[s], I, H);
    }
    __syncthreads();
    if (t < N) p2_gu_item(t, k, I, Is, q, r), sgb = p2_sbase(V.g[q], r), sub = p2_sbase(V.u[q], V.u0[q] + r);
    if (t >= Is && t < N && V.g[q].data) { /* a routed first item: its view is known now */
        p2_gu_load(V.g[q].data + r * V.g[q].pitch, V.u[q].data + (V.u0[q] + r) * V.u[q].pitch, V.nch[q], 0, lane, ga,
                   ua);
        p2_gu_scales<GF>(V.g[q], V.u[q], sgb, sub, V.nch[q], 0, lane, csa, cua);
    }
    if constexpr (XT) { /* matvec_kernel.cuh's transposed layout, per format chunk */
        constexpr int er = fmt_traits<GF>::EPC;
        const int es = moe_epc(shared.gate.fmt);
        const int64_t nr = H / er, ns = H / es;
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const float v = xr[j];
            xs[xt_at<er>(j, nr)] = v;
            if (xs_off) {
                const int64_t c = j / es;
                const int e = (int)(j - c * es);
                xs[xs_off + ((e >> 2) * ns + c) * 4 + (e & 3)] = v;
            }
        }
        __syncthreads();
    }
    float ag = 0.0f, au = 0.0f;
    while (t < N) {
        int t2 = t, r2 = r, q2 = q;
        int64_t nb = b0 + 32 * P2_U, sgb2 = sgb, sub2 = sub;
        if (nb >= V.nch[q]) { /* this item's last batch: the next item's first one */
            t2 = t + stride, nb = 0;
            if (t2 < N) p2_gu_item(t2, k, I, Is, q2, r2), sgb2 = p2_sbase(V.g[q2], r2), sub2 = p2_sbase(V.u[q2], V.u0[q2] + r2);
        }
        if (t2 < N && V.g[q2].data) {
            const int rl = defect == 7 && q2 < k && t2 != t ? (r2 + 1) % I : r2; /* planted: the next output's rows */
            p2_gu_load(V.g[q2].data + rl * V.g[q2].pitch, V.u[q2].data + (V.u0[q2] + rl) * V.u[q2].pitch, V.nch[q2],
                       nb, lane, gb, ub);
            if (q2 < k) p2_gu_scales<GF>(V.g[q2], V.u[q2], sgb2, sub2, V.nch[q2], nb, lane, csb, cub);
        }
        const bool live = V.g[q].data != NULL;
        if (live) {
            const int64_t ru = V.u0[q] + r;
            if (q < k) {
                p2_gu_dot<GF, XT, true>(V.g[q], V.u[q], r, ru, sgb, sub, V.nch[q], b0, lane, ga, ua, csa, cua, ag, au);
            } else {
                mv_fmt_switch(V.g[k].fmt, [&](auto F) {
                    p2_gu_dot<decltype(F)::value, XT, false>(V.g[k], V.u[k], r, ru, sgb, sub, V.nch[k], b0, lane, ga, ua,
                                                             csa, cua, ag, au);
                });
            }
        }
        if (t2 != t) { /* item done: warp_row_dot2's xor tree, then gate_up_decode_kernel's store */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                ag += __shfl_xor_sync(0xFFFFFFFFu, ag, off);
                au += __shfl_xor_sync(0xFFFFFFFFu, au, off);
            }
            if (live && lane == 0) {
                const int64_t width = q < k ? I : Is, jy = q < k ? i * k + q : n * k + i;
                int64_t at = r; /* XT: where the down kernel's chunk_dot reads element r of the row */
                if constexpr (XT) {
                    const int epc = moe_epc(V.dfmt[q]), e = r % epc;
                    at = ((e >> 2) * (width / epc) + r / epc) * 4 + (e & 3);
                }
                act[jy * W + at] = fmul(dsilu(ag), au); /* dr_op_swiglu */
            }
            ag = au = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < P2_U; u++) ga[u] = gb[u], ua[u] = ub[u], csa[u] = csb[u], cua[u] = cub[u];
        t = t2, b0 = nb, q = q2, r = r2, sgb = sgb2, sub = sub2;
    }
}

/* ---- down + combine ---- */

/* batch b of output h: b < nbs the shared row's chunk steps b P2_G + 0 .. P2_G - 1 (from S, the
 * kernel parameter: no view needed), else routed ranks g0 .. g0 + P2_G - 1 (g0 = (b - nbs) / pr
 * P2_G) at chunk step (b - nbs) % pr, with their FP8 block scales in c (p2_scale, DF the routed format) */
template <int DF>
__device__ __forceinline__ void p2_dn_load(const mp_dn_views &V, const mv_job &S, int k, int64_t h, int b, int nbs,
                                           int pr, int64_t nchr, int64_t nchs, int lane, uint4 (&v)[P2_G],
                                           float (&c)[P2_G], int defect) {
    if (b < nbs) {
        const uint8_t *ws = S.data + h * S.pitch;
#pragma unroll
        for (int g = 0; g < P2_G; g++) {
            const int64_t ch = lane + 32 * ((int64_t)b * P2_G + g);
            if (ch < nchs) v[g] = ld_stream(ws + ch * 16);
        }
    } else {
        const int br = b - nbs, g0 = br / pr * P2_G;
        const int64_t ch = lane + 32 * (int64_t)(br % pr);
#pragma unroll
        for (int g = 0; g < P2_G; g++) {
            const int q = g0 + g;
            if (q < k && V.j[q].data && ch < nchr) {
                v[g] = ld_stream(V.j[q].data + h * V.j[q].pitch + ch * 16);
                const int64_t hs = defect == 10 ? (h + V.j[q].block_rows) % V.j[q].r1 : h; /* 10: planted, the next row block's */
                c[g] = p2_scale<DF>(V.j[q], p2_sbase(V.j[q], hs), ch);
            }
        }
    }
}

/* moe_down_persist_kernel's out, DF the routed experts' down format (XT: act rows transposed, as the
 * gate/up kernels wrote them). ST: the row's k + 1 act rows staged in dynamic shared memory at once
 * (one round trip, overlapping the views), not read from L2 chunk by chunk at dot time. */
template <int DF, bool XT, bool ST>
__global__ void __launch_bounds__(P2_WARPS * 32, P2_MINB)
moe_down_p2_kernel(int64_t n, int k, const int32_t *slots, const float *wsel, const float *sg,
                   const moe_expert *experts, moe_expert shared, int64_t I, int64_t W, int64_t H, const float *act,
                   float *out, int add, int defect) {
    constexpr int EPC = fmt_traits<DF>::EPC;
    pdl_trigger();
    __shared__ mp_dn_views V;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t i = blockIdx.y;
    const int64_t nchr = I / EPC, nchs = shared.down.cols / moe_epc(shared.down.fmt);
    const int pr = (int)((nchr + 31) / 32), nbs = (int)(((nchs + 31) / 32 + P2_G - 1) / P2_G);
    const int nb_all = nbs + (k + P2_G - 1) / P2_G * pr;
    const int64_t stride = (int64_t)gridDim.x * P2_WARPS;
    int64_t h = (int64_t)blockIdx.x * P2_WARPS + warp;
    int b = 0;
    uint4 va[P2_G], vb[P2_G];
    float ca[P2_G] = {}, cb[P2_G] = {}; /* the routed chunks' FP8 block scales */
    if (h < H && nbs > 0) p2_dn_load<DF>(V, shared.down, k, h, 0, nbs, pr, nchr, nchs, lane, va, ca, defect); /* constants: before the wait */
    pdl_wait(); /* everything below may read what the previous kernel wrote */
    extern __shared__ float4 dx4[];
    float *xs = reinterpret_cast<float *>(dx4); /* ST: ranks 0 .. k - 1 at q W, the shared expert at k W */
    if constexpr (ST) { /* rows i k .. i k + k - 1 are adjacent; the shared row is n k + i (W: 4 floats a unit) */
        const float4 *ar = reinterpret_cast<const float4 *>(act + i * k * W), *as4 = reinterpret_cast<const float4 *>(act + (n * k + i) * W);
        const int nr4 = (int)(k * W / 4), ns4 = (int)(W / 4);
        for (int j = threadIdx.x; j < nr4 + ns4; j += blockDim.x) dx4[j] = j < nr4 ? __ldg(ar + j) : __ldg(as4 + (j - nr4));
    }
    if (threadIdx.x <= k) {
        mp_dn_view_fill(V, threadIdx.x, n, i, k, slots, wsel, experts, shared, act, W, defect);
        const int qs = defect == 9 && (int)threadIdx.x < k ? ((int)threadIdx.x + 1) % k : (int)threadIdx.x; /* 9: planted, the next rank's row */
        if (ST) V.j[threadIdx.x].x = xs + qs * W;
    }
    const float gate = dsigmoid(sg[i]);
    __syncthreads();
    if (h < H && nbs == 0) p2_dn_load<DF>(V, shared.down, k, h, 0, nbs, pr, nchr, nchs, lane, va, ca, defect);
    float acc[P2_G], as = 0.0f, o = 0.0f;
#pragma unroll
    for (int g = 0; g < P2_G; g++) acc[g] = 0.0f;
    while (h < H) {
        int64_t h2 = h;
        int b2 = b + 1;
        if (b2 == nb_all) h2 = h + stride, b2 = 0; /* the next output's first batch */
        if (h2 < H) p2_dn_load<DF>(V, shared.down, k, defect == 8 && b2 < nbs && h2 != h ? h : h2, b2, nbs, pr, nchr,
                                   nchs, lane, vb, cb, defect); /* 8: planted stale row */
        if (b < nbs) { /* warp_row_dot_full's chunks of the shared row, in order */
            const mv_job &S = V.j[k];
            const int64_t ss = p2_sbase(S, h);
            mv_fmt_switch(S.fmt, [&](auto F) {
                constexpr int FMT = decltype(F)::value;
                constexpr int E2 = fmt_traits<FMT>::EPC;
#pragma unroll
                for (int g = 0; g < P2_G; g++) {
                    const int64_t ch = lane + 32 * ((int64_t)b * P2_G + g);
                    if (ch < nchs) {
                        float w[E2];
                        p2_decode<FMT>(S, h, ss, ch, va[g], w, p2_scale<FMT>(S, ss, ch));
                        p2_fma<FMT, ST, XT>(S.x, S.x_vec, ch, nchs, w, as);
                    }
                }
            });
        } else { /* down_routed_lean's chunks, ranks g0 .. */
            const int br = b - nbs, g0 = br / pr * P2_G;
            const int64_t ch = lane + 32 * (int64_t)(br % pr);
#pragma unroll
            for (int g = 0; g < P2_G; g++) {
                const mv_job &J = V.j[g0 + g < k ? g0 + g : 0];
                if (g0 + g < k && J.data && ch < nchr) {
                    float w[EPC];
                    p2_decode<DF>(J, h, p2_sbase(J, h), ch, va[g], w, ca[g]);
                    p2_fma<DF, ST, XT>(J.x, J.x_vec, ch, nchr, w, acc[g]);
                }
            }
            if (br % pr == pr - 1) { /* the group's ranks done: xor trees, weighted, added in rank order */
#pragma unroll
                for (int g = 0; g < P2_G; g++) {
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) acc[g] += __shfl_xor_sync(0xFFFFFFFFu, acc[g], off);
                    if (g0 + g < k && V.j[g0 + g].data) o = fadd(o, fmul(V.w[g0 + g], acc[g]));
                    acc[g] = 0.0f;
                }
            }
        }
        if (b2 == 0) { /* output h done: the shared row's xor tree, then moe_down_lean_kernel's combine */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) as += __shfl_xor_sync(0xFFFFFFFFu, as, off);
            if (lane == 0) {
                const float y = fadd(o, fmul(gate, as));
                float *dst = out + i * H + h;
                *dst = add ? fadd(*dst, y) : y;
            }
            as = 0.0f, o = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < P2_G; g++) va[g] = vb[g], ca[g] = cb[g];
        h = h2, b = b2;
    }
}

/* ---- launches ---- */

/* blocks per row: resident blocks an SM (the caller's cache: one per kernel) times the SMs, shared
 * by the n rows, at most what the items need */
template <class K> static int p2_blocks(K kernel, int &resident, size_t smem, int sms, int64_t n, int64_t items,
                                        int max_blocks) {
    /* asked once per kernel (not a stream operation: fine in a capture) */
    if (!resident && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, P2_WARPS * 32, smem) ||
                      resident < 1))
        resident = 2;
    int64_t b = (int64_t)sms * resident / n;
    const int64_t need = (items + P2_WARPS - 1) / P2_WARPS;
    if (b > need) b = need;
    if (max_blocks > 0 && b > max_blocks) b = max_blocks;
    return (int)(b < 1 ? 1 : b);
}

template <int GF, bool XT>
static cudaError_t p2_gate_up(cudaStream_t stream, int pdl, int sms, int64_t n, int k, int32_t *slots,
                              const moe_expert *experts, const moe_expert &shared, int64_t I, int64_t Is, int64_t W,
                              int64_t H, const float *x, float *act, int64_t xs_off, size_t smem, int defect,
                              int max_blocks, const p2_route &rt, int l2pf) {
    static int resident = 0, resident_rt = 0; /* per instantiation and smem size: per kernel */
    const int64_t probs_off = (int64_t)(smem / sizeof(float)); /* the routing's probabilities after the staged x */
    if (rt.scores) smem += (size_t)rt.E * sizeof(float);
    const dim3 g((unsigned)p2_blocks(gate_up_p2_kernel<GF, XT>, rt.scores ? resident_rt : resident, smem, sms, n,
                                     (int64_t)k * I + Is, max_blocks),
                 (unsigned)n);
    return dr_launch(pdl, gate_up_p2_kernel<GF, XT>, g, P2_WARPS * 32, smem, stream, n, k, slots, experts, shared,
                     (int)I, (int)Is, W, H, x, act, xs_off, defect, rt, probs_off, l2pf);
}

template <int DF, bool XT, bool ST>
static cudaError_t p2_down_st(cudaStream_t stream, int pdl, int sms, int64_t n, int k, const int32_t *slots,
                              const float *wsel, const float *sg, const moe_expert *experts, const moe_expert &shared,
                              int64_t I, int64_t W, int64_t H, const float *act, float *out, int add, int defect,
                              int max_blocks, size_t smem) {
    static int resident = 0; /* per instantiation: per kernel */
    const dim3 g((unsigned)p2_blocks(moe_down_p2_kernel<DF, XT, ST>, resident, smem, sms, n, H, max_blocks), (unsigned)n);
    return dr_launch(pdl, moe_down_p2_kernel<DF, XT, ST>, g, P2_WARPS * 32, smem, stream, n, k, slots, wsel, sg,
                     experts, shared, I, W, H, act, out, add, defect);
}

/* the act rows staged (ST) when they fit beside the views (DRAMA_CUDA_MOE_DOWN_STAGE=0: never) */
template <int DF, bool XT>
static cudaError_t p2_down(cudaStream_t stream, int pdl, int sms, int64_t n, int k, const int32_t *slots,
                           const float *wsel, const float *sg, const moe_expert *experts, const moe_expert &shared,
                           int64_t I, int64_t W, int64_t H, const float *act, float *out, int add, int defect,
                           int max_blocks, int stage) {
    const size_t smem = (size_t)(k + 1) * (size_t)W * sizeof(float);
    if (stage && smem <= P2_SMEM_MAX)
        return p2_down_st<DF, XT, true>(stream, pdl, sms, n, k, slots, wsel, sg, experts, shared, I, W, H, act, out,
                                        add, defect, max_blocks, smem);
    return p2_down_st<DF, XT, false>(stream, pdl, sms, n, k, slots, wsel, sg, experts, shared, I, W, H, act, out, add,
                                     defect, max_blocks, 0);
}

/* host-side format switch: fn(std::integral_constant<int, FMT>()) */
template <class Fn> static cudaError_t p2_fmt_host(int fmt, Fn &&fn) {
    switch (fmt) {
    case MV_F32: return fn(std::integral_constant<int, MV_F32>());
    case MV_F16: return fn(std::integral_constant<int, MV_F16>());
    case MV_BF16: return fn(std::integral_constant<int, MV_BF16>());
    case MV_FP8_BLOCK: return fn(std::integral_constant<int, MV_FP8_BLOCK>());
    case MV_FP8_TENSOR: return fn(std::integral_constant<int, MV_FP8_TENSOR>());
    case MV_NVFP4: return fn(std::integral_constant<int, MV_NVFP4>());
    case MV_AFF4: return fn(std::integral_constant<int, MV_AFF4>());
    case MV_AFF8: return fn(std::integral_constant<int, MV_AFF8>());
    default: return cudaErrorInvalidValue;
    }
}


cudaError_t moe_persist2_launch(cudaStream_t stream, int routed_fmt, int gu_fmt, int64_t n, int k, int32_t *slots,
                                const float *wsel, const float *sg, const moe_expert *experts,
                                const moe_expert &shared, int64_t I, int64_t Is, int64_t W, int64_t H, const float *x,
                                float *act, float *out, int add, int defect, int xt, int max_blocks, int pdl, int sms,
                                int stage, const p2_route &rt, int l2pf) {
    static_assert(ROUTE_THREADS == P2_WARPS * 32, "the gate/up kernel routes with the routing kernel's block size");
    if (k > MOE_MAX_TOPK || k * I + Is >= ((int64_t)1 << 31)) return cudaErrorInvalidValue;
    const int64_t one = xt_floats<32>(H);
    const int64_t xs_off = moe_epc(gu_fmt) == moe_epc(shared.gate.fmt) ? 0 : one;
    const size_t smem = (size_t)(xs_off ? 2 : 1) * (size_t)one * sizeof(float);
    const bool XT = xt && smem <= P2_SMEM_MAX;
    cudaError_t e = p2_fmt_host(gu_fmt, [&](auto F) {
        constexpr int GF = decltype(F)::value;
        return XT ? p2_gate_up<GF, true>(stream, pdl, sms, n, k, slots, experts, shared, I, Is, W, H, x, act, xs_off,
                                         smem, defect, max_blocks, rt, l2pf)
                  : p2_gate_up<GF, false>(stream, pdl, sms, n, k, slots, experts, shared, I, Is, W, H, x, act, 0, 0,
                                          defect, max_blocks, rt, l2pf);
    });
    if (e != cudaSuccess) return e;
    return p2_fmt_host(routed_fmt, [&](auto F) {
        constexpr int DF = decltype(F)::value;
        return XT ? p2_down<DF, true>(stream, pdl, sms, n, k, slots, wsel, sg, experts, shared, I, W, H, act, out, add,
                                      defect, max_blocks, stage)
                  : p2_down<DF, false>(stream, pdl, sms, n, k, slots, wsel, sg, experts, shared, I, W, H, act, out,
                                       add, defect, max_blocks, stage);
    });
}
