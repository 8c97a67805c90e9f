/* contract_internal.h - shared pieces of `drama contract` (contract.c runner, contract_matmul.c,
 * contract_ops.c). The rules (tolerances, NaN handling, controls) are in docs/contract.md. */
#ifndef DRAMA_TOOLS_CONTRACT_INTERNAL_H
#define DRAMA_TOOLS_CONTRACT_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "base/pool.h"
#include "num/weight.h"

#define CT_U32 0x1p-24 /* unit roundoff of fp32 */

/* Results of one kernel (or control) over all its cases. */
typedef struct ct_result {
    int cases, failed_cases;
    double max_abs;       /* max |out - ref| over finite comparisons */
    double max_ratio;     /* max |out - ref| / tol: > 1 is a failure */
    double max_relnorm;   /* max over cases of ||out - ref||_2 / ||ref||_2 */
    int discriminating;   /* a precision-discriminating fixture ran and the fp16 variant failed on it */
    int discr_checked;    /* such a fixture exists for this kernel */
    double discr_ratio;   /* the fp16 variant's max err/tol on it */
    int run_errors;       /* cases that could not run (setup failed): a control with any is MISSED, not red */
    char first_failure[320];
} ct_result;

typedef struct ct_ctx {
    dr_pool *pool;
    uint64_t seed;
} ct_ctx;

typedef struct ct_kernel ct_kernel;
typedef void (*ct_check_fn)(const ct_kernel *k, ct_ctx *ctx, ct_result *res);
typedef double (*ct_time_fn)(const ct_kernel *k, ct_ctx *ctx); /* ms per call on the fixed shape */

struct ct_kernel {
    const char *name;      /* "matmul.bf16", "rms_norm", ... */
    const char *backend;   /* "cpu/avx2", "cpu/portable", "cpu" */
    const char *precision; /* the precision contract in words */
    ct_check_fn check;
    ct_time_fn time;
    const char *time_shape;
    double limit_ms;
    int variant;           /* kernel-specific: weight format, code path, ... */
    int control;           /* 0: a real kernel; otherwise the id of a planted defect */
    const char *control_desc;
    const char *data;      /* fixture file, for kernels checked against stored golden data */
    /* NULL, or: returns NULL when the entry can run here, else writes why not into `why` (e.g. "no
     * CUDA device (...)") and returns it; such entries are reported NOT RUN and left out of N. */
    const char *(*unavailable)(char *why, size_t why_size);
};

/* Registries: each fills up to `max` entries and returns how many. */
int ct_matmul_kernels(ct_kernel *out, int max);
int ct_matmul_controls(ct_kernel *out, int max);
int ct_ops_kernels(ct_kernel *out, int max);
int ct_ops_controls(ct_kernel *out, int max);
/* Codec kernels (src/codec/ops.c, transformer.c): contract_codec.c */
int ct_codec_kernels(ct_kernel *out, int max);
int ct_codec_controls(ct_kernel *out, int max);
/* Model-level element-wise kernels (backend/cpu/ops.h beyond the basic ops): contract_model.c */
int ct_model_kernels(ct_kernel *out, int max);
int ct_model_controls(ct_kernel *out, int max);
/* The chunked DeltaNet prefill (backend/cpu/gdn_chunk.c): contract_gdn_chunk.c */
int ct_gdn_chunk_kernels(ct_kernel *out, int max);
int ct_gdn_chunk_controls(ct_kernel *out, int max);
/* CUDA kernels (src/backend/cuda), registered when the backend is built: contract_cuda.c */
int ct_cuda_kernels(ct_kernel *out, int max);
int ct_cuda_controls(ct_kernel *out, int max);
/* NULL when the CUDA backend is built in, else a line saying that it is not (for --list). */
const char *ct_cuda_build_note(void);
/* Format fixtures from ref/quant-units.safetensors under golden_dir (none when it is absent). */
int ct_golden_kernels(ct_kernel *out, int max, const char *golden_dir);
int ct_golden_controls(ct_kernel *out, int max, const char *golden_dir);

/* ---- matmul fixtures, weights and float64 reference, shared by the CPU and CUDA entries
 * (contract_matmul.c) ---- */
enum { CT_F_F32, CT_F_F16, CT_F_BF16, CT_F_FP8B, CT_F_FP8T, CT_F_NVFP4, CT_F_AFF4, CT_F_AFF8, CT_F_AFF4_G32,
       CT_F_AFF4_G128, CT_F_AFF8_G128, CT_F_COUNT };
