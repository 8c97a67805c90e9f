/* codec_dec.cu - the codec decoder on a CUDA device (cuda_codec.h): weights uploaded once from a
 * loaded dr_codec, per-stream device state (conv histories, the post_module's K/V ring), and the
 * decode of one chunk of <= 16 frames in the CPU's layer order (codec/decode.c). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/codec_kernels.cuh"
#include "backend/cuda/cuda_codec.h"

extern "C" {
#include "codec/internal.h"
}

#define CC_CHUNK 16 /* frames per feed (codec/decode.c CHUNK) */

namespace {

struct dconv {
    int cin, cout, K, dil, H, phases, state, splits, depthwise;
    int64_t phase_len; /* floats of one phase's weights */
    float *w;          /* phases x [cin][K][cout] (depthwise: [c][K]) */
    const float *b;
};

struct dsnake {
    const float *alpha, *inv;
};

struct dru {
    dsnake s1, s2;
    dconv c1, c2;
};

struct dcnx {
    dconv dw, pw1, pw2;
    const float *ln_w, *ln_b, *gamma;
    float eps;
};

struct dtl {
    dconv wqkv, wo, w1, w2, w3;
    const float *attn_norm, *ffn_norm, *g_attn, *g_ffn;
};

struct dtf {
    dr_codec_tf_config cfg;
    std::vector<dtl> layers;
    const float *norm;
    int cap; /* ring rows: window + CC_CHUNK */
};

struct dblock {
    dsnake snake;
    dconv up;
    dru ru[CD_MAX_RU];
};

enum { B_A, B_B, B_D, B_PART, B_CUR, B_NRM, B_QKV, B_ATT, B_F1, B_F3, B_CNX_H, B_CNX_M, B_OUT, B_N };

struct ccodec {
    const dr_codec *c;
    dr_codec_config cfg;
    int device;
    cudaStream_t stream;
    pthread_mutex_t mu;
    std::vector<void *> owned;
    size_t weight_bytes;
    ck_tables tables;
    dtf post;
    dconv up[DR_CODEC_MAX_RATES];
    dcnx up_cnx[DR_CODEC_MAX_RATES];
    dconv dec_in, dec_out;
    dblock dec[DR_CODEC_MAX_RATES];
    dsnake dec_snake;
    float *buf[B_N];
    size_t cap[B_N];
    int32_t *dcodes;
    cudaError_t fail; /* first launch error of the current feed */
    int prof;         /* DRAMA_CUDA_CODEC_PROFILE=1: device time per stage on stderr after each feed */
    cudaEvent_t ev[24];
    const char *ev_name[24];
    int n_ev;
};

/* a profiling mark (no-op unless cc->prof) */
void mark(ccodec *cc, const char *name) {
    if (!cc->prof || cc->n_ev >= 24) return;
    if (!cc->ev[cc->n_ev]) cudaEventCreate(&cc->ev[cc->n_ev]);
    cc->ev_name[cc->n_ev] = name;
    cudaEventRecord(cc->ev[cc->n_ev++], cc->stream);
}

struct cstream {
    std::vector<float *> hist[2]; /* [n_conv_states] device: the current history and the next */
    std::vector<int> cur;         /* which of the two is current */
    std::vector<int> hist_len;
    float *rk, *rv;            /* post_module ring [n_layer][cap][Dq] */
    int64_t pos;
};

drama_status cuerr(cudaError_t e, const char *what, drama_error *err) {
    if (e == cudaSuccess) return DRAMA_OK;
    return dr_fail(err, e == cudaErrorMemoryAllocation ? DRAMA_ENOMEM : DRAMA_EINTERNAL, "cuda codec: %s: %s", what,
                   cudaGetErrorString(e));
}

void *dev_alloc(ccodec *cc, size_t bytes, drama_error *err) {
    void *p = NULL;
    if (cuerr(cudaMalloc(&p, bytes ? bytes : 4), "cudaMalloc", err)) return NULL;
    cc->owned.push_back(p);
    return p;
}

const float *put_vec(ccodec *cc, const float *h, int64_t n, drama_error *err, drama_status *st) {
    if (*st || !h) return NULL;
    float *d = (float *)dev_alloc(cc, (size_t)n * 4, err);
    if (!d || cuerr(cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice), "upload", err)) {
        *st = err->code ? (drama_status)err->code : DRAMA_EINTERNAL;
        return NULL;
    }
    cc->weight_bytes += (size_t)n * 4;
    return d;
}

