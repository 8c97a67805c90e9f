/* matmul_avx2.c - AVX2/FMA/F16C dequantisation and the canonical dot product (kernels.h).
 * Compiled for every x86-64 build through target attributes and called only after a run-time
 * CPU check, so the binary still runs on older CPUs. Every dequantised value equals
 * dr_weight_dequant_row's bit for bit: the same fp32 operations, or ones shown equal where they
 * differ (NVFP4 tables, affine fma), with a fallback wherever that argument does not hold
 * (tests/unit/test_kernels_fastpaths.c probes each switch). */
#include "backend/cpu/kernels.h"

/* matmul_avx2_plant*.c compile this file again with PLANT = 1..4 (a defect inside the vector
 * loops, for `drama contract`'s controls) under the names AVX2_NAME gives them. */
#ifndef AVX2_NAME
#define AVX2_NAME(f) dr_cpu_avx2_##f
#define PLANT 0
#endif

#include <math.h>
#include <string.h>

#include "num/formats.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))

#include "backend/cpu/prefetch.h"

TGT static inline __m256i load8_u8(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v));
}

TGT static inline __m256i load8_i8(const uint8_t *p) { /* sign-extended */
    uint64_t v;
    memcpy(&v, p, 8);
    return _mm256_cvtepi8_epi32(_mm_cvtsi64_si128((long long)v));
}

/* E4M3 bits placed into the fp32 exponent/mantissa field and scaled by 2^(127-7): exact for
 * normals and subnormals alike; 0x7F/0xFF become NaN as in the table. (E4M3 subnormal codes pass
 * through an fp32 denormal here: a process running with denormals-are-zero set would lose them.) */
TGT static inline __m256 e4m3x8(__m256i b) {
    __m256i em = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    __m256 mag = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 20)), _mm256_set1_ps(0x1p120f));
    __m256 nan_mask = _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7F)));
    mag = _mm256_blendv_ps(mag, _mm256_set1_ps(NAN), nan_mask);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

/* any code 0x7F / 0xFF (NaN) in n bytes, of `avail` from p to the end of the buffer: the largest
 * low-7-bit value is 0x7F */
TGT static int e4m3_row_has_nan(const uint8_t *p, int64_t n, int64_t avail) {
    const __m256i m7f = _mm256_set1_epi8(0x7F);
    __m256i mx = _mm256_setzero_si256();
    int64_t i = 0, sa = n + SCAN_AHEAD <= avail ? SCAN_AHEAD : 0; /* in bounds, as pf_ahead */
    for (; i + 64 <= n; i += 64) { /* the first read of an FP8 row: it carries the prefetch */
        _mm_prefetch((const char *)(p + i) + sa, _MM_HINT_T0);
        __m256i v0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + i)), m7f);
        __m256i v1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32)), m7f);
        mx = _mm256_max_epu8(mx, _mm256_max_epu8(v0, v1));
    }
    for (; i + 32 <= n; i += 32)
        mx = _mm256_max_epu8(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + i)), m7f));
    int found = _mm256_movemask_epi8(_mm256_cmpeq_epi8(mx, m7f)) != 0;
    for (; i < n; i++) found |= (p[i] & 0x7F) == 0x7F;
    return found;
}

/* eight 4-bit codes of a little-endian word, element k from bits 4k..4k+3 */
TGT static inline __m256i nibbles8(const uint8_t *p) {
    uint32_t word;
    memcpy(&word, p, 4);
    __m256i v = _mm256_set1_epi32((int)word);
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_and_si256(v, _mm256_set1_epi32(0xF));
}

TGT static inline __m256 e2m1x8(__m256i code) {
    const __m256 mags = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m256 mag = _mm256_permutevar8x32_ps(mags, code); /* uses the low 3 bits */
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

/* NVFP4 block table: lane i < 8 holds (e2m1(i) * s) * g, the reference's two products for the
 * positive code i, XOR (i << 28). XOR-ing a code placed at bits 28..31 (nibble << 28, zeros below)
 * then cancels the index bits and applies the code's sign bit: -(a) is the reference's product for
 * the negative code whenever it is not NaN (callers fall back when g is not finite or a block
 * scale is a NaN code, the only ways to get a NaN). */
TGT static inline __m256 nvfp4_table(uint8_t scale_code, __m256 vg) {
    const __m256 mags = PLANT == 3 ? _mm256_setr_ps(0.0f, 0.5f, 1.5f, 1.0f, 2.0f, 3.0f, 4.0f, 6.0f)
                                   : _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i idx_bits = _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28);
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(mags, _mm256_set1_ps(dr_ue4m3_to_f32(scale_code))), vg);
    return _mm256_xor_ps(t, _mm256_castsi256_ps(idx_bits));
}

/* eight NVFP4 values of a little-endian word through a block table (nvfp4_table) */
TGT static inline __m256 nvfp4x8(uint32_t word, __m256 table) {
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    __m256 mag = _mm256_permutevar8x32_ps(table, v); /* uses the low 3 bits */
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));
}

TGT static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* NVFP4 tables of every scale code byte (the sign bit is ignored: c and c | 0x80 get the same one)
 * for the product's global scale, built once per product by order_x after x (8 floats each)
 * instead of per block and row */
TGT static void nvfp4_products(float g, float *tables) {
    const __m256 vg = _mm256_set1_ps(g);
    for (int c = 0; c < 256; c++) _mm256_storeu_ps(tables + 8 * c, nvfp4_table((uint8_t)c, vg));
}

