/* backbone.h - the Qwen3.5-MoE hybrid backbone on the CPU (MODEL.md 4-6).
 *
 * A dr_backbone holds weights bound in their stored format (dr_weight into the mapped
 * checkpoint; only norm vectors, conv kernels and DeltaNet gate constants are copied to fp32).
 * It is immutable after bind and shared by every session; per-request state is a dr_bb_state
 * (model/state.h).
 *
 * Rows are [token, c0 .. c_{NC-1}] (MODEL.md 6). One call processes n rows:
 *   dr_backbone_forward   n rows of one session (prefill; n = 1 is a decode step)
 *   dr_backbone_step_batch one row for each of n distinct sessions (batched decode)
 * Results are bit-identical whatever the thread count and however rows are grouped into calls:
 * prefill(rows) == prefill(first k) + steps, and a session in a batch == the session alone.
 * (DeltaNet prefill runs the recurrence row by row, which is what makes that exact.)
 */
#ifndef DRAMA_MODEL_BACKBONE_H
#define DRAMA_MODEL_BACKBONE_H

#include <stdint.h>

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

typedef struct dr_bb_expert {
    int fused;                 /* 1: gate_up holds [2I, H] (gate rows then up rows) */
    dr_weight gate, up, gate_up, down;
} dr_bb_expert;

typedef struct dr_bb_moe {
    dr_weight router;          /* [E, H] */
    dr_weight sh_gate, sh_up, sh_down, sh_gate_proj; /* shared expert; sh_gate_proj is [1, H] */
    int n_kept;                /* stored experts */
    int *kept;                 /* [n_kept] original ids, ascending */
    int *slot;                 /* [E] slot of an original id, -1 if pruned */
    dr_bb_expert *experts;     /* [n_kept], by slot */
    int fused_layout;
} dr_bb_moe;

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

/* n rows [n][row_width] of one session, at positions st->pos ..; advances st->pos by n.
 * hidden [n][H] (final-normed) and logits [n][n_sem + 1] may be NULL. */
drama_status dr_backbone_forward(const dr_backbone *bb, dr_bb_state *st, const int32_t *rows, int64_t n,
                                 float *hidden, float *logits, const dr_bb_trace *trace, dr_pool *pool,
                                 drama_error *err);

/* One row per session (states distinct): row i [row_width] goes to states[i]. */
drama_status dr_backbone_step_batch(const dr_backbone *bb, dr_bb_state *const *states, int n, const int32_t *rows,
                                    float *hidden, float *logits, dr_pool *pool, drama_error *err);

/* Check one input row (token range, audio row codes, c0 agreement); names row index `r`. */
drama_status dr_backbone_check_row(const dr_backbone *bb, const int32_t *row, int64_t r, drama_error *err);

#endif
