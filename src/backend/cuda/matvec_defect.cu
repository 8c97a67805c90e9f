/* matvec_defect.cu - the matvec kernel with planted defects (cuda_contract.h), for `drama contract`
 * only. Each defect is compiled for the one format whose control uses it (3 tile widths each), in
 * its own file so the production kernels (matvec.cu) neither pay for nor rebuild with them. */
#include "backend/cuda/matvec_kernel.cuh"

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
    case DR_CUDA_DEFECT_TILE_TAIL:
        if (fmt == MV_FP8_TENSOR) return launch_fmt<MV_FP8_TENSOR, DR_CUDA_DEFECT_TILE_TAIL>(b, stream);
        break;
    default: break;
    }
    return cudaErrorInvalidValue;
}
