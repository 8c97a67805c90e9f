/* matvec_kernel.cuh - the matvec kernel templates (design: matvec.cu), shared by matvec.cu (the
 * production instantiations, DEFECT = 0) and matvec_defect.cu (planted defects for `drama
 * contract`, cuda_contract.h). DEFECT is a template parameter, so with DEFECT = 0 every planted
 * branch is a compile-time constant false and the production kernel is unchanged. */
#ifndef DRAMA_BACKEND_CUDA_MATVEC_KERNEL_CUH
#define DRAMA_BACKEND_CUDA_MATVEC_KERNEL_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/pdl.cuh"

#define WARPS_PER_BLOCK 4
#define UNROLL 4

template <int FMT> struct fmt_traits;
template <> struct fmt_traits<MV_F32> { enum { EPC = 4 }; };
template <> struct fmt_traits<MV_F16> { enum { EPC = 8 }; };
template <> struct fmt_traits<MV_BF16> { enum { EPC = 8 }; };
template <> struct fmt_traits<MV_FP8_BLOCK> { enum { EPC = 16 }; };
template <> struct fmt_traits<MV_FP8_TENSOR> { enum { EPC = 16 }; };
template <> struct fmt_traits<MV_NVFP4> { enum { EPC = 32 }; };
template <> struct fmt_traits<MV_AFF4> { enum { EPC = 32 }; };
template <> struct fmt_traits<MV_AFF8> { enum { EPC = 16 }; };

/* 16 bytes through the read-only, no-L1-allocate path: W is streamed once per product. */
__device__ __forceinline__ uint4 ld_stream(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float load_scale(const uint8_t *base, int dt, int64_t i) {
    if (dt == MV_S_F32) return __ldg((const float *)base + i);
    unsigned short h = __ldg((const unsigned short *)base + i);
    if (dt == MV_S_BF16) return __uint_as_float((unsigned)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* Two E4M3 codes (low byte first) to floats; exact (every E4M3 value is an fp16), NaN kept. */
__device__ __forceinline__ float2 e4m3x2(unsigned short pair) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    return __half22float2(*reinterpret_cast<__half2 *>(&h));
}

__device__ __forceinline__ float e4m3(unsigned char code) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3);
    return __half2float(*reinterpret_cast<__half *>(&h));
}

/* E2M1 code (4 bits) to float, exact: sign to bit 15, exponent+mantissa to bits 9..11 of an
 * fp16 (bias 15 instead of 1, so the value is 2^-14 times too small; subnormal codes land on fp16
 * subnormals with the same factor), then times 2^14. */
__device__ __forceinline__ float e2m1(unsigned code) {
    unsigned short h = (unsigned short)(((code & 8u) << 12) | ((code & 7u) << 9));
    return __half2float(__ushort_as_half(h)) * 16384.0f;
}

/* Dequantises chunk ch (elements c0 .. c0+EPC-1 of row `row`) into w. TAIL: only the first `lim`
 * elements exist; the rest are set to 0 without touching their scales. */
/* Accumulation step of a planted fp16-accumulating variant (DEFECT only; identity otherwise). */
template <int DEFECT> __device__ __forceinline__ float keep(float a) {
    if constexpr (DEFECT == DR_CUDA_DEFECT_FP16_ACCUM) return __half2float(__float2half_rn(a));
    else return a;
}

