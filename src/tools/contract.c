/* contract.c - the `drama contract` runner: registry, comparison rules, report, summary. */
#include "tools/contract.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "num/formats.h"
#include "tools/contract_internal.h"

/* ---- helpers ---- */

uint64_t ct_rand_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double ct_rand_uniform(uint64_t *s) { return (double)(ct_rand_u64(s) >> 11) * 0x1p-53; }

double ct_rand_normal(uint64_t *s) {
    double u1 = ct_rand_uniform(s), u2 = ct_rand_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

const char *const ct_x_kind[X_KINDS] = {"random", "dynamic-range", "tiny", "nan-inf", "fp16-discriminating"};

void ct_fill_kind(uint64_t *s, int kind, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = ct_rand_normal(s);
        if (kind == X_RANGE) v *= ldexp(1.0, (int)(ct_rand_u64(s) % 41) - 20);
        if (kind == X_TINY) v *= 1e-4;
        if (kind == X_DISCR) v = 0.5 + 0.5 * ct_rand_uniform(s);
        x[i] = (float)v;
    }
}

void ct_poison(float *y, int64_t n) {
    float p = dr_f32_from_bits(0x7FC0DEADu);
    for (int64_t i = 0; i < n; i++) y[i] = p;
}

double ct_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

float ct_h(float v) { return dr_f16_to_f32(dr_f32_to_f16(v)); }

void ct_case_error(ct_result *res, const char *case_name, const char *msg) {
    res->cases++;
    res->failed_cases++;
    res->run_errors++;
    if (!res->first_failure[0])
        snprintf(res->first_failure, sizeof res->first_failure, "%s: could not run: %s", case_name, msg);
}

/* Worst violation in a case: returns max err/tol (INFINITY for a NaN/Inf rule violation). */
static double case_ratio(const float *out, const double *ref, const double *tol, int64_t n, int64_t *where,
                         double *max_abs, double *relnorm) {
    double worst = 0, ma = 0, num = 0, den = 0;
    *where = -1;
    for (int64_t i = 0; i < n; i++) {
        double o = out[i], r = ref[i], ratio;
        if (isnan(r)) {
            ratio = isnan(o) ? 0 : INFINITY;
        } else if (isinf(r)) {
            ratio = (o == r) ? 0 : INFINITY;
        } else if (!isfinite(o)) {
            ratio = INFINITY;
        } else {
            double e = fabs(o - r);
            ratio = e / tol[i];
            if (e == 0) ratio = 0;
            if (!(tol[i] >= 0) || isinf(tol[i])) ratio = INFINITY; /* a NaN/Inf/negative bound is a reference bug */
            if (e > ma) ma = e;
            num += e * e;
            den += r * r;
        }
        if (ratio > worst || (isnan(ratio) && worst == 0)) {
            worst = ratio;
            *where = i;
        }
    }
    *max_abs = ma;
    *relnorm = den > 0 ? sqrt(num / den) : sqrt(num);
    return worst;
}

int ct_compare(ct_result *res, const char *case_name, const float *out, const double *ref, const double *tol,
               int64_t n) {
    int64_t where;
    double ma, rn;
    double worst = case_ratio(out, ref, tol, n, &where, &ma, &rn);
    res->cases++;
    if (ma > res->max_abs) res->max_abs = ma;
    if (worst > res->max_ratio) res->max_ratio = worst;
    if (rn > res->max_relnorm) res->max_relnorm = rn;
    int ok = worst <= 1.0;
    if (!ok) {
        res->failed_cases++;
        if (!res->first_failure[0])
            snprintf(res->first_failure, sizeof res->first_failure, "%s: out[%lld] = %.9g, ref %.9g, tol %.3g",
                     case_name, (long long)where, (double)out[where], ref[where], tol[where]);
    }
    return ok;
}

void ct_discriminate(ct_result *res, const char *case_name, const float *alt, const double *ref, const double *tol,
                     int64_t n) {
    int64_t where;
    double ma, rn;
    double worst = case_ratio(alt, ref, tol, n, &where, &ma, &rn);
    (void)case_name;
    res->discr_checked = 1;
    if (worst > res->discr_ratio) res->discr_ratio = worst;
    if (worst > 1.0) res->discriminating = 1;
}

/* ---- runner ---- */

#define CT_MAX 256 /* kernels (and controls) registered; the CUDA build holds about 190 kernels + the format fixtures */

static int pattern_matches(const char *pat, const char *s) {
    if (strpbrk(pat, "*?[")) return fnmatch(pat, s, 0) == 0;
    return strstr(s, pat) != NULL;
}

