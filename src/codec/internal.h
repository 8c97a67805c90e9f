/* internal.h - codec internals shared by its .c files (not a public header).
 * Activations are [channels][time] row-major fp32. Every stateful layer (a conv with history,
 * a transformer with its KV window) has an index into the state table of its path (decode or
 * encode), so one set of weights serves many streams. */
#ifndef DRAMA_CODEC_INTERNAL_H
#define DRAMA_CODEC_INTERNAL_H

#include <stdint.h>

#include "base/pool.h"
#include "base/receipt.h"
#include "codec/codec.h"

/* bits of dr_codec_config.stated: shape-derived keys that codec.json gave */
enum {
    DR_CS_ENCODER_DIM = 1 << 0,
    DR_CS_LATENT_DIM = 1 << 1,
    DR_CS_DECODER_DIM = 1 << 2,
    DR_CS_Q_INPUT_DIM = 1 << 3,
    DR_CS_SEM_SIZE = 1 << 4,
    DR_CS_N_CODEBOOKS = 1 << 5,
    DR_CS_CB_SIZE = 1 << 6,
    DR_CS_CB_DIM = 1 << 7,
    DR_CS_CLAMP = 1 << 8,
    DR_CS_NUM_BOOKS = 1 << 9
};
#define DR_CS_ENC_TF_SHIFT 10 /* n_layer, dim, intermediate_size: 3 bits each */
#define DR_CS_PRE_SHIFT 13
#define DR_CS_POST_SHIFT 16
#define DR_CS_CLAMP_N_SHIFT 24
#define DR_CS_CLAMP_N_MASK (0xffull << DR_CS_CLAMP_N_SHIFT)

/* encoder profile stages (dr_codec_encode_ex): 0 input conv, CD_ES_RU(b) / CD_ES_DOWN(b) block b */
#define CD_ES_RU(b) (1 + 2 * (b))
#define CD_ES_DOWN(b) (2 + 2 * (b))
enum {
    CD_ES_TF = 1 + 2 * DR_CODEC_MAX_RATES,
    CD_ES_OUT,
    CD_ES_QDOWN,
    CD_ES_PRE,
    CD_ES_VQ
};

/* the time since *t0 goes to stage `stage` of prof (the decoder's and the encoder's per-stage
 * profiles; prof NULL: off), and *t0 moves on */
static inline void cd_lap(double *prof, int stage, double *t0) {
    if (!prof) return;
    double t = dr_clock_s();
    prof[stage] += t - *t0;
    *t0 = t;
}

#define CD_WPACK 8 /* output channels per packed weight block */

/* Kernel instruction sets (kernels.h). cd_isa_best: the widest this CPU runs, or the one named by
 * DRAMA_CODEC_ISA (portable, avx2, avx512; one the CPU lacks falls back to the best it has). */
enum { CD_ISA_PORTABLE, CD_ISA_AVX2, CD_ISA_AVX512, CD_ISA_COUNT };
int cd_isa_best(void);
/* AVX2 convs blocked as a GEMM (kernels.h), unless DRAMA_CODEC_GEMM=0 asks for the earlier
 * kernel order (one contraction block, one weight block per task); either gives the same values */
int cd_gemm_default(void);
int cd_isa_supported(int isa);
const char *cd_isa_name(int isa);

typedef struct cd_conv {
    int cin, cout, k, dil, stride, groups, transposed;
    float *w;   /* packed by cd_pack_weights: [ceil(cout/8)][cin/groups][k][8] (zero-padded rows);
                 * transposed: per output phase q < stride one such stride-1 conv with
                 * ceil(k/stride) taps (cd_conv_pack); read one value with cd_weight_at */
    float *b;   /* [cout] */
    int hist;   /* history columns carried between calls (0: stateless) */
    int state;  /* index in the path's state table, -1 when hist == 0 */
    int isa;    /* CD_ISA_* kernels (cd_conv_init: cd_isa_best()) */
    int plant;  /* drama contract only: a planted defect in the SIMD loop (kernels.h), else 0 */
    int gemm;   /* AVX2 GEMM blocking (kernels.h; cd_conv_init: cd_gemm_default()) */
    int kcb, nob; /* drama contract only: forced contraction block and weight blocks per task, else 0 */
} cd_conv;

typedef struct cd_snake {
    int c;
    float *inv;   /* 1 / (alpha + eps), precomputed in fp32 as the reference does */
    float *alpha;
    int isa;      /* CD_ISA_* (cd_snake_prepare: cd_isa_best()) */
    int plant;    /* drama contract only, else 0 */
} cd_snake;

