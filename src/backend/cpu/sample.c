/* sample.c - TEXT.md section 5 on the CPU: filters, temperature, the draw, the redraw. */
#include "backend/cpu/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "base/rng.h"
#include "num/formats.h"

_Static_assert(sizeof(int) == sizeof(int32_t), "windows are int32_t in backend memory and int in the API");

typedef struct dr_sample_item {
    float logit;
    int index;
} dr_sample_item;

drama_status dr_sample_ws_init(dr_sample_ws *ws, int cap, drama_error *err) {
    ws->cap = cap;
    /* cap items, then cap floats: the sorted logits as one array for the ops */
    ws->items = dr_calloc(cap > 0 ? (size_t)cap : 1, sizeof *ws->items + sizeof(float));
    ws->q = dr_calloc(cap > 0 ? (size_t)cap : 1, sizeof *ws->q);
    if (!ws->items || !ws->q) {
        dr_sample_ws_free(ws);
        return dr_fail(err, DRAMA_ENOMEM, "sampler: cannot allocate scratch for %d candidates", cap);
    }
    return DRAMA_OK;
}

void dr_sample_ws_free(dr_sample_ws *ws) {
    if (!ws) return;
    dr_free(ws->items);
    dr_free(ws->q);
    ws->items = NULL;
    ws->q = NULL;
    ws->cap = 0;
}

/* Descending logit; ties by candidate order so the result never depends on qsort's order. */
static int item_cmp(const void *a, const void *b) {
    const dr_sample_item *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* item_cmp's order as an unsigned key, ascending: finite logits only (collect() excludes NaN and
 * +-inf); -0 is keyed as +0 because item_cmp ties them */
static inline uint32_t desc_key(float logit) {
    uint32_t u = dr_f32_bits(logit == 0.0f ? 0.0f : logit);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with the float */
    return ~u;
}

/* The candidates in item_cmp's order: an LSD radix sort on desc_key (4 passes of 8 bits) into tmp
 * and back. It is stable and collect() gives the items in ascending index order, so equal logits
 * keep that order: the same permutation qsort with item_cmp gives, at O(m) instead of a
 * comparator call per m log m (the sort was the sampler's largest cost on the tiny model). */
static void sort_items(dr_sample_item *it, dr_sample_item *tmp, int m) {
    if (m < 64) {
        qsort(it, (size_t)m, sizeof *it, item_cmp);
        return;
    }
    uint32_t cnt[4][256];
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < m; i++) {
        uint32_t k = desc_key(it[i].logit);
        for (int d = 0; d < 4; d++) cnt[d][(k >> (8 * d)) & 255]++;
    }
    dr_sample_item *src = it, *dst = tmp;
    for (int d = 0; d < 4; d++) {
        if (cnt[d][(desc_key(it[0].logit) >> (8 * d)) & 255] == (uint32_t)m) continue; /* one digit: identity */
        uint32_t off[256], sum = 0;
        for (int b = 0; b < 256; b++) off[b] = sum, sum += cnt[d][b];
        for (int i = 0; i < m; i++) dst[off[(desc_key(src[i].logit) >> (8 * d)) & 255]++] = src[i];
        dr_sample_item *t = src;
        src = dst, dst = t;
    }
    if (src != it) memcpy(it, src, (size_t)m * sizeof *it);
}

static void draw_fault(dr_op_status *st, int reason, int64_t candidate) {
    st->code = reason == DR_DRAW_SCRATCH || reason == DR_DRAW_SLOT ? DRAMA_EINTERNAL : DRAMA_ENUMERIC;
    st->fault = DR_FAULT_DRAW;
    st->b = reason;
    st->d = candidate;
}

/* Checks the logits and collects the candidates that are not excluded; 0 on a fault. */
static int collect(const float *logits, int n, dr_sample_ws *ws, int *n_valid, dr_op_status *st) {
    if (n < 1 || n > ws->cap) {
        draw_fault(st, DR_DRAW_SCRATCH, n);
        return 0;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l) || (isinf(l) && l > 0)) {
            draw_fault(st, isnan(l) ? DR_DRAW_NAN : DR_DRAW_POSINF, i);
            return 0;
        }
        if (isinf(l)) continue;
        ws->items[m].logit = l;
        ws->items[m].index = i;
        m++;
    }
    if (m == 0) {
        draw_fault(st, DR_DRAW_ALL_EXCLUDED, 0);
        return 0;
    }
    *n_valid = m;
    return 1;
}

/* Sorts, filters and weights: on return ws->items[0..*kept) are the survivors in rank order and
 * ws->q their tempered weights (not normalised). */
static int filter(int m, const dr_draw_spec *spec, dr_sample_ws *ws) {
    dr_sample_item *it = ws->items;
    float *x = (float *)(ws->items + ws->cap);
    sort_items(it, (dr_sample_item *)(void *)ws->q, m); /* q (cap doubles) is free until the weights */
    for (int r = 0; r < m; r++) x[r] = it[r].logit;
    int kept = m;
    if (spec->top_k > 0 && spec->top_k < kept) kept = spec->top_k;
    if (spec->top_p < 1.0f) {
        /* p = softmax of the untempered logits over all candidates (fp32 terms, max subtracted). */
        dr_op_exp_weights(x, m, x[0], 1.0f, ws->q);
        int by_p = dr_op_top_p_count(ws->q, m, spec->top_p, spec->rule == DR_TOPP_KEEP_CROSSING);
        if (by_p < kept) kept = by_p;
    }
    /* temperature after filtering (S2-Pro order); the survivors' maximum is rank 0 */
    dr_op_exp_weights(x, kept, x[0], spec->temperature, ws->q);
    return kept;
}

