/* framestep.h - one frame of n sessions as backend ops only (MODEL.md 8, TEXT.md 5):
 *
 *   guidance -> semantic draw (end token: the lane ends; its states hold from here on)
 *   -> tower chain from the pending hidden (13 layers, 9 heads, an acoustic draw after each head)
 *   -> the frame as the next row of every backbone state (conditional, and unconditional when
 *      guided: paired in the same call, separate in a second) -> pending hidden and logits
 *
 * dr_gen_frame_step issues exactly that and nothing else: no host read, no host write, every
 * position, length, counter and flag in backend memory (backend.h: dr_seq, dr_gen_lane,
 * dr_step_io), so a backend may record it once per lane count and replay it as the context
 * grows and sessions come and go (their pointers are read from the step's tables). The host
 * prepares the step (dr_gen_step_prepare: tables uploaded when the sessions change; capacity is
 * the caller's, reserved before), runs it in a capturable region (dr_gen_step_run), then reads
 * the results. On a backend whose memory is host memory (CPU) the step skips the tower and
 * backbone when every lane ended or failed (semantic draw, non-finite pending hidden), which
 * changes no result.
 */
#ifndef DRAMA_GEN_FRAMESTEP_H
#define DRAMA_GEN_FRAMESTEP_H

#include "backend/backend.h"
#include "gen/frameloop.h"

typedef struct dr_gen_step dr_gen_step;

/* What the host reads of one lane after a step. */
typedef struct dr_gen_step_result {
    int32_t codes[DR_MAX_CODEBOOKS];
    int ended;                 /* the semantic draw gave the end token (the states did not change) */
    dr_op_status draw;         /* first failure of the draws and the tower chain */
    dr_op_status row;          /* first failure of the lane's backbone rows */
} dr_gen_step_result;

/* A step for up to `lanes` sessions of m (its tables, results and workspaces in backend memory). */
drama_status dr_gen_step_create(const dr_gen_model *m, int lanes, dr_gen_step **out, drama_error *err);
void dr_gen_step_free(dr_gen_step *st);
int dr_gen_step_capacity(const dr_gen_step *st);

/* Points the step at sessions ss[0..n) (n <= capacity, each prefilled, states with room for one
 * more position); uploads the tables only when they differ from the last ones. */
drama_status dr_gen_step_prepare(dr_gen_step *st, dr_gen_session *const *ss, int n, drama_error *err);
/* The frame step itself: ops only (see above). st as prepared. */
void dr_gen_frame_step(dr_gen_step *st);
/* dr_gen_frame_step inside the backend's capturable region, then the results [n] to the host. */
drama_status dr_gen_step_run(dr_gen_step *st, dr_gen_step_result *res, drama_error *err);

#endif