template <int FMT, bool TAIL, int DEFECT>
__device__ __forceinline__ void decode(const mv_job &J, int64_t row, int64_t c0, uint4 v, int lim,
                                       float (&w)[fmt_traits<FMT>::EPC]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
    if constexpr (FMT == MV_F32) {
#pragma unroll
        for (int e = 0; e < 4; e++) w[e] = __uint_as_float(u[e]);
    } else if constexpr (FMT == MV_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = __uint_as_float(u[k] << 16);
            w[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
        }
    } else if constexpr (FMT == MV_F16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = __half2float(__ushort_as_half((unsigned short)(u[k] & 0xFFFFu)));
            w[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(u[k] >> 16)));
        }
    } else if constexpr (FMT == MV_FP8_TENSOR) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 a = e4m3x2((unsigned short)(u[k] & 0xFFFFu)), b = e4m3x2((unsigned short)(u[k] >> 16));
            w[4 * k] = a.x * J.global_scale;
            w[4 * k + 1] = a.y * J.global_scale;
            w[4 * k + 2] = b.x * J.global_scale;
            w[4 * k + 3] = b.y * J.global_scale;
        }
    } else if constexpr (FMT == MV_FP8_BLOCK) {
        const int64_t sbase = (row / J.block_rows) * J.scale_cols;
        const int64_t blk0 = c0 / J.block_cols;
        const int64_t bnext = DEFECT == DR_CUDA_DEFECT_NEXT_BLOCK_SCALE; /* planted: next block's scale */
        float q[16];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 a = e4m3x2((unsigned short)(u[k] & 0xFFFFu)), b = e4m3x2((unsigned short)(u[k] >> 16));
            q[4 * k] = a.x, q[4 * k + 1] = a.y, q[4 * k + 2] = b.x, q[4 * k + 3] = b.y;
        }
        if ((blk0 + 1) * J.block_cols >= c0 + lim) { /* the chunk lies in one scale block */
            float s = load_scale(J.scales, J.scale_dt, sbase + (blk0 + bnext) % J.scale_cols);
#pragma unroll
            for (int e = 0; e < 16; e++) w[e] = q[e] * s;
        } else { /* block_cols not a multiple of 16: a boundary inside the chunk */
#pragma unroll
            for (int e = 0; e < 16; e++)
                w[e] = (e < lim) ? q[e] * load_scale(J.scales, J.scale_dt,
                                                     sbase + ((c0 + e) / J.block_cols + bnext) % J.scale_cols)
                                 : 0.0f;
        }
    } else if constexpr (FMT == MV_NVFP4) {
        const unsigned char *srow = J.scales + row * J.scale_cols;
        const int64_t s0 = c0 / 16;
        float sa = e4m3((unsigned char)(__ldg(srow + s0) & 0x7F));
        float sb = (!TAIL || lim > 16) ? e4m3((unsigned char)(__ldg(srow + s0 + 1) & 0x7F)) : 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 8; b++) {
                int e = 8 * k + b;
                const int nib = DEFECT == DR_CUDA_DEFECT_NIBBLE_HIGH_FIRST ? (b ^ 1) : b; /* planted: high first */
                float v0 = e2m1((u[k] >> (4 * nib)) & 0xFu) * (e < 16 ? sa : sb);     /* exact */
                w[e] = v0 * J.global_scale;
            }
        }
    } else if constexpr (FMT == MV_AFF4 || FMT == MV_AFF8) {
        constexpr int BITS = FMT == MV_AFF4 ? 4 : 8;
        constexpr unsigned MASK = (1u << BITS) - 1u;
        constexpr int PER_WORD = 32 / BITS;
        int64_t g = c0 / J.group; /* the chunk lies in one group */
        if (DEFECT == DR_CUDA_DEFECT_PREV_GROUP && g > 0) g--; /* planted: the previous group's scale */
        const int64_t si = row * J.scale_cols + g;
        float s = load_scale(J.scales, J.scale_dt, si);
        float bias = load_scale(J.biases, J.scale_dt, si);
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < PER_WORD; b++) {
                float q = (float)((u[k] >> (BITS * b)) & MASK);
                w[PER_WORD * k + b] = __fadd_rn(__fmul_rn(s, q), bias); /* two roundings, as the spec */
            }
        }
    }
    if constexpr (TAIL) {
#pragma unroll
        for (int e = 0; e < EPC; e++)
            if (e >= lim) w[e] = 0.0f;
    }
}

