/* ops.cu - row norms, the backbone's input embedding, the tower layer input, guidance, and the
 * device status word (cuda_ops.h). One block per row; sums of squares in double as the CPU does
 * (backend/cpu/ops.c), so norms differ from the CPU only by the order of that double sum. */
#include <stdio.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/dev_common.cuh"

#define NORM_THREADS 256

extern "C" drama_status dr_cuda_status_check(dr_cuda *c, dr_cuda_status *dev, const char *what, drama_error *err) {
    dr_cuda_status h = {0, 0, 0};
    drama_status st = dr_cuda_to_host(c, &h, dev, sizeof h, err);
    if (st) return st;
    if (h.code == DR_CUDA_ERR_NONE) return DRAMA_OK;
    static const dr_cuda_status zero = {0, 0, 0};
    if ((st = dr_cuda_to_device(c, dev, &zero, sizeof zero, err))) return st;
    const char *w = what ? what : "CUDA step";
    switch (h.code) {
    case DR_CUDA_ERR_ROUTER:
        return dr_fail(err, DRAMA_ENUMERIC, "%s: layer %d, row %d: router produced no finite score", w, h.a, h.b);
    case DR_CUDA_ERR_LOGIT_NAN:
        return dr_fail(err, DRAMA_ENUMERIC, "%s: row %d: logit of candidate %d is NaN", w, h.b, h.a);
    case DR_CUDA_ERR_LOGIT_INF:
        return dr_fail(err, DRAMA_ENUMERIC, "%s: row %d: logit of candidate %d is +inf", w, h.b, h.a);
    case DR_CUDA_ERR_EXCLUDED:
        return dr_fail(err, DRAMA_ENUMERIC, "%s: row %d: every candidate is excluded (-inf)", w, h.b);
    case DR_CUDA_ERR_TOKEN:
        return dr_fail(err, DRAMA_EINVAL, "%s: row %d: token id %d outside the embedding", w, h.b, h.a);
    case DR_CUDA_ERR_CODE:
        return dr_fail(err, DRAMA_EINVAL, "%s: row %d: code %d outside its code table", w, h.b, h.a);
    default: return dr_fail(err, DRAMA_EINTERNAL, "%s: device error %d (%d, %d)", w, h.code, h.a, h.b);
    }
}

/* ---- rms norm ---- */

/* Rows up to NORM_REG * NORM_THREADS wide keep their elements in registers: thread t holds
 * elements t + k NORM_THREADS, loaded (row and weights) all at once before the reduction instead
 * of the weights after it. The sum, r and the products are block_rms_norm's, in its order. */
#define NORM_REG 8

__device__ __forceinline__ void reg_load(const float *x, int n, float fill, float *v) {
#pragma unroll
    for (int k = 0; k < NORM_REG; k++) {
        const int i = threadIdx.x + k * NORM_THREADS;
        v[k] = x && i < n ? x[i] : fill;
    }
}

/* y = block_rms_norm(x, w) with x in xv and w in wv (has_w: w != NULL); x and y may alias */
__device__ __forceinline__ void reg_rms_norm(const float *xv, const float *wv, bool has_w, double eps, int n, float *y,
                                             double *sh) {
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_REG; k++)
        if (threadIdx.x + k * NORM_THREADS < n) ss += (double)xv[k] * (double)xv[k];
    ss = block_sum_d(ss, sh);
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
#pragma unroll
    for (int k = 0; k < NORM_REG; k++) {
        const int i = threadIdx.x + k * NORM_THREADS;
        if (i < n) y[i] = has_w ? fmul(fmul(xv[k], r), wv[k]) : fmul(xv[k], r);
    }
}

__global__ void __launch_bounds__(NORM_THREADS) rms_norm_kernel(const float *x, int64_t x_ld, const float *w, double eps,
                                                                int dim, float *y, int64_t y_ld) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    if (dim > NORM_REG * NORM_THREADS) {
        block_rms_norm(x + r * x_ld, w, eps, dim, y + r * y_ld, sh);
        return;
    }
    float xv[NORM_REG], wv[NORM_REG];
    reg_load(x + r * x_ld, dim, 0.0f, xv);
    reg_load(w, dim, 1.0f, wv);
    reg_rms_norm(xv, wv, w != NULL, eps, dim, y + r * y_ld, sh);
}

extern "C" drama_status dr_cuda_rms_norm(dr_cuda *c, const float *x, int64_t x_ld, const float *w, double eps, int64_t n,
                                         int64_t dim, float *y, int64_t y_ld, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!x || !y || dim <= 0 || dim > INT32_MAX || x_ld < dim || y_ld < dim)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_rms_norm: bad arguments (dim %lld)", (long long)dim);
    dr_launch(c->pdl, rms_norm_kernel, (unsigned)n, NORM_THREADS, 0, c->stream, x, x_ld, w, eps, (int)dim, y, y_ld);
    return dr_cuda_check(cudaGetLastError(), "rms_norm launch", err);
}

