/* contract_matmul.c - `drama contract` entries for the CPU matmul over every stored format:
 * fixtures, an independent float64 reference (weights decoded from the stored bytes with the
 * formulas of FORMATS.md, not with num/weight.c), the tolerance rule, and planted controls. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "num/formats.h"
#include "num/quant.h"
#include "num/weight.h"
#include "tools/contract_internal.h"

/* affine4 / affine8 use groups 64 / 32 (MLX defaults); the _g entries cover the other group sizes */
const char *const ct_matmul_names[CT_F_COUNT] = {"matmul.f32",         "matmul.f16",          "matmul.bf16",
                                                 "matmul.fp8_block",   "matmul.fp8_tensor",   "matmul.nvfp4",
                                                 "matmul.affine4",     "matmul.affine8",      "matmul.affine4_g32",
                                                 "matmul.affine4_g128", "matmul.affine8_g128"};

/* C_VEC_PLANT: the real product through a vector path with a defect planted inside its loops
 * (the path is in the variant, kernels.h DR_CPU_AVX2_PLANT* / DR_CPU_AVX512_PLANT*) */
enum { C_NONE = 0, C_SCALE_OFF_BY_ONE, C_NIBBLE_SWAP, C_FP16_ACCUM, C_DROP_TAIL, C_GROUP_OFF_BY_ONE, C_VEC_PLANT };

/* ---- weights built from an fp32 source with the encoders; own their bytes ---- */

void ct_w_free(ct_w *t) {
    for (int i = 0; i < 3; i++) free(t->bytes[i]);
    memset(t, 0, sizeof *t);
}

/* Input width granule of a format (NVFP4 blocks, affine groups). */
int64_t ct_matmul_granule(int f) {
    switch (f) {
    case CT_F_NVFP4: return 16;
    case CT_F_AFF4: return 64;
    case CT_F_AFF8:
    case CT_F_AFF4_G32: return 32;
    case CT_F_AFF4_G128:
    case CT_F_AFF8_G128: return 128;
    default: return 1;
    }
}
static int affine_bits(int f) { return f == CT_F_AFF4 || f == CT_F_AFF4_G32 || f == CT_F_AFF4_G128 ? 4 : 8; }

