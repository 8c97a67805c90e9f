/* cpu_backend.h - the CPU backend of the seam (backend/backend.h): backend memory is host memory
 * (64-byte aligned), model constants are used in place, every op calls the kernels of
 * backend/cpu/{matmul,ops,sample}.h with the pool's threads. Nothing is recorded: run_region
 * runs its function. Results are bit-identical for any thread count. */
#ifndef DRAMA_BACKEND_CPU_CPU_BACKEND_H
#define DRAMA_BACKEND_CPU_CPU_BACKEND_H

#include "backend/backend.h"
#include "backend/cpu/sample.h"
#include "base/pool.h"

/* What a CPU backend holds: the pool (not owned) and the sampler's scratch (grown on demand). */
typedef struct dr_cpu_backend {
    dr_pool *pool;
    dr_sample_ws ws;
} dr_cpu_backend;

/* A heap backend over `pool` (NULL: inline); free with dr_backend_free. */
drama_status dr_backend_cpu_create(dr_pool *pool, dr_backend **out, drama_error *err);
/* A backend in caller memory (e.g. on the stack for one call); release with dr_backend_cpu_release. */
void dr_backend_cpu_init(dr_backend *be, dr_cpu_backend *impl, dr_pool *pool);
void dr_backend_cpu_release(dr_backend *be);
/* The backend a host call runs on: `be` when given, else a CPU backend over `pool` kept in c
 * (for objects made without a backend). End with dr_cpu_call_end. */
typedef struct dr_cpu_call {
    dr_backend cpu;
    dr_cpu_backend impl;
    dr_backend *be;
} dr_cpu_call;
dr_backend *dr_cpu_call_begin(dr_cpu_call *c, dr_backend *be, dr_pool *pool);
void dr_cpu_call_end(dr_cpu_call *c);
/* The op table (tests wrap it to inject faults). */
const dr_backend_ops *dr_backend_cpu_ops(void);
/* A process-wide CPU backend without threads, for memory of objects made without a backend
 * (immutable: its sampler scratch is never used, its memory ops are stateless). */
dr_backend *dr_backend_cpu_memory(void);
/* The pool of a CPU backend (NULL for other kinds). */
dr_pool *dr_backend_cpu_pool(const dr_backend *be);

/* ---- internal to backend/cpu: the ops in cpu_mixers.c, cpu_moe.c, cpu_lanes.c ---- */
void dr_cpu_op_attention(dr_backend *be, const dr_attn_args *a);
void dr_cpu_op_deltanet(dr_backend *be, const dr_gdn_args *a);
void dr_cpu_op_moe(dr_backend *be, const dr_moe_args *a);
void dr_cpu_op_guidance(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand);
void dr_cpu_op_sample_semantic(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand, dr_step_io io);
void dr_cpu_op_sample_acoustic(dr_backend *be, const dr_step_lane *lanes, int n, int codebook, const float *logits,
                               int head_vocab, dr_step_io io);
void dr_cpu_op_frame_rows(dr_backend *be, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                          int64_t sem_start, int32_t *rows);

static inline dr_pool *dr_cpu_pool_of(dr_backend *be) { return ((dr_cpu_backend *)be->impl)->pool; }

#endif
