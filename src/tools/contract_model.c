/* contract_model.c - `drama contract` entries for the model-level element-wise ops of
 * backend/cpu/ops.h (SwiGLU, gates, DeltaNet gates and output norm, MoE routing and combine,
 * guidance, sampler weights and nucleus cut): float64 references written from MODEL.md / TEXT.md
 * (never calling the op), tolerances from each op's operation sequence (docs/contract.md),
 * fp16 variants for the precision-discriminating fixtures, and planted controls. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "tools/contract_internal.h"

#define U CT_U32
#define TINY 0x1p-148       /* fp32 subnormal results: absolute error below one subnormal step */
#define EXP_FLOOR 0x1p-121  /* silu(x) for x < -88.7: expf(-x) overflows and the op returns -0 (|silu| < 2^-121) */
#define SIG_FLOOR 0x1p-126  /* sigmoid(x) for x < -87.3: 1 / (1 + expf(-x)) is subnormal or 0 */
#define RANK_FLOOR 0x1p-120 /* MoE ranks whose probabilities are below this may tie in fp32 */

enum { MK_SILU, MK_SWIGLU, MK_SIGMUL, MK_GRMS, MK_GATES, MK_ROUTE, MK_COMBINE, MK_GUIDANCE, MK_EXPW, MK_TOPP, MK_ATT64,
       MK_COUNT };
static const char *const mk_names[MK_COUNT] = {"silu",      "swiglu",      "sigmoid_mul", "gated_rms_norm",
                                               "gdn_gates", "moe_route",   "moe_combine", "guidance",
                                               "exp_weights", "top_p_count", "attend_f64"};
static const char *const mk_precision[MK_COUNT] = {
    "x / (1 + expf(-x)) in fp32; tol = 5u|y| + 2^-121",
    "silu(g) * u in fp32; tol = 6u|y| + 2^-121|u| + 2^-148",
    "x * (1 / (1 + expf(-g))) in fp32; tol = 6u|y| + 2^-126|x| + 2^-148",
    "rms_norm (3u) times silu(z) (4u) in fp32; tol = 9u|y| + 2^-121|x r w| + 2^-148",
    ("g = neg_A * softplus(a + dt) (threshold 20), beta = sigmoid(b) in fp32; tol_g = 5u|g| + |A|(sigma(x) u "
     "(|x| + 2) + [x > 20] e^-x + 2^-148), tol_beta = 5u|beta| + 2^-126"),
    ("softmax of the finite scores (softmax rule), top-k exact up to ties within tolerance, renormalised in "
     "double; tol_w = w (e_i + max_sel e_j + 2u)"),
    "fp32 sum in rank order of w_r y_r and sigmoid(s) y_sh; tol = (m+1)u sum|terms| + 4u sigma|y_sh| + 2^-126|y_sh|",
    "c + gamma (c - u) in fp32, -inf cond kept; tol = u|y| + 3u gamma|c - u| + 2^-148",
    "expf((x - max) / T) in fp32, widened; tol = q u (2|d/T| + 3) + 2^-148",
    "masses in double; counts exact (tol 0) for both rules, P kept 1e-9 away from every prefix mass",
    ("double scores rounded to fp32, fp32(exp(s - max)), sums in double; tol = sum_t p_t|v_t|(e_t + sum_j p_j e_j) "
     "+ u|o|, e_t = u(|s_t| + 1) + dot and sum terms"),
};

enum { MC_NONE = 0, MC_NO_MUL, MC_SWAP, MC_FLIP, MC_NO_EPS, MC_NO_BRANCH, MC_RENORM_ALL, MC_UNGATED, MC_GUIDE_SIGN,
       MC_TEMP_MUL, MC_RULES_SWAPPED, MC_DROP_LAST };

static const int64_t sizes[] = {1, 7, 33, 1000, 4099};
#define N_SIZES 5

/* One case's outputs, reference, tolerance and fp16-variant output (n_out of at most cap). */
typedef struct mk_out {
    float *out, *alt;
    double *ref, *tol;
    int64_t n;
} mk_out;

