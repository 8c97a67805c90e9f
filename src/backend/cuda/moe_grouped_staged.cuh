/* moe_grouped_staged.cuh - the grouped MoE expert kernels (moe_prefill.cu) with their activation rows
 * staged in shared memory and the weight rows streamed by warps that keep the next batch of loads in
 * flight (included by moe_prefill.cu after grp_select; taken when every routed expert has one format
 * per weight kind and H, I and Is are multiples of 32 values, as the decode kernels need, and a tile's
 * rows fit the shared memory; opt-in, DRAMA_CUDA_MOE_GROUPED=staged; the default is
 * moe_grouped_walk.cuh, =old the first kernels).
 *
 * Why (H200, bench/RESULTS.md "fifth pass"): the old kernels gave each warp one output row of one
 * expert, read the pairs' activation rows through L1 for every chunk (FP8: 64 bytes of x per 16 bytes
 * of weights per pair) and issued a warp's gate, then up, then (another kernel) down loads one row
 * after another: 0.3-0.5 TB/s, most of a cached voice's 69 ms of text-row prefill (30 rows x 8 ranks
 * reach ~155 experts x 3 MB per layer).
 *
 * Values: every pair's dot is rows_dot's (each lane's chunks in order, one fmaf chain per pair, the
 * same xor tree), only where x is read from (shared memory, chunk-transposed: matvec_kernel.cuh
 * xt_at) and when loads are issued differ, so the outputs are the old kernels' and the per-row
 * path's bit for bit (the contract's moe.* entries check grouped == per row).
 * group_defect (the contract's controls): 1 drops each expert's pairs after its first tile (as the
 * old gate/up kernel), 2 stages each tile's first down activation row from the tile's second pair. */
#ifndef DRAMA_BACKEND_CUDA_MOE_GROUPED_STAGED_CUH
#define DRAMA_BACKEND_CUDA_MOE_GROUPED_STAGED_CUH

#define GS_NT 4       /* pairs per tile (their rows staged together) */
#define GS_WARPS 8
#define GS_GU_ROWS 8  /* gate/up output rows per warp: 64 a block */
#define GS_DN_R 4     /* down rows a warp dots at once (one chunk each per lane for 8-bit rows of 512) */
#define GS_DN_ROWS 16 /* down rows per warp: 128 a block */
/* Each kernel is compiled per format (FMT: the format of the experts its blocks read; the routed
 * experts and the shared expert are two launches), so no run-time format switch holds registers. */
#define GS_SMEM_MAX (48 * 1024)

/* the tile's nt rows src[j] (cols values) into xs, row j at xs + j * cols, chunk-transposed */
template <int EPC>
__device__ __forceinline__ void gs_stage(float *xs, const float *const (&src)[GS_NT], int nt, int64_t cols) {
    const int64_t nch = cols / EPC;
    for (int j = 0; j < nt; j++)
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[j * cols + xt_at<EPC>(i, nch)] = src[j][i];
}

/* chunk ch of weight row `row` against the nt staged rows: chunk_dot_ptr's arithmetic */
template <int FMT>
__device__ __forceinline__ void gs_chunk(const mv_job &J, int64_t row, int64_t ch, uint4 v, const float *xs, int64_t cols,
                                         int nt, float (&acc)[GS_NT]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const int64_t nch = cols / EPC;
    float w[EPC];
    decode<FMT, false, 0>(J, row, ch * EPC, v, EPC, w);
#pragma unroll
    for (int j = 0; j < GS_NT; j++) {
        if (j < nt) {
            const float *xc = xs + j * cols + ch * 4; /* float4 q of the chunk at xc + q * nch * 4 */
#pragma unroll
            for (int e = 0; e < EPC; e += 4) {
                float4 xv = *reinterpret_cast<const float4 *>(xc + (e >> 2) * nch * 4);
                acc[j] = fmaf(w[e], xv.x, acc[j]);
                acc[j] = fmaf(w[e + 1], xv.y, acc[j]);
                acc[j] = fmaf(w[e + 2], xv.z, acc[j]);
                acc[j] = fmaf(w[e + 3], xv.w, acc[j]);
            }
        }
    }
}

__device__ __forceinline__ void gs_tree(float (&acc)[GS_NT]) {
#pragma unroll
    for (int j = 0; j < GS_NT; j++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(0xFFFFFFFFu, acc[j], off);
    }
}

