/* cmd_generate.c - `drama generate`: prefill ROWS.json and generate frames into CODES.json, the
 * bring-up and test entry point of the frame loop (docs/generation.md).
 *
 *   drama generate --model DIR --rows ROWS.json [--frames N] --codes-out CODES.json
 *       [--seed S] [--temperature T] [--top-p P] [--semantic-top-k K] [--acoustic-top-k K]
 *       [--ras-window W] [--ras-temperature T] [--ras-top-p P] [--frame-cap N]
 *       [--cfg-gamma G --uncond-rows U.json] [--cfg-mode paired|separate]
 *       [--threads N] [--set name=value]... [--score] [--dump FILE.safetensors]
 *
 * --score prints the tower's teacher-forced negative log-likelihood of the prompt's audio rows
 * (codebooks 1..9, MODEL.md 11 step 3) as one JSON line on stdout; without --frames it stops
 * there (no generation, --codes-out optional). Compare tower switch settings with it.
 *
 * The first "prefill" rows of ROWS.json are one prefill call (0: the first row); later rows are
 * appended one call each, to both states when guided (U.json's rows after its own "prefill"
 * pair with them one to one). The prompt has a reference when any row of ROWS.json is audio.
 * --frames N asks for exactly N frames (fewer if the end token comes first); without it
 * the run ends at the end token or fails at the frame cap. CODES.json is written through a
 * temporary file and renamed only on success: a failed or interrupted run publishes nothing. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/cli_args.h"
#include "cli/commands.h"
#include "gen/frameloop.h"
#include "gen/session.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "io/safetensors.h"

static volatile sig_atomic_t g_interrupted;

static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama generate --model DIR --rows ROWS.json [--frames N] --codes-out CODES.json [options]\n"
            "  --frames N            exactly N frames (fewer if the end token comes first); default: until the\n"
            "                        end token, failing at the frame cap\n"
            "  --seed S              64-bit seed (negative: two's complement); default: drawn and printed\n"
            "  --temperature T       0..2, default 1 (0 = argmax for every draw)\n"
            "  --top-p P             (0, 1], default 0.9\n"
            "  --semantic-top-k K    0..4097, default 0 (off)\n"
            "  --acoustic-top-k K    0..1024, default 30\n"
            "  --ras-window W        0..64, default 10 (0 disables the repetition-aware redraw)\n"
            "  --ras-temperature T   (0, 2], default 1\n"
            "  --ras-top-p P         (0, 1], default 0.9\n"
            "  --frame-cap N         >= 1, default 750 (or N of --frames when larger)\n"
            "  --cfg-gamma G         0..5, default 0; needs --uncond-rows when the prompt has a reference\n"
            "  --uncond-rows U.json  the same prompt without the reference (guidance's second state); its rows\n"
            "                        after its \"prefill\" pair one to one with those of ROWS.json\n"
            "  --cfg-mode M          paired (one batched step, default) or separate\n"
            "  --draw-base F         semantic draws made earlier in the request (default 0)\n"
            "  --threads N           worker threads (default: physical cores)\n"
            "  --backend B           cpu | cuda | auto (default auto: CUDA when a usable GPU is present)\n"
            "  --device N            GPU index for cuda (default 0)\n"
            "  --set name=value      engine switch override (repeatable)\n"
            "  --dump FILE           also write frames, sem_logits, hidden, head_logits (safetensors, the\n"
            "                        layout of the golden e2e files)\n"
            "  --score               print the tower's teacher-forced NLL of the prompt's audio rows (JSON);\n"
            "                        without --frames nothing is generated\n"
            "exit status: 0 ok, 1 error, 2 usage, 3 frame limit reached, 130 interrupted\n");
}

static int parse_double(const char *flag, const char *v, double *out) {
    return dr_cli_num("generate", flag, v, -HUGE_VAL, HUGE_VAL, 0, out);
}

static int parse_int(const char *flag, const char *v, long long lo, long long hi, long long *out) {
    return dr_cli_int("generate", flag, v, lo, hi, out);
}

static int parse_seed(const char *v, uint64_t *out) { return dr_cli_seed("generate", "--seed", v, out); }

typedef struct collect {
    int32_t *codes;
    int64_t n, cap;
    int nc;
    /* --dump: per frame the logits of the draw, the hidden after the frame, the head logits */
    dr_gen_session *s;
    int dump;
    int64_t nl, H, nh; /* widths: semantic candidates, hidden, head logits of one frame */
    float *sem, *hid, *heads;
} collect;

static int grow(void **p, int64_t count, int64_t width, size_t elem) {
    void *q = realloc(*p, (size_t)count * (size_t)width * elem);
    if (!q) return 0;
    *p = q;
    return 1;
}

