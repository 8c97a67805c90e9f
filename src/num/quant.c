/* quant.c - encoders of FORMATS.md sections 4.4 and 6. */
#include "num/quant.h"

#include <math.h>
#include <string.h>

#include "num/formats.h"

float dr_quant_amax(const float *src, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(src[i]);
        if (a > m) m = a;
    }
    return m;
}

static drama_status check_finite(const float *src, int64_t rows, int64_t cols, const char *what, drama_error *err) {
    for (int64_t i = 0; i < rows * cols; i++)
        if (!isfinite(src[i]))
            return dr_fail(err, DRAMA_ENUMERIC, "%s: source value at [%lld, %lld] is not finite", what,
                           (long long)(i / cols), (long long)(i % cols));
    return DRAMA_OK;
}

static drama_status check_dims(int64_t rows, int64_t cols, const char *what, drama_error *err) {
    if (rows <= 0 || cols <= 0 || rows > INT64_MAX / cols)
        return dr_fail(err, DRAMA_EINVAL, "%s: invalid shape [%lld, %lld]", what, (long long)rows, (long long)cols);
    return DRAMA_OK;
}

drama_status dr_quant_fp8_block(const float *src, int64_t rows, int64_t cols, int br, int bc, uint8_t *codes,
                                float *scales, drama_error *err) {
    if (check_dims(rows, cols, "fp8 quantisation", err)) return err ? err->code : DRAMA_EINVAL;
    if (br < 0 || bc < 0) return dr_fail(err, DRAMA_EINVAL, "fp8 quantisation: negative block size %dx%d", br, bc);
    if (!br) br = 128;
    if (!bc) bc = 128;
    if (check_finite(src, rows, cols, "fp8 quantisation", err)) return err ? err->code : DRAMA_ENUMERIC;
    int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    for (int64_t bi = 0; bi < sr; bi++) {
        for (int64_t bj = 0; bj < sc; bj++) {
            int64_t r0 = bi * br, r1 = r0 + br < rows ? r0 + br : rows;
            int64_t c0 = bj * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    if (fabsf(src[r * cols + c]) > amax) amax = fabsf(src[r * cols + c]);
            float s = amax > 0.0f ? (float)((double)amax / 448.0) : 1.0f;
            /* amax / 448 can underflow to 0 for tiny blocks; 1.0 then still decodes the zeros */
            if (s == 0.0f) s = 1.0f;
            scales[bi * sc + bj] = s;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    codes[r * cols + c] = dr_e4m3_from_f64((double)src[r * cols + c] / (double)s);
        }
    }
    return DRAMA_OK;
}

float dr_quant_nvfp4_global_scale(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    float gs = (float)((double)amax / (6.0 * 448.0));
    return gs > 0.0f ? gs : 1.0f;
}

