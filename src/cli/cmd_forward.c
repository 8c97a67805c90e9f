/* cmd_forward.c - `drama forward --model DIR --rows ROWS.json --dump OUT.safetensors
 *                 [--threads N] [--set name=value]... [--trace]`
 *
 * Runs the backbone alone: the first K rows of ROWS.json ({"rows": [[token, c0..c9], ...],
 * "prefill": K}) as one prefill call, every later row as one decode step. Dumps, per row,
 *   hidden  F32 [rows, H]          final-normed hidden
 *   logits  F32 [rows, n_sem + 1]  restricted logits: semantic 0..n_sem-1, then the end token
 * and with --trace also embeds F32 [rows, H] and layer_out F32 [layers, rows, H] (residual
 * stream after each layer). --nll prints the teacher-forced semantic negative log-likelihood of
 * every audio row under the previous row's restricted logits (MODEL.md 11 step 2: low and flat on a
 * real reference clip when the switches are right) and dumps it as nll F32 [rows] (row r: the NLL
 * of row r+1's semantic token; -1 where row r+1 is not an audio row). Token ids come from tokenizer.json (MODEL.md 3.4). This interface is
 * what reference dumps are compared with; keep it stable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/pool.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "io/checkpoint.h"
#include "io/rows_json.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/loader.h"
#include "model/state.h"
#include "model/upload.h"
#include "text/prompt.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: drama forward --model DIR --rows ROWS.json --dump OUT.safetensors [--threads N]\n"
               "                     [--backend cpu|cuda|auto] [--device N] [--set name=value]... [--trace] [--nll]\n\n"
               "Runs the backbone over ROWS.json (first \"prefill\" rows in one call, then one decode step\n"
               "per row) and writes hidden [rows, H] and logits [rows, n_semantic + 1] (end token last).\n"
               "--trace adds embeds [rows, H] and layer_out [layers, rows, H].\n"
               "--nll prints the semantic NLL of each audio row given the previous row and dumps nll [rows].\n");
}

typedef struct fwd {
    dr_config *cfg;
    dr_tok *tok;
    dr_ckpt *ck;
    dr_loader *ld;
    dr_backbone bb;
    int bound;
} fwd;

static void fwd_close(fwd *f) {
    if (f->bound) dr_backbone_release(&f->bb);
    dr_loader_free(f->ld);
    dr_ckpt_close(f->ck);
    dr_tok_free(f->tok);
    dr_config_free(f->cfg);
}

static drama_status fwd_open(fwd *f, const char *dir, const char *const *sets, int n_sets, drama_error *err) {
    memset(f, 0, sizeof *f);
    char path[4096];
    drama_status st = dr_config_load(dir, sets, n_sets, &f->cfg, err);
    if (st) return st;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((st = dr_tok_load(path, &f->tok, err))) return st;
    if ((st = dr_ckpt_open(dir, &f->ck, err))) return st;
    if ((st = dr_loader_create(f->ck, f->cfg, &f->ld, err))) return st;
    if ((st = dr_backbone_bind(&f->bb, f->ld, err))) return st;
    f->bound = 1;
    /* The tower is not bound here, so only fatal findings count (no "unexpected" pass). */
    dr_findings *fs = dr_loader_findings(f->ld);
    if (dr_findings_fatal(fs, 0)) {
        dr_findings_print(fs, stderr);
        return dr_findings_check(fs, 0, err);
    }
    dr_prompt_ids ids;
    if ((st = dr_prompt_resolve_ids(f->tok, &ids, err))) return st;
    int32_t end_id = dr_tok_id(f->tok, f->cfg->sw.end_token);
    if (end_id < 0)
        return dr_fail(err, DRAMA_EFORMAT, "tokenizer: end token \"%s\" (switch end_token) is missing",
                       f->cfg->sw.end_token);
    int eos_warn = 0;
    if ((st = dr_config_check_token_ids(f->cfg, ids.semantic_start, ids.n_semantic, end_id, &eos_warn, err))) return st;
    if (eos_warn)
        fprintf(stderr, "drama forward: warning: config.json eos_token_id does not contain the end token %d (%s)\n", end_id,
                f->cfg->sw.end_token);
    return dr_backbone_set_tokens(&f->bb, ids.semantic_start, ids.n_semantic, end_id, err);
}

