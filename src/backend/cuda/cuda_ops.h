/* cuda_ops.h - the CUDA activation kernels of one frame step (plain C API): norms, embeddings,
 * attention with its KV cache, the Gated DeltaNet step, the MoE layer, guidance, sampling and the
 * tower's inputs (MODEL.md 5-7, TEXT.md 5). Products go through cuda_backend.h.
 *
 * Every pointer is a DEVICE pointer unless it says host. Work is queued on the context's stream;
 * nothing here reads a device value on the host, so a sequence of these calls can be captured in a
 * CUDA graph. Positions, cache lengths and counters are device values the kernels read.
 * Kernels that meet unusable input (a router with no finite score, a NaN logit) record it in a
 * dr_cuda_status word in device memory; dr_cuda_status_check turns it into an error on the host.
 *
 * Per-session state is passed as device arrays of device pointers (one entry per row), so rows of
 * one call may belong to one session (a prefill: consecutive positions) or to distinct sessions
 * (a batched step). `skip` (device int32 [n], NULL = none) marks rows whose session must not
 * change: their cache, window and recurrent state are left as they were (a lane that drew the end
 * token inside a captured frame step). Design and arithmetic: docs/cuda.md. */
#ifndef DRAMA_BACKEND_CUDA_OPS_H
#define DRAMA_BACKEND_CUDA_OPS_H

#include <stdint.h>

#include "backend/cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* ---- device status ---- */
enum {
    DR_CUDA_ERR_NONE = 0,
    DR_CUDA_ERR_ROUTER,      /* a = layer, b = row: router produced no finite score */
    DR_CUDA_ERR_LOGIT_NAN,   /* a = candidate, b = row: a NaN logit */
    DR_CUDA_ERR_LOGIT_INF,   /* a = candidate, b = row: a +inf logit */
    DR_CUDA_ERR_EXCLUDED,    /* b = row: every candidate is -inf */
    DR_CUDA_ERR_TOKEN,       /* a = token, b = row: outside the embedding */
    DR_CUDA_ERR_CODE,        /* a = code, b = row: outside its code table */
    DR_CUDA_ERR_SHAPE        /* a, b: a kernel met a shape it was not built for */
};
typedef struct dr_cuda_status { int code, a, b; } dr_cuda_status;
/* Reads and clears *dev (synchronises the stream); an error naming `what` when it holds a failure. */
drama_status dr_cuda_status_check(dr_cuda *c, dr_cuda_status *dev, const char *what, drama_error *err);

/* ---- norms and embeddings (ops.cu) ---- */

/* y[r] = rms_norm(x[r], w, eps) for n rows of dim values, rows x_ld / y_ld floats apart; w [dim]
 * holds offset + stored weight (NULL = 1). Sum of squares in double, r rounded once, two fp32
 * products: dr_op_rms_norm. x and y may alias. */
drama_status dr_cuda_rms_norm(dr_cuda *c, const float *x, int64_t x_ld, const float *w, double eps, int64_t n,
                              int64_t dim, float *y, int64_t y_ld, drama_error *err);

/* The backbone's input rows (MODEL.md 6): rows [n][width] (device int32) -> x [n][H]. Text rows
 * take E_tok[token]; audio rows (token in [sem_start, sem_start + n_sem)) take (E_tok[token] if
 * add_token + sum_{k < in_codebooks} E_code[c_k + k code_stride]) * scale, summed in double in
 * that order and rounded once (bit-identical to the CPU). */
typedef struct dr_cuda_embed_params {
    int64_t sem_start, n_sem;
    int width;            /* 1 + num_codebooks */
    int in_codebooks;
    int64_t code_stride;
    int add_token;
    double scale;         /* 1/sqrt(in_codebooks + 1) (input.code_scale rsqrt) or 1 */
} dr_cuda_embed_params;
drama_status dr_cuda_embed(dr_cuda *c, const dr_cuda_weight *tok, const dr_cuda_weight *code_table,
                           const dr_cuda_embed_params *p, const int32_t *rows, int64_t n, float *x,
                           dr_cuda_status *st, drama_error *err);

