/* frameloop.c - generation sessions (frameloop.h): the host side of prefills and frames; the
 * frame itself is gen/framestep.c. */
#include "gen/frameloop.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "gen/frameloop_internal.h"

/* ---------------- the model ---------------- */

drama_status dr_gen_model_init(dr_gen_model *m, dr_backend *be, const dr_backbone *bb, const dr_tower *tower,
                               dr_pool *pool, drama_error *err) {
    memset(m, 0, sizeof *m);
    m->bb.model = bb;
    m->bb.hidden_dim = bb->d.H;
    m->bb.n_candidates = (int)dr_backbone_n_logits(bb);
    m->bb.semantic_start = bb->sem_start;
    m->tower = tower;
    m->pool = pool;
    m->be = be;
    m->cache = dr_calloc(1, sizeof *m->cache);
    if (!m->cache) return dr_fail(err, DRAMA_ENOMEM, "generation: out of memory");
    return DRAMA_OK;
}

void dr_gen_model_release(dr_gen_model *m) {
    if (!m || !m->cache) return;
    dr_gen_cache *c = m->cache;
    dr_gen_step_free(c->step);
    dr_bb_ws_free(c->bws);
    dr_tower_ws_free(c->tws);
    if (c->hbuf) dr_bk_free(m->be, c->hbuf);
    dr_free(c);
    m->cache = NULL;
}

/* ---------------- sessions ---------------- */

void dr_gen_options_default(dr_gen_options *o) {
    memset(o, 0, sizeof *o);
    dr_sampler_params_default(&o->sp);
    o->cfg_mode = DR_CFG_PAIRED;
    o->has_reference = -1;
}

static void free_states(dr_gen_session *s) {
    dr_bb_state_free(s->cond);
    dr_bb_state_free(s->uncond);
    s->cond = s->uncond = NULL;
}

/* The lane's device part at the start of a request: parameters, draw base, empty window. */
static drama_status write_lane(dr_gen_session *s, drama_error *err) {
    dr_gen_lane g;
    memset(&g, 0, sizeof g);
    g.sp = s->o.sp;
    g.draw = s->o.draw_base + s->draws;
    return dr_bk_upload(s->m->be, s->lane, &g, sizeof g, err);
}

