/* gdn_chunk.c - the gated delta rule over L consecutive rows of one value head in the chunked
 * (WY) form: the rows' updates are solved together as one lower-triangular system instead of L
 * rank-1 passes over the state, so the state is read twice per chunk rather than four times per
 * row and the work becomes dense products. Same recurrence as dr_op_gdn_step up to fp32
 * rounding (checked against a float64 row-by-row reference by `drama contract`, gdn_chunk).
 *
 * With G_t = exp(gc_t), gc_t = g_1 + ... + g_t (the decay since the chunk start) and S_0 the
 * state before the chunk, the row-by-row rule gives
 *   d_t = beta_t (v_t - G_t S_0^T k_t - sum_{s<t} (G_t/G_s)(k_t.k_s) d_s)   (forward substitution)
 *   o_t = G_t S_0^T q_t + sum_{s<=t} (G_t/G_s)(q_t.k_s) d_s
 *   S_L = G_L S_0 + sum_s (G_L/G_s) k_s d_s^T
 * Every decay ratio is exp(gc_t - gc_s) <= 1 (gc in double, one expf), never a quotient, so a
 * strong decay underflows to 0 instead of overflowing.
 * Every product is one kernel, y[j] = fma(c_r, X_r[j], y[j]) for r in order (vecmat): AVX2 runs 8
 * columns per instruction, the portable loop one, with the same operations per element, so both
 * give the same bits. gdn_chunk_plant.c compiles this file again with a defect inside both of
 * vecmat's loops. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"

#ifndef GDN_CHUNK_NAME
#define GDN_CHUNK_NAME dr_op_gdn_chunk
#define PLANT 0
#endif
#define VECMAT_NAME(f) vecmat_##f

/* planted: the last coefficient of a run is replaced by the one before it */
#define COEF(c, r, nr) (c)[PLANT && (r) == (nr) - 1 && (r) > 0 ? (r) - 1 : (r)]

/* y[j] = fma(c[r], X[r * ldx + j], y[j]) for r = 0 .. nr-1 in order, j < n */
static void VECMAT_NAME(portable)(float *y, const float *c, const float *X, int64_t ldx, int nr, int n) {
    for (int r = 0; r < nr; r++) {
        float cr = COEF(c, r, nr);
        const float *xr = X + r * ldx;
        for (int j = 0; j < n; j++) y[j] = fmaf(cr, xr[j], y[j]);
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* 32 columns at a time held in registers over all r, then 8, then the scalar tail */
__attribute__((target("avx2,fma"))) static void VECMAT_NAME(avx2)(float *y, const float *c, const float *X,
                                                                   int64_t ldx, int nr, int n) {
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 y0 = _mm256_loadu_ps(y + j), y1 = _mm256_loadu_ps(y + j + 8);
        __m256 y2 = _mm256_loadu_ps(y + j + 16), y3 = _mm256_loadu_ps(y + j + 24);
        for (int r = 0; r < nr; r++) {
            __m256 cr = _mm256_set1_ps(COEF(c, r, nr));
            const float *xr = X + r * ldx + j;
            y0 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(xr), y0);
            y1 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(xr + 8), y1);
            y2 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(xr + 16), y2);
            y3 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(xr + 24), y3);
        }
        _mm256_storeu_ps(y + j, y0);
        _mm256_storeu_ps(y + j + 8, y1);
        _mm256_storeu_ps(y + j + 16, y2);
        _mm256_storeu_ps(y + j + 24, y3);
    }
    for (; j + 8 <= n; j += 8) {
        __m256 y0 = _mm256_loadu_ps(y + j);
        for (int r = 0; r < nr; r++) y0 = _mm256_fmadd_ps(_mm256_set1_ps(COEF(c, r, nr)), _mm256_loadu_ps(X + r * ldx + j), y0);
        _mm256_storeu_ps(y + j, y0);
    }
    for (; j < n; j++) {
        float t = y[j];
        for (int r = 0; r < nr; r++) t = fmaf(COEF(c, r, nr), X[r * ldx + j], t);
        y[j] = t;
    }
}
#endif

typedef void (*vecmat_fn)(float *y, const float *c, const float *X, int64_t ldx, int nr, int n);

#if PLANT == 0
int64_t dr_op_gdn_chunk_scratch(int L, int dk, int dv) {
    return 3 * (int64_t)L * dv + 3 * (int64_t)L * L + (int64_t)dk * L + 3 * (int64_t)L;
}
#endif

