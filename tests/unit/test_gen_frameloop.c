/* Tests of src/gen/frameloop + session on the tiny checkpoint, on the backend of DRAMA_TEST_BACKEND
 * (CPU by default; ctest's test_gen_frameloop_cuda runs them on CUDA):
 *  - golden end-to-end greedy generation (ref/e2e-noref, ref/e2e-ref12): frames exact, semantic
 *    logits / hiddens / head logits within the README bounds (printed as max abs / rel);
 *  - determinism: same seed twice, threads 1 vs 2, batched with another session vs alone,
 *    guidance paired vs separate, gamma 0 equals unguided, no reference is never guided;
 *  - the draw index n = 16*f + slot (draw_base), stop rules (exact count, end token, empty,
 *    frame cap), cancellation then a fresh run equals an uncancelled run. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/rng.h"
#include "gen/frameloop.h"
#include "gen/sampler.h"
#include "gen/session.h"
#include "testbackend.h"
#include "testutil.h"

typedef struct fixture {
    dr_gen_lm *lm1, *lm2; /* 1 and 2 threads */
    int32_t *rows_noref, *rows_ref;
    int64_t n_noref, n_ref;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    drama_error e = {0};
    const char *dir = tu_model_dir("tiny-drama3");
    dr_backend_choice bk = tu_backend_choice(); /* DRAMA_TEST_BACKEND: the same checks on every backend */
    drama_status st = dr_gen_lm_open_on(dir, NULL, 0, 1, NULL, &bk, NULL, &f->lm1, &e);
    tu_backend_skip_unavailable(st, &e);
    if (st || dr_gen_lm_open_on(dir, NULL, 0, 2, NULL, &bk, NULL, &f->lm2, &e)) fail_msg("%s", e.message);
    printf("backend under test: %s\n", f->lm1->be->description);
    int64_t n;
    int W = f->lm1->tower.d.num_codebooks + 1;
    f->rows_noref = tu_load_i32(tu_golden("ref/e2e-noref.safetensors"), "prompt.rows", &n);
    f->n_noref = n / W;
    f->rows_ref = tu_load_i32(tu_golden("ref/e2e-ref12.safetensors"), "prompt.rows", &n);
    f->n_ref = n / W;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dr_gen_lm_close(f->lm1);
    dr_gen_lm_close(f->lm2);
    free(f->rows_noref);
    free(f->rows_ref);
    free(f);
    return 0;
}

/* ---------------- golden greedy generation ---------------- */

