#include "base/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct dr_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    uint64_t generation; /* bumps once per dr_pool_run */
    int pending;         /* workers still busy with this generation */
    int stop;
    int64_t n;
    dr_pool_fn fn;
    void *ctx;
};

typedef struct { dr_pool *pool; int id; } worker_arg;

static void run_range(dr_pool *p, int id) {
    int64_t per = p->n / p->n_threads, rem = p->n % p->n_threads;
    int64_t begin = id * per + (id < rem ? id : rem);
    int64_t end = begin + per + (id < rem ? 1 : 0);
    for (int64_t i = begin; i < end; i++) p->fn(p->ctx, i, id);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    dr_pool *p = wa->pool;
    int id = wa->id;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_range(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dr_pool *dr_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    dr_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        if (!p->threads) { dr_pool_free(p); return NULL; }
        /* worker 0 is the calling thread; start 1..n-1 */
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { p->n_threads = i; dr_pool_free(p); return NULL; }
            wa->pool = p;
            wa->id = i;
            if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
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
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads && p->threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

int dr_pool_threads(const dr_pool *p) { return p ? p->n_threads : 1; }

void dr_pool_run(dr_pool *p, int64_t n, dr_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->n = n;
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_range(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
