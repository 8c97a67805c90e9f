/* testutil.h - helpers shared by the tests: where the golden data lives, float64 comparison
 * with max-abs / max-rel reporting (NaN/Inf always fails), and reading golden tensors. */
#ifndef DRAMA_TESTUTIL_H
#define DRAMA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* $DRAMA_GOLDEN (set by ctest) joined with rel, in a static buffer per call slot (4 slots). */
const char *tu_golden(const char *rel);

/* Comparison of n values against a reference, in float64. */
typedef struct tu_cmp {
    double max_abs;   /* max |a - b| */
    double max_ref;   /* max |b| */
    double max_rel;   /* max_abs / max_ref (0 if max_ref == 0) */
    double rmse;
    int64_t worst;    /* index of max_abs */
    int64_t nonfinite;/* count of non-finite values in a (always a failure) */
} tu_cmp;

tu_cmp tu_compare_f32(const float *a, const float *b, int64_t n);
/* Prints "label: max_abs=... max_rel=... rmse=..." and returns 1 when within bound and finite. */
int tu_report(const char *label, tu_cmp c, double bound_abs);

/* Read tensor `name` of safetensors file `path` as float32 (any dtype, via dr_st_to_f32) or int32
 * (integer dtypes only, values must fit). malloc'd, free with free(); *n = element count (n may be
 * NULL). A missing file or tensor fails the current cmocka test with a message naming both. */
float *tu_load_f32(const char *path, const char *name, int64_t *n);
int32_t *tu_load_i32(const char *path, const char *name, int64_t *n);

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
