/* Unit tests of the batched engine (include/drama.h drama_engine_*, src/gen/engine*.c) on the golden
 * tiny model: every request's codes and audio equal its solo run through drama_synthesize (a
 * private one-lane engine, checked against the goldens elsewhere), whatever else runs beside it,
 * when it starts, how its prefill is sliced, and whether its voice prefix came from the prompt
 * cache; cancellation mid-prefill and mid-generation frees the lane; A -> B -> A with the cache;
 * LRU eviction at the byte bound; admission by memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "drama.h"
#include "backend/cpu/ops.h"
#include "gen/engine_internal.h"
#include "gen/session.h"
#include "model/state.h"
#include "model/state_bytes.h"
#include "testutil.h"

typedef tu_pcm sink;
#define collect tu_pcm_collect

static drama_model *open_tiny(void) {
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = 2;
    drama_model *m = NULL;
    drama_error e = {0};
    if (drama_model_open(&m, tu_golden("tiny-drama3"), &mo, &e) != DRAMA_OK) fail_msg("model open: %s", e.message);
    return m;
}

/* Deterministic reference codes in range for any model (small values). */
static int32_t *make_codes(int nc, int frames, int salt) {
    int32_t *c = malloc((size_t)frames * nc * sizeof *c);
    for (int f = 0; f < frames; f++)
        for (int k = 0; k < nc; k++) c[f * nc + k] = (f * 7 + k * 3 + salt * 11) % 40;
    return c;
}

typedef struct outcome {
    drama_status st;
    drama_result res;
    sink audio;
} outcome;

static void outcome_free(outcome *o) {
    drama_result_free(&o->res);
    free(o->audio.x);
    memset(o, 0, sizeof *o);
}

static void solo(drama_model *m, const drama_request *r, outcome *o) {
    memset(o, 0, sizeof *o);
    drama_session *s = NULL;
    drama_error e = {0};
    assert_int_equal(drama_session_create(&s, m, &e), DRAMA_OK);
    o->st = drama_synthesize(s, r, collect, NULL, &o->audio, &o->res, &e);
    drama_session_free(s);
}

static void same(const outcome *a, const outcome *b, const char *what) {
    if (a->st != b->st) fail_msg("%s: status %d vs %d", what, a->st, b->st);
    assert_string_equal(a->res.finish_reason, b->res.finish_reason);
    if (a->res.frames != b->res.frames) fail_msg("%s: %lld vs %lld frames", what, (long long)a->res.frames, (long long)b->res.frames);
    if (a->st == DRAMA_OK) {
        assert_non_null(a->res.codes);
        assert_non_null(b->res.codes);
        assert_memory_equal(a->res.codes, b->res.codes, (size_t)a->res.frames * a->res.n_codebooks * sizeof(int32_t));
        if (a->audio.n != b->audio.n) fail_msg("%s: %zu vs %zu samples", what, a->audio.n, b->audio.n);
        assert_memory_equal(a->audio.x, b->audio.x, a->audio.n * sizeof(float));
    }
}

/* Steps the engine until every lane in hs[0..n) is done (bounded). */
static void run_until_done(drama_engine *e, const drama_lane *hs, int n) {
    drama_error err = {0};
    for (int t = 0; t < 100000; t++) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= drama_lane_done(e, hs[i]);
        if (all) return;
        assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
    }
    fail_msg("engine did not finish in 100000 ticks");
}

#define NREQ 8
typedef struct suite {
    drama_request r[NREQ];
    drama_reference refs[4][2];
    int32_t *codes[3];
    char name[NREQ][48];
} suite;

