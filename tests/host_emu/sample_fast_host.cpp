/* sample_fast_host.cpp - sample.cu's device functions (their text: the helpers + sample_fast.cuh) run on
 * the host, 1024 threads a block (std::thread), __syncthreads / __syncwarp as barriers, the warp
 * collectives through a per-warp exchange; random fixtures drawn twice in one block (the redraw
 * reuses the keys) against the CPU's dr_sample, plus the planted defects 2 and 3 (they should differ
 * sometimes). Not a ctest (C++20, slow): tests/host_emu/run_sample_fast_host.sh [cases] [sort]. */
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#include <algorithm>
#include <functional>
extern "C" {
#include "backend/cpu/sample.h"
}
#include "num/expf_det.h"
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __noinline__
struct dim3t { int x; };
thread_local dim3t threadIdx;
static dim3t blockDim = {1024};
enum { DR_CUDA_ERR_NONE = 0, DR_CUDA_ERR_ROUTER, DR_CUDA_ERR_LOGIT_NAN, DR_CUDA_ERR_LOGIT_INF, DR_CUDA_ERR_EXCLUDED };
static std::barrier<> *blockbar;
static std::barrier<> *warpbar[32];
static uint64_t slots[1024];
static std::mutex amu;
static void __syncthreads() { blockbar->arrive_and_wait(); }
static void __syncwarp(unsigned = 0xFFFFFFFFu) { warpbar[threadIdx.x >> 5]->arrive_and_wait(); }
template <class T> static T shfl_generic(T v, int src) {
    const int w = threadIdx.x >> 5;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    slots[threadIdx.x] = b;
    __syncwarp();
    uint64_t r = slots[w * 32 + src];
    __syncwarp();
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
template <class T> static T __shfl_xor_sync(unsigned, T v, int off) { return shfl_generic(v, (threadIdx.x & 31) ^ off); }
template <class T> static T __shfl_up_sync(unsigned, T v, int d) {
    const int lane = threadIdx.x & 31;
    return shfl_generic(v, lane >= d ? lane - d : lane);
}
template <class T> static T __shfl_sync(unsigned, T v, int src) { return shfl_generic(v, src); }
static unsigned __ballot_sync(unsigned, int p) {
    const int w = threadIdx.x >> 5;
    slots[threadIdx.x] = p != 0;
    __syncwarp();
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= (unsigned)slots[w * 32 + l] << l;
    __syncwarp();
    return r;
}
static unsigned __match_any_sync(unsigned, unsigned v) {
    const int w = threadIdx.x >> 5;
    slots[threadIdx.x] = v;
    __syncwarp();
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= (unsigned)(slots[w * 32 + l] == v) << l;
    __syncwarp();
    return r;
}
static int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static int __popc(unsigned x) { return __builtin_popcount(x); }
static int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static int atomicAdd(int *p, int v) { std::lock_guard<std::mutex> g(amu); int o = *p; *p += v; return o; }
static int atomicMin(int *p, int v) { std::lock_guard<std::mutex> g(amu); int o = *p; if (v < *p) *p = v; return o; }
static unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
#define __expf(x) expf(x)
static float fsub(float a, float b) { return a - b; }
static float fdiv(float a, float b) { return a / b; }
using std::isfinite; using std::isinf; using std::isnan;
#include <map>
#include <string>
static std::map<std::string, int> stats;
#define SAMPLE_STAT(what) (stats[what]++)
#include "sample_extracted.inc" /* run_sample_fast_host.sh writes it from sample.cu */

struct spec2 { draw_spec a, b; int two; };
static int run_block(const float *lg, int n, const spec2 &sp, double u1, double u2, int variant, int *second) {
    int n2 = 1;
    while (n2 < (n >= 8 ? n : 8)) n2 <<= 1;
    std::vector<uint64_t> smem((fast_smem_bytes(n, n2) + 7) / 8 + 16, 0x5a5a5a5a5a5a5a5aull);
    std::barrier<> bb(1024);
    blockbar = &bb;
    std::vector<std::barrier<> *> wb;
    for (int w = 0; w < 32; w++) warpbar[w] = new std::barrier<>(32);
    int res = -99, res2 = -99;
    std::vector<std::thread> th;
    for (int t = 0; t < 1024; t++)
        th.emplace_back([&, t] {
            threadIdx.x = t;
            int err = 0, arg = 0, r, r2 = -99;
            fast_smem F = fast_layout(smem.data(), n, n2);
            draw_state ds = {0, 0, 0};
            if (variant == 0) { /* the sort-all draw (DRAMA_CUDA_SAMPLE=0), its own n2 */
                int n2o = 1;
                while (n2o < n) n2o <<= 1;
                sample_smem S = smem_layout(smem.data(), n, n2o);
                r = block_draw(lg, n, n2o, sp.a, u1, S, &err, &arg);
            } else if (variant == 1) {
                r = fast_draw<1>(lg, n, n2, sp.a, u1, F, ds, &err, &arg);
                if (sp.two && r >= 0) r2 = fast_draw<1>(lg, n, n2, sp.b, u2, F, ds, &err, &arg);
            } else if (variant == 2) r = fast_draw<2>(lg, n, n2, sp.a, u1, F, ds, &err, &arg);
            else r = fast_draw<3>(lg, n, n2, sp.a, u1, F, ds, &err, &arg);
            if (t == 0) res = r, res2 = r2;
        });
    for (auto &x : th) x.join();
    for (int w = 0; w < 32; w++) delete warpbar[w];
    *second = res2;
    return res;
}
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static double unif() { return (rnd() >> 11) * 0x1p-53; }
static double gauss() { double a = unif() + 1e-300, b = unif(); return sqrt(-2 * log(a)) * cos(6.283185307179586 * b); }
static int sort_test(int L) {
    const int n2 = 1 << L;
    std::vector<unsigned long long> a(n2), want(n2);
    for (int i = 0; i < n2; i++) want[i] = rnd();
    for (int i = 0; i < n2; i++) a[swz(i)] = want[i];
    std::sort(want.begin(), want.end(), std::greater<unsigned long long>());
    std::barrier<> bb(1024);
    blockbar = &bb;
    std::vector<std::thread> th;
    for (int t = 0; t < 1024; t++) th.emplace_back([&, t] { threadIdx.x = t; window_sort<0>(a.data(), L); });
    for (auto &x : th) x.join();
    for (int i = 0; i < n2; i++) if (a[i] != want[i]) { printf("sort L=%d: first wrong rank %d\n", L, i); return 1; }
    return 0;
}
int main(int argc, char **argv) {
    int cases = argc > 1 ? atoi(argv[1]) : 40;
    if (getenv("SEED")) rs ^= strtoull(getenv("SEED"), 0, 10) * 0x9E3779B97F4A7C15ull;
    if (argc > 2) { int b = 0; for (int r = 0; r < 10; r++) for (int L = 3; L <= 13; L++) b += sort_test(L); printf("sort tests: %d bad\n", b); return 0; }
    dr_sample_ws ws; drama_error e = {};
    dr_sample_ws_init(&ws, 8192, &e);
    const int sizes[] = {7, 33, 1000, 1024, 4097, 8192};
    const int Ks[] = {0, 1, 30, 32, 33, 1000};
    const float Ps[] = {1.0f, 0.9f, 0.5f, 1e-6f};
    const float Ts[] = {1.0f, 0.7f, 1.5f, 0.0f};
    std::vector<float> lg(8192);
    int bad = 0, ctl2 = 0, ctl3 = 0, ctl3n = 0;
    for (int c = 0; c < cases; c++) {
        int n = sizes[rnd() % 6], kind = rnd() % 7;
        if (getenv("GUESS")) n = c % 2 ? 8192 : 1024, kind = c % 3 == 0 ? 6 : 0; /* the nucleus list's paths */
        for (int i = 0; i < n; i++) {
            double g = gauss(), l;
            switch (kind) { case 1: l = 0.05 * g; break; case 2: l = floor(g * 2) / 2; break; case 3: l = (i % 7 == 3) ? -INFINITY : 3 * g; break;
            case 4: l = (i % 2) ? 0.0 : -0.0; break; case 6: l = i == 5 ? 0.0 : (i % 4 == 1) ? -4.6 + 0.01 * g : -30 + g; break; default: l = 3 * g; }
            lg[i] = (float)l;
        }
        spec2 sp;
        int K = Ks[rnd() % 6], keep = rnd() % 2;
        float P = Ps[rnd() % 4], T = Ts[rnd() % 4];
        if (getenv("GUESS")) K = 0, P = c % 4 == 3 ? 0.5f : 0.9f, T = T > 0 ? T : 1.0f;
        sp.a = {T, P, K, keep, 0};
        const float P2 = (c % 2) && P < 1.0f ? P : 0.9f;
        sp.b = {1.0f, P2, 0, 1, 0};
        sp.two = 1;
        double u1 = kind == 4 ? 0.5 : unif(), u2 = unif();
        int r2;
        int r = run_block(lg.data(), n, sp, u1, u2, 1, &r2);
        dr_draw_spec cs = {T, P, K, keep ? DR_TOPP_KEEP_CROSSING : DR_TOPP_DROP_CROSSING};
        int ref = -1, ref2 = -1;
        if (dr_sample(lg.data(), n, &cs, u1, &ws, &ref, "h", &e)) ref = -1;
        dr_draw_spec cs2 = {1.0f, P2, 0, DR_TOPP_KEEP_CROSSING};
        if (dr_sample(lg.data(), n, &cs2, u2, &ws, &ref2, "h", &e)) ref2 = -1;
        if (ref < 0) ref2 = -99;
        int ok = r == ref && r2 == ref2;
        bad += !ok;
        int d2 = -1, d3 = -1, dummy;
        if (c % 3 == 0) {
            const int o = run_block(lg.data(), n, sp, u1, u2, 0, &dummy);
            if (o != ref) bad++, printf("BAD old draw %d cpu %d\n", o, ref);
        }
        if (T > 0 && c % 2 == 0) { d2 = run_block(lg.data(), n, sp, u1, u2, 2, &dummy); ctl2 += d2 != ref; }
        if (T > 0 && K > 0 && K < n && c % 2 == 1) { d3 = run_block(lg.data(), n, sp, u1, u2, 3, &dummy); ctl3 += d3 != ref; ctl3n++; }
        if (!ok) { spec2 s1; s1.a = sp.b; s1.two = 0; int dd; int alone = run_block(lg.data(), n, s1, u2, 0, 1, &dd); printf("  second spec alone (fresh): %d\n", alone);
            spec2 s3 = sp; s3.a.top_k = 0; int r3b; int r3 = run_block(lg.data(), n, s3, u1, u2, 1, &r3b); printf("  first with top_k 0: %d then %d\n", r3, r3b); }
        printf("%s n=%d kind=%d T=%g P=%g K=%d keep=%d: fast %d/%d cpu %d/%d  ctl2 %d ctl3 %d\n", ok ? "ok " : "BAD", n, kind, T, P, K, keep, r, r2, ref, ref2, d2, d3);
        fflush(stdout);
    }
    for (auto &kv : stats) printf("path %s: %d\n", kv.first.c_str(), kv.second);
    printf("bad %d; control 2 differed %d, control 3 differed %d of %d\n", bad, ctl2, ctl3, ctl3n);
    return bad != 0;
}