int ct_w_make(ct_w *t, int f, const float *src, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    int64_t n = rows * cols;
    drama_error err = {0};
    dr_tensor tw = {.name = "contract.weight", .ndim = 2, .shape = {rows, cols}};
    dr_tensor ts = {.name = "contract.scale", .ndim = 2}, tb = {.name = "contract.biases", .ndim = 2};
    dr_tensor t2 = {.name = "contract.weight_scale_2", .dtype = DR_DT_F32, .ndim = 0, .nbytes = 4};
    const dr_tensor *ps = NULL, *p2 = NULL, *pb = NULL;
    switch (f) {
    case CT_F_F32:
        t->bytes[0] = malloc((size_t)n * 4);
        memcpy(t->bytes[0], src, (size_t)n * 4);
        tw.dtype = DR_DT_F32;
        tw.nbytes = (size_t)n * 4;
        break;
    case CT_F_F16:
    case CT_F_BF16:
        t->bytes[0] = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = f == CT_F_BF16 ? dr_f32_to_bf16(src[i]) : dr_f32_to_f16(src[i]);
            memcpy(t->bytes[0] + 2 * i, &h, 2);
        }
        tw.dtype = f == CT_F_BF16 ? DR_DT_BF16 : DR_DT_F16;
        tw.nbytes = (size_t)n * 2;
        break;
    case CT_F_FP8B: {
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        t->bytes[0] = malloc((size_t)n);
        t->bytes[1] = malloc((size_t)(sr * sc) * 4);
        if (dr_quant_fp8_block(src, rows, cols, 128, 128, t->bytes[0], (float *)(void *)t->bytes[1], &err)) return -1;
        tw.dtype = DR_DT_F8_E4M3;
        tw.nbytes = (size_t)n;
        ts.dtype = DR_DT_F32;
        ts.shape[0] = sr;
        ts.shape[1] = sc;
        ts.nbytes = (size_t)(sr * sc) * 4;
        ps = &ts;
        break;
    }
    case CT_F_FP8T: {
        float gs = dr_quant_amax(src, n) / 448.0f;
        if (!(gs > 0)) gs = 1;
        t->bytes[0] = malloc((size_t)n);
        t->bytes[1] = malloc(4);
        for (int64_t i = 0; i < n; i++) t->bytes[0][i] = dr_e4m3_from_f64((double)src[i] / gs);
        memcpy(t->bytes[1], &gs, 4);
        tw.dtype = DR_DT_F8_E4M3;
        tw.nbytes = (size_t)n;
        t2.name = "contract.weight_scale";
        ps = &t2;
        break;
    }
    case CT_F_NVFP4: {
        float gs = dr_quant_nvfp4_global_scale(dr_quant_amax(src, n));
        t->bytes[0] = malloc((size_t)n / 2);
        t->bytes[1] = malloc((size_t)n / 16);
        t->bytes[2] = malloc(4);
        memcpy(t->bytes[2], &gs, 4);
        if (dr_quant_nvfp4(src, rows, cols, gs, t->bytes[0], t->bytes[1], &err)) return -1;
        tw.dtype = DR_DT_U8;
        tw.shape[1] = cols / 2;
        tw.nbytes = (size_t)n / 2;
        ts.dtype = DR_DT_F8_E4M3;
        ts.shape[0] = rows;
        ts.shape[1] = cols / 16;
        ts.nbytes = (size_t)n / 16;
        ps = &ts;
        p2 = &t2;
        break;
    }
    case CT_F_AFF4:
    case CT_F_AFF8:
    case CT_F_AFF4_G32:
    case CT_F_AFF4_G128:
    case CT_F_AFF8_G128: {
        int bits = affine_bits(f), g = (int)ct_matmul_granule(f);
        int64_t sc = cols / g;
        t->bytes[0] = malloc((size_t)n * (size_t)bits / 8);
        t->bytes[1] = malloc((size_t)(rows * sc) * 2);
        t->bytes[2] = malloc((size_t)(rows * sc) * 2);
        if (dr_quant_affine(src, rows, cols, bits, g, DR_DT_BF16, t->bytes[0], t->bytes[1], t->bytes[2], &err))
            return -1;
        tw.dtype = DR_DT_U32;
        tw.shape[1] = cols * bits / 32;
        tw.nbytes = (size_t)n * (size_t)bits / 8;
        ts.dtype = tb.dtype = DR_DT_BF16;
        ts.shape[0] = tb.shape[0] = rows;
        ts.shape[1] = tb.shape[1] = sc;
        ts.nbytes = tb.nbytes = (size_t)(rows * sc) * 2;
        tb.data = t->bytes[2];
        ps = &ts;
        pb = &tb;
        break;
    }
    default: return -1;
    }
    tw.data = t->bytes[0];
    ts.data = t->bytes[1];
    t2.data = f == CT_F_FP8T ? t->bytes[1] : t->bytes[2];
    return dr_weight_bind_ex(&tw, ps, p2, pb, -1, 0, 0, cols, &t->w, &err) == DRAMA_OK ? 0 : -1;
}

/* ---- independent float64 decode of the stored bytes (FORMATS.md 3 and 4) ---- */

static double d_e4m3(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return (c & 0x80) ? -v : v;
}

static double d_e2m1(uint8_t c) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

