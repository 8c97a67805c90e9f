/* matvec_defect.cu - the matvec kernel with planted defects (cuda_contract.h), for `drama contract`
 * only. Each defect is compiled for the one format whose control uses it (3 tile widths each), in
 * its own file so the production kernels (matvec.cu) neither pay for nor rebuild with them. */
#include "backend/cuda/matvec_kernel.cuh"

/* The PDL ordering check's producer (cuda_contract.h): spins spin_ns on the global timer, then
 * dst = src. It lets its dependent be scheduled at once, so a dependent that reads dst before its
 * pdl_wait reads the old contents while this one spins. */
__global__ void pdl_slow_copy_kernel(const float *src, float *dst, int64_t n, long long spin_ns) {
    pdl_enter();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while ((long long)(t - t0) < spin_ns);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" drama_status dr_cuda_pdl_order_check(dr_cuda *c, const float *src, float *dst, int64_t n, int spin_us,
                                                const dr_cuda_job *jobs, int count, int defect, drama_error *err) {
    if (!c || !src || !dst || n < 0 || spin_us < 0) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_pdl_order_check: bad argument");
    drama_status st = dr_cuda_check(dr_launch(c->pdl, pdl_slow_copy_kernel, 1, 256, 0, c->stream, src, dst, n,
                                              (long long)spin_us * 1000),
                                    "PDL slow copy launch", err);
    if (st) return st;
    return defect ? dr_cuda_matmul_batch_defect(c, jobs, count, defect, err) : dr_cuda_matmul_batch(c, jobs, count, err);
}

cudaError_t dr_cuda_launch_matvec_defect(int fmt, int defect, const mv_batch *b, cudaStream_t stream) {
    switch (defect) {
    case DR_CUDA_DEFECT_NEXT_BLOCK_SCALE:
        if (fmt == MV_FP8_BLOCK) return launch_fmt<MV_FP8_BLOCK, DR_CUDA_DEFECT_NEXT_BLOCK_SCALE>(b, stream);
        break;
    case DR_CUDA_DEFECT_NIBBLE_HIGH_FIRST:
        if (fmt == MV_NVFP4) return launch_fmt<MV_NVFP4, DR_CUDA_DEFECT_NIBBLE_HIGH_FIRST>(b, stream);
        break;
    case DR_CUDA_DEFECT_FP16_ACCUM:
        if (fmt == MV_BF16) return launch_fmt<MV_BF16, DR_CUDA_DEFECT_FP16_ACCUM>(b, stream);
        break;
    case DR_CUDA_DEFECT_DROP_TAIL_CHUNK:
        if (fmt == MV_F32) return launch_fmt<MV_F32, DR_CUDA_DEFECT_DROP_TAIL_CHUNK>(b, stream);
        break;
    case DR_CUDA_DEFECT_PREV_GROUP:
        if (fmt == MV_AFF4) return launch_fmt<MV_AFF4, DR_CUDA_DEFECT_PREV_GROUP>(b, stream);
        if (fmt == MV_AFF8) return launch_fmt<MV_AFF8, DR_CUDA_DEFECT_PREV_GROUP>(b, stream);
        break;
    case DR_CUDA_DEFECT_SHUFFLE_LEVEL:
        if (fmt == MV_F16) return launch_fmt<MV_F16, DR_CUDA_DEFECT_SHUFFLE_LEVEL>(b, stream);
        break;
    case DR_CUDA_DEFECT_NORM_NO_WEIGHT:
        if (fmt == MV_BF16) return launch_fmt<MV_BF16, DR_CUDA_DEFECT_NORM_NO_WEIGHT>(b, stream);
        break;
    case DR_CUDA_DEFECT_XT_SHIFT: /* only the n = 1 kernel's transposed staging reads it */
        if (fmt == MV_BF16) return launch_fmt<MV_BF16, DR_CUDA_DEFECT_XT_SHIFT>(b, stream);
        break;
    case DR_CUDA_DEFECT_NEXT_ROW_PREFETCH: /* only the n = 1 kernel's walk over rows reads it */
        if (fmt == MV_FP8_BLOCK) return launch_fmt<MV_FP8_BLOCK, DR_CUDA_DEFECT_NEXT_ROW_PREFETCH>(b, stream);
        break;
    case DR_CUDA_DEFECT_PDL_EARLY_X: /* only the n = 1 kernel stages x; red only with PDL on */
        if (fmt == MV_BF16) return launch_fmt<MV_BF16, DR_CUDA_DEFECT_PDL_EARLY_X>(b, stream);
        break;
    case DR_CUDA_DEFECT_TILE_TAIL:
        if (fmt == MV_FP8_TENSOR) return launch_fmt<MV_FP8_TENSOR, DR_CUDA_DEFECT_TILE_TAIL>(b, stream);
        break;
    default: break;
    }
    return cudaErrorInvalidValue;
}
