/* encode.c - samples -> codes (CODEC.md 2, 3.8) and loading a codec directory.
 * The encoder is causal, so it runs as a stream over chunks of whole frames (bounded memory);
 * only the zero padding of the last frame depends on the clip's end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "io/safetensors.h"
#include "io/torchzip.h"

#define ENC_CHUNK 32        /* frames per encoder call */
#define ENC_SLICE_FRAMES 2  /* frames per slice through the high-rate blocks (front_blocks) */
#define ENC_FRONT_STEPS 1024

typedef struct act {
    float *x;
    int64_t ch, len;
} act;

const char *dr_codec_enc_stage_name(int stage, char *buf, size_t len) {
    if (stage == 0) snprintf(buf, len, "input conv");
    else if (stage < CD_ES_TF)
        snprintf(buf, len, "block %d %s", (stage - 1) / 2, (stage - 1) % 2 ? "snake + downconv" : "residual units");
    else if (stage == CD_ES_TF) snprintf(buf, len, "encoder transformer");
    else if (stage == CD_ES_OUT) snprintf(buf, len, "snake + out conv");
    else if (stage == CD_ES_QDOWN) snprintf(buf, len, "downsample + convnext");
    else if (stage == CD_ES_PRE) snprintf(buf, len, "pre_module");
    else snprintf(buf, len, "quantizer");
    return buf;
}

/* conv (after Snake sn_in, NULL: none) on *a, replacing it by the output */
static drama_status conv_step(const cd_conv *cv, const cd_snake *sn_in, float **hist, act *a, dr_pool *pool,
                              drama_error *err) {
    int64_t len = cd_conv_out_len(cv, a->len);
    size_t bytes;
    float *y = NULL;
    if (!dr_mul_size((size_t)cv->cout * (size_t)len, sizeof(float), &bytes) || !(y = dr_alloc(bytes ? bytes : 4)))
        return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (encoder activations)");
    drama_status rc = sn_in ? cd_conv_run_snake_in(cv, cd_hist(hist, cv), a->x, a->len, y, sn_in, pool, err)
                             : cd_conv_run(cv, cd_hist(hist, cv), a->x, a->len, y, pool, err);
    dr_free(a->x);
    a->x = y, a->ch = cv->cout, a->len = len;
    return rc;
}

/* residual vector quantisation of z [Q][T] -> codes[t * K + k] */
static drama_status quantize(const dr_codec *c, float *z, int64_t T, int32_t *codes, drama_error *err) {
    const dr_codec_config *cf = &c->cfg;
    int Q = cf->q_input_dim, K = cf->num_codebooks, dim = cf->codebook_dim;
    float *e = dr_alloc((size_t)dim * T * sizeof(float) + 4);
    if (!e) return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (quantizer)");
    for (int k = 0; k < K; k++) {
        const cd_vq *q = &c->vq[k];
        drama_status rc = cd_conv_run(&q->in_proj, NULL, z, T, e, c->pool, err);
        if (rc) {
            dr_free(e);
            return rc;
        }
        for (int64_t t = 0; t < T; t++) {
            int best = cd_vq_nearest(q, e + t, T);
            codes[t * K + k] = best;
            const float *row = q->table + (int64_t)best * Q; /* out_proj of the raw codebook row */
            for (int o = 0; o < Q; o++) z[(int64_t)o * T + t] -= row[o];
        }
    }
    dr_free(e);
    return DRAMA_OK;
}

/* encoder blocks b0 .. b1-1 on *a (residual units, Snake + downsampling conv, transformer) */
static drama_status run_blocks(const dr_codec *c, cd_state *st, act *a, int b0, int b1, double *prof, double *t0,
                               drama_error *err) {
    dr_pool *pool = c->pool;
    float **hist = st->conv;
    drama_status rc = DRAMA_OK;
    for (int b = b0; !rc && b < b1; b++) {
        const cd_enc_block *eb = &c->enc[b];
        int sb = b < DR_CODEC_MAX_RATES ? b : DR_CODEC_MAX_RATES - 1;
        for (int r = 0; !rc && r < c->cfg.n_dilations; r++) rc = cd_ru_run(&eb->ru[r], hist, a->x, a->len, pool, err);
        cd_lap(prof, CD_ES_RU(sb), t0);
        if (rc) break;
        if ((rc = conv_step(&eb->down, &eb->snake, hist, a, pool, err))) break;
        cd_lap(prof, CD_ES_DOWN(sb), t0);
        if (eb->has_tf) {
            float *y = dr_alloc((size_t)a->ch * a->len * sizeof(float));
            if (!y) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (encoder transformer)");
            else rc = cd_tf_run(&eb->tf, &st->kv[eb->tf.state], a->x, a->len, y, pool, err);
            dr_free(a->x);
            a->x = y;
            cd_lap(prof, CD_ES_TF, t0);
        }
    }
    return rc;
}