static double d_half(const uint8_t *p, dr_dtype dt) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    if (dt == DR_DT_BF16) {
        int e = (h >> 7) & 0xFF, m = h & 0x7F;
        double v = e == 255 ? (m ? NAN : INFINITY) : e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
        return (h & 0x8000) ? -v : v;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

static double d_scale(const uint8_t *base, dr_dtype dt, int64_t i) {
    if (dt == DR_DT_F32) {
        float f;
        memcpy(&f, base + 4 * i, 4);
        return f;
    }
    return d_half(base + 2 * i, dt);
}

/* value of W[r][c] in float64, and its "magnitude" for the error bound: |w|, except affine, where
 * the fp32 dequantisation rounds s*q and then s*q + b: |s q| + |w| */
static double ref_w(const dr_weight *w, int64_t r, int64_t c, double *mag) {
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    double v;
    switch (w->fmt) {
    case DR_WF_F32: {
        float f;
        memcpy(&f, row + 4 * c, 4);
        v = f;
        break;
    }
    case DR_WF_F16: v = d_half(row + 2 * c, DR_DT_F16); break;
    case DR_WF_BF16: v = d_half(row + 2 * c, DR_DT_BF16); break;
    case DR_WF_FP8_TENSOR: v = d_e4m3(row[c]) * w->global_scale; break;
    case DR_WF_FP8_BLOCK:
        v = d_e4m3(row[c]) *
            d_scale(w->scales, w->scale_dtype, (r / w->block_rows) * w->scale_cols + c / w->block_cols);
        break;
    case DR_WF_NVFP4: {
        uint8_t b = row[c / 2];
        uint8_t code = (c % 2) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
        v = d_e2m1(code) * d_e4m3(w->scales[r * w->scale_cols + c / 16] & 0x7F) * w->global_scale;
        break;
    }
    case DR_WF_AFFINE: {
        int per = 32 / w->bits;
        const uint8_t *wp = row + 4 * (c / per);
        uint32_t word = (uint32_t)wp[0] | ((uint32_t)wp[1] << 8) | ((uint32_t)wp[2] << 16) | ((uint32_t)wp[3] << 24);
        uint32_t q = (word >> (w->bits * (c % per))) & ((1u << w->bits) - 1);
        double s = d_scale(w->scales, w->scale_dtype, r * w->scale_cols + c / w->group);
        double b = d_scale(w->biases, w->scale_dtype, r * w->scale_cols + c / w->group);
        v = s * q + b;
        *mag = fabs(s * q) + fabs(v);
        return v;
    }
    default: v = NAN;
    }
    *mag = fabs(v);
    return v;
}

double ct_weight_ref(const dr_weight *w, int64_t r, int64_t c, double *mag) {
    double m;
    return ref_w(w, r, c, mag ? mag : &m);
}

void ct_matmul_abs(const dr_weight *w, const double *e, int64_t n, double *out) {
    int64_t K = w->cols;
    double *wm = malloc((size_t)K * sizeof *wm);
    for (int64_t r = 0; r < w->rows; r++) {
        for (int64_t k = 0; k < K; k++) ref_w(w, r, k, &wm[k]);
        for (int64_t i = 0; i < n; i++) {
            double m = 0;
            for (int64_t k = 0; k < K; k++) m += wm[k] * e[i * K + k];
            out[i * w->rows + r] = m;
        }
    }
    free(wm);
}

/* y_ref = x W^T in float64; tol = (K + chain) u sum_k |x_k| mag_k + 2^-140; alt = fp16-accumulated */
void ct_matmul_reference(const dr_weight *w, const float *x, int64_t n, int chain, double *ref, double *tol,
                         float *alt) {
    int64_t K = w->cols;
    double *wr = malloc((size_t)K * sizeof *wr), *wm = malloc((size_t)K * sizeof *wm);
    for (int64_t r = 0; r < w->rows; r++) {
        for (int64_t k = 0; k < K; k++) wr[k] = ref_w(w, r, k, &wm[k]);
        for (int64_t i = 0; i < n; i++) {
            const float *xi = x + i * K;
            double s = 0, m = 0;
            float h = 0;
            for (int64_t k = 0; k < K; k++) {
                s += (double)xi[k] * wr[k];
                m += fabs((double)xi[k]) * wm[k];
                h = ct_h(h + xi[k] * (float)wr[k]);
            }
            ref[i * w->rows + r] = s;
            tol[i * w->rows + r] = (double)(K + chain) * CT_U32 * m + 0x1p-140;
            if (alt) alt[i * w->rows + r] = h;
        }
    }
    free(wr);
    free(wm);
}

/* ---- the kernel under test, or a planted defect ---- */

static void run_control(const dr_weight *w, const float *x, int64_t n, float *y, int control) {
    int64_t K = w->cols;
    float *row = malloc((size_t)K * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        dr_weight_dequant_row(w, r, row);
        if (control == C_SCALE_OFF_BY_ONE && w->fmt == DR_WF_FP8_BLOCK) {
            for (int64_t c = 0; c < K; c++) {
                int64_t bi = (r / w->block_rows) * w->scale_cols + (c / w->block_cols + 1) % w->scale_cols;
                row[c] = dr_e4m3_to_f32(w->data[(size_t)r * w->row_bytes + (size_t)c]) *
                         dr_weight_load_scale(w->scales, w->scale_dtype, bi);
            }
        } else if (control == C_NIBBLE_SWAP && w->fmt == DR_WF_NVFP4) {
            const uint8_t *rb = w->data + (size_t)r * w->row_bytes;
            for (int64_t c = 0; c < K; c++) {
                uint8_t code = (c % 2) ? (uint8_t)(rb[c / 2] & 15) : (uint8_t)(rb[c / 2] >> 4);
                row[c] = dr_e2m1_to_f32(code) * dr_ue4m3_to_f32(w->scales[r * w->scale_cols + c / 16]) *
                         w->global_scale;
            }
        } else if (control == C_GROUP_OFF_BY_ONE && w->fmt == DR_WF_AFFINE) {
            /* group g + 1 dequantised with the scale and bias of group g */
            const uint8_t *rb = w->data + (size_t)r * w->row_bytes;
            int per = 32 / w->bits;
            for (int64_t c = w->group; c < K; c++) {
                uint32_t word;
                memcpy(&word, rb + 4 * (c / per), 4); /* little-endian host, as the kernels */
                uint32_t q = (word >> (w->bits * (c % per))) & ((1u << w->bits) - 1);
                int64_t g = r * w->scale_cols + c / w->group - 1;
                row[c] = dr_weight_load_scale(w->scales, w->scale_dtype, g) * (float)q +
                         dr_weight_load_scale(w->biases, w->scale_dtype, g);
            }
        }
        for (int64_t i = 0; i < n; i++) {
            const float *xi = x + i * K;
            float acc;
            if (control == C_FP16_ACCUM) {
                acc = 0;
                for (int64_t k = 0; k < K; k++) acc = ct_h(acc + xi[k] * row[k]);
            } else if (control == C_DROP_TAIL) {
                acc = dr_cpu_dot_path(xi, row, K - K % 32, DR_CPU_PORTABLE);
            } else {
                acc = dr_cpu_dot_path(xi, row, K, DR_CPU_PORTABLE);
            }
            y[i * w->rows + r] = acc;
        }
    }
    free(row);
}

/* variant: format | path << 8 | (block isa + 1) << 16 (0: the path's own choice) | planted << 20 */
#define CT_BLOCK(isa, planted) ((((int)(isa) + 1) << 16) | ((planted) << 20))

/* The product under test: the path, and for the block entries an explicit n > 1 block kernel. */
static void product(const ct_kernel *k, const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                    dr_pool *pool) {
    dr_cpu_path path = (dr_cpu_path)((k->variant >> 8) & 0xFF);
    int isa = ((k->variant >> 16) & 0xF) - 1;
    if (isa < 0)
        dr_cpu_matmul_path(w, r0, r1, x, n, y, pool, path);
    else
        dr_cpu_matmul_block(w, r0, r1, x, n, y, pool, path,
                            dr_cpu_block_kernel((dr_cpu_block_isa)isa, (k->variant >> 20) & 1));
}

static void run_kernel(const ct_kernel *k, ct_ctx *ctx, const dr_weight *w, const float *x, int64_t n, float *y) {
    if (k->control && k->control != C_VEC_PLANT)
        run_control(w, x, n, y, k->control);
    else
        product(k, w, 0, w->rows, x, n, y, ctx->pool);
}

static int run_cpu(const ct_kernel *k, ct_ctx *ctx, const dr_weight *w, const float *x, int64_t n, float *y,
                   void *arg, char *msg, size_t msg_size) {
    (void)arg, (void)msg, (void)msg_size;
    run_kernel(k, ctx, w, x, n, y);
    return 0;
}

/* ---- fixtures ---- */

const char *const ct_matmul_kinds[CT_K_KINDS] = {"random", "dynamic-range", "cancellation", "format-limits",
                                            "nan-inf", "fp16-discriminating"};

static float limit_value(int f) { /* the largest magnitude the format stores exactly */
    switch (f) {
    case CT_F_F16: return 65504.0f;
    case CT_F_BF16: return 0x1.FEp127f;
    case CT_F_F32: return 0x1.FFFFFEp127f;
    default: return 448.0f;
    }
}

void ct_matmul_fill(int kind, int f, uint64_t *s, float *w, int64_t rows, int64_t cols, float *x, int64_t n) {
    for (int64_t i = 0; i < rows * cols; i++) {
        double v = ct_rand_normal(s);
        switch (kind) {
        case CT_K_RANGE: /* 2^-20 .. 2^20 (F16: 2^-12 .. 2^12, inside its range) */
            v *= f == CT_F_F16 ? ldexp(1.0, (int)(ct_rand_u64(s) % 25) - 12) : ldexp(1.0, (int)(ct_rand_u64(s) % 41) - 20);
            break;
        case CT_K_CANCEL: /* pairs w, -w (1 + 2^-10): sums cancel to a few ulps of the terms */
            if (i % 2) {
                float prev = w[i - 1];
                v = -(double)prev * (1.0 + 0x1p-10);
            }
            break;
        case CT_K_LIMITS: /* values at the format's largest magnitude and tiny ones in the same rows */
            v = (i % 3 == 0) ? (v < 0 ? -1.0 : 1.0) * limit_value(f) : v * 1e-3;
            break;
        case CT_K_DISCR: v = 0.5 + 0.5 * ct_rand_uniform(s); break;
        default: break;
        }
        w[i] = (float)v;
    }
    for (int64_t i = 0; i < n * cols; i++) {
        double v = ct_rand_normal(s);
        if (kind == CT_K_RANGE) v *= ldexp(1.0, (int)(ct_rand_u64(s) % 41) - 20);
        if (kind == CT_K_CANCEL) v = (i % 2) ? x[i - 1] : v;
        if (kind == CT_K_LIMITS) v = ldexp(v, f == CT_F_F32 || f == CT_F_BF16 ? -100 : -8) / (double)cols;
        if (kind == CT_K_DISCR) v = 0.5 + 0.5 * ct_rand_uniform(s);
        x[i] = (float)v;
    }
    if (kind == CT_K_NONFINITE && n >= 2) {
        x[cols / 2] = NAN;               /* row 0: NaN */
        x[cols + cols - 1] = INFINITY;   /* row 1: +inf in the last (ragged) column */
    }
}

int ct_matmul_cases(const ct_kernel *k, ct_ctx *ctx, ct_result *res, int chain, ct_matmul_run_fn run, void *arg) {
    int f = k->variant & 0xFF, errors = 0;
    int64_t g = ct_matmul_granule(f);
    /* ragged shapes: rows and columns that are not multiples of 8, 32 or 128 (within the granule) */
    const int64_t shapes[][3] = {{3, 7, 2}, {37, 101, 3}, {130, 200, 2}, {1, 33, 2}, {129, 300, 1}};
    uint64_t seed = ctx->seed ^ ((uint64_t)(uint32_t)k->variant * 7919u + 17u); /* unsigned: path bits make variant large */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int kind = 0; kind < CT_K_KINDS; kind++) {
            int64_t rows = shapes[si][0], cols = (shapes[si][1] + g - 1) / g * g, n = shapes[si][2];
            if (kind == CT_K_DISCR) {
                if (si > 0) continue;
                rows = 8, cols = g == 1 ? 4100 : 4096, n = 2; /* long positive sums */
            }
            if (kind == CT_K_NONFINITE) n = 2;
            float *wsrc = malloc((size_t)(rows * cols) * sizeof *wsrc), *x = malloc((size_t)(n * cols) * sizeof *x);
            float *y = malloc((size_t)(n * rows) * sizeof *y), *alt = malloc((size_t)(n * rows) * sizeof *alt);
            double *ref = malloc((size_t)(n * rows) * sizeof *ref), *tol = malloc((size_t)(n * rows) * sizeof *tol);
            ct_matmul_fill(kind, f, &seed, wsrc, rows, cols, x, n);
            ct_w t;
            char name[96];
            snprintf(name, sizeof name, "%s [%lld,%lld] n=%lld", ct_matmul_kinds[kind], (long long)rows, (long long)cols,
                     (long long)n);
            if (ct_w_make(&t, f, wsrc, rows, cols) != 0) {
                ct_case_error(res, name, "could not build the weight");
            } else {
                ct_matmul_reference(&t.w, x, n, chain, ref, tol, alt);
                ct_poison(y, n * rows);
                char msg[200] = "";
                if (run(k, ctx, &t.w, x, n, y, arg, msg, sizeof msg) != 0) {
                    errors++;
                    ct_case_error(res, name, msg);
                } else {
                    ct_compare(res, name, y, ref, tol, n * rows);
                    if (kind == CT_K_DISCR) ct_discriminate(res, name, alt, ref, tol, n * rows);
                }
            }
            ct_w_free(&t);
            free(wsrc);
            free(x);
            free(y);
            free(alt);
            free(ref);
            free(tol);
        }
    }
    return errors;
}

