/* The backend seam under a guard (tiny checkpoint): a CPU backend whose memory is readable only
 * inside its ops (mmap + mprotect; host_memory = 0, so the frame step takes the path a
 * recording backend takes). If the model, the frame loop or the frame step touched backend
 * memory from the host, the test would crash. Checked:
 *  - sampled, guided (paired and separate) and batched generation under the guard gives the
 *    plain CPU backend's codes bit for bit;
 *  - a lane that ends in a batch holds its state: the ended session, extended by a prefill,
 *    continues exactly like a session stopped after the same frames;
 *  - the device-side counters (positions, tower lengths, draw counter) equal the host's copies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "gen/frameloop.h"
#include "gen/frameloop_internal.h"
#include "gen/session.h"
#include "testutil.h"

/* ---------------- the guard backend ---------------- */

#define MAX_BUFS 4096

typedef struct guard {
    dr_backend be;
    dr_backend_ops ops;
    const dr_backend_ops *cpu;
    struct {
        void *p;
        size_t len;
    } buf[MAX_BUFS];
    int n_buf, depth;
    long ops_run;
    int force_end_lane, force_end_step, steps; /* the guidance op ends lane `force_end_lane` at step k */
} guard;

static guard G;

static void set_prot(int prot) {
    for (int i = 0; i < G.n_buf; i++)
        if (mprotect(G.buf[i].p, G.buf[i].len, prot)) fail_msg("mprotect failed");
}
static void open_mem(void) {
    if (G.depth++ == 0) set_prot(PROT_READ | PROT_WRITE);
    G.ops_run++;
}
static void close_mem(void) {
    if (--G.depth == 0) set_prot(PROT_NONE);
}

static drama_status g_alloc(dr_backend *be, size_t bytes, int zeroed, void **out, drama_error *err) {
    (void)be;
    (void)zeroed; /* mmap memory is zero */
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page;
    void *p = mmap(NULL, len ? len : page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || G.n_buf == MAX_BUFS) return dr_fail(err, DRAMA_ENOMEM, "guard: cannot map %zu bytes", bytes);
    G.buf[G.n_buf].p = p;
    G.buf[G.n_buf++].len = len ? len : page;
    *out = p;
    return DRAMA_OK;
}

static void g_free(dr_backend *be, void *p) {
    (void)be;
    for (int i = 0; i < G.n_buf; i++)
        if (G.buf[i].p == p) {
            munmap(p, G.buf[i].len);
            G.buf[i] = G.buf[--G.n_buf];
            return;
        }
    fail_msg("guard: free of an unknown buffer");
}

/* every other op: the memory is open while it runs */
#define WRAP(name, params, args)                                                                                      \
    static void g_##name params {                                                                                     \
        open_mem();                                                                                                   \
        G.cpu->name args;                                                                                             \
        close_mem();                                                                                                  \
    }
#define WRAP_ST(name, params, args)                                                                                   \
    static drama_status g_##name params {                                                                             \
        open_mem();                                                                                                   \
        drama_status s_ = G.cpu->name args;                                                                           \
        close_mem();                                                                                                  \
        return s_;                                                                                                    \
    }

WRAP_ST(upload, (dr_backend * be, void *d, const void *s, size_t n, drama_error *e), (be, d, s, n, e))
WRAP_ST(download, (dr_backend * be, void *d, const void *s, size_t n, drama_error *e), (be, d, s, n, e))
WRAP(copy, (dr_backend * be, void *d, const void *s, size_t n), (be, d, s, n))
WRAP(zero, (dr_backend * be, void *d, size_t n), (be, d, n))
WRAP(matmul, (dr_backend * be, const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y),
     (be, w, r0, r1, x, n, y))
WRAP(embed, (dr_backend * be, const dr_embed_args *a, const int32_t *rows, int64_t n, float *x), (be, a, rows, n, x))
WRAP(rms_norm, (dr_backend * be, const float *x, const float *w, double eps, int64_t dim, int64_t n, float *y),
     (be, x, w, eps, dim, n, y))
WRAP(gated_rms_norm,
     (dr_backend * be, float *x, const float *w, int ph, const float *z, double eps, int64_t h, int64_t dv, int64_t n),
     (be, x, w, ph, z, eps, h, dv, n))