static void golden_case(fixture *f, const char *file) {
    const char *g = tu_golden(file);
    int64_t n;
    int NC = f->lm1->tower.d.num_codebooks, HV = f->lm1->tower.d.head_vocab;
    int64_t H = f->lm1->model.bb.hidden_dim, NL = f->lm1->model.bb.n_candidates;
    int32_t *rows = tu_load_i32(g, "prompt.rows", &n);
    int64_t L = n / (NC + 1);
    int32_t *frames = tu_load_i32(g, "frames", &n);
    int F = (int)(n / NC);
    float *sem = tu_load_f32(g, "sem_logits", &n);
    assert_int_equal(n, F * NL);
    float *hid = tu_load_f32(g, "hidden", &n);
    assert_int_equal(n, (F + 1) * H);
    float *heads = tu_load_f32(g, "head_logits", &n);
    int FH = (int)(n / ((NC - 1) * HV));

    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.temperature = 0;
    o.frames = F;
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    if (dr_gen_prefill(s, rows, L, NULL, 0, &e)) fail_msg("%s", e.message);
    float *my_sem = calloc((size_t)F * NL, sizeof(float)), *my_hid = calloc((size_t)(F + 1) * H, sizeof(float));
    float *my_heads = calloc((size_t)FH * (NC - 1) * HV, sizeof(float));
    int32_t fr[16];
    dr_gen_finish fin;
    int mismatch = -1;
    for (int k = 0; k < F; k++) {
        memcpy(my_hid + k * H, dr_gen_pending_hidden(s), (size_t)H * sizeof(float));
        if (dr_gen_next(s, fr, &fin, &e)) fail_msg("frame %d: %s", k, e.message);
        assert_int_equal(fin, DR_FINISH_NONE);
        memcpy(my_sem + k * NL, dr_gen_last_logits(s), (size_t)NL * sizeof(float));
        if (k < FH) memcpy(my_heads + (int64_t)k * (NC - 1) * HV, dr_gen_last_head_logits(s),
                           (size_t)(NC - 1) * HV * sizeof(float));
        for (int j = 0; j < NC; j++)
            if (fr[j] != frames[k * NC + j] && mismatch < 0) {
                mismatch = k;
                printf("%s: frame %d codebook %d: got %d, golden %d\n", file, k, j, fr[j], frames[k * NC + j]);
            }
    }
    memcpy(my_hid + F * H, dr_gen_pending_hidden(s), (size_t)H * sizeof(float));
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    assert_int_equal(fin, DR_FINISH_FRAMES);
    char label[128];
    int ok = 1;
    snprintf(label, sizeof label, "%s sem_logits", file);
    ok &= tu_report(label, tu_compare_f32(my_sem, sem, (int64_t)F * NL), 5e-4);
    snprintf(label, sizeof label, "%s hidden", file);
    ok &= tu_report(label, tu_compare_f32(my_hid, hid, (int64_t)(F + 1) * H), 2e-4);
    snprintf(label, sizeof label, "%s head_logits", file);
    ok &= tu_report(label, tu_compare_f32(my_heads, heads, (int64_t)FH * (NC - 1) * HV), 5e-4);
    printf("%s: %d frames, %s\n", file, F, mismatch < 0 ? "all codes equal" : "CODES DIFFER");
    assert_true(ok);
    assert_int_equal(mismatch, -1);
    dr_gen_session_free(s);
    free(rows); free(frames); free(sem); free(hid); free(heads); free(my_sem); free(my_hid); free(my_heads);
}

static void test_golden_noref(void **state) { golden_case(*state, "ref/e2e-noref.safetensors"); }
static void test_golden_ref12(void **state) { golden_case(*state, "ref/e2e-ref12.safetensors"); }

/* ---------------- helpers ---------------- */

typedef struct run_result {
    int32_t codes[64 * 16];
    int n;
    dr_gen_finish fin;
    drama_status st;
} run_result;

static void sampled_options(dr_gen_options *o, uint64_t seed, int frames) {
    dr_gen_options_default(o);
    o->sp.seed = seed;
    o->sp.temperature = 1.0f;
    o->sp.top_p = 0.9f;
    o->frames = frames;
    o->allow_empty = 1;
}

/* Pulls frames from a prefilled session until a finish or an error (at most 64). */
static void drain(dr_gen_session *s, run_result *r) {
    int NC = dr_gen_num_codebooks(s);
    drama_error e = {0};
    while (r->n < 64) {
        r->st = dr_gen_next(s, r->codes + r->n * NC, &r->fin, &e);
        if (r->st || r->fin != DR_FINISH_NONE) break;
        r->n++;
    }
}

static run_result run(const dr_gen_model *m, const dr_gen_options *o, const int32_t *rows, int64_t n,
                      const int32_t *urows, int64_t un) {
    run_result r;
    memset(&r, 0, sizeof r);
    dr_gen_session *s;
    drama_error e = {0};
    if (dr_gen_session_create(m, o, &s, &e)) fail_msg("%s", e.message);
    if (dr_gen_prefill(s, rows, n, urows, un, &e)) fail_msg("%s", e.message);
    drain(s, &r);
    dr_gen_session_free(s);
    return r;
}

static void expect_status(drama_status got, drama_status want, const drama_error *e, const char *needle) {
    if (got != want) fail_msg("status %d, expected %d (%s)", got, want, e->message);
    if (needle && !strstr(e->message, needle)) fail_msg("message '%s' lacks '%s'", e->message, needle);
}