/* CPU chain: K products and additions plus the exact-dequant roundings (affine: in m_k) */
void ct_mm_fixture_make(ct_mm_fixture *fx, int f, uint64_t *seed, int64_t rows, int64_t cols, int64_t nx, int chain) {
    memset(fx, 0, sizeof *fx);
    int64_t g = ct_matmul_granule(f);
    cols = (cols + g - 1) / g * g;
    float *wsrc = malloc((size_t)(rows * cols) * sizeof *wsrc);
    fx->x = malloc((size_t)(nx * cols) * sizeof *fx->x);
    fx->ref = malloc((size_t)(nx * rows) * sizeof *fx->ref);
    fx->tol = malloc((size_t)(nx * rows) * sizeof *fx->tol);
    fx->rows = rows, fx->cols = cols, fx->nx = nx;
    ct_matmul_fill(CT_K_RANDOM, f, seed, wsrc, rows, cols, fx->x, nx);
    fx->ok = ct_w_make(&fx->t, f, wsrc, rows, cols) == 0;
    if (fx->ok) ct_matmul_reference(&fx->t.w, fx->x, nx, chain, fx->ref, fx->tol, NULL);
    free(wsrc);
}

void ct_mm_fixture_free(ct_mm_fixture *fx) {
    ct_w_free(&fx->t);
    free(fx->x);
    free(fx->ref);
    free(fx->tol);
}

