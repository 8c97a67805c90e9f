/* formats.h - scalar number formats of FORMATS.md section 3: decode and round-to-nearest-even
 * encode for BF16, F16, FP8 E4M3 (the "fn" variant), UE4M3 (NVFP4 block scales) and E2M1 (FP4).
 *
 * Decoders are exact (every code of these formats is an fp32 value). Encoders round to nearest,
 * ties to even, and take a double where FORMATS.md section 6 asks for the expression to be
 * evaluated in fp64 and only its final value encoded (no double rounding through fp32).
 * No state, no allocation; safe from any thread.
 */
#ifndef DRAMA_NUM_FORMATS_H
#define DRAMA_NUM_FORMATS_H

#include <stdint.h>
#include <string.h>

/* ---- fp32 bit access (memcpy: no aliasing issues, compiles to a move) ---- */
static inline uint32_t dr_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float dr_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- BF16: the upper 16 bits of an fp32 ---- */
static inline float dr_bf16_to_f32(uint16_t b) { return dr_f32_from_bits((uint32_t)b << 16); }
/* RNE; NaN -> (u >> 16) | 0x40 (quiet, sign and payload top kept); overflow -> +-inf. */
uint16_t dr_f32_to_bf16(float f);

/* ---- F16: IEEE binary16 ---- */
float dr_f16_to_f32(uint16_t h);
/* RNE; overflow -> +-inf; NaN -> quiet NaN with the sign kept (0x7E00 | sign). */
uint16_t dr_f32_to_f16(float f);

/* ---- FP8 E4M3 fn: bias 7, no infinity, 0x7F/0xFF NaN, max 448 ---- */
/* Table of all 256 codes (the CPU reference); NaN for 0x7F and 0xFF. */
extern const float dr_e4m3_table[256];
static inline float dr_e4m3_to_f32(uint8_t c) { return dr_e4m3_table[c]; }
/* UE4M3: the same byte with the sign bit ignored. 0x7F (after masking) is NaN. */
static inline float dr_ue4m3_to_f32(uint8_t c) { return dr_e4m3_table[c & 0x7F]; }
/* Saturating RNE encode ("satfinite"): |x| >= 448 (and +-inf) -> +-448, NaN -> 0x7F, the sign is
 * always kept (-0.0 and negatives that round to zero give 0x80). */
uint8_t dr_e4m3_from_f64(double x);
static inline uint8_t dr_f32_to_e4m3(float x) { return dr_e4m3_from_f64((double)x); }

/* ---- E2M1 (FP4): codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign ---- */
extern const float dr_e2m1_table[16];
static inline float dr_e2m1_to_f32(uint8_t code) { return dr_e2m1_table[code & 0xF]; }
/* RNE, saturate at +-6; a zero result is always code 0 (also for -0.0 and small negatives);
 * NaN -> code 0 (encoders check their sources for non-finite values before calling this). */
uint8_t dr_e2m1_from_f64(double x);

/* Round half to even in double (independent of the FP environment's rounding mode). */
double dr_rne(double v);

#endif
