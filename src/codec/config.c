/* config.c - codec.json (CODEC.md section 9): built-in defaults equal to the real codec, parsing
 * with typo protection (unknown keys are errors), internal consistency checks. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "codec/codec.h"
#include "codec/internal.h"

static void tf_default(dr_codec_tf_config *t, int n_layer, int window) {
    t->n_layer = n_layer;
    t->dim = 1024;
    t->intermediate_size = 3072;
    t->n_head = 16;
    t->n_local_heads = 16;
    t->head_dim = 64;
    t->window_size = window;
    t->rope_base = 10000.0;
    t->norm_eps = 1e-5;
    t->layer_scale = 1;
    t->rope_bf16 = 1;
}

void dr_codec_config_default(dr_codec_config *c) {
    memset(c, 0, sizeof *c);
    c->sample_rate = 44100;
    c->causal = 1;
    c->encoder_dim = 64;
    c->latent_dim = 1024;
    c->decoder_dim = 1536;
    c->n_encoder_rates = 4;
    const int er[4] = {2, 4, 8, 8}, dr[4] = {8, 8, 4, 2};
    memcpy(c->encoder_rates, er, sizeof er);
    c->n_decoder_rates = 4;
    memcpy(c->decoder_rates, dr, sizeof dr);
    c->hop_length = 512;
    c->frame_length = 2048;
    c->ru_kernel = 7;
    c->n_dilations = 3;
    c->dilations[0] = 1, c->dilations[1] = 3, c->dilations[2] = 9;
    c->snake_eps = 1e-9;
    tf_default(&c->enc_tf, 4, 512);
    c->enc_tf_block = 4;
    c->q_input_dim = 1024;
    c->n_down = 2;
    c->down_factor[0] = 2, c->down_factor[1] = 2;
    c->down_kernel = 2;
    c->cnx_kernel = 7;
    c->cnx_mlp_ratio = 4;
    c->cnx_ln_eps = 1e-6;
    c->semantic_codebook_size = 4096;
    c->n_codebooks = 9;
    c->codebook_size = 1024;
    c->codebook_dim = 8;
    tf_default(&c->pre, 8, 128);
    tf_default(&c->post, 8, 128);
    c->num_codebooks = 10;
    c->upper_clamp[0] = 4095;
    for (int k = 1; k < 10; k++) c->upper_clamp[k] = 1023;
}

typedef struct jctx {
    const char *label;
    drama_error *err;
} jctx;

static drama_status bad(jctx *j, const char *path, const char *why) {
    return dr_fail(j->err, DRAMA_EFORMAT, "%s: '%s': %s", j->label, path, why);
}

static drama_status get_int(jctx *j, json_t *v, const char *path, int lo, int hi, int *out) {
    if (!json_is_integer(v)) return bad(j, path, "expected an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return dr_fail(j->err, DRAMA_EFORMAT, "%s: '%s': %lld outside %d..%d", j->label, path,
                                         (long long)x, lo, hi);
    *out = (int)x;
    return DRAMA_OK;
}

static drama_status get_num(jctx *j, json_t *v, const char *path, double *out) {
    if (!json_is_number(v)) return bad(j, path, "expected a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < 0) return bad(j, path, "expected a finite non-negative number");
    *out = x;
    return DRAMA_OK;
}

static drama_status get_bool(jctx *j, json_t *v, const char *path, int *out) {
    if (!json_is_boolean(v)) return bad(j, path, "expected true or false");
    *out = json_is_true(v);
    return DRAMA_OK;
}

static drama_status get_ints(jctx *j, json_t *v, const char *path, int lo, int hi, int max_n, int *n, int *out) {
    if (!json_is_array(v)) return bad(j, path, "expected a list of integers");
    if (json_array_size(v) == 0 || json_array_size(v) > (size_t)max_n) return bad(j, path, "list length out of range");
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        drama_status rc = get_int(j, x, path, lo, hi, &out[i]);
        if (rc) return rc;
    }
    *n = (int)json_array_size(v);
    return DRAMA_OK;
}

static drama_status text_only(jctx *j, json_t *v, const char *path) {
    (void)v;
    (void)j;
    (void)path;
    return DRAMA_OK; /* informational: any JSON value accepted, not interpreted */
}