drama_status dr_gen_session_create(const dr_gen_model *m, const dr_gen_options *opt, dr_gen_session **out,
                                   drama_error *err) {
    *out = NULL;
    drama_status st = dr_sampler_params_validate(&opt->sp, err);
    if (st) return st;
    if (opt->frames < 0) return dr_fail(err, DRAMA_EINVAL, "frames: must be >= 0, got %d", opt->frames);
    if (opt->cfg_mode != DR_CFG_PAIRED && opt->cfg_mode != DR_CFG_SEPARATE)
        return dr_fail(err, DRAMA_EINVAL, "cfg_mode: must be paired or separate");
    if (!m->tower || !m->bb.model || !m->be || !m->cache)
        return dr_fail(err, DRAMA_EINVAL, "generation: model not initialised (dr_gen_model_init)");
    if (m->tower->input_dim != m->bb.hidden_dim)
        return dr_fail(err, DRAMA_EINVAL, "generation: tower input width %d differs from the backbone hidden %lld",
                       m->tower->input_dim, (long long)m->bb.hidden_dim);
    if (m->bb.n_candidates < 2) return dr_fail(err, DRAMA_EINVAL, "generation: %d logit candidates", m->bb.n_candidates);
    const dr_tower_dims *td = &m->tower->d;
    int64_t bstride = m->bb.model->d.code_stride;
    /* every code a frame step can draw must be a valid row code (the step cannot stop to check) */
    if (m->bb.n_candidates - 1 > td->code_stride || m->bb.n_candidates - 1 > bstride)
        return dr_fail(err, DRAMA_EINVAL, "generation: %d semantic codes exceed the code tables (tower %lld, backbone %lld)",
                       m->bb.n_candidates - 1, (long long)td->code_stride, (long long)bstride);
    if (td->head_vocab > td->code_stride || td->head_vocab > bstride)
        return dr_fail(err, DRAMA_EINVAL, "generation: tower head_vocab %d exceeds the code tables (tower %lld, backbone %lld)",
                       td->head_vocab, (long long)td->code_stride, (long long)bstride);
    if (td->num_codebooks > DR_MAX_CODEBOOKS)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "generation: %d codebooks (at most %d)", td->num_codebooks,
                       DR_MAX_CODEBOOKS);
    dr_gen_session *s = dr_calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "generation session: out of memory");
    s->m = m;
    s->o = *opt;
    s->nc = td->num_codebooks;
    s->hv = td->head_vocab;
    s->ncand = m->bb.n_candidates;
    s->H = m->bb.hidden_dim;
    atomic_init(&s->cancel, 0);
    size_t nf = 3 * (size_t)s->ncand + (size_t)s->H + (size_t)(s->nc - 1) * s->hv;
    size_t lane_bytes = (sizeof(dr_gen_lane) + 63) & ~(size_t)63;
    st = dr_bk_alloc(m->be, lane_bytes + nf * sizeof(float), &s->dev, err);
    if (!st) {
        s->lane = s->dev;
        s->logits_c = (float *)((char *)s->dev + lane_bytes);
        s->logits_u = s->logits_c + s->ncand;
        s->logits = s->logits_u + s->ncand;
        s->pend_h = s->logits + s->ncand;
        s->head_logits = s->pend_h + s->H;
        s->last_row = dr_calloc((size_t)s->nc + 1, sizeof(int32_t));
        s->h_logits = dr_calloc((size_t)s->ncand, sizeof(float));
        s->h_pend = dr_calloc((size_t)s->H, sizeof(float));
        s->h_head = dr_calloc((size_t)(s->nc - 1) * s->hv, sizeof(float));
        if (!s->last_row || !s->h_logits || !s->h_pend || !s->h_head)
            st = dr_fail(err, DRAMA_ENOMEM, "generation session: out of memory");
    }
    if (!st) st = write_lane(s, err);
    if (!st) st = dr_tower_cache_create_on(m->be, m->tower, 256, &s->tc, err);
    if (st) {
        dr_gen_session_free(s);
        return st;
    }
    *out = s;
    return DRAMA_OK;
}

void dr_gen_session_free(dr_gen_session *s) {
    if (!s) return;
    free_states(s);
    dr_tower_cache_free(s->tc);
    if (s->dev) dr_bk_free(s->m->be, s->dev);
    dr_free(s->last_row);
    dr_free(s->h_logits);
    dr_free(s->h_pend);
    dr_free(s->h_head);
    dr_free(s);
}

drama_status dr_gen_reset(dr_gen_session *s, drama_error *err) {
    free_states(s);
    dr_tower_cache_reset(s->tc);
    s->bb_len = 0;
    s->draws = 0;
    s->frames = s->batch_frames = 0;
    s->finish = DR_FINISH_NONE;
    s->prefilled = 0;
    s->invalid = 0;
    s->guided = 0;
    s->has_ref = 0;
    atomic_store(&s->cancel, 0);
    return write_lane(s, err);
}

drama_status dr_gen_session_clone(const dr_gen_session *src, dr_gen_session **out, drama_error *err) {
    *out = NULL;
    if (src->invalid) return dr_fail(err, DRAMA_EINVAL, "session clone: the source is invalid (cancelled or failed)");
    dr_gen_session *s;
    drama_status st = dr_gen_session_create(src->m, &src->o, &s, err);
    if (st) return st;
    if (src->cond && (st = dr_bb_state_clone(src->cond, &s->cond, err))) goto fail;
    if (src->uncond && (st = dr_bb_state_clone(src->uncond, &s->uncond, err))) goto fail;
    if ((st = dr_tower_cache_copy(src->tc, s->tc, err))) goto fail;
    /* the device part is plain data: lane counters and window, logits, pending hidden, head logits */
    size_t lane_bytes = (size_t)((char *)src->logits_c - (char *)src->dev);
    size_t nf = 3 * (size_t)s->ncand + (size_t)s->H + (size_t)(s->nc - 1) * s->hv;
    dr_bk_copy(s->m->be, s->dev, src->dev, lane_bytes + nf * sizeof(float));
    memcpy(s->last_row, src->last_row, (size_t)(s->nc + 1) * sizeof(int32_t));
    s->guided = src->guided;
    s->has_ref = src->has_ref;
    s->prefilled = src->prefilled;
    s->bb_len = src->bb_len;
    s->draws = src->draws;
    s->frames = src->frames;
    s->batch_frames = src->batch_frames;
    s->finish = src->finish;
    if ((st = dr_bk_sync(s->m->be, err))) goto fail;
    *out = s;
    return DRAMA_OK;
fail:
    dr_gen_session_free(s);
    return st;
}