/* a fixed split of the input channels (chosen from the shape only, so chunking never changes it):
 * the most parts (<= 16, a power of two dividing cin) that keep >= 256 products per part */
int pick_splits(int cin, int K) {
    int s = 1;
    while (s < 16 && cin % (2 * s) == 0 && (int64_t)cin * K / (2 * s) >= 256) s *= 2;
    return s;
}

drama_status up_conv(ccodec *cc, const cd_conv *cv, dconv *d, drama_error *err) {
    memset(d, 0, sizeof *d);
    d->cin = cv->cin, d->cout = cv->cout, d->state = cv->state, d->H = cv->hist;
    if (cv->groups != 1 && !(cv->groups == cv->cin && cv->cin == cv->cout))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda codec: a conv with %d groups of %d channels", cv->groups, cv->cin);
    if (cv->stride != 1 && !cv->transposed)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda codec: a strided conv in the decoder (stride %d)", cv->stride);
    d->depthwise = cv->groups != 1;
    if (cv->transposed) {
        d->phases = cv->stride, d->K = (cv->k + cv->stride - 1) / cv->stride, d->dil = 1;
    } else {
        d->phases = 1, d->K = cv->k, d->dil = cv->dil;
    }
    if (d->H != (d->K - 1) * d->dil)
        return dr_fail(err, DRAMA_EINTERNAL, "cuda codec: conv history %d for %d taps of dilation %d", d->H, d->K, d->dil);
    int cin_g = d->depthwise ? 1 : d->cin;
    d->phase_len = (int64_t)cin_g * d->K * d->cout;
    d->splits = d->depthwise ? 1 : pick_splits(d->cin, d->K);
    std::vector<float> h((size_t)(d->phase_len * d->phases));
    int64_t plen = cd_packed_len(d->cout, cin_g, d->K);
    for (int q = 0; q < d->phases; q++) {
        const float *pk = cv->w + (int64_t)q * plen; /* one output phase: a stride-1 conv (ops.c) */
        float *o = h.data() + (int64_t)q * d->phase_len;
        for (int oc = 0; oc < d->cout; oc++)
            for (int i = 0; i < cin_g; i++)
                for (int k = 0; k < d->K; k++) {
                    float v = cd_weight_at(pk, cin_g, d->K, oc, i, k);
                    if (d->depthwise) o[(int64_t)oc * d->K + k] = v;
                    else o[((int64_t)i * d->K + k) * d->cout + oc] = v;
                }
    }
    drama_status st = DRAMA_OK;
    d->w = (float *)put_vec(cc, h.data(), (int64_t)h.size(), err, &st);
    if (!st && cv->b) d->b = put_vec(cc, cv->b, cv->cout, err, &st);
    return st;
}

drama_status up_snake(ccodec *cc, const cd_snake *s, dsnake *d, drama_error *err) {
    drama_status st = DRAMA_OK;
    d->alpha = put_vec(cc, s->alpha, s->c, err, &st);
    d->inv = put_vec(cc, s->inv, s->c, err, &st);
    return st;
}

drama_status up_tf(ccodec *cc, const cd_tf *tf, dtf *d, drama_error *err) {
    d->cfg = tf->cfg;
    d->cap = tf->cfg.window_size + CC_CHUNK;
    if (ck_attend_smem(tf->cfg.window_size, tf->cfg.head_dim) > 48 * 1024)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda codec: post_module window %d x head dim %d exceeds the staged K tile",
                       tf->cfg.window_size, tf->cfg.head_dim);
    d->layers.resize((size_t)tf->cfg.n_layer);
    int D = tf->cfg.dim;
    drama_status st = DRAMA_OK;
    for (int l = 0; l < tf->cfg.n_layer && !st; l++) {
        const cd_tlayer *s = &tf->layers[l];
        dtl *o = &d->layers[(size_t)l];
        if (!st) st = up_conv(cc, &s->wqkv, &o->wqkv, err);
        if (!st) st = up_conv(cc, &s->wo, &o->wo, err);
        if (!st) st = up_conv(cc, &s->w1, &o->w1, err);
        if (!st) st = up_conv(cc, &s->w2, &o->w2, err);
        if (!st) st = up_conv(cc, &s->w3, &o->w3, err);
        o->attn_norm = put_vec(cc, s->attn_norm, D, err, &st);
        o->ffn_norm = put_vec(cc, s->ffn_norm, D, err, &st);
        o->g_attn = put_vec(cc, s->g_attn, D, err, &st);
        o->g_ffn = put_vec(cc, s->g_ffn, D, err, &st);
    }
    d->norm = put_vec(cc, tf->norm, D, err, &st);
    return st;
}

