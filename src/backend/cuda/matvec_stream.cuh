/* matvec_stream.cuh - the n = 1 product with its weight rows streamed through shared memory, a
 * variant of matvec1_kernel chosen by DRAMA_CUDA_MV1=async|bulk (default: off; docs/cuda.md "Not yet
 * run on a GPU"). Included by matvec_stream.cu (DEFECT = 0) and matvec_stream_defect.cu.
 *
 * Why: matvec1_kernel holds the bytes it has in flight in registers (two batches of 8 chunks per
 * lane), which bounds the blocks per SM and so the bytes in flight per SM (H200: 30-50% of the
 * copy rate, bench/RESULTS.md). Here a warp's row goes through a ring of MVS_STAGES slots of
 * MVS_SEG 16-byte chunks in shared memory: MVS_STAGES - 1 slots are in flight while the lanes dot
 * the current one, and the bytes in flight cost shared memory instead of registers.
 *   MVS_ASYNC: each lane copies its own chunks (cp.async, 16 bytes, L2 only: SASS LDGSTS) and waits
 *              for its own copy groups (cp.async.wait_group): a lane reads only what it copied, so
 *              no barrier is needed.
 *   MVS_BULK:  lane 0 copies the warp's whole segment in one bulk copy (the TMA unit: SASS UBLKCP)
 *              that completes on the slot's mbarrier; the lanes wait on the barrier's phase and
 *              meet at __syncwarp before lane 0 refills the slot they have just read.
 * Values: a block of MVS_WARPS warps, one row per warp; segment g holds chunks g MVS_SEG ..
 * (g + 1) MVS_SEG - 1 and lane l dots chunks l, l + 32, ... of it, so every lane still adds the
 * chunks l, l + 32, l + 64, ... of its row in order through the same chunk_dot, and the lanes meet
 * in the same xor tree: y is matvec1_kernel's bit for bit (the contract checks it). The fused norm,
 * `add`, `y2`, row ranges and batches are matvec1_kernel's too.
 * DEFECT (the contract's control): DR_CUDA_DEFECT_RING_SLOT dots the slot after the one waited for. */
#ifndef DRAMA_BACKEND_CUDA_MATVEC_STREAM_CUH
#define DRAMA_BACKEND_CUDA_MATVEC_STREAM_CUH

#include "backend/cuda/matvec_kernel.cuh"

#define MVS_WARPS 8                       /* rows per block; 256 threads, as mv1_norm needs */
#define MVS_STAGES 4                      /* ring slots per warp: 3 in flight while one is dotted */
#define MVS_CPL 2                         /* chunks per lane per slot */
#define MVS_SEG (32 * MVS_CPL)            /* chunks per slot: 1 KiB */
#define MVS_BAR_BYTES 256                 /* [MVS_WARPS][MVS_STAGES] mbarriers (8 bytes each), first */
#define MVS_RING_BYTES ((size_t)MVS_WARPS * MVS_STAGES * MVS_SEG * 16)
static_assert(MVS_WARPS * 32 >= 256, "mv1_norm sums over 256 threads");
static_assert(MVS_WARPS * MVS_STAGES * 8 <= MVS_BAR_BYTES, "mbarriers fit their space");

/* dynamic shared memory of a launch: barriers | ring | x [cols] (rounded up to whole chunks of 32: any
 * format's transposed staging fits) */
