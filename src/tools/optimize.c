/* optimize.c - `drama optimize` (FORMATS.md section 6): plan the output tensors, stream them into
 * shards (non-expert tensors copied byte for byte, experts re-encoded a few at a time), then
 * config.json, index, copied side files, NOTICE, drama-manifest.json and the receipt
 * drama-optimize.json; all inside DST.partial, renamed to DST at the end. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "drama.h"
#include "base/file.h"
#include "base/path.h"
#include "base/receipt.h"
#include "io/checkpoint.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/loader.h"
#include "tools/optimize_internal.h"

#define RECEIPT_NAME "drama-optimize.json"
#define OPT_CONFIG_MAX_BYTES ((size_t)64 << 20) /* config.json: a few KiB */

int dr_opt_format_parse(const char *s, dr_opt_format *out) {
    static const struct { const char *name; dr_opt_format f; } k[] = {
        {"keep", DR_OPT_KEEP}, {"bf16", DR_OPT_BF16}, {"fp8", DR_OPT_FP8}, {"nvfp4", DR_OPT_NVFP4}, {"q4", DR_OPT_AFFINE},
    };
    for (size_t i = 0; s && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].name)) {
            *out = k[i].f;
            return 1;
        }
    return 0;
}

const char *dr_opt_format_name(dr_opt_format f) {
    switch (f) {
    case DR_OPT_KEEP: return "keep";
    case DR_OPT_BF16: return "bf16";
    case DR_OPT_FP8: return "fp8";
    case DR_OPT_NVFP4: return "nvfp4";
    case DR_OPT_AFFINE: return "q4";
    }
    return "?";
}

/* One output tensor: a copy of a source tensor, or component `comp` of projection `proj` of the
 * expert number `expert` in the expert order. */
typedef struct opt_item {
    char *name;
    const dr_tensor *src;
    int expert, proj, comp;
    int group;   /* items of one group (one tensor, or one expert) share a shard */
    int shard;
    dr_dtype dtype;
    int ndim;
    int64_t shape[DR_MAX_DIMS];
    size_t nbytes;
} opt_item;

typedef struct opt_run {
    const dr_opt_options *o;
    dr_config *cfg;
    dr_ckpt *ck;
    dr_loader *ld;
    dr_backbone bb;
    int bb_bound;
    unsigned char *keep;      /* [L][E] */
    int copy_experts;         /* --experts keep on a per-expert source: copy the stored tensors */
    opt_target t;
    int check_exact;
    int src_quantised;
    opt_item *items;
    int64_t n_items, cap_items;
    int *exp_layer, *exp_slot; /* expert order */
    int n_exp;
    int n_shards;
    char partial[PATH_MAX];
    dr_opt_report rep;
} opt_run;

/* ---- small file helpers ---- */

