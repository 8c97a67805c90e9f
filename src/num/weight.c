/* weight.c - binding stored weight tensors (FORMATS.md section 4) and the reference dequantiser. */
#include "num/weight.h"

#include <math.h>
#include <string.h>

#include "base/error.h"
#include "num/formats.h"

float dr_weight_load_scale(const uint8_t *base, dr_dtype dt, int64_t i) {
    switch (dt) {
    case DR_DT_F32: {
        float f;
        memcpy(&f, base + (size_t)i * 4, 4);
        return f;
    }
    case DR_DT_BF16: {
        uint16_t h;
        memcpy(&h, base + (size_t)i * 2, 2);
        return dr_bf16_to_f32(h);
    }
    case DR_DT_F16: {
        uint16_t h;
        memcpy(&h, base + (size_t)i * 2, 2);
        return dr_f16_to_f32(h);
    }
    default: return NAN;
    }
}

static const char *tname(const dr_tensor *t) { return (t && t->name) ? t->name : "(unnamed tensor)"; }

static int is_float_scale_dtype(dr_dtype dt) { return dt == DR_DT_F32 || dt == DR_DT_BF16 || dt == DR_DT_F16; }

/* A companion (or the weight itself) reduced to the 2-D (or scalar) piece of expert `slice`.
 * want_ndim is the rank for a 2-D weight (2 for matrices, 0 for scalars). */
typedef struct part {
    int64_t shape[2];
    const uint8_t *data;
} part;

static drama_status take_part(const dr_tensor *t, const char *role, int64_t slice, int64_t experts,
                              int want_ndim, part *p, drama_error *err) {
    size_t el = dr_dtype_size(t->dtype);
    if (el == 0) return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: %s has unsupported dtype", tname(t), role);
    if (t->ndim < 0 || t->ndim > DR_MAX_DIMS)
        return dr_fail(err, DRAMA_ESHAPE, "%s: %s has invalid rank %d", tname(t), role, t->ndim);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || (t->shape[i] > 0 && numel > INT64_MAX / t->shape[i]))
            return dr_fail(err, DRAMA_ESHAPE, "%s: %s has invalid shape (dim %d)", tname(t), role, i);
        numel *= t->shape[i];
    }
    if ((uint64_t)numel > SIZE_MAX / el || (size_t)numel * el > t->nbytes || (numel > 0 && !t->data))
        return dr_fail(err, DRAMA_ESHAPE, "%s: %s holds %zu bytes, shape needs %lld x %zu", tname(t), role,
                       t->nbytes, (long long)numel, el);
    int lead = slice >= 0 ? 1 : 0;
    int ok_rank = t->ndim == want_ndim + lead;
    /* a per-tensor scalar is sometimes stored as [1] instead of [] ([E, 1] instead of [E] fused) */
    int scalar_as_1 = want_ndim == 0 && t->ndim == lead + 1 && t->shape[lead] == 1;
    if (!ok_rank && !scalar_as_1)
        return dr_fail(err, DRAMA_ESHAPE, "%s: %s has rank %d, expected %d%s", tname(t), role, t->ndim,
                       want_ndim + lead, lead ? " (fused experts: leading expert dimension)" : "");
    int64_t per = numel;
    if (lead) {
        if (t->shape[0] != experts)
            return dr_fail(err, DRAMA_ESHAPE, "%s: %s has %lld experts, the weight has %lld", tname(t), role,
                           (long long)t->shape[0], (long long)experts);
        per = experts ? numel / experts : 0;
    }
    p->shape[0] = p->shape[1] = 1;
    if (want_ndim == 2) {
        p->shape[0] = t->shape[lead];
        p->shape[1] = t->shape[lead + 1];
    }
    p->data = t->data + (size_t)(lead ? slice : 0) * (size_t)per * el;
    return DRAMA_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static drama_status no_companion(const dr_tensor *w, const dr_tensor *c, const char *role, drama_error *err) {
    if (c) return dr_fail(err, DRAMA_ESHAPE, "%s: unexpected %s companion %s for a %s weight", tname(w), role,
                          tname(c), dr_dtype_name(w->dtype));
    return DRAMA_OK;
}