static drama_status parse_tf(jctx *j, json_t *o, const char *base, dr_codec_tf_config *t, uint64_t *stated,
                             int stated_shift, int *block_out) {
    char path[160];
    if (!json_is_object(o)) return bad(j, base, "expected an object");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        snprintf(path, sizeof path, "%s.%s", base, key);
        drama_status rc = DRAMA_OK;
        if (!strcmp(key, "n_layer")) rc = get_int(j, v, path, 0, 1000, &t->n_layer), *stated |= 1ull << stated_shift;
        else if (!strcmp(key, "dim")) rc = get_int(j, v, path, 1, 1 << 16, &t->dim), *stated |= 2ull << stated_shift;
        else if (!strcmp(key, "intermediate_size"))
            rc = get_int(j, v, path, 1, 1 << 20, &t->intermediate_size), *stated |= 4ull << stated_shift;
        else if (!strcmp(key, "n_head")) rc = get_int(j, v, path, 1, 1024, &t->n_head);
        else if (!strcmp(key, "n_local_heads")) rc = get_int(j, v, path, 1, 1024, &t->n_local_heads);
        else if (!strcmp(key, "head_dim")) rc = get_int(j, v, path, 2, 4096, &t->head_dim);
        else if (!strcmp(key, "window_size")) rc = get_int(j, v, path, 1, 1 << 24, &t->window_size);
        else if (!strcmp(key, "rope_base")) rc = get_num(j, v, path, &t->rope_base);
        else if (!strcmp(key, "norm_eps")) rc = get_num(j, v, path, &t->norm_eps);
        else if (!strcmp(key, "layer_scale")) {
            rc = get_bool(j, v, path, &t->layer_scale);
            if (!rc && !t->layer_scale) rc = dr_fail(j->err, DRAMA_EUNSUPPORTED, "%s: '%s': false is not supported", j->label, path);
        } else if (!strcmp(key, "rope_cos_sin_dtype")) {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, "bfloat16")) t->rope_bf16 = 1;
            else if (s && !strcmp(s, "float32")) t->rope_bf16 = 0;
            else rc = bad(j, path, "expected \"bfloat16\" or \"float32\"");
        } else if (!strcmp(key, "positions")) rc = text_only(j, v, path);
        else if (block_out && !strcmp(key, "block")) {
            const char *s = json_string_value(v);
            if (!s) rc = bad(j, path, "expected a string");
            /* checked against the number of encoder blocks in dr_codec_config_validate */
            else if (strncmp(s, "encoder.block.", 14) != 0) rc = bad(j, path, "must be \"encoder.block.<last>.block.5\"");
            else {
                char want[64];
                int nb = 0;
                if (sscanf(s + 14, "%d", &nb) != 1 || (snprintf(want, sizeof want, "encoder.block.%d.block.5", nb), strcmp(want, s)))
                    rc = bad(j, path, "must be \"encoder.block.<last>.block.5\"");
                else *block_out = nb;
            }
        } else rc = bad(j, path, "unknown key");
        if (rc) return rc;
    }
    return DRAMA_OK;
}

