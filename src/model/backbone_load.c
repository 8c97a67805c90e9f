/* backbone_load.c - backbone weights bound by a name table (MODEL.md 4.1-4.3, FORMATS.md 5). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "model/backbone.h"

drama_status dr_bb_dims_from_config(const dr_config *cfg, dr_bb_dims *d, drama_error *err) {
    memset(d, 0, sizeof *d);
    const dr_text_config *t = &cfg->text;
    d->H = t->hidden_size;
    d->n_layers = t->n_layers;
    d->kinds = malloc((size_t)t->n_layers * sizeof(dr_layer_kind));
    if (!d->kinds) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    memcpy(d->kinds, t->layer_types, (size_t)t->n_layers * sizeof(dr_layer_kind));
    d->nh = t->n_heads;
    d->nkv = t->n_kv_heads;
    d->hd = t->head_dim;
    d->rope_dims = t->rope_dims;
    d->rope_theta = t->rope_theta;
    d->eps = (float)t->rms_norm_eps;
    d->norm_offset = (float)cfg->sw.backbone_norm_offset;
    d->attn_gate = t->attn_output_gate;
    d->nk = t->lin_k_heads;
    d->dk = t->lin_k_dim;
    d->nv = t->lin_v_heads;
    d->dv = t->lin_v_dim;
    d->K = t->conv_kernel;
    d->E = t->n_experts;
    d->topk = t->n_experts_per_tok;
    d->I = t->moe_intermediate;
    d->Is = t->shared_intermediate;
    d->norm_topk = t->norm_topk_prob;
    d->n_codebooks = cfg->audio.num_codebooks;
    d->in_codebooks = cfg->sw.input_codebooks;
    d->code_stride = cfg->audio.vocab_size;
    d->code_scale_rsqrt = cfg->sw.input_code_scale_rsqrt;
    d->add_token_embedding = cfg->sw.input_add_token_embedding;
    d->gdn_recurrent = cfg->sw.deltanet_prefill_recurrent;
    return DRAMA_OK;
}

/* A dense vector [n] -> fp32 with `offset` added (norm weights). */
static float *take_vec(dr_loader *ld, const char *name, int64_t n, float offset) {
    int64_t shape[1] = {n};
    float *v = dr_loader_take_f32(ld, name, 1, shape, NULL);
    if (v && offset != 0.0f)
        for (int64_t i = 0; i < n; i++) v[i] += offset;
    return v;
}

/* Kept expert ids per layer from index metadata drama_experts (object, or the same as a JSON string). */
static drama_status read_drama_experts(const dr_ckpt *ck, json_t **out, drama_error *err) {
    *out = NULL;
    const json_t *meta = ck ? dr_ckpt_index_metadata(ck) : NULL;
    const json_t *de = meta ? json_object_get(meta, "drama_experts") : NULL;
    if (!de || json_is_null(de)) return DRAMA_OK;
    if (json_is_string(de)) {
        json_error_t je;
        json_t *parsed = json_loads(json_string_value(de), JSON_REJECT_DUPLICATES, &je);
        if (!parsed || !json_is_object(parsed)) {
            json_decref(parsed);
            return dr_fail(err, DRAMA_EFORMAT,
                           "model.safetensors.index.json: metadata.drama_experts: string is not a JSON object (%s)",
                           parsed ? "not an object" : je.text);
        }
        *out = parsed;
        return DRAMA_OK;
    }
    if (!json_is_object(de))
        return dr_fail(err, DRAMA_EFORMAT,
                       "model.safetensors.index.json: metadata.drama_experts: expected an object of layer -> ids");
    *out = json_incref((json_t *)de);
    return DRAMA_OK;
}

/* Routed experts missing without metadata.drama_experts: most likely a pruned checkpoint whose
 * index (or kept-expert list) is absent. Say so first, so the summary line explains the list. */
static void pruned_hint(dr_findings *f) {
    int n = 0;
    for (int i = 0; i < f->n; i++)
        if (f->items[i].kind == DR_FIND_MISSING && strstr(f->items[i].name, ".experts.")) n++;
    if (n == 0) return;
    dr_findings_add(f, DR_FIND_MISSING, "model.safetensors.index.json: metadata.drama_experts",
                    "absent, so every routed expert must be stored, but %d expert tensors are missing (a pruned "
                    "checkpoint lists its kept experts there, FORMATS.md 5)", n);
    dr_finding hint = f->items[f->n - 1];
    memmove(f->items + 1, f->items, (size_t)(f->n - 1) * sizeof *f->items);
    f->items[0] = hint;
}

