/* l2_prefetch.cuh - bulk L2 prefetches of weights (sm_90: cp.async.bulk.prefetch.L2, one instruction
 * per piece, no registers held, nothing to wait for). Why (issue 13): the frame step's kernels are
 * latency bound (few bytes in flight a warp), so DRAM idles while they run; a prefetch issued as soon
 * as an address is known keeps it busy and turns the later loads into L2 hits. A prefetch is a hint:
 * it changes no value, only when bytes arrive. Below sm_90 it is a plain line prefetch per 4 KiB. */
#ifndef DRAMA_BACKEND_CUDA_L2_PREFETCH_CUH
#define DRAMA_BACKEND_CUDA_L2_PREFETCH_CUH

#include <stdint.h>

#define L2PF_PIECE (32 * 1024) /* bytes per bulk instruction */

/* Prefetches the 16-byte-aligned interior of [p, p + bytes) into L2 (the unaligned edges, < 16 bytes
 * each, are left: an aligned range never leaves the allocation). One thread. */
__device__ __forceinline__ void l2_prefetch(const void *p, int64_t bytes) {
    if (!p || bytes <= 0) return;
    uint64_t a = ((uint64_t)(uintptr_t)p + 15u) & ~(uint64_t)15u;
    const uint64_t e = ((uint64_t)(uintptr_t)p + (uint64_t)bytes) & ~(uint64_t)15u;
    for (; a < e; a += L2PF_PIECE) {
        const uint64_t n = e - a < L2PF_PIECE ? e - a : L2PF_PIECE;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)n));
#else
        for (uint64_t o = 0; o < n; o += 4096) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + o));
#endif
    }
}

/* Share `part` of `parts` of [p, p + bytes): the parts of a region prefetched by different blocks
 * (or threads) together cover it once. */
__device__ __forceinline__ void l2_prefetch_part(const void *p, int64_t bytes, int64_t part, int64_t parts) {
    if (parts < 1 || part < 0 || part >= parts || bytes <= 0) return;
    const int64_t piece = ((bytes + parts - 1) / parts + 15) / 16 * 16, off = part * piece;
    if (off >= bytes) return;
    l2_prefetch((const uint8_t *)p + off, off + piece > bytes ? bytes - off : piece);
}

#endif
