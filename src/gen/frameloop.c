/* frameloop.c - generation sessions (frameloop.h). */
#include "gen/frameloop.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"

#define RAS_MAX 64 /* the largest valid ras_window */

struct dr_gen_session {
    const dr_gen_model *m;
    dr_gen_options o;
    int nc, ncand, hv;
    int64_t H;
    int guided;
    int has_ref;           /* the first prefill had a reference voice */
    int prefilled;
    int invalid;           /* cancelled or failed: reset before reuse */
    atomic_int cancel;
    void *cond, *uncond;   /* backbone states */
    dr_tower_cache *tc;
    int64_t bb_len;        /* rows in the conditional state */
    uint64_t draws;        /* semantic draws of this session */
    int64_t frames;        /* frames of this session, all batches */
    int64_t batch_frames;  /* frames since the last prefill */
    dr_gen_finish finish;
    float *pend_h;         /* [H] hidden of the last row: the tower input of the next frame */
    float *logits_c, *logits_u, *logits; /* [ncand] */
    float *head_logits;    /* [nc-1][hv] */
    int32_t *last_row;     /* [1+nc] the last row of the conditional state */
    int window[RAS_MAX];   /* semantic codes of the last frames of this batch, oldest first */
    int window_len;
    dr_sample_ws ws;
    dr_gen_score *score;   /* when set, prefills accumulate the tower's teacher-forced NLL */
};

void dr_gen_options_default(dr_gen_options *o) {
    memset(o, 0, sizeof *o);
    dr_sampler_params_default(&o->sp);
    o->cfg_mode = DR_CFG_PAIRED;
    o->has_reference = -1;
}

static void free_states(dr_gen_session *s) {
    if (s->cond) s->m->bb.state_free(s->m->bb.impl, s->cond);
    if (s->uncond) s->m->bb.state_free(s->m->bb.impl, s->uncond);
    s->cond = s->uncond = NULL;
}

drama_status dr_gen_session_create(const dr_gen_model *m, const dr_gen_options *opt, dr_gen_session **out,
                                   drama_error *err) {
    *out = NULL;
    drama_status st = dr_sampler_params_validate(&opt->sp, err);
    if (st) return st;
    if (opt->frames < 0) return dr_fail(err, DRAMA_EINVAL, "frames: must be >= 0, got %d", opt->frames);
    if (opt->cfg_mode != DR_CFG_PAIRED && opt->cfg_mode != DR_CFG_SEPARATE)
        return dr_fail(err, DRAMA_EINVAL, "cfg_mode: must be paired or separate");
    if (!m->tower || m->tower->input_dim != m->bb.hidden_dim)
        return dr_fail(err, DRAMA_EINVAL, "generation: tower input width %d differs from the backbone hidden %lld",
                       m->tower ? m->tower->input_dim : -1, (long long)m->bb.hidden_dim);
    if (m->bb.n_candidates < 2) return dr_fail(err, DRAMA_EINVAL, "generation: %d logit candidates", m->bb.n_candidates);
    dr_gen_session *s = dr_calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "generation session: out of memory");
    s->m = m;
    s->o = *opt;
    s->nc = m->tower->d.num_codebooks;
    s->hv = m->tower->d.head_vocab;
    s->ncand = m->bb.n_candidates;
    s->H = m->bb.hidden_dim;
    atomic_init(&s->cancel, 0);
    s->pend_h = dr_calloc((size_t)s->H, sizeof(float));
    s->logits_c = dr_calloc((size_t)s->ncand, sizeof(float));
    s->logits_u = dr_calloc((size_t)s->ncand, sizeof(float));
    s->logits = dr_calloc((size_t)s->ncand, sizeof(float));
    s->head_logits = dr_calloc((size_t)(s->nc - 1) * s->hv, sizeof(float));
    s->last_row = dr_calloc((size_t)s->nc + 1, sizeof(int32_t));
    int cap = s->ncand > s->hv ? s->ncand : s->hv;
    if (!s->pend_h || !s->logits_c || !s->logits_u || !s->logits || !s->head_logits || !s->last_row ||
        dr_sample_ws_init(&s->ws, cap, err)) {
        dr_gen_session_free(s);
        return dr_fail(err, DRAMA_ENOMEM, "generation session: out of memory");
    }
    if ((st = dr_tower_cache_create(m->tower, 256, &s->tc, err))) {
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
    dr_free(s->pend_h);
    dr_free(s->logits_c);
    dr_free(s->logits_u);
    dr_free(s->logits);
    dr_free(s->head_logits);
    dr_free(s->last_row);
    dr_sample_ws_free(&s->ws);
    dr_free(s);
}

