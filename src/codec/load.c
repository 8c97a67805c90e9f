/* load.c - codec weights: one walk of the module tree (CODEC.md 4) serves three purposes:
 * listing the expected inventory of a configuration, checking a set of tensors against it
 * (every missing, mis-shaped, incomplete or unexpected tensor is named), and loading them
 * (weight norm folded once, CODEC.md 3.1; transposed weights re-laid for the kernels). */
#include <math.h>
#include <stdarg.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "io/safetensors.h"

#define MAX_STATES 256

typedef struct named {
    const char *name; /* normalised (generator. stripped) */
    const dr_tensor *t;
} named;

typedef struct ld {
    dr_codec *c;          /* NULL in inventory mode */
    const dr_codec_config *cf;
    int alloc;            /* load the section being walked (else only check / list) */
    named *tab;           /* sorted by name */
    int64_t n;
    uint8_t *used;
    dr_codec_tensor_cb cb;
    void *cb_ctx;
    char findings[900];
    int n_findings;
    int oom;
    int conv_states[2], tf_states[2];
    int conv_state_size[2][MAX_STATES];
    cd_tf *tf_of_state[2][MAX_STATES];
} ld;

static int cmp_named(const void *a, const void *b) { return strcmp(((const named *)a)->name, ((const named *)b)->name); }

static int64_t find(const ld *L, const char *name) {
    int64_t lo = 0, hi = L->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strcmp(L->tab[mid].name, name);
        if (!c) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static void finding(ld *L, const char *fmt, ...) DR_PRINTF(2, 3);
static void finding(ld *L, const char *fmt, ...) {
    char line[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (L->n_findings++ < 12) {
        size_t used = strlen(L->findings);
        snprintf(L->findings + used, sizeof L->findings - used, "%s%s", used ? "; " : "", line);
    }
}

static void *own(ld *L, size_t bytes) {
    dr_codec *c = L->c;
    void *p = dr_alloc(bytes ? bytes : 4);
    if (!p) {
        L->oom = 1;
        return NULL;
    }
    if (c->n_owned == c->cap_owned) {
        int64_t nc = c->cap_owned ? c->cap_owned * 2 : 256;
        void **q = realloc(c->owned, (size_t)nc * sizeof *q);
        if (!q) {
            dr_free(p);
            L->oom = 1;
            return NULL;
        }
        c->owned = q;
        c->cap_owned = nc;
    }
    c->owned[c->n_owned++] = p;
    return p;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t u = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && u < n; i++) u += (size_t)snprintf(buf + u, n - u, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (u < n) snprintf(buf + u, n - u, "]");
}

/* A plain tensor of the given shape: listed (inventory), checked, and loaded as fp32 when alloc. */
static float *get(ld *L, const char *name, int ndim, const int64_t *shape) {
    if (L->cb) L->cb(L->cb_ctx, name, ndim, shape);
    if (!L->c) return NULL;
    int64_t i = find(L, name);
    if (i < 0) {
        finding(L, "missing %s", name);
        return NULL;
    }
    L->used[i] = 1;
    const dr_tensor *t = L->tab[i].t;
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        char want[96], got[96], both[200];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        snprintf(both, sizeof both, " has shape %s, expected %s", got, want);
        finding(L, "%s%s", name, both);
        return NULL;
    }
    if (t->dtype != DR_DT_F32 && t->dtype != DR_DT_F16 && t->dtype != DR_DT_BF16 && t->dtype != DR_DT_F64) {
        finding(L, "%s has dtype %s (F32, BF16, F16 or F64 expected)", name, dr_dtype_name(t->dtype));
        return NULL;
    }
    if (!L->alloc) return NULL;
    int64_t n = dr_tensor_numel(t);
    float *out = own(L, (size_t)n * sizeof(float));
    if (!out) return NULL;
    drama_error e = {0};
    if (dr_st_to_f32(t, out, &e)) {
        finding(L, "%s: %s", name, e.message);
        return NULL;
    }
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(out[k])) {
            finding(L, "%s holds a non-finite value", name);
            return NULL;
        }
    return out;
}

static float *get1(ld *L, const char *name, int64_t d0) { return get(L, name, 1, &d0); }

/* A weight-normed weight [d0, d1, d2] of module m in any of the three spellings (CODEC.md 3.1).
 * The inventory lists the canonical spelling (old_style for the VQ projections). */
