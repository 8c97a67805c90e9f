/* dev_common.cuh - device helpers shared by the activation kernels (ops.cu, attn.cu, gdn.cu, moe.cu,
 * sample.cu): one weight row's dot product and dequantisation in any stored format (the matvec's
 * own chunk loop, so a product here is bit-identical to dr_cuda_matmul's), a run-time format
 * switch, block reductions in double, and the fp32 operations the CPU code performs, spelled as
 * round-to-nearest intrinsics so nvcc never contracts them into an fma the CPU does not do. */
#ifndef DRAMA_BACKEND_CUDA_DEV_COMMON_CUH
#define DRAMA_BACKEND_CUDA_DEV_COMMON_CUH

#include <type_traits>

#include "backend/cuda/matvec_kernel.cuh"

/* ---- fp32 steps as the CPU computes them (ISO C, no contraction) ---- */
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float fdiv(float a, float b) { return __fdiv_rn(a, b); }
/* x / (1 + expf(-x)) and 1 / (1 + expf(-x)) (backend/cpu/ops.h); the device expf is within 2 ulp */
__device__ __forceinline__ float dsilu(float x) { return fdiv(x, fadd(1.0f, expf(-x))); }
__device__ __forceinline__ float dsigmoid(float x) { return fdiv(1.0f, fadd(1.0f, expf(-x))); }
__device__ __forceinline__ float dsoftplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- run-time format switch: fn(std::integral_constant<int, FMT>) ---- */
template <class Fn> __device__ __forceinline__ void mv_fmt_switch(int fmt, Fn &&fn) {
    switch (fmt) {
    case MV_F32: fn(std::integral_constant<int, MV_F32>()); break;
    case MV_F16: fn(std::integral_constant<int, MV_F16>()); break;
    case MV_BF16: fn(std::integral_constant<int, MV_BF16>()); break;
    case MV_FP8_BLOCK: fn(std::integral_constant<int, MV_FP8_BLOCK>()); break;
    case MV_FP8_TENSOR: fn(std::integral_constant<int, MV_FP8_TENSOR>()); break;
    case MV_NVFP4: fn(std::integral_constant<int, MV_NVFP4>()); break;
    case MV_AFF4: fn(std::integral_constant<int, MV_AFF4>()); break;
    case MV_AFF8: fn(std::integral_constant<int, MV_AFF8>()); break;
    default: break;
    }
}

/* Dot product of weight row `row` with x (J.x is ignored; x is [cols], 16-byte aligned when J.x_vec),
 * by one whole warp; every lane returns the sum. The chunk order, the fmaf chains and the xor tree
 * are matvec_kernel<FMT, 1, 0>'s, so the value equals dr_cuda_matmul's y for that row. */
template <int FMT>
__device__ __forceinline__ float warp_row_dot(const mv_job &W, int64_t row, const float *x, int lane) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    mv_job J = W;
    J.x = x;
    const uint8_t *wrow = J.data + row * J.pitch;
    const int64_t nfull = J.cols / EPC, nch = (J.cols + EPC - 1) / EPC;
    float acc[1] = {0.0f};
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
            if (ch < nfull) chunk_dot<FMT, 1, false, 0>(J, row, ch, v[k], 0, 1, acc);
            else if (ch < nch) chunk_dot<FMT, 1, true, 0>(J, row, ch, v[k], 0, 1, acc);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[0] += __shfl_xor_sync(0xFFFFFFFFu, acc[0], off);
    return acc[0];
}

__device__ __forceinline__ float warp_row_dot_any(const mv_job &W, int64_t row, const float *x, int lane) {
    float r = 0.0f;
    mv_fmt_switch(W.fmt, [&](auto F) { r = warp_row_dot<decltype(F)::value>(W, row, x, lane); });
    return r;
}

/* Row `row` of W dequantised to fp32 exactly as dr_weight_dequant_row (the chunk decoder of the
 * matvec), by the threads tid = 0 .. nthreads-1 together. */
template <int FMT>
__device__ __forceinline__ void dequant_row(const mv_job &J, int64_t row, float *out, int tid, int nthreads) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const uint8_t *wrow = J.data + row * J.pitch;
    const int64_t nfull = J.cols / EPC, nch = (J.cols + EPC - 1) / EPC;
    for (int64_t ch = tid; ch < nch; ch += nthreads) {
        uint4 v = *reinterpret_cast<const uint4 *>(wrow + ch * 16);
        float w[EPC];
        int64_t c0 = ch * EPC;
        if (ch < nfull) {
            decode<FMT, false, 0>(J, row, c0, v, EPC, w);
#pragma unroll
            for (int e = 0; e < EPC; e++) out[c0 + e] = w[e];
        } else {
            int lim = (int)(J.cols - c0);
            decode<FMT, true, 0>(J, row, c0, v, lim, w);
#pragma unroll
            for (int e = 0; e < EPC; e++)
                if (e < lim) out[c0 + e] = w[e];
        }
    }
}

__device__ __forceinline__ void dequant_row_any(const mv_job &J, int64_t row, float *out, int tid, int nthreads) {
    mv_fmt_switch(J.fmt, [&](auto F) { dequant_row<decltype(F)::value>(J, row, out, tid, nthreads); });
}

/* ---- reductions ---- */
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * sh: 32 doubles of shared memory. Calls must be reached by every thread of the block. */
__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(t);
}

__device__ __forceinline__ float block_max_f(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_f(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return warp_max_f(t);
}

/* y[i] = (x[i] r) w[i] with r = fp32(1 / sqrt(sum x^2 / n + eps)), sum in double: dr_op_rms_norm
 * (w NULL: 1), by the whole block; x and y may alias. */
__device__ __forceinline__ void block_rms_norm(const float *x, const float *w, double eps, int n, float *y, double *sh) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * (double)x[i];
    ss = block_sum_d(ss, sh);
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = w ? fmul(fmul(x[i], r), w[i]) : fmul(x[i], r);
}

/* A status word kernels set when their input is unusable (first failure wins): code, and two
 * numbers that the host turns into the message (docs/cuda.md "Device errors"). */
struct dev_status {
    int code;  /* 0 = fine; a DR_CUDA_ERR_* */
    int a, b;
};

__device__ __forceinline__ void dev_fail(dev_status *st, int code, int a, int b) {
    if (!st) return;
    if (atomicCAS(&st->code, 0, code) == 0) {
        st->a = a;
        st->b = b;
    }
}

#endif