typedef struct cd_ru {
    cd_snake s1, s2;
    cd_conv c1, c2;
} cd_ru;

typedef struct cd_convnext {
    cd_conv dw, pw1, pw2; /* pw as 1x1 convs */
    float *ln_w, *ln_b, *gamma;
    double ln_eps;
} cd_convnext;

typedef struct cd_tlayer {
    cd_conv wqkv, wo, w1, w2, w3; /* 1x1 convs without bias */
    float *attn_norm, *ffn_norm, *g_attn, *g_ffn;
} cd_tlayer;

typedef struct cd_tf {
    dr_codec_tf_config cfg;
    cd_tlayer *layers;
    float *norm;
    int state; /* index of its KV window in the path's transformer-state table */
} cd_tf;

typedef struct cd_vq {
    int n, dim, cin;
    cd_conv in_proj, out_proj;
    float *codebook;  /* [n][dim] raw rows */
    float *cb_hat;    /* [n][dim] L2-normalised rows (encode) */
    float *cb_hat_sq; /* [n] squared norms of cb_hat (encode) */
    float *table;     /* [n][cin] out_proj(codebook row) incl. bias (decode) */
} cd_vq;

#define CD_MAX_RU 8
typedef struct cd_enc_block {
    cd_ru ru[CD_MAX_RU];
    cd_snake snake;
    cd_conv down;
    int has_tf;
    cd_tf tf;
} cd_enc_block;

typedef struct cd_dec_block {
    cd_snake snake;
    cd_conv up;
    cd_ru ru[CD_MAX_RU];
} cd_dec_block;

struct dr_codec {
    dr_codec_config cfg;
    unsigned parts;
    dr_pool *pool;
    /* encoder */
    cd_conv enc_in, enc_out;
    cd_enc_block enc[DR_CODEC_MAX_RATES];
    cd_snake enc_snake;
    /* quantizer */
    cd_conv down[DR_CODEC_MAX_RATES], up[DR_CODEC_MAX_RATES];
    cd_convnext down_cnx[DR_CODEC_MAX_RATES], up_cnx[DR_CODEC_MAX_RATES];
    cd_tf pre, post;
    cd_vq vq[DR_CODEC_MAX_BOOKS]; /* 0: semantic, 1..n_codebooks: residual */
    /* decoder */
    cd_conv dec_in, dec_out;
    cd_dec_block dec[DR_CODEC_MAX_RATES];
    cd_snake dec_snake;
    /* state tables: [0] decode path, [1] encode path */
    int n_conv_states[2], n_tf_states[2];
    int *conv_state_size[2]; /* floats: cin * hist */
    cd_tf **tf_of_state[2];
    dr_codec_accel accel; /* device decoder (feed NULL: none) */
    /* every buffer the codec owns */
    void **owned;
    int64_t n_owned, cap_owned;
};

/* Per-stream state of one path. */
typedef struct cd_kv {
    float *k, *v;    /* [n_layer][W-1][dim] after RoPE */
    int64_t n;       /* cached positions (<= W-1) */
    int64_t pos;     /* absolute position of the next input */
} cd_kv;

typedef struct cd_state {
    float **conv;    /* [n_conv_states] */
    cd_kv *kv;       /* [n_tf_states] */
    int n_conv, n_tf;
} cd_state;

drama_status cd_state_init(const dr_codec *c, int path, cd_state *s, drama_error *err);
void cd_state_reset(cd_state *s, const dr_codec *c, int path);
void cd_state_free(cd_state *s);

/* ---- ops (ops.c) ---- all return DRAMA_ENOMEM on allocation failure. `drama contract`
 * (src/tools/contract_codec.c) checks each kernel below against a float64 reference. */
/* w [cout][cin_g][k] -> packed [ceil(cout/8)][cin_g][k][8]; packed holds cd_packed_len floats. */
void cd_pack_weights(const float *w, float *packed, int cout, int cin_g, int k);
static inline int64_t cd_packed_len(int cout, int cin_g, int k) {
    return (int64_t)(cout + CD_WPACK - 1) / CD_WPACK * CD_WPACK * cin_g * k;
}
float cd_weight_at(const float *packed, int cin_g, int k, int o, int i, int kk);
/* A conv's geometry and history columns (w, b NULL, state -1); the loader and the contract build
 * every conv this way. */
void cd_conv_init(cd_conv *cv, int cin, int cout, int k, int dil, int stride, int groups, int transposed);
int64_t cd_conv_weight_len(const cd_conv *cv); /* floats of the packed cv->w */
/* plain weights (conv [cout][cin/groups][k]; transposed [cin][cout][k], re-laid per output phase)
 * -> packed (cd_conv_weight_len floats) */
