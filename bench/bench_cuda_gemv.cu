/* bench_cuda_gemv.cu - n = 1 BF16 products at the frame step's shapes, kernel layouts compared
 * (issue 13). Standalone (no engine code): every variant keeps matvec1_kernel's arithmetic (lane l
 * dots chunks l, l + 32, ... in order, one fmaf chain, the same xor tree), so all of them must give
 * the same y bit for bit, which the bench checks; they differ only in how loads are scheduled:
 * rows per block, persistent warps walking rows, the next batch of loads in flight across rows,
 * x staged in shared memory (chunk-transposed) or read through L1, and programmatic dependent
 * launch (PDL: weight loads issued before griddepcontrol.wait). Times are per kernel inside CUDA
 * graphs of many launches over weight copies beyond the L2, like the frame step's graph.
 * Build: nvcc -O3 -arch=sm_90 -o bench_cuda_gemv bench/bench_cuda_gemv.cu
 * Run:   bench_cuda_gemv [launches per graph, default 120] */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define EPC 8 /* BF16 elements per 16-byte chunk */

__device__ __forceinline__ uint4 ld_stream(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::); }

struct job {
    const uint8_t *w; /* [rows, pitch] BF16 */
    const float *x;   /* [cols] */
    float *y;         /* [rows] */
    int rows, cols, pitch;
};

/* one chunk's 8 products into acc, in element order (x chunk-transposed in shared memory or plain) */
template <bool SMEM>
__device__ __forceinline__ float dot_chunk(uint4 v, const float *x, int ch, int nch, float acc) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
    float4 a, b;
    if (SMEM) {
        a = *reinterpret_cast<const float4 *>(x + (0 * nch + ch) * 4);
        b = *reinterpret_cast<const float4 *>(x + (1 * nch + ch) * 4);
    } else {
        a = __ldg(reinterpret_cast<const float4 *>(x + ch * 8));
        b = __ldg(reinterpret_cast<const float4 *>(x + ch * 8 + 4));
    }
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = fmaf(__uint_as_float(u[k] << 16), xv[2 * k], acc);
        acc = fmaf(__uint_as_float(u[k] & 0xFFFF0000u), xv[2 * k + 1], acc);
    }
    return acc;
}

template <int U>
__device__ __forceinline__ void load_batch(const uint8_t *wrow, int base, int nch, uint4 (&v)[U]) {
#pragma unroll
    for (int k = 0; k < U; k++) {
        int ch = base + 32 * k;
        if (ch < nch) v[k] = ld_stream(wrow + (size_t)ch * 16);
    }
}

/* WPB warps per block; U chunks per lane per batch; PERSIST: warps walk rows with the grid's
 * stride (else one row per warp); PREF: the next batch (same row or the next row) loaded before
 * the current one is dotted; SMEM: x staged chunk-transposed; PDL: weight loads before the wait. */
template <int WPB, int U, bool PERSIST, bool PREF, bool SMEM, bool PDL, int MINB>
__global__ void __launch_bounds__(WPB * 32, MINB) gemv_kernel(const __grid_constant__ job J) {
    extern __shared__ float4 xs4[];
    float *xs = reinterpret_cast<float *>(xs4);
    if (PDL) pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nch = J.cols / EPC; /* cols a multiple of 8 here */
    const int stride = PERSIST ? gridDim.x * WPB : 1 << 30;
    int row = blockIdx.x * WPB + warp;
    if (blockIdx.x * WPB >= J.rows) return;
    uint4 va[U], vb[U];
    int base = lane;
    if (row < J.rows) load_batch<U>(J.w + (size_t)row * J.pitch, base, nch, va);
    if (PDL) pdl_wait();
    const float *x = J.x;
    if (SMEM) {
        for (int i = threadIdx.x; i < J.cols; i += blockDim.x) {
            int ch = i / EPC, e = i % EPC;
            xs[((e >> 2) * nch + ch) * 4 + (e & 3)] = J.x[i];
        }
        __syncthreads();
        x = xs;
    }
    float acc = 0.0f;
    while (row < J.rows) {
        int nb = base + 32 * U, nrow = row;
        if (nb >= nch) nb = lane, nrow = row + stride;
        const bool more = nrow < J.rows;
        if (PREF && more) load_batch<U>(J.w + (size_t)nrow * J.pitch, nb, nch, vb);
#pragma unroll
        for (int k = 0; k < U; k++) {
            int ch = base + 32 * k;
            if (ch < nch) acc = dot_chunk<SMEM>(va[k], x, ch, nch, acc);
        }
        if (nrow != row) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
            if (lane == 0) J.y[row] = acc;
            acc = 0.0f;
        }
        if (!PREF && more) load_batch<U>(J.w + (size_t)nrow * J.pitch, nb, nch, vb);
#pragma unroll
        for (int k = 0; k < U; k++) va[k] = vb[k];
        row = nrow, base = nb;
    }
}