drama_status dr_gen_set_params(dr_gen_session *s, const dr_sampler_params *sp, drama_error *err) {
    drama_status st = dr_sampler_params_validate(sp, err);
    if (st) return st;
    if (s->prefilled && ((sp->cfg_gamma > 0 && s->has_ref) != s->guided))
        return dr_fail(err, DRAMA_EINVAL, "cfg_gamma: guidance cannot be switched on or off after the prefill");
    if ((st = dr_bk_upload(s->m->be, (char *)s->lane + offsetof(dr_gen_lane, sp), sp, sizeof *sp, err))) return st;
    s->o.sp = *sp;
    return DRAMA_OK;
}

void dr_gen_cancel(dr_gen_session *s) {
    if (s) atomic_store(&s->cancel, 1);
}

static int is_audio(const dr_gen_session *s, const int32_t *row) {
    int64_t t = row[0];
    return t >= s->m->bb.semantic_start && t < s->m->bb.semantic_start + s->ncand - 1;
}

/* Rows the frame loop can pair with the tower: an audio row's c0 is its semantic token and every
 * code is a row of the tower's code table (checked here so the error names the prefill). */
static drama_status check_rows(const dr_gen_session *s, const int32_t *rows, int64_t n, const char *what,
                               drama_error *err) {
    int64_t stride = s->m->tower->d.code_stride;
    for (int64_t r = 0; r < n; r++) {
        const int32_t *row = rows + r * (s->nc + 1);
        if (row[0] < 0) return dr_fail(err, DRAMA_EINVAL, "%s row %lld: negative token id %d", what, (long long)r, row[0]);
        if (!is_audio(s, row)) continue;
        if (row[1] != row[0] - s->m->bb.semantic_start)
            return dr_fail(err, DRAMA_EINVAL, "%s row %lld: semantic token %d but c0 column %d", what, (long long)r,
                           row[0], row[1]);
        for (int j = 0; j < s->nc; j++)
            if (row[1 + j] < 0 || row[1 + j] >= stride)
                return dr_fail(err, DRAMA_EINVAL, "%s row %lld: code c%d = %d outside the tower's code table [0, %lld)",
                               what, (long long)r, j, row[1 + j], (long long)stride);
    }
    return DRAMA_OK;
}

/* -log softmax(head j-1 logits)[c_j] of every audio-paired tower row (MODEL.md 11 step 3). */
static void score_rows(dr_gen_session *s, const float *logits, const int32_t *codes, const uint8_t *mask, int64_t nt) {
    dr_gen_score *sc = s->score;
    sc->n_codebooks = s->nc - 1;
    for (int64_t r = 0; r < nt; r++) {
        if (!mask[r]) continue;
        sc->count++;
        for (int j = 1; j < s->nc; j++) {
            const float *l = logits + (r * (s->nc - 1) + (j - 1)) * s->hv;
            int32_t target = codes[r * s->nc + j];
            double mx = -INFINITY, z = 0;
            for (int i = 0; i < s->hv; i++) mx = l[i] > mx ? l[i] : mx;
            for (int i = 0; i < s->hv; i++) z += exp(l[i] - mx);
            /* a code outside the head's vocabulary cannot be predicted: infinite NLL */
            double nll = (target >= 0 && target < s->hv) ? log(z) - (l[target] - mx) : INFINITY;
            if (j - 1 < DR_GEN_SCORE_MAX) sc->nll_sum[j - 1] += nll;
        }
    }
}

