/* bench_prefill - CPU prefill pieces: n > 1 products (the old dot_rows tiles, the AVX2 and AVX-512
 * block kernels, and OpenBLAS sgemm on fp32 weights dequantised beforehand, when the library can
 * be opened) and the DeltaNet recurrence (row by row against the chunked form).
 *
 * Usage: bench_prefill [--threads T] [--reps R] [--shape RxC] [--n N] [--format bf16|q4]
 *                      [--cpu-time] [--skip-gemm] [--skip-deltanet]
 * Weights are hot (one copy, as a prefill reads each weight once for all its rows). GFLOP/s counts
 * 2 rows cols n per product; `bits_equal` says whether the path gave the same bits as the old tiles
 * (sgemm is not expected to). DeltaNet: one layer's recurrence at the full model's heads (32 value
 * heads of 128 x 128, 16 key heads) over N rows. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"
#include "base/cli_args.h"
#include "base/pool.h"
#include "tools/bench.h"
#include "tools/contract_internal.h"

typedef void (*sgemm_fn)(const char *ta, const char *tb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);

static sgemm_fn open_sgemm(const char **from) {
    const char *libs[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        void *f = dlsym(h, "sgemm_");
        if (f) {
            *from = libs[i];
            sgemm_fn fn;
            memcpy(&fn, &f, sizeof fn);
            return fn;
        }
    }
    return NULL;
}

/* --cpu-time: the process's CPU seconds instead of wall time (a loaded machine deschedules the
 * bench; with --threads 1 this measures the loop itself) */
static int g_cpu_time;
static double now(void) { return g_cpu_time ? dr_bench_cpu_s() : dr_bench_now(); }

typedef struct gemm_case {
    const dr_weight *w;
    const float *x;
    int64_t n;
    float *y;
    dr_pool *pool;
} gemm_case;

/* best seconds over reps calls of one path (block NULL with path AVX2: the old dot_rows tiles) */
static double time_path(const gemm_case *c, dr_cpu_path path, dr_cpu_block_fn block, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        dr_cpu_matmul_block(c->w, 0, c->w->rows, c->x, c->n, c->y, c->pool, path, block);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

static int bench_gemm(dr_pool *pool, int fmt, int64_t rows, int64_t cols, int64_t n, int reps) {
    uint64_t s = 5;
    float *src = malloc((size_t)(rows * cols) * sizeof *src), *x = malloc((size_t)(n * cols) * sizeof *x);
    float *y0 = malloc((size_t)(n * rows) * sizeof *y0), *y1 = malloc((size_t)(n * rows) * sizeof *y1);
    ct_w t;
    if (!src || !x || !y0 || !y1) return 1;
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)(ct_rand_normal(&s) * 0.02);
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)ct_rand_normal(&s);
    if (ct_w_make(&t, fmt, src, rows, cols)) {
        fprintf(stderr, "bench_prefill: could not build the weight\n");
        return 1;
    }
    double flop = 2.0 * (double)rows * (double)cols * (double)n;
    char name[96];
    printf("gemm %s [%lld,%lld] n=%lld\n", ct_matmul_names[fmt] + 7, (long long)rows, (long long)cols, (long long)n);
    gemm_case c = {&t.w, x, n, y0, pool};
    double t_old = time_path(&c, DR_CPU_AVX2, NULL, reps);
    dr_bench_line("dot_rows_tiles", flop / t_old / 1e9, 1, "GFLOP/s");
    c.y = y1;
    const struct { dr_cpu_block_isa isa; const char *name; } k[] = {{DR_CPU_BLOCK_AVX2, "block_avx2"},
                                                                     {DR_CPU_BLOCK_AVX512, "block_avx512"}};
    for (int i = 0; i < 2; i++) {
        dr_cpu_block_fn fn = dr_cpu_block_kernel(k[i].isa, 0);
        if (!fn) {
            printf("  %-28s %14s (not on this CPU)\n", k[i].name, "-");
            continue;
        }
        memset(y1, 0, (size_t)(n * rows) * sizeof *y1);
        double tb = time_path(&c, DR_CPU_AVX2, fn, reps);
        dr_bench_line(k[i].name, flop / tb / 1e9, 1, "GFLOP/s");
        snprintf(name, sizeof name, "%s_speedup", k[i].name);
        dr_bench_line(name, t_old / tb, 2, "x");
        snprintf(name, sizeof name, "%s_bits_equal", k[i].name);
        dr_bench_line(name, memcmp(y0, y1, (size_t)(n * rows) * sizeof *y0) == 0, 0, "");
    }
    const char *from = NULL;
    sgemm_fn sgemm = open_sgemm(&from);
    float *wf = sgemm ? malloc((size_t)(rows * cols) * sizeof *wf) : NULL;
    if (wf) {
        for (int64_t r = 0; r < rows; r++) dr_cpu_dequant_row_path(&t.w, r, wf + r * cols, DR_CPU_AUTO);
        /* y[n][rows] = x[n][cols] W^T: column-major C[rows][n] = W^T... i.e. op(A) = W^T (A = wf as
         * cols x rows column-major), B = x (cols x n column-major) */
        int m = (int)rows, nn = (int)n, kk = (int)cols;
        float one = 1.0f, zero = 0.0f;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            sgemm("T", "N", &m, &nn, &kk, &one, wf, &kk, x, &kk, &zero, y1, &m);
            double tt = now() - t0;
            if (tt < best) best = tt;
        }
        double maxrel = 0;
        for (int64_t i = 0; i < n * rows; i++) {
            double d = fabs((double)y1[i] - (double)y0[i]) / (fabs((double)y0[i]) + 1e-30);
            if (d > maxrel || isnan(d)) maxrel = d;
        }
        snprintf(name, sizeof name, "sgemm_fp32 (%s)", from);
        dr_bench_line(name, flop / best / 1e9, 1, "GFLOP/s");
        dr_bench_line("sgemm_max_rel_diff", maxrel, 9, "(weights pre-dequantised, not timed)");
        free(wf);
    } else {
        printf("  %-28s %14s (no OpenBLAS/BLAS sgemm_ to open)\n", "sgemm_fp32", "-");
    }
    ct_w_free(&t);
    free(src);
    free(x);
    free(y0);
    free(y1);
    return 0;
}