/* samples -> the input conv and blocks 0 .. nb-1 -> *a */
static drama_status run_front(const dr_codec *c, cd_state *st, const float *pcm, int64_t L, int nb, act *a,
                              double *prof, double *t0, drama_error *err) {
    *a = (act){dr_alloc((size_t)L * sizeof(float)), 1, L};
    if (!a->x) return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (encoder input)");
    memcpy(a->x, pcm, (size_t)L * sizeof(float));
    drama_status rc = conv_step(&c->enc_in, NULL, st->conv, a, c->pool, err);
    cd_lap(prof, 0, t0);
    return rc ? rc : run_blocks(c, st, a, 0, nb, prof, t0, err);
}

/* The leading blocks whose input has ENC_FRONT_STEPS steps per frame or more (no transformer):
 * a chunk runs through them in slices of ENC_SLICE_FRAMES frames, each slice through all of them
 * before the next, so their activations (16 MB a buffer at 32 frames) stay in the caches; every
 * layer carries its history, so the values are those of one piece. */
static int front_blocks(const dr_codec *c) {
    int64_t steps = c->cfg.frame_length;
    int nb = 0;
    while (nb < c->cfg.n_encoder_rates && steps >= ENC_FRONT_STEPS && !c->enc[nb].has_tf)
        steps /= c->enc[nb].down.stride, nb++;
    return nb;
}

static drama_status encode_chunk(const dr_codec *c, cd_state *st, const float *pcm, int64_t L, int32_t *codes,
                                 dr_codec_tap_fn tap, void *tap_ctx, double *prof, drama_error *err) {
    const dr_codec_config *cf = &c->cfg;
    dr_pool *pool = c->pool;
    double t0 = prof ? dr_clock_s() : 0;
    float **hist = st->conv;
    int nf = front_blocks(c);
    int64_t S = (int64_t)ENC_SLICE_FRAMES * cf->frame_length, div = 1;
    for (int b = 0; b < nf; b++) div *= c->enc[b].down.stride;
    act a = {0};
    drama_status rc = DRAMA_OK;
    if (nf > 0 && L > S) { /* whole frames per slice: every stride divides it */
        int64_t ch = c->enc[nf - 1].down.cout, Lg = L / div;
        if (!(a.x = dr_alloc((size_t)ch * Lg * sizeof(float))))
            return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (encoder activations)");
        a.ch = ch, a.len = Lg;
        for (int64_t s0 = 0; !rc && s0 < L; s0 += S) {
            act p = {0};
            rc = run_front(c, st, pcm + s0, L - s0 < S ? L - s0 : S, nf, &p, prof, &t0, err);
            for (int64_t r = 0; !rc && r < ch; r++)
                memcpy(a.x + r * Lg + s0 / div, p.x + r * p.len, (size_t)p.len * sizeof(float));
            dr_free(p.x);
        }
    } else {
        rc = run_front(c, st, pcm, L, nf, &a, prof, &t0, err);
    }
    if (!rc) rc = run_blocks(c, st, &a, nf, cf->n_encoder_rates, prof, &t0, err);
    if (!rc) rc = conv_step(&c->enc_out, &c->enc_snake, hist, &a, pool, err);
    if (!rc && tap) tap(tap_ctx, "z_enc", a.x, (int)a.ch, a.len);
    cd_lap(prof, CD_ES_OUT, &t0);
    for (int i = 0; !rc && i < cf->n_down; i++) {
        if ((rc = conv_step(&c->down[i], NULL, hist, &a, pool, err))) break;
        rc = cd_convnext_run(&c->down_cnx[i], hist, a.x, a.len, pool, err);
    }
    if (!rc && tap) tap(tap_ctx, "z_down", a.x, (int)a.ch, a.len);
    cd_lap(prof, CD_ES_QDOWN, &t0);
    if (!rc && cf->pre.n_layer > 0) {
        float *y = dr_alloc((size_t)a.ch * a.len * sizeof(float));
        if (!y) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (pre_module)");
        else rc = cd_tf_run(&c->pre, &st->kv[c->pre.state], a.x, a.len, y, pool, err);
        dr_free(a.x);
        a.x = y;
    }
    if (!rc && tap) tap(tap_ctx, "z_pre", a.x, (int)a.ch, a.len);
    cd_lap(prof, CD_ES_PRE, &t0);
    if (!rc) rc = quantize(c, a.x, a.len, codes, err);
    cd_lap(prof, CD_ES_VQ, &t0);
    dr_free(a.x);
    return rc;
}

drama_status dr_codec_encode(const dr_codec *c, const float *samples, int64_t n, int32_t **codes_out, int64_t *n_frames,
                             dr_codec_tap_fn tap, void *tap_ctx, drama_error *err) {
    return dr_codec_encode_ex(c, samples, n, codes_out, n_frames, tap, tap_ctx, NULL, err);
}