static drama_status rm_tree(const char *dir, drama_error *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? DRAMA_OK : dr_fail(err, DRAMA_EIO, "%s: %s", dir, strerror(errno));
    struct dirent *de;
    drama_status st = DRAMA_OK;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat s;
        if (lstat(p, &s) == 0 && S_ISDIR(s.st_mode)) st = rm_tree(p, err);
        else if (unlink(p) != 0) st = dr_fail(err, DRAMA_EIO, "%s: cannot remove: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) != 0 && !st) st = dr_fail(err, DRAMA_EIO, "%s: cannot remove: %s", dir, strerror(errno));
    return st;
}

/* 1 = missing, 0 = an empty directory, -1 = anything else */
static int dst_state(const char *path) {
    struct stat s;
    if (lstat(path, &s) != 0) return 1;
    if (!S_ISDIR(s.st_mode)) return -1;
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *de;
    int empty = 1;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
    closedir(d);
    return empty ? 0 : -1;
}

static drama_status copy_file(const char *from, const char *to, drama_error *err) {
    char buf_path[PATH_MAX];
    const char *real = dr_path_follow_placeholder(from, buf_path, sizeof buf_path);
    FILE *in = fopen(real, "rb");
    if (!in) return dr_fail(err, DRAMA_EIO, "%s: cannot read: %s", real, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return dr_fail(err, DRAMA_EIO, "%s: cannot create: %s", to, strerror(errno));
    }
    static char chunk[1 << 16];
    size_t n;
    drama_status st = DRAMA_OK;
    while ((n = fread(chunk, 1, sizeof chunk, in)) > 0)
        if (fwrite(chunk, 1, n, out) != n) {
            st = dr_fail(err, DRAMA_EIO, "%s: write failed: %s", to, strerror(errno));
            break;
        }
    if (!st && ferror(in)) st = dr_fail(err, DRAMA_EIO, "%s: read failed", real);
    fclose(in);
    if (fclose(out) != 0 && !st) st = dr_fail(err, DRAMA_EIO, "%s: write failed: %s", to, strerror(errno));
    return st;
}

static drama_status dump_json(const json_t *j, const char *dir, const char *name, drama_error *err) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (json_dump_file(j, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: cannot write", p);
    return DRAMA_OK;
}

/* ---- opening the source ---- */

static drama_status open_source(opt_run *r, drama_error *err) {
    const char *src = r->o->src;
    drama_status st = dr_config_load(src, NULL, 0, &r->cfg, err);
    if (!st) st = dr_ckpt_open(src, &r->ck, err);
    if (!st) st = dr_loader_create(r->ck, r->cfg, &r->ld, err);
    if (!st) {
        st = dr_backbone_bind(&r->bb, r->ld, err);
        r->bb_bound = 1;
    }
    if (st) return st; /* the readers' messages name the file */
    dr_loader_finish(r->ld);
    /* the tower is not bound here: its tensors are "unexpected" and get copied like the rest */
    if (dr_findings_fatal(dr_loader_findings(r->ld), 0)) {
        st = dr_findings_check(dr_loader_findings(r->ld), 0, err);
        dr_error_prefix(err, "%s: the source does not load", src);
        return st;
    }
    return DRAMA_OK;
}

/* "<P>layers.<L>.mlp.experts." -> L, else -1; *rest points after it. */
static int expert_layer(const char *P, const char *name, const char **rest) {
    size_t pl = strlen(P);
    if (strncmp(name, P, pl) || strncmp(name + pl, "layers.", 7)) return -1;
    const char *s = name + pl + 7;
    char *end;
    long L = strtol(s, &end, 10);
    if (end == s || *s == '-' || *s == '+' || strncmp(end, ".mlp.experts.", 13)) return -1;
    *rest = end + 13;
    return (int)L;
}

static dr_dtype wfmt_dtype(dr_wfmt f) {
    return f == DR_WF_F32 ? DR_DT_F32 : f == DR_WF_F16 ? DR_DT_F16 : f == DR_WF_BF16 ? DR_DT_BF16 : DR_DT_INVALID;
}

static drama_status choose_target(opt_run *r, drama_error *err) {
    const dr_opt_options *o = r->o;
    const dr_bb_moe *m0 = &r->bb.layers[0].moe;
    const dr_bb_expert *x0 = &m0->experts[0];
    const dr_weight *w0 = x0->fused ? &x0->gate_up : &x0->gate;
    dr_dtype src_dense = wfmt_dtype(w0->fmt);
    r->src_quantised = src_dense == DR_DT_INVALID;
    dr_dtype dense = src_dense != DR_DT_INVALID ? src_dense : wfmt_dtype(m0->router.fmt);
    if (dense == DR_DT_INVALID) dense = DR_DT_BF16;
    r->t.fmt = o->experts;
    r->t.dense = dense;
    r->t.bits = o->affine_bits ? o->affine_bits : 4;
    r->t.group = o->affine_group ? o->affine_group : 64;
    if (o->experts == DR_OPT_KEEP) {
        if (!x0->fused) {
            r->copy_experts = 1;
            return DRAMA_OK;
        }
        if (r->src_quantised)
            return dr_fail(err, DRAMA_EUNSUPPORTED,
                           "%s: --experts keep of quantised fused experts (%s) is not supported; pick a format", o->src,
                           w0->name ? w0->name : "gate_up_proj");
        return DRAMA_OK; /* dense fused: sliced into per-expert tensors of the same dtype */
    }
    r->check_exact = r->src_quantised;
    return DRAMA_OK;
}

/* ---- plan ---- */

static opt_item *add_item(opt_run *r, const char *name, drama_error *err) {
    if (r->n_items == r->cap_items) {
        int64_t cap = r->cap_items ? 2 * r->cap_items : 256;
        opt_item *n = realloc(r->items, (size_t)cap * sizeof *n);
        if (!n) {
            dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory planning tensors");
            return NULL;
        }
        r->items = n;
        r->cap_items = cap;
    }
    opt_item *it = &r->items[r->n_items];
    memset(it, 0, sizeof *it);
    it->name = strdup(name);
    if (!it->name) {
        dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory planning tensors");
        return NULL;
    }
    it->expert = -1;
    r->n_items++;
    return it;
}

static void item_from_tensor(opt_item *it, const dr_tensor *t) {
    it->src = t;
    it->dtype = t->dtype;
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, sizeof it->shape);
    it->nbytes = t->nbytes;
}

static drama_status plan(opt_run *r, drama_error *err) {
    const char *P = r->bb.prefix;
    int L = r->bb.d.n_layers, E = r->bb.d.E, group = 0;
    /* non-expert tensors (and, for keep, the stored tensors of kept per-expert experts) */
    int last_key = -1;
    for (int64_t i = 0; i < dr_ckpt_count(r->ck); i++) {
        const dr_tensor *t = dr_ckpt_at(r->ck, i);
        const char *rest;
        int layer = expert_layer(P, t->name, &rest);
        if (layer >= 0 && layer < L) {
            if (!r->copy_experts) continue;
            char *end;
            long e = strtol(rest, &end, 10);
            if (end == rest || *end != '.' || e < 0 || e >= E) continue; /* not per-expert: bound as fused */
            if (!r->keep[(size_t)layer * E + e]) continue;
            int key = layer * E + (int)e;
            if (key != last_key) group++;
            last_key = key;
            opt_item *it = add_item(r, t->name, err);
            if (!it) return err->code;
            item_from_tensor(it, t);
            it->group = group;
            continue;
        }
        last_key = -1;
        opt_item *it = add_item(r, t->name, err);
        if (!it) return err->code;
        item_from_tensor(it, t);
        it->group = ++group;
        r->rep.tensors_copied++;
    }
    /* experts in (layer, id) order */
    r->exp_layer = malloc((size_t)L * E * sizeof(int));
    r->exp_slot = malloc((size_t)L * E * sizeof(int));
    if (!r->exp_layer || !r->exp_slot) return dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory");
    for (int l = 0; l < L; l++) {
        const dr_bb_moe *m = &r->bb.layers[l].moe;
        for (int k = 0; k < m->n_kept; k++) {
            int e = m->kept[k];
            if (!r->keep[(size_t)l * E + e]) {
                r->rep.experts_dropped++;
                continue;
            }
            r->rep.experts_written++;
            if (r->copy_experts) continue;
            int x = r->n_exp++;
            r->exp_layer[x] = l;
            r->exp_slot[x] = k;
            group++;
            for (int p = 0; p < OPT_NPROJ; p++) {
                int64_t rows = p == 2 ? r->bb.d.H : r->bb.d.I, cols = p == 2 ? r->bb.d.I : r->bb.d.H;
                opt_comp comp[OPT_MAX_COMP];
                const char *why;
                int nc = opt_components(&r->t, rows, cols, comp, &why);
                if (!nc)
                    return dr_fail(err, DRAMA_EUNSUPPORTED, "layer %d expert %d %s [%lld, %lld]: --experts %s: %s", l, e,
                                   opt_proj_names[p], (long long)rows, (long long)cols, dr_opt_format_name(r->t.fmt), why);
                for (int c = 0; c < nc; c++) {
                    char name[768];
                    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%d.%s.%s", P, l, e, opt_proj_names[p],
                             comp[c].suffix);
                    opt_item *it = add_item(r, name, err);
                    if (!it) return err->code;
                    it->expert = x;
                    it->proj = p;
                    it->comp = c;
                    it->group = group;
                    it->dtype = comp[c].dtype;
                    it->ndim = comp[c].ndim;
                    it->shape[0] = comp[c].shape[0];
                    it->shape[1] = comp[c].shape[1];
                    it->nbytes = comp[c].nbytes;
                }
            }
        }
    }
    /* shards: greedy in item order, a group never split */
    uint64_t limit = r->o->shard_size ? r->o->shard_size : (uint64_t)4 << 30, cur = 0;
    int shard = 0;
    for (int64_t i = 0; i < r->n_items;) {
        int64_t j = i;
        uint64_t gsize = 0;
        while (j < r->n_items && r->items[j].group == r->items[i].group) gsize += r->items[j++].nbytes;
        if (cur > 0 && cur + gsize > limit) {
            shard++;
            cur = 0;
        }
        for (int64_t k = i; k < j; k++) r->items[k].shard = shard;
        cur += gsize;
        r->rep.total_size += gsize;
        i = j;
    }
    r->n_shards = r->n_items ? shard + 1 : 0;
    r->rep.shards = r->n_shards;
    r->rep.tensors_written = r->n_items;
    return DRAMA_OK;
}

