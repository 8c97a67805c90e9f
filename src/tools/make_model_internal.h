/* make_model_internal.h - shared between the make_model*.c files only. */
#ifndef DRAMA_TOOLS_MAKE_MODEL_INTERNAL_H
#define DRAMA_TOOLS_MAKE_MODEL_INTERNAL_H

#include "tools/make_model.h"

/* Layer i is full attention iff (i+1) % interval == 0 (MODEL.md 3.2). */
static inline int mm_is_full(const dr_mm_dims *d, int i) {
    return (i + 1) % d->full_attention_interval == 0;
}

/* Tensor list + shard files + index (make_model_weights.c). */
drama_status mm_write_weights(const char *dir, const dr_mm_options *o, int64_t vocab, drama_error *err);
/* Remove model shards (model-NNNNN-of-MMMMM.safetensors, model.safetensors) from dir. */
void mm_remove_stale(const char *dir);

#endif
