/* pdl.cuh - programmatic dependent launch (sm_90+, docs/cuda.md "PDL"): one host launch helper
 * every frame-step kernel goes through, and the two device instructions its kernels use.
 *
 * Launched with the attribute, kernel N+1 may be scheduled once every block of kernel N has issued
 * pdl_trigger() (or exited); it then runs its preamble (loads of constants: weights, scales, norm
 * weights) and stops in pdl_wait() until kernel N has completed and its memory is visible.
 * The rule for every kernel launched through dr_launch: pdl_wait() before the first read of
 * anything an earlier kernel or copy may have written and before the first global write or atomic.
 * The wait covers the DIRECT predecessor only (cuda_device_runtime_api.h), so at least one block of
 * every grid must wait before it ends: then no grid completes before its predecessor, and the
 * ordering is transitive down the stream. Without the attribute both instructions are no-ops. */
#ifndef DRAMA_BACKEND_CUDA_PDL_CUH
#define DRAMA_BACKEND_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

/* Blocks until the preceding grid has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next grid be scheduled once all our blocks have issued it (it still waits for us). */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* The head of a kernel that has no constant loads worth issuing early. */
__device__ __forceinline__ void pdl_enter() {
    pdl_trigger();
    pdl_wait();
}

/* An L2 prefetch of the first bytes (at most 4 KiB) of a weight row by one warp: a preamble of
 * constant loads before pdl_wait that holds no registers (for kernels kept at 128 registers). */
__device__ __forceinline__ void pdl_prefetch_row(const uint8_t *row, int64_t bytes, int lane) {
    if (bytes > 4096) bytes = 4096;
    for (int64_t o = (int64_t)lane * 128; o < bytes; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + o));
}

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when pdl
 * (dr_cuda.pdl, DRAMA_CUDA_PDL; 0: exactly a plain launch). Returns the launch error. */
template <class... KArgs, class... Args>
static inline cudaError_t dr_launch(int pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, Args &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = pdl ? at : NULL;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

#endif
