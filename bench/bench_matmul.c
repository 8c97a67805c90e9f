/* bench_matmul - CPU matmul throughput per stored format, against the machine's memory bandwidth.
 *
 * Usage: bench_matmul [--threads N] [--min-ms MS] [--hot] [--best] [--cpu-time] [--cold-mib MIB] [--format NAME] [--shape RxC]
 *                     [--n N] [--calls C]
 * Weights rotate over enough copies to exceed the last-level cache (512 MiB by default; --hot: one
 * copy, cache resident), as in decoding, where every expert matrix is read once per token. GB/s counts the
 * stored weight bytes (codes + scales + biases) read per call. The bandwidth line is a
 * STREAM-like copy (bytes read + written) and a read-only sum over 256 MiB buffers. --format,
 * --shape and --n run only the matching rows (e.g. `--hot --shape 64x2048`: L2-resident weights,
 * which measures the decode loop alone). --calls C makes exactly C calls per sample instead of timing
 * (fixed work for `valgrind --tool=callgrind --toggle-collect=dr_cpu_matmul_path`). of_read: GB/s over the
 * 1 GiB read bandwidth on the same threads. --best reports the fastest of the 5 samples, not the median. --cpu-time times with the
 * process's CPU time over the thread count (every clock of the run, the bandwidth lines included), which leaves out
 * the time other jobs of a shared machine hold the cores. DRAMA_CPU_PATH=avx2|avx512|portable picks the loops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "base/alloc.h"
#include "base/pool.h"
#include "num/formats.h"
#include "num/quant.h"
#include "num/weight.h"

/* --cpu-time: the process's CPU time over the pool's threads instead of wall time, so the time
 * a shared machine's other jobs hold the cores is left out (waiting workers spin, so they count) */
static int g_cpu_clock = 0, g_clock_threads = 1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / (g_cpu_clock ? g_clock_threads : 1);
}

static uint32_t rng = 7;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* Copy / read bandwidth over 256 MiB, best of a few passes. */
static void memory_bandwidth(double *copy_gbs, double *read_gbs) {
    size_t n = (size_t)256 << 20;
    uint8_t *a = dr_alloc(n), *b = dr_alloc(n);
    if (!a || !b) {
        *copy_gbs = *read_gbs = 0;
        dr_free(a);
        dr_free(b);
        return;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best_c = 1e9, best_r = 1e9;
    volatile double sink = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double t1 = now_s();
        const double *d = (const double *)(void *)a;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n / 8; i += 4) {
            s0 += d[i];
            s1 += d[i + 1];
            s2 += d[i + 2];
            s3 += d[i + 3];
        }
        sink += s0 + s1 + s2 + s3 + b[rep];
        double t2 = now_s();
        if (t1 - t0 < best_c) best_c = t1 - t0;
        if (t2 - t1 < best_r) best_r = t2 - t1;
    }
    (void)sink;
    *copy_gbs = 2.0 * (double)n / best_c / 1e9;
    *read_gbs = (double)n / best_r / 1e9;
    dr_free(a);
    dr_free(b);
}

/* Read bandwidth with every pool thread summing its share of a 1 GiB buffer (what a threaded
 * matmul over cold weights can hope for). */
typedef struct par_read { const double *d; int64_t per; double *sums; } par_read;
static void par_read_task(void *ctx, int64_t i, int worker) {
    par_read *p = ctx;
    const double *d = p->d + i * p->per;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t k = 0; k + 4 <= p->per; k += 4) {
        s0 += d[k];
        s1 += d[k + 1];
        s2 += d[k + 2];
        s3 += d[k + 3];
    }
    p->sums[i] = s0 + s1 + s2 + s3;
}

static double parallel_read_gbs(dr_pool *pool) {
    size_t n = (size_t)1 << 30;
    int tasks = dr_pool_threads(pool) * 4;
    double *buf = dr_alloc(n), sums[4096];
    if (!buf || tasks > 4096) {
        dr_free(buf);
        return 0;
    }
    memset(buf, 0, n);
    par_read p = {.d = buf, .per = (int64_t)(n / 8) / tasks, .sums = sums};
    double best = 1e9;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now_s();
        dr_pool_run(pool, tasks, par_read_task, &p);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    dr_free(buf);
    return (double)p.per * 8.0 * tasks / best / 1e9;
}

/* One encoded weight and `copies` byte-identical clones of its buffers. */
#define MAX_COPIES 2048

