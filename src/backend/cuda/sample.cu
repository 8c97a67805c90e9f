/* sample.cu - the sampler on the device (TEXT.md 5, gen/sampler.c), one block per draw.
 *
 * The draw is the CPU's bit for bit given the same logits: the candidates are sorted by (logit
 * descending, index ascending), a total order, so any correct sort gives qsort's result; the
 * weights are dr_expf_det of the same fp32 (x - x0) / T (num/expf_det.h computes identical bits on
 * both sides); every double sum the CPU forms sequentially (the nucleus mass, the draw total, the
 * walk) is formed by one thread in the same order; u is Philox at 16 f + slot (base/philox.h).
 * Parallel steps (checks, keys, the bitonic sort, the weights) have no rounding at all.
 *
 * The sequential sums are a few thousand dependent double adds by one thread; a faster path
 * decides the same outcomes from parallel prefix sums: every sum involved has nonnegative terms, so
 * the CPU's sequential value and the block scan's value are both within (terms + depth) u of the
 * exact sum (Higham 4.2: gamma_k bounds any summation order of nonnegatives). A nucleus cut or a
 * pick whose comparison is decided with twice that margin to spare is the CPU's; when any
 * candidate before the decided one is within the margin (ties, a target on a boundary: about one
 * draw in 1e8 for ordinary logits), the sequential sums run as before.
 *
 * The faster draw (sample_fast.cuh; the default, DRAMA_CUDA_SAMPLE=0 runs the one above) changes
 * only what is sorted and where the sums are formed, never an operand or the order of a sequential
 * sum: (1) the full sort is the same bitonic network with each thread's 8 keys in registers, 3 stages
 * a shared-memory round trip (34 barriers at 8192 candidates instead of 91): keys are distinct, so
 * any correct sort gives the one order. (2) With 0 < top_k < m (top_k <= 1024) only the top_k
 * largest keys are needed: a radix select on the 64-bit key finds exactly them (a set: the same for
 * any method), 32 of them are sorted by one warp's shuffles, more by (1). The nucleus cut can bind
 * only at s < top_k (a later cut leaves kept = top_k), so fast_top_p's decision is taken there, on
 * prefix sums of the same q_s over the sorted list, with Z the sum of the same m terms in another
 * order: the margin holds for any order of nonnegative terms (gamma_{terms-1}), so decided cuts are
 * the CPU's; an open one falls back to the full sort and the draw above, with nothing reused but
 * S.keys. The pick needs only the kept prefix: fast_pick's decision, else lane 0's walk in order, as
 * the CPU. (2b) With no binding top-k and a nucleus that a gate estimates small (the gate only picks
 * a path), the same list of the top 32 keys: a cut decided at s < 32 with every earlier one decided
 * false is the CPU's cut and kept <= 32 is inside the list; all cuts in the list decided false means
 * the nucleus is longer: the full sort runs. (3) The redraw has the same logits, so the first
 * draw's keys (and its sort, or its list and Z) stay: the key build, the checks, m, the order and Z
 * (untempered) are functions of the logits alone. */
#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"
#include "base/philox.h"
#include "num/expf_det.h"

#define SAMPLE_THREADS 1024

struct draw_spec {
    float temperature, top_p;
    int top_k, keep_crossing;
    int sequential; /* the contract's check of the sequential path: skip the parallel decision */
};

/* Sort key of a finite logit l at candidate i: descending key = descending logit, then ascending
 * index. -0 and +0 compare equal in the CPU's comparison, so both map to +0's key. */
__device__ __forceinline__ unsigned long long logit_key(float l, int i) {
    unsigned b = __float_as_uint(l == 0.0f ? 0.0f : l);
    unsigned ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)ord << 32) | (0xFFFFFFFFu - (unsigned)i);
}
__device__ __forceinline__ int key_index(unsigned long long k) { return (int)(0xFFFFFFFFu - (unsigned)(k & 0xFFFFFFFFull)); }