static void assert_same(const run_result *a, const run_result *b, int NC, const char *what) {
    printf("%s: %d vs %d frames\n", what, a->n, b->n);
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->fin, b->fin);
    assert_int_equal(a->st, b->st);
    assert_memory_equal(a->codes, b->codes, (size_t)a->n * NC * sizeof(int32_t));
}

/* ---------------- determinism ---------------- */

static void test_seed_threads_batch(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    sampled_options(&o, 0x1234567890abcdefull, 12);
    run_result a = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    run_result b = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    assert_true(a.n > 0);
    assert_same(&a, &b, NC, "same seed twice");
    run_result c = run(&f->lm2->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    assert_same(&a, &c, NC, "threads 1 vs 2");
    dr_gen_options o2 = o;
    o2.sp.seed = 99;
    run_result d = run(&f->lm1->model, &o2, f->rows_ref, f->n_ref, NULL, 0);
    assert_true(d.n != a.n || memcmp(d.codes, a.codes, (size_t)a.n * NC * sizeof(int32_t)));
    /* batched with another session (other prompt, other seed, other length) vs alone */
    dr_gen_session *ss[2];
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm2->model, &o, &ss[0], &e), DRAMA_OK);
    dr_gen_options ob;
    sampled_options(&ob, 7, 5);
    assert_int_equal(dr_gen_session_create(&f->lm2->model, &ob, &ss[1], &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(ss[1], f->rows_noref, f->n_noref, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(ss[0], f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    run_result m;
    memset(&m, 0, sizeof m);
    int32_t frames[2 * 16];
    dr_gen_finish fin[2] = {0, 0};
    drama_status st[2];
    drama_error errs[2];
    for (int step = 0; step < 64 && fin[0] == DR_FINISH_NONE; step++) {
        memset(errs, 0, sizeof errs);
        int nb = fin[1] == DR_FINISH_NONE ? 2 : 1; /* keep stepping B while it runs */
        dr_gen_next_many(ss, nb, frames, fin, st, errs);
        assert_int_equal(st[0], DRAMA_OK);
        if (fin[0] == DR_FINISH_NONE) memcpy(m.codes + m.n++ * NC, frames, (size_t)NC * sizeof(int32_t));
    }
    m.fin = fin[0];
    assert_same(&a, &m, NC, "batched with another session vs alone");
    dr_gen_session_free(ss[0]);
    dr_gen_session_free(ss[1]);
}

static void test_guidance(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    sampled_options(&o, 2024, 10);
    run_result plain = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    /* gamma 0: unguided, the unconditional rows are not even run */
    run_result g0 = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref);
    assert_same(&plain, &g0, NC, "gamma 0 vs unguided");
    o.sp.cfg_gamma = 1.5f;
    o.cfg_mode = DR_CFG_PAIRED;
    run_result paired = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref);
    o.cfg_mode = DR_CFG_SEPARATE;
    run_result separate = run(&f->lm2->model, &o, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref);
    assert_same(&paired, &separate, NC, "guidance paired vs separate");
    assert_true(paired.n != plain.n || memcmp(paired.codes, plain.codes, (size_t)plain.n * NC * sizeof(int32_t)));
    /* guided logits are cond + gamma (cond - uncond) */
    dr_gen_session *s, *sc, *su;
    drama_error e = {0};
    o.sp.temperature = 0;
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, &e), DRAMA_OK);
    assert_true(dr_gen_guided(s));
    dr_gen_options op = o;
    op.sp.cfg_gamma = 0;
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &op, &sc, &e), DRAMA_OK);
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &op, &su, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(sc, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(su, f->rows_noref, f->n_noref, NULL, 0, &e), DRAMA_OK);
    int32_t fr[16];
    dr_gen_finish fin;
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(sc, fr, &fin, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(su, fr, &fin, &e), DRAMA_OK);
    int nl = f->lm1->model.bb.n_candidates;
    float *expect = calloc((size_t)nl, sizeof(float));
    dr_guidance_combine(dr_gen_last_logits(sc), dr_gen_last_logits(su), nl, 1.5f, expect);
    assert_memory_equal(expect, dr_gen_last_logits(s), (size_t)nl * sizeof(float));
    free(expect);
    dr_gen_session_free(s);
    dr_gen_session_free(sc);
    dr_gen_session_free(su);
    /* no reference in the prompt: never guided, whatever gamma (and no unconditional rows needed) */
    o.sp.temperature = 1;
    o.sp.cfg_gamma = 3;
    run_result nr = run(&f->lm1->model, &o, f->rows_noref, f->n_noref, NULL, 0);
    o.sp.cfg_gamma = 0;
    run_result nr0 = run(&f->lm1->model, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_same(&nr, &nr0, NC, "no reference: gamma 3 vs 0");
    /* guided with a reference but without unconditional rows: an error naming the cause */
    o.sp.cfg_gamma = 1;
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "unconditional"));
    dr_gen_session_free(s);
}