/* The tower layer input (MODEL.md 7.2): x [n][de + dh] = concat(enorm(e), hnorm(h)) (hidden first
 * when hidden_first), e = E[codes[r * codes_ld] + slot * code_stride] when the row's mask is on,
 * else 0 (rms of 0 is 0). mask (device uint8 [n]) NULL = on for every row; mask_off = 1 turns
 * every row off (tower.shared_code none). */
typedef struct dr_cuda_tower_in {
    const dr_cuda_weight *code_table;
    int64_t code_stride;
    int slot;             /* codebook of the embedded code */
    const float *enorm, *hnorm; /* [de], [dh], offset added */
    int de, dh;
    double eps;
    int hidden_first;
    int mask_off;
} dr_cuda_tower_in;
drama_status dr_cuda_tower_input(dr_cuda *c, const dr_cuda_tower_in *p, int64_t n, const int32_t *codes,
                                 int64_t codes_ld, const uint8_t *mask, const float *h, float *x,
                                 dr_cuda_status *st, drama_error *err);
/* The same reporting a bad code per row as the seam does: rstatus[r] = {EINVAL, DR_FAULT_CODE, code,
 * slot, layer} (the first failure of the row kept). */
drama_status dr_cuda_tower_input_rows(dr_cuda *c, const dr_cuda_tower_in *p, int layer, int64_t n, const int32_t *codes,
                                      int64_t codes_ld, const uint8_t *mask, const float *h, float *x,
                                      dr_op_status *rstatus, drama_error *err);

/* out = cond + gamma (cond - uncond) over n rows of m logits (rows ld apart); a -inf cond stays
 * -inf (dr_op_guidance). out may alias cond. */
drama_status dr_cuda_guidance(dr_cuda *c, const float *cond, const float *uncond, int64_t n, int64_t m, int64_t ld,
                              float gamma, float *out, drama_error *err);

/* ---- attention (attn.cu) ---- */

typedef struct dr_cuda_attn_shape {
    int nh, nkv, hd;
    int rope_half;        /* R/2 rotated pairs (0: no RoPE) */
    int rope_interleaved; /* 0: pairs (i, i + R/2) (rotate half); 1: (2i, 2i + 1) */
    const float *inv_freq;/* [rope_half] */
    const float *q_norm, *k_norm; /* [hd] per-head RMS norm weights (offset added), NULL = none */
    double eps;
    double scale;         /* score scale (1/sqrt(hd)) */
} dr_cuda_attn_shape;

/* Per row i: q heads (head j at q_in + i q_ld + j q_hs, hd values) normed and rotated into
 * q_out [n][nh][hd]; K/V heads (head m at k_in / v_in + i kv_ld + m hd) K normed and rotated,
 * stored at position pos[i] of the row's caches kc[i] / vc[i] ([cap][nkv hd] each). Rows whose
 * skip flag is set write nothing to their caches. RoPE angles pos * inv_freq in double, cos/sin
 * rounded to fp32, fp32 rotation (dr_op_rope_*). */
drama_status dr_cuda_attn_prep(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q_in, int64_t q_ld,
                               int64_t q_hs, const float *k_in, const float *v_in, int64_t kv_ld, const int32_t *pos,
                               float *const *kc, float *const *vc, const int32_t *skip, float *q_out,
                               drama_error *err);

