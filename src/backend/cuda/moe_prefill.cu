/* moe_prefill.cu - the MoE layer's experts for many rows, grouped by expert (docs/cuda.md "MoE
 * prefill"): after routing, one block lists for every used expert the (row, rank) pairs that chose
 * it; then gate/up/SwiGLU and down run per used expert, each warp streaming one weight row once for
 * up to GRP_NT of its pairs (the shared expert: once for all rows), and a last launch combines each
 * row's ranks in rank order with the routing weights, the sigmoid-gated shared expert and the
 * residual add. Each pair's dot product is warp_row_dot's arithmetic (the same chunk order, fmaf
 * chain and xor tree) and the combine is moe_down_kernel's, so every output equals the per-row
 * path's (moe.cu) bit for bit; only how often a weight is read changes. Grids are sized from n on
 * the host (blocks past the used experts leave), so a call is capturable. */
#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/moe_internal.h"

#define GRP_NT 4        /* pairs sharing one pass over a weight row (4: registers and compile time) */
#define GRP_WARPS 4     /* output rows per block */
#define BUCKET_THREADS 1024
#define COMBINE_THREADS 256
#define WK_NP 2         /* pairs a tile of the walk kernels (moe_grouped_walk.cuh): a gate/up tile's x in 128 registers */

/* ---- the used experts and their pairs (one block) ---- */

__global__ void __launch_bounds__(BUCKET_THREADS)
moe_bucket_kernel(int64_t npairs, int n_kept, const int32_t *slots, int32_t *used, int32_t *ustart, int32_t *ucount,
                  int32_t *pairs, int32_t *vt) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    extern __shared__ int bsm[]; /* cnt [n_kept] | fill [n_kept] */
    int *cnt = bsm, *fill = bsm + n_kept;
    for (int e = threadIdx.x; e < n_kept; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < npairs; p += blockDim.x) {
        int s = slots[p];
        if (s >= 0 && s < n_kept) atomicAdd(&cnt[s], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0: used experts in slot order, their starts and tiles (exclusive scans) */
        const int lane = threadIdx.x, per = (n_kept + 31) / 32;
        const int e0 = min(lane * per, n_kept), e1 = min(e0 + per, n_kept);
        int nu = 0, tot = 0, nv = 0;
        for (int e = e0; e < e1; e++)
            if (cnt[e]) nu++, tot += cnt[e], nv += (cnt[e] + WK_NP - 1) / WK_NP;
        int su = nu, st = tot, sv = nv;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            int a = __shfl_up_sync(0xFFFFFFFFu, su, off), b = __shfl_up_sync(0xFFFFFFFFu, st, off);
            int c = __shfl_up_sync(0xFFFFFFFFu, sv, off);
            if (lane >= off) su += a, st += b, sv += c;
        }
        su -= nu, st -= tot, sv -= nv;
        for (int e = e0; e < e1; e++)
            if (cnt[e]) {
                used[2 + su] = e, ustart[su] = st, ucount[su] = cnt[e], fill[e] = st;
                for (int j = 0; j < cnt[e]; j += WK_NP, sv++) /* the walk kernels' tiles: slot, first pair, count */
                    vt[3 * sv] = e, vt[3 * sv + 1] = st + j, vt[3 * sv + 2] = min(WK_NP, cnt[e] - j);
                su++, st += cnt[e];
            }
        if (lane == 31) used[0] = su, used[1] = sv;
    }
    __syncthreads();
    /* the order of pairs inside an expert's list does not change any value (each pair is its own sum) */
    for (int64_t p = threadIdx.x; p < npairs; p += blockDim.x) {
        int s = slots[p];
        if (s >= 0 && s < n_kept) pairs[atomicAdd(&fill[s], 1)] = (int32_t)p;
    }
}

/* ---- one weight row against up to NT activation rows ---- */

/* chunk_dot's arithmetic with the activation rows given by pointer */
template <int FMT, int NT, bool TAIL>
__device__ __forceinline__ void chunk_dot_ptr(const mv_job &J, int64_t row, int64_t ch, uint4 v, const float *const (&xp)[NT],
                                              int nt, float (&acc)[NT]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const int64_t c0 = ch * EPC;
    const int lim = TAIL ? (int)(J.cols - c0) : EPC;
    float w[EPC];
    decode<FMT, TAIL, 0>(J, row, c0, v, lim, w);
#pragma unroll
    for (int j = 0; j < NT; j++) {
        if (j < nt) {
            const float *xr = xp[j] + c0;
            if (!TAIL && J.x_vec) {
#pragma unroll
                for (int e = 0; e < EPC; e += 4) {
                    float4 xv = __ldg(reinterpret_cast<const float4 *>(xr + e));
                    acc[j] = fmaf(w[e], xv.x, acc[j]);
                    acc[j] = fmaf(w[e + 1], xv.y, acc[j]);
                    acc[j] = fmaf(w[e + 2], xv.z, acc[j]);
                    acc[j] = fmaf(w[e + 3], xv.w, acc[j]);
                }
            } else {
#pragma unroll
                for (int e = 0; e < EPC; e++)
                    if (e < lim) acc[j] = fmaf(w[e], __ldg(xr + e), acc[j]);
            }
        }
    }
}