struct sample_smem {
    unsigned long long *keys; /* [n2] */
    double *q;                /* [n] */
    double *qz;               /* [n] */
    double *zsum;
    int *bad;                 /* [2]: lowest NaN / +inf index, count of valid */
    unsigned long long *red;  /* [32]; the scan's warp totals as doubles */
    int *result;
    int *first;               /* [2]: the parallel decision's first decided / first undecided index */
};

/* q[0] + q[1] + ... + q[n-1] left to right in double (the CPU's loops), loads run ahead of the adds */
__device__ __forceinline__ double seq_sum(const double *q, int n) {
    double z = 0;
    int r = 0;
    for (; r + 8 <= n; r += 8) {
        double v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = q[r + e];
#pragma unroll
        for (int e = 0; e < 8; e++) z += v[e];
    }
    for (; r < n; r++) z += q[r];
    return z;
}

/* this thread's run of a scan: P[i] = q[b0] + ... + q[i] for i in [b0, b1), in order; returns its total */
__device__ __forceinline__ double run_scan(const double *q, int b0, int b1, double *P) {
    double loc = 0;
    for (int i = b0; i < b1; i++) {
        loc += q[i];
        P[i] = loc;
    }
    return loc;
}

/* the sum of v over lanes 0 .. lane by shuffles (a tree of depth 5), in every lane */
__device__ __forceinline__ double warp_incl_scan(double v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        double o = __shfl_up_sync(0xFFFFFFFFu, v, off);
        if (lane >= off) v += o;
    }
    return v;
}

/* Inclusive prefix sums P[0..n) of q (nonnegative) by the whole block: each thread a run of
 * ceil(n / threads) <= 8 in order, then the runs' totals by warp shuffles and the warps' totals by
 * warp 0. Every P[i] is a sum of a tree of depth < SCAN_DEPTH. Returns the total (all threads). */
#define SCAN_DEPTH 24
__device__ double block_scan(const double *q, int n, double *P, const sample_smem &S) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, w = tid >> 5;
    double *wsum = (double *)S.red;
    const int c = (n + nt - 1) / nt, b0 = tid * c, b1 = b0 + c < n ? b0 + c : n;
    const double v = warp_incl_scan(run_scan(q, b0, b1, P));
    double excl = __shfl_up_sync(0xFFFFFFFFu, v, 1); /* a move, no rounding */
    if (lane == 0) excl = 0;
    if (lane == 31) wsum[w] = v;
    __syncthreads();
    if (w == 0) wsum[lane] = warp_incl_scan(lane < nt / 32 ? wsum[lane] : 0.0);
    __syncthreads();
    const double off = w ? wsum[w - 1] + excl : excl;
    for (int i = b0; i < b1; i++) P[i] = off + P[i];
    const double total = wsum[31];
    __syncthreads();
    return total;
}

/* Margin of a sum of k + 1 nonnegative terms formed in any order of depth <= k against another such
 * formation: 2 (k + 2 SCAN_DEPTH + 16) 2^-53 of the value covers gamma_k + gamma_SCAN_DEPTH + the
 * divisions, and is used twice over. */
__device__ __forceinline__ double sum_margin(int k, double v) { return (double)(k + 2 * SCAN_DEPTH + 16) * 0x1p-52 * v; }

/* The first index in [lo, hi] whose flag is "decided true", if every earlier one is "decided false":
 * decide(i) returns 1 (true), 0 (false) or -1 (within the margin). Returns hi + 1 when all are
 * false, -2 when undecided. */