static drama_status kept_for_layer(const json_t *de, int L, const dr_bb_dims *d, dr_bb_moe *m, drama_error *err) {
    m->slot = malloc((size_t)d->E * sizeof(int));
    m->kept = malloc((size_t)d->E * sizeof(int));
    if (!m->slot || !m->kept) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    for (int e = 0; e < d->E; e++) m->slot[e] = -1;
    if (!de) {
        for (int e = 0; e < d->E; e++) m->kept[e] = m->slot[e] = e;
        m->n_kept = d->E;
        return DRAMA_OK;
    }
    char key[32];
    snprintf(key, sizeof key, "%d", L);
    const json_t *ids = json_object_get(de, key);
    if (!json_is_array(ids))
        return dr_fail(err, DRAMA_EFORMAT, "metadata.drama_experts: layer %d: missing or not a list of expert ids", L);
    size_t n = json_array_size(ids);
    if (n > (size_t)d->E)
        return dr_fail(err, DRAMA_EFORMAT, "metadata.drama_experts: layer %d: %zu ids for %d experts", L, n, d->E);
    int prev = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= d->E ||
            json_integer_value(v) <= prev)
            return dr_fail(err, DRAMA_EFORMAT,
                           "metadata.drama_experts: layer %d: item %zu: expected ascending unique ids in [0, %d)", L, i,
                           d->E);
        prev = (int)json_integer_value(v);
        m->kept[i] = prev;
        m->slot[prev] = (int)i;
    }
    m->n_kept = (int)n;
    if (m->n_kept < d->topk)
        return dr_fail(err, DRAMA_EFORMAT, "metadata.drama_experts: layer %d keeps %d experts, fewer than top-k %d", L,
                       m->n_kept, d->topk);
    return DRAMA_OK;
}

/* Which layers use the per-expert layout: any name P+"layers.L.mlp.experts.<digits>.". */
static void scan_layouts(const dr_loader *ld, const char *P, int n_layers, int *per_expert) {
    size_t plen = strlen(P);
    for (int64_t i = 0; i < dr_loader_count(ld); i++) {
        const char *nm = dr_loader_name_at(ld, i);
        if (strncmp(nm, P, plen) != 0 || strncmp(nm + plen, "layers.", 7) != 0) continue;
        const char *p = nm + plen + 7;
        char *end;
        long L = strtol(p, &end, 10);
        if (end == p || L < 0 || L >= n_layers || strncmp(end, ".mlp.experts.", 13) != 0) continue;
        p = end + 13;
        if (!isdigit((unsigned char)*p)) continue;
        while (isdigit((unsigned char)*p)) p++;
        if (*p == '.') per_expert[L] = 1;
    }
}

static int bind_w(dr_loader *ld, const char *P, int L, const char *suffix, int64_t rows, int64_t cols, dr_weight *w) {
    char nm[512];
    snprintf(nm, sizeof nm, "%slayers.%d.%s", P, L, suffix);
    return dr_loader_bind(ld, nm, rows, cols, -1, -1, w);
}

static float *layer_vec(dr_loader *ld, const char *P, int L, const char *suffix, int64_t n, float offset) {
    char nm[512];
    snprintf(nm, sizeof nm, "%slayers.%d.%s", P, L, suffix);
    return take_vec(ld, nm, n, offset);
}

static void bind_attention(dr_loader *ld, const char *P, int L, const dr_bb_dims *d, dr_bb_attn *a) {
    int64_t H = d->H, q_rows = (int64_t)d->nh * d->hd * (d->attn_gate ? 2 : 1);
    bind_w(ld, P, L, "self_attn.q_proj.weight", q_rows, H, &a->q);
    bind_w(ld, P, L, "self_attn.k_proj.weight", (int64_t)d->nkv * d->hd, H, &a->k);
    bind_w(ld, P, L, "self_attn.v_proj.weight", (int64_t)d->nkv * d->hd, H, &a->v);
    bind_w(ld, P, L, "self_attn.o_proj.weight", H, (int64_t)d->nh * d->hd, &a->o);
    a->q_norm = layer_vec(ld, P, L, "self_attn.q_norm.weight", d->hd, d->norm_offset);
    a->k_norm = layer_vec(ld, P, L, "self_attn.k_norm.weight", d->hd, d->norm_offset);
}