/* ---------------- draw indices, stop rules, cancellation ---------------- */

static void test_draw_index(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks, HV = f->lm1->tower.d.head_vocab;
    int nl = f->lm1->model.bb.n_candidates;
    dr_gen_options o;
    sampled_options(&o, 31337, 0);
    o.draw_base = 5;
    o.sp.ras_window = 0;
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_noref, f->n_noref, NULL, 0, &e), DRAMA_OK);
    dr_sample_ws ws;
    assert_int_equal(dr_sample_ws_init(&ws, nl, NULL), DRAMA_OK);
    for (uint64_t k = 0; k < 3; k++) {
        int32_t fr[16];
        dr_gen_finish fin;
        assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
        if (fin != DR_FINISH_NONE) break;
        /* frame k of this session is draw f = draw_base + k: semantic slot 0, codebook j slot 1 + j */
        int t;
        assert_int_equal(dr_sample_semantic(dr_gen_last_logits(s), nl, &o.sp, 5 + k, NULL, 0, &ws, &t, NULL), DRAMA_OK);
        assert_int_equal(t, fr[0]);
        for (int j = 1; j < NC; j++) {
            int c;
            assert_int_equal(dr_sample_acoustic(dr_gen_last_head_logits(s) + (j - 1) * HV, HV, &o.sp, 5 + k, j, &ws, &c,
                                                NULL), DRAMA_OK);
            assert_int_equal(c, fr[j]);
        }
        assert_int_equal(dr_gen_draws(s), k + 1);
    }
    dr_sample_ws_free(&ws);
    dr_gen_session_free(s);
}

static void test_frame_cap_and_count(void **state) {
    fixture *f = *state;
    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.temperature = 0; /* the golden greedy run makes 16 frames without the end token */
    o.sp.frame_cap = 3;
    run_result r = run(&f->lm1->model, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_int_equal(r.st, DRAMA_EFRAMELIMIT);
    assert_int_equal(r.n, 3);
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_noref, f->n_noref, NULL, 0, &e), DRAMA_OK);
    int32_t fr[16];
    dr_gen_finish fin;
    for (int k = 0; k < 3; k++) assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_EFRAMELIMIT);
    assert_non_null(strstr(e.message, "frame limit reached"));
    dr_error_clear(&e);
    /* the session is invalid until reset */
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_EINVAL);
    dr_gen_session_free(s);
    /* exact count */
    o.sp.frame_cap = 750;
    o.frames = 5;
    r = run(&f->lm1->model, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_int_equal(r.st, DRAMA_OK);
    assert_int_equal(r.fin, DR_FINISH_FRAMES);
    assert_int_equal(r.n, 5);
    /* invalid options are rejected at create, naming the parameter */
    o.sp.top_p = 0;
    dr_error_clear(&e);
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "top_p"));
}

/* A CPU backend whose restricted logits (one call per backbone call: the prefill, then every
 * frame) make the end token win after `after` calls. */
typedef struct end_wrap {
    dr_backend be;
    dr_backend_ops ops;
    const dr_backend_ops *inner;
    int calls, after;
} end_wrap;

static end_wrap *the_end_wrap;