static float *fbuf(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* random: normal; dynamic-range: times 2^k, k in [-20, 20] (exp overflows at |x| > 88.7); tiny:
 * times 1e-4; nan-inf: NaN in the middle, +inf first and -inf last; fp16-discriminating: [0.5, 1] */
static void fill(uint64_t *s, int kind, float *x, int64_t n) {
    ct_fill_kind(s, kind, x, n);
    if (kind != X_NONFINITE) return;
    x[n / 2] = NAN;
    if (n > 2) x[0] = INFINITY, x[n - 1] = -INFINITY;
}

static double silu64(double x) { return x / (1.0 + exp(-x)); }
static double sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- element-wise ops ---- */

static void case_silu(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    (void)idx;
    float *x = fbuf(n);
    fill(s, kind, x, n);
    memcpy(o->out, x, (size_t)n * sizeof *x); /* in place: every element must be rewritten */
    if (k->control == MC_NO_MUL) /* planted: the sigmoid without the multiply by x */
        for (int64_t i = 0; i < n; i++) o->out[i] = dr_sigmoidf(x[i]);
    else dr_op_silu(o->out, n);
    for (int64_t i = 0; i < n; i++) {
        o->ref[i] = silu64(x[i]);
        o->tol[i] = 5 * U * fabs(o->ref[i]) + EXP_FLOOR;
        o->alt[i] = x[i] / (1.0f + ct_h(expf(-x[i])));
    }
    o->n = n;
    free(x);
}

static void case_swiglu(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    (void)idx;
    float *g = fbuf(n), *u = fbuf(n);
    fill(s, kind, g, n);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, u, n);
    if (kind == X_NONFINITE && n > 3) u[1] = INFINITY;
    if (k->control == MC_SWAP) dr_op_swiglu(u, g, n, o->out); /* planted: gate and up swapped */
    else dr_op_swiglu(g, u, n, o->out);
    for (int64_t i = 0; i < n; i++) {
        o->ref[i] = silu64(g[i]) * u[i];
        o->tol[i] = 6 * U * fabs(o->ref[i]) + EXP_FLOOR * fabs(u[i]) + TINY;
        o->alt[i] = g[i] / (1.0f + ct_h(expf(-g[i]))) * u[i];
    }
    o->n = n;
    free(g), free(u);
}

static void case_sigmul(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    (void)idx;
    float *x = fbuf(n), *g = fbuf(n);
    fill(s, kind, x, n);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, g, n);
    if (kind == X_NONFINITE && n > 3) g[1] = -INFINITY, g[2] = INFINITY;
    memcpy(o->out, x, (size_t)n * sizeof *x);
    if (k->control == MC_FLIP) /* planted: the gate's sign flipped */
        for (int64_t i = 0; i < n; i++) o->out[i] *= dr_sigmoidf(-g[i]);
    else dr_op_sigmoid_mul(o->out, g, n);
    for (int64_t i = 0; i < n; i++) {
        o->ref[i] = (double)x[i] * sigmoid64(g[i]);
        o->tol[i] = 6 * U * fabs(o->ref[i]) + SIG_FLOOR * fabs(x[i]) + TINY;
        o->alt[i] = x[i] * (1.0f / (1.0f + ct_h(expf(-g[i]))));
    }
    o->n = n;
    free(x), free(g);
}