static inline size_t mvs_smem_bytes(int64_t cols) {
    return MVS_BAR_BYTES + MVS_RING_BYTES + (size_t)xt_floats<32>(cols) * 4;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint4 *dst, const uint8_t *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
/* the barriers' initialisation made visible to the bulk-copy unit */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* lane 0's arrival with the bytes the slot's copy will deliver, then the copy itself */
__device__ __forceinline__ void bulk_copy(void *dst, const uint8_t *src, unsigned bytes, uint64_t *bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
}

/* Segment g of the warp's row into its slot (lane 0 alone in MVS_BULK, every lane its chunks in
 * MVS_ASYNC; an MVS_ASYNC caller commits the group). */
template <int COPY>
__device__ __forceinline__ void mvs_issue(uint4 *slots, uint64_t *bars, const uint8_t *wrow, int64_t g, int64_t nch,
                                          int lane) {
    uint4 *slot = slots + (g % MVS_STAGES) * MVS_SEG;
    const int64_t c0 = g * MVS_SEG;
    if constexpr (COPY == MVS_ASYNC) {
#pragma unroll
        for (int k = 0; k < MVS_CPL; k++)
            if (c0 + lane + 32 * k < nch) cp_async16(slot + lane + 32 * k, wrow + (c0 + lane + 32 * k) * 16);
    } else if (lane == 0) { /* the row is padded to 16 bytes: whole chunks, 16-byte aligned */
        const int64_t left = nch - c0;
        bulk_copy(slot, wrow + c0 * 16, (unsigned)((left < MVS_SEG ? left : MVS_SEG) * 16), bars + g % MVS_STAGES);
    }
}

template <int FMT, int COPY, int DEFECT, bool XT>
__global__ void __launch_bounds__(MVS_WARPS * 32) matvec_stream_kernel(const __grid_constant__ mv_batch b) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    extern __shared__ uint4 smem4[];
    const mv_job &J = b.job[blockIdx.y];
    const int64_t row0 = J.r0 + (int64_t)blockIdx.x * MVS_WARPS;
    if (row0 >= J.r1 || J.n < 1) return; /* the whole block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row = row0 + warp;
    const bool live = row < J.r1; /* a dead warp still stages x and meets the barrier */
    const int64_t nfull = J.cols / EPC, nch = (J.cols + EPC - 1) / EPC;
    const int64_t nseg = (nch + MVS_SEG - 1) / MVS_SEG;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem4) + warp * MVS_STAGES;
    uint4 *slots = smem4 + MVS_BAR_BYTES / 16 + (size_t)warp * MVS_STAGES * MVS_SEG;
    float *xs = reinterpret_cast<float *>(smem4 + (MVS_BAR_BYTES + MVS_RING_BYTES) / 16);
    const uint8_t *wrow = J.data + (live ? row : row0) * J.pitch;
    if constexpr (COPY == MVS_BULK) {
        if (lane == 0) {
            for (int s = 0; s < MVS_STAGES; s++) mbar_init(bars + s);
            mbar_init_fence();
        }
        __syncwarp();
    }
    /* the first MVS_STAGES - 1 segments in flight before x is staged (one group each, empty or not) */
    for (int64_t g = 0; g < MVS_STAGES - 1; g++) {
        if (live && g < nseg) mvs_issue<COPY>(slots, bars, wrow, g, nch, lane);
        if constexpr (COPY == MVS_ASYNC) cp_async_commit();
    }
    mv1_stage<EPC, XT>(J, xs);
    if (J.norm) mv1_norm<DEFECT, EPC, XT>(J, xs); /* the norm fused into the staging (cuda_seam_ops.cu) */
    __syncthreads();
    if (!live) return;
    mv_job L = J;
    L.x = xs;
    L.x_vec = J.cols % 4 == 0;
    float acc[1] = {0.0f};
    for (int64_t g = 0; g < nseg; g++) {
        if constexpr (COPY == MVS_BULK) __syncwarp(); /* every lane is done with the slot refilled now */
        if (g + MVS_STAGES - 1 < nseg) mvs_issue<COPY>(slots, bars, wrow, g + MVS_STAGES - 1, nch, lane);
        if constexpr (COPY == MVS_ASYNC) {
            cp_async_commit();
            cp_async_wait<MVS_STAGES - 1>(); /* this lane's copies of segment g have landed */
        } else {
            mbar_wait(bars + g % MVS_STAGES, (unsigned)((g / MVS_STAGES) & 1)); /* the slot's (g / STAGES)-th fill */
        }
        const uint4 *slot = slots + ((g + (DEFECT == DR_CUDA_DEFECT_RING_SLOT)) % MVS_STAGES) * MVS_SEG; /* planted */
#pragma unroll
        for (int k = 0; k < MVS_CPL; k++) {
            const int64_t ch = g * MVS_SEG + lane + 32 * k;
            if (ch < nfull) chunk_dot<FMT, 1, false, DEFECT, true, XT>(L, row, ch, slot[lane + 32 * k], 0, 1, acc);
            else if (ch < nch) chunk_dot<FMT, 1, true, DEFECT, true, XT>(L, row, ch, slot[lane + 32 * k], 0, 1, acc);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xFFFFFFFFu, acc[0], off);
    if (lane == 0) {
        float *yp = J.y + (row - J.r0);
        *yp = J.add ? *yp + acc[0] : acc[0];
        if (J.y2) J.y2[row - J.r0] = J.y2[row - J.r0] + acc[0];
    }
}

/* Launches the variant for all jobs of b (n <= 1, cols <= MV1_MAX_COLS: dr_cuda_mvs_fits). */
template <int FMT, int COPY, int DEFECT> static cudaError_t mvs_launch(const mv_batch *b, cudaStream_t stream) {
    int64_t max_cols = 0;
    for (int i = 0; i < b->count; i++) max_cols = b->job[i].cols > max_cols ? b->job[i].cols : max_cols;
    dim3 grid((unsigned)((b->max_rows + MVS_WARPS - 1) / MVS_WARPS), (unsigned)b->count);
    if (b->xt) matvec_stream_kernel<FMT, COPY, DEFECT, true><<<grid, MVS_WARPS * 32, mvs_smem_bytes(max_cols), stream>>>(*b);
    else matvec_stream_kernel<FMT, COPY, DEFECT, false><<<grid, MVS_WARPS * 32, mvs_smem_bytes(max_cols), stream>>>(*b);
    return cudaGetLastError();
}

template <int FMT, int DEFECT> static cudaError_t mvs_launch_mode(int mode, const mv_batch *b, cudaStream_t stream) {
    if (mode == MVS_BULK) return mvs_launch<FMT, MVS_BULK, DEFECT>(b, stream);
    return mvs_launch<FMT, MVS_ASYNC, DEFECT>(b, stream);
}

/* Lets every instantiation of (FMT, DEFECT) take a launch's shared memory (above 48 KiB from about
 * 4000 columns on); called before any capture (dr_cuda_set_mv1). */
template <int FMT, int DEFECT> static cudaError_t mvs_optin() {
    const int bytes = (int)mvs_smem_bytes(MV1_MAX_COLS);
    const void *fn[4] = {(const void *)matvec_stream_kernel<FMT, MVS_ASYNC, DEFECT, true>,
                         (const void *)matvec_stream_kernel<FMT, MVS_BULK, DEFECT, true>,
                         (const void *)matvec_stream_kernel<FMT, MVS_ASYNC, DEFECT, false>,
                         (const void *)matvec_stream_kernel<FMT, MVS_BULK, DEFECT, false>};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
}

#endif