static void bind_deltanet(dr_loader *ld, const char *P, int L, const dr_bb_dims *d, dr_bb_gdn *g) {
    int64_t H = d->H, C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv, vd = (int64_t)d->nv * d->dv;
    bind_w(ld, P, L, "linear_attn.in_proj_qkv.weight", C, H, &g->qkv);
    bind_w(ld, P, L, "linear_attn.in_proj_z.weight", vd, H, &g->z);
    bind_w(ld, P, L, "linear_attn.in_proj_b.weight", d->nv, H, &g->b);
    bind_w(ld, P, L, "linear_attn.in_proj_a.weight", d->nv, H, &g->a);
    bind_w(ld, P, L, "linear_attn.out_proj.weight", H, vd, &g->out);
    char nm[512];
    snprintf(nm, sizeof nm, "%slayers.%d.linear_attn.conv1d.weight", P, L);
    /* [C, 1, K] as released; some conversions drop the middle dimension. */
    const dr_tensor *ct = dr_loader_peek(ld, nm);
    int64_t cshape[3] = {C, 1, d->K}, cshape2[2] = {C, d->K};
    if (ct && ct->ndim == 2) g->conv_w = dr_loader_take_f32(ld, nm, 2, cshape2, NULL);
    else g->conv_w = dr_loader_take_f32(ld, nm, 3, cshape, NULL);
    snprintf(nm, sizeof nm, "%slayers.%d.linear_attn.conv1d.bias", P, L);
    if (dr_loader_peek(ld, nm)) g->conv_b = take_vec(ld, nm, C, 0.0f);
    float *A_log = layer_vec(ld, P, L, "linear_attn.A_log", d->nv, 0.0f);
    if (A_log)
        for (int h = 0; h < d->nv; h++) A_log[h] = -expf(A_log[h]);
    g->neg_A = A_log;
    g->dt_bias = layer_vec(ld, P, L, "linear_attn.dt_bias", d->nv, 0.0f);
    /* norm.weight is [dv] (shared by heads) or [nv*dv] (per channel, some conversions). */
    snprintf(nm, sizeof nm, "%slayers.%d.linear_attn.norm.weight", P, L);
    const dr_tensor *nt = dr_loader_peek(ld, nm);
    g->norm_per_channel = nt && nt->ndim == 1 && nt->shape[0] == vd && vd != d->dv;
    g->norm = take_vec(ld, nm, g->norm_per_channel ? vd : d->dv, 0.0f);
}