drama_status dr_codec_encode_ex(const dr_codec *c, const float *samples, int64_t n, int32_t **codes_out,
                                int64_t *n_frames, dr_codec_tap_fn tap, void *tap_ctx, double *prof, drama_error *err) {
    *codes_out = NULL;
    *n_frames = 0;
    const dr_codec_config *cf = &c->cfg;
    if (!(c->parts & DR_CODEC_LOAD_ENCODER)) return dr_fail(err, DRAMA_EINVAL, "codec: loaded without the encoder");
    if (n <= 0) return dr_fail(err, DRAMA_EEMPTY, "codec encode: no samples");
    if (cf->codebook_dim > CD_VQ_MAX_DIM)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "codec encode: codebook_dim above %d", CD_VQ_MAX_DIM);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(samples[i])) return dr_fail(err, DRAMA_ENUMERIC, "codec encode: sample %lld is not finite", (long long)i);
    int64_t FL = cf->frame_length, T = (n + FL - 1) / FL, K = cf->num_codebooks;
    int32_t *codes = malloc((size_t)(T * K) * sizeof(int32_t));
    float *buf = dr_alloc((size_t)ENC_CHUNK * FL * sizeof(float));
    cd_state st;
    drama_status rc = (!codes || !buf) ? dr_fail(err, DRAMA_ENOMEM, "codec encode: out of memory") : DRAMA_OK;
    if (!rc) rc = cd_state_init(c, 1, &st, err);
    else memset(&st, 0, sizeof st);
    for (int64_t f0 = 0; !rc && f0 < T; f0 += ENC_CHUNK) {
        int64_t nf = T - f0 < ENC_CHUNK ? T - f0 : ENC_CHUNK, s0 = f0 * FL, have = n - s0 < nf * FL ? n - s0 : nf * FL;
        memcpy(buf, samples + s0, (size_t)have * sizeof(float));
        memset(buf + have, 0, (size_t)(nf * FL - have) * sizeof(float)); /* zero-pad the last frame */
        rc = encode_chunk(c, &st, buf, nf * FL, codes + f0 * K, tap, tap_ctx, prof, err);
    }
    cd_state_free(&st);
    dr_free(buf);
    if (rc) {
        free(codes);
        return rc;
    }
    *codes_out = codes;
    *n_frames = T;
    return DRAMA_OK;
}

/* ---- a codec directory: codec.pth or codec.safetensors, plus codec.json ---- */
drama_status dr_codec_file(const char *dir, char *buf, size_t buflen, drama_error *err) {
    struct stat sb;
    static const char *names[] = {"codec.pth", "codec.safetensors"};
    for (int i = 0; i < 2; i++) {
        if ((size_t)snprintf(buf, buflen, "%s/%s", dir, names[i]) >= buflen)
            return dr_fail(err, DRAMA_EINVAL, "%s: path too long", dir);
        if (stat(buf, &sb) == 0 && S_ISREG(sb.st_mode)) return DRAMA_OK;
    }
    if (buflen) buf[0] = '\0';
    return dr_fail(err, DRAMA_EIO, "%s: neither codec.pth nor codec.safetensors found", dir);
}

drama_status dr_codec_open(const char *dir, unsigned parts, dr_codec **out, drama_error *err) {
    *out = NULL;
    char pth[4096], st[4096], js[4096];
    struct stat sb;
    if (strlen(dir) + sizeof "/codec.safetensors" > sizeof st) /* never open a truncated path */
        return dr_fail(err, DRAMA_EINVAL, "%.200s...: path too long", dir);
    snprintf(pth, sizeof pth, "%s/codec.pth", dir);
    snprintf(st, sizeof st, "%s/codec.safetensors", dir);
    snprintf(js, sizeof js, "%s/codec.json", dir);
    dr_codec_config cfg;
    dr_codec_config_default(&cfg);
    drama_status rc;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) /* a common slip: the file instead of its folder */
        return dr_fail(err, DRAMA_EINVAL, "%s: not a directory (give the folder that holds codec.pth or codec.safetensors)",
                       dir);
    if (stat(js, &sb) == 0 && (rc = dr_codec_config_read(js, &cfg, err))) return rc;
    dr_tensor *tensors = NULL;
    int64_t n = 0;
    dr_pth *p = NULL;
    dr_st_file *sf = NULL;
    const char *label;
    if (stat(pth, &sb) == 0) {
        if ((rc = dr_pth_open(pth, &p, err))) return rc;
        n = dr_pth_count(p);
        label = pth;
    } else if (stat(st, &sb) == 0) {
        if ((rc = dr_st_open(st, &sf, err))) return rc;
        n = dr_st_count(sf);
        label = st;
    } else {
        return dr_fail(err, DRAMA_EIO, "%s: neither codec.pth nor codec.safetensors found", dir);
    }
    tensors = malloc((size_t)(n ? n : 1) * sizeof *tensors);
    if (!tensors) rc = dr_fail(err, DRAMA_ENOMEM, "out of memory");
    else {
        for (int64_t i = 0; i < n; i++) tensors[i] = p ? *dr_pth_at(p, i) : *dr_st_at(sf, i);
        rc = dr_codec_load(tensors, n, &cfg, parts, label, out, err);
    }
    free(tensors);
    dr_pth_close(p);
    dr_st_close(sf);
    return rc;
}
