/* cuda_contract.h - INTERNAL entry for `drama contract` only (src/tools/contract_cuda.c): the matvec
 * kernel compiled with a planted defect, so the contract can prove on the device that its fixtures
 * catch such faults. Not part of the public API; production launches always use DEFECT = 0
 * (a template parameter: the real kernel carries no trace of these branches). */
#ifndef DRAMA_BACKEND_CUDA_CONTRACT_H
#define DRAMA_BACKEND_CUDA_CONTRACT_H

#include "backend/cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dr_cuda_defect {
    DR_CUDA_DEFECT_NONE = 0,
    DR_CUDA_DEFECT_NEXT_BLOCK_SCALE, /* FP8 block: the scale of the next block column */
    DR_CUDA_DEFECT_NIBBLE_HIGH_FIRST, /* NVFP4: E2M1 nibbles read high-first */
    DR_CUDA_DEFECT_FP16_ACCUM,        /* BF16: every accumulation step rounded to fp16 */
    DR_CUDA_DEFECT_DROP_TAIL_CHUNK,   /* F32: the ragged last 16-byte chunk of a row is skipped */
    DR_CUDA_DEFECT_PREV_GROUP,        /* affine 4/8-bit: group g+1 uses the scale and bias of group g */
    DR_CUDA_DEFECT_SHUFFLE_LEVEL,     /* F16: the shuffle tree stops one level early (odd lanes lost) */
    DR_CUDA_DEFECT_TILE_TAIL,         /* FP8 per-tensor: n > tile width drops the last partial tile */
    DR_CUDA_DEFECT_NORM_NO_WEIGHT,    /* BF16, fused norm: the norm weight skipped in the staging */
    DR_CUDA_DEFECT_XT_SHIFT,          /* n = 1, BF16, transposed staging: each chunk dotted with the next chunk's x */
    DR_CUDA_DEFECT_NEXT_ROW_PREFETCH, /* n = 1, FP8 block, persistent warps: a warp's next row loaded from the row after it */
    DR_CUDA_DEFECT_PDL_EARLY_X,       /* n = 1, BF16: x staged BEFORE pdl_wait (red only with PDL on) */
    DR_CUDA_DEFECT_COUNT
} dr_cuda_defect;

/* dr_cuda_matmul_batch with the kernel variant carrying `defect` (DR_CUDA_DEFECT_NONE = the real
 * kernel). A defect is compiled only for the format named beside it; another format fails (the
 * launch error, "invalid argument"). */
drama_status dr_cuda_matmul_batch_defect(dr_cuda *c, const dr_cuda_job *jobs, int count, int defect,
                                         drama_error *err);

/* How the n = 1 kernel (matvec1_kernel) stages x in shared memory from now on:
 * 1 = chunk-transposed (the default: no bank conflicts), 0 = plain (y bit for bit the same).
 * dr_cuda_open sets it from DRAMA_CUDA_XT ("0": 0, else 1). */
drama_status dr_cuda_set_xt(dr_cuda *c, int xt, drama_error *err);

/* The n = 1 kernel's rows per warp from now on: 0 = persistent warps walking rows (the default), 1 =
 * one row per warp (y bit for bit the same). dr_cuda_open sets it from DRAMA_CUDA_MV1_PERSIST ("0": 1). */
drama_status dr_cuda_set_mv1_one_row(dr_cuda *c, int one_row, drama_error *err);
/* the n = 1 kernel's L2 prefetch of the first `bytes` of a launch's weight rows before its wait (0: off, the default) */
drama_status dr_cuda_set_mv1_l2pf(dr_cuda *c, int64_t bytes, drama_error *err);
/* Whether the kernels are launched from now on with programmatic dependent launch (pdl.cuh):
 * 1 = on (the default on sm_90+; ignored below), 0 = plain launches. dr_cuda_open sets it from
 * DRAMA_CUDA_PDL ("0": 0, else 1). dr_cuda_pdl tells the current setting. */
drama_status dr_cuda_set_pdl(dr_cuda *c, int pdl, drama_error *err);
int dr_cuda_pdl(const dr_cuda *c);
/* The sampler kernels (sample.cu) from now on: 1 = the faster draw (top-k select, windowed sort,
 * the redraw's keys reused; the default), 0 = the draw that sorts every candidate (the draws bit for
 * bit the same); dr_cuda_open sets it from DRAMA_CUDA_SAMPLE ("0": 0, "nolist": 4, else 1). 2 / 3 = the faster
 * draw with a planted defect, for dr_cuda_sample_raw only (the lane ops then run 1): 2 = every
 * bitonic sort skips its last stage, 3 = the top-k list has its k-th key replaced by the (k+1)-th.
 * 4 = the faster draw without the nucleus list (DRAMA_CUDA_SAMPLE=nolist; the draws the same). */
drama_status dr_cuda_set_sample(dr_cuda *c, int v, drama_error *err);

