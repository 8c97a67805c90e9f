/* session.c - opening the language model for generation, and the CPU backbone adapter. */
#include "gen/session.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "io/manifest.h"
#include "model/state.h"
#include "text/prompt.h"

/* ---------------- backbone adapter ---------------- */

static drama_status cpu_state_create(void *impl, void **state, drama_error *err) {
    dr_gen_cpu_backbone *c = impl;
    dr_bb_state *s = NULL;
    drama_status st = dr_bb_state_create(c->bb, 256, &s, err);
    *state = s;
    return st;
}

static drama_status cpu_state_clone(void *impl, const void *src, void **dst, drama_error *err) {
    (void)impl;
    dr_bb_state *s = NULL;
    drama_status st = dr_bb_state_clone(src, &s, err);
    *dst = s;
    return st;
}

static void cpu_state_free(void *impl, void *state) {
    (void)impl;
    dr_bb_state_free(state);
}

/* Outputs of one backbone call: hidden [rows][H] and logits [rows][n_logits]. Allocated per call
 * (small next to the work) so the adapter holds no mutable state. */
static drama_status alloc_out(const dr_backbone *bb, int64_t rows, float **h, float **l, drama_error *err) {
    *h = dr_alloc((size_t)rows * bb->d.H * sizeof(float));
    *l = dr_alloc((size_t)rows * dr_backbone_n_logits(bb) * sizeof(float));
    if (*h && *l) return DRAMA_OK;
    dr_free(*h);
    dr_free(*l);
    *h = *l = NULL;
    return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory for %lld rows", (long long)rows);
}

static drama_status cpu_forward(void *impl, void *const *states, int n_states, const int32_t *const *rows,
                                const int64_t *n_rows, int pre_norm, float *const *hidden, float *const *logits,
                                drama_error *err) {
    dr_gen_cpu_backbone *c = impl;
    int64_t H = c->bb->d.H, nl = dr_backbone_n_logits(c->bb);
    int W = dr_backbone_row_width(c->bb);
    float *oh, *ol;
    drama_status st;
    int all_single = 1;
    for (int i = 0; i < n_states; i++) all_single &= n_rows[i] == 1;
    if (n_states > 1 && all_single && !pre_norm) {
        /* one row per state: the batched decode step */
        if ((st = alloc_out(c->bb, n_states, &oh, &ol, err))) return st;
        int32_t *rowbuf = dr_alloc((size_t)n_states * W * sizeof(int32_t));
        if (!rowbuf) st = dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
        for (int i = 0; !st && i < n_states; i++) memcpy(rowbuf + (int64_t)i * W, rows[i], (size_t)W * sizeof(int32_t));
        if (!st) st = dr_backbone_step_batch(c->bb, (dr_bb_state *const *)states, n_states, rowbuf, oh, ol, c->pool, err);
        for (int i = 0; !st && i < n_states; i++) {
            if (hidden[i]) memcpy(hidden[i], oh + i * H, (size_t)H * sizeof(float));
            if (logits[i]) memcpy(logits[i], ol + i * nl, (size_t)nl * sizeof(float));
        }
        dr_free(rowbuf);
        dr_free(oh);
        dr_free(ol);
        return st;
    }
    for (int i = 0; i < n_states; i++) {
        int64_t n = n_rows[i];
        if ((st = alloc_out(c->bb, n, &oh, &ol, err))) return st;
        float *pre = NULL;
        if (pre_norm && !(pre = dr_alloc((size_t)n * H * sizeof(float)))) st = dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
        dr_bb_trace tr = {0};
        tr.pre_norm = pre;
        if (!st) st = dr_backbone_forward(c->bb, states[i], rows[i], n, oh, ol, pre ? &tr : NULL, c->pool, err);
        if (!st && hidden[i]) memcpy(hidden[i], pre ? pre : oh, (size_t)n * H * sizeof(float));
        if (!st && logits[i]) memcpy(logits[i], ol + (n - 1) * nl, (size_t)nl * sizeof(float));
        dr_free(pre);
        dr_free(oh);
        dr_free(ol);
        if (st) return st;
    }
    return DRAMA_OK;
}

