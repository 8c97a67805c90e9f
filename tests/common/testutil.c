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