void ct_mm_compare_rows(ct_result *res, const char *name, const ct_mm_fixture *fx, int64_t xoff, int64_t n, int64_t r0,
                        int64_t r1, const float *y) {
    int64_t m = r1 - r0;
    double *ref = malloc((size_t)(n * m) * sizeof *ref), *tol = malloc((size_t)(n * m) * sizeof *tol);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++) {
            ref[t * m + r - r0] = fx->ref[(xoff + t) * fx->rows + r];
            tol[t * m + r - r0] = fx->tol[(xoff + t) * fx->rows + r];
        }
    ct_compare(res, name, y, ref, tol, n * m);
    free(ref);
    free(tol);
}

/* The CPU kernel's structure, as the engine calls it: activation tiles of 16 rows with a partial
 * last tile (n = 16, 17, 33), output row ranges starting past 0 (the lm_head slice, an expert's row
 * block) and the pool-less calls of the MoE (NULL pool). Random fixtures; each run poisons y. */
static void structure_cases(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t seed = ctx->seed ^ ((uint64_t)k->variant * 15485863u + 3u);
    ct_mm_fixture fx[2];
    ct_mm_fixture_make(&fx[0], k->variant & 0xFF, &seed, 37, 101, 33, 4);
    ct_mm_fixture_make(&fx[1], k->variant & 0xFF, &seed, 130, 200, 33, 4);
    /* {fixture, n, r0, r1 (0: all rows), pool} */
    const int64_t runs[][5] = {{0, 16, 0, 0, 1}, {0, 17, 0, 0, 1}, {1, 33, 0, 0, 0}, {1, 17, 3, 97, 0},
                               {1, 2, 129, 130, 1}, {0, 5, 5, 37, 0}};
    char name[128];
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const ct_mm_fixture *f = &fx[runs[i][0]];
        int64_t n = runs[i][1], r0 = runs[i][2], r1 = runs[i][3] ? runs[i][3] : f->rows;
        snprintf(name, sizeof name, "structure [%lld,%lld] n=%lld rows [%lld,%lld) %s", (long long)f->rows,
                 (long long)f->cols, (long long)n, (long long)r0, (long long)r1, runs[i][4] ? "pool" : "no pool");
        if (!f->ok) {
            ct_case_error(res, name, "could not build the weight");
            continue;
        }
        float *y = malloc((size_t)(n * (r1 - r0)) * sizeof *y);
        ct_poison(y, n * (r1 - r0));
        product(k, &f->t.w, r0, r1, f->x, n, y, runs[i][4] ? ctx->pool : NULL);
        ct_mm_compare_rows(res, name, f, 0, n, r0, r1, y);
        free(y);
    }
    ct_mm_fixture_free(&fx[0]);
    ct_mm_fixture_free(&fx[1]);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    ct_matmul_cases(k, ctx, res, 4, run_cpu, NULL);
    if (!k->control) structure_cases(k, ctx, res); /* the controls emulate whole products only */
}

