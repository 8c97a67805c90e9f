/* inspect.c - `drama inspect DIR` (inspect.h). Every part reads the directory through the
 * engine's own readers and checkers: config + switches (model/config.h), checkpoint
 * (io/checkpoint.h), the loader findings of the backbone and tower binds (model/loader.h),
 * the tokenizer (text/tokenizer.h) and the codec loader (codec/codec.h). Problems are collected,
 * never fatal to the report itself. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/tower.h"
#include "base/file.h"
#include "base/path.h"
#include "tools/inspect.h"
#include "tools/inspect_internal.h"

/* ---- problems that are not tensor findings (config, tokens, codec) ---- */

void ins_problem(ins_report *r, int fatal, const char *fmt, ...) {
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (r->n_problems == r->cap_problems) {
        int cap = r->cap_problems ? 2 * r->cap_problems : 16;
        ins_problem_t *np = realloc(r->problems, (size_t)cap * sizeof *np);
        if (!np) return;
        r->problems = np;
        r->cap_problems = cap;
    }
    r->problems[r->n_problems].fatal = fatal;
    r->problems[r->n_problems].text = strdup(buf);
    if (r->problems[r->n_problems].text) r->n_problems++;
}

/* ---- files ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void print_files(const char *dir, FILE *out) {
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[512];
    int n = 0, more = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == 512) more++; /* a model folder has a few dozen files; say what is not listed */
        else names[n] = strdup(e->d_name), n += names[n] != NULL;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    fprintf(out, "## files\n\n");
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], target[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        ssize_t tl = readlink(path, target, sizeof target - 1);
        if (tl > 0) {
            target[tl] = 0;
            fprintf(out, "- %s: %lld bytes, symlink -> %s%s\n", names[i], size, target, size < 0 ? " (dangling)" : "");
        } else {
            fprintf(out, "- %s: %lld bytes\n", names[i], size);
        }
        free(names[i]);
    }
    if (more) fprintf(out, "- ... and %d more files (not listed)\n", more);
    fprintf(out, "\n");
}

/* ---- config and switches ---- */

static void print_config(const dr_config *c, FILE *out) {
    const dr_text_config *t = &c->text;
    const dr_audio_config *a = &c->audio;
    fprintf(out, "## config\n\n");
    fprintf(out, "- model_type: %s\n", c->model_type ? c->model_type : "(none)");
    fprintf(out, "- backbone: hidden %lld, %d layers (", (long long)t->hidden_size, t->n_layers);
    int nf = 0;
    for (int i = 0; i < t->n_layers; i++) nf += t->layer_types[i] == DR_LAYER_FULL;
    fprintf(out, "%d linear_attention, %d full_attention), vocab %lld\n", t->n_layers - nf, nf, (long long)t->vocab_size);
    fprintf(out, "- attention: %d heads, %d KV heads, head_dim %d, output gate %d, rope theta %g, rotary %d dims\n",
            t->n_heads, t->n_kv_heads, t->head_dim, t->attn_output_gate, t->rope_theta, t->rope_dims);
    fprintf(out, "- gated deltanet: %d key heads x %d, %d value heads x %d, conv kernel %d\n", t->lin_k_heads,
            t->lin_k_dim, t->lin_v_heads, t->lin_v_dim, t->conv_kernel);
    fprintf(out, "- moe: %d experts, top-%d, expert width %lld, shared width %lld, norm_topk_prob %d\n", t->n_experts,
            t->n_experts_per_tok, (long long)t->moe_intermediate, (long long)t->shared_intermediate, t->norm_topk_prob);
    fprintf(out, "- rms_norm_eps %g, tie_word_embeddings %d, max_position_embeddings %lld\n", t->rms_norm_eps,
            t->tie_word_embeddings, (long long)t->max_position_embeddings);
    fprintf(out, "- audio decoder (`%s`): dim %d, %d heads, %d KV heads, head_dim %d, ffn %lld, norm_eps %g\n", a->key,
            a->dim, a->n_head, a->n_local_heads, a->head_dim, (long long)a->intermediate_size, a->norm_eps);
    fprintf(out, "- tower: %d layers (%d shared + %d per codebook), %d codebooks, code vocab %lld, rope base %g, "
                 "rotary_percent %g, vq_backbone_codebooks %d\n",
            a->n_layers, a->shared_enrichment_layers, a->n_layers - a->shared_enrichment_layers, a->num_codebooks,
            (long long)a->vocab_size, a->rope_base, a->rotary_percent, a->vq_backbone_codebooks);
    const dr_token_config *k = &c->tokens;
    fprintf(out, "- token ids in config: semantic_start %lld, semantic_end %lld, pad %lld, audio_pad %lld, eos",
            (long long)k->semantic_start, (long long)k->semantic_end, (long long)k->pad, (long long)k->audio_pad);
    for (int i = 0; i < k->n_eos; i++) fprintf(out, " %lld", (long long)k->eos[i]);
    fprintf(out, "%s\n", k->n_eos ? "" : " (none)");
    const dr_quant_config *q = &c->quant;
    if (q->present)
        fprintf(out, "- quantization entry: method '%s', algo '%s', fmt '%s', mode '%s', block %dx%d, group %d, bits %d\n",
                q->quant_method, q->quant_algo, q->fmt, q->mode, q->block_rows, q->block_cols, q->group_size, q->bits);
    else
        fprintf(out, "- quantization entry: none\n");
    fprintf(out, "- unknown fields (kept, not used): %d\n", c->n_unknown);
    for (int i = 0; i < c->n_unknown; i++) fprintf(out, "  - %s\n", c->unknown[i]);
    for (int i = 0; i < c->n_warnings; i++) fprintf(out, "- warning: %s\n", c->warnings[i]);
    fprintf(out, "\n## switches\n\n| switch | value | source |\n|---|---|---|\n");
    for (int i = 0; i < dr_switch_def_count(); i++) {
        const dr_switch_def *d = dr_switch_def_at(i);
        char val[512];
        dr_switch_source src = DR_SRC_BUILTIN;
        if (!dr_config_switch_text(c, d->name, val, sizeof val, &src)) snprintf(val, sizeof val, "?");
        fprintf(out, "| %s | %s | %s |\n", d->name, val, dr_switch_source_name(src));
    }
    fprintf(out, "\n");
}

