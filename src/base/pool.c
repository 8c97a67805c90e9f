/* pool.c - the thread pool of pool.h.
 * A run publishes its job, then a ticket (generation << 32 | next chunk) that every thread,
 * the caller included, advances by compare-and-swap to claim a chunk; a claim succeeds only while
 * the generation is the one the thread read the job for and chunks remain, so a late worker never
 * runs a stale or half-written job. Idle workers spin on the generation word for SPIN_NS, then
 * sleep on it (futex); the caller issues a wake only when some worker sleeps. The caller waits for
 * the chunk count the same way (spin, then futex). */
#include "base/pool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <stdlib.h>
void dr_trace(const char *what);
void dr_trace(const char *what) {
    static double t0 = -1; if (!getenv("POOL_TRACE")) return;
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); double t = ts.tv_sec + ts.tv_nsec * 1e-9;
    if (t0 < 0) { t0 = t; }
    fprintf(stderr, "TRACE %8.2f ms %s\n", (t - t0) * 1e3, what);
}
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* how long an idle thread polls before sleeping: longer than the gap between two products of a
 * decode step (norms, attention: tens of us), short enough not to burn a shared core for long */
#define SPIN_NS 200000
/* past this much polling, each poll also yields the core: with more runnable threads than cores
 * (--threads above the core count, or another thread of the process announced work through
 * dr_pool_yield_to) the thread that holds the work gets to run. Otherwise idle threads poll
 * without yielding until SPIN_NS: a poll that yields answers the next run late (a sched_yield
 * per 64 polls; on the 2-core AMD a 2 us run took 34.6 us with a 30 us gap before it at 2
 * threads against 32.5 us at 1), and a frame step's runs come 20-100 us apart (the sampler) */
#define YIELD_NS 20000
/* chunks per taking-part thread: small enough to balance a descheduled thread's share; a small
 * run takes fewer (every chunk is a claim and a count on a shared line, ~0.1-0.3 us each in a VM),
 * down to MIN_CHUNKS, so that the threads that start late still find work */
#define CHUNKS_PER_THREAD 8
#define MIN_CHUNKS 2
/* Every claim and every finished chunk is an atomic on a line all taking-part threads share, so
 * with many threads they queue on it: past CLAIM_THREADS threads a chunk's least work grows with
 * the thread count (x use / CLAIM_THREADS), so that a small run (an n = 1 product of a decode
 * step: 2048 x 2048 is 4.2 M units, 2 chunks per thread at 16) makes fewer claims; large runs
 * keep CHUNKS_PER_THREAD, and 1-2 threads are unchanged. Issue 17's 16-core n = 1 products fit
 * a fixed ~26 us per product that the chunk claims could explain (bench/RESULTS.md, "CPU 4-bit
 * n = 1, third pass"). Default 0 (off, the rule before): on the 16-core host the rule at 2 made
 * the AVX2 16-thread products and the q4 decode step slower (RESULTS "sixth pass", call 5);
 * DRAMA_POOL_CLAIM_THREADS=N turns it on, for measuring. */
#define CLAIM_THREADS 0

static int claim_threads(void) {
    static int v = -1;
    int c = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (c < 0) {
        const char *e = getenv("DRAMA_POOL_CLAIM_THREADS");
        c = e && *e ? atoi(e) : CLAIM_THREADS;
        if (c < 0) c = 0;
        __atomic_store_n(&v, c, __ATOMIC_RELAXED);
    }
    return c;
}
#define CACHE_LINE 64

/* Three cache lines, each written by one side of a run: the job (caller, then claims), the
 * generation idle workers poll (caller, once per run), the count the caller polls (workers). A
 * poller's line changes only when it has something to see. */
