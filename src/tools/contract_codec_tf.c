/* contract_codec_tf.c - `drama contract` entries for the codec transformer's kernels and the encoder's
 * VQ search (src/codec/transformer.c, ops.c): RoPE (bf16 and fp32 tables), windowed attention and
 * its KV window, SwiGLU gate, GELU, tanh, VQ nearest code. Float64 references, tolerances from each
 * op's operation sequence (docs/contract.md); registered with the other codec entries in contract_codec.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "codec/internal.h"
#include "codec/kernels.h"
#include "tools/contract_codec_internal.h"

/* ---- RoPE ---- */

static double bf16_round64(double v) { /* round to 8 significant bits, ties to even */
    int e;
    if (v == 0 || !isfinite(v)) return v;
    frexp(v, &e);
    return ldexp(nearbyint(ldexp(v, 8 - e)), e - 8);
}

/* the table value the kernel may produce: its reference and its allowed error, given the
 * fp32 value's error bound dv around the exact v */
static void table_value(double v, double dv, int bf16, double *val, double *err) {
    if (!bf16) {
        *val = v, *err = dv;
        return;
    }
    double lo = bf16_round64(v - dv), hi = bf16_round64(v + dv);
    *val = bf16_round64(v);
    *err = hi - lo; /* 0 when the rounding is determined; else one bf16 step */
}

static void rope_case(const ct_kernel *k, ct_result *res, dr_pool *pool, uint64_t *s, int kind, int H, int hd, int64_t L,
                      int64_t pos0) {
    int bf16 = KV(k) == K_ROPE, Dq = H * hd;
    dr_codec_tf_config cf = {.n_head = H, .head_dim = hd, .rope_base = 10000, .rope_bf16 = bf16};
    int64_t n = 3 * (int64_t)Dq * L;
    float *x = fvec(n), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    ct_fill_kind(s, kind, x, n);
    if (kind == X_NONFINITE) x[(int64_t)(Dq + 1) * L] = NAN, x[L - 1] = INFINITY; /* rotated / untouched row */
    for (int64_t i = 0; i < n; i++) ref[i] = x[i], tol[i] = 0, alt[i] = x[i]; /* rows outside: unchanged */
    double lnb = log(cf.rope_base);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int64_t t = 0; t < L; t++) {
                double e = 2.0 * i / hd, ang = (double)(pos0 + t) * pow(cf.rope_base, -e);
                double da = fabs(ang) * (lnb * e + 4) * U; /* exponent, powf, reciprocal, product in fp32 */
                double c, dc, sn, ds, cv = cos(ang), sv = sin(ang);
                table_value(cv, fabs(sv) * da + da * da / 2 + 2 * U, bf16, &c, &dc);
                table_value(sv, fabs(cv) * da + da * da / 2 + 2 * U, bf16, &sn, &ds);
                int64_t i0 = (int64_t)(Dq + h * hd + 2 * i) * L + t, i1 = i0 + L;
                double a = x[i0], b = x[i1];
                ref[i0] = a * c - b * sn;
                ref[i1] = b * c + a * sn;
                double m0 = fabs(a * c) + fabs(b * sn), m1 = fabs(b * c) + fabs(a * sn);
                tol[i0] = 2 * (fabs(a) * dc + fabs(b) * ds + 2 * U * m0 + U * fabs(ref[i0])) + TINY;
                tol[i1] = 2 * (fabs(b) * dc + fabs(a) * ds + 2 * U * m1 + U * fabs(ref[i1])) + TINY;
                float hc = ct_h((float)cv), hs = ct_h((float)sv); /* fp16 tables */
                alt[i0] = x[i0] * hc - x[i1] * hs;
                alt[i1] = x[i1] * hc + x[i0] * hs;
            }
    memcpy(y, x, (size_t)n * sizeof *y); /* in place on the k rows of a qkv buffer */
    dr_codec_tf_config run_cf = cf;
    if (k->control == CC_ROPE_BASE) run_cf.rope_base = 500000; /* planted: another model's RoPE base */
    cd_rope_ct(y, Dq, &run_cf, L, pos0, pool);
    char name[96];
    snprintf(name, sizeof name, "%s heads=%d hd=%d L=%lld pos=%lld", ct_x_kind[kind], H, hd, (long long)L,
             (long long)pos0);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(x), free(y), free(alt), free(ref), free(tol);
}