/* ---- checkpoint: shards, index metadata, warnings, inventory ---- */

static const char *shard_label(const char *file, char *buf, size_t cap) {
    int a, b;
    if (sscanf(file, "model-%d-of-%d.safetensors", &a, &b) == 2) snprintf(buf, cap, "%05d", a);
    else snprintf(buf, cap, "%s", file);
    return buf;
}

static void print_checkpoint(const dr_ckpt *ck, FILE *out) {
    fprintf(out, "## checkpoint\n\n");
    for (int i = 0; i < dr_ckpt_shard_count(ck); i++) {
        const dr_st_file *f = dr_ckpt_shard(ck, i);
        size_t hl = dr_st_header_len(f);
        fprintf(out, "- %s: %lld tensors, header %zu bytes (%s), %zu bytes, metadata {", dr_st_path(f),
                (long long)dr_st_count(f), hl, hl % 8 ? "NOT aligned" : "8-byte aligned", dr_st_file_size(f));
        for (int64_t m = 0; m < dr_st_metadata_count(f); m++) {
            const char *k, *v;
            dr_st_metadata_at(f, m, &k, &v);
            fprintf(out, "%s\"%s\": \"%s\"", m ? ", " : "", k, v);
        }
        fprintf(out, "}\n");
    }
    const json_t *meta = dr_ckpt_index_metadata(ck);
    if (meta) {
        fprintf(out, "- index metadata keys:");
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)meta, key, v) fprintf(out, " %s", key);
        fprintf(out, "\n");
        json_t *de = json_object_get(meta, "drama_experts");
        if (de) {
            char *txt = json_dumps(de, JSON_COMPACT | JSON_ENCODE_ANY);
            if (txt) fprintf(out, "- drama_experts: %.2000s%s\n", txt, strlen(txt) > 2000 ? " ..." : "");
            free(txt);
        }
    }
    for (int i = 0; i < dr_ckpt_warning_count(ck); i++) {
        const char *w = dr_ckpt_warning(ck, i);
        /* codec.safetensors is never a weight shard; the codec section covers it */
        fprintf(out, "- warning: %s%s\n", w, strstr(w, "'codec.safetensors'") ? " (it is the codec: see ## codec)" : "");
    }
    int64_t n = dr_ckpt_count(ck);
    dr_fold_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof *items);
    char (*groups)[32] = calloc((size_t)(n > 0 ? n : 1), sizeof *groups);
    uint64_t total = 0;
    if (items && groups) {
        for (int64_t i = 0; i < n; i++) {
            const dr_tensor *t = dr_ckpt_at(ck, i);
            const char *sh = dr_ckpt_shard_of(ck, t->name);
            const char *base = sh ? strrchr(sh, '/') : NULL;
            items[i] = (dr_fold_item){t->name, dr_dtype_name(t->dtype), t->ndim, t->shape,
                                      shard_label(base ? base + 1 : sh ? sh : "?", groups[i], sizeof groups[i]),
                                      (uint64_t)t->nbytes};
            total += t->nbytes;
        }
        fprintf(out, "\n### tensors: %lld, %llu bytes\n\n", (long long)n, (unsigned long long)total);
        dr_fold_print(out, items, n);
    }
    free(items);
    free(groups);
    fprintf(out, "\n");
}

