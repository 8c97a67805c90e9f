/* contract_cuda_attn.c - `drama contract` entry `attn_fused`: the fused attention step (attn.cu,
 * DRAMA_CUDA_ATTN_FUSED, the default) bit for bit against the prep / split / merge kernels
 * (DRAMA_CUDA_ATTN_FUSED=0) on the same inputs, through dr_cuda_attn_step (what the seam's attention
 * op runs): one row (the one-kernel path: prep, split and merge in one launch; and with
 * DRAMA_CUDA_ATTN_FUSED=2's setting prep + split in one, then the merge kernel) and two sessions (the
 * prep kernel, then one split + merge kernel), over 3 consecutive steps, every step's output and both
 * caches at the end compared, on the backbone's shapes (16 / 2 heads of 256, q/k norm, rotate-half
 * RoPE of 64 dims, gated, fp32 scale), the tower's (32 / 8 heads of 128, interleaved RoPE, ungated,
 * double scale) and odd ones (3 / 1 heads of 33, 10 rotated dims, q norm only), contexts of 1, 31,
 * 32, 33, 300, 1000 and 10000 positions (one to 32 splits); a held row (its cache untouched); and
 * for one row, q left raw (the one-kernel path ran, not prep + split + merge). Controls: the last
 * block's merge leaves out the last split; the arrival counter is never reset (the second step
 * merges nothing). docs/contract.md "CUDA entries". */
#include "tools/contract_cuda_internal.h"

#ifdef DRAMA_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"

#define STEPS 3
#define MAXN 2

typedef struct af_shape {
    const char *name;
    int nh, nkv, hd, half, inter, qnorm, knorm, gated, qkv; /* qkv: one buffer (the tower's wqkv layout) */
    double scale;
} af_shape;

/* the layout of one row's inputs: q (and gate) at q + j q_hs, k / v at + kv_off / + v_off */
typedef struct af_lay {
    int64_t q_ld, q_hs, kv_ld, k_off, v_off, in_len; /* in_len: floats of one row's input buffer(s) */
} af_lay;

static af_lay lay_of(const af_shape *sh) {
    af_lay l;
    int64_t hd = sh->hd, kvd = (int64_t)sh->nkv * hd;
    if (sh->qkv) {
        l.q_ld = (sh->nh + 2 * sh->nkv) * hd, l.q_hs = hd, l.kv_ld = l.q_ld;
        l.k_off = sh->nh * hd, l.v_off = sh->nh * hd + kvd, l.in_len = l.q_ld;
    } else {
        l.q_ld = (int64_t)sh->nh * (sh->gated ? 2 : 1) * hd, l.q_hs = (sh->gated ? 2 : 1) * hd, l.kv_ld = 2 * kvd;
        l.k_off = 0, l.v_off = kvd, l.in_len = l.q_ld; /* k | v rows in their own buffer */
    }
    return l;
}

static float *xm_f(int64_t n) { return calloc((size_t)(n ? n : 1), 4); }

static void fill_n(uint64_t *s, float *x, int64_t n, double mul) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(mul * ct_rand_normal(s));
}

/* out must equal want bit for bit (NaN where want is NaN) */
static void same_bits(ct_result *res, const char *name, const float *out, const float *want, int64_t m) {
    double *r = calloc((size_t)(m ? m : 1), 8), *z = calloc((size_t)(m ? m : 1), 8);
    for (int64_t i = 0; i < m; i++) r[i] = want[i];
    ct_compare(res, name, out, r, z, m);
    free(r), free(z);
}

typedef struct af_run {
    float *o[STEPS];   /* [n][nh hd] per step */
    float *kc[MAXN], *vc[MAXN];
    float *q_after;    /* row 0's q buffer after the last step */
} af_run;

/* The STEPS steps from the same host inputs with dr_cuda_set_attn_fused(fused) (the planted defect
 * only with them on). q, kv: per step [n][in_len] / [n][2 kvd]; caches [n][cap kvd]. */
