/* pool.h - a fixed thread pool running data-parallel loops.
 * dr_pool_run(pool, n, fn, ctx) calls fn(ctx, i, worker) for every i in [0, n) and returns
 * when all are done. Work is split into contiguous ranges by index, so any reduction that a
 * caller keeps per index (not per worker) is independent of the thread count. A NULL pool or
 * a pool of 1 thread runs inline. The pool is owned by its creator; not reentrant. */
#ifndef DRAMA_BASE_POOL_H
#define DRAMA_BASE_POOL_H

#include <stdint.h>

typedef struct dr_pool dr_pool;
typedef void (*dr_pool_fn)(void *ctx, int64_t i, int worker);

dr_pool *dr_pool_create(int n_threads); /* n_threads <= 0: number of online CPUs */
void dr_pool_free(dr_pool *pool);
int dr_pool_threads(const dr_pool *pool);
void dr_pool_run(dr_pool *pool, int64_t n, dr_pool_fn fn, void *ctx);

#endif