/* nll[r] = -log softmax(logits[r])[next semantic index] for audio rows r+1, else -1. Returns the count. */
static int64_t semantic_nll(const fwd *f, const dr_rows *rows, const float *logits, float *nll, double *mean,
                            double *worst, int64_t *worst_row) {
    int64_t n = rows->n_rows, nl = dr_backbone_n_logits(&f->bb), cnt = 0;
    double sum = 0;
    *worst = 0;
    *worst_row = -1;
    for (int64_t r = 0; r < n; r++) {
        nll[r] = -1.0f;
        if (r + 1 >= n) continue;
        int64_t t = rows->data[(r + 1) * rows->n_cols] - f->bb.sem_start;
        if (t < 0 || t >= f->bb.n_sem) continue;
        const float *l = logits + r * nl;
        double mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < nl; j++) mx = l[j] > mx ? l[j] : mx;
        for (int64_t j = 0; j < nl; j++) se += exp((double)l[j] - mx);
        double v = mx + log(se) - (double)l[t];
        nll[r] = (float)v;
        sum += v;
        cnt++;
        if (v > *worst) {
            *worst = v;
            *worst_row = r + 1;
        }
    }
    *mean = cnt ? sum / (double)cnt : 0.0;
    return cnt;
}

static drama_status write_dump(const char *path, const fwd *f, int64_t rows, int64_t prefill, const float *hidden,
                               const float *logits, const float *embeds, const float *layer_out, const float *nll,
                               drama_error *err) {
    int64_t H = f->bb.d.H, nl = dr_backbone_n_logits(&f->bb), L = f->bb.d.n_layers;
    dr_st_writer *w = NULL;
    drama_status st = dr_st_writer_create(path, &w, err);
    if (st) return st;
    char buf[64];
    snprintf(buf, sizeof buf, "%lld", (long long)prefill);
    int64_t sh[3] = {rows, H, 0}, shl[2] = {rows, nl}, sht[3] = {L, rows, H};
    if (!st) st = dr_st_writer_metadata(w, "producer", "drama forward", err);
    if (!st) st = dr_st_writer_metadata(w, "prefill", buf, err);
    snprintf(buf, sizeof buf, "%lld", (long long)f->bb.sem_start);
    if (!st) st = dr_st_writer_metadata(w, "semantic_start", buf, err);
    snprintf(buf, sizeof buf, "%lld", (long long)f->bb.end_id);
    if (!st) st = dr_st_writer_metadata(w, "end_id", buf, err);
    if (!st) st = dr_st_writer_declare(w, "hidden", DR_DT_F32, 2, sh, err);
    if (!st) st = dr_st_writer_declare(w, "logits", DR_DT_F32, 2, shl, err);
    if (!st && embeds) st = dr_st_writer_declare(w, "embeds", DR_DT_F32, 2, sh, err);
    if (!st && layer_out) st = dr_st_writer_declare(w, "layer_out", DR_DT_F32, 3, sht, err);
    if (!st && nll) st = dr_st_writer_declare(w, "nll", DR_DT_F32, 1, sh, err);
    if (!st) st = dr_st_writer_write(w, hidden, (size_t)(rows * H) * sizeof(float), err);
    if (!st) st = dr_st_writer_write(w, logits, (size_t)(rows * nl) * sizeof(float), err);
    if (!st && embeds) st = dr_st_writer_write(w, embeds, (size_t)(rows * H) * sizeof(float), err);
    if (!st && layer_out) st = dr_st_writer_write(w, layer_out, (size_t)(L * rows * H) * sizeof(float), err);
    if (!st && nll) st = dr_st_writer_write(w, nll, (size_t)rows * sizeof(float), err);
    if (st) {
        dr_st_writer_abort(w);
        return st;
    }
    return dr_st_writer_finish(w, err);
}