/* read probe: every byte of a buffer once, 8 loads in flight per thread */
__global__ void read_kernel(const uint8_t *p, size_t n16, unsigned *sink) {
    unsigned s = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (; i + 7 * st < n16; i += 8 * st) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = ld_stream(p + (i + k * st) * 16);
#pragma unroll
        for (int k = 0; k < 8; k++) s ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n16; i += st) {
        uint4 v = ld_stream(p + i * 16);
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x9e3779b9u) *sink = s;
}

typedef void (*kfn)(job);
struct variant {
    const char *name;
    kfn fn;
    int wpb, persist, smem, pdl;
};

#define V(WPB, U, P, PR, S, D, MB, NAME) {NAME, gemv_kernel<WPB, U, P, PR, S, D, MB>, WPB, P, S, D}
static variant variants[] = {
    V(16, 8, false, true, true, false, 1, "cur: 16w/blk, 1 row/warp, 2x8 in flight, smem x"),
    V(16, 8, false, true, true, true, 1, "cur + PDL"),
    V(8, 8, false, true, true, false, 2, "8w/blk, 1 row/warp, 2x8, smem x"),
    V(8, 8, false, false, true, false, 4, "8w/blk, 1 row/warp, 1x8, smem x, 4 blk/SM"),
    V(8, 8, false, false, false, false, 4, "8w/blk, 1 row/warp, 1x8, ldg x, 4 blk/SM"),
    V(16, 8, true, true, true, false, 1, "persist 16w, 2x8 across rows, smem x"),
    V(16, 8, true, true, true, true, 1, "persist 16w, 2x8 across rows, smem x, PDL"),
    V(8, 8, true, true, true, false, 2, "persist 8w x2, 2x8 across rows, smem x"),
    V(8, 8, true, true, true, true, 2, "persist 8w x2, 2x8 across rows, smem x, PDL"),
    V(8, 4, true, true, true, false, 3, "persist 8w x3, 2x4 across rows, smem x"),
    V(8, 4, true, true, true, true, 3, "persist 8w x3, 2x4 across rows, smem x, PDL"),
    V(8, 4, true, true, false, true, 3, "persist 8w x3, 2x4 across rows, ldg x, PDL"),
    V(4, 8, true, true, true, true, 4, "persist 4w x4, 2x8 across rows, smem x, PDL"),
    V(8, 8, false, true, true, true, 2, "8w/blk, 1 row/warp, 2x8, smem x, PDL"),
};
#define NV (int)(sizeof variants / sizeof variants[0])

static int g_sms;

static void launch(const variant &v, const job &J, cudaStream_t s) {
    int blocks = (J.rows + v.wpb - 1) / v.wpb;
    size_t smem = v.smem ? (size_t)J.cols * 4 : 0;
    if (v.persist) {
        int per = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, v.fn, v.wpb * 32, smem));
        if (per < 1) per = 1;
        if (blocks > per * g_sms) blocks = per * g_sms;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(v.wpb * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = v.pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, v.fn, J));
}

struct mat {
    int rows, cols;
    std::vector<uint8_t *> copies;
    float *x, *y;
    std::vector<double> ref; /* float64 x W^T from the host copies */
    std::vector<double> mag; /* sum |w x| per row: the error's scale */
};

