/* moe_persist.cuh - the MoE decode path (n <= MOE_DECODE_MAX_N rows) with persistent warps, and the
 * routing kernel without its top-k rounds (issue 13). Included by moe.cu after moe_decode.cuh;
 * chosen by dr_cuda_moe_create unless DRAMA_CUDA_MOE_PERSIST=0 (then moe_route_kernel and
 * moe_decode.cuh's kernels run, as before; =2: this routing kernel with moe_persist2.cu's expert
 * kernels). Its routing kernel and moe.cu's share route_fail / route_softmax (below).
 *
 * Why: gate_up_decode_kernel (810 GB/s) and moe_down_lean_kernel (425 GB/s) run each block as one
 * serial chain (slots -> expert view -> x staging -> weight loads -> dot) in 2-3 waves; the down
 * rows are one 16-byte chunk per lane, so a lean warp had 4 loads in flight. Here the grid is sized
 * to the SMs (two 256-thread blocks each, <= 128 registers), every block serves one row i
 * (blockIdx.y), stages the row's expert views in shared memory once, and each warp walks work items
 * with the grid's stride, issuing the NEXT batch of loads (same item or the next one) before it dots
 * the current batch (bench/bench_cuda_gemv.cu's persistent layout, NCU-1: 1.3-1.6x on n = 1 products).
 *  - gate/up: items (rank q, output r), q < k the routed ranks (k I items), then the shared
 *    expert's Is outputs; a batch is MP_U chunks per lane of the gate row and of the up row. The
 *    first item's loads are issued before x is staged (XT).
 *  - down: items the outputs h; a batch is one chunk step of up to MP_G routed ranks (I = 512 FP8
 *    is one chunk per lane: the model's k = 8 ranks are two batches) or MP_G chunk steps of the
 *    shared row, so the next batch is in flight while one is dotted, and the next output's first
 *    batch while this output is combined.
 * Values: bit for bit moe_decode.cuh's (and so the per-row path's): each row's dot is the same
 * chunk_dot chain over the lane's chunks lane, lane + 32, ... in order, the same xor tree, the same
 * SwiGLU and act layout, the ranks weighted and added in rank order, then the shared expert, the
 * gate and the residual add as moe_down_lean_kernel; only the scheduling differs.
 * `defect` (the contract's planted controls, 0 in production): 2 as moe_decode.cuh (the next rank's
 * routing weight); 5: at an item change inside the gate/up walk, the next item's rows are loaded
 * through the current item's expert view (a stale view: the previous rank's rows); 6: at an item
 * change inside the down walk, the next output's routed rows are loaded at the current output's
 * row (a stale index). */
#ifndef DRAMA_BACKEND_CUDA_MOE_PERSIST_CUH
#define DRAMA_BACKEND_CUDA_MOE_PERSIST_CUH

#include "backend/cuda/moe_route.cuh"

#define MP_WARPS 8 /* warps per block, both expert kernels: two blocks per SM at <= 128 registers */
/* Batch sizes at <= 128 registers without spills (ptxas, sm_90): two batches in flight are 8 loads
 * of 16 bytes a lane (16 warps an SM: 64 KiB). gate/up MP_U 4 spilled 80-124 bytes, down MP_G 8
 * (all 8 ranks of an output in one batch) 140-268 bytes: the 32-value formats' decode needs the rest. */
#define MP_U 2 /* gate/up: chunks per lane of each of the two rows per batch */
#define MP_G 4 /* down: loads per lane per batch (routed ranks at one chunk step, or shared chunk steps) */
#define MP_SMEM_MAX (40 * 1024) /* the staged x (XT) next to ~6 KiB of views within 48 KiB */

/* element i of a row of nch chunks of epc values in the transposed layout (xt_at<EPC>, at run time) */
__device__ __forceinline__ int64_t mp_xt_at(int64_t i, int epc, int64_t nch) {
    const int64_t ch = i / epc;
    const int e = (int)(i - ch * epc);
    return ((e >> 2) * nch + ch) * 4 + (e & 3);
}