/* The model's prefill workspaces for n rows (grown, never shrunk: one thread drives a model). */
static drama_status prefill_ws(const dr_gen_model *m, int64_t n, drama_error *err) {
    dr_gen_cache *c = m->cache;
    drama_status st = DRAMA_OK;
    int64_t chunk = n < 256 ? n : 256;
    if (!c->bws || c->bws->rows < chunk) {
        dr_bb_ws_free(c->bws);
        c->bws = NULL;
        if ((st = dr_bb_ws_create(m->be, m->bb.model, chunk, &c->bws, err))) return st;
    }
    if (!c->tws || c->tws->rows < n) {
        dr_tower_ws_free(c->tws);
        c->tws = NULL;
        if ((st = dr_tower_ws_create(m->be, m->tower, n, &c->tws, err))) return st;
    }
    if (c->hbuf_rows < n + 1) {
        if (c->hbuf) dr_bk_free(m->be, c->hbuf);
        c->hbuf = NULL;
        c->hbuf_rows = 0;
        if ((st = dr_bk_alloc_scratch(m->be, (size_t)(n + 1) * (size_t)m->bb.hidden_dim, sizeof(float), (void **)&c->hbuf,
                                      err)))
            return st;
        c->hbuf_rows = n + 1;
    }
    return DRAMA_OK;
}

