/* inspect_parts.c - the manifest, tokenizer and codec sections of `drama inspect`. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/sha256.h"
#include "codec/codec.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "io/torchzip.h"
#include "text/tokenizer.h"
#include "tools/inspect.h"
#include "tools/inspect_internal.h"

static const char *const k_specials[] = {
    "<|endoftext|>", "<|pad|>",  "<|im_start|>",   "<|im_end|>",     "<|phoneme_start|>", "<|phoneme_end|>",
    "<|text|>",      "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>",     "<|audio_pad|>",
};

/* The split patterns TEXT.md 1.3 knows (as stored in tokenizer.json). */
static const char *pattern_kind(const char *p) {
    if (!p) return "none";
    if (strstr(p, "[\\p{L}\\p{M}]+")) return "Qwen3.5";
    if (strstr(p, "\\p{L}+|\\p{N}|")) return "Qwen2/Qwen3";
    return "other";
}

void ins_tokens(const char *dir, const dr_config *cfg, FILE *out, ins_report *r, dr_tok_info *info) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    fprintf(out, "## tokenizer\n\n");
    dr_tok *tok = NULL;
    drama_error e = {0};
    if (dr_tok_load(path, &tok, &e)) {
        fprintf(out, "(not loaded)\n\n");
        ins_problem(r, 1, "tokenizer: %s", e.message);
        return;
    }
    fprintf(out, "- %lld vocabulary entries, %lld merges, %lld added tokens, ids 0..%lld; split pattern: %s\n",
            (long long)dr_tok_n_vocab(tok), (long long)dr_tok_n_merges(tok), (long long)dr_tok_n_added(tok),
            (long long)dr_tok_vocab_size(tok) - 1, pattern_kind(dr_tok_split_pattern(tok)));
    fprintf(out, "- special tokens:");
    for (size_t i = 0; i < sizeof k_specials / sizeof k_specials[0]; i++) {
        int32_t id = dr_tok_id(tok, k_specials[i]);
        if (id >= 0) fprintf(out, " %s=%d", k_specials[i], id);
        else fprintf(out, " %s=absent", k_specials[i]);
    }
    fprintf(out, "\n");

    const char *end_name = cfg && cfg->sw.end_token ? cfg->sw.end_token : "<|im_end|>";
    int64_t V = cfg && cfg->audio.vocab_size > 0 ? cfg->audio.vocab_size : 4096;
    int32_t end = dr_tok_id(tok, end_name), S = dr_tok_id(tok, "<|semantic:0|>");
    fprintf(out, "- end token (switch end_token) %s = %d\n", end_name, end);
    if (end < 0) ins_problem(r, 1, "tokenizer: end token %s (switch end_token) is not in tokenizer.json", end_name);
    int contiguous = S >= 0;
    char name[64];
    if (S < 0) ins_problem(r, 1, "tokenizer: <|semantic:0|> is not in tokenizer.json");
    for (int64_t i = 1; contiguous && i < V; i++) {
        snprintf(name, sizeof name, "<|semantic:%lld|>", (long long)i);
        int32_t id = dr_tok_id(tok, name);
        if (id != S + i) {
            contiguous = 0;
            ins_problem(r, 1, "tokenizer: %s has id %d, expected %lld (semantic block must be contiguous)", name, id,
                        (long long)(S + i));
        }
    }
    if (S >= 0)
        fprintf(out, "- semantic block: <|semantic:0|> .. <|semantic:%lld|> = %d .. %lld (%s)\n", (long long)(V - 1), S,
                (long long)(S + V - 1), contiguous ? "contiguous" : "NOT contiguous");
    /* speaker tags: added tokens (golden layout) or plain text split by BPE (S2-Pro) */
    int n_spk = 0, n_spk_added = 0, first_spk = -1;
    for (int i = 0; i < 4096; i++) {
        snprintf(name, sizeof name, "<|speaker:%d|>", i);
        int32_t id = dr_tok_id(tok, name);
        if (id < 0) break;
        if (!i) first_spk = id;
        n_spk++;
    }
    for (int64_t i = 0; i < dr_tok_n_added(tok); i++) {
        const char *content;
        int32_t id;
        int special;
        dr_tok_added_at(tok, i, &content, &id, &special);
        n_spk_added += !strncmp(content, "<|speaker:", 10);
    }
    if (n_spk)
        fprintf(out, "- speaker tags: <|speaker:0..%d|> = %d .. (%d of them added tokens)\n", n_spk - 1, first_spk,
                n_spk_added);
    else
        fprintf(out, "- speaker tags: not tokens (plain text, split by BPE)\n");

    if (cfg) {
        /* the engine's own cross-check (MODEL.md 3.4) */
        if (S >= 0 && end >= 0 && contiguous) {
            int eos_warning = 0;
            e = (drama_error){0};
            if (dr_config_check_token_ids(cfg, S, V, end, &eos_warning, &e)) ins_problem(r, 1, "tokens: %s", e.message);
            if (eos_warning)
                ins_problem(r, 0, "config.json eos_token_id does not contain the end token %s (%d); switch end_token decides",
                            end_name, end);
        }
        if (dr_tok_vocab_size(tok) > cfg->text.vocab_size)
            ins_problem(r, 1, "tokenizer.json uses ids up to %lld but text_config.vocab_size is %lld",
                        (long long)dr_tok_vocab_size(tok) - 1, (long long)cfg->text.vocab_size);
    }
    info->ok = S >= 0 && end >= 0 && contiguous;
    info->semantic_start = S;
    info->n_semantic = V;
    info->end_id = end;
    fprintf(out, "\n");
    dr_tok_free(tok);
}