static void end_logits(dr_backend *be, const dr_weight *head, int64_t sem_row, int64_t n_sem, int64_t end_row,
                       const float *x, int64_t n, float *logits) {
    end_wrap *w = the_end_wrap;
    w->inner->restricted_logits(be, head, sem_row, n_sem, end_row, x, n, logits);
    if (w->calls++ >= w->after)
        for (int64_t i = 0; i < n; i++) logits[i * (n_sem + 1) + n_sem] = 1e4f;
}

static void test_end_token(void **state) {
    fixture *f = *state;
    if (!f->lm1->be->host_memory) skip(); /* the wrapper writes the logits from the host */
    end_wrap w = {.inner = f->lm1->be->ops, .after = 4};
    w.ops = *w.inner;
    w.ops.restricted_logits = end_logits;
    w.be = *f->lm1->be;
    w.be.ops = &w.ops;
    w.be.destroy = NULL;
    the_end_wrap = &w;
    dr_gen_model m;
    drama_error e = {0};
    assert_int_equal(dr_gen_model_init(&m, &w.be, &f->lm1->bb, &f->lm1->tower, f->lm1->pool, &e), DRAMA_OK);
    dr_gen_options o;
    sampled_options(&o, 5, 0);
    o.allow_empty = 0;
    run_result r = run(&m, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_int_equal(r.st, DRAMA_OK);
    assert_int_equal(r.fin, DR_FINISH_END_TOKEN);
    assert_int_equal(r.n, 4); /* prefill + 3 steps are normal; the 4th step's logits end it */
    w.calls = 0;
    w.after = 0;
    r = run(&m, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_int_equal(r.st, DRAMA_EEMPTY);
    w.calls = 0;
    o.allow_empty = 1;
    r = run(&m, &o, f->rows_noref, f->n_noref, NULL, 0);
    assert_int_equal(r.st, DRAMA_OK);
    assert_int_equal(r.fin, DR_FINISH_END_TOKEN);
    assert_int_equal(r.n, 0);
    dr_gen_model_release(&m);
}

static int cancel_at_3(void *ctx, int64_t index, const int32_t *frame) {
    (void)frame;
    (void)ctx;
    return index == 2;
}

static void test_cancel_then_fresh_run(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    sampled_options(&o, 77, 8);
    run_result ref = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    dr_gen_finish fin;
    assert_int_equal(dr_gen_run(s, cancel_at_3, NULL, &fin, &e), DRAMA_ECANCELLED);
    assert_int_equal(dr_gen_frames(s), 3);
    dr_error_clear(&e);
    int32_t fr[16];
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_EINVAL); /* invalid until reset */
    assert_non_null(strstr(e.message, "reset"));
    dr_error_clear(&e);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_EINVAL);
    assert_int_equal(dr_gen_reset(s, NULL), DRAMA_OK);
    dr_error_clear(&e);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    run_result again;
    memset(&again, 0, sizeof again);
    drain(s, &again);
    assert_same(&ref, &again, NC, "cancelled then fresh run vs uncancelled");
    /* dr_gen_cancel from outside, between frames */
    assert_int_equal(dr_gen_reset(s, NULL), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_OK);
    dr_gen_cancel(s);
    assert_int_equal(dr_gen_next(s, fr, &fin, &e), DRAMA_ECANCELLED);
    dr_gen_session_free(s);
}

/* Extending a state: prefill rows 0..k-1, then rows k..L-1, equals prefilling all at once. */
static void test_extend_equals_whole(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    sampled_options(&o, 4242, 6);
    run_result whole = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    int64_t k = f->n_ref / 2;
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, k, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref + k * (NC + 1), f->n_ref - k, NULL, 0, &e), DRAMA_OK);
    run_result part;
    memset(&part, 0, sizeof part);
    drain(s, &part);
    assert_same(&whole, &part, NC, "prefill in two parts vs whole");
    dr_gen_session_free(s);
}

/* A clone (snapshot of a voice prefix) continues exactly like the original, independently; new
 * sampling parameters after the clone equal a session created with them. */