WRAP(add, (dr_backend * be, float *x, const float *y, int64_t c), (be, x, y, c))
WRAP(swiglu, (dr_backend * be, const float *g, const float *u, int64_t c, float *y), (be, g, u, c, y))
WRAP(attention, (dr_backend * be, const dr_attn_args *a), (be, a))
WRAP(deltanet, (dr_backend * be, const dr_gdn_args *a), (be, a))
WRAP(moe, (dr_backend * be, const dr_moe_args *a), (be, a))
WRAP(restricted_logits,
     (dr_backend * be, const dr_weight *h, int64_t s, int64_t ns, int64_t e, const float *x, int64_t n, float *l),
     (be, h, s, ns, e, x, n, l))
WRAP(tower_input, (dr_backend * be, const dr_tower_in_args *a), (be, a))
WRAP(check_finite, (dr_backend * be, const float *x, int64_t w, int64_t n, dr_op_status *s), (be, x, w, n, s))
WRAP(scatter_rows,
     (dr_backend * be, const float *s, int64_t w, int64_t n, float *const *d, int64_t o, const dr_seq_row *r),
     (be, s, w, n, d, o, r))
WRAP(gather_rows, (dr_backend * be, float *d, int64_t w, int64_t n, const float *const *s), (be, d, w, n, s))
WRAP(advance, (dr_backend * be, const dr_seq_row *r, int64_t n), (be, r, n))
WRAP(sample_semantic, (dr_backend * be, const dr_step_lane *l, int n, int nc, dr_step_io io), (be, l, n, nc, io))
WRAP(sample_acoustic, (dr_backend * be, const dr_step_lane *l, int n, int cb, const float *x, int hv, dr_step_io io),
     (be, l, n, cb, x, hv, io))
WRAP(frame_rows, (dr_backend * be, const int32_t *c, const int32_t *lr, int64_t m, int nc, int64_t ss, int32_t *r),
     (be, c, lr, m, nc, ss, r))

/* guidance, and the forced end token of one lane at one step */
static void g_guidance(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand) {
    open_mem();
    G.cpu->guidance(be, lanes, n, n_cand);
    if (G.steps++ == G.force_end_step && G.force_end_lane < n) lanes[G.force_end_lane].logits[n_cand - 1] = 1e4f;
    close_mem();
}

static void guard_init(dr_backend *cpu) {
    memset(&G, 0, sizeof G);
    G.cpu = cpu->ops;
    G.ops = *cpu->ops;
    G.ops.alloc = g_alloc;
    G.ops.free = g_free;
#define SET(name) G.ops.name = g_##name
    SET(upload); SET(download); SET(copy); SET(zero); SET(matmul); SET(embed); SET(rms_norm); SET(gated_rms_norm);
    SET(add); SET(swiglu); SET(attention); SET(deltanet); SET(moe); SET(restricted_logits); SET(tower_input);
    SET(check_finite); SET(scatter_rows); SET(gather_rows); SET(advance); SET(guidance); SET(sample_semantic);
    SET(sample_acoustic); SET(frame_rows);
#undef SET
    G.be = *cpu;
    G.be.ops = &G.ops;
    G.be.host_memory = 0; /* the frame step may not look: it takes the recording backends' path */
    G.be.destroy = NULL;
    G.force_end_step = -1;
}

/* ---------------- fixture ---------------- */

typedef struct fixture {
    dr_gen_lm *lm;
    dr_gen_model guarded;
    int32_t *rows_noref, *rows_ref;
    int64_t n_noref, n_ref;
    int NC;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    drama_error e = {0};
    if (dr_gen_lm_open(tu_model_dir("tiny-drama3"), NULL, 0, 2, NULL, &f->lm, &e)) fail_msg("%s", e.message);
    guard_init(f->lm->be);
    if (dr_gen_model_init(&f->guarded, &G.be, &f->lm->bb, &f->lm->tower, f->lm->pool, &e)) fail_msg("%s", e.message);
    int64_t n;
    f->NC = f->lm->tower.d.num_codebooks;
    f->rows_noref = tu_load_i32(tu_golden("ref/e2e-noref.safetensors"), "prompt.rows", &n);
    f->n_noref = n / (f->NC + 1);
    f->rows_ref = tu_load_i32(tu_golden("ref/e2e-ref12.safetensors"), "prompt.rows", &n);
    f->n_ref = n / (f->NC + 1);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dr_gen_model_release(&f->guarded);
    assert_int_equal(G.n_buf, 0); /* every backend buffer was freed */
    dr_gen_lm_close(f->lm);
    free(f->rows_noref);
    free(f->rows_ref);
    free(f);
    return 0;
}