float *scratch(ccodec *cc, int slot, int64_t floats) {
    size_t bytes = (size_t)(floats > 0 ? floats : 1) * 4;
    if (bytes > cc->cap[slot]) {
        if (cc->buf[slot]) cudaFree(cc->buf[slot]); /* waits for queued work */
        cc->buf[slot] = NULL, cc->cap[slot] = 0;
        if (cudaMalloc(&cc->buf[slot], bytes) != cudaSuccess) {
            cc->buf[slot] = NULL;
            if (!cc->fail) cc->fail = cudaErrorMemoryAllocation;
            return NULL;
        }
        cc->cap[slot] = bytes;
    }
    return cc->buf[slot];
}

void note(ccodec *cc, cudaError_t e) {
    if (e != cudaSuccess && !cc->fail) cc->fail = e;
}

/* a stateful conv's history: read `in`, write the next call's into `out`, then swap */
struct hpair {
    float *in, *out;
    int *cur;
};

/* y = epi(conv(snake_in(x))) for L input steps (snake_in NULL: none; every output phase of a
 * transposed conv in the same launch); the epilogue's bias and output placement are filled here */
void conv(ccodec *cc, const dconv *cv, hpair hp, const float *x, int64_t L, float *y, ck_epi e,
          const dsnake *snake_in = NULL) {
    if (cc->fail || L <= 0) return;
    float *hist = hp.in;
    e.bias = cv->b;
    if (cv->depthwise) {
        note(cc, ck_dwconv(cv->w, cv->b, hist, x, cv->cin, cv->K, cv->dil, cv->H, L, y, cc->stream));
    } else {
        ck_conv p = {};
        p.w = cv->w, p.phases = cv->phases, p.phase_len = cv->phase_len;
        if (snake_in) p.in_alpha = snake_in->alpha, p.in_inv = snake_in->inv;
        p.hist = hist, p.x = x, p.cin = cv->cin, p.cout = cv->cout, p.K = cv->K, p.dil = cv->dil, p.H = cv->H;
        p.L = L, p.splits = cv->splits;
        p.e = e;
        p.e.y = y, p.e.ldy = L * cv->phases;
        if (cv->splits > 1) {
            p.part = scratch(cc, B_PART, (int64_t)cv->phases * cv->splits * cv->cout * L);
            if (!p.part) return;
        }
        note(cc, ck_conv_launch(&p, cc->stream));
        if (cv->splits > 1) note(cc, ck_reduce_launch(p.part, cv->splits, cv->phases, cv->cout, L, &p.e, cc->stream));
    }
    if (cv->H > 0 && hist) { /* the last H input columns (before any Snake) become the next call's history */
        note(cc, ck_hist_next(hist, x, cv->cin, cv->H, L, hp.out, cc->stream));
        *hp.cur ^= 1;
    }
}

ck_epi epi_none() {
    ck_epi e = {};
    return e;
}

hpair hist_of(cstream *s, const dconv *cv) {
    hpair h = {NULL, NULL, NULL};
    if (cv->state < 0) return h;
    size_t i = (size_t)cv->state;
    int c = s->cur[i];
    h.in = s->hist[c][i], h.out = s->hist[c ^ 1][i], h.cur = &s->cur[i];
    return h;
}

const hpair no_hist = {NULL, NULL, NULL};