static float *get_wn(ld *L, const char *m, int old_style, int64_t d0, int64_t d1, int64_t d2) {
    char gname[300], vname[300], wname[300];
    int64_t vshape[3] = {d0, d1, d2}, gshape[3] = {d0, 1, 1};
    int have_new = 0, have_old = 0, have_w = 0;
    snprintf(wname, sizeof wname, "%s.weight", m);
    if (L->c) {
        char a[300], b[300];
        snprintf(a, sizeof a, "%s.parametrizations.weight.original0", m);
        snprintf(b, sizeof b, "%s.parametrizations.weight.original1", m);
        have_new = (find(L, a) >= 0) + (find(L, b) >= 0);
        snprintf(a, sizeof a, "%s.weight_g", m);
        snprintf(b, sizeof b, "%s.weight_v", m);
        have_old = (find(L, a) >= 0) + (find(L, b) >= 0);
        have_w = find(L, wname) >= 0;
    }
    int use_old = L->c ? (have_old && !have_new) : old_style;
    if (L->c && !have_new && !have_old && have_w) {
        if (L->cb) L->cb(L->cb_ctx, wname, 3, vshape);
        dr_codec_tensor_cb cb = L->cb;
        L->cb = NULL;
        float *w = get(L, wname, 3, vshape);
        L->cb = cb;
        return w;
    }
    if (L->c && have_new && have_old) finding(L, "%s: weight norm stored in two spellings", m);
    if (L->c && (have_new == 1 || (have_old == 1 && !have_new)))
        finding(L, "%s: incomplete weight norm (g without v or v without g)", m);
    snprintf(gname, sizeof gname, use_old ? "%s.weight_g" : "%s.parametrizations.weight.original0", m);
    snprintf(vname, sizeof vname, use_old ? "%s.weight_v" : "%s.parametrizations.weight.original1", m);
    float *g = get(L, gname, 3, gshape);
    float *v = get(L, vname, 3, vshape);
    if (!g || !v) return NULL;
    /* W = g * v / ||v||, norm over dims 1.. per row of dim 0, no epsilon; folded in fp64 */
    int64_t row = d1 * d2;
    for (int64_t o = 0; o < d0; o++) {
        double ss = 0;
        for (int64_t k = 0; k < row; k++) ss += (double)v[o * row + k] * v[o * row + k];
        double scale = (double)g[o] / sqrt(ss);
        if (!isfinite(scale)) {
            finding(L, "%s: weight norm of a zero row", m);
            return NULL;
        }
        for (int64_t k = 0; k < row; k++) v[o * row + k] = (float)(v[o * row + k] * scale);
    }
    return v;
}

static void new_state(ld *L, cd_conv *cv, int path) {
    cv->state = -1;
    if (cv->hist <= 0 || !L->alloc) return;
    if (L->conv_states[path] >= MAX_STATES) {
        L->oom = 1;
        return;
    }
    cv->state = L->conv_states[path];
    L->conv_state_size[path][L->conv_states[path]++] = cv->cin * cv->hist;
}

/* Replace an owned buffer by another (frees the old one now: weights are large). */
static void disown(ld *L, void *p) {
    dr_codec *c = L->c;
    for (int64_t i = c->n_owned - 1; i >= 0; i--)
        if (c->owned[i] == p) {
            dr_free(p);
            c->owned[i] = c->owned[--c->n_owned];
            return;
        }
}

/* plain weights (conv [cout][cin/groups][k], transposed [cin][cout][k]) -> the packed layout of
 * the kernels (cd_conv_pack); the plain buffer is released at once */
static void conv_setup(ld *L, cd_conv *cv, int cin, int cout, int k, int dil, int stride, int groups, int transposed,
                       float *w, float *b, int path) {
    cd_conv_init(cv, cin, cout, k, dil, stride, groups, transposed);
    cv->b = b;
    if (w && L->alloc) {
        float *pk = own(L, (size_t)cd_conv_weight_len(cv) * sizeof(float));
        if (pk) cd_conv_pack(cv, w, pk);
        cv->w = pk;
        disown(L, w);
    }
    new_state(L, cv, path);
}

/* weight-normed conv "<m>" with bias */
static void conv_wn(ld *L, cd_conv *cv, const char *m, int cin, int cout, int k, int dil, int stride, int transposed,
                    int old_style, int path) {
    char bn[300];
    float *w = transposed ? get_wn(L, m, old_style, cin, cout, k) : get_wn(L, m, old_style, cout, cin, k);
    snprintf(bn, sizeof bn, "%s.bias", m);
    float *b = get1(L, bn, cout);
    conv_setup(L, cv, cin, cout, k, dil, stride, 1, transposed, w, b, path);
}

static void snake(ld *L, cd_snake *s, const char *name, int c, double eps) {
    int64_t shape[3] = {1, c, 1};
    s->c = c;
    s->alpha = get(L, name, 3, shape);
    if (s->alpha && L->alloc) {
        s->inv = own(L, (size_t)c * sizeof(float));
        if (s->inv) cd_snake_prepare(s, eps);
    }
}

