/* backbone.h - the Qwen3.5-MoE hybrid backbone (MODEL.md 4-6), written once over the backend
 * seam (backend/backend.h): the same code runs on the CPU and on CUDA.
 *
 * A dr_backbone holds weights bound in their stored format (dr_weight into the mapped
 * checkpoint; only norm vectors, conv kernels and DeltaNet gate constants are copied to fp32).
 * It is immutable after bind and shared by every session; a backend holds its resident copy
 * (model/upload.h). Per-request state is a dr_bb_state (model/state.h) in backend memory.
 *
 * Rows are [token, c0 .. c_{NC-1}] (MODEL.md 6). One call processes n rows:
 *   dr_bb_run              n rows in backend memory, each with its state and position (ops only:
 *                          the frame step uses it inside a capturable region)
 *   dr_backbone_forward    n rows of one session from the host (prefill; n = 1 is a decode step)
 *   dr_backbone_step_batch one row for each of n distinct sessions (batched decode)
 * Results are bit-identical whatever the thread count and however rows are grouped into calls:
 * prefill(rows) == prefill(first k) + steps, and a session in a batch == the session alone.
 * (DeltaNet prefill runs the recurrence row by row, which is what makes that exact.)
 */
#ifndef DRAMA_MODEL_BACKBONE_H
#define DRAMA_MODEL_BACKBONE_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/error.h"
#include "base/pool.h"
#include "model/config.h"
#include "model/loader.h"
#include "num/weight.h"

typedef struct dr_bb_state dr_bb_state;

/* Dimensions and switches the math needs (from config; a benchmark may fill them directly). */
typedef struct dr_bb_dims {
    int64_t H;                 /* hidden_size */
    int n_layers;
    dr_layer_kind *kinds;      /* [n_layers], owned by the backbone */
    int nh, nkv, hd;           /* attention heads, KV heads, head dim */
    int rope_dims;             /* rotary dims R (even) */
    double rope_theta;
    float eps;                 /* rms_norm_eps */
    float norm_offset;         /* switch backbone.norm_offset */
    int attn_gate;             /* attn_output_gate */
    int nk, dk, nv, dv, K;     /* DeltaNet key heads/dim, value heads/dim, conv width */
    int E, topk;               /* experts, experts per row */
    int64_t I, Is;             /* expert width, shared expert width */
    int norm_topk;
    int n_codebooks;           /* code columns of a row (audio num_codebooks) */
    int in_codebooks;          /* switch input.codebooks */
    int64_t code_stride;       /* audio vocab_size V */
    int code_scale_rsqrt;      /* switch input.code_scale */
    int add_token_embedding;   /* switch input.add_token_embedding */
    int gdn_recurrent;         /* switch deltanet.prefill = recurrent (default chunked): never the chunked form */
} dr_bb_dims;

typedef struct dr_bb_attn {
    dr_weight q, k, v, o;
    float *q_norm, *k_norm;    /* [hd], offset added */
} dr_bb_attn;

typedef struct dr_bb_gdn {
    dr_weight qkv, z, b, a, out;
    float *conv_w;             /* [C][K] */
    float *conv_b;             /* [C] or NULL */
    float *neg_A;              /* [nv]: -exp(A_log) */
    float *dt_bias;            /* [nv] */
    float *norm;               /* [dv] or [nv*dv] (per channel), plain weight */
    int norm_per_channel;
} dr_bb_gdn;

/* An MoE layer's weights are what the MoE op reads (backend.h). */
typedef dr_moe_expert dr_bb_expert;
typedef dr_moe_weights dr_bb_moe;

typedef struct dr_bb_layer {
    dr_layer_kind kind;
    int idx;                   /* index among layers of its kind (state arrays) */
    float *in_norm, *post_norm;/* [H], offset added */
    dr_bb_attn attn;
    dr_bb_gdn gdn;
    dr_bb_moe moe;
} dr_bb_layer;

typedef struct dr_backbone {
    dr_bb_dims d;
    char prefix[256];
    int n_attn, n_gdn;
    dr_bb_layer *layers;
    dr_weight embed;           /* [vocab, H] */
    dr_weight code_table;      /* [>= in_codebooks*V, H]; rows == 0 when in_codebooks == 0 */
    dr_weight head;            /* [vocab, H] (lm_head, or embed when tied) */
    float *final_norm;         /* [H], offset added */
    float *rope_inv_freq;      /* [rope_dims/2] */
    /* token ids (from the tokenizer; dr_backbone_set_tokens) */
    int64_t sem_start, n_sem, end_id;
    /* head rows scored: [head_sem_row, + n_sem) and head_end_row. Equal to the token ids, except
     * for a head already trimmed to n_sem + 1 rows (semantic block, then end: MODEL.md 5.6). */
    int64_t head_sem_row, head_end_row;
    int has_experts_meta;      /* drama_experts was present */
} dr_backbone;

/* Fill dims from a loaded config (text config + input.* / backbone.* switches). */
drama_status dr_bb_dims_from_config(const dr_config *cfg, dr_bb_dims *d, drama_error *err);

/* Bind every backbone tensor through the loader (prefix detected there). Tensor problems become
 * loader findings (check them with dr_findings_check afterwards); the return value is an error
 * only for what stops binding altogether (bad config, prefix, drama_experts, memory). */
