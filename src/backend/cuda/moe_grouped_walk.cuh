/* moe_grouped_walk.cuh - the grouped MoE expert kernels (moe_prefill.cu) as persistent warps that walk
 * (tile, output row) work items with the pairs' activation values in REGISTERS (issue 13; the
 * default grouped kernels, DRAMA_CUDA_MOE_GROUPED=walk; =old and =staged keep the kernels before
 * them). NOT YET MEASURED ON A GPU (docs/cuda.md "Prefill (issue 13)").
 *
 * Why (H200, notes/ncu-moe.md): a 30-row prefill spent 1.3 ms a layer in moe_gu_grouped_kernel and
 * moe_down_grouped_kernel for ~465 MB of weights (~110 us at 4.2 TB/s): each warp took one output row
 * of one expert, re-read every pair's x through L1 for each 16-byte weight chunk (L1 hit 92%, top
 * stall L1TEX scoreboard, 167 registers, 18.75% occupancy, DRAM < 9%). With ~1.5 pairs per used expert
 * this is a "matvec with 1-2 vectors per expert", so it is built as the n = 1 kernels that stream:
 *  - The bucket kernel cuts every used expert's pairs into tiles of WK_NP (its list `vt`: slot,
 *    first pair, count); the shared expert's n rows are ceil(n / WK_NP) tiles on the fly.
 *  - Items: (tile v, output row r) in order, v-major. A grid sized to the SMs (the occupancy the
 *    compiler gives) splits the items into equal contiguous segments, one per warp: a warp works
 *    ~items / warps consecutive rows of (mostly) one tile, so its x is loaded once per tile, and
 *    the tiles of one hot expert go to neighbouring warps at the same time (their weight re-reads
 *    are L2 hits).
 *  - In warp_row_dot's chunk order lane l only ever touches chunks l, l + 32, ... of a row, so the
 *    x a lane needs of a pair is fixed: K / 32 values (64 for gate/up at K = H = 2048 in every
 *    format; 16-32 for down at K = 512), held in registers for the tile.
 *  - Each warp issues the NEXT batch of weight loads (the rest of this row, or the next item's first
 *    batch, in the next tile's expert if it changes) before it dots the current one: gate and up
 *    rows together (WK_GU_BL chunks per lane each), down WK_DN_L loads per lane (8 FP8 rows of 512).
 * Values: each pair's dot is rows_dot's / warp_row_dot's: lane l adds its chunks in order through one
 * fmaf chain per pair (decode, then w[e] * x[e] for e ascending), then the same xor tree; SwiGLU and
 * the act / ydn layout are moe_gu_grouped_kernel's and moe_down_grouped_kernel's, so every output is
 * the old kernels' and the per-row path's bit for bit (the contract's moe.* entries compare grouped
 * with per row exactly). Only where x comes from (registers) and when loads are issued differ.
 * Taken when every routed expert has one format per weight kind (gu_fmt, down_fmt), rows are whole
 * chunks and a lane's x fits: K <= 64 / EPC chunks a lane for gate/up (H <= 2048), down
 * K <= 32 WK_DN_CPL EPC (512; 1024 for 4-bit formats); otherwise the old kernels run.
 * group_defect (the contract's controls): 3 = the gate/up walk keeps the previous tile's x when its
 * segment enters a new tile (stale registers); 4 = the same in the down walk. */
#ifndef DRAMA_BACKEND_CUDA_MOE_GROUPED_WALK_CUH
#define DRAMA_BACKEND_CUDA_MOE_GROUPED_WALK_CUH

#define WK_WARPS 8  /* warps per block */
#define WK_GU_X 64  /* x values per lane per pair, gate/up: H <= 32 * 64 = 2048 in any format */
#define WK_GU_BL 4  /* gate/up: chunks per lane of the gate row and of the up row per batch */
#define WK_DN_L 8   /* down: loads per lane per item (WK_DN_L / WK_DN_CPL rows, all their chunks) */
/* WK_NP (pairs a tile, moe_prefill.cu): 2 keeps a gate/up tile's x in 128 registers */

/* down chunks per lane: K = 512 in one item for every format (4-bit formats: one chunk, up to 1024) */
__host__ __device__ constexpr int wk_dn_cpl(int epc) { return epc >= 16 ? 1 : 16 / epc; }

/* whether the walk kernels take a kind of weight of format fmt and width K */
static bool wk_fits_gu(int fmt, int64_t K) {
    const int epc = moe_epc(fmt);
    return fmt >= 0 && K > 0 && K % epc == 0 && K / epc <= 32 * (WK_GU_X / epc);
}
/* the walk's 32-bit item counters: tiles (<= n k + n) times output rows (or row groups) */
static bool wk_items_fit(int64_t n, int k, int64_t rows) { return (n * (k + 1) + 1) * (rows + 1) < ((int64_t)1 << 31); }
static bool wk_fits_dn(int fmt, int64_t K) {
    const int epc = moe_epc(fmt);
    return fmt >= 0 && K > 0 && K % epc == 0 && K / epc <= 32 * wk_dn_cpl(epc);
}