/* Workspace bytes of dr_cuda_attn for n rows and caches of up to max_pos positions. */
size_t dr_cuda_attn_ws_bytes(const dr_cuda_attn_shape *s, int64_t n, int64_t max_pos);
/* o [n][nh hd]: row i's heads attend over positions 0 .. pos[i] of kc[i] / vc[i] (GQA: head j uses
 * KV head j / (nh / nkv)); scores and sums in double, split over blocks of positions and merged.
 * gate (NULL = none): o_j *= sigmoid(gate + i gate_ld + j gate_hs) (attn_output_gate). max_pos
 * bounds pos[i] + 1 (it fixes the launch shape, so a captured graph stays valid as pos grows). */
drama_status dr_cuda_attn(dr_cuda *c, const dr_cuda_attn_shape *s, int64_t n, const float *q, const int32_t *pos,
                          float *const *kc, float *const *vc, int64_t max_pos, const float *gate, int64_t gate_ld,
                          int64_t gate_hs, void *ws, size_t ws_bytes, float *o, drama_error *err);

/* ---- Gated DeltaNet (gdn.cu) ---- */

typedef struct dr_cuda_gdn_shape {
    int nk, dk, nv, dv, K;
    const float *conv_w;  /* [C][K], C = 2 nk dk + nv dv */
    const float *conv_b;  /* [C] or NULL */
    const float *neg_A, *dt_bias; /* [nv] */
    const float *norm;    /* [dv], or [nv dv] when norm_per_channel */
    int norm_per_channel;
    double eps;           /* rms_norm_eps of the output norm */
} dr_cuda_gdn_shape;
#define DR_CUDA_GDN_MAX_DK 128 /* the recurrence keeps a state column in registers */
#define DR_CUDA_GDN_MAX_DV 128

/* Causal depthwise conv + SiLU of n rows u [n][u_ld] -> y [n][C], row i with the window win[i]
 * ([K-1][C], oldest first, shifted to include u): dr_op_conv_step then dr_op_silu. Rows of one
 * session must come in position order. */
drama_status dr_cuda_gdn_conv(dr_cuda *c, const dr_cuda_gdn_shape *s, int64_t n, const float *u, int64_t u_ld,
                              float *const *win, const int32_t *skip, float *y, drama_error *err);

/* The recurrence and output of n rows (MODEL.md 5.4): q, k l2-normalised (q also by 1/sqrt(dk)),
 * g = neg_A softplus(a + dt_bias), beta = sigmoid(b), per value head h the state S[i] + h dk dv
 * updated, o_h = rms_norm(q^T S) * silu(z_h) -> o [n][nv dv]. y [n][C] from dr_cuda_gdn_conv,
 * z [n][z_ld], a and b [n][ab_ld]. one_session = 1: every row belongs to one session, in
 * position order (a prefill); 0: every row is its own session. */
drama_status dr_cuda_gdn_recur(dr_cuda *c, const dr_cuda_gdn_shape *s, int64_t n, int one_session, const float *y,
                               const float *z, int64_t z_ld, const float *a, const float *b, int64_t ab_ld,
                               float *const *state, const int32_t *skip, float *o, drama_error *err);

/* ---- the MoE layer (moe.cu) ---- */

typedef struct dr_cuda_moe dr_cuda_moe;
/* The device tables of one layer: slot[E] (host: the slot of each original id, -1 pruned), the
 * experts of each slot (fused: gate_up[slot] holds gate rows then up rows, gate/up NULL), the
 * router, the shared expert and its [1, H] gate. Weights stay owned by the caller. */
typedef struct dr_cuda_moe_desc {
    int E, topk, norm_topk, n_kept;
    int64_t H, I, Is;
    const int *slot;                        /* host [E] */
    const dr_cuda_weight *const *gate, *const *up, *const *gate_up, *const *down; /* host arrays [n_kept] */
    int fused;
    const dr_cuda_weight *router, *sh_gate, *sh_up, *sh_down, *sh_gate_proj;
} dr_cuda_moe_desc;
drama_status dr_cuda_moe_create(dr_cuda *c, const dr_cuda_moe_desc *d, dr_cuda_moe **out, drama_error *err);
void dr_cuda_moe_free(dr_cuda_moe *m);
size_t dr_cuda_moe_ws_bytes(const dr_cuda_moe *m, int64_t n);
/* out [n][H] (+)= MoE(x) for normed rows x [n][H] (add = 1: the residual add, out += y, as the CPU's
 * x[j] += mix[j]): router product, softmax/top-k on the device (pruned and non-finite scores
 * excluded, ties to the lower id; no finite score: DR_CUDA_ERR_ROUTER with `layer`), the selected
 * experts' gate/up/SwiGLU in one launch, down + routing weights + sigmoid-gated shared expert in
 * one more. The selected ids and weights of the last call are at dr_cuda_moe_last_route. */