static int on_frame(void *ctx, int64_t index, const int32_t *frame) {
    collect *c = ctx;
    (void)index;
    if (c->n == c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 64;
        if (!grow((void **)&c->codes, cap, c->nc, sizeof(int32_t))) return 1;
        if (c->dump && (!grow((void **)&c->sem, cap, c->nl, sizeof(float)) ||
                        !grow((void **)&c->hid, cap + 1, c->H, sizeof(float)) ||
                        !grow((void **)&c->heads, cap, c->nh, sizeof(float))))
            return 1;
        c->cap = cap;
    }
    memcpy(c->codes + c->n * c->nc, frame, (size_t)c->nc * sizeof(int32_t));
    if (c->dump) {
        memcpy(c->sem + c->n * c->nl, dr_gen_last_logits(c->s), (size_t)c->nl * sizeof(float));
        memcpy(c->heads + c->n * c->nh, dr_gen_last_head_logits(c->s), (size_t)c->nh * sizeof(float));
        memcpy(c->hid + (c->n + 1) * c->H, dr_gen_pending_hidden(c->s), (size_t)c->H * sizeof(float));
    }
    c->n++;
    return g_interrupted != 0;
}

/* The golden e2e layout: frames [F, NC], sem_logits [F, n_candidates], hidden [F+1, H] (index 0:
 * the last prompt row), head_logits [F, NC-1, head_vocab]. */