static drama_status need(const dr_tensor *w, const dr_tensor *c, const char *role, const char *fmt,
                         drama_error *err) {
    if (!c) return dr_fail(err, DRAMA_ESHAPE, "%s: incomplete %s weight: missing %s", tname(w), fmt, role);
    return DRAMA_OK;
}

static drama_status bind_scalar(const dr_tensor *t, const char *role, int64_t slice, int64_t experts, float *v,
                                drama_error *err) {
    part p = {0};
    if (take_part(t, role, slice, experts, 0, &p, err)) return err ? err->code : DRAMA_ESHAPE;
    if (!is_float_scale_dtype(t->dtype))
        return dr_fail(err, DRAMA_ESHAPE, "%s: %s has dtype %s, expected F32", tname(t), role, dr_dtype_name(t->dtype));
    *v = dr_weight_load_scale(p.data, t->dtype, 0);
    if (!isfinite(*v)) return dr_fail(err, DRAMA_ENUMERIC, "%s: %s is not finite", tname(t), role);
    return DRAMA_OK;
}

#define TRY(x)                                                  \
    do {                                                        \
        drama_status st_ = (x);                                 \
        if (st_ != DRAMA_OK) return st_;                        \
    } while (0)

drama_status dr_weight_bind_ex(const dr_tensor *w, const dr_tensor *scale, const dr_tensor *scale2,
                               const dr_tensor *bias, int64_t slice, int block_rows, int block_cols,
                               int64_t in_cols, dr_weight *out, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_weight_bind: out is NULL");
    memset(out, 0, sizeof *out);
    if (!w) return dr_fail(err, DRAMA_EINVAL, "dr_weight_bind: weight tensor is NULL");
    int64_t experts = 0;
    if (slice >= 0) {
        if (w->ndim != 3)
            return dr_fail(err, DRAMA_ESHAPE, "%s: expert slice %lld requested but the tensor has rank %d", tname(w),
                           (long long)slice, w->ndim);
        experts = w->shape[0];
        if (slice >= experts)
            return dr_fail(err, DRAMA_ESHAPE, "%s: expert slice %lld out of range [0, %lld)", tname(w),
                           (long long)slice, (long long)experts);
    }
    part pw;
    TRY(take_part(w, "weight", slice, experts, 2, &pw, err));
    int64_t rows = pw.shape[0], stored_cols = pw.shape[1];
    if (rows <= 0 || stored_cols <= 0)
        return dr_fail(err, DRAMA_ESHAPE, "%s: empty weight [%lld, %lld]", tname(w), (long long)rows,
                       (long long)stored_cols);
    if (block_rows < 0 || block_cols < 0)
        return dr_fail(err, DRAMA_EINVAL, "%s: negative weight_block_size [%d, %d]", tname(w), block_rows, block_cols);
    if (in_cols < 0) return dr_fail(err, DRAMA_EINVAL, "%s: negative in_cols %lld", tname(w), (long long)in_cols);
    out->name = w->name;
    out->rows = rows;
    out->data = pw.data;
    out->global_scale = 1.0f;
    int64_t cols = 0;

    switch (w->dtype) {
    case DR_DT_F32:
    case DR_DT_F16:
    case DR_DT_BF16:
        TRY(no_companion(w, scale, "scale", err));
        TRY(no_companion(w, scale2, "scale_2", err));
        TRY(no_companion(w, bias, "biases", err));
        out->fmt = w->dtype == DR_DT_F32 ? DR_WF_F32 : w->dtype == DR_DT_F16 ? DR_WF_F16 : DR_WF_BF16;
        cols = stored_cols;
        out->row_bytes = (size_t)cols * dr_dtype_size(w->dtype);
        break;

    case DR_DT_F8_E4M3: {
        TRY(need(w, scale, "weight_scale_inv / weight_scale", "FP8", err));
        TRY(no_companion(w, scale2, "scale_2", err));
        TRY(no_companion(w, bias, "biases", err));
        cols = stored_cols;
        out->row_bytes = (size_t)cols;
        int lead = slice >= 0;
        int scalar = scale->ndim == lead || (scale->ndim == lead + 1 && scale->shape[lead] == 1);
        if (scalar) {
            out->fmt = DR_WF_FP8_TENSOR;
            TRY(bind_scalar(scale, "weight_scale", slice, experts, &out->global_scale, err));
            break;
        }
        out->fmt = DR_WF_FP8_BLOCK;
        out->block_rows = block_rows ? block_rows : 128;
        out->block_cols = block_cols ? block_cols : 128;
        part ps;
        TRY(take_part(scale, "weight_scale_inv", slice, experts, 2, &ps, err));
        if (!is_float_scale_dtype(scale->dtype))
            return dr_fail(err, DRAMA_ESHAPE, "%s: dtype %s, expected F32 or BF16", tname(scale),
                           dr_dtype_name(scale->dtype));
        int64_t er = ceil_div(rows, out->block_rows), ec = ceil_div(cols, out->block_cols);
        if (ps.shape[0] != er || ps.shape[1] != ec)
            return dr_fail(err, DRAMA_ESHAPE,
                           "%s: scale shape [%lld, %lld] does not match weight [%lld, %lld] with blocks %dx%d "
                           "(expected [%lld, %lld])",
                           tname(scale), (long long)ps.shape[0], (long long)ps.shape[1], (long long)rows,
                           (long long)cols, out->block_rows, out->block_cols, (long long)er, (long long)ec);
        out->scales = ps.data;
        out->scale_dtype = scale->dtype;
        out->scale_cols = ec;
        break;
    }

    case DR_DT_U8: {
        TRY(need(w, scale, "weight_scale", "NVFP4", err));
        TRY(need(w, scale2, "weight_scale_2", "NVFP4", err));
        TRY(no_companion(w, bias, "biases", err));
        out->fmt = DR_WF_NVFP4;
        cols = stored_cols * 2;
        out->row_bytes = (size_t)stored_cols;
        if (cols % 16 != 0)
            return dr_fail(err, DRAMA_ESHAPE, "%s: NVFP4 input width %lld is not a multiple of 16", tname(w),
                           (long long)cols);
        if (scale->dtype != DR_DT_F8_E4M3)
            return dr_fail(err, DRAMA_ESHAPE, "%s: dtype %s, expected F8_E4M3", tname(scale),
                           dr_dtype_name(scale->dtype));
        part ps;
        TRY(take_part(scale, "weight_scale", slice, experts, 2, &ps, err));
        if (ps.shape[0] != rows || ps.shape[1] != cols / 16)
            return dr_fail(err, DRAMA_ESHAPE, "%s: shape [%lld, %lld], expected [%lld, %lld] (one per 16 inputs)",
                           tname(scale), (long long)ps.shape[0], (long long)ps.shape[1], (long long)rows,
                           (long long)(cols / 16));
        for (int64_t i = 0; i < rows * (cols / 16); i++)
            if ((ps.data[i] & 0x7F) == 0x7F)
                return dr_fail(err, DRAMA_ENUMERIC, "%s: NaN block scale at [%lld, %lld]", tname(scale),
                               (long long)(i / (cols / 16)), (long long)(i % (cols / 16)));
        out->scales = ps.data;
        out->scale_dtype = DR_DT_F8_E4M3;
        out->scale_cols = cols / 16;
        TRY(bind_scalar(scale2, "weight_scale_2", slice, experts, &out->global_scale, err));
        break;
    }

    case DR_DT_U32: {
        TRY(need(w, scale, "scales", "affine", err));
        TRY(need(w, bias, "biases", "affine", err));
        TRY(no_companion(w, scale2, "scale_2", err));
        out->fmt = DR_WF_AFFINE;
        out->row_bytes = (size_t)stored_cols * 4;
        if (!is_float_scale_dtype(scale->dtype))
            return dr_fail(err, DRAMA_ESHAPE, "%s: dtype %s, expected BF16, F16 or F32", tname(scale),
                           dr_dtype_name(scale->dtype));
        if (bias->dtype != scale->dtype)
            return dr_fail(err, DRAMA_ESHAPE, "%s: dtype %s differs from scales dtype %s", tname(bias),
                           dr_dtype_name(bias->dtype), dr_dtype_name(scale->dtype));
        part ps, pb;
        TRY(take_part(scale, "scales", slice, experts, 2, &ps, err));
        TRY(take_part(bias, "biases", slice, experts, 2, &pb, err));
        if (ps.shape[0] != rows || pb.shape[0] != rows || pb.shape[1] != ps.shape[1] || ps.shape[1] <= 0)
            return dr_fail(err, DRAMA_ESHAPE, "%s / %s: shapes [%lld, %lld] / [%lld, %lld] do not fit weight rows %lld",
                           tname(scale), tname(bias), (long long)ps.shape[0], (long long)ps.shape[1],
                           (long long)pb.shape[0], (long long)pb.shape[1], (long long)rows);
        int64_t sc = ps.shape[1];
        int bits = 0, group = 0;
        if (in_cols > 0) {
            if ((32 * stored_cols) % in_cols == 0) bits = (int)((32 * stored_cols) / in_cols);
            if (in_cols % sc == 0) group = (int)(in_cols / sc);
            cols = in_cols;
        } else {
            /* derive: 4 bits first (the required case), then 8 */
            for (int b = 4; b <= 8 && !bits; b += 4) {
                int64_t in = 32 * stored_cols / b;
                if (in % sc) continue;
                int64_t g = in / sc;
                if (g == 32 || g == 64 || g == 128) { bits = b; group = (int)g; cols = in; }
            }
            if (!bits) {
                return dr_fail(err, DRAMA_EUNSUPPORTED,
                               "%s: affine shapes (packed %lld words, %lld groups per row) fit no supported "
                               "bits 4/8 with group 32/64/128",
                               tname(w), (long long)stored_cols, (long long)sc);
            }
        }
        /* exact products, so a truncated quotient can never pass for a valid bits/group pair */
        if ((int64_t)group * sc != cols || (int64_t)bits * cols != 32 * stored_cols) bits = group = 0;
        if ((bits != 4 && bits != 8) || (group != 32 && group != 64 && group != 128))
            return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: unsupported affine quantisation bits=%d group=%d (in=%lld)",
                           tname(w), bits, group, (long long)cols);
        out->bits = bits;
        out->group = group;
        out->scales = ps.data;
        out->biases = pb.data;
        out->scale_dtype = scale->dtype;
        out->scale_cols = sc;
        break;
    }

    default:
        return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: dtype %s is not a supported weight format", tname(w),
                       dr_dtype_name(w->dtype));
    }
    if (in_cols > 0 && cols != in_cols)
        return dr_fail(err, DRAMA_ESHAPE, "%s: input width %lld, expected %lld", tname(w), (long long)cols,
                       (long long)in_cols);
    out->cols = cols;
    return DRAMA_OK;
}

