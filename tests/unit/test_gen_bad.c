/* Bad input to the frame loop never crashes and always names the fault (also run under
 * valgrind): malformed rows, non-finite logits and hiddens, a failing backbone step, use before
 * prefill or after a failure, invalid options, sessions of different models in one batch. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gen/frameloop.h"
#include "gen/session.h"
#include "testutil.h"

/* Faults injected at the backend seam: a CPU backend whose restricted-logits op (one call per
 * backbone call: the prefill, then every frame) poisons its output, whose hidden scatter (the
 * pending hidden of a frame) poisons it, or whose next read reports a device failure. */
typedef struct wrap {
    dr_backend be;
    dr_backend_ops ops;
    const dr_backend_ops *inner;
    int64_t hidden_dim;
    int calls;
    int nan_logits_at, nan_hidden_at, fail_at; /* call index, -1 never */
    int fail_pending;
} wrap;

static wrap *the_wrap; /* the ops see only the backend: one wrapped backend at a time */

static void w_logits(dr_backend *be, const dr_weight *head, int64_t sem_row, int64_t n_sem, int64_t end_row,
                     const float *x, int64_t n, float *logits) {
    wrap *w = the_wrap;
    w->inner->restricted_logits(be, head, sem_row, n_sem, end_row, x, n, logits);
    int call = w->calls++;
    if (call == w->fail_at) w->fail_pending = call + 1;
    if (call == w->nan_logits_at)
        for (int64_t i = 0; i < n; i++) logits[i * (n_sem + 1) + 7] = NAN;
}

static void w_scatter(dr_backend *be, const float *src, int64_t width, int64_t n, float *const *dst, int64_t off,
                      const dr_seq_row *rows) {
    wrap *w = the_wrap;
    w->inner->scatter_rows(be, src, width, n, dst, off, rows);
    if (width == w->hidden_dim && w->calls - 1 == w->nan_hidden_at)
        for (int64_t i = 0; i < n; i++)
            if (dst[i]) dst[i][off + 3] = NAN;
}

static drama_status w_download(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    wrap *w = the_wrap;
    if (w->fail_pending) {
        int call = w->fail_pending - 1;
        w->fail_pending = 0;
        return dr_fail(err, DRAMA_EIO, "injected backbone failure at call %d", call);
    }
    return w->inner->download(be, dst, src, bytes, err);
}

typedef struct fixture {
    dr_gen_lm *lm;
    int32_t *rows;
    int64_t n;
    int W;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    drama_error e = {0};
    if (dr_gen_lm_open(tu_model_dir("tiny-drama3"), NULL, 0, 1, NULL, &f->lm, &e)) fail_msg("%s", e.message);
    int64_t n;
    f->W = f->lm->tower.d.num_codebooks + 1;
    f->rows = tu_load_i32(tu_golden("ref/e2e-noref.safetensors"), "prompt.rows", &n);
    f->n = n / f->W;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dr_gen_lm_close(f->lm);
    free(f->rows);
    free(f);
    return 0;
}

/* f's model on a wrapped copy of its CPU backend (its own workspaces: release with dr_gen_model_release). */
static dr_gen_model wrapped(fixture *f, wrap *w) {
    w->inner = f->lm->be->ops;
    w->ops = *w->inner;
    w->ops.restricted_logits = w_logits;
    w->ops.scatter_rows = w_scatter;
    w->ops.download = w_download;
    w->be = *f->lm->be;
    w->be.ops = &w->ops;
    w->be.destroy = NULL;
    w->hidden_dim = f->lm->bb.d.H;
    w->calls = 0;
    w->fail_pending = 0;
    the_wrap = w;
    dr_gen_model m;
    drama_error e = {0};
    if (dr_gen_model_init(&m, &w->be, &f->lm->bb, &f->lm->tower, f->lm->pool, &e)) fail_msg("%s", e.message);
    return m;
}

static void expect(drama_status got, drama_status want, const drama_error *e, const char *needle) {
    if (got != want) fail_msg("status %d, expected %d (%s)", got, want, e->message);
    if (needle && !strstr(e->message, needle)) fail_msg("message '%s' lacks '%s'", e->message, needle);
}

