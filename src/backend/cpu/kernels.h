/* kernels.h - the CPU kernel variants behind matmul.h, exposed for tests, the bench and
 * `drama contract`. Production code calls dr_cpu_matmul (which picks the best path once per call).
 *
 * Canonical dot product (every path computes exactly this, so results are bit-identical across
 * paths, thread counts and batch sizes): 32 running sums, sum j taking k = j (mod 32) over the
 * first len - len % 32 elements with fused multiply-add; then lane-wise (s[j] + s[8+j]) +
 * (s[16+j] + s[24+j]) for j < 8, then ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), then the tail
 * elements in order with fused multiply-add. Dequantisation (exact per FORMATS.md 4) happens
 * first, one weight row at a time, into fp32. */
#ifndef DRAMA_BACKEND_CPU_KERNELS_H
#define DRAMA_BACKEND_CPU_KERNELS_H

#include <stdint.h>

#include "base/pool.h"
#include "num/weight.h"

typedef enum dr_cpu_path {
    DR_CPU_AUTO = -1,    /* best the running CPU supports */
    DR_CPU_PORTABLE = 0, /* plain C (fmaf) */
    DR_CPU_AVX2 = 1,     /* AVX2 + FMA + F16C, selected at run time */
    /* the AVX2 loops with one defect planted inside them (matmul_avx2_plant*.c): only for the
     * controls of `drama contract`, which must see them fail */
    DR_CPU_AVX2_PLANT1 = 2, /* affine 4-bit fused loop: nibbles of each byte swapped */
    DR_CPU_AVX2_PLANT2 = 3, /* FP8 fast path: scale off by a factor 2 */
    DR_CPU_AVX2_PLANT3 = 4, /* NVFP4 block table: magnitudes 1.0 and 1.5 swapped */
    DR_CPU_AVX2_PLANT4 = 5, /* canonical reduction drops the fourth accumulator */
    DR_CPU_AVX512 = 6,      /* AVX-512 F/BW/VL/DQ n = 1 loops (matmul_avx512.c); n > 1 runs the AVX2 loops */
    /* the AVX-512 loops with one defect planted inside them (matmul_avx512_plant*.c) */
    DR_CPU_AVX512_PLANT1 = 7, /* affine loops: 4-bit nibbles swapped, 8-bit scale x2 */
    DR_CPU_AVX512_PLANT2 = 8, /* FP8 loop: scale off by a factor 2 */
    DR_CPU_AVX512_PLANT3 = 9, /* NVFP4 block table: magnitudes 1.0 and 1.5 swapped */
    DR_CPU_AVX512_PLANT4 = 10 /* canonical reduction drops the sums 16..31 */
} dr_cpu_path;

/* The best path the running CPU supports, capped by the environment variable DRAMA_CPU_PATH
 * (portable | avx2 | avx512) when it is set. */
dr_cpu_path dr_cpu_best_path(void);
/* 1 when the running CPU has what path p (or its planted copies) needs */
int dr_cpu_path_supported(dr_cpu_path p);
const char *dr_cpu_path_name(dr_cpu_path p);

/* dr_cpu_matmul_rows through an explicit path (an unsupported path falls back to portable). */
void dr_cpu_matmul_path(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                        dr_pool *pool, dr_cpu_path path);
/* One weight row to fp32 through a path; equals dr_weight_dequant_row bit for bit. */
void dr_cpu_dequant_row_path(const dr_weight *w, int64_t r, float *out, dr_cpu_path path);
/* The canonical dot product through a path. */
float dr_cpu_dot_path(const float *x, const float *w, int64_t len, dr_cpu_path path);

/* One vector implementation's entry points (the real AVX2 / AVX-512 one or a planted copy). */
typedef struct dr_cpu_vec_fns {
    void (*dequant_row)(const dr_weight *w, int64_t r, float *out);
    int (*fused_row)(const dr_weight *w, int64_t r, const float *x, float *y);
    /* n = 1, rows [r, r + nr), nr <= DR_CPU_FUSED_ROWS, interleaved so each weight load and FMA
     * chain overlaps the others: 1 when all were written, 0 when none (then row by row). NULL: none */
    int (*fused_rows)(const dr_weight *w, int64_t r, int nr, const float *x, float *y);
    /* xp has room for cols rounded up to 16, then DR_CPU_XORDER_EXTRA floats the path may fill
     * with per-product tables its fused loops read (after x, in the same buffer) */
    int (*order_x)(const dr_weight *w, const float *x, float *xp);
    void (*dot_rows)(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y, int64_t ldy);
} dr_cpu_vec_fns;

#define DR_CPU_VEC_DECLARE(prefix)                                                                          \
    void prefix##_dequant_row(const dr_weight *w, int64_t r, float *out);                                   \
    int prefix##_fused_row(const dr_weight *w, int64_t r, const float *x, float *y);                        \
    int prefix##_order_x(const dr_weight *w, const float *x, float *xp);                                    \
    void prefix##_dot_rows(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y, \
                           int64_t ldy);