/* Requests of different lengths, voices, guidance, stop rules, streaming, seeds. */
static void make_suite(drama_model *m, suite *s) {
    memset(s, 0, sizeof *s);
    int nc = drama_model_codebooks(m);
    s->codes[0] = make_codes(nc, 12, 1);
    s->codes[1] = make_codes(nc, 7, 2);
    s->codes[2] = make_codes(nc, 5, 3);
    drama_reference A = {.transcript = "A voice.", .codes = s->codes[0], .n_code_frames = 12};
    drama_reference B = {.transcript = "Another voice here.", .codes = s->codes[1], .n_code_frames = 7};
    drama_reference C = {.transcript = "Third.", .codes = s->codes[2], .n_code_frames = 5};
    s->refs[0][0] = A;
    s->refs[1][0] = B;
    s->refs[2][0] = A;
    s->refs[2][1] = C;
    s->refs[3][0] = A;
    for (int i = 0; i < NREQ; i++) {
        drama_request *q = &s->r[i];
        drama_request_default(q);
        q->seed = 1000 + (uint64_t)i * 77;
        q->seed_set = 1;
    }
    s->r[0].text = "Hello there.";
    s->r[0].frames = 6;
    snprintf(s->name[0], 48, "plain, 6 frames");
    s->r[1].text = "A voice speaks first. Then it keeps going for a while.";
    s->r[1].references = s->refs[0];
    s->r[1].n_references = 1;
    s->r[1].frames = 9;
    s->r[1].stream = 1;
    snprintf(s->name[1], 48, "voice A, stream");
    s->r[2].text = "Guided speech with a voice.";
    s->r[2].references = s->refs[0];
    s->r[2].n_references = 1;
    s->r[2].cfg_gamma = 1.5f;
    s->r[2].frames = 7;
    snprintf(s->name[2], 48, "voice A, guided");
    s->r[3].text = "<|speaker:0|>One. <|speaker:1|>Two, and then three more words to say here.";
    s->r[3].references = s->refs[2];
    s->r[3].n_references = 2;
    s->r[3].chunk_tokens = 6;
    s->r[3].frames_per_batch = 3;
    snprintf(s->name[3], 48, "two voices, long text");
    s->r[4].text = "Short.";
    s->r[4].references = s->refs[1];
    s->r[4].n_references = 1;
    s->r[4].temperature = 0;
    s->r[4].frames = 4;
    s->r[4].stream = 1;
    s->r[4].stream_first_frames = 1;
    s->r[4].stream_chunk_frames = 2;
    snprintf(s->name[4], 48, "voice B, greedy, stream 1/2");
    s->r[5].text = "This one never ends on the random model.";
    s->r[5].max_frames = 5;
    snprintf(s->name[5], 48, "frame cap");
    s->r[6].text = "Long text in guided mode, split into several batches for the test.";
    s->r[6].references = s->refs[3];
    s->r[6].n_references = 1;
    s->r[6].cfg_gamma = 0.5f;
    s->r[6].chunk_tokens = 5;
    s->r[6].frames_per_batch = 2;
    s->r[6].stream = 1;
    snprintf(s->name[6], 48, "voice A, guided, long text");
    s->r[7].text = "A voice speaks first. Then it keeps going for a while.";
    s->r[7].references = s->refs[0];
    s->r[7].n_references = 1;
    s->r[7].frames = 9;
    s->r[7].seed = 5;
    snprintf(s->name[7], 48, "voice A again, other seed");
}

static void free_suite(suite *s) {
    for (int i = 0; i < 3; i++) free(s->codes[i]);
}

static drama_engine *make_engine(drama_model *m, int lanes, int slice, int64_t cache) {
    drama_engine_options o;
    drama_engine_options_default(&o);
    o.lanes = lanes;
    o.prefill_slice_rows = slice;
    o.prompt_cache_bytes = cache;
    o.memory_budget_bytes = -1;
    drama_engine *e = NULL;
    drama_error err = {0};
    if (drama_engine_create(&e, m, &o, &err) != DRAMA_OK) fail_msg("engine: %s", err.message);
    return e;
}

/* Runs the suite through an engine: requests start as lanes come free, one new start per tick
 * (so they join at different ticks), each compared with its solo outcome. */
static void run_suite(drama_model *m, suite *s, const outcome *want, int lanes, int slice, int64_t cache,
                      int64_t *hits) {
    drama_engine *e = make_engine(m, lanes, slice, cache);
    outcome got[NREQ];
    memset(got, 0, sizeof got);
    drama_lane h[NREQ] = {0};
    int next = 0, done = 0;
    drama_error err = {0};
    for (int t = 0; t < 100000 && done < NREQ; t++) {
        if (next < NREQ) {
            drama_status st = drama_engine_start(e, &s->r[next], collect, NULL, &got[next].audio, &h[next], &err);
            if (st == DRAMA_OK) next++;
            else if (st != DRAMA_EBUSY) fail_msg("start %d: %s", next, err.message);
            else assert_string_equal(err.reason, "no_free_lane");
            dr_error_clear(&err);
        }
        assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
        for (int i = 0; i < next; i++)
            if (h[i] && drama_lane_done(e, h[i])) {
                drama_error le = {0};
                got[i].st = drama_lane_result(e, h[i], &got[i].res, &le);
                drama_lane_release(e, h[i]);
                h[i] = 0;
                done++;
            }
    }
    assert_int_equal(done, NREQ);
    for (int i = 0; i < NREQ; i++) {
        char what[96];
        snprintf(what, sizeof what, "lanes %d slice %d cache %lld: %s", lanes, slice, (long long)cache, s->name[i]);
        same(&want[i], &got[i], what);
        outcome_free(&got[i]);
    }
    drama_engine_stats es;
    drama_engine_get_stats(e, &es);
    assert_int_equal(es.lanes_busy, 0);
    assert_int_equal(es.reserved_bytes, 0);
    if (hits) *hits = es.prompt_cache_hits;
    printf("lanes %d slice %d cache %lld: %d requests equal to solo; %lld ticks, cache hits %lld misses %lld\n", lanes,
           slice, (long long)cache, NREQ, (long long)es.ticks, (long long)es.prompt_cache_hits,
           (long long)es.prompt_cache_misses);
    drama_engine_free(e);
}