typedef struct bench_weight {
    dr_weight w[MAX_COPIES];
    int copies;
    void *bufs[MAX_COPIES][3];
    size_t bytes;
} bench_weight;

static size_t g_cold_bytes = (size_t)512 << 20; /* rotation set: beyond the L3 of large server parts */

/* the benched variants: a stored format with its affine bits and group */
typedef struct bench_fmt {
    const char *label;
    dr_wfmt fmt;
    int bits, group;
} bench_fmt;

static const bench_fmt g_fmts[] = {
    {"bf16", DR_WF_BF16, 0, 0},          {"f16", DR_WF_F16, 0, 0},
    {"fp8-block", DR_WF_FP8_BLOCK, 0, 0}, {"fp8-tensor", DR_WF_FP8_TENSOR, 0, 0},
    {"nvfp4", DR_WF_NVFP4, 0, 0},        {"q4-g64", DR_WF_AFFINE, 4, 64},
    {"q4-g32", DR_WF_AFFINE, 4, 32},     {"q4-g128", DR_WF_AFFINE, 4, 128},
    {"q8-g64", DR_WF_AFFINE, 8, 64},     {"f32", DR_WF_F32, 0, 0},
};

static int make(bench_weight *bw, const bench_fmt *bf, int64_t rows, int64_t cols, int hot) {
    dr_wfmt fmt = bf->fmt;
    memset(bw, 0, sizeof *bw);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    if (!src) return -1;
    for (int64_t i = 0; i < rows * cols; i++) src[i] = frand() * 0.05f;
    size_t sz[3] = {0, 0, 0};
    void *b0[3] = {NULL, NULL, NULL};
    drama_error err = {0};
    int64_t n = rows * cols;
    switch (fmt) {
    case DR_WF_F32:
        sz[0] = (size_t)n * 4;
        b0[0] = malloc(sz[0]);
        memcpy(b0[0], src, sz[0]);
        break;
    case DR_WF_BF16:
    case DR_WF_F16:
        sz[0] = (size_t)n * 2;
        b0[0] = malloc(sz[0]);
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)b0[0])[i] = fmt == DR_WF_BF16 ? dr_f32_to_bf16(src[i]) : dr_f32_to_f16(src[i]);
        break;
    case DR_WF_FP8_BLOCK:
        sz[0] = (size_t)n;
        sz[1] = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128)) * 4;
        b0[0] = malloc(sz[0]);
        b0[1] = malloc(sz[1]);
        dr_quant_fp8_block(src, rows, cols, 128, 128, b0[0], b0[1], &err);
        break;
    case DR_WF_FP8_TENSOR:
        sz[0] = (size_t)n;
        sz[1] = 4;
        b0[0] = malloc(sz[0]);
        b0[1] = malloc(4);
        {
            float gs = dr_quant_amax(src, n) / 448.0f;
            memcpy(b0[1], &gs, 4);
            for (int64_t i = 0; i < n; i++) ((uint8_t *)b0[0])[i] = dr_e4m3_from_f64((double)src[i] / gs);
        }
        break;
    case DR_WF_NVFP4:
        sz[0] = (size_t)n / 2;
        sz[1] = (size_t)n / 16;
        sz[2] = 4;
        b0[0] = malloc(sz[0]);
        b0[1] = malloc(sz[1]);
        b0[2] = malloc(4);
        {
            float gs = dr_quant_nvfp4_global_scale(dr_quant_amax(src, n));
            memcpy(b0[2], &gs, 4);
            dr_quant_nvfp4(src, rows, cols, gs, b0[0], b0[1], &err);
        }
        break;
    case DR_WF_AFFINE:
        sz[0] = (size_t)n * (size_t)bf->bits / 8;
        sz[1] = sz[2] = (size_t)(n / bf->group) * 2;
        for (int i = 0; i < 3; i++) b0[i] = malloc(sz[i]);
        dr_quant_affine(src, rows, cols, bf->bits, bf->group, DR_DT_BF16, b0[0], b0[1], b0[2], &err);
        break;
    default: break;
    }
    free(src);
    if (err.code) {
        fprintf(stderr, "encode: %s\n", err.message);
        return -1;
    }
    size_t total = sz[0] + sz[1] + sz[2];
    int copies = hot ? 1 : (int)(g_cold_bytes / total) + 1;
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    bw->copies = copies;
    for (int c = 0; c < copies; c++) {
        for (int i = 0; i < 3; i++) {
            if (!b0[i]) continue;
            bw->bufs[c][i] = dr_alloc(sz[i]);
            memcpy(bw->bufs[c][i], b0[i], sz[i]);
        }
        dr_tensor tw = {.name = "bench.weight", .ndim = 2, .shape = {rows, cols}, .data = bw->bufs[c][0], .nbytes = sz[0]};
        dr_tensor ts = {.name = "bench.scale", .ndim = 2, .data = bw->bufs[c][1], .nbytes = sz[1]};
        dr_tensor t2 = {.name = "bench.scale2", .ndim = 0, .dtype = DR_DT_F32, .data = bw->bufs[c][2], .nbytes = sz[2]};
        dr_tensor tb = ts;
        const dr_tensor *ps = NULL, *p2 = NULL, *pb = NULL;
        switch (fmt) {
        case DR_WF_F32: tw.dtype = DR_DT_F32; break;
        case DR_WF_F16: tw.dtype = DR_DT_F16; break;
        case DR_WF_BF16: tw.dtype = DR_DT_BF16; break;
        case DR_WF_FP8_BLOCK:
            tw.dtype = DR_DT_F8_E4M3;
            ts.dtype = DR_DT_F32;
            ts.shape[0] = (rows + 127) / 128;
            ts.shape[1] = (cols + 127) / 128;
            ps = &ts;
            break;
        case DR_WF_FP8_TENSOR:
            tw.dtype = DR_DT_F8_E4M3;
            t2.name = "bench.weight_scale";
            t2.data = bw->bufs[c][1];
            t2.nbytes = 4;
            ps = &t2;
            break;
        case DR_WF_NVFP4:
            tw.dtype = DR_DT_U8;
            tw.shape[1] = cols / 2;
            ts.dtype = DR_DT_F8_E4M3;
            ts.shape[0] = rows;
            ts.shape[1] = cols / 16;
            ps = &ts;
            p2 = &t2;
            break;
        case DR_WF_AFFINE:
            tw.dtype = DR_DT_U32;
            tw.shape[1] = cols * bf->bits / 32;
            ts.dtype = DR_DT_BF16;
            ts.shape[0] = rows;
            ts.shape[1] = cols / bf->group;
            tb = ts;
            tb.data = bw->bufs[c][2];
            tb.nbytes = sz[2];
            ps = &ts;
            pb = &tb;
            break;
        default: break;
        }
        if (dr_weight_bind_ex(&tw, ps, p2, pb, -1, 0, 0, cols, &bw->w[c], &err) != DRAMA_OK) {
            fprintf(stderr, "bind: %s\n", err.message);
            return -1;
        }
    }
    bw->bytes = dr_weight_bytes(&bw->w[0]);
    for (int i = 0; i < 3; i++) free(b0[i]);
    return 0;
}

