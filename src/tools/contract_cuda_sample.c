/* contract_cuda_sample.c - `drama contract` entry for the faster CUDA draw (sample.cu, sample_fast.cuh,
 * DRAMA_CUDA_SAMPLE): dr_cuda_sample_raw with the faster kernels against, on the same logits, spec and u,
 * both the CPU's dr_sample and the kernels that sort every candidate (dr_cuda_set_sample 0), and the
 * faster kernels without the nucleus list (4) against the CPU; tol 0.
 * Fixtures: random, flat, peaked, ties, -inf excluded, signed zeros, a huge range, one survivor, at
 * 1 .. 8192 candidates (odd sizes too), top_k 0 / 1 / 30 / 32 / 33 / 1000 / 5000 (the warp list, the
 * block list, the full sort), top_p 1 / 0.9 / 0.5 / 1e-6, T 0 / 0.7 / 1 / 1.5, both crossing rules, the
 * sequential sums, u at 0, 1 - 2^-53 and on the weights' boundaries. Controls: the sort's last stage
 * skipped, the top-k list's k-th key replaced by the (k+1)-th (dr_cuda_set_sample 2, 3). docs/contract.md. */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/sample.h"
#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "base/philox.h"

enum { NV = 12 };             /* logit vectors a launch (one block each) */
enum { SC_SORT = 2, SC_TOPK = 3 }; /* the controls: dr_cuda_set_sample's defects */

/* logit vector v of n candidates; *u its uniform */
static void fast_vec(uint64_t *s, int v, float *x, int n, uint64_t seed, int64_t slot, double *u) {
    for (int i = 0; i < n; i++) {
        double g = ct_rand_normal(s), l;
        switch (v) {
        case 1: l = 0.05 * g; break;                        /* flat: the nucleus is most candidates */
        case 2: l = g + ((i * 7919) % n < 3 ? 8.0 : 0.0); break; /* peaked: three dominate */
        case 3: l = floor(g * 2) / 2; break;                /* many exact ties */
        case 4: l = (i % 7 == 3) ? -INFINITY : 3 * g; break;  /* excluded candidates */
        case 5: l = (i % 2) ? 0.0 : -0.0; break;            /* all equal, signed zeros: ties everywhere */
        case 6: l = 3e29 * g; break;                        /* a huge range */
        case 7: l = (i == n / 3) ? 2.0 : -INFINITY; break;  /* one survivor */
        case 8: l = (double)(ct_rand_u64(s) % 2); break;    /* two values: exact ties, flat */
        case 9: l = i == 5 % n ? 0.0 : (i % 4 == 1) ? -4.6 + 0.01 * g : (i % 4 == 2) ? -INFINITY : -30 + g; break; /* one dominant, a long tail: the nucleus list's gate passes, the list is too short */
        default: l = 3 * g; break;                          /* random (0, 10, 11) */
        }
        x[i] = (float)l;
    }
    *u = v == 10 ? 0.0 : v == 11 ? 1.0 - 0x1p-53 : v == 5 || v == 8 ? 0.5 : dr_philox_uniform(seed, (uint64_t)slot);
}

