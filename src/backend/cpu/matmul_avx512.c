/* matmul_avx512.c - AVX-512 (F/BW/VL/DQ) n = 1 loops: fused dequantise-and-dot over up to
 * DR_CPU_FUSED_ROWS weight rows at once, computing exactly the canonical dot product of kernels.h.
 * Sums 0..15 and 16..31 live in two zmm accumulators per row, so one row has two FMA chains; the
 * rows are interleaved so the chains (and the shared x loads) of four rows overlap. The 4-bit
 * formats decode through a 16-entry fp32 table per scale group built with the reference's own
 * operations (vpermps / vpermt2ps select the entry), so every weight value is the reference's bits
 * without a per-weight conversion. The batched path (n > 1) and the row dequantisation are the AVX2
 * ones (same bits). Compiled with target attributes, called only after a run-time CPU check. */
#include "backend/cpu/kernels.h"

/* matmul_avx512_plant*.c compile this file again with PLANT = 1..4 (a defect inside the vector
 * loops, for `drama contract`'s controls) under the names AVX512_NAME gives them. */
#ifndef AVX512_NAME
#define AVX512_NAME(f) dr_cpu_avx512_##f
#define PLANT 0
#endif

#include <math.h>
#include <string.h>

#include "num/formats.h"

void AVX512_NAME(dequant_row)(const dr_weight *w, int64_t r, float *out) { dr_cpu_avx2_dequant_row(w, r, out); }

void AVX512_NAME(dot_rows)(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y,
                            int64_t ldy) {
    dr_cpu_avx2_dot_rows(x, ldx, n, wrow, len, y, ldy);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INL TGT static inline __attribute__((always_inline))
#define NR DR_CPU_FUSED_ROWS
#define FOR_ROWS _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++)

#include "backend/cpu/prefetch.h"


/* the canonical reduction of sums a = s[0..15], b = s[16..31] (kernels.h) */
INL float hsum_canonical(__m512 a, __m512 b) {
    __m256 p = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)); /* s_j + s_{8+j} */
    __m256 q = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1)); /* s_{16+j} + s_{24+j} */
    __m256 v = PLANT == 4 ? p : _mm256_add_ps(p, q);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* v_j + v_{j+4} */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 /* (0+2), (1+3) */
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

/* Order of the 4-bit loops: each 32 weights are 16 bytes, broadcast to the four 128-bit lanes
 * (a load, no shuffle) and shifted per dword lane (vpsrlvd) so that lane d holds byte
 * p(d) = 4 (d % 4) + d / 4 in its low bits: vpermps / vpermt2ps read the low nibble (element
 * 2 p(d)) and, after 4 more bits of shift, the high one (element 2 p(d) + 1). x is read in that
 * order (order_x) and the accumulators hold (s[2 p(d)]) and (s[2 p(d) + 1]); this puts them
 * back to s[0..15], s[16..31] (p is its own inverse). One shuffle fewer per 32 weights and row
 * than widening the bytes with vpmovzxbd. */
INL float hsum_pairs(__m512 ev, __m512 od) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 1, 17, 5, 21, 9, 25, 13, 29);
    const __m512i hi = _mm512_setr_epi32(2, 18, 6, 22, 10, 26, 14, 30, 3, 19, 7, 23, 11, 27, 15, 31);
    return hsum_canonical(_mm512_permutex2var_ps(ev, lo, od), _mm512_permutex2var_ps(ev, hi, od));
}

/* per dword lane d: the shift that brings byte p(d) of the broadcast 16 bytes to bits 0..7 */
#define NIB_SHIFT _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24)
INL __m512i bytes16_bcast(const uint8_t *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)p)); }

/* NVFP4: every block's table t[c] = (e2m1(c) * s) * g depends only on the scale code and the
 * product's global scale g, so the 256 tables (the sign bit is ignored: codes c and c | 0x80 get
 * the same one, and the loop indexes with the byte as stored) are built once per product (after x
 * in the order_x buffer, DR_CPU_XORDER_EXTRA floats) with the reference's two products; the loop
 * then loads its block's 16 entries instead of widening a scale and multiplying twice per block
 * and row. Scale code 0x7F gives NaN entries, as the reference. */