static double time_kernel(const ct_kernel *k, ct_ctx *ctx) {
    int f = k->variant & 0xFF;
    int64_t rows = 2048, cols = 2048;
    uint64_t s = 99;
    float *src = malloc((size_t)(rows * cols) * sizeof *src), *x = malloc((size_t)cols * sizeof *x), y[2048];
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)(ct_rand_normal(&s) * 0.02);
    for (int64_t i = 0; i < cols; i++) x[i] = (float)ct_rand_normal(&s);
    ct_w t;
    double best = INFINITY;
    if (ct_w_make(&t, f, src, rows, cols) == 0) {
        for (int rep = 0; rep < 5; rep++) {
            double t0 = ct_now_ms();
            run_kernel(k, ctx, &t.w, x, 1, y);
            double dt = ct_now_ms() - t0;
            if (dt < best) best = dt;
        }
    }
    ct_w_free(&t);
    free(src);
    free(x);
    return best;
}

static const char *k_precision =
    "weights dequantised to fp32 as FORMATS.md 4 (codes exact, one rounding per scale product), fp32 products and "
    "accumulation; "
    "tol = (K+4) u sum|x||w| (affine: |w| -> |s q|+|w|), u = 2^-24; NaN/Inf propagate";

int ct_matmul_kernels(ct_kernel *out, int max) {
    int n = 0;
    const dr_cpu_path paths[3] = {DR_CPU_AVX512, DR_CPU_AVX2, DR_CPU_PORTABLE};
    const char *const backends[3] = {"cpu/avx512", "cpu/avx2", "cpu/portable"};
    for (int p = 0; p < 3; p++) {
        if (!dr_cpu_path_supported(paths[p])) continue;
        for (int f = 0; f < CT_F_COUNT && n < max; f++) {
            out[n] = (ct_kernel){.name = ct_matmul_names[f],
                                 .backend = backends[p],
                                 .precision = k_precision,
                                 .check = check,
                                 .time = time_kernel,
                                 .time_shape = "[2048,2048] n=1",
                                 .limit_ms = paths[p] != DR_CPU_PORTABLE ? 20.0 : 200.0, /* portable: libm fmaf */
                                 .variant = f | ((int)paths[p] << 8)};
            n++;
        }
    }
    /* the n > 1 block kernels of each instruction set the CPU has, explicitly (the avx2 entries
     * above run the best one); the kernels see dequantised fp32 rows, so three formats suffice */
    const int block_fmts[] = {CT_F_F32, CT_F_BF16, CT_F_AFF4};
    const struct { dr_cpu_block_isa isa; const char *backend; } b[] = {{DR_CPU_BLOCK_AVX2, "cpu/avx2-block"},
                                                                        {DR_CPU_BLOCK_AVX512, "cpu/avx512-block"}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; dr_cpu_block_kernel(b[i].isa, 0) && j < 3 && n < max; j++, n++)
            out[n] = (ct_kernel){.name = ct_matmul_names[block_fmts[j]], .backend = b[i].backend,
                                 .precision = k_precision, .check = check, .time = time_kernel,
                                 .time_shape = "[2048,2048] n=1", .limit_ms = 20.0,
                                 .variant = block_fmts[j] | (DR_CPU_AVX2 << 8) | CT_BLOCK(b[i].isa, 0)};
    return n;
}

