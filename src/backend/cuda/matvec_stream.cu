/* matvec_stream.cu - the production instantiations of the streamed n = 1 product (design:
 * matvec_stream.cuh), 8 formats x 2 copy modes; off unless DRAMA_CUDA_MV1 (or the contract) asks. */
#include "backend/cuda/matvec_stream.cuh"

int dr_cuda_mvs_fits(const mv_batch *b) {
    if (b->max_n > 1) return 0;
    for (int i = 0; i < b->count; i++)
        if (b->job[i].cols > MV1_MAX_COLS) return 0;
    return 1;
}

cudaError_t dr_cuda_launch_matvec_stream(int fmt, int mode, const mv_batch *b, cudaStream_t stream) {
    switch (fmt) {
    case MV_F32: return mvs_launch_mode<MV_F32, 0>(mode, b, stream);
    case MV_F16: return mvs_launch_mode<MV_F16, 0>(mode, b, stream);
    case MV_BF16: return mvs_launch_mode<MV_BF16, 0>(mode, b, stream);
    case MV_FP8_BLOCK: return mvs_launch_mode<MV_FP8_BLOCK, 0>(mode, b, stream);
    case MV_FP8_TENSOR: return mvs_launch_mode<MV_FP8_TENSOR, 0>(mode, b, stream);
    case MV_NVFP4: return mvs_launch_mode<MV_NVFP4, 0>(mode, b, stream);
    case MV_AFF4: return mvs_launch_mode<MV_AFF4, 0>(mode, b, stream);
    case MV_AFF8: return mvs_launch_mode<MV_AFF8, 0>(mode, b, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t dr_cuda_mvs_init(void) {
    static cudaError_t done = cudaErrorNotReady; /* once per process: the attribute is the kernel's */
    if (done == cudaErrorNotReady) {
        cudaError_t e = mvs_optin<MV_F32, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_F16, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_BF16, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_FP8_BLOCK, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_FP8_TENSOR, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_NVFP4, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_AFF4, 0>();
        if (e == cudaSuccess) e = mvs_optin<MV_AFF8, 0>();
        done = e;
    }
    return done;
}