drama_status dr_weight_bind(const dr_tensor *w, const dr_tensor *scale, const dr_tensor *scale2,
                            const dr_tensor *bias, int64_t slice, int block_rows, int block_cols,
                            dr_weight *out, drama_error *err) {
    return dr_weight_bind_ex(w, scale, scale2, bias, slice, block_rows, block_cols, 0, out, err);
}

drama_status dr_weight_rows(const dr_weight *w, int64_t r0, int64_t r1, dr_weight *out, drama_error *err) {
    if (!w || !out) return dr_fail(err, DRAMA_EINVAL, "dr_weight_rows: NULL argument");
    if (r0 < 0 || r1 <= r0 || r1 > w->rows)
        return dr_fail(err, DRAMA_EINVAL, "%s: row range [%lld, %lld) outside [0, %lld)",
                       w->name ? w->name : "weight", (long long)r0, (long long)r1, (long long)w->rows);
    *out = *w;
    out->rows = r1 - r0;
    out->data = w->data + (size_t)r0 * w->row_bytes;
    size_t el = w->fmt == DR_WF_NVFP4 ? 1 : dr_dtype_size(w->scale_dtype);
    switch (w->fmt) {
    case DR_WF_FP8_BLOCK:
        if (r0 % w->block_rows)
            return dr_fail(err, DRAMA_EINVAL, "%s: row view at %lld is not on a %d-row scale block boundary",
                           w->name ? w->name : "weight", (long long)r0, w->block_rows);
        out->scales = w->scales + (size_t)(r0 / w->block_rows) * (size_t)w->scale_cols * el;
        break;
    case DR_WF_NVFP4: out->scales = w->scales + (size_t)r0 * (size_t)w->scale_cols; break;
    case DR_WF_AFFINE:
        out->scales = w->scales + (size_t)r0 * (size_t)w->scale_cols * el;
        out->biases = w->biases + (size_t)r0 * (size_t)w->scale_cols * el;
        break;
    default: break;
    }
    return DRAMA_OK;
}