int ct_matmul_controls(ct_kernel *out, int max) {
    const struct { int f, control; const char *desc; } c[] = {
        {CT_F_FP8B, C_SCALE_OFF_BY_ONE, "block scale of the next block column"},
        {CT_F_NVFP4, C_NIBBLE_SWAP, "E2M1 nibbles read high-first"},
        {CT_F_BF16, C_FP16_ACCUM, "fp16 accumulation"},
        {CT_F_F32, C_DROP_TAIL, "drops the last K % 32 columns"},
        {CT_F_AFF4, C_GROUP_OFF_BY_ONE, "scale and bias of the previous group"},
        {CT_F_AFF8, C_GROUP_OFF_BY_ONE, "scale and bias of the previous group"},
        {CT_F_F16, C_FP16_ACCUM, "fp16 accumulation"},
        {CT_F_FP8T, C_DROP_TAIL, "drops the last K % 32 columns"},
        {CT_F_AFF4_G32, C_GROUP_OFF_BY_ONE, "scale and bias of the previous group"},
        {CT_F_AFF4_G128, C_GROUP_OFF_BY_ONE, "scale and bias of the previous group"},
        {CT_F_AFF8_G128, C_GROUP_OFF_BY_ONE, "scale and bias of the previous group"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = ct_matmul_names[c[i].f], .backend = "cpu/control", .precision = k_precision,
                             .check = check, .variant = c[i].f | (DR_CPU_PORTABLE << 8), .control = c[i].control,
                             .control_desc = c[i].desc};
    /* defects inside the AVX2 loops themselves (matmul_avx2_plant*.c), where the CPU has them */
    const struct { int f; dr_cpu_path path; const char *desc; } v[] = {
        {CT_F_AFF4, DR_CPU_AVX2_PLANT1, "AVX2 fused loop: nibbles of each byte swapped"},
        {CT_F_AFF4_G128, DR_CPU_AVX2_PLANT1, "AVX2 fused loop: nibbles of each byte swapped"},
        {CT_F_FP8B, DR_CPU_AVX2_PLANT2, "AVX2 FP8 fast path: scale x2 in the loop"},
        {CT_F_FP8T, DR_CPU_AVX2_PLANT2, "AVX2 FP8 fast path: scale x2 in the loop"},
        {CT_F_NVFP4, DR_CPU_AVX2_PLANT3, "AVX2 NVFP4 table: magnitudes 1.0/1.5 swapped"},
        {CT_F_BF16, DR_CPU_AVX2_PLANT4, "AVX2 reduction drops the 4th accumulator"},
        {CT_F_F16, DR_CPU_AVX2_PLANT4, "AVX2 reduction drops the 4th accumulator"},
        {CT_F_F32, DR_CPU_AVX2_PLANT4, "AVX2 reduction drops the 4th accumulator"},
        {CT_F_AFF8, DR_CPU_AVX2_PLANT4, "AVX2 reduction drops the 4th accumulator"},
    };
    for (size_t i = 0; dr_cpu_path_supported(DR_CPU_AVX2) && i < sizeof v / sizeof v[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = ct_matmul_names[v[i].f], .backend = "cpu/avx2-control", .precision = k_precision,
                             .check = check, .variant = v[i].f | ((int)v[i].path << 8), .control = C_VEC_PLANT,
                             .control_desc = v[i].desc};
    /* the block kernels' tile loops with the last weight row of a tile loading the previous one */
    const struct { dr_cpu_block_isa isa; int f; const char *desc; } bp[] = {
        {DR_CPU_BLOCK_AVX2, CT_F_BF16, "AVX2 block tile: last weight row loads the previous row"},
        {DR_CPU_BLOCK_AVX512, CT_F_BF16, "AVX-512 block tile: last weight row loads the previous row"},
        {DR_CPU_BLOCK_AVX512, CT_F_AFF4, "AVX-512 block tile: last weight row loads the previous row"}};
    for (size_t i = 0; i < sizeof bp / sizeof bp[0] && n < max; i++) {
        if (!dr_cpu_block_kernel(bp[i].isa, 1)) continue;
        out[n++] = (ct_kernel){.name = ct_matmul_names[bp[i].f],
                               .backend = bp[i].isa == DR_CPU_BLOCK_AVX2 ? "cpu/avx2-block-control"
                                                                          : "cpu/avx512-block-control",
                               .precision = k_precision, .check = check,
                               .variant = bp[i].f | (DR_CPU_AVX2 << 8) | CT_BLOCK(bp[i].isa, 1),
                               .control = C_VEC_PLANT, .control_desc = bp[i].desc};
    }
    /* and inside the AVX-512 loops (matmul_avx512_plant*.c): every format's n = 1 loop */
    const struct { int f; dr_cpu_path path; const char *desc; } v5[] = {
        {CT_F_AFF4, DR_CPU_AVX512_PLANT1, "AVX-512 affine 4-bit table: nibbles of each byte swapped"},
        {CT_F_AFF4_G32, DR_CPU_AVX512_PLANT1, "AVX-512 affine 4-bit table: nibbles of each byte swapped"},
        {CT_F_AFF4_G128, DR_CPU_AVX512_PLANT1, "AVX-512 affine 4-bit table: nibbles of each byte swapped"},
        {CT_F_AFF8, DR_CPU_AVX512_PLANT1, "AVX-512 affine 8-bit loop: scale x2"},
        {CT_F_AFF8_G128, DR_CPU_AVX512_PLANT1, "AVX-512 affine 8-bit loop: scale x2"},
        {CT_F_FP8B, DR_CPU_AVX512_PLANT2, "AVX-512 FP8 loop: scale x2"},
        {CT_F_FP8T, DR_CPU_AVX512_PLANT2, "AVX-512 FP8 loop: scale x2"},
        {CT_F_NVFP4, DR_CPU_AVX512_PLANT3, "AVX-512 NVFP4 table: magnitudes 1.0/1.5 swapped"},
        {CT_F_BF16, DR_CPU_AVX512_PLANT4, "AVX-512 reduction drops sums 16..31"},
        {CT_F_F16, DR_CPU_AVX512_PLANT4, "AVX-512 reduction drops sums 16..31"},
        {CT_F_F32, DR_CPU_AVX512_PLANT4, "AVX-512 reduction drops sums 16..31"},
    };
    for (size_t i = 0; dr_cpu_path_supported(DR_CPU_AVX512) && i < sizeof v5 / sizeof v5[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = ct_matmul_names[v5[i].f], .backend = "cpu/avx512-control",
                             .precision = k_precision, .check = check, .variant = v5[i].f | ((int)v5[i].path << 8),
                             .control = C_VEC_PLANT, .control_desc = v5[i].desc};
    return n;
}