drama_status dr_backbone_bind(dr_backbone *bb, dr_loader *ld, drama_error *err);
void dr_backbone_release(dr_backbone *bb); /* frees what bind allocated; bb itself is the caller's */

/* Semantic block [sem_start, sem_start + n_sem) and the end token (MODEL.md 3.4): decide which
 * rows are audio rows and which head rows the restricted logits use. Checked against vocab. A head
 * of exactly n_sem + 1 rows (fewer than the embedding's) is taken as already trimmed: rows
 * 0..n_sem-1 are the semantic tokens and row n_sem the end token. */
drama_status dr_backbone_set_tokens(dr_backbone *bb, int64_t sem_start, int64_t n_sem, int64_t end_id,
                                    drama_error *err);
int64_t dr_backbone_n_logits(const dr_backbone *bb); /* n_sem + 1 */
int dr_backbone_row_width(const dr_backbone *bb);    /* 1 + n_codebooks */

/* Optional per-call outputs for tests and `drama forward --trace`: NULL members are skipped. */
typedef struct dr_bb_trace {
    float *embeds;             /* [n][H] */
    float *layer_out;          /* [n_layers][n][H], residual stream after each layer */
    float *pre_norm;           /* [n][H], last residual before the final norm */
} dr_bb_trace;

/* Activations of backbone calls of up to `rows` rows, in backend memory (reused across calls
 * so a recorded region keeps its addresses). */
typedef struct dr_bb_ws {
    dr_backend *be;
    int64_t rows;
    float *x, *xn, *mix;       /* [rows][H]: residual, normed input, mixer / MoE output */
    float *q, *k, *v, *o;      /* attention: [rows][q_stride], [rows][kv_dim] x2, [rows][nh*hd] */
    float *u, *y, *z, *ga, *gb, *go; /* DeltaNet: [rows][C] x2, [rows][nv*dv], [rows][nv] x2, [rows][nv*dv] */
    float *hidden, *logits;    /* outputs of host calls: [rows][H], [rows][n_sem + 1] */
    int32_t *tok;              /* [rows][row_width] rows uploaded by host calls */
    dr_seq_row *seq;           /* [rows] */
    dr_op_status *status;      /* [rows] */
} dr_bb_ws;

drama_status dr_bb_ws_create(dr_backend *be, const dr_backbone *bb, int64_t rows, dr_bb_ws **out, drama_error *err);
void dr_bb_ws_free(dr_bb_ws *ws);

/* One call over n <= ws->rows rows, all in backend memory; issues ops only (no host read or
 * write unless trace is set). Row i ([row_width], valid) runs at seq[i]; outputs may be NULL:
 * hidden [n][H] final-normed, pre_norm [n][H] the residual before it, logits [n][n_sem + 1].
 * status[n] (zeroed by the caller) gets router failures. The caller advances the positions
 * (the advance op) afterwards. trace rows go to [row0, row0 + n) of host arrays of trace_rows. */
typedef struct dr_bb_call {
    int64_t n;
    const int32_t *rows;
    const dr_seq_row *seq;
    float *hidden, *pre_norm, *logits;
    dr_op_status *status;
    const dr_bb_trace *trace;
    int64_t trace_row0, trace_rows;
} dr_bb_call;
drama_status dr_bb_run(dr_backend *be, const dr_backbone *bb, dr_bb_ws *ws, const dr_bb_call *c, drama_error *err);

/* The router failure of row `row` (status from dr_bb_run) as an error message. */
drama_status dr_bb_status_fail(const dr_op_status *s, int64_t row, drama_error *err);

/* n rows [n][row_width] of one session from the host, at positions st->pos ..; advances st->pos
 * by n. Runs on the state's backend (pool: the threads for a state made without one). Outputs
 * (host) may be NULL: hidden [n][H] final-normed, logits [n][n_sem + 1]; with trace. */
drama_status dr_backbone_forward(const dr_backbone *bb, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden, float *logits, const dr_bb_trace *trace, dr_pool *pool,
                                 drama_error *err);

/* The same with the outputs left in backend memory of the state's backend: hidden_dev [n][H]
 * (final-normed, or the pre-norm residual when pre_norm) and last_logits_dev [n_sem + 1] of the
 * last row, each may be NULL. ws (may be NULL: made for the call) must be of that backend. */
drama_status dr_backbone_prefill(const dr_backbone *bb, dr_bb_ws *ws, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden_dev, int pre_norm, float *last_logits_dev, dr_pool *pool,
                                 drama_error *err);

/* One row per session (states distinct): row i [row_width] goes to states[i]. */
drama_status dr_backbone_step_batch(const dr_backbone *bb, dr_bb_state *const *states, int n, const int32_t *rows,
                                    float *hidden, float *logits, dr_pool *pool, drama_error *err);

/* The op arguments a backbone's embedding uses (its constants and switches). */
dr_embed_args dr_backbone_embed_args(const dr_backbone *bb);

/* Check one input row (token range, audio row codes, c0 agreement); names row index `r`. */
drama_status dr_backbone_check_row(const dr_backbone *bb, const int32_t *row, int64_t r, drama_error *err);

#endif