static int argmax_first(const float *logits, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isinf(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best;
}

/* The draw; 0 with st filled on a fault (st->a and st->c are the caller's). */
static int sample_st(const float *logits, int n, const dr_draw_spec *spec, double u, dr_sample_ws *ws, int *out,
                     dr_op_status *st) {
    int m;
    if (!collect(logits, n, ws, &m, st)) return 0;
    if (spec->temperature <= 0.0f) {
        *out = argmax_first(logits, n);
        return 1;
    }
    int kept = filter(m, spec, ws);
    double total = 0;
    for (int r = 0; r < kept; r++) total += ws->q[r];
    double target = u * total, acc = 0;
    for (int r = 0; r < kept; r++) {
        acc += ws->q[r];
        if (target < acc) {
            *out = ws->items[r].index;
            return 1;
        }
    }
    *out = ws->items[kept - 1].index; /* rounding left none: the last survivor */
    return 1;
}

drama_status dr_sample(const float *logits, int n, const dr_draw_spec *spec, double u, dr_sample_ws *ws, int *out,
                       const char *what, drama_error *err) {
    dr_op_status st = {0};
    if (sample_st(logits, n, spec, u, ws, out, &st)) return DRAMA_OK;
    return dr_draw_fail(&st, what, err);
}

drama_status dr_sample_distribution(const float *logits, int n, const dr_draw_spec *spec, dr_sample_ws *ws,
                                    double *probs, drama_error *err) {
    int m;
    dr_op_status st = {0};
    if (!collect(logits, n, ws, &m, &st)) return dr_draw_fail(&st, "distribution", err);
    for (int i = 0; i < n; i++) probs[i] = 0;
    if (spec->temperature <= 0.0f) {
        probs[argmax_first(logits, n)] = 1.0;
        return DRAMA_OK;
    }
    int kept = filter(m, spec, ws);
    double total = 0;
    for (int r = 0; r < kept; r++) total += ws->q[r];
    for (int r = 0; r < kept; r++) probs[ws->items[r].index] = ws->q[r] / total;
    return DRAMA_OK;
}

void dr_sample_semantic_st(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                           const int32_t *window, int window_len, dr_sample_ws *ws, int *out, dr_op_status *st) {
    dr_draw_spec spec = {p->temperature, p->top_p, p->semantic_top_k, DR_TOPP_KEEP_CROSSING};
    st->a = DR_DRAW_SEMANTIC;
    st->c = (int64_t)frame;
    double u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_SEMANTIC));
    if (!sample_st(logits, n, &spec, u, ws, out, st)) return;
    st->a = 0;
    st->c = 0;
    if (p->temperature <= 0.0f || p->ras_window <= 0 || *out == n - 1) return;
    int first = window_len > p->ras_window ? window_len - p->ras_window : 0;
    int repeated = 0;
    for (int i = first; i < window_len; i++)
        if (window[i] == *out) repeated = 1;
    if (!repeated) return;
    /* repetition-aware redraw: same logits, its own temperature and nucleus, no top-k, slot 1 */
    dr_draw_spec ras = {p->ras_temperature, p->ras_top_p, 0, DR_TOPP_KEEP_CROSSING};
    st->a = DR_DRAW_REDRAW;
    st->c = (int64_t)frame;
    u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_REDRAW));
    if (sample_st(logits, n, &ras, u, ws, out, st)) st->a = 0, st->c = 0;
}

void dr_sample_acoustic_st(const float *logits, int n, const dr_sampler_params *p, uint64_t frame, int codebook,
                           dr_sample_ws *ws, int *out, dr_op_status *st) {
    st->a = codebook;
    st->c = (int64_t)frame;
    if (codebook < 1 || codebook > DR_RNG_SLOTS_PER_FRAME - DR_RNG_SLOT_CODEBOOK1) {
        draw_fault(st, DR_DRAW_SLOT, 0);
        return;
    }
    dr_draw_spec spec = {p->temperature, p->top_p, p->acoustic_top_k, DR_TOPP_DROP_CROSSING};
    double u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_CODEBOOK1 + codebook - 1));
    if (sample_st(logits, n, &spec, u, ws, out, st)) st->a = 0, st->c = 0;
}

drama_status dr_sample_semantic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                                const int *window, int window_len, dr_sample_ws *ws, int *out, drama_error *err) {
    dr_op_status st = {0};
    dr_sample_semantic_st(logits, n, p, frame, window, window_len, ws, out, &st);
    return st.code ? dr_draw_fail(&st, NULL, err) : DRAMA_OK;
}

drama_status dr_sample_acoustic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame, int codebook,
                                dr_sample_ws *ws, int *out, drama_error *err) {
    dr_op_status st = {0};
    dr_sample_acoustic_st(logits, n, p, frame, codebook, ws, out, &st);
    return st.code ? dr_draw_fail(&st, NULL, err) : DRAMA_OK;
}
