/* cli_args.c - numeric flag values, parsed strictly (the whole string, no overflow, in range). */
#include "base/cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int bad(const char *cmd, const char *flag, const char *v, const char *why) {
    fprintf(stderr, "drama %s: %s: invalid value '%s': %s\n", cmd, flag, v ? v : "(missing)", why);
    return 0;
}

int dr_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out) {
    char *end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno) return bad(cmd, flag, v, "expected an integer");
    if (x < lo || x > hi) {
        char why[96];
        snprintf(why, sizeof why, "must be in %lld..%lld", lo, hi);
        return bad(cmd, flag, v, why);
    }
    *out = x;
    return 1;
}

int dr_cli_num(const char *cmd, const char *flag, const char *v, double lo, double hi, int lo_open, double *out) {
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno) return bad(cmd, flag, v, "expected a number");
    if (!isfinite(x)) return bad(cmd, flag, v, "must be finite");
    if (x < lo || x > hi || (lo_open && x <= lo)) {
        char why[96];
        snprintf(why, sizeof why, "must be in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
        return bad(cmd, flag, v, why);
    }
    *out = x;
    return 1;
}

int dr_cli_seed(const char *cmd, const char *flag, const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (!v || !*v) return bad(cmd, flag, v, "expected a 64-bit integer");
    if (v[0] == '-') {
        long long x = strtoll(v, &end, 10);
        if (*end || errno) return bad(cmd, flag, v, "expected a 64-bit integer");
        *out = (uint64_t)x;
    } else {
        unsigned long long x = strtoull(v, &end, 10);
        if (*end || errno) return bad(cmd, flag, v, "expected a 64-bit integer");
        *out = (uint64_t)x;
    }
    return 1;
}