static void res_unit(ld *L, cd_ru *ru, const char *p, int c, int dil, int path) {
    const dr_codec_config *cf = L->cf;
    char n[300];
    double eps = cf->snake_eps;
    int k = cf->ru_kernel;
    snprintf(n, sizeof n, "%s.block.0.alpha", p), snake(L, &ru->s1, n, c, eps);
    snprintf(n, sizeof n, "%s.block.1.conv", p), conv_wn(L, &ru->c1, n, c, c, k, dil, 1, 0, 0, path);
    snprintf(n, sizeof n, "%s.block.2.alpha", p), snake(L, &ru->s2, n, c, eps);
    snprintf(n, sizeof n, "%s.block.3.conv", p), conv_wn(L, &ru->c2, n, c, c, 1, 1, 1, 0, 0, path);
}

static void convnext(ld *L, cd_convnext *b, const char *p, int C, int K, int ratio, double eps, int path) {
    char n[300];
    int64_t dws[3] = {C, 1, K}, w1s[2] = {(int64_t)C * ratio, C}, w2s[2] = {C, (int64_t)C * ratio};
    snprintf(n, sizeof n, "%s.dwconv.conv.weight", p);
    float *w = get(L, n, 3, dws);
    snprintf(n, sizeof n, "%s.dwconv.conv.bias", p);
    conv_setup(L, &b->dw, C, C, K, 1, 1, C, 0, w, get1(L, n, C), path);
    snprintf(n, sizeof n, "%s.norm.weight", p), b->ln_w = get1(L, n, C);
    snprintf(n, sizeof n, "%s.norm.bias", p), b->ln_b = get1(L, n, C);
    snprintf(n, sizeof n, "%s.pwconv1.weight", p), w = get(L, n, 2, w1s);
    snprintf(n, sizeof n, "%s.pwconv1.bias", p);
    conv_setup(L, &b->pw1, C, C * ratio, 1, 1, 1, 1, 0, w, get1(L, n, (int64_t)C * ratio), path);
    snprintf(n, sizeof n, "%s.pwconv2.weight", p), w = get(L, n, 2, w2s);
    snprintf(n, sizeof n, "%s.pwconv2.bias", p);
    conv_setup(L, &b->pw2, C * ratio, C, 1, 1, 1, 1, 0, w, get1(L, n, C), path);
    snprintf(n, sizeof n, "%s.gamma", p), b->gamma = get1(L, n, C);
    b->ln_eps = eps;
}

static void linear(ld *L, cd_conv *cv, const char *name, int out, int in, int path) {
    int64_t s[2] = {out, in};
    conv_setup(L, cv, in, out, 1, 1, 1, 1, 0, get(L, name, 2, s), NULL, path);
}

static void transformer(ld *L, cd_tf *tf, const char *p, const dr_codec_tf_config *cf, int path) {
    char n[300];
    int D = cf->dim, Dq = cf->n_head * cf->head_dim, F = cf->intermediate_size;
    tf->cfg = *cf;
    tf->layers = NULL;
    if (cf->n_layer <= 0) return;
    if (L->alloc) {
        tf->layers = own(L, (size_t)cf->n_layer * sizeof *tf->layers);
        if (!tf->layers) return;
        memset(tf->layers, 0, (size_t)cf->n_layer * sizeof *tf->layers);
    }
    for (int l = 0; l < cf->n_layer; l++) {
        cd_tlayer tmp, *ly = tf->layers ? &tf->layers[l] : &tmp;
        snprintf(n, sizeof n, "%s.layers.%d.attention.wqkv.weight", p, l), linear(L, &ly->wqkv, n, 3 * Dq, D, path);
        snprintf(n, sizeof n, "%s.layers.%d.attention.wo.weight", p, l), linear(L, &ly->wo, n, D, Dq, path);
        snprintf(n, sizeof n, "%s.layers.%d.feed_forward.w1.weight", p, l), linear(L, &ly->w1, n, F, D, path);
        snprintf(n, sizeof n, "%s.layers.%d.feed_forward.w3.weight", p, l), linear(L, &ly->w3, n, F, D, path);
        snprintf(n, sizeof n, "%s.layers.%d.feed_forward.w2.weight", p, l), linear(L, &ly->w2, n, D, F, path);
        snprintf(n, sizeof n, "%s.layers.%d.ffn_norm.weight", p, l), ly->ffn_norm = get1(L, n, D);
        snprintf(n, sizeof n, "%s.layers.%d.attention_norm.weight", p, l), ly->attn_norm = get1(L, n, D);
        snprintf(n, sizeof n, "%s.layers.%d.attention_layer_scale.gamma", p, l), ly->g_attn = get1(L, n, D);
        snprintf(n, sizeof n, "%s.layers.%d.ffn_layer_scale.gamma", p, l), ly->g_ffn = get1(L, n, D);
    }
    snprintf(n, sizeof n, "%s.norm.weight", p), tf->norm = get1(L, n, D);
    tf->state = -1;
    if (L->alloc && L->tf_states[path] < MAX_STATES) {
        tf->state = L->tf_states[path];
        L->tf_of_state[path][L->tf_states[path]++] = tf;
    }
}