struct wk_args {
    int defect;
    int64_t n;
    int k;
    const int32_t *used, *vt, *pairs;
    const moe_expert *experts;
    moe_expert shared;
    int64_t I, Is, W, H;
};

/* tile v: its expert, pair count and the act row / x row of its pair j (sh: the shared expert's tiles) */
struct wk_tile { /* 32-bit counters: items < 2^31 (wk_items_fit), fewer registers */
    const moe_expert *ex;
    int p0, nt;
};

__device__ __forceinline__ wk_tile wk_tile_of(const wk_args &a, int sh, int v) {
    wk_tile t;
    if (sh) {
        t.ex = &a.shared, t.p0 = v * WK_NP, t.nt = min(WK_NP, (int)a.n - v * WK_NP);
    } else {
        t.ex = &a.experts[a.vt[3 * v]], t.p0 = a.vt[3 * v + 1], t.nt = a.vt[3 * v + 2];
    }
    return t;
}

/* pair j of tile t: act / ydn row (jy) and x row */
__device__ __forceinline__ int wk_jy(const wk_args &a, int sh, const wk_tile &t, int j) {
    return sh ? (int)a.n * a.k + t.p0 + j : a.pairs[t.p0 + j];
}

/* lane's x of the tile's pairs: chunk ch = lane + 32 q at xr[j][q EPC ..] (rows of `cols` values at
 * src + row * ld; row = x row for gate/up, the pair's act row for down) */
template <int EPC, int CPL>
__device__ __forceinline__ void wk_load_x(const float *src, int64_t ld, const int (&row)[WK_NP], int nt, int nch,
                                          int lane, float (&xr)[WK_NP][CPL * EPC]) {
#pragma unroll
    for (int j = 0; j < WK_NP; j++) {
        if (j < nt) {
            const float *xp = src + row[j] * ld;
#pragma unroll
            for (int q = 0; q < CPL; q++) {
                const int ch = lane + 32 * q;
                if (ch < nch) {
#pragma unroll
                    for (int e = 0; e < EPC; e += 4) {
                        const float4 v = __ldg(reinterpret_cast<const float4 *>(xp + ch * EPC + e));
                        xr[j][q * EPC + e] = v.x, xr[j][q * EPC + e + 1] = v.y;
                        xr[j][q * EPC + e + 2] = v.z, xr[j][q * EPC + e + 3] = v.w;
                    }
                }
            }
        }
    }
}

/* one chunk (its xr values at xq) of a row against the tile's pairs: chunk_dot_ptr's fmaf chain */
template <int FMT, int XN>
__device__ __forceinline__ void wk_chunk(const mv_job &J, int64_t row, int64_t ch, uint4 v, const float (&xr)[WK_NP][XN],
                                         int q, int nt, float (&acc)[WK_NP]) {
    constexpr int EPC = fmt_traits<FMT>::EPC;
    float w[EPC];
    decode<FMT, false, 0>(J, row, ch * EPC, v, EPC, w);
#pragma unroll
    for (int j = 0; j < WK_NP; j++) {
        if (j < nt) {
#pragma unroll
            for (int e = 0; e < EPC; e++) acc[j] = fmaf(w[e], xr[j][q * EPC + e], acc[j]);
        }
    }
}

__device__ __forceinline__ void wk_tree(float (&acc)[WK_NP]) {
#pragma unroll
    for (int j = 0; j < WK_NP; j++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(0xFFFFFFFFu, acc[j], off);
    }
}

/* this warp's segment [t, te) of the `total` items (equal contiguous shares of the grid's warps) */
__device__ __forceinline__ bool wk_segment(int total, int &t, int &te) {
    const int nw = (int)gridDim.x * WK_WARPS, gw = (int)blockIdx.x * WK_WARPS + (int)(threadIdx.x >> 5);
    const int per = (total + nw - 1) / nw;
    t = gw * per, te = min(t + per, total);
    return t < te;
}

/* ---- gate / up / SwiGLU: items (tile v, output row r), batch b = chunks lane + 32 (b BL + i) ---- */

template <int BL>
__device__ __forceinline__ void wk_gu_load(const moe_expert *ex, int r, int b, int lane, int nch, uint4 (&v)[2 * BL]) {
    const uint8_t *g = ex->gate.data + r * ex->gate.pitch, *u = ex->up.data + (ex->up_row0 + r) * ex->up.pitch;
#pragma unroll
    for (int i = 0; i < BL; i++) {
        const int ch = lane + 32 * (b * BL + i);
        if (ch < nch) v[i] = ld_stream(g + ch * 16), v[BL + i] = ld_stream(u + ch * 16);
    }
}

