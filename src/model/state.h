/* state.h - per-request backbone state (MODEL.md 9) in backend memory: attention K/V per
 * full-attention layer (capacity grows between calls, never inside one), DeltaNet conv window
 * and recurrent matrix per linear layer (fixed size), and the position counter. Snapshot =
 * dr_bb_state_clone, restore = dr_bb_state_copy into an existing state: the voice cache and
 * guidance use them. All fp32.
 *
 * The ops read and advance the state through `seq` (a dr_seq in backend memory, backend.h); `pos`
 * and `cap` here are the host's copies, kept equal to seq->pos and seq->cap by whoever issues the
 * ops (model/backbone.c for host calls, gen/frameloop.c after each frame step). */
#ifndef DRAMA_MODEL_STATE_H
#define DRAMA_MODEL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/error.h"
#include "model/backbone.h"

struct dr_bb_state {
    dr_backend *be;            /* where the state lives; NULL: host memory of the CPU backend, run
                                  with the pool each host call passes (dr_bb_state_create) */
    int n_attn, n_gdn;
    int64_t pos;               /* rows consumed so far = next position (host copy of seq->pos) */
    int64_t cap;               /* K/V capacity in positions (host copy of seq->cap) */
    int64_t kv_dim;            /* nkv * hd */
    int64_t conv_len;          /* (K-1) * C */
    int64_t rec_len;           /* nv * dk * dv */
    float *kv;                 /* [n_attn][2][cap][kv_dim] (backend memory) */
    float *conv;               /* [n_gdn][conv_len], oldest input first */
    float *rec;                /* [n_gdn][rec_len], value head h at h * dk * dv, [dk][dv] */
    dr_seq *seq;               /* the ops' view (backend memory) */
};

/* A zeroed state (position 0) with room for `reserve` positions (grows on demand), on be. */
drama_status dr_bb_state_create_on(dr_backend *be, const dr_backbone *bb, int64_t reserve, dr_bb_state **out,
                                   drama_error *err);
/* The same in CPU memory (be NULL: host calls pass their pool). */
drama_status dr_bb_state_create(const dr_backbone *bb, int64_t reserve, dr_bb_state **out, drama_error *err);
void dr_bb_state_free(dr_bb_state *s);
void dr_bb_state_reset(dr_bb_state *s); /* back to position 0, zero state (queued) */
/* Make room for `positions` positions in total (between calls: the seq pointers change). */
drama_status dr_bb_state_reserve(dr_bb_state *s, int64_t positions, drama_error *err);
/* dst := src (restore). Both must come from the same backbone and backend. */
drama_status dr_bb_state_copy(dr_bb_state *dst, const dr_bb_state *src, drama_error *err);
/* A new state equal to src (snapshot), on src's backend. */
drama_status dr_bb_state_clone(const dr_bb_state *src, dr_bb_state **out, drama_error *err);
/* Bytes held (for the voice cache's budget). */
size_t dr_bb_state_bytes(const dr_bb_state *s);
/* The backend a state's memory belongs to (the shared CPU one for be NULL). */
dr_backend *dr_bb_state_backend(const dr_bb_state *s);
/* Host copy of pos advanced by n after the ops advanced seq->pos (callers of the ops only). */
static inline void dr_bb_state_advanced(dr_bb_state *s, int64_t n) { s->pos += n; }

#endif