/* x through the read-only cache, or (SX) from shared memory, where a block staged it */
template <bool SX> __device__ __forceinline__ float4 ldx4(const float *p) {
    if constexpr (SX) return *reinterpret_cast<const float4 *>(p);
    else return __ldg(reinterpret_cast<const float4 *>(p));
}
template <bool SX> __device__ __forceinline__ float ldx(const float *p) {
    if constexpr (SX) return *p;
    else return __ldg(p);
}

/* The chunk-transposed staging of x (XT, DRAMA_CUDA_XT=1, the default): float4 q of chunk ch (elements
 * ch*EPC + 4q .. +3) at float4 index q*nchp + ch (nchp: the row's chunks), so when the 32 lanes of a
 * warp dot chunks base .. base+31, each step q reads 32 consecutive float4s: no shared-memory bank
 * conflict (the plain layout puts lanes EPC*4 bytes apart: 2-, 4- or 8-way for 8, 16, 32 per chunk).
 * xt_at: the float index of element i (any i < cols; the layout holds nchp*EPC floats). */
template <int EPC> __device__ __forceinline__ int64_t xt_at(int64_t i, int64_t nchp) {
    const int64_t ch = i / EPC;
    const int e = (int)(i - ch * EPC);
    return ((e >> 2) * nchp + ch) * 4 + (e & 3);
}
/* where staged element i lives: xt_at, or i itself in the plain layout */
template <int EPC, bool XT> __device__ __forceinline__ int64_t xs_at(int64_t i, int64_t nchp) {
    if constexpr (XT) return xt_at<EPC>(i, nchp);
    else return i;
}
/* floats a staged row of cols takes (the transposed layout rounds up to whole chunks) */
template <int EPC> __host__ __device__ __forceinline__ int64_t xt_floats(int64_t cols) {
    return (cols + EPC - 1) / EPC * EPC;
}

/* XT: J.x is the row in the transposed layout (NT = 1, t0 = 0; staged in shared memory with SX, or so
 * written in global memory by its producer, 16-byte aligned: any full chunk is read as float4s,
 * whatever x_vec says); the values and the fmaf order are the plain layout's. */
template <int FMT, int NT, bool TAIL, int DEFECT, bool SX = false, bool XT = false>
__device__ __forceinline__ void chunk_dot(const mv_job &J, int64_t row, int64_t ch, uint4 v, int64_t t0, int nt,
                                          float (&acc)[NT]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    static_assert(!XT || NT == 1, "the transposed layout holds one activation row");
    const int64_t c0 = ch * EPC;
    const int lim = TAIL ? (int)(J.cols - c0) : EPC;
    float w[EPC];
    decode<FMT, TAIL, DEFECT>(J, row, c0, v, lim, w);
    if constexpr (XT) {
        const int64_t nchp = (J.cols + EPC - 1) / EPC;
        const int64_t cx = DEFECT == DR_CUDA_DEFECT_XT_SHIFT ? (ch + 1) % nchp : ch; /* planted: the next chunk's x */
        const float *xc = J.x + cx * 4; /* float4 q of the chunk at xc + q * nchp * 4 */
        if (!TAIL) {
#pragma unroll
            for (int e = 0; e < EPC; e += 4) {
                float4 xv = ldx4<SX>(xc + (e >> 2) * nchp * 4);
                acc[0] = keep<DEFECT>(fmaf(w[e], xv.x, acc[0]));
                acc[0] = keep<DEFECT>(fmaf(w[e + 1], xv.y, acc[0]));
                acc[0] = keep<DEFECT>(fmaf(w[e + 2], xv.z, acc[0]));
                acc[0] = keep<DEFECT>(fmaf(w[e + 3], xv.w, acc[0]));
            }
        } else {
#pragma unroll
            for (int e = 0; e < EPC; e++)
                if (e < lim) acc[0] = keep<DEFECT>(fmaf(w[e], ldx<SX>(xc + (e >> 2) * nchp * 4 + (e & 3)), acc[0]));
        }
    } else {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if (j < nt) {
                const float *xr = J.x + (t0 + j) * J.cols + c0;
                if (!TAIL && J.x_vec) {
#pragma unroll
                    for (int e = 0; e < EPC; e += 4) {
                        float4 xv = ldx4<SX>(xr + e);
                        acc[j] = keep<DEFECT>(fmaf(w[e], xv.x, acc[j]));
                        acc[j] = keep<DEFECT>(fmaf(w[e + 1], xv.y, acc[j]));
                        acc[j] = keep<DEFECT>(fmaf(w[e + 2], xv.z, acc[j]));
                        acc[j] = keep<DEFECT>(fmaf(w[e + 3], xv.w, acc[j]));
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < EPC; e++)
                        if (e < lim) acc[j] = keep<DEFECT>(fmaf(w[e], ldx<SX>(xr + e), acc[j]));
                }
            }
        }
    }
}

