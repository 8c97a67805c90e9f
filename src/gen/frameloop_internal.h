/* frameloop_internal.h - the session and the model's workspaces, shared by frameloop.c and
 * framestep.c only. */
#ifndef DRAMA_GEN_FRAMELOOP_INTERNAL_H
#define DRAMA_GEN_FRAMELOOP_INTERNAL_H

#include <stdatomic.h>

#include "gen/frameloop.h"
#include "gen/framestep.h"
#include "model/state.h"

struct dr_gen_session {
    const dr_gen_model *m;
    dr_gen_options o;
    int nc, ncand, hv;
    int64_t H;
    int guided;
    int has_ref;           /* the first prefill had a reference voice */
    int prefilled;
    int invalid;           /* cancelled or failed: reset before reuse */
    atomic_int cancel;
    dr_bb_state *cond, *uncond; /* backbone states */
    dr_tower_cache *tc;
    int64_t bb_len;        /* rows in the conditional state */
    uint64_t draws;        /* semantic draws of this session (host copy of lane->draw - draw_base) */
    int64_t frames;        /* frames of this session, all batches */
    int64_t batch_frames;  /* frames since the last prefill */
    dr_gen_finish finish;
    int32_t *last_row;     /* [1+nc] the last row of the conditional state (host) */
    /* backend memory, one block: */
    void *dev;
    dr_gen_lane *lane;     /* sampler parameters, draw counter, redraw window */
    float *logits_c, *logits_u, *logits; /* [ncand] */
    float *pend_h;         /* [H] hidden of the last row: the tower input of the next frame */
    float *head_logits;    /* [nc-1][hv] */
    /* host copies for the introspection calls */
    float *h_logits, *h_pend, *h_head;
    dr_gen_score *score;   /* when set, prefills accumulate the tower's teacher-forced NLL */
};

/* Workspaces of a model, reused by its prefills and frame steps (one thread drives a model). */
struct dr_gen_cache {
    dr_bb_ws *bws;         /* prefill chunks */
    dr_tower_ws *tws;      /* tower prefill rows */
    float *hbuf;           /* [hbuf_rows][H]: prefill hidden, one row of room in front */
    int64_t hbuf_rows;
    dr_gen_step *step;     /* the frame step of the last dr_gen_next_many */
};

#endif