static void case_grms(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    (void)idx;
    float eps = 1e-6f, *x = fbuf(n), *w = fbuf(n), *z = fbuf(n);
    fill(s, kind, x, n);
    for (int64_t i = 0; i < n; i++) w[i] = (float)(1.0 + 0.1 * ct_rand_normal(s));
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, z, n);
    memcpy(o->out, x, (size_t)n * sizeof *x);
    if (k->control == MC_NO_EPS) { /* planted: epsilon left out */
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ss / (double)n));
        for (int64_t i = 0; i < n; i++) o->out[i] = x[i] * r * w[i] * dr_siluf(z[i]);
    } else {
        dr_op_gated_rms_norm(o->out, w, z, eps, n);
    }
    double ss = 0;
    float hs = 0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        hs = ct_h(hs + x[i] * x[i]); /* fp16 accumulation */
    }
    double r = 1.0 / sqrt(ss / (double)n + (double)eps);
    float hr = (float)(1.0 / sqrt((double)hs / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) {
        double yn = (double)x[i] * r * w[i];
        o->ref[i] = yn * silu64(z[i]);
        o->tol[i] = 9 * U * fabs(o->ref[i]) + EXP_FLOOR * fabs(yn) + TINY;
        o->alt[i] = x[i] * hr * w[i] * dr_siluf(z[i]);
    }
    o->n = n;
    free(x), free(w), free(z);
}

/* outputs [g (n) | beta (n)] */
static void case_gates(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    (void)idx;
    float *a = fbuf(n), *b = fbuf(n), *A_log = fbuf(n), *neg_A = fbuf(n), *dt = fbuf(n);
    fill(s, kind, a, n);
    fill(s, kind, b, n);
    for (int64_t h = 0; h < n; h++) {
        A_log[h] = (float)(0.5 * ct_rand_normal(s));
        neg_A[h] = -expf(A_log[h]); /* as the loader stores it */
        dt[h] = (float)(0.5 * ct_rand_normal(s));
    }
    memcpy(o->out, a, (size_t)n * sizeof *a);
    memcpy(o->out + n, b, (size_t)n * sizeof *b);
    if (k->control == MC_NO_BRANCH) /* planted: softplus without its linear branch (expf overflows) */
        for (int64_t h = 0; h < n; h++) {
            o->out[h] = neg_A[h] * log1pf(expf(a[h] + dt[h]));
            o->out[n + h] = dr_sigmoidf(b[h]);
        }
    else dr_op_gdn_gates(o->out, o->out + n, neg_A, dt, n);
    for (int64_t h = 0; h < n; h++) {
        double A = -exp((double)A_log[h]), x = (double)a[h] + dt[h];
        double sp = x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); /* stable softplus, no threshold */
        o->ref[h] = A * sp;
        double t = TINY;
        if (isfinite(x)) t += sigmoid64(x) * U * (fabs(x) + 2) + (x > 20 ? exp(-x) : 0);
        o->tol[h] = 5 * U * fabs(o->ref[h]) + fabs(A) * t + TINY;
        o->alt[h] = neg_A[h] * ct_h(dr_softplusf(a[h] + dt[h]));
        o->ref[n + h] = sigmoid64(b[h]);
        o->tol[n + h] = 5 * U * fabs(o->ref[n + h]) + SIG_FLOOR;
        o->alt[n + h] = ct_h(dr_sigmoidf(b[h]));
    }
    o->n = 2 * n;
    free(a), free(b), free(A_log), free(neg_A), free(dt);
}

/* ---- MoE routing: outputs [eligible | ids (k) | weights (k) | probs (E)] ---- */

