/* testutil.h - helpers shared by the tests: where the golden data lives, float64 comparison
 * with max-abs / max-rel reporting (NaN/Inf always fails), and reading golden tensors. */
#ifndef DRAMA_TESTUTIL_H
#define DRAMA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* $DRAMA_GOLDEN (set by ctest) joined with rel, in a static buffer per call slot (4 slots). */
const char *tu_golden(const char *rel);

/* The one way tests compare float arrays: n values against a reference, in float64. A NaN or Inf
 * on either side is a failure (counted in nonfinite) unless the caller states, with
 * tu_cmp_opts.nonfinite_same, that where the reference is non-finite the value must be the same
 * non-finite value (NaN for NaN, an Inf of the same sign). Every verdict below is 0 when
 * nonfinite > 0 or n < 0; callers assert the verdict. */
typedef struct tu_cmp {
    int64_t n;
    double max_abs;       /* max |a - ref| over finite pairs */
    double max_ref;       /* max |ref| over finite pairs */
    double max_rel;       /* max_abs / max_ref (0 if max_ref == 0): error relative to the reference's scale */
    double max_elem_rel;  /* max |a - ref| / |ref| (Inf where ref == 0 != a) */
    double rmse;
    int64_t worst;        /* index of max_abs (-1: none) */
    double worst_a, worst_ref;
    double max_tol_ratio; /* max |a - ref| / tol[i] with per-element tolerances (0 without) */
    int64_t worst_tol;    /* index of max_tol_ratio (-1: none) */
    int64_t nonfinite;    /* pairs with a non-finite value not stated as expected: always a failure */
    int64_t first_nonfinite; /* the first of them (-1: none) */
    double nonfinite_a, nonfinite_ref;
    int64_t nonfinite_same; /* non-finite pairs the caller stated (nonfinite_same), equal on both sides */
} tu_cmp;

typedef struct tu_cmp_opts {
    const double *tol;  /* per-element bound on |a - ref| (NULL: none), for tu_report_tol */
    int nonfinite_same; /* where ref is NaN/Inf, a must be the same NaN/Inf (else a failure) */
} tu_cmp_opts;

tu_cmp tu_compare_f32(const float *a, const float *ref, int64_t n);
tu_cmp tu_compare_f64(const double *a, const double *ref, int64_t n);
tu_cmp tu_compare_f32_f64(const float *a, const double *ref, int64_t n); /* float results, float64 reference */
tu_cmp tu_compare_f32_opts(const float *a, const float *ref, int64_t n, const tu_cmp_opts *o);
/* Each prints one line "label: max_abs=... max_rel=... worst [i] a vs ref ... nonfinite=... ok|FAIL"
 * and returns the verdict: finite and max_abs <= bound (tu_report), max_rel <= bound (tu_report_rel),
 * max_elem_rel <= bound (tu_report_elem_rel), max_tol_ratio <= 1 (tu_report_tol), or max_abs > bound
 * (tu_report_differs: the arrays must differ visibly). */
int tu_report(const char *label, tu_cmp c, double bound_abs);
int tu_report_rel(const char *label, tu_cmp c, double bound_rel);
int tu_report_elem_rel(const char *label, tu_cmp c, double bound_rel);
int tu_report_tol(const char *label, tu_cmp c);
int tu_report_differs(const char *label, tu_cmp c, double min_abs);

/* Bound on |dequantised - source| for one group of MLX affine quantisation (FORMATS.md 4.4) of the
 * source values w[0..n) to `bits` bits with scales/biases stored at relative precision eps (2^-8
 * BF16, 2^-11 F16, 2^-24 F32), computed from the source alone: 1.5 steps of the ideal step
 * (max - min) / (2^bits - 1) (widened by the edge rounding of the scale, at least the format's
 * minimum step 1e-7), plus eps * (|edge| + (2^bits - 1) * step) for the stored scale and bias. */
double tu_affine_bound(const float *w, int64_t n, int bits, double eps);
/* tol[i] = tu_affine_bound of the group of `group` consecutive values holding src[i] (n % group == 0). */
void tu_affine_tol(const float *src, int64_t n, int group, int bits, double eps, double *tol);

/* Read tensor `name` of safetensors file `path` as float32 (any dtype, via dr_st_to_f32) or int32
 * (integer dtypes only, values must fit). malloc'd, free with free(); *n = element count (n may be
 * NULL). A missing file or tensor fails the current cmocka test with a message naming both. */
float *tu_load_f32(const char *path, const char *name, int64_t *n);
int32_t *tu_load_i32(const char *path, const char *name, int64_t *n);
/* Golden codes: tensor `name` stored [codebook][frame] (K codebooks), returned [frame][codebook]
 * as the engine takes them; *frames = its frame count. Fails the test unless numel % K == 0. */
int32_t *tu_load_codes(const char *path, const char *name, int K, int64_t *frames);

/* A golden model directory (rel under $DRAMA_GOLDEN) with its symbolic links intact. Some copies of
 * the golden data store the links of variants/ as small text files holding the target path (git
 * with core.symlinks=false); this rebuilds the directory in a temporary folder as real symlinks
 * (every entry a link, so the loader's symlink following is exercised too). Returns the original
 * path when nothing needed restoring. Static buffer per call slot (4 slots). */
const char *tu_model_dir(const char *rel);

/* A fresh empty temporary directory (mkdtemp under $TMPDIR or /tmp); static buffer per slot. */
const char *tu_tmpdir(void);
/* Remove a directory tree made by the tests (no symlink following). Returns 0 on success. */
int tu_rm_rf(const char *path);
/* Write n bytes to path (truncating); fails the test on error. */
void tu_write_file(const char *path, const void *data, size_t n);
/* Read a whole file (malloc'd, NUL-terminated); fails the test on error. */
char *tu_read_file(const char *path, size_t *n);
/* `bin forward` of `model` on ROWS.json `rows`, dumped to dir/<tag>.out.safetensors: its logits
 * (malloc'd, *n values). A failing command or a non-finite logit fails the test. */
float *tu_forward_logits(const char *bin, const char *dir, const char *model, const char *rows, const char *tag,
                         int64_t *n);

/* Audio collected from an audio callback (drama_audio_fn): tu_pcm_collect appends the samples
 * (user = a zeroed tu_pcm) and returns nonzero on call number cancel_after when that is > 0. */
typedef struct tu_pcm {
    float *x;
    size_t n, cap;
    int calls;
    int cancel_after;
} tu_pcm;
int tu_pcm_collect(void *user, const float *samples, size_t n);
void tu_pcm_free(tu_pcm *p);

#endif
