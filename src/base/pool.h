/* pool.h - a fixed thread pool running data-parallel loops.
 * dr_pool_run(pool, n, fn, ctx) calls fn(ctx, i, worker) for every i in [0, n) exactly once and
 * returns when all are done. Indices are claimed in contiguous chunks by whichever thread is free
 * (the caller is worker 0 and takes part), so a result that a caller keeps per index (not per
 * worker; `worker` is only for scratch space) is independent of the thread count and of timing.
 * Workers spin for a bounded time after a run (yielding their core past 20 us only when it may be
 * wanted: dr_pool_yield_to, more threads than CPUs), then sleep (futex), so back-to-back runs cost no
 * system call; dr_pool_run_work takes an estimate of the whole run's work and keeps small runs on
 * the calling thread. A NULL pool or a pool of 1 thread runs inline. Not reentrant. */
#ifndef DRAMA_BASE_POOL_H
#define DRAMA_BASE_POOL_H

#include <stdint.h>

typedef struct dr_pool dr_pool;
typedef void (*dr_pool_fn)(void *ctx, int64_t i, int worker);

/* Work below which a run stays on the calling thread (and the grain per extra thread), in the
 * units callers pass to dr_pool_run_work: about one multiply-add of a SIMD product or one byte of
 * weights read (an op whose multiply-adds cost more scales its estimate). 32768 units are ~3-5 us
 * on one core; waking a spinning worker costs ~1 us, a sleeping one ~10-50 us in a VM. */
#define DR_POOL_MIN_WORK 32768.0

dr_pool *dr_pool_create(int n_threads); /* n_threads <= 0: dr_pool_default_threads() */
void dr_pool_free(dr_pool *pool);
int dr_pool_threads(const dr_pool *pool);
/* Physical cores this process may run on (SMT siblings counted once, from /sys topology and the
 * affinity mask), or the online CPUs where the topology cannot be read. */
int dr_pool_default_threads(void);
void dr_pool_run(dr_pool *pool, int64_t n, dr_pool_fn fn, void *ctx);
/* Another thread of this process starts (+1) or ends (-1) work that wants the cores (the
 * overlapped codec decoder): while any is pending, this pool's idle threads yield their core
 * after 20 us of polling, as they always do when the pool has more threads than usable CPUs;
 * otherwise they poll without yielding until they sleep (a yielding poll answers a run late).
 * Any thread may call it; NULL pool: nothing. */
void dr_pool_yield_to(dr_pool *pool, int delta);
/* Like dr_pool_run, with `work` the estimated cost of all n items: below DR_POOL_MIN_WORK the run
 * stays inline, otherwise at most work / DR_POOL_MIN_WORK threads take part. work < 0: unknown. */
void dr_pool_run_work(dr_pool *pool, int64_t n, dr_pool_fn fn, void *ctx, double work);

#endif