void ct_codec_check_rope(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x524f5045ull ^ (uint64_t)KV(k);
    static const int shapes[][3] = {{2, 8, 5}, {1, 64, 3}, {3, 2, 37}};
    static const int64_t pos[] = {0, 1, 17, 5000, 100000};
    for (int i = 0; i < 3; i++)
        for (int p = 0; p < 5; p++) rope_case(k, res, ctx->pool, &s, X_RANDOM, shapes[i][0], shapes[i][1], shapes[i][2], pos[p]);
    for (int kind = X_RANGE; kind < X_DISCR; kind++) rope_case(k, res, ctx->pool, &s, kind, 2, 8, 5, 17);
    rope_case(k, res, ctx->pool, &s, X_DISCR, 2, 64, 3, 1);
}

/* ---- attention with a KV window ---- */

static void attend_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int H, int hd, int W, int64_t n_prev,
                        int64_t L, dr_pool *pool) {
    int Dq = H * hd;
    int64_t np = n_prev + L, no = (int64_t)Dq * L;
    float *q = fvec(L * Dq), *kk = fvec(np * Dq), *vv = fvec(np * Dq), *out = fvec(no), *alt = fvec(no);
    double *ref = dvec(no), *tol = dvec(no), *sc = dvec(np), *p = dvec(np), *ds = dvec(np);
    ct_fill_kind(s, kind == X_DISCR ? X_RANDOM : kind == X_RANGE ? X_RANDOM : kind, q, L * Dq);
    ct_fill_kind(s, kind == X_NONFINITE || kind == X_RANGE ? X_RANDOM : kind, kk, np * Dq);
    ct_fill_kind(s, kind == X_NONFINITE || kind == X_RANGE ? X_RANDOM : kind, vv, np * Dq);
    if (kind == X_RANGE) /* peaked: scores of a few tens, the softmax nearly one-hot */
        for (int64_t i = 0; i < L * Dq; i++) q[i] *= 6.0f;
    if (kind == X_DISCR) /* equal scores, positive values: a long sum of small equal terms */
        for (int64_t i = 0; i < np * Dq; i++) kk[i] = 0.0f;
    if (kind == X_NONFINITE) {
        if (H > 1) q[hd + 1] = NAN;                 /* head 1 of query 0 */
        vv[np / 2 * Dq] = NAN;                      /* seen only by queries whose window holds it */
    }
    double scale = 1 / sqrt((double)hd);
    for (int64_t t = 0; t < L; t++)
        for (int h = 0; h < H; h++) {
            int64_t last = n_prev + t, first = last - (W - 1) < 0 ? 0 : last - (W - 1), n = last - first + 1;
            double mx = -INFINITY, dmx = 0, sum = 0, rel_s = n * U;
            for (int64_t j = first; j <= last; j++) {
                double d = 0, m = 0;
                for (int e = 0; e < hd; e++) {
                    double pr = (double)q[t * Dq + h * hd + e] * kk[j * Dq + h * hd + e];
                    d += pr, m += fabs(pr);
                }
                sc[j] = d * scale;
                ds[j] = (hd + 1) * U * m * scale + 3 * U * fabs(sc[j]); /* dot, fp32 scale, product */
                if (sc[j] > mx) mx = sc[j];
                if (ds[j] > dmx) dmx = ds[j];
            }
            for (int64_t j = first; j <= last; j++) sum += exp(sc[j] - mx);
            for (int64_t j = first; j <= last; j++) {
                p[j] = exp(sc[j] - mx) / sum;
                ds[j] += dmx + U * fabs(sc[j] - mx) + 2 * U; /* now the relative error of exp(s - max) */
                rel_s += p[j] * ds[j];
            }
            for (int e = 0; e < hd; e++) {
                double o = 0, m = 0, mp = 0;
                float hsum = 0, hacc = 0;
                for (int64_t j = first; j <= last; j++) hsum = ct_h(hsum + expf((float)(sc[j] - mx)));
                for (int64_t j = first; j <= last; j++) {
                    double v = vv[j * Dq + h * hd + e];
                    o += p[j] * v;
                    m += p[j] * fabs(v) * (ds[j] + rel_s + U);
                    mp += p[j] * fabs(v);
                    hacc = ct_h(hacc + expf((float)(sc[j] - mx)) / hsum * (float)v);
                }
                int64_t i = (int64_t)(h * hd + e) * L + t;
                ref[i] = o;
                tol[i] = 2 * (m + (n + 1) * U * mp) + TINY;
                alt[i] = hacc;
            }
        }
    dr_codec_tf_config cf = {.n_head = H, .head_dim = hd, .window_size = W};
    if (k->control == CC_WIDE) cf.window_size = W + 1; /* planted: one key too many */
    ct_poison(out, no);
    cd_attend_ex(&cf, q, kk, vv, n_prev, L, out, pool, KISA(k), k->control == CC_SIMD_TAP ? CD_PLANT_TAP : 0);
    char name[96];
    snprintf(name, sizeof name, "%s heads=%d hd=%d W=%d cached=%lld L=%lld", ct_x_kind[kind], H, hd, W,
             (long long)n_prev, (long long)L);
    ct_compare(res, name, out, ref, tol, no);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, no);
    free(q), free(kk), free(vv), free(out), free(alt), free(ref), free(tol), free(sc), free(p), free(ds);
}

