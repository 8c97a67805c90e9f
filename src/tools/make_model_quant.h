/* make_model_quant.h - stored tensors of one routed-expert matrix in the chosen expert format
 * (FORMATS.md 4.1, 4.3, 4.4), encoded with the num encoders (num/quant.h). make_model*.c only. */
#ifndef DRAMA_TOOLS_MAKE_MODEL_QUANT_H
#define DRAMA_TOOLS_MAKE_MODEL_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/pool.h"
#include "base/tensor.h"
#include "tools/make_model.h"

enum {
    MM_Q_BF16 = 0,          /* .weight BF16 [out, in] */
    MM_Q_FP8_W, MM_Q_FP8_SCALE,                                   /* .weight, .weight_scale_inv */
    MM_Q_NV_W, MM_Q_NV_SCALE, MM_Q_NV_SCALE2, MM_Q_NV_INPUT,     /* .weight, .weight_scale, _2, .input_scale */
    MM_Q_AF_W, MM_Q_AF_SCALES, MM_Q_AF_BIASES,                   /* .weight, .scales, .biases */
    MM_Q_KINDS
};
#define MM_Q_MAX 4

typedef struct mm_q_component {
    int kind;
    const char *suffix;     /* appended to "...experts.E.gate_proj." */
    dr_dtype dtype;
    int ndim;               /* 0 = scalar */
    int64_t shape[2];
} mm_q_component;

/* The stored tensors of one [rows, cols] expert matrix, in write order. Returns their count. */
int mm_quant_components(const dr_mm_options *o, int64_t rows, int64_t cols, mm_q_component out[MM_Q_MAX]);

/* Encoded expert matrices (all components), `nslots` at a time: mm_quant_prepare encodes up to
 * nslots sources in parallel (slot i <- source i); mm_quant_get serves a prepared one, or encodes
 * it on the spot. Memory: nslots matrices. */
typedef struct mm_quant_cache mm_quant_cache;
typedef struct mm_qsrc { int layer, expert, proj; } mm_qsrc;
mm_quant_cache *mm_quant_cache_new(int nslots);
void mm_quant_cache_free(mm_quant_cache *c);
int mm_quant_cache_slots(const mm_quant_cache *c);
int mm_quant_has(const mm_quant_cache *c, int layer, int expert, int proj);
drama_status mm_quant_prepare(mm_quant_cache *c, const dr_mm_options *o, dr_pool *pool, const mm_qsrc *src, int n,
                              drama_error *err);
drama_status mm_quant_get(mm_quant_cache *c, const dr_mm_options *o, int layer, int expert, int proj, int kind,
                          const void **bytes, size_t *nbytes, drama_error *err);

/* Rows [r0, r0+nr) of the BF16-rounded source of expert (layer, e, proj) (make_model_weights.c). */
void mm_expert_rows(const dr_mm_options *o, int layer, int e, int proj, int64_t r0, int64_t nr, float *out);

#endif