void cd_conv_pack(const cd_conv *cv, const float *w, float *packed);
/* x [cin][L] -> y [cout][L_out]; L must be a multiple of stride for strided convs. */
drama_status cd_conv_run(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, dr_pool *pool,
                         drama_error *err);
/* the same with a fused epilogue: y = res + snake(conv(x)) (snake, res NULL: left out; res may
 * be y; res only for convs that are not transposed) */
drama_status cd_conv_run_ex(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, const cd_snake *snake,
                            const float *res, dr_pool *pool, drama_error *err);
/* y = conv(snake(x)) with x left as it is: the Snake runs in the conv's input copy (same values
 * as cd_snake_run on x, then cd_conv_run) */
drama_status cd_conv_run_snake_in(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y,
                                  const cd_snake *sn_in, dr_pool *pool, drama_error *err);
int64_t cd_conv_out_len(const cd_conv *cv, int64_t L);
void cd_snake_prepare(cd_snake *s, double eps); /* s->inv = 1 / (alpha + eps) in fp32 */
void cd_snake_run(const cd_snake *s, float *x, int64_t L, dr_pool *pool);
void cd_snake_apply(const cd_snake *s, const float *x, float *y, int64_t L, dr_pool *pool); /* y = snake(x) */
/* fn(ctx, i0, len) over [0, n) in blocks of `block` items on the pool; inline when the whole
 * (work_per_item x n, pool.h's units) is small. Elementwise steps use it: no result depends on it. */
void cd_par_blocks(dr_pool *pool, int64_t n, int64_t block, double work_per_item,
                   void (*fn)(void *ctx, int64_t i0, int64_t len), void *ctx);
/* ConvNeXt LayerNorm over the C channels of each time step of x [C][L], in place */
void cd_layernorm_ct(float *x, int C, int64_t L, const float *w, const float *b, double eps, dr_pool *pool);
void cd_tanh(const float *x, float *y, int64_t n, dr_pool *pool); /* the decoder's last activation */
void cd_gelu_erf(float *x, int64_t n, dr_pool *pool); /* in place, 0.5 x (1 + erf(x / sqrt 2)): the ConvNeXt MLP */
/* VQ (CODEC.md 3.8): x (dim values, stride apart) / max(||x||, 1e-12) -> out; returns ||out||^2 */
#define CD_VQ_MAX_DIM 64
float cd_unit_vector(const float *x, int64_t stride, int dim, float *out);
void cd_vq_normalise(cd_vq *q); /* cb_hat, cb_hat_sq from codebook */
/* the code minimising ||e^||^2 - 2 e^.c^_j + ||c^_j||^2 for e (dim values, stride apart); ties:
 * the lowest index; -1 when dim > CD_VQ_MAX_DIM */
int cd_vq_nearest(const cd_vq *q, const float *e, int64_t stride);
/* y = x + ru(x), in place on x [c][L] */
drama_status cd_ru_run(const cd_ru *ru, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err);
drama_status cd_convnext_run(const cd_convnext *b, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err);
/* transformer pieces (transformer.c) */
void cd_rmsnorm_ct(const float *x, float *y, int D, int64_t L, const float *w, double eps,
                   dr_pool *pool); /* per time step */
void cd_rope_ct(float *qkv, int row0, const dr_codec_tf_config *cf, int64_t L, int64_t pos0, dr_pool *pool);
/* q [L][H*hd]; k, v [n_prev + L][H*hd] (cached positions first) -> out [H*hd][L]; query t sees
 * keys max(0, n_prev + t - W + 1) .. n_prev + t */
void cd_attend(const dr_codec_tf_config *cf, const float *q, const float *k, const float *v, int64_t n_prev, int64_t L,
               float *out, dr_pool *pool);
/* the same on instruction set isa (AVX2 and up: kernels.h cd_attend_row_avx2, the same values)
 * with a planted defect for drama contract (0: none) */
void cd_attend_ex(const dr_codec_tf_config *cf, const float *q, const float *k, const float *v, int64_t n_prev,
                  int64_t L, float *out, dr_pool *pool, int isa, int plant);
void cd_swiglu(float *g, const float *u, int64_t n, dr_pool *pool); /* g = silu(g) * u */
/* transformer (transformer.c): x [dim][L] -> y [dim][L] */
drama_status cd_tf_run(const cd_tf *tf, cd_kv *kv, const float *x, int64_t L, float *y, dr_pool *pool,
                       drama_error *err);

static inline float *cd_hist(float **tab, const cd_conv *cv) { return cv->state >= 0 ? tab[cv->state] : 0; }

#endif