template <typename F>
__device__ int first_decided(int lo, int hi, const sample_smem &S, F decide) {
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) S.first[0] = S.first[1] = 0x7FFFFFFF;
    __syncthreads();
    int t = 0x7FFFFFFF, nf = 0x7FFFFFFF;
    for (int i = lo + tid; i <= hi; i += nt) {
        int d = decide(i);
        if (d == 1 && i < t) t = i;
        if (d != 0 && i < nf) nf = i;
    }
    if (t != 0x7FFFFFFF) atomicMin(&S.first[0], t);
    if (nf != 0x7FFFFFFF) atomicMin(&S.first[1], nf);
    __syncthreads();
    t = S.first[0], nf = S.first[1];
    __syncthreads();
    if (nf == 0x7FFFFFFF) return hi + 1;
    return nf == t ? t : -2;
}

/* dr_op_top_p_count's result from the scan of q[0..m) (S.q), or -1 when the margin leaves it open.
 * The CPU's cum_s (sum of q_i / z for i <= s) is within the margin of P_s / P_{m-1}. */
__device__ int fast_top_p(const sample_smem &S, int m, double top_p, int keep_crossing) {
    const double Z = block_scan(S.q, m, S.qz, S);
    if (!(Z > 0) || !isfinite(Z)) return -1;
    /* keep crossing: r = s + 1 for the first s <= m - 2 with cum_s >= top_p; drop crossing: r = s for the
     * first s >= 1 with cum_s > top_p */
    auto decide = [&](int s2) -> int {
        double E = S.qz[s2] / Z, B = 2 * sum_margin(m + s2, E);
        if (keep_crossing ? E - B >= top_p : E - B > top_p) return 1;
        return E + B < top_p ? 0 : -1;
    };
    int lo = keep_crossing ? 0 : 1, hi = keep_crossing ? m - 2 : m - 1;
    int s2 = first_decided(lo, hi, S, decide);
    if (s2 == -2) return -1;
    if (s2 == hi + 1) return m;
    return keep_crossing ? s2 + 1 : s2;
}

/* The walk's pick from the scan of the tempered weights q[0..kept) (S.q), or -1 when open: the CPU
 * takes the first r with u * total < acc_r, else the last survivor. */
__device__ int fast_pick(const sample_smem &S, int kept, double u) {
    const double W = block_scan(S.q, kept, S.qz, S);
    if (!(W > 0) || !isfinite(W)) return -1;
    const double tgt = u * W, bt = 2 * sum_margin(kept, tgt);
    auto decide = [&](int r) -> int {
        double A = S.qz[r], ba = 2 * sum_margin(r, A);
        if (A - ba > tgt + bt) return 1;
        return A + ba < tgt - bt ? 0 : -1;
    };
    int r = first_decided(0, kept - 1, S, decide);
    if (r == -2) return -1;
    return key_index(S.keys[r == kept ? kept - 1 : r]);
}

