/* matvec_stream_defect.cu - the streamed n = 1 product (matvec_stream.cuh) with its planted defect,
 * for `drama contract` only (cuda_contract.h): DR_CUDA_DEFECT_RING_SLOT, compiled for BF16 (both
 * copy modes) and NVFP4 (both), in its own file so the production kernels neither pay for nor
 * rebuild with it. */
#include "backend/cuda/matvec_stream.cuh"

cudaError_t dr_cuda_launch_matvec_stream_defect(int fmt, int mode, int defect, const mv_batch *b, cudaStream_t stream) {
    if (defect != DR_CUDA_DEFECT_RING_SLOT) return cudaErrorInvalidValue;
    if (fmt == MV_BF16) return mvs_launch_mode<MV_BF16, DR_CUDA_DEFECT_RING_SLOT>(mode, b, stream);
    if (fmt == MV_NVFP4) return mvs_launch_mode<MV_NVFP4, DR_CUDA_DEFECT_RING_SLOT>(mode, b, stream);
    return cudaErrorInvalidValue;
}

cudaError_t dr_cuda_mvs_defect_init(void) {
    static cudaError_t done = cudaErrorNotReady;
    if (done == cudaErrorNotReady) {
        cudaError_t e = mvs_optin<MV_BF16, DR_CUDA_DEFECT_RING_SLOT>();
        done = e == cudaSuccess ? mvs_optin<MV_NVFP4, DR_CUDA_DEFECT_RING_SLOT>() : e;
    }
    return done;
}
