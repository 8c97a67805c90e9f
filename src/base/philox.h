/* philox.h - Philox4x32 (Random123) and the request RNG's uniform draw as inline functions that
 * compile for the host and for a CUDA device alike, so the CPU sampler (base/rng.c) and the device
 * sampler (backend/cuda/sample.cu) draw bit-identical numbers from one definition (TEXT.md 5.6).
 * Integer arithmetic and one exact conversion only: no rounding can differ between the two. */
#ifndef DRAMA_BASE_PHILOX_H
#define DRAMA_BASE_PHILOX_H

#include <stdint.h>

#ifndef DR_HD
#ifdef __CUDACC__
#define DR_HD __host__ __device__
#else
#define DR_HD
#endif
#endif

#define DR_PHILOX_M0 0xD2511F53u
#define DR_PHILOX_M1 0xCD9E8D57u
#define DR_PHILOX_W0 0x9E3779B9u
#define DR_PHILOX_W1 0xBB67AE85u

/* The block function with `rounds` rounds (10 for Philox4x32-10). */
static inline DR_HD void dr_philox4x32_block(int rounds, const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < rounds; r++) {
        if (r > 0) { /* the key is bumped before every round but the first */
            k0 += DR_PHILOX_W0;
            k1 += DR_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)DR_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)DR_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Raw 64 bits of draw n of stream `seed`: key (seed low, seed high), counter (n low, n high, 0, 0). */
static inline DR_HD uint64_t dr_philox_bits(uint64_t seed, uint64_t n) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), 0, 0};
    uint32_t out[4];
    dr_philox4x32_block(10, ctr, key, out);
    return (uint64_t)out[0] | ((uint64_t)out[1] << 32);
}

/* Uniform in [0, 1): the top 53 bits times 2^-53 (exact: a 53-bit integer converts exactly). */
static inline DR_HD double dr_philox_uniform(uint64_t seed, uint64_t n) {
    return (double)(dr_philox_bits(seed, n) >> 11) * 0x1.0p-53;
}

#endif