/* The old sort: bitonic, descending, one shared-memory pass and barrier per stage (91 at n2 = 8192) */
__device__ void bitonic_sort_smem(unsigned long long *keys, int n2) {
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int k = 2; k <= n2; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < n2; i += nt) {
                int ixj = i ^ j;
                if (ixj > i) {
                    unsigned long long a = keys[i], b = keys[ixj];
                    bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) {
                        keys[i] = b;
                        keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
}

/* The draw from S.keys[0..m) sorted (rank order), m valid candidates: nucleus, weights, the pick.
 * Called by every thread of the block; the result is valid in every thread. */
__device__ int draw_sorted(const float *logits, int m, const draw_spec &sp, double u, const sample_smem &S) {
    const int tid = threadIdx.x, nt = blockDim.x;
    const float x0 = logits[key_index(S.keys[0])];
    int kept = m;
    if (sp.top_k > 0 && sp.top_k < kept) kept = sp.top_k;
    if (sp.top_p < 1.0f) {
        /* p over every candidate, untempered (dr_op_exp_weights with T = 1), then dr_op_top_p_count:
         * decided from the scan, or z summed in rank order by one thread, the masses q_r / z by all
         * (IEEE division: the same bits whoever computes them), their prefix sums again by one
         * thread, in order */
        for (int r = tid; r < m; r += nt) S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(S.keys[r])], x0), 1.0f));
        __syncthreads();
        const int by_fast = sp.sequential ? -1 : fast_top_p(S, m, (double)sp.top_p, sp.keep_crossing);
        if (by_fast >= 0) {
            if (by_fast < kept) kept = by_fast;
        } else {
        if (tid == 0) *S.zsum = seq_sum(S.q, m);
        __syncthreads();
        const double z = *S.zsum;
        for (int r = tid; r < m; r += nt) S.qz[r] = S.q[r] / z;
        __syncthreads();
        if (tid == 0) {
            double cum = 0, top_p = (double)sp.top_p;
            int by_p = m;
            for (int r0 = 0; r0 < m && by_p == m; r0 += 8) {
                double v[8];
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = r0 + e < m ? S.qz[r0 + e] : 0.0;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    int r = r0 + e;
                    if (r >= m || by_p != m) break;
                    double prev = cum;
                    cum += v[e];
                    if (sp.keep_crossing ? (r > 0 && !(prev < top_p)) : (r > 0 && !(cum <= top_p))) by_p = r;
                }
            }
            *S.result = by_p;
        }
        __syncthreads();
        if (*S.result < kept) kept = *S.result;
        __syncthreads();
        }
    }
    for (int r = tid; r < kept; r += nt)
        S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(S.keys[r])], x0), sp.temperature));
    __syncthreads();
    const int pick = sp.sequential ? -1 : fast_pick(S, kept, u);
    if (pick >= 0) return pick;
    if (tid == 0) {
        double target = u * seq_sum(S.q, kept), acc = 0;
        int out = key_index(S.keys[kept - 1]); /* rounding left none: the last survivor */
        for (int r0 = 0, found = 0; r0 < kept && !found; r0 += 8) {
            double v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = r0 + e < kept ? S.q[r0 + e] : 0.0;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (r0 + e >= kept || found) break;
                acc += v[e];
                if (target < acc) {
                    out = key_index(S.keys[r0 + e]);
                    found = 1;
                }
            }
        }
        *S.result = out;
    }
    __syncthreads();
    return *S.result;
}

/* One draw over logits[0..n) (dr_sample). Returns the candidate, or -1 with *err / *arg set
 * (DR_CUDA_ERR_*). Called by every thread of the block; the result is valid in every thread. */
__device__ int block_draw(const float *logits, int n, int n2, const draw_spec &sp, double u, const sample_smem &S,
                          int *err, int *arg) {
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) {
        S.bad[0] = 0x7FFFFFFF; /* lowest index of a NaN or +inf */
        S.bad[1] = 0;          /* valid candidates */
    }
    __syncthreads();
    int valid = 0;
    unsigned long long best = 0;
    for (int i = tid; i < n2; i += nt) {
        unsigned long long key = 0;
        if (i < n) {
            float l = logits[i];
            if (isnan(l) || (isinf(l) && l > 0)) atomicMin(&S.bad[0], i);
            else if (!isinf(l)) {
                key = logit_key(l, i);
                valid++;
            }
        }
        S.keys[i] = key;
        best = key > best ? key : best;
    }
    atomicAdd(&S.bad[1], valid);
    __syncthreads();
    if (S.bad[0] != 0x7FFFFFFF) {
        *arg = S.bad[0];
        *err = isnan(logits[S.bad[0]]) ? DR_CUDA_ERR_LOGIT_NAN : DR_CUDA_ERR_LOGIT_INF;
        return -1;
    }
    const int m = S.bad[1];
    if (m == 0) {
        *err = DR_CUDA_ERR_EXCLUDED;
        *arg = 0;
        return -1;
    }
    if (sp.temperature <= 0.0f) { /* argmax: the largest key is the first maximum */
        int lane = tid & 31, w = tid >> 5;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, best, off);
            best = o > best ? o : best;
        }
        if (lane == 0) S.red[w] = best;
        __syncthreads();
        if (tid == 0) {
            unsigned long long b = 0;
            for (int k = 0; k < nt / 32; k++) b = S.red[k] > b ? S.red[k] : b;
            *S.result = key_index(b);
        }
        __syncthreads();
        return *S.result;
    }
    bitonic_sort_smem(S.keys, n2);
    return draw_sorted(logits, m, sp, u, S);
}

