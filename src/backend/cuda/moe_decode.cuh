/* moe_decode.cuh - the MoE layer's expert launches for few rows (decode steps, n <= MOE_DECODE_MAX_N),
 * included by moe.cu after its structs. Same arithmetic as gate_up_kernel / moe_down_kernel, bit for
 * bit (every row's lane chains, xor tree and the combine order are unchanged); what differs is how
 * much is in flight: the gate and up rows of an output are loaded together, the down rows of all
 * ranks of an output are loaded together by one warp, and the shared expert's down rows run in
 * other warps of the same block. The old down kernel (a block of k + 1 warps per output, 128
 * registers each) held one block per SM: 41 us per layer on the H200 for 9 MB.
 *
 * Rows here have no ragged chunk (moe.cu takes this path only when H, I and Is are multiples of 32
 * values: whole chunks in every format), so only the full-chunk code is compiled. `defect` (the
 * contract's planted controls, dr_cuda_moe_plant_defect; 0 in production): 1 reads the up row of the
 * next output, 2 weights each rank with the next rank's routing weight (3: moe_down_lean.cuh), 4 (XT)
 * writes each SwiGLU value into the next chunk's place of the transposed layout.
 * XT (the context's DRAMA_CUDA_XT, default 1): the gate/up block stages its x row in shared memory in
 * matvec_kernel.cuh's chunk-transposed layout, and writes each SwiGLU row in that layout (for its
 * down format's chunk) straight to act, so the down kernels' __ldg reads of act are 32 consecutive
 * float4s a warp too: no bank conflicts, no extra traffic; the values and sums are unchanged. */
#ifndef DRAMA_BACKEND_CUDA_MOE_DECODE_CUH
#define DRAMA_BACKEND_CUDA_MOE_DECODE_CUH

#define MOE_DECODE_MAX_N 16
#define GU2_WARPS 8 /* outputs per gate/up block */
#define DN_OUT 4    /* outputs per down block: warps 0..3 the routed ranks, 4..7 the shared expert */
#define DN_G 8      /* routed ranks whose rows are in flight together */

/* warp_row_dot for a row of whole chunks (XT: x in the transposed layout) */
template <int FMT, bool XT>
__device__ __forceinline__ float warp_row_dot_full(const mv_job &W, int64_t row, const float *x, int lane) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    mv_job J = W;
    J.x = x;
    const uint8_t *wrow = J.data + row * J.pitch;
    const int64_t nch = J.cols / EPC;
    float acc[1] = {0.0f};
    for (int64_t base = lane; base < nch; base += 32 * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            if (base + 32 * k < nch) v[k] = ld_stream(wrow + (base + 32 * k) * 16);
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            if (base + 32 * k < nch) chunk_dot<FMT, 1, false, 0, false, XT>(J, row, base + 32 * k, v[k], 0, 1, acc);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xFFFFFFFFu, acc[0], off);
    return acc[0];
}

/* Rows ra of A and rb of B (one format and width, whole chunks) dotted with x by one warp, the
 * loads of both rows issued together; each sum is warp_row_dot's. XT: x staged transposed (shared). */
template <int FMT, bool XT>
__device__ __forceinline__ void warp_row_dot2(const mv_job &A, int64_t ra, const mv_job &B, int64_t rb, const float *x,
                                              int lane, float &ya, float &yb) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    mv_job JA = A, JB = B;
    JA.x = JB.x = x;
    const uint8_t *wa = JA.data + ra * JA.pitch, *wb = JB.data + rb * JB.pitch;
    const int64_t nch = JA.cols / EPC;
    float acc_a[1] = {0.0f}, acc_b[1] = {0.0f};
    for (int64_t base = lane; base < nch; base += 32 * UNROLL) {
        uint4 va[UNROLL], vb[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            if (base + 32 * k < nch) va[k] = ld_stream(wa + (base + 32 * k) * 16), vb[k] = ld_stream(wb + (base + 32 * k) * 16);
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            if (base + 32 * k < nch) {
                chunk_dot<FMT, 1, false, 0, XT, XT>(JA, ra, base + 32 * k, va[k], 0, 1, acc_a);
                chunk_dot<FMT, 1, false, 0, XT, XT>(JB, rb, base + 32 * k, vb[k], 0, 1, acc_b);
            }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        acc_a[0] += __shfl_xor_sync(0xFFFFFFFFu, acc_a[0], off);
        acc_b[0] += __shfl_xor_sync(0xFFFFFFFFu, acc_b[0], off);
    }
    ya = acc_a[0], yb = acc_b[0];
}

/* gate_up_kernel's jobs (mode 0), GU2_WARPS outputs per block, gate and up loaded together. XT: x
 * [H] staged transposed in dynamic shared memory (xt_floats<32>(H) floats), act written transposed. */