static void shard_name(const opt_run *r, int s, char *buf, size_t n) {
    snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, r->n_shards);
}

/* ---- writing ---- */

static drama_status write_shards(opt_run *r, dr_pool *pool, drama_error *err) {
    int nslots = pool ? dr_pool_threads(pool) : 1;
    opt_encoder enc;
    memset(&enc, 0, sizeof enc);
    drama_status st = DRAMA_OK;
    int have_enc = !r->copy_experts && r->n_exp > 0;
    if (have_enc && (st = opt_encoder_init(&enc, &r->bb, &r->t, r->check_exact, nslots, pool, err))) {
        opt_encoder_free(&enc);
        return st;
    }
    int batch0 = -1, batch_n = 0;
    int64_t i = 0;
    for (int s = 0; s < r->n_shards && !st; s++) {
        char name[64], path[PATH_MAX];
        shard_name(r, s, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", r->partial, name);
        dr_st_writer *w = NULL;
        if ((st = dr_st_writer_create(path, &w, err))) break;
        st = dr_st_writer_metadata(w, "format", "pt", err);
        int64_t first = i;
        for (; !st && i < r->n_items && r->items[i].shard == s; i++)
            st = dr_st_writer_declare(w, r->items[i].name, r->items[i].dtype, r->items[i].ndim, r->items[i].shape, err);
        for (int64_t k = first; !st && k < i; k++) {
            const opt_item *it = &r->items[k];
            const void *bytes = NULL;
            if (it->src) {
                bytes = it->src->data;
            } else {
                if (batch0 < 0 || it->expert < batch0 || it->expert >= batch0 + batch_n) {
                    batch0 = it->expert;
                    batch_n = r->n_exp - batch0 < enc.nslots ? r->n_exp - batch0 : enc.nslots;
                    if ((st = opt_encoder_run(&enc, r->exp_layer + batch0, r->exp_slot + batch0, batch_n, err))) break;
                    if (!r->o->quiet && isatty(2))
                        fprintf(stderr, "\roptimize: experts %d/%d", batch0 + batch_n, r->n_exp);
                }
                bytes = enc.slots[it->expert - batch0].bytes[it->proj][it->comp];
            }
            if (it->nbytes) st = dr_st_writer_write(w, bytes, it->nbytes, err);
            if (it->src) opt_drop_pages(it->src->data, it->nbytes);
        }
        if (st) {
            dr_st_writer_abort(w);
            break;
        }
        if ((st = dr_st_writer_finish(w, err))) break;
    }
    if (have_enc) opt_encoder_free(&enc);
    if (!r->o->quiet && have_enc && isatty(2)) fprintf(stderr, "\n");
    return st;
}

static int any_pruned(const opt_run *r) {
    int L = r->bb.d.n_layers, E = r->bb.d.E;
    for (int64_t i = 0; i < (int64_t)L * E; i++)
        if (!r->keep[i]) return 1;
    return 0;
}

static drama_status write_index(opt_run *r, drama_error *err) {
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", wm);
    json_object_set_new(meta, "total_size", json_integer((json_int_t)r->rep.total_size));
    if (any_pruned(r)) {
        json_t *de = json_object();
        int L = r->bb.d.n_layers, E = r->bb.d.E;
        for (int l = 0; l < L; l++) {
            json_t *ids = json_array();
            for (int e = 0; e < E; e++)
                if (r->keep[(size_t)l * E + e]) json_array_append_new(ids, json_integer(e));
            char key[16];
            snprintf(key, sizeof key, "%d", l);
            json_object_set_new(de, key, ids);
        }
        json_object_set_new(meta, "drama_experts", de);
    }
    for (int64_t i = 0; i < r->n_items; i++) {
        char name[64];
        shard_name(r, r->items[i].shard, name, sizeof name);
        json_object_set_new(wm, r->items[i].name, json_string(name));
    }
    drama_status st = dump_json(root, r->partial, "model.safetensors.index.json", err);
    json_decref(root);
    return st;
}

/* Modules the quantisation entries exclude: every non-expert weight (FORMATS.md 4.6). */
static json_t *excluded_modules(const char *P, int globs) {
    json_t *a = json_array();
    char embed[300];
    snprintf(embed, sizeof embed, "%sembed_tokens", P);
    json_array_append_new(a, json_string("lm_head"));
    json_array_append_new(a, json_string(embed));
    const char *plain[] = {"self_attn", "linear_attn", "shared_expert", "shared_expert_gate", "mlp.gate",
                           "audio_decoder", "audio_decoder_mtp", "audio_decoder_mtp_shared"};
    const char *glob[] = {"*self_attn*", "*linear_attn*", "*shared_expert*", "*mlp.gate", "audio_decoder*"};
    if (globs)
        for (size_t i = 0; i < sizeof glob / sizeof glob[0]; i++) json_array_append_new(a, json_string(glob[i]));
    else
        for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) json_array_append_new(a, json_string(plain[i]));
    return a;
}