/* one spec over the NV vectors: the faster kernels (variant fast) vs the CPU and vs variant 0 */
static void fast_case(const ct_kernel *k, cu_t *t, ct_result *res, dr_sample_ws *ws, const float *lg, const float *dl,
                      const double *u, const double *du, int32_t *dout, dr_cuda_status *dst, int n, float T, float P,
                      int K, int rule) {
    int32_t o_new[NV], o_old[NV], o_nl[NV];
    const int fast = k->control ? k->control : 1;
    if (t->failed) return;
    if (dr_cuda_set_sample(t->c, fast, &t->err) ||
        dr_cuda_sample_raw(t->c, dl, n, n, NV, T, P, K, rule, du, dout, dst, &t->err))
        t->failed = 1;
    if (cu_get(t, o_new, dout, sizeof o_new)) return;
    if (dr_cuda_set_sample(t->c, 0, &t->err) ||
        dr_cuda_sample_raw(t->c, dl, n, n, NV, T, P, K, rule, du, dout, dst, &t->err))
        t->failed = 1;
    if (cu_get(t, o_old, dout, sizeof o_old)) return;
    if (dr_cuda_set_sample(t->c, 4, &t->err) || /* the faster draw without the nucleus list */
        dr_cuda_sample_raw(t->c, dl, n, n, NV, T, P, K, rule, du, dout, dst, &t->err))
        t->failed = 1;
    if (cu_get(t, o_nl, dout, sizeof o_nl)) return;
    float out[3 * NV], alt[3 * NV];
    double ref[3 * NV], tol[3 * NV] = {0};
    dr_draw_spec sp = {T, P, K, rule & 1 ? DR_TOPP_DROP_CROSSING : DR_TOPP_KEEP_CROSSING};
    drama_error e = {0};
    for (int v = 0; v < NV; v++) {
        int r = -1, a = -1;
        if (dr_sample(lg + (int64_t)v * n, n, &sp, u[v], ws, &r, "contract", &e)) r = -1;
        /* the reduced-precision variant: u rounded to fp16 */
        if (dr_sample(lg + (int64_t)v * n, n, &sp, (double)ct_h((float)u[v]), ws, &a, "contract", &e)) a = -1;
        out[v] = (float)o_new[v], ref[v] = r, alt[v] = (float)a;
        out[NV + v] = (float)o_new[v], ref[NV + v] = o_old[v], alt[NV + v] = (float)o_old[v];
        out[2 * NV + v] = (float)o_nl[v], ref[2 * NV + v] = r, alt[2 * NV + v] = (float)r;
    }
    char name[160];
    snprintf(name, sizeof name, "n=%d T=%g top_p=%g top_k=%d %s%s: CPU, sort-all, nolist vs CPU (%d vectors)", n,
             (double)T, (double)P, K, rule & 1 ? "drop-crossing" : "keep-crossing", rule & 2 ? " sequential" : "", NV);
    ct_compare(res, name, out, ref, tol, 3 * NV);
    if (n >= 4097) ct_discriminate(res, name, alt, ref, tol, NV);
}

static void check_fast(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x46415354ull;
    const int sizes[] = {1, 2, 7, 33, 1000, 1024, 4097, 8191, 8192};
    const float Ts[] = {0.0f, 0.7f, 1.0f, 1.5f}, Ps[] = {1.0f, 0.9f, 0.5f, 1e-6f};
    const int Ks[] = {0, 1, 30, 32, 33, 1000, 5000};
    dr_sample_ws ws;
    drama_error e = {0};
    if (dr_sample_ws_init(&ws, 8192, &e)) {
        ct_case_error(res, "workspace", e.message);
        cu_close(&t);
        return;
    }
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int n = sizes[si];
        float *lg = malloc((size_t)NV * n * 4);
        double u[NV];
        for (int v = 0; v < NV; v++) fast_vec(&s, v, lg + (int64_t)v * n, n, ctx->seed, (int64_t)si * 100 + v, &u[v]);
        float *dl = cu_put(&t, lg, (size_t)NV * n * 4);
        double *du = cu_put(&t, u, sizeof u);
        int32_t *dout = cu_poison(&t, NV * 4);
        dr_cuda_status *dst = cu_zero(&t, sizeof(dr_cuda_status));
        for (int ti = 0; ti < 4; ti++)
            for (int pi = 0; pi < 4; pi++)
                for (int ki = 0; ki < 7; ki++)
                    for (int rule = 0; rule < 4; rule++) { /* bit 0: drop crossing; bit 1: the sequential sums */
                        if (ti == 0 && (pi || ki || rule)) continue; /* argmax ignores the rest */
                        if ((rule & 2) && Ks[ki] != 0 && Ks[ki] != 30) continue;
                        fast_case(k, &t, res, &ws, lg, dl, u, du, dout, dst, n, Ts[ti], Ps[pi], Ks[ki], rule);
                    }
        cu_case_end(&t, res, "sample_fast");
        free(lg);
    }
    dr_cuda_set_sample(t.c, 1, &t.err);
    dr_sample_ws_free(&ws);
    cu_close(&t);
}

static const char *k_precision = "exact: the CPU's dr_sample draw and the sort-all kernels' for the same logits, "
                                 "spec and u (tol 0)";

int ct_cuda_sample_kernels(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = "sample_fast", .backend = "cuda", .precision = k_precision, .check = check_fast,
                         .unavailable = cu_unavailable};
    return 1;
}

int ct_cuda_sample_controls(ct_kernel *out, int max) {
    const struct { int control; const char *desc; } c[] = {
        {SC_SORT, "device: faster draw: every bitonic sort skips its last stage"},
        {SC_TOPK, "device: faster draw: the top-k list's k-th key replaced by the (k+1)-th"},
    };
    int n = 0;
    for (int i = 0; i < 2 && n < max; i++, n++)
        out[n] = (ct_kernel){.name = "sample_fast", .backend = "cuda/control", .precision = k_precision,
                             .check = check_fast, .control = c[i].control, .control_desc = c[i].desc,
                             .unavailable = cu_unavailable};
    return n;
}

#endif