TGT static void nvfp4_products(float g, float *tables) {
    const float mags[16] = {0.0f,  0.5f,  PLANT == 3 ? 1.5f : 1.0f,  PLANT == 3 ? 1.0f : 1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, PLANT == 3 ? -1.5f : -1.0f, PLANT == 3 ? -1.0f : -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const __m512 e2m1 = _mm512_loadu_ps(mags), vg = _mm512_set1_ps(g);
    for (int c = 0; c < 256; c++)
        _mm512_storeu_ps(tables + 16 * c, _mm512_mul_ps(_mm512_mul_ps(e2m1, _mm512_set1_ps(dr_ue4m3_to_f32((uint8_t)c))), vg));
}

TGT int AVX512_NAME(order_x)(const dr_weight *w, const float *x, float *xp) {
    if (!(w->fmt == DR_WF_NVFP4 || (w->fmt == DR_WF_AFFINE && w->bits == 4))) return 0;
    int64_t body = w->cols & ~(int64_t)31;
    const __m512i ev = _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30); /* 2 p(d) */
    const __m512i od = _mm512_setr_epi32(1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31);
    for (int64_t k = 0; k < body; k += 32) { /* moves only */
        __m512 a = _mm512_loadu_ps(x + k), b = _mm512_loadu_ps(x + k + 16);
        _mm512_storeu_ps(xp + k, _mm512_permutex2var_ps(a, ev, b));
        _mm512_storeu_ps(xp + k + 16, _mm512_permutex2var_ps(a, od, b));
    }
    for (int64_t k = body; k < w->cols; k++) xp[k] = x[k];
    if (w->fmt == DR_WF_NVFP4) nvfp4_products(w->global_scale, xp + ((w->cols + 15) & ~(int64_t)15));
    return 1;
}

/* ---- dense: BF16, F16, F32 ---- */

INL __m512 bf16x16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
}
INL __m512 f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)p)); }
INL __m512 f32x16(const uint8_t *p) { return _mm512_loadu_ps((const void *)p); }

static inline float dense_value(dr_wfmt f, const uint8_t *row, int64_t k) {
    if (f == DR_WF_F32) {
        float v;
        memcpy(&v, row + 4 * k, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, row + 2 * k, 2);
    return f == DR_WF_BF16 ? dr_bf16_to_f32(h) : dr_f16_to_f32(h);
}

#define DENSE_ROWS(NAME, LOAD, ESZ)                                                                 \
    INL void NAME(const dr_weight *w, int64_t r, const int nr, const float *x, float *y) {        \
        int64_t cols = w->cols, body = cols & ~(int64_t)31;                                          \
        const uint8_t *row[NR];                                                                      \
        const int64_t ahead = PF_AHEAD_ROWS(w, r, nr);                                          \
        __m512 a[NR], b[NR];                                                                         \
        FOR_ROWS {                                                                                   \
            row[i] = w->data + (size_t)(r + i) * w->row_bytes;                                       \
            a[i] = b[i] = _mm512_setzero_ps();                                                       \
        }                                                                                            \
        for (int64_t k = 0; k < body; k += 32) {                                                     \
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);                   \
            FOR_ROWS {                                                                               \
                if ((ESZ) != 4) PREFETCH(row[i] + (ESZ) * k); /* f32: cold no faster, hot 9% slower */ \
                a[i] = _mm512_fmadd_ps(x0, LOAD(row[i] + (ESZ) * k), a[i]);                          \
                b[i] = _mm512_fmadd_ps(x1, LOAD(row[i] + (ESZ) * (k + 16)), b[i]);                   \
            }                                                                                        \
        }                                                                                            \
        FOR_ROWS {                                                                                   \
            float t = hsum_canonical(a[i], b[i]);                                                    \
            for (int64_t k = body; k < cols; k++) t = fmaf(x[k], dense_value(w->fmt, row[i], k), t); \
            y[i] = t;                                                                                \
        }                                                                                            \
    }