template <bool XT>
__global__ void __launch_bounds__(GU2_WARPS * 32, 2) /* <= 128 registers: two blocks per SM (XT took 142) */
gate_up_decode_kernel(int64_t n, int k, const int32_t *slots, const moe_expert *experts, moe_expert shared, int64_t I,
                      int64_t Is, int64_t W, int64_t H, const float *x, float *act, int defect) {
    extern __shared__ float4 gx4[];
    const int lane = threadIdx.x & 31;
    const int64_t jy = blockIdx.y, r = (int64_t)blockIdx.x * GU2_WARPS + (threadIdx.x >> 5);
    pdl_trigger();
    if (jy >= n * k && r < Is) { /* the shared expert's rows are constants (the routed ids are not yet) */
        pdl_prefetch_row(shared.gate.data + r * shared.gate.pitch, shared.gate.pitch, lane);
        pdl_prefetch_row(shared.up.data + (shared.up_row0 + r) * shared.up.pitch, shared.up.pitch, lane);
    }
    pdl_wait();
    const moe_expert *ex = &shared;
    int64_t row, width = I;
    if (jy < n * k) {
        int sl = slots[jy];
        if (sl < 0) return;
        ex = &experts[sl];
        row = jy / k;
    } else {
        row = jy - n * k;
        width = Is;
    }
    if (!XT && r >= width) return; /* whole warps: the shuffles stay full (XT: after the staging) */
    const int64_t ru = ex->up_row0 + r + (defect == 1 && r + 1 < width); /* planted: the next output's up row */
    float g = 0.0f, u = 0.0f;
    mv_fmt_switch(ex->gate.fmt, [&](auto F) {
        constexpr int FMT = decltype(F)::value;
        const float *xr = x + row * H;
        if constexpr (XT) { /* the whole block (one format per block) */
            constexpr int EPC = fmt_traits<FMT>::EPC;
            float *xs = reinterpret_cast<float *>(gx4);
            const int64_t nch = (H + EPC - 1) / EPC;
            for (int64_t i = threadIdx.x; i < H; i += blockDim.x) xs[xt_at<EPC>(i, nch)] = xr[i];
            __syncthreads();
            xr = xs;
        }
        if (r < width) warp_row_dot2<FMT, XT>(ex->gate, r, ex->up, ru, xr, lane, g, u);
    });
    if (r >= width || lane != 0) return;
    int64_t at = r; /* XT: where the down kernel's chunk_dot reads element r of the row */
    if constexpr (XT) {
        const int epc = moe_epc(ex->down.fmt), e = (int)(r % epc);
        const int64_t nchw = width / epc, ch = defect == 4 ? (r / epc + 1) % nchw : r / epc; /* planted: a chunk over */
        at = ((e >> 2) * nchw + ch) * 4 + (e & 3);
    }
    act[jy * W + at] = fmul(dsilu(g), u); /* dr_op_swiglu */
}

/* The routed ranks of output h for row i (format FMT, every routed down weight [H, I]), DN_G rows in
 * flight, each rank's dot times its routing weight added in rank order (dr_op_moe_combine's). */
template <int FMT, bool XT>
__device__ __forceinline__ float down_routed(const moe_expert *experts, const int32_t *sl, const float *ws, int k,
                                             int64_t h, int64_t I, const float *act, int64_t W, int lane, int defect) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const int64_t nch = I / EPC;
    float o = 0.0f;
    for (int q0 = 0; q0 < k; q0 += DN_G) {
        const mv_job *jq[DN_G];
        const uint8_t *wr[DN_G];
        float acc[DN_G][1];
#pragma unroll
        for (int g = 0; g < DN_G; g++) {
            int s = q0 + g < k ? sl[q0 + g] : -1;
            jq[g] = s >= 0 ? &experts[s].down : NULL;
            wr[g] = s >= 0 ? jq[g]->data + h * jq[g]->pitch : NULL;
            acc[g][0] = 0.0f;
        }
        for (int64_t ch = lane; ch < nch; ch += 32) {
            uint4 v[DN_G];
#pragma unroll
            for (int g = 0; g < DN_G; g++)
                if (wr[g]) v[g] = ld_stream(wr[g] + ch * 16);
#pragma unroll
            for (int g = 0; g < DN_G; g++)
                if (wr[g]) {
                    mv_job J = *jq[g];
                    J.x = act + (q0 + g) * W;
                    chunk_dot<FMT, 1, false, 0, false, XT>(J, h, ch, v[g], 0, 1, acc[g]);
                }
        }
#pragma unroll
        for (int g = 0; g < DN_G; g++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[g][0] += __shfl_xor_sync(0xFFFFFFFFu, acc[g][0], off);
            const int q = q0 + g;
            const int qw = defect == 2 ? (q + 1) % k : q; /* planted: the next rank's routing weight */
            if (wr[g]) o = fadd(o, fmul(ws[qw], acc[g][0]));
        }
    }
    return o;
}