/* the table path's condition (nvfp4_table): finite global scale, no NaN block scale in the row */
TGT static int nvfp4_row_tables_exact(const dr_weight *w, int64_t r, const uint8_t *srow) {
    return isfinite(w->global_scale) && !e4m3_row_has_nan(srow, w->scale_cols, (w->rows - r) * w->scale_cols);
}

/* Affine groups whose scales are BF16/F16: s * q is exact in fp32 (at most 8 + 8 or 11 + 8
 * significant bits, subnormal scales included) unless it overflows, so the reference's
 * round(round(s * q) + b) equals fma(s, q, b). |s| <= 2^100 rules out overflow (and NaN). */
/* inlined (as load_scales): called per row and span, a call cost 12-15% of a 512-column affine product */
TGT static inline __attribute__((always_inline)) int affine_fma_exact(const dr_weight *w, const float *sv, int cnt) {
    if (w->scale_dtype == DR_DT_F32) return 0;
    int i = 0, bad = 0; /* 8 at a time: NaN compares false (LE ordered), so it is bad too */
    const __m256 lim = _mm256_set1_ps(0x1p100f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (; i + 8 <= cnt; i += 8)
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(sv + i), absm), lim, _CMP_LE_OQ)) != 0xFF;
    for (; i < cnt; i++) bad |= !(fabsf(sv[i]) <= 0x1p100f);
    return !bad;
}

/* cnt scale (or bias) values from index i0 of an F32/BF16/F16 array, the dtype switch hoisted
 * (BF16, the MLX default: 8 at a time, the exact widening of dr_bf16_to_f32) */
TGT static inline __attribute__((always_inline)) void load_scales(const uint8_t *base, dr_dtype dt, int64_t i0, int cnt, float *out) {
    if (dt == DR_DT_F32) {
        memcpy(out, base + 4 * i0, (size_t)cnt * 4);
    } else if (dt == DR_DT_BF16) {
        int i = 0;
        for (; i + 8 <= cnt; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(base + 2 * (i0 + i)));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        }
        for (; i < cnt; i++) {
            uint16_t h;
            memcpy(&h, base + 2 * (i0 + i), 2);
            out[i] = dr_bf16_to_f32(h);
        }
    } else {
        for (int i = 0; i < cnt; i++) out[i] = dr_weight_load_scale(base, dt, i0 + i);
    }
}

TGT void AVX2_NAME(dequant_row)(const dr_weight *w, int64_t r, float *out) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    int64_t cols = w->cols;
    switch (w->fmt) {
    case DR_WF_F32: memcpy(out, row, (size_t)cols * 4); return;
    case DR_WF_BF16: {
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + 2 * c));
            __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(out + c, _mm256_castsi256_ps(v));
        }
        for (; c < cols; c++) {
            uint16_t h;
            memcpy(&h, row + 2 * c, 2);
            out[c] = dr_bf16_to_f32(h);
        }
        return;
    }
    case DR_WF_F16: {
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8)
            _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * c))));
        for (; c < cols; c++) {
            uint16_t h;
            memcpy(&h, row + 2 * c, 2);
            out[c] = dr_f16_to_f32(h);
        }
        return;
    }
    case DR_WF_FP8_TENSOR:
    case DR_WF_FP8_BLOCK: {
        int per_tensor = w->fmt == DR_WF_FP8_TENSOR;
        int has_nan = e4m3_row_has_nan(row, cols, (w->rows - r) * w->row_bytes); /* one cheap byte scan instead of a blend per code */
        int64_t bc = per_tensor ? cols : w->block_cols;
        int64_t sbase = per_tensor ? 0 : (r / w->block_rows) * w->scale_cols;
        /* one segment per scale block, so a block width that is not a multiple of 8 still works */
        for (int64_t c0 = 0; c0 < cols; c0 += bc) {
            int64_t c1 = c0 + bc < cols ? c0 + bc : cols;
            float s = per_tensor ? w->global_scale : dr_weight_load_scale(w->scales, w->scale_dtype, sbase + c0 / bc);
            int64_t c = c0;
            if (!has_nan && fabsf(s) < 0x1p7f) {
                /* fast path: the code bits placed into the fp32 field times (2^120 s). 2^120 s is
                 * exact here, and e4m3 * (2^120 s) is the same real number as (e4m3 * 2^120) * s, so
                 * the single rounding gives the reference's bits. */
                __m256 vs = _mm256_set1_ps(s * (PLANT == 2 ? 0x1p121f : 0x1p120f));
                const __m256i keep = _mm256_set1_epi32((int)0x87F00000u); /* sign + 7 code bits */
                for (; c + 8 <= c1; c += 8) {
                    uint64_t v;
                    memcpy(&v, row + c, 8);
                    __m256i b = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128((long long)v)); /* sign-extended */
                    __m256i f = _mm256_and_si256(_mm256_slli_epi32(b, 20), keep);
                    _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_castsi256_ps(f), vs));
                }
            } else {
                __m256 vs = _mm256_set1_ps(s);
                for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(out + c, _mm256_mul_ps(e4m3x8(load8_u8(row + c)), vs));
            }
            for (; c < c1; c++) out[c] = dr_e4m3_to_f32(row[c]) * s;
        }
        return;
    }
    case DR_WF_NVFP4: {
        const uint8_t *srow = w->scales + (size_t)r * (size_t)w->scale_cols;
        __m256 g = _mm256_set1_ps(w->global_scale);
        if (nvfp4_row_tables_exact(w, r, srow)) {
            for (int64_t c = 0; c < cols; c += 16) { /* cols % 16 == 0 is checked at bind */
                __m256 t = nvfp4_table(srow[c / 16], g);
                _mm256_storeu_ps(out + c, nvfp4x8(load_u32(row + c / 2), t));
                _mm256_storeu_ps(out + c + 8, nvfp4x8(load_u32(row + c / 2 + 4), t));
            }
            return;
        }
        for (int64_t c = 0; c < cols; c += 16) {
            __m256 s = _mm256_set1_ps(dr_ue4m3_to_f32(srow[c / 16]));
            __m256 lo = _mm256_mul_ps(e2m1x8(nibbles8(row + c / 2)), s);
            __m256 hi = _mm256_mul_ps(e2m1x8(nibbles8(row + c / 2 + 4)), s);
            _mm256_storeu_ps(out + c, _mm256_mul_ps(lo, g));
            _mm256_storeu_ps(out + c + 8, _mm256_mul_ps(hi, g));
        }
        return;
    }
    case DR_WF_AFFINE: {
        int64_t sbase = r * w->scale_cols;
        int64_t g = w->group; /* 32, 64 or 128: a multiple of 8 */
        float sv[64], bv[64];
        int fma_ok = 0;
        for (int64_t gi = 0, c0 = 0; c0 < cols; gi++, c0 += g) { /* no division per group */
            if ((gi & 63) == 0) { /* scales and biases of the next 64 groups, the dtype switch hoisted */
                int cnt = w->scale_cols - gi < 64 ? (int)(w->scale_cols - gi) : 64;
                load_scales(w->scales, w->scale_dtype, sbase + gi, cnt, sv);
                load_scales(w->biases, w->scale_dtype, sbase + gi, cnt, bv);
                fma_ok = affine_fma_exact(w, sv, cnt);
            }
            __m256 s = _mm256_set1_ps(sv[gi & 63]);
            __m256 b = _mm256_set1_ps(bv[gi & 63]);
            /* the reference's two roundings: one fma where s * q is exact, else mul then add */
            const uint8_t *pg = row + (size_t)c0 * (size_t)w->bits / 8;
            if (w->bits == 4 && fma_ok)
                for (int64_t c = 0; c < g; c += 8)
                    _mm256_storeu_ps(out + c0 + c, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(nibbles8(pg + c / 2)), b));
            else if (fma_ok)
                for (int64_t c = 0; c < g; c += 8)
                    _mm256_storeu_ps(out + c0 + c, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(load8_u8(pg + c)), b));
            else
                for (int64_t c = 0; c < g; c += 8) {
                    __m256i q = w->bits == 4 ? nibbles8(pg + c / 2) : load8_u8(pg + c);
                    _mm256_storeu_ps(out + c0 + c, _mm256_add_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(q)), b));
                }
        }
        return;
    }
    default: dr_weight_dequant_row(w, r, out); return;
    }
}