drama_status dr_gen_prefill(dr_gen_session *s, const int32_t *rows, int64_t n_rows, const int32_t *uncond_rows,
                            int64_t n_uncond, drama_error *err) {
    if (s->invalid) return dr_fail(err, DRAMA_EINVAL, "generation session: invalid after a cancel or failure; reset it");
    if (n_rows <= 0) return dr_fail(err, DRAMA_EEMPTY, "prefill: no rows");
    drama_status st = check_rows(s, rows, n_rows, "prefill", err);
    if (st) return st;
    const dr_gen_model *m = s->m;
    dr_backend *be = m->be;
    const int W = s->nc + 1;
    int has_ref = s->has_ref, guided = s->guided;
    if (!s->prefilled) {
        /* -1: decided here, once, from the first prefill's rows (a reference voice is part of the
         * prompt's start); callers whose first call lacks the reference rows pass 0 or 1 */
        has_ref = s->o.has_reference;
        if (has_ref < 0) {
            has_ref = 0;
            for (int64_t r = 0; r < n_rows; r++) has_ref |= is_audio(s, rows + r * W);
        }
        /* a request without a reference voice is never guided, whatever gamma */
        guided = s->o.sp.cfg_gamma > 0 && has_ref;
    }
    if (guided) {
        /* a later call may carry none: the unconditional prompt can be complete before the other */
        if (!s->prefilled && (!uncond_rows || n_uncond <= 0))
            return dr_fail(err, DRAMA_EINVAL, "cfg_gamma %g with a reference needs the unconditional rows",
                           (double)s->o.sp.cfg_gamma);
        if (n_uncond > 0 && !uncond_rows) return dr_fail(err, DRAMA_EINVAL, "unconditional prefill: rows missing");
        if (n_uncond > 0 && (st = check_rows(s, uncond_rows, n_uncond, "unconditional prefill", err))) return st;
    }
    /* states are created only once the rows are known to be usable; leftovers of a first prefill
     * that failed before the backbone ran (out of memory) are empty and dropped, so a retry
     * neither leaks nor needs a reset */
    if (!s->prefilled) {
        free_states(s);
        s->has_ref = has_ref;
        s->guided = guided;
        if ((st = dr_bb_state_create_on(be, m->bb.model, 256, &s->cond, err))) return st;
        if (s->guided && (st = dr_bb_state_create_on(be, m->bb.model, 256, &s->uncond, err))) {
            free_states(s);
            return st;
        }
    }
    int32_t *tcodes = dr_alloc((size_t)(n_rows + 1) * s->nc * sizeof(int32_t));
    uint8_t *tmask = dr_alloc((size_t)n_rows + 1);
    if (!tcodes || !tmask || (st = prefill_ws(m, n_rows, err))) {
        if (!st) st = dr_fail(err, DRAMA_ENOMEM, "prefill: out of memory for %lld rows", (long long)n_rows);
        goto done;
    }
    /* hidden rows go to hbuf + H, so the tower rows [pend_h, hidden 0..n-2] are contiguous */
    float *hidden = m->cache->hbuf + s->H;
    int pre = m->tower->d.input_pre_norm;
    st = dr_backbone_prefill(m->bb.model, m->cache->bws, s->cond, rows, n_rows, hidden, pre, s->logits_c, m->pool, err);
    if (!st && s->guided && n_uncond > 0)
        st = dr_backbone_prefill(m->bb.model, m->cache->bws, s->uncond, uncond_rows, n_uncond, NULL, 0, s->logits_u,
                                 m->pool, err);
    if (st) {
        s->invalid = 1;
        goto done;
    }
    /* Tower rows: position p pairs h_p with the codes of row p+1 (tower.prefill_codes next_row) or
     * of row p (same_row). Position bb_len-1 (the previous last row) runs now that its next row is known. */
    int64_t nt = 0;
    int same = m->tower->d.prefill_same_row;
    for (int64_t p = s->bb_len > 0 ? s->bb_len - 1 : 0; p < s->bb_len + n_rows - 1; p++, nt++) {
        int64_t src = same ? p : p + 1; /* row index whose codes pair with position p */
        const int32_t *row = src < s->bb_len ? s->last_row : rows + (src - s->bb_len) * W;
        tmask[nt] = (uint8_t)is_audio(s, row);
        for (int j = 0; j < s->nc; j++) tcodes[nt * s->nc + j] = tmask[nt] ? row[1 + j] : 0;
    }
    const float *th = hidden;
    if (s->bb_len > 0) {
        dr_bk_copy(be, m->cache->hbuf, s->pend_h, (size_t)s->H * sizeof(float));
        th = m->cache->hbuf;
    }
    float *tl = NULL;
    if (s->score && nt > 0 && !(tl = dr_alloc((size_t)nt * (s->nc - 1) * s->hv * sizeof(float)))) {
        st = dr_fail(err, DRAMA_ENOMEM, "prefill: out of memory for the tower scores");
        s->invalid = 1; /* the backbone states already hold the rows */
        goto done;
    }
    if (nt > 0 && (st = dr_tower_prefill(m->tower, m->cache->tws, s->tc, (int)nt, th, tcodes, tmask, tl, m->pool, err))) {
        s->invalid = 1;
        dr_free(tl);
        goto done;
    }
    if (tl) {
        score_rows(s, tl, tcodes, tmask, nt);
        dr_free(tl);
    }
    dr_bk_copy(be, s->pend_h, hidden + (n_rows - 1) * s->H, (size_t)s->H * sizeof(float));
    /* the redraw window is empty at the start of each batch */
    dr_bk_zero(be, (char *)s->lane + offsetof(dr_gen_lane, window_len), sizeof(int32_t));
    if ((st = dr_bk_sync(be, err))) {
        s->invalid = 1;
        goto done;
    }
    memcpy(s->last_row, rows + (n_rows - 1) * W, (size_t)W * sizeof(int32_t));
    s->bb_len += n_rows;
    s->prefilled = 1;
    s->batch_frames = 0;
    s->finish = DR_FINISH_NONE;
done:
    dr_free(tcodes);
    dr_free(tmask);
    return st;
}

/* ---------------- frames ---------------- */

/* Host checks before a session joins a frame step (MODEL.md 8): 1 = it draws, 0 = it does not
 * (finish or *status set). */