/* The KV window carried by cd_tf_run: a small 2-layer transformer fed in chunks must give the
 * whole-sequence output exactly (CODEC.md 6). */
static void tf_window_case(ct_result *res, uint64_t *s, dr_pool *pool) {
    enum { D = 16, H = 2, HD = 8, F = 24, W = 5, NL = 2, L = 23 };
    dr_codec_tf_config cf = {.n_layer = NL, .dim = D, .intermediate_size = F, .n_head = H, .n_local_heads = H,
                             .head_dim = HD, .window_size = W, .rope_base = 10000, .norm_eps = 1e-5,
                             .layer_scale = 1, .rope_bf16 = 1};
    cd_tlayer layers[NL];
    float *bufs[NL * 9 + 1]; /* every weight of the little transformer (dr_alloc) */
    int nb = 0;
    for (int l = 0; l < NL; l++) {
        cd_conv *lin[5] = {&layers[l].wqkv, &layers[l].wo, &layers[l].w1, &layers[l].w3, &layers[l].w2};
        const int dims[5][2] = {{3 * H * HD, D}, {D, H * HD}, {F, D}, {F, D}, {D, F}};
        for (int m = 0; m < 5; m++) {
            float *w = fvec(dims[m][0] * dims[m][1]);
            ct_fill_kind(s, X_RANDOM, w, dims[m][0] * dims[m][1]);
            for (int i = 0; i < dims[m][0] * dims[m][1]; i++) w[i] *= 0.3f;
            cd_conv_init(lin[m], dims[m][1], dims[m][0], 1, 1, 1, 1, 0);
            lin[m]->w = bufs[nb++] = dr_alloc((size_t)cd_conv_weight_len(lin[m]) * sizeof(float));
            cd_conv_pack(lin[m], w, lin[m]->w);
            free(w);
        }
        float **vecs[4] = {&layers[l].attn_norm, &layers[l].ffn_norm, &layers[l].g_attn, &layers[l].g_ffn};
        for (int m = 0; m < 4; m++) {
            *vecs[m] = bufs[nb++] = dr_alloc(D * sizeof(float));
            for (int i = 0; i < D; i++) (*vecs[m])[i] = (float)(1 + 0.2 * ct_rand_normal(s));
        }
    }
    float *norm = bufs[nb++] = dr_alloc(D * sizeof(float));
    for (int i = 0; i < D; i++) norm[i] = (float)(1 + 0.2 * ct_rand_normal(s));
    cd_tf tf = {.cfg = cf, .layers = layers, .norm = norm, .state = 0};
    int64_t kvn = (int64_t)NL * (W - 1) * H * HD;
    float *x = fvec(D * L), *y = fvec(D * L), *yc = fvec(D * L), *xc = fvec(D * L), *oc = fvec(D * L);
    double *whole = dvec(D * L), *zero = dvec(D * L);
    ct_fill_kind(s, X_RANDOM, x, D * L);
    cd_kv kv = {calloc((size_t)kvn, sizeof(float)), calloc((size_t)kvn, sizeof(float)), 0, 0};
    ct_poison(y, D * L);
    cd_tf_run(&tf, &kv, x, L, y, pool, NULL);
    kv.n = kv.pos = 0;
    static const int chunk[] = {1, 4, 2, 7, 9};
    for (int64_t t0 = 0, ci = 0, n = 0; t0 < L; t0 += n, ci++) {
        n = chunk[ci % 5] < L - t0 ? chunk[ci % 5] : L - t0;
        for (int c = 0; c < D; c++) memcpy(xc + c * n, x + c * L + t0, (size_t)n * sizeof *xc);
        ct_poison(oc, D * n);
        cd_tf_run(&tf, &kv, xc, n, oc, pool, NULL);
        for (int c = 0; c < D; c++) memcpy(yc + c * L + t0, oc + c * n, (size_t)n * sizeof *yc);
    }
    for (int i = 0; i < D * L; i++) whole[i] = y[i], zero[i] = 0;
    ct_compare(res, "transformer W=5 in chunks 1,4,2,7,9 == whole", yc, whole, zero, D * L);
    for (int i = 0; i < nb; i++) dr_free(bufs[i]);
    free(kv.k), free(kv.v), free(x), free(y), free(yc), free(xc), free(oc), free(whole), free(zero);
}

