/* framestep.c - the frame step (framestep.h). */
#include "gen/framestep.h"

#include <stdlib.h>
#include <string.h>

#include "gen/frameloop_internal.h"

/* Byte offsets of the arrays inside one backend block (and its host twin). */
typedef struct layout {
    size_t size;
} layout;

static size_t place(layout *l, size_t bytes) {
    size_t off = (l->size + 63) & ~(size_t)63;
    l->size = off + bytes;
    return off;
}

/* The step's tables: built on the host, uploaded when they change; read by the ops. */
typedef struct tables {
    size_t lanes, tseq, hsrc, headdst, seq1, lane1, hdst1, ldst1, seq2, lane2, ldst2;
} tables;

/* What a step writes for the host: one download after the step. */
typedef struct results {
    size_t codes, ended, status, rs1, rs2;
} results;

struct dr_gen_step {
    const dr_gen_model *m;
    dr_backend *be;
    int cap;
    dr_bb_ws *bws;             /* [2 cap] rows */
    dr_tower_ws *tws;          /* [cap] rows */
    tables t;
    layout tl;
    char *tab, *tab_host, *tab_last; /* backend block, host twin being built, the twin last uploaded */
    int have_last;
    results r;
    layout rl;
    char *res, *res_host;
    /* the prepared step */
    int n, n1, n2;
};

#define AT(base, off, type) ((type)((base) + (off)))

drama_status dr_gen_step_create(const dr_gen_model *m, int lanes, dr_gen_step **out, drama_error *err) {
    *out = NULL;
    dr_gen_step *st = calloc(1, sizeof *st);
    if (!st) return dr_fail(err, DRAMA_ENOMEM, "frame step: out of memory");
    st->m = m;
    st->be = m->be;
    st->cap = lanes > 0 ? lanes : 1;
    size_t c = (size_t)st->cap;
    tables *t = &st->t;
    layout *tl = &st->tl;
    t->lanes = place(tl, c * sizeof(dr_step_lane));
    t->tseq = place(tl, c * sizeof(dr_seq_row));
    t->hsrc = place(tl, c * sizeof(float *));
    t->headdst = place(tl, c * sizeof(float *));
    t->seq1 = place(tl, 2 * c * sizeof(dr_seq_row));
    t->lane1 = place(tl, 2 * c * sizeof(int32_t));
    t->hdst1 = place(tl, 2 * c * sizeof(float *));
    t->ldst1 = place(tl, 2 * c * sizeof(float *));
    t->seq2 = place(tl, c * sizeof(dr_seq_row));
    t->lane2 = place(tl, c * sizeof(int32_t));
    t->ldst2 = place(tl, c * sizeof(float *));
    results *r = &st->r;
    layout *rl = &st->rl;
    r->codes = place(rl, c * DR_MAX_CODEBOOKS * sizeof(int32_t));
    r->ended = place(rl, c * sizeof(int32_t));
    r->status = place(rl, c * sizeof(dr_op_status));
    r->rs1 = place(rl, 2 * c * sizeof(dr_op_status));
    r->rs2 = place(rl, c * sizeof(dr_op_status));
    drama_status s = dr_bk_alloc(st->be, tl->size, (void **)&st->tab, err);
    if (!s) s = dr_bk_alloc(st->be, rl->size, (void **)&st->res, err);
    st->tab_host = calloc(1, tl->size);
    st->tab_last = calloc(1, tl->size);
    st->res_host = calloc(1, rl->size);
    if (!s && (!st->tab_host || !st->tab_last || !st->res_host)) s = dr_fail(err, DRAMA_ENOMEM, "frame step: out of memory");
    if (!s) s = dr_bb_ws_create(st->be, m->bb.model, 2 * (int64_t)st->cap, &st->bws, err);
    if (!s) s = dr_tower_ws_create(st->be, m->tower, st->cap, &st->tws, err);
    if (s) {
        dr_gen_step_free(st);
        return s;
    }
    *out = st;
    return DRAMA_OK;
}

void dr_gen_step_free(dr_gen_step *st) {
    if (!st) return;
    st->be->ops->forget_region(st->be, st);
    dr_bb_ws_free(st->bws);
    dr_tower_ws_free(st->tws);
    dr_bk_free(st->be, st->tab);
    dr_bk_free(st->be, st->res);
    free(st->tab_host);
    free(st->tab_last);
    free(st->res_host);
    free(st);
}