static drama_status write_config(opt_run *r, drama_error *err) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/config.json", r->o->src);
    json_t *cfg;
    drama_status st = dr_read_json_file(p, OPT_CONFIG_MAX_BYTES, 0, &cfg, err);
    if (st) return st;
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return dr_fail(err, DRAMA_EFORMAT, "%s: expected a JSON object", p);
    }
    if (r->o->experts != DR_OPT_KEEP) {
        /* the chosen format's entry replaces the source's, wherever the source had one */
        json_t *tc = json_object_get(cfg, "text_config");
        json_object_del(cfg, "quantization_config");
        json_object_del(cfg, "quantization");
        if (json_is_object(tc)) {
            json_object_del(tc, "quantization_config");
            json_object_del(tc, "quantization");
        }
    }
    json_t *hf = NULL;
    switch (r->o->experts) {
    case DR_OPT_KEEP:
    case DR_OPT_BF16:
        break;
    case DR_OPT_FP8: {
        json_t *q = json_pack("{s:s, s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                              "dynamic", "weight_block_size", 128, 128);
        json_object_set_new(q, "modules_to_not_convert", excluded_modules(r->bb.prefix, 0));
        json_object_set_new(cfg, "quantization_config", q);
        break;
    }
    case DR_OPT_NVFP4: {
        json_t *q = json_pack("{s:s, s:s, s:i, s:n}", "quant_method", "modelopt", "quant_algo", "NVFP4", "group_size",
                              16, "kv_cache_quant_algo");
        json_object_set_new(q, "exclude_modules", excluded_modules(r->bb.prefix, 1));
        json_object_set_new(cfg, "quantization_config", q);
        json_t *hq = json_pack("{s:s, s:n, s:i}", "quant_algo", "NVFP4", "kv_cache_quant_algo", "group_size", 16);
        json_object_set_new(hq, "exclude_modules", excluded_modules(r->bb.prefix, 1));
        hf = json_pack("{s:{s:s, s:s}, s:o}", "producer", "name", "drama optimize", "version", DRAMA_VERSION,
                       "quantization", hq);
        break;
    }
    case DR_OPT_AFFINE: {
        json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", r->t.group, "bits", r->t.bits, "mode", "affine");
        json_object_set_new(cfg, "quantization_config", json_deep_copy(q));
        json_object_set_new(cfg, "quantization", q);
        break;
    }
    }
    st = dump_json(cfg, r->partial, "config.json", err);
    if (!st && hf) st = dump_json(hf, r->partial, "hf_quant_config.json", err);
    json_decref(cfg);
    json_decref(hf);
    return st;
}