void tf_run(ccodec *cc, cstream *s, const float *x, int64_t T, float *y) {
    const dtf *tf = &cc->post;
    const dr_codec_tf_config *cf = &tf->cfg;
    int D = cf->dim, H = cf->n_head, hd = cf->head_dim, Dq = H * hd, F = cf->intermediate_size;
    float eps = (float)cf->norm_eps;
    float *cur = scratch(cc, B_CUR, (int64_t)D * T), *nrm = scratch(cc, B_NRM, (int64_t)D * T);
    float *qkv = scratch(cc, B_QKV, (int64_t)3 * Dq * T), *att = scratch(cc, B_ATT, (int64_t)Dq * T);
    float *f1 = scratch(cc, B_F1, (int64_t)F * T), *f3 = scratch(cc, B_F3, (int64_t)F * T);
    if (cc->fail) return;
    note(cc, cudaMemcpyAsync(cur, x, (size_t)D * T * 4, cudaMemcpyDeviceToDevice, cc->stream));
    for (int l = 0; l < cf->n_layer && !cc->fail; l++) {
        const dtl *ly = &tf->layers[(size_t)l];
        float *rk = s->rk + (int64_t)l * tf->cap * Dq, *rv = s->rv + (int64_t)l * tf->cap * Dq;
        note(cc, ck_rmsnorm(cur, nrm, D, T, ly->attn_norm, eps, cc->stream));
        conv(cc, &ly->wqkv, no_hist, nrm, T, qkv, epi_none());
        note(cc, ck_rope(qkv, 0, H, hd, (float)cf->rope_base, cf->rope_bf16, T, s->pos, cc->stream));
        note(cc, ck_rope(qkv, Dq, H, hd, (float)cf->rope_base, cf->rope_bf16, T, s->pos, cc->stream));
        note(cc, ck_kv_store(qkv, Dq, T, rk, rv, tf->cap, s->pos, cc->stream));
        note(cc, ck_attend(qkv, rk, rv, tf->cap, H, hd, cf->window_size, T, s->pos, att, cc->stream));
        ck_epi e = epi_none();
        e.gamma = ly->g_attn, e.res = cur;
        conv(cc, &ly->wo, no_hist, att, T, cur, e);
        note(cc, ck_rmsnorm(cur, nrm, D, T, ly->ffn_norm, eps, cc->stream));
        conv(cc, &ly->w3, no_hist, nrm, T, f3, epi_none());
        e = epi_none();
        e.act = CK_ACT_SILU_MUL, e.aux = f3;
        conv(cc, &ly->w1, no_hist, nrm, T, f1, e);
        e = epi_none();
        e.gamma = ly->g_ffn, e.res = cur;
        conv(cc, &ly->w2, no_hist, f1, T, cur, e);
    }
    note(cc, ck_rmsnorm(cur, y, D, T, tf->norm, eps, cc->stream));
    s->pos += T;
}

void cnx_run(ccodec *cc, cstream *s, const dcnx *b, float *x, int64_t L) {
    int C = b->dw.cout, Hd = b->pw1.cout;
    float *h = scratch(cc, B_CNX_H, (int64_t)C * L), *m = scratch(cc, B_CNX_M, (int64_t)Hd * L);
    if (cc->fail) return;
    conv(cc, &b->dw, hist_of(s, &b->dw), x, L, h, epi_none());
    note(cc, ck_layernorm(h, C, L, b->ln_w, b->ln_b, b->eps, cc->stream));
    ck_epi e = epi_none();
    e.act = CK_ACT_GELU;
    conv(cc, &b->pw1, no_hist, h, L, m, e);
    e = epi_none();
    e.gamma = b->gamma, e.res = x;
    conv(cc, &b->pw2, no_hist, m, L, x, e);
}

