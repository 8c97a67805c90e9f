/* make_model_codec.c - the codec part of `drama make-model`: codec.json (CODEC.md 9) for the
 * chosen hyper-parameters, and a random codec.safetensors holding exactly the tensors the codec
 * engine expects for it (dr_codec_expected), at scales that keep the decoder unsaturated. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "io/safetensors.h"
#include "tools/make_model.h"

/* ---- codec.json ---- */

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *tf_json(const dr_mm_codec_tf *t, int64_t dim, const char *block) {
    json_t *o = json_object();
    json_object_set_new(o, "n_layer", json_integer(t->n_layer));
    json_object_set_new(o, "dim", json_integer(dim));
    json_object_set_new(o, "n_head", json_integer(t->n_head));
    json_object_set_new(o, "n_local_heads", json_integer(t->n_head));
    json_object_set_new(o, "head_dim", json_integer(t->head_dim));
    json_object_set_new(o, "intermediate_size", json_integer(t->intermediate));
    json_object_set_new(o, "window_size", json_integer(t->window));
    json_object_set_new(o, "rope_base", json_real(10000.0));
    json_object_set_new(o, "norm_eps", json_real(1e-5));
    json_object_set_new(o, "layer_scale", json_true());
    json_object_set_new(o, "rope_cos_sin_dtype", json_string("bfloat16"));
    json_object_set_new(o, "positions", json_string("restart at 0 for every call"));
    if (block) json_object_set_new(o, "block", json_string(block));
    return o;
}