drama_status dr_quant_nvfp4(const float *src, int64_t rows, int64_t cols, float global_scale, uint8_t *packed,
                            uint8_t *scales, drama_error *err) {
    if (check_dims(rows, cols, "nvfp4 quantisation", err)) return err ? err->code : DRAMA_EINVAL;
    if (cols % 16)
        return dr_fail(err, DRAMA_EINVAL, "nvfp4 quantisation: input width %lld is not a multiple of 16",
                       (long long)cols);
    if (!(global_scale > 0.0f) || !isfinite(global_scale))
        return dr_fail(err, DRAMA_EINVAL, "nvfp4 quantisation: weight_scale_2 %g must be positive and finite",
                       (double)global_scale);
    if (check_finite(src, rows, cols, "nvfp4 quantisation", err)) return err ? err->code : DRAMA_ENUMERIC;
    double gs = global_scale;
    for (int64_t r = 0; r < rows; r++) {
        const float *w = src + r * cols;
        for (int64_t b = 0; b < cols / 16; b++) {
            float amax = dr_quant_amax(w + 16 * b, 16);
            uint8_t s = dr_e4m3_from_f64(((double)amax / 6.0) / gs);
            scales[r * (cols / 16) + b] = s;
            double denom = (double)dr_ue4m3_to_f32(s) * gs; /* exact: 4-bit times 24-bit mantissa */
            for (int64_t j = 0; j < 16; j += 2) {
                uint8_t lo = 0, hi = 0;
                if (denom != 0.0) {
                    lo = dr_e2m1_from_f64((double)w[16 * b + j] / denom);
                    hi = dr_e2m1_from_f64((double)w[16 * b + j + 1] / denom);
                }
                packed[r * (cols / 2) + (16 * b + j) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
    return DRAMA_OK;
}

static void store_scale(uint8_t *base, dr_dtype dt, int64_t i, double v) {
    float f = (float)v;
    if (dt == DR_DT_F32) {
        memcpy(base + 4 * i, &f, 4);
    } else {
        uint16_t h = dt == DR_DT_BF16 ? dr_f32_to_bf16(f) : dr_f32_to_f16(f);
        memcpy(base + 2 * i, &h, 2);
    }
}

static double stored_value(dr_dtype dt, double v) {
    float f = (float)v;
    if (dt == DR_DT_BF16) return dr_bf16_to_f32(dr_f32_to_bf16(f));
    if (dt == DR_DT_F16) return dr_f16_to_f32(dr_f32_to_f16(f));
    return f;
}

drama_status dr_quant_affine(const float *src, int64_t rows, int64_t cols, int bits, int group, dr_dtype scale_dtype,
                             uint8_t *words, uint8_t *scales, uint8_t *biases, drama_error *err) {
    if (check_dims(rows, cols, "affine quantisation", err)) return err ? err->code : DRAMA_EINVAL;
    if ((bits != 4 && bits != 8) || (group != 32 && group != 64 && group != 128))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "affine quantisation: unsupported bits=%d group=%d", bits, group);
    if (cols % group)
        return dr_fail(err, DRAMA_EINVAL, "affine quantisation: input width %lld is not a multiple of group %d",
                       (long long)cols, group);
    if (scale_dtype != DR_DT_BF16 && scale_dtype != DR_DT_F16 && scale_dtype != DR_DT_F32)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "affine quantisation: scale dtype %s (BF16, F16 or F32)",
                       dr_dtype_name(scale_dtype));
    if (check_finite(src, rows, cols, "affine quantisation", err)) return err ? err->code : DRAMA_ENUMERIC;
    int64_t groups = cols / group;
    double qmax = (double)((1 << bits) - 1);
    int per_word = 32 / bits;
    memset(words, 0, (size_t)(rows * cols / per_word) * 4);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t gi = 0; gi < groups; gi++) {
            const float *w = src + r * cols + gi * group;
            double mn = w[0], mx = w[0];
            for (int j = 1; j < group; j++) {
                if (w[j] < mn) mn = w[j];
                if (w[j] > mx) mx = w[j];
            }
            double scale = (mx - mn) / qmax;
            if (scale < 1e-7) scale = 1e-7;
            double edge;
            if (fabs(mn) > fabs(mx)) {
                edge = mn;
            } else {
                edge = mx;
                scale = -scale;
            }
            double q0 = dr_rne(edge / scale);
            double bias = 0.0;
            if (q0 != 0.0) {
                scale = edge / q0;
                bias = edge;
            }
            double S = stored_value(scale_dtype, scale), B = stored_value(scale_dtype, bias);
            store_scale(scales, scale_dtype, r * groups + gi, scale);
            store_scale(biases, scale_dtype, r * groups + gi, bias);
            for (int j = 0; j < group; j++) {
                double q = dr_rne(((double)w[j] - B) / S);
                if (!(q >= 0.0)) q = 0.0; /* also catches NaN from S == 0 (a stored scale that underflowed) */
                if (q > qmax) q = qmax;
                int64_t c = gi * group + j;
                size_t wi = (size_t)(r * cols + c) / (size_t)per_word;
                uint32_t word;
                memcpy(&word, words + 4 * wi, 4);
                word |= (uint32_t)q << (bits * (int)(c % per_word));
                memcpy(words + 4 * wi, &word, 4);
            }
        }
    }
    return DRAMA_OK;
}
