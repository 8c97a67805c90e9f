/* upload.c - see upload.h. */
#include "model/upload.h"

#include <string.h>

static drama_status visit_w(const dr_model_visitor *v, const dr_weight *w, const char *part, drama_error *err) {
    if (!v->weight || w->rows <= 0) return DRAMA_OK; /* an absent optional weight (no code table) */
    return v->weight(v->ctx, w, part, err);
}

static drama_status visit_v(const dr_model_visitor *v, const float *x, int64_t n, const char *part, drama_error *err) {
    if (!v->vec || !x || n <= 0) return DRAMA_OK;
    return v->vec(v->ctx, x, n, part, err);
}

#define TRY(x)                                                                                                        \
    do {                                                                                                              \
        drama_status s_ = (x);                                                                                        \
        if (s_) return s_;                                                                                            \
    } while (0)

static drama_status visit_backbone(const dr_backbone *bb, const dr_model_visitor *v, drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int64_t C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv;
    TRY(visit_w(v, &bb->embed, "dense", err));
    TRY(visit_w(v, &bb->code_table, "dense", err));
    TRY(visit_w(v, &bb->head, "dense", err));
    TRY(visit_v(v, bb->final_norm, d->H, "dense", err));
    TRY(visit_v(v, bb->rope_inv_freq, d->rope_dims / 2, "dense", err));
    for (int L = 0; L < d->n_layers; L++) {
        const dr_bb_layer *ly = &bb->layers[L];
        TRY(visit_v(v, ly->in_norm, d->H, "dense", err));
        TRY(visit_v(v, ly->post_norm, d->H, "dense", err));
        if (ly->kind == DR_LAYER_FULL) {
            const dr_bb_attn *a = &ly->attn;
            TRY(visit_w(v, &a->q, "dense", err));
            TRY(visit_w(v, &a->k, "dense", err));
            TRY(visit_w(v, &a->v, "dense", err));
            TRY(visit_w(v, &a->o, "dense", err));
            TRY(visit_v(v, a->q_norm, d->hd, "dense", err));
            TRY(visit_v(v, a->k_norm, d->hd, "dense", err));
        } else {
            const dr_bb_gdn *g = &ly->gdn;
            TRY(visit_w(v, &g->qkv, "dense", err));
            TRY(visit_w(v, &g->z, "dense", err));
            TRY(visit_w(v, &g->b, "dense", err));
            TRY(visit_w(v, &g->a, "dense", err));
            TRY(visit_w(v, &g->out, "dense", err));
            TRY(visit_v(v, g->conv_w, C * d->K, "dense", err));
            TRY(visit_v(v, g->conv_b, C, "dense", err));
            TRY(visit_v(v, g->neg_A, d->nv, "dense", err));
            TRY(visit_v(v, g->dt_bias, d->nv, "dense", err));
            TRY(visit_v(v, g->norm, (int64_t)(g->norm_per_channel ? d->nv : 1) * d->dv, "dense", err));
        }
        const dr_bb_moe *m = &ly->moe;
        TRY(visit_w(v, &m->router, "dense", err));
        TRY(visit_w(v, &m->sh_gate, "dense", err));
        TRY(visit_w(v, &m->sh_up, "dense", err));
        TRY(visit_w(v, &m->sh_down, "dense", err));
        TRY(visit_w(v, &m->sh_gate_proj, "dense", err));
        for (int k = 0; k < m->n_kept; k++) {
            const dr_bb_expert *x = &m->experts[k];
            if (x->fused) TRY(visit_w(v, &x->gate_up, "experts", err));
            else {
                TRY(visit_w(v, &x->gate, "experts", err));
                TRY(visit_w(v, &x->up, "experts", err));
            }
            TRY(visit_w(v, &x->down, "experts", err));
        }
    }
    return DRAMA_OK;
}

static drama_status visit_tower(const dr_tower *t, const dr_model_visitor *v, drama_error *err) {
    const dr_tower_dims *d = &t->d;
    for (int l = 0; l < t->n_layers; l++) {
        const dr_tower_layer *L = &t->layers[l];
        TRY(visit_v(v, L->enorm, L->de, "tower", err));
        TRY(visit_v(v, L->hnorm, L->dh, "tower", err));
        TRY(visit_v(v, L->attention_norm, d->dim, "tower", err));
        TRY(visit_v(v, L->ffn_norm, d->dim, "tower", err));
        TRY(visit_v(v, L->out_norm, d->dim, "tower", err));
        TRY(visit_v(v, L->q_norm, d->head_dim, "tower", err));
        TRY(visit_v(v, L->k_norm, d->head_dim, "tower", err));
        TRY(visit_w(v, &L->eh_proj, "tower", err));
        TRY(visit_w(v, &L->wqkv, "tower", err));
        TRY(visit_w(v, &L->wo, "tower", err));
        TRY(visit_w(v, &L->w1, "tower", err));
        TRY(visit_w(v, &L->w2, "tower", err));
        TRY(visit_w(v, &L->w3, "tower", err));
    }
    TRY(visit_w(v, &t->code_table, "tower", err));
    for (int j = 0; j < t->n_heads_out; j++) TRY(visit_w(v, &t->heads[j], "tower", err));
    TRY(visit_v(v, t->rope_freq, d->rope_dims / 2, "tower", err));
    return DRAMA_OK;
}

drama_status dr_model_visit(const dr_backbone *bb, const dr_tower *t, const dr_model_visitor *v, drama_error *err) {
    if (bb) TRY(visit_backbone(bb, v, err));
    if (t) TRY(visit_tower(t, v, err));
    return DRAMA_OK;
}

typedef struct plan_ctx {
    dr_backend *be;
    dr_upload_plan *p;
} plan_ctx;

static drama_status plan_weight(void *ctx, const dr_weight *w, const char *part, drama_error *err) {
    (void)err;
    plan_ctx *c = ctx;
    size_t b = c->be->ops->weight_bytes(c->be, w);
    if (!strcmp(part, "experts")) c->p->experts += b;
    else if (!strcmp(part, "tower")) c->p->tower += b;
    else c->p->dense += b;
    c->p->n_weights++;
    return DRAMA_OK;
}

static drama_status plan_vec(void *ctx, const float *x, int64_t n, const char *part, drama_error *err) {
    (void)x;
    (void)part;
    (void)err;
    plan_ctx *c = ctx;
    c->p->vectors += (size_t)n * sizeof(float);
    c->p->n_vectors++;
    return DRAMA_OK;
}

drama_status dr_model_plan(dr_backend *be, const dr_backbone *bb, const dr_tower *t, dr_upload_plan *plan,
                           drama_error *err) {
    memset(plan, 0, sizeof *plan);
    plan_ctx c = {be, plan};
    dr_model_visitor v = {&c, plan_weight, plan_vec};
    return dr_model_visit(bb, t, &v, err);
}

static drama_status put_weight(void *ctx, const dr_weight *w, const char *part, drama_error *err) {
    (void)part;
    dr_backend *be = ctx;
    return be->ops->upload_weight(be, w, err);
}

static drama_status put_vec(void *ctx, const float *x, int64_t n, const char *part, drama_error *err) {
    (void)part;
    dr_backend *be = ctx;
    return be->ops->upload_vec(be, x, n, err);
}

drama_status dr_model_upload(dr_backend *be, const dr_backbone *bb, const dr_tower *t, drama_error *err) {
    dr_upload_plan plan;
    TRY(dr_model_plan(be, bb, t, &plan, err));
    TRY(be->ops->plan(be, &plan, err));
    dr_model_visitor v = {be, put_weight, put_vec};
    return dr_model_visit(bb, t, &v, err);
}