TGT static inline float hsum_canonical(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), PLANT == 4 ? a2 : _mm256_add_ps(a2, a3));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* v_j + v_{j+4} */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 /* (0+2), (1+3) */
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

TGT void AVX2_NAME(dot_rows)(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y,
                              int64_t ldy) {
    int64_t body = len & ~(int64_t)31;
    int64_t b = 0;
    /* two activation rows per pass: each weight load feeds two independent accumulator sets */
    for (; b + 2 <= n; b += 2) {
        const float *xa = x + b * ldx, *xb = xa + ldx;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int64_t k = 0; k < body; k += 32) {
            __m256 w0 = _mm256_loadu_ps(wrow + k), w1 = _mm256_loadu_ps(wrow + k + 8);
            __m256 w2 = _mm256_loadu_ps(wrow + k + 16), w3 = _mm256_loadu_ps(wrow + k + 24);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k), w0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 8), w1, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 16), w2, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 24), w3, a3);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + k), w0, b0);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + k + 8), w1, b1);
            b2 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + k + 16), w2, b2);
            b3 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + k + 24), w3, b3);
        }
        float ta = hsum_canonical(a0, a1, a2, a3), tb = hsum_canonical(b0, b1, b2, b3);
        for (int64_t k = body; k < len; k++) {
            ta = fmaf(xa[k], wrow[k], ta);
            tb = fmaf(xb[k], wrow[k], tb);
        }
        y[b * ldy] = ta;
        y[(b + 1) * ldy] = tb;
    }
    for (; b < n; b++) {
        const float *xa = x + b * ldx;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < body; k += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k), _mm256_loadu_ps(wrow + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 8), _mm256_loadu_ps(wrow + k + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 16), _mm256_loadu_ps(wrow + k + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k + 24), _mm256_loadu_ps(wrow + k + 24), a3);
        }
        float ta = hsum_canonical(a0, a1, a2, a3);
        for (int64_t k = body; k < len; k++) ta = fmaf(xa[k], wrow[k], ta);
        y[b * ldy] = ta;
    }
}

/* Affine 4-bit bytes hold elements (2j, 2j+1): the n = 1 loop widens 8 bytes to lanes and splits
 * the nibbles (and / shift) instead of a variable shift per 8 codes, which yields the even and
 * then the odd elements of each 16. x is put in that order once per product; lane l of each
 * accumulator still sums one canonical s[j] in the same order, and pair_unorder puts the lanes
 * back before the reduction, so the bits do not change. */