static uint16_t bf16_of(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static mat make_mat(int rows, int cols, size_t pool_bytes, unsigned seed) {
    mat m;
    m.rows = rows, m.cols = cols;
    size_t bytes = (size_t)rows * cols * 2;
    int n = (int)((pool_bytes + bytes - 1) / bytes);
    if (n < 2) n = 2;
    std::vector<uint16_t> h((size_t)rows * cols);
    std::vector<float> hx(cols);
    unsigned r = seed;
    for (auto &e : h) {
        r = r * 1664525u + 1013904223u;
        e = bf16_of(((int)(r >> 9) - (1 << 22)) / (float)(1 << 22) * 0.05f);
    }
    for (auto &e : hx) {
        r = r * 1664525u + 1013904223u;
        e = ((int)(r >> 9) - (1 << 22)) / (float)(1 << 22);
    }
    m.ref.assign(rows, 0.0), m.mag.assign(rows, 0.0);
    for (int r0 = 0; r0 < rows; r0++)
        for (int c = 0; c < cols; c++) {
            unsigned u = (unsigned)h[(size_t)r0 * cols + c] << 16;
            float w;
            memcpy(&w, &u, 4);
            m.ref[r0] += (double)w * hx[c];
            m.mag[r0] += fabs((double)w * hx[c]);
        }
    for (int i = 0; i < n; i++) {
        uint8_t *d;
        CK(cudaMalloc(&d, bytes));
        CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
        m.copies.push_back(d);
    }
    CK(cudaMalloc(&m.x, cols * 4));
    CK(cudaMemcpy(m.x, hx.data(), cols * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&m.y, (size_t)rows * 4 * n));
    return m;
}

static void free_mat(mat &m) {
    for (auto d : m.copies) cudaFree(d);
    cudaFree(m.x), cudaFree(m.y);
}

static job job_of(const mat &m, int i) {
    job J;
    J.w = m.copies[i % m.copies.size()];
    J.x = m.x;
    J.y = m.y + (size_t)(i % m.copies.size()) * m.rows;
    J.rows = m.rows, J.cols = m.cols, J.pitch = m.cols * 2;
    return J;
}

/* us per launch of a captured sequence of jobs (best of 5 replays) */
static double time_graph(const std::vector<std::pair<const variant *, job>> &seq, cudaStream_t s) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (auto &p : seq) launch(*p.first, p.second, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return best * 1000.0;
}

int main(int argc, char **argv) {
    int launches = argc > 1 ? atoi(argv[1]) : 120;
    int dev = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int drv = 0;
    cudaDriverGetVersion(&drv);
    printf("device %s, %d SMs, L2 %d MB, driver API %d\n", prop.name, g_sms, prop.l2CacheSize >> 20, drv);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < NV; i++) CK(cudaFuncSetAttribute(variants[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));

    /* bandwidth probes: a 2 GiB read, a 1 GiB device-to-device copy */
    {
        size_t n = (size_t)2 << 30;
        uint8_t *p, *q;
        unsigned *sink;
        CK(cudaMalloc(&p, n));
        CK(cudaMalloc(&q, n / 2));
        CK(cudaMalloc(&sink, 4));
        CK(cudaMemset(p, 1, n));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        float best = 1e30f, bestc = 1e30f;
        for (int r = 0; r < 6; r++) {
            CK(cudaEventRecord(a, s));
            read_kernel<<<g_sms * 8, 256, 0, s>>>(p, n / 16, sink);
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            best = ms < best ? ms : best;
            CK(cudaEventRecord(a, s));
            CK(cudaMemcpyAsync(q, p, n / 2, cudaMemcpyDeviceToDevice, s));
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            CK(cudaEventElapsedTime(&ms, a, b));
            bestc = ms < bestc ? ms : bestc;
        }
        printf("read probe %.0f GB/s; D2D copy %.0f GB/s (read + write bytes), %.0f GB/s (bytes copied)\n",
               n / (best * 1e6), 2.0 * (n / 2) / (bestc * 1e6), (n / 2) / (bestc * 1e6));
        cudaFree(p), cudaFree(q), cudaFree(sink);
    }

    struct shape {
        int rows, cols;
        const char *what;
    } shapes[] = {
        {2048, 2048, "generic"},      {8192, 2048, "gdn qkv / attn q+gate"}, {4096, 2048, "gdn z"},
        {2048, 4096, "gdn/attn out"}, {512, 2048, "attn k, shared gate"},    {2048, 512, "shared down"},
        {256, 2048, "router"},        {4096, 2048, "lm_head slice"},         {6144, 2560, "tower qkv"},
        {2560, 4096, "tower o"},      {9728, 2560, "tower gate/up"},          {2560, 9728, "tower down"},
        {1024, 2560, "tower head"},
    };
    const int NS = (int)(sizeof shapes / sizeof shapes[0]);
    printf("\nper launch, %d launches per graph over copies beyond the L2 (us | GB/s); identical: y == variant 0 bit for bit\n",
           launches);
    std::vector<mat> mats;
    for (int si = 0; si < NS; si++) mats.push_back(make_mat(shapes[si].rows, shapes[si].cols, (size_t)512 << 20, 7 + si));
    printf("%-58s", "variant");
    for (int si = 0; si < NS; si++) printf(" %5dx%-5d", shapes[si].rows, shapes[si].cols);
    printf("\n");
    std::vector<std::vector<float>> ref(NS);
    std::vector<float> got;
    for (int vi = 0; vi < NV; vi++) {
        printf("%-58s", variants[vi].name);
        int same = 1;
        for (int si = 0; si < NS; si++) {
            mat &m = mats[si];
            std::vector<std::pair<const variant *, job>> seq;
            for (int i = 0; i < launches; i++) seq.push_back({&variants[vi], job_of(m, i)});
            double us = time_graph(seq, s) / launches;
            double gbs = (double)m.rows * m.cols * 2 / (us * 1e3);
            printf(" %5.2f|%4.0f", us, gbs);
            got.resize(m.rows);
            CK(cudaMemcpy(got.data(), m.y, m.rows * 4, cudaMemcpyDeviceToHost));
            if (vi == 0) {
                ref[si] = got;
                double worst = 0;
                for (int r0 = 0; r0 < m.rows; r0++) {
                    double e = fabs(got[r0] - m.ref[r0]) / (m.mag[r0] > 0 ? m.mag[r0] : 1);
                    worst = e > worst || e != e ? e : worst;
                }
                if (!(worst <= (m.cols + 8) * 5.96e-8)) same = 0; /* (K + 8) u sum |w x| */
                if (si == 0 || !same) printf("[%.1e]", worst);
            }
            else if (memcmp(ref[si].data(), got.data(), m.rows * 4)) same = 0;
        }
        printf("  %s\n", same ? "identical" : "DIFFERENT");
        fflush(stdout);
    }
    /* a frame's dense products in order: 30 DeltaNet + 10 attention layers, 13 tower layers, each
     * layer's weights distinct (copies), as one graph */
    printf("\nframe mix (the dense n = 1 products of one frame, in order, one graph):\n");
    int gdn[] = {1, 2, 4, 6, 4, 4, 5}; /* qkv, z, out, router, shared gate, up, down (shape indices) */
    int att[] = {1, 4, 4, 3, 6, 4, 4, 5};
    int tow[] = {8, 9, 10, 10, 11, 12};
    for (int vi = 0; vi < NV; vi++) {
        std::vector<std::pair<const variant *, job>> seq;
        double bytes = 0;
        int k = 0;
        for (int l = 0; l < 40; l++) {
            int *ix = (l % 4 == 3) ? att : gdn;
            int cnt = (l % 4 == 3) ? 8 : 7;
            for (int j = 0; j < cnt; j++) {
                mat &m = mats[ix[j]];
                seq.push_back({&variants[vi], job_of(m, k++)});
                bytes += (double)m.rows * m.cols * 2;
            }
        }
        for (int l = 0; l < 13; l++)
            for (int j = 0; j < 6; j++) {
                mat &m = mats[tow[j]];
                seq.push_back({&variants[vi], job_of(m, k++)});
                bytes += (double)m.rows * m.cols * 2;
            }
        double us = time_graph(seq, s);
        printf("%-58s %4zu launches %8.1f us %6.0f GB/s (%.0f MB)\n", variants[vi].name, seq.size(), us,
               bytes / (us * 1e3), bytes / 1e6);
        fflush(stdout);
    }
    for (auto &m : mats) free_mat(m);
    return 0;
}
