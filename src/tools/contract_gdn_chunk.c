/* contract_gdn_chunk.c - `drama contract` entry for the chunked DeltaNet prefill
 * (dr_op_gdn_chunk, backend/cpu/gdn_chunk.c): a float64 row-by-row recurrence as the reference,
 * a normwise tolerance per value column, and a control with a defect planted in the kernel's
 * substitution loop (dr_op_gdn_chunk_planted).
 *
 * Tolerance. Column j of the state follows its own recurrence S_t[:,j] = (I - b_t k_t k_t^T) G S_{t-1}[:,j]
 * + b_t k_t v_t[j], a non-expansion for |k_t| <= 1, 0 <= b_t <= 1 (the model's k is l2-normalised,
 * b a sigmoid), so rounding errors are not amplified from row to row. Each fp32 sum of the
 * chunked form has at most dk + L terms of size |v_s[j]| or |S_s[:,j]|_2, so with
 *   M_j(t) = sum_{s<=t} (|v_s[j]| + |S_{s-1}[:,j]|_2) + |S_t[:,j]|_2   (float64 reference values)
 * the bound is tol = 4 (dk + L + 4) u M_j(t) for the state column and |q_t|_2 times that for
 * o_t[j] (u = 2^-24). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "tools/contract_internal.h"

#define U CT_U32
#define GK_STR_(x) #x
#define GK_STR(x) GK_STR_(x) /* the block length as text (time_shape) */

enum { GK_RANDOM, GK_TINY, GK_DECAY, GK_NAN, GK_DISCR, GK_KINDS };
static const char *const gk_name[GK_KINDS] = {"random", "tiny", "strong/weak decay", "nan", "fp16-discriminating"};

/* a unit vector (times scale) of n normal components (positive: of uniform ones in [0.5, 1)) */
static void unit(uint64_t *s, float *x, int n, double scale, int positive) {
    double nn = 0;
    for (int i = 0; i < n; i++) {
        x[i] = positive ? (float)(0.5 + 0.5 * ct_rand_uniform(s)) : (float)ct_rand_normal(s);
        nn += (double)x[i] * x[i];
    }
    double r = nn > 0 ? scale / sqrt(nn) : 0;
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] * r);
}

