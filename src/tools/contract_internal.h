/* contract_internal.h - shared pieces of `drama contract` (contract.c runner, contract_matmul.c,
 * contract_ops.c). The rules (tolerances, NaN handling, controls) are in docs/contract.md. */
#ifndef DRAMA_TOOLS_CONTRACT_INTERNAL_H
#define DRAMA_TOOLS_CONTRACT_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "base/pool.h"

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
/* CUDA kernels (src/backend/cuda), registered when the backend is built: contract_cuda.c */
int ct_cuda_kernels(ct_kernel *out, int max);
int ct_cuda_controls(ct_kernel *out, int max);
/* Format fixtures from ref/quant-units.safetensors under golden_dir (none when it is absent). */
int ct_golden_kernels(ct_kernel *out, int max, const char *golden_dir);
int ct_golden_controls(ct_kernel *out, int max, const char *golden_dir);

/* ---- helpers (contract.c) ---- */
uint64_t ct_rand_u64(uint64_t *s);
double ct_rand_uniform(uint64_t *s);  /* [0, 1) */
double ct_rand_normal(uint64_t *s);
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
