/* contract_golden.c - `drama contract` format fixtures from ref/quant-units.safetensors (made by
 * an independent implementation): the E4M3 / E2M1 code tables and the encoding probes, checked
 * through num/formats and through the CPU kernels' own decoders, and the stored quantisation
 * units multiplied by the CPU matmul. Registered only when the golden folder is found. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/kernels.h"
#include "io/safetensors.h"
#include "num/formats.h"
#include "num/weight.h"
#include "tools/contract_internal.h"

enum { G_E4M3, G_E2M1, G_BF16, G_UNITS };
enum { GC_NONE = 0, GC_NAN_OVERFLOW, GC_SIGNED_ZERO };

static char k_path[4096];

static dr_st_file *open_units(const ct_kernel *k, ct_result *res) {
    dr_st_file *f = NULL;
    drama_error err = {0};
    if (dr_st_open(k->data, &f, &err) != DRAMA_OK) {
        ct_case_error(res, k->data, err.message);
        return NULL;
    }
    return f;
}

static const dr_tensor *need(dr_st_file *f, const char *name, int64_t n_min, ct_result *res) {
    const dr_tensor *t = dr_st_find(f, name);
    if (!t || dr_tensor_numel(t) < n_min) {
        char msg[160];
        snprintf(msg, sizeof msg, "tensor %s missing or too small", name);
        ct_case_error(res, k_path, msg);
        return NULL;
    }
    return t;
}

static float f32_at(const dr_tensor *t, int64_t i) {
    float v;
    memcpy(&v, t->data + 4 * i, 4);
    return v;
}

/* ties away from zero: nudging |x| up by 2^-40 (relative) moves only exact midpoints */
static uint8_t e4m3_ties_away(double x) { return dr_e4m3_from_f64(x * (1.0 + 0x1p-40)); }
static uint8_t e2m1_ties_away(double x) { return dr_e2m1_from_f64(x * (1.0 + 0x1p-40)); }

static uint8_t e4m3_under_test(const ct_kernel *k, float x) {
    if (k->control == GC_NAN_OVERFLOW && fabsf(x) > 448.0f && !isinf(x)) return 0x7F; /* a plain cast */
    return dr_f32_to_e4m3(x);
}

static uint8_t e2m1_under_test(const ct_kernel *k, float x) {
    uint8_t c = dr_e2m1_from_f64(x);
    if (k->control == GC_SIGNED_ZERO && c == 0 && signbit(x)) c = 8; /* keeps the sign of zero */
    return c;
}

/* A table check: value and sign of each code, NaN-ness for NaN codes. */
static void table_case(ct_result *res, const char *name, const float *got, const dr_tensor *gold, int n) {
    float *ref_f = malloc((size_t)n * 2 * sizeof *ref_f), *out = malloc((size_t)n * 2 * sizeof *out);
    double *ref = malloc((size_t)n * 2 * sizeof *ref), *tol = calloc((size_t)n * 2, sizeof *tol);
    for (int i = 0; i < n; i++) {
        ref_f[i] = f32_at(gold, i);
        ref[i] = ref_f[i];
        out[i] = got[i];
        /* signs, so -0 and +0 are told apart (NaN codes: sign not compared) */
        ref[n + i] = isnan(ref_f[i]) ? 0 : !!signbit(ref_f[i]);
        out[n + i] = isnan(ref_f[i]) ? 0.0f : (float)!!signbit(got[i]);
    }
    ct_compare(res, name, out, ref, tol, 2 * n);
    free(ref_f), free(out), free(ref), free(tol);
}

