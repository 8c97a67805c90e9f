/* engine.c - drama_engine (include/drama.h): lanes, admission by lanes and reserved bytes, the
 * tick (prefill slices, one batched frame step, decoding), lane handles and statistics. The
 * steps of one lane are in engine_lane.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/receipt.h"
#include "gen/engine_internal.h"

#define MAX_LANES 256

/* ---- request copies ---- */

static void *keep(dr_req_copy *c, const void *src, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) return NULL;
    if (n) memcpy(p, src, n);
    c->owned[c->n_owned++] = p;
    return p;
}

static const char *keep_str(dr_req_copy *c, const char *s, int *ok) {
    if (!s) return NULL;
    const char *p = keep(c, s, strlen(s) + 1);
    if (!p) *ok = 0;
    return p;
}

drama_status dr_req_copy_make(const drama_request *src, int nc, dr_req_copy *out, drama_error *err) {
    memset(out, 0, sizeof *out);
    out->req = *src;
    int ok = 1, n = src->n_references;
    if (n < 0 || n > 16 || (n > 0 && !src->references)) return dr_fail(err, DRAMA_EINVAL, "references: %d given, at most 16", n);
    out->req.text = keep_str(out, src->text, &ok);
    for (int i = 0; i < n; i++) {
        const drama_reference *r = &src->references[i];
        drama_reference *d = &out->refs[i];
        *d = *r;
        d->audio_path = keep_str(out, r->audio_path, &ok);
        d->codes_path = keep_str(out, r->codes_path, &ok);
        d->transcript = keep_str(out, r->transcript, &ok);
        if (r->audio_data && !(d->audio_data = keep(out, r->audio_data, r->audio_bytes))) ok = 0;
        if (r->codes && r->n_code_frames > 0 && r->n_code_frames < INT32_MAX &&
            !(d->codes = keep(out, r->codes, (size_t)r->n_code_frames * (size_t)nc * sizeof(int32_t))))
            ok = 0;
    }
    out->req.references = n > 0 ? out->refs : NULL;
    if (!ok) {
        dr_req_copy_free(out);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory copying the request");
    }
    return DRAMA_OK;
}

void dr_req_copy_free(dr_req_copy *c) {
    for (int i = 0; i < c->n_owned; i++) free(c->owned[i]);
    memset(c, 0, sizeof *c);
}

drama_status drama_request_copy(const drama_model *m, const drama_request *src, drama_request **out,
                                drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "drama_request_copy: out is NULL");
    *out = NULL;
    if (!m || !src) return dr_fail(err, DRAMA_EINVAL, "drama_request_copy: model or request is NULL");
    dr_req_copy *c = malloc(sizeof *c);
    if (!c) return dr_fail(err, DRAMA_ENOMEM, "out of memory copying the request");
    drama_status st = dr_req_copy_make(src, m->n_codebooks, c, err);
    if (st != DRAMA_OK) {
        free(c);
        return st;
    }
    *out = &c->req; /* the first member: drama_request_free finds the copy from it */
    return DRAMA_OK;
}

void drama_request_free(drama_request *req) {
    if (!req) return;
    dr_req_copy *c = (dr_req_copy *)req;
    dr_req_copy_free(c);
    free(c);
}

/* ---- options, memory budget ---- */

void drama_engine_options_default(drama_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->lanes = 1;
    o->prefill_slice_rows = -1; /* auto */
}

/* Physical memory, or the cgroup's limit when lower (containers). */
static int64_t physical_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    const char *files[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f) continue;
        long long v = 0;
        if (fscanf(f, "%lld", &v) == 1 && v > 0 && (phys == 0 || v < phys)) phys = v;
        fclose(f);
    }
    return phys;
}

static int64_t default_budget(void) {
    int64_t phys = physical_bytes(), rss = dr_mem_rss_bytes();
    int64_t b = phys / 4 * 3 - rss;
    return b > 0 ? b : 0;
}