/* warp_row_dot for nt <= NT activation rows at once: the weight row is streamed once */
template <int FMT, int NT>
__device__ __forceinline__ void rows_dot(const mv_job &J, int64_t row, const float *const (&xp)[NT], int nt, int lane,
                                         float (&acc)[NT]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    const uint8_t *wrow = J.data + row * J.pitch;
    const int64_t nfull = J.cols / EPC, nch = (J.cols + EPC - 1) / EPC;
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j] = 0.0f;
    for (int64_t base = lane; base < nch; base += 32 * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int64_t ch = base + 32 * k;
            if (ch < nch) v[k] = ld_stream(wrow + ch * 16);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int64_t ch = base + 32 * k;
            if (ch < nfull) chunk_dot_ptr<FMT, NT, false>(J, row, ch, v[k], xp, nt, acc);
            else if (ch < nch) chunk_dot_ptr<FMT, NT, true>(J, row, ch, v[k], xp, nt, acc);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(0xFFFFFFFFu, acc[j], off);
    }
}

template <int NT>
__device__ __forceinline__ void rows_dot_any(const mv_job &J, int64_t row, const float *const (&xp)[NT], int nt, int lane,
                                             float (&acc)[NT]) {
    mv_fmt_switch(J.fmt, [&](auto F) { rows_dot<decltype(F)::value, NT>(J, row, xp, nt, lane, acc); });
}

/* Block (output rows, u): u < umax the u-th used expert (leaves when u >= used[0]), u == umax the
 * shared expert over all n rows. Pair p = row k + rank; the shared expert's pair of row i is n k + i. */
struct grp_sel {
    const moe_expert *ex;
    int64_t p0, cnt, width;
    int shared;
};

__device__ __forceinline__ bool grp_select(int64_t u, int64_t umax, int64_t n, const int32_t *used, const int32_t *ustart,
                                           const int32_t *ucount, const moe_expert *experts, const moe_expert *shared,
                                           int64_t width_routed, int64_t width_shared, grp_sel *s) {
    if (u < umax) {
        if (u >= used[0]) return false;
        s->ex = &experts[used[2 + u]], s->p0 = ustart[u], s->cnt = ucount[u], s->width = width_routed, s->shared = 0;
    } else {
        s->ex = shared, s->p0 = 0, s->cnt = n, s->width = width_shared, s->shared = 1;
    }
    return true;
}

__global__ void __launch_bounds__(GRP_WARPS * 32)
moe_gu_grouped_kernel(int defect, int64_t n, int k, int64_t umax, const int32_t *used, const int32_t *ustart, const int32_t *ucount,
                      const int32_t *pairs, const moe_expert *experts, moe_expert shared, int64_t I, int64_t Is,
                      int64_t W, int64_t H, const float *x, float *act) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * GRP_WARPS + (threadIdx.x >> 5);
    grp_sel s;
    if (!grp_select(blockIdx.y, umax, n, used, ustart, ucount, experts, &shared, I, Is, &s)) return;
    if (r >= s.width) return; /* whole warps */
    const int64_t cnt = defect == 1 ? min(s.cnt, (int64_t)GRP_NT) : s.cnt; /* planted (contract): one tile per expert */
    for (int64_t t0 = 0; t0 < cnt; t0 += GRP_NT) {
        const int nt = (int)min((int64_t)GRP_NT, s.cnt - t0);
        const float *xp[GRP_NT];
        int64_t jy[GRP_NT];
#pragma unroll
        for (int j = 0; j < GRP_NT; j++) {
            int64_t p = j < nt ? (s.shared ? n * k + t0 + j : pairs[s.p0 + t0 + j]) : 0;
            int64_t row = s.shared ? t0 + j : p / k;
            jy[j] = p;
            xp[j] = x + (j < nt ? row : 0) * H;
        }
        float g[GRP_NT], u[GRP_NT];
        rows_dot_any<GRP_NT>(s.ex->gate, r, xp, nt, lane, g);
        rows_dot_any<GRP_NT>(s.ex->up, s.ex->up_row0 + r, xp, nt, lane, u);
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < GRP_NT; j++)
                if (j < nt) act[jy[j] * W + r] = fmul(dsilu(g[j]), u[j]); /* dr_op_swiglu */
        }
    }
}