/* one chunk of T <= CC_CHUNK frames (codes clamped, on the device) -> B_OUT */
void decode_chunk(ccodec *cc, cstream *s, int64_t T) {
    const dr_codec_config *cf = &cc->cfg;
    int Q = cf->q_input_dim;
    int cur = B_A;
    float *a = scratch(cc, B_A, (int64_t)Q * T);
    if (cc->fail) return;
    mark(cc, "start");
    note(cc, ck_vq_sum(&cc->tables, cf->num_codebooks, cc->dcodes, Q, (int)T, a, cc->stream));
    int64_t len = T, ch = Q;
    auto next = [&](int64_t nch, int64_t nlen) -> float * {
        int o = cur == B_A ? B_B : B_A;
        float *p = scratch(cc, o, nch * nlen);
        return p;
    };
    auto flip = [&](int64_t nch, int64_t nlen) {
        cur = cur == B_A ? B_B : B_A;
        ch = nch, len = nlen;
    };
    if (cf->post.n_layer > 0) {
        float *y = next(Q, T);
        if (cc->fail) return;
        tf_run(cc, s, cc->buf[cur], T, y);
        flip(Q, T);
    }
    for (int i = 0; i < cf->n_down && !cc->fail; i++) {
        const dconv *u = &cc->up[i];
        float *y = next(u->cout, len * u->phases);
        if (cc->fail) return;
        conv(cc, u, hist_of(s, u), cc->buf[cur], len, y, epi_none());
        flip(u->cout, len * u->phases);
        cnx_run(cc, s, &cc->up_cnx[i], cc->buf[cur], len);
    }
    mark(cc, "codes+post+upsample");
    {
        float *y = next(cc->dec_in.cout, len);
        if (cc->fail) return;
        conv(cc, &cc->dec_in, hist_of(s, &cc->dec_in), cc->buf[cur], len, y, epi_none());
        flip(cc->dec_in.cout, len);
    }
    mark(cc, "dec_in");
    for (int b = 0; b < cf->n_decoder_rates && !cc->fail; b++) {
        const dblock *db = &cc->dec[b];
        float *y = next(db->up.cout, len * db->up.phases);
        if (cc->fail) return;
        conv(cc, &db->up, hist_of(s, &db->up), cc->buf[cur], len, y, epi_none(), &db->snake);
        flip(db->up.cout, len * db->up.phases);
        mark(cc, "block up");
        for (int r = 0; r < cf->n_dilations && !cc->fail; r++) {
            const dru *ru = &db->ru[r];
            float *x = cc->buf[cur];
            float *sb = scratch(cc, B_D, (int64_t)ru->c1.cout * len);
            if (cc->fail) return;
            ck_epi e = epi_none();
            e.act = CK_ACT_SNAKE, e.alpha = ru->s2.alpha, e.inv = ru->s2.inv;
            conv(cc, &ru->c1, hist_of(s, &ru->c1), x, len, sb, e, &ru->s1); /* x + c2(s2(c1(s1(x)))) */
            e = epi_none();
            e.res = x;
            conv(cc, &ru->c2, hist_of(s, &ru->c2), sb, len, x, e);
        }
        mark(cc, "block residual units");
    }
    if (cc->fail) return;
    float *out = scratch(cc, B_OUT, len);
    if (cc->fail) return;
    ck_epi e = epi_none();
    e.act = CK_ACT_TANH;
    conv(cc, &cc->dec_out, hist_of(s, &cc->dec_out), cc->buf[cur], len, out, e, &cc->dec_snake);
    mark(cc, "out");
}

/* ---- the dr_codec_accel entries ---- */

void free_stream(cstream *s) {
    for (int k = 0; k < 2; k++)
        for (float *p : s->hist[k]) cudaFree(p);
    cudaFree(s->rk), cudaFree(s->rv);
    delete s;
}

drama_status acc_stream_create(void *ctx, void **out, drama_error *err) {
    ccodec *cc = (ccodec *)ctx;
    *out = NULL;
    cstream *s = new (std::nothrow) cstream();
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "cuda codec: out of memory");
    pthread_mutex_lock(&cc->mu);
    drama_status st = cuerr(cudaSetDevice(cc->device), "cudaSetDevice", err);
    const dr_codec *c = cc->c;
    for (int i = 0; i < c->n_conv_states[0] && !st; i++) {
        size_t bytes = (size_t)c->conv_state_size[0][i] * 4;
        for (int k = 0; k < 2 && !st; k++) {
            float *p = NULL;
            st = cuerr(cudaMalloc(&p, bytes ? bytes : 4), "stream state", err);
            if (!st) st = cuerr(cudaMemset(p, 0, bytes), "stream state", err);
            if (p) s->hist[k].push_back(p);
        }
        s->hist_len.push_back(c->conv_state_size[0][i]);
        s->cur.push_back(0);
    }
    if (!st && cc->cfg.post.n_layer > 0) {
        const dr_codec_tf_config *t = &cc->post.cfg;
        size_t n = (size_t)t->n_layer * cc->post.cap * t->n_head * t->head_dim * 4;
        st = cuerr(cudaMalloc(&s->rk, n), "stream K/V", err);
        if (!st) st = cuerr(cudaMalloc(&s->rv, n), "stream K/V", err);
    }
    pthread_mutex_unlock(&cc->mu);
    if (st) {
        free_stream(s);
        return st;
    }
    *out = s;
    return DRAMA_OK;
}