/* The PDL ordering check (matvec_defect.cu): a kernel that spins about spin_us microseconds, then
 * copies src[0, n) to dst (launched like every frame-step kernel, and letting its dependent start
 * at once), followed on the stream by the n = 1 product of jobs (dr_cuda_matmul_batch, or with
 * `defect`). With PDL on, a product that read its x before pdl_wait reads the old dst. */
drama_status dr_cuda_pdl_order_check(dr_cuda *c, const float *src, float *dst, int64_t n, int spin_us,
                                     const dr_cuda_job *jobs, int count, int defect, drama_error *err);

/* y[i] = dr_expf_det(x[i]) computed on the device (num/expf_det.h), for the contract's check that
 * host and device give the same bits; device_expf = 1 computes the device's own expf instead (the
 * planted control: close, but not the same bits). x, y device pointers. */
drama_status dr_cuda_expf_det_eval(dr_cuda *c, const float *x, int64_t n, float *y, int device_expf, drama_error *err);

/* The split attention (attn.cu) with a planted defect from then on, for every context: 1 = each V
 * row of the shared-memory staging loop copied from the next position; 0 = the real kernel. */
void dr_cuda_attn_plant_defect(int defect);

/* The MoE layer's grouped path (moe_prefill.cu) with a planted defect: 1 = each expert's pairs past
 * the first tile are dropped (inside the first gate/up kernel's tile loop), 2 = the staged down kernel
 * stages a tile's first row from its second pair, 3 / 4 = the walk gate/up / down kernel keeps the
 * previous tile's x when a warp's segment enters a new tile; each selects the kernels it is planted
 * in; 0 = the real kernels. */
struct dr_cuda_moe;
void dr_cuda_moe_set_group_defect(struct dr_cuda_moe *m, int defect);
/* How many calls of m ran the grouped path's walk kernels (moe_grouped_walk.cuh), or -1 when m's grouped
 * path is not the walk (DRAMA_CUDA_MOE_GROUPED=old / staged, or a control of those kernels). */
int64_t dr_cuda_moe_walk_calls(const struct dr_cuda_moe *m);
/* The walk kernels of m on at most `blocks` blocks from now on (0: the grid the occupancy gives, one
 * wave on every SM), so the contract's warps walk many tiles whatever the GPU. */
void dr_cuda_moe_set_walk_blocks(struct dr_cuda_moe *m, int blocks);
/* The MoE layer's few-row expert kernels (moe_decode.cuh) with a planted defect from then on:
 * 1 = the up row of the next output, 2 = each rank weighted with the next rank's routing weight,
 * 4 = (DRAMA_CUDA_XT=1) each SwiGLU value written a chunk over in the transposed layout; 0 = none. */
struct dr_cuda_moe;
void dr_cuda_moe_plant_defect(struct dr_cuda_moe *m, int defect);
/* The few-row down kernel of the MoE layer m from now on: 0 = moe_down_decode_kernel, 1 = its variant
 * at <= 128 registers (moe_down_lean.cuh; out bit for bit the same; the default). dr_cuda_moe_create
 * sets it from DRAMA_CUDA_MOE_DOWN (unset: 1, "decode": 0). With it, planted defect 3 dots a rank's
 * chunks with the next rank's SwiGLU row (inside the chunk loop). */
void dr_cuda_moe_set_down(struct dr_cuda_moe *m, int lean);
/* The MoE layer m's routing and few-row expert kernels from now on: on = 1 moe_persist.cuh's
 * (persistent warps; dr_cuda_moe_create's default unless DRAMA_CUDA_MOE_PERSIST=0), 0 moe_route_kernel
 * and moe_decode.cuh's (then set_down chooses the down kernel); out bit for bit the same.
 * max_blocks > 0: at most that many blocks per row (each warp walks many items: the contract's
 * cases), 0: sized to the SMs. With it on, planted defect 5 loads the next gate/up item's rows
 * through the current item's expert view and 6 the next output's routed down rows at the current
 * output's row (both inside the item walk), 2 as before. on = 2: moe_persist2.cu's expert kernels
 * (DRAMA_CUDA_MOE_PERSIST=2; the same routing kernel); planted defect 7 loads a routed next gate/up
 * item's rows at the next output's row, 8 the next down output's shared-expert row at the current
 * output's (both inside the walk), 2 as before. */
void dr_cuda_moe_set_persist(struct dr_cuda_moe *m, int on, int max_blocks);
/* moe_persist2.cu's down kernel: a row's act rows staged in shared memory (1, the default) or read from L2 (0) */
void dr_cuda_moe_set_down_stage(struct dr_cuda_moe *m, int on);
/* with those kernels: the gate/up kernel prefetches the chosen experts into L2 (1, DRAMA_CUDA_MOE_L2PF=1) or not (0, the default) */
void dr_cuda_moe_set_l2pf(struct dr_cuda_moe *m, int on);
/* with those kernels: the gate/up kernel routes its row (1, the default) or the routing kernel runs first (0) */
void dr_cuda_moe_set_route_in_gu(struct dr_cuda_moe *m, int on);

#ifdef __cplusplus
}
#endif

#endif