static void release(bench_weight *bw) {
    for (int c = 0; c < bw->copies; c++)
        for (int i = 0; i < 3; i++) dr_free(bw->bufs[c][i]);
}

/* Median ms per call over 5 samples of at least min_ms / 5 each (the median resists the other
 * jobs of a shared machine better than the mean). */
static long g_fixed_calls = 0; /* --calls */
static int g_best = 0;          /* --best: the fastest sample instead (the kernel alone on a busy machine) */

static double time_calls(const bench_weight *bw, const float *x, int64_t n, float *y, dr_pool *pool, double min_ms) {
    double ms[5];
    long calls = 0;
    for (int s = 0; s < 5; s++) {
        long c0 = calls;
        double t0 = now_s(), t;
        do {
            dr_cpu_matmul(&bw->w[calls % bw->copies], x, n, y, pool);
            calls++;
            t = now_s();
        } while (g_fixed_calls ? calls - c0 < g_fixed_calls : (t - t0) * 1e3 < min_ms / 5 || calls - c0 < 2);
        ms[s] = (t - t0) * 1e3 / (double)(calls - c0);
    }
    for (int i = 1; i < 5; i++) /* insertion sort of five */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            double tmp = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = tmp;
        }
    return g_best ? ms[0] : ms[2];
}