static int joins_step(dr_gen_session *s, dr_gen_finish *finish, drama_status *status, drama_error *err) {
    *finish = DR_FINISH_NONE;
    if (s->invalid) {
        *status = dr_fail(err, DRAMA_EINVAL, "generation session: invalid after a cancel or failure; reset it");
        return 0;
    }
    if (!s->prefilled) {
        *status = dr_fail(err, DRAMA_EINVAL, "generation session: prefill before drawing frames");
        return 0;
    }
    if (s->finish != DR_FINISH_NONE) {
        *finish = s->finish;
        return 0;
    }
    if (atomic_load(&s->cancel)) {
        s->invalid = 1;
        *status = dr_fail(err, DRAMA_ECANCELLED, "generation cancelled after %lld frames", (long long)s->frames);
        return 0;
    }
    if (s->o.frames > 0 && s->batch_frames >= s->o.frames) {
        *finish = s->finish = DR_FINISH_FRAMES;
        return 0;
    }
    /* room for this frame's position, reserved between frames (never inside a step) */
    drama_status st = dr_bb_state_reserve(s->cond, s->cond->pos + 1, err);
    if (!st && s->uncond) st = dr_bb_state_reserve(s->uncond, s->uncond->pos + 1, err);
    if (!st) st = dr_tower_cache_reserve(s->tc, s->tc->len + 1, err);
    if (st) {
        s->invalid = 1;
        *status = st;
        return 0;
    }
    return 1;
}

/* The host's reading of one lane's step, in the order the frame is made (MODEL.md 8): the
 * semantic draw, the end token, the frame cap, the tower chain, the backbone rows. */
static drama_status lane_outcome(dr_gen_session *s, const dr_gen_step_result *r, int32_t *frame, dr_gen_finish *finish,
                                 drama_error *err) {
    s->draws++;
    const dr_op_status *d = &r->draw;
    int semantic_fault = d->code && d->fault == DR_FAULT_DRAW && (d->a == DR_DRAW_SEMANTIC || d->a == DR_DRAW_REDRAW);
    drama_status st = DRAMA_OK;
    if (semantic_fault) {
        st = dr_draw_fail(d, NULL, err);
    } else if (r->ended) {
        if (s->batch_frames == 0 && !s->o.allow_empty) {
            st = dr_fail(err, DRAMA_EEMPTY, "empty generation: the first draw was the end token");
        } else {
            *finish = s->finish = DR_FINISH_END_TOKEN;
            return DRAMA_OK;
        }
    } else if (s->batch_frames >= s->o.sp.frame_cap) {
        st = dr_fail(err, DRAMA_EFRAMELIMIT, "frame limit reached: %d frames without the end token", s->o.sp.frame_cap);
    } else if (d->code) {
        st = dr_tower_status_fail(s->m->tower, d, err);
    } else if (r->row.code) {
        st = dr_bb_status_fail(&r->row, 0, err);
    }
    if (st) {
        s->invalid = 1;
        return st;
    }
    memcpy(frame, r->codes, (size_t)s->nc * sizeof(int32_t));
    s->last_row[0] = (int32_t)(s->m->bb.semantic_start + frame[0]);
    memcpy(s->last_row + 1, frame, (size_t)s->nc * sizeof(int32_t));
    dr_bb_state_advanced(s->cond, 1);
    if (s->uncond) dr_bb_state_advanced(s->uncond, 1);
    s->tc->len++;
    s->bb_len++;
    s->frames++;
    s->batch_frames++;
    return DRAMA_OK;
}

/* The model's frame step for n lanes (made larger when needed; its records are then dropped). */
static drama_status step_for(const dr_gen_model *m, int n, dr_gen_step **out, drama_error *err) {
    dr_gen_cache *c = m->cache;
    if (!c->step || dr_gen_step_capacity(c->step) < n) {
        int cap = c->step ? 2 * dr_gen_step_capacity(c->step) : 1;
        while (cap < n) cap *= 2;
        dr_gen_step_free(c->step);
        c->step = NULL;
        drama_status st = dr_gen_step_create(m, cap, &c->step, err);
        if (st) return st;
    }
    *out = c->step;
    return DRAMA_OK;
}