/* ---- gate / up / SwiGLU ---- */

/* the block's views: q < k rank q of row i (gate data NULL: no expert), q = k the shared expert */

__device__ __forceinline__ void mp_gu_item(int64_t t, int k, int64_t I, int64_t NR, int &q, int64_t &r) {
    if (t < NR) q = (int)(t / I), r = t - (int64_t)q * I;
    else q = k, r = t - NR;
}

/* batch b0 (chunks b0 + lane + 32 u, u < MP_U) of item (q, r)'s gate and up rows */
__device__ __forceinline__ void mp_gu_load(const mp_gu_views &V, int q, int64_t r, int64_t b0, int lane,
                                           uint4 (&vg)[MP_U], uint4 (&vu)[MP_U]) {
    const uint8_t *wg = V.g[q].data, *wu = V.u[q].data;
    if (!wg) return;
    wg += r * V.g[q].pitch, wu += (V.u0[q] + r) * V.u[q].pitch;
    const int64_t nch = V.nch[q];
#pragma unroll
    for (int u = 0; u < MP_U; u++) {
        const int64_t ch = b0 + lane + 32 * u;
        if (ch < nch) vg[u] = ld_stream(wg + ch * 16), vu[u] = ld_stream(wu + ch * 16);
    }
}

/* warp_row_dot2's chunk_dot calls for one batch */
template <bool XT>
__device__ __forceinline__ void mp_gu_dot(const mp_gu_views &V, int q, int64_t r, int64_t b0, int lane,
                                          const uint4 (&vg)[MP_U], const uint4 (&vu)[MP_U], float (&ag)[1],
                                          float (&au)[1]) {
    const int64_t nch = V.nch[q], ru = V.u0[q] + r;
    mv_fmt_switch(V.g[q].fmt, [&](auto F) {
        constexpr int FMT = decltype(F)::value;
#pragma unroll
        for (int u = 0; u < MP_U; u++) {
            const int64_t ch = b0 + lane + 32 * u;
            if (ch < nch) {
                chunk_dot<FMT, 1, false, 0, XT, XT>(V.g[q], r, ch, vg[u], 0, 1, ag);
                chunk_dot<FMT, 1, false, 0, XT, XT>(V.u[q], ru, ch, vu[u], 0, 1, au);
            }
        }
    });
}

/* gate_up_decode_kernel's act rows (mode 0 jobs: row i rank q at i k + q, the shared expert at n k + i).
 * XT: x [H] staged in dynamic shared memory in the routed gate format's layout (gu_fmt, every routed
 * expert's) and, when the shared expert's chunk differs, in its own at xs_off floats. */