/* ---- codec ---- */

/* One spelling for both weight-norm styles and no "generator." prefix, for comparing names. */
static void canonical(const char *in, char *out, size_t cap) {
    if (!strncmp(in, "generator.", 10)) in += 10;
    snprintf(out, cap, "%s", in);
    size_t n = strlen(out);
    if (n > 9 && !strcmp(out + n - 9, ".weight_g")) snprintf(out + n - 9, cap - (n - 9), ".parametrizations.weight.original0");
    else if (n > 9 && !strcmp(out + n - 9, ".weight_v")) snprintf(out + n - 9, cap - (n - 9), ".parametrizations.weight.original1");
}

typedef struct exp_list {
    int n, cap;
    char **names;
} exp_list;

static void collect_expected(void *ctx, const char *name, int ndim, const int64_t *shape) {
    (void)ndim;
    (void)shape;
    exp_list *l = ctx;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 512;
        char **nn = realloc(l->names, (size_t)cap * sizeof *nn);
        if (!nn) return;
        l->names = nn;
        l->cap = cap;
    }
    char buf[512];
    canonical(name, buf, sizeof buf);
    if ((l->names[l->n] = strdup(buf))) l->n++;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void ins_codec(const char *dir, FILE *out, ins_report *r) {
    char pth[PATH_MAX], sft[PATH_MAX], js[PATH_MAX];
    struct stat st;
    snprintf(pth, sizeof pth, "%s/codec.pth", dir);
    snprintf(sft, sizeof sft, "%s/codec.safetensors", dir);
    snprintf(js, sizeof js, "%s/codec.json", dir);
    fprintf(out, "## codec\n\n");
    int has_pth = stat(pth, &st) == 0, has_st = stat(sft, &st) == 0;
    if (!has_pth && !has_st) {
        fprintf(out, "(no codec.pth or codec.safetensors)\n\n");
        ins_problem(r, 0, "codec: no codec.pth or codec.safetensors in %s (synthesis needs one)", dir);
        return;
    }
    dr_pth *p = NULL;
    dr_st_file *sf = NULL;
    drama_error e = {0};
    const char *label = has_pth ? pth : sft;
    if (has_pth ? dr_pth_open(pth, &p, &e) : dr_st_open(sft, &sf, &e)) {
        fprintf(out, "(not readable)\n\n");
        ins_problem(r, 1, "codec: %s", e.message);
        return;
    }
    int64_t n = p ? dr_pth_count(p) : dr_st_count(sf);
    dr_tensor *ts = calloc((size_t)(n > 0 ? n : 1), sizeof *ts);
    dr_fold_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof *items);
    exp_list ex = {0};
    if (!ts || !items) {
        ins_problem(r, 1, "codec: out of memory");
        goto done;
    }
    int64_t params = 0;
    for (int64_t i = 0; i < n; i++) {
        ts[i] = *(p ? dr_pth_at(p, i) : dr_st_at(sf, i));
        items[i] = (dr_fold_item){ts[i].name, dr_dtype_name(ts[i].dtype), ts[i].ndim, ts[i].shape, NULL, ts[i].nbytes};
        params += dr_tensor_numel(&ts[i]);
    }
    fprintf(out, "- %s: %lld entries, %lld values%s%s\n- codec.json: %s\n\n", label, (long long)n, (long long)params,
            has_pth && has_st ? " (codec.safetensors also present; codec.pth is used)" : "",
            p ? "" : "", stat(js, &st) == 0 ? "present" : "absent (built-in real-codec defaults)");
    dr_fold_print(out, items, n);
    fprintf(out, "\n");

    dr_codec_config cfg;
    dr_codec_config_default(&cfg);
    e = (drama_error){0};
    if (stat(js, &st) == 0 && dr_codec_config_read(js, &cfg, &e)) {
        ins_problem(r, 1, "codec: %s", e.message);
        goto done;
    }
    dr_codec *codec = NULL;
    e = (drama_error){0};
    if (dr_codec_load(ts, n, &cfg, 0 /* check names and shapes, copy nothing */, label, &codec, &e)) {
        ins_problem(r, 1, "codec: %s", e.message);
        goto done;
    }
    /* Loaded: list entries the loader skipped (stale buffers) against the expected inventory. */
    e = (drama_error){0};
    if (dr_codec_expected(dr_codec_cfg(codec), collect_expected, &ex, &e) == DRAMA_OK && ex.n > 0) {
        qsort(ex.names, (size_t)ex.n, sizeof *ex.names, cmp_str);
        int ignored = 0;
        char buf[512];
        for (int64_t i = 0; i < n; i++) {
            canonical(ts[i].name, buf, sizeof buf);
            const char *key = buf;
            if (!bsearch(&key, ex.names, (size_t)ex.n, sizeof *ex.names, cmp_str)) {
                fprintf(out, "- ignored: %s (not part of the model; skipped by the loader)\n", ts[i].name);
                ignored++;
            }
        }
        fprintf(out, "- codec loads: %d expected tensors, %d ignored entries\n\n", ex.n, ignored);
    }
    dr_codec_free(codec);