/* pair j of the tile at t0 and its activation row index (x row for gate/up, the pair for down) */
__device__ __forceinline__ int64_t gs_pair(const grp_sel &s, const int32_t *pairs, int64_t n, int k, int64_t t) {
    return s.shared ? n * k + t : pairs[s.p0 + t];
}

/* The prologue both staged kernels share: the block's expert (blockIdx.y + u0x; false: the block
 * leaves) and its shared-memory tile buffer. */
__device__ __forceinline__ bool gs_begin(int64_t u0x, int64_t n, int64_t umax, const int32_t *used, const int32_t *ustart,
                                         const int32_t *ucount, const moe_expert *experts, const moe_expert *shared,
                                         int64_t I, int64_t Is, grp_sel *s, float **xs) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float4 gs4[];
    *xs = reinterpret_cast<float *>(gs4);
    return grp_select(blockIdx.y + u0x, umax, n, used, ustart, ucount, experts, shared, I, Is, s);
}

/* The tile at t0 (nt pairs): the pairs' act rows jy, and their activation rows (down: the pairs'
 * SwiGLU rows of act, W apart; else the pairs' x rows, H apart) staged chunk-transposed in xs, then
 * the block's barrier. Planted 2 (down): the tile's first row staged from its second pair. */
template <int EPC>
__device__ __forceinline__ void gs_tile(const grp_sel &s, const int32_t *pairs, int64_t n, int k, int64_t t0, int nt,
                                        bool down, int defect, const float *in, int64_t W, int64_t H, int64_t cols,
                                        float *xs, int64_t (&jy)[GS_NT]) {
    const float *src[GS_NT];
#pragma unroll
    for (int j = 0; j < GS_NT; j++) jy[j] = j < nt ? gs_pair(s, pairs, n, k, t0 + j) : 0;
#pragma unroll
    for (int j = 0; j < GS_NT; j++)
        src[j] = down ? in + (defect == 2 && j == 0 && nt > 1 ? jy[1] : jy[j]) * W
                      : in + (j < nt ? (s.shared ? t0 + j : jy[j] / k) : 0) * H;
    gs_stage<EPC>(xs, src, nt, cols);
    __syncthreads();
}

/* Block (64 output rows, u = blockIdx.y + u0): the gate and up rows of each output row of expert u
 * against the tile's staged x rows; warp w walks rows r0 + w, r0 + w + 8, ..., loading the next batch
 * (4 chunks per lane of gate and of up) before it dots the current one. */
template <int FMT>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
moe_gu_staged_kernel(int defect, int64_t u0x, int64_t n, int k, int64_t umax, const int32_t *used, const int32_t *ustart,
                     const int32_t *ucount, const int32_t *pairs, const moe_expert *experts, moe_expert shared, int64_t I,
                     int64_t Is, int64_t W, int64_t H, const float *x, float *act) {
    grp_sel s;
    float *xs;
    if (!gs_begin(u0x, n, umax, used, ustart, ucount, experts, &shared, I, Is, &s, &xs)) return;
    const int64_t rb = (int64_t)blockIdx.x * GS_WARPS * GS_GU_ROWS, re = min(rb + GS_WARPS * GS_GU_ROWS, s.width);
    if (rb >= s.width) return; /* the whole block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t cnt = defect == 1 ? min(s.cnt, (int64_t)GS_NT) : s.cnt; /* planted (contract): one tile per expert */
    const mv_job &G = s.ex->gate, &U = s.ex->up;
    const int64_t u0 = s.ex->up_row0;
    {
        constexpr int EPC = fmt_traits<FMT>::EPC;
        const int64_t nch = H / EPC;
        for (int64_t t0 = 0; t0 < cnt; t0 += GS_NT) {
            const int nt = (int)min((int64_t)GS_NT, s.cnt - t0);
            int64_t r = rb + warp;
            const bool live = r < re;
            uint4 ga[4], ua[4], gb[4], ub[4];
            if (live) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int64_t ch = lane + 32 * q;
                    if (ch < nch) ga[q] = ld_stream(G.data + r * G.pitch + ch * 16), ua[q] = ld_stream(U.data + (u0 + r) * U.pitch + ch * 16);
                }
            }
            int64_t jy[GS_NT];
            gs_tile<EPC>(s, pairs, n, k, t0, nt, false, defect, x, W, H, H, xs, jy);
            if (live) {
                float ag[GS_NT], au[GS_NT];
#pragma unroll
                for (int j = 0; j < GS_NT; j++) ag[j] = au[j] = 0.0f;
                for (int64_t base = lane;;) {
                    int64_t nb = base + 128, nr = r;
                    if (nb - lane >= nch) nb = lane, nr = r + GS_WARPS; /* warp-uniform: the row's last batch */
                    const bool more = nr < re;
                    if (more) {
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const int64_t ch = nb + 32 * q;
                            if (ch < nch)
                                gb[q] = ld_stream(G.data + nr * G.pitch + ch * 16),
                                ub[q] = ld_stream(U.data + (u0 + nr) * U.pitch + ch * 16);
                        }
                    }
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int64_t ch = base + 32 * q;
                        if (ch < nch) {
                            gs_chunk<FMT>(G, r, ch, ga[q], xs, H, nt, ag);
                            gs_chunk<FMT>(U, u0 + r, ch, ua[q], xs, H, nt, au);
                        }
                    }
                    if (nr != r) {
                        gs_tree(ag), gs_tree(au);
                        if (lane == 0) {
#pragma unroll
                            for (int j = 0; j < GS_NT; j++)
                                if (j < nt) act[jy[j] * W + r] = fmul(dsilu(ag[j]), au[j]); /* dr_op_swiglu */
                        }
#pragma unroll
                        for (int j = 0; j < GS_NT; j++) ag[j] = au[j] = 0.0f;
                    }
                    if (!more) break;
#pragma unroll
                    for (int q = 0; q < 4; q++) ga[q] = gb[q], ua[q] = ub[q];
                    r = nr, base = nb;
                }
            }
            __syncthreads(); /* xs is restaged by the next tile */
        }
    }
}

