/* ops.h - the coarse CPU operations the backbone calls besides matmul (MODEL.md 5):
 * norms, RoPE, one attention query, one DeltaNet recurrence step, the causal conv step, softmax.
 * All activations fp32; reductions whose length is a model dimension accumulate in double so the
 * result does not depend on how the caller splits work. No op allocates; none uses threads (the
 * caller splits work by head or channel through base/pool.h). */
#ifndef DRAMA_BACKEND_CPU_OPS_H
#define DRAMA_BACKEND_CPU_OPS_H

#include <math.h>
#include <stdint.h>

static inline float dr_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float dr_siluf(float x) { return x / (1.0f + expf(-x)); }
/* softplus as torch computes it (threshold 20: linear above). */
static inline float dr_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* y = x * r * w with r = 1/sqrt(mean(x^2) + eps). `w` already holds (offset + stored weight);
 * w == NULL means 1. In place allowed (y == x). eps is double so a config's double epsilon (the
 * tower's) is used as given; float callers' values convert exactly. */
void dr_op_rms_norm(const float *x, const float *w, double eps, int64_t n, float *y);

/* x *= 1/sqrt(sum(x^2) + eps) * scale (DeltaNet q/k normalisation). */
void dr_op_l2norm(float *x, int64_t n, float eps, float scale);

/* RoPE tables for one position: cos/sin[i] of pos * inv_freq[i], i < half. */
void dr_op_rope_cos_sin(const float *inv_freq, int half, int64_t pos, float *cos_out, float *sin_out);
/* Rotate-half pairing inside the first 2*half dims: (x[i], x[i+half]) for i < half. */
void dr_op_rope_half(float *x, int half, const float *cos_v, const float *sin_v);
/* Interleaved pairing: (x[2i], x[2i+1]) for i < half. */
void dr_op_rope_interleaved(float *x, int half, const float *cos_v, const float *sin_v);

/* In-place softmax over n values (fp32 result; max-subtracted, sum in double). -inf entries give 0. */
void dr_op_softmax(float *x, int64_t n);

/* The k largest of p[n] in descending order, ties to the lower index; entries < 0 are never chosen
 * (ids[r] = -1 when fewer than k are eligible). */
void dr_op_topk(const float *p, int n, int k, int *ids);

/* One query against positions 0..n_pos-1 of a KV cache (row t of the cache at t*stride):
 * out[hd] = sum_t softmax_t(q . k_t * scale) v_t. scratch holds n_pos floats. */
void dr_op_attend(const float *q, const float *k_cache, const float *v_cache, int64_t n_pos, int64_t stride,
                  int hd, float scale, float *scratch, float *out);

/* As dr_op_attend with float64 accumulation (the tower's attention): scores are double dot
 * products times scale rounded to fp32, weights fp32(exp(s - max)) in double, out = fp32(sum_t w_t
 * v_t / sum_t w_t) with both sums in double. scratch holds n_pos floats. */
void dr_op_attend_f64(const float *q, const float *k_cache, const float *v_cache, int64_t n_pos, int64_t stride,
                      int hd, double scale, float *scratch, float *out);

/* Causal depthwise conv step for channels [c0, c1): window holds the previous K-1 inputs
 * ([K-1][C], oldest first), u the new input [C]; y[c] = bias[c] + sum_j w[c*K+j] * x_j with
 * x_0..x_{K-2} = window, x_{K-1} = u. The window is shifted to include u. bias may be NULL. */
void dr_op_conv_step(float *window, const float *u, const float *w, const float *bias, int K, int64_t C,
                     int64_t c0, int64_t c1, float *y);

/* Gated DeltaNet recurrence for one value head (MODEL.md 5.4), state S [dk][dv] fp32:
 *   S = exp(g) S;  m = k^T S;  S += k outer ((v - m) * beta);  o = q^T S.
 * q is already l2-normalised and scaled; mem is scratch of dv floats. */
void dr_op_gdn_step(float *S, const float *q, const float *k, const float *v, float g, float beta, int dk, int dv,
                    float *mem, float *o);

/* The same rule over L <= 256 consecutive rows in the chunked (WY) form (gdn_chunk.c): row t reads
 * q, k at t * ld_qk, v at t * ld_v, g (log decay) and beta at t * ld_gate, writes o at t * ld_o; S
 * becomes the state after the last row. Equals L dr_op_gdn_step calls up to fp32 rounding, not bit
 * for bit; the same bits on the AVX2 and the portable path (portable = 1 forces the latter).
 * scratch: dr_op_gdn_chunk_scratch(L, dk, dv) floats. The prefill uses it for complete,
 * position-aligned blocks of DR_GDN_CHUNK rows (the grid every prefill cut follows). */