done:
    for (int i = 0; i < ex.n; i++) free(ex.names[i]);
    free(ex.names);
    free(ts);
    free(items);
    dr_pth_close(p);
    dr_st_close(sf);
}

/* ---- manifest (FORMATS.md 7): verified before anything is parsed ---- */

typedef struct ins_manifest_ctx {
    FILE *out;
    ins_report *r;
} ins_manifest_ctx;

static void manifest_finding(const dr_manifest_finding *f, void *user) {
    ins_manifest_ctx *c = user;
    if (!strcmp(f->kind, "ok")) {
        fprintf(c->out, "- ok: %s%s\n", f->file->path, f->from_cache ? " (cached digest)" : "");
    } else if (!strcmp(f->kind, "missing")) {
        fprintf(c->out, "- MISSING: %s\n", f->file->path);
        ins_problem(c->r, 1, "manifest: %s is listed but missing", f->file->path);
    } else if (!strcmp(f->kind, "size")) {
        fprintf(c->out, "- SIZE: %s: %llu bytes, manifest says %llu\n", f->file->path,
                (unsigned long long)f->actual_size, (unsigned long long)f->file->size);
        ins_problem(c->r, 1, "manifest: %s: size %llu, expected %llu", f->file->path,
                    (unsigned long long)f->actual_size, (unsigned long long)f->file->size);
    } else {
        fprintf(c->out, "- MISMATCH: %s: sha256 %s, manifest says %s\n", f->file->path, f->actual_sha256,
                f->file->sha256);
        ins_problem(c->r, 1, "manifest: %s: SHA-256 mismatch: expected %s, actual %s", f->file->path,
                    f->file->sha256, f->actual_sha256);
    }
}

int ins_manifest(const char *dir, FILE *out, ins_report *r) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, DR_MANIFEST_NAME);
    struct stat sb;
    if (stat(path, &sb) != 0) return 1; /* no manifest: nothing to verify */
    fprintf(out, "## manifest\n\n");
    dr_manifest *m = NULL;
    drama_error e = {0};
    if (dr_manifest_load(path, &m, &e)) {
        fprintf(out, "- unreadable\n\n");
        ins_problem(r, 1, "manifest: %s", e.message);
        return 0;
    }
    char cache[PATH_MAX];
    const char *cache_path = dr_sha256_default_cache(cache, sizeof cache) ? cache : NULL;
    ins_manifest_ctx ctx = {out, r};
    e = (drama_error){0};
    drama_status st = dr_manifest_verify(m, dir, cache_path, manifest_finding, &ctx, &e);
    if (st && st != DRAMA_EHASH) ins_problem(r, 1, "manifest: %s", e.message); /* a read error */
    /* Files present but not listed are "unverified" (FORMATS.md 7 rule 3): a warning. */
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char fp[PATH_MAX];
        snprintf(fp, sizeof fp, "%s/%s", dir, de->d_name);
        if (de->d_name[0] == '.' || !strcmp(de->d_name, DR_MANIFEST_NAME) || stat(fp, &sb) != 0 ||
            !S_ISREG(sb.st_mode) || dr_manifest_find(m, de->d_name))
            continue;
        fprintf(out, "- unverified: %s (not in the manifest)\n", de->d_name);
        ins_problem(r, 0, "manifest: %s is not listed (unverified)", de->d_name);
    }
    if (d) closedir(d);
    fprintf(out, "\n");
    dr_manifest_free(m);
    return st == DRAMA_OK;
}