extern const char *const ct_matmul_names[CT_F_COUNT]; /* "matmul.f32", ... */
enum { CT_K_RANDOM, CT_K_RANGE, CT_K_CANCEL, CT_K_LIMITS, CT_K_NONFINITE, CT_K_DISCR, CT_K_KINDS };
extern const char *const ct_matmul_kinds[CT_K_KINDS]; /* "random", ... */
/* A weight built from fp32 values with the project's encoders; owns its bytes. */
typedef struct ct_w {
    dr_weight w;
    uint8_t *bytes[3];
} ct_w;
int ct_w_make(ct_w *t, int f, const float *src, int64_t rows, int64_t cols); /* 0 or -1 */
void ct_w_free(ct_w *t);
int64_t ct_matmul_granule(int f); /* input width granule: NVFP4 block, affine group, else 1 */
/* Fixture values of one kind for format f: w [rows][cols], x [n][cols]. */
void ct_matmul_fill(int kind, int f, uint64_t *s, float *w, int64_t rows, int64_t cols, float *x, int64_t n);
/* y = x W^T in float64 from the stored bytes; tol = (K + chain) u sum_k |x_k| m_k + 2^-140 (chain: the
 * extra roundings of the kernel beyond K, see docs/contract.md); alt (may be NULL) = fp16-accumulated. */
void ct_matmul_reference(const dr_weight *w, const float *x, int64_t n, int chain, double *ref, double *tol,
                         float *alt);
/* W[r][c] in float64 from the stored bytes (FORMATS.md 3-4), and its magnitude for error bounds
 * (|w|; affine |s q| + |w|). */
double ct_weight_ref(const dr_weight *w, int64_t r, int64_t c, double *mag);
/* out[n][rows] = sum_k mag_k e[n][k]: how errors e of a product's input reach its outputs. */
void ct_matmul_abs(const dr_weight *w, const double *e, int64_t n, double *out);
/* A random fixture for the structure cases: a weight of format f (cols rounded up to the granule),
 * nx activation rows, and their float64 reference and tolerance ([nx][rows], with `chain`). */
typedef struct ct_mm_fixture {
    ct_w t;
    int ok; /* the weight was built */
    float *x;
    int64_t rows, cols, nx;
    double *ref, *tol;
} ct_mm_fixture;
void ct_mm_fixture_make(ct_mm_fixture *fx, int f, uint64_t *seed, int64_t rows, int64_t cols, int64_t nx, int chain);
void ct_mm_fixture_free(ct_mm_fixture *fx);
/* Compares y[n][r1 - r0] (activation rows xoff.. of fx, output rows [r0, r1)) with the reference. */
void ct_mm_compare_rows(ct_result *res, const char *name, const ct_mm_fixture *fx, int64_t xoff, int64_t n, int64_t r0,
                        int64_t r1, const float *y);
/* Runs the product under test into y[n][rows] (poisoned by the caller); 0, or -1 with msg set. */
typedef int (*ct_matmul_run_fn)(const ct_kernel *k, ct_ctx *ctx, const dr_weight *w, const float *x, int64_t n,
                                float *y, void *arg, char *msg, size_t msg_size);
/* Every matmul fixture (ragged shapes x kinds, and the fp16-discriminating one) through `run`. Returns
 * the number of cases whose run reported an error. */
int ct_matmul_cases(const ct_kernel *k, ct_ctx *ctx, ct_result *res, int chain, ct_matmul_run_fn run, void *arg);

/* ---- helpers (contract.c) ---- */
/* A case that could not run (a weight not built, a device call failed): counts as a failed case, and
 * marks the result so that a planted control is never red because of it. */
void ct_case_error(ct_result *res, const char *case_name, const char *msg);
uint64_t ct_rand_u64(uint64_t *s);
double ct_rand_uniform(uint64_t *s);  /* [0, 1) */
double ct_rand_normal(uint64_t *s);
/* The element-wise fixtures' input kinds (contract_ops.c, contract_model.c, contract_cuda_ops.c, the
 * codec's entries) and their names for case labels */
enum { X_RANDOM, X_RANGE, X_TINY, X_NONFINITE, X_DISCR, X_KINDS };
extern const char *const ct_x_kind[X_KINDS];
/* x[0, n) of a kind: normal; X_RANGE times 2^k, k in [-20, 20]; X_TINY times 1e-4; X_DISCR in [0.5, 1]
 * (fp16-discriminating); X_NONFINITE normal, its NaN / inf placed by the caller */
void ct_fill_kind(uint64_t *s, int kind, float *x, int64_t n);
/* Fill with a NaN bit pattern no kernel produces, so an unwritten output is seen. */
void ct_poison(float *y, int64_t n);
/* Compare n outputs with their float64 reference and per-element tolerance:
 *   ref NaN        -> out must be NaN
 *   ref +-inf      -> out must be the same infinity
 *   ref finite     -> out finite and |out - ref| <= tol
 * Updates res (one case); returns 1 when the case passes. */
int ct_compare(ct_result *res, const char *case_name, const float *out, const double *ref, const double *tol,
               int64_t n);
/* Record a precision-discriminating check: `alt` is the output of an fp16-accumulating (or
 * fp16-rounding) variant on the same fixture; it must violate the tolerance somewhere. */
void ct_discriminate(ct_result *res, const char *case_name, const float *alt, const double *ref, const double *tol,
                     int64_t n);
double ct_now_ms(void);
/* fp16 rounding of an fp32 value (the reduced-precision variants accumulate through this) */
float ct_h(float v);

#endif