static drama_status write_dump(const char *path, const collect *c, drama_error *err) {
    dr_st_writer *w;
    drama_status st = dr_st_writer_create(path, &w, err);
    if (st) return st;
    int64_t s1[2] = {c->n, c->nc}, s2[2] = {c->n, c->nl}, s3[2] = {c->n + 1, c->H}, s4[3] = {c->n, c->nc - 1, 0};
    s4[2] = c->nc > 1 ? c->nh / (c->nc - 1) : 0;
    if (!st) st = dr_st_writer_metadata(w, "producer", "drama generate --dump", err);
    if (!st) st = dr_st_writer_declare(w, "frames", DR_DT_I32, 2, s1, err);
    if (!st) st = dr_st_writer_declare(w, "sem_logits", DR_DT_F32, 2, s2, err);
    if (!st) st = dr_st_writer_declare(w, "hidden", DR_DT_F32, 2, s3, err);
    if (!st) st = dr_st_writer_declare(w, "head_logits", DR_DT_F32, 3, s4, err);
    if (!st) st = dr_st_writer_write(w, c->codes, (size_t)c->n * c->nc * sizeof(int32_t), err);
    if (!st) st = dr_st_writer_write(w, c->sem, (size_t)c->n * c->nl * sizeof(float), err);
    if (!st) st = dr_st_writer_write(w, c->hid, (size_t)(c->n + 1) * c->H * sizeof(float), err);
    if (!st) st = dr_st_writer_write(w, c->heads, (size_t)c->n * c->nh * sizeof(float), err);
    if (st) {
        dr_st_writer_abort(w);
        return st;
    }
    return dr_st_writer_finish(w, err);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *rows_path = NULL, *uncond_path = NULL, *out_path = NULL, *dump_path = NULL;
    const char *sets[64];
    int n_sets = 0, threads = 0, have_seed = 0, have_cap = 0, score_only = 0, usage_error = 0;
    long long frames = 0, lv;
    double dv;
    dr_gen_options o;
    dr_gen_options_default(&o);
    dr_backend_choice backend = {DR_WANT_AUTO, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        int b = dr_cli_backend_arg("generate", argc, argv, &i, &backend);
        if (b < 0) return DR_EXIT_USAGE;
        if (b) continue;
        if (!strcmp(a, "--score")) {
            score_only = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "drama generate: %s: missing value (or unknown flag)\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--rows")) rows_path = v;
        else if (!strcmp(a, "--uncond-rows")) uncond_path = v;
        else if (!strcmp(a, "--codes-out")) out_path = v;
        else if (!strcmp(a, "--dump")) dump_path = v;
        else if (!strcmp(a, "--frames")) { if (!parse_int(a, v, 1, INT32_MAX, &frames)) return DR_EXIT_USAGE; }
        else if (!strcmp(a, "--seed")) { if (!parse_seed(v, &o.sp.seed)) return DR_EXIT_USAGE; have_seed = 1; }
        else if (!strcmp(a, "--temperature")) { if (!parse_double(a, v, &dv)) return DR_EXIT_USAGE; o.sp.temperature = (float)dv; }
        else if (!strcmp(a, "--top-p")) { if (!parse_double(a, v, &dv)) return DR_EXIT_USAGE; o.sp.top_p = (float)dv; }
        else if (!strcmp(a, "--ras-temperature")) { if (!parse_double(a, v, &dv)) return DR_EXIT_USAGE; o.sp.ras_temperature = (float)dv; }
        else if (!strcmp(a, "--ras-top-p")) { if (!parse_double(a, v, &dv)) return DR_EXIT_USAGE; o.sp.ras_top_p = (float)dv; }
        else if (!strcmp(a, "--cfg-gamma")) { if (!parse_double(a, v, &dv)) return DR_EXIT_USAGE; o.sp.cfg_gamma = (float)dv; }
        else if (!strcmp(a, "--semantic-top-k")) { if (!parse_int(a, v, INT32_MIN, INT32_MAX, &lv)) return DR_EXIT_USAGE; o.sp.semantic_top_k = (int)lv; }
        else if (!strcmp(a, "--acoustic-top-k")) { if (!parse_int(a, v, INT32_MIN, INT32_MAX, &lv)) return DR_EXIT_USAGE; o.sp.acoustic_top_k = (int)lv; }
        else if (!strcmp(a, "--ras-window")) { if (!parse_int(a, v, INT32_MIN, INT32_MAX, &lv)) return DR_EXIT_USAGE; o.sp.ras_window = (int)lv; }
        else if (!strcmp(a, "--frame-cap")) { if (!parse_int(a, v, INT32_MIN, INT32_MAX, &lv)) return DR_EXIT_USAGE; o.sp.frame_cap = (int)lv; have_cap = 1; }
        else if (!strcmp(a, "--draw-base")) { if (!parse_int(a, v, 0, INT64_MAX / 32, &lv)) return DR_EXIT_USAGE; o.draw_base = (uint64_t)lv; }
        else if (!strcmp(a, "--threads")) { if (!parse_int(a, v, 1, 1024, &lv)) return DR_EXIT_USAGE; threads = (int)lv; }
        else if (!strcmp(a, "--cfg-mode")) {
            if (!strcmp(v, "paired")) o.cfg_mode = DR_CFG_PAIRED;
            else if (!strcmp(v, "separate")) o.cfg_mode = DR_CFG_SEPARATE;
            else { fprintf(stderr, "drama generate: --cfg-mode: expected paired or separate, got '%s'\n", v); return DR_EXIT_USAGE; }
        } else if (!strcmp(a, "--set")) {
            if (n_sets == 64) { fprintf(stderr, "drama generate: too many --set\n"); return DR_EXIT_USAGE; }
            sets[n_sets++] = v;
        } else {
            fprintf(stderr, "drama generate: unknown flag %s\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    int generate = !score_only || frames > 0;
    if (!model || !rows_path || (generate && !out_path)) {
        fprintf(stderr, "drama generate: --model, --rows and --codes-out are required\n");
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    o.frames = (int)frames;
    if (frames > 0 && !have_cap && frames > o.sp.frame_cap) o.sp.frame_cap = (int)frames;

    drama_error err = {0};
    int rc = DR_EXIT_ERROR;
    dr_gen_lm *lm = NULL;
    dr_gen_session *s = NULL;
    dr_rows rows = {0}, urows = {0};
    collect col = {0};
    drama_status st = dr_sampler_params_validate(&o.sp, &err);
    if (st) {
        fprintf(stderr, "drama generate: %s\n", err.message);
        return DR_EXIT_USAGE;
    }
    if (!have_seed && generate) {
        if (getrandom(&o.sp.seed, sizeof o.sp.seed, 0) != (ssize_t)sizeof o.sp.seed) o.sp.seed = (uint64_t)time(NULL);
        fprintf(stderr, "drama generate: seed %" PRId64 "\n", (int64_t)o.sp.seed);
    }
    if ((st = dr_gen_lm_open_on(model, sets, n_sets, threads, NULL, &backend, NULL, &lm, &err))) goto done;
    int nc = lm->tower.d.num_codebooks;
    col.nc = nc;
    if ((st = dr_rows_read(rows_path, nc + 1, &rows, &err))) goto done;
    if (uncond_path && (st = dr_rows_read(uncond_path, nc + 1, &urows, &err))) goto done;
    if (rows.n_rows == 0) {
        st = dr_fail(&err, DRAMA_EEMPTY, "%s: no rows", rows_path);
        goto done;
    }
    /* The prompt has a reference when any of its rows is audio, wherever the "prefill" split puts
     * it (the library's auto-detection would see the first call only). */
    o.has_reference = 0;
    for (int64_t r = 0; r < rows.n_rows; r++) {
        int32_t t = rows.data[r * (nc + 1)];
        o.has_reference |= t >= lm->semantic_start && t < lm->semantic_start + lm->n_semantic;
    }
    int guided = o.sp.cfg_gamma > 0 && o.has_reference;
    /* "prefill": K rows in the first call (K = 0: every row one call, as `drama forward`) */
    int64_t k = rows.prefill > 0 ? rows.prefill : 1, uk = urows.prefill > 0 ? urows.prefill : 1;
    if (guided && !urows.n_rows) {
        st = dr_fail(&err, DRAMA_EINVAL, "--cfg-gamma %g: the prompt has a reference, so guidance needs --uncond-rows",
                     (double)o.sp.cfg_gamma);
        usage_error = 1;
        goto done;
    }
    /* rows after the prefill are appended to both states one call each (the same continuation,
     * e.g. teacher-forced frames), so both files must have as many of them */
    if (guided && rows.n_rows - k != urows.n_rows - uk) {
        st = dr_fail(&err, DRAMA_EINVAL,
                     "%s: %lld rows after its prefill of %lld, but %s has %lld after its prefill of %lld; guidance "
                     "appends each later row to both states, so the counts must match",
                     uncond_path, (long long)(urows.n_rows - uk), (long long)uk, rows_path,
                     (long long)(rows.n_rows - k), (long long)k);
        usage_error = 1;
        goto done;
    }
    o.allow_empty = !generate;
    if ((st = dr_gen_session_create(&lm->model, &o, &s, &err))) goto done;
    dr_gen_score score;
    memset(&score, 0, sizeof score);
    if (score_only) dr_gen_set_score(s, &score);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    double t0 = now_s();
    /* the prefill call, then any later rows one call each (the ROWS.json convention) */
    const int32_t *ur = guided ? urows.data : NULL;
    if ((st = dr_gen_prefill(s, rows.data, k, ur, guided ? uk : 0, &err))) goto done;
    for (int64_t r = k, ru = uk; r < rows.n_rows; r++, ru++)
        if ((st = dr_gen_prefill(s, rows.data + r * (nc + 1), 1, guided ? urows.data + ru * (nc + 1) : NULL,
                                 guided ? 1 : 0, &err)))
            goto done;
    double t1 = now_s();
    if (score_only) {
        double mean = 0;
        printf("{\"scored_positions\": %" PRId64 ", \"tower_nll\": [", score.count);
        for (int j = 0; j < score.n_codebooks; j++) {
            double v = score.count ? score.nll_sum[j] / (double)score.count : 0;
            mean += v / score.n_codebooks;
            printf("%s%.6f", j ? ", " : "", v);
        }
        printf("], \"tower_nll_mean\": %.6f}\n", mean);
        fflush(stdout);
        dr_gen_set_score(s, NULL);
        if (!generate) {
            rc = DR_EXIT_OK;
            goto done;
        }
    }
    dr_gen_finish fin = DR_FINISH_NONE;
    if (dump_path) {
        col.s = s;
        col.dump = 1;
        col.nl = lm->model.bb.n_candidates;
        col.H = lm->model.bb.hidden_dim;
        col.nh = (int64_t)(nc - 1) * lm->tower.d.head_vocab;
        if (!(col.hid = malloc((size_t)col.H * sizeof(float)))) {
            st = dr_fail(&err, DRAMA_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(col.hid, dr_gen_pending_hidden(s), (size_t)col.H * sizeof(float));
    }
    st = dr_gen_run(s, on_frame, &col, &fin, &err);
    double t2 = now_s();
    if (st) goto done;
    dr_codes codes = {col.n, nc, col.codes};
    if (dump_path && (st = write_dump(dump_path, &col, &err))) goto done;
    if ((st = dr_codes_write(out_path, &codes, &err))) goto done;
    fprintf(stderr, "drama generate: %" PRId64 " frames (%s)%s; prefill %" PRId64 " rows %.3f s, %.2f ms/frame\n",
            col.n, fin == DR_FINISH_END_TOKEN ? "end token" : "frame count", dr_gen_guided(s) ? ", guided" : "",
            rows.n_rows, t1 - t0, col.n ? (t2 - t1) * 1e3 / (double)col.n : 0.0);
    rc = DR_EXIT_OK;
done:
    if (st) {
        fprintf(stderr, "drama generate: %s\n", err.message);
        rc = st == DRAMA_EFRAMELIMIT ? DR_EXIT_FRAME_LIMIT : st == DRAMA_ECANCELLED ? DR_EXIT_CANCELLED : DR_EXIT_ERROR;
        if (usage_error) rc = DR_EXIT_USAGE;
        if (st == DRAMA_ECANCELLED && g_interrupted) fprintf(stderr, "drama generate: interrupted, nothing written\n");
    }
    free(col.codes);
    free(col.sem);
    free(col.hid);
    free(col.heads);
    dr_rows_free(&rows);
    dr_rows_free(&urows);
    dr_gen_session_free(s);
    dr_gen_lm_close(lm);
    return rc;
}