DENSE_ROWS(bf16_rows, bf16x16, 2)
DENSE_ROWS(f16_rows, f16x16, 2)
DENSE_ROWS(f32_rows, f32x16, 4)

/* ---- affine (MLX): groups of 32/64/128 columns, so no tail ---- */

enum { GSPAN = 64 }; /* groups whose scales and biases are widened at once */

/* cnt (<= GSPAN) values from index i0 of an F32/BF16/F16 array: the exact widenings of
 * dr_weight_load_scale, the dtype switch hoisted */
INL void load_scales(const uint8_t *base, dr_dtype dt, int64_t i0, int cnt, float *out) {
    if (dt == DR_DT_F32) {
        memcpy(out, base + 4 * i0, (size_t)cnt * 4);
        return;
    }
    if (dt != DR_DT_BF16 && dt != DR_DT_F16) {
        for (int i = 0; i < cnt; i++) out[i] = dr_weight_load_scale(base, dt, i0 + i);
        return;
    }
    for (int i = 0; i < cnt; i += 16) { /* the last 16 masked: no read past the array */
        __mmask16 m = cnt - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (cnt - i)) - 1u);
        __m256i h = _mm256_maskz_loadu_epi16(m, (const void *)(base + 2 * (i0 + i)));
        _mm512_mask_storeu_ps(out + i, m, dt == DR_DT_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                                                           : _mm512_cvtph_ps(h));
    }
}

/* the scales and biases of the nr rows after [r, r + nr), for the next call (at most 4 KiB each) */
INL void prefetch_next_scales(const dr_weight *w, int64_t r, int nr) {
    if (r + 2 * nr > w->rows) return;
    int64_t el = (int64_t)dr_dtype_size(w->scale_dtype), at = (r + nr) * w->scale_cols * el;
    for (int64_t o = 0; o < nr * w->scale_cols * el && o < 4096; o += 64) {
        _mm_prefetch((const char *)(w->scales + at + o), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->biases + at + o), _MM_HINT_T0);
    }
}

/* Scales BF16/F16: s * q is exact in fp32 (at most 8 + 8 or 11 + 8 significant bits) unless it
 * overflows, so the reference's round(round(s * q) + b) equals fma(s, q, b); |s| <= 2^100 rules
 * out overflow and NaN (the condition of matmul_avx2.c's affine_fma_exact), for every row's cnt */
INL int fma_exact(dr_dtype dt, float sv[][GSPAN], int nr, int cnt) {
    if (dt != DR_DT_BF16 && dt != DR_DT_F16) return 0;
    __mmask16 bad = 0;
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < cnt; j += 16) { /* the last 16 masked */
            __mmask16 m = cnt - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (cnt - j)) - 1u);
            bad |= _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, sv[i] + j)), _mm512_set1_ps(0x1p100f), _CMP_NLE_UQ);
        }
    return bad == 0;
}

/* 4 bits: per group a table t[q] = s * q + b, the reference's two roundings for each code (one fma
 * where that is exact) */