size_t dr_weight_bytes(const dr_weight *w) {
    size_t b = (size_t)w->rows * w->row_bytes;
    size_t el = w->fmt == DR_WF_NVFP4 ? 1 : dr_dtype_size(w->scale_dtype);
    if (w->fmt == DR_WF_FP8_BLOCK)
        b += (size_t)((w->rows + w->block_rows - 1) / w->block_rows) * (size_t)w->scale_cols * el;
    else if (w->fmt == DR_WF_NVFP4)
        b += (size_t)w->rows * (size_t)w->scale_cols;
    else if (w->fmt == DR_WF_AFFINE)
        b += 2 * (size_t)w->rows * (size_t)w->scale_cols * el;
    return b;
}

void dr_weight_dequant_row(const dr_weight *w, int64_t r, float *out) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    int64_t cols = w->cols;
    switch (w->fmt) {
    case DR_WF_F32: memcpy(out, row, (size_t)cols * 4); break;
    case DR_WF_BF16:
        for (int64_t c = 0; c < cols; c++) {
            uint16_t h;
            memcpy(&h, row + 2 * c, 2);
            out[c] = dr_bf16_to_f32(h);
        }
        break;
    case DR_WF_F16:
        for (int64_t c = 0; c < cols; c++) {
            uint16_t h;
            memcpy(&h, row + 2 * c, 2);
            out[c] = dr_f16_to_f32(h);
        }
        break;
    case DR_WF_FP8_TENSOR:
        for (int64_t c = 0; c < cols; c++) out[c] = dr_e4m3_to_f32(row[c]) * w->global_scale;
        break;
    case DR_WF_FP8_BLOCK: {
        const uint8_t *srow = w->scales;
        int64_t sbase = (r / w->block_rows) * w->scale_cols;
        for (int64_t c = 0; c < cols; c++)
            out[c] = dr_e4m3_to_f32(row[c]) * dr_weight_load_scale(srow, w->scale_dtype, sbase + c / w->block_cols);
        break;
    }
    case DR_WF_NVFP4: {
        const uint8_t *srow = w->scales + (size_t)r * (size_t)w->scale_cols;
        for (int64_t c = 0; c < cols; c++) {
            uint8_t byte = row[c / 2];
            uint8_t code = (c & 1) ? (byte >> 4) : (byte & 0xF);
            float v = dr_e2m1_to_f32(code) * dr_ue4m3_to_f32(srow[c / 16]); /* exact */
            out[c] = v * w->global_scale;
        }
        break;
    }
    case DR_WF_AFFINE: {
        int64_t sbase = r * w->scale_cols;
        int per_word = 32 / w->bits;
        uint32_t mask = (1u << w->bits) - 1u;
        for (int64_t c = 0; c < cols; c++) {
            uint32_t word;
            memcpy(&word, row + 4 * (c / per_word), 4);
            uint32_t q = (word >> (w->bits * (c % per_word))) & mask;
            float s = dr_weight_load_scale(w->scales, w->scale_dtype, sbase + c / w->group);
            float b = dr_weight_load_scale(w->biases, w->scale_dtype, sbase + c / w->group);
            float sq = s * (float)q; /* two roundings, as FORMATS.md 4.4 writes it (no fma) */
            out[c] = sq + b;
        }
        break;
    }
    default:
        for (int64_t c = 0; c < cols; c++) out[c] = NAN;
        break;
    }
}