/* ---- the backbone's input rows ---- */

/* One block per row: the text row's embedding is the dequantised row; an audio row sums its rows
 * in double (token row first, then codebooks 0..n-1) and rounds once after the scale. */
__global__ void __launch_bounds__(NORM_THREADS) embed_kernel(mv_job tok, mv_job codes, dr_cuda_embed_params p,
                                                             const int32_t *rows, float *x, dev_status *st) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float tmp[]; /* [H] */
    const int64_t r = blockIdx.x, H = tok.cols;
    const int32_t *row = rows + r * p.width;
    int64_t t = row[0];
    float *xr = x + r * H;
    if (t < 0 || t >= tok.r1) {
        if (threadIdx.x == 0) dev_fail(st, DR_CUDA_ERR_TOKEN, (int)t, (int)r);
        for (int64_t j = threadIdx.x; j < H; j += blockDim.x) xr[j] = 0.0f;
        return;
    }
    int audio = p.sem_start >= 0 && t >= p.sem_start && t < p.sem_start + p.n_sem;
    if (!audio) {
        dequant_row_any(tok, t, xr, threadIdx.x, blockDim.x);
        return;
    }
    /* each thread keeps the double sums of the columns it owns; at most 8 per thread (H <= 2048
     * at 256 threads) stay in registers, more loop through the same code */
    for (int64_t j0 = 0; j0 < H; j0 += (int64_t)blockDim.x * 8) {
        double acc[8];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = 0.0;
        for (int k = -1; k < p.in_codebooks; k++) {
            if (k < 0 && !p.add_token) continue;
            int64_t src;
            const mv_job *J;
            if (k < 0) {
                src = t;
                J = &tok;
            } else {
                int32_t code = row[1 + k];
                src = (int64_t)code + (int64_t)k * p.code_stride;
                if (code < 0 || code >= p.code_stride || src >= codes.r1) {
                    if (threadIdx.x == 0) dev_fail(st, DR_CUDA_ERR_CODE, code, (int)r);
                    src = -1;
                }
                J = &codes;
            }
            __syncthreads(); /* tmp is rewritten */
            if (src >= 0) dequant_row_any(*J, src, tmp, threadIdx.x, blockDim.x);
            __syncthreads();
            if (src < 0) continue;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                int64_t j = j0 + (int64_t)e * blockDim.x + threadIdx.x;
                if (j < H) acc[e] = __dadd_rn(acc[e], (double)tmp[j]);
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int64_t j = j0 + (int64_t)e * blockDim.x + threadIdx.x;
            if (j < H) xr[j] = (float)__dmul_rn(acc[e], p.scale);
        }
    }
}

extern "C" drama_status dr_cuda_embed(dr_cuda *c, const dr_cuda_weight *tok, const dr_cuda_weight *code_table,
                                      const dr_cuda_embed_params *p, const int32_t *rows, int64_t n, float *x,
                                      dr_cuda_status *st, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!tok || !p || !rows || !x || p->width < 1 || p->in_codebooks < 0 || p->in_codebooks + 1 > p->width)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_embed: bad arguments");
    if (p->in_codebooks > 0 && (!code_table || code_table->cols != tok->cols))
        return dr_fail(err, DRAMA_ESHAPE, "dr_cuda_embed: code table missing or of another width than %s", tok->name);
    mv_job tj = dr_cuda_weight_view(tok), cj;
    memset(&cj, 0, sizeof cj);
    if (code_table) cj = dr_cuda_weight_view(code_table);
    size_t shm = (size_t)tok->cols * sizeof(float);
    if (shm > 48 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_embed: hidden %lld too wide", (long long)tok->cols);
    dr_launch(c->pdl, embed_kernel, (unsigned)n, NORM_THREADS, shm, c->stream, tj, cj, *p, rows, x, (dev_status *)st);
    return dr_cuda_check(cudaGetLastError(), "embed launch", err);
}

/* ---- the tower layer input ---- */