static void test_batched_equals_solo(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    outcome want[NREQ];
    for (int i = 0; i < NREQ; i++) {
        solo(m, &s.r[i], &want[i]);
        printf("solo %-28s %s, %lld frames\n", s.name[i], want[i].res.finish_reason, (long long)want[i].res.frames);
    }
    assert_int_equal(want[5].st, DRAMA_EFRAMELIMIT); /* the suite has a failing request too */
    assert_string_equal(want[3].res.finish_reason, "frames");
    assert_true(want[3].res.n_batches > 1 && want[6].res.n_batches > 1);
    int64_t hits = 0;
    run_suite(m, &s, want, 3, 7, 0, NULL);
    run_suite(m, &s, want, 4, 1, 64 << 20, &hits);
    assert_true(hits >= 2); /* voice A unguided (1, 7) and guided (2, 6) repeat */
    run_suite(m, &s, want, 2, 0, 64 << 20, NULL);
    for (int i = 0; i < NREQ; i++) outcome_free(&want[i]);
    free_suite(&s);
    drama_model_close(m);
}

/* A slice size never changes a result: request r sliced by each of slices[0..n) (0 = whole)
 * beside a generating lane (bg) equals r alone. */
static void slices_equal_solo(drama_model *m, const drama_request *r, const drama_request *bg_req, const char *name,
                              const int *slices, int n) {
    outcome want;
    solo(m, r, &want);
    for (int k = 0; k < n; k++) {
        drama_engine *e = make_engine(m, 2, slices[k], 0);
        drama_request bg = *bg_req;
        bg.frames = 40; /* keeps a lane generating through the other's prefill */
        outcome b, got;
        memset(&b, 0, sizeof b);
        memset(&got, 0, sizeof got);
        drama_lane hb = 0, hg = 0;
        drama_error err = {0};
        assert_int_equal(drama_engine_start(e, &bg, collect, NULL, &b.audio, &hb, &err), DRAMA_OK);
        assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
        assert_int_equal(drama_engine_start(e, r, collect, NULL, &got.audio, &hg, &err), DRAMA_OK);
        int64_t ticks0;
        drama_engine_stats es;
        drama_engine_get_stats(e, &es);
        ticks0 = es.ticks;
        while (!drama_lane_done(e, hg)) assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
        got.st = drama_lane_result(e, hg, &got.res, NULL);
        drama_engine_get_stats(e, &es);
        char what[96];
        snprintf(what, sizeof what, "%s, slice %d", name, slices[k]);
        same(&want, &got, what);
        printf("%s: equal to solo, %lld prompt rows, %lld ticks\n", what, (long long)got.res.prompt_tokens,
               (long long)(es.ticks - ticks0));
        drama_lane h2[1] = {hb};
        run_until_done(e, h2, 1);
        drama_lane_release(e, hb);
        drama_lane_release(e, hg);
        outcome_free(&b);
        outcome_free(&got);
        drama_engine_free(e);
    }
    outcome_free(&want);
}

static void test_prefill_slices(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    const int slices[3] = {1, 7, 0};
    slices_equal_solo(m, &s.r[2], &s.r[0], "request 2", slices, 3); /* guided */
    slices_equal_solo(m, &s.r[3], &s.r[0], "request 3", slices, 3); /* two voices and long text */
    free_suite(&s);
    drama_model_close(m);
}

/* The state itself, bit for bit: prefilled in slices of 1 and 7 rows, and continued from a snapshot
 * of the voice prefix (the prompt cache's path), vs in one call (unguided and guided): the pending hidden after the prefill, then for 4 frames the semantic logits (backbone
 * K/V and DeltaNet state, both guidance states), the tower's head logits (its caches over every
 * teacher-forced row) and the next hidden. Codes alone could hide a small difference. */
typedef struct trace {
    float *v;
    size_t n, cap;
} trace;

static void trace_add(trace *t, const float *x, size_t n) {
    if (t->n + n > t->cap) {
        t->cap = (t->n + n) * 2;
        t->v = realloc(t->v, t->cap * sizeof *t->v);
    }
    memcpy(t->v + t->n, x, n * sizeof *x);
    t->n += n;
}