static void case_route(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    int E = (int)n, K = 8, norm = (kind + idx) % 2 == 0;
    float *sc = fbuf(E), *probs = fbuf(E), wts[8];
    int ids[8], rid[8];
    double *p = malloc((size_t)E * sizeof *p), *ep = malloc((size_t)E * sizeof *ep);
    fill(s, kind, sc, E);
    if (kind == X_RANDOM) for (int e = 0; e < E; e++) sc[e] *= 3.0f;
    if (kind == X_NONFINITE)
        for (int e = 3; e < E; e += 5) sc[e] = -INFINITY; /* pruned experts */
    ct_poison(probs, E);
    int eligible = dr_op_moe_route(sc, E, K, norm && k->control != MC_RENORM_ALL, probs, ids, wts);
    if (k->control == MC_RENORM_ALL) { /* planted: renormalised over every expert, not the chosen k */
        double all = 0;
        for (int e = 0; e < E; e++) all += probs[e] >= 0 ? probs[e] : 0;
        for (int r = 0; r < K; r++) wts[r] = norm && all > 0 ? (float)(wts[r] / all) : wts[r];
    }
    /* reference: softmax in double over the finite scores, selection by score (ties: lower id) */
    double mx = -INFINITY, sum = 0, spread = 0;
    int ref_eligible = 0;
    for (int e = 0; e < E; e++)
        if (isfinite(sc[e])) {
            ref_eligible++;
            if (sc[e] > mx) mx = sc[e];
        }
    for (int e = 0; e < E; e++) sum += isfinite(sc[e]) ? exp(sc[e] - mx) : 0;
    for (int e = 0; e < E; e++) p[e] = isfinite(sc[e]) ? exp(sc[e] - mx) / sum : -1.0;
    for (int e = 0; e < E; e++) spread += p[e] > 0 ? p[e] * fabs(sc[e] - mx) : 0;
    for (int e = 0; e < E; e++) ep[e] = p[e] >= 0 ? U * (fabs(sc[e] - mx) + spread + 6) : 0; /* softmax rule */
    for (int r = 0; r < K; r++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int q = 0; q < r; q++) used |= rid[q] == e;
            if (!used && p[e] >= 0 && (best < 0 || sc[e] > sc[best])) best = e;
        }
        rid[r] = best;
    }
    /* an id the op chose whose probability equals the reference's choice within both tolerances
     * (or both below RANK_FLOOR, where fp32 exp underflow merges ranks) is an equal choice */
    int use[8];
    for (int r = 0; r < K; r++) {
        int j = ids[r], i = rid[r];
        use[r] = i;
        if (j >= 0 && j < E && i >= 0 && j != i && p[j] >= 0 &&
            fabs(p[j] - p[i]) <= p[i] * ep[i] + p[j] * ep[j] + RANK_FLOOR)
            use[r] = j;
    }
    double sel = 0, sel_e = 0, hsel = 0;
    for (int r = 0; r < K; r++)
        if (use[r] >= 0) {
            sel += p[use[r]];
            hsel += ct_h((float)p[use[r]]);
            if (ep[use[r]] > sel_e) sel_e = ep[use[r]];
        }
    o->out[0] = (float)eligible, o->ref[0] = ref_eligible, o->tol[0] = 0, o->alt[0] = (float)ref_eligible;
    for (int r = 0; r < K; r++) {
        int e = use[r];
        double pe = e >= 0 ? p[e] : 0, w = norm && e >= 0 ? pe / sel : pe;
        o->out[1 + r] = (float)(ids[r] == e ? rid[r] : ids[r]), o->ref[1 + r] = rid[r], o->tol[1 + r] = 0;
        o->alt[1 + r] = (float)rid[r];
        o->out[1 + K + r] = wts[r], o->ref[1 + K + r] = w;
        o->tol[1 + K + r] = e < 0 ? TINY : w * (ep[e] + (norm ? sel_e + 2 * U : 0)) + TINY;
        if (e >= 0 && pe < RANK_FLOOR) o->tol[1 + K + r] += RANK_FLOOR; /* an fp32-underflowed rank */
        o->alt[1 + K + r] = e < 0 ? 0.0f : norm ? (float)(ct_h((float)pe) / hsel) : ct_h((float)pe);
    }
    for (int e = 0; e < E; e++) {
        o->out[1 + 2 * K + e] = probs[e], o->ref[1 + 2 * K + e] = p[e];
        o->tol[1 + 2 * K + e] = p[e] >= 0 ? p[e] * ep[e] + TINY : 0;
        o->alt[1 + 2 * K + e] = p[e] >= 0 ? ct_h((float)p[e]) : -1.0f;
    }
    o->n = 1 + 2 * K + E;
    free(sc), free(probs), free(p), free(ep);
}

/* ---- MoE combine ---- */