template <int FMT, int NT, int DEFECT>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * 32) matvec_kernel(const __grid_constant__ mv_batch b) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const mv_job &J = b.job[blockIdx.y];
    const int lane = threadIdx.x & 31;
    const int64_t row = J.r0 + (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    pdl_enter(); /* no preamble: any before the wait (loads, an L2 prefetch) made ptxas spill */
    if (row >= J.r1) return; /* whole warps leave together: the shuffles below stay full */
    const uint8_t *wrow = J.data + row * J.pitch;
    const int64_t nfull = J.cols / EPC;            /* chunks without a ragged end */
    const int64_t nch = (J.cols + EPC - 1) / EPC;  /* all chunks */
    const int64_t ystride = J.y_ld ? J.y_ld : J.r1 - J.r0;

    /* planted TILE_TAIL: the activation rows of a last partial tile are never computed */
    const int64_t nrun = (DEFECT == DR_CUDA_DEFECT_TILE_TAIL && J.n > NT) ? J.n / NT * NT : J.n;
    for (int64_t t0 = 0; t0 < nrun; t0 += NT) {
        const int nt = (int)min((int64_t)NT, J.n - t0);
        float acc[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j] = 0.0f;
        /* same chunk order per lane as a plain `for (ch = lane; ch < nch; ch += 32)` */
        for (int64_t base = lane; base < nch; base += 32 * UNROLL) {
            uint4 v[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                int64_t ch = base + 32 * k;
                if (ch < nch) v[k] = ld_stream(wrow + ch * 16);
            }
#pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                int64_t ch = base + 32 * k;
                if (ch < nfull)
                    chunk_dot<FMT, NT, false, DEFECT>(J, row, ch, v[k], t0, nt, acc);
                else if (ch < nch && DEFECT != DR_CUDA_DEFECT_DROP_TAIL_CHUNK) /* planted: tail skipped */
                    chunk_dot<FMT, NT, true, DEFECT>(J, row, ch, v[k], t0, nt, acc);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int off = 16; off > (DEFECT == DR_CUDA_DEFECT_SHUFFLE_LEVEL ? 1 : 0); off >>= 1) /* planted */
                acc[j] = keep<DEFECT>(acc[j] + __shfl_xor_sync(0xFFFFFFFFu, acc[j], off));
        }
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < NT; j++)
                if (j < nt) {
                    int64_t off = (t0 + j) * ystride + (row - J.r0);
                    J.y[off] = J.add ? J.y[off] + acc[j] : acc[j]; /* add: the residual stream, one fp32 add */
                    if (J.y2) J.y2[off] = J.y2[off] + acc[j];
                }
        }
    }
}

/* n = 1 (a decode step): blocks of 8 or 16 warps (blockDim) that stay resident (persistent): job
 * J's J.pblocks blocks cover its rows with a stride of pblocks x warps, so each warp walks rows
 * row0 + warp, + stride, ... and issues the NEXT batch of MV1_UNROLL chunks per lane (the rest of its
 * row, or the first batch of its next row) before it dots the current one: the weight stream never
 * waits on a row's end, a block's start or the x staging (staged once per block, after the first
 * loads are issued). H200, bench/bench_cuda_gemv.cu: [8192, 2048] BF16 13.9 -> 10.7 us, the frame's
 * dense products 2712 -> 2371 us. Each row's sum is matvec_kernel's: lane l still adds chunks l,
 * l + 32, ... in order through the same fmaf chain and xor tree (only the loads issued ahead
 * differ), so results are bit-identical to the general kernel and to one row per warp
 * (pblocks = ceil(rows / warps): DRAMA_CUDA_MV1_PERSIST=0). */