template <bool XT>
__global__ void __launch_bounds__(MP_WARPS * 32, 2)
gate_up_persist_kernel(int64_t n, int k, int gu_fmt, const int32_t *slots, const moe_expert *experts,
                       moe_expert shared, int64_t I, int64_t Is, int64_t W, int64_t H, const float *x, float *act,
                       int64_t xs_off, int defect) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float4 gx4[];
    __shared__ mp_gu_views V;
    float *xs = reinterpret_cast<float *>(gx4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t i = blockIdx.y;
    const float *xr = x + i * H;
    if (threadIdx.x <= k) /* the views, once per block (the old kernel read one per block of 8 outputs) */
        mp_gu_view_fill(V, threadIdx.x, i, k, slots, experts, shared, XT ? xs + ((int)threadIdx.x < k ? 0 : xs_off) : xr);
    __syncthreads();
    const int64_t NR = (int64_t)k * I, N = NR + Is, stride = (int64_t)gridDim.x * MP_WARPS;
    int64_t t = (int64_t)blockIdx.x * MP_WARPS + warp, b0 = 0, r = 0;
    int q = 0;
    uint4 ga[MP_U], ua[MP_U], gb[MP_U], ub[MP_U];
    if (t < N) {
        mp_gu_item(t, k, I, NR, q, r);
        mp_gu_load(V, q, r, 0, lane, ga, ua); /* in flight during the staging */
    }
    if constexpr (XT) { /* matvec_kernel.cuh's transposed layout, per format chunk */
        const int er = moe_epc(gu_fmt), es = moe_epc(shared.gate.fmt);
        const int64_t nr = H / er, ns = H / es;
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
            const float v = xr[j];
            xs[mp_xt_at(j, er, nr)] = v;
            if (xs_off) xs[xs_off + mp_xt_at(j, es, ns)] = v;
        }
        __syncthreads();
    }
    float ag[1] = {0.0f}, au[1] = {0.0f};
    while (t < N) {
        int64_t t2 = t, nb = b0 + 32 * MP_U, r2 = r;
        int q2 = q;
        if (nb >= V.nch[q]) { /* this item's last batch: the next item's first one */
            t2 = t + stride, nb = 0;
            if (t2 < N) mp_gu_item(t2, k, I, NR, q2, r2);
        }
        if (t2 < N) {
            const int ql = defect == 5 && t2 < NR ? q : q2; /* planted: the current item's (stale) view */
            mp_gu_load(V, ql, r2, nb, lane, gb, ub);
        }
        const bool live = V.g[q].data != NULL;
        if (live) mp_gu_dot<XT>(V, q, r, b0, lane, ga, ua, ag, au);
        if (t2 != t) { /* item done: warp_row_dot2's xor tree, then gate_up_decode_kernel's store */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                ag[0] += __shfl_xor_sync(0xFFFFFFFFu, ag[0], off);
                au[0] += __shfl_xor_sync(0xFFFFFFFFu, au[0], off);
            }
            if (live && lane == 0) {
                const int64_t width = q < k ? I : Is, jy = q < k ? i * k + q : n * k + i;
                int64_t at = r; /* XT: where the down kernel's chunk_dot reads element r of the row */
                if constexpr (XT) {
                    const int epc = moe_epc(V.dfmt[q]), e = (int)(r % epc);
                    at = ((e >> 2) * (width / epc) + r / epc) * 4 + (e & 3);
                }
                act[jy * W + at] = fmul(dsilu(ag[0]), au[0]); /* dr_op_swiglu */
            }
            ag[0] = au[0] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MP_U; u++) ga[u] = gb[u], ua[u] = ub[u];
        t = t2, b0 = nb, q = q2, r = r2;
    }
}

/* ---- down + combine ---- */

/* the block's views: q < k rank q's down weight with its SwiGLU row as x (data NULL: no expert),
 * q = k the shared expert's; w[q] rank q's routing weight */
/* batch b of output h: b < nbr routed ranks g0 .. g0 + MP_G - 1 (g0 = b / pr * MP_G) at chunk step b % pr,
 * else shared chunk steps (b - nbr) MP_G + 0 .. MP_G - 1 */
__device__ __forceinline__ void mp_dn_load(const mp_dn_views &V, int k, int64_t h, int b, int nbr, int pr,
                                           int64_t nchr, int64_t nchs, int lane, uint4 (&v)[MP_G]) {
    if (b < nbr) {
        const int g0 = b / pr * MP_G;
        const int64_t ch = lane + 32 * (int64_t)(b % pr);
#pragma unroll
        for (int g = 0; g < MP_G; g++) {
            const int q = g0 + g;
            if (q < k && V.j[q].data && ch < nchr) v[g] = ld_stream(V.j[q].data + h * V.j[q].pitch + ch * 16);
        }
    } else {
        const uint8_t *ws = V.j[k].data + h * V.j[k].pitch;
        const int64_t c0 = (int64_t)(b - nbr) * MP_G;
#pragma unroll
        for (int g = 0; g < MP_G; g++) {
            const int64_t ch = lane + 32 * (c0 + g);
            if (ch < nchs) v[g] = ld_stream(ws + ch * 16);
        }
    }
}

