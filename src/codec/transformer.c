/* transformer.c - the codec's windowed causal transformer (CODEC.md 3.7) with a KV window carried
 * between calls (CODEC.md 6): a query at absolute position p sees keys max(0, p-W+1) .. p.
 * The cache holds K (after RoPE) and V of the last W-1 positions, so chunked calls see exactly
 * the keys a whole-sequence call sees, and every sum runs in the same order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "codec/kernels.h"

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

typedef struct rms_job {
    const float *x;
    float *y;
    int D;
    int64_t L;
    const float *w;
    double eps;
} rms_job;

/* steps t0 .. t0+len (the sum of a step runs over its channels in order, whatever the block) */
static void rms_steps(void *ctx, int64_t ta, int64_t len) {
    enum { TB = 256 };
    const rms_job *j = ctx;
    const float *x = j->x, *w = j->w;
    float *y = j->y;
    int D = j->D;
    int64_t L = j->L;
    double eps = j->eps;
    for (int64_t t0 = ta; t0 < ta + len; t0 += TB) {
        int64_t nt = ta + len - t0 < TB ? ta + len - t0 : TB;
        float ss[TB];
        for (int64_t t = 0; t < nt; t++) ss[t] = 0.0f;
        for (int c = 0; c < D; c++)
            for (int64_t t = 0; t < nt; t++) {
                float v = x[(int64_t)c * L + t0 + t];
                ss[t] += v * v;
            }
        for (int64_t t = 0; t < nt; t++) ss[t] = 1.0f / sqrtf(ss[t] / (float)D + (float)eps);
        for (int c = 0; c < D; c++)
            for (int64_t t = 0; t < nt; t++) y[(int64_t)c * L + t0 + t] = x[(int64_t)c * L + t0 + t] * ss[t] * w[c];
    }
}

/* x [D][L] -> y = x / sqrt(mean(x^2) + eps) * w per time step (sum over channels in order). */
void cd_rmsnorm_ct(const float *x, float *y, int D, int64_t L, const float *w, double eps, dr_pool *pool) {
    rms_job j = {x, y, D, L, w, eps};
    cd_par_blocks(pool, L, 8, 3.0 * D, rms_steps, &j);
}

typedef struct rope_job {
    float *qkv;
    int row0;
    const dr_codec_tf_config *cf;
    int64_t L, pos0;
} rope_job;

/* rotation pairs i0 .. i0+len of every head (rows apart: no two pairs share a value) */
static void rope_pairs(void *ctx, int64_t i0, int64_t len) {
    const rope_job *j = ctx;
    const dr_codec_tf_config *cf = j->cf;
    float *qkv = j->qkv;
    int row0 = j->row0, hd = cf->head_dim;
    int64_t L = j->L, pos0 = j->pos0;
    for (int i = (int)i0; i < i0 + len; i++) {
        float e = (float)(2 * i) / (float)hd;
        float freq = 1.0f / powf((float)cf->rope_base, e);
        for (int64_t t = 0; t < L; t++) {
            float ang = (float)(pos0 + t) * freq;
            float c = cosf(ang), s = sinf(ang);
            if (cf->rope_bf16) c = bf16_round(c), s = bf16_round(s);
            for (int h = 0; h < cf->n_head; h++) {
                float *x0 = qkv + (int64_t)(row0 + h * hd + 2 * i) * L + t, *x1 = x0 + L;
                float a = *x0, b = *x1;
                *x0 = a * c - b * s;
                *x1 = b * c + a * s;
            }
        }
    }
}

/* RoPE on rows [row0, row0 + n_head*hd) of qkv [rows][L], adjacent pairs, positions pos0 + t. */
void cd_rope_ct(float *qkv, int row0, const dr_codec_tf_config *cf, int64_t L, int64_t pos0, dr_pool *pool) {
    rope_job j = {qkv, row0, cf, L, pos0};
    cd_par_blocks(pool, cf->head_dim / 2, 1, 40.0 * (double)L * cf->n_head, rope_pairs, &j);
}

typedef struct attn_job {
    const dr_codec_tf_config *cf;
    const float *q;  /* [L][Dq] */
    const float *k, *v; /* [n_prev + L][Dq] */
    int64_t n_prev, L;
    float *out;      /* [Dq][L] */
    const float *kT; /* AVX2: the keys transposed [Dq][n_prev + L], else NULL */
    int plant;       /* drama contract only (kernels.h CD_PLANT_TAP), else 0 */
} attn_job;

