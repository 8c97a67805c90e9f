/* rng.c - Philox4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11),
 * with the multipliers and Weyl key increments of the Random123 reference. */
#include "base/rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dr_philox4x32(int rounds, const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < rounds; r++) {
        if (r > 0) { /* the key is bumped before every round but the first */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
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

uint64_t dr_rng_bits(uint64_t seed, uint64_t n) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), 0, 0};
    uint32_t out[4];
    dr_philox4x32(10, ctr, key, out);
    return (uint64_t)out[0] | ((uint64_t)out[1] << 32);
}

double dr_rng_uniform(uint64_t seed, uint64_t n) {
    return (double)(dr_rng_bits(seed, n) >> 11) * 0x1.0p-53;
}