__global__ void __launch_bounds__(GRP_WARPS * 32)
moe_down_grouped_kernel(int64_t n, int k, int64_t umax, const int32_t *used, const int32_t *ustart, const int32_t *ucount,
                        const int32_t *pairs, const moe_expert *experts, moe_expert shared, int64_t W, int64_t H,
                        const float *act, float *ydn) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int lane = threadIdx.x & 31;
    const int64_t h = (int64_t)blockIdx.x * GRP_WARPS + (threadIdx.x >> 5);
    grp_sel s;
    if (!grp_select(blockIdx.y, umax, n, used, ustart, ucount, experts, &shared, H, H, &s)) return;
    if (h >= H) return;
    for (int64_t t0 = 0; t0 < s.cnt; t0 += GRP_NT) {
        const int nt = (int)min((int64_t)GRP_NT, s.cnt - t0);
        const float *xp[GRP_NT];
        int64_t jy[GRP_NT];
#pragma unroll
        for (int j = 0; j < GRP_NT; j++) {
            int64_t p = j < nt ? (s.shared ? n * k + t0 + j : pairs[s.p0 + t0 + j]) : 0;
            jy[j] = p;
            xp[j] = act + p * W;
        }
        float y[GRP_NT];
        rows_dot_any<GRP_NT>(s.ex->down, h, xp, nt, lane, y);
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < GRP_NT; j++)
                if (j < nt) ydn[jy[j] * H + h] = y[j];
        }
    }
}

#include "backend/cuda/moe_grouped_staged.cuh"
#include "backend/cuda/moe_grouped_walk.cuh"

/* moe_down_kernel's combine: ranks in order, then the gated shared expert, then the residual */
__global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine_kernel(int64_t n, int k, const int32_t *slots, const float *wsel, const float *sg, const float *ydn, int64_t H,
                   float *out, int add) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int64_t i = blockIdx.y, h = (int64_t)blockIdx.x * COMBINE_THREADS + threadIdx.x;
    if (h >= H) return;
    float o = 0.0f;
    for (int r = 0; r < k; r++)
        if (slots[i * k + r] >= 0) o = fadd(o, fmul(wsel[i * k + r], ydn[(i * k + r) * H + h]));
    o = fadd(o, fmul(dsigmoid(sg[i]), ydn[(n * k + i) * H + h]));
    float *dst = out + i * H + h;
    *dst = add ? fadd(*dst, o) : o;
}

extern "C" void dr_cuda_moe_set_group_defect(struct dr_cuda_moe *m, int defect) {
    if (!m) return;
    m->group_defect = defect;
    /* each control runs the kernels it is planted in: 1 the first ones, 2 the staged, 3-4 the walk */
    if (defect == 1) m->group_kind = MOE_GROUP_OLD;
    if (defect == 2) m->group_kind = MOE_GROUP_STAGED;
    if (defect == 3 || defect == 4) m->group_kind = MOE_GROUP_WALK;
}

extern "C" void dr_cuda_moe_set_walk_blocks(struct dr_cuda_moe *m, int blocks) {
    if (m) m->walk_blocks = blocks > 0 ? blocks : 0;
}

extern "C" int64_t dr_cuda_moe_walk_calls(const struct dr_cuda_moe *m) {
    return m && m->group_kind == MOE_GROUP_WALK ? m->walk_calls : -1;
}