static void attn_task(void *ctx, int64_t idx, int worker) {
    (void)worker;
    const attn_job *j = ctx;
    int H = j->cf->n_head, hd = j->cf->head_dim, Dq = H * hd, W = j->cf->window_size;
    int64_t t = idx / H;
    int h = (int)(idx % H);
    int64_t last = j->n_prev + t, first = last - (W - 1) < 0 ? 0 : last - (W - 1);
    float scale = 1.0f / sqrtf((float)hd);
    const float *q = j->q + t * Dq + h * hd;
    float *sc = malloc((size_t)(last - first + 1) * sizeof(float));
    float acc[512];
    if (!sc || hd > 512) { /* cannot happen for sane configs (checked at load); keep output defined */
        free(sc);
        for (int d = 0; d < hd; d++) j->out[(int64_t)(h * hd + d) * j->L + t] = 0.0f;
        return;
    }
    if (j->kT) {
        int64_t P = j->n_prev + j->L;
        cd_attend_row_avx2(q, j->kT + (int64_t)h * hd * P, P, j->v + h * hd, Dq, first, last, hd, scale, sc,
                           j->out + (int64_t)h * hd * j->L + t, j->L, j->plant);
        free(sc);
        return;
    }
    float mx = -INFINITY;
    for (int64_t p = first; p <= last; p++) {
        const float *k = j->k + p * Dq + h * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * k[d];
        s *= scale;
        sc[p - first] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int64_t p = first; p <= last; p++) sum += (sc[p - first] = expf(sc[p - first] - mx));
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    for (int64_t p = first; p <= last; p++) {
        const float *v = j->v + p * Dq + h * hd;
        float w = sc[p - first] / sum;
        for (int d = 0; d < hd; d++) acc[d] += w * v[d];
    }
    for (int d = 0; d < hd; d++) j->out[(int64_t)(h * hd + d) * j->L + t] = acc[d];
    free(sc);
}

typedef struct kt_job {
    const float *k;
    float *kT;
    int64_t P, Dq;
} kt_job;

static void kt_rows(void *ctx, int64_t c0, int64_t n) {
    const kt_job *j = ctx;
    for (int64_t c = c0; c < c0 + n; c++)
        for (int64_t p = 0; p < j->P; p++) j->kT[c * j->P + p] = j->k[p * j->Dq + c];
}

void cd_attend_ex(const dr_codec_tf_config *cf, const float *q, const float *k, const float *v, int64_t n_prev,
                  int64_t L, float *out, dr_pool *pool, int isa, int plant) {
    int64_t P = n_prev + L, Dq = (int64_t)cf->n_head * cf->head_dim;
    int simd = isa >= CD_ISA_AVX2 && cd_isa_supported(CD_ISA_AVX2);
    float *kT = simd ? dr_alloc((size_t)(P * Dq + 1) * sizeof(float)) : NULL;
    if (kT) {
        kt_job kj = {k, kT, P, Dq};
        cd_par_blocks(pool, Dq, 16, 2.0 * (double)P, kt_rows, &kj);
    }
    attn_job aj = {cf, q, k, v, n_prev, L, out, kT, plant}; /* no memory for kT: the portable loop */
    dr_pool_run(pool, L * cf->n_head, attn_task, &aj);
    dr_free(kT);
}

void cd_attend(const dr_codec_tf_config *cf, const float *q, const float *k, const float *v, int64_t n_prev, int64_t L,
               float *out, dr_pool *pool) {
    cd_attend_ex(cf, q, k, v, n_prev, L, out, pool, cd_isa_best(), 0);
}

typedef struct glu_job {
    float *g;
    const float *u;
} glu_job;

static void swiglu_part(void *ctx, int64_t i0, int64_t len) {
    const glu_job *j = ctx;
    for (int64_t i = i0; i < i0 + len; i++) {
        float a = j->g[i];
        j->g[i] = a / (1.0f + expf(-a)) * j->u[i];
    }
}

void cd_swiglu(float *g, const float *u, int64_t n, dr_pool *pool) {
    glu_job j = {g, u};
    cd_par_blocks(pool, n, 4096, 16.0, swiglu_part, &j);
}

