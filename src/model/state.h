/* state.h - per-request backbone state (MODEL.md 9): attention K/V per full-attention layer
 * (grows with positions), DeltaNet conv window and recurrent matrix per linear layer (fixed
 * size), and the position counter. Snapshot = dr_bb_state_clone, restore = dr_bb_state_copy
 * into an existing state: the voice cache and guidance use them. All fp32. */
#ifndef DRAMA_MODEL_STATE_H
#define DRAMA_MODEL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/backbone.h"

struct dr_bb_state {
    int n_attn, n_gdn;
    int64_t pos;               /* rows consumed so far = next position */
    int64_t cap;               /* K/V capacity in positions */
    int64_t kv_dim;            /* nkv * hd */
    float **k, **v;            /* [n_attn][cap * kv_dim] */
    int64_t conv_len;          /* (K-1) * C */
    int64_t rec_len;           /* nv * dk * dv */
    float **conv;              /* [n_gdn][conv_len], oldest input first */
    float **rec;               /* [n_gdn][rec_len], value head h at h * dk * dv, [dk][dv] */
};

/* A zeroed state (position 0) with room for `reserve` positions (grows on demand). */
drama_status dr_bb_state_create(const dr_backbone *bb, int64_t reserve, dr_bb_state **out, drama_error *err);
void dr_bb_state_free(dr_bb_state *s);
void dr_bb_state_reset(dr_bb_state *s);                 /* back to position 0, zero state */
/* Make room for `positions` positions in total. */
drama_status dr_bb_state_reserve(dr_bb_state *s, int64_t positions, drama_error *err);
/* dst := src (restore). Both must come from the same backbone. */
drama_status dr_bb_state_copy(dr_bb_state *dst, const dr_bb_state *src, drama_error *err);
/* A new state equal to src (snapshot). */
drama_status dr_bb_state_clone(const dr_bb_state *src, dr_bb_state **out, drama_error *err);
/* Bytes held (for the voice cache's budget). */
size_t dr_bb_state_bytes(const dr_bb_state *s);

#endif