/* One DeltaNet layer's recurrence at the full model's heads over n rows (one thread): every value
 * head row by row (dr_op_gdn_step) against the chunked form (dr_op_gdn_chunk) in blocks of 8, 16, 32,
 * 64 (the engine's DR_GDN_CHUNK) and 128 rows, the rows past the last full block row by row, as the
 * prefill runs them: what a smaller grid (a shorter minimum prefill slice) costs. */
static int bench_deltanet(int64_t n, int reps) {
    const int nk = 16, nv = 32, dk = 128, dv = 128;
    static const int blocks[] = {0, 8, 16, 32, 64, 128}; /* 0: row by row */
    enum { NB = sizeof blocks / sizeof blocks[0] };
    int64_t qk = (int64_t)nk * dk, C = 2 * qk + (int64_t)nv * dv, ns = (int64_t)nv * dk * dv;
    uint64_t s = 11;
    float *y = malloc((size_t)(n * C) * 4), *ga = malloc((size_t)(n * nv) * 4), *gb = malloc((size_t)(n * nv) * 4);
    float *S = calloc((size_t)ns, 4), *o = malloc((size_t)(n * nv * dv) * 4), *mem = malloc((size_t)dv * 4);
    float *scratch = malloc((size_t)dr_op_gdn_chunk_scratch(blocks[NB - 1], dk, dv) * 4);
    if (!y || !ga || !gb || !S || !o || !mem || !scratch) return 1;
    for (int64_t i = 0; i < n * C; i++) y[i] = (float)(ct_rand_normal(&s) * 0.09);
    for (int64_t i = 0; i < n * nv; i++) ga[i] = -(float)(0.05 + 0.5 * ct_rand_uniform(&s)), gb[i] = 0.5f;
    double best[NB];
    for (int mode = 0; mode < NB; mode++) best[mode] = 1e30;
    for (int r = 0; r < reps; r++) /* modes interleaved: a load change hits them alike */
        for (int mode = 0; mode < NB; mode++) {
            int L = blocks[mode];
            memset(S, 0, (size_t)ns * 4);
            double t0 = now();
            for (int h = 0; h < nv; h++) {
                int kh = h / (nv / nk);
                float *Sh = S + (int64_t)h * dk * dv;
                for (int64_t i = 0; i < n; i++) {
                    const float *yi = y + i * C;
                    if (L && i + L <= n) {
                        dr_op_gdn_chunk(Sh, yi + kh * dk, yi + qk + kh * dk, C, yi + 2 * qk + h * dv, C, ga + i * nv + h,
                                        gb + i * nv + h, nv, L, dk, dv, scratch, o + i * nv * dv + h * dv,
                                        (int64_t)nv * dv, 0);
                        i += L - 1;
                        continue;
                    }
                    dr_op_gdn_step(Sh, yi + kh * dk, yi + qk + kh * dk, yi + 2 * qk + h * dv, ga[i * nv + h],
                                   gb[i * nv + h], dk, dv, mem, o + i * nv * dv + h * dv);
                }
            }
            double t = now() - t0;
            if (t < best[mode]) best[mode] = t;
        }
    printf("deltanet recurrence, one layer (32 value heads of 128x128), %lld rows, 1 thread\n", (long long)n);
    dr_bench_line("row_by_row", (double)n / best[0], 0, "rows/s");
    for (int mode = 1; mode < NB; mode++) {
        char name[48];
        snprintf(name, sizeof name, "chunked_%d", blocks[mode]);
        dr_bench_line(name, (double)n / best[mode], 0, "rows/s");
        snprintf(name, sizeof name, "chunked_%d_speedup", blocks[mode]);
        dr_bench_line(name, best[0] / best[mode], 2, "x");
    }
    dr_bench_line("row_by_row_GFLOP/s", 4.0 * nv * dk * dv * (double)n / best[0] / 1e9, 1, "(4 nv dk dv per row)");
    free(y), free(ga), free(gb), free(S), free(o), free(mem), free(scratch);
    return 0;
}