__device__ sample_smem smem_layout(void *base, int n, int n2) {
    sample_smem S;
    uint8_t *p = (uint8_t *)base;
    S.keys = (unsigned long long *)p;
    S.q = (double *)(p + (size_t)n2 * 8);
    S.qz = S.q + n;
    S.zsum = S.qz + n;
    S.red = (unsigned long long *)(S.zsum + 1);
    S.bad = (int *)(S.red + 32);
    S.result = S.bad + 2;
    S.first = S.result + 1;
    return S;
}

__host__ __device__ static size_t smem_bytes(int n, int n2) { return (size_t)n2 * 8 + (size_t)2 * n * 8 + 8 + 32 * 8 + 8 * sizeof(int); }

/* The kernels' variants: V = 0 the sort-everything draw (block_draw), 1 the faster one (fast_draw),
 * 2 and 3 its planted defects (sample_raw_kernel only), 4 the faster one without the nucleus list.
 * dr_cuda.sample picks (DRAMA_CUDA_SAMPLE). */
enum { SV_OLD, SV_FAST, SV_SORT_DEFECT, SV_TOPK_DEFECT, SV_NOLIST, SV_COUNT };

#include "backend/cuda/sample_fast.cuh"

__device__ fast_smem fast_layout(void *base, int n, int n2) {
    fast_smem F;
    F.S = smem_layout(base, n, n2);
    F.top = (unsigned long long *)((uint8_t *)base + smem_bytes(n, n2));
    F.maxk = F.top + TOP_CAP;
    F.zpart = (double *)(F.maxk + 32);
    F.hist = (int *)(F.zpart + 32);
    F.sel = F.hist + 768;
    F.gm = (float *)(F.sel + 4);
    F.gs = F.gm + 32;
    return F;
}
static size_t fast_smem_bytes(int n, int n2) { return smem_bytes(n, n2) + (size_t)TOP_CAP * 8 + 64 * 8 + 772 * 4 + 64 * 4; }

static int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}


/* One draw of the variant: the old or the faster device function on one block's shared memory. */
template <int V> struct drawer {
    sample_smem S;
    fast_smem F;
    draw_state ds;
    __device__ drawer(void *base, int n, int n2) {
        if (V == SV_OLD) S = smem_layout(base, n, n2);
        else F = fast_layout(base, n, n2);
        ds.m = 0, ds.sorted = 0, ds.listed = 0;
    }
    __device__ int draw(const float *logits, int n, int n2, const draw_spec &sp, double u, int *err, int *arg) {
        if (V == SV_OLD) return block_draw(logits, n, n2, sp, u, S, err, arg);
        return fast_draw<V>(logits, n, n2, sp, u, F, ds, err, arg);
    }
};

/* Geometry of a draw over n candidates (the faster draw: n2 >= 8, its extra shared memory); the kernel's
 * opt-in to large shared memory is made once per kernel (the first launch always happens outside a
 * graph capture: the prefill draws first). */
static drama_status launch_prep(const void *fn, int *attr_set, int n, int v, int *n2, size_t *shm, drama_error *err) {
    if (n < 1 || n > 8192) return dr_fail(err, DRAMA_EINVAL, "CUDA sampler: %d candidates (1 .. 8192)", n);
    *n2 = pow2_at_least(v == SV_OLD || n >= 8 ? n : 8);
    *shm = v == SV_OLD ? smem_bytes(n, *n2) : fast_smem_bytes(n, *n2);
    if (*shm > 48 * 1024 && !*attr_set) {
        drama_status s = dr_cuda_smem_optin(fn, "sampler shared memory", err);
        if (s) return s;
        *attr_set = 1;
    }
    return DRAMA_OK;
}