/* ---- create / free ---- */

static drama_status engine_alloc(drama_model *m, const drama_engine_options *o, int private_, drama_engine **out,
                                 drama_error *err) {
    *out = NULL;
    if (o->lanes < 1 || o->lanes > MAX_LANES)
        return dr_fail(err, DRAMA_EINVAL, "lanes: %d is outside 1..%d", o->lanes, MAX_LANES);
    if (o->prefill_slice_rows < -1)
        return dr_fail(err, DRAMA_EINVAL, "prefill_slice_rows: %d must be -1 (auto), 0 (whole) or positive",
                       o->prefill_slice_rows);
    if (o->prompt_cache_bytes < 0)
        return dr_fail(err, DRAMA_EINVAL, "prompt_cache_bytes: %lld must not be negative", (long long)o->prompt_cache_bytes);
    drama_engine *e = calloc(1, sizeof *e);
    if (!e) return dr_fail(err, DRAMA_ENOMEM, "engine: out of memory");
    e->m = m;
    e->o = *o;
    e->private_ = private_;
    e->n_lanes = o->lanes;
    int nc = m->n_codebooks, n = o->lanes;
    e->lanes = calloc((size_t)n, sizeof *e->lanes);
    e->frames_buf = calloc((size_t)n * nc, sizeof *e->frames_buf);
    e->fin_buf = calloc((size_t)n, sizeof *e->fin_buf);
    e->st_buf = calloc((size_t)n, sizeof *e->st_buf);
    e->err_buf = calloc((size_t)n, sizeof *e->err_buf);
    e->sess_buf = calloc((size_t)n, sizeof *e->sess_buf);
    e->lane_buf = calloc((size_t)n, sizeof *e->lane_buf);
    if (o->prompt_cache_bytes > 0) e->cache = dr_pcache_create(o->prompt_cache_bytes);
    if (!e->lanes || !e->frames_buf || !e->fin_buf || !e->st_buf || !e->err_buf || !e->sess_buf || !e->lane_buf ||
        (o->prompt_cache_bytes > 0 && !e->cache)) {
        drama_engine_free(e);
        return dr_fail(err, DRAMA_ENOMEM, "engine: out of memory");
    }
    for (int i = 0; i < n; i++) {
        e->lanes[i].index = i;
        atomic_init(&e->lanes[i].cancel, 0);
    }
    e->st.lanes_total = n;
    *out = e;
    return DRAMA_OK;
}

drama_status drama_engine_create(drama_engine **out, drama_model *m, const drama_engine_options *opt,
                                 drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "drama_engine_create: out is NULL");
    *out = NULL;
    if (!m) return dr_fail(err, DRAMA_EINVAL, "drama_engine_create: model is NULL");
    if (m->low_memory)
        return dr_fail(err, DRAMA_EUNSUPPORTED,
                       "low_memory: a low-memory model unmaps its weights between requests and cannot serve an engine");
    drama_engine_options def;
    if (!opt) {
        drama_engine_options_default(&def);
        opt = &def;
    }
    drama_engine *e;
    drama_status st = engine_alloc(m, opt, 0, &e, err);
    if (st != DRAMA_OK) return st;
    pthread_mutex_lock(&m->run_lock);
    st = dr_pl_lm_acquire(m, err);
    if (st == DRAMA_OK) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_ALL, err);
    if (st == DRAMA_OK) {
        atomic_fetch_add(&m->engines, 1);
        e->counted = 1;
    }
    pthread_mutex_unlock(&m->run_lock);
    if (st != DRAMA_OK) {
        drama_engine_free(e);
        return st;
    }
    e->budget = opt->memory_budget_bytes > 0 ? opt->memory_budget_bytes : opt->memory_budget_bytes < 0 ? -1 : default_budget();
    e->st.memory_budget_bytes = e->budget;
    *out = e;
    return DRAMA_OK;
}