drama_status dr_gen_reset(dr_gen_session *s, drama_error *err) {
    (void)err;
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
    s->window_len = 0;
    atomic_store(&s->cancel, 0);
    return DRAMA_OK;
}

drama_status dr_gen_session_clone(const dr_gen_session *src, dr_gen_session **out, drama_error *err) {
    *out = NULL;
    if (src->invalid) return dr_fail(err, DRAMA_EINVAL, "session clone: the source is invalid (cancelled or failed)");
    if (src->prefilled && !src->m->bb.state_clone)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "session clone: the backbone cannot clone states");
    dr_gen_session *s;
    drama_status st = dr_gen_session_create(src->m, &src->o, &s, err);
    if (st) return st;
    if (src->cond && (st = src->m->bb.state_clone(src->m->bb.impl, src->cond, &s->cond, err))) goto fail;
    if (src->uncond && (st = src->m->bb.state_clone(src->m->bb.impl, src->uncond, &s->uncond, err))) goto fail;
    if ((st = dr_tower_cache_copy(src->tc, s->tc, err))) goto fail;
    memcpy(s->pend_h, src->pend_h, (size_t)s->H * sizeof(float));
    memcpy(s->logits_c, src->logits_c, (size_t)s->ncand * sizeof(float));
    memcpy(s->logits_u, src->logits_u, (size_t)s->ncand * sizeof(float));
    memcpy(s->logits, src->logits, (size_t)s->ncand * sizeof(float));
    memcpy(s->head_logits, src->head_logits, (size_t)(s->nc - 1) * s->hv * sizeof(float));
    memcpy(s->last_row, src->last_row, (size_t)(s->nc + 1) * sizeof(int32_t));
    memcpy(s->window, src->window, sizeof s->window);
    s->window_len = src->window_len;
    s->guided = src->guided;
    s->has_ref = src->has_ref;
    s->prefilled = src->prefilled;
    s->bb_len = src->bb_len;
    s->draws = src->draws;
    s->frames = src->frames;
    s->batch_frames = src->batch_frames;
    s->finish = src->finish;
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

