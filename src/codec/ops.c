/* ops.c - codec convolutions and elementwise blocks (CODEC.md section 3) on [channels][time].
 *
 * Determinism rule (CODEC.md 6): every output value is one fixed-order sum (bias, then input
 * channels in order, taps in order), whatever the number of time steps in the call, the tile
 * it falls in or the thread that computes it. Vectorisation runs across time steps only, so it
 * never reorders a sum. History columns make a call on a chunk equal to the same call on the
 * whole sequence. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"

#define OB 8     /* output channels per task */
#define TT 256   /* time steps per task */

typedef struct conv_job {
    const cd_conv *cv;
    const float *x; /* [cin][lx] with history in front */
    int64_t lx;
    float *y;       /* [cout][ly] */
    int64_t ly;     /* output length (normal) or input blocks (transposed) */
    int64_t n_tiles;
} conv_job;

static void conv_task(void *ctx, int64_t idx, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const cd_conv *cv = j->cv;
    int64_t ob = idx / j->n_tiles, tile = idx % j->n_tiles;
    int o0 = (int)(ob * OB), no = cv->cout - o0 < OB ? cv->cout - o0 : OB;
    int64_t t0 = tile * TT, nt = j->ly - t0 < TT ? j->ly - t0 : TT;
    int cin_g = cv->cin / cv->groups, cout_g = cv->cout / cv->groups;
    int K = cv->k, d = cv->dil, s = cv->stride;
    float acc[OB][TT];
    for (int r = 0; r < no; r++)
        for (int64_t t = 0; t < nt; t++) acc[r][t] = 0.0f;
    if (cv->groups == 1) {
        for (int i = 0; i < cin_g; i++) {
            for (int k = 0; k < K; k++) {
                const float *xr = j->x + (int64_t)i * j->lx + t0 * s + (int64_t)k * d;
                for (int r = 0; r < no; r++) {
                    float w = cv->w[((int64_t)(o0 + r) * cin_g + i) * K + k];
                    float *a = acc[r];
                    if (s == 1)
                        for (int64_t t = 0; t < nt; t++) a[t] += w * xr[t];
                    else
                        for (int64_t t = 0; t < nt; t++) a[t] += w * xr[t * s];
                }
            }
        }
    } else {
        for (int r = 0; r < no; r++) {
            int o = o0 + r, g = o / cout_g;
            float *a = acc[r];
            for (int i = 0; i < cin_g; i++)
                for (int k = 0; k < K; k++) {
                    float w = cv->w[((int64_t)o * cin_g + i) * K + k];
                    const float *xr = j->x + (int64_t)(g * cin_g + i) * j->lx + t0 * s + (int64_t)k * d;
                    for (int64_t t = 0; t < nt; t++) a[t] += w * xr[t * s];
                }
        }
    }
    for (int r = 0; r < no; r++) {
        float b = cv->b ? cv->b[o0 + r] : 0.0f;
        float *yr = j->y + (int64_t)(o0 + r) * j->ly + t0;
        for (int64_t t = 0; t < nt; t++) yr[t] = acc[r][t] + b;
    }
}

/* Transposed conv: output block j (s samples) = bias + sum over r of taps q + r*s of input j - r. */
static void convt_task(void *ctx, int64_t idx, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const cd_conv *cv = j->cv;
    int64_t ob = idx / j->n_tiles, tile = idx % j->n_tiles;
    int o0 = (int)(ob * OB), no = cv->cout - o0 < OB ? cv->cout - o0 : OB;
    int64_t t0 = tile * TT, nt = j->ly - t0 < TT ? j->ly - t0 : TT;
    int K = cv->k, s = cv->stride, cin = cv->cin, R = (K + s - 1) / s;
    float acc[TT];
    for (int r = 0; r < no; r++) {
        int o = o0 + r;
        for (int q = 0; q < s; q++) {
            for (int64_t t = 0; t < nt; t++) acc[t] = 0.0f;
            for (int rr = 0; rr < R; rr++) {
                int tap = q + rr * s;
                if (tap >= K) break;
                const float *w = cv->w + ((int64_t)o * K + tap) * cin;
                /* input j - rr sits at column hist + j - rr of x */
                const float *xb = j->x + cv->hist + t0 - rr;
                for (int i = 0; i < cin; i++) {
                    float wv = w[i];
                    const float *xr = xb + (int64_t)i * j->lx;
                    for (int64_t t = 0; t < nt; t++) acc[t] += wv * xr[t];
                }
            }
            float b = cv->b ? cv->b[o] : 0.0f;
            float *yr = j->y + (int64_t)o * (j->ly * s) + t0 * s + q;
            for (int64_t t = 0; t < nt; t++) yr[t * s] = acc[t] + b;
        }
    }
}

int64_t cd_conv_out_len(const cd_conv *cv, int64_t L) { return cv->transposed ? L * cv->stride : L / cv->stride; }

