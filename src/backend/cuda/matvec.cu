/* matvec.cu - y = x W^T for weights in their stored format (FORMATS.md section 4).
 *
 * One warp per output row. Lane l reads the row's 16-byte chunks l, l+32, l+64, ... (a warp reads
 * 512 contiguous bytes per step: coalesced, 16-byte loads, UNROLL = 4 chunks in flight per lane;
 * 8 for n = 1 measured slower on the H200: lm_head 10.8 vs 8.3 us),
 * dequantises each chunk in registers exactly as dr_weight_dequant_row does (same fp32
 * operations in the same order), and accumulates w * x with fmaf into one sum per activation row.
 * The 32 lane sums meet in a fixed xor-shuffle tree. The chunk-to-lane assignment and the order
 * of every addition depend only on the row length, never on n, the row range or the batch: row i
 * of y is bit-identical however it is asked for.
 *
 * NT activation rows share each weight load (NT in {1, 4, 16}; larger n loops over tiles of
 * 16 rows). Chunk sizes: F32 4 values, F16/BF16 8, FP8 16, NVFP4 32 (+2 scales), affine 4-bit 32
 * (one group), affine 8-bit 16 (one group). */
#include "backend/cuda/matvec_kernel.cuh"

cudaError_t dr_cuda_launch_matvec(int fmt, const mv_batch *b, cudaStream_t stream) {
    switch (fmt) {
    case MV_F32: return launch_fmt<MV_F32, 0>(b, stream);
    case MV_F16: return launch_fmt<MV_F16, 0>(b, stream);
    case MV_BF16: return launch_fmt<MV_BF16, 0>(b, stream);
    case MV_FP8_BLOCK: return launch_fmt<MV_FP8_BLOCK, 0>(b, stream);
    case MV_FP8_TENSOR: return launch_fmt<MV_FP8_TENSOR, 0>(b, stream);
    case MV_NVFP4: return launch_fmt<MV_NVFP4, 0>(b, stream);
    case MV_AFF4: return launch_fmt<MV_AFF4, 0>(b, stream);
    case MV_AFF8: return launch_fmt<MV_AFF8, 0>(b, stream);
    default: return cudaErrorInvalidValue;
    }
}