#ifndef DR_GDN_CHUNK_ROWS
/* 16: the chunked form as fast as at 64, the shortest prefill tick (one block) 2.8x shorter at
 * full width (bench/RESULTS.md, "The DeltaNet block"). A build constant, never load-dependent (results depend
 * on it): -DDR_GDN_CHUNK_ROWS=N only to measure another grid. */
#define DR_GDN_CHUNK_ROWS 16
#endif
enum { DR_GDN_CHUNK = DR_GDN_CHUNK_ROWS };
int64_t dr_op_gdn_chunk_scratch(int L, int dk, int dv);
void dr_op_gdn_chunk(float *S, const float *q, const float *k, int64_t ld_qk, const float *v, int64_t ld_v,
                     const float *g, const float *beta, int64_t ld_gate, int L, int dk, int dv, float *scratch,
                     float *o, int64_t ld_o, int portable);
/* with a defect planted in its substitution loop: only for `drama contract`'s control */
void dr_op_gdn_chunk_planted(float *S, const float *q, const float *k, int64_t ld_qk, const float *v, int64_t ld_v,
                             const float *g, const float *beta, int64_t ld_gate, int L, int dk, int dv,
                             float *scratch, float *o, int64_t ld_o, int portable);

/* ---- model-level element-wise steps (MODEL.md 5.3-5.5, TOWER-H1.md, TEXT.md 5) ---- */

/* In place: x = silu(x) = x / (1 + expf(-x)) (DeltaNet conv output). */
void dr_op_silu(float *x, int64_t n);

/* SwiGLU product y = silu(gate) * up (MoE experts, shared expert, tower FFN). y may be gate. */
void dr_op_swiglu(const float *gate, const float *up, int64_t n, float *y);

/* In place: x *= sigmoid(gate) (gated attention output). */
void dr_op_sigmoid_mul(float *x, const float *gate, int64_t n);

/* In place: x = rms_norm(x, w, eps) * silu(z) (DeltaNet output norm; w is the plain weight). */
void dr_op_gated_rms_norm(float *x, const float *w, const float *z, float eps, int64_t n);

/* DeltaNet gates of n value heads, in place: a -> g = neg_A * softplus(a + dt_bias) (log decay,
 * neg_A = -exp(A_log) from the loader), b -> beta = sigmoid(b). */
void dr_op_gdn_gates(float *a, float *b, const float *neg_A, const float *dt_bias, int64_t n);

/* MoE routing of one row over E experts: probs = softmax of the finite scores (non-finite ones,
 * pruned experts included as -inf, are excluded and get probs = -1); ids = top-k of probs (ties to
 * the lower id, -1 when fewer than k are eligible); weights = probs[ids] renormalised over the
 * chosen k in double when norm_topk, else probs[ids]; 0 for an id of -1. Returns the number of
 * eligible experts (0: nothing was chosen; the caller reports it). */
int dr_op_moe_route(const float *scores, int E, int k, int norm_topk, float *probs, int *ids, float *weights);

/* MoE output of one row: out = sum_r w[r] * ys[r] (rank order, fp32; ys[r] NULL skips the rank)
 * + sigmoid(shared_gate) * y_shared (y_shared may be NULL). */
void dr_op_moe_combine(const float *const *ys, const float *w, int k, const float *y_shared, float shared_gate,
                       int64_t H, float *out);

/* Classifier-free guidance: out = c + gamma * (c - u); an excluded (-inf) cond logit stays -inf. */
void dr_op_guidance(const float *cond, const float *uncond, int64_t n, float gamma, float *out);

/* Tempered sampling weights: q[r] = exp((x[r] - x_max) / temperature) (fp32 terms, widened), exp
 * being dr_expf_det (num/expf_det.h: the same bits on the host and the CUDA device). */
void dr_op_exp_weights(const float *x, int64_t n, float x_max, float temperature, double *q);

/* Nucleus cut over weights q[0..m) in descending rank order (finite, >= 0, not normalised): the
 * count kept. keep_crossing: the shortest prefix whose mass reaches top_p; otherwise the longest
 * prefix whose mass does not exceed top_p (at least 1). Masses in double. */
int dr_op_top_p_count(const double *q, int m, double top_p, int keep_crossing);

#endif
