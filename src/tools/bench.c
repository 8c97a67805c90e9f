/* bench.c - the shared parts of `drama bench`: clock, read bandwidth, table lines, roofline. */
#include "tools/bench.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/cli_args.h"

double dr_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double dr_bench_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 32-byte lanes (GCC vector extension) so the sum keeps up with memory on one core without
 * depending on -march; integer adds, so nothing is reordered or skipped. */
typedef uint64_t v4u64 __attribute__((vector_size(32)));

typedef struct read_job {
    const v4u64 *buf;
    int64_t per_task; /* vectors per task */
    uint64_t *sums;
} read_job;

static void read_task(void *ctx, int64_t i, int worker) {
    (void)worker;
    const read_job *j = ctx;
    const v4u64 *p = j->buf + i * j->per_task;
    v4u64 a = {0}, b = {0}, c = {0}, d = {0};
    for (int64_t k = 0; k + 4 <= j->per_task; k += 4) {
        a += p[k];
        b += p[k + 1];
        c += p[k + 2];
        d += p[k + 3];
    }
    v4u64 s = a + b + c + d;
    j->sums[i] = s[0] + s[1] + s[2] + s[3];
}

double dr_bench_read_gbs(dr_pool *pool, size_t bytes, int reps) {
    if (!bytes) bytes = (size_t)1 << 30;
    if (reps <= 0) reps = 5;
    int tasks = dr_pool_threads(pool) * 4;
    if (tasks < 1) tasks = 4;
    int64_t per = (int64_t)(bytes / sizeof(v4u64)) / tasks / 4 * 4;
    if (per < 4) return 0;
    v4u64 *buf = dr_alloc((size_t)per * (size_t)tasks * sizeof(v4u64));
    uint64_t *sums = dr_calloc((size_t)tasks, sizeof *sums);
    if (!buf || !sums) {
        dr_free(buf);
        dr_free(sums);
        return 0;
    }
    memset(buf, 1, (size_t)per * (size_t)tasks * sizeof(v4u64)); /* touch every page first */
    read_job j = {.buf = buf, .per_task = per, .sums = sums};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = dr_bench_now();
        dr_pool_run(pool, tasks, read_task, &j);
        double t = dr_bench_now() - t0;
        if (t < best) best = t;
    }
    uint64_t check = 0;
    for (int i = 0; i < tasks; i++) check += sums[i];
    dr_free(buf);
    dr_free(sums);
    if (check == 0) return 0; /* every byte is 1: a zero sum means the reads did not happen */
    return (double)per * (double)tasks * (double)sizeof(v4u64) / best / 1e9;
}

void dr_bench_line(const char *name, double value, int decimals, const char *unit) {
    printf("  %-28s %14.*f %s\n", name, decimals, value, unit ? unit : "");
}

double dr_bench_roofline(double seconds_per_step, double bytes_per_step, double gbs, const char *bandwidth_from) {
    double floor_s = gbs > 0 ? bytes_per_step / (gbs * 1e9) : 0;
    dr_bench_line("bytes_per_step", bytes_per_step / 1e6, 3, "MB");
    dr_bench_line("achieved", seconds_per_step > 0 ? bytes_per_step / seconds_per_step / 1e9 : 0, 2, "GB/s");
    dr_bench_line("bandwidth", gbs, 2, bandwidth_from ? bandwidth_from : "GB/s");
    dr_bench_line("floor", floor_s * 1e3, 4, "ms/step");
    double ratio = floor_s > 0 ? seconds_per_step / floor_s : 0;
    printf("ratio_to_floor %.3f\n", ratio);
    return ratio;
}

/* `drama bench bandwidth [--threads T] [--mib N]`: the read bandwidth every roofline divides by. */
int dr_bench_bandwidth_main(int argc, char **argv) {
    long long threads = 1, mib = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: drama bench bandwidth [--threads T] [--mib N]\n"
                   "  STREAM-like read of an N MiB buffer (default 1024) on T threads (default 1, 0 = all CPUs),\n"
                   "  best of 5 passes, in GB/s (1e9 bytes/s).\n");
            return 0;
        } else if (!strcmp(a, "--threads")) {
            if (!dr_cli_int("bench bandwidth", a, v, 0, 4096, &threads)) return 2;
            i++;
        } else if (!strcmp(a, "--mib")) {
            if (!dr_cli_int("bench bandwidth", a, v, 1, 1 << 20, &mib)) return 2;
            i++;
        } else {
            fprintf(stderr, "drama bench bandwidth: unknown option '%s'\n", a);
            return 2;
        }
    }
    dr_pool *pool = dr_pool_create((int)threads);
    if (!pool) {
        fprintf(stderr, "drama bench bandwidth: cannot start %lld threads\n", threads);
        return 1;
    }
    double gbs = dr_bench_read_gbs(pool, (size_t)mib << 20, 5);
    printf("bench bandwidth: read %lld MiB, %d threads\n", mib, dr_pool_threads(pool));
    dr_pool_free(pool);
    if (gbs <= 0) {
        fprintf(stderr, "drama bench bandwidth: could not allocate %lld MiB\n", mib);
        return 1;
    }
    dr_bench_line("read_bandwidth", gbs, 2, "GB/s");
    return 0;
}