drama_status dr_codec_config_parse(const char *text, size_t len, const char *label, dr_codec_config *c,
                                   drama_error *err) {
    jctx j = {label ? label : "codec.json", err};
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d: %s", j.label, je.line,
                              je.column, je.text);
    drama_status rc = DRAMA_OK;
    if (!json_is_object(root)) rc = bad(&j, "$", "expected an object");
    const char *key;
    json_t *v;
    if (!rc) json_object_foreach(root, key, v) {
        if (!strcmp(key, "description") || !strcmp(key, "decoder_transformer_note")) rc = text_only(&j, v, key);
        else if (!strcmp(key, "sample_rate")) rc = get_int(&j, v, key, 1, 1 << 24, &c->sample_rate);
        else if (!strcmp(key, "causal")) {
            rc = get_bool(&j, v, key, &c->causal);
            if (!rc && !c->causal) rc = dr_fail(err, DRAMA_EUNSUPPORTED, "%s: 'causal': false is not supported", j.label);
        } else if (!strcmp(key, "encoder_dim")) rc = get_int(&j, v, key, 1, 1 << 16, &c->encoder_dim), c->stated |= DR_CS_ENCODER_DIM;
        else if (!strcmp(key, "latent_dim")) rc = get_int(&j, v, key, 1, 1 << 16, &c->latent_dim), c->stated |= DR_CS_LATENT_DIM;
        else if (!strcmp(key, "decoder_dim")) rc = get_int(&j, v, key, 1, 1 << 16, &c->decoder_dim), c->stated |= DR_CS_DECODER_DIM;
        else if (!strcmp(key, "encoder_rates"))
            rc = get_ints(&j, v, key, 1, 64, DR_CODEC_MAX_RATES, &c->n_encoder_rates, c->encoder_rates);
        else if (!strcmp(key, "decoder_rates"))
            rc = get_ints(&j, v, key, 1, 64, DR_CODEC_MAX_RATES, &c->n_decoder_rates, c->decoder_rates);
        else if (!strcmp(key, "hop_length")) rc = get_int(&j, v, key, 1, 1 << 20, &c->hop_length);
        else if (!strcmp(key, "frame_length")) rc = get_int(&j, v, key, 1, 1 << 20, &c->frame_length);
        else if (!strcmp(key, "snake_alpha_eps")) rc = get_num(&j, v, key, &c->snake_eps);
        else if (!strcmp(key, "residual_unit")) {
            const char *k2;
            json_t *v2;
            if (!json_is_object(v)) rc = bad(&j, key, "expected an object");
            else json_object_foreach(v, k2, v2) {
                if (!strcmp(k2, "kernel_size")) rc = get_int(&j, v2, "residual_unit.kernel_size", 1, 63, &c->ru_kernel);
                else if (!strcmp(k2, "dilations"))
                    rc = get_ints(&j, v2, "residual_unit.dilations", 1, 1024, DR_CODEC_MAX_RATES, &c->n_dilations, c->dilations);
                else rc = bad(&j, "residual_unit", "unknown key inside");
                if (rc) break;
            }
        } else if (!strcmp(key, "encoder_transformer")) rc = parse_tf(&j, v, key, &c->enc_tf, &c->stated, DR_CS_ENC_TF_SHIFT, &c->enc_tf_block);
        else if (!strcmp(key, "quantizer")) {
            const char *k2;
            json_t *v2;
            char path[128];
            if (!json_is_object(v)) rc = bad(&j, key, "expected an object");
            else json_object_foreach(v, k2, v2) {
                snprintf(path, sizeof path, "quantizer.%s", k2);
                if (!strcmp(k2, "input_dim")) rc = get_int(&j, v2, path, 1, 1 << 16, &c->q_input_dim), c->stated |= DR_CS_Q_INPUT_DIM;
                else if (!strcmp(k2, "downsample_factor"))
                    rc = get_ints(&j, v2, path, 1, 64, DR_CODEC_MAX_RATES, &c->n_down, c->down_factor);
                else if (!strcmp(k2, "downsample_kernel")) rc = get_int(&j, v2, path, 1, 64, &c->down_kernel);
                else if (!strcmp(k2, "semantic_codebook_size"))
                    rc = get_int(&j, v2, path, 1, 1 << 24, &c->semantic_codebook_size), c->stated |= DR_CS_SEM_SIZE;
                else if (!strcmp(k2, "n_codebooks"))
                    rc = get_int(&j, v2, path, 0, DR_CODEC_MAX_BOOKS - 1, &c->n_codebooks), c->stated |= DR_CS_N_CODEBOOKS;
                else if (!strcmp(k2, "codebook_size"))
                    rc = get_int(&j, v2, path, 1, 1 << 24, &c->codebook_size), c->stated |= DR_CS_CB_SIZE;
                else if (!strcmp(k2, "codebook_dim")) rc = get_int(&j, v2, path, 1, 4096, &c->codebook_dim), c->stated |= DR_CS_CB_DIM;
                else if (!strcmp(k2, "vq_distance")) rc = text_only(&j, v2, path);
                else if (!strcmp(k2, "pre_module")) rc = parse_tf(&j, v2, path, &c->pre, &c->stated, DR_CS_PRE_SHIFT, NULL);
                else if (!strcmp(k2, "post_module")) rc = parse_tf(&j, v2, path, &c->post, &c->stated, DR_CS_POST_SHIFT, NULL);
                else if (!strcmp(k2, "convnext")) {
                    const char *k3;
                    json_t *v3;
                    if (!json_is_object(v2)) rc = bad(&j, path, "expected an object");
                    else json_object_foreach(v2, k3, v3) {
                        if (!strcmp(k3, "kernel_size")) rc = get_int(&j, v3, "quantizer.convnext.kernel_size", 1, 63, &c->cnx_kernel);
                        else if (!strcmp(k3, "mlp_ratio")) rc = get_int(&j, v3, "quantizer.convnext.mlp_ratio", 1, 64, &c->cnx_mlp_ratio);
                        else if (!strcmp(k3, "layernorm_eps")) rc = get_num(&j, v3, "quantizer.convnext.layernorm_eps", &c->cnx_ln_eps);
                        else if (!strcmp(k3, "gelu")) {
                            const char *s = json_string_value(v3);
                            if (!s || strcmp(s, "erf")) rc = dr_fail(err, DRAMA_EUNSUPPORTED, "%s: 'quantizer.convnext.gelu' must be \"erf\"", j.label);
                        } else rc = bad(&j, "quantizer.convnext", "unknown key inside");
                        if (rc) break;
                    }
                } else rc = bad(&j, path, "unknown key");
                if (rc) break;
            }
        } else if (!strcmp(key, "codes")) {
            const char *k2;
            json_t *v2;
            if (!json_is_object(v)) rc = bad(&j, key, "expected an object");
            else json_object_foreach(v, k2, v2) {
                int n = 0;
                if (!strcmp(k2, "num_codebooks")) rc = get_int(&j, v2, "codes.num_codebooks", 1, DR_CODEC_MAX_BOOKS, &c->num_codebooks), c->stated |= DR_CS_NUM_BOOKS;
                else if (!strcmp(k2, "order")) rc = text_only(&j, v2, "codes.order");
                else if (!strcmp(k2, "decode_upper_clamp")) {
                    rc = get_ints(&j, v2, "codes.decode_upper_clamp", 0, 1 << 24, DR_CODEC_MAX_BOOKS, &n, c->upper_clamp);
                    if (!rc) c->stated |= DR_CS_CLAMP, c->stated = (c->stated & ~DR_CS_CLAMP_N_MASK) | ((uint64_t)n << DR_CS_CLAMP_N_SHIFT);
                } else rc = bad(&j, "codes", "unknown key inside");
                if (rc) break;
            }
        } else if (!strcmp(key, "weight_norm")) rc = text_only(&j, v, key);
        else rc = bad(&j, key, "unknown key");
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

drama_status dr_codec_config_read(const char *path, dr_codec_config *c, drama_error *err) {
    char *buf;
    size_t n;
    drama_status rc = dr_read_file(path, (size_t)16 << 20, &buf, &n, err);
    if (rc) {
        dr_error_prefix(err, "codec config: ");
        return rc;
    }
    rc = dr_codec_config_parse(buf, n, path, c, err);
    free(buf);
    return rc;
}

static drama_status validate_tf(const dr_codec_tf_config *t, const char *name, drama_error *err) {
    if (t->n_layer == 0) return DRAMA_OK;
    if (t->n_local_heads != t->n_head)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "codec config: %s.n_local_heads (%d) must equal n_head (%d)", name,
                       t->n_local_heads, t->n_head);
    if (t->head_dim % 2) return dr_fail(err, DRAMA_EFORMAT, "codec config: %s.head_dim must be even", name);
    if (t->window_size < 1) return dr_fail(err, DRAMA_EFORMAT, "codec config: %s.window_size must be >= 1", name);
    if (!(t->rope_base > 0)) return dr_fail(err, DRAMA_EFORMAT, "codec config: %s.rope_base must be > 0", name);
    return DRAMA_OK;
}

