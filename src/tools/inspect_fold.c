/* inspect_fold.c - tensor inventories folded the way golden/INVENTORY.md writes them: every run
 * of digits in a name becomes a set of numbers ("layers.{0..2,4..6}.linear_attn.A_log"), and
 * names are grouped by (pattern, dtype, shape, group) where group is the shard. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/inspect.h"

#define MAX_SLOTS 8

typedef struct fold_row {
    char *pattern;          /* name with each digit run replaced by '\x01' */
    const dr_fold_item *first;
    int n_slots;
    int64_t *vals[MAX_SLOTS];
    int nv[MAX_SLOTS], cap[MAX_SLOTS];
    int64_t count;
    uint64_t bytes;
} fold_row;

/* Pattern of a name and the numbers of its digit runs (at most MAX_SLOTS; later runs stay text). */
static int split_name(const char *name, char *pat, size_t cap, int64_t *nums) {
    size_t o = 0;
    int n = 0;
    for (const char *p = name; *p && o + 2 < cap;) {
        if (*p >= '0' && *p <= '9' && n < MAX_SLOTS) {
            int64_t v = 0;
            int digits = 0;
            while (*p >= '0' && *p <= '9') {
                if (digits < 18) v = v * 10 + (*p - '0');
                digits++;
                p++;
            }
            nums[n++] = v;
            pat[o++] = '\x01';
        } else {
            pat[o++] = *p++;
        }
    }
    pat[o] = 0;
    return n;
}

static void add_val(fold_row *r, int s, int64_t v) {
    for (int i = 0; i < r->nv[s]; i++)
        if (r->vals[s][i] == v) return;
    if (r->nv[s] == r->cap[s]) {
        int cap = r->cap[s] ? 2 * r->cap[s] : 8;
        int64_t *nv = realloc(r->vals[s], (size_t)cap * sizeof *nv);
        if (!nv) return;
        r->vals[s] = nv;
        r->cap[s] = cap;
    }
    r->vals[s][r->nv[s]++] = v;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* "{0..2,4..6}", "{3,7}" or "5" (runs of three or more become a..b). */
static void format_set(int64_t *v, int n, char *out, size_t cap) {
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    if (n == 1) {
        snprintf(out, cap, "%lld", (long long)v[0]);
        return;
    }
    size_t o = 0;
    o += (size_t)snprintf(out + o, cap - o, "{");
    for (int i = 0; i < n && o < cap;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        const char *sep = i ? "," : "";
        if (j - i >= 2) o += (size_t)snprintf(out + o, cap - o, "%s%lld..%lld", sep, (long long)v[i], (long long)v[j]);
        else if (j == i) o += (size_t)snprintf(out + o, cap - o, "%s%lld", sep, (long long)v[i]);
        else o += (size_t)snprintf(out + o, cap - o, "%s%lld,%lld", sep, (long long)v[i], (long long)v[j]);
        i = j + 1;
    }
    if (o < cap) snprintf(out + o, cap - o, "}");
}

static int same_key(const fold_row *r, const char *pat, const dr_fold_item *it) {
    const dr_fold_item *f = r->first;
    if (strcmp(r->pattern, pat) || strcmp(f->dtype, it->dtype) || f->ndim != it->ndim) return 0;
    if (strcmp(f->group ? f->group : "", it->group ? it->group : "")) return 0;
    for (int i = 0; i < it->ndim; i++)
        if (f->shape[i] != it->shape[i]) return 0;
    return 1;
}

void dr_shape_text(int ndim, const int64_t *shape, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, "]");
}

static int cmp_rows(const void *a, const void *b) {
    const fold_row *x = a, *y = b;
    return strcmp(x->first->name, y->first->name);
}

int dr_fold_print(FILE *out, const dr_fold_item *items, int64_t n) {
    fold_row *rows = NULL;
    int n_rows = 0, cap_rows = 0;
    char pat[512];
    int64_t nums[MAX_SLOTS];
    /* Rows keyed by pattern; linear search over rows with an index from the last hit is fast
     * enough: consecutive names usually fall in the same row. */
    int last = -1;
    for (int64_t i = 0; i < n; i++) {
        int ns = split_name(items[i].name, pat, sizeof pat, nums);
        int hit = -1;
        if (last >= 0 && same_key(&rows[last], pat, &items[i])) hit = last;
        for (int r = 0; hit < 0 && r < n_rows; r++)
            if (same_key(&rows[r], pat, &items[i])) hit = r;
        if (hit < 0) {
            if (n_rows == cap_rows) {
                int cap = cap_rows ? 2 * cap_rows : 64;
                fold_row *nr = realloc(rows, (size_t)cap * sizeof *nr);
                if (!nr) break;
                rows = nr;
                cap_rows = cap;
            }
            hit = n_rows++;
            memset(&rows[hit], 0, sizeof rows[hit]);
            rows[hit].pattern = strdup(pat);
            rows[hit].first = &items[i];
            rows[hit].n_slots = ns;
        }
        last = hit;
        fold_row *r = &rows[hit];
        for (int s = 0; s < ns; s++) add_val(r, s, nums[s]);
        r->count++;
        r->bytes += items[i].bytes;
    }
    qsort(rows, (size_t)n_rows, sizeof *rows, cmp_rows);
    fprintf(out, "| tensor | dtype shape shard | count | bytes |\n|---|---|---|---|\n");
    char name[1024], set[512], shape[256];
    for (int r = 0; r < n_rows; r++) {
        fold_row *row = &rows[r];
        size_t o = 0;
        int s = 0;
        for (const char *p = row->pattern ? row->pattern : ""; *p && o + 1 < sizeof name; p++) {
            if (*p == '\x01' && s < row->n_slots) {
                format_set(row->vals[s], row->nv[s], set, sizeof set);
                o += (size_t)snprintf(name + o, sizeof name - o, "%s", set);
                s++;
            } else {
                name[o++] = *p;
            }
        }
        name[o < sizeof name ? o : sizeof name - 1] = 0;
        dr_shape_text(row->first->ndim, row->first->shape, shape, sizeof shape);
        fprintf(out, "| `%s` | %s %s%s%s | %lld | %llu |\n", name, row->first->dtype, shape,
                row->first->group ? " " : "", row->first->group ? row->first->group : "", (long long)row->count,
                (unsigned long long)row->bytes);
        free(row->pattern);
        for (int k = 0; k < MAX_SLOTS; k++) free(row->vals[k]);
    }
    free(rows);
    return n_rows;
}