void acc_stream_free(void *ctx, void *sp) {
    ccodec *cc = (ccodec *)ctx;
    pthread_mutex_lock(&cc->mu);
    cudaSetDevice(cc->device);
    cudaStreamSynchronize(cc->stream);
    free_stream((cstream *)sp);
    pthread_mutex_unlock(&cc->mu);
}

void acc_stream_reset(void *ctx, void *sp) {
    ccodec *cc = (ccodec *)ctx;
    cstream *s = (cstream *)sp;
    pthread_mutex_lock(&cc->mu);
    cudaSetDevice(cc->device);
    cudaStreamSynchronize(cc->stream);
    for (size_t i = 0; i < s->hist_len.size(); i++) {
        cudaMemset(s->hist[0][i], 0, (size_t)s->hist_len[i] * 4);
        s->cur[i] = 0;
    }
    s->pos = 0;
    pthread_mutex_unlock(&cc->mu);
}

drama_status acc_feed(void *ctx, void *sp, const int32_t *codes, int64_t n, float *out, drama_error *err) {
    ccodec *cc = (ccodec *)ctx;
    cstream *s = (cstream *)sp;
    const dr_codec_config *cf = &cc->cfg;
    int K = cf->num_codebooks;
    if (n <= 0) return DRAMA_OK;
    if (n > CC_CHUNK) return dr_fail(err, DRAMA_EINTERNAL, "cuda codec: %lld frames in one call (at most %d)", (long long)n, CC_CHUNK);
    int32_t cl[CC_CHUNK * DR_CODEC_MAX_BOOKS];
    for (int64_t f = 0; f < n; f++)
        for (int k = 0; k < K; k++) {
            int32_t v = codes[f * K + k];
            cl[f * K + k] = v > cf->upper_clamp[k] ? cf->upper_clamp[k] : v; /* the reference's clamp */
        }
    pthread_mutex_lock(&cc->mu);
    cc->fail = cudaSuccess;
    drama_status st = cuerr(cudaSetDevice(cc->device), "cudaSetDevice", err);
    if (!st) {
        note(cc, cudaMemcpyAsync(cc->dcodes, cl, (size_t)(n * K) * 4, cudaMemcpyHostToDevice, cc->stream));
        decode_chunk(cc, s, n);
        if (!cc->fail)
            note(cc, cudaMemcpyAsync(out, cc->buf[B_OUT], (size_t)(n * cf->frame_length) * 4, cudaMemcpyDeviceToHost,
                                     cc->stream));
        note(cc, cudaStreamSynchronize(cc->stream));
        st = cuerr(cc->fail, "decode", err);
        if (cc->prof && cc->n_ev > 1) {
            fprintf(stderr, "cuda codec profile, %lld frames:", (long long)n);
            for (int i = 1; i < cc->n_ev; i++) {
                float ms = 0;
                cudaEventElapsedTime(&ms, cc->ev[i - 1], cc->ev[i]);
                fprintf(stderr, " %s %.3f ms%s", cc->ev_name[i], ms, i + 1 < cc->n_ev ? ";" : "\n");
            }
        }
        cc->n_ev = 0;
    }
    pthread_mutex_unlock(&cc->mu);
    return st;
}

void acc_free(void *ctx) {
    ccodec *cc = (ccodec *)ctx;
    if (!cc) return;
    cudaSetDevice(cc->device);
    if (cc->stream) cudaStreamSynchronize(cc->stream);
    for (void *p : cc->owned) cudaFree(p);
    for (int i = 0; i < B_N; i++) cudaFree(cc->buf[i]);
    for (int i = 0; i < 24; i++)
        if (cc->ev[i]) cudaEventDestroy(cc->ev[i]);
    if (cc->stream) cudaStreamDestroy(cc->stream);
    pthread_mutex_destroy(&cc->mu);
    delete cc;
}