/* The pattern selects by name or by "<backend>/<name>" (`--only cuda`, `--only 'cpu/avx2/matmul.*'`). */
static int selected(const dr_contract_options *o, const ct_kernel *k) {
    if (!o->only || !o->only[0]) return 1;
    char full[160];
    snprintf(full, sizeof full, "%s/%s", k->backend ? k->backend : "", k->name);
    return pattern_matches(o->only, k->name) || pattern_matches(o->only, full);
}

/* Entries that cannot run here (no device): one NOT RUN line per backend and reason (a group); they
 * are left out of N and of C. */
typedef struct ct_skip_group {
    char backend[32], why[200], family[48]; /* backend: up to its first '/' ("cuda" for "cuda/control") */
    int kernels, controls;
} ct_skip_group;

static void skip_note(ct_skip_group *g, int *ng, const ct_kernel *k, const char *why, int control) {
    char be[32];
    snprintf(be, sizeof be, "%.*s", (int)strcspn(k->backend, "/"), k->backend);
    int i = 0;
    while (i < *ng && !(strcmp(g[i].backend, be) == 0 && strcmp(g[i].why, why) == 0)) i++;
    if (i == *ng) {
        if (*ng == 8) i = 7; /* more distinct reasons than lines: count them with the last */
        else {
            memset(&g[i], 0, sizeof g[i]);
            snprintf(g[i].backend, sizeof g[i].backend, "%s", be);
            snprintf(g[i].why, sizeof g[i].why, "%s", why);
            snprintf(g[i].family, sizeof g[i].family, "%.*s", (int)strcspn(k->name, "."), k->name);
            (*ng)++;
        }
    }
    size_t fl = strlen(g[i].family);
    if (strncmp(k->name, g[i].family, fl) != 0 || (k->name[fl] != '.' && k->name[fl])) g[i].family[0] = 0;
    if (control) g[i].controls++;
    else g[i].kernels++;
}