static void run_mode(const ct_kernel *k, cu_t *t, const af_shape *sh, int n, int np, int held_step, int64_t cap,
                     float *const *q, float *const *kv, float *const *kc0, float *const *vc0, int fused, af_run *out) {
    const af_lay l = lay_of(sh);
    const int64_t kvd = (int64_t)sh->nkv * sh->hd, no = (int64_t)n * sh->nh * sh->hd;
    dr_cuda_attn_shape s = {sh->nh, sh->nkv, sh->hd, sh->half, sh->inter, NULL, NULL, NULL, 1e-6, sh->scale};
    uint64_t wseed = 0x46555345ull ^ (uint64_t)(sh->hd * 131 + np); /* the norm weights: the same in every mode */
    float *qn = xm_f(sh->hd), *kn = xm_f(sh->hd), *inv = xm_f(sh->half + 1);
    for (int d = 0; d < sh->hd; d++) {
        qn[d] = (float)(1 + 0.1 * ct_rand_normal(&wseed));
        kn[d] = (float)(1 + 0.1 * ct_rand_normal(&wseed));
    }
    for (int p = 0; p < sh->half; p++) inv[p] = (float)(1.0 / pow(1e7, (double)p / sh->half));
    float *dqn = cu_put(t, qn, (size_t)sh->hd * 4), *dkn = cu_put(t, kn, (size_t)sh->hd * 4);
    float *dinv = cu_put(t, inv, (size_t)(sh->half + 1) * 4);
    s.inv_freq = sh->half ? dinv : NULL, s.q_norm = sh->qnorm ? dqn : NULL, s.k_norm = sh->knorm ? dkn : NULL;
    void *kc[MAXN], *vc[MAXN];
    for (int r = 0; r < n; r++) {
        kc[r] = cu_put(t, kc0[r], (size_t)(cap * kvd) * 4);
        vc[r] = cu_put(t, vc0[r], (size_t)(cap * kvd) * 4);
    }
    void *dkc = cu_ptrs(t, kc, n), *dvc = cu_ptrs(t, vc, n);
    size_t wsb = dr_cuda_attn_ws_bytes(&s, n, cap);
    void *ws = cu_zero(t, wsb); /* the counters at its head: zero once */
    float *dq = cu_alloc(t, (size_t)(n * l.in_len) * 4), *dkv = sh->qkv ? NULL : cu_alloc(t, (size_t)(n * 2 * kvd) * 4);
    float *dy = cu_alloc(t, (size_t)no * 4);
    int32_t *dpos = cu_alloc(t, sizeof(int32_t) * MAXN), *dskip = cu_alloc(t, sizeof(int32_t) * MAXN);
    int32_t pos[STEPS][MAXN], skip[STEPS][MAXN];
    if (!t->failed && dr_cuda_set_attn_fused(t->c, fused, &t->err)) t->failed = 1;
    if (fused) dr_cuda_attn_plant_defect(k->control);
    for (int st = 0; st < STEPS && !t->failed; st++) {
        for (int r = 0; r < n; r++) pos[st][r] = np - 1 + st + r * 7, skip[st][r] = st == held_step && r == 0;
        if (dr_cuda_to_device(t->c, dq, q[st], (size_t)(n * l.in_len) * 4, &t->err) ||
            (dkv && dr_cuda_to_device(t->c, dkv, kv[st], (size_t)(n * 2 * kvd) * 4, &t->err)) ||
            dr_cuda_to_device(t->c, dpos, pos[st], sizeof pos[st], &t->err) ||
            dr_cuda_to_device(t->c, dskip, skip[st], sizeof skip[st], &t->err) ||
            dr_cuda_memset(t->c, dy, 0xFF, (size_t)no * 4, &t->err)) {
            t->failed = 1;
            break;
        }
        const float *kin = sh->qkv ? dq + l.k_off : dkv + l.k_off, *vin = sh->qkv ? dq + l.v_off : dkv + l.v_off;
        if (dr_cuda_attn_step(t->c, &s, n, dq, l.q_ld, l.q_hs, kin, vin, l.kv_ld, dpos, (float *const *)dkc,
                              (float *const *)dvc, dskip, sh->gated ? dq + sh->hd : NULL, l.q_ld, l.q_hs, ws, wsb, dy,
                              &t->err))
            t->failed = 1;
        cu_get(t, out->o[st], dy, (size_t)no * 4);
    }
    dr_cuda_attn_plant_defect(0);
    if (!t->failed && dr_cuda_set_attn_fused(t->c, 1, &t->err)) t->failed = 1;
    cu_get(t, out->q_after, dq, (size_t)l.in_len * 4);
    for (int r = 0; r < n; r++) {
        cu_get(t, out->kc[r], kc[r], (size_t)(cap * kvd) * 4);
        cu_get(t, out->vc[r], vc[r], (size_t)(cap * kvd) * 4);
    }
    free(qn), free(kn), free(inv);
}

