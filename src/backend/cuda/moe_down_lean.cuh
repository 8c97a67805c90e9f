/* moe_down_lean.cuh - moe_down_decode_kernel (moe_decode.cuh) at <= 128 registers, chosen by
 * DRAMA_CUDA_MOE_DOWN=lean (default: off; docs/cuda.md "Not yet run on a GPU"). Included by moe.cu
 * after moe_decode.cuh.
 *
 * Why: the decode down kernel holds all 8 ranks' loads and weight views in registers (202 per
 * thread on the H200: one 256-thread block per SM), and ran slower than the kernel before it
 * (47.8 vs 41.3 us a layer). Here __launch_bounds__(256, 2) caps the registers at 128 (two blocks
 * per SM), DNL_G = 4 ranks are in flight per pass instead of 8, and each rank's weight view
 * (mv_job, its SwiGLU row as x) is read from shared memory, set once per block by k threads,
 * instead of being held in registers for every rank.
 * Values: the same blocks (DN_OUT outputs of one row; warps 0..3 the routed ranks, 4..7 the shared
 * expert), each rank's dot the same chunk_dot chain in the same lane order and xor tree, the ranks
 * weighted and added in rank order, then the same combine: out is the decode kernel's bit for bit
 * (the contract checks it against the grouped path, which equals the per-row one).
 * DEFECT 3 (the contract's control): rank q's chunks are dotted with rank q + 1's SwiGLU row, inside
 * the chunk loop. `defect` 2 (runtime, as in the decode kernel): the next rank's routing weight. */
#ifndef DRAMA_BACKEND_CUDA_MOE_DOWN_LEAN_CUH
#define DRAMA_BACKEND_CUDA_MOE_DOWN_LEAN_CUH

#define DNL_G 4 /* routed ranks whose rows are in flight together */

/* The routed ranks of output h (views sj[0 .. k-1], data NULL for an unused rank), DNL_G rows in
 * flight; down_routed's values. */
template <int FMT, int DEFECT, bool XT>
__device__ __forceinline__ float down_routed_lean(const mv_job *sj, const float *ws, int k, int64_t h, int64_t I,
                                                  int lane, int defect) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const int64_t nch = I / EPC;
    float o = 0.0f;
    for (int q0 = 0; q0 < k; q0 += DNL_G) {
        float acc[DNL_G][1];
#pragma unroll
        for (int g = 0; g < DNL_G; g++) acc[g][0] = 0.0f;
        for (int64_t ch = lane; ch < nch; ch += 32) {
            uint4 v[DNL_G];
#pragma unroll
            for (int g = 0; g < DNL_G; g++)
                if (q0 + g < k && sj[q0 + g].data) v[g] = ld_stream(sj[q0 + g].data + h * sj[q0 + g].pitch + ch * 16);
#pragma unroll
            for (int g = 0; g < DNL_G; g++)
                if (q0 + g < k && sj[q0 + g].data) {
                    if constexpr (DEFECT == 3) { /* planted: the next rank's SwiGLU row */
                        mv_job J = sj[q0 + g];
                        J.x = sj[(q0 + g + 1) % k].x;
                        chunk_dot<FMT, 1, false, 0, false, XT>(J, h, ch, v[g], 0, 1, acc[g]);
                    } else {
                        chunk_dot<FMT, 1, false, 0, false, XT>(sj[q0 + g], h, ch, v[g], 0, 1, acc[g]);
                    }
                }
        }
#pragma unroll
        for (int g = 0; g < DNL_G; g++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[g][0] += __shfl_xor_sync(0xFFFFFFFFu, acc[g][0], off);
            const int q = q0 + g;
            const int qw = defect == 2 ? (q + 1) % k : q; /* planted: the next rank's routing weight */
            if (q < k && sj[q].data) o = fadd(o, fmul(ws[qw], acc[g][0]));
        }
    }
    return o;
}

/* moe_down_decode_kernel's arguments and blocks (XT: act rows transposed, as there) */
template <int DEFECT, bool XT>
__global__ void __launch_bounds__(2 * DN_OUT * 32, 2)
moe_down_lean_kernel(int64_t n, int k, int routed_fmt, const int32_t *slots, const float *wsel, const float *sg,
                     const moe_expert *experts, moe_expert shared, int64_t I, int64_t W, int64_t H, const float *act,
                     float *out, int add, int defect) {
    __shared__ float routed[DN_OUT], shared_y[DN_OUT];
    __shared__ mv_job sj[MOE_MAX_TOPK];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t i = blockIdx.y, h = (int64_t)blockIdx.x * DN_OUT + (w % DN_OUT);
    pdl_trigger();
    if (h < H && w >= DN_OUT) /* the shared expert's down row is a constant (the routed slots are not yet) */
        pdl_prefetch_row(shared.down.data + h * shared.down.pitch, shared.down.pitch, lane);
    pdl_wait();
    if (threadIdx.x < k) { /* rank q's down weight and SwiGLU row, for every warp of the block */
        const int q = threadIdx.x, s = slots[i * k + q];
        mv_job J = experts[s >= 0 ? s : 0].down;
        if (s < 0) J.data = NULL;
        J.x = act + (i * k + q) * W;
        sj[q] = J;
    }
    __syncthreads();
    if (h < H && w < DN_OUT) {
        float o = 0.0f;
        mv_fmt_switch(routed_fmt, [&](auto F) {
            o = down_routed_lean<decltype(F)::value, DEFECT, XT>(sj, wsel + i * k, k, h, I, lane, defect);
        });
        if (lane == 0) routed[w] = o;
    } else if (h < H) {
        float y = 0.0f;
        mv_fmt_switch(shared.down.fmt, [&](auto F) {
            y = warp_row_dot_full<decltype(F)::value, XT>(shared.down, h, act + (n * k + i) * W, lane);
        });
        if (lane == 0) shared_y[w - DN_OUT] = y;
    }
    __syncthreads();
    const int64_t ho = (int64_t)blockIdx.x * DN_OUT + threadIdx.x;
    if (threadIdx.x < DN_OUT && ho < H) {
        float o = fadd(routed[threadIdx.x], fmul(dsigmoid(sg[i]), shared_y[threadIdx.x]));
        float *dst = out + i * H + ho;
        *dst = add ? fadd(*dst, o) : o;
    }
}

#endif