template <int FMT>
__global__ void __launch_bounds__(WK_WARPS * 32, 1)
moe_gu_walk_kernel(const __grid_constant__ wk_args a, int sh, const float *x, float *act) {
    constexpr int EPC = fmt_traits<FMT>::EPC, CPL = WK_GU_X / EPC;
    constexpr int BL = CPL < WK_GU_BL ? CPL : WK_GU_BL, NB = CPL / BL;
    pdl_enter(); /* pdl.cuh: the tile list and x are the previous kernels' */
    const int lane = threadIdx.x & 31;
    const int width = (int)(sh ? a.Is : a.I), nch = (int)(a.H / EPC);
    const int nv = sh ? ((int)a.n + WK_NP - 1) / WK_NP : a.used[1];
    int t, te;
    if (!wk_segment(nv * width, t, te)) return; /* whole warps */
    int v = t / width, r = t - v * width, xv = -1;
    wk_tile T = wk_tile_of(a, sh, v);
    uint4 A[2 * BL], B[2 * BL];
    wk_gu_load<BL>(T.ex, r, 0, lane, nch, A);
    float xr[WK_NP][WK_GU_X];
    int jy[WK_NP];
    for (;;) {
        if (v != xv && !(a.defect == 3 && xv >= 0)) { /* planted 3: the previous tile's x kept */
            int row[WK_NP];
#pragma unroll
            for (int j = 0; j < WK_NP; j++) {
                jy[j] = j < T.nt ? wk_jy(a, sh, T, j) : 0;
                row[j] = sh ? T.p0 + j : jy[j] / a.k;
            }
            wk_load_x<EPC, CPL>(x, a.H, row, T.nt, nch, lane, xr);
        }
        if (v != xv) { /* the act rows are the tile's own even when planted */
#pragma unroll
            for (int j = 0; j < WK_NP; j++) jy[j] = j < T.nt ? wk_jy(a, sh, T, j) : 0;
            xv = v;
        }
        /* the next item (t + 1): row r + 1 of this tile, or row 0 of the next tile */
        const bool more = t + 1 < te;
        int v2 = v, r2 = r + 1;
        if (r2 == width) v2 = v + 1, r2 = 0;
        const wk_tile T2 = more && v2 != v ? wk_tile_of(a, sh, v2) : T;
        float ag[WK_NP], au[WK_NP];
#pragma unroll
        for (int j = 0; j < WK_NP; j++) ag[j] = au[j] = 0.0f;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b + 1 < NB) wk_gu_load<BL>(T.ex, r, b + 1, lane, nch, B);
            else if (more) wk_gu_load<BL>(T2.ex, r2, 0, lane, nch, B);
            const mv_job &G = T.ex->gate, &U = T.ex->up;
            const int64_t ru = T.ex->up_row0 + r;
#pragma unroll
            for (int i = 0; i < BL; i++) {
                const int q = b * BL + i;
                const int ch = lane + 32 * q;
                if (ch < nch) {
                    wk_chunk<FMT, WK_GU_X>(G, r, ch, A[i], xr, q, T.nt, ag);
                    wk_chunk<FMT, WK_GU_X>(U, ru, ch, A[BL + i], xr, q, T.nt, au);
                }
            }
#pragma unroll
            for (int i = 0; i < 2 * BL; i++) A[i] = B[i];
        }
        wk_tree(ag), wk_tree(au);
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < WK_NP; j++)
                if (j < T.nt) act[(int64_t)jy[j] * a.W + r] = fmul(dsilu(ag[j]), au[j]); /* dr_op_swiglu */
        }
        if (!more) break;
        t++, v = v2, r = r2, T = T2;
    }
}

/* ---- down: items (tile v, group g of R output rows h = g R + i), each all R rows' chunks ---- */

template <int R, int CPL>
__device__ __forceinline__ void wk_dn_load(const moe_expert *ex, int h0, int H, int lane, int nch,
                                           uint4 (&v)[R * CPL]) {
    const mv_job &D = ex->down;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (h0 + i < H) {
            const uint8_t *row = D.data + (h0 + i) * D.pitch;
#pragma unroll
            for (int c = 0; c < CPL; c++) {
                const int ch = lane + 32 * c;
                if (ch < nch) v[i * CPL + c] = ld_stream(row + ch * 16);
            }
        }
    }
}