static void prefill_trace(drama_model *m, const drama_request *r, int64_t slice, trace *t) {
    drama_error e = {0};
    dr_pl_text text;
    dr_pl_refs refs;
    assert_int_equal(dr_pl_text_prepare(m, r, &text, &e), DRAMA_OK);
    assert_int_equal(dr_pl_refs_encode(m, r->references, r->n_references, &refs, &e), DRAMA_OK);
    dr_pl_gen_params gp = {.temperature = r->temperature, .top_p = r->top_p, .cfg_gamma = r->cfg_gamma, .seed = r->seed,
                           .frame_cap = r->max_frames, .has_reference = r->n_references > 0};
    dr_pl_gen *g = NULL;
    assert_int_equal(dr_pl_gen_create(m, &gp, &g, &e), DRAMA_OK);
    int64_t rows = 0, used = 0;
    assert_int_equal(dr_pl_gen_prompt(g, m, &text, 0, &refs, 8192, 4, &rows, &e), DRAMA_OK);
    int calls = 0, from_snapshot = slice < 0;
    if (slice < 0) { /* through a snapshot: the voice prefix in a first session, cloned into this one */
        int64_t pc, pu;
        dr_pl_gen_prefix(g, &pc, &pu);
        assert_true(pc > 0);
        dr_pl_gen *first = NULL;
        int64_t r2;
        assert_int_equal(dr_pl_gen_create(m, &gp, &first, &e), DRAMA_OK);
        assert_int_equal(dr_pl_gen_prompt(first, m, &text, 0, &refs, 8192, 4, &r2, &e), DRAMA_OK);
        assert_int_equal(dr_pl_gen_prefill(first, 0, pc, pu, &used, &e), DRAMA_OK);
        assert_int_equal(dr_pl_gen_fed(first, 0), pc);
        assert_int_equal(dr_pl_gen_restore(g, dr_pl_gen_session(first), pc, pu, &e), DRAMA_OK);
        dr_pl_gen_free(first);
        slice = 0;
    }
    /* every cut on the DR_GDN_CHUNK-row grid (chunked) or at the voice prefix or the prompt's end,
     * and no call longer than the slice or one block per prompt (except the unconditional rest
     * taken by the call that completes the conditional prompt or its prefix) */
    const int64_t B = DR_GDN_CHUNK;
    int64_t align = dr_pl_lm_model(m)->bb.d.gdn_recurrent ? 1 : B, pc0, pu0, nc0, nu0;
    dr_pl_gen_prefix(g, &pc0, &pu0);
    dr_pl_gen_rows(g, 0, &nc0);
    dr_pl_gen_rows(g, 1, &nu0);
    while (dr_pl_gen_pending(g) > 0) {
        int64_t c0 = dr_pl_gen_fed(g, 0), u0 = dr_pl_gen_fed(g, 1);
        if (dr_pl_gen_prefill(g, slice, 0, 0, &used, &e) != DRAMA_OK) fail_msg("prefill: %s", e.message);
        int64_t c1 = dr_pl_gen_fed(g, 0), u1 = dr_pl_gen_fed(g, 1);
        assert_true(c1 % align == 0 || c1 == pc0 || c1 == nc0);
        assert_true(u1 % align == 0 || u1 == pu0 || u1 == nu0);
        if (slice > 0) assert_true(c1 - c0 <= (slice > B ? slice : B));
        if (slice > 0 && c1 != pc0 && c1 != nc0) assert_true(u1 - u0 <= (slice > B ? slice : B));
        calls++;
    }
    dr_gen_session *s = dr_pl_gen_session(g);
    const dr_gen_lm *lm = dr_pl_lm_model(m);
    int64_t H = lm->bb.d.H, ncand = lm->model.bb.n_candidates, hv = lm->tower.d.head_vocab;
    int NC = dr_gen_num_codebooks(s);
    trace_add(t, dr_gen_pending_hidden(s), (size_t)H);
    dr_pl_gen_begin_frames(g, 4);
    int32_t frame[64];
    for (int f = 0; f < 4; f++) {
        dr_gen_finish fin;
        assert_int_equal(dr_gen_next(s, frame, &fin, &e), DRAMA_OK);
        assert_int_equal(fin, DR_FINISH_NONE);
        trace_add(t, dr_gen_last_logits(s), (size_t)ncand);
        trace_add(t, dr_gen_last_head_logits(s), (size_t)(NC - 1) * hv);
        trace_add(t, dr_gen_pending_hidden(s), (size_t)H);
    }
    printf("  %s %lld: %d prefill calls over %lld rows, %zu values traced\n", from_snapshot ? "snapshot + rest, slice" : "slice",
           (long long)slice, calls, (long long)rows, t->n);
    dr_pl_gen_free(g);
    dr_pl_refs_free(&refs);
    dr_pl_text_free(&text);
}