INL void affine4_rows(const dr_weight *w, int64_t r, const int nr, const float *xp, float *y) {
    const int64_t g = w->group, ng = w->scale_cols;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sh = NIB_SHIFT, sh4 = _mm512_add_epi32(sh, _mm512_set1_epi32(4));
    const uint8_t *row[NR];
    const int64_t ahead = PF_AHEAD_ROWS(w, r, nr);
    __m512 a[NR], b[NR];
    FOR_ROWS {
        row[i] = w->data + (size_t)(r + i) * w->row_bytes;
        a[i] = b[i] = _mm512_setzero_ps();
    }
    float sv[NR][GSPAN], bv[NR][GSPAN];
    prefetch_next_scales(w, r, nr);
    int fma_ok = 0;
    for (int64_t gi = 0; gi < ng; gi++) {
        if (gi % GSPAN == 0) {
            int cnt = ng - gi < GSPAN ? (int)(ng - gi) : GSPAN;
            FOR_ROWS {
                load_scales(w->scales, w->scale_dtype, (r + i) * ng + gi, cnt, sv[i]);
                load_scales(w->biases, w->scale_dtype, (r + i) * ng + gi, cnt, bv[i]);
            }
            fma_ok = fma_exact(w->scale_dtype, sv, nr, cnt);
        }
        __m512 t[NR];
        if (fma_ok) FOR_ROWS t[i] = _mm512_fmadd_ps(_mm512_set1_ps(sv[i][gi % GSPAN]), iota, _mm512_set1_ps(bv[i][gi % GSPAN]));
        else FOR_ROWS t[i] = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(sv[i][gi % GSPAN]), iota), _mm512_set1_ps(bv[i][gi % GSPAN]));
        for (int64_t k = gi * g; k < (gi + 1) * g; k += 32) {
            __m512 x0 = _mm512_loadu_ps(xp + k), x1 = _mm512_loadu_ps(xp + k + 16);
            FOR_ROWS {
                PREFETCH(row[i] + k / 2);
                __m512i v = bytes16_bcast(row[i] + k / 2);
                __m512i lo = _mm512_srlv_epi32(v, sh), hi = _mm512_srlv_epi32(v, sh4); /* vpermps: low 4 bits */
                a[i] = _mm512_fmadd_ps(x0, _mm512_permutexvar_ps(PLANT == 1 ? hi : lo, t[i]), a[i]);
                b[i] = _mm512_fmadd_ps(x1, _mm512_permutexvar_ps(PLANT == 1 ? lo : hi, t[i]), b[i]);
            }
        }
    }
    FOR_ROWS y[i] = hsum_pairs(a[i], b[i]);
}

/* 8 bits: s * q then + b per value (the reference's two roundings) */
INL void affine8_rows(const dr_weight *w, int64_t r, const int nr, const float *x, float *y) {
    const int64_t g = w->group, ng = w->scale_cols;
    const uint8_t *row[NR];
    const int64_t ahead = PF_AHEAD_ROWS(w, r, nr);
    __m512 a[NR], b[NR];
    FOR_ROWS {
        row[i] = w->data + (size_t)(r + i) * w->row_bytes;
        a[i] = b[i] = _mm512_setzero_ps();
    }
    float sv[NR][GSPAN], bv[NR][GSPAN];
    prefetch_next_scales(w, r, nr);
    int fma_ok = 0;
    for (int64_t gi = 0; gi < ng; gi++) {
        if (gi % GSPAN == 0) {
            int cnt = ng - gi < GSPAN ? (int)(ng - gi) : GSPAN;
            FOR_ROWS {
                load_scales(w->scales, w->scale_dtype, (r + i) * ng + gi, cnt, sv[i]);
                load_scales(w->biases, w->scale_dtype, (r + i) * ng + gi, cnt, bv[i]);
            }
            fma_ok = fma_exact(w->scale_dtype, sv, nr, cnt);
        }
        __m512 s[NR], bi[NR];
        FOR_ROWS {
            s[i] = _mm512_set1_ps(sv[i][gi % GSPAN] * (PLANT == 1 ? 2.0f : 1.0f));
            bi[i] = _mm512_set1_ps(bv[i][gi % GSPAN]);
        }
#define Q8(off) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(row[i] + k + (off)))))
#define AF8_LOOP(DEQ)                                                              \
    for (int64_t k = gi * g; k < (gi + 1) * g; k += 32) {                           \
        __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);      \
        FOR_ROWS {                                                                  \
            PREFETCH(row[i] + k);                                                   \
            a[i] = _mm512_fmadd_ps(x0, DEQ(Q8(0)), a[i]);                           \
            b[i] = _mm512_fmadd_ps(x1, DEQ(Q8(16)), b[i]);                          \
        }                                                                           \
    }
#define DEQ_FMA(q) _mm512_fmadd_ps(s[i], q, bi[i])
#define DEQ_MUL_ADD(q) _mm512_add_ps(_mm512_mul_ps(s[i], q), bi[i])
        if (fma_ok) AF8_LOOP(DEQ_FMA)
        else AF8_LOOP(DEQ_MUL_ADD)
#undef AF8_LOOP
#undef DEQ_FMA
#undef DEQ_MUL_ADD
#undef Q8
    }
    FOR_ROWS y[i] = hsum_canonical(a[i], b[i]);
}