drama_status dr_engine_create_private(drama_model *m, drama_engine **out, drama_error *err) {
    drama_engine_options o;
    drama_engine_options_default(&o);
    o.prefill_slice_rows = 0;
    drama_status st = engine_alloc(m, &o, 1, out, err);
    if (st == DRAMA_OK) (*out)->budget = -1; /* one request, as before there were engines */
    return st;
}

void drama_engine_free(drama_engine *e) {
    if (!e) return;
    if (e->lanes)
        for (int i = 0; i < e->n_lanes; i++) dr_lane_drop(e, &e->lanes[i]);
    dr_pcache_free(e->cache);
    if (e->counted) atomic_fetch_sub(&e->m->engines, 1);
    free(e->lanes);
    free(e->frames_buf);
    free(e->fin_buf);
    free(e->st_buf);
    free(e->err_buf);
    free(e->sess_buf);
    free(e->lane_buf);
    free(e);
}

/* ---- lanes ---- */

static dr_lane *lane_of(const drama_engine *e, drama_lane h) {
    if (!e || h == 0) return NULL;
    uint64_t idx = (h & 0xFFFF);
    if (idx < 1 || idx > (uint64_t)e->n_lanes) return NULL;
    dr_lane *l = &e->lanes[idx - 1];
    if (l->phase == DR_LANE_FREE || dr_lane_handle(l) != h) return NULL;
    return l;
}

drama_status dr_engine_start_ext(drama_engine *e, const drama_request *req, drama_audio_fn on_audio,
                                 drama_event_fn on_event, void *user, const atomic_int *ext_cancel, drama_lane *lane,
                                 drama_error *err) {
    if (lane) *lane = 0;
    if (!e || !req || !lane) return dr_fail(err, DRAMA_EINVAL, "drama_engine_start: engine, request or lane is NULL");
    dr_lane *l = NULL;
    for (int i = 0; i < e->n_lanes && !l; i++)
        if (e->lanes[i].phase == DR_LANE_FREE) l = &e->lanes[i];
    if (!l) return dr_fail_reason(err, DRAMA_EBUSY, "no_free_lane", "no free lane (%d busy)", e->n_lanes);
    int64_t need = 0, rows = 0;
    drama_status st = DRAMA_OK;
    if (!e->private_) {
        drama_plan plan;
        st = dr_plan_request(e->m, req, e->o.prefill_slice_rows, &plan, err);
        if (st != DRAMA_OK) return st;
        need = plan.state_bytes;
        rows = plan.max_rows;
        if (e->budget >= 0 && need > e->budget)
            return dr_fail_reason(err, DRAMA_ENOMEM, "insufficient_memory",
                                  "insufficient_memory: the request needs %lld bytes, the budget is %lld", (long long)need,
                                  (long long)e->budget);
        /* cached voices give way to requests */
        while (e->budget >= 0 && e->reserved + dr_pcache_bytes(e->cache) + need > e->budget &&
               dr_pcache_evict_one(e->cache))
            e->st.prompt_cache_evictions++;
        if (e->budget >= 0 && e->reserved + need > e->budget)
            return dr_fail_reason(err, DRAMA_EBUSY, "insufficient_memory",
                                  "insufficient_memory: %lld bytes needed, %lld of %lld reserved", (long long)need,
                                  (long long)e->reserved, (long long)e->budget);
    } else {
        st = dr_request_validate(req, err);
        if (st != DRAMA_OK) return st;
    }
    st = dr_req_copy_make(req, e->m->n_codebooks, &l->rq, err);
    if (st != DRAMA_OK) return st;
    l->serial++;
    if ((l->serial & 0xFFFFFFFFu) == 0) l->serial = 1;
    atomic_store(&l->cancel, 0);
    l->ext_cancel = ext_cancel;
    l->on_audio = on_audio;
    l->on_event = on_event;
    l->user = user;
    memset(&l->res, 0, sizeof l->res);
    memset(&l->err, 0, sizeof l->err);
    l->order = e->next_order++;
    l->reserved = need;
    l->planned_rows = rows;
    e->reserved += need;
    l->n_frames = l->cap_frames = l->frames_decoded = 0;
    l->chunk_index = 0;
    dr_lane_begin(e, l);
    *lane = dr_lane_handle(l);
    return DRAMA_OK;
}

