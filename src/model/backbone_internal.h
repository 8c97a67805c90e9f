/* backbone_internal.h - shared by the backbone_*.c files only: one call's batch of rows. */
#ifndef DRAMA_MODEL_BACKBONE_INTERNAL_H
#define DRAMA_MODEL_BACKBONE_INTERNAL_H

#include "model/backbone.h"
#include "model/state.h"

/* Rows of one call. Row i belongs to state st[i] at position pos[i]; rows of the same state
 * appear in position order (a prefill), or every row has its own state (a batched step). */
typedef struct bb_batch {
    const dr_backbone *bb;
    int64_t n;
    dr_bb_state *const *st;   /* [n] */
    const int64_t *pos;       /* [n] */
    dr_pool *pool;
    int n_workers;
} bb_batch;

/* Mixers and MoE: x [n][H] normalised input, out [n][H]. */
drama_status dr_bb_attention_run(const bb_batch *b, const dr_bb_layer *ly, const float *x, float *out, drama_error *err);
drama_status dr_bb_deltanet_run(const bb_batch *b, const dr_bb_layer *ly, const float *x, float *out, drama_error *err);
drama_status dr_bb_moe_run(const bb_batch *b, const dr_bb_layer *ly, int layer, const float *x, float *out,
                       drama_error *err);

#endif