static void check_e4m3(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    (void)ctx;
    dr_st_file *f = open_units(k, res);
    if (!f) return;
    const dr_tensor *tab = need(f, "e4m3.all_codes_value", 256, res), *probe = need(f, "probe.f32", 1, res),
                    *gold = need(f, "probe.to_e4m3_satfinite_rne", 1, res);
    if (tab && probe && gold) {
        float dec[256];
        uint8_t codes[256];
        for (int c = 0; c < 256; c++) {
            dec[c] = dr_e4m3_to_f32((uint8_t)c);
            codes[c] = (uint8_t)c;
        }
        if (!k->control) table_case(res, "decode table (num/formats)", dec, tab, 256);
        /* the kernel's own decoder: a per-tensor FP8 row of every code, scale 1 */
        float one = 1.0f;
        dr_tensor tw = {.name = "codes", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {1, 256}, .data = codes,
                        .nbytes = 256};
        dr_tensor ts = {.name = "codes.weight_scale", .dtype = DR_DT_F32, .ndim = 0, .data = (const uint8_t *)&one,
                        .nbytes = 4};
        dr_weight w;
        if (!k->control && dr_weight_bind(&tw, &ts, NULL, NULL, -1, 0, 0, &w, NULL) == DRAMA_OK) {
            dr_cpu_dequant_row_path(&w, 0, dec, DR_CPU_AUTO);
            table_case(res, "decode table (cpu kernel)", dec, tab, 256);
        }
        int64_t n = dr_tensor_numel(probe);
        if (dr_tensor_numel(gold) < n) n = dr_tensor_numel(gold);
        float *out = malloc((size_t)n * sizeof *out), *alt = malloc((size_t)n * sizeof *alt);
        double *ref = malloc((size_t)n * sizeof *ref), *tol = calloc((size_t)n, sizeof *tol);
        for (int64_t i = 0; i < n; i++) {
            float p = f32_at(probe, i);
            out[i] = e4m3_under_test(k, p);
            alt[i] = e4m3_ties_away(p);
            ref[i] = gold->data[i];
        }
        ct_compare(res, "encode probes (satfinite, RNE)", out, ref, tol, n);
        ct_discriminate(res, "encode probes", alt, ref, tol, n);
        free(out), free(alt), free(ref), free(tol);
    }
    dr_st_close(f);
}

static void check_e2m1(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    (void)ctx;
    dr_st_file *f = open_units(k, res);
    if (!f) return;
    const dr_tensor *tab = need(f, "e2m1.all_codes_value", 16, res), *probe = need(f, "probe.f32", 1, res),
                    *gold = need(f, "probe.to_e2m1_rne", 1, res);
    if (tab && probe && gold) {
        float dec[16];
        for (int c = 0; c < 16; c++) dec[c] = dr_e2m1_to_f32((uint8_t)c);
        if (!k->control) table_case(res, "decode table (num/formats)", dec, tab, 16);
        /* the kernel's decoder: one NVFP4 row holding codes 0..15, block scale 1.0, global 1 */
        uint8_t packed[8], scale = 0x38;
        for (int j = 0; j < 8; j++) packed[j] = (uint8_t)((2 * j) | ((2 * j + 1) << 4));
        float one = 1.0f;
        dr_tensor tw = {.name = "codes", .dtype = DR_DT_U8, .ndim = 2, .shape = {1, 8}, .data = packed, .nbytes = 8};
        dr_tensor ts = {.name = "codes.weight_scale", .dtype = DR_DT_F8_E4M3, .ndim = 2, .shape = {1, 1},
                        .data = &scale, .nbytes = 1};
        dr_tensor t2 = {.name = "codes.weight_scale_2", .dtype = DR_DT_F32, .ndim = 0, .data = (const uint8_t *)&one,
                        .nbytes = 4};
        dr_weight w;
        if (!k->control && dr_weight_bind(&tw, &ts, &t2, NULL, -1, 0, 0, &w, NULL) == DRAMA_OK) {
            dr_cpu_dequant_row_path(&w, 0, dec, DR_CPU_AUTO);
            table_case(res, "decode table (cpu kernel)", dec, tab, 16);
        }
        int64_t n = dr_tensor_numel(probe);
        if (dr_tensor_numel(gold) < n) n = dr_tensor_numel(gold);
        float *out = malloc((size_t)n * sizeof *out), *alt = malloc((size_t)n * sizeof *alt);
        double *ref = malloc((size_t)n * sizeof *ref), *tol = calloc((size_t)n, sizeof *tol);
        for (int64_t i = 0; i < n; i++) {
            float p = f32_at(probe, i) / 10.0f; /* in fp32, as the golden file states */
            out[i] = e2m1_under_test(k, p);
            alt[i] = e2m1_ties_away(p);
            ref[i] = gold->data[i];
        }
        ct_compare(res, "encode probes/10 (RNE, saturate 6, zero is code 0)", out, ref, tol, n);
        ct_discriminate(res, "encode probes/10", alt, ref, tol, n);
        free(out), free(alt), free(ref), free(tol);
    }
    dr_st_close(f);
}