/* Backbone calls for a set of states; paired = one call, else one call per state. */
static drama_status bb_forward(const dr_gen_model *m, void *const *states, int n, const int32_t *const *rows,
                               const int64_t *n_rows, float *const *hidden, float *const *logits, int one_call,
                               drama_error *err) {
    int pre = m->tower->d.input_pre_norm;
    if (one_call) return m->bb.forward(m->bb.impl, states, n, rows, n_rows, pre, hidden, logits, err);
    for (int i = 0; i < n; i++) {
        drama_status st = m->bb.forward(m->bb.impl, states + i, 1, rows + i, n_rows + i, pre, hidden + i, logits + i, err);
        if (st) return st;
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

drama_status dr_gen_prefill(dr_gen_session *s, const int32_t *rows, int64_t n_rows, const int32_t *uncond_rows,
                            int64_t n_uncond, drama_error *err) {
    if (s->invalid) return dr_fail(err, DRAMA_EINVAL, "generation session: invalid after a cancel or failure; reset it");
    if (n_rows <= 0) return dr_fail(err, DRAMA_EEMPTY, "prefill: no rows");
    drama_status st = check_rows(s, rows, n_rows, "prefill", err);
    if (st) return st;
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
        if (!uncond_rows || n_uncond <= 0)
            return dr_fail(err, DRAMA_EINVAL, "cfg_gamma %g with a reference needs the unconditional rows",
                           (double)s->o.sp.cfg_gamma);
        if ((st = check_rows(s, uncond_rows, n_uncond, "unconditional prefill", err))) return st;
    }
    /* states are created only once the rows are known to be usable; leftovers of a first prefill
     * that failed before the backbone ran (out of memory) are empty and dropped, so a retry
     * neither leaks nor needs a reset */
    if (!s->prefilled) {
        free_states(s);
        s->has_ref = has_ref;
        s->guided = guided;
        if ((st = s->m->bb.state_create(s->m->bb.impl, &s->cond, err))) return st;
        if (s->guided && (st = s->m->bb.state_create(s->m->bb.impl, &s->uncond, err))) {
            free_states(s);
            return st;
        }
    }
    float *hidden = dr_alloc((size_t)n_rows * s->H * sizeof(float));
    float *th = dr_alloc((size_t)(n_rows + 1) * s->H * sizeof(float));
    int32_t *tcodes = dr_alloc((size_t)(n_rows + 1) * s->nc * sizeof(int32_t));
    uint8_t *tmask = dr_alloc((size_t)n_rows + 1);
    if (!hidden || !th || !tcodes || !tmask) {
        st = dr_fail(err, DRAMA_ENOMEM, "prefill: out of memory for %lld rows", (long long)n_rows);
        goto done;
    }
    void *states[2] = {s->cond, s->uncond};
    const int32_t *rs[2] = {rows, uncond_rows};
    int64_t ns[2] = {n_rows, n_uncond};
    float *hs[2] = {hidden, NULL};
    float *ls[2] = {s->logits_c, s->logits_u};
    st = bb_forward(s->m, states, s->guided ? 2 : 1, rs, ns, hs, ls, s->o.cfg_mode == DR_CFG_PAIRED, err);
    if (st) {
        s->invalid = 1;
        goto done;
    }
    /* Tower rows: position p pairs h_p with the codes of row p+1 (tower.prefill_codes next_row) or
     * of row p (same_row). Position bb_len-1 (the previous last row) runs now that its next row is known. */
    int64_t nt = 0;
    int same = s->m->tower->d.prefill_same_row;
    for (int64_t p = s->bb_len > 0 ? s->bb_len - 1 : 0; p < s->bb_len + n_rows - 1; p++, nt++) {
        const float *h = p < s->bb_len ? s->pend_h : hidden + (p - s->bb_len) * s->H;
        int64_t src = same ? p : p + 1; /* row index whose codes pair with position p */
        const int32_t *row = src < s->bb_len ? s->last_row : rows + (src - s->bb_len) * W;
        memcpy(th + nt * s->H, h, (size_t)s->H * sizeof(float));
        tmask[nt] = (uint8_t)is_audio(s, row);
        for (int j = 0; j < s->nc; j++) tcodes[nt * s->nc + j] = tmask[nt] ? row[1 + j] : 0;
    }
    float *tl = NULL;
    if (s->score && nt > 0 && !(tl = dr_alloc((size_t)nt * (s->nc - 1) * s->hv * sizeof(float)))) {
        st = dr_fail(err, DRAMA_ENOMEM, "prefill: out of memory for the tower scores");
        s->invalid = 1; /* the backbone states already hold the rows */
        goto done;
    }
    if (nt > 0 && (st = dr_tower_forward(s->m->tower, s->tc, (int)nt, th, tcodes, tmask, NULL, tl, s->m->pool, err))) {
        s->invalid = 1;
        dr_free(tl);
        goto done;
    }
    if (tl) {
        score_rows(s, tl, tcodes, tmask, nt);
        dr_free(tl);
    }
    memcpy(s->pend_h, hidden + (n_rows - 1) * s->H, (size_t)s->H * sizeof(float));
    memcpy(s->last_row, rows + (n_rows - 1) * W, (size_t)W * sizeof(int32_t));
    s->bb_len += n_rows;
    s->prefilled = 1;
    s->batch_frames = 0;
    s->window_len = 0; /* the redraw window is empty at the start of each batch */
    s->finish = DR_FINISH_NONE;
done:
    dr_free(hidden);
    dr_free(th);
    dr_free(tcodes);
    dr_free(tmask);
    return st;
}

/* The semantic draw of one session's next frame, and the stop rules (MODEL.md 8). On DRAMA_OK
 * with *finish == DR_FINISH_NONE, *code is the frame's c0 and *f its draw index. */
static drama_status draw_semantic(dr_gen_session *s, int *code, uint64_t *f, dr_gen_finish *finish, drama_error *err) {
    *finish = DR_FINISH_NONE;
    if (s->invalid) return dr_fail(err, DRAMA_EINVAL, "generation session: invalid after a cancel or failure; reset it");
    if (!s->prefilled) return dr_fail(err, DRAMA_EINVAL, "generation session: prefill before drawing frames");
    if (s->finish != DR_FINISH_NONE) {
        *finish = s->finish;
        return DRAMA_OK;
    }
    if (atomic_load(&s->cancel)) {
        s->invalid = 1;
        return dr_fail(err, DRAMA_ECANCELLED, "generation cancelled after %lld frames", (long long)s->frames);
    }
    if (s->o.frames > 0 && s->batch_frames >= s->o.frames) {
        *finish = s->finish = DR_FINISH_FRAMES;
        return DRAMA_OK;
    }
    if (s->guided) dr_guidance_combine(s->logits_c, s->logits_u, s->ncand, s->o.sp.cfg_gamma, s->logits);
    else memcpy(s->logits, s->logits_c, (size_t)s->ncand * sizeof(float));
    *f = s->o.draw_base + s->draws;
    int t;
    drama_status st = dr_sample_semantic(s->logits, s->ncand, &s->o.sp, *f, s->window, s->window_len, &s->ws, &t, err);
    s->draws++;
    if (st) goto fail;
    if (t == s->ncand - 1) {
        if (s->batch_frames == 0 && !s->o.allow_empty) {
            st = dr_fail(err, DRAMA_EEMPTY, "empty generation: the first draw was the end token");
            goto fail;
        }
        *finish = s->finish = DR_FINISH_END_TOKEN;
        return DRAMA_OK;
    }
    if (s->batch_frames >= s->o.sp.frame_cap) {
        st = dr_fail(err, DRAMA_EFRAMELIMIT, "frame limit reached: %d frames without the end token", s->o.sp.frame_cap);
        goto fail;
    }
    if (t >= s->m->tower->d.code_stride) {
        st = dr_fail(err, DRAMA_EINTERNAL, "semantic code %d beyond the code table stride %lld", t,
                     (long long)s->m->tower->d.code_stride);
        goto fail;
    }
    *code = t;
    return DRAMA_OK;
fail:
    s->invalid = 1;
    return st;
}

/* Acoustic draws of the sessions in one batched tower pass: row k is session owner[k]. */
typedef struct pick_ctx {
    dr_gen_session *const *ss;
    const int *owner;
    const uint64_t *f;
} pick_ctx;

static drama_status pick_acoustic(void *ctx, int row, int codebook, const float *logits, int n, int *code,
                                  drama_error *err) {
    pick_ctx *p = ctx;
    dr_gen_session *s = p->ss[p->owner[row]];
    return dr_sample_acoustic(logits, n, &s->o.sp, p->f[row], codebook, &s->ws, code, err);
}

/* Semantic draws, then one tower pass for every session that makes a frame. */
static void make_frames(dr_gen_session *const *ss, int n, int32_t *frames, dr_gen_finish *finish,
                        drama_status *status, drama_error *errs) {
    const dr_gen_model *m = ss[0]->m;
    int nc = ss[0]->nc, hv = ss[0]->hv;
    int64_t H = ss[0]->H;
    int *owner = dr_calloc((size_t)n, sizeof(int));
    uint64_t *fs = dr_calloc((size_t)n, sizeof(uint64_t));
    int32_t *c0 = dr_calloc((size_t)n, sizeof(int32_t)), *codes = dr_calloc((size_t)n * nc, sizeof(int32_t));
    dr_tower_cache **tcs = dr_calloc((size_t)n, sizeof *tcs);
    float *h = dr_alloc((size_t)n * H * sizeof(float));
    float *heads = dr_alloc((size_t)n * (nc - 1) * hv * sizeof(float));
    drama_status *rst = dr_calloc((size_t)n, sizeof(drama_status));
    drama_error *rerr = dr_calloc((size_t)n, sizeof(drama_error));
    int ok = owner && fs && c0 && codes && tcs && h && heads && rst && rerr;
    int k = 0;
    for (int i = 0; i < n; i++) {
        drama_error *e = errs ? &errs[i] : NULL;
        if (status[i]) continue; /* already failed (wrong model) */
        if (!ok) {
            status[i] = dr_fail(e, DRAMA_ENOMEM, "generation: out of memory");
            continue;
        }
        int t = 0;
        status[i] = draw_semantic(ss[i], &t, &fs[k], &finish[i], e);
        if (status[i] || finish[i] != DR_FINISH_NONE) continue;
        owner[k] = i;
        c0[k] = t;
        tcs[k] = ss[i]->tc;
        memcpy(h + (int64_t)k * H, ss[i]->pend_h, (size_t)H * sizeof(float));
        k++;
    }
    if (k > 0) {
        pick_ctx pc = {ss, owner, fs};
        drama_error e = {0};
        drama_status st =
            dr_tower_generate_many(m->tower, tcs, k, h, c0, pick_acoustic, &pc, codes, heads, rst, rerr, m->pool, &e);
        for (int r = 0; r < k; r++) {
            int i = owner[r];
            dr_gen_session *s = ss[i];
            drama_status rs = st ? st : rst[r];
            if (rs) {
                status[i] = rs;
                if (errs) dr_fail(&errs[i], rs, "%s", st ? e.message : rerr[r].message);
                s->invalid = 1;
                continue;
            }
            memcpy(frames + (int64_t)i * nc, codes + (int64_t)r * nc, (size_t)nc * sizeof(int32_t));
            memcpy(s->head_logits, heads + (int64_t)r * (nc - 1) * hv, (size_t)(nc - 1) * hv * sizeof(float));
            if (s->window_len == RAS_MAX) {
                memmove(s->window, s->window + 1, (RAS_MAX - 1) * sizeof(int));
                s->window_len--;
            }
            s->window[s->window_len++] = c0[r];
        }
    }
    dr_free(owner); dr_free(fs); dr_free(c0); dr_free(codes); dr_free(tcs); dr_free(h); dr_free(heads);
    dr_free(rst); dr_free(rerr);
}

drama_status dr_gen_next_many(dr_gen_session *const *ss, int n, int32_t *frames, dr_gen_finish *finish,
                              drama_status *status, drama_error *errs) {
    if (n <= 0) return DRAMA_OK;
    const dr_gen_model *m = ss[0]->m;
    int W = ss[0]->nc + 1;
    /* state lists: call 1 = every conditional state + paired unconditional ones, call 2 = the rest */
    void **st1 = dr_calloc((size_t)2 * n, sizeof(void *)), **st2 = dr_calloc((size_t)n, sizeof(void *));
    const int32_t **r1 = dr_calloc((size_t)2 * n, sizeof(int32_t *)), **r2 = dr_calloc((size_t)n, sizeof(int32_t *));
    float **h1 = dr_calloc((size_t)2 * n, sizeof(float *)), **l1 = dr_calloc((size_t)2 * n, sizeof(float *));
    float **l2 = dr_calloc((size_t)n, sizeof(float *)), **h2 = dr_calloc((size_t)n, sizeof(float *));
    int64_t *ones = dr_calloc((size_t)2 * n, sizeof(int64_t));
    int32_t *rowbuf = dr_calloc((size_t)n * W, sizeof(int32_t));
    int *owner1 = dr_calloc((size_t)2 * n, sizeof(int)), *owner2 = dr_calloc((size_t)n, sizeof(int));
    drama_status first = DRAMA_OK;
    if (!st1 || !st2 || !r1 || !r2 || !h1 || !l1 || !l2 || !h2 || !ones || !rowbuf || !owner1 || !owner2) {
        first = DRAMA_ENOMEM;
        for (int i = 0; i < n; i++) {
            status[i] = DRAMA_ENOMEM;
            if (errs) dr_fail(&errs[i], DRAMA_ENOMEM, "generation: out of memory");
        }
        goto done;
    }
    int n1 = 0, n2 = 0;
    for (int i = 0; i < n; i++) {
        status[i] = DRAMA_OK;
        finish[i] = DR_FINISH_NONE;
        if (ss[i]->m != m)
            status[i] = dr_fail(errs ? &errs[i] : NULL, DRAMA_EINVAL, "generation: sessions of different models in one batch");
    }
    make_frames(ss, n, frames, finish, status, errs);
    for (int i = 0; i < n; i++) {
        dr_gen_session *s = ss[i];
        if (status[i] || finish[i] != DR_FINISH_NONE) continue;
        int32_t *fr = frames + (int64_t)i * s->nc;
        int32_t *row = rowbuf + (int64_t)i * W;
        row[0] = (int32_t)(m->bb.semantic_start + fr[0]);
        for (int j = 0; j < s->nc; j++) row[1 + j] = fr[j];
        st1[n1] = s->cond; r1[n1] = row; h1[n1] = s->pend_h; l1[n1] = s->logits_c; owner1[n1++] = i;
        if (s->guided && s->o.cfg_mode == DR_CFG_PAIRED) {
            st1[n1] = s->uncond; r1[n1] = row; h1[n1] = NULL; l1[n1] = s->logits_u; owner1[n1++] = i;
        } else if (s->guided) {
            st2[n2] = s->uncond; r2[n2] = row; h2[n2] = NULL; l2[n2] = s->logits_u; owner2[n2++] = i;
        }
    }
    for (int k = 0; k < 2 * n; k++) ones[k] = 1;
    /* one batched backbone step appends every frame (and the separate-mode unconditional states
     * in a second call); a failure there invalidates the sessions of that call */
    for (int call = 0; call < 2; call++) {
        int cnt = call ? n2 : n1;
        if (!cnt) continue;
        drama_error e = {0};
        drama_status st = m->bb.forward(m->bb.impl, call ? st2 : st1, cnt, call ? r2 : r1, ones,
                                        m->tower->d.input_pre_norm, call ? h2 : h1, call ? l2 : l1, &e);
        if (!st) continue;
        for (int k = 0; k < cnt; k++) {
            int i = call ? owner2[k] : owner1[k];
            if (status[i]) continue;
            ss[i]->invalid = 1;
            status[i] = st;
            if (errs) dr_fail(&errs[i], st, "%s", e.message);
        }
    }
    for (int i = 0; i < n; i++) {
        dr_gen_session *s = ss[i];
        if (status[i] || finish[i] != DR_FINISH_NONE) continue;
        memcpy(s->last_row, rowbuf + (int64_t)i * W, (size_t)W * sizeof(int32_t));
        s->bb_len++;
        s->frames++;
        s->batch_frames++;
    }
    for (int i = 0; i < n; i++)
        if (status[i] && !first) first = status[i];
done:
    dr_free(st1); dr_free(st2); dr_free(r1); dr_free(r2); dr_free(h1); dr_free(l1); dr_free(l2); dr_free(h2);
    dr_free(ones); dr_free(rowbuf); dr_free(owner1); dr_free(owner2);
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
    int32_t frame[64];
    if (s->nc > 64) return dr_fail(err, DRAMA_EUNSUPPORTED, "generation: %d codebooks", s->nc);
    for (;;) {
        drama_status st = dr_gen_next(s, frame, finish, err);
        if (st || *finish != DR_FINISH_NONE) return st;
        if (on_frame && on_frame(ctx, s->frames - 1, frame)) dr_gen_cancel(s);
    }
}

void dr_gen_set_score(dr_gen_session *s, dr_gen_score *score) { s->score = score; }

int64_t dr_gen_frames(const dr_gen_session *s) { return s->frames; }
uint64_t dr_gen_draws(const dr_gen_session *s) { return s->draws; }
int64_t dr_gen_position(const dr_gen_session *s) { return s->bb_len; }
int dr_gen_guided(const dr_gen_session *s) { return s->guided; }
int dr_gen_num_codebooks(const dr_gen_session *s) { return s->nc; }
const float *dr_gen_last_logits(const dr_gen_session *s) { return s->logits; }
const float *dr_gen_pending_hidden(const dr_gen_session *s) { return s->pend_h; }
void dr_gen_set_frames(dr_gen_session *s, int frames) { s->o.frames = frames > 0 ? frames : 0; }
const float *dr_gen_last_head_logits(const dr_gen_session *s) { return s->head_logits; }