/* moe_down_lean_kernel's out (XT: act rows transposed, as gate_up_persist_kernel<true> wrote them) */
template <bool XT>
__global__ void __launch_bounds__(MP_WARPS * 32, 2)
moe_down_persist_kernel(int64_t n, int k, int routed_fmt, const int32_t *slots, const float *wsel, const float *sg,
                        const moe_expert *experts, moe_expert shared, int64_t I, int64_t W, int64_t H,
                        const float *act, float *out, int add, int defect) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ mp_dn_views V;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t i = blockIdx.y;
    if (threadIdx.x <= k) mp_dn_view_fill(V, threadIdx.x, n, i, k, slots, wsel, experts, shared, act, W, defect);
    const float gate = dsigmoid(sg[i]);
    const int64_t nchr = I / moe_epc(routed_fmt), nchs = shared.down.cols / moe_epc(shared.down.fmt);
    const int pr = (int)((nchr + 31) / 32), nbr = (k + MP_G - 1) / MP_G * pr;
    const int nb_all = nbr + (int)(((nchs + 31) / 32 + MP_G - 1) / MP_G);
    __syncthreads();
    const int64_t stride = (int64_t)gridDim.x * MP_WARPS;
    int64_t h = (int64_t)blockIdx.x * MP_WARPS + warp;
    int b = 0;
    uint4 va[MP_G], vb[MP_G];
    if (h < H) mp_dn_load(V, k, h, 0, nbr, pr, nchr, nchs, lane, va);
    float acc[MP_G][1], as[1] = {0.0f}, o = 0.0f;
#pragma unroll
    for (int g = 0; g < MP_G; g++) acc[g][0] = 0.0f;
    while (h < H) {
        int64_t h2 = h;
        int b2 = b + 1;
        if (b2 == nb_all) h2 = h + stride, b2 = 0; /* the next output's first batch */
        if (h2 < H) mp_dn_load(V, k, defect == 6 && b2 < nbr ? h : h2, b2, nbr, pr, nchr, nchs, lane, vb); /* 6: planted stale row */
        if (b < nbr) { /* down_routed_lean's chunk_dot calls, ranks g0 .. */
            const int g0 = b / pr * MP_G;
            const int64_t ch = lane + 32 * (int64_t)(b % pr);
            mv_fmt_switch(routed_fmt, [&](auto F) {
                constexpr int FMT = decltype(F)::value;
#pragma unroll
                for (int g = 0; g < MP_G; g++)
                    if (g0 + g < k && V.j[g0 + g].data && ch < nchr)
                        chunk_dot<FMT, 1, false, 0, false, XT>(V.j[g0 + g], h, ch, va[g], 0, 1, acc[g]);
            });
            if (b % pr == pr - 1) { /* the group's ranks done: xor trees, weighted, added in rank order */
#pragma unroll
                for (int g = 0; g < MP_G; g++) {
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) acc[g][0] += __shfl_xor_sync(0xFFFFFFFFu, acc[g][0], off);
                    if (g0 + g < k && V.j[g0 + g].data) o = fadd(o, fmul(V.w[g0 + g], acc[g][0]));
                    acc[g][0] = 0.0f;
                }
            }
        } else { /* warp_row_dot_full's chunk_dot calls for the shared row */
            const int64_t c0 = (int64_t)(b - nbr) * MP_G;
            mv_fmt_switch(V.j[k].fmt, [&](auto F) {
                constexpr int FMT = decltype(F)::value;
#pragma unroll
                for (int g = 0; g < MP_G; g++) {
                    const int64_t ch = lane + 32 * (c0 + g);
                    if (ch < nchs) chunk_dot<FMT, 1, false, 0, false, XT>(V.j[k], h, ch, va[g], 0, 1, as);
                }
            });
        }
        if (b2 == 0) { /* output h done: the shared row's xor tree, then moe_down_lean_kernel's combine */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) as[0] += __shfl_xor_sync(0xFFFFFFFFu, as[0], off);
            if (lane == 0) {
                const float y = fadd(o, fmul(gate, as[0]));
                float *dst = out + i * H + h;
                *dst = add ? fadd(*dst, y) : y;
            }
            as[0] = 0.0f, o = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < MP_G; g++) va[g] = vb[g];
        h = h2, b = b2;
    }
}

/* ---- routing: moe_route_kernel's values with fewer barriers (moe_route.cuh's route_rank_row) ---- */