static void vq(ld *L, cd_vq *q, const char *p, int n, int dim, int cin) {
    char m[300];
    int64_t cbs[2] = {n, dim};
    q->n = n, q->dim = dim, q->cin = cin;
    snprintf(m, sizeof m, "%s.in_proj", p), conv_wn(L, &q->in_proj, m, cin, dim, 1, 1, 1, 0, 1, 0);
    snprintf(m, sizeof m, "%s.out_proj", p), conv_wn(L, &q->out_proj, m, dim, cin, 1, 1, 1, 0, 1, 0);
    snprintf(m, sizeof m, "%s.codebook.weight", p), q->codebook = get(L, m, 2, cbs);
}

/* Walk the whole module tree. parts selects what is loaded; the rest is only checked/listed. */
static void walk(ld *L, const dr_codec_config *cf, dr_codec *c, unsigned parts) {
    char p[300];
    int inv = !L->c;
    L->cf = cf;
    /* ---- encoder (path 1) ---- */
    L->alloc = !inv && (parts & DR_CODEC_LOAD_ENCODER);
    int ch = cf->encoder_dim;
    conv_wn(L, &c->enc_in, "encoder.block.0.conv", 1, ch, 7, 1, 1, 0, 0, 1);
    for (int b = 0; b < cf->n_encoder_rates; b++) {
        cd_enc_block *eb = &c->enc[b];
        int s = cf->encoder_rates[b];
        for (int r = 0; r < cf->n_dilations; r++) {
            snprintf(p, sizeof p, "encoder.block.%d.block.%d", b + 1, r);
            res_unit(L, &eb->ru[r], p, ch, cf->dilations[r], 1);
        }
        snprintf(p, sizeof p, "encoder.block.%d.block.%d.alpha", b + 1, cf->n_dilations);
        snake(L, &eb->snake, p, ch, cf->snake_eps);
        snprintf(p, sizeof p, "encoder.block.%d.block.%d.conv", b + 1, cf->n_dilations + 1);
        conv_wn(L, &eb->down, p, ch, 2 * ch, 2 * s, 1, s, 0, 0, 1);
        ch *= 2;
        eb->has_tf = b + 1 == cf->enc_tf_block && cf->enc_tf.n_layer > 0;
        if (eb->has_tf) {
            snprintf(p, sizeof p, "encoder.block.%d.block.%d", b + 1, cf->n_dilations + 2);
            transformer(L, &eb->tf, p, &cf->enc_tf, 1);
        }
    }
    snprintf(p, sizeof p, "encoder.block.%d.alpha", cf->n_encoder_rates + 1);
    snake(L, &c->enc_snake, p, ch, cf->snake_eps);
    snprintf(p, sizeof p, "encoder.block.%d.conv", cf->n_encoder_rates + 2);
    conv_wn(L, &c->enc_out, p, ch, cf->latent_dim, 3, 1, 1, 0, 0, 1);
    /* ---- quantizer: downsample, pre_module, VQ in_proj (encode); VQ out, post, upsample (decode) ---- */
    int Q = cf->q_input_dim;
    for (int i = 0; i < cf->n_down; i++) {
        int64_t ws[3] = {Q, Q, cf->down_kernel};
        snprintf(p, sizeof p, "quantizer.downsample.%d.0.conv.weight", i);
        float *w = get(L, p, 3, ws);
        snprintf(p, sizeof p, "quantizer.downsample.%d.0.conv.bias", i);
        conv_setup(L, &c->down[i], Q, Q, cf->down_kernel, 1, cf->down_factor[i], 1, 0, w, get1(L, p, Q), 1);
        snprintf(p, sizeof p, "quantizer.downsample.%d.1", i);
        convnext(L, &c->down_cnx[i], p, Q, cf->cnx_kernel, cf->cnx_mlp_ratio, cf->cnx_ln_eps, 1);
    }
    transformer(L, &c->pre, "quantizer.pre_module", &cf->pre, 1);
    /* the VQ stages are needed by both paths: loaded when either is */
    L->alloc = !inv && parts;
    vq(L, &c->vq[0], "quantizer.semantic_quantizer.quantizers.0", cf->semantic_codebook_size, cf->codebook_dim, Q);
    for (int k = 0; k < cf->n_codebooks; k++) {
        snprintf(p, sizeof p, "quantizer.quantizer.quantizers.%d", k);
        vq(L, &c->vq[1 + k], p, cf->codebook_size, cf->codebook_dim, Q);
    }
    L->alloc = !inv && (parts & DR_CODEC_LOAD_DECODER);
    transformer(L, &c->post, "quantizer.post_module", &cf->post, 0);
    for (int i = 0; i < cf->n_down; i++) {
        int f = cf->down_factor[cf->n_down - 1 - i]; /* the reference upsamples in reversed order */
        int64_t ws[3] = {Q, Q, f};
        snprintf(p, sizeof p, "quantizer.upsample.%d.0.conv.weight", i);
        float *w = get(L, p, 3, ws);
        snprintf(p, sizeof p, "quantizer.upsample.%d.0.conv.bias", i);
        conv_setup(L, &c->up[i], Q, Q, f, 1, f, 1, 1, w, get1(L, p, Q), 0);
        snprintf(p, sizeof p, "quantizer.upsample.%d.1", i);
        convnext(L, &c->up_cnx[i], p, Q, cf->cnx_kernel, cf->cnx_mlp_ratio, cf->cnx_ln_eps, 0);
    }
    /* ---- decoder (path 0) ---- */
    ch = cf->decoder_dim;
    conv_wn(L, &c->dec_in, "decoder.model.0.conv", cf->latent_dim, ch, 7, 1, 1, 0, 0, 0);
    for (int b = 0; b < cf->n_decoder_rates; b++) {
        cd_dec_block *db = &c->dec[b];
        int s = cf->decoder_rates[b];
        snprintf(p, sizeof p, "decoder.model.%d.block.0.alpha", b + 1);
        snake(L, &db->snake, p, ch, cf->snake_eps);
        snprintf(p, sizeof p, "decoder.model.%d.block.1.conv", b + 1);
        conv_wn(L, &db->up, p, ch, ch / 2, 2 * s, 1, s, 1, 0, 0);
        ch /= 2;
        for (int r = 0; r < cf->n_dilations; r++) {
            snprintf(p, sizeof p, "decoder.model.%d.block.%d", b + 1, r + 2);
            res_unit(L, &db->ru[r], p, ch, cf->dilations[r], 0);
        }
    }
    snprintf(p, sizeof p, "decoder.model.%d.alpha", cf->n_decoder_rates + 1);
    snake(L, &c->dec_snake, p, ch, cf->snake_eps);
    snprintf(p, sizeof p, "decoder.model.%d.conv", cf->n_decoder_rates + 2);
    conv_wn(L, &c->dec_out, p, ch, 1, 7, 1, 1, 0, 0, 0);
}

