/* matmul.c - y = x W^T with W in its stored format: the driver (threads over output rows) and the
 * portable path. The AVX2 / AVX-512 paths are in matmul_avx2.c / matmul_avx512.c; all compute the canonical dot product of
 * kernels.h, so results do not depend on the path, the thread count or n. */
#include "backend/cpu/matmul.h"

#include <math.h>
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/prefetch.h"
#include "base/alloc.h"
#include "base/log.h"

/* 0: portable only, 1: AVX2 + FMA + F16C, 2: also AVX-512 F/BW/VL/DQ */
static int detect_level(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* avx2/fma/avx512 through the compiler (it also checks the OS saves the AVX / ZMM state); F16C
     * from cpuid leaf 1, ecx bit 29 (not every compiler knows the "f16c" feature name) */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
    return 1;
#else
    return 0;
#endif
}

/* the CPU's level, detected once: cpuid traps to the hypervisor in a VM (tens of us, measured on
 * the dev box), far more than a small expert product costs. Racing first calls store the same. */
static int cpu_level(void) {
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = detect_level();
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
}

/* 1 on AMD CPUs (cpuid leaf 0 vendor "AuthenticAMD") */
static int cpu_is_amd(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#else
    return 0;
#endif
}

/* prefetch.h's one-row-stream distance: PF_STREAM_AMD on AMD, 0 (the one-call-ahead rule)
 * elsewhere; DRAMA_CPU_PF_STREAM=<bytes> sets it (0: the call rule everywhere). Decided once, as
 * cpu_level; the value moves prefetches only, never results. */
int64_t dr_cpu_pf_stream_parse(const char *e, int64_t dflt) {
    if (!e || !*e) return dflt;
    char *end;
    errno = 0;
    long long b = strtoll(e, &end, 10);
    if (*end || errno || b < 0 || b > PF_SPAN_MAX) {
        dr_log(DR_LOG_WARN, "DRAMA_CPU_PF_STREAM=%s is not a byte count in [0, %d]; ignored", e, PF_SPAN_MAX);
        return dflt;
    }
    return b;
}

int64_t dr_cpu_pf_stream(void) {
    static int64_t dist = -1;
    int64_t v = __atomic_load_n(&dist, __ATOMIC_RELAXED);
    if (v < 0) {
        v = dr_cpu_pf_stream_parse(getenv("DRAMA_CPU_PF_STREAM"), cpu_is_amd() ? PF_STREAM_AMD : 0);
        __atomic_store_n(&dist, v, __ATOMIC_RELAXED);
    }
    return v;
}

static int path_level(dr_cpu_path p) {
    return p >= DR_CPU_AVX512 && p <= DR_CPU_AVX512_PLANT4 ? 2 : p >= DR_CPU_AVX2 && p <= DR_CPU_AVX2_PLANT4 ? 1 : 0;
}

int dr_cpu_path_supported(dr_cpu_path p) { return p >= DR_CPU_PORTABLE && path_level(p) <= cpu_level(); }

static dr_cpu_path detect_best_path(void) {
    static const dr_cpu_path by_level[3] = {DR_CPU_PORTABLE, DR_CPU_AVX2, DR_CPU_AVX512};
    int l = cpu_level();
    const char *want = getenv("DRAMA_CPU_PATH"); /* a cap for measurements: avx2 on an AVX-512 CPU */
    if (want && *want) {
        int cap = !strcmp(want, "portable") ? 0 : !strcmp(want, "avx2") ? 1 : !strcmp(want, "avx512") ? 2 : -1;
        if (cap < 0)
            dr_log(DR_LOG_WARN, "DRAMA_CPU_PATH=%s is not one of portable, avx2, avx512; ignored", want);
        else if (cap < l)
            l = cap;
    }
    return by_level[l];
}

dr_cpu_path dr_cpu_best_path(void) {
    static int best = -1;
    int b = __atomic_load_n(&best, __ATOMIC_RELAXED);
    if (b < 0) {
        b = (int)detect_best_path();
        __atomic_store_n(&best, b, __ATOMIC_RELAXED);
    }
    return (dr_cpu_path)b;
}

const char *dr_cpu_path_name(dr_cpu_path p) {
    switch (p) {
    case DR_CPU_PORTABLE: return "portable";
    case DR_CPU_AVX2: return "avx2";
    case DR_CPU_AVX2_PLANT1:
    case DR_CPU_AVX2_PLANT2:
    case DR_CPU_AVX2_PLANT3:
    case DR_CPU_AVX2_PLANT4: return "avx2-planted";
    case DR_CPU_AVX512: return "avx512";
    case DR_CPU_AVX512_PLANT1:
    case DR_CPU_AVX512_PLANT2:
    case DR_CPU_AVX512_PLANT3:
    case DR_CPU_AVX512_PLANT4: return "avx512-planted";
    default: return "auto";
    }
}