drama_status upload_all(ccodec *cc, const dr_codec *c, drama_error *err) {
    const dr_codec_config *cf = &c->cfg;
    drama_status st = DRAMA_OK;
    if (cf->num_codebooks > CK_MAX_BOOKS) return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda codec: %d codebooks", cf->num_codebooks);
    for (int k = 0; k < cf->num_codebooks && !st; k++)
        cc->tables.t[k] = put_vec(cc, c->vq[k].table, (int64_t)c->vq[k].n * cf->q_input_dim, err, &st);
    if (!st && cf->post.n_layer > 0) st = up_tf(cc, &c->post, &cc->post, err);
    for (int i = 0; i < cf->n_down && !st; i++) {
        const cd_convnext *s = &c->up_cnx[i];
        dcnx *d = &cc->up_cnx[i];
        st = up_conv(cc, &c->up[i], &cc->up[i], err);
        if (!st) st = up_conv(cc, &s->dw, &d->dw, err);
        if (!st) st = up_conv(cc, &s->pw1, &d->pw1, err);
        if (!st) st = up_conv(cc, &s->pw2, &d->pw2, err);
        d->ln_w = put_vec(cc, s->ln_w, s->dw.cout, err, &st);
        d->ln_b = put_vec(cc, s->ln_b, s->dw.cout, err, &st);
        d->gamma = put_vec(cc, s->gamma, s->dw.cout, err, &st);
        d->eps = (float)s->ln_eps;
    }
    if (!st) st = up_conv(cc, &c->dec_in, &cc->dec_in, err);
    for (int b = 0; b < cf->n_decoder_rates && !st; b++) {
        const cd_dec_block *s = &c->dec[b];
        dblock *d = &cc->dec[b];
        st = up_snake(cc, &s->snake, &d->snake, err);
        if (!st) st = up_conv(cc, &s->up, &d->up, err);
        for (int r = 0; r < cf->n_dilations && !st; r++) {
            st = up_snake(cc, &s->ru[r].s1, &d->ru[r].s1, err);
            if (!st) st = up_snake(cc, &s->ru[r].s2, &d->ru[r].s2, err);
            if (!st) st = up_conv(cc, &s->ru[r].c1, &d->ru[r].c1, err);
            if (!st) st = up_conv(cc, &s->ru[r].c2, &d->ru[r].c2, err);
        }
    }
    if (!st) st = up_snake(cc, &c->dec_snake, &cc->dec_snake, err);
    if (!st) st = up_conv(cc, &c->dec_out, &cc->dec_out, err);
    if (!st) {
        cc->dcodes = (int32_t *)dev_alloc(cc, (size_t)CC_CHUNK * DR_CODEC_MAX_BOOKS * 4, err);
        if (!cc->dcodes) st = DRAMA_ENOMEM;
    }
    return st;
}

} // namespace

extern "C" drama_status dr_cuda_codec_attach(dr_codec *c, int device, drama_error *err) {
    if (!(c->parts & DR_CODEC_LOAD_DECODER)) return dr_fail(err, DRAMA_EINVAL, "cuda codec: loaded without the decoder");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "cuda codec: no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (device < 0 || device >= n)
        return dr_fail(err, DRAMA_EINVAL, "cuda codec: device %d out of range (%d present)", device, n);
    ccodec *cc = new (std::nothrow) ccodec();
    if (!cc) return dr_fail(err, DRAMA_ENOMEM, "cuda codec: out of memory");
    cc->c = c, cc->cfg = c->cfg, cc->device = device;
    const char *pe = getenv("DRAMA_CUDA_CODEC_PROFILE");
    cc->prof = pe && pe[0] == '1';
    pthread_mutex_init(&cc->mu, NULL);
    drama_status st = cuerr(cudaSetDevice(device), "cudaSetDevice", err);
    if (!st) st = cuerr(cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking), "cudaStreamCreate", err);
    if (!st) st = upload_all(cc, c, err);
    if (st) {
        acc_free(cc);
        return st;
    }
    dr_codec_accel a = {"cuda", cc, acc_stream_create, acc_stream_free, acc_stream_reset, acc_feed, acc_free};
    dr_codec_set_accel(c, &a);
    return DRAMA_OK;
}

