/* codec.h - the ModifiedDAC audio codec (../shared/spec/CODEC.md): configuration (codec.json),
 * loading (codec.pth or codec.safetensors), the expected tensor inventory, a streaming decoder
 * (codes -> 44.1 kHz samples, bit-identical for any chunking) and the encoder (samples -> codes).
 *
 * Codes are int32, frame-major: codes[f * num_codebooks + k] (k = 0 semantic, 1.. residual), the
 * layout of CODES.json. Everything runs in fp32 on the CPU; threads come from a dr_pool given to
 * dr_codec_set_pool (NULL = inline); results do not depend on the thread count. */
#ifndef DRAMA_CODEC_CODEC_H
#define DRAMA_CODEC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/pool.h"
#include "base/tensor.h"

#define DR_CODEC_MAX_RATES 8
#define DR_CODEC_MAX_BOOKS 32

/* One windowed causal transformer (CODEC.md 3.7). */
typedef struct dr_codec_tf_config {
    int n_layer, dim, intermediate_size; /* shape-derived */
    int n_head, n_local_heads, head_dim;
    int window_size;
    double rope_base, norm_eps;
    int layer_scale;                     /* must be 1 */
    int rope_bf16;                       /* rope_cos_sin_dtype "bfloat16" (1) or "float32" (0) */
} dr_codec_tf_config;

typedef struct dr_codec_config {
    int sample_rate, causal;
    int encoder_dim, latent_dim, decoder_dim;           /* shape-derived */
    int n_encoder_rates, encoder_rates[DR_CODEC_MAX_RATES];
    int n_decoder_rates, decoder_rates[DR_CODEC_MAX_RATES];
    int hop_length, frame_length;
    int ru_kernel, n_dilations, dilations[DR_CODEC_MAX_RATES];
    double snake_eps;
    dr_codec_tf_config enc_tf;                          /* at "encoder.block.<enc_tf_block>.block.5" */
    int enc_tf_block;                                   /* must be the last block (n_encoder_rates) */
    int q_input_dim;                                    /* shape-derived */
    int n_down, down_factor[DR_CODEC_MAX_RATES], down_kernel;
    int cnx_kernel, cnx_mlp_ratio;
    double cnx_ln_eps;
    int semantic_codebook_size, n_codebooks, codebook_size, codebook_dim; /* shape-derived */
    dr_codec_tf_config pre, post;
    int num_codebooks;                                  /* 1 + n_codebooks */
    int upper_clamp[DR_CODEC_MAX_BOOKS];
    /* Which shape-derived values codec.json stated (they must then agree with the tensors);
     * internal bookkeeping, ignored by dr_codec_config_equal. */
    uint64_t stated;
} dr_codec_config;

/* The built-in defaults: the real codec (equal to golden codec/codec-real.json). */
void dr_codec_config_default(dr_codec_config *c);
/* Apply a codec.json (CODEC.md 9) on top of *c: unknown keys, wrong types and unsupported values
 * are errors naming the JSON path. */
drama_status dr_codec_config_parse(const char *json_text, size_t len, const char *label, dr_codec_config *c,
                                   drama_error *err);
drama_status dr_codec_config_read(const char *path, dr_codec_config *c, drama_error *err);
/* Internal consistency (hop = product of rates, frame = hop * product of factors, ...). */
drama_status dr_codec_config_validate(const dr_codec_config *c, drama_error *err);
int dr_codec_config_equal(const dr_codec_config *a, const dr_codec_config *b);

/* The tensors a codec of this configuration has, in the canonical stored spelling (convs with
 * parametrizations.weight.original0/1, VQ projections with weight_g/weight_v, CODEC.md 4).
 * cb is called once per tensor (all F32). */
typedef void (*dr_codec_tensor_cb)(void *ctx, const char *name, int ndim, const int64_t *shape);
drama_status dr_codec_expected(const dr_codec_config *c, dr_codec_tensor_cb cb, void *ctx, drama_error *err);

typedef struct dr_codec dr_codec;

enum { DR_CODEC_LOAD_DECODER = 1, DR_CODEC_LOAD_ENCODER = 2, DR_CODEC_LOAD_ALL = 3 };

/* Load from a directory: codec.pth (preferred) or codec.safetensors, plus codec.json if present. */
drama_status dr_codec_open(const char *dir, unsigned parts, dr_codec **out, drama_error *err);
/* The weights file dr_codec_open(dir) reads (path into buf). Its SHA-256 (base/sha256.h) is the
 * codec fingerprint that keys cached reference encodings (CODEC.md 7). */
drama_status dr_codec_file(const char *dir, char *buf, size_t buflen, drama_error *err);
/* Load from named tensors (any source; names as stored, "generator." stripped, stale buffers
 * ignored). cfg: defaults + codec.json; shape-derived values are filled from the tensors.
 * Every missing, unexpected, mis-shaped or incomplete tensor is named in the error (up to a
 * message's length). Weight norm is folded here; the tensors need not outlive the codec.
 * parts = 0 only checks the tensors (nothing copied): a check for `drama inspect`. */
drama_status dr_codec_load(const dr_tensor *tensors, int64_t n, const dr_codec_config *cfg, unsigned parts,
                           const char *label, dr_codec **out, drama_error *err);
void dr_codec_free(dr_codec *c);
const dr_codec_config *dr_codec_cfg(const dr_codec *c);
void dr_codec_set_pool(dr_codec *c, dr_pool *pool);
/* Floating-point operations of one frame (encode 0: decode, 1: encode), counted from the layers
 * (codec/flops.c states what counts); for `drama bench codec`. */