drama_status cd_conv_run(const cd_conv *cv, float *hist, const float *x, int64_t L, float *y, dr_pool *pool,
                         drama_error *err) {
    if (L <= 0) return DRAMA_OK;
    if (!cv->transposed && L % cv->stride)
        return dr_fail(err, DRAMA_EINTERNAL, "codec: conv input length %lld not a multiple of stride %d", (long long)L,
                       cv->stride);
    int64_t lx = L + cv->hist;
    const float *xin = x;
    float *buf = NULL;
    if (cv->hist > 0) {
        size_t bytes;
        if (!dr_mul_size((size_t)cv->cin * (size_t)lx, sizeof(float), &bytes) || !(buf = dr_alloc(bytes)))
            return dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (conv of %lld steps)", (long long)L);
        for (int i = 0; i < cv->cin; i++) {
            memcpy(buf + (int64_t)i * lx, hist + (int64_t)i * cv->hist, (size_t)cv->hist * sizeof(float));
            memcpy(buf + (int64_t)i * lx + cv->hist, x + (int64_t)i * L, (size_t)L * sizeof(float));
        }
        xin = buf;
    }
    conv_job j = {.cv = cv, .x = xin, .lx = lx, .y = y};
    j.ly = cv->transposed ? L : L / cv->stride;
    j.n_tiles = (j.ly + TT - 1) / TT;
    int64_t n_ob = (cv->cout + OB - 1) / OB;
    dr_pool_run(pool, n_ob * j.n_tiles, cv->transposed ? convt_task : conv_task, &j);
    if (cv->hist > 0) { /* keep the last hist input columns for the next call */
        for (int i = 0; i < cv->cin; i++)
            memcpy(hist + (int64_t)i * cv->hist, buf + (int64_t)i * lx + L, (size_t)cv->hist * sizeof(float));
        dr_free(buf);
    }
    return DRAMA_OK;
}

typedef struct snake_job {
    const cd_snake *s;
    float *x;
    int64_t L;
} snake_job;

static void snake_task(void *ctx, int64_t c, int worker) {
    (void)worker;
    const snake_job *j = ctx;
    float a = j->s->alpha[c], inv = j->s->inv[c];
    float *x = j->x + c * j->L;
    for (int64_t t = 0; t < j->L; t++) {
        float v = sinf(a * x[t]);
        x[t] = x[t] + inv * (v * v);
    }
}

void cd_snake_run(const cd_snake *s, float *x, int64_t L, dr_pool *pool) {
    snake_job j = {s, x, L};
    dr_pool_run(pool, s->c, snake_task, &j);
}

static float *tmp(int64_t c, int64_t L) {
    size_t bytes;
    if (!dr_mul_size((size_t)c * (size_t)L, sizeof(float), &bytes)) return NULL;
    return dr_alloc(bytes ? bytes : 4);
}

drama_status cd_ru_run(const cd_ru *ru, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err) {
    int c = ru->c1.cin;
    float *a = tmp(c, L), *b = tmp(ru->c1.cout, L), *y = tmp(ru->c2.cout, L);
    drama_status rc = DRAMA_OK;
    if (!a || !b || !y) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (residual unit)");
    if (!rc) {
        memcpy(a, x, (size_t)c * (size_t)L * sizeof(float));
        cd_snake_run(&ru->s1, a, L, pool);
        rc = cd_conv_run(&ru->c1, cd_hist(hist, &ru->c1), a, L, b, pool, err);
    }
    if (!rc) {
        cd_snake_run(&ru->s2, b, L, pool);
        rc = cd_conv_run(&ru->c2, cd_hist(hist, &ru->c2), b, L, y, pool, err);
    }
    if (!rc)
        for (int64_t i = 0; i < (int64_t)c * L; i++) x[i] = x[i] + y[i];
    dr_free(a), dr_free(b), dr_free(y);
    return rc;
}

/* LayerNorm over channels per time step; sums run over channels in order for every t. */
static void layernorm_ct(float *x, int C, int64_t L, const float *w, const float *b, double eps) {
    for (int64_t t0 = 0; t0 < L; t0 += TT) {
        int64_t nt = L - t0 < TT ? L - t0 : TT;
        float mean[TT], var[TT];
        for (int64_t t = 0; t < nt; t++) mean[t] = 0.0f, var[t] = 0.0f;
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) mean[t] += x[(int64_t)c * L + t0 + t];
        for (int64_t t = 0; t < nt; t++) mean[t] /= (float)C;
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) {
                float d = x[(int64_t)c * L + t0 + t] - mean[t];
                var[t] += d * d;
            }
        for (int64_t t = 0; t < nt; t++) var[t] = 1.0f / sqrtf(var[t] / (float)C + (float)eps);
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++) {
                float *p = &x[(int64_t)c * L + t0 + t];
                *p = (*p - mean[t]) * var[t] * w[c] + b[c];
            }
    }
}

drama_status cd_convnext_run(const cd_convnext *b, float **hist, float *x, int64_t L, dr_pool *pool, drama_error *err) {
    int C = b->dw.cout, H = b->pw1.cout;
    float *h = tmp(C, L), *m = tmp(H, L), *o = tmp(C, L);
    drama_status rc = DRAMA_OK;
    if (!h || !m || !o) rc = dr_fail(err, DRAMA_ENOMEM, "codec: out of memory (ConvNeXt block)");
    if (!rc) rc = cd_conv_run(&b->dw, cd_hist(hist, &b->dw), x, L, h, pool, err);
    if (!rc) {
        layernorm_ct(h, C, L, b->ln_w, b->ln_b, b->ln_eps);
        rc = cd_conv_run(&b->pw1, NULL, h, L, m, pool, err);
    }
    if (!rc) {
        for (int64_t i = 0; i < (int64_t)H * L; i++) m[i] = 0.5f * m[i] * (1.0f + erff(m[i] * (float)M_SQRT1_2));
        rc = cd_conv_run(&b->pw2, NULL, m, L, o, pool, err);
    }
    if (!rc)
        for (int c = 0; c < C; c++)
            for (int64_t t = 0; t < L; t++) x[(int64_t)c * L + t] += b->gamma[c] * o[(int64_t)c * L + t];
    dr_free(h), dr_free(m), dr_free(o);
    return rc;
}