__global__ void __launch_bounds__(ROUTE_THREADS)
moe_route_rank_kernel(const float *scores, int E, int k, int norm_topk, const int32_t *slot, int32_t *ids,
                      int32_t *slots, float *wsel, int layer, dev_status *st, dr_op_status *rst) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float probs[]; /* [E] */
    __shared__ route_smem R;
    const int64_t r = blockIdx.x;
    if (!route_rank_row(scores + r * E, E, k, slot, probs, R)) {
        route_fail(r, k, ids, slots, wsel, layer, st, rst);
        return;
    }
    route_write(R, r, k, norm_topk, slot, ids, slots, wsel);
}

/* ---- launches ---- */

static int mp_epc_host(int fmt) {
    switch (fmt) {
    case MV_F32: return 4;
    case MV_F16: case MV_BF16: return 8;
    case MV_FP8_BLOCK: case MV_FP8_TENSOR: case MV_AFF8: return 16;
    default: return 32; /* MV_NVFP4, MV_AFF4 */
    }
}

/* the device's SM count, asked once (not a stream operation: fine in a capture) */
static int mp_sms(void) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
            sms = 132;
    }
    return sms;
}

static int mp_blocks_per_row(int64_t n, int64_t items, int max_blocks) {
    const int sms = mp_sms();
    int64_t b = (int64_t)sms * 2 / n; /* two resident blocks per SM, shared by the rows */
    const int64_t need = (items + MP_WARPS - 1) / MP_WARPS;
    if (b > need) b = need;
    if (max_blocks > 0 && b > max_blocks) b = max_blocks;
    return (int)(b < 1 ? 1 : b);
}

/* The two expert launches with persistent warps (moe_decode_launch's arguments; gu_fmt: the routed
 * experts' one gate/up format; max_blocks > 0: at most that many blocks per row, for the contract's
 * long walks). XT as moe_decode_launch, while the staged x fits MP_SMEM_MAX. */
static cudaError_t moe_persist_launch(cudaStream_t stream, int routed_fmt, int gu_fmt, int64_t n, int k,
                                      const int32_t *slots, const float *wsel, const float *sg,
                                      const moe_expert *experts, const moe_expert &shared, int64_t I, int64_t Is,
                                      int64_t W, int64_t H, const float *x, float *act, float *out, int add,
                                      int defect, int xt, int max_blocks, int pdl) {
    const int64_t one = xt_floats<32>(H);
    const int64_t xs_off = mp_epc_host(gu_fmt) == mp_epc_host(shared.gate.fmt) ? 0 : one;
    const size_t smem = (size_t)(xs_off ? 2 : 1) * (size_t)one * sizeof(float);
    const bool XT = xt && smem <= MP_SMEM_MAX;
    dim3 g1((unsigned)mp_blocks_per_row(n, (int64_t)k * I + Is, max_blocks), (unsigned)n);
    if (XT)
        dr_launch(pdl, gate_up_persist_kernel<true>, g1, MP_WARPS * 32, smem, stream, n, k, gu_fmt, slots, experts, shared,
                  I, Is, W, H, x, act, xs_off, defect);
    else
        dr_launch(pdl, gate_up_persist_kernel<false>, g1, MP_WARPS * 32, 0, stream, n, k, gu_fmt, slots, experts, shared,
                  I, Is, W, H, x, act, (int64_t)0, defect);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dim3 g2((unsigned)mp_blocks_per_row(n, H, max_blocks), (unsigned)n);
    if (XT)
        dr_launch(pdl, moe_down_persist_kernel<true>, g2, MP_WARPS * 32, 0, stream, n, k, routed_fmt, slots, wsel, sg,
                  experts, shared, I, W, H, (const float *)act, out, add, defect);
    else
        dr_launch(pdl, moe_down_persist_kernel<false>, g2, MP_WARPS * 32, 0, stream, n, k, routed_fmt, slots, wsel, sg,
                  experts, shared, I, W, H, (const float *)act, out, add, defect);
    return cudaGetLastError();
}

#endif