static void case_combine(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    static const int ks[N_SIZES] = {1, 8, 2, 8, 8};
    int K = ks[idx];
    int64_t H = n;
    float *y = fbuf(K * H), *ysh = fbuf(H), w[8];
    const float *ys[8];
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, y, K * H);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, ysh, H);
    for (int r = 0; r < K; r++) {
        w[r] = (float)(kind == X_DISCR ? 0.5 + 0.5 * ct_rand_uniform(s) : 0.05 + 0.25 * ct_rand_uniform(s));
        ys[r] = K == 8 && r == 1 ? NULL : y + r * H; /* a rank with no expert (fewer eligible than k) */
    }
    float sg = (float)(2 * ct_rand_normal(s));
    if (kind == X_RANGE) sg *= 100.0f; /* the gate saturates; expf(-sg) may overflow */
    if (kind == X_NONFINITE) {
        y[H / 2] = NAN;
        if (H > 2) ysh[H - 1] = INFINITY, y[(K - 1) * H] = -INFINITY;
    }
    ct_poison(o->out, H);
    dr_op_moe_combine(ys, w, K, ysh, k->control == MC_UNGATED ? INFINITY : sg, H, o->out); /* planted: gate 1 */
    double sig = sigmoid64(sg);
    float sigf = dr_sigmoidf(sg);
    for (int64_t j = 0; j < H; j++) {
        double acc = 0, mag = 0;
        float h = 0;
        int m = 1;
        for (int r = 0; r < K; r++) {
            if (!ys[r]) continue;
            acc += (double)w[r] * ys[r][j];
            mag += fabs((double)w[r] * ys[r][j]);
            h = ct_h(h + w[r] * ys[r][j]);
            m++;
        }
        acc += sig * ysh[j];
        mag += sig * fabs(ysh[j]);
        o->ref[j] = acc;
        o->tol[j] = (m + 1) * U * mag + 4 * U * sig * fabs(ysh[j]) + SIG_FLOOR * fabs(ysh[j]) + TINY;
        o->alt[j] = ct_h(h + sigf * ysh[j]);
    }
    o->n = H;
    free(y), free(ysh);
}

/* ---- sampler arithmetic ---- */

static void case_guidance(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    static const float gammas[N_SIZES] = {0.5f, 1.5f, 3.0f, 5.0f, 1.0f};
    float gamma = gammas[idx], *c = fbuf(n), *u = fbuf(n);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, c, n);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, u, n);
    if (kind == X_NONFINITE) {
        c[0] = -INFINITY; /* an excluded candidate stays excluded */
        c[n / 2] = NAN;
        if (n > 3) u[1] = -INFINITY, u[n - 1] = INFINITY, c[2] = INFINITY;
    }
    ct_poison(o->out, n);
    dr_op_guidance(c, u, n, k->control == MC_GUIDE_SIGN ? -gamma : gamma, o->out); /* planted: sign flipped */
    for (int64_t i = 0; i < n; i++) {
        double d = (double)c[i] - u[i];
        o->ref[i] = (isinf(c[i]) && c[i] < 0) ? -INFINITY : c[i] + gamma * d;
        o->tol[i] = U * fabs(o->ref[i]) + 3 * U * gamma * fabs(d) + TINY;
        o->alt[i] = c[i] + gamma * ct_h(c[i] - u[i]);
    }
    o->n = n;
    free(c), free(u);
}

static void case_expw(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    static const float temps[N_SIZES] = {0.1f, 0.7f, 1.0f, 2.0f, 1.3f};
    float T = temps[idx], *x = fbuf(n), mx = -INFINITY;
    double *q = malloc((size_t)n * sizeof *q);
    fill(s, kind, x, n);
    if (kind == X_NONFINITE) x[0] = -INFINITY; /* logits are at most the maximum: no +inf */
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && x[i] > mx) mx = x[i];
    if (mx == -INFINITY) mx = 0;
    if (k->control == MC_TEMP_MUL) /* planted: temperature multiplied instead of divided */
        for (int64_t i = 0; i < n; i++) q[i] = (double)expf((x[i] - mx) * T);
    else dr_op_exp_weights(x, n, mx, T, q);
    for (int64_t i = 0; i < n; i++) {
        double d = ((double)x[i] - mx) / T;
        o->out[i] = (float)q[i]; /* fp32 terms: exact */
        o->ref[i] = exp(d);
        o->tol[i] = (isfinite(d) ? o->ref[i] * U * (2 * fabs(d) + 3) : 0) + TINY;
        o->alt[i] = ct_h(expf((x[i] - mx) / T));
    }
    o->n = n;
    free(x), free(q);
}