drama_status dr_gen_next_many(dr_gen_session *const *ss, int n, int32_t *frames, dr_gen_finish *finish,
                              drama_status *status, drama_error *errs) {
    if (n <= 0) return DRAMA_OK;
    const dr_gen_model *m = ss[0]->m;
    dr_gen_session **lane_s = dr_calloc((size_t)n, sizeof *lane_s);
    int *owner = dr_calloc((size_t)n, sizeof(int));
    dr_gen_step_result *res = dr_calloc((size_t)n, sizeof *res);
    drama_status first = DRAMA_OK;
    if (!lane_s || !owner || !res) {
        for (int i = 0; i < n; i++) {
            status[i] = DRAMA_ENOMEM;
            if (errs) dr_fail(&errs[i], DRAMA_ENOMEM, "generation: out of memory");
        }
        first = DRAMA_ENOMEM;
        goto done;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        status[i] = DRAMA_OK;
        finish[i] = DR_FINISH_NONE;
        drama_error *e = errs ? &errs[i] : NULL;
        if (ss[i]->m != m) {
            status[i] = dr_fail(e, DRAMA_EINVAL, "generation: sessions of different models in one batch");
            continue;
        }
        if (!joins_step(ss[i], &finish[i], &status[i], e)) continue;
        owner[k] = i;
        lane_s[k++] = ss[i];
    }
    if (k > 0) {
        /* one frame step for every session that draws; a failure of the step fails all of them */
        dr_gen_step *step = NULL;
        drama_error e = {0};
        drama_status st = step_for(m, k, &step, &e);
        if (!st) st = dr_gen_step_prepare(step, lane_s, k, &e);
        if (!st) st = dr_gen_step_run(step, res, &e);
        for (int j = 0; j < k; j++) {
            int i = owner[j];
            drama_error *ei = errs ? &errs[i] : NULL;
            if (st) {
                lane_s[j]->invalid = 1;
                status[i] = st;
                if (ei) dr_fail(ei, st, "%s", e.message);
                continue;
            }
            status[i] = lane_outcome(lane_s[j], &res[j], frames + (int64_t)i * lane_s[j]->nc, &finish[i], ei);
        }
    }
    for (int i = 0; i < n; i++)
        if (status[i] && !first) first = status[i];
done:
    dr_free(lane_s);
    dr_free(owner);
    dr_free(res);
    return first;
}

drama_status dr_gen_next(dr_gen_session *s, int32_t *frame, dr_gen_finish *finish, drama_error *err) {
    drama_status st = DRAMA_OK;
    drama_error e = {0};
    dr_gen_next_many(&s, 1, frame, finish, &st, &e);
    if (st) dr_fail(err, st, "%s", e.message);
    return st;
}

drama_status dr_gen_run(dr_gen_session *s, dr_gen_frame_fn on_frame, void *ctx, dr_gen_finish *finish,
                        drama_error *err) {
    int32_t frame[DR_MAX_CODEBOOKS];
    for (;;) {
        drama_status st = dr_gen_next(s, frame, finish, err);
        if (st || *finish != DR_FINISH_NONE) return st;
        if (on_frame && on_frame(ctx, s->frames - 1, frame)) dr_gen_cancel(s);
    }
}

/* ---------------- introspection ---------------- */

void dr_gen_set_score(dr_gen_session *s, dr_gen_score *score) { s->score = score; }

int64_t dr_gen_frames(const dr_gen_session *s) { return s->frames; }
uint64_t dr_gen_draws(const dr_gen_session *s) { return s->draws; }
int64_t dr_gen_position(const dr_gen_session *s) { return s->bb_len; }
int dr_gen_guided(const dr_gen_session *s) { return s->guided; }
int dr_gen_num_codebooks(const dr_gen_session *s) { return s->nc; }
void dr_gen_set_frames(dr_gen_session *s, int frames) { s->o.frames = frames > 0 ? frames : 0; }

/* A host copy of backend memory (the copy buffers belong to the session; NULL if the read fails). */
static const float *host_copy(const dr_gen_session *s, float *dst, const float *src, size_t count) {
    return dr_bk_download(s->m->be, dst, src, count * sizeof(float), NULL) ? NULL : dst;
}

const float *dr_gen_last_logits(const dr_gen_session *s) { return host_copy(s, s->h_logits, s->logits, (size_t)s->ncand); }
const float *dr_gen_pending_hidden(const dr_gen_session *s) { return host_copy(s, s->h_pend, s->pend_h, (size_t)s->H); }
const float *dr_gen_last_head_logits(const dr_gen_session *s) {
    return host_copy(s, s->h_head, s->head_logits, (size_t)(s->nc - 1) * s->hv);
}
