/* tower.h - the codebook tower ("codebook MTP"), hypothesis H1 (MODEL.md 7,
 * ../shared/golden/TOWER-H1.md).
 *
 * 13 layers (shared_enrichment_layers shared + num_codebooks-1 per-codebook), each
 *   out_norm(Block(eh_proj([enorm(mask * E[code + k*V]); hnorm(h_in)])))
 * with its own causal KV cache over the whole sequence, partial RoPE, and 9 heads of which the
 * first head_vocab logits are used. Every uncertain choice is a switch of model/config.h and is
 * read into dr_tower_dims; nothing here is a literal of the golden shapes.
 *
 * Weights stay in their stored format (dr_weight into the mapped checkpoint); only the norm
 * vectors are copied to fp32 at bind. A dr_tower is immutable after bind and shared by every
 * session; per-request state lives in a dr_tower_cache in backend memory. The math is written
 * once over the backend seam (backend/backend.h): dr_tower_chain is what a frame step runs;
 * dr_tower_forward / dr_tower_generate_many are host calls over the same layers.
 */
#ifndef DRAMA_MODEL_TOWER_H
#define DRAMA_MODEL_TOWER_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/error.h"
#include "base/pool.h"
#include "base/tensor.h"
#include "model/config.h"
#include "model/loader.h"
#include "num/weight.h"

/* Everything the tower math needs, from config + switches (or set directly by a benchmark). */
typedef struct dr_tower_dims {
    int dim;               /* D, width of every layer's output */
    int n_head, n_kv_head, head_dim;
    int64_t ffn;           /* F (informational; read from w1's shape) */
    double eps;            /* norm_eps */
    int num_codebooks;     /* NC: a frame has NC codes, the tower predicts codes 1..NC-1 */
    int n_shared;          /* shared_enrichment_layers */
    int64_t code_stride;   /* V, switch tower.code_stride */
    int head_vocab;        /* switch tower.head_vocab */
    int head_vocab_auto;   /* the switch was not set: heads with fewer rows lower head_vocab to them */
    int rope_dims;         /* switch tower.rope_dims (resolved) */
    double rope_base;
    int rope_half;         /* switch tower.rope_pairing: 0 interleaved (x[2i], x[2i+1]), 1 half */
    int rope_freq_head_dim;/* switch tower.rope_freq_dims: 0 exponent -2i/rope_dims, 1 -2i/head_dim */
    double norm_offset;    /* switch tower.norm_offset: rms(x) * (w + offset) */
    int concat_hidden_first; /* switch tower.concat_order */
    int shared_code_none;  /* switch tower.shared_code: 1 = shared layers run with mask 0 */
    int qk_norm;           /* switch tower.qk_norm */
    int prefill_same_row;  /* switch tower.prefill_codes (used by the frame loop) */
    int input_pre_norm;    /* switch tower.input (used by the frame loop) */
    const char *code_table;/* switch tower.code_table: tensor name */
} dr_tower_dims;

/* Fill dims from a loaded config (audio sub-config + tower.* switches). */
drama_status dr_tower_dims_from_config(const dr_config *cfg, dr_tower_dims *d, drama_error *err);

typedef struct dr_tower_layer {
    char prefix[64];       /* "audio_decoder_mtp_shared.layers.0." */
    int de, dh;            /* widths of the embedding and hidden inputs (from enorm / hnorm) */
    float *enorm, *hnorm, *attention_norm, *ffn_norm, *out_norm; /* fp32 copies, offset added */
    float *q_norm, *k_norm;  /* [head_dim] when qk_norm, else NULL */
    dr_weight eh_proj, wqkv, wo, w1, w2, w3;
} dr_tower_layer;

typedef struct dr_tower {
    dr_tower_dims d;
    int n_layers;          /* n_shared + num_codebooks - 1 */
    int n_heads_out;       /* num_codebooks - 1 */
    int64_t ffn;
    int input_dim;         /* width of the tower input h (hnorm of layer 0) */
    dr_tower_layer *layers;
    dr_weight code_table;  /* [NC * V (or more), De] */
    dr_weight *heads;      /* [n_heads_out], each [>= head_vocab, D] */
    float *rope_freq;      /* [rope_dims / 2] */
} dr_tower;

/* Tensor lookup used by bind: a checkpoint, or an in-memory table (benchmarks, tests). */
typedef const dr_tensor *(*dr_tower_find_fn)(void *ctx, const char *name);

/* Bind every tower tensor; shapes checked against dims, errors name the tensor and both shapes. */
drama_status dr_tower_bind(dr_tower *t, const dr_tower_dims *d, dr_tower_find_fn find, void *ctx,
                           drama_error *err);
/* The same, recording every problem as a finding (missing / mis-shaped / unsupported, MODEL.md
 * 4.5) instead of stopping at the first; fails at the end (ESHAPE, the first problem's message,
 * prefixed with the count) when there was any. Use with dr_loader_find and dr_loader_findings. */
drama_status dr_tower_bind_findings(dr_tower *t, const dr_tower_dims *d, dr_tower_find_fn find, void *ctx,
                                    dr_findings *findings, drama_error *err);
void dr_tower_release(dr_tower *t); /* frees the fp32 norm copies and arrays; t itself is the caller's */

/* Per-request KV caches of all layers, positions 0..len-1, in backend memory (one block; the ops
 * read it through seq and advance seq->pos; len and cap are the host's copies). Grows as needed,
 * between calls. */