static void test_clone(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    sampled_options(&o, 4242, 6);
    int64_t k = f->n_ref / 2;
    run_result whole = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    dr_gen_options o2 = o;
    o2.sp.seed = 8;
    o2.sp.temperature = 0.7f;
    run_result whole2 = run(&f->lm1->model, &o2, f->rows_ref, f->n_ref, NULL, 0);
    dr_gen_session *voice, *a, *b;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &voice, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(voice, f->rows_ref, k, NULL, 0, &e), DRAMA_OK);
    if (dr_gen_session_clone(voice, &a, &e)) fail_msg("%s", e.message);
    assert_int_equal(dr_gen_session_clone(voice, &b, &e), DRAMA_OK);
    assert_int_equal(dr_gen_set_params(b, &o2.sp, &e), DRAMA_OK);
    dr_gen_session_free(voice); /* the clones own their states */
    run_result ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    assert_int_equal(dr_gen_prefill(a, f->rows_ref + k * (NC + 1), f->n_ref - k, NULL, 0, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(b, f->rows_ref + k * (NC + 1), f->n_ref - k, NULL, 0, &e), DRAMA_OK);
    for (run_result *r = &ra; r; r = r == &ra ? &rb : NULL) {
        drain(r == &ra ? a : b, r);
    }
    assert_same(&whole, &ra, NC, "clone of the prefix + rest vs whole");
    assert_same(&whole2, &rb, NC, "clone with new params vs whole with them");
    o2.sp.cfg_gamma = 0; /* unguided stays unguided */
    assert_int_equal(dr_gen_set_params(a, &o2.sp, &e), DRAMA_OK);
    o2.sp.top_p = 2;
    assert_int_equal(dr_gen_set_params(a, &o2.sp, &e), DRAMA_EINVAL);
    dr_gen_session_free(a);
    dr_gen_session_free(b);
}

typedef struct collected {
    run_result *r;
    int nc;
} collected;

static int collect_frame(void *ctx, int64_t index, const int32_t *frame) {
    collected *c = ctx;
    assert_int_equal(index, c->r->n);
    memcpy(c->r->codes + c->r->n++ * c->nc, frame, (size_t)c->nc * sizeof(int32_t));
    return 0;
}

/* Streaming does not change the codes: frames handed to a callback (dr_gen_run) equal frames
 * pulled one by one; a guided state extended in two prefills (the conditional and the
 * unconditional rows each split, the shared tail appended to both) equals one guided prefill. */
static void test_streamed_and_guided_parts(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks, W = NC + 1;
    dr_gen_options o;
    sampled_options(&o, 0xfeedull, 9);
    run_result pulled = run(&f->lm2->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    run_result streamed;
    memset(&streamed, 0, sizeof streamed);
    collected col = {&streamed, NC};
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm2->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref, NULL, 0, &e), DRAMA_OK);
    streamed.st = dr_gen_run(s, collect_frame, &col, &streamed.fin, &e);
    dr_gen_session_free(s);
    assert_true(pulled.n > 0);
    assert_same(&pulled, &streamed, NC, "callback vs pull");
    /* the rows both prompts end with (user turn, assistant start) form the second prefill */
    int64_t tail = 0;
    while (tail < f->n_noref - 1 && tail < 6 &&
           !memcmp(f->rows_ref + (f->n_ref - 1 - tail) * W, f->rows_noref + (f->n_noref - 1 - tail) * W,
                   (size_t)W * sizeof(int32_t)))
        tail++;
    assert_true(tail >= 1);
    o.sp.cfg_gamma = 2.0f;
    run_result whole = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref);
    run_result parts;
    memset(&parts, 0, sizeof parts);
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref - tail, f->rows_noref, f->n_noref - tail, &e), DRAMA_OK);
    assert_true(dr_gen_guided(s));
    /* an extension that names unconditional rows must pass them */
    expect_status(dr_gen_prefill(s, f->rows_ref + (f->n_ref - tail) * W, tail, NULL, tail, &e), DRAMA_EINVAL, &e,
                  "unconditional");
    dr_error_clear(&e);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref + (f->n_ref - tail) * W, tail, f->rows_noref + (f->n_noref - tail) * W,
                                    tail, &e), DRAMA_OK);
    drain(s, &parts);
    dr_gen_session_free(s);
    printf("guided prefill split before the last %lld rows\n", (long long)tail);
    assert_same(&whole, &parts, NC, "guided prefill in two parts vs whole");
    /* the unconditional prompt complete first: the last call carries conditional rows only */
    run_result first;
    memset(&first, 0, sizeof first);
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref, f->n_ref - tail, f->rows_noref, f->n_noref, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(s, f->rows_ref + (f->n_ref - tail) * W, tail, NULL, 0, &e), DRAMA_OK);
    drain(s, &first);
    dr_gen_session_free(s);
    assert_same(&whole, &first, NC, "guided prefill, unconditional rows all in the first call, vs whole");
}