TGT int AVX2_NAME(order_x)(const dr_weight *w, const float *x, float *xp) {
    if (w->fmt == DR_WF_NVFP4) { /* natural order, then the tables the fused loop reads */
        memcpy(xp, x, (size_t)w->cols * sizeof *xp);
        nvfp4_products(w->global_scale, xp + ((w->cols + 15) & ~(int64_t)15));
        return 1;
    }
    if (w->fmt != DR_WF_AFFINE || w->bits != 4) return 0;
    int64_t body = w->cols & ~(int64_t)31;
    /* per 16: evens then odds (xp[k + l] = x[k + 2l], xp[k + 8 + l] = x[k + 2l + 1]); moves only */
    for (int64_t k = 0; k < body; k += 16) {
        __m256 a = _mm256_loadu_ps(x + k), b = _mm256_loadu_ps(x + k + 8);
        __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)); /* a0 a2 b0 b2 | a4 a6 b4 b6 */
        __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        _mm256_storeu_ps(xp + k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), _MM_SHUFFLE(3, 1, 2, 0))));
        _mm256_storeu_ps(xp + k + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), _MM_SHUFFLE(3, 1, 2, 0))));
    }
    for (int64_t k = body; k < w->cols; k++) xp[k] = x[k];
    return 1;
}

/* (evens, odds) of 16 sums -> sums 0..7, 8..15 */
TGT static inline void pair_unorder(__m256 ev, __m256 od, __m256 *c0, __m256 *c1) {
    __m256 lo = _mm256_unpacklo_ps(ev, od), hi = _mm256_unpackhi_ps(ev, od);
    *c0 = _mm256_permute2f128_ps(lo, hi, 0x20);
    *c1 = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* n = 1 without the row buffer: decode 32 weights into registers and feed the FMAs directly.
 * Same decoded values and the same canonical order as dequant_row + dot_rows, so the same bits.
 * Handles F32, F16, BF16, NVFP4, affine, and FP8 (per-tensor, or blocks whose width is a multiple
 * of 32) without NaN codes and with |scale| < 2^7; returns 0 (nothing written) otherwise. */
TGT int AVX2_NAME(fused_row)(const dr_weight *w, int64_t r, const float *x, float *y) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const int64_t ahead = PF_STREAM_ROW(w, r);
    int64_t cols = w->cols, body = cols & ~(int64_t)31;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float t;
    if (w->fmt == DR_WF_BF16) {
        for (int64_t k = 0; k < body; k += 32) {
            const uint8_t *p = row + 2 * k;
            PREFETCH(p);
#define BF8(j) _mm256_castsi256_ps(_mm256_slli_epi32( \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * (j)))), 16))
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), BF8(0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), BF8(1), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), BF8(2), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), BF8(3), a3);
#undef BF8
        }
        t = hsum_canonical(a0, a1, a2, a3);
        for (int64_t k = body; k < cols; k++) {
            uint16_t h;
            memcpy(&h, row + 2 * k, 2);
            t = fmaf(x[k], dr_bf16_to_f32(h), t);
        }
        *y = t;
        return 1;
    }
    if (w->fmt == DR_WF_F16 || w->fmt == DR_WF_F32) {
        int half = w->fmt == DR_WF_F16;
        for (int64_t k = 0; k < body; k += 32) {
            PREFETCH(row + (half ? 2 : 4) * k);
#define D8(j) (half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * (k + 8 * (j))))) \
                    : _mm256_loadu_ps((const float *)(const void *)(row + 4 * (k + 8 * (j)))))
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), D8(0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), D8(1), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), D8(2), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), D8(3), a3);
#undef D8
        }
        t = hsum_canonical(a0, a1, a2, a3);
        for (int64_t k = body; k < cols; k++) {
            float v;
            if (half) {
                uint16_t h;
                memcpy(&h, row + 2 * k, 2);
                v = dr_f16_to_f32(h);
            } else {
                memcpy(&v, row + 4 * k, 4);
            }
            t = fmaf(x[k], v, t);
        }
        *y = t;
        return 1;
    }
    if (w->fmt == DR_WF_NVFP4) {
        const uint8_t *srow = w->scales + (size_t)r * (size_t)w->scale_cols;
        float g = w->global_scale;
        const __m256 vg = _mm256_set1_ps(g);
        if (r + 1 < w->rows) PREFETCH_SPAN(srow, w->scale_cols, w->scale_cols); /* the next row's scales */
        int tables = nvfp4_row_tables_exact(w, r, srow);
        const float *tab = x + ((cols + 15) & ~(int64_t)15); /* nvfp4_products, built by order_x */
        for (int64_t k = 0; tables && k < body; k += 32) {
            /* two blocks of 16: one table each, then per 8 codes srlv, permute, shift, xor, fma */
            __m256 t0 = _mm256_loadu_ps(tab + 8 * srow[k / 16]), t1 = _mm256_loadu_ps(tab + 8 * srow[k / 16 + 1]);
            const uint8_t *p = row + k / 2;
            PREFETCH(p);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), nvfp4x8(load_u32(p), t0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), nvfp4x8(load_u32(p + 4), t0), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), nvfp4x8(load_u32(p + 8), t1), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), nvfp4x8(load_u32(p + 12), t1), a3);
        }
        for (int64_t k = 0; !tables && k < body; k += 32) {
            /* (e2m1 * s) is exact, then * g: the reference's single rounding */
            __m256 s0 = _mm256_set1_ps(dr_ue4m3_to_f32(srow[k / 16]));
            __m256 s1 = _mm256_set1_ps(dr_ue4m3_to_f32(srow[k / 16 + 1]));
            const uint8_t *p = row + k / 2;
            PREFETCH(p);
#define NV8(off, sv) _mm256_mul_ps(_mm256_mul_ps(e2m1x8(nibbles8(p + (off))), sv), vg)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), NV8(0, s0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), NV8(4, s0), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), NV8(8, s1), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), NV8(12, s1), a3);
#undef NV8
        }
        t = hsum_canonical(a0, a1, a2, a3);
        for (int64_t k = body; k < cols; k++) {
            uint8_t code = (k & 1) ? (uint8_t)(row[k / 2] >> 4) : (uint8_t)(row[k / 2] & 15);
            t = fmaf(x[k], (dr_e2m1_to_f32(code) * dr_ue4m3_to_f32(srow[k / 16])) * g, t);
        }
        *y = t;
        return 1;
    }
    if (w->fmt == DR_WF_AFFINE) { /* groups of 32/64/128: every 32-chunk lies in one group, no tail */
        int64_t sbase = r * w->scale_cols, g = w->group;
        int lg = g == 32 ? 5 : g == 64 ? 6 : 7;
        const __m256i low4 = _mm256_set1_epi32(0xF);
        float sv[64], bv[64];
        if (r + 1 < w->rows) { /* the next row's scales and biases */
            int64_t el = (int64_t)dr_dtype_size(w->scale_dtype);
            PREFETCH_SPAN(w->scales + sbase * el, w->scale_cols * el, w->scale_cols * el);
            PREFETCH_SPAN(w->biases + sbase * el, w->scale_cols * el, w->scale_cols * el);
        }
        /* spans of up to 64 groups: scales and biases loaded once, then one flat loop over the
         * span's columns per (bits, exactness) case, so no branch or loop setup runs per group */
        for (int64_t gi = 0; gi < w->scale_cols; gi += 64) {
            int cnt = w->scale_cols - gi < 64 ? (int)(w->scale_cols - gi) : 64;
            load_scales(w->scales, w->scale_dtype, sbase + gi, cnt, sv);
            load_scales(w->biases, w->scale_dtype, sbase + gi, cnt, bv);
            int fma_ok = affine_fma_exact(w, sv, cnt);
            int64_t c0 = gi << lg, span = (int64_t)cnt << lg;
            const uint8_t *ps = row + (size_t)c0 * (size_t)w->bits / 8; /* the span's codes */
            const float *xs = x + c0;
#define AF_LOOP(Q8, SH, DEQ) /* SH: log2(8 / bits) */                                     \
    for (int64_t k = 0; k < span; k += 32) {                                                  \
        const uint8_t *pk = ps + (k >> (SH));                                                 \
        PREFETCH(pk);                                                                         \
        __m256 sc = _mm256_broadcast_ss(sv + (k >> lg)), bi = _mm256_broadcast_ss(bv + (k >> lg)); \
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k), DEQ(Q8(0)), a0);                        \
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 8), DEQ(Q8(1)), a1);                    \
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 16), DEQ(Q8(2)), a2);                   \
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 24), DEQ(Q8(3)), a3);                   \
    }