static void af_case(const ct_kernel *k, cu_t *t, ct_result *res, uint64_t *s, const af_shape *sh, int n, int np,
                    int held_step) {
    const af_lay l = lay_of(sh);
    const int64_t kvd = (int64_t)sh->nkv * sh->hd, cap = np + STEPS + 7 * (n - 1), no = (int64_t)n * sh->nh * sh->hd;
    float *q[STEPS], *kv[STEPS], *kc0[MAXN], *vc0[MAXN];
    for (int st = 0; st < STEPS; st++) {
        q[st] = xm_f(n * l.in_len), kv[st] = xm_f(n * 2 * kvd);
        fill_n(s, q[st], n * l.in_len, 1.0);
        fill_n(s, kv[st], n * 2 * kvd, 1.0);
    }
    for (int r = 0; r < n; r++) {
        kc0[r] = xm_f(cap * kvd), vc0[r] = xm_f(cap * kvd);
        fill_n(s, kc0[r], cap * kvd, 1.0);
        fill_n(s, vc0[r], cap * kvd, 1.0);
    }
    af_run run[3]; /* dr_cuda_set_attn_fused 0 (prep / split / merge), 1 (the default), 2 (prep in the split) */
    for (int md = 0; md < 3; md++) {
        for (int st = 0; st < STEPS; st++) run[md].o[st] = xm_f(no);
        for (int r = 0; r < n; r++) run[md].kc[r] = xm_f(cap * kvd), run[md].vc[r] = xm_f(cap * kvd);
        run[md].q_after = xm_f(l.in_len);
        run_mode(k, t, sh, n, np, held_step, cap, q, kv, kc0, vc0, md, &run[md]);
    }
    char name[160];
    snprintf(name, sizeof name, "%s n=%d n_pos=%d..%d%s", sh->name, n, np, np + STEPS - 1,
             held_step >= 0 ? " (row 0 held at step 2)" : "");
    if (!cu_case_end(t, res, name))
        for (int md = 1; md < 3; md++) {
            char sub[240];
            for (int st = 0; st < STEPS; st++) {
                snprintf(sub, sizeof sub, "%s: fused=%d step %d out == prep/split/merge (bit for bit)", name, md, st + 1);
                same_bits(res, sub, run[md].o[st], run[0].o[st], no);
            }
            for (int r = 0; r < n; r++) {
                snprintf(sub, sizeof sub, "%s: fused=%d row %d K cache == (bit for bit)", name, md, r);
                same_bits(res, sub, run[md].kc[r], run[0].kc[r], cap * kvd);
                snprintf(sub, sizeof sub, "%s: fused=%d row %d V cache == (bit for bit)", name, md, r);
                same_bits(res, sub, run[md].vc[r], run[0].vc[r], cap * kvd);
            }
            if (n == 1) { /* the fused preparation leaves q raw; the prep kernel norms it in place */
                snprintf(sub, sizeof sub, "%s: fused=%d q left raw (the fused path ran)", name, md);
                same_bits(res, sub, run[md].q_after, q[STEPS - 1], l.in_len);
            }
        }
    for (int md = 0; md < 3; md++) {
        for (int st = 0; st < STEPS; st++) free(run[md].o[st]);
        for (int r = 0; r < n; r++) free(run[md].kc[r]), free(run[md].vc[r]);
        free(run[md].q_after);
    }
    for (int st = 0; st < STEPS; st++) free(q[st]), free(kv[st]);
    for (int r = 0; r < n; r++) free(kc0[r]), free(vc0[r]);
}

static void check(const ct_kernel *k, ct_ctx *ctx, ct_result *res) {
    cu_t t;
    if (cu_open(&t, res)) return;
    uint64_t s = ctx->seed ^ 0x41464655ull;
    const af_shape shapes[] = {
        {"backbone 16/2x256 R=64 half gated", 16, 2, 256, 32, 0, 1, 1, 1, 0, (double)(1.0f / sqrtf(256.0f))},
        {"tower 32/8x128 R=64 interleaved qkv", 32, 8, 128, 32, 1, 1, 1, 0, 1, 1.0 / sqrt(128.0)},
        {"odd 3/1x33 R=10 interleaved q_norm gated", 3, 1, 33, 5, 1, 1, 0, 1, 0, 1.0 / sqrt(33.0)},
    };
    const int ctxs[] = {1, 31, 32, 33, 300, 1000, 10000};
    for (int i = 0; i < 3; i++)
        for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) af_case(k, &t, res, &s, &shapes[i], 1, ctxs[c], -1);
    af_case(k, &t, res, &s, &shapes[0], 1, 33, 1);  /* a held row: its cache untouched, as unfused */
    af_case(k, &t, res, &s, &shapes[0], 2, 300, -1); /* two sessions: prep, then split + merge fused */
    af_case(k, &t, res, &s, &shapes[2], 2, 33, -1);
    af_case(k, &t, res, &s, &shapes[1], 2, 1000, -1);
    cu_close(&t);
}

static const char *af_precision =
    "the fused step (prep, split, last-block merge in one kernel for one row; split + merge fused for up to 8) bit for "
    "bit the prep / split / merge kernels' outputs and caches on the same inputs over 3 steps";

int ct_cuda_attn_kernels(ct_kernel *out, int max) {
    if (max < 1) return 0;
    out[0] = (ct_kernel){.name = "attn_fused", .backend = "cuda", .precision = af_precision, .check = check,
                         .unavailable = cu_unavailable};
    return 1;
}

int ct_cuda_attn_controls(ct_kernel *out, int max) {
    const struct { int defect; const char *desc; } c[] = {
        {2, "device: the fused merge leaves out the last split"},
        {3, "device: the fused arrival counter never reset (the next step merges nothing)"},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++, n++)
        out[n] = (ct_kernel){.name = "attn_fused", .backend = "cuda/control", .precision = af_precision, .check = check,
                             .control = c[i].defect, .control_desc = c[i].desc, .unavailable = cu_unavailable};
    return n;
}

#endif