/* ---- NVFP4: per block of 16 a table t[c] = (e2m1(c) * s) * g, the reference's products ---- */

INL void nvfp4_rows(const dr_weight *w, int64_t r, const int nr, const float *xp, float *y) {
    int64_t cols = w->cols, body = cols & ~(int64_t)31;
    const float *tables = xp + ((cols + 15) & ~(int64_t)15); /* nvfp4_products, built by order_x */
    /* lanes with p(d) >= 8 hold the second block's bytes: index bit 4 picks its table */
    const __m512i second = _mm512_setr_epi32(0, 0, 16, 16, 0, 0, 16, 16, 0, 0, 16, 16, 0, 0, 16, 16);
    const __m512i sh = NIB_SHIFT, sh4 = _mm512_add_epi32(sh, _mm512_set1_epi32(4));
    const __m512i low4 = _mm512_set1_epi32(0xF);
    const uint8_t *row[NR], *srow[NR];
    const int64_t ahead = PF_AHEAD_ROWS(w, r, nr), sahead = pf_ahead(nr * w->scale_cols, (r + nr) * w->scale_cols, w->rows * w->scale_cols);
    __m512 a[NR], b[NR];
    FOR_ROWS {
        row[i] = w->data + (size_t)(r + i) * w->row_bytes;
        srow[i] = w->scales + (size_t)(r + i) * (size_t)w->scale_cols;
        a[i] = b[i] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < body; k += 32) {
        __m512 x0 = _mm512_loadu_ps(xp + k), x1 = _mm512_loadu_ps(xp + k + 16);
        if ((k & 511) == 0) /* the scales: a line per 1024 columns */
            FOR_ROWS _mm_prefetch((const char *)(srow[i] + k / 16) + sahead, _MM_HINT_T0);
        FOR_ROWS {
            PREFETCH(row[i] + k / 2);
            __m512 t0 = _mm512_loadu_ps(tables + 16 * srow[i][k / 16]);
            __m512 t1 = _mm512_loadu_ps(tables + 16 * srow[i][k / 16 + 1]);
            __m512i v = bytes16_bcast(row[i] + k / 2);
            __m512i lo = _mm512_ternarylogic_epi32(_mm512_srlv_epi32(v, sh), low4, second, 0xEA); /* (. & 15) | second */
            __m512i hi = _mm512_ternarylogic_epi32(_mm512_srlv_epi32(v, sh4), low4, second, 0xEA);
            a[i] = _mm512_fmadd_ps(x0, _mm512_permutex2var_ps(t0, lo, t1), a[i]);
            b[i] = _mm512_fmadd_ps(x1, _mm512_permutex2var_ps(t0, hi, t1), b[i]);
        }
    }
    FOR_ROWS {
        float t = hsum_pairs(a[i], b[i]);
        for (int64_t k = body; k < cols; k++) { /* the tail keeps the natural order (order_x) */
            uint8_t code = (k & 1) ? (uint8_t)(row[i][k / 2] >> 4) : (uint8_t)(row[i][k / 2] & 15);
            t = fmaf(xp[k], (dr_e2m1_to_f32(code) * dr_ue4m3_to_f32(srow[i][k / 16])) * w->global_scale, t);
        }
        y[i] = t;
    }
}

/* ---- FP8 E4M3 (per tensor, or blocks whose width is a multiple of 32) ---- */