static void test_bad_rows(void **state) {
    fixture *f = *state;
    dr_gen_options o;
    dr_gen_options_default(&o);
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_OK);
    int32_t fr[16];
    dr_gen_finish fin;
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_EINVAL, &e, "prefill");
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, f->rows, 0, NULL, 0, &e), DRAMA_EEMPTY, &e, "no rows");
    int32_t *rows = malloc((size_t)f->n * f->W * sizeof(int32_t));
    memcpy(rows, f->rows, (size_t)f->n * f->W * sizeof(int32_t));
    /* a semantic token whose c0 column disagrees */
    rows[2 * f->W + 0] = (int32_t)f->lm->semantic_start + 5;
    rows[2 * f->W + 1] = 6;
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, rows, f->n, NULL, 0, &e), DRAMA_EINVAL, &e, "row 2");
    /* a token beyond the vocabulary: the backbone refuses it, the session must be reset */
    memcpy(rows, f->rows, (size_t)f->n * f->W * sizeof(int32_t));
    rows[4 * f->W] = 1 << 30;
    dr_error_clear(&e);
    drama_status st = dr_gen_prefill(s, rows, f->n, NULL, 0, &e);
    printf("token beyond vocab: %s\n", e.message);
    assert_int_not_equal(st, DRAMA_OK);
    rows[4 * f->W] = -3;
    dr_error_clear(&e);
    assert_int_not_equal(dr_gen_prefill(s, rows, f->n, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_reset(s, NULL), DRAMA_OK);
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_OK, &e, NULL);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_OK, &e, NULL);
    free(rows);
    dr_gen_session_free(s);
}

static void test_non_finite_and_failures(void **state) {
    fixture *f = *state;
    wrap w;
    dr_gen_model m = wrapped(f, &w);
    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.seed = 3;
    dr_gen_session *s;
    drama_error e = {0};
    int32_t fr[16];
    dr_gen_finish fin;
    /* NaN in the logits of the second step: the third draw fails naming it */
    w.nan_logits_at = 2, w.nan_hidden_at = -1, w.fail_at = -1;
    assert_int_equal(dr_gen_session_create(&m, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_ENUMERIC, &e, "NaN");
    printf("NaN logits: %s\n", e.message);
    dr_error_clear(&e);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_EINVAL, &e, "reset");
    /* NaN in the hidden: the tower refuses it */
    dr_gen_reset(s, NULL);
    w.calls = 0, w.nan_logits_at = -1, w.nan_hidden_at = 1;
    dr_error_clear(&e);
    assert_int_equal(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_ENUMERIC, &e, "tower");
    printf("NaN hidden: %s\n", e.message);
    /* a failing backbone step */
    dr_gen_reset(s, NULL);
    w.calls = 0, w.nan_hidden_at = -1, w.fail_at = 2;
    dr_error_clear(&e);
    assert_int_equal(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_EIO, &e, "injected");
    dr_error_clear(&e);
    expect(dr_gen_next(s, fr, &fin, &e), DRAMA_EINVAL, &e, "reset");
    /* a failing prefill */
    dr_gen_reset(s, NULL);
    w.calls = 0, w.fail_at = 0;
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_EIO, &e, "injected");
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, f->rows, f->n, NULL, 0, &e), DRAMA_EINVAL, &e, "reset");
    /* clone is refused from an invalid session */
    dr_gen_session *c = NULL;
    dr_error_clear(&e);
    expect(dr_gen_session_clone(s, &c, &e), DRAMA_EINVAL, &e, "invalid");
    assert_null(c);
    dr_gen_session_free(s);
    dr_gen_model_release(&m);
}