/* pair order (dr_cpu_avx2_order_x): j = 0/1 even/odd codes of bytes 0..7, 2/3 of bytes 8..15 */
#define Q4(j) _mm256_cvtepi32_ps(((j) & 1) != (PLANT == 1) ? _mm256_srli_epi32(load8_u8(pk + 8 * ((j) >> 1)), 4) \
                                         : _mm256_and_si256(load8_u8(pk + 8 * ((j) >> 1)), low4))
#define Q8(j) _mm256_cvtepi32_ps(load8_u8(pk + 8 * (j)))
#define DEQ_FMA(q) _mm256_fmadd_ps(sc, q, bi)
#define DEQ_MUL_ADD(q) _mm256_add_ps(_mm256_mul_ps(sc, q), bi)
            if (w->bits == 4 && fma_ok) AF_LOOP(Q4, 1, DEQ_FMA)
            else if (w->bits == 4) AF_LOOP(Q4, 1, DEQ_MUL_ADD)
            else if (fma_ok) AF_LOOP(Q8, 0, DEQ_FMA)
            else AF_LOOP(Q8, 0, DEQ_MUL_ADD)
#undef AF_LOOP
#undef Q4
#undef Q8
#undef DEQ_FMA
#undef DEQ_MUL_ADD
        }
        if (w->bits == 4) { /* accumulators in pair order -> canonical lanes */
            __m256 c0, c1, c2, c3;
            pair_unorder(a0, a1, &c0, &c1);
            pair_unorder(a2, a3, &c2, &c3);
            a0 = c0, a1 = c1, a2 = c2, a3 = c3;
        }
        *y = hsum_canonical(a0, a1, a2, a3);
        return 1;
    }
    if (w->fmt != DR_WF_FP8_TENSOR && w->fmt != DR_WF_FP8_BLOCK) return 0;
    int per_tensor = w->fmt == DR_WF_FP8_TENSOR;
    int64_t bc = per_tensor ? cols : w->block_cols;
    if (!per_tensor && bc % 32 != 0) return 0;
    int64_t sbase = per_tensor ? 0 : (r / w->block_rows) * w->scale_cols;
    int64_t nsc = per_tensor ? 1 : w->scale_cols;
    if (e4m3_row_has_nan(row, cols, (w->rows - r) * w->row_bytes)) return 0;
    const __m256i keep = _mm256_set1_epi32((int)0x87F00000u);
    float sv[64];
    /* block by block (no division in the loop); scales fetched and checked 64 blocks at a time
     * (the tail after body uses the scalar reference product, exact for any scale) */
    for (int64_t c0 = 0, bi = 0; c0 < body; c0 += bc, bi++) {
        if (per_tensor) sv[0] = w->global_scale;
        else if ((bi & 63) == 0)
            load_scales(w->scales, w->scale_dtype, sbase + bi, nsc - bi < 64 ? (int)(nsc - bi) : 64, sv);
        float s = sv[per_tensor ? 0 : bi & 63];
        if (!(fabsf(s) < 0x1p7f)) return 0; /* nothing written yet */
        __m256 vs = _mm256_set1_ps(s * (PLANT == 2 ? 0x1p121f : 0x1p120f));
        int64_t c1 = c0 + bc < body ? c0 + bc : body;
        for (int64_t k = c0; k < c1; k += 32) {
            PREFETCH(row + k);
#define E8(j) _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(load8_i8(row + k + 8 * (j)), 20), \
        keep)), vs)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), E8(0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), E8(1), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), E8(2), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), E8(3), a3);