static void chunk_case(const ct_kernel *k, ct_result *res, uint64_t *s, int kind, int L, int dk, int dv) {
    int64_t ns = (int64_t)dk * dv, no = (int64_t)L * dv + ns;
    float *S = malloc((size_t)ns * 4), *q = malloc((size_t)L * dk * 4), *kk = malloc((size_t)L * dk * 4);
    float *v = malloc((size_t)L * dv * 4), *g = malloc((size_t)L * 4), *b = malloc((size_t)L * 4);
    float *out = malloc((size_t)no * 4);
    float *scratch = malloc((size_t)dr_op_gdn_chunk_scratch(L, dk, dv) * 4);
    double *Sd = malloc((size_t)ns * 8), *ref = malloc((size_t)no * 8), *tol = malloc((size_t)no * 8);
    double *M = malloc((size_t)dv * 8), *dd = malloc((size_t)dv * 8);
    double mag = kind == GK_TINY ? 1e-4 : 1.0;
    int pos = kind == GK_DISCR; /* no cancellation: every term positive */
#define VAL() (pos ? 0.5 + 0.5 * ct_rand_uniform(s) : ct_rand_normal(s) * mag)
    for (int64_t i = 0; i < ns; i++) S[i] = (float)VAL();
    for (int t = 0; t < L; t++) {
        unit(s, q + (int64_t)t * dk, dk, 1.0 / sqrt((double)dk), pos); /* as the model: unit, then 1/sqrt(dk) */
        unit(s, kk + (int64_t)t * dk, dk, 1.0, pos);
        for (int j = 0; j < dv; j++) v[(int64_t)t * dv + j] = (float)VAL();
#undef VAL
        g[t] = -(float)(0.02 + 0.5 * ct_rand_uniform(s));
        if (kind == GK_DECAY) g[t] = t % 5 == 1 ? -40.0f : t % 5 == 3 ? -1e-5f : g[t]; /* expf underflow, ~1 */
        b[t] = (float)ct_rand_uniform(s);
        if (t == 2) b[t] = 1.0f; /* the end of the allowed range */
    }
    if (kind == GK_NAN && L > 1) v[(int64_t)(L / 2) * dv + dv / 2] = NAN; /* reaches column dv/2 from row L/2 on */
    /* float64 row-by-row reference */
    for (int64_t i = 0; i < ns; i++) Sd[i] = S[i];
    for (int j = 0; j < dv; j++) M[j] = 0;
    for (int t = 0; t < L; t++) {
        const float *qt = q + (int64_t)t * dk, *kt = kk + (int64_t)t * dk, *vt = v + (int64_t)t * dv;
        double decay = exp((double)g[t]), qn = 0;
        for (int i = 0; i < dk; i++) qn += (double)qt[i] * qt[i];
        qn = sqrt(qn);
        for (int j = 0; j < dv; j++) {
            double cn = 0, m = 0;
            for (int i = 0; i < dk; i++) {
                double x = Sd[(int64_t)i * dv + j];
                cn += x * x;
                m += decay * x * kt[i];
            }
            M[j] += fabs((double)vt[j]) + sqrt(cn);
            dd[j] = ((double)vt[j] - m) * b[t];
        }
        for (int j = 0; j < dv; j++) {
            double o = 0, cn = 0;
            for (int i = 0; i < dk; i++) {
                int64_t ij = (int64_t)i * dv + j;
                Sd[ij] = Sd[ij] * decay + (double)kt[i] * dd[j];
                o += Sd[ij] * qt[i];
                cn += Sd[ij] * Sd[ij];
            }
            ref[(int64_t)t * dv + j] = o;
            tol[(int64_t)t * dv + j] = 4.0 * (dk + L + 4) * U * qn * (M[j] + sqrt(cn)) + 0x1p-140;
            if (t == L - 1)
                for (int i = 0; i < dk; i++) {
                    ref[(int64_t)L * dv + (int64_t)i * dv + j] = Sd[(int64_t)i * dv + j];
                    tol[(int64_t)L * dv + (int64_t)i * dv + j] = 4.0 * (dk + L + 4) * U * (M[j] + sqrt(cn)) + 0x1p-140;
                }
        }
    }
    ct_poison(out, no);
    float *S_in = malloc((size_t)ns * 4);
    memcpy(S_in, S, (size_t)ns * 4);
    /* the kernel under test: o at stride dv, then the state after the chunk */
    (k->control ? dr_op_gdn_chunk_planted : dr_op_gdn_chunk)(S, q, kk, dk, v, dv, g, b, 1, L, dk, dv, scratch, out, dv,
                                                               k->variant);
    memcpy(out + (int64_t)L * dv, S, (size_t)ns * 4);
    char name[96];
    snprintf(name, sizeof name, "%s L=%d dk=%d dv=%d", gk_name[kind], L, dk, dv);
    ct_compare(res, name, out, ref, tol, no);
    if (kind == GK_DISCR) { /* an fp16-storing variant (the reference rounded to fp16) must fail */
        float *alt = malloc((size_t)no * 4);
        for (int64_t i = 0; i < no; i++) alt[i] = ct_h((float)ref[i]);
        ct_discriminate(res, name, alt, ref, tol, no);
        free(alt);
    }
    if (!k->control && k->variant == 0) { /* the best path gives the portable path's bits */
        float *port = malloc((size_t)no * 4);
        double *pd = malloc((size_t)no * 8), *zero = calloc((size_t)no, 8);
        dr_op_gdn_chunk(S_in, q, kk, dk, v, dv, g, b, 1, L, dk, dv, scratch, port, dv, 1);
        memcpy(port + (int64_t)L * dv, S_in, (size_t)ns * 4);
        for (int64_t i = 0; i < no; i++) pd[i] = port[i];
        snprintf(name, sizeof name, "%s L=%d dk=%d dv=%d: bits of the portable path", gk_name[kind], L, dk, dv);
        ct_compare(res, name, out, pd, zero, no);
        free(port), free(pd), free(zero);
    }
    free(S_in);
    free(S), free(q), free(kk), free(v), free(g), free(b), free(out), free(scratch), free(Sd), free(ref), free(tol);
    free(M), free(dd);
}

