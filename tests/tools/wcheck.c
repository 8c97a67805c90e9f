/* wcheck.c - drama_test_wcheck SRC DST BITS: every MLX affine weight of checkpoint DST (U32 words
 * with .scales/.biases), dequantised by the library, against the same tensor of checkpoint SRC
 * (exact fp32 of its stored values), within tu_affine_bound of each group of source values; BITS
 * is the width DST must carry. One report line (tests/common/testutil); exit 0 when at least one
 * weight was checked and all are within the bound, 1 otherwise (tests/e2e/optimize.sh, q8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "num/weight.h"
#include "testutil.h"

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

/* Appends one dequantised weight and its source, with the bound of each value's group. */
typedef struct acc {
    float *deq, *src;
    double *tol;
    int64_t n, cap;
} acc;

static int grow(acc *a, int64_t m) {
    if (a->n + m <= a->cap) return 0;
    a->cap = 2 * (a->n + m);
    float *d = realloc(a->deq, (size_t)a->cap * sizeof *d);
    if (d) a->deq = d;
    float *s = realloc(a->src, (size_t)a->cap * sizeof *s);
    if (s) a->src = s;
    double *t = realloc(a->tol, (size_t)a->cap * sizeof *t);
    if (t) a->tol = t;
    return !d || !s || !t;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: drama_test_wcheck SRC DST BITS\n");
        return 2;
    }
    int bits = atoi(argv[3]);
    drama_error e = {0};
    dr_ckpt *src = NULL, *dst = NULL;
    if (dr_ckpt_open(argv[1], &src, &e) || dr_ckpt_open(argv[2], &dst, &e)) {
        fprintf(stderr, "wcheck: %s\n", e.message);
        return 1;
    }
    acc a = {0};
    int checked = 0, bad = 0;
    for (int64_t i = 0; i < dr_ckpt_count(dst) && !bad; i++) {
        const dr_tensor *w = dr_ckpt_at(dst, i);
        if (w->dtype != DR_DT_U32 || w->ndim != 2 || !ends_with(w->name, ".weight")) continue;
        char sn[600], bn[600];
        int base = (int)strlen(w->name) - 7; /* drop ".weight" */
        snprintf(sn, sizeof sn, "%.*s.scales", base, w->name);
        snprintf(bn, sizeof bn, "%.*s.biases", base, w->name);
        const dr_tensor *sc = dr_ckpt_find(dst, sn), *bi = dr_ckpt_find(dst, bn), *s = dr_ckpt_find(src, w->name);
        if (!sc || !bi) continue;
        if (!s || s->ndim != 2) {
            fprintf(stderr, "wcheck: %s: no 2-D source tensor of that name in %s\n", w->name, argv[1]);
            bad = 1;
            break;
        }
        int64_t rows = s->shape[0], cols = s->shape[1];
        dr_weight q;
        if (dr_weight_bind_ex(w, sc, NULL, bi, -1, 0, 0, cols, &q, &e)) {
            fprintf(stderr, "wcheck: %s\n", e.message);
            bad = 1;
            break;
        }
        if (q.bits != bits || q.rows != rows || q.cols != cols) {
            fprintf(stderr, "wcheck: %s: %d bits [%lld, %lld], expected %d bits [%lld, %lld]\n", w->name, q.bits,
                    (long long)q.rows, (long long)q.cols, bits, (long long)rows, (long long)cols);
            bad = 1;
            break;
        }
        if (grow(&a, rows * cols)) {
            fprintf(stderr, "wcheck: out of memory\n");
            bad = 1;
            break;
        }
        float *d = a.deq + a.n, *x = a.src + a.n;
        if (dr_st_to_f32(s, x, &e)) {
            fprintf(stderr, "wcheck: %s\n", e.message);
            bad = 1;
            break;
        }
        for (int64_t r = 0; r < rows; r++) dr_weight_dequant_row(&q, r, d + r * cols);
        double eps = sc->dtype == DR_DT_BF16 ? 0x1p-8 : sc->dtype == DR_DT_F16 ? 0x1p-11 : 0x1p-24;
        tu_affine_tol(x, rows * cols, q.group, bits, eps, a.tol + a.n); /* groups along rows */
        a.n += rows * cols;
        checked++;
    }
    int ok = !bad && checked > 0;
    if (!bad) {
        char label[96];
        snprintf(label, sizeof label, "%d affine %d-bit weights vs source", checked, bits);
        tu_cmp_opts o = {.tol = a.tol};
        ok &= tu_report_tol(label, tu_compare_f32_opts(a.deq, a.src, a.n, &o));
        if (!checked) fprintf(stderr, "wcheck: no affine weight in %s\n", argv[2]);
    }
    free(a.deq), free(a.src), free(a.tol);
    dr_ckpt_close(src);
    dr_ckpt_close(dst);
    return ok ? 0 : 1;
}