static drama_status bind_moe(dr_loader *ld, const char *P, int L, const dr_bb_dims *d, const json_t *de,
                             int per_expert, dr_bb_moe *m, drama_error *err) {
    int64_t H = d->H;
    bind_w(ld, P, L, "mlp.gate.weight", d->E, H, &m->router);
    bind_w(ld, P, L, "mlp.shared_expert.gate_proj.weight", d->Is, H, &m->sh_gate);
    bind_w(ld, P, L, "mlp.shared_expert.up_proj.weight", d->Is, H, &m->sh_up);
    bind_w(ld, P, L, "mlp.shared_expert.down_proj.weight", H, d->Is, &m->sh_down);
    bind_w(ld, P, L, "mlp.shared_expert_gate.weight", 1, H, &m->sh_gate_proj);
    if (kept_for_layer(de, L, d, m, err)) return err ? err->code : DRAMA_EFORMAT;
    m->experts = calloc((size_t)m->n_kept, sizeof(dr_bb_expert));
    if (!m->experts) return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    m->fused_layout = !per_expert;
    char nm[512], dn[512];
    if (per_expert) {
        /* MODEL.md 4.3: both layouts in one layer is a load error */
        const char *fused_names[4] = {"gate_up_proj", "gate_up_proj.weight", "down_proj", "down_proj.weight"};
        for (int i = 0; i < 4; i++) {
            snprintf(nm, sizeof nm, "%slayers.%d.mlp.experts.%s", P, L, fused_names[i]);
            if (dr_loader_take(ld, nm))
                dr_findings_add(dr_loader_findings(ld), DR_FIND_UNSUPPORTED, nm,
                                "fused expert tensor in a layer that also has per-expert tensors");
        }
        for (int k = 0; k < m->n_kept; k++) {
            int e = m->kept[k];
            dr_bb_expert *x = &m->experts[k];
            snprintf(nm, sizeof nm, "mlp.experts.%d.gate_proj.weight", e);
            bind_w(ld, P, L, nm, d->I, H, &x->gate);
            snprintf(nm, sizeof nm, "mlp.experts.%d.up_proj.weight", e);
            bind_w(ld, P, L, nm, d->I, H, &x->up);
            snprintf(nm, sizeof nm, "mlp.experts.%d.down_proj.weight", e);
            bind_w(ld, P, L, nm, H, d->I, &x->down);
        }
        return DRAMA_OK;
    }
    /* Fused 3-D: names with or without a ".weight" suffix. */
    snprintf(nm, sizeof nm, "%slayers.%d.mlp.experts.gate_up_proj", P, L);
    if (!dr_loader_peek(ld, nm)) snprintf(nm, sizeof nm, "%slayers.%d.mlp.experts.gate_up_proj.weight", P, L);
    snprintf(dn, sizeof dn, "%slayers.%d.mlp.experts.down_proj", P, L);
    if (!dr_loader_peek(ld, dn)) snprintf(dn, sizeof dn, "%slayers.%d.mlp.experts.down_proj.weight", P, L);
    if (!dr_loader_peek(ld, nm) || !dr_loader_peek(ld, dn)) {
        char what[600];
        snprintf(what, sizeof what, "%slayers.%d.mlp.experts", P, L);
        if (!dr_loader_peek(ld, nm))
            dr_findings_add(dr_loader_findings(ld), DR_FIND_MISSING, what,
                            "no per-expert tensors (experts.<id>.gate_proj.weight) and no fused gate_up_proj");
        if (!dr_loader_peek(ld, dn))
            dr_findings_add(dr_loader_findings(ld), DR_FIND_MISSING, dn, "fused down_proj [%d, %lld, %lld]", m->n_kept,
                            (long long)H, (long long)d->I);
        return DRAMA_OK;
    }
    for (int k = 0; k < m->n_kept; k++) {
        dr_bb_expert *x = &m->experts[k];
        x->fused = 1;
        if (!dr_loader_bind(ld, nm, 2 * d->I, H, k, m->n_kept, &x->gate_up)) break;
        if (!dr_loader_bind(ld, dn, H, d->I, k, m->n_kept, &x->down)) break;
    }
    return DRAMA_OK;
}