static void check_chunk(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x4744434bull;
    const int dims[][2] = {{1, 1}, {8, 5}, {32, 32}, {64, 128}, {128, 128}};
    const int lens[] = {1, 3, 17, 64, DR_GDN_CHUNK}; /* the last: the engine's block (skipped when one above) */
    for (int kind = 0; kind < GK_KINDS; kind++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                if (l == 4 && (DR_GDN_CHUNK == 1 || DR_GDN_CHUNK == 3 || DR_GDN_CHUNK == 17 || DR_GDN_CHUNK == 64)) continue;
                if (kind != GK_RANDOM && dims[d][0] < 32 && lens[l] < 17) continue;
                if (kind == GK_DISCR && (dims[d][0] != 128 || lens[l] != 3)) continue;
                chunk_case(k, res, &s, kind, lens[l], dims[d][0], dims[d][1]);
            }
}

static double time_chunk(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    int L = DR_GDN_CHUNK, dk = 128, dv = 128;
    float *S = calloc((size_t)dk * dv, 4), *q = calloc((size_t)L * dk, 4), *v = calloc((size_t)L * dv, 4);
    float *g = calloc((size_t)L, 4), *o = calloc((size_t)L * dv, 4);
    float *scratch = calloc((size_t)dr_op_gdn_chunk_scratch(L, dk, dv), 4);
    for (int i = 0; i < L * dk; i++) q[i] = 0.01f;
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ct_now_ms();
        dr_op_gdn_chunk(S, q, q, dk, v, dv, g, g, 1, L, dk, dv, scratch, o, dv, k->variant);
        double dt = ct_now_ms() - t0;
        if (dt < best) best = dt;
    }
    free(S), free(q), free(v), free(g), free(o), free(scratch);
    return best;
}

static const char *k_chunk_precision =
    "chunked (WY) form, fp32; vs the float64 row-by-row recurrence: tol = 4 (dk + L + 4) u M_j(t) for state "
    "column j, |q_t| times that for o_t[j], M_j(t) = sum_{s<=t} (|v_s[j]| + |S_{s-1}[:,j]|) + |S_t[:,j]|";

/* variant 0: the best path (AVX2 where the CPU has it, also checked for the portable path's bits), 1: portable */
int ct_gdn_chunk_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < 2 && n < max; v++, n++)
        out[n] = (ct_kernel){.name = "gdn_chunk", .backend = v ? "cpu/portable" : "cpu", .precision = k_chunk_precision,
                             .check = check_chunk, .time = time_chunk, .time_shape = "L=" GK_STR(DR_GDN_CHUNK_ROWS) " 128x128",
                             .limit_ms = v ? 60.0 : 2.0, .variant = v}; /* portable: libm fmaf */
    return n;
}

/* the defect inside vecmat's loops (the last coefficient of each run replaced by the one before),
 * on the AVX2 loop where the CPU has it and on the portable loop */
int ct_gdn_chunk_controls(ct_kernel *out, int max) {
    int n = 0;
    for (int v = 0; v < 2 && n < max; v++, n++)
        out[n] = (ct_kernel){.name = "gdn_chunk", .backend = v ? "cpu/portable-control" : "cpu/control",
                             .precision = k_chunk_precision, .check = check_chunk, .variant = v, .control = 1,
                             .control_desc = "vecmat loop: last coefficient of a run replaced by the previous one"};
    return n;
}
