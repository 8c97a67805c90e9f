/* matmul_block.c - register-blocked micro-kernels for n > 1 products (prefill, batched lanes):
 * a tile of activation rows x dequantised weight rows at once, so each loaded vector feeds several
 * outputs. Every output is still exactly the canonical dot product of kernels.h (its 32 running
 * sums take the same elements in the same order, then the same reduction tree and tail), so the
 * tiling changes speed only, never bits. matmul_block_plant.c compiles this file again with a
 * defect inside both vector loops, for `drama contract`'s controls. */
#include "backend/cpu/kernels.h"

#ifndef BLOCK_NAME
#define BLOCK_NAME(f) dr_cpu_block_##f
#define PLANT 0
#endif

#include <math.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

/* planted defect: the last weight row of a tile loads the previous row's vectors inside the FMA
 * loop (seen by any product with 3 or more weight rows and 32 or more columns) */
#define WROW(c, C) (PLANT && (c) == (C) - 1 ? (c) - 1 : (c))

/* one load per activation vector, reused from a register by the tile's FMAs (the compiler would
 * otherwise fold a load into every FMA: C loads instead of one) */
#define KEEP(v) __asm__("" : "+v"(v))
/* every tile loop fully unrolled, so the accumulators live in registers */
#define UNROLL _Pragma("GCC unroll 16")

/* The canonical tail (elements past the last multiple of 32, in order) after the reduction. */
static inline float tail_dot(const float *x, const float *w, int64_t body, int64_t len, float t) {
    for (int64_t k = body; k < len; k++) t = fmaf(x[k], w[k], t);
    return t;
}

/* ---- AVX-512: tiles of 4 activation rows x 3 weight rows; each output's 32 sums are two zmm
 * (sums 0..15 and 16..31), 24 accumulators + 6 weight vectors + 1 activation vector ---- */

#define T512 __attribute__((target("avx512f,avx2,fma")))
enum { R512 = 4, C512 = 3 };

/* (s0..7 + s8..15) + (s16..23 + s24..31), then the tree of kernels.h */
T512 static inline float reduce512(__m512 lo, __m512 hi) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(lo), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1)));
    __m256 b = _mm256_add_ps(_mm512_castps512_ps256(hi), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1)));
    __m256 v = _mm256_add_ps(a, b);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

T512 static void tile512(const float *const *xr, const float *const *wr, int64_t body, float out[R512][C512]) {
    __m512 acc[R512][C512][2];
    UNROLL
    for (int r = 0; r < R512; r++)
        UNROLL
        for (int c = 0; c < C512; c++) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < body; k += 32) {
        __m512 w0[C512], w1[C512];
        UNROLL
        for (int c = 0; c < C512; c++) {
            w0[c] = _mm512_loadu_ps(wr[WROW(c, C512)] + k);
            w1[c] = _mm512_loadu_ps(wr[WROW(c, C512)] + k + 16);
        }
        UNROLL
        for (int r = 0; r < R512; r++) {
            __m512 x0 = _mm512_loadu_ps(xr[r] + k);
            KEEP(x0);
            UNROLL
            for (int c = 0; c < C512; c++) acc[r][c][0] = _mm512_fmadd_ps(x0, w0[c], acc[r][c][0]);
            __m512 x1 = _mm512_loadu_ps(xr[r] + k + 16);
            KEEP(x1);
            UNROLL
            for (int c = 0; c < C512; c++) acc[r][c][1] = _mm512_fmadd_ps(x1, w1[c], acc[r][c][1]);
        }
    }
    UNROLL
    for (int r = 0; r < R512; r++)
        UNROLL
        for (int c = 0; c < C512; c++) out[r][c] = reduce512(acc[r][c][0], acc[r][c][1]);
}

/* ---- AVX2: 16 registers hold only 3 outputs' 4 accumulators each, so the tile (3 x 3) runs one
 * accumulator quarter at a time (sums 8q..8q+7 over the elements k = 8q..8q+7 mod 32 of a panel),
 * keeping the other quarters in memory; each sum still takes its elements in increasing k ---- */

#define T256 __attribute__((target("avx2,fma")))
enum { R256 = 3, C256 = 3, PANEL256 = 512 };

