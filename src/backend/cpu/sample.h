/* sample.h - drawing codes from logits on the CPU (TEXT.md section 5): the reference draw that
 * the backend's sampling ops implement, also used directly by tests and tools.
 *
 * Every draw is a pure function of (logits, parameters, u) where u comes from the request's
 * counter-based RNG (base/rng.h) at index 16*f + slot. Nothing here keeps state between draws
 * except the caller-owned scratch buffers, so a seed reproduces the same codes whatever the
 * thread count, batch or streaming mode.
 *
 * Rules (TEXT.md 5.1): NaN or +inf fails (DRAMA_ENUMERIC), -inf excludes a candidate; T = 0 is
 * argmax (first maximum in candidate order); otherwise sort by logit descending (ties: candidate
 * order), p = softmax without temperature, top-k and top-p (keep or drop the crossing token)
 * select a prefix of ranks, survivors are re-weighted with softmax(logit / T), and u walks the
 * survivors in sorted order.
 */
#ifndef DRAMA_BACKEND_CPU_SAMPLE_H
#define DRAMA_BACKEND_CPU_SAMPLE_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/error.h"

typedef enum dr_topp_rule {
    DR_TOPP_KEEP_CROSSING = 0, /* shortest prefix whose mass reaches P (semantic draw, redraw) */
    DR_TOPP_DROP_CROSSING = 1  /* longest prefix whose mass does not exceed P, >= 1 (acoustic) */
} dr_topp_rule;

/* One draw's filter. */
typedef struct dr_draw_spec {
    float temperature; /* 0 = argmax */
    float top_p;       /* >= 1 disables */
    int top_k;         /* <= 0 disables */
    dr_topp_rule rule;
} dr_draw_spec;

/* Scratch for draws over at most `cap` candidates; reuse across draws, one per thread. */
typedef struct dr_sample_ws {
    int cap;
    struct dr_sample_item *items; /* sorted candidates */
    double *q;                    /* survivor weights */
} dr_sample_ws;

drama_status dr_sample_ws_init(dr_sample_ws *ws, int cap, drama_error *err);
void dr_sample_ws_free(dr_sample_ws *ws);

/* Draw one candidate index in [0, n) with uniform u in [0, 1). `what` names the draw in errors
 * ("semantic draw of frame 3"). */
drama_status dr_sample(const float *logits, int n, const dr_draw_spec *spec, double u, dr_sample_ws *ws,
                       int *out, const char *what, drama_error *err);

/* The exact distribution dr_sample draws from: probs[i] for every candidate (0 for filtered).
 * For tests and diagnostics. */
drama_status dr_sample_distribution(const float *logits, int n, const dr_draw_spec *spec, dr_sample_ws *ws,
                                    double *probs, drama_error *err);

/* Semantic draw of frame f (TEXT.md 5.2, 5.4). logits: n candidates in candidate order, the
 * end token last (index n-1). window: the semantic codes (candidate indices) of the last frames
 * of the current batch, oldest first, window_len <= p->ras_window entries considered (the most
 * recent ones). The result is a candidate index; n-1 means the end token. */
drama_status dr_sample_semantic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                                const int *window, int window_len, dr_sample_ws *ws, int *out,
                                drama_error *err);

/* Acoustic draw of codebook j (1..9) of frame f over the first n head logits (TEXT.md 5.3). */
drama_status dr_sample_acoustic(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                                int codebook, dr_sample_ws *ws, int *out, drama_error *err);

/* The same two draws reporting a failure as a dr_op_status (DR_FAULT_DRAW) instead of a message:
 * what the backend's sampling ops write (format it with dr_draw_fail). */
void dr_sample_semantic_st(const float *logits, int n, const dr_sampler_params *p, uint64_t frame,
                           const int32_t *window, int window_len, dr_sample_ws *ws, int *out, dr_op_status *st);
void dr_sample_acoustic_st(const float *logits, int n, const dr_sampler_params *p, uint64_t frame, int codebook,
                           dr_sample_ws *ws, int *out, dr_op_status *st);

#endif