static void test_prefill_state_bitwise(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    drama_error e = {0};
    assert_int_equal(dr_pl_lm_acquire(m, &e), DRAMA_OK);
    const int pick[2] = {3, 2}; /* two voices unguided; one voice guided */
    for (int p = 0; p < 2; p++) {
        printf("%s:\n", s.name[pick[p]]);
        trace whole = {0}, t1 = {0}, t7 = {0}, snap = {0};
        prefill_trace(m, &s.r[pick[p]], 0, &whole);
        prefill_trace(m, &s.r[pick[p]], 1, &t1);
        prefill_trace(m, &s.r[pick[p]], 7, &t7);
        prefill_trace(m, &s.r[pick[p]], -1, &snap);
        assert_int_equal(whole.n, t1.n);
        assert_int_equal(whole.n, t7.n);
        assert_int_equal(whole.n, snap.n);
        assert_memory_equal(whole.v, t1.v, whole.n * sizeof(float));
        assert_memory_equal(whole.v, t7.v, whole.n * sizeof(float));
        assert_memory_equal(whole.v, snap.v, whole.n * sizeof(float));
        free(whole.v);
        free(t1.v);
        free(t7.v);
        free(snap.v);
    }
    free_suite(&s);
    drama_model_close(m);
}

/* deltanet.prefill=chunked (the default) with prompts long enough for whole DR_GDN_CHUNK-row
 * blocks on both sides of the voice prefix (a 150-frame reference, a long text): the state is bit
 * for bit the same in one call, in slices of 1, 7, 16, 64 and 100 rows, and through a snapshot;
 * the codes through the engine at those slices equal the solo run; and row by row (recurrent)
 * gives visibly other bits (so the chunked form really ran), within fp32 rounding of them. */
static void test_prefill_chunked_blocks(void **state) {
    (void)state;
    drama_model *m = open_tiny(), *mr = NULL;
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = 2;
    const char *rec[] = {"deltanet.prefill=recurrent", NULL};
    mo.set = rec;
    drama_error e = {0};
    if (drama_model_open(&mr, tu_golden("tiny-drama3"), &mo, &e) != DRAMA_OK) fail_msg("model open: %s", e.message);
    assert_int_equal(dr_pl_lm_acquire(m, &e), DRAMA_OK);
    assert_int_equal(dr_pl_lm_acquire(mr, &e), DRAMA_OK);
    int nc = drama_model_codebooks(m);
    int32_t *codes = make_codes(nc, 150, 4);
    drama_reference ref = {.transcript = "A long reference voice, read slowly.", .codes = codes, .n_code_frames = 150};
    drama_request r[2], bg;
    for (int i = 0; i < 2; i++) {
        drama_request_default(&r[i]);
        r[i].text = "This text is long enough to fill a whole block of sixty four rows after the voice prefix, "
                    "so the chunked form also runs past the cut that the prompt cache makes, and it goes on a "
                    "little further than that with some more words.";
        r[i].references = &ref;
        r[i].n_references = 1;
        r[i].chunk_tokens = 400;
        r[i].frames = 6;
        r[i].seed = 4242 + (uint64_t)i;
        r[i].seed_set = 1;
    }
    r[1].cfg_gamma = 1.5f;
    drama_request_default(&bg);
    bg.text = "Hello there.";
    bg.seed = 7;
    bg.seed_set = 1;
    const int64_t slices[6] = {1, 7, 16, 64, 100, -1};
    for (int p = 0; p < 2; p++) {
        printf("long voice, %s:\n", p ? "guided" : "unguided");
        trace whole = {0}, other = {0}, rt = {0};
        prefill_trace(m, &r[p], 0, &whole);
        for (int k = 0; k < 6; k++) {
            prefill_trace(m, &r[p], slices[k], &other);
            assert_int_equal(whole.n, other.n);
            assert_memory_equal(whole.v, other.v, whole.n * sizeof(float));
            other.n = 0;
        }
        prefill_trace(mr, &r[p], 0, &rt);
        assert_int_equal(whole.n, rt.n);
        const dr_gen_lm *lm = dr_pl_lm_model(m);
        int64_t H = lm->bb.d.H;
        assert_true(memcmp(whole.v, rt.v, (size_t)H * sizeof(float)) != 0); /* the chunked form ran */
        assert_true(tu_report("pending hidden, chunked vs recurrent", tu_compare_f32(whole.v, rt.v, H), 1e-3));
        free(whole.v);
        free(other.v);
        free(rt.v);
        const int es[4] = {1, 7, 64, 0};
        slices_equal_solo(m, &r[p], &bg, p ? "long voice, guided" : "long voice", es, 4);
    }
    free(codes);
    drama_model_close(mr);
    drama_model_close(m);
}

static void expect_idle(drama_engine *e) {
    drama_engine_stats es;
    drama_engine_get_stats(e, &es);
    assert_int_equal(es.lanes_prefilling, 0);
    assert_int_equal(es.lanes_generating, 0);
    assert_int_equal(es.reserved_bytes, 0);
}