static void check_bf16(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    (void)ctx;
    dr_st_file *f = open_units(k, res);
    if (!f) return;
    const dr_tensor *probe = need(f, "probe.f32", 1, res), *gold = need(f, "probe.to_bf16_rne", 1, res);
    if (probe && gold) {
        int64_t n = dr_tensor_numel(probe);
        if (dr_tensor_numel(gold) < n) n = dr_tensor_numel(gold);
        float *out = malloc((size_t)n * sizeof *out), *alt = malloc((size_t)n * sizeof *alt);
        double *ref = malloc((size_t)n * sizeof *ref), *tol = calloc((size_t)n, sizeof *tol);
        for (int64_t i = 0; i < n; i++) {
            float p = f32_at(probe, i) * 1.0001f; /* in fp32, as the golden file states */
            uint16_t g;
            memcpy(&g, gold->data + 2 * i, 2);
            out[i] = dr_bf16_to_f32(dr_f32_to_bf16(p));
            alt[i] = dr_bf16_to_f32((uint16_t)(dr_f32_bits(p) >> 16)); /* truncation */
            ref[i] = dr_bf16_to_f32(g);
        }
        ct_compare(res, "encode probes*1.0001 (RNE)", out, ref, tol, n);
        ct_discriminate(res, "encode probes*1.0001", alt, ref, tol, n);
        free(out), free(alt), free(ref), free(tol);
    }
    dr_st_close(f);
}

/* The stored units through the kernels: dequantised rows bit-exact against `.dequant`, and
 * y = x W^T against the float64 product with `.dequant` under the matmul tolerance rule. */
static void check_units(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    dr_st_file *f = open_units(k, res);
    if (!f) return;
    uint64_t s = ctx->seed ^ 0x554e4954ull;
    int units = 0;
    for (int64_t ti = 0; ti < dr_st_count(f); ti++) {
        const char *nm = dr_st_at(f, ti)->name;
        size_t ln = strlen(nm);
        if (ln < 9 || ln > 200 || strcmp(nm + ln - 8, ".dequant") != 0) continue;
        char base[201], buf[256];
        memcpy(base, nm, ln - 8);
        base[ln - 8] = 0;
        const dr_tensor *dq = dr_st_at(f, ti), *parts[5];
        const char *suffix[5] = {"weight", "weight_scale_inv", "weight_scale", "weight_scale_2", "biases"};
        for (int i = 0; i < 5; i++) {
            snprintf(buf, sizeof buf, "%s.%s", base, suffix[i]);
            parts[i] = dr_st_find(f, buf);
        }
        snprintf(buf, sizeof buf, "%s.scales", base);
        const dr_tensor *scale = parts[1] ? parts[1] : parts[2] ? parts[2] : dr_st_find(f, buf);
        dr_weight w;
        drama_error err = {0};
        if (!parts[0] || dr_weight_bind(parts[0], scale, parts[3], parts[4], -1, 0, 0, &w, &err) != DRAMA_OK ||
            dq->ndim != 2 || dq->shape[0] != w.rows || dq->shape[1] != w.cols || dq->dtype != DR_DT_F32) {
            ct_case_error(res, base, err.message[0] ? err.message : "cannot bind the unit");
            continue;
        }
        units++;
        int64_t rows = w.rows, cols = w.cols, n = 2;
        float *row = malloc((size_t)cols * sizeof *row), *x = malloc((size_t)(n * cols) * sizeof *x);
        float *y = malloc((size_t)(n * rows) * sizeof *y), *alt = malloc((size_t)(n * rows) * sizeof *alt);
        float *dqa = malloc((size_t)(rows * cols) * sizeof *dqa);
        double *ref = malloc((size_t)(n * rows) * sizeof *ref), *tol = malloc((size_t)(n * rows) * sizeof *tol);
        double *zero = calloc((size_t)(rows * cols), sizeof *zero);
        double *dref = malloc((size_t)(rows * cols) * sizeof *dref);
        for (int64_t r = 0; r < rows; r++) {
            dr_cpu_dequant_row_path(&w, r, row, (dr_cpu_path)k->variant);
            memcpy(dqa + r * cols, row, (size_t)cols * sizeof *row);
        }
        for (int64_t i = 0; i < rows * cols; i++) dref[i] = f32_at(dq, i);
        snprintf(buf, sizeof buf, "%s dequantised (bit-exact)", base);
        ct_compare(res, buf, dqa, dref, zero, rows * cols);
        for (int64_t i = 0; i < n * cols; i++) x[i] = (float)ct_rand_normal(&s);
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < rows; r++) {
                double acc = 0, m = 0;
                float h = 0;
                for (int64_t c = 0; c < cols; c++) {
                    double wv = f32_at(dq, r * cols + c);
                    acc += (double)x[i * cols + c] * wv;
                    m += fabs((double)x[i * cols + c] * wv);
                    h = ct_h(h + x[i * cols + c] * (float)wv);
                }
                ref[i * rows + r] = acc;
                tol[i * rows + r] = (double)(cols + 4) * CT_U32 * m + 0x1p-140;
                alt[i * rows + r] = h;
            }
        ct_poison(y, n * rows);
        dr_cpu_matmul_path(&w, 0, rows, x, n, y, ctx->pool, (dr_cpu_path)k->variant);
        snprintf(buf, sizeof buf, "%s x W^T", base);
        ct_compare(res, buf, y, ref, tol, n * rows);
        ct_discriminate(res, buf, alt, ref, tol, n * rows);
        free(row), free(x), free(y), free(alt), free(dqa), free(ref), free(tol), free(zero), free(dref);
    }
    if (!units) {
        ct_case_error(res, k->data, "no <unit>.dequant tensors");
    }
    dr_st_close(f);
}