/* Side files (tokenizer, template, codec, LICENSE, ...): every regular top-level file that is not
 * a weight shard or something this tool writes itself. */
static int skip_side_file(const opt_run *r, const char *name) {
    static const char *const own[] = {"config.json", "model.safetensors.index.json", "model.safetensors",
                                      DR_MANIFEST_NAME, RECEIPT_NAME, "NOTICE"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(name, own[i])) return 1;
    if (!strcmp(name, "hf_quant_config.json")) return r->o->experts != DR_OPT_KEEP;
    for (int s = 0; s < dr_ckpt_shard_count(r->ck); s++) {
        const char *sp = dr_st_path(dr_ckpt_shard(r->ck, s));
        const char *base = strrchr(sp, '/');
        if (!strcmp(base ? base + 1 : sp, name)) return 1;
    }
    return name[0] == '.';
}

static drama_status copy_side_files(opt_run *r, drama_error *err) {
    DIR *d = opendir(r->o->src);
    if (!d) return dr_fail(err, DRAMA_EIO, "%s: cannot list: %s", r->o->src, strerror(errno));
    struct dirent *de;
    drama_status st = DRAMA_OK;
    while (!st && (de = readdir(d))) {
        if (skip_side_file(r, de->d_name)) continue;
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s", r->o->src, de->d_name);
        struct stat s;
        if (stat(from, &s) != 0 || !S_ISREG(s.st_mode)) continue;
        snprintf(to, sizeof to, "%s/%s", r->partial, de->d_name);
        st = copy_file(from, to, err);
    }
    closedir(d);
    if (st) return st;
    /* NOTICE: the source's, then what was changed */
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/NOTICE", r->o->src);
    snprintf(to, sizeof to, "%s/NOTICE", r->partial);
    struct stat s;
    if (stat(from, &s) == 0 && S_ISREG(s.st_mode) && (st = copy_file(from, to, err))) return st;
    FILE *f = fopen(to, "a");
    if (!f) return dr_fail(err, DRAMA_EIO, "%s: cannot write: %s", to, strerror(errno));
    fprintf(f,
            "\nThe weights in this directory were modified by `drama optimize` (drama.c %s): the routed experts of "
            "the source model were re-encoded as %s",
            DRAMA_VERSION, r->o->experts == DR_OPT_KEEP ? "stored (not re-encoded)" : dr_opt_format_name(r->o->experts));
    if (r->o->experts == DR_OPT_AFFINE) fprintf(f, " (affine, %d bits, group %d)", r->t.bits, r->t.group);
    fprintf(f, "; %lld experts were written and %lld removed (pruned). All other tensors are unchanged. "
               "Settings and the source's file digests are in %s.\n",
            (long long)r->rep.experts_written, (long long)r->rep.experts_dropped, RECEIPT_NAME);
    if (fclose(f) != 0) return dr_fail(err, DRAMA_EIO, "%s: write failed", to);
    return DRAMA_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static drama_status write_manifest(opt_run *r, drama_error *err) {
    DIR *d = opendir(r->partial);
    if (!d) return dr_fail(err, DRAMA_EIO, "%s: cannot list: %s", r->partial, strerror(errno));
    char *names[4096];
    int n = 0;
    struct dirent *de;
    drama_status st = DRAMA_OK;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !strcmp(de->d_name, DR_MANIFEST_NAME) || !strcmp(de->d_name, RECEIPT_NAME)) continue;
        if (n == 4096) {
            st = dr_fail(err, DRAMA_EUNSUPPORTED, "%s: more than 4096 files", r->partial);
            break;
        }
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    if (!st) {
        qsort(names, (size_t)n, sizeof names[0], cmp_str);
        char out[PATH_MAX];
        snprintf(out, sizeof out, "%s/%s", r->partial, DR_MANIFEST_NAME);
        st = dr_manifest_write(r->partial, (const char *const *)names, n, out, err);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    return st;
}

static drama_status write_receipt(opt_run *r, double t0, drama_error *err) {
    const dr_opt_options *o = r->o;
    json_t *in = NULL, *out = NULL;
    drama_status st = dr_receipt_dir_files(o->src, &in, err);
    if (!st) st = dr_receipt_dir_files(r->partial, &out, err);
    if (st) {
        json_decref(in);
        json_decref(out);
        return st;
    }
    r->rep.seconds = dr_clock_s() - t0;
    r->rep.peak_rss = dr_mem_peak_bytes();
    json_t *settings = json_pack("{s:s, s:i, s:i, s:I, s:i}", "experts", dr_opt_format_name(o->experts), "q4_bits",
                                 r->t.bits, "q4_group", r->t.group, "shard_size",
                                 (json_int_t)(o->shard_size ? o->shard_size : (uint64_t)4 << 30), "threads", o->threads);
    json_object_set_new(settings, "prune_experts", o->prune_file ? json_string(o->prune_file) : json_null());
    json_object_set_new(settings, "prune", json_integer(o->prune_k));
    json_object_set_new(settings, "calibration", o->calibration ? json_string(o->calibration) : json_null());
    json_t *counts = json_pack("{s:I, s:I, s:I, s:I, s:i, s:I}", "tensors_copied", (json_int_t)r->rep.tensors_copied,
                               "experts_written", (json_int_t)r->rep.experts_written, "experts_dropped",
                               (json_int_t)r->rep.experts_dropped, "tensors_written", (json_int_t)r->rep.tensors_written,
                               "shards", r->rep.shards, "total_size", (json_int_t)r->rep.total_size);
    json_t *rc = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:f, s:I}", "tool", "drama optimize", "version",
                           DRAMA_VERSION, "source", o->src, "output", o->dst, "settings", settings, "counts", counts,
                           "inputs", in, "outputs", out, "seconds", r->rep.seconds, "peak_rss_bytes",
                           (json_int_t)r->rep.peak_rss);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", r->partial, RECEIPT_NAME);
    st = rc ? dr_receipt_write(p, rc, err) : dr_fail(err, DRAMA_ENOMEM, "optimize: receipt");
    json_decref(rc);
    return st;
}

