/* sample.cu - the sampler on the device (TEXT.md 5, gen/sampler.c), one block per draw.
 *
 * The draw is the CPU's bit for bit given the same logits: the candidates are sorted by (logit
 * descending, index ascending), a total order, so any correct sort gives qsort's result; the
 * weights are dr_expf_det of the same fp32 (x - x0) / T (num/expf_det.h computes identical bits on
 * both sides); every double sum the CPU forms sequentially (the nucleus mass, the draw total, the
 * walk) is formed by one thread in the same order; u is Philox at 16 f + slot (base/philox.h).
 * Parallel steps (checks, keys, the bitonic sort, the weights) have no rounding at all. */
#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"
#include "base/philox.h"
#include "num/expf_det.h"

#define SAMPLE_THREADS 1024

struct draw_spec {
    float temperature, top_p;
    int top_k, keep_crossing;
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
    unsigned long long *red;  /* [32] */
    int *result;
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
    /* bitonic sort, descending */
    for (int k = 2; k <= n2; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < n2; i += nt) {
                int ixj = i ^ j;
                if (ixj > i) {
                    unsigned long long a = S.keys[i], b = S.keys[ixj];
                    bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) {
                        S.keys[i] = b;
                        S.keys[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    const float x0 = logits[key_index(S.keys[0])];
    int kept = m;
    if (sp.top_k > 0 && sp.top_k < kept) kept = sp.top_k;
    if (sp.top_p < 1.0f) {
        /* p over every candidate, untempered (dr_op_exp_weights with T = 1), then dr_op_top_p_count:
         * z summed in rank order by one thread, the masses q_r / z by all (IEEE division: the same
         * bits whoever computes them), their prefix sums again by one thread, in order */
        for (int r = tid; r < m; r += nt) S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(S.keys[r])], x0), 1.0f));
        __syncthreads();
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
    for (int r = tid; r < kept; r += nt)
        S.q[r] = (double)dr_expf_det(fdiv(fsub(logits[key_index(S.keys[r])], x0), sp.temperature));
    __syncthreads();
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
    return S;
}

static size_t smem_bytes(int n, int n2) { return (size_t)n2 * 8 + (size_t)2 * n * 8 + 8 + 32 * 8 + 4 * sizeof(int); }
static int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* ---- semantic draw with the repetition-aware redraw (dr_sample_semantic) ---- */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_semantic_kernel(const float *logits, int64_t ld, int n, int n2, dr_cuda_lane *lanes, const int32_t *skip,
                       int32_t *codes, int64_t codes_ld, dev_status *st) {
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    if (skip && skip[i]) return;
    sample_smem S = smem_layout(smem, n, n2);
    dr_cuda_lane *L = &lanes[i];
    const uint64_t f = L->next_f;
    const float *lg = logits + i * ld;
    draw_spec sp = {L->temperature, L->top_p, L->semantic_top_k, 1};
    int err = 0, arg = 0;
    int t = block_draw(lg, n, n2, sp, dr_philox_uniform(L->seed, f * 16 + 0), S, &err, &arg);
    if (t >= 0 && L->temperature > 0.0f && L->ras_window > 0 && t != n - 1) {
        int len = L->window_len, first = len > L->ras_window ? len - L->ras_window : 0, rep = 0;
        for (int k = first; k < len; k++) rep |= L->window[k] == t;
        if (rep) { /* same logits, its own temperature and nucleus, no top-k, slot 1 */
            draw_spec ras = {L->ras_temperature, L->ras_top_p, 0, 1};
            t = block_draw(lg, n, n2, ras, dr_philox_uniform(L->seed, f * 16 + 1), S, &err, &arg);
        }
    }
    if (threadIdx.x != 0) return;
    L->f = f;
    L->next_f = f + 1;
    if (t < 0) {
        dev_fail(st, err, arg, (int)i);
        L->finish = -1;
        return;
    }
    L->code = t;
    if (t == n - 1) {
        L->finish = 1;
    } else if (L->batch_frames >= L->frame_cap) {
        L->finish = 2;
    } else {
        L->finish = 0;
        if (L->window_len == DR_CUDA_RAS_MAX) {
            for (int k = 0; k + 1 < DR_CUDA_RAS_MAX; k++) L->window[k] = L->window[k + 1];
            L->window_len--;
        }
        L->window[L->window_len++] = t;
        L->batch_frames++;
        if (codes) codes[i * codes_ld] = t;
    }
}