drama_status dr_cuda_moe_run(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, int add,
                             void *ws, size_t ws_bytes, int layer, dr_cuda_status *st, drama_error *err);
/* Calls of at least DR_CUDA_MOE_GROUP_MIN_N rows (a prefill) run the experts grouped by expert
 * (moe_prefill.cu: each used expert read once for all its rows), with values equal to the per-row
 * path's bit for bit; the set call changes the threshold of one layer (the contract forces both
 * paths). The workspace size depends on it: set it before dr_cuda_moe_ws_bytes. */
#define DR_CUDA_MOE_GROUP_MIN_N 8
void dr_cuda_moe_set_group_min(dr_cuda_moe *m, int64_t min_rows);
/* Device pointers into ws after a run: ids [n][topk] (original expert ids, -1 none), weights [n][topk]. */
void dr_cuda_moe_last_route(const dr_cuda_moe *m, int64_t n, void *ws, int32_t **ids, float **weights);

/* act [n][F] = silu(x W_gate^T) * (x W_up^T) for n rows x [n][cols] in one launch (the tower's
 * feed-forward w1/w3): each output's two dot products are dr_cuda_matmul's bit for bit. */
drama_status dr_cuda_swiglu_matmul(dr_cuda *c, const dr_cuda_weight *gate, const dr_cuda_weight *up, const float *x,
                                   int64_t n, float *act, drama_error *err);

/* ---- sampling (sample.cu) ---- */

/* The seam's lane ops (backend.h), device memory throughout. Semantic draw of n lanes from
 * lanes[i].logits at f = g->draw (then g->draw + 1), with the repetition-aware redraw; the end token
 * sets io.ended[i]; a frame's code goes to io.codes[i][0] and joins the window; a failed draw fills
 * io.status[i] as dr_sample_semantic_st does. The CPU's draw bit for bit given the same logits. */
drama_status dr_cuda_sample_semantic(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int n_cand, dr_step_io io,
                                     drama_error *err);
/* Acoustic draw of codebook j (1..14) of every lane that has not ended or failed, from logits
 * [n][hv], at f = g->draw - 1, into io.codes[i][j] (0 for the others). */
drama_status dr_cuda_sample_acoustic(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int codebook,
                                     const float *logits, int hv, dr_step_io io, drama_error *err);
/* lanes[i].logits = guided ? cond + gamma (cond - uncond) : cond (dr_cpu_op_guidance). */
drama_status dr_cuda_lanes_guidance(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int n_cand, drama_error *err);

/* One draw of the general sampler (dr_sample) for n logit vectors [n][ld] of n_cand candidates with
 * uniforms u [n] (host-visible through the contract): out [n]. Exposed for the contract, which
 * compares it with the CPU's dr_sample. rule bit 0: 0 = keep crossing, 1 = drop crossing; bit 1 (2):
 * the sequential sums only (no parallel decision), for the contract's check of that path. */
drama_status dr_cuda_sample_raw(dr_cuda *c, const float *logits, int64_t ld, int n_cand, int64_t n, float temperature,
                                float top_p, int top_k, int rule, const double *u, int32_t *out, dr_cuda_status *st,
                                drama_error *err);

#ifdef __cplusplus
}
#endif

#endif
