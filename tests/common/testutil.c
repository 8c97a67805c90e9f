#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/file.h"
#include "io/safetensors.h"

const char *tu_golden(const char *rel) {
    static char buf[4][4096];
    static int slot;
    const char *root = getenv("DRAMA_GOLDEN");
    if (!root) root = "../shared/golden";
    char *out = buf[slot++ & 3];
    snprintf(out, sizeof buf[0], "%s/%s", root, rel);
    return out;
}

/* The same NaN/Inf on both sides (NaN payloads and signs aside). */
static int same_nonfinite(double x, double y) { return isnan(x) ? isnan(y) : !isnan(y) && x == y; }

static tu_cmp compare(const float *af, const double *ad, const float *bf, const double *bd, int64_t n,
                      const tu_cmp_opts *o) {
    tu_cmp c = {.n = n, .worst = -1, .worst_tol = -1, .first_nonfinite = -1};
    double se = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = af ? af[i] : ad[i], y = bf ? bf[i] : bd[i];
        if (!isfinite(x) || !isfinite(y)) {
            if (o && o->nonfinite_same && !isfinite(y) && same_nonfinite(y, x)) {
                c.nonfinite_same++;
                continue;
            }
            if (c.nonfinite++ == 0) c.first_nonfinite = i, c.nonfinite_a = x, c.nonfinite_ref = y;
            continue;
        }
        double d = fabs(x - y);
        if (c.worst < 0 || d > c.max_abs) c.max_abs = d, c.worst = i, c.worst_a = x, c.worst_ref = y;
        if (fabs(y) > c.max_ref) c.max_ref = fabs(y);
        double er = y != 0 ? d / fabs(y) : d != 0 ? INFINITY : 0;
        if (er > c.max_elem_rel) c.max_elem_rel = er;
        if (o && o->tol) {
            double t = o->tol[i]; /* a NaN or negative tolerance never passes */
            double r = !(t >= 0) ? INFINITY : d == 0 ? 0 : t > 0 ? d / t : INFINITY;
            if (c.worst_tol < 0 || r > c.max_tol_ratio) c.max_tol_ratio = r, c.worst_tol = i;
        }
        se += d * d;
    }
    c.max_rel = c.max_ref > 0 ? c.max_abs / c.max_ref : c.max_abs > 0 ? INFINITY : 0;
    c.rmse = n > 0 ? sqrt(se / (double)n) : 0;
    return c;
}

tu_cmp tu_compare_f32(const float *a, const float *ref, int64_t n) { return compare(a, NULL, ref, NULL, n, NULL); }
tu_cmp tu_compare_f64(const double *a, const double *ref, int64_t n) { return compare(NULL, a, NULL, ref, n, NULL); }
tu_cmp tu_compare_f32_f64(const float *a, const double *ref, int64_t n) {
    return compare(a, NULL, NULL, ref, n, NULL);
}
tu_cmp tu_compare_f32_opts(const float *a, const float *ref, int64_t n, const tu_cmp_opts *o) {
    return compare(a, NULL, ref, NULL, n, o);
}

static int report(const char *label, tu_cmp c, const char *what, double value, double bound, int within) {
    int ok = c.nonfinite == 0 && c.n >= 0 && within;
    printf("%-40s max_abs=%.3e max_rel=%.3e rmse=%.3e", label, c.max_abs, c.max_rel, c.rmse);
    if (c.worst >= 0) printf(" worst[%lld]=%.9g vs %.9g", (long long)c.worst, c.worst_a, c.worst_ref);
    printf(" nonfinite=%lld", (long long)c.nonfinite);
    if (c.nonfinite) printf(" (first [%lld]=%g vs %g)", (long long)c.first_nonfinite, c.nonfinite_a, c.nonfinite_ref);
    if (c.nonfinite_same) printf(" expected_nonfinite=%lld", (long long)c.nonfinite_same);
    printf(" %s=%.3e bound=%.3e %s\n", what, value, bound, ok ? "ok" : "FAIL");
    return ok;
}

int tu_report(const char *label, tu_cmp c, double bound_abs) {
    return report(label, c, "max_abs", c.max_abs, bound_abs, c.max_abs <= bound_abs);
}
int tu_report_rel(const char *label, tu_cmp c, double bound_rel) {
    return report(label, c, "max_rel", c.max_rel, bound_rel, c.max_rel <= bound_rel);
}
int tu_report_elem_rel(const char *label, tu_cmp c, double bound_rel) {
    return report(label, c, "max_elem_rel", c.max_elem_rel, bound_rel, c.max_elem_rel <= bound_rel);
}
int tu_report_tol(const char *label, tu_cmp c) {
    return report(label, c, "max_err/tol", c.max_tol_ratio, 1.0, c.max_tol_ratio <= 1.0);
}
int tu_report_differs(const char *label, tu_cmp c, double min_abs) {
    return report(label, c, "must_differ_by", c.max_abs, min_abs, c.max_abs > min_abs);
}