static drama_status check_options(const dr_opt_options *o, drama_error *err) {
    if (!o->src || !*o->src) return dr_fail(err, DRAMA_EINVAL, "optimize: --model: missing");
    if (!o->dst || !*o->dst) return dr_fail(err, DRAMA_EINVAL, "optimize: --out: missing");
    if (o->experts < DR_OPT_KEEP || o->experts > DR_OPT_AFFINE)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --experts: unknown format %d", (int)o->experts);
    if (o->affine_bits && o->affine_bits != 4 && o->affine_bits != 8)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --q4-bits %d: expected 4 or 8", o->affine_bits);
    if (o->affine_group && o->affine_group != 32 && o->affine_group != 64 && o->affine_group != 128)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --q4-group %d: expected 32, 64 or 128", o->affine_group);
    if (o->prune_file && o->prune_k)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --prune-experts and --prune K exclude each other");
    if (o->prune_k && !o->calibration)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --prune %d needs --calibration ROWS.json", o->prune_k);
    if (o->prune_k < 0) return dr_fail(err, DRAMA_EINVAL, "optimize: --prune %d: must be positive", o->prune_k);
    return DRAMA_OK;
}

drama_status dr_optimize(const dr_opt_options *o, dr_opt_report *report, drama_error *err) {
    double t0 = dr_clock_s();
    dr_mem_peak_reset();
    drama_status st = check_options(o, err);
    if (st) return st;
    int ds = dst_state(o->dst);
    if (ds < 0)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --out %s: exists and is not an empty directory (never overwritten)",
                       o->dst);
    opt_run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    if (snprintf(r.partial, sizeof r.partial, "%s.partial", o->dst) >= (int)sizeof r.partial)
        return dr_fail(err, DRAMA_EINVAL, "optimize: --out: path too long");
    dr_pool *pool = NULL;
    int made_partial = 0;
    if ((st = open_source(&r, err))) goto done;
    int L = r.bb.d.n_layers, E = r.bb.d.E;
    r.keep = calloc((size_t)L * E, 1);
    if (!r.keep) {
        st = dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory");
        goto done;
    }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < r.bb.layers[l].moe.n_kept; k++) r.keep[(size_t)l * E + r.bb.layers[l].moe.kept[k]] = 1;
    pool = dr_pool_create(o->threads);
    if (!pool) {
        st = dr_fail(err, DRAMA_ENOMEM, "optimize: cannot start threads");
        goto done;
    }
    if (o->prune_file && (st = opt_keep_from_file(o->prune_file, &r.bb, r.keep, err))) goto done;
    if (o->prune_k && (st = opt_keep_from_calibration(o->calibration, o->prune_k, r.cfg, &r.bb, pool, r.keep, err))) goto done;
    if ((st = choose_target(&r, err)) || (st = plan(&r, err))) goto done;
    /* a stale DST.partial is what a killed run left behind: ours to remove */
    if ((st = rm_tree(r.partial, err))) goto done;
    if (mkdir(r.partial, 0777) != 0) {
        st = dr_fail(err, DRAMA_EIO, "%s: cannot create: %s", r.partial, strerror(errno));
        goto done;
    }
    made_partial = 1;
    if ((st = write_shards(&r, pool, err)) || (st = write_index(&r, err)) || (st = write_config(&r, err)) ||
        (st = copy_side_files(&r, err)) || (st = write_manifest(&r, err)) || (st = write_receipt(&r, t0, err)))
        goto done;
    if (ds == 0 && rmdir(o->dst) != 0) {
        st = dr_fail(err, DRAMA_EIO, "%s: cannot replace the empty directory: %s", o->dst, strerror(errno));
        goto done;
    }
    if (rename(r.partial, o->dst) != 0) {
        st = dr_fail(err, DRAMA_EIO, "%s -> %s: rename failed: %s", r.partial, o->dst, strerror(errno));
        goto done;
    }
    made_partial = 0;
    if (report) *report = r.rep;
done:
    if (made_partial) rm_tree(r.partial, NULL);
    dr_pool_free(pool);
    for (int64_t i = 0; i < r.n_items; i++) free(r.items[i].name);
    free(r.items);
    free(r.exp_layer);
    free(r.exp_slot);
    free(r.keep);
    if (r.bb_bound) dr_backbone_release(&r.bb);
    dr_loader_free(r.ld);
    dr_ckpt_close(r.ck);
    dr_config_free(r.cfg);
    return st;
}