drama_status dr_mm_write_codec_json(const char *path, const dr_mm_codec *c, drama_error *err) {
    json_t *o = json_object();
    int hop = 1, frame;
    for (int i = 0; i < c->n_enc_rates; i++) hop *= c->enc_rates[i];
    frame = hop;
    for (int i = 0; i < c->n_down; i++) frame *= c->down_factor[i];
    int64_t enc_out = (int64_t)c->encoder_dim << c->n_enc_rates;
    json_object_set_new(o, "description", json_string("random codec written by drama make-model"));
    json_object_set_new(o, "sample_rate", json_integer(44100));
    json_object_set_new(o, "causal", json_true());
    json_object_set_new(o, "encoder_dim", json_integer(c->encoder_dim));
    json_object_set_new(o, "encoder_rates", int_array(c->enc_rates, c->n_enc_rates));
    json_object_set_new(o, "latent_dim", json_integer(c->latent_dim));
    json_object_set_new(o, "decoder_dim", json_integer(c->decoder_dim));
    json_object_set_new(o, "decoder_rates", int_array(c->dec_rates, c->n_dec_rates));
    json_object_set_new(o, "hop_length", json_integer(hop));
    json_object_set_new(o, "frame_length", json_integer(frame));
    json_t *ru = json_object();
    static const int dil[3] = {1, 3, 9};
    json_object_set_new(ru, "kernel_size", json_integer(c->ru_kernel));
    json_object_set_new(ru, "dilations", int_array(dil, 3));
    json_object_set_new(o, "residual_unit", ru);
    json_object_set_new(o, "snake_alpha_eps", json_real(1e-9));
    char block[64];
    snprintf(block, sizeof block, "encoder.block.%d.block.5", c->n_enc_rates);
    json_object_set_new(o, "encoder_transformer", tf_json(&c->enc_tf, enc_out, block));
    json_t *q = json_object();
    json_object_set_new(q, "input_dim", json_integer(c->latent_dim));
    json_object_set_new(q, "downsample_factor", int_array(c->down_factor, c->n_down));
    json_object_set_new(q, "downsample_kernel", json_integer(c->n_down > 0 ? c->down_factor[0] : 2));
    json_t *cn = json_object();
    json_object_set_new(cn, "kernel_size", json_integer(c->convnext_kernel));
    json_object_set_new(cn, "mlp_ratio", json_integer(c->convnext_ratio));
    json_object_set_new(cn, "layernorm_eps", json_real(1e-6));
    json_object_set_new(cn, "gelu", json_string("erf"));
    json_object_set_new(q, "convnext", cn);
    json_object_set_new(q, "semantic_codebook_size", json_integer(c->semantic_codebook_size));
    json_object_set_new(q, "n_codebooks", json_integer(c->n_codebooks));
    json_object_set_new(q, "codebook_size", json_integer(c->codebook_size));
    json_object_set_new(q, "codebook_dim", json_integer(c->codebook_dim));
    json_object_set_new(q, "pre_module", tf_json(&c->pre, c->latent_dim, NULL));
    json_object_set_new(q, "post_module", tf_json(&c->post, c->latent_dim, NULL));
    json_object_set_new(o, "quantizer", q);
    json_t *codes = json_object();
    json_object_set_new(codes, "num_codebooks", json_integer(1 + c->n_codebooks));
    json_t *clamp = json_array();
    json_array_append_new(clamp, json_integer(c->semantic_codebook_size - 1));
    for (int i = 0; i < c->n_codebooks; i++) json_array_append_new(clamp, json_integer(c->codebook_size - 1));
    json_object_set_new(codes, "decode_upper_clamp", clamp);
    json_object_set_new(o, "codes", codes);
    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (rc != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot write", path);
    return DRAMA_OK;
}

/* ---- codec.safetensors ---- */

typedef struct codec_list {
    int n, cap, failed;
    char **names;
    int *ndim;
    int64_t (*shape)[3];
} codec_list;

static void collect(void *ctx, const char *name, int ndim, const int64_t *shape) {
    codec_list *l = ctx;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        char **nn = realloc(l->names, (size_t)cap * sizeof *nn);
        int *nd = realloc(l->ndim, (size_t)cap * sizeof *nd);
        int64_t(*ns)[3] = realloc(l->shape, (size_t)cap * sizeof *ns);
        if (nn) l->names = nn;
        if (nd) l->ndim = nd;
        if (ns) l->shape = ns;
        if (!nn || !nd || !ns) {
            l->failed = 1;
            return;
        }
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    l->ndim[l->n] = ndim;
    for (int i = 0; i < 3; i++) l->shape[l->n][i] = i < ndim ? shape[i] : 0;
    if (l->names[l->n]) l->n++;
    else l->failed = 1;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Values of codec tensor `name` are a + b * u, u uniform in [-1, 1) (fan_in: product of the
 * dims after the first). Decided once per tensor: the element loop is hot at the real size. */
static void codec_affine(const char *name, int64_t fan_in, int is_last_conv, double *a, double *b) {
    *a = 0;
    if (ends_with(name, ".alpha")) *a = 1.25, *b = 0.75;                    /* Snake alpha in [0.5, 2] */
    else if (ends_with(name, ".gamma")) *a = 0.25, *b = 0.15;               /* layer scale in [0.1, 0.4] */
    else if (ends_with(name, "norm.weight")) *a = 1.0, *b = 0.05;
    else if (ends_with(name, ".bias")) *b = 0.01;
    else if (ends_with(name, "original0") || ends_with(name, "weight_g")) { /* weight-norm g: row norms */
        double k = is_last_conv ? 0.01 : 1.0;                                /* last conv: keep tanh unsaturated */
        *a = k, *b = 0.1 * k;
    } else if (ends_with(name, "codebook.weight")) *b = 1.0;
    else {
        double gain = (strstr(name, ".wo.") || strstr(name, ".w2.") || strstr(name, "pwconv2")) ? 0.5 : 1.0;
        *b = gain * sqrt(3.0 / (double)(fan_in > 0 ? fan_in : 1));
    }
}

drama_status dr_mm_write_codec(const char *dir, const dr_mm_codec *c, uint64_t seed, drama_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/codec.json", dir);
    drama_status st = dr_mm_write_codec_json(path, c, err);
    if (st) return st;
    /* The tensor list is the codec engine's own (dr_codec_expected) for the configuration the
     * codec.json just written describes, so a generated codec always matches its loader. */
    codec_list l = {0};
    dr_codec_config cfg;
    dr_codec_config_default(&cfg);
    dr_st_writer *w = NULL;
    float *buf = NULL;
    enum { CHUNK = 1 << 16 };
    if ((st = dr_codec_config_read(path, &cfg, err)) || (st = dr_codec_expected(&cfg, collect, &l, err))) goto done;
    if (l.failed) {
        st = dr_fail(err, DRAMA_ENOMEM, "codec inventory: out of memory");
        goto done;
    }
    snprintf(path, sizeof path, "%s/codec.safetensors", dir);
    if ((st = dr_st_writer_create(path, &w, err))) goto done;
    if ((st = dr_st_writer_metadata(w, "format", "pt", err))) goto done;
    for (int i = 0; i < l.n && !st; i++) st = dr_st_writer_declare(w, l.names[i], DR_DT_F32, l.ndim[i], l.shape[i], err);
    if (st) goto done;
    buf = malloc(CHUNK * sizeof *buf);
    if (!buf) {
        st = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory");
        goto done;
    }
    char last_conv[64];
    snprintf(last_conv, sizeof last_conv, "decoder.model.%d.conv.", c->n_dec_rates + 2);
    for (int i = 0; i < l.n && !st; i++) {
        int64_t numel = 1, fan_in = 1;
        for (int d = 0; d < l.ndim[i]; d++) numel *= l.shape[i][d];
        for (int d = 1; d < l.ndim[i]; d++) fan_in *= l.shape[i][d];
        uint64_t key = dr_mm_name_key(l.names[i]);
        int is_last = !strncmp(l.names[i], last_conv, strlen(last_conv));
        double a, b;
        codec_affine(l.names[i], fan_in, is_last, &a, &b);
        for (int64_t off = 0; off < numel && !st; off += CHUNK) {
            int64_t n = numel - off < CHUNK ? numel - off : CHUNK;
            for (int64_t j = 0; j < n; j++) buf[j] = (float)(a + b * dr_mm_uniform(seed, key, (uint64_t)(off + j)));
            st = dr_st_writer_write(w, buf, (size_t)n * sizeof *buf, err); /* little-endian hosts */
        }
    }
    if (!st) {
        st = dr_st_writer_finish(w, err);
        w = NULL;
    }
done:
    if (w) dr_st_writer_abort(w);
    free(buf);
    for (int i = 0; i < l.n; i++) free(l.names[i]);
    free(l.names);
    free(l.ndim);
    free(l.shape);
    if (st) dr_error_prefix(err, "%s/codec.safetensors: ", dir);
    return st;
}