void ct_codec_check_attend(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x41545457ull;
    static const int shapes[][5] = {{2, 8, 5, 0, 9}, {1, 64, 128, 127, 3}, {3, 33, 16, 4, 40}, {2, 32, 8, 7, 1}};
    for (int kind = 0; kind < X_KINDS; kind++) {
        if (kind == X_DISCR) {
            attend_case(k, res, &s, kind, 1, 16, 4096, 4095, 1, ctx->pool);
            continue;
        }
        for (int i = 0; i < 4; i++)
            attend_case(k, res, &s, kind, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4],
                        ctx->pool);
    }
    tf_window_case(res, &s, ctx->pool);
}

/* ---- element-wise: SwiGLU gate, tanh, GELU ---- */

/* The tanh approximation of GELU: a plausible wrong kernel (codec.json requires "erf"). */
static void gelu_tanh_approx(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

static void elementwise_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int64_t n, dr_pool *pool) {
    int glu = KV(k) == K_SWIGLU, gelu = KV(k) == K_GELU;
    float *a = fvec(n), *u = fvec(n), *y = fvec(n), *alt = fvec(n);
    double *ref = dvec(n), *tol = dvec(n);
    ct_fill_kind(s, kind, a, n);
    ct_fill_kind(s, kind == X_NONFINITE ? X_RANDOM : kind, u, n);
    if (kind == X_RANGE && n > 4) a[0] = -100.0f, a[1] = -88.8f, a[2] = 89.0f, a[3] = -87.0f; /* expf overflow edges */
    if (kind == X_NONFINITE && n > 3) a[0] = NAN, a[1] = INFINITY, a[2] = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double av = a[i];
        if (gelu) { /* t = x fp32(1/sqrt2) carries 2u; erf' = 2/sqrt(pi) exp(-t^2) */
            double t = av * M_SQRT1_2, e = erf(t);
            ref[i] = 0.5 * av * (1 + e);
            double de = 2 * U * fabs(t) * 1.1283791670955126 * exp(-t * t);
            tol[i] = 2 * (0.5 * fabs(av) * (U * fabs(1 + e) + 2 * U * fabs(e) + de) + U * fabs(ref[i])) + TINY;
            alt[i] = ct_h(0.5f * a[i] * ct_h(1.0f + erff(a[i] * (float)M_SQRT1_2)));
        } else if (glu) {
            ref[i] = av / (1 + exp(-av)) * u[i];
            tol[i] = 10 * U * fabs(ref[i]) + 0x1p-120 * fabs(u[i]) + TINY;
            alt[i] = ct_h(a[i] / (1.0f + expf(-a[i]))) * u[i];
        } else {
            ref[i] = tanh(av);
            tol[i] = 4 * U * fabs(ref[i]) + TINY;
            alt[i] = ct_h(tanhf(a[i]));
        }
    }
    if (gelu) {
        memcpy(y, a, (size_t)n * sizeof *y); /* in place */
        if (k->control == CC_GELU_TANH) gelu_tanh_approx(y, n);
        else cd_gelu_erf(y, n, pool);
    } else if (glu && k->control == CC_SWAP) { /* planted: gate and up swapped */
        memcpy(y, u, (size_t)n * sizeof *y);
        cd_swiglu(y, a, n, pool);
    } else if (glu) {
        memcpy(y, a, (size_t)n * sizeof *y); /* in place */
        cd_swiglu(y, u, n, pool);
    } else {
        ct_poison(y, n);
        cd_tanh(a, y, n, pool);
        if (k->control == CC_HALF) /* planted: an fp16 tanh */
            for (int64_t i = 0; i < n; i++) y[i] = ct_h(y[i]);
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld", ct_x_kind[kind], (long long)n);
    ct_compare(res, name, y, ref, tol, n);
    if (kind == X_DISCR) ct_discriminate(res, name, alt, ref, tol, n);
    free(a), free(u), free(y), free(alt), free(ref), free(tol);
}