int dr_gen_step_capacity(const dr_gen_step *st) { return st->cap; }

drama_status dr_gen_step_prepare(dr_gen_step *st, dr_gen_session *const *ss, int n, drama_error *err) {
    if (n < 1 || n > st->cap) return dr_fail(err, DRAMA_EINTERNAL, "frame step: %d lanes for %d", n, st->cap);
    const tables *t = &st->t;
    char *h = st->tab_host;
    memset(h, 0, st->tl.size);
    int32_t *ended = AT(st->res, st->r.ended, int32_t *); /* backend addresses: stored, never read */
    int n1 = 0, n2 = 0;
    for (int k = 0; k < n; k++) {
        dr_gen_session *s = ss[k];
        const int32_t *hold = ended + k;
        AT(h, t->lanes, dr_step_lane *)[k] =
            (dr_step_lane){s->lane, s->logits_c, s->logits_u, s->logits, s->pend_h, s->head_logits, s->guided, 0};
        AT(h, t->tseq, dr_seq_row *)[k] = (dr_seq_row){s->tc->seq, 0, hold};
        AT(h, t->hsrc, float **)[k] = s->pend_h;
        AT(h, t->headdst, float **)[k] = s->head_logits;
        AT(h, t->seq1, dr_seq_row *)[n1] = (dr_seq_row){s->cond->seq, 0, hold};
        AT(h, t->lane1, int32_t *)[n1] = k;
        AT(h, t->hdst1, float **)[n1] = s->pend_h;
        AT(h, t->ldst1, float **)[n1++] = s->logits_c;
        if (s->guided && s->o.cfg_mode == DR_CFG_PAIRED) {
            AT(h, t->seq1, dr_seq_row *)[n1] = (dr_seq_row){s->uncond->seq, 0, hold};
            AT(h, t->lane1, int32_t *)[n1] = k;
            AT(h, t->ldst1, float **)[n1++] = s->logits_u;
        } else if (s->guided) {
            AT(h, t->seq2, dr_seq_row *)[n2] = (dr_seq_row){s->uncond->seq, 0, hold};
            AT(h, t->lane2, int32_t *)[n2] = k;
            AT(h, t->ldst2, float **)[n2++] = s->logits_u;
        }
    }
    st->n = n;
    st->n1 = n1;
    st->n2 = n2;
    if (st->have_last && !memcmp(h, st->tab_last, st->tl.size)) return DRAMA_OK;
    drama_status s = dr_bk_upload(st->be, st->tab, h, st->tl.size, err);
    if (s) {
        st->have_last = 0;
        return s;
    }
    memcpy(st->tab_last, h, st->tl.size);
    st->have_last = 1;
    return DRAMA_OK;
}

/* After head `slot`: codebook slot+1 of every lane, and the head logits kept per lane. */
static void pick(void *ctx, int slot, const float *logits) {
    dr_gen_step *st = ctx;
    dr_backend *be = st->be;
    int hv = st->m->tower->d.head_vocab;
    dr_step_io io = {AT(st->res, st->r.codes, int32_t *), AT(st->res, st->r.ended, int32_t *),
                     AT(st->res, st->r.status, dr_op_status *)};
    be->ops->sample_acoustic(be, AT(st->tab, st->t.lanes, const dr_step_lane *), st->n, slot + 1, logits, hv, io);
    be->ops->scatter_rows(be, logits, hv, st->n, AT(st->tab, st->t.headdst, float *const *), (int64_t)slot * hv,
                          AT(st->tab, st->t.tseq, const dr_seq_row *));
}

/* The frame's row appended to m rows of states (one backbone call), outputs scattered to the lanes. */
static void append_rows(dr_gen_step *st, int m, size_t seq_off, size_t lane_off, size_t hdst_off, size_t ldst_off,
                        size_t rs_off) {
    const dr_gen_model *gm = st->m;
    dr_backend *be = st->be;
    dr_bb_ws *w = st->bws;
    int nc = gm->tower->d.num_codebooks;
    const dr_seq_row *seq = AT(st->tab, seq_off, const dr_seq_row *);
    be->ops->frame_rows(be, AT(st->res, st->r.codes, const int32_t *), AT(st->tab, lane_off, const int32_t *), m, nc,
                        gm->bb.semantic_start, w->tok);
    int pre = gm->tower->d.input_pre_norm;
    dr_bb_call c = {m, w->tok, seq, pre ? NULL : w->hidden, pre ? w->hidden : NULL, w->logits,
                    AT(st->res, rs_off, dr_op_status *), NULL, 0, 0};
    dr_bb_run(be, gm->bb.model, w, &c, NULL); /* fails only for traces (none here) */
    if (hdst_off) be->ops->scatter_rows(be, w->hidden, gm->bb.hidden_dim, m, AT(st->tab, hdst_off, float *const *), 0, seq);
    be->ops->scatter_rows(be, w->logits, gm->bb.n_candidates, m, AT(st->tab, ldst_off, float *const *), 0, seq);
    be->ops->advance(be, seq, m);
}