/* Cancel while prefilling and while generating: the lane finishes within one tick with its state
 * and reservation freed; the same request afterwards equals its solo run. */
static void test_cancel(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    drama_request r = s.r[2]; /* guided, with a voice */
    outcome want;
    solo(m, &r, &want);
    drama_engine *e = make_engine(m, 2, 1, 64 << 20);
    drama_error err = {0};
    drama_request bg = s.r[0];
    bg.frames = 200;
    outcome b;
    memset(&b, 0, sizeof b);
    drama_lane hb = 0;
    assert_int_equal(drama_engine_start(e, &bg, collect, NULL, &b.audio, &hb, &err), DRAMA_OK);
    assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
    for (int where = 0; where < 2; where++) { /* 0: mid-prefill, 1: mid-generation */
        outcome got;
        memset(&got, 0, sizeof got);
        drama_lane h = 0;
        assert_int_equal(drama_engine_start(e, &r, collect, NULL, &got.audio, &h, &err), DRAMA_OK);
        drama_engine_stats es;
        int guard = 0;
        for (;;) {
            assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
            drama_engine_get_stats(e, &es);
            dr_lane *l = &e->lanes[(h & 0xFFFF) - 1];
            if (where == 0 && l->phase == DR_LANE_PREFILL) break;
            if (where == 1 && l->phase == DR_LANE_GENERATE && l->n_frames >= 3) break;
            assert_true(++guard < 10000);
        }
        int64_t reserved_with = es.reserved_bytes;
        drama_lane_cancel(e, h);
        assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
        assert_true(drama_lane_done(e, h));
        drama_error le = {0};
        assert_int_equal(drama_lane_result(e, h, &got.res, &le), DRAMA_ECANCELLED);
        assert_string_equal(got.res.finish_reason, "cancelled");
        assert_null(got.res.codes);
        drama_engine_get_stats(e, &es);
        assert_true(es.reserved_bytes < reserved_with); /* only the background lane's reservation is left */
        drama_lane_release(e, h);
        drama_lane_cancel(e, h); /* stale handle: ignored */
        outcome_free(&got);
        /* the identical request now */
        assert_int_equal(drama_engine_start(e, &r, collect, NULL, &got.audio, &h, &err), DRAMA_OK);
        drama_lane h1[1] = {h};
        run_until_done(e, h1, 1);
        got.st = drama_lane_result(e, h, &got.res, NULL);
        drama_lane_release(e, h);
        same(&want, &got, where ? "after a cancel mid-generation" : "after a cancel mid-prefill");
        outcome_free(&got);
    }
    drama_lane_cancel(e, hb);
    assert_int_equal(drama_engine_step(e, &err), DRAMA_OK);
    assert_true(drama_lane_done(e, hb));
    drama_lane_release(e, hb);
    expect_idle(e);
    outcome_free(&b);
    outcome_free(&want);
    drama_engine_free(e);
    free_suite(&s);
    drama_model_close(m);
}

/* A -> B -> A through the cache gives A the audio of a fresh engine; a bound that holds one entry
 * evicts the least recently used. */
static void test_cache_abA_and_lru(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    const drama_request *A = &s.r[1], *B = &s.r[4];
    outcome wa, wb;
    solo(m, A, &wa);
    solo(m, B, &wb);
    int64_t n;
    (void)n;
    for (int bound = 0; bound < 2; bound++) {
        /* bound 0: room for both; bound 1: for one entry only */
        drama_plan pa;
        drama_error err = {0};
        assert_int_equal(drama_request_plan(m, A, &pa, &err), DRAMA_OK);
        int64_t one = dr_plan_snapshot_bytes(m, pa.prefix_rows, 0);
        assert_true(one > 0);
        drama_engine *e = make_engine(m, 1, 0, bound ? one + one / 2 : 64 << 20);
        const drama_request *seq[3] = {A, B, A};
        const outcome *want[3] = {&wa, &wb, &wa};
        for (int i = 0; i < 3; i++) {
            outcome got;
            memset(&got, 0, sizeof got);
            drama_lane h = 0;
            assert_int_equal(drama_engine_start(e, seq[i], collect, NULL, &got.audio, &h, &err), DRAMA_OK);
            drama_lane h1[1] = {h};
            run_until_done(e, h1, 1);
            got.st = drama_lane_result(e, h, &got.res, NULL);
            drama_lane_release(e, h);
            same(want[i], &got, i == 2 ? "A after B" : "first A / B");
            assert_int_equal(got.res.voice_cached, i == 2 && !bound);
            outcome_free(&got);
            drama_engine_stats es;
            drama_engine_get_stats(e, &es);
            assert_true(es.prompt_cache_bytes <= (bound ? one + one / 2 : 64 << 20));
            if (bound) assert_true(es.prompt_cache_entries == 1);
        }
        drama_engine_stats es;
        drama_engine_get_stats(e, &es);
        printf("cache bound %lld: hits %lld misses %lld evictions %lld entries %lld bytes %lld\n",
               (long long)(bound ? one + one / 2 : 64 << 20), (long long)es.prompt_cache_hits,
               (long long)es.prompt_cache_misses, (long long)es.prompt_cache_evictions,
               (long long)es.prompt_cache_entries, (long long)es.prompt_cache_bytes);
        assert_int_equal(es.prompt_cache_hits, bound ? 0 : 1);
        assert_int_equal(es.prompt_cache_misses, bound ? 3 : 2);
        if (bound) assert_int_equal(es.prompt_cache_evictions, 2);
        drama_engine_free(e);
    }
    outcome_free(&wa);
    outcome_free(&wb);
    free_suite(&s);
    drama_model_close(m);
}