/* any code 0x7F / 0xFF (NaN) in n bytes, of `avail` from p to the end of the buffer */
TGT static int e4m3_has_nan(const uint8_t *p, int64_t n, int64_t avail) {
    const __m512i m7f = _mm512_set1_epi8(0x7F);
    __m512i mx = _mm512_setzero_si512();
    int64_t i = 0, sa = n + SCAN_AHEAD <= avail ? SCAN_AHEAD : 0; /* in bounds, as pf_ahead */
    for (; i + 64 <= n; i += 64) { /* this scan is the first read of the row: it carries the prefetch */
        _mm_prefetch((const char *)(p + i) + sa, _MM_HINT_T0);
        mx = _mm512_max_epu8(mx, _mm512_and_si512(_mm512_loadu_si512((const void *)(p + i)), m7f));
    }
    int found = _mm512_cmpeq_epi8_mask(mx, m7f) != 0;
    for (; i < n; i++) found |= (p[i] & 0x7F) == 0x7F;
    return found;
}

enum { FP8_MAXBLK = 256 }; /* scale blocks per row the loop takes (wider rows go row by row) */

/* the scales of row r's first nblk blocks (one for FP8_TENSOR) */
TGT static void fp8_row_scales(const dr_weight *w, int64_t r, int64_t nblk, float *out) {
    if (w->fmt == DR_WF_FP8_TENSOR) out[0] = w->global_scale;
    else load_scales(w->scales, w->scale_dtype, (r / w->block_rows) * w->scale_cols, (int)nblk, out);
}

static int64_t fp8_blocks(const dr_weight *w) {
    int64_t body = w->cols & ~(int64_t)31;
    return w->fmt == DR_WF_FP8_TENSOR ? 1 : (body + w->block_cols - 1) / w->block_cols;
}

/* The code bits placed into the fp32 field times (2^120 s): 2^120 s is exact for |s| < 2^7 and
 * e4m3 * (2^120 s) is the same real number as (e4m3 * 2^120) * s, so the single rounding gives the
 * reference's bits (no NaN code: checked first, as the scales, by fp8_row_ok). */
INL void fp8_rows(const dr_weight *w, int64_t r, const int nr, const float *x, float *y) {
    int64_t cols = w->cols, body = cols & ~(int64_t)31, nblk = fp8_blocks(w);
    int64_t bc = w->fmt == DR_WF_FP8_TENSOR ? (body > 0 ? body : 32) : w->block_cols;
    const __m512i keep = _mm512_set1_epi32((int)0x87F00000u); /* sign + 7 code bits */
    const uint8_t *row[NR];
    const int64_t ahead = PF_AHEAD_ROWS(w, r, nr);
    __m512 a[NR], b[NR];
    float sc[NR][FP8_MAXBLK];
    FOR_ROWS {
        row[i] = w->data + (size_t)(r + i) * w->row_bytes;
        a[i] = b[i] = _mm512_setzero_ps();
        fp8_row_scales(w, r + i, nblk, sc[i]);
    }
    for (int64_t c0 = 0, blk = 0; c0 < body; c0 += bc, blk++) {
        __m512 vs[NR];
        FOR_ROWS vs[i] = _mm512_set1_ps(sc[i][blk] * (PLANT == 2 ? 0x1p121f : 0x1p120f));
        int64_t c1 = c0 + bc < body ? c0 + bc : body;
        for (int64_t k = c0; k < c1; k += 32) {
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            FOR_ROWS {
                PREFETCH(row[i] + k);
#define E16(off) _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32( \
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(row[i] + k + (off)))), 20), keep)), vs[i])
                a[i] = _mm512_fmadd_ps(x0, E16(0), a[i]);
                b[i] = _mm512_fmadd_ps(x1, E16(16), b[i]);
#undef E16
            }
        }
    }
    FOR_ROWS {
        float t = hsum_canonical(a[i], b[i]);
        for (int64_t k = body; k < cols; k++) { /* the reference's product, exact for any scale */
            float sk = w->fmt == DR_WF_FP8_TENSOR ? w->global_scale
                                                  : dr_weight_load_scale(w->scales, w->scale_dtype,
                                                                         (r + i) / w->block_rows * w->scale_cols + k / w->block_cols);
            t = fmaf(x[k], dr_e4m3_to_f32(row[i][k]) * sk, t);
        }
        y[i] = t;
    }
}

/* the FP8 loop's condition for row r: blocks a multiple of 32 wide and at most FP8_MAXBLK of them,
 * no NaN code, |scale| < 2^7 for every block of the body (rows of one block row share the check) */