int main(int argc, char **argv) {
    long long threads = 0, reps = 5, rows = 2048, cols = 2048, n_only = 0;
    int fmt = CT_F_BF16, gemm = 1, deltanet = 1;
    const char *cmd = "bench_prefill";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads")) {
            if (!dr_cli_int(cmd, a, v, 0, 4096, &threads)) return 2;
            i++;
        } else if (!strcmp(a, "--reps")) {
            if (!dr_cli_int(cmd, a, v, 1, 1000, &reps)) return 2;
            i++;
        } else if (!strcmp(a, "--n")) {
            if (!dr_cli_int(cmd, a, v, 2, 65536, &n_only)) return 2;
            i++;
        } else if (!strcmp(a, "--shape")) {
            if (!v || sscanf(v, "%lldx%lld", &rows, &cols) != 2 || rows < 1 || cols < 1 || rows > 65536 ||
                cols > 65536) {
                fprintf(stderr, "%s: --shape: invalid value '%s': want ROWSxCOLS, each 1..65536\n", cmd, v ? v : "");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--format")) {
            if (v && !strcmp(v, "bf16")) fmt = CT_F_BF16;
            else if (v && !strcmp(v, "q4")) fmt = CT_F_AFF4;
            else {
                fprintf(stderr, "%s: --format: invalid value '%s': want bf16 or q4\n", cmd, v ? v : "");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--cpu-time")) {
            g_cpu_time = 1;
        } else if (!strcmp(a, "--skip-gemm")) {
            gemm = 0;
        } else if (!strcmp(a, "--skip-deltanet")) {
            deltanet = 0;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'\n", cmd, a);
            return 2;
        }
    }
    if (fmt == CT_F_AFF4 && cols % 64) {
        fprintf(stderr, "%s: --shape: q4 needs cols a multiple of 64\n", cmd);
        return 2;
    }
    dr_pool *pool = dr_pool_create((int)threads);
    printf("bench_prefill: %d threads, cpu path %s, best of %lld, %s\n", dr_pool_threads(pool),
           dr_cpu_path_name(dr_cpu_best_path()), reps, g_cpu_time ? "process CPU time" : "wall time");
    int rc = 0;
    int64_t ns[3] = {16, 64, 256};
    int nn = 3;
    if (n_only) ns[0] = n_only, nn = 1;
    for (int i = 0; gemm && i < nn && !rc; i++) rc = bench_gemm(pool, fmt, rows, cols, ns[i], (int)reps);
    if (deltanet && !rc) rc = bench_deltanet(n_only ? n_only : 256, (int)reps);
    dr_pool_free(pool);
    return rc;
}