#undef E8
        }
    }
    t = hsum_canonical(a0, a1, a2, a3);
    for (int64_t k = body; k < cols; k++) {
        float sk = per_tensor ? w->global_scale : dr_weight_load_scale(w->scales, w->scale_dtype, sbase + k / bc);
        t = fmaf(x[k], dr_e4m3_to_f32(row[k]) * sk, t);
    }
    *y = t;
    return 1;
}


/* ---- n = 1, two rows at a time (fused_rows): NVFP4 and affine 4-bit ----
 * Each row keeps its own four accumulators and exactly fused_row's operations in the same order
 * (so the same bits: the affine loop takes fma only where both rows' spans allow it, and the
 * mul-then-add it uses otherwise is the reference's own pair of roundings), but the two rows'
 * FMA chains and memory streams overlap, the x loads are shared, and the driver calls once per
 * DR_CPU_FUSED_ROWS rows instead of once per row. */

/* the scalar tail of an NVFP4 row after its body (cols % 32 == 16) */
static float nvfp4_tail(const dr_weight *w, const uint8_t *row, const uint8_t *srow, const float *x, int64_t body, float t) {
    for (int64_t k = body; k < w->cols; k++) {
        uint8_t code = (k & 1) ? (uint8_t)(row[k / 2] >> 4) : (uint8_t)(row[k / 2] & 15);
        t = fmaf(x[k], (dr_e2m1_to_f32(code) * dr_ue4m3_to_f32(srow[k / 16])) * w->global_scale, t);
    }
    return t;
}

/* eight NVFP4 values through the table at t (the load folds into vpermps) */
#define NVT8(p, t) nvfp4x8(load_u32(p), _mm256_loadu_ps(t))

TGT static void nvfp4_pair(const dr_weight *w, int64_t r, const float *x, float *y, int64_t ahead) {
    int64_t cols = w->cols, body = cols & ~(int64_t)31;
    const uint8_t *ra = w->data + (size_t)r * w->row_bytes, *rb = ra + w->row_bytes;
    const uint8_t *sa = w->scales + (size_t)r * (size_t)w->scale_cols, *sb = sa + w->scale_cols;
    const float *tab = x + ((cols + 15) & ~(int64_t)15); /* nvfp4_products, built by order_x */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < body; k += 32) {
        const uint8_t *pa = ra + k / 2, *pb = rb + k / 2;
        const float *ta0 = tab + 8 * (size_t)sa[k / 16], *ta1 = tab + 8 * (size_t)sa[k / 16 + 1];
        const float *tb0 = tab + 8 * (size_t)sb[k / 16], *tb1 = tab + 8 * (size_t)sb[k / 16 + 1];
        PREFETCH(pa);
        PREFETCH(pb);
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        a0 = _mm256_fmadd_ps(x0, NVT8(pa, ta0), a0);
        b0 = _mm256_fmadd_ps(x0, NVT8(pb, tb0), b0);
        a1 = _mm256_fmadd_ps(x1, NVT8(pa + 4, ta0), a1);
        b1 = _mm256_fmadd_ps(x1, NVT8(pb + 4, tb0), b1);
        a2 = _mm256_fmadd_ps(x2, NVT8(pa + 8, ta1), a2);
        b2 = _mm256_fmadd_ps(x2, NVT8(pb + 8, tb1), b2);
        a3 = _mm256_fmadd_ps(x3, NVT8(pa + 12, ta1), a3);
        b3 = _mm256_fmadd_ps(x3, NVT8(pb + 12, tb1), b3);
    }
    y[0] = nvfp4_tail(w, ra, sa, x, body, hsum_canonical(a0, a1, a2, a3));
    y[1] = nvfp4_tail(w, rb, sb, x, body, hsum_canonical(b0, b1, b2, b3));
}
#undef NVT8

