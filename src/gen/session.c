/* session.c - opening the language model for generation on a backend. */
#include "gen/session.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "io/manifest.h"
#include "model/upload.h"
#include "text/prompt.h"

/* ---------------- opening a model directory ---------------- */

drama_status dr_gen_lm_open(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                            dr_gen_lm **out, drama_error *err) {
    dr_backend_choice cpu = {DR_WANT_CPU, 0};
    return dr_gen_lm_open_on(dir, sets, n_sets, threads, pool, &cpu, NULL, out, err);
}

drama_status dr_gen_lm_open_on(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                               const dr_backend_choice *backend, const dr_tok *tok, dr_gen_lm **out,
                               drama_error *err) {
    *out = NULL;
    dr_gen_lm *lm = dr_calloc(1, sizeof *lm);
    if (!lm) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    /* FORMATS.md 7: a drama-manifest.json next to the weights is verified before anything is parsed */
    dr_manifest *manifest = NULL;
    drama_status st = dr_manifest_verify_dir(dir, 0, &manifest, err);
    dr_manifest_free(manifest);
    if (!st) st = dr_config_load(dir, sets, n_sets, &lm->cfg, err);
    char path[4096];
    if (!st && tok) {
        lm->tok = tok;
    } else if (!st) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        st = dr_tok_load(path, &lm->own_tok, err);
        lm->tok = lm->own_tok;
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
    if ((st = dr_backend_open(backend, lm->pool, &lm->be, err))) goto fail;
    if ((st = dr_model_upload(lm->be, &lm->bb, &lm->tower, err))) goto fail;
    if ((st = dr_gen_model_init(&lm->model, lm->be, &lm->bb, &lm->tower, lm->pool, err))) goto fail;
    *out = lm;
    return DRAMA_OK;
fail:
    dr_error_prefix(err, "%s: ", dir);
    dr_gen_lm_close(lm);
    return st;
}

void dr_gen_lm_close(dr_gen_lm *lm) {
    if (!lm) return;
    dr_gen_model_release(&lm->model);
    dr_backend_free(lm->be);
    dr_tower_release(&lm->tower);
    dr_backbone_release(&lm->bb);
    dr_loader_free(lm->ld);
    dr_ckpt_close(lm->ckpt);
    dr_tok_free(lm->own_tok);
    dr_config_free(lm->cfg);
    if (lm->own_pool) dr_pool_free(lm->pool);
    dr_free(lm);
}
