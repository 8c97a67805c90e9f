/* sampler.c - TEXT.md section 5: filters, temperature, the draw, the redraw, guidance. */
#include "gen/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "base/rng.h"

typedef struct dr_sample_item {
    float logit;
    int index;
} dr_sample_item;

void dr_sampler_params_default(dr_sampler_params *p) {
    p->temperature = 1.0f;
    p->top_p = 0.9f;
    p->semantic_top_k = 0;
    p->acoustic_top_k = 30;
    p->ras_window = 10;
    p->ras_temperature = 1.0f;
    p->ras_top_p = 0.9f;
    p->cfg_gamma = 0.0f;
    p->seed = 0;
    p->frame_cap = 750;
}

/* lo_open / hi_open: whether the bound itself is excluded. */
static drama_status check_range(const char *name, double v, double lo, int lo_open, double hi, int hi_open,
                                drama_error *err) {
    int ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (ok) return DRAMA_OK;
    return dr_fail(err, DRAMA_EINVAL, "%s: must be finite and in %c%g, %g%c, got %g", name, lo_open ? '(' : '[',
                   lo, hi, hi_open ? ')' : ']', v);
}

drama_status dr_sampler_params_validate(const dr_sampler_params *p, drama_error *err) {
    drama_status st;
    if ((st = check_range("temperature", p->temperature, 0, 0, 2, 0, err))) return st;
    if ((st = check_range("top_p", p->top_p, 0, 1, 1, 0, err))) return st;
    if ((st = check_range("semantic_top_k", p->semantic_top_k, 0, 0, 4097, 0, err))) return st;
    if ((st = check_range("acoustic_top_k", p->acoustic_top_k, 0, 0, 1024, 0, err))) return st;
    if ((st = check_range("ras_window", p->ras_window, 0, 0, 64, 0, err))) return st;
    if ((st = check_range("ras_temperature", p->ras_temperature, 0, 1, 2, 0, err))) return st;
    if ((st = check_range("ras_top_p", p->ras_top_p, 0, 1, 1, 0, err))) return st;
    if ((st = check_range("cfg_gamma", p->cfg_gamma, 0, 0, 5, 0, err))) return st;
    if (p->frame_cap < 1) return dr_fail(err, DRAMA_EINVAL, "frame_cap: must be at least 1, got %d", p->frame_cap);
    return DRAMA_OK;
}

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

/* Checks the logits and collects the candidates that are not excluded. Returns their count. */
static drama_status collect(const float *logits, int n, dr_sample_ws *ws, int *n_valid, const char *what,
                            drama_error *err) {
    if (n < 1 || n > ws->cap)
        return dr_fail(err, DRAMA_EINTERNAL, "%s: %d candidates for a scratch of %d", what, n, ws->cap);
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l) || (isinf(l) && l > 0))
            return dr_fail(err, DRAMA_ENUMERIC, "%s: logit of candidate %d is %s", what, i, isnan(l) ? "NaN" : "+inf");
        if (isinf(l)) continue;
        ws->items[m].logit = l;
        ws->items[m].index = i;
        m++;
    }
    if (m == 0) return dr_fail(err, DRAMA_ENUMERIC, "%s: every candidate is excluded (-inf)", what);
    *n_valid = m;
    return DRAMA_OK;
}

/* Sorts, filters and weights: on return ws->items[0..*kept) are the survivors in rank order and
 * ws->q their tempered weights (not normalised). */
static int filter(int m, const dr_draw_spec *spec, dr_sample_ws *ws) {
    dr_sample_item *it = ws->items;
    float *x = (float *)(ws->items + ws->cap);
    qsort(it, (size_t)m, sizeof *it, item_cmp);
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

drama_status dr_sample(const float *logits, int n, const dr_draw_spec *spec, double u, dr_sample_ws *ws,
                       int *out, const char *what, drama_error *err) {
    int m;
    drama_status st = collect(logits, n, ws, &m, what, err);
    if (st) return st;
    if (spec->temperature <= 0.0f) {
        *out = argmax_first(logits, n);
        return DRAMA_OK;
    }
    int kept = filter(m, spec, ws);
    double total = 0;
    for (int r = 0; r < kept; r++) total += ws->q[r];
    double target = u * total, acc = 0;
    for (int r = 0; r < kept; r++) {
        acc += ws->q[r];
        if (target < acc) {
            *out = ws->items[r].index;
            return DRAMA_OK;
        }
    }
    *out = ws->items[kept - 1].index; /* rounding left none: the last survivor */
    return DRAMA_OK;
}

drama_status dr_sample_distribution(const float *logits, int n, const dr_draw_spec *spec, dr_sample_ws *ws,
                                    double *probs, drama_error *err) {
    int m;
    drama_status st = collect(logits, n, ws, &m, "distribution", err);
    if (st) return st;
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

drama_status dr_sample_semantic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                                const int *window, int window_len, dr_sample_ws *ws, int *out,
                                drama_error *err) {
    char what[64];
    snprintf(what, sizeof what, "semantic draw of frame %llu", (unsigned long long)frame);
    dr_draw_spec spec = {p->temperature, p->top_p, p->semantic_top_k, DR_TOPP_KEEP_CROSSING};
    double u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_SEMANTIC));
    drama_status st = dr_sample(logits, n, &spec, u, ws, out, what, err);
    if (st || p->temperature <= 0.0f || p->ras_window <= 0 || *out == n - 1) return st;
    int first = window_len > p->ras_window ? window_len - p->ras_window : 0;
    int repeated = 0;
    for (int i = first; i < window_len; i++)
        if (window[i] == *out) repeated = 1;
    if (!repeated) return DRAMA_OK;
    /* repetition-aware redraw: same logits, its own temperature and nucleus, no top-k, slot 1 */
    dr_draw_spec ras = {p->ras_temperature, p->ras_top_p, 0, DR_TOPP_KEEP_CROSSING};
    snprintf(what, sizeof what, "semantic redraw of frame %llu", (unsigned long long)frame);
    u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_REDRAW));
    return dr_sample(logits, n, &ras, u, ws, out, what, err);
}

drama_status dr_sample_acoustic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                                int codebook, dr_sample_ws *ws, int *out, drama_error *err) {
    char what[64];
    snprintf(what, sizeof what, "codebook %d draw of frame %llu", codebook, (unsigned long long)frame);
    if (codebook < 1 || codebook > DR_RNG_SLOTS_PER_FRAME - DR_RNG_SLOT_CODEBOOK1)
        return dr_fail(err, DRAMA_EINTERNAL, "%s: codebook out of the slot range", what);
    dr_draw_spec spec = {p->temperature, p->top_p, p->acoustic_top_k, DR_TOPP_DROP_CROSSING};
    double u = dr_rng_uniform(p->seed, dr_rng_index(frame, DR_RNG_SLOT_CODEBOOK1 + codebook - 1));
    return dr_sample(logits, n, &spec, u, ws, out, what, err);
}

void dr_guidance_combine(const float *cond, const float *uncond, int n, float gamma, float *out) {
    dr_op_guidance(cond, uncond, n, gamma, out);
}