/* Block (outputs h0 .. h0 + DN_OUT - 1, row i): warp w < DN_OUT the routed ranks of output h0 + w,
 * warp DN_OUT + w the shared expert's row of it; then moe_down_kernel's combine and residual add.
 * XT: act rows in the transposed layout (gate_up_decode_kernel<true> wrote them so). */
template <bool XT>
__global__ void __launch_bounds__(2 * DN_OUT * 32)
moe_down_decode_kernel(int64_t n, int k, int routed_fmt, const int32_t *slots, const float *wsel, const float *sg,
                       const moe_expert *experts, moe_expert shared, int64_t I, int64_t W, int64_t H, const float *act,
                       float *out, int add, int defect) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ float routed[DN_OUT], shared_y[DN_OUT];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t i = blockIdx.y, h = (int64_t)blockIdx.x * DN_OUT + (w % DN_OUT);
    if (h < H && w < DN_OUT) {
        float o = 0.0f;
        mv_fmt_switch(routed_fmt, [&](auto F) {
            o = down_routed<decltype(F)::value, XT>(experts, slots + i * k, wsel + i * k, k, h, I, act + i * k * W, W, lane,
                                                defect);
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

#include "backend/cuda/moe_down_lean.cuh"

/* The two expert launches (x staged as XT says) */
template <bool XT>
static cudaError_t moe_decode_launch_xt(cudaStream_t stream, int pdl, int routed_fmt, int64_t n, int k,
                                        const int32_t *slots, const float *wsel, const float *sg,
                                        const moe_expert *experts, const moe_expert &shared, int64_t I, int64_t Is,
                                        int64_t W, int64_t H, const float *x, float *act, float *out, int add,
                                        int defect, int lean) {
    int64_t wmax = I > Is ? I : Is;
    dim3 g1((unsigned)((wmax + GU2_WARPS - 1) / GU2_WARPS), (unsigned)(n * (k + 1)));
    const size_t smem = XT ? (size_t)xt_floats<32>(H) * sizeof(float) : 0;
    dr_launch(pdl, gate_up_decode_kernel<XT>, g1, GU2_WARPS * 32, smem, stream, n, k, slots, experts, shared, I, Is, W,
              H, x, act, defect);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dim3 g2((unsigned)((H + DN_OUT - 1) / DN_OUT), (unsigned)n);
    if (lean && defect == 3)
        dr_launch(pdl, moe_down_lean_kernel<3, XT>, g2, 2 * DN_OUT * 32, 0, stream, n, k, routed_fmt, slots, wsel, sg,
                  experts, shared, I, W, H, act, out, add, defect);
    else if (lean)
        dr_launch(pdl, moe_down_lean_kernel<0, XT>, g2, 2 * DN_OUT * 32, 0, stream, n, k, routed_fmt, slots, wsel, sg,
                  experts, shared, I, W, H, act, out, add, defect);
    else
        dr_launch(pdl, moe_down_decode_kernel<XT>, g2, 2 * DN_OUT * 32, 0, stream, n, k, routed_fmt, slots, wsel, sg,
                  experts, shared, I, W, H, act, out, add, defect);
    return cudaGetLastError();
}

/* The two expert launches for n <= MOE_DECODE_MAX_N rows; routed_fmt: the routed experts' one down
 * format (moe.cu checked it and the widths); lean: the down kernel at <= 128 registers; xt: the
 * transposed layouts (DRAMA_CUDA_XT; only while x [H] fits 48 KiB of shared memory); pdl: the
 * context's (pdl.cuh). */
static cudaError_t moe_decode_launch(cudaStream_t stream, int routed_fmt, int64_t n, int k, const int32_t *slots,
                                     const float *wsel, const float *sg, const moe_expert *experts,
                                     const moe_expert &shared, int64_t I, int64_t Is, int64_t W, int64_t H,
                                     const float *x, float *act, float *out, int add, int defect, int lean, int xt,
                                     int pdl) {
    if (xt && H <= MV1_MAX_COLS)
        return moe_decode_launch_xt<true>(stream, pdl, routed_fmt, n, k, slots, wsel, sg, experts, shared, I, Is, W, H,
                                          x, act, out, add, defect, lean);
    return moe_decode_launch_xt<false>(stream, pdl, routed_fmt, n, k, slots, wsel, sg, experts, shared, I, Is, W, H, x,
                                       act, out, add, defect, lean);
}

#endif