void ct_codec_check_elementwise(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x454c454dull ^ (uint64_t)KV(k);
    static const int64_t ns[] = {1, 7, 1000, 4097};
    for (int kind = 0; kind < X_KINDS; kind++)
        for (int i = 0; i < 4; i++) elementwise_case(k, res, &s, kind, ns[i], ctx->pool);
}

/* ---- VQ nearest code (encoder) ---- */

/* a reduced-precision or planted search on the library's normalised codebook */
static int vq_search(const cd_vq *q, const float *e, int64_t stride, int fp16, int ties_high) {
    float eh[CD_VQ_MAX_DIM];
    float ee = cd_unit_vector(e, stride, q->dim, eh), best_d = INFINITY;
    int best = 0;
    for (int j = 0; j < q->n; j++) {
        float dot = 0.0f;
        for (int d = 0; d < q->dim; d++) {
            dot = dot + eh[d] * q->cb_hat[(int64_t)j * q->dim + d];
            if (fp16) dot = ct_h(dot);
        }
        float dist = ee - 2.0f * dot + q->cb_hat_sq[j];
        if (dist < best_d || (ties_high && dist == best_d)) best_d = dist, best = j;
    }
    return best;
}

enum { V_RANDOM, V_SPECIAL, V_TIES, V_TINY_E, V_NEAR, V_KINDS };
static const char *const v_kind[V_KINDS] = {"random", "zero/tiny/scaled rows", "ties (rows twice)",
                                            "e below 1e-12", "near-ties (fp16-discriminating)"};

