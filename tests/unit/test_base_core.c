/* Unit tests of src/base: error records, dtypes, allocation, thread pool. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/pool.h"
#include "base/tensor.h"

static void test_first_error_wins_and_prefix(void **state) {
    (void)state;
    drama_error e = {0};
    assert_int_equal(dr_fail(&e, DRAMA_EFORMAT, "tensor %s: bad", "x"), DRAMA_EFORMAT);
    assert_int_equal(dr_fail(&e, DRAMA_EIO, "later"), DRAMA_EIO);
    assert_int_equal(e.code, DRAMA_EFORMAT);
    dr_error_prefix(&e, "%s: ", "model.safetensors");
    assert_string_equal(e.message, "model.safetensors: tensor x: bad");
    assert_int_equal(dr_fail(NULL, DRAMA_EIO, "no record"), DRAMA_EIO);
    assert_string_equal(drama_status_name(DRAMA_EFRAMELIMIT), "frame_limit");
}

static void test_dtypes(void **state) {
    (void)state;
    assert_int_equal(dr_dtype_from_name("F8_E4M3"), DR_DT_F8_E4M3);
    assert_int_equal(dr_dtype_size(DR_DT_BF16), 2);
    assert_int_equal(dr_dtype_from_name("F4"), DR_DT_F4);
    assert_int_equal(dr_dtype_bits(DR_DT_F4), 4);
    assert_int_equal(dr_dtype_size(DR_DT_F4), 0); /* not a whole number of bytes */
    assert_int_equal(dr_dtype_size(DR_DT_F8_E8M0), 1);
    assert_int_equal(dr_dtype_from_name("F2"), DR_DT_INVALID);
    assert_int_equal(dr_dtype_from_name("bf16"), DR_DT_INVALID);
    assert_int_equal(dr_dtype_from_name(NULL), DR_DT_INVALID);
    assert_string_equal(dr_dtype_name(DR_DT_U32), "U32");
}

static void test_alloc_overflow(void **state) {
    (void)state;
    size_t out;
    assert_int_equal(dr_mul_size(SIZE_MAX / 2, 3, &out), 0);
    assert_null(dr_calloc(SIZE_MAX / 2, 3));
    void *p = dr_alloc(100);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % DR_ALIGN, 0);
    dr_free(p);
}

static void add_index(void *ctx, int64_t i, int worker) {
    (void)worker;
    ((int64_t *)ctx)[i] = i * i;
}

static void test_pool_covers_every_index(void **state) {
    (void)state;
    for (int threads = 1; threads <= 4; threads++) {
        dr_pool *p = dr_pool_create(threads);
        assert_non_null(p);
        for (int64_t n = 0; n < 37; n += 5) {
            int64_t out[40];
            memset(out, 0xff, sizeof out);
            dr_pool_run(p, n, add_index, out);
            for (int64_t i = 0; i < n; i++) assert_int_equal(out[i], i * i);
            assert_int_equal(out[n], -1);
        }
        dr_pool_free(p);
    }
}

/* each index counted, and the worker that ran it recorded */
typedef struct { _Atomic int *hits; int *who; int threads; _Atomic int bad_worker; } count_ctx;

static void count_index(void *ctx, int64_t i, int worker) {
    count_ctx *c = ctx;
    atomic_fetch_add(&c->hits[i], 1);
    c->who[i] = worker;
    if (worker < 0 || worker >= c->threads) atomic_store(&c->bad_worker, 1);
}

/* Many back-to-back runs of varied sizes (the steady state of a decode step, where workers spin
 * between runs) and runs after a sleep (workers asleep on the futex): every index exactly once,
 * worker ids in range, and a run whose work is below the threshold stays on the caller. */