drama_status dr_codec_config_validate(const dr_codec_config *c, drama_error *err) {
    int64_t hop = 1, fr;
    for (int i = 0; i < c->n_encoder_rates; i++) hop *= c->encoder_rates[i];
    if (hop != c->hop_length)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: hop_length %d != product of encoder_rates (%lld)", c->hop_length,
                       (long long)hop);
    fr = hop;
    for (int i = 0; i < c->n_down; i++) fr *= c->down_factor[i];
    if (fr != c->frame_length)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: frame_length %d != hop_length x downsample factors (%lld)",
                       c->frame_length, (long long)fr);
    int64_t up = 1;
    for (int i = 0; i < c->n_decoder_rates; i++) up *= c->decoder_rates[i];
    for (int i = 0; i < c->n_down; i++) up *= c->down_factor[i];
    if (up != c->frame_length)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: decoder_rates x downsample factors (%lld) != frame_length %d",
                       (long long)up, c->frame_length);
    if (c->num_codebooks != 1 + c->n_codebooks)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: codes.num_codebooks %d != 1 + quantizer.n_codebooks (%d)",
                       c->num_codebooks, c->n_codebooks);
    if ((c->stated & DR_CS_CLAMP) &&
        (int)((c->stated & DR_CS_CLAMP_N_MASK) >> DR_CS_CLAMP_N_SHIFT) != c->num_codebooks)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: codes.decode_upper_clamp needs %d values", c->num_codebooks);
    if (c->enc_tf.n_layer && c->enc_tf_block != c->n_encoder_rates)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: encoder_transformer.block must be encoder.block.%d.block.5 (the last "
                       "encoder block)", c->n_encoder_rates);
    if (c->ru_kernel % 2 == 0) return dr_fail(err, DRAMA_EFORMAT, "codec config: residual_unit.kernel_size must be odd");
    drama_status rc;
    if ((rc = validate_tf(&c->enc_tf, "encoder_transformer", err)) || (rc = validate_tf(&c->pre, "quantizer.pre_module", err)) ||
        (rc = validate_tf(&c->post, "quantizer.post_module", err)))
        return rc;
    return DRAMA_OK;
}