static void vq_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int n, int dim, int T) {
    float *cb = fvec((int64_t)n * dim), *hat = fvec((int64_t)n * dim), *hsq = fvec(n), *e = fvec((int64_t)dim * T);
    float *out = fvec(2 * T), *alt = fvec(2 * T);
    double *ref = dvec(2 * T), *tol = dvec(2 * T), *dist = dvec(n), *err = dvec(n), *ch = dvec((int64_t)n * dim);
    ct_fill_kind(s, X_RANDOM, cb, (int64_t)n * dim);
    ct_fill_kind(s, X_RANDOM, e, (int64_t)dim * T);
    if (kind == V_SPECIAL && n > 3) {
        for (int d = 0; d < dim; d++) cb[d] = 0.0f, cb[dim + d] *= 1e-13f, cb[2 * dim + d] = 2.0f * cb[3 * dim + d];
    }
    if (kind == V_TIES) memcpy(cb + (int64_t)(n / 2) * dim, cb, (size_t)(n / 2) * dim * sizeof *cb);
    if (kind == V_TINY_E)
        for (int64_t i = 0; i < (int64_t)dim * T; i++) e[i] *= 1e-14f; /* the 1e-12 floor decides */
    if (kind == V_NEAR) /* every code within ~1e-2 of the direction of e column 0 */
        for (int j = 0; j < n; j++)
            for (int d = 0; d < dim; d++)
                cb[(int64_t)j * dim + d] = e[(int64_t)d * T] + 0.01f * (float)ct_rand_normal(s);
    for (int j = 0; j < n; j++) {
        double ss = 0;
        for (int d = 0; d < dim; d++) ss += (double)cb[(int64_t)j * dim + d] * cb[(int64_t)j * dim + d];
        double den = fmax(sqrt(ss), 1e-12);
        for (int d = 0; d < dim; d++) ch[(int64_t)j * dim + d] = cb[(int64_t)j * dim + d] / den;
    }
    cd_vq q = {.n = n, .dim = dim, .codebook = cb, .cb_hat = hat, .cb_hat_sq = hsq};
    cd_vq_normalise(&q);
    for (int t = 0; t < T; t++) {
        double ss = 0, eh[CD_VQ_MAX_DIM], ee = 0;
        for (int d = 0; d < dim; d++) ss += (double)e[(int64_t)d * T + t] * e[(int64_t)d * T + t];
        for (int d = 0; d < dim; d++) eh[d] = e[(int64_t)d * T + t] / fmax(sqrt(ss), 1e-12), ee += eh[d] * eh[d];
        int best = 0;
        for (int j = 0; j < n; j++) {
            double dot = 0, m = 0, hs = 0;
            for (int d = 0; d < dim; d++) {
                double c = ch[(int64_t)j * dim + d];
                dot += eh[d] * c, m += fabs(eh[d] * c), hs += c * c;
            }
            dist[j] = ee - 2 * dot + hs;
            err[j] = (2 * dim + 16) * U * (ee + 2 * m + hs);
            if (dist[j] < dist[best]) best = j;
        }
        int got = k->control == CC_TIES_HIGH ? vq_search(&q, e + t, T, 0, 1) /* planted: ties to the higher index */
                                             : cd_vq_nearest(&q, e + t, T);
        int a16 = vq_search(&q, e + t, T, 1, 0);
        int first = got; /* the lowest index holding the same raw row */
        for (int j = 0; j < n; j++)
            if (!memcmp(cb + (int64_t)j * dim, cb + (int64_t)got * dim, (size_t)dim * sizeof *cb)) {
                first = j;
                break;
            }
        out[2 * t] = got >= 0 && got < n ? (float)dist[got] : NAN; /* + u|dist| from the fp32 store */
        ref[2 * t] = dist[best];
        tol[2 * t] = (got >= 0 && got < n ? err[got] : 0) + err[best] + 2 * U * fabs(dist[best]) + TINY;
        out[2 * t + 1] = (float)got, ref[2 * t + 1] = first, tol[2 * t + 1] = 0;
        alt[2 * t] = (float)dist[a16], alt[2 * t + 1] = (float)first; /* judged by its distance only */
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%d dim=%d", v_kind[kind], n, dim);
    ct_compare(res, name, out, ref, tol, 2 * T);
    if (kind == V_NEAR) ct_discriminate(res, name, alt, ref, tol, 2 * T);
    free(cb), free(hat), free(hsq), free(e), free(out), free(alt), free(ref), free(tol), free(dist), free(err);
    free(ch);
}

void ct_codec_check_vq(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x5651ull;
    static const int shapes[][2] = {{64, 8}, {7, 3}, {40, 64}, {4, 1}};
    for (int kind = 0; kind < V_KINDS; kind++) {
        if (kind == V_NEAR) {
            vq_case(k, res, &s, kind, 256, 8, 1);
            continue;
        }
        for (int i = 0; i < 4; i++) vq_case(k, res, &s, kind, shapes[i][0], shapes[i][1], 33);
    }
}