DR_CPU_VEC_DECLARE(dr_cpu_avx2p1)
DR_CPU_VEC_DECLARE(dr_cpu_avx2p2)
DR_CPU_VEC_DECLARE(dr_cpu_avx2p3)
DR_CPU_VEC_DECLARE(dr_cpu_avx2p4)
DR_CPU_VEC_DECLARE(dr_cpu_avx512)
DR_CPU_VEC_DECLARE(dr_cpu_avx512p1)
DR_CPU_VEC_DECLARE(dr_cpu_avx512p2)
DR_CPU_VEC_DECLARE(dr_cpu_avx512p3)
DR_CPU_VEC_DECLARE(dr_cpu_avx512p4)
enum { DR_CPU_FUSED_ROWS = 4, DR_CPU_XORDER_EXTRA = 256 * 16 }; /* NVFP4: 16 floats per scale code */
/* fused_rows: AVX-512 (all formats, 4 rows interleaved) and AVX2 (NVFP4, affine 4-bit, FP8: pairs) */
#define DR_CPU_VEC512_DECLARE(prefix) \
    int prefix##_fused_rows(const dr_weight *w, int64_t r, int nr, const float *x, float *y);
DR_CPU_VEC512_DECLARE(dr_cpu_avx512)
DR_CPU_VEC512_DECLARE(dr_cpu_avx512p1)
DR_CPU_VEC512_DECLARE(dr_cpu_avx512p2)
DR_CPU_VEC512_DECLARE(dr_cpu_avx512p3)
DR_CPU_VEC512_DECLARE(dr_cpu_avx512p4)
DR_CPU_VEC512_DECLARE(dr_cpu_avx2)
DR_CPU_VEC512_DECLARE(dr_cpu_avx2p1)
DR_CPU_VEC512_DECLARE(dr_cpu_avx2p2)
DR_CPU_VEC512_DECLARE(dr_cpu_avx2p3)
DR_CPU_VEC512_DECLARE(dr_cpu_avx2p4)

/* AVX2 implementations (matmul_avx2.c); call only when dr_cpu_best_path() == DR_CPU_AVX2. */
void dr_cpu_avx2_dequant_row(const dr_weight *w, int64_t r, float *out);
/* n = 1 fused dequantise-and-dot for the formats it covers (returns 0 otherwise, nothing written).
 * x in the order dr_cpu_avx2_order_x gives for w (the plain x where it returns 0). */
int dr_cpu_avx2_fused_row(const dr_weight *w, int64_t r, const float *x, float *y);
/* Writes x[cols] into xp in the element order the fused loop of w reads (for NVFP4: the natural
 * order, then the per-product block tables) and returns 1, or returns 0 (xp untouched) when the
 * loop reads the plain x. */
int dr_cpu_avx2_order_x(const dr_weight *w, const float *x, float *xp);
/* y[i * ldy] = dot(x + i * ldx, wrow, len) for i < n */
void dr_cpu_avx2_dot_rows(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y,
                          int64_t ldy);

/* n > 1 products: register-blocked micro-kernels (matmul_block.c). y[b * ldy + i] = the canonical
 * dot product of x + b * ldx and w + i * ldw over len elements, for b < nx, i < nw: the same bits
 * as dot_rows for every element (only the order in which outputs are visited differs). */
typedef void (*dr_cpu_block_fn)(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw,
                                int64_t len, float *y, int64_t ldy);
typedef enum dr_cpu_block_isa { DR_CPU_BLOCK_BEST = -1, DR_CPU_BLOCK_AVX2 = 0, DR_CPU_BLOCK_AVX512 = 1 } dr_cpu_block_isa;
/* The block kernel of an instruction set (BEST: AVX-512 where the CPU has it, else AVX2), or its
 * planted copy (planted = 1, for `drama contract`); NULL where the CPU lacks it. */
dr_cpu_block_fn dr_cpu_block_kernel(dr_cpu_block_isa isa, int planted);
void dr_cpu_block_avx2(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw, int64_t len,
                       float *y, int64_t ldy);
void dr_cpu_block_avx512(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw, int64_t len,
                         float *y, int64_t ldy);
void dr_cpu_blockp_avx2(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw, int64_t len,
                        float *y, int64_t ldy);
void dr_cpu_blockp_avx512(const float *x, int64_t ldx, int64_t nx, const float *w, int64_t ldw, int64_t nw,
                          int64_t len, float *y, int64_t ldy);
/* dr_cpu_matmul_path with an explicit block kernel for n > 1 (NULL: dot_rows / the portable dot).
 * dr_cpu_matmul_path uses the AVX-512 one on the AVX-512 path, BEST on the AVX2 path (AVX2 when
 * DRAMA_CPU_PATH=avx2 capped the machine), none on the portable path. */
void dr_cpu_matmul_block(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                         dr_pool *pool, dr_cpu_path path, dr_cpu_block_fn block);

#endif