static int valid_tree_config(const dr_codec_config *cf, drama_error *err) {
    if (cf->n_dilations > CD_MAX_RU)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "codec config: more than %d residual units per block", CD_MAX_RU), 0;
    int ch = cf->decoder_dim;
    for (int b = 0; b < cf->n_decoder_rates; b++, ch /= 2)
        if (ch % 2) return dr_fail(err, DRAMA_EFORMAT, "codec config: decoder width %d is not divisible by 2^%d",
                                   cf->decoder_dim, cf->n_decoder_rates), 0;
    if (cf->encoder_dim > (1 << 20) >> cf->n_encoder_rates)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: encoder width too large"), 0;
    const dr_codec_tf_config *t[3] = {&cf->enc_tf, &cf->pre, &cf->post};
    for (int i = 0; i < 3; i++)
        if (t[i]->n_layer && t[i]->head_dim > 512)
            return dr_fail(err, DRAMA_EUNSUPPORTED, "codec config: head_dim above 512 is not supported"), 0;
    if (cf->enc_tf.n_layer && cf->enc_tf.dim != cf->encoder_dim << cf->n_encoder_rates)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: encoder_transformer.dim %d != encoder width %d",
                       cf->enc_tf.dim, cf->encoder_dim << cf->n_encoder_rates), 0;
    if ((cf->pre.n_layer && cf->pre.dim != cf->q_input_dim) || (cf->post.n_layer && cf->post.dim != cf->q_input_dim))
        return dr_fail(err, DRAMA_EFORMAT, "codec config: quantizer transformer dim != quantizer.input_dim %d",
                       cf->q_input_dim), 0;
    if (cf->latent_dim != cf->q_input_dim)
        return dr_fail(err, DRAMA_EFORMAT, "codec config: latent_dim %d != quantizer.input_dim %d", cf->latent_dim,
                       cf->q_input_dim), 0;
    return 1;
}