/* n sessions of m stepped together for `frames` frames; codes [n][frames][NC]. */
static void run_batch(const dr_gen_model *m, const dr_gen_options *o, int n, const int32_t *rows, int64_t nr,
                      const int32_t *urows, int64_t nu, int frames, int32_t *codes, dr_gen_session **keep) {
    dr_gen_session *ss[4];
    drama_error e = {0};
    for (int i = 0; i < n; i++) {
        dr_gen_options oi = o[i];
        if (dr_gen_session_create(m, &oi, &ss[i], &e)) fail_msg("%s", e.message);
        if (dr_gen_prefill(ss[i], rows, nr, oi.sp.cfg_gamma > 0 ? urows : NULL, oi.sp.cfg_gamma > 0 ? nu : 0, &e))
            fail_msg("%s", e.message);
    }
    int NC = dr_gen_num_codebooks(ss[0]);
    int32_t fr[4 * 16];
    dr_gen_finish fin[4];
    drama_status st[4];
    drama_error errs[4];
    for (int k = 0; k < frames; k++) {
        memset(errs, 0, sizeof errs);
        if (dr_gen_next_many(ss, n, fr, fin, st, errs)) fail_msg("frame %d: %s", k, errs[0].message);
        for (int i = 0; i < n; i++) {
            assert_int_equal(fin[i], DR_FINISH_NONE);
            memcpy(codes + ((int64_t)i * frames + k) * NC, fr + i * NC, (size_t)NC * sizeof(int32_t));
        }
    }
    for (int i = 0; i < n; i++) {
        if (keep) keep[i] = ss[i];
        else dr_gen_session_free(ss[i]);
    }
}

static void options(dr_gen_options *o, uint64_t seed, float gamma, dr_cfg_mode mode) {
    dr_gen_options_default(o);
    o->sp.seed = seed;
    o->sp.cfg_gamma = gamma;
    o->cfg_mode = mode;
    o->allow_empty = 1;
}

/* ---------------- tests ---------------- */

static void test_guarded_equals_cpu(void **state) {
    fixture *f = *state;
    enum { F = 6 };
    dr_gen_options o[3];
    options(&o[0], 7, 0, DR_CFG_PAIRED);
    options(&o[1], 8, 1.5f, DR_CFG_PAIRED);
    options(&o[2], 9, 1.5f, DR_CFG_SEPARATE);
    int32_t want[3 * F * 16], got[3 * F * 16];
    run_batch(&f->lm->model, o, 3, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, F, want, NULL);
    long before = G.ops_run;
    run_batch(&f->guarded, o, 3, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, F, got, NULL);
    printf("guarded: %ld ops, %d buffers live\n", G.ops_run - before, G.n_buf);
    assert_memory_equal(got, want, sizeof(int32_t) * 3 * F * f->NC);
    /* one session alone under the guard equals it in the batch */
    int32_t alone[F * 16];
    run_batch(&f->guarded, &o[1], 1, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, F, alone, NULL);
    assert_memory_equal(alone, want + F * f->NC, sizeof(int32_t) * F * f->NC);
}

/* device-side counters of s equal the host's copies */
static void check_counters(fixture *f, dr_gen_session *s) {
    dr_seq q;
    drama_error e = {0};
    assert_int_equal(dr_bk_download(&G.be, &q, s->cond->seq, sizeof q, &e), DRAMA_OK);
    assert_int_equal(q.pos, s->cond->pos);
    assert_int_equal(q.cap, s->cond->cap);
    assert_int_equal(q.pos, dr_gen_position(s));
    if (s->uncond) {
        assert_int_equal(dr_bk_download(&G.be, &q, s->uncond->seq, sizeof q, &e), DRAMA_OK);
        assert_int_equal(q.pos, s->uncond->pos);
    }
    assert_int_equal(dr_bk_download(&G.be, &q, s->tc->seq, sizeof q, &e), DRAMA_OK);
    assert_int_equal(q.pos, s->tc->len);
    dr_gen_lane g;
    assert_int_equal(dr_bk_download(&G.be, &g, s->lane, sizeof g, &e), DRAMA_OK);
    assert_int_equal(g.draw, s->o.draw_base + dr_gen_draws(s));
    (void)f;
}