struct dr_pool {
    /* the job of the current generation; written by the caller before the ticket, read by
     * workers between reading the ticket and claiming (relaxed: the ticket orders them) */
    _Alignas(CACHE_LINE) _Atomic(dr_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n, chunk;
    _Atomic uint32_t n_chunks;
    _Atomic int helpers;           /* worker ids below this take part */
    _Atomic uint64_t ticket;       /* generation << 32 | next unclaimed chunk */
    _Alignas(CACHE_LINE) _Atomic uint32_t gen; /* futex word of idle workers */
    _Atomic int sleepers;          /* workers in (or entering) futex wait on gen */
    _Atomic int stop;
    _Atomic int yield_to;          /* dr_pool_yield_to: other threads with work for the cores */
    int oversubscribed;            /* more threads than CPUs this process may use, or DRAMA_POOL_YIELD=always */
    _Alignas(CACHE_LINE) _Atomic uint32_t done; /* chunks finished; futex word of the waiting caller */
    _Atomic int caller_sleeping;
    _Alignas(CACHE_LINE) int n_threads;
    pthread_t *threads;
    uint32_t generation;           /* the caller's copy */
};

typedef struct { dr_pool *pool; int id; } worker_arg;

static void futex_wait(_Atomic uint32_t *word, uint32_t expect) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
#else
    (void)word, (void)expect;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
#endif
}

static void futex_wake(_Atomic uint32_t *word, int count) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
#else
    (void)word, (void)count;
#endif
}

/* past YIELD_NS of polling: yield the core only when someone else may need it */
static int should_yield(dr_pool *p) {
    return p->oversubscribed || atomic_load_explicit(&p->yield_to, memory_order_relaxed) > 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claims and runs chunks of generation g until none is left or the generation moved on. */
static void take_chunks(dr_pool *p, uint32_t g, int id) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != g) return;
        uint32_t c = (uint32_t)t;
        uint32_t nc = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
        if (c >= nc) return;
        dr_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        int64_t n = atomic_load_explicit(&p->n, memory_order_relaxed);
        int64_t chunk = atomic_load_explicit(&p->chunk, memory_order_relaxed);
        /* pairs with the caller's fence after it closes the ticket: a field of the next job read
         * above makes the claim below fail */
        atomic_thread_fence(memory_order_acquire);
        /* success means generation g is still running (chunk c was not done), so the fields
         * read above were g's: the caller closes g's ticket before it rewrites them */
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        int64_t i0 = (int64_t)c * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        for (int64_t i = i0; i < i1; i++) fn(ctx, i, id);
        if (atomic_fetch_add(&p->done, 1) + 1 == nc && /* seq_cst: pairs with caller_sleeping */
            atomic_load(&p->caller_sleeping))
            futex_wake(&p->done, 1);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    dr_pool *p = wa->pool;
    int id = wa->id;
    free(wa);
    uint32_t seen = atomic_load(&p->gen);
    for (;;) {
        uint32_t g;
        int64_t t0 = 0;
        for (int spins = 0; (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen; spins++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            CPU_RELAX();
            if ((spins & 63) != 63) continue;
            int64_t t = now_ns();
            if (!t0) t0 = t;
            if (t - t0 > YIELD_NS && should_yield(p)) sched_yield(); /* let the others run */
            if (t - t0 < SPIN_NS) continue;
            atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's gen store + load */
            if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            t0 = 0;
        }
        seen = g;
        if (id < atomic_load_explicit(&p->helpers, memory_order_relaxed)) take_chunks(p, g, id);
    }
}

/* the number of distinct (package, core) pairs among the CPUs this process may use; 0 if unknown */
static int physical_cores(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int n = 0;
    long *keys = malloc(sizeof(long) * CPU_SETSIZE);
    if (!keys) return 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        long id[2] = {-1, -1};
        const char *what[2] = {"physical_package_id", "core_id"};
        for (int k = 0; k < 2; k++) {
            char path[128];
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what[k]);
            FILE *f = fopen(path, "r");
            if (!f || fscanf(f, "%ld", &id[k]) != 1) id[k] = -1;
            if (f) fclose(f);
        }
        if (id[0] < 0 || id[1] < 0) { free(keys); return 0; } /* no topology: let the caller fall back */
        long key = id[0] * 65536 + id[1];
        int dup = 0;
        for (int j = 0; j < n && !dup; j++) dup = keys[j] == key;
        if (!dup) keys[n++] = key;
    }
    free(keys);
    return n;