/* a failed draw as the CPU's dr_sample_*_st reports it (backend.h: DR_FAULT_DRAW) */
__device__ void draw_status(dr_op_status *st, int kind, int err, int arg, uint64_t f) {
    st->code = DRAMA_ENUMERIC;
    st->fault = DR_FAULT_DRAW;
    st->a = kind;
    st->b = err == DR_CUDA_ERR_LOGIT_NAN ? DR_DRAW_NAN : err == DR_CUDA_ERR_LOGIT_INF ? DR_DRAW_POSINF : DR_DRAW_ALL_EXCLUDED;
    st->c = (int64_t)f;
    st->d = err == DR_CUDA_ERR_EXCLUDED ? 0 : arg;
}

/* ---- the semantic draw of every lane with the repetition-aware redraw (dr_cpu_op_sample_semantic,
 * dr_sample_semantic_st): f = g->draw (then g->draw + 1), the end token ends the lane, a frame's
 * code joins the redraw window. The faster draw's redraw reuses the first draw's keys (and sort). ---- */
template <int V>
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_semantic_kernel(const dr_step_lane *lanes, int n, int n2, dr_step_io io) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    drawer<V> D(smem, n, n2);
    dr_gen_lane *g = lanes[i].g;
    const dr_sampler_params sp = g->sp;
    const uint64_t f = g->draw;
    dr_op_status *st = &io.status[i];
    int32_t *code = io.codes + i * DR_MAX_CODEBOOKS;
    const int earlier = st->code != 0;
    __syncthreads(); /* every thread has read the counter and the status */
    if (threadIdx.x == 0) {
        g->draw = f + 1;
        code[0] = 0;
        io.ended[i] = 0;
    }
    if (earlier) return; /* an earlier failure of this step */
    const float *lg = lanes[i].logits;
    draw_spec spec = {sp.temperature, sp.top_p, sp.semantic_top_k, 1, 0};
    int err = 0, arg = 0, kind = DR_DRAW_SEMANTIC;
    int t = D.draw(lg, n, n2, spec, dr_philox_uniform(sp.seed, f * 16 + 0), &err, &arg);
    if (t >= 0 && sp.temperature > 0.0f && sp.ras_window > 0 && t != n - 1) {
        int len = g->window_len, first = len > sp.ras_window ? len - sp.ras_window : 0, rep = 0;
        for (int k = first; k < len; k++) rep |= g->window[k] == t;
        if (rep) { /* same logits, its own temperature and nucleus, no top-k, slot 1 */
            draw_spec ras = {sp.ras_temperature, sp.ras_top_p, 0, 1, 0};
            kind = DR_DRAW_REDRAW;
            t = D.draw(lg, n, n2, ras, dr_philox_uniform(sp.seed, f * 16 + 1), &err, &arg);
        }
    }
    if (threadIdx.x != 0) return;
    if (t < 0) {
        draw_status(st, kind, err, arg, f);
        return;
    }
    if (t == n - 1) {
        io.ended[i] = 1;
        return;
    }
    code[0] = t;
    if (g->window_len == DR_RAS_MAX) {
        for (int k = 0; k + 1 < DR_RAS_MAX; k++) g->window[k] = g->window[k + 1];
        g->window_len--;
    }
    g->window[g->window_len++] = t;
}

