#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *tu_golden(const char *rel) {
    static char buf[4][4096];
    static int slot;
    const char *root = getenv("DRAMA_GOLDEN");
    if (!root) root = "../shared/golden";
    char *out = buf[slot++ & 3];
    snprintf(out, sizeof buf[0], "%s/%s", root, rel);
    return out;
}

tu_cmp tu_compare_f32(const float *a, const float *b, int64_t n) {
    tu_cmp c = {0};
    double se = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!isfinite(x)) { c.nonfinite++; continue; }
        double d = fabs(x - y);
        if (d > c.max_abs) { c.max_abs = d; c.worst = i; }
        if (fabs(y) > c.max_ref) c.max_ref = fabs(y);
        se += d * d;
    }
    c.max_rel = c.max_ref > 0 ? c.max_abs / c.max_ref : 0;
    c.rmse = n ? sqrt(se / (double)n) : 0;
    return c;
}

int tu_report(const char *label, tu_cmp c, double bound_abs) {
    int ok = c.nonfinite == 0 && c.max_abs <= bound_abs;
    printf("%-40s max_abs=%.3e max_rel=%.3e rmse=%.3e nonfinite=%lld bound=%.1e %s\n", label, c.max_abs,
           c.max_rel, c.rmse, (long long)c.nonfinite, bound_abs, ok ? "ok" : "FAIL");
    return ok;
}