#define MV1_UNROLL 8
#define MV1_MAX_WARPS 16
/* x [cols] fp32 plus the kernel's static shared memory (~1 KiB) within the 48 KiB a launch gets
 * without opt-in (at 12288 columns the launch failed on the H200: invalid argument) */
#define MV1_MAX_COLS 11776

template <int FMT, int DEFECT, bool XT>
__device__ __forceinline__ void mv1_batch(const mv_job &L, int64_t row, int64_t base, int64_t nfull, int64_t nch,
                                          const uint4 (&v)[MV1_UNROLL], float (&acc)[1]) {
#pragma unroll
    for (int k = 0; k < MV1_UNROLL; k++) {
        int64_t ch = base + 32 * k;
        if (ch < nfull)
            chunk_dot<FMT, 1, false, DEFECT, true, XT>(L, row, ch, v[k], 0, 1, acc);
        else if (ch < nch && DEFECT != DR_CUDA_DEFECT_DROP_TAIL_CHUNK) /* planted: tail skipped */
            chunk_dot<FMT, 1, true, DEFECT, true, XT>(L, row, ch, v[k], 0, 1, acc);
    }
}

__device__ __forceinline__ void mv1_load(const uint8_t *wrow, int64_t base, int64_t nch, uint4 (&v)[MV1_UNROLL]) {
#pragma unroll
    for (int k = 0; k < MV1_UNROLL; k++) {
        int64_t ch = base + 32 * k;
        if (ch < nch) v[k] = ld_stream(wrow + ch * 16);
    }
}

/* x [cols] staged in xs, element i at xs_at<EPC, XT>(i, nch) (all threads of the block; a barrier
 * must follow before anyone reads it) */
template <int EPC, bool XT> __device__ __forceinline__ void mv1_stage(const mv_job &J, float *xs) {
    const int64_t nch = (J.cols + EPC - 1) / EPC;
    for (int64_t i = threadIdx.x; i < J.cols; i += blockDim.x) xs[xs_at<EPC, XT>(i, nch)] = J.x[i];
}

/* xs [cols] (staged x) <- rms_norm(xs, J.norm_w, J.norm_eps), the whole block: the sum of squares in
 * rms_norm_kernel's order (256 threads, i = t, t + 256, ..., each warp's xor tree, then the 8 warp
 * sums' tree), r rounded once, two fp32 products: dr_cuda_rms_norm's values bit for bit. Block 0 of
 * the job writes them to J.norm_y too. Element i is read and written at xs_at (the staging's layout). */