static int desc_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* outputs [count keep-crossing, count drop-crossing] */
static void case_topp(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    static const double ps[N_SIZES] = {0.1, 0.5, 0.9, 0.95, 0.999};
    int m = (int)n;
    double *q = malloc((size_t)m * sizeof *q), P = ps[idx];
    long double *M = malloc((size_t)(m + 1) * sizeof *M);
    for (int r = 0; r < m; r++) {
        double v = exp(-fabs(3 * ct_rand_normal(s)));
        if (kind == X_RANGE) v *= ldexp(1.0, (int)(ct_rand_u64(s) % 41) - 20);
        if (kind == X_TINY) v *= 1e-30;
        if (kind == X_NONFINITE && r >= m / 2 && r > 0) v = 0; /* weights that underflowed */
        if (kind == X_DISCR) v = 1;
        q[r] = (double)(float)v;
    }
    qsort(q, (size_t)m, sizeof *q, desc_cmp); /* descending rank order */
    long double tot = 0;
    for (int r = 0; r < m; r++) tot += q[r];
    M[0] = 0;
    for (int r = 0; r < m; r++) M[r + 1] = M[r] + q[r] / tot;
    for (int again = 1; again;) { /* P clear of every prefix mass: counts are then exact */
        again = 0;
        for (int c = 0; c <= m; c++)
            if (fabsl(M[c] - P) < 1e-9L) again = 1;
        if (again) P += 1e-6;
    }
    int keep = m, drop = 1;
    for (int c = 1; c <= m; c++)
        if (M[c] >= P) { keep = c; break; }
    for (int c = 1; c <= m; c++)
        if (M[c] <= P) drop = c;
    int ok = dr_op_top_p_count(q, m, P, k->control == MC_RULES_SWAPPED ? 0 : 1); /* planted: rules swapped */
    int od = dr_op_top_p_count(q, m, P, k->control == MC_RULES_SWAPPED ? 1 : 0);
    double z = 0; /* fp16 variant: running mass rounded to fp16 */
    for (int r = 0; r < m; r++) z += q[r];
    float cum = 0;
    int hk = m, hd = m;
    for (int r = 0; r < m; r++) {
        float prev = cum;
        cum = ct_h(cum + (float)(q[r] / z));
        if (r > 0 && hk == m && !(prev < P)) hk = r;
        if (r > 0 && hd == m && !(cum <= P)) hd = r;
    }
    o->out[0] = (float)ok, o->ref[0] = keep, o->tol[0] = 0, o->alt[0] = (float)hk;
    o->out[1] = (float)od, o->ref[1] = drop, o->tol[1] = 0, o->alt[1] = (float)hd;
    o->n = 2;
    free(q), free(M);
}

/* ---- attention with float64 accumulation (the tower's): n is the number of positions ---- */