extern "C" size_t dr_cuda_codec_weight_bytes(const dr_codec *c) {
    return c->accel.free == acc_free ? ((const ccodec *)c->accel.ctx)->weight_bytes : 0;
}

extern "C" drama_status dr_cuda_codec_conv_test(const float *w, const float *b, const float *x, int cin, int cout,
                                                int K, int dil, int64_t L, int act, const float *alpha,
                                                const float *inv, const float *res, int splits, int plant, float *y,
                                                drama_error *err) {
    int H = (K - 1) * dil;
    if (splits < 1 || cin % splits || K < 1 || K > 64 || L < 1)
        return dr_fail(err, DRAMA_EINVAL, "cuda codec conv test: bad geometry");
    std::vector<float> wt((size_t)cin * K * cout);
    for (int o = 0; o < cout; o++)
        for (int i = 0; i < cin; i++)
            for (int k = 0; k < K; k++) wt[((size_t)i * K + k) * cout + o] = w[((size_t)o * cin + i) * K + k];
    std::vector<float> hx((size_t)cin * (H + L > 0 ? H + L : 1)), xx((size_t)cin * L), hh((size_t)cin * (H ? H : 1));
    for (int i = 0; i < cin; i++) {
        for (int c = 0; c < H; c++) hh[(size_t)i * H + c] = x[(size_t)i * (H + L) + c];
        for (int64_t t = 0; t < L; t++) xx[(size_t)i * L + t] = x[(size_t)i * (H + L) + H + t];
    }
    float *dw = NULL, *db = NULL, *dh = NULL, *dx = NULL, *dy = NULL, *da = NULL, *di = NULL, *dr = NULL, *dp = NULL;
    size_t ny = (size_t)cout * L * 4;
    drama_status st = DRAMA_OK;
    auto up = [&](float **d, const void *h, size_t bytes) {
        if (st || !h) return;
        st = cuerr(cudaMalloc(d, bytes ? bytes : 4), "cudaMalloc", err);
        if (!st) st = cuerr(cudaMemcpy(*d, h, bytes, cudaMemcpyHostToDevice), "upload", err);
    };
    up(&dw, wt.data(), wt.size() * 4);
    up(&db, b, (size_t)cout * 4);
    if (H) up(&dh, hh.data(), hh.size() * 4);
    up(&dx, xx.data(), xx.size() * 4);
    up(&da, alpha, (size_t)cout * 4);
    up(&di, inv, (size_t)cout * 4);
    up(&dr, res, ny);
    if (!st) st = cuerr(cudaMalloc(&dy, ny), "cudaMalloc", err);
    if (!st && splits > 1) st = cuerr(cudaMalloc(&dp, ny * splits), "cudaMalloc", err);
    if (!st) {
        ck_conv p = {};
        p.w = dw, p.hist = dh, p.x = dx, p.cin = cin, p.cout = cout, p.K = K, p.dil = dil, p.H = H, p.L = L;
        p.splits = splits, p.part = dp, p.plant = plant;
        p.e.bias = db, p.e.act = act == 1 ? CK_ACT_SNAKE : act == 2 ? CK_ACT_TANH : CK_ACT_NONE;
        p.e.alpha = da, p.e.inv = di, p.e.res = dr, p.e.y = dy, p.e.ldy = L;
        p.phases = 1;
        st = cuerr(ck_conv_launch(&p, 0), "conv launch", err);
        if (!st && splits > 1) st = cuerr(ck_reduce_launch(dp, splits, 1, cout, L, &p.e, 0), "reduce launch", err);
        if (!st) st = cuerr(cudaMemcpy(y, dy, ny, cudaMemcpyDeviceToHost), "download", err);
    }
    cudaFree(dw), cudaFree(db), cudaFree(dh), cudaFree(dx), cudaFree(dy), cudaFree(da), cudaFree(di), cudaFree(dr);
    cudaFree(dp);
    return st;
}
