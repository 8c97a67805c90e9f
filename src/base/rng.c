/* rng.c - Philox4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11), with the
 * multipliers and Weyl key increments of the Random123 reference. The arithmetic is the inline
 * definition of base/philox.h, which the CUDA sampler compiles too. */
#include "base/rng.h"

#include "base/philox.h"

void dr_philox4x32(int rounds, const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    dr_philox4x32_block(rounds, ctr, key, out);
}

uint64_t dr_rng_bits(uint64_t seed, uint64_t n) { return dr_philox_bits(seed, n); }

double dr_rng_uniform(uint64_t seed, uint64_t n) { return dr_philox_uniform(seed, n); }