/* ---- the acoustic draw of codebook j for every live lane (dr_cpu_op_sample_acoustic) ---- */
template <int V>
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_acoustic_kernel(const dr_step_lane *lanes, int codebook, const float *logits, int n, int n2, dr_step_io io) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    dr_op_status *st = &io.status[i];
    int32_t *out = io.codes + i * DR_MAX_CODEBOOKS + codebook;
    if (io.ended[i] || st->code) { /* uniform: the lane draws nothing */
        if (threadIdx.x == 0) *out = 0;
        return;
    }
    drawer<V> D(smem, n, n2);
    const dr_gen_lane *g = lanes[i].g;
    const dr_sampler_params sp = g->sp;
    const uint64_t f = g->draw - 1;
    draw_spec spec = {sp.temperature, sp.top_p, sp.acoustic_top_k, 0, 0};
    int err = 0, arg = 0;
    int t = D.draw(logits + i * n, n, n2, spec, dr_philox_uniform(sp.seed, f * 16 + 1 + (uint64_t)codebook), &err,
                   &arg);
    if (threadIdx.x != 0) return;
    if (t < 0) {
        draw_status(st, codebook, err, arg, f);
        t = 0; /* the lane is lost; the others go on */
    }
    *out = t;
}

/* ---- one general draw per row (the contract's entry point) ---- */
template <int V>
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_raw_kernel(const float *logits, int64_t ld, int n, int n2, draw_spec sp, const double *u, int32_t *out,
                  dev_status *st) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    drawer<V> D(smem, n, n2);
    int err = 0, arg = 0;
    int t = D.draw(logits + i * ld, n, n2, sp, u[i], &err, &arg);
    if (threadIdx.x != 0) return;
    if (t < 0) dev_fail(st, err, arg, (int)i);
    out[i] = t;
}

/* the kernels by variant, their shared-memory opt-in flags */
typedef void (*semantic_fn)(const dr_step_lane *, int, int, dr_step_io);
typedef void (*acoustic_fn)(const dr_step_lane *, int, const float *, int, int, dr_step_io);
typedef void (*raw_fn)(const float *, int64_t, int, int, draw_spec, const double *, int32_t *, dev_status *);
static const semantic_fn semantic_k[3] = {sample_semantic_kernel<SV_OLD>, sample_semantic_kernel<SV_FAST>,
                                          sample_semantic_kernel<SV_NOLIST>};
static const acoustic_fn acoustic_k[3] = {sample_acoustic_kernel<SV_OLD>, sample_acoustic_kernel<SV_FAST>,
                                          sample_acoustic_kernel<SV_NOLIST>};
static const raw_fn raw_k[SV_COUNT] = {sample_raw_kernel<SV_OLD>, sample_raw_kernel<SV_FAST>,
                                       sample_raw_kernel<SV_SORT_DEFECT>, sample_raw_kernel<SV_TOPK_DEFECT>,
                                       sample_raw_kernel<SV_NOLIST>};
static int attr_semantic[3], attr_acoustic[3], attr_raw[SV_COUNT];
/* the frame step's kernels (slot 0 old, 1 fast, 2 fast without the list; the controls are the raw entry's) */
static int lane_variant(const dr_cuda *c) { return c->sample == SV_OLD ? 0 : c->sample == SV_NOLIST ? 2 : 1; }

extern "C" drama_status dr_cuda_sample_semantic(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int n_cand,
                                                dr_step_io io, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!lanes || n_cand < 2) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_semantic: bad arguments");
    const int v = lane_variant(c);
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)semantic_k[v], &attr_semantic[v], n_cand, v ? SV_FAST : SV_OLD, &n2, &shm, err);
    if (s) return s;
    dr_launch(c->pdl, semantic_k[v], (unsigned)n, SAMPLE_THREADS, shm, c->stream, lanes, n_cand, n2, io);
    return dr_cuda_check(cudaGetLastError(), "semantic sampler launch", err);
}

extern "C" drama_status dr_cuda_sample_acoustic(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int codebook,
                                                const float *logits, int hv, dr_step_io io, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!lanes || !logits || codebook < 1 || codebook > 14)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_acoustic: bad arguments");
    const int v = lane_variant(c);
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)acoustic_k[v], &attr_acoustic[v], hv, v ? SV_FAST : SV_OLD, &n2, &shm, err);
    if (s) return s;
    dr_launch(c->pdl, acoustic_k[v], (unsigned)n, SAMPLE_THREADS, shm, c->stream, lanes, codebook, logits, hv, n2, io);
    return dr_cuda_check(cudaGetLastError(), "acoustic sampler launch", err);
}