drama_status dr_codec_expected(const dr_codec_config *cf, dr_codec_tensor_cb cb, void *ctx, drama_error *err) {
    drama_status rc = dr_codec_config_validate(cf, err);
    if (rc) return rc;
    if (!valid_tree_config(cf, err)) return err ? err->code : DRAMA_EFORMAT;
    ld *L = calloc(1, sizeof *L);
    dr_codec *scratch = calloc(1, sizeof *scratch);
    if (!L || !scratch) {
        free(L), free(scratch);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    L->cb = cb;
    L->cb_ctx = ctx;
    walk(L, cf, scratch, 0);
    free(L), free(scratch);
    return DRAMA_OK;
}

/* ---- loading ---- */
static void precompute(dr_codec *c) {
    const dr_codec_config *cf = &c->cfg;
    for (int k = 0; k < 1 + cf->n_codebooks; k++) {
        cd_vq *q = &c->vq[k];
        if (!q->codebook) continue;
        cd_vq_normalise(q);
        /* out_proj of every codebook row: per output the same sum in the same order as
         * sum_d cd_weight_at(o, d) * row[d], taken CD_WPACK outputs at a time along the packed
         * block (contiguous, vectorisable: this loop was most of a tiny codec's load time) */
        for (int j = 0; j < q->n; j++) {
            const float *row = q->codebook + (int64_t)j * q->dim;
            float *t = q->table + (int64_t)j * q->cin;
            for (int o0 = 0; o0 < q->cin; o0 += CD_WPACK) {
                const float *w = q->out_proj.w + (int64_t)o0 * q->dim; /* block o0 / CD_WPACK */
                float acc[CD_WPACK] = {0};
                for (int d = 0; d < q->dim; d++)
                    for (int l = 0; l < CD_WPACK; l++) acc[l] += w[(int64_t)d * CD_WPACK + l] * row[d];
                for (int l = 0; l < CD_WPACK && o0 + l < q->cin; l++) t[o0 + l] = acc[l] + q->out_proj.b[o0 + l];
            }
        }
    }
}

static drama_status derive(const named *tab, int64_t n, dr_codec_config *cf, char *why, size_t whylen);

drama_status dr_codec_load(const dr_tensor *tensors, int64_t n, const dr_codec_config *cfg_in, unsigned parts,
                           const char *label, dr_codec **out, drama_error *err) {
    *out = NULL;
    if (!label) label = "codec";
    ld *L = calloc(1, sizeof *L);
    dr_codec *c = calloc(1, sizeof *c);
    if (!L || !c) {
        free(L), free(c);
        return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    }
    drama_status rc = DRAMA_OK;
    c->cfg = *cfg_in;
    c->parts = parts;
    /* names: keep only generator.* (stripped) when any exist, as the reference loaders do */
    int gen = 0;
    for (int64_t i = 0; i < n; i++) gen |= !strncmp(tensors[i].name, "generator.", 10);
    L->tab = calloc((size_t)(n ? n : 1), sizeof *L->tab);
    L->used = calloc((size_t)(n ? n : 1), 1);
    if (!L->tab || !L->used) {
        rc = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        if (gen && strncmp(tensors[i].name, "generator.", 10)) continue;
        L->tab[L->n].name = tensors[i].name + (gen ? 10 : 0);
        L->tab[L->n++].t = &tensors[i];
    }
    qsort(L->tab, (size_t)L->n, sizeof *L->tab, cmp_named);
    for (int64_t i = 1; i < L->n; i++)
        if (!strcmp(L->tab[i].name, L->tab[i - 1].name)) {
            rc = dr_fail(err, DRAMA_EFORMAT, "%s: tensor '%s' appears twice", label, L->tab[i].name);
            goto fail;
        }
    char why[600] = "";
    if ((rc = derive(L->tab, L->n, &c->cfg, why, sizeof why))) {
        rc = dr_fail(err, rc, "%s: %s", label, why);
        goto fail;
    }
    /* stale RoPE / mask buffers of older saves (CODEC.md 10.3): ignored, the engine computes them */
    for (int m = 0; m < 3; m++) {
        char tfp[128], nm[200];
        if (m == 0) snprintf(tfp, sizeof tfp, "encoder.block.%d.block.%d", c->cfg.enc_tf_block, c->cfg.n_dilations + 2);
        else snprintf(tfp, sizeof tfp, "quantizer.%s_module", m == 1 ? "pre" : "post");
        for (int b = 0; b < 2; b++) {
            snprintf(nm, sizeof nm, "%s.%s", tfp, b ? "causal_mask" : "freqs_cis");
            int64_t i = find(L, nm);
            if (i >= 0) L->used[i] = 1;
        }
    }
    if ((rc = dr_codec_config_validate(&c->cfg, err)) || !valid_tree_config(&c->cfg, err)) {
        if (!rc) rc = err ? err->code : DRAMA_EFORMAT;
        dr_error_prefix(err, "%s: ", label);
        goto fail;
    }
    L->c = c;
    walk(L, &c->cfg, c, parts);
    for (int64_t i = 0; i < L->n; i++)
        if (!L->used[i]) finding(L, "unexpected tensor %s", L->tab[i].name);
    if (L->oom) {
        rc = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory loading the codec", label);
        goto fail;
    }
    if (L->n_findings) {
        const char *hint = strstr(L->findings, "attention.wqkv.weight has shape")
                               ? " (n_head and head_dim are not visible in shapes: they come from codec.json; is it "
                                 "missing or wrong?)"
                               : "";
        rc = dr_fail(err, DRAMA_ESHAPE, "%s: %d problem%s%s: %s%s", label, L->n_findings, L->n_findings > 1 ? "s" : "",
                     hint, L->findings, L->n_findings > 12 ? "; ..." : "");
        goto fail;
    }
    /* state tables and decode tables */
    for (int path = 0; path < 2; path++) {
        c->n_conv_states[path] = L->conv_states[path];
        c->n_tf_states[path] = L->tf_states[path];
        c->conv_state_size[path] = calloc((size_t)L->conv_states[path] + 1, sizeof(int));
        c->tf_of_state[path] = calloc((size_t)L->tf_states[path] + 1, sizeof(cd_tf *));
        if (!c->conv_state_size[path] || !c->tf_of_state[path]) {
            rc = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
            goto fail;
        }
        memcpy(c->conv_state_size[path], L->conv_state_size[path], (size_t)L->conv_states[path] * sizeof(int));
        memcpy(c->tf_of_state[path], L->tf_of_state[path], (size_t)L->tf_states[path] * sizeof(cd_tf *));
    }
    for (int k = 0; k < 1 + c->cfg.n_codebooks; k++) {
        cd_vq *q = &c->vq[k];
        if (!q->codebook) continue;
        L->alloc = 1;
        q->cb_hat = own(L, (size_t)q->n * q->dim * sizeof(float));
        q->cb_hat_sq = own(L, (size_t)q->n * sizeof(float));
        q->table = own(L, (size_t)q->n * q->cin * sizeof(float));
        if (L->oom) {
            rc = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory (codebook tables)", label);
            goto fail;
        }
    }
    precompute(c);
    free(L->tab), free(L->used), free(L);
#ifdef __GLIBC__
    /* every weight was read, folded and then re-packed into a new buffer: hand the freed
     * intermediates back to the system instead of leaving them resident (~250 MB at real size) */
    malloc_trim(0);
#endif
    *out = c;
    return DRAMA_OK;
fail:
    free(L->tab), free(L->used), free(L);
    dr_codec_free(c);
    return rc;
}

void dr_codec_free(dr_codec *c) {
    if (!c) return;
    dr_codec_set_accel(c, NULL);
    for (int64_t i = 0; i < c->n_owned; i++) dr_free(c->owned[i]);
    free(c->owned);
    for (int p = 0; p < 2; p++) free(c->conv_state_size[p]), free(c->tf_of_state[p]);
    free(c);
}

const dr_codec_config *dr_codec_cfg(const dr_codec *c) { return &c->cfg; }
void dr_codec_set_pool(dr_codec *c, dr_pool *pool) { c->pool = pool; }
const char *dr_codec_isa(const dr_codec *c) { return cd_isa_name(c->parts & DR_CODEC_LOAD_DECODER ? c->dec_in.isa : c->enc_in.isa); }

/* ---- shape-derived configuration (CODEC.md 9): read from the tensors, checked against codec.json ---- */
static const dr_tensor *lk(const named *tab, int64_t n, const char *name) {
    named key = {name, NULL};
    const named *r = bsearch(&key, tab, (size_t)n, sizeof key, cmp_named);
    return r ? r->t : NULL;
}

static const dr_tensor *wn_weight(const named *tab, int64_t n, const char *m) {
    static const char *suffix[] = {".parametrizations.weight.original1", ".weight_v", ".weight"};
    char name[300];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s%s", m, suffix[i]);
        const dr_tensor *t = lk(tab, n, name);
        if (t && t->ndim == 3) return t;
    }
    return NULL;
}