/* ---- backbone layout (after bind) ---- */

static const char *wfmt_name(dr_wfmt f) {
    switch (f) {
    case DR_WF_F32: return "F32";
    case DR_WF_F16: return "F16";
    case DR_WF_BF16: return "BF16";
    case DR_WF_FP8_BLOCK: return "block FP8";
    case DR_WF_FP8_TENSOR: return "per-tensor FP8";
    case DR_WF_NVFP4: return "NVFP4";
    case DR_WF_AFFINE: return "affine";
    default: return "?";
    }
}

static void print_layers(const dr_backbone *bb, FILE *out) {
    fprintf(out, "## backbone\n\n- prefix: \"%s\"\n- layers (kind, routed experts: layout, stored/total, format):\n",
            bb->prefix);
    for (int L = 0; L < bb->d.n_layers; L++) {
        const dr_bb_layer *ly = &bb->layers[L];
        const dr_bb_moe *m = &ly->moe;
        const dr_weight *w = NULL;
        if (m->n_kept > 0 && m->experts) w = m->experts[0].fused ? &m->experts[0].gate_up : &m->experts[0].gate;
        char fmt[64] = "?";
        if (w && w->fmt == DR_WF_AFFINE) snprintf(fmt, sizeof fmt, "affine %d-bit group %d", w->bits, w->group);
        else if (w && w->fmt == DR_WF_FP8_BLOCK) snprintf(fmt, sizeof fmt, "block FP8 %dx%d", w->block_rows, w->block_cols);
        else if (w) snprintf(fmt, sizeof fmt, "%s", wfmt_name(w->fmt));
        fprintf(out, "  - %d: %s, %s, %d/%d, %s\n", L, ly->kind == DR_LAYER_FULL ? "full_attention" : "linear_attention",
                m->fused_layout ? "fused" : "per-expert", m->n_kept, bb->d.E, fmt);
    }
    fprintf(out, "\n");
}

/* Tower bind stops at its first problem: turn its message into a finding and keep the other
 * tower tensors from being reported as unexpected (they were not checked). */
static void tower_failure(dr_loader *ld, const char *msg) {
    char name[256] = "tower";
    const char *detail = msg;
    const char *p = strstr(msg, "tower tensor ");
    if (p) {
        p += strlen("tower tensor ");
        size_t n = strcspn(p, ": ");
        if (n >= sizeof name) n = sizeof name - 1;
        memcpy(name, p, n);
        name[n] = 0;
        detail = p[n] == ':' ? p + n + 1 + (p[n + 1] == ' ') : p + n;
    }
    int missing = !strcmp(detail, "missing");
    dr_findings_add(dr_loader_findings(ld), missing ? DR_FIND_MISSING : DR_FIND_MISSHAPED, name, "%s",
                    missing ? "" : detail);
    for (int64_t i = 0; i < dr_loader_count(ld); i++) {
        const char *n = dr_loader_name_at(ld, i);
        if (!strncmp(n, "audio_decoder_mtp", 17) && !dr_loader_taken_at(ld, i)) dr_loader_take(ld, n);
    }
}

/* ---- chat template ---- */

static void print_template(const char *dir, int max_bytes, FILE *out) {
    char path[PATH_MAX];
    char link_target[PATH_MAX];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(dr_path_follow_placeholder(path, link_target, sizeof link_target), "rb");
    fprintf(out, "## chat template\n\n");
    if (!f) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        json_t *tc = NULL;
        drama_error terr = {0};
        dr_read_json_file(path, (size_t)64 << 20, 1, &tc, &terr);
        json_t *t = tc ? json_object_get(tc, "chat_template") : NULL;
        if (json_is_string(t)) fprintf(out, "(from tokenizer_config.json)\n```\n%.*s\n```\n\n", max_bytes, json_string_value(t));
        else if (terr.code) fprintf(out, "(none: %s)\n\n", terr.message);
        else fprintf(out, "(none)\n\n");
        json_decref(tc);
        return;
    }
    fprintf(out, "(chat_template.jinja; informational, the engine never executes it)\n```\n");
    char buf[4096];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0 && total < (size_t)max_bytes) {
        size_t take = total + n > (size_t)max_bytes ? (size_t)max_bytes - total : n;
        fwrite(buf, 1, take, out);
        total += take;
    }
    fclose(f);
    fprintf(out, "\n```\n\n");
}