typedef struct dr_tower_cache {
    dr_backend *be;        /* NULL: CPU memory, host calls run with the pool they pass */
    int n_layers, kv_dim;  /* kv_dim = n_kv_head * head_dim */
    int64_t len, cap;
    float *kv;             /* [n_layers][2][cap][kv_dim] */
    dr_seq *seq;           /* the ops' view */
} dr_tower_cache;

drama_status dr_tower_cache_create_on(dr_backend *be, const dr_tower *t, int64_t reserve, dr_tower_cache **out,
                                      drama_error *err);
drama_status dr_tower_cache_create(const dr_tower *t, int64_t reserve, dr_tower_cache **out, drama_error *err);
void dr_tower_cache_free(dr_tower_cache *c);
/* Capacity for `positions` positions (keeps the contents). */
drama_status dr_tower_cache_reserve(dr_tower_cache *c, int64_t positions, drama_error *err);
void dr_tower_cache_reset(dr_tower_cache *c);                          /* len = 0 */
drama_status dr_tower_cache_truncate(dr_tower_cache *c, int64_t len);  /* keep positions < len */
drama_status dr_tower_cache_copy(const dr_tower_cache *src, dr_tower_cache *dst, drama_error *err);
dr_backend *dr_tower_cache_backend(const dr_tower_cache *c);

/* Activations of tower calls of up to `rows` rows (backend memory, reused across calls). */
typedef struct dr_tower_ws {
    dr_backend *be;
    int64_t rows;
    float *e, *x, *u, *a, *qkv, *o, *tmp, *g1, *g3, *heads, *ga, *gb, *h;
    int32_t *codes;        /* [rows][NC] codes uploaded by host calls */
    uint8_t *mask;         /* [rows] */
    dr_seq_row *seq;       /* [rows] */
    dr_op_status *status;  /* [rows] */
} dr_tower_ws;
drama_status dr_tower_ws_create(dr_backend *be, const dr_tower *t, int64_t rows, dr_tower_ws **out, drama_error *err);
void dr_tower_ws_free(dr_tower_ws *ws);

/* Generation for n rows in backend memory, issuing ops only: row r at seq[r] (its tower cache
 * and position), input h [n][input_dim], codes of row r at codes[r*codes_ld + j] with c0 given;
 * after head `slot` (predicting code slot+1) pick(ctx, slot, logits [n][head_vocab]) must write
 * code slot+1 of every row. status [n] gets failures (code outside the table). Advances every
 * row that does not hold by one position (host copies: the caller's). */
typedef void (*dr_tower_chain_pick)(void *ctx, int slot, const float *logits);
void dr_tower_chain(dr_backend *be, const dr_tower *t, dr_tower_ws *ws, const dr_seq_row *seq, int64_t n,
                    const float *h, int32_t *codes, int64_t codes_ld, dr_op_status *status, dr_tower_chain_pick pick,
                    void *ctx);

/* The message of a tower failure (status of a tower call). */
drama_status dr_tower_status_fail(const dr_tower *t, const dr_op_status *s, drama_error *err);

/* Teacher-forced pass over n rows at positions cache->len .. cache->len+n-1 (all layers).
 * h [n][input_dim], codes [n][NC] (row r: the codes paired with tower row r), mask [n] (0/1).
 * Optional outputs: layer_out [n_layers][n][D], logits [n][NC-1][head_vocab]. */
drama_status dr_tower_forward(const dr_tower *t, dr_tower_cache *c, int n, const float *h, const int32_t *codes,
                              const uint8_t *mask, float *layer_out, float *logits, dr_pool *pool,
                              drama_error *err);

/* The same with the input hidden h_dev [n][input_dim] in backend memory of the cache's backend,
 * through ws (may be NULL: made for the call), without layer outputs (the frame loop's prefill). */
drama_status dr_tower_prefill(const dr_tower *t, dr_tower_ws *ws, dr_tower_cache *c, int n, const float *h_dev,
                              const int32_t *codes, const uint8_t *mask, float *logits, dr_pool *pool,
                              drama_error *err);

/* Chooses code j (1..NC-1) from the head logits [n] (n = head_vocab). */
typedef drama_status (*dr_tower_pick_fn)(void *ctx, int codebook, const float *logits, int n, int *code,
                                         drama_error *err);

/* Generation at position cache->len: h [input_dim], c0 given, mask 1; codes[1..NC-1] chosen one
 * after another by pick. codes[0] = c0 on return. head_logits [NC-1][head_vocab] optional. */
drama_status dr_tower_generate(const dr_tower *t, dr_tower_cache *c, const float *h, int32_t c0,
                               dr_tower_pick_fn pick, void *pick_ctx, int32_t *codes, float *head_logits,
                               dr_pool *pool, drama_error *err);

/* Generation for n sessions at once: row r at position caches[r]->len (caches distinct), input
 * h [n][input_dim], semantic code c0[r]. Every product streams the weights once for all rows; a
 * row's codes equal generating it alone. pick is called per row and codebook. Per-row failures
 * (non-finite input, a failing pick) go to row_status[r] / row_errs[r] (may be NULL) and leave
 * the other rows running; the return value is for failures of the whole call. codes [n][NC],
 * head_logits [n][NC-1][head_vocab] (optional). */
typedef drama_status (*dr_tower_pick_many_fn)(void *ctx, int row, int codebook, const float *logits, int n,
                                              int *code, drama_error *err);
drama_status dr_tower_generate_many(const dr_tower *t, dr_tower_cache *const *caches, int n, const float *h,
                                    const int32_t *c0, dr_tower_pick_many_fn pick, void *pick_ctx, int32_t *codes,
                                    float *head_logits, drama_status *row_status, drama_error *row_errs,
                                    dr_pool *pool, drama_error *err);

#endif