static drama_status launch_prep(const void *fn, int n, int *n2, size_t *shm, drama_error *err) {
    if (n < 1 || n > (1 << 14)) return dr_fail(err, DRAMA_EINVAL, "CUDA sampler: %d candidates (1 .. 16384)", n);
    *n2 = pow2_at_least(n);
    *shm = smem_bytes(n, *n2);
    if (*shm > 48 * 1024)
        return dr_cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*shm),
                             "cudaFuncSetAttribute (sampler)", err);
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_sample_semantic(dr_cuda *c, const float *logits, int64_t ld, int n_cand, int64_t n,
                                                dr_cuda_lane *lanes, const int32_t *skip, int32_t *codes,
                                                int64_t codes_ld, dr_cuda_status *st, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!logits || !lanes || ld < n_cand || n_cand < 2) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_semantic: bad arguments");
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)sample_semantic_kernel, n_cand, &n2, &shm, err);
    if (s) return s;
    sample_semantic_kernel<<<(unsigned)n, SAMPLE_THREADS, shm, c->stream>>>(logits, ld, n_cand, n2, lanes, skip, codes,
                                                                           codes_ld, (dev_status *)st);
    return dr_cuda_check(cudaGetLastError(), "semantic sampler launch", err);
}

/* ---- acoustic draw of one codebook (dr_sample_acoustic) ---- */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_acoustic_kernel(const float *logits, int64_t ld, int n, int n2, int codebook, const dr_cuda_lane *lanes,
                       const int32_t *skip, int32_t *codes, int64_t codes_ld, dev_status *st) {
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    const dr_cuda_lane *L = &lanes[i];
    if ((skip && skip[i]) || L->finish != 0) return;
    sample_smem S = smem_layout(smem, n, n2);
    draw_spec sp = {L->temperature, L->top_p, L->acoustic_top_k, 0};
    int err = 0, arg = 0;
    int t = block_draw(logits + i * ld, n, n2, sp, dr_philox_uniform(L->seed, L->f * 16 + 1 + (uint64_t)codebook), S,
                       &err, &arg);
    if (threadIdx.x != 0) return;
    if (t < 0) {
        dev_fail(st, err, arg, (int)i);
        t = 0;
    }
    codes[i * codes_ld + codebook] = t;
}

extern "C" drama_status dr_cuda_sample_acoustic(dr_cuda *c, const float *logits, int64_t ld, int hv, int64_t n,
                                                int codebook, const dr_cuda_lane *lanes, const int32_t *skip,
                                                int32_t *codes, int64_t codes_ld, dr_cuda_status *st,
                                                drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!logits || !lanes || !codes || ld < hv || codebook < 1 || codebook > 14)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_acoustic: bad arguments");
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)sample_acoustic_kernel, hv, &n2, &shm, err);
    if (s) return s;
    sample_acoustic_kernel<<<(unsigned)n, SAMPLE_THREADS, shm, c->stream>>>(logits, ld, hv, n2, codebook, lanes, skip,
                                                                           codes, codes_ld, (dev_status *)st);
    return dr_cuda_check(cudaGetLastError(), "acoustic sampler launch", err);
}

/* ---- one general draw per row (the contract's entry point) ---- */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_raw_kernel(const float *logits, int64_t ld, int n, int n2, draw_spec sp, const double *u, int32_t *out,
                  dev_status *st) {
    extern __shared__ unsigned long long smem[];
    const int64_t i = blockIdx.x;
    sample_smem S = smem_layout(smem, n, n2);
    int err = 0, arg = 0;
    int t = block_draw(logits + i * ld, n, n2, sp, u[i], S, &err, &arg);
    if (threadIdx.x != 0) return;
    if (t < 0) dev_fail(st, err, arg, (int)i);
    out[i] = t;
}

extern "C" drama_status dr_cuda_sample_raw(dr_cuda *c, const float *logits, int64_t ld, int n_cand, int64_t n,
                                           float temperature, float top_p, int top_k, int rule, const double *u,
                                           int32_t *out, dr_cuda_status *st, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!logits || !u || !out || ld < n_cand) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sample_raw: bad arguments");
    int n2 = 0;
    size_t shm = 0;
    drama_status s = launch_prep((const void *)sample_raw_kernel, n_cand, &n2, &shm, err);
    if (s) return s;
    draw_spec sp = {temperature, top_p, top_k, rule == 0};
    sample_raw_kernel<<<(unsigned)n, SAMPLE_THREADS, shm, c->stream>>>(logits, ld, n_cand, n2, sp, u, out,
                                                                      (dev_status *)st);
    return dr_cuda_check(cudaGetLastError(), "sampler launch", err);
}

/* ---- the contract's check of dr_expf_det on the device ---- */
__global__ void expf_eval_kernel(const float *x, int64_t n, float *y, int device_expf) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = device_expf ? expf(x[i]) : dr_expf_det(x[i]);
}

extern "C" drama_status dr_cuda_expf_det_eval(dr_cuda *c, const float *x, int64_t n, float *y, int device_expf,
                                              drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    expf_eval_kernel<<<1024, 256, 0, c->stream>>>(x, n, y, device_expf);
    return dr_cuda_check(cudaGetLastError(), "expf_det launch", err);
}