TGT static void affine4_pair(const dr_weight *w, int64_t r, const float *x, float *y, int64_t ahead) {
    int64_t g = w->group, ng = w->scale_cols;
    int lg = g == 32 ? 5 : g == 64 ? 6 : 7;
    const __m256i low4 = _mm256_set1_epi32(0xF);
    const uint8_t *ra = w->data + (size_t)r * w->row_bytes, *rb = ra + w->row_bytes;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    float sva[64], bva[64], svb[64], bvb[64];
    for (int64_t gi = 0; gi < ng; gi += 64) { /* as fused_row: spans of up to 64 groups */
        int cnt = ng - gi < 64 ? (int)(ng - gi) : 64;
        load_scales(w->scales, w->scale_dtype, r * ng + gi, cnt, sva);
        load_scales(w->biases, w->scale_dtype, r * ng + gi, cnt, bva);
        load_scales(w->scales, w->scale_dtype, (r + 1) * ng + gi, cnt, svb);
        load_scales(w->biases, w->scale_dtype, (r + 1) * ng + gi, cnt, bvb);
        int fma_ok = affine_fma_exact(w, sva, cnt) && affine_fma_exact(w, svb, cnt);
        int64_t c0 = gi << lg, span = (int64_t)cnt << lg;
        const uint8_t *qa = ra + c0 / 2, *qb = rb + c0 / 2;
        const float *xs = x + c0;
/* pair order (order_x): j = 0/1 even/odd codes of bytes 0..7 (v), 2/3 of bytes 8..15 (u) */
#define LO4(v) _mm256_cvtepi32_ps(_mm256_and_si256(v, low4))
#define HI4(v) _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4))
/* one row's 32 weights: row A then row B, so that only one row's codes, scale and bias are live
 * (8 accumulators + 5: no spill of an accumulator; x comes from memory, twice, from L1) */
#define AF2_ROW(DEQ, q, sv, bv, c0, c1, c2, c3)                                                   \
    do {                                                                                           \
        const uint8_t *pk = (q) + k / 2;                                                           \
        PREFETCH(pk);                                                                              \
        __m256i v = load8_u8(pk), u = load8_u8(pk + 8);                                            \
        __m256 sc = _mm256_broadcast_ss((sv) + (k >> lg)), bi = _mm256_broadcast_ss((bv) + (k >> lg)); \
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k), DEQ(sc, PLANT == 1 ? HI4(v) : LO4(v), bi), c0);       \
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 8), DEQ(sc, PLANT == 1 ? LO4(v) : HI4(v), bi), c1);   \
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 16), DEQ(sc, PLANT == 1 ? HI4(u) : LO4(u), bi), c2);  \
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(xs + k + 24), DEQ(sc, PLANT == 1 ? LO4(u) : HI4(u), bi), c3);  \
    } while (0)
#define AF2_LOOP(DEQ)                                          \
    for (int64_t k = 0; k < span; k += 32) {                   \
        AF2_ROW(DEQ, qa, sva, bva, a0, a1, a2, a3);            \
        AF2_ROW(DEQ, qb, svb, bvb, b0, b1, b2, b3);            \
    }
#define DEQ2_FMA(s, q, b) _mm256_fmadd_ps(s, q, b)
#define DEQ2_MUL_ADD(s, q, b) _mm256_add_ps(_mm256_mul_ps(s, q), b)
        if (fma_ok) AF2_LOOP(DEQ2_FMA)
        else AF2_LOOP(DEQ2_MUL_ADD)
#undef AF2_LOOP
#undef AF2_ROW
#undef LO4
#undef HI4
#undef DEQ2_FMA
#undef DEQ2_MUL_ADD
    }
    __m256 c0, c1, c2, c3; /* accumulators in pair order -> canonical lanes */
    pair_unorder(a0, a1, &c0, &c1);
    pair_unorder(a2, a3, &c2, &c3);
    y[0] = hsum_canonical(c0, c1, c2, c3);
    pair_unorder(b0, b1, &c0, &c1);
    pair_unorder(b2, b3, &c2, &c3);
    y[1] = hsum_canonical(c0, c1, c2, c3);
}

/* FP8: the part of fused_row's condition for row r that is not about scales (blocks a multiple of
 * 32 wide, no NaN code); fp8_pair checks the scales as it loads them */
TGT static int fp8_row_codes_ok(const dr_weight *w, int64_t r) {
    if (w->fmt == DR_WF_FP8_BLOCK && w->block_cols % 32 != 0) return 0;
    return !e4m3_row_has_nan(w->data + (size_t)r * w->row_bytes, w->cols, (w->rows - r) * w->row_bytes);
}

/* the scalar tail of an FP8 row after its body: the reference's product, exact for any scale */
static float fp8_tail(const dr_weight *w, int64_t r, const uint8_t *row, const float *x, int64_t body, float t) {
    int per_tensor = w->fmt == DR_WF_FP8_TENSOR;
    int64_t bc = per_tensor ? w->cols : w->block_cols, sbase = per_tensor ? 0 : (r / w->block_rows) * w->scale_cols;
    for (int64_t k = body; k < w->cols; k++) {
        float sk = per_tensor ? w->global_scale : dr_weight_load_scale(w->scales, w->scale_dtype, sbase + k / bc);
        t = fmaf(x[k], dr_e4m3_to_f32(row[k]) * sk, t);
    }
    return t;
}

/* rows r, r + 1, both passing fp8_row_codes_ok: fused_row's FP8 loop for each, interleaved; 0
 * (y untouched) where a block scale is not below 2^7 in magnitude, as fused_row */
TGT static int fp8_pair(const dr_weight *w, int64_t r, const float *x, float *y, int64_t ahead) {
    int per_tensor = w->fmt == DR_WF_FP8_TENSOR;
    int64_t cols = w->cols, body = cols & ~(int64_t)31, bc = per_tensor ? cols : w->block_cols;
    int64_t nsc = per_tensor ? 1 : w->scale_cols;
    int64_t sba = per_tensor ? 0 : (r / w->block_rows) * w->scale_cols, sbb = per_tensor ? 0 : ((r + 1) / w->block_rows) * w->scale_cols;
    const uint8_t *ra = w->data + (size_t)r * w->row_bytes, *rb = ra + w->row_bytes;
    const __m256i keep = _mm256_set1_epi32((int)0x87F00000u);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    float sva[64], svb[64];
    for (int64_t c0 = 0, bi = 0; c0 < body; c0 += bc, bi++) {
        if (per_tensor) sva[0] = svb[0] = w->global_scale;
        else if ((bi & 63) == 0) {
            int cnt = nsc - bi < 64 ? (int)(nsc - bi) : 64;
            load_scales(w->scales, w->scale_dtype, sba + bi, cnt, sva);
            load_scales(w->scales, w->scale_dtype, sbb + bi, cnt, svb);
        }
        int j = per_tensor ? 0 : (int)(bi & 63);
        if (!(fabsf(sva[j]) < 0x1p7f) || !(fabsf(svb[j]) < 0x1p7f)) return 0;
        __m256 vsa = _mm256_set1_ps(sva[j] * (PLANT == 2 ? 0x1p121f : 0x1p120f));
        __m256 vsb = _mm256_set1_ps(svb[j] * (PLANT == 2 ? 0x1p121f : 0x1p120f));
        int64_t c1 = c0 + bc < body ? c0 + bc : body;
        for (int64_t k = c0; k < c1; k += 32) {
#define E8(row, j, vs) _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(load8_i8((row) + k + 8 * (j)), 20), \
        keep)), vs)
            PREFETCH(ra + k);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), E8(ra, 0, vsa), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), E8(ra, 1, vsa), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), E8(ra, 2, vsa), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), E8(ra, 3, vsa), a3);
            PREFETCH(rb + k);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), E8(rb, 0, vsb), b0);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), E8(rb, 1, vsb), b1);
            b2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), E8(rb, 2, vsb), b2);
            b3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), E8(rb, 3, vsb), b3);