static int set_derived(int *field, int64_t val, int stated, const char *key, char *why, size_t whylen) {
    if (val < 1 || val > (1 << 20)) {
        snprintf(why, whylen, "tensor shapes give %s = %lld, outside 1..%d", key, (long long)val, 1 << 20);
        return 0;
    }
    if (stated && *field != val) {
        snprintf(why, whylen, "codec.json says %s = %d but the tensors say %lld", key, *field, (long long)val);
        return 0;
    }
    *field = (int)val;
    return 1;
}

static int derive_tf(const named *tab, int64_t n, const char *p, dr_codec_tf_config *t, uint64_t stated, int shift,
                     const char *key, char *why, size_t whylen) {
    char name[300], k2[160];
    int64_t layers = 0;
    for (; layers < 1000; layers++) {
        snprintf(name, sizeof name, "%s.layers.%lld.attention.wqkv.weight", p, (long long)layers);
        if (!lk(tab, n, name)) break;
    }
    if (layers == 0) {
        if ((stated >> shift & 1) && t->n_layer) {
            snprintf(why, whylen, "codec.json says %s.n_layer = %d but the tensors have no %s.layers.0", key, t->n_layer, p);
            return 0;
        }
        if (!(stated >> shift & 1)) t->n_layer = 0;
        return 1;
    }
    snprintf(k2, sizeof k2, "%s.n_layer", key);
    if (!set_derived(&t->n_layer, layers, (int)(stated >> shift & 1), k2, why, whylen)) return 0;
    snprintf(name, sizeof name, "%s.norm.weight", p);
    const dr_tensor *x = lk(tab, n, name);
    snprintf(k2, sizeof k2, "%s.dim", key);
    if (x && x->ndim == 1 && !set_derived(&t->dim, x->shape[0], (int)(stated >> (shift + 1) & 1), k2, why, whylen)) return 0;
    snprintf(name, sizeof name, "%s.layers.0.feed_forward.w1.weight", p);
    x = lk(tab, n, name);
    snprintf(k2, sizeof k2, "%s.intermediate_size", key);
    if (x && x->ndim == 2 &&
        !set_derived(&t->intermediate_size, x->shape[0], (int)(stated >> (shift + 2) & 1), k2, why, whylen))
        return 0;
    return 1;
}

