/* dev_rows.cuh - where the kernels find each row's position, caches and hold flag: device arrays
 * (the C API of cuda_ops.h, which the contract drives) or the seam's dr_seq_row table in device
 * memory (backend.h, the CUDA backend). Kernels are templates over these two accessors, so both
 * paths run the same arithmetic. */
#ifndef DRAMA_BACKEND_CUDA_DEV_ROWS_CUH
#define DRAMA_BACKEND_CUDA_DEV_ROWS_CUH

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif

/* positions pos[i]; attention caches kc[i] / vc[i]; DeltaNet window / state win[i] / st[i] */
struct rows_arr {
    static constexpr bool zero_held = false, gates_out = false;
    const int32_t *pos;
    float *const *kc;
    float *const *vc;
    const int32_t *skip;
    __device__ __forceinline__ int64_t p(int64_t i) const { return pos[i]; }
    __device__ __forceinline__ float *k(int64_t i) const { return kc[i]; }
    __device__ __forceinline__ float *v(int64_t i) const { return vc[i]; }
    __device__ __forceinline__ float *conv(int64_t i) const { return kc[i]; }
    __device__ __forceinline__ float *rec(int64_t i) const { return vc[i]; }
    __device__ __forceinline__ bool held(int64_t i) const { return skip && skip[i]; }
    __device__ __forceinline__ bool same(int64_t i, int64_t j) const { return vc[i] == vc[j]; }
};

/* the seam: rows[i].seq holds the sequence (layout of backend.h's dr_seq), layer the slot */
struct rows_seq {
    static constexpr bool zero_held = true, gates_out = true;
    const dr_seq_row *rows;
    int layer;
    __device__ __forceinline__ int64_t p(int64_t i) const { return rows[i].seq->pos + rows[i].off; }
    __device__ __forceinline__ float *k(int64_t i) const {
        const dr_seq *s = rows[i].seq;
        return s->kv + (int64_t)2 * layer * s->cap * s->kv_dim;
    }
    __device__ __forceinline__ float *v(int64_t i) const {
        const dr_seq *s = rows[i].seq;
        return s->kv + ((int64_t)2 * layer + 1) * s->cap * s->kv_dim;
    }
    __device__ __forceinline__ float *conv(int64_t i) const {
        const dr_seq *s = rows[i].seq;
        return s->conv + (int64_t)layer * s->conv_len;
    }
    __device__ __forceinline__ float *rec(int64_t i) const {
        const dr_seq *s = rows[i].seq;
        return s->rec + (int64_t)layer * s->rec_len;
    }
    __device__ __forceinline__ bool held(int64_t i) const { return rows[i].hold && *rows[i].hold; }
    __device__ __forceinline__ bool same(int64_t i, int64_t j) const { return rows[i].seq == rows[j].seq; }
};

#endif