double tu_affine_bound(const float *w, int64_t n, int bits, double eps) {
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(w[i])) return NAN; /* a NaN tolerance never passes */
        mn = fmin(mn, w[i]), mx = fmax(mx, w[i]);
    }
    double qmax = (double)((1 << bits) - 1), edge = fmax(fabs(mn), fabs(mx));
    /* |edge| >= range / 2, so the edge code is >= (qmax + 1) / 2: the scale grows by <= 1 / (qmax + 1) */
    double step = fmax((mx - mn) / qmax, 1e-7) * (1 + 1 / (qmax + 1));
    return 1.5 * step + eps * (edge + qmax * step);
}

void tu_affine_tol(const float *src, int64_t n, int group, int bits, double eps, double *tol) {
    for (int64_t g = 0; g < n; g += group) {
        double b = tu_affine_bound(src + g, group, bits, eps);
        for (int j = 0; j < group && g + j < n; j++) tol[g + j] = b;
    }
}

/* ---- golden tensors, temporary folders ---- */


static const dr_tensor *open_tensor(const char *path, const char *name, dr_st_file **f) {
    drama_error err = {0};
    if (dr_st_open(path, f, &err) != DRAMA_OK) fail_msg("cannot open golden file: %s", err.message);
    const dr_tensor *t = dr_st_find(*f, name);
    if (!t) {
        dr_st_close(*f);
        fail_msg("%s: golden tensor '%s' not found", path, name);
    }
    return t;
}

float *tu_load_f32(const char *path, const char *name, int64_t *n) {
    dr_st_file *f = NULL;
    const dr_tensor *t = open_tensor(path, name, &f);
    int64_t numel = dr_tensor_numel(t);
    float *out = malloc((size_t)(numel ? numel : 1) * sizeof *out);
    drama_error err = {0};
    if (!out || dr_st_to_f32(t, out, &err) != DRAMA_OK) {
        free(out);
        dr_st_close(f);
        fail_msg("%s: tensor '%s': %s", path, name, out ? err.message : "out of memory");
    }
    dr_st_close(f);
    if (n) *n = numel;
    return out;
}

int32_t *tu_load_i32(const char *path, const char *name, int64_t *n) {
    dr_st_file *f = NULL;
    const dr_tensor *t = open_tensor(path, name, &f);
    int64_t numel = dr_tensor_numel(t);
    int32_t *out = malloc((size_t)(numel ? numel : 1) * sizeof *out);
    if (!out) {
        dr_st_close(f);
        fail_msg("out of memory");
    }
    size_t es = dr_dtype_size(t->dtype);
    for (int64_t i = 0; i < numel; i++) {
        const uint8_t *p = t->data + (size_t)i * es;
        int64_t v;
        switch (t->dtype) {
        case DR_DT_I32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
        case DR_DT_I64: { memcpy(&v, p, 8); break; }
        case DR_DT_U32: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
        case DR_DT_I16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
        case DR_DT_U16: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case DR_DT_I8: v = (int8_t)p[0]; break;
        case DR_DT_U8: case DR_DT_BOOL: v = p[0]; break;
        default:
            free(out);
            dr_st_close(f);
            fail_msg("%s: tensor '%s' has dtype %s, not an integer type", path, name, dr_dtype_name(t->dtype));
            return NULL;
        }
        if (v < INT32_MIN || v > INT32_MAX) {
            free(out);
            dr_st_close(f);
            fail_msg("%s: tensor '%s'[%lld] = %lld does not fit int32", path, name, (long long)i, (long long)v);
        }
        out[i] = (int32_t)v;
    }
    dr_st_close(f);
    if (n) *n = numel;
    return out;
}

int32_t *tu_load_codes(const char *path, const char *name, int K, int64_t *frames) {
    int64_t n;
    int32_t *g = tu_load_i32(path, name, &n);
    if (K <= 0 || n % K != 0) {
        free(g);
        fail_msg("%s: tensor '%s' has %lld values, not a multiple of %d codebooks", path, name, (long long)n, K);
    }
    *frames = n / K;
    int32_t *c = malloc((size_t)(n ? n : 1) * sizeof *c);
    if (!c) fail_msg("out of memory");
    for (int k = 0; k < K; k++)
        for (int64_t f = 0; f < *frames; f++) c[f * K + k] = g[k * *frames + f];
    free(g);
    return c;
}