static drama_status bind_all(dr_backbone *bb, dr_loader *ld, drama_error *err) {
    memset(bb, 0, sizeof *bb);
    const dr_config *cfg = dr_loader_config(ld);
    if (!cfg) return dr_fail(err, DRAMA_EINVAL, "backbone bind: loader has no config");
    drama_status st = dr_bb_dims_from_config(cfg, &bb->d, err);
    if (st) return st;
    dr_bb_dims *d = &bb->d;
    dr_findings *f = dr_loader_findings(ld);
    if (cfg->text.n_mlp_only_layers > 0)
        dr_findings_add(f, DR_FIND_UNSUPPORTED, "config.json: text_config.mlp_only_layers", "non-empty (%d layers)",
                        cfg->text.n_mlp_only_layers);
    if (cfg->text.decoder_sparse_step != 1)
        dr_findings_add(f, DR_FIND_UNSUPPORTED, "config.json: text_config.decoder_sparse_step", "%d (only 1 is supported)",
                        cfg->text.decoder_sparse_step);
    if ((st = dr_loader_detect_prefix(ld, cfg->sw.backbone_prefix, bb->prefix, sizeof bb->prefix, err))) return st;
    const char *P = bb->prefix;
    json_t *de = NULL;
    if ((st = read_drama_experts(dr_loader_ckpt(ld), &de, err))) return st;
    bb->has_experts_meta = de != NULL;

    int half = d->rope_dims / 2;
    bb->rope_inv_freq = malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    bb->layers = calloc((size_t)d->n_layers, sizeof(dr_bb_layer));
    int *per_expert = calloc((size_t)d->n_layers, sizeof(int));
    if (!bb->rope_inv_freq || !bb->layers || !per_expert) {
        free(per_expert);
        json_decref(de);
        return dr_fail(err, DRAMA_ENOMEM, "backbone: out of memory");
    }
    /* f_i = theta^(-2i/R), computed as the reference does: in float from an fp64 power. */
    for (int i = 0; i < half; i++) bb->rope_inv_freq[i] = (float)(1.0 / pow(d->rope_theta, (2.0 * i) / d->rope_dims));
    scan_layouts(ld, P, d->n_layers, per_expert);

    char nm[512];
    snprintf(nm, sizeof nm, "%sembed_tokens.weight", P);
    dr_loader_bind(ld, nm, -1, d->H, -1, -1, &bb->embed);
    if (bb->embed.rows > 0 && bb->embed.rows > cfg->text.vocab_size)
        dr_findings_add(f, DR_FIND_MISSHAPED, nm, "%lld rows exceed text_config.vocab_size %lld",
                        (long long)bb->embed.rows, (long long)cfg->text.vocab_size);
    snprintf(nm, sizeof nm, "%snorm.weight", P);
    bb->final_norm = take_vec(ld, nm, d->H, d->norm_offset);

    /* Head: the unique non-audio_decoder name ending in lm_head.weight; else tied embedding. */
    const char *head_name = NULL;
    int n_heads = 0;
    for (int64_t i = 0; i < dr_loader_count(ld); i++) {
        const char *x = dr_loader_name_at(ld, i);
        size_t n = strlen(x);
        if (strncmp(x, "audio_decoder", 13) == 0 || n < 14 || strcmp(x + n - 14, "lm_head.weight") != 0) continue;
        head_name = x;
        n_heads++;
    }
    if (n_heads == 1) {
        dr_loader_bind(ld, head_name, -1, d->H, -1, -1, &bb->head);
    } else if (n_heads > 1) {
        dr_findings_add(f, DR_FIND_UNSUPPORTED, "lm_head.weight", "%d tensors end in lm_head.weight", n_heads);
    } else if (cfg->text.tie_word_embeddings) {
        bb->head = bb->embed;
    } else {
        dr_findings_add(f, DR_FIND_MISSING, "lm_head.weight", "and tie_word_embeddings is false");
    }

    /* Frame-input code table (absolute name, switch input.code_table). */
    if (d->in_codebooks > 0) {
        const char *ct = cfg->sw.input_code_table;
        const dr_tensor *t = dr_loader_peek(ld, ct);
        if (!t) {
            /* MODEL.md 6: name the tensors that look like the table (k*V rows of width H) */
            char cands[600] = "";
            size_t cl = 0;
            for (int64_t i = 0; i < dr_loader_count(ld) && cl < sizeof cands - 1; i++) {
                const dr_tensor *x = dr_loader_tensor_at(ld, i);
                const char *xn = dr_loader_name_at(ld, i);
                if (x->ndim != 2 || x->shape[1] != d->H || d->code_stride <= 0 || x->shape[0] % d->code_stride != 0 ||
                    strstr(xn, "lm_head") || strstr(xn, "embed_tokens"))
                    continue;
                cl += (size_t)snprintf(cands + cl, sizeof cands - cl, "%s%s [%lld, %lld]", cl ? ", " : "", xn,
                                       (long long)x->shape[0], (long long)x->shape[1]);
            }
            dr_findings_add(f, DR_FIND_MISSING, ct, "switch input.code_table; candidates with k*%lld rows of width %lld: %s",
                            (long long)d->code_stride, (long long)d->H, cl ? cands : "none");
        } else if (t->ndim == 2 && t->shape[1] != d->H) {
            dr_loader_take(ld, ct);
            dr_findings_add(f, DR_FIND_MISSHAPED, ct, "width %lld differs from hidden_size %lld",
                            (long long)t->shape[1], (long long)d->H);
        } else if (dr_loader_bind(ld, ct, -1, d->H, -1, -1, &bb->code_table) &&
                   bb->code_table.rows < (int64_t)d->in_codebooks * d->code_stride) {
            dr_findings_add(f, DR_FIND_MISSHAPED, ct, "expected at least %lld rows (%d codebooks x %lld), found %lld",
                            (long long)d->in_codebooks * d->code_stride, d->in_codebooks, (long long)d->code_stride,
                            (long long)bb->code_table.rows);
            bb->code_table.rows = 0;
        }
    }

    for (int L = 0; L < d->n_layers && st == DRAMA_OK; L++) {
        dr_bb_layer *ly = &bb->layers[L];
        ly->kind = d->kinds[L];
        ly->idx = ly->kind == DR_LAYER_FULL ? bb->n_attn++ : bb->n_gdn++;
        ly->in_norm = layer_vec(ld, P, L, "input_layernorm.weight", d->H, d->norm_offset);
        ly->post_norm = layer_vec(ld, P, L, "post_attention_layernorm.weight", d->H, d->norm_offset);
        if (ly->kind == DR_LAYER_FULL) bind_attention(ld, P, L, d, &ly->attn);
        else bind_deltanet(ld, P, L, d, &ly->gdn);
        st = bind_moe(ld, P, L, d, de, per_expert[L], &ly->moe, err);
    }
    free(per_expert);
    json_decref(de);
    if (st) return st;
    if (!bb->has_experts_meta) pruned_hint(f);
    /* default token ids from config.json; the tokenizer's ids replace them (dr_backbone_set_tokens) */
    bb->sem_start = cfg->tokens.semantic_start;
    bb->n_sem = cfg->tokens.semantic_end >= cfg->tokens.semantic_start && cfg->tokens.semantic_start >= 0
                    ? cfg->tokens.semantic_end - cfg->tokens.semantic_start + 1
                    : cfg->audio.vocab_size;
    bb->end_id = cfg->tokens.n_eos > 0 ? cfg->tokens.eos[0] : -1;
    if (bb->sem_start >= 0 && bb->end_id >= 0) dr_backbone_set_tokens(bb, bb->sem_start, bb->n_sem, bb->end_id, NULL);
    return DRAMA_OK;
}