int main(int argc, char **argv) {
    int threads = 0, hot = 0, probe = 1;
    double min_ms = 300;
    const char *only_fmt = NULL;
    int64_t only_rows = 0, only_cols = 0, only_n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-ms") && i + 1 < argc) min_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--hot")) hot = 1;
        else if (!strcmp(argv[i], "--best")) g_best = 1;
        else if (!strcmp(argv[i], "--no-probe")) probe = 0;
        else if (!strcmp(argv[i], "--cpu-time")) g_cpu_clock = 1;
        else if (!strcmp(argv[i], "--cold-mib") && i + 1 < argc) g_cold_bytes = (size_t)atol(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--format") && i + 1 < argc) only_fmt = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) only_n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc) g_fixed_calls = atol(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
                 sscanf(argv[i + 1], "%ldx%ld", (long *)&only_rows, (long *)&only_cols) == 2 && only_rows > 0 &&
                 only_cols > 0 && only_cols % 128 == 0)
            i++;
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--min-ms MS] [--hot] [--best] [--cpu-time] [--cold-mib MIB] [--no-probe]\n"
                    "       [--format NAME] [--shape ROWSxCOLS (COLS a multiple of 128)] [--n N] [--calls C]\n",
                    argv[0]);
            return 2;
        }
    }
    dr_pool *pool = dr_pool_create(threads);
    if (!pool) return 1;
    g_clock_threads = dr_pool_threads(pool);
    printf("drama bench_matmul  path=%s threads=%d weights=%s%s\n", dr_cpu_path_name(dr_cpu_best_path()),
           dr_pool_threads(pool), hot ? "hot (one copy, cache resident)" : "cold (rotating copies)",
           g_cpu_clock ? " clock=process CPU time / threads" : "");
    double par_read_gbs = 0; /* the "of_read" column: GB/s over this read bandwidth, same threads */
    if (probe) {
        double copy_gbs, read_gbs;
        memory_bandwidth(&copy_gbs, &read_gbs);
        printf("memory bandwidth (256 MiB, single thread): copy %.1f GB/s (read+write), read %.1f GB/s\n", copy_gbs,
               read_gbs);
        par_read_gbs = parallel_read_gbs(pool);
        printf("memory bandwidth (1 GiB, %d threads): read %.1f GB/s\n", dr_pool_threads(pool), par_read_gbs);
    }
    printf("\n%-10s %-12s %4s %10s %10s %10s %10s %7s\n", "format", "shape", "n", "weight MB", "ms/call", "GB/s",
           "Gweight/s", "of_read");
    const int64_t shapes[3][2] = {{512, 2048}, {2048, 512}, {2048, 2048}};
    const int64_t ns[3] = {1, 8, 64};
    int nshapes = only_rows ? 1 : 3;
    for (size_t f = 0; f < sizeof g_fmts / sizeof g_fmts[0]; f++) {
        if (only_fmt && strcmp(only_fmt, g_fmts[f].label)) continue;
        for (int s = 0; s < nshapes; s++) {
            int64_t rows = only_rows ? only_rows : shapes[s][0], cols = only_rows ? only_cols : shapes[s][1];
            bench_weight *bw = calloc(1, sizeof *bw);
            if (!bw || make(bw, &g_fmts[f], rows, cols, hot) != 0) return 1;
            for (int ni = 0; ni < 3; ni++) {
                int64_t n = only_n ? only_n : ns[ni];
                if (only_n && ni) break;
                float *x = dr_alloc((size_t)(n * cols) * 4), *y = dr_alloc((size_t)(n * rows) * 4);
                for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
                dr_cpu_matmul(&bw->w[0], x, n, y, pool); /* warm-up */
                double ms = time_calls(bw, x, n, y, pool, min_ms);
                char shape[32];
                snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)rows, (long long)cols);
                double gbs = (double)bw->bytes / (ms * 1e-3) / 1e9;
                char of_read[16] = "-";
                if (par_read_gbs > 0) snprintf(of_read, sizeof of_read, "%.0f%%", 100.0 * gbs / par_read_gbs);
                printf("%-10s %-12s %4lld %10.2f %10.3f %10.2f %10.2f %7s\n", g_fmts[f].label, shape, (long long)n,
                       (double)bw->bytes / 1e6, ms, gbs, (double)(rows * cols) / (ms * 1e-3) / 1e9, of_read);
                fflush(stdout);
                if (!isfinite(y[0])) fprintf(stderr, "warning: non-finite output\n");
                dr_free(x);
                dr_free(y);
            }
            release(bw);
            free(bw);
        }
    }
    dr_pool_free(pool);
    return 0;
}
