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

#endif