static drama_status derive(const named *tab, int64_t n, dr_codec_config *cf, char *why, size_t whylen) {
    uint64_t st = cf->stated;
    const dr_tensor *t;
    char p[300];
#define DERIVE(field, val, flag, key) \
    if (!set_derived(&cf->field, (val), (st & (flag)) != 0, key, why, whylen)) return DRAMA_ESHAPE
    if ((t = wn_weight(tab, n, "encoder.block.0.conv"))) DERIVE(encoder_dim, t->shape[0], DR_CS_ENCODER_DIM, "encoder_dim");
    if ((t = wn_weight(tab, n, "decoder.model.0.conv"))) {
        DERIVE(decoder_dim, t->shape[0], DR_CS_DECODER_DIM, "decoder_dim");
        DERIVE(latent_dim, t->shape[1], DR_CS_LATENT_DIM, "latent_dim");
    }
    if ((t = wn_weight(tab, n, "quantizer.semantic_quantizer.quantizers.0.in_proj")))
        DERIVE(q_input_dim, t->shape[1], DR_CS_Q_INPUT_DIM, "quantizer.input_dim");
    if ((t = lk(tab, n, "quantizer.semantic_quantizer.quantizers.0.codebook.weight")) && t->ndim == 2) {
        DERIVE(semantic_codebook_size, t->shape[0], DR_CS_SEM_SIZE, "quantizer.semantic_codebook_size");
        DERIVE(codebook_dim, t->shape[1], DR_CS_CB_DIM, "quantizer.codebook_dim");
    }
    int books = 0;
    for (; books < DR_CODEC_MAX_BOOKS; books++) {
        snprintf(p, sizeof p, "quantizer.quantizer.quantizers.%d.codebook.weight", books);
        if (!lk(tab, n, p)) break;
    }
    if (books >= DR_CODEC_MAX_BOOKS) {
        snprintf(why, whylen, "more than %d residual codebooks", DR_CODEC_MAX_BOOKS - 1);
        return DRAMA_EUNSUPPORTED;
    }
    if (books > 0) {
        if ((st & DR_CS_N_CODEBOOKS) && cf->n_codebooks != books) {
            snprintf(why, whylen, "codec.json says quantizer.n_codebooks = %d but the tensors have %d", cf->n_codebooks, books);
            return DRAMA_ESHAPE;
        }
        cf->n_codebooks = books;
        if ((t = lk(tab, n, "quantizer.quantizer.quantizers.0.codebook.weight")) && t->ndim == 2)
            DERIVE(codebook_size, t->shape[0], DR_CS_CB_SIZE, "quantizer.codebook_size");
    }
#undef DERIVE
    snprintf(p, sizeof p, "encoder.block.%d.block.%d", cf->enc_tf_block, cf->n_dilations + 2);
    if (!derive_tf(tab, n, p, &cf->enc_tf, st, DR_CS_ENC_TF_SHIFT, "encoder_transformer", why, whylen) ||
        !derive_tf(tab, n, "quantizer.pre_module", &cf->pre, st, DR_CS_PRE_SHIFT, "quantizer.pre_module", why, whylen) ||
        !derive_tf(tab, n, "quantizer.post_module", &cf->post, st, DR_CS_POST_SHIFT, "quantizer.post_module", why, whylen))
        return DRAMA_ESHAPE;
    if (!(st & DR_CS_NUM_BOOKS)) cf->num_codebooks = 1 + cf->n_codebooks;
    if (!(st & DR_CS_CLAMP)) {
        cf->upper_clamp[0] = cf->semantic_codebook_size - 1;
        for (int k = 1; k < cf->num_codebooks && k < DR_CODEC_MAX_BOOKS; k++) cf->upper_clamp[k] = cf->codebook_size - 1;
    }
    /* the decoder indexes its tables with clamped codes: a clamp past the codebook would read
     * outside them (the reference would fail there too) */
    for (int k = 0; k < cf->num_codebooks && k < DR_CODEC_MAX_BOOKS; k++) {
        int size = k == 0 ? cf->semantic_codebook_size : cf->codebook_size;
        if (cf->upper_clamp[k] > size - 1) {
            snprintf(why, whylen, "codec.json codes.decode_upper_clamp[%d] = %d is past the codebook (%d entries)", k,
                     cf->upper_clamp[k], size);
            return DRAMA_ESHAPE;
        }
    }
    return DRAMA_OK;
}