static int tf_equal(const dr_codec_tf_config *a, const dr_codec_tf_config *b) {
    return a->n_layer == b->n_layer && a->dim == b->dim && a->intermediate_size == b->intermediate_size &&
           a->n_head == b->n_head && a->n_local_heads == b->n_local_heads && a->head_dim == b->head_dim &&
           a->window_size == b->window_size && a->rope_base == b->rope_base && a->norm_eps == b->norm_eps &&
           a->layer_scale == b->layer_scale && a->rope_bf16 == b->rope_bf16;
}

int dr_codec_config_equal(const dr_codec_config *a, const dr_codec_config *b) {
    dr_codec_config x = *a, y = *b;
    x.stated = y.stated = 0;
    if (!tf_equal(&x.enc_tf, &y.enc_tf) || !tf_equal(&x.pre, &y.pre) || !tf_equal(&x.post, &y.post)) return 0;
    memset(&x.enc_tf, 0, sizeof x.enc_tf), memset(&y.enc_tf, 0, sizeof y.enc_tf);
    memset(&x.pre, 0, sizeof x.pre), memset(&y.pre, 0, sizeof y.pre);
    memset(&x.post, 0, sizeof x.post), memset(&y.post, 0, sizeof y.post);
    /* remaining fields are ints and doubles without padding-sensitive comparisons */
    return x.sample_rate == y.sample_rate && x.enc_tf_block == y.enc_tf_block && x.causal == y.causal && x.encoder_dim == y.encoder_dim &&
           x.latent_dim == y.latent_dim && x.decoder_dim == y.decoder_dim && x.n_encoder_rates == y.n_encoder_rates &&
           !memcmp(x.encoder_rates, y.encoder_rates, sizeof x.encoder_rates) && x.n_decoder_rates == y.n_decoder_rates &&
           !memcmp(x.decoder_rates, y.decoder_rates, sizeof x.decoder_rates) && x.hop_length == y.hop_length &&
           x.frame_length == y.frame_length && x.ru_kernel == y.ru_kernel && x.n_dilations == y.n_dilations &&
           !memcmp(x.dilations, y.dilations, sizeof x.dilations) && x.snake_eps == y.snake_eps &&
           x.q_input_dim == y.q_input_dim && x.n_down == y.n_down && !memcmp(x.down_factor, y.down_factor, sizeof x.down_factor) &&
           x.down_kernel == y.down_kernel && x.cnx_kernel == y.cnx_kernel && x.cnx_mlp_ratio == y.cnx_mlp_ratio &&
           x.cnx_ln_eps == y.cnx_ln_eps && x.semantic_codebook_size == y.semantic_codebook_size &&
           x.n_codebooks == y.n_codebooks && x.codebook_size == y.codebook_size && x.codebook_dim == y.codebook_dim &&
           x.num_codebooks == y.num_codebooks && !memcmp(x.upper_clamp, y.upper_clamp, sizeof x.upper_clamp);
}