static void case_att64(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o) {
    static const int hds[N_SIZES] = {8, 33, 16, 64, 16};
    int hd = hds[idx];
    int64_t np = n, stride = hd + 3; /* rows of a wider cache: the op must honour the stride */
    float *q = fbuf(hd), *kc = fbuf(np * stride), *vc = fbuf(np * stride), *scratch = fbuf(np);
    double *sc = malloc((size_t)np * sizeof *sc), *ea = malloc((size_t)np * sizeof *ea);
    fill(s, kind == X_TINY ? X_TINY : X_RANDOM, q, hd);
    fill(s, kind == X_TINY ? X_TINY : X_RANDOM, kc, np * stride);
    fill(s, kind == X_NONFINITE ? X_RANDOM : kind, vc, np * stride); /* dynamic range in the values only */
    if (kind == X_DISCR) /* equal scores, positive values: a long sum of small equal terms */
        for (int64_t i = 0; i < np * stride; i++) kc[i] = 0.0f;
    if (kind == X_NONFINITE) {
        vc[(np / 2) * stride + 1] = NAN;
        vc[(np - 1) * stride + hd - 1] = INFINITY;
    }
    double scale = 1.0 / sqrt((double)hd), mx = -INFINITY, z = 0, E = 0;
    for (int64_t t = 0; t < np; t++) {
        double d = 0, m = 0;
        for (int i = 0; i < hd; i++) {
            d += (double)q[i] * kc[t * stride + i];
            m += fabs((double)q[i] * kc[t * stride + i]);
        }
        sc[t] = d * scale;
        ea[t] = U * (fabs(sc[t]) + 1) + (hd + 2) * 0x1p-53 * m * scale + 0x1p-52; /* score, exp, dot */
        if (sc[t] > mx) mx = sc[t];
    }
    for (int64_t t = 0; t < np; t++) z += exp(sc[t] - mx);
    for (int64_t t = 0; t < np; t++) E += exp(sc[t] - mx) / z * ea[t];
    ct_poison(o->out, hd);
    /* planted: the newest position left out (an off-by-one cache length) */
    int64_t used = k->control == MC_DROP_LAST && np > 1 ? np - 1 : np;
    dr_op_attend_f64(q, kc, vc, used, stride, hd, scale, scratch, o->out);
    for (int j = 0; j < hd; j++) {
        double acc = 0, mag = 0, rel = 0;
        float h = 0;
        for (int64_t t = 0; t < np; t++) {
            double p = exp(sc[t] - mx) / z, v = vc[t * stride + j];
            acc += p * v;
            mag += p * fabs(v);
            rel += p * fabs(v) * (ea[t] + E);
            h = ct_h(h + (float)p * (float)v); /* fp16 accumulation over positions */
        }
        o->ref[j] = acc;
        o->tol[j] = rel + U * fabs(acc) + (double)(np + 2) * 0x1p-52 * mag + TINY;
        o->alt[j] = h;
    }
    o->n = hd;
    free(q), free(kc), free(vc), free(scratch), free(sc), free(ea);
}

/* ---- driver ---- */

typedef void (*mk_case_fn)(const ct_kernel *k, uint64_t *s, int kind, int idx, int64_t n, mk_out *o);
static const mk_case_fn mk_cases[MK_COUNT] = {case_silu,    case_swiglu,  case_sigmul,   case_grms, case_gates,
                                              case_route,   case_combine, case_guidance, case_expw, case_topp,
                                              case_att64};

static void check_model(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    uint64_t s = ctx->seed ^ 0x4d4f44454cull ^ ((uint64_t)k->variant << 40);
    for (int kind = 0; kind < X_KINDS; kind++) {
        for (int idx = 0; idx < N_SIZES; idx++) {
            int64_t n = sizes[idx], cap = 2 * n + 64;
            mk_out o = {fbuf(cap), fbuf(cap), malloc((size_t)cap * sizeof(double)),
                        malloc((size_t)cap * sizeof(double)), 0};
            ct_poison(o.out, cap);
            mk_cases[k->variant](k, &s, kind, idx, n, &o);
            char name[96];
            const char *kn = k->variant == MK_TOPP && kind == X_NONFINITE ? "zero-weights" : ct_x_kind[kind];
            snprintf(name, sizeof name, "%s n=%lld", kn, (long long)n);
            ct_compare(res, name, o.out, o.ref, o.tol, o.n);
            if (kind == X_DISCR) ct_discriminate(res, name, o.alt, o.ref, o.tol, o.n);
            free(o.out), free(o.alt), free(o.ref), free(o.tol);
        }
    }
}

/* ---- timing on a fixed shape ---- */