static float dot_portable(const float *x, const float *w, int64_t len) {
    float s[32] = {0};
    int64_t k = 0;
    for (; k + 32 <= len; k += 32)
        for (int j = 0; j < 32; j++) s[j] = fmaf(x[k + j], w[k + j], s[j]);
    float v[8];
    for (int j = 0; j < 8; j++) v[j] = (s[j] + s[8 + j]) + (s[16 + j] + s[24 + j]);
    float t = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; k < len; k++) t = fmaf(x[k], w[k], t);
    return t;
}

static dr_cpu_path resolve(dr_cpu_path path) {
    dr_cpu_path best = dr_cpu_best_path();
    if (path == DR_CPU_AUTO) return best;
    return dr_cpu_path_supported(path) ? path : DR_CPU_PORTABLE;
}

#define VEC_FNS(prefix) {prefix##_dequant_row, prefix##_fused_row, prefix##_fused_rows, prefix##_order_x, prefix##_dot_rows}
static const dr_cpu_vec_fns k_vec[] = {VEC_FNS(dr_cpu_avx2),       VEC_FNS(dr_cpu_avx2p1),      VEC_FNS(dr_cpu_avx2p2),
                                       VEC_FNS(dr_cpu_avx2p3),     VEC_FNS(dr_cpu_avx2p4),      VEC_FNS(dr_cpu_avx512),
                                       VEC_FNS(dr_cpu_avx512p1), VEC_FNS(dr_cpu_avx512p2), VEC_FNS(dr_cpu_avx512p3),
                                       VEC_FNS(dr_cpu_avx512p4)};

/* the vector entry points of a resolved path; NULL for the portable one */
static const dr_cpu_vec_fns *vec_of(dr_cpu_path p) {
    return p >= DR_CPU_AVX2 && p <= DR_CPU_AVX512_PLANT4 ? &k_vec[p - DR_CPU_AVX2] : NULL;
}

float dr_cpu_dot_path(const float *x, const float *w, int64_t len, dr_cpu_path path) {
    const dr_cpu_vec_fns *v = vec_of(resolve(path));
    if (v) {
        float y;
        v->dot_rows(x, len, 1, w, len, &y, 1);
        return y;
    }
    return dot_portable(x, w, len);
}

void dr_cpu_dequant_row_path(const dr_weight *w, int64_t r, float *out, dr_cpu_path path) {
    const dr_cpu_vec_fns *v = vec_of(resolve(path));
    if (v)
        v->dequant_row(w, r, out);
    else
        dr_weight_dequant_row(w, r, out);
}

/* Batched products (n > 1, prefill) take weight rows in blocks of up to MM_ROWS: the block is
 * dequantised once into the worker's scratch, then activation rows are visited in tiles of
 * MM_XTILE so a tile and the block stay in L2 while every pair meets. Each y element is still one
 * canonical dot product, so the tiling changes speed only, never bits. */
enum { MM_ROWS = 16, MM_XTILE = 16 };

typedef struct mm_job {
    const dr_weight *w;
    int64_t r0;       /* first weight row */
    int64_t nrows;    /* r1 - r0 */
    const float *x;
    const float *x_fused; /* n == 1, AVX2: x in the fused loop's order (dr_cpu_avx2_order_x) */
    int64_t n;        /* activation rows */
    float *y;
    int64_t ldy;      /* r1 - r0 */
    float *scratch;   /* per worker: scratch_rows dequantised rows */
    int64_t ld_scratch;
    int rows_per_task;
    int scratch_rows; /* rows_per_task, or 1 when n == 1 (the fused loops need no buffer) */
    const dr_cpu_vec_fns *vec; /* NULL: portable */
    dr_cpu_block_fn block;     /* n > 1: register-blocked tiles (matmul_block.c), or NULL */
} mm_job;

static void dequant(const mm_job *j, int64_t r, float *out) {
    if (j->vec) j->vec->dequant_row(j->w, r, out);
    else dr_weight_dequant_row(j->w, r, out);
}

/* y[b * ldy] = dot(x_b, wrow) for the nb activation rows starting at x */
static void dots(const mm_job *j, const float *x, int64_t nb, const float *wrow, float *y) {
    int64_t cols = j->w->cols;
    if (j->vec) j->vec->dot_rows(x, cols, nb, wrow, cols, y, j->ldy);
    else
        for (int64_t b = 0; b < nb; b++) y[b * j->ldy] = dot_portable(x + b * cols, wrow, cols);
}

/* Task t: weight rows [t * rows_per_task, ...) (relative to r0) against every activation row.
 * Each y element is produced by exactly one task, with a fixed operation order, so the split over
 * workers cannot change it. */