/* Guided sessions in a batch: a separate-mode guided session, an unguided one and a paired-mode
 * guided one stepped together (three backbone states in the first call, one in the second) each
 * give the codes they give alone. */
static void test_guided_batch(void **state) {
    fixture *f = *state;
    int NC = f->lm2->tower.d.num_codebooks;
    dr_gen_options o[3];
    for (int i = 0; i < 3; i++) sampled_options(&o[i], 500 + (uint64_t)i, 7 - i);
    o[0].sp.cfg_gamma = 1.0f, o[0].cfg_mode = DR_CFG_SEPARATE;
    o[2].sp.cfg_gamma = 3.0f, o[2].cfg_mode = DR_CFG_PAIRED;
    run_result alone[3], together[3];
    dr_gen_session *ss[3];
    drama_error e = {0};
    memset(together, 0, sizeof together);
    for (int i = 0; i < 3; i++) {
        alone[i] = run(&f->lm2->model, &o[i], f->rows_ref, f->n_ref, f->rows_noref, f->n_noref);
        assert_int_equal(dr_gen_session_create(&f->lm2->model, &o[i], &ss[i], &e), DRAMA_OK);
        assert_int_equal(dr_gen_prefill(ss[i], f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, &e), DRAMA_OK);
        assert_int_equal(dr_gen_guided(ss[i]), i != 1);
    }
    int32_t frames[3 * 16];
    dr_gen_finish fin[3] = {0, 0, 0};
    drama_status st[3];
    for (int step = 0; step < 64 && (!fin[0] || !fin[1] || !fin[2]); step++) {
        /* every session that still runs, in order; finished ones leave the batch */
        dr_gen_session *live[3];
        int idx[3], n = 0;
        for (int i = 0; i < 3; i++)
            if (!fin[i]) live[n] = ss[i], idx[n++] = i;
        dr_gen_finish lf[3];
        drama_status ls[3];
        dr_gen_next_many(live, n, frames, lf, ls, NULL);
        for (int k = 0; k < n; k++) {
            int i = idx[k];
            st[i] = ls[k];
            assert_int_equal(st[i], DRAMA_OK);
            fin[i] = lf[k];
            if (!fin[i]) memcpy(together[i].codes + together[i].n++ * NC, frames + k * NC, (size_t)NC * sizeof(int32_t));
        }
    }
    for (int i = 0; i < 3; i++) {
        together[i].fin = fin[i];
        together[i].st = st[i];
        assert_same(&alone[i], &together[i], NC, i == 0 ? "guided separate, batched" : i == 1 ? "unguided, batched"
                                                                                     : "guided paired, batched");
        dr_gen_session_free(ss[i]);
    }
}

/* tower.prefill_codes = same_row and tower.input = pre_norm reach the frame loop: the greedy
 * codes change (the golden run uses the defaults, so equality would mean the switch is ignored),
 * and the run is still deterministic. */