drama_status cd_tf_run(const cd_tf *tf, cd_kv *kv, const float *x, int64_t L, float *y, dr_pool *pool,
                       drama_error *err) {
    const dr_codec_tf_config *cf = &tf->cfg;
    int D = cf->dim, Dq = cf->n_head * cf->head_dim, F = cf->intermediate_size, W = cf->window_size;
    int64_t keep = W - 1, np = kv->n;
    float *cur = dr_alloc((size_t)D * L * 4), *nrm = dr_alloc((size_t)D * L * 4), *qkv = dr_alloc((size_t)3 * Dq * L * 4);
    float *q = dr_alloc((size_t)Dq * L * 4), *kk = dr_alloc((size_t)Dq * (np + L) * 4 + 4),
          *vv = dr_alloc((size_t)Dq * (np + L) * 4 + 4);
    float *att = dr_alloc((size_t)Dq * L * 4), *o = dr_alloc((size_t)D * L * 4);
    float *f1 = dr_alloc((size_t)F * L * 4), *f3 = dr_alloc((size_t)F * L * 4);
    drama_status rc = DRAMA_OK;
    if (!cur || !nrm || !qkv || !q || !kk || !vv || !att || !o || !f1 || !f3) {
        rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (transformer, %lld steps)", (long long)L);
        goto done;
    }
    memcpy(cur, x, (size_t)D * L * 4);
    for (int l = 0; l < cf->n_layer && !rc; l++) {
        const cd_tlayer *ly = &tf->layers[l];
        float *ck = kv->k + (int64_t)l * keep * Dq, *cvv = kv->v + (int64_t)l * keep * Dq;
        cd_rmsnorm_ct(cur, nrm, D, L, ly->attn_norm, cf->norm_eps, pool);
        if ((rc = cd_conv_run(&ly->wqkv, NULL, nrm, L, qkv, pool, err))) break;
        cd_rope_ct(qkv, 0, cf, L, kv->pos, pool);
        cd_rope_ct(qkv, Dq, cf, L, kv->pos, pool);
        /* rows -> [time][channel] for attention; cached positions first */
        memcpy(kk, ck, (size_t)np * Dq * 4);
        memcpy(vv, cvv, (size_t)np * Dq * 4);
        for (int c = 0; c < Dq; c++)
            for (int64_t t = 0; t < L; t++) {
                q[t * Dq + c] = qkv[(int64_t)c * L + t];
                kk[(np + t) * Dq + c] = qkv[(int64_t)(Dq + c) * L + t];
                vv[(np + t) * Dq + c] = qkv[(int64_t)(2 * Dq + c) * L + t];
            }
        cd_attend(cf, q, kk, vv, np, L, att, pool);
        if ((rc = cd_conv_run(&ly->wo, NULL, att, L, o, pool, err))) break;
        for (int c = 0; c < D; c++)
            for (int64_t t = 0; t < L; t++) cur[(int64_t)c * L + t] += ly->g_attn[c] * o[(int64_t)c * L + t];
        cd_rmsnorm_ct(cur, nrm, D, L, ly->ffn_norm, cf->norm_eps, pool);
        if ((rc = cd_conv_run(&ly->w1, NULL, nrm, L, f1, pool, err))) break;
        if ((rc = cd_conv_run(&ly->w3, NULL, nrm, L, f3, pool, err))) break;
        cd_swiglu(f1, f3, (int64_t)F * L, pool);
        if ((rc = cd_conv_run(&ly->w2, NULL, f1, L, o, pool, err))) break;
        for (int c = 0; c < D; c++)
            for (int64_t t = 0; t < L; t++) cur[(int64_t)c * L + t] += ly->g_ffn[c] * o[(int64_t)c * L + t];
        /* keep the last W-1 positions */
        int64_t tot = np + L, nk = tot < keep ? tot : keep;
        memmove(ck, kk + (tot - nk) * Dq, (size_t)nk * Dq * 4);
        memmove(cvv, vv + (tot - nk) * Dq, (size_t)nk * Dq * 4);
    }
    if (!rc) {
        int64_t tot = np + L;
        kv->n = tot < keep ? tot : keep;
        kv->pos += L;
        cd_rmsnorm_ct(cur, y, D, L, tf->norm, cf->norm_eps, pool);
    }
done:
    dr_free(cur), dr_free(nrm), dr_free(qkv), dr_free(q), dr_free(kk), dr_free(vv);
    dr_free(att), dr_free(o), dr_free(f1), dr_free(f3);
    return rc;
}