/* ---- the report ---- */

drama_status dr_inspect(const char *dir, const dr_inspect_options *opts, FILE *out, int *loadable,
                        drama_error *err) {
    struct stat st;
    *loadable = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return dr_fail(err, DRAMA_EIO, "%s: not a directory", dir);
    dr_inspect_options o = opts ? *opts : (dr_inspect_options){0};
    if (o.max_template_bytes <= 0) o.max_template_bytes = 65536;
    ins_report r = {0};
    fprintf(out, "# drama inspect %s\n\n", dir);
    print_files(dir, out);
    /* FORMATS.md 7 rule 2: a model whose manifest refuses it is not parsed at all. */
    int verified = ins_manifest(dir, out, &r);

    drama_error e = {0};
    dr_config *cfg = NULL;
    if (!verified) {
        fprintf(out, "(the manifest refuses the model: nothing else is read)\n\n");
    } else if (dr_config_load(dir, o.sets, o.n_sets, &cfg, &e)) {
        ins_problem(&r, 1, "config: %s", e.message);
        cfg = NULL;
    } else {
        print_config(cfg, out);
    }

    dr_tok_info tok = {0};
    if (verified) ins_tokens(dir, cfg, out, &r, &tok);

    dr_ckpt *ck = NULL;
    e = (drama_error){0};
    if (!verified) {
        ck = NULL;
    } else if (dr_ckpt_open(dir, &ck, &e)) {
        ins_problem(&r, 1, "checkpoint: %s", e.message);
        ck = NULL;
    } else {
        print_checkpoint(ck, out);
    }

    dr_loader *ld = NULL;
    dr_backbone bb;
    int bb_bound = 0;
    memset(&bb, 0, sizeof bb);
    if (cfg && ck) {
        e = (drama_error){0};
        if (dr_loader_create(ck, cfg, &ld, &e)) {
            ins_problem(&r, 1, "loader: %s", e.message);
            ld = NULL;
        }
    }
    if (ld) {
        e = (drama_error){0};
        if (dr_backbone_bind(&bb, ld, &e)) ins_problem(&r, 1, "backbone: %s", e.message);
        else bb_bound = 1;
        if (bb_bound && tok.ok) {
            e = (drama_error){0};
            if (dr_backbone_set_tokens(&bb, tok.semantic_start, tok.n_semantic, tok.end_id, &e))
                ins_problem(&r, 1, "tokens vs backbone: %s", e.message);
        }
        dr_tower_dims td;
        dr_tower tw;
        memset(&tw, 0, sizeof tw);
        e = (drama_error){0};
        if (dr_tower_dims_from_config(cfg, &td, &e)) ins_problem(&r, 1, "tower: %s", e.message);
        else if (dr_tower_bind(&tw, &td, dr_loader_find, ld, &e)) tower_failure(ld, e.message);
        dr_tower_release(&tw);
        dr_loader_finish(ld);
        if (bb_bound) print_layers(&bb, out);
    }

    if (verified) {
        ins_codec(dir, out, &r);
        print_template(dir, o.max_template_bytes, out);
    }

    /* findings */
    int fatal = 0, strict = cfg ? cfg->sw.loader_strict : 0;
    fprintf(out, "## findings\n\n");
    if (ld) {
        dr_findings *f = dr_loader_findings(ld);
        dr_findings_print(f, out);
        fatal += dr_findings_fatal(f, strict);
        fprintf(out, "(tensors: ");
        for (int k = 0; k < DR_FIND_KIND_COUNT; k++)
            fprintf(out, "%s%d %s", k ? ", " : "", dr_findings_count(f, (dr_finding_kind)k),
                    dr_finding_kind_name((dr_finding_kind)k));
        fprintf(out, ")\n");
    }
    for (int i = 0; i < r.n_problems; i++) {
        fprintf(out, "%s: %s\n", r.problems[i].fatal ? "error" : "warning", r.problems[i].text);
        fatal += r.problems[i].fatal;
    }
    *loadable = fatal == 0;
    fprintf(out, "\n%s: %d fatal finding%s\n", *loadable ? "LOADABLE" : "NOT LOADABLE", fatal, fatal == 1 ? "" : "s");

    for (int i = 0; i < r.n_problems; i++) free(r.problems[i].text);
    free(r.problems);
    if (bb_bound) dr_backbone_release(&bb);
    dr_loader_free(ld);
    dr_ckpt_close(ck);
    dr_config_free(cfg);
    return DRAMA_OK;
}