TGT static int fp8_row_ok(const dr_weight *w, int64_t r, int same_scales_as_previous) {
    if (w->fmt == DR_WF_FP8_BLOCK && w->block_cols % 32 != 0) return 0;
    int64_t nblk = fp8_blocks(w);
    if (nblk > FP8_MAXBLK || e4m3_has_nan(w->data + (size_t)r * w->row_bytes, w->cols, (w->rows - r) * w->row_bytes)) return 0;
    if (same_scales_as_previous) return 1;
    float sc[FP8_MAXBLK];
    fp8_row_scales(w, r, nblk, sc);
    __mmask16 bad = 0;
    int64_t j = 0;
    for (; j + 16 <= nblk; j += 16) /* !(|s| < 2^7): NaN compares unordered, so it is bad too */
        bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(sc + j)), _mm512_set1_ps(0x1p7f), _CMP_NLT_UQ);
    for (; j < nblk; j++) bad |= !(fabsf(sc[j]) < 0x1p7f);
    return bad == 0;
}

#define DISPATCH(NRV)                                                           \
    switch (w->fmt) {                                                           \
    case DR_WF_BF16: bf16_rows(w, r, NRV, x, y); return 1;                     \
    case DR_WF_F16: f16_rows(w, r, NRV, x, y); return 1;                       \
    case DR_WF_F32: f32_rows(w, r, NRV, x, y); return 1;                       \
    case DR_WF_NVFP4: nvfp4_rows(w, r, NRV, x, y); return 1;                   \
    case DR_WF_AFFINE:                                                          \
        if (w->bits == 4) affine4_rows(w, r, NRV, x, y);                       \
        else affine8_rows(w, r, NRV, x, y);                                     \
        return 1;                                                               \
    case DR_WF_FP8_TENSOR:                                                      \
    case DR_WF_FP8_BLOCK: fp8_rows(w, r, NRV, x, y); return 1;                 \
    default: return 0;                                                          \
    }

static int covered(const dr_weight *w, int64_t r, int nr) {
    if (w->fmt == DR_WF_AFFINE) return (w->bits == 4 || w->bits == 8) && w->group % 32 == 0;
    if (w->fmt == DR_WF_FP8_TENSOR || w->fmt == DR_WF_FP8_BLOCK) {
        for (int i = 0; i < nr; i++) {
            int same = i > 0 && (w->fmt == DR_WF_FP8_TENSOR || (r + i) / w->block_rows == (r + i - 1) / w->block_rows);
            if (!fp8_row_ok(w, r + i, same)) return 0;
        }
        return 1;
    }
    return w->fmt == DR_WF_BF16 || w->fmt == DR_WF_F16 || w->fmt == DR_WF_F32 || w->fmt == DR_WF_NVFP4;
}

TGT static int fused1(const dr_weight *w, int64_t r, const float *x, float *y) { DISPATCH(1) }

/* x in the order AVX512_NAME(order_x) gives for w; returns 0 (nothing written) when a row is
 * outside what these loops cover exactly (then the caller goes row by row). */
TGT int AVX512_NAME(fused_rows)(const dr_weight *w, int64_t r, int nr, const float *x, float *y) {
    if (nr < 1 || nr > NR || !covered(w, r, nr)) return 0;
    if (nr == NR) DISPATCH(NR)
    for (int i = 0; i < nr; i++) fused1(w, r + i, x, y + i);
    return 1;
}

TGT int AVX512_NAME(fused_row)(const dr_weight *w, int64_t r, const float *x, float *y) {
    return covered(w, r, 1) && fused1(w, r, x, y);
}

#else /* not x86: never selected (dr_cpu_best_path returns portable); defined for the linker */

int AVX512_NAME(order_x)(const dr_weight *w, const float *x, float *xp) { return 0; }
int AVX512_NAME(fused_rows)(const dr_weight *w, int64_t r, int nr, const float *x, float *y) { return 0; }
int AVX512_NAME(fused_row)(const dr_weight *w, int64_t r, const float *x, float *y) { return 0; }
#endif