__global__ void __launch_bounds__(NORM_THREADS) tower_input_kernel(mv_job table, dr_cuda_tower_in p, const int32_t *codes,
                                                                   int64_t codes_ld, const uint8_t *mask, const float *h,
                                                                   float *x, dev_status *st, dr_op_status *rst, int layer) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ float e[]; /* [de] */
    __shared__ double sh[32];
    const int64_t r = blockIdx.x, xw = (int64_t)p.de + p.dh;
    float *xr = x + r * xw;
    float *xe = p.hidden_first ? xr + p.dh : xr, *xh = p.hidden_first ? xr : xr + p.de;
    const int32_t code = codes[r * codes_ld]; /* read with the mask, not after it (in bounds either way) */
    int on = !p.mask_off && (!mask || mask[r]);
    int64_t src = -1;
    if (on) {
        src = (int64_t)code + (int64_t)p.slot * p.code_stride;
        if (code < 0 || code >= p.code_stride || src >= table.r1) {
            if (threadIdx.x == 0) dev_fail(st, DR_CUDA_ERR_CODE, code, (int)r);
            if (threadIdx.x == 0 && rst && !rst[r].code) /* the seam: per row, the first failure kept */
                rst[r].code = DRAMA_EINVAL, rst[r].fault = DR_FAULT_CODE, rst[r].a = code, rst[r].b = p.slot,
                rst[r].c = layer;
            src = -1;
        }
    }
    /* the hidden row and both norms' weights in registers before the code's row is read (it
     * waits on the code): their loads overlap that chain instead of following it */
    const bool reg = p.de <= NORM_REG * NORM_THREADS && p.dh <= NORM_REG * NORM_THREADS;
    float hv[NORM_REG], hw[NORM_REG], ew[NORM_REG];
    if (reg) {
        reg_load(h + r * p.dh, p.dh, 0.0f, hv);
        reg_load(p.hnorm, p.dh, 1.0f, hw);
        reg_load(src >= 0 ? p.enorm : NULL, p.de, 1.0f, ew);
    }
    if (src >= 0) {
        dequant_row_any(table, src, e, threadIdx.x, blockDim.x);
        __syncthreads();
        if (reg) {
            float ev[NORM_REG];
            reg_load(e, p.de, 0.0f, ev);
            reg_rms_norm(ev, ew, p.enorm != NULL, p.eps, p.de, xe, sh);
        } else
            block_rms_norm(e, p.enorm, p.eps, p.de, xe, sh);
    } else {
        for (int j = threadIdx.x; j < p.de; j += blockDim.x) xe[j] = 0.0f;
    }
    if (reg) reg_rms_norm(hv, hw, p.hnorm != NULL, p.eps, p.dh, xh, sh);
    else block_rms_norm(h + r * p.dh, p.hnorm, p.eps, p.dh, xh, sh);
}

static drama_status tower_input(dr_cuda *c, const dr_cuda_tower_in *p, int64_t n, const int32_t *codes, int64_t codes_ld,
                                const uint8_t *mask, const float *h, float *x, dr_cuda_status *st, dr_op_status *rst,
                                int layer, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (!p || !p->code_table || !codes || !h || !x || p->de <= 0 || p->dh <= 0 || p->code_table->cols != p->de)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_tower_input: bad arguments");
    size_t shm = (size_t)p->de * sizeof(float);
    if (shm > 48 * 1024) return dr_fail(err, DRAMA_EUNSUPPORTED, "dr_cuda_tower_input: code width %d too wide", p->de);
    mv_job tj = dr_cuda_weight_view(p->code_table);
    dr_launch(c->pdl, tower_input_kernel, (unsigned)n, NORM_THREADS, shm, c->stream, tj, *p, codes, codes_ld, mask, h,
              x, (dev_status *)st, rst, layer);
    return dr_cuda_check(cudaGetLastError(), "tower input launch", err);
}

extern "C" drama_status dr_cuda_tower_input(dr_cuda *c, const dr_cuda_tower_in *p, int64_t n, const int32_t *codes,
                                            int64_t codes_ld, const uint8_t *mask, const float *h, float *x,
                                            dr_cuda_status *st, drama_error *err) {
    return tower_input(c, p, n, codes, codes_ld, mask, h, x, st, NULL, 0, err);
}

extern "C" drama_status dr_cuda_tower_input_rows(dr_cuda *c, const dr_cuda_tower_in *p, int layer, int64_t n,
                                                 const int32_t *codes, int64_t codes_ld, const uint8_t *mask,
                                                 const float *h, float *x, dr_op_status *rstatus, drama_error *err) {
    return tower_input(c, p, n, codes, codes_ld, mask, h, x, NULL, rstatus, layer, err);
}

/* ---- guidance ---- */

__global__ void guidance_kernel(const float *cond, const float *uncond, int64_t m, int64_t ld, float gamma, float *out) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    int64_t r = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x) {
        float cv = cond[r * ld + i];
        out[r * ld + i] = (isinf(cv) && cv < 0) ? cv : fadd(cv, fmul(gamma, fsub(cv, uncond[r * ld + i])));
    }
}

extern "C" drama_status dr_cuda_guidance(dr_cuda *c, const float *cond, const float *uncond, int64_t n, int64_t m,
                                         int64_t ld, float gamma, float *out, drama_error *err) {
    if (n <= 0 || m <= 0) return DRAMA_OK;
    if (!cond || !uncond || !out || ld < m) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_guidance: bad arguments");
    dim3 grid((unsigned)((m + 255) / 256 < 64 ? (m + 255) / 256 : 64), (unsigned)n);
    dr_launch(c->pdl, guidance_kernel, grid, 256, 0, c->stream, cond, uncond, m, ld, gamma, out);
    return dr_cuda_check(cudaGetLastError(), "guidance launch", err);
}