T256 static inline float reduce256(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

T256 static void tile256(const float *const *xr, const float *const *wr, int64_t body, float out[R256][C256]) {
    __m256 sums[4][R256][C256]; /* [quarter][r][c] */
    UNROLL
    for (int q = 0; q < 4; q++)
        UNROLL
        for (int r = 0; r < R256; r++)
            UNROLL
            for (int c = 0; c < C256; c++) sums[q][r][c] = _mm256_setzero_ps();
    /* panels small enough that the tile's rows stay in L1 over the four quarter passes */
    for (int64_t p0 = 0; p0 < body; p0 += PANEL256) {
        int64_t p1 = p0 + PANEL256 < body ? p0 + PANEL256 : body;
        UNROLL
        for (int q = 0; q < 4; q++) {
            __m256 acc[R256][C256];
            UNROLL
            for (int r = 0; r < R256; r++)
                UNROLL
                for (int c = 0; c < C256; c++) acc[r][c] = sums[q][r][c];
            for (int64_t k = p0 + 8 * q; k < p1; k += 32) {
                __m256 wv[C256];
                UNROLL
                for (int c = 0; c < C256; c++) wv[c] = _mm256_loadu_ps(wr[WROW(c, C256)] + k);
                UNROLL
                for (int r = 0; r < R256; r++) {
                    __m256 xv = _mm256_loadu_ps(xr[r] + k);
                    KEEP(xv);
                    UNROLL
                    for (int c = 0; c < C256; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                }
            }
            UNROLL
            for (int r = 0; r < R256; r++)
                UNROLL
                for (int c = 0; c < C256; c++) sums[q][r][c] = acc[r][c];
        }
    }
    UNROLL
    for (int r = 0; r < R256; r++)
        UNROLL
        for (int c = 0; c < C256; c++)
            out[r][c] = reduce256(sums[0][r][c], sums[1][r][c], sums[2][r][c], sums[3][r][c]);
}

/* Tile loop shared by both: partial tiles repeat their last valid row (the results of the
 * repeated rows are not stored). Weight tiles outer, so a tile's weight rows stay in L1 while
 * every activation tile meets them. */
#define BLOCK_LOOP(R, C, TILE)                                                                          \
    int64_t body = len & ~(int64_t)31;                                                                  \
    for (int64_t i0 = 0; i0 < nw; i0 += (C)) {                                                          \
        const float *wr[C];                                                                             \
        for (int c = 0; c < (C); c++) wr[c] = w + (i0 + c < nw ? i0 + c : nw - 1) * ldw;                \
        for (int64_t b0 = 0; b0 < nx; b0 += (R)) {                                                      \
            const float *xr[R];                                                                         \
            for (int r = 0; r < (R); r++) xr[r] = x + (b0 + r < nx ? b0 + r : nx - 1) * ldx;            \
            float out[R][C];                                                                            \
            TILE(xr, wr, body, out);                                                                    \
            for (int r = 0; r < (R) && b0 + r < nx; r++)                                                \
                for (int c = 0; c < (C) && i0 + c < nw; c++)                                            \
                    y[(b0 + r) * ldy + i0 + c] = tail_dot(xr[r], wr[c], body, len, out[r][c]);          \
        }                                                                                               \
    }

T512 void BLOCK_NAME(avx512)(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw,
                             int64_t len, float *y, int64_t ldy) {
    BLOCK_LOOP(R512, C512, tile512)
}

T256 void BLOCK_NAME(avx2)(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw,
                           int64_t len, float *y, int64_t ldy) {
    BLOCK_LOOP(R256, C256, tile256)
}

#if PLANT == 0
static int has_avx512(void) { /* checked once, as dr_cpu_best_path (cpuid traps in a VM) */
    static int known = -1;
    int v = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = dr_cpu_path_supported(DR_CPU_AVX2) && __builtin_cpu_supports("avx512f");
        __atomic_store_n(&known, v, __ATOMIC_RELAXED);
    }
    return v;
}

dr_cpu_block_fn dr_cpu_block_kernel(dr_cpu_block_isa isa, int planted) {
    int avx2 = dr_cpu_path_supported(DR_CPU_AVX2); /* AVX2 + FMA + F16C (the dequantisation's path) */
    int avx512 = has_avx512();
    if (isa == DR_CPU_BLOCK_BEST) isa = avx512 ? DR_CPU_BLOCK_AVX512 : DR_CPU_BLOCK_AVX2;
    if (isa == DR_CPU_BLOCK_AVX512 && avx512) return planted ? dr_cpu_blockp_avx512 : dr_cpu_block_avx512;
    if (isa == DR_CPU_BLOCK_AVX2 && avx2) return planted ? dr_cpu_blockp_avx2 : dr_cpu_block_avx2;
    return NULL;
}
#endif

#else /* not x86: no block kernels (the driver keeps dot_rows) */

#if PLANT == 0
dr_cpu_block_fn dr_cpu_block_kernel(dr_cpu_block_isa isa, int planted) {
    (void)isa, (void)planted;
    return NULL;
}
#endif

#endif