int dr_contract_run(const dr_contract_options *o, FILE *out, dr_contract_summary *summary) {
    static ct_kernel kernels[CT_MAX], controls[CT_MAX];
    int nk = 0, nc = 0;
    nk += ct_matmul_kernels(kernels + nk, CT_MAX - nk);
    nk += ct_ops_kernels(kernels + nk, CT_MAX - nk);
    nk += ct_model_kernels(kernels + nk, CT_MAX - nk);
    nk += ct_gdn_chunk_kernels(kernels + nk, CT_MAX - nk);
    nk += ct_codec_kernels(kernels + nk, CT_MAX - nk);
    nk += ct_cuda_kernels(kernels + nk, CT_MAX - nk);
    nc += ct_matmul_controls(controls + nc, CT_MAX - nc);
    nc += ct_ops_controls(controls + nc, CT_MAX - nc);
    nc += ct_model_controls(controls + nc, CT_MAX - nc);
    nc += ct_gdn_chunk_controls(controls + nc, CT_MAX - nc);
    nc += ct_codec_controls(controls + nc, CT_MAX - nc);
    nc += ct_cuda_controls(controls + nc, CT_MAX - nc);
    const char *golden = o->golden ? o->golden : getenv("DRAMA_GOLDEN");
    int ng = ct_golden_kernels(kernels + nk, CT_MAX - nk, golden);
    nk += ng;
    nc += ct_golden_controls(controls + nc, CT_MAX - nc, golden);

    dr_contract_summary s = {0};
    ct_ctx ctx = {.pool = dr_pool_create(o->threads > 0 ? o->threads : 2), .seed = o->seed ? o->seed : 20261201};
    fprintf(out, "drama contract: %d kernels, %d planted controls registered; seed %llu, %d threads\n", nk, nc,
            (unsigned long long)ctx.seed, dr_pool_threads(ctx.pool));
    if (ng) fprintf(out, "format fixtures: %s/ref/quant-units.safetensors\n", golden);
    else fprintf(out, "format fixtures: golden data not found (--golden DIR or $DRAMA_GOLDEN): format.* not run\n");
    fprintf(out, "tolerance rules and fixtures: docs/contract.md\n");
    if (ct_cuda_build_note()) fprintf(out, "%s\n", ct_cuda_build_note());
    static unsigned char skip_k[CT_MAX], skip_c[CT_MAX];
    ct_skip_group groups[8];
    int ngroups = 0, nskipped = 0;
    for (int pass = 0; pass < 2; pass++) {
        const ct_kernel *list = pass ? controls : kernels;
        unsigned char *skip = pass ? skip_c : skip_k;
        for (int i = 0; i < (pass ? nc : nk); i++) {
            char why[200];
            skip[i] = selected(o, &list[i]) && list[i].unavailable && list[i].unavailable(why, sizeof why);
            if (skip[i]) {
                skip_note(groups, &ngroups, &list[i], why, pass);
                nskipped++;
            }
        }
    }
    for (int i = 0; i < ngroups; i++)
        fprintf(out, "NOT RUN  %s%s %s: %s (%d kernels, %d controls left out of the summary)\n",
                groups[i].family[0] ? groups[i].family : "*", groups[i].family[0] ? ".*" : "", groups[i].backend,
                groups[i].why, groups[i].kernels, groups[i].controls);
    fprintf(out, "\n");
    for (int i = 0; i < nk; i++) {
        const ct_kernel *k = &kernels[i];
        if (!selected(o, k)) continue;
        if (o->list) {
            fprintf(out, "kernel  %-24s %-13s %s%s\n", k->name, k->backend, k->precision,
                    skip_k[i] ? " [not run here]" : "");
            s.listed++;
            continue;
        }
        if (skip_k[i]) continue;
        ct_result r = {0};
        k->check(k, &ctx, &r);
        int pass = r.cases > 0 && r.failed_cases == 0 && (!r.discr_checked || r.discriminating);
        if (!r.discr_checked) pass = 0; /* every kernel must carry a precision-discriminating fixture */
        s.kernels++;
        if (pass) s.pass++;
        else s.fail++;
        fprintf(out, "%s %-24s %-13s cases=%-3d max_abs=%-9.3g err/tol=%-8.3g relnorm=%-9.3g discr=%s(alt %.3g)",
                pass ? "PASS" : "FAIL", k->name, k->backend, r.cases, r.max_abs, r.max_ratio, r.max_relnorm,
                r.discriminating ? "yes" : "NO", r.discr_ratio);
        if (!o->no_limits && k->time) {
            double ms = k->time(k, &ctx);
            fprintf(out, " time=%.3fms %s (limit %.3gms%s)", ms, k->time_shape, k->limit_ms,
                    ms > k->limit_ms ? ", OVER: reported only" : "");
        }
        fprintf(out, "\n     contract: %s\n", k->precision);
        if (!pass) {
            if (r.first_failure[0]) fprintf(out, "     first failure: %s\n", r.first_failure);
            if (r.discr_checked && !r.discriminating)
                fprintf(out, "     fixtures are not precision-discriminating: the reduced-precision variant passed\n");
            if (!r.discr_checked) fprintf(out, "     no precision-discriminating fixture\n");
        }
        fflush(out);
    }
    for (int i = 0; i < nc; i++) {
        const ct_kernel *k = &controls[i];
        if (!selected(o, k)) continue;
        if (o->list) {
            fprintf(out, "control %-24s %-13s %s%s\n", k->name, k->backend, k->control_desc,
                    skip_c[i] ? " [not run here]" : "");
            s.listed++;
            continue;
        }
        if (skip_c[i]) continue;
        ct_result r = {0};
        k->check(k, &ctx, &r);
        int red = r.failed_cases > 0 && r.run_errors == 0; /* red only from numbers the fixtures saw */
        s.controls++;
        if (red) s.red++;
        else s.missed++;
        fprintf(out, "%s control %-24s (%s): %s\n", red ? "RED   " : "MISSED", k->name, k->control_desc,
                red ? "red as planted"
                : r.run_errors ? "could not run, so it proves nothing"
                               : "PASSED: the contract cannot see this defect");
        if (!red && r.run_errors) fprintf(out, "     %s\n", r.first_failure);
        if (red) fprintf(out, "     caught by %d of %d cases; first: %s\n", r.failed_cases, r.cases, r.first_failure);
        fflush(out);
    }
    dr_pool_free(ctx.pool);
    if (!o->list)
        fprintf(out, "SUMMARY %d kernels: %d pass, %d fail; %d controls: %d red as planted, %d missed\n", s.kernels,
                s.pass, s.fail, s.controls, s.red, s.missed);
    if (!o->list && s.kernels == 0 && s.controls == 0 && nskipped > 0) {
        s.not_run = nskipped;
        snprintf(s.not_run_why, sizeof s.not_run_why, "%s", groups[0].why);
    }
    if (summary) *summary = s;
    return (s.fail == 0 && s.missed == 0) ? 0 : 1;
}