void GDN_CHUNK_NAME(float *S, const float *q, const float *k, int64_t ld_qk, const float *v, int64_t ld_v,
                    const float *g, const float *beta, int64_t ld_gate, int L, int dk, int dv, float *scratch,
                    float *o, int64_t ld_o, int portable) {
    vecmat_fn vecmat = VECMAT_NAME(portable);
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    if (!portable && dr_cpu_best_path() != DR_CPU_PORTABLE) vecmat = VECMAT_NAME(avx2); /* AVX2 or AVX-512 CPUs */
#endif
    float *ks = scratch;                   /* [L][dv] S_0^T k_t */
    float *qs = ks + (int64_t)L * dv;      /* [L][dv] S_0^T q_t */
    float *d = qs + (int64_t)L * dv;       /* [L][dv] the solved updates d_t */
    float *na = d + (int64_t)L * dv;       /* [L][L] -beta_t (G_t/G_s) k_t.k_s, s < t */
    float *p = na + (int64_t)L * L;        /* [L][L] (G_t/G_s) q_t.k_s, s <= t */
    float *dots = p + (int64_t)L * L;      /* [L][L] k_t.k_s, then q_t.k_s */
    float *kt_T = dots + (int64_t)L * L;   /* [dk][L] the chunk's k transposed */
    float *G = kt_T + (int64_t)dk * L;     /* [L] G_t */
    float *GL = G + L;                     /* [L] G_L / G_s */
    float *cf = GL + L;                    /* [L] coefficients of one run */
    double gc[256 + 1];                    /* callers pass L <= 256 */
    gc[0] = 0;
    for (int t = 0; t < L; t++) gc[t + 1] = gc[t] + (double)g[t * ld_gate];
    for (int t = 0; t < L; t++) {
        G[t] = expf((float)gc[t + 1]);
        GL[t] = expf((float)(gc[L] - gc[t + 1]));
    }
    for (int t = 0; t < L; t++)
        for (int i = 0; i < dk; i++) kt_T[(int64_t)i * L + t] = k[t * ld_qk + i];
    /* S_0^T k_t, S_0^T q_t (runs over the state rows i) */
    memset(ks, 0, (size_t)(2 * (int64_t)L * dv) * sizeof *ks); /* ks and qs */
    for (int t = 0; t < L; t++) {
        vecmat(ks + (int64_t)t * dv, k + t * ld_qk, S, dv, dk, dv);
        vecmat(qs + (int64_t)t * dv, q + t * ld_qk, S, dv, dk, dv);
    }
    /* k_t.k_s (s < t) and q_t.k_s (s <= t): runs over i against the transposed k */
    for (int t = 0; t < L; t++) {
        float *kk = dots + (int64_t)t * L, *qk = na + (int64_t)t * L;
        memset(kk, 0, (size_t)L * sizeof *kk);
        memset(qk, 0, (size_t)L * sizeof *qk);
        vecmat(kk, k + t * ld_qk, kt_T, L, dk, t);
        vecmat(qk, q + t * ld_qk, kt_T, L, dk, t + 1);
        float bt = beta[t * ld_gate];
        for (int s = 0; s <= t; s++) {
            float ratio = expf((float)(gc[t + 1] - gc[s + 1]));
            p[(int64_t)t * L + s] = ratio * qk[s];
            qk[s] = s < t ? -(bt * ratio * kk[s]) : 0.0f; /* na row t (qk aliases it: read before written) */
        }
    }
    /* forward substitution: d_t = beta_t (v_t - G_t ks_t) + sum_{s<t} na[t][s] d_s */
    for (int t = 0; t < L; t++) {
        const float *vt = v + t * ld_v, *kst = ks + (int64_t)t * dv;
        float *dt = d + (int64_t)t * dv;
        float bt = beta[t * ld_gate], Gt = G[t];
        for (int j = 0; j < dv; j++) dt[j] = bt * (vt[j] - Gt * kst[j]);
        vecmat(dt, na + (int64_t)t * L, d, dv, t, dv);
    }
    /* outputs o_t = G_t qs_t + sum_{s<=t} p[t][s] d_s */
    for (int t = 0; t < L; t++) {
        float *ot = o + t * ld_o;
        const float *qst = qs + (int64_t)t * dv;
        float Gt = G[t];
        for (int j = 0; j < dv; j++) ot[j] = Gt * qst[j];
        vecmat(ot, p + (int64_t)t * L, d, dv, t + 1, dv);
    }
    /* the state after the chunk: S_i = G_L S_i + sum_s (G_L/G_s) k_s[i] d_s */
    float GLL = G[L - 1];
    for (int i = 0; i < dk; i++) {
        float *row = S + (int64_t)i * dv;
        for (int j = 0; j < dv; j++) row[j] *= GLL;
        for (int s = 0; s < L; s++) cf[s] = GL[s] * kt_T[(int64_t)i * L + s];
        vecmat(row, cf, d, dv, L, dv);
    }
}