#else
    return 0;
#endif
}

/* CPUs in this process's affinity mask (online CPUs where it cannot be read) */
static int usable_cpus(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

int dr_pool_default_threads(void) {
    int n = physical_cores();
    if (n > 0) return n;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

dr_pool *dr_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = dr_pool_default_threads();
    dr_pool *p = aligned_alloc(CACHE_LINE, (sizeof *p + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads;
    const char *y = getenv("DRAMA_POOL_YIELD"); /* "always": the rule before (yield past YIELD_NS) */
    p->oversubscribed = n_threads > usable_cpus() || (y && !strcmp(y, "always"));
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        if (!p->threads) { free(p); return NULL; }
        /* worker 0 is the calling thread; start 1..n-1 */
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) *wa = (worker_arg){p, i};
            if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i;
                dr_pool_free(p);
                return NULL;
            }
        }
    }
    return p;
}

void dr_pool_free(dr_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int i = 1; i < p->n_threads && p->threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int dr_pool_threads(const dr_pool *p) { return p ? p->n_threads : 1; }

void dr_pool_yield_to(dr_pool *p, int delta) {
    if (p) atomic_fetch_add_explicit(&p->yield_to, delta, memory_order_relaxed);
}

void dr_pool_run_work(dr_pool *p, int64_t n, dr_pool_fn fn, void *ctx, double work) {
    if (n <= 0) return;
    int use = p ? p->n_threads : 1;
    if (work >= 0 && work < DR_POOL_MIN_WORK * use) use = (int)(work / DR_POOL_MIN_WORK);
    if (use > n) use = (int)n;
    if (use <= 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    /* work / use per thread; a chunk of at least DR_POOL_MIN_WORK / 2, times use / CLAIM_THREADS
     * past CLAIM_THREADS threads */
    int per = CHUNKS_PER_THREAD, ct = claim_threads();
    double grain = DR_POOL_MIN_WORK / 2 * (ct > 0 && use > ct ? (double)use / ct : 1.0);
    if (work >= 0 && work < (double)use * CHUNKS_PER_THREAD * grain) per = (int)(work / ((double)use * grain));
    if (per < MIN_CHUNKS) per = MIN_CHUNKS;
    int64_t want = (int64_t)use * per;
    int64_t chunk = (n + want - 1) / want;
    if ((n + chunk - 1) / chunk > UINT32_MAX) chunk = (n + UINT32_MAX - 1) / UINT32_MAX;
    uint32_t nc = (uint32_t)((n + chunk - 1) / chunk);
    uint32_t g = ++p->generation;
    /* Close the previous ticket first: a worker still in take_chunks for the previous generation
     * holds its last value (all chunks claimed) and must not claim a "chunk" of it against this
     * run's n_chunks (that ran a chunk twice and left the count one over: a hang) */
    atomic_store_explicit(&p->ticket, (uint64_t)g << 32 | UINT32_MAX, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n, n, memory_order_relaxed);
    atomic_store_explicit(&p->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&p->n_chunks, nc, memory_order_relaxed);
    atomic_store_explicit(&p->helpers, use, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->ticket, (uint64_t)g << 32, memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: a worker past its check is counted in sleepers */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, INT_MAX);
    take_chunks(p, g, 0);
    int64_t t0 = 0;
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) != nc; spins++) {
        CPU_RELAX();
        if ((spins & 63) != 63) continue;
        int64_t t = now_ns();
        if (!t0) t0 = t;
        if (t - t0 > YIELD_NS && should_yield(p)) sched_yield();
        if (t - t0 < SPIN_NS) continue;
        atomic_store(&p->caller_sleeping, 1);
        uint32_t d;
        while ((d = atomic_load(&p->done)) != nc) futex_wait(&p->done, d);
        atomic_store(&p->caller_sleeping, 0);
    }
}

void dr_pool_run(dr_pool *p, int64_t n, dr_pool_fn fn, void *ctx) { dr_pool_run_work(p, n, fn, ctx, -1.0); }