#undef E8
        }
    }
    y[0] = fp8_tail(w, r, ra, x, body, hsum_canonical(a0, a1, a2, a3));
    y[1] = fp8_tail(w, r + 1, rb, x, body, hsum_canonical(b0, b1, b2, b3));
    return 1;
}

/* rows [r, r + nr), nr <= DR_CPU_FUSED_ROWS, of NVFP4 (pairs where both rows take the table path),
 * affine 4-bit (pairs) and FP8 (pairs, when every row is one fused_row takes); an odd last row
 * through fused_row; 1 when all were written, 0 (nothing written) for every other format or an FP8
 * row fused_row does not take, which the driver then takes row by row. x as order_x gives it. */
TGT int AVX2_NAME(fused_rows)(const dr_weight *w, int64_t r, int nr, const float *x, float *y) {
    int fp8 = w->fmt == DR_WF_FP8_TENSOR || w->fmt == DR_WF_FP8_BLOCK;
    /* other formats: the driver goes row by row through fused_row */
    if (nr < 1 || nr > DR_CPU_FUSED_ROWS ||
        !(fp8 || w->fmt == DR_WF_NVFP4 || (w->fmt == DR_WF_AFFINE && w->bits == 4 && w->group % 32 == 0)))
        return 0;
    if (fp8) { /* the codes of every row checked first (the NaN scan is also the rows' first read,
                * with its prefetch), the scales as the loops load them; results kept until all
                * rows are done, so a refusal writes nothing */
        for (int i = 0; i < nr; i++)
            if (!fp8_row_codes_ok(w, r + i)) return 0;
        const int64_t ahead = PF_AHEAD_ROWS(w, r, nr);
        float t[DR_CPU_FUSED_ROWS];
        int i = 0;
        for (; i + 2 <= nr; i += 2)
            if (!fp8_pair(w, r + i, x, t + i, ahead)) return 0;
        if (i < nr && !AVX2_NAME(fused_row)(w, r + i, x, t + i)) return 0;
        memcpy(y, t, (size_t)nr * sizeof *y);
        return 1;
    }
    const int64_t ahead = PF_AHEAD_ROWS(w, r, nr); /* the next call's rows */
    int64_t el = w->fmt == DR_WF_NVFP4 ? 1 : (int64_t)dr_dtype_size(w->scale_dtype);
    if (r + 2 * nr <= w->rows) { /* the next call's scales (and biases) */
        PREFETCH_SPAN(w->scales + (r + nr) * w->scale_cols * el, nr * w->scale_cols * el, 0);
        if (w->fmt == DR_WF_AFFINE) PREFETCH_SPAN(w->biases + (r + nr) * w->scale_cols * el, nr * w->scale_cols * el, 0);
    }
    int i = 0;
    for (; i + 2 <= nr; i += 2) {
        if (w->fmt == DR_WF_AFFINE) {
            affine4_pair(w, r + i, x, y + i, ahead);
            continue;
        }
        const uint8_t *s0 = w->scales + (size_t)(r + i) * (size_t)w->scale_cols;
        if (nvfp4_row_tables_exact(w, r + i, s0) && nvfp4_row_tables_exact(w, r + i + 1, s0 + w->scale_cols)) {
            nvfp4_pair(w, r + i, x, y + i, ahead);
            continue;
        }
        AVX2_NAME(fused_row)(w, r + i, x, y + i); /* NVFP4 and affine 4-bit: always covered */
        AVX2_NAME(fused_row)(w, r + i + 1, x, y + i + 1);
    }
    if (i < nr) AVX2_NAME(fused_row)(w, r + i, x, y + i);
    return 1;
}

#else /* not x86: never selected (dr_cpu_best_path returns portable); defined for the linker */

void AVX2_NAME(dequant_row)(const dr_weight *w, int64_t r, float *out) { dr_weight_dequant_row(w, r, out); }

int AVX2_NAME(fused_row)(const dr_weight *w, int64_t r, const float *x, float *y) { return 0; }

int AVX2_NAME(order_x)(const dr_weight *w, const float *x, float *xp) { return 0; }

int AVX2_NAME(fused_rows)(const dr_weight *w, int64_t r, int nr, const float *x, float *y) { return 0; }

void AVX2_NAME(dot_rows)(const float *x, int64_t ldx, int64_t n, const float *wrow, int64_t len, float *y,
                          int64_t ldy) {
    for (int64_t b = 0; b < n; b++) y[b * ldy] = dr_cpu_dot_path(x + b * ldx, wrow, len, DR_CPU_PORTABLE);
}
#endif