template <int FMT>
__global__ void __launch_bounds__(WK_WARPS * 32, 1)
moe_down_walk_kernel(const __grid_constant__ wk_args a, int sh, const float *act, float *ydn) {
    constexpr int EPC = fmt_traits<FMT>::EPC, CPL = wk_dn_cpl(EPC), R = WK_DN_L / CPL;
    pdl_enter(); /* pdl.cuh: the tile list and act are the previous kernels' */
    const int lane = threadIdx.x & 31;
    const int K = (int)(sh ? a.Is : a.I), nch = K / EPC, H = (int)a.H, ng = (H + R - 1) / R;
    const int nv = sh ? ((int)a.n + WK_NP - 1) / WK_NP : a.used[1];
    int t, te;
    if (!wk_segment(nv * ng, t, te)) return; /* whole warps */
    int v = t / ng, g = t - v * ng, xv = -1;
    wk_tile T = wk_tile_of(a, sh, v);
    uint4 A[R * CPL], B[R * CPL];
    wk_dn_load<R, CPL>(T.ex, g * R, H, lane, nch, A);
    float xr[WK_NP][CPL * EPC];
    int jy[WK_NP];
    for (;;) {
        if (v != xv) {
#pragma unroll
            for (int j = 0; j < WK_NP; j++) jy[j] = j < T.nt ? wk_jy(a, sh, T, j) : 0;
            if (!(a.defect == 4 && xv >= 0)) wk_load_x<EPC, CPL>(act, a.W, jy, T.nt, nch, lane, xr); /* planted 4: stale x */
            xv = v;
        }
        const bool more = t + 1 < te;
        int v2 = v, g2 = g + 1;
        if (g2 == ng) v2 = v + 1, g2 = 0;
        const wk_tile T2 = more && v2 != v ? wk_tile_of(a, sh, v2) : T;
        if (more) wk_dn_load<R, CPL>(T2.ex, g2 * R, H, lane, nch, B);
        const mv_job &D = T.ex->down;
        const int h0 = g * R;
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (h0 + i < H) { /* warp-uniform */
                float acc[WK_NP];
#pragma unroll
                for (int j = 0; j < WK_NP; j++) acc[j] = 0.0f;
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    const int ch = lane + 32 * c;
                    if (ch < nch) wk_chunk<FMT, CPL * EPC>(D, h0 + i, ch, A[i * CPL + c], xr, c, T.nt, acc);
                }
                wk_tree(acc);
                if (lane == 0) {
#pragma unroll
                    for (int j = 0; j < WK_NP; j++)
                        if (j < T.nt) ydn[(int64_t)jy[j] * H + h0 + i] = acc[j];
                }
            }
        }
        if (!more) break;
#pragma unroll
        for (int i = 0; i < R * CPL; i++) A[i] = B[i];
        t++, v = v2, g = g2, T = T2;
    }
}

/* ---- launches: one per kind and expert set (routed: the bucket kernel's tiles; shared), each of one format ---- */

template <class K> static int wk_blocks(K kernel, int sm_count) {
    int per = 0; /* resident blocks an SM (registers decide): the persistent grid is exactly one wave */
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, WK_WARPS * 32, 0) != cudaSuccess || per < 1) per = 1;
    return per * (sm_count > 0 ? sm_count : 1);
}

template <int FMT>
static void wk_launch_fmt(const wk_args &a, bool down, int sh, int sm_count, int cap, int pdl, const float *in, float *out,
                          cudaStream_t st) {
    if (!down) {
        static const int nb = wk_blocks(moe_gu_walk_kernel<FMT>, sm_count);
        dr_launch(pdl, moe_gu_walk_kernel<FMT>, cap > 0 && cap < nb ? cap : nb, WK_WARPS * 32, 0, st, a, sh, in, out);
    } else {
        static const int nb = wk_blocks(moe_down_walk_kernel<FMT>, sm_count);
        dr_launch(pdl, moe_down_walk_kernel<FMT>, cap > 0 && cap < nb ? cap : nb, WK_WARPS * 32, 0, st, a, sh, in, out);
    }
}

/* cap > 0: at most cap blocks (the contract's long walks) */
static cudaError_t wk_launch(int fmt, const wk_args &a, bool down, int sh, int sm_count, int cap, int pdl, const float *in,
                             float *out, cudaStream_t st) {
    switch (fmt) {
    case MV_F32: wk_launch_fmt<MV_F32>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_F16: wk_launch_fmt<MV_F16>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_BF16: wk_launch_fmt<MV_BF16>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_FP8_BLOCK: wk_launch_fmt<MV_FP8_BLOCK>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_FP8_TENSOR: wk_launch_fmt<MV_FP8_TENSOR>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_NVFP4: wk_launch_fmt<MV_NVFP4>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_AFF4: wk_launch_fmt<MV_AFF4>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    case MV_AFF8: wk_launch_fmt<MV_AFF8>(a, down, sh, sm_count, cap, pdl, in, out, st); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

#endif