static int find_units(const char *golden_dir) {
    if (!golden_dir || !golden_dir[0]) return 0;
    snprintf(k_path, sizeof k_path, "%s/ref/quant-units.safetensors", golden_dir);
    return access(k_path, R_OK) == 0;
}

int ct_golden_kernels(ct_kernel *out, int max, const char *golden_dir) {
    if (!find_units(golden_dir) || max < 6) return 0;
    int n = 0;
    out[n++] = (ct_kernel){.name = "format.e4m3", .backend = "cpu",
                           .precision = "exact: 256-code table (value, sign, NaN) via num and the kernel decoder; "
                                        "satfinite RNE encode of the probes",
                           .check = check_e4m3, .variant = G_E4M3, .data = k_path};
    out[n++] = (ct_kernel){.name = "format.e2m1", .backend = "cpu",
                           .precision = "exact: 16-code table via num and the NVFP4 decoder; RNE encode "
                                        "(zero = code 0)",
                           .check = check_e2m1, .variant = G_E2M1, .data = k_path};
    out[n++] = (ct_kernel){.name = "format.bf16", .backend = "cpu", .precision = "exact: RNE encode of the probes",
                           .check = check_bf16, .variant = G_BF16, .data = k_path};
    const dr_cpu_path paths[3] = {DR_CPU_AVX512, DR_CPU_AVX2, DR_CPU_PORTABLE};
    const char *const backends[3] = {"cpu/avx512", "cpu/avx2", "cpu/portable"};
    for (int p = 0; p < 3; p++) {
        if (!dr_cpu_path_supported(paths[p])) continue;
        out[n++] = (ct_kernel){.name = "matmul.golden_units",
                               .backend = backends[p],
                               .precision = "dequantisation bit-exact vs .dequant; product under the matmul rule",
                               .check = check_units, .variant = (int)paths[p], .data = k_path};
    }
    return n;
}

int ct_golden_controls(ct_kernel *out, int max, const char *golden_dir) {
    if (!find_units(golden_dir) || max < 2) return 0;
    out[0] = (ct_kernel){.name = "format.e4m3", .backend = "cpu/control", .check = check_e4m3, .variant = G_E4M3,
                         .control = GC_NAN_OVERFLOW, .control_desc = "overflow to NaN (plain cast)", .data = k_path};
    out[1] = (ct_kernel){.name = "format.e2m1", .backend = "cpu/control", .check = check_e2m1, .variant = G_E2M1,
                         .control = GC_SIGNED_ZERO, .control_desc = "negative zero kept as code 8", .data = k_path};
    return 2;
}