static void test_frameloop_switches(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks;
    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.temperature = 0;
    o.frames = 8;
    run_result base = run(&f->lm1->model, &o, f->rows_ref, f->n_ref, NULL, 0);
    const char *sets[2] = {"tower.prefill_codes=same_row", "tower.input=pre_norm"};
    for (int i = 0; i < 2; i++) {
        dr_gen_lm *lm;
        drama_error e = {0};
        if (dr_gen_lm_open(tu_model_dir("tiny-drama3"), &sets[i], 1, 1, NULL, &lm, &e)) fail_msg("%s", e.message);
        run_result a = run(&lm->model, &o, f->rows_ref, f->n_ref, NULL, 0);
        run_result b = run(&lm->model, &o, f->rows_ref, f->n_ref, NULL, 0);
        assert_same(&a, &b, NC, sets[i]);
        assert_int_equal(a.st, DRAMA_OK);
        int differs = a.n != base.n || memcmp(a.codes, base.codes, (size_t)base.n * NC * sizeof(int32_t));
        printf("%s: codes %s the default's\n", sets[i], differs ? "differ from" : "EQUAL");
        assert_true(differs);
        dr_gen_lm_close(lm);
    }
}

/* Scoring during prefill equals the NLL computed from the golden tower logits: the prefill of
 * ref/backbone's 20 rows pairs tower position p with row p+1 exactly as ref/tower does (its rows
 * 0..18; row 19 there is an extra frame), so this checks the prefill pairing against the golden. */
static void test_score_matches_golden_tower(void **state) {
    fixture *f = *state;
    int NC = f->lm1->tower.d.num_codebooks, HV = f->lm1->tower.d.head_vocab;
    int64_t n;
    int32_t *rows = tu_load_i32(tu_golden("ref/backbone.safetensors"), "prefill.rows", &n);
    int64_t L = n / (NC + 1);
    const char *g = tu_golden("ref/tower.safetensors");
    float *logits = tu_load_f32(g, "logits", &n);
    float *mask = tu_load_f32(g, "mask", &n);
    int32_t *codes = tu_load_i32(g, "codes", &n);
    double want[16] = {0};
    int64_t cnt = 0;
    for (int64_t r = 0; r < L - 1; r++) {
        if (mask[r] == 0) continue;
        cnt++;
        for (int j = 1; j < NC; j++) {
            const float *l = logits + (r * (NC - 1) + j - 1) * HV;
            double mx = -INFINITY, z = 0;
            for (int i = 0; i < HV; i++) mx = fmax(mx, l[i]);
            for (int i = 0; i < HV; i++) z += exp(l[i] - mx);
            want[j - 1] += log(z) - (l[codes[r * NC + j]] - mx);
        }
    }
    dr_gen_options o;
    dr_gen_options_default(&o);
    dr_gen_session *s;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->lm1->model, &o, &s, &e), DRAMA_OK);
    dr_gen_score sc;
    memset(&sc, 0, sizeof sc);
    dr_gen_set_score(s, &sc);
    assert_int_equal(dr_gen_prefill(s, rows, L, NULL, 0, &e), DRAMA_OK);
    assert_true(cnt > 0);
    assert_int_equal(sc.count, cnt);
    assert_int_equal(sc.n_codebooks, NC - 1);
    double got[16], exp_mean[16];
    for (int j = 0; j < NC - 1; j++) got[j] = sc.nll_sum[j] / cnt, exp_mean[j] = want[j] / cnt;
    printf("tower NLL from the session vs from golden logits: %lld positions\n", (long long)cnt);
    assert_true(tu_report("tower NLL per codebook (mean)", tu_compare_f64(got, exp_mean, NC - 1), 1e-3));
    dr_gen_session_free(s);
    free(rows); free(logits); free(mask); free(codes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_noref),
        cmocka_unit_test(test_golden_ref12),
        cmocka_unit_test(test_seed_threads_batch),
        cmocka_unit_test(test_guidance),
        cmocka_unit_test(test_draw_index),
        cmocka_unit_test(test_frame_cap_and_count),
        cmocka_unit_test(test_end_token),
        cmocka_unit_test(test_cancel_then_fresh_run),
        cmocka_unit_test(test_extend_equals_whole),
        cmocka_unit_test(test_clone),
        cmocka_unit_test(test_frameloop_switches),
        cmocka_unit_test(test_score_matches_golden_tower),
        cmocka_unit_test(test_streamed_and_guided_parts),
        cmocka_unit_test(test_guided_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