static double time_model(const ct_kernel *k, ct_ctx *ctx) {
    (void)ctx;
    enum { N = 4096, E = 256 };
    static float a[N], b[N], c[N], y[8 * N];
    static double q[N];
    float w[8], probs[E];
    int ids[8];
    const float *ys[8];
    for (int i = 0; i < N; i++) a[i] = b[i] = c[i] = (float)(i % 97) / 97.0f - 0.5f;
    for (int i = 0; i < 8 * N; i++) y[i] = 0.001f * (float)(i % 89);
    for (int r = 0; r < 8; r++) w[r] = 0.125f, ys[r] = y + r * N;
    for (int i = 0; i < N; i++) q[i] = 1.0 / (1.0 + i);
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = ct_now_ms();
        switch (k->variant) {
        case MK_SILU: dr_op_silu(a, N); break;
        case MK_SWIGLU: dr_op_swiglu(a, b, N, c); break;
        case MK_SIGMUL: dr_op_sigmoid_mul(a, b, N); break;
        case MK_GRMS: dr_op_gated_rms_norm(a, b, c, 1e-6f, N); break;
        case MK_GATES: dr_op_gdn_gates(a, b, c, c, 32); break;
        case MK_ROUTE: dr_op_moe_route(b, E, 8, 1, probs, ids, w); break;
        case MK_COMBINE: dr_op_moe_combine(ys, w, 8, y, 0.5f, N, c); break;
        case MK_GUIDANCE: dr_op_guidance(a, b, N, 1.5f, c); break;
        case MK_EXPW: dr_op_exp_weights(a, N, 1.0f, 0.7f, q); break;
        case MK_TOPP: dr_op_top_p_count(q, N, 0.999, 1); break;
        case MK_ATT64: dr_op_attend_f64(a, y, y + 64, 256, 128, 64, 0.125, c, b); break;
        default: break;
        }
        double dt = ct_now_ms() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static const char *const mk_time_shape[MK_COUNT] = {"n=4096", "n=4096",     "n=4096",     "n=4096", "nv=32",
                                                    "E=256 k=8", "H=4096 k=8", "n=4096", "n=4096", "m=4096",
                                                    "n_pos=256 hd=64"};
static const double mk_limit_ms[MK_COUNT] = {0.05, 0.05, 0.05, 0.05, 0.01, 0.05, 0.05, 0.02, 0.05, 0.05, 0.2};

int ct_model_kernels(ct_kernel *out, int max) {
    int n = 0;
    for (int op = 0; op < MK_COUNT && n < max; op++, n++)
        out[n] = (ct_kernel){.name = mk_names[op], .backend = "cpu", .precision = mk_precision[op],
                             .check = check_model, .time = time_model, .time_shape = mk_time_shape[op],
                             .limit_ms = mk_limit_ms[op], .variant = op};
    return n;
}

int ct_model_controls(ct_kernel *out, int max) {
    const struct { int op, control; const char *desc; } c[] = {
        {MK_SILU, MC_NO_MUL, "sigmoid(x) without the multiply by x"},
        {MK_SWIGLU, MC_SWAP, "gate and up swapped"},
        {MK_SIGMUL, MC_FLIP, "sigmoid(-gate): the gate's sign flipped"},
        {MK_GRMS, MC_NO_EPS, "epsilon left out"},
        {MK_GATES, MC_NO_BRANCH, "softplus without its large-x branch (expf overflows)"},
        {MK_ROUTE, MC_RENORM_ALL, "renormalised over all experts instead of the top-k"},
        {MK_COMBINE, MC_UNGATED, "shared expert added without its sigmoid gate"},
        {MK_GUIDANCE, MC_GUIDE_SIGN, "guidance sign flipped"},
        {MK_EXPW, MC_TEMP_MUL, "temperature multiplied instead of divided"},
        {MK_TOPP, MC_RULES_SWAPPED, "keep-crossing and drop-crossing rules swapped"},
        {MK_ATT64, MC_DROP_LAST, "newest cache position left out"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = mk_names[c[i].op], .backend = "cpu/control", .precision = mk_precision[c[i].op],
                             .check = check_model, .variant = c[i].op, .control = c[i].control,
                             .control_desc = c[i].desc};
    return n;
}