double dr_codec_flops_per_frame(const dr_codec *c, int encode);
/* The conv kernels' instruction set: "portable", "avx2" or "avx512" (DRAMA_CODEC_ISA picks a narrower one). */
const char *dr_codec_isa(const dr_codec *c);

/* Range check for codes that come from outside (files, voices, requests): every code in
 * 0 .. codebook size - 1, else DRAMA_EINVAL naming frame and codebook (CODEC.md 2). */
drama_status dr_codec_check_codes(const dr_codec_config *c, const int32_t *codes, int64_t n_frames,
                                  const char *label, drama_error *err);

/* Diagnostic taps: called with named intermediates ("z_q", "z_post", "z_up"; encode: "z_enc",
 * "z_down", "z_pre"), [channels][time] of this call's time steps only. */
typedef void (*dr_codec_tap_fn)(void *ctx, const char *name, const float *x, int channels, int64_t steps);

/* ---- streaming decoder (CODEC.md 6) ---- */
typedef struct dr_codec_stream dr_codec_stream;
drama_status dr_codec_stream_create(const dr_codec *c, dr_codec_stream **out, drama_error *err);
void dr_codec_stream_free(dr_codec_stream *s);
void dr_codec_stream_reset(dr_codec_stream *s);
void dr_codec_stream_set_tap(dr_codec_stream *s, dr_codec_tap_fn fn, void *ctx);
/* Threads for this stream (overrides the codec's pool; a dr_pool is not reentrant, so streams fed
 * concurrently from different threads need their own pools or none). */
void dr_codec_stream_set_pool(dr_codec_stream *s, dr_pool *pool);
/* Decode n_frames frames (negative code: error; above the clamp: clamped) into
 * out[n_frames * frame_length]. Any chunking of a stream gives bit-identical samples.
 * Codes are checked before anything runs; after any other failure the stream is reset. */
drama_status dr_codec_stream_feed(dr_codec_stream *s, const int32_t *codes, int64_t n_frames, float *out,
                                  drama_error *err);
int64_t dr_codec_stream_frames(const dr_codec_stream *s); /* frames fed so far */
/* Wall seconds per decoder stage, added to seconds[DR_CODEC_N_STAGES] by every feed (NULL: off;
 * `drama bench codec`): 0 post_module, 1 upsample, 2 decoder input conv, 3 + 2b / 4 + 2b block b's
 * upsampling / residual units, last the output conv. dr_codec_stage_name writes a stage's name. */
#define DR_CODEC_N_STAGES (4 + 2 * DR_CODEC_MAX_RATES)
void dr_codec_stream_set_profile(dr_codec_stream *s, double *seconds);
const char *dr_codec_stage_name(int stage, char *buf, size_t len);
double dr_codec_stage_flops_per_frame(const dr_codec *c, int stage); /* decode FLOPs of one stage */

/* ---- a device decoder (src/backend/cuda/cuda_codec.h attaches one) ----
 * Streams created while one is attached decode on it: same codes checks, same chunking rule
 * (any chunking bit-identical within the device), no taps. The codec owns ctx from then on. */
typedef struct dr_codec_accel {
    const char *name; /* "cuda" */
    void *ctx;
    drama_status (*stream_create)(void *ctx, void **st, drama_error *err);
    void (*stream_free)(void *ctx, void *st);
    void (*stream_reset)(void *ctx, void *st);
    /* n_frames <= 16 frames of non-negative codes (clamped here as the CPU path clamps) -> out[n_frames * frame_length] */
    drama_status (*feed)(void *ctx, void *st, const int32_t *codes, int64_t n_frames, float *out, drama_error *err);
    void (*free)(void *ctx);
} dr_codec_accel;
/* Attach a (NULL: detach) device decoder; the previous one is freed. No stream may be alive. */
void dr_codec_set_accel(dr_codec *c, const dr_codec_accel *a);
const char *dr_codec_decoder_name(const dr_codec *c); /* "cpu" or the device decoder's name */

/* Whole decode: a fresh stream fed everything. */
drama_status dr_codec_decode(const dr_codec *c, const int32_t *codes, int64_t n_frames, float *out,
                             drama_error *err);

/* ---- encoder ---- */
/* Mono 44.1 kHz samples -> ceil(n / frame_length) frames (the last one zero-padded) into a
 * malloc'd array *codes (free()); taps as above (may be NULL). */
drama_status dr_codec_encode(const dr_codec *c, const float *samples, int64_t n, int32_t **codes,
                             int64_t *n_frames, dr_codec_tap_fn tap, void *tap_ctx, drama_error *err);
/* The same, adding wall seconds per encoder stage to seconds[DR_CODEC_N_ENC_STAGES] (NULL: off;
 * `drama bench codec`): 0 input conv, 1 + 2b / 2 + 2b block b's residual units / Snake and
 * downsampling conv, then the encoder transformer, Snake + output conv, downsample + ConvNeXt,
 * pre_module, quantizer. dr_codec_enc_stage_name writes a stage's name. */
#define DR_CODEC_N_ENC_STAGES (6 + 2 * DR_CODEC_MAX_RATES)
drama_status dr_codec_encode_ex(const dr_codec *c, const float *samples, int64_t n, int32_t **codes,
                                int64_t *n_frames, dr_codec_tap_fn tap, void *tap_ctx, double *seconds,
                                drama_error *err);
const char *dr_codec_enc_stage_name(int stage, char *buf, size_t len);
double dr_codec_enc_stage_flops_per_frame(const dr_codec *c, int stage); /* encode FLOPs of one stage */

#endif
