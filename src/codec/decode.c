/* decode.c - the streaming decoder (CODEC.md 2 and 6): codes -> code-table sums -> post_module ->
 * upsample -> decoder -> tanh. A whole decode is this stream fed everything; every layer keeps
 * the history it needs, so any chunking gives bit-identical samples. Long inputs are processed
 * in sub-chunks of CHUNK frames, which bounds memory and changes nothing (same rule). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"

#define CHUNK 16
#define SLICE (256 * 1024) /* floats of a block output that run_blocks keeps in one piece */
#define SLICE_MIN 128      /* input steps of a slice, at least */

struct dr_codec_stream {
    const dr_codec *c;
    cd_state st;
    int64_t frames;
    dr_codec_tap_fn tap;
    void *tap_ctx;
    dr_pool *pool; /* NULL: the codec's */
    double *prof;  /* [DR_CODEC_N_STAGES] seconds per stage, accumulated; NULL: off */
    void *dev;     /* the device decoder's stream (c->accel), else NULL */
};

const char *dr_codec_stage_name(int stage, char *buf, size_t len) {
    if (stage == 0) snprintf(buf, len, "codes + post_module");
    else if (stage == 1) snprintf(buf, len, "upsample + convnext");
    else if (stage == 2) snprintf(buf, len, "decoder in conv");
    else if (stage < DR_CODEC_N_STAGES - 1)
        snprintf(buf, len, "block %d %s", (stage - 3) / 2, (stage - 3) % 2 ? "residual units" : "snake + upconv");
    else snprintf(buf, len, "snake + out conv + tanh");
    return buf;
}

void dr_codec_stream_set_profile(dr_codec_stream *s, double *seconds) { s->prof = seconds; }

void dr_codec_set_accel(dr_codec *c, const dr_codec_accel *a) {
    if (c->accel.free) c->accel.free(c->accel.ctx);
    memset(&c->accel, 0, sizeof c->accel);
    if (a) c->accel = *a;
}

const char *dr_codec_decoder_name(const dr_codec *c) { return c->accel.feed ? c->accel.name : "cpu"; }

drama_status cd_state_init(const dr_codec *c, int path, cd_state *s, drama_error *err) {
    memset(s, 0, sizeof *s);
    s->n_conv = c->n_conv_states[path];
    s->n_tf = c->n_tf_states[path];
    s->conv = calloc((size_t)s->n_conv + 1, sizeof *s->conv);
    s->kv = calloc((size_t)s->n_tf + 1, sizeof *s->kv);
    if (!s->conv || !s->kv) goto oom;
    for (int i = 0; i < s->n_conv; i++)
        if (!(s->conv[i] = calloc((size_t)c->conv_state_size[path][i], sizeof(float)))) goto oom;
    for (int i = 0; i < s->n_tf; i++) {
        const dr_codec_tf_config *cf = &c->tf_of_state[path][i]->cfg;
        size_t n = (size_t)cf->n_layer * (size_t)(cf->window_size - 1) * (size_t)(cf->n_head * cf->head_dim) + 1;
        s->kv[i].k = calloc(n, sizeof(float));
        s->kv[i].v = calloc(n, sizeof(float));
        if (!s->kv[i].k || !s->kv[i].v) goto oom;
    }
    return DRAMA_OK;
oom:
    cd_state_free(s);
    return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (stream state)");
}

void cd_state_reset(cd_state *s, const dr_codec *c, int path) {
    for (int i = 0; i < s->n_conv; i++) memset(s->conv[i], 0, (size_t)c->conv_state_size[path][i] * sizeof(float));
    for (int i = 0; i < s->n_tf; i++) s->kv[i].n = 0, s->kv[i].pos = 0;
}

void cd_state_free(cd_state *s) {
    if (s->conv)
        for (int i = 0; i < s->n_conv; i++) free(s->conv[i]);
    if (s->kv)
        for (int i = 0; i < s->n_tf; i++) free(s->kv[i].k), free(s->kv[i].v);
    free(s->conv);
    free(s->kv);
    memset(s, 0, sizeof *s);
}