template <int DEFECT, int EPC, bool XT> __device__ __forceinline__ void mv1_norm(const mv_job &J, float *xs) {
    __shared__ double sh[8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* xs staged */
    const int64_t nch = (J.cols + EPC - 1) / EPC;
    double ss = 0.0;
    if (threadIdx.x < 256)
        for (int64_t i = threadIdx.x; i < J.cols; i += 256) {
            const int64_t k = xs_at<EPC, XT>(i, nch);
            ss += (double)xs[k] * (double)xs[k];
        }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
    if (lane == 0 && warp < 8) sh[warp] = ss;
    __syncthreads();
    double t = lane < 8 ? sh[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, off);
    const float r = (float)(1.0 / sqrt(t / (double)J.cols + J.norm_eps));
    const float *w = DEFECT == DR_CUDA_DEFECT_NORM_NO_WEIGHT ? NULL : J.norm_w; /* planted: weight skipped */
    const bool out = J.norm_y && blockIdx.x == 0;
    for (int64_t i = threadIdx.x; i < J.cols; i += blockDim.x) {
        float *p = xs + xs_at<EPC, XT>(i, nch);
        float v = w ? __fmul_rn(__fmul_rn(*p, r), __ldg(w + i)) : __fmul_rn(*p, r);
        *p = v;
        if (out) J.norm_y[i] = v;
    }
}

template <int FMT, int DEFECT, bool XT>
__global__ void __launch_bounds__(MV1_MAX_WARPS * 32) matvec1_kernel(const __grid_constant__ mv_batch b) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    extern __shared__ float4 xs4[]; /* [xt_floats(cols)] floats */
    float *xs = reinterpret_cast<float *>(xs4);
    const mv_job &J = b.job[blockIdx.y];
    const int wpb = blockDim.x >> 5;
    const int64_t row0 = J.r0 + (int64_t)blockIdx.x * wpb;
    pdl_trigger();
    if ((int)blockIdx.x >= J.pblocks || row0 >= J.r1 || J.n < 1) return; /* the whole block */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t stride = (int64_t)J.pblocks * wpb;
    int64_t row = row0 + warp;
    const bool live = row < J.r1; /* a dead warp still stages x and meets the barrier */
    const int64_t nfull = J.cols / EPC, nch = (J.cols + EPC - 1) / EPC;
    uint4 va[MV1_UNROLL], vb[MV1_UNROLL];
    if (live) mv1_load(J.data + row * J.pitch, lane, nch, va);
    if (b.l2pf > 0 && threadIdx.x == 0) { /* this block's part of the job's first rows: constants, before the wait */
        const int64_t bytes = (J.r1 - J.r0) * J.pitch, cap = b.l2pf / b.count;
        l2_prefetch_part(J.data + J.r0 * J.pitch, bytes < cap ? bytes : cap, blockIdx.x, J.pblocks);
    }
    if (DEFECT != DR_CUDA_DEFECT_PDL_EARLY_X) pdl_wait(); /* the first batch is in flight; x after */
    mv1_stage<EPC, XT>(J, xs);
    if (DEFECT == DR_CUDA_DEFECT_PDL_EARLY_X) pdl_wait(); /* planted: x read before the wait */
    if (J.norm) mv1_norm<DEFECT, EPC, XT>(J, xs); /* the norm fused into the staging (cuda_seam_ops.cu) */
    __syncthreads();
    if (!live) return;
    mv_job L = J;
    L.x = xs;
    L.x_vec = J.cols % 4 == 0;
    float acc[1] = {0.0f};
    for (int64_t base = lane;;) {
        int64_t nb = base + 32 * MV1_UNROLL, nrow = row;
        /* this row's last batch (decided on the warp's first chunk, so all lanes agree: the xor tree
         * below needs the whole warp): the next row's first */
        if (nb - lane >= nch) nb = lane, nrow = row + stride;
        const bool more = nrow < J.r1;
        /* planted: the next row's first batch read from the row after it */
        const int64_t lrow = DEFECT == DR_CUDA_DEFECT_NEXT_ROW_PREFETCH && nrow != row && nrow + 1 < J.r1 ? nrow + 1 : nrow;
        if (more) mv1_load(J.data + lrow * J.pitch, nb, nch, vb); /* the next batch in flight */
        mv1_batch<FMT, DEFECT, XT>(L, row, base, nfull, nch, va, acc);
        if (nrow != row) { /* the row is complete */
#pragma unroll
            for (int off = 16; off > (DEFECT == DR_CUDA_DEFECT_SHUFFLE_LEVEL ? 1 : 0); off >>= 1) /* planted */
                acc[0] = keep<DEFECT>(acc[0] + __shfl_xor_sync(0xFFFFFFFFu, acc[0], off));
            if (lane == 0) {
                float *yp = J.y + (row - J.r0);
                *yp = J.add ? *yp + acc[0] : acc[0];
                if (J.y2) J.y2[row - J.r0] = J.y2[row - J.r0] + acc[0];
            }
            acc[0] = 0.0f;
        }
        if (!more) break;
#pragma unroll
        for (int k = 0; k < MV1_UNROLL; k++) va[k] = vb[k];
        row = nrow, base = nb;
    }
}