static void mm_task(void *ctx, int64_t t, int worker) {
    mm_job *j = ctx;
    int64_t cols = j->w->cols;
    int64_t i0 = t * j->rows_per_task, i1 = i0 + j->rows_per_task < j->nrows ? i0 + j->rows_per_task : j->nrows;
    float *buf = j->scratch + (size_t)worker * (size_t)j->scratch_rows * (size_t)j->ld_scratch;
    if (j->n == 1) {
        if (j->vec && j->vec->fused_rows && j->vec->fused_rows(j->w, j->r0 + i0, (int)(i1 - i0), j->x_fused, j->y + i0))
            return;
        for (int64_t i = i0; i < i1; i++) {
            if (j->vec && j->vec->fused_row(j->w, j->r0 + i, j->x_fused, j->y + i)) continue;
            dequant(j, j->r0 + i, buf);
            dots(j, j->x, 1, buf, j->y + i);
        }
        return;
    }
    for (int64_t i = i0; i < i1; i++) dequant(j, j->r0 + i, buf + (i - i0) * j->ld_scratch);
    for (int64_t b0 = 0; b0 < j->n; b0 += MM_XTILE) {
        int64_t nb = j->n - b0 < MM_XTILE ? j->n - b0 : MM_XTILE;
        if (j->block) {
            j->block(j->x + b0 * cols, cols, nb, buf, j->ld_scratch, i1 - i0, cols, j->y + b0 * j->ldy + i0, j->ldy);
            continue;
        }
        for (int64_t i = i0; i < i1; i++)
            dots(j, j->x + b0 * cols, nb, buf + (i - i0) * j->ld_scratch, j->y + b0 * j->ldy + i);
    }
}

void dr_cpu_matmul_path(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                        dr_pool *pool, dr_cpu_path path) {
    dr_cpu_path p = resolve(path);
    /* n > 1 block kernels: AVX-512 on the AVX-512 path; on the AVX2 path the best one, unless
     * DRAMA_CPU_PATH capped the machine at AVX2 */
    dr_cpu_block_fn block = p == DR_CPU_AVX512                                  ? dr_cpu_block_kernel(DR_CPU_BLOCK_AVX512, 0)
                            : p == DR_CPU_AVX2 && dr_cpu_best_path() == DR_CPU_AVX2 ? dr_cpu_block_kernel(DR_CPU_BLOCK_AVX2, 0)
                            : p == DR_CPU_AVX2                                   ? dr_cpu_block_kernel(DR_CPU_BLOCK_BEST, 0)
                                                                                 : NULL;
    dr_cpu_matmul_block(w, r0, r1, x, n, y, pool, p, block);
}

void dr_cpu_matmul_block(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                         dr_pool *pool, dr_cpu_path path, dr_cpu_block_fn block) {
    if (!w || n <= 0 || r1 <= r0) return;
    int threads = pool ? dr_pool_threads(pool) : 1;
    if (threads < 1) threads = 1;
    mm_job j = {.w = w, .r0 = r0, .nrows = r1 - r0, .x = x, .n = n, .y = y, .ldy = r1 - r0, .vec = vec_of(resolve(path)),
              .block = n > 1 ? block : NULL};
    j.ld_scratch = (w->cols + 15) & ~(int64_t)15; /* keep each row on its own cache lines */
    /* at most 64 KiB of rows per worker: stays in L2 and below malloc's mmap threshold, which
     * matters when callers (the MoE) issue many small products */
    j.rows_per_task = n == 1 ? (j.vec && j.vec->fused_rows ? DR_CPU_FUSED_ROWS : 1)
                             : (int)(16384 / j.ld_scratch > MM_ROWS ? MM_ROWS : 16384 / j.ld_scratch);
    if (j.rows_per_task < 1) j.rows_per_task = 1;
    j.scratch_rows = n == 1 ? 1 : j.rows_per_task;
    size_t bytes;
    if (r0 < 0 || r1 > w->rows || w->cols <= 0 ||
        !dr_mul_size((size_t)threads * (size_t)j.scratch_rows * 4 + 4, (size_t)j.ld_scratch, &bytes) ||
        !(j.scratch = dr_alloc(bytes + 4 * (size_t)DR_CPU_XORDER_EXTRA))) {
        dr_log(DR_LOG_ERROR, "matmul %s: bad row range [%lld, %lld) or out of memory; output set to NaN",
               w->name ? w->name : "weight", (long long)r0, (long long)r1);
        for (int64_t i = 0; i < n * (r1 - r0); i++) y[i] = NAN;
        return;
    }
    /* the last row of scratch (4 bytes per element of the +4 above) holds the reordered x, then
     * DR_CPU_XORDER_EXTRA floats of the path's per-product tables */
    float *xo = j.scratch + (size_t)threads * (size_t)j.scratch_rows * (size_t)j.ld_scratch;
    j.x_fused = n == 1 && j.vec && j.vec->order_x(w, x, xo) ? xo : x;
    dr_pool_run_work(pool, (j.nrows + j.rows_per_task - 1) / j.rows_per_task, mm_task, &j,
                     (double)j.nrows * (double)w->cols * (double)n);
    dr_free(j.scratch);
}

void dr_cpu_matmul_rows(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                        dr_pool *pool) {
    dr_cpu_matmul_path(w, r0, r1, x, n, y, pool, DR_CPU_AUTO);
}

void dr_cpu_matmul(const dr_weight *w, const float *x, int64_t n, float *y, dr_pool *pool) {
    if (!w) return;
    dr_cpu_matmul_path(w, 0, w->rows, x, n, y, pool, DR_CPU_AUTO);
}