drama_status dr_codec_stream_create(const dr_codec *c, dr_codec_stream **out, drama_error *err) {
    *out = NULL;
    if (!(c->parts & DR_CODEC_LOAD_DECODER))
        return dr_fail(err, DRAMA_EINVAL, "codec: loaded without the decoder");
    dr_codec_stream *s = calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory");
    s->c = c;
    drama_status rc = c->accel.feed ? c->accel.stream_create(c->accel.ctx, &s->dev, err) : cd_state_init(c, 0, &s->st, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return DRAMA_OK;
}

void dr_codec_stream_free(dr_codec_stream *s) {
    if (!s) return;
    if (s->dev) s->c->accel.stream_free(s->c->accel.ctx, s->dev);
    cd_state_free(&s->st);
    free(s);
}

void dr_codec_stream_reset(dr_codec_stream *s) {
    if (s->dev) s->c->accel.stream_reset(s->c->accel.ctx, s->dev);
    cd_state_reset(&s->st, s->c, 0);
    s->frames = 0;
}

void dr_codec_stream_set_tap(dr_codec_stream *s, dr_codec_tap_fn fn, void *ctx) {
    s->tap = fn;
    s->tap_ctx = ctx;
}

int64_t dr_codec_stream_frames(const dr_codec_stream *s) { return s->frames; }

void dr_codec_stream_set_pool(dr_codec_stream *s, dr_pool *pool) { s->pool = pool; }

drama_status dr_codec_check_codes(const dr_codec_config *c, const int32_t *codes, int64_t n_frames, const char *label,
                                  drama_error *err) {
    int K = c->num_codebooks;
    for (int64_t f = 0; f < n_frames; f++)
        for (int k = 0; k < K; k++) {
            int32_t v = codes[f * K + k];
            int32_t size = k == 0 ? c->semantic_codebook_size : c->codebook_size;
            if (v < 0 || v >= size)
                return dr_fail(err, DRAMA_EINVAL, "%s: frame %lld codebook %d: code %d outside 0..%d", label ? label : "codes",
                               (long long)f, k, v, size - 1);
        }
    return DRAMA_OK;
}

/* Buffers are swapped between stages: cur holds [channels][len]. */
typedef struct act {
    float *x;
    int64_t ch, len;
} act;

static drama_status next_buf(act *a, int64_t ch, int64_t len, drama_error *err) {
    size_t bytes;
    if (!dr_mul_size((size_t)ch * (size_t)len, sizeof(float), &bytes) || !(a->x = dr_alloc(bytes ? bytes : 4)))
        return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (%lld x %lld activations)", (long long)ch, (long long)len);
    a->ch = ch, a->len = len;
    return DRAMA_OK;
}

/* run conv cv (after Snake sn_in, NULL: none) on *a, replacing it by the output */
static drama_status conv_step(const cd_conv *cv, const cd_snake *sn_in, float **hist, act *a, dr_pool *pool,
                              drama_error *err) {
    act o = {0};
    drama_status rc = next_buf(&o, cv->cout, cd_conv_out_len(cv, a->len), err);
    if (!rc)
        rc = sn_in ? cd_conv_run_snake_in(cv, cd_hist(hist, cv), a->x, a->len, o.x, sn_in, pool, err)
                   : cd_conv_run(cv, cd_hist(hist, cv), a->x, a->len, o.x, pool, err);
    dr_free(a->x);
    *a = o;
    if (rc) dr_free(o.x), a->x = NULL;
    return rc;
}

/* decoder blocks b.. and the output layers on a (consumed: a->x freed) -> out. A block whose
 * output would outgrow the caches (SLICE floats) runs on time slices of its input, each slice
 * through all later blocks before the next: activations stay in L2 instead of streaming through
 * memory at every conv, and, as every layer carries its history, the samples are the same. */
static drama_status run_blocks(dr_codec_stream *s, int b, act *a, float *out, double *t0, drama_error *err) {
    const dr_codec *c = s->c;
    const dr_codec_config *cf = &c->cfg;
    dr_pool *pool = s->pool ? s->pool : c->pool;
    float **hist = s->st.conv;
    drama_status rc = DRAMA_OK;
    if (b == cf->n_decoder_rates) {
        if (!(rc = conv_step(&c->dec_out, &c->dec_snake, hist, a, pool, err))) cd_tanh(a->x, out, a->len, pool);
        cd_lap(s->prof, DR_CODEC_N_STAGES - 1, t0);
        dr_free(a->x), a->x = NULL;
        return rc;
    }
    const cd_dec_block *db = &c->dec[b];
    int64_t per_step = 1; /* output samples per input step of block b */
    for (int i = b; i < cf->n_decoder_rates; i++) per_step *= c->dec[i].up.stride;
    /* at least SLICE_MIN steps: the upsampling conv reads all its weights once per call */
    int64_t step_floats = (int64_t)db->up.cout * db->up.stride, slice = SLICE / step_floats;
    if (slice < SLICE_MIN) slice = SLICE_MIN;
    if (a->len > slice) {
        for (int64_t t = 0; t < a->len && !rc; t += slice) {
            act p;
            int64_t n = a->len - t < slice ? a->len - t : slice;
            if ((rc = next_buf(&p, a->ch, n, err))) break;
            for (int64_t ch = 0; ch < a->ch; ch++) memcpy(p.x + ch * n, a->x + ch * a->len + t, (size_t)n * sizeof(float));
            rc = run_blocks(s, b, &p, out + t * per_step, t0, err);
            dr_free(p.x);
        }
        dr_free(a->x), a->x = NULL;
        return rc;
    }
    int st = 3 + 2 * (b < DR_CODEC_MAX_RATES ? b : DR_CODEC_MAX_RATES - 1);
    if ((rc = conv_step(&db->up, &db->snake, hist, a, pool, err))) return rc;
    cd_lap(s->prof, st, t0);
    for (int r = 0; r < cf->n_dilations && !rc; r++) rc = cd_ru_run(&db->ru[r], hist, a->x, a->len, pool, err);
    cd_lap(s->prof, st + 1, t0);
    if (rc) {
        dr_free(a->x), a->x = NULL;
        return rc;
    }
    return run_blocks(s, b + 1, a, out, t0, err);
}

static drama_status decode_chunk(dr_codec_stream *s, const int32_t *codes, int64_t T, float *out, drama_error *err) {
    const dr_codec *c = s->c;
    const dr_codec_config *cf = &c->cfg;
    dr_pool *pool = s->pool ? s->pool : c->pool;
    float **hist = s->st.conv;
    int Q = cf->q_input_dim, K = cf->num_codebooks;
    act a = {0};
    double t0 = s->prof ? dr_clock_s() : 0;
    drama_status rc = next_buf(&a, Q, T, err);
    if (rc) return rc;
    /* z = q0 + (q1 + ... + q9), the reference's order of sums */
    float *res = dr_alloc((size_t)Q * sizeof(float));
    if (!res) {
        dr_free(a.x);
        return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory");
    }
    for (int64_t t = 0; t < T; t++) {
        for (int o = 0; o < Q; o++) res[o] = 0.0f;
        for (int k = 1; k < K; k++) {
            int32_t code = codes[t * K + k];
            if (code > cf->upper_clamp[k]) code = cf->upper_clamp[k];
            const float *row = c->vq[k].table + (int64_t)code * Q;
            for (int o = 0; o < Q; o++) res[o] += row[o];
        }
        int32_t c0 = codes[t * K] > cf->upper_clamp[0] ? cf->upper_clamp[0] : codes[t * K];
        const float *row0 = c->vq[0].table + (int64_t)c0 * Q;
        for (int o = 0; o < Q; o++) a.x[(int64_t)o * T + t] = row0[o] + res[o];
    }
    dr_free(res);
    if (s->tap) s->tap(s->tap_ctx, "z_q", a.x, Q, T);
    if (cf->post.n_layer > 0) {
        act o;
        if ((rc = next_buf(&o, Q, T, err))) goto done;
        rc = cd_tf_run(&c->post, &s->st.kv[c->post.state], a.x, T, o.x, pool, err);
        dr_free(a.x);
        a = o;
        if (rc) goto done;
    }
    if (s->tap) s->tap(s->tap_ctx, "z_post", a.x, Q, T);
    cd_lap(s->prof, 0, &t0);
    for (int i = 0; i < cf->n_down; i++) {
        if ((rc = conv_step(&c->up[i], NULL, hist, &a, pool, err))) goto done;
        if ((rc = cd_convnext_run(&c->up_cnx[i], hist, a.x, a.len, pool, err))) goto done;
    }
    if (s->tap) s->tap(s->tap_ctx, "z_up", a.x, (int)a.ch, a.len);
    cd_lap(s->prof, 1, &t0);
    if ((rc = conv_step(&c->dec_in, NULL, hist, &a, pool, err))) goto done;
    cd_lap(s->prof, 2, &t0);
    rc = run_blocks(s, 0, &a, out, &t0, err);
done:
    dr_free(a.x);
    return rc;
}

drama_status dr_codec_stream_feed(dr_codec_stream *s, const int32_t *codes, int64_t n_frames, float *out,
                                  drama_error *err) {
    const dr_codec_config *cf = &s->c->cfg;
    int K = cf->num_codebooks;
    if (n_frames < 0) return dr_fail(err, DRAMA_EINVAL, "codec: negative frame count");
    for (int64_t f = 0; f < n_frames; f++)
        for (int k = 0; k < K; k++)
            if (codes[f * K + k] < 0)
                return dr_fail(err, DRAMA_EINVAL, "codec: frame %lld codebook %d: negative code %d",
                               (long long)(s->frames + f), k, codes[f * K + k]);
    for (int64_t f0 = 0; f0 < n_frames; f0 += CHUNK) {
        int64_t T = n_frames - f0 < CHUNK ? n_frames - f0 : CHUNK;
        drama_status rc = s->dev ? s->c->accel.feed(s->c->accel.ctx, s->dev, codes + f0 * K, T, out + f0 * cf->frame_length, err)
                                 : decode_chunk(s, codes + f0 * K, T, out + f0 * cf->frame_length, err);
        if (rc) { /* a half-updated state is useless: start the stream over */
            dr_codec_stream_reset(s);
            return rc;
        }
        s->frames += T;
    }
    return DRAMA_OK;
}

drama_status dr_codec_decode(const dr_codec *c, const int32_t *codes, int64_t n_frames, float *out, drama_error *err) {
    dr_codec_stream *s;
    drama_status rc = dr_codec_stream_create(c, &s, err);
    if (rc) return rc;
    rc = dr_codec_stream_feed(s, codes, n_frames, out, err);
    dr_codec_stream_free(s);
    return rc;
}