drama_status drama_engine_start(drama_engine *e, const drama_request *req, drama_audio_fn on_audio,
                                drama_event_fn on_event, void *user, drama_lane *lane, drama_error *err) {
    return dr_engine_start_ext(e, req, on_audio, on_event, user, NULL, lane, err);
}

void drama_lane_cancel(drama_engine *e, drama_lane h) {
    if (!e || h == 0) return;
    uint64_t idx = h & 0xFFFF;
    if (idx < 1 || idx > (uint64_t)e->n_lanes) return;
    /* the lane compares the stored handle with its own, so a stale handle cancels nothing */
    atomic_store(&e->lanes[idx - 1].cancel, h);
}

int drama_lane_done(const drama_engine *e, drama_lane h) {
    const dr_lane *l = lane_of(e, h);
    return l && l->phase == DR_LANE_DONE;
}

drama_status drama_lane_result(drama_engine *e, drama_lane h, drama_result *res, drama_error *err) {
    dr_lane *l = lane_of(e, h);
    if (res) memset(res, 0, sizeof *res);
    if (!l || l->phase != DR_LANE_DONE) return dr_fail(err, DRAMA_EINVAL, "drama_lane_result: the lane has not finished");
    if (l->result_taken) return dr_fail(err, DRAMA_EINVAL, "drama_lane_result: the result was already taken");
    l->result_taken = 1;
    if (res) {
        *res = l->res;
        l->res.codes = NULL; /* the caller's now */
    }
    if (err && l->status != DRAMA_OK) {
        dr_error_clear(err);
        *err = l->err;
    }
    return l->status;
}

void drama_lane_release(drama_engine *e, drama_lane h) {
    dr_lane *l = lane_of(e, h);
    if (l) dr_lane_drop(e, l);
}

void drama_engine_get_stats(const drama_engine *e, drama_engine_stats *s) {
    memset(s, 0, sizeof *s);
    if (!e) return;
    *s = e->st;
    for (int i = 0; i < e->n_lanes; i++) {
        dr_lane_phase p = e->lanes[i].phase;
        if (p != DR_LANE_FREE) s->lanes_busy++;
        if (p == DR_LANE_PREPARE || p == DR_LANE_PREFILL) s->lanes_prefilling++;
        if (p == DR_LANE_GENERATE || p == DR_LANE_DECODE) s->lanes_generating++;
    }
    s->reserved_bytes = e->reserved;
    s->memory_budget_bytes = e->budget;
    s->prompt_cache_bytes = dr_pcache_bytes(e->cache);
    s->prompt_cache_entries = dr_pcache_entries(e->cache);
}

/* ---- the tick ---- */

static int running(const dr_lane *l) { return l->phase != DR_LANE_FREE && l->phase != DR_LANE_DONE; }

/* Running means of the step times (they choose slice sizes only, never a result). */
static void observe(double *mean, double x) { *mean = *mean > 0 ? 0.8 * *mean + 0.2 * x : x; }

/* Prefill rows per tick while lanes generate: fixed, or (auto) as many as take about one frame
 * step, from the measured times of both: 1 row until they are known, and at most twice the last
 * tick's rows (a noisy measurement cannot make one tick much longer than the ones before). */