/* Block (128 output rows, u = blockIdx.y + u0x): the down rows of expert u against the tile's staged
 * SwiGLU rows; warp w takes rows h0 + 16 w .. + 15 in groups of GS_DN_R, each group's chunk batch (one
 * chunk per lane of each of its rows) loaded before the previous one is dotted. */
template <int FMT>
__global__ void __launch_bounds__(GS_WARPS * 32, 2)
moe_down_staged_kernel(int defect, int64_t u0x, int64_t n, int k, int64_t umax, const int32_t *used, const int32_t *ustart,
                       const int32_t *ucount, const int32_t *pairs, const moe_expert *experts, moe_expert shared,
                       int64_t I, int64_t Is, int64_t W, int64_t H, const float *act, float *ydn) {
    grp_sel s;
    float *xs;
    if (!gs_begin(u0x, n, umax, used, ustart, ucount, experts, &shared, I, Is, &s, &xs)) return;
    const int64_t hb = (int64_t)blockIdx.x * GS_WARPS * GS_DN_ROWS;
    if (hb >= H) return; /* the whole block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t h0 = hb + (int64_t)warp * GS_DN_ROWS, he = min(h0 + GS_DN_ROWS, H);
    const int64_t K = s.width; /* the down rows' width: I routed, Is shared */
    const mv_job &D = s.ex->down;
    {
        constexpr int EPC = fmt_traits<FMT>::EPC;
        const int64_t nch = K / EPC;
        for (int64_t t0 = 0; t0 < s.cnt; t0 += GS_NT) {
            const int nt = (int)min((int64_t)GS_NT, s.cnt - t0);
            int64_t h = h0;
            const bool live = h < he;
            uint4 va[GS_DN_R], vb[GS_DN_R];
            if (live) {
#pragma unroll
                for (int q = 0; q < GS_DN_R; q++)
                    if (h + q < he && lane < nch) va[q] = ld_stream(D.data + (h + q) * D.pitch + lane * 16);
            }
            int64_t jy[GS_NT];
            gs_tile<EPC>(s, pairs, n, k, t0, nt, true, defect, act, W, H, K, xs, jy); /* planted 2 inside */
            if (live) {
                float acc[GS_DN_R][GS_NT];
#pragma unroll
                for (int q = 0; q < GS_DN_R; q++)
#pragma unroll
                    for (int j = 0; j < GS_NT; j++) acc[q][j] = 0.0f;
                for (int64_t base = lane;;) {
                    int64_t nb = base + 32, nh = h;
                    if (nb - lane >= nch) nb = lane, nh = h + GS_DN_R; /* warp-uniform: the group's last batch */
                    const bool more = nh < he;
                    if (more) {
#pragma unroll
                        for (int q = 0; q < GS_DN_R; q++)
                            if (nh + q < he && nb < nch) vb[q] = ld_stream(D.data + (nh + q) * D.pitch + nb * 16);
                    }
                    if (base < nch) {
#pragma unroll
                        for (int q = 0; q < GS_DN_R; q++)
                            if (h + q < he) gs_chunk<FMT>(D, h + q, base, va[q], xs, K, nt, acc[q]);
                    }
                    if (nh != h) {
#pragma unroll
                        for (int q = 0; q < GS_DN_R; q++) {
                            gs_tree(acc[q]);
                            if (lane == 0 && h + q < he) {
#pragma unroll
                                for (int j = 0; j < GS_NT; j++)
                                    if (j < nt) ydn[jy[j] * H + h + q] = acc[q][j];
                            }
#pragma unroll
                            for (int j = 0; j < GS_NT; j++) acc[q][j] = 0.0f;
                        }
                    }
                    if (!more) break;
#pragma unroll
                    for (int q = 0; q < GS_DN_R; q++) va[q] = vb[q];
                    h = nh, base = nb;
                }
            }
            __syncthreads(); /* xs is restaged by the next tile */
        }
    }
}