/* Admission by memory: a budget that holds one request's reservation refuses a second one now
 * (EBUSY, insufficient_memory) and one that can never fit (ENOMEM); the planned bytes cover what
 * real states report. */
static void test_memory_admission(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    suite s;
    make_suite(m, &s);
    drama_plan p;
    drama_error err = {0};
    assert_int_equal(drama_request_plan(m, &s.r[1], &p, &err), DRAMA_OK);
    assert_true(p.state_bytes > 0 && p.prompt_rows > p.prefix_rows && p.prefix_rows > 12);
    assert_int_equal(p.max_rows, p.prompt_rows + 9);
    drama_engine_options o;
    drama_engine_options_default(&o);
    o.lanes = 2;
    o.memory_budget_bytes = p.state_bytes + p.state_bytes / 2;
    drama_engine *e = NULL;
    assert_int_equal(drama_engine_create(&e, m, &o, &err), DRAMA_OK);
    drama_lane h1 = 0, h2 = 0;
    sink k1 = {0}, k2 = {0};
    assert_int_equal(drama_engine_start(e, &s.r[1], collect, NULL, &k1, &h1, &err), DRAMA_OK);
    assert_int_equal(drama_engine_start(e, &s.r[1], collect, NULL, &k2, &h2, &err), DRAMA_EBUSY);
    assert_string_equal(err.reason, "insufficient_memory");
    dr_error_clear(&err);
    drama_request big = s.r[1];
    big.max_frames = 750;
    big.frames = 700;
    assert_int_equal(drama_engine_start(e, &big, collect, NULL, &k2, &h2, &err), DRAMA_ENOMEM);
    assert_string_equal(err.reason, "insufficient_memory");
    dr_error_clear(&err);
    drama_lane hs[1] = {h1};
    run_until_done(e, hs, 1);
    drama_lane_release(e, h1);
    assert_int_equal(drama_engine_start(e, &s.r[1], collect, NULL, &k2, &h2, &err), DRAMA_OK);
    drama_lane_release(e, h2); /* dropped before it ran */
    expect_idle(e);
    drama_engine_free(e);
    /* the formula against real states */
    const dr_gen_lm *g = dr_pl_lm_model(m);
    assert_non_null(g);
    const int64_t rows[4] = {1, 255, 257, 1000};
    for (int i = 0; i < 4; i++) {
        dr_bb_state *st = NULL;
        assert_int_equal(dr_bb_state_create(&g->bb, 256, &st, &err), DRAMA_OK);
        assert_int_equal(dr_bb_state_reserve(st, rows[i], &err), DRAMA_OK);
        assert_true(dr_bb_state_bytes(st) <= dr_bb_state_bytes_for(&g->bb, 256, rows[i]));
        assert_true(dr_bb_state_bytes(st) * 2 > dr_bb_state_bytes_for(&g->bb, 256, rows[i]));
        dr_bb_state_free(st);
        dr_tower_cache *tc = NULL;
        assert_int_equal(dr_tower_cache_create(&g->tower, 256, &tc, &err), DRAMA_OK);
        assert_int_equal(dr_tower_cache_reserve(tc, rows[i], &err), DRAMA_OK);
        assert_int_equal(tc->cap, dr_state_capacity_for(256, rows[i]));
        dr_tower_cache_free(tc);
    }
    free(k1.x);
    free(k2.x);
    free_suite(&s);
    drama_model_close(m);
}

