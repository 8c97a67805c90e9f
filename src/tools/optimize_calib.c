/* optimize_calib.c - `drama optimize --prune K --calibration ROWS.json`: count, per MoE layer, how
 * often the router selects each expert on the calibration rows, and keep the K most used experts
 * (ties to the lower id).
 *
 * The backbone has no router hook, so the router input of layer L is recovered exactly: the model
 * is run with layer L's routed and shared expert down projections replaced by zeros, which makes
 * that layer's MoE output exactly 0, so its traced layer output is exactly the residual the router
 * normalises. Layers before L are untouched. The router scores are then computed with the same
 * kernels as the engine (rms norm with the offset-added post-attention weight, then the router
 * matmul) and the top num_experts_per_tok stored experts of each row are counted (the softmax is
 * monotonic, so ranking logits equals ranking probabilities). Cost: one forward pass per layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "io/rows_json.h"
#include "model/state.h"
#include "tools/optimize_internal.h"

/* w with every value replaced by zero: a dense BF16 view of a zero buffer of the same shape. */
static dr_weight zero_weight(const dr_weight *w, const uint8_t *zeros) {
    dr_weight z = *w;
    z.fmt = DR_WF_BF16;
    z.data = zeros;
    z.row_bytes = (size_t)w->cols * 2;
    z.scales = z.biases = NULL;
    z.global_scale = 1.0f;
    return z;
}

/* Count the top-k stored experts of each of n rows of router scores [n][E]. */
static void count_topk(const dr_bb_moe *m, const float *scores, int64_t n, int E, int k, int64_t *counts) {
    for (int64_t i = 0; i < n; i++) {
        const float *s = scores + i * E;
        unsigned char taken[1024] = {0};
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int e = 0; e < E && e < 1024; e++) {
                if (m->slot[e] < 0 || taken[e] || !isfinite(s[e])) continue;
                if (best < 0 || s[e] > s[best]) best = e; /* strict: a tie keeps the lower id */
            }
            if (best < 0) break;
            taken[best] = 1;
            counts[best]++;
        }
    }
}

drama_status opt_keep_from_calibration(const char *rows_path, int k, const dr_config *cfg, dr_backbone *bb,
                                       dr_pool *pool, unsigned char *keep, drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int L = d->n_layers, E = d->E;
    if (k < d->topk || k > E)
        return dr_fail(err, DRAMA_EINVAL, "--prune %d: must be in [num_experts_per_tok %d, num_experts %d]", k, d->topk, E);
    if (E > 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "--prune: %d experts (at most 1024 supported)", E);
    for (int l = 0; l < L; l++)
        if (bb->layers[l].moe.n_kept < k)
            return dr_fail(err, DRAMA_EINVAL, "--prune %d: layer %d stores only %d experts", k, l,
                           bb->layers[l].moe.n_kept);
    int64_t S = cfg->tokens.semantic_start, n_sem = cfg->tokens.semantic_end - S + 1;
    drama_status st = dr_backbone_set_tokens(bb, S, n_sem, cfg->tokens.eos[0], err);
    if (st) return st;
    dr_rows rows = {0};
    if ((st = dr_rows_read(rows_path, dr_backbone_row_width(bb), &rows, err))) return st;
    int64_t n = rows.n_rows, H = d->H;
    if (n == 0) {
        dr_rows_free(&rows);
        return dr_fail(err, DRAMA_EEMPTY, "%s: no rows to calibrate on", rows_path);
    }
    int64_t zmax = H * (d->I > d->Is ? d->I : d->Is);
    int64_t *counts = calloc((size_t)L * E, sizeof(int64_t));
    uint8_t *zeros = dr_calloc((size_t)zmax, 2);
    float *layer_out = dr_alloc((size_t)(L * n * H) * sizeof(float));
    float *xn = dr_alloc((size_t)(n * H) * sizeof(float));
    float *scores = dr_alloc((size_t)(n * E) * sizeof(float));
    dr_bb_layer *layers = malloc((size_t)L * sizeof(dr_bb_layer));
    dr_bb_expert *experts = malloc((size_t)E * sizeof(dr_bb_expert));
    dr_bb_state *state = NULL;
    if (!counts || !zeros || !layer_out || !xn || !scores || !layers || !experts) {
        st = dr_fail(err, DRAMA_ENOMEM, "--prune: out of memory for %lld calibration rows", (long long)n);
        goto done;
    }
    memcpy(layers, bb->layers, (size_t)L * sizeof(dr_bb_layer));
    dr_backbone probe = *bb;
    probe.layers = layers;
    if ((st = dr_bb_state_create(&probe, n, &state, err))) goto done;
    for (int l = 0; l < L; l++) {
        const dr_bb_moe *m = &bb->layers[l].moe;
        dr_bb_moe *pm = &layers[l].moe;
        for (int s = 0; s < m->n_kept; s++) {
            experts[s] = m->experts[s];
            experts[s].down = zero_weight(&m->experts[s].down, zeros);
        }
        pm->experts = experts;
        pm->sh_down = zero_weight(&m->sh_down, zeros);
        dr_bb_state_reset(state);
        dr_bb_trace tr = {NULL, layer_out, NULL};
        st = dr_backbone_forward(&probe, state, rows.data, n, NULL, NULL, &tr, pool, err);
        layers[l] = bb->layers[l];
        if (st) {
            dr_error_prefix(err, "--calibration %s (layer %d)", rows_path, l);
            goto done;
        }
        const float *h = layer_out + (int64_t)l * n * H;
        for (int64_t i = 0; i < n; i++) dr_op_rms_norm(h + i * H, bb->layers[l].post_norm, d->eps, H, xn + i * H);
        dr_cpu_matmul(&m->router, xn, n, scores, pool);
        count_topk(m, scores, n, E, d->topk, counts + (int64_t)l * E);
    }
    /* per layer: the k stored experts with the most selections, ties to the lower id */
    for (int l = 0; l < L; l++) {
        const dr_bb_moe *m = &bb->layers[l].moe;
        unsigned char *row = keep + (size_t)l * E;
        memset(row, 0, (size_t)E);
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (m->slot[e] >= 0 && !row[e] && (best < 0 || counts[(int64_t)l * E + e] > counts[(int64_t)l * E + best]))
                    best = e;
            row[best] = 1;
        }
    }
done:
    dr_bb_state_free(state);
    free(counts);
    dr_free(zeros);
    dr_free(layer_out);
    dr_free(xn);
    dr_free(scores);
    free(layers);
    free(experts);
    dr_rows_free(&rows);
    return st;
}