static int64_t slice_budget(drama_engine *e) {
    if (e->o.prefill_slice_rows > 0) return e->o.prefill_slice_rows;
    if (e->o.prefill_slice_rows == 0) return 0;
    int64_t rows = 1;
    if (e->frame_step_s > 0 && e->prefill_row_s > 0) {
        double r = e->frame_step_s / e->prefill_row_s;
        rows = r < 1 ? 1 : r > 4096 ? 4096 : (int64_t)r;
    }
    int64_t cap = e->last_slice > 0 ? 2 * e->last_slice : 1;
    if (rows > cap) rows = cap;
    e->last_slice = rows;
    return rows;
}

drama_status dr_engine_tick(drama_engine *e, drama_error *err) {
    (void)err;
    int n = e->n_lanes, busy = 0, generating = 0;
    for (int i = 0; i < n; i++) {
        dr_lane *l = &e->lanes[i];
        if (!running(l)) continue;
        busy++;
        if (dr_lane_cancelled(l)) { /* within one tick: state and reservation freed now */
            dr_fail(&l->err, DRAMA_ECANCELLED, "cancelled (%lld frames)", (long long)l->n_frames);
            dr_lane_finish(e, l, DRAMA_ECANCELLED);
            continue;
        }
        generating += l->phase == DR_LANE_GENERATE;
    }
    if (!busy) return DRAMA_OK;
    e->st.ticks++;
    /* newcomers, first come first served */
    dr_lane **order = e->lane_buf;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (e->lanes[i].phase == DR_LANE_PREPARE || e->lanes[i].phase == DR_LANE_PREFILL) order[k++] = &e->lanes[i];
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && order[b - 1]->order > order[b]->order; b--) {
            dr_lane *t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    for (int i = 0; i < k; i++)
        if (order[i]->phase == DR_LANE_PREPARE) dr_lane_prepare(e, order[i]);
    /* prefill: a bounded number of rows per tick while others generate, else whole prompts */
    int64_t budget = generating ? slice_budget(e) : 0, rows = 0;
    double t0 = dr_clock_s();
    for (int i = 0; i < k; i++) {
        dr_lane *l = order[i];
        while (l->phase == DR_LANE_PREFILL) {
            int64_t used = 0;
            if (dr_lane_prefill(e, l, budget > 0 ? budget - rows : 0, &used) != DRAMA_OK) break;
            rows += used;
            if (budget > 0 && rows >= budget) break;
        }
        if (budget > 0 && rows >= budget) break;
    }
    if (rows > 0) observe(&e->prefill_row_s, (dr_clock_s() - t0) / (double)rows);
    /* one frame for every generating lane, in one batched step */
    int g = 0;
    for (int i = 0; i < n; i++)
        if (e->lanes[i].phase == DR_LANE_GENERATE) {
            order[g] = &e->lanes[i];
            e->sess_buf[g] = dr_pl_gen_session(e->lanes[i].gen);
            g++;
        }
    if (g > 0) {
        int nc = e->m->n_codebooks;
        memset(e->err_buf, 0, (size_t)g * sizeof *e->err_buf);
        double t1 = dr_clock_s();
        dr_gen_next_many(e->sess_buf, g, e->frames_buf, e->fin_buf, e->st_buf, e->err_buf);
        observe(&e->frame_step_s, dr_clock_s() - t1);
        for (int i = 0; i < g; i++)
            dr_lane_frame(e, order[i], e->frames_buf + (int64_t)i * nc, e->fin_buf[i], e->st_buf[i], &e->err_buf[i]);
    }
    for (int i = 0; i < n; i++)
        if (e->lanes[i].phase == DR_LANE_DECODE) dr_lane_decode(e, &e->lanes[i]);
    return DRAMA_OK;
}

drama_status drama_engine_step(drama_engine *e, drama_error *err) {
    if (!e) return dr_fail(err, DRAMA_EINVAL, "drama_engine_step: engine is NULL");
    pthread_mutex_lock(&e->m->run_lock);
    drama_status st = dr_engine_tick(e, err);
    pthread_mutex_unlock(&e->m->run_lock);
    return st;
}
