/* rng.h - the request RNG: counter-based Philox4x32-10 (Random123), TEXT.md section 5.6.
 *
 * A counter-based generator has no sequential state: draw n is a pure function of (seed, n).
 * That is what makes a seed reproducible regardless of thread count, batch composition or
 * streaming: the frame loop names every draw by its index n = 16*f + slot and never depends on
 * how many draws happened before.
 *
 *   key     = (seed & 0xffffffff, seed >> 32)
 *   counter = (n & 0xffffffff, n >> 32, 0, 0)
 *   x       = out[0] | (uint64)out[1] << 32
 *   u       = (x >> 11) * 2^-53            in [0, 1), 53 random bits
 */
#ifndef DRAMA_BASE_RNG_H
#define DRAMA_BASE_RNG_H

#include <stdint.h>

/* Slots of one frame's 16 draw indices (TEXT.md 5.6). */
enum {
    DR_RNG_SLOT_SEMANTIC = 0,
    DR_RNG_SLOT_REDRAW = 1,
    DR_RNG_SLOT_CODEBOOK1 = 2, /* codebook j (1..9) uses slot 1 + j */
    DR_RNG_SLOTS_PER_FRAME = 16
};

/* The Random123 block function with `rounds` rounds (10 for Philox4x32-10). */
void dr_philox4x32(int rounds, const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Raw 64 bits of draw n of stream `seed`. */
uint64_t dr_rng_bits(uint64_t seed, uint64_t n);
/* Uniform double in [0, 1) of draw n. */
double dr_rng_uniform(uint64_t seed, uint64_t n);
/* Draw index of frame f (counts semantic draws over the request) and slot. */
static inline uint64_t dr_rng_index(uint64_t frame, int slot) {
    return frame * (uint64_t)DR_RNG_SLOTS_PER_FRAME + (uint64_t)slot;
}

#endif