/* shared memory of a staged launch: a tile of rows of `cols` values */
static size_t gs_smem(int64_t cols) { return (size_t)GS_NT * (size_t)cols * sizeof(float); }

/* The two launches of one kind for experts u0x .. u0x + nu - 1 (routed: 0 .. umax-1, shared: umax),
 * all of format fmt. */
struct gs_args {
    int defect;
    int64_t n;
    int k;
    int64_t umax;
    const int32_t *used, *ustart, *ucount, *pairs;
    const moe_expert *experts;
    moe_expert shared;
    int64_t I, Is, W, H;
    int pdl; /* the context's (pdl.cuh) */
};

template <int FMT>
static void gs_launch_fmt(const gs_args &a, bool down, int64_t u0x, int64_t nu, const float *in, float *out, cudaStream_t st) {
    const int64_t wmax = a.I > a.Is ? a.I : a.Is;
    if (!down) {
        dim3 g((unsigned)((wmax + GS_WARPS * GS_GU_ROWS - 1) / (GS_WARPS * GS_GU_ROWS)), (unsigned)nu);
        dr_launch(a.pdl, moe_gu_staged_kernel<FMT>, g, GS_WARPS * 32, gs_smem(a.H), st, a.defect, u0x, a.n, a.k, a.umax,
                  a.used, a.ustart, a.ucount, a.pairs, a.experts, a.shared, a.I, a.Is, a.W, a.H, in, out);
    } else {
        dim3 g((unsigned)((a.H + GS_WARPS * GS_DN_ROWS - 1) / (GS_WARPS * GS_DN_ROWS)), (unsigned)nu);
        dr_launch(a.pdl, moe_down_staged_kernel<FMT>, g, GS_WARPS * 32, gs_smem(wmax), st, a.defect, u0x, a.n, a.k,
                  a.umax, a.used, a.ustart, a.ucount, a.pairs, a.experts, a.shared, a.I, a.Is, a.W, a.H, in, out);
    }
}

static cudaError_t gs_launch(int fmt, const gs_args &a, bool down, int64_t u0x, int64_t nu, const float *in, float *out,
                             cudaStream_t st) {
    switch (fmt) {
    case MV_F32: gs_launch_fmt<MV_F32>(a, down, u0x, nu, in, out, st); break;
    case MV_F16: gs_launch_fmt<MV_F16>(a, down, u0x, nu, in, out, st); break;
    case MV_BF16: gs_launch_fmt<MV_BF16>(a, down, u0x, nu, in, out, st); break;
    case MV_FP8_BLOCK: gs_launch_fmt<MV_FP8_BLOCK>(a, down, u0x, nu, in, out, st); break;
    case MV_FP8_TENSOR: gs_launch_fmt<MV_FP8_TENSOR>(a, down, u0x, nu, in, out, st); break;
    case MV_NVFP4: gs_launch_fmt<MV_NVFP4>(a, down, u0x, nu, in, out, st); break;
    case MV_AFF4: gs_launch_fmt<MV_AFF4>(a, down, u0x, nu, in, out, st); break;
    case MV_AFF8: gs_launch_fmt<MV_AFF8>(a, down, u0x, nu, in, out, st); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

#endif