static void test_pool_exactly_once_and_threshold(void **state) {
    (void)state;
    enum { N = 1000 };
    _Atomic int hits[N];
    int who[N];
    for (int threads = 1; threads <= 3; threads++) {
        dr_pool *p = dr_pool_create(threads);
        assert_non_null(p);
        assert_int_equal(dr_pool_threads(p), threads);
        count_ctx c = {hits, who, threads, 0};
        for (int rep = 0; rep < 3000; rep++) {
            int64_t n = 1 + (rep * 37) % N;
            for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
            if (rep % 1000 == 999) usleep(300000); /* past the spin: the workers sleep */
            /* unknown work, large work, and work of a few grains (fewer chunks per thread) */
            double work = rep % 3 == 0 ? -1.0 : rep % 3 == 1 ? 1e9 : DR_POOL_MIN_WORK * (1 + rep % 11);
            dr_pool_run_work(p, n, count_index, &c, work);
            for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), 1);
        }
        assert_int_equal(atomic_load(&c.bad_worker), 0);
        for (int64_t i = 0; i < 100; i++) who[i] = -1;
        dr_pool_run_work(p, 100, count_index, &c, DR_POOL_MIN_WORK - 1);
        for (int64_t i = 0; i < 100; i++) assert_int_equal(who[i], 0);
        dr_pool_free(p);
    }
    assert_true(dr_pool_default_threads() >= 1);
    assert_true(dr_pool_default_threads() <= sysconf(_SC_NPROCESSORS_ONLN));
}

static void bump_index(void *ctx, int64_t i, int worker) {
    (void)worker;
    atomic_fetch_add(&((_Atomic int *)ctx)[i], 1);
}

/* Back-to-back runs whose chunk counts alternate (a few, then many): a worker still looking at
 * the last run's ticket must not claim a chunk of it against the next run's count (that ran an
 * index twice, and the count of finished chunks went one over: the caller waited forever). A
 * race, so many runs; it showed within ~10^5 runs at 2-3 threads on the 2-core VM. */
static void test_pool_back_to_back_alternating(void **state) {
    (void)state;
    enum { N = 64, RUNS = 200000 };
    _Atomic int hits[N];
    for (int threads = 2; threads <= 3; threads++) {
        dr_pool *p = dr_pool_create(threads);
        assert_non_null(p);
        for (int64_t i = 0; i < N; i++) atomic_store(&hits[i], 0);
        for (int rep = 0; rep < RUNS; rep++) dr_pool_run(p, rep % 2 ? N : 3, bump_index, hits);
        for (int64_t i = 0; i < N; i++) assert_int_equal(atomic_load(&hits[i]), i < 3 ? RUNS : RUNS / 2);
        dr_pool_free(p);
    }
}

/* dr_pool_yield_to toggled by another thread while runs with gaps go on (workers past the 20 us
 * of polling yield, or not): every index exactly once either way, and a pool of more threads than
 * CPUs (always yielding) gives the same; NULL is accepted. */
typedef struct { dr_pool *p; _Atomic int stop; } toggle_ctx;

static void *toggle_main(void *arg) {
    toggle_ctx *t = arg;
    while (!atomic_load(&t->stop)) {
        dr_pool_yield_to(t->p, 1);
        usleep(50);
        dr_pool_yield_to(t->p, -1);
        usleep(50);
    }
    return NULL;
}

static void test_pool_yield_to(void **state) {
    (void)state;
    enum { N = 48, RUNS = 4000 };
    _Atomic int hits[N];
    dr_pool_yield_to(NULL, 1);
    int over = (int)sysconf(_SC_NPROCESSORS_ONLN) + 1;
    for (int k = 0; k < 2; k++) {
        dr_pool *p = dr_pool_create(k ? over : 2);
        assert_non_null(p);
        toggle_ctx t = {p, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, toggle_main, &t), 0);
        for (int64_t i = 0; i < N; i++) atomic_store(&hits[i], 0);
        for (int rep = 0; rep < RUNS; rep++) {
            dr_pool_run(p, rep % 3 ? N : 5, bump_index, hits);
            if (rep % 16 == 0) usleep(30); /* a gap past the yield threshold */
        }
        atomic_store(&t.stop, 1);
        pthread_join(th, NULL);
        int small = (RUNS + 2) / 3; /* reps with rep % 3 == 0 */
        for (int64_t i = 0; i < N; i++) assert_int_equal(atomic_load(&hits[i]), i < 5 ? RUNS : RUNS - small);
        dr_pool_free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_error_wins_and_prefix),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_alloc_overflow),
        cmocka_unit_test(test_pool_covers_every_index),
        cmocka_unit_test(test_pool_exactly_once_and_threshold),
        cmocka_unit_test(test_pool_back_to_back_alternating),
        cmocka_unit_test(test_pool_yield_to),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