/* On failure everything bind allocated is released again (bb zeroed): no cleanup for the caller,
 * and dr_backbone_release on the zeroed struct stays harmless. */
drama_status dr_backbone_bind(dr_backbone *bb, dr_loader *ld, drama_error *err) {
    drama_status st = bind_all(bb, ld, err);
    if (st) dr_backbone_release(bb);
    return st;
}

void dr_backbone_release(dr_backbone *bb) {
    if (!bb) return;
    for (int L = 0; bb->layers && L < bb->d.n_layers; L++) {
        dr_bb_layer *ly = &bb->layers[L];
        free(ly->in_norm);
        free(ly->post_norm);
        free(ly->attn.q_norm);
        free(ly->attn.k_norm);
        free(ly->gdn.conv_w);
        free(ly->gdn.conv_b);
        free(ly->gdn.neg_A);
        free(ly->gdn.dt_bias);
        free(ly->gdn.norm);
        free(ly->moe.kept);
        free(ly->moe.slot);
        free(ly->moe.experts);
    }
    free(bb->layers);
    free(bb->final_norm);
    free(bb->rope_inv_freq);
    free(bb->d.kinds);
    memset(bb, 0, sizeof *bb);
}

drama_status dr_backbone_set_tokens(dr_backbone *bb, int64_t sem_start, int64_t n_sem, int64_t end_id,
                                    drama_error *err) {
    int64_t vocab = bb->embed.rows;
    if (sem_start < 0 || n_sem <= 0 || sem_start + n_sem > vocab)
        return dr_fail(err, DRAMA_EINVAL, "semantic tokens [%lld, %lld) outside the embedding's %lld rows",
                       (long long)sem_start, (long long)(sem_start + n_sem), (long long)vocab);
    if (end_id < 0 || end_id >= vocab)
        return dr_fail(err, DRAMA_EINVAL, "end token id %lld outside the embedding's %lld rows", (long long)end_id,
                       (long long)vocab);
    int trimmed = bb->head.rows == n_sem + 1 && bb->head.rows < vocab;
    if (!trimmed && (sem_start + n_sem > bb->head.rows || end_id >= bb->head.rows))
        return dr_fail(err, DRAMA_EINVAL, "lm_head has %lld rows: too few for semantic tokens [%lld, %lld) and end id %lld",
                       (long long)bb->head.rows, (long long)sem_start, (long long)(sem_start + n_sem),
                       (long long)end_id);
    bb->sem_start = sem_start;
    bb->n_sem = n_sem;
    bb->end_id = end_id;
    bb->head_sem_row = trimmed ? 0 : sem_start;
    bb->head_end_row = trimmed ? n_sem : end_id;
    return DRAMA_OK;
}

int64_t dr_backbone_n_logits(const dr_backbone *bb) { return bb->n_sem + 1; }
int dr_backbone_row_width(const dr_backbone *bb) { return 1 + bb->d.n_codebooks; }