extern "C" drama_status dr_cuda_set_sample(dr_cuda *c, int v, drama_error *err) {
    if (!c || v < 0 || v >= SV_COUNT) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_set_sample: bad argument");
    c->sample = v;
    return DRAMA_OK;
}

/* ---- guidance over the lanes (dr_cpu_op_guidance) ---- */
__global__ void lanes_guidance_kernel(const dr_step_lane *lanes, int n_cand) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const dr_step_lane *L = &lanes[blockIdx.y];
    const float gamma = L->g->sp.cfg_gamma;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_cand; i += gridDim.x * blockDim.x) {
        float cv = L->logits_c[i];
        L->logits[i] = !L->guided ? cv : (isinf(cv) && cv < 0) ? cv : fadd(cv, fmul(gamma, fsub(cv, L->logits_u[i])));
    }
}

extern "C" drama_status dr_cuda_lanes_guidance(dr_cuda *c, const dr_step_lane *lanes, int64_t n, int n_cand,
                                               drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    dim3 grid((unsigned)((n_cand + 255) / 256 < 32 ? (n_cand + 255) / 256 : 32), (unsigned)n);
    dr_launch(c->pdl, lanes_guidance_kernel, grid, 256, 0, c->stream, lanes, n_cand);
    return dr_cuda_check(cudaGetLastError(), "guidance launch", err);
}

extern "C" drama_status dr_cuda_sample_raw(dr_cuda *c, const float *logits, int64_t ld, int n_cand, int64_t n,
                                           float temperature, float top_p, int top_k, int rule, const double *u,
                                           int32_t *out, dr_cuda_status *st, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!logits || !u || !out || ld < n_cand) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_raw: bad arguments");
    const int v = c->sample;
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)raw_k[v], &attr_raw[v], n_cand, v, &n2, &shm, err);
    if (s) return s;
    draw_spec sp = {temperature, top_p, top_k, (rule & 1) == 0, (rule & 2) != 0};
    dr_launch(c->pdl, raw_k[v], (unsigned)n, SAMPLE_THREADS, shm, c->stream, logits, ld, n_cand, n2, sp, u, out,
              (dev_status *)st);
    return dr_cuda_check(cudaGetLastError(), "sampler launch", err);
}

/* ---- the contract's check of dr_expf_det on the device ---- */
__global__ void expf_eval_kernel(const float *x, int64_t n, float *y, int device_expf) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = device_expf ? expf(x[i]) : dr_expf_det(x[i]);
}

extern "C" drama_status dr_cuda_expf_det_eval(dr_cuda *c, const float *x, int64_t n, float *y, int device_expf,
                                              drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    dr_launch(c->pdl, expf_eval_kernel, 1024, 256, 0, c->stream, x, n, y, device_expf);
    return dr_cuda_check(cudaGetLastError(), "expf_det launch", err);
}

drama_status dr_cuda_sample_init(drama_error *err) {
    const void *fns[6 + SV_COUNT];
    int *flags[6 + SV_COUNT];
    for (int v = 0; v < 3; v++) {
        fns[v] = (const void *)semantic_k[v], flags[v] = &attr_semantic[v];
        fns[3 + v] = (const void *)acoustic_k[v], flags[3 + v] = &attr_acoustic[v];
    }
    for (int v = 0; v < SV_COUNT; v++) fns[6 + v] = (const void *)raw_k[v], flags[6 + v] = &attr_raw[v];
    for (int i = 0; i < 6 + SV_COUNT; i++) {
        drama_status s = dr_cuda_smem_optin(fns[i], "sampler shared memory", err);
        if (s) return s;
        *flags[i] = 1;
    }
    return DRAMA_OK;
}