/* On a backend whose memory the host reads (CPU) the rest of a step is skipped when every lane
 * ended or failed: its results would be ignored. Other backends run it with the lanes held. */
static int nothing_left(const dr_backend *be, dr_step_io io, int n) {
    if (!be->host_memory) return 0;
    for (int k = 0; k < n; k++)
        if (!io.ended[k] && !io.status[k].code) return 0;
    return 1;
}

void dr_gen_frame_step(dr_gen_step *st) {
    const dr_gen_model *m = st->m;
    dr_backend *be = st->be;
    int n = st->n, ncand = m->bb.n_candidates;
    const dr_step_lane *lanes = AT(st->tab, st->t.lanes, const dr_step_lane *);
    dr_step_io io = {AT(st->res, st->r.codes, int32_t *), AT(st->res, st->r.ended, int32_t *),
                     AT(st->res, st->r.status, dr_op_status *)};
    dr_bk_zero(be, st->res, st->rl.size);
    be->ops->guidance(be, lanes, n, ncand);
    be->ops->sample_semantic(be, lanes, n, ncand, io);
    if (nothing_left(be, io, n)) return;
    dr_tower_ws *tw = st->tws;
    be->ops->gather_rows(be, tw->h, m->bb.hidden_dim, n, AT(st->tab, st->t.hsrc, const float *const *));
    be->ops->check_finite(be, tw->h, m->bb.hidden_dim, n, io.status);
    if (nothing_left(be, io, n)) return;
    dr_tower_chain(be, m->tower, tw, AT(st->tab, st->t.tseq, const dr_seq_row *), n, tw->h, io.codes, DR_MAX_CODEBOOKS,
                   io.status, pick, st);
    append_rows(st, st->n1, st->t.seq1, st->t.lane1, st->t.hdst1, st->t.ldst1, st->r.rs1);
    if (st->n2) append_rows(st, st->n2, st->t.seq2, st->t.lane2, 0, st->t.ldst2, st->r.rs2);
}

static void step_fn(void *ctx) { dr_gen_frame_step(ctx); }

drama_status dr_gen_step_run(dr_gen_step *st, dr_gen_step_result *res, drama_error *err) {
    dr_backend *be = st->be;
    uint64_t key = (uint64_t)st->n | (uint64_t)st->n1 << 20 | (uint64_t)st->n2 << 40;
    drama_status s = be->ops->run_region(be, st, key, step_fn, st, err);
    if (!s) s = dr_bk_download(be, st->res_host, st->res, st->rl.size, err);
    if (s) return s;
    const char *h = st->res_host;
    const int32_t *codes = AT(h, st->r.codes, const int32_t *), *ended = AT(h, st->r.ended, const int32_t *);
    const dr_op_status *status = AT(h, st->r.status, const dr_op_status *);
    const dr_op_status *rs1 = AT(h, st->r.rs1, const dr_op_status *), *rs2 = AT(h, st->r.rs2, const dr_op_status *);
    const int32_t *lane1 = AT(st->tab_last, st->t.lane1, const int32_t *);
    const int32_t *lane2 = AT(st->tab_last, st->t.lane2, const int32_t *);
    for (int k = 0; k < st->n; k++) {
        memset(&res[k], 0, sizeof res[k]);
        memcpy(res[k].codes, codes + (int64_t)k * DR_MAX_CODEBOOKS, sizeof res[k].codes);
        res[k].ended = ended[k] != 0;
        res[k].draw = status[k];
    }
    for (int r = 0; r < st->n1; r++)
        if (rs1[r].code && !res[lane1[r]].row.code) res[lane1[r]].row = rs1[r];
    for (int r = 0; r < st->n2; r++)
        if (rs2[r].code && !res[lane2[r]].row.code) res[lane2[r]].row = rs2[r];
    return DRAMA_OK;
}