/* Blocks of a persistent n = 1 launch: the device's resident blocks of this kernel (sms: its SM count,
 * launch_fmt's) shared among the jobs in proportion to their rows (a job gets at least one, never more than its rows need). */
template <int FMT, int DEFECT, bool XT>
static void mv1_share_blocks(mv_batch *b, int wpb, size_t smem, int sms, int64_t total_rows, unsigned *grid_x) {
    static int resident[2] = {0, 0}; /* asked once per kernel (not a stream operation: fine in a capture) */
    const int wi = wpb == 16;
    if (!resident[wi] &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident[wi], matvec1_kernel<FMT, DEFECT, XT>, wpb * 32, smem))
        resident[wi] = 1;
    const int64_t total = (int64_t)sms * (resident[wi] > 0 ? resident[wi] : 1);
    int64_t gx = 1;
    for (int i = 0; i < b->count; i++) {
        mv_job &J = b->job[i];
        const int64_t rows = J.r1 - J.r0, need = (rows + wpb - 1) / wpb;
        int64_t p = b->one_row ? need : (total * rows + total_rows - 1) / total_rows;
        p = p < 1 ? 1 : p > need ? need : p;
        J.pblocks = (int)p;
        gx = p > gx ? p : gx;
    }
    *grid_x = (unsigned)gx;
}

/* Launches matvec_kernel<FMT, NT, DEFECT> for all jobs of b; NT from the largest n. */
template <int FMT, int DEFECT>
static cudaError_t launch_fmt(const mv_batch *b, cudaStream_t stream) {
    dim3 block(WARPS_PER_BLOCK * 32);
    dim3 grid((unsigned)((b->max_rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK), (unsigned)b->count);
    int64_t n = b->max_n, max_cols = 0;
    for (int i = 0; i < b->count; i++) max_cols = b->job[i].cols > max_cols ? b->job[i].cols : max_cols;
    /* three tile widths keep compile time modest; a wider tile than n only masks rows */
    if (n <= 1 && max_cols <= MV1_MAX_COLS) {
        int64_t total_rows = 0;
        for (int i = 0; i < b->count; i++) total_rows += b->job[i].r1 - b->job[i].r0;
        const size_t smem = (size_t)xt_floats<fmt_traits<FMT>::EPC>(max_cols) * sizeof(float);
        static int sms = 0; /* the device's SM count, asked once (not a stream operation: fine in a capture) */
        if (!sms) {
            int dev = 0;
            if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
                sms = 132;
        }
        const int wpb = total_rows >= 16 * (int64_t)sms ? 16 : 8; /* a block of 16 rows for every SM, else 8 */
        mv_batch pb = *b; /* the jobs with their block shares */
        unsigned gx;
        if (b->xt) mv1_share_blocks<FMT, DEFECT, true>(&pb, wpb, smem, sms, total_rows, &gx);
        else mv1_share_blocks<FMT, DEFECT, false>(&pb, wpb, smem, sms, total_rows, &gx);
        dim3 g1(gx, (unsigned)b->count);
        if (b->xt) dr_launch(b->pdl, matvec1_kernel<FMT, DEFECT, true>, g1, wpb * 32, smem, stream, pb);
        else dr_launch(b->pdl, matvec1_kernel<FMT, DEFECT, false>, g1, wpb * 32, smem, stream, pb);
    } else if (n <= 1)
        dr_launch(b->pdl, matvec_kernel<FMT, 1, DEFECT>, grid, block, 0, stream, *b);
    else if (n <= 4)
        dr_launch(b->pdl, matvec_kernel<FMT, 4, DEFECT>, grid, block, 0, stream, *b);
    else
        dr_launch(b->pdl, matvec_kernel<FMT, 16, DEFECT>, grid, block, 0, stream, *b);
    return cudaGetLastError();
}

#endif