drama_status dr_cuda_moe_grouped(dr_cuda *c, const dr_cuda_moe *m, int64_t n, const float *x, float *out, int add,
                                 const moe_ws *w, drama_error *err) {
    const int64_t npairs = n * m->topk;
    const int64_t umax = npairs < m->n_kept ? npairs : m->n_kept;
    if (umax + 1 > 65535) return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA MoE grouped: %lld experts", (long long)umax);
    drama_status s;
    dr_launch(c->pdl, moe_bucket_kernel, 1, BUCKET_THREADS, (size_t)2 * m->n_kept * sizeof(int), c->stream, npairs,
              m->n_kept, w->slots, w->used, w->ustart, w->ucount, w->pairs, w->vt);
    if ((s = dr_cuda_check(cudaGetLastError(), "MoE bucket launch", err))) return s;
    int64_t wmax = m->I > m->Is ? m->I : m->Is;
    /* the staged kernels (moe_grouped_staged.cuh): one routed format per weight kind, whole chunks, a tile in 48 KiB */
    /* the walk kernels (moe_grouped_walk.cuh, the default): one routed format per kind, a lane's x in registers */
    const bool walk = m->group_kind == MOE_GROUP_WALK && m->down_fmt >= 0 && m->gu_fmt >= 0 && wk_fits_gu(m->gu_fmt, m->H) &&
                      wk_fits_gu(m->shared.gate.fmt, m->H) && m->shared.up.fmt == m->shared.gate.fmt &&
                      wk_fits_dn(m->down_fmt, m->I) && wk_fits_dn(m->shared.down.fmt, m->Is) &&
                      wk_items_fit(n, m->topk, m->H > wmax ? m->H : wmax);
    const bool staged = m->group_kind == MOE_GROUP_STAGED && m->down_fmt >= 0 && m->gu_fmt >= 0 && m->H % 32 == 0 && m->I % 32 == 0 && m->Is % 32 == 0 &&
                        gs_smem(m->H) <= GS_SMEM_MAX && gs_smem(wmax) <= GS_SMEM_MAX;
    if (walk) { /* routed tiles then the shared expert's, each kind in its format: four launches */
        const wk_args wa = {m->group_defect, n, m->topk, w->used, w->vt, w->pairs, m->experts, m->shared,
                            m->I, m->Is, m->W, m->H};
        const int sms = c->info.sm_count, cap = m->walk_blocks;
        cudaError_t e = wk_launch(m->gu_fmt, wa, false, 0, sms, cap, c->pdl, x, w->act, c->stream);
        if (e == cudaSuccess) e = wk_launch(m->shared.gate.fmt, wa, false, 1, sms, cap, c->pdl, x, w->act, c->stream);
        if ((s = dr_cuda_check(e, "MoE walk gate/up launch", err))) return s;
        e = wk_launch(m->down_fmt, wa, true, 0, sms, cap, c->pdl, w->act, w->ydn, c->stream);
        if (e == cudaSuccess) e = wk_launch(m->shared.down.fmt, wa, true, 1, sms, cap, c->pdl, w->act, w->ydn, c->stream);
        if ((s = dr_cuda_check(e, "MoE walk down launch", err))) return s;
        m->walk_calls++;
    } else if (staged) { /* routed experts then the shared one, each kind in its format: four launches */
        const gs_args ga = {m->group_defect, n, m->topk, umax, w->used, w->ustart, w->ucount, w->pairs, m->experts,
                            m->shared, m->I, m->Is, m->W, m->H, c->pdl};
        cudaError_t e = gs_launch(m->gu_fmt, ga, false, 0, umax, x, w->act, c->stream);
        if (e == cudaSuccess) e = gs_launch(m->shared.gate.fmt, ga, false, umax, 1, x, w->act, c->stream);
        if ((s = dr_cuda_check(e, "MoE staged gate/up launch", err))) return s;
        e = gs_launch(m->down_fmt, ga, true, 0, umax, w->act, w->ydn, c->stream);
        if (e == cudaSuccess) e = gs_launch(m->shared.down.fmt, ga, true, umax, 1, w->act, w->ydn, c->stream);
        if ((s = dr_cuda_check(e, "MoE staged down launch", err))) return s;
    } else {
        dim3 g1((unsigned)((wmax + GRP_WARPS - 1) / GRP_WARPS), (unsigned)(umax + 1));
        dr_launch(c->pdl, moe_gu_grouped_kernel, g1, GRP_WARPS * 32, 0, c->stream, m->group_defect, n, m->topk, umax,
                  w->used, w->ustart, w->ucount, w->pairs, m->experts, m->shared, m->I, m->Is, m->W, m->H, x, w->act);
        if ((s = dr_cuda_check(cudaGetLastError(), "MoE grouped gate/up launch", err))) return s;
        dim3 g2((unsigned)((m->H + GRP_WARPS - 1) / GRP_WARPS), (unsigned)(umax + 1));
        dr_launch(c->pdl, moe_down_grouped_kernel, g2, GRP_WARPS * 32, 0, c->stream, n, m->topk, umax, w->used, w->ustart,
                  w->ucount, w->pairs, m->experts, m->shared, m->W, m->H, w->act, w->ydn);
        if ((s = dr_cuda_check(cudaGetLastError(), "MoE grouped down launch", err))) return s;
    }
    dim3 g3((unsigned)((m->H + COMBINE_THREADS - 1) / COMBINE_THREADS), (unsigned)n);
    dr_launch(c->pdl, moe_combine_kernel, g3, COMBINE_THREADS, 0, c->stream, n, m->topk, w->slots, w->wsel, w->sg,
              w->ydn, m->H, out, add);
    return dr_cuda_check(cudaGetLastError(), "MoE combine launch", err);
}