/* A mono PCM16 WAV image of a 220 Hz tone (n samples at rate). */
static unsigned char *make_wav(int rate, int n, size_t *size) {
    *size = 44 + (size_t)n * 2;
    unsigned char *b = calloc(1, *size);
    uint32_t v;
    memcpy(b, "RIFF", 4);
    v = (uint32_t)(*size - 8);
    memcpy(b + 4, &v, 4);
    memcpy(b + 8, "WAVEfmt ", 8);
    v = 16;
    memcpy(b + 16, &v, 4);
    uint16_t h = 1;
    memcpy(b + 20, &h, 2);
    memcpy(b + 22, &h, 2);
    v = (uint32_t)rate;
    memcpy(b + 24, &v, 4);
    v = (uint32_t)rate * 2;
    memcpy(b + 28, &v, 4);
    h = 2;
    memcpy(b + 32, &h, 2);
    h = 16;
    memcpy(b + 34, &h, 2);
    memcpy(b + 36, "data", 4);
    v = (uint32_t)n * 2;
    memcpy(b + 40, &v, 4);
    for (int i = 0; i < n; i++) {
        int16_t x = (int16_t)lrint(8000.0 * sin(2 * M_PI * 220.0 * i / rate));
        memcpy(b + 44 + 2 * i, &x, 2);
    }
    return b;
}

typedef struct enc_job {
    drama_model *m;
    const unsigned char *wav;
    size_t size;
    int32_t *codes;
    int64_t frames;
    drama_status st;
} enc_job;

static void *encode_thread(void *arg) {
    enc_job *j = arg;
    double dur = 0;
    drama_error e = {0};
    j->st = drama_encode_audio(j->m, j->wav, j->size, 0, &j->codes, &j->frames, &dur, &e);
    return NULL;
}

/* drama_encode_audio on several threads at once, beside a running engine, gives the codes the
 * engine derives from the same bytes as a reference: audio bytes and those codes give the same
 * request output. */
static void test_encode_audio_threads(void **state) {
    (void)state;
    drama_model *m = open_tiny();
    size_t size;
    unsigned char *wav = make_wav(22050, 22050 / 2, &size); /* 0.5 s, resampled to the codec rate */
    int32_t *codes = NULL;
    int64_t frames = 0;
    double dur = 0;
    drama_error e = {0};
    assert_int_equal(drama_encode_audio(m, wav, size, 0, &codes, &frames, &dur, &e), DRAMA_OK);
    assert_true(fabs(dur - 0.5) < 1e-3);
    int spf = drama_model_samples_per_frame(m), rate = drama_model_sample_rate(m);
    assert_int_equal(frames, (rate / 2 + spf - 1) / spf);
    /* an engine generating while three threads encode */
    drama_engine *eng = make_engine(m, 1, 0, 0);
    drama_request bg;
    drama_request_default(&bg);
    bg.text = "Background work.";
    bg.frames = 30;
    bg.seed_set = 1;
    sink kb = {0};
    drama_lane hb = 0;
    assert_int_equal(drama_engine_start(eng, &bg, collect, NULL, &kb, &hb, &e), DRAMA_OK);
    enc_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (enc_job){.m = m, .wav = wav, .size = size};
        pthread_create(&th[i], NULL, encode_thread, &jobs[i]);
    }
    drama_lane hs[1] = {hb};
    run_until_done(eng, hs, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].st, DRAMA_OK);
        assert_int_equal(jobs[i].frames, frames);
        assert_memory_equal(jobs[i].codes, codes, (size_t)frames * drama_model_codebooks(m) * sizeof(int32_t));
        drama_codes_free(jobs[i].codes);
    }
    drama_lane_release(eng, hb);
    drama_engine_free(eng);
    free(kb.x);
    /* the same voice as audio bytes and as codes */
    drama_reference ra = {.transcript = "A tone.", .audio_data = wav, .audio_bytes = size};
    drama_reference rc = {.transcript = "A tone.", .codes = codes, .n_code_frames = frames};
    drama_request r;
    drama_request_default(&r);
    r.text = "Speak with the tone.";
    r.frames = 5;
    r.seed = 8;
    r.seed_set = 1;
    r.references = &ra;
    r.n_references = 1;
    outcome oa, oc;
    solo(m, &r, &oa);
    r.references = &rc;
    solo(m, &r, &oc);
    assert_int_equal(oa.st, DRAMA_OK);
    same(&oa, &oc, "audio bytes vs drama_encode_audio codes");
    printf("drama_encode_audio: %lld frames, 3 threads beside an engine agree; bytes == codes as a reference\n",
           (long long)frames);
    outcome_free(&oa);
    outcome_free(&oc);
    drama_codes_free(codes);
    free(wav);
    drama_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_solo),
        cmocka_unit_test(test_prefill_slices),
        cmocka_unit_test(test_prefill_state_bitwise),
        cmocka_unit_test(test_prefill_chunked_blocks),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cache_abA_and_lru),
        cmocka_unit_test(test_memory_admission),
        cmocka_unit_test(test_encode_audio_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
