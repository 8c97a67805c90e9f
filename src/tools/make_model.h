/* make_model.h - `drama make-model`: write a random-weight checkpoint in the real Drama 3 layout.
 *
 * Output directory: config.json (the real schema), model-NNNNN-of-MMMMM.safetensors +
 * model.safetensors.index.json (total_size; drama_experts when pruned), tokenizer.json (byte-level
 * BPE: 256 byte tokens, a few merges, the special, semantic and speaker tokens),
 * tokenizer_config.json, codec.safetensors + codec.json.
 *
 * Values come from a counter-based generator keyed by (seed, tensor name, element index), so a
 * tensor's values do not depend on shard layout, expert layout or write order, and the same seed
 * gives byte-identical files (for any thread count). Tensors are generated in bounded pieces by
 * a thread pool and streamed through dr_st_writer_*: memory stays bounded at full shape (one
 * 1 Mi-value piece plus one expert matrix per worker; 119 MB peak with 16 threads).
 * Quantised experts are encoded with num/quant.h from the BF16-rounded values, so they equal
 * `drama optimize` of the BF16 model with the same seed.
 */
#ifndef DRAMA_TOOLS_MAKE_MODEL_H
#define DRAMA_TOOLS_MAKE_MODEL_H

#include <stdint.h>

#include "base/error.h"

typedef enum dr_mm_format { DR_MM_BF16 = 0, DR_MM_FP8, DR_MM_NVFP4, DR_MM_Q4 } dr_mm_format;
typedef enum dr_mm_layout { DR_MM_PER_EXPERT = 0, DR_MM_FUSED } dr_mm_layout;
/* Routed experts' values: encodings of the BF16 source matrices (default), or random stored codes
 * written directly (valid codes, scales bounded so |w| <= the source amplitude): no encoder runs,
 * so a full-shape quantised model takes seconds; for benchmarks and backend parity only. */
typedef enum dr_mm_expert_fill { DR_MM_FILL_ENCODE = 0, DR_MM_FILL_DIRECT } dr_mm_expert_fill;

/* One windowed transformer of the codec (CODEC.md 3.7). dim is the width it runs at. */
typedef struct dr_mm_codec_tf {
    int n_layer, n_head, head_dim, intermediate, window;
} dr_mm_codec_tf;

#define DR_MM_MAX_RATES 8

/* Codec hyper-parameters (CODEC.md 4 and 9). Tensor shapes follow from them. */
typedef struct dr_mm_codec {
    int encoder_dim, latent_dim, decoder_dim;
    int n_enc_rates, enc_rates[DR_MM_MAX_RATES];
    int n_dec_rates, dec_rates[DR_MM_MAX_RATES];
    int n_down, down_factor[DR_MM_MAX_RATES]; /* quantizer downsample factors */
    int ru_kernel;                            /* residual unit kernel (7) */
    int convnext_kernel, convnext_ratio;      /* 7, 4 */
    dr_mm_codec_tf enc_tf, pre, post;
    int semantic_codebook_size, n_codebooks, codebook_size, codebook_dim;
} dr_mm_codec;

/* Every dimension of the generated model. Filled from a named shape, then overridden by flags. */
typedef struct dr_mm_dims {
    /* text_config (MODEL.md 3.2) */
    int64_t vocab;              /* embedding rows; 0 = the tokenizer's size */
    int hidden, layers, full_attention_interval;
    int heads, kv_heads, head_dim;
    double rope_theta, partial_rotary;
    int lin_k_heads, lin_k_dim, lin_v_heads, lin_v_dim, conv_kernel;
    int experts, top_k;
    int64_t moe_inter, shared_inter;
    int64_t max_positions;
    /* audio_decoder_config (MODEL.md 3.3) */
    int a_dim, a_heads, a_kv_heads, a_head_dim;
    int64_t a_inter;
    int codebooks;              /* num_codebooks (10) */
    int code_vocab;             /* audio vocab_size: code-table stride and semantic token count */
    int shared_layers;          /* shared_enrichment_layers */
    double a_rotary, a_rope_base;
    int head_rows;              /* rows of each tower head (residual codebook size) */
    /* tokenizer */
    int speakers;               /* <|speaker:0..N-1|> */
    /* codec */
    dr_mm_codec codec;
} dr_mm_dims;

typedef struct dr_mm_options {
    dr_mm_dims dims;
    dr_mm_format experts;
    int q4_group;               /* 32, 64 or 128 */
    int prune_keep;             /* 0 = keep all; else experts kept per layer */
    dr_mm_layout layout;
    int shards;                 /* >= 1 */
    uint64_t seed;
    int with_codec;             /* default 1 */
    int threads;                /* worker threads for generation and encoding; 0 = physical cores */
    dr_mm_expert_fill expert_fill;
    /* Test hooks for `drama inspect`'s broken-checkpoint tests (NULL = off): leave out the named
     * tensor, add one more dimension-0 row to it, or add an extra BF16 [4] tensor of that name. */
    const char *test_omit, *test_misshape, *test_extra;
} dr_mm_options;

/* Fill opts with a named shape ("tiny", "full") and default options. 0 on unknown name. */
int dr_mm_shape_defaults(const char *shape, dr_mm_options *opts);

/* Check the dimensions and options (divisibility, ranges); the message names the field. */
drama_status dr_mm_validate(const dr_mm_options *opts, drama_error *err);

/* Write the model into `dir` (created if absent; existing generated files are replaced). Files are
 * staged in dir/.make-model.partial and moved in only when all are complete: on failure dir keeps
 * what it held before. */
drama_status dr_make_model(const char *dir, const dr_mm_options *opts, drama_error *err);

/* ---- pieces, also used by tests ---- */

/* Counter-based uniform value in [-1, 1): depends only on (seed, key, index). */
double dr_mm_uniform(uint64_t seed, uint64_t key, uint64_t index);
uint64_t dr_mm_name_key(const char *name);
/* 64 random bits that depend only on (seed, key). */
uint64_t dr_mm_key_bits(uint64_t seed, uint64_t key);

/* codec.json for these hyper-parameters (CODEC.md 9 schema). */
drama_status dr_mm_write_codec_json(const char *path, const dr_mm_codec *c, drama_error *err);
/* DIR/codec.json + DIR/codec.safetensors (F32; tensors of dr_codec_expected for that codec.json). */
drama_status dr_mm_write_codec(const char *dir, const dr_mm_codec *c, uint64_t seed, drama_error *err);
/* Writes tokenizer.json and tokenizer_config.json; *ids receives the tokenizer's size and the ids
 * of the tokens config.json names. */
typedef struct dr_mm_token_ids {
    int64_t n_tokens, endoftext, pad, im_start, im_end, audio_pad, semantic_start, semantic_end,
        speaker0;
} dr_mm_token_ids;
drama_status dr_mm_write_tokenizer(const char *dir, const dr_mm_dims *d, dr_mm_token_ids *ids,
                                   drama_error *err);
/* Ids the tokenizer will have, without writing it. */
void dr_mm_token_layout(const dr_mm_dims *d, dr_mm_token_ids *ids);

#endif