const char *tu_tmpdir(void) {
    static char buf[4][4096];
    static int slot;
    char *out = buf[slot++ & 3];
    const char *base = getenv("TMPDIR");
    snprintf(out, sizeof buf[0], "%s/drama-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(out)) fail_msg("mkdtemp %s: %s", out, strerror(errno));
    return out;
}

int tu_rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        if (tu_rm_rf(sub) != 0) rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0) rc = -1;
    return rc;
}

void tu_write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) fail_msg("cannot create %s: %s", path, strerror(errno));
    size_t w = n ? fwrite(data, 1, n, fp) : 0;
    if (fclose(fp) != 0 || w != n) fail_msg("cannot write %s", path);
}

char *tu_read_file(const char *path, size_t *n) {
    char *buf;
    size_t len;
    drama_error err = {0};
    if (dr_read_file(path, DR_FILE_MAX_BYTES, &buf, &len, &err)) fail_msg("%s", err.message);
    if (n) *n = len;
    return buf;
}

float *tu_forward_logits(const char *bin, const char *dir, const char *model, const char *rows, const char *tag,
                         int64_t *n) {
    char out[4300], cmd[16384];
    snprintf(out, sizeof out, "%s/%s.out.safetensors", dir, tag);
    snprintf(cmd, sizeof cmd, "'%s' forward --model '%s' --rows '%s' --dump '%s' --threads 2", bin, model, rows, out);
    int rc = system(cmd);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("%s: failed (status %d)", cmd, rc);
    float *l = tu_load_f32(out, "logits", n);
    for (int64_t i = 0; i < *n; i++)
        if (!isfinite(l[i])) fail_msg("%s: logit %lld is not finite", out, (long long)i);
    return l;
}

/* A text file of at most 4 KiB whose whole content is a relative path (no NUL/newline) that
 * resolves, from its folder, to an existing file: a symlink stored as text. */
static int placeholder_target(const char *dir, const char *file, char *target, size_t cap) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 || sb.st_size >= 4096) return 0;
    FILE *fp = fopen(p, "rb");
    if (!fp) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    if (strlen(buf) != n || strncmp(buf, "../", 3) != 0 || strchr(buf, '\n')) return 0;
    char full[8192];
    snprintf(full, sizeof full, "%s/%s", dir, buf);
    if (stat(full, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    if (!realpath(full, target)) return 0;
    (void)cap;
    return 1;
}

/* Restored model folders are removed when the test program exits. */
static char g_restored[16][4096];
static int g_nrestored;

static void remove_restored(void) {
    for (int i = 0; i < g_nrestored; i++) tu_rm_rf(g_restored[i]);
}

const char *tu_model_dir(const char *rel) {
    static char buf[4][4096];
    static int slot;
    char *out = buf[slot++ & 3];
    const char *src = tu_golden(rel);
    char src_abs[PATH_MAX];
    if (!realpath(src, src_abs)) fail_msg("golden model dir %s: %s", src, strerror(errno));
    DIR *d = opendir(src_abs);
    if (!d) fail_msg("golden model dir %s: %s", src_abs, strerror(errno));
    int needed = 0;
    struct dirent *e;
    char target[PATH_MAX];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && placeholder_target(src_abs, e->d_name, target, sizeof target)) needed = 1;
    if (!needed) {
        closedir(d);
        snprintf(out, sizeof buf[0], "%s", src_abs);
        return out;
    }
    rewinddir(d);
    snprintf(out, sizeof buf[0], "%s", tu_tmpdir());
    if (g_nrestored < 16) {
        if (g_nrestored == 0) atexit(remove_restored);
        snprintf(g_restored[g_nrestored++], sizeof g_restored[0], "%s", out);
    }
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char link[8192], orig[8192];
        snprintf(link, sizeof link, "%s/%s", out, e->d_name);
        snprintf(orig, sizeof orig, "%s/%s", src_abs, e->d_name);
        const char *to = placeholder_target(src_abs, e->d_name, target, sizeof target) ? target : orig;
        if (symlink(to, link) != 0) fail_msg("symlink %s -> %s: %s", link, to, strerror(errno));
    }
    closedir(d);
    return out;
}

int tu_pcm_collect(void *user, const float *samples, size_t n) {
    tu_pcm *k = user;
    if (k->n + n > k->cap) {
        size_t cap = (k->n + n) * 2;
        float *x = realloc(k->x, cap * sizeof *x);
        if (!x) fail_msg("tu_pcm_collect: out of memory for %zu samples", cap);
        k->x = x;
        k->cap = cap;
    }
    if (n) memcpy(k->x + k->n, samples, n * sizeof *samples);
    k->n += n;
    k->calls++;
    return k->cancel_after > 0 && k->calls >= k->cancel_after;
}

void tu_pcm_free(tu_pcm *p) {
    free(p->x);
    memset(p, 0, sizeof *p);
}
