/* state_bytes.h - how many bytes a backbone state and a tower cache hold at a given number of
 * positions, computed without allocating (admission reserves them before a request's state
 * grows). Follows the growth policy of state.c and tower.c: capacity starts at `reserve`
 * positions (at least 64) and doubles; the figure includes the transient of the last growth
 * (the old K/V block, one for all layers, lives while it is copied). test_gen_engine checks it against the
 * bytes real states report. */
#ifndef DRAMA_MODEL_STATE_BYTES_H
#define DRAMA_MODEL_STATE_BYTES_H

#include <stddef.h>
#include <stdint.h>

#include "model/backbone.h"
#include "model/tower.h"

/* The capacity (positions) a buffer created with `reserve` reaches when it holds `positions`. */
int64_t dr_state_capacity_for(int64_t reserve, int64_t positions);
size_t dr_bb_state_bytes_for(const dr_backbone *bb, int64_t reserve, int64_t positions);
size_t dr_tower_cache_bytes_for(const dr_tower *t, int64_t reserve, int64_t positions);

#endif
