/* kernels.h - the codec's conv and Snake kernels per instruction set (internal to src/codec).
 * ops.c holds the portable reference (no FMA: -ffp-contract=off) and the dispatch; conv_x86.c the
 * AVX2/FMA and AVX-512 kernels. A SIMD path computes every output as one fixed chain of FMAs
 * (a = fma(w, x, a) over input channels, then taps, from a = 0; y = a + bias), whatever the tile,
 * the remainder or the thread, so streaming stays bit-identical to a whole decode; its results
 * differ from the portable path's by the rounding of the products only. */
#ifndef DRAMA_CODEC_KERNELS_H
#define DRAMA_CODEC_KERNELS_H

#include <stdint.h>

#include "codec/internal.h"

#define CD_TILE 192 /* output steps per conv task: 4 AVX-512 blocks of 48, 8 AVX2 blocks of 24 */

/* One conv call's geometry (one output phase of a transposed conv), its fused epilogue and, for
 * `drama contract`, a planted defect. Output value (o, t): v = sum + b[o]; snake: v = snake(v);
 * res: v = res[o][t] + v; y[o * ldy + t * ystep + yoff] = v. */
typedef struct cd_conv_job {
    const float *w;  /* packed: [cout/8][cin_g][k][8] (cd_pack_weights) */
    const float *b;  /* [cout] or NULL */
    int cin, cout, k, dil, stride, groups;
    const float *x;  /* [cin][lx] with history in front (SIMD strided convs: each row phase-major) */
    int64_t lx;
    const int64_t *toff; /* SIMD kernels: tap k reads x[i * lx + t - xt0 + toff[k]] for output step t */
    int64_t xt0;         /* SIMD kernels: the output step of x's column 0 (a tile's panel) */
    float *y;
    int64_t ldy, ystep, yoff;
    int64_t ly;        /* output steps */
    const cd_snake *snake; /* fused Snake on the output, or NULL */
    const float *res;  /* residual [cout][ldy] added last (ystep 1 only), or NULL */
    int plant;         /* contract control (CD_PLANT_*), 0 in the codec */
    /* AVX2 GEMM blocking: the contraction (input channels x taps) runs in blocks of kcb input
     * channels (>= cin: one block), so a block's weights and its input window stay in L1 while
     * the block runs over the tile; partial sums wait in acc ([nob * 8][CD_TILE] per task) and
     * are reloaded, so each output is still one FMA chain in the reference's order */
    int kcb;
    float *acc;
    int gemm; /* AVX2: the GEMM-era kernel choices (8-step remainders on 8 chains, row prefetch); 0: the
               * earlier kernel (DRAMA_CODEC_GEMM=0) */
} cd_conv_job;

/* planted defects inside the SIMD loops (drama contract controls only); KC: the partial sums
 * restart from zero at the second contraction block */
enum { CD_PLANT_NONE = 0, CD_PLANT_TAP = 1, CD_PLANT_PARITY = 2, CD_PLANT_KC = 3 };

#define CD_MAX_TAPS 64 /* SIMD kernels: taps per conv call (more: the portable loops) */

/* output steps t0 .. t0+nt of the 8 outputs of weight block ob (groups 1; a strided conv reads a
 * phase-major input through toff, so each tap is a contiguous run of steps); AVX2: weight blocks
 * ob .. ob+nob-1, contraction blocks outermost (j->kcb, j->acc) */
void cd_conv_tile_avx2(const cd_conv_job *j, int ob, int nob, int64_t t0, int64_t nt);
void cd_conv_tile_avx512(const cd_conv_job *j, int ob, int64_t t0, int64_t nt);
/* y[t] = x[t] + inv * sin(alpha x[t])^2 for one channel (y may be x), sin from the SIMD path's
 * own polynomial (|alpha x| > 8192 or non-finite: libm sinf) */
void cd_snake_row_avx2(float alpha, float inv, const float *x, float *y, int64_t L, int plant);
void cd_snake_row_avx512(float alpha, float inv, const float *x, float *y, int64_t L, int plant);

/* attention of one query and head over keys first .. last (transformer.c: cd_attend_ex): kT the keys
 * transposed ([hd][ldk], column = position), v + p * ldv the values, out + d * ldo the output;
 * the portable loop's values */
void cd_attend_row_avx2(const float *q, const float *kT, int64_t ldk, const float *v, int64_t ldv, int64_t first,
                        int64_t last, int hd, float scale, float *sc, float *out, int64_t ldo, int plant);

#endif