int cmd_forward(int argc, char **argv) {
    const char *dir = NULL, *rows_path = NULL, *dump = NULL;
    int threads = 0, trace = 0, n_sets = 0, want_nll = 0, b;
    dr_backend_choice backend = {DR_WANT_AUTO, 0};
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) return DR_EXIT_ERROR;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(sets);
            return DR_EXIT_OK;
        } else if (!strcmp(a, "--model") && has) dir = argv[++i];
        else if (!strcmp(a, "--rows") && has) rows_path = argv[++i];
        else if (!strcmp(a, "--dump") && has) dump = argv[++i];
        else if (!strcmp(a, "--set") && has) sets[n_sets++] = argv[++i];
        else if (!strcmp(a, "--trace")) trace = 1;
        else if ((b = dr_cli_backend_arg("forward", argc, argv, &i, &backend)) != 0) {
            if (b < 0) {
                free(sets);
                return DR_EXIT_USAGE;
            }
        }
        else if (!strcmp(a, "--nll")) want_nll = 1;
        else if (!strcmp(a, "--threads") && has) {
            long long t;
            if (!dr_cli_int("forward", a, argv[++i], 0, 1024, &t)) {
                free(sets);
                return DR_EXIT_USAGE;
            }
            threads = (int)t;
        } else {
            fprintf(stderr, "drama forward: unexpected argument '%s'\n", a);
            usage(stderr);
            free(sets);
            return DR_EXIT_USAGE;
        }
    }
    if (!dir || !rows_path || !dump) {
        usage(stderr);
        free(sets);
        return DR_EXIT_USAGE;
    }
    drama_error err = {0};
    fwd f;
    dr_rows rows = {0};
    dr_pool *pool = NULL;
    dr_bb_state *st = NULL;
    dr_backend *be = NULL;
    float *hidden = NULL, *logits = NULL, *embeds = NULL, *layer_out = NULL, *step_layers = NULL, *nll = NULL;
    int rc = DR_EXIT_ERROR;
    if (fwd_open(&f, dir, sets, n_sets, &err)) {
        dr_error_prefix(&err, "%s: ", dir);
        goto out;
    }
    int width = dr_backbone_row_width(&f.bb);
    if (dr_rows_read(rows_path, width, &rows, &err)) goto out;
    int64_t n = rows.n_rows, K = rows.prefill, H = f.bb.d.H, nl = dr_backbone_n_logits(&f.bb), L = f.bb.d.n_layers;
    if (n == 0) { /* an empty dump would look like a successful run */
        dr_fail(&err, DRAMA_EFORMAT, "%s: \"rows\" is empty: nothing to run", rows_path);
        goto out;
    }
    pool = dr_pool_create(threads);
    if (!pool) {
        dr_fail(&err, DRAMA_ENOMEM, "cannot start threads");
        goto out;
    }
    if (dr_backend_open(&backend, pool, &be, &err) || dr_model_upload(be, &f.bb, NULL, &err) ||
        dr_bb_state_create_on(be, &f.bb, n, &st, &err))
        goto out;
    hidden = dr_calloc((size_t)(n > 0 ? n : 1) * (size_t)H, sizeof(float));
    logits = dr_calloc((size_t)(n > 0 ? n : 1) * (size_t)nl, sizeof(float));
    if (trace) {
        embeds = dr_calloc((size_t)(n > 0 ? n : 1) * (size_t)H, sizeof(float));
        layer_out = dr_calloc((size_t)L * (size_t)(n > 0 ? n : 1) * (size_t)H, sizeof(float));
        step_layers = dr_calloc((size_t)L * (size_t)(K > 1 ? K : 1) * (size_t)H, sizeof(float));
    }
    if (!hidden || !logits || (trace && (!embeds || !layer_out || !step_layers))) {
        dr_fail(&err, DRAMA_ENOMEM, "out of memory for %lld rows", (long long)n);
        goto out;
    }
    /* one prefill call, then one step per row; a call of m rows at row r0 */
    for (int64_t r0 = 0; r0 < n;) {
        int64_t m = (r0 == 0 && K > 0) ? K : 1;
        dr_bb_trace tr = {trace ? embeds + r0 * H : NULL, trace ? step_layers : NULL, NULL};
        if (dr_backbone_forward(&f.bb, st, rows.data + r0 * width, m, hidden + r0 * H, logits + r0 * nl,
                                trace ? &tr : NULL, pool, &err)) {
            if (m == 1) /* the backbone numbers rows within its call: name the file's row */
                dr_error_prefix(&err, "%s: rows[%lld] (decode step): ", rows_path, (long long)r0);
            else
                dr_error_prefix(&err, "%s: prefill rows[0..%lld] (row numbers below count from 0): ", rows_path,
                                (long long)(m - 1));
            goto out;
        }
        if (trace)
            for (int64_t l = 0; l < L; l++)
                memcpy(layer_out + (l * n + r0) * H, step_layers + l * m * H, (size_t)(m * H) * sizeof(float));
        r0 += m;
    }
    if (want_nll) {
        nll = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        if (!nll) {
            dr_fail(&err, DRAMA_ENOMEM, "out of memory");
            goto out;
        }
        double mean, worst;
        int64_t worst_row;
        int64_t cnt = semantic_nll(&f, &rows, logits, nll, &mean, &worst, &worst_row);
        printf("semantic NLL over %lld audio rows: mean %.4f nats", (long long)cnt, mean);
        if (cnt) printf(", max %.4f at row %lld", worst, (long long)worst_row);
        printf("\n");
    }
    if (write_dump(dump, &f, n, K, hidden, logits, embeds, layer_out, nll, &err)) goto out;
    rc = DR_EXIT_OK;
out:
    if (rc != DR_EXIT_OK) fprintf(stderr, "drama forward: %s\n", err.message);
    dr_free(hidden);
    dr_free(logits);
    dr_free(embeds);
    dr_free(layer_out);
    dr_free(step_layers);
    free(nll);
    dr_bb_state_free(st);
    dr_backend_free(be);
    dr_pool_free(pool);
    dr_rows_free(&rows);
    fwd_close(&f);
    free(sets);
    return rc;
}