static void test_bad_options_and_batches(void **state) {
    fixture *f = *state;
    dr_gen_options o;
    dr_gen_session *s = NULL;
    drama_error e = {0};
    dr_gen_options_default(&o);
    o.frames = -1;
    expect(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_EINVAL, &e, "frames");
    assert_null(s);
    dr_gen_options_default(&o);
    o.cfg_mode = (dr_cfg_mode)7;
    dr_error_clear(&e);
    expect(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_EINVAL, &e, "cfg_mode");
    dr_gen_options_default(&o);
    o.sp.ras_temperature = NAN;
    dr_error_clear(&e);
    expect(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_EINVAL, &e, "ras_temperature");
    /* two models in one batch: the foreign session fails, the other steps normally */
    wrap w = {0};
    w.nan_logits_at = w.nan_hidden_at = w.fail_at = -1;
    dr_gen_model m2 = wrapped(f, &w);
    dr_gen_options_default(&o);
    dr_gen_session *ss[2];
    assert_int_equal(dr_gen_session_create(&f->lm->model, &o, &ss[0], &e), DRAMA_OK);
    assert_int_equal(dr_gen_session_create(&m2, &o, &ss[1], &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(ss[0], f->rows, f->n, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(ss[1], f->rows, f->n, NULL, 0, &e), DRAMA_OK);
    int32_t frames[32];
    dr_gen_finish fin[2];
    drama_status st[2];
    drama_error errs[2] = {{0}, {0}};
    assert_int_equal(dr_gen_next_many(ss, 2, frames, fin, st, errs), DRAMA_EINVAL);
    assert_int_equal(st[0], DRAMA_OK);
    assert_int_equal(st[1], DRAMA_EINVAL);
    assert_non_null(strstr(errs[1].message, "different models"));
    dr_gen_session_free(ss[0]);
    dr_gen_session_free(ss[1]);
    dr_gen_model_release(&m2);
}

/* A rejected first prefill of a guided request (no unconditional rows, a code outside the tower's
 * table in them) leaves the session untouched: the retry needs no reset, leaks nothing (valgrind)
 * and generates the codes of a session that never failed. */
static void test_guided_prefill_retry(void **state) {
    fixture *f = *state;
    int64_t n;
    int32_t *ref = tu_load_i32(tu_golden("ref/e2e-ref12.safetensors"), "prompt.rows", &n);
    int64_t n_ref = n / f->W;
    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.seed = 11;
    o.sp.cfg_gamma = 1.0f;
    int32_t want[16], got[16];
    dr_gen_finish fin;
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, ref, n_ref, f->rows, f->n, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, want, &fin, &e), DRAMA_OK);
    dr_gen_session_free(s);
    assert_int_equal(dr_gen_session_create(&f->lm->model, &o, &s, &e), DRAMA_OK);
    expect(dr_gen_prefill(s, ref, n_ref, NULL, 0, &e), DRAMA_EINVAL, &e, "unconditional rows");
    int32_t *bad = malloc((size_t)f->n * f->W * sizeof(int32_t));
    memcpy(bad, f->rows, (size_t)f->n * f->W * sizeof(int32_t));
    /* an audio row in the unconditional prompt whose c3 is beyond the tower's code table */
    bad[f->W] = (int32_t)f->lm->semantic_start + 2;
    bad[f->W + 1] = 2;
    bad[f->W + 4] = (int32_t)f->lm->tower.d.code_stride;
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, ref, n_ref, bad, f->n, &e), DRAMA_EINVAL, &e, "unconditional prefill row 1: code c3");
    printf("bad unconditional row: %s\n", e.message);
    dr_error_clear(&e);
    expect(dr_gen_prefill(s, ref, n_ref, f->rows, f->n, &e), DRAMA_OK, &e, NULL);
    assert_true(dr_gen_guided(s));
    assert_int_equal(dr_gen_next(s, got, &fin, &e), DRAMA_OK);
    assert_memory_equal(got, want, (size_t)(f->W - 1) * sizeof(int32_t));
    dr_gen_session_free(s);
    free(bad);
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guided_prefill_retry),
        cmocka_unit_test(test_bad_rows),
        cmocka_unit_test(test_non_finite_and_failures),
        cmocka_unit_test(test_bad_options_and_batches),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