void dr_gen_backbone_cpu(dr_gen_cpu_backbone *impl, const dr_backbone *bb, dr_pool *pool, dr_gen_backbone *out) {
    impl->bb = bb;
    impl->pool = pool;
    memset(out, 0, sizeof *out);
    out->impl = impl;
    out->hidden_dim = bb->d.H;
    out->n_candidates = (int)dr_backbone_n_logits(bb);
    out->semantic_start = bb->sem_start;
    out->state_create = cpu_state_create;
    out->state_free = cpu_state_free;
    out->forward = cpu_forward;
    out->state_clone = cpu_state_clone;
}

void dr_gen_backbone_cpu_release(dr_gen_cpu_backbone *impl) {
    (void)impl; /* nothing held: kept so callers need not change if that changes */
}

/* ---------------- opening a model directory ---------------- */

drama_status dr_gen_lm_open(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                            dr_gen_lm **out, drama_error *err) {
    *out = NULL;
    dr_gen_lm *lm = dr_calloc(1, sizeof *lm);
    if (!lm) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    /* FORMATS.md 7: a drama-manifest.json next to the weights is verified before anything is parsed */
    dr_manifest *manifest = NULL;
    drama_status st = dr_manifest_verify_dir(dir, 0, &manifest, err);
    dr_manifest_free(manifest);
    if (!st) st = dr_config_load(dir, sets, n_sets, &lm->cfg, err);
    char path[4096];
    if (!st) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        st = dr_tok_load(path, &lm->tok, err);
    }
    if (!st) st = dr_ckpt_open(dir, &lm->ckpt, err);
    if (!st) st = dr_loader_create(lm->ckpt, lm->cfg, &lm->ld, err);
    if (st) goto fail;
    if (pool) {
        lm->pool = pool;
    } else {
        lm->pool = dr_pool_create(threads);
        lm->own_pool = 1;
        if (!lm->pool) {
            st = dr_fail(err, DRAMA_ENOMEM, "cannot start %d threads", threads);
            goto fail;
        }
    }
    /* token ids from the tokenizer (MODEL.md 3.4) */
    dr_prompt_ids ids;
    if ((st = dr_prompt_resolve_ids(lm->tok, &ids, err))) goto fail;
    lm->semantic_start = ids.semantic_start;
    lm->n_semantic = ids.n_semantic;
    lm->end_id = dr_tok_id(lm->tok, lm->cfg->sw.end_token);
    if (lm->end_id < 0) {
        st = dr_fail(err, DRAMA_EFORMAT, "tokenizer: end token \"%s\" (switch end_token) is missing", lm->cfg->sw.end_token);
        goto fail;
    }
    if ((st = dr_backbone_bind(&lm->bb, lm->ld, err))) goto fail;
    dr_tower_dims td;
    if ((st = dr_tower_dims_from_config(lm->cfg, &td, err))) goto fail;
    /* tower problems join the backbone's findings: one report names everything */
    drama_error terr = {0};
    drama_status tst = dr_tower_bind_findings(&lm->tower, &td, dr_loader_find, lm->ld, dr_loader_findings(lm->ld), &terr);
    dr_loader_finish(lm->ld);
    if ((st = dr_findings_check(dr_loader_findings(lm->ld), lm->cfg->sw.loader_strict, err))) goto fail;
    if (tst) {
        st = dr_fail(err, tst, "%s", terr.message);
        goto fail;
    }
    if ((st = dr_backbone_set_tokens(&lm->bb, lm->semantic_start, lm->n_semantic, lm->end_id, err))) goto fail;
    if (lm->n_semantic > td.code_stride) {
        st = dr_fail(err, DRAMA_EFORMAT, "tokenizer: %d semantic ids exceed the tower code stride %lld", lm->n_semantic,
                     (long long)td.code_stride);
        goto fail;
    }
    dr_gen_backbone_cpu(&lm->cpu, &lm->bb, lm->pool, &lm->model.bb);
    lm->model.tower = &lm->tower;
    lm->model.pool = lm->pool;
    *out = lm;
    return DRAMA_OK;
fail:
    dr_error_prefix(err, "%s: ", dir);
    dr_gen_lm_close(lm);
    return st;
}

void dr_gen_lm_close(dr_gen_lm *lm) {
    if (!lm) return;
    dr_gen_backbone_cpu_release(&lm->cpu);
    dr_tower_release(&lm->tower);
    dr_backbone_release(&lm->bb);
    dr_loader_free(lm->ld);
    dr_ckpt_close(lm->ckpt);
    dr_tok_free(lm->tok);
    dr_config_free(lm->cfg);
    if (lm->own_pool) dr_pool_free(lm->pool);
    dr_free(lm);
}