static void test_end_token_holds(void **state) {
    fixture *f = *state;
    enum { K = 3, MORE = 4 };
    int NC = f->NC;
    /* greedy, so the extra end-token draw of the ended session does not matter afterwards */
    dr_gen_options o[2];
    options(&o[0], 1, 1.2f, DR_CFG_PAIRED);
    options(&o[1], 2, 0, DR_CFG_PAIRED);
    o[0].sp.temperature = o[1].sp.temperature = 0;
    /* the reference: session 0 alone, stopped after K frames, extended, MORE frames */
    dr_gen_options ro = o[0];
    ro.frames = K;
    int32_t ref_codes[MORE * 16], codes[MORE * 16];
    dr_gen_session *r;
    drama_error e = {0};
    assert_int_equal(dr_gen_session_create(&f->guarded, &ro, &r, &e), DRAMA_OK);
    assert_int_equal(dr_gen_prefill(r, f->rows_ref, f->n_ref, f->rows_noref, f->n_noref, &e), DRAMA_OK);
    int32_t fr[2 * 16];
    dr_gen_finish fin[2];
    drama_status st[2];
    for (int k = 0; k <= K; k++) assert_int_equal(dr_gen_next(r, fr, &fin[0], &e), DRAMA_OK);
    assert_int_equal(fin[0], DR_FINISH_FRAMES);
    const int32_t *tail = f->rows_noref + (f->n_noref - 3) * (NC + 1); /* three text rows to extend with */
    dr_gen_set_frames(r, 0);
    assert_int_equal(dr_gen_prefill(r, tail, 3, tail, 3, &e), DRAMA_OK);
    for (int k = 0; k < MORE; k++) assert_int_equal(dr_gen_next(r, ref_codes + k * NC, &fin[0], &e), DRAMA_OK);
    /* the batch: lane 0 ends at step K (after K frames), lane 1 goes on */
    dr_gen_session *ss[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(dr_gen_session_create(&f->guarded, &o[i], &ss[i], &e), DRAMA_OK);
        assert_int_equal(dr_gen_prefill(ss[i], f->rows_ref, f->n_ref, i == 0 ? f->rows_noref : NULL,
                                        i == 0 ? f->n_noref : 0, &e),
                         DRAMA_OK);
    }
    G.steps = 0;
    G.force_end_lane = 0;
    G.force_end_step = K;
    drama_error errs[2] = {{0}, {0}};
    for (int k = 0; k <= K; k++) assert_int_equal(dr_gen_next_many(ss, 2, fr, fin, st, errs), DRAMA_OK);
    G.force_end_step = -1;
    assert_int_equal(fin[0], DR_FINISH_END_TOKEN);
    assert_int_equal(fin[1], DR_FINISH_NONE);
    assert_int_equal(dr_gen_frames(ss[0]), K);
    assert_int_equal(dr_gen_position(ss[0]), f->n_ref + K);
    check_counters(f, ss[0]);
    check_counters(f, ss[1]);
    /* the ended session, extended the same way, continues as the reference did */
    assert_int_equal(dr_gen_prefill(ss[0], tail, 3, tail, 3, &e), DRAMA_OK);
    for (int k = 0; k < MORE; k++) assert_int_equal(dr_gen_next(ss[0], codes + k * NC, &fin[0], &e), DRAMA_OK);
    assert_memory_equal(codes, ref_codes, sizeof(int32_t) * MORE * NC);
    assert_memory_equal(dr_gen_pending_hidden(ss[0]), dr_gen_pending_hidden(r), sizeof(float) * f->lm->bb.d.H);
    check_counters(f, ss[0]);
    check_counters(f, r);
    printf("ended lane held its state: %d frames after the extension equal the reference\n", MORE);
    dr_gen_session_free(r);
    dr_gen_session_free(ss[0]);
    dr_gen_session_free(ss[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guarded_equals_cpu),
        cmocka_unit_test(test_end_token_holds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
