/* cmd_synthesize.c - `drama synthesize`: text (+ reference voices) -> WAV, through the public
 * API of include/drama.h. This file only parses flags, reports progress, writes the output and
 * the receipt; the pipeline lives in src/gen/pipeline.c.
 *
 * Guarantees (docs/cli.md): the output is written to "<out>.tmp.<pid>" and renamed on success;
 * on an error, the frame cap or SIGINT/SIGTERM nothing is published and no temporary file is
 * left; the exit status says which (DR_EXIT_*). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/receipt.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "drama.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "io/wav_out.h"
#include "tools/pull.h"

#define MAX_REFS 16
#define MAX_SETS 64

typedef struct synth_args {
    const char *model_dir;
    const char *text;
    const char *text_file;
    const char *ref_audio[MAX_REFS]; /* one of audio / codes per reference, in flag order */
    const char *ref_codes[MAX_REFS];
    const char *ref_text[MAX_REFS];
    int n_refs, n_ref_texts;
    const char *out;
    const char *format;
    const char *receipt;
    const char *save_codes;
    const char *sets[MAX_SETS + 1];
    int n_sets;
    int progress_json, quiet, low_memory, max_frames_given;
    drama_request req;
    int threads;
    dr_backend_choice backend;
} synth_args;

/* ---- signals: the first SIGINT/SIGTERM cancels between frames; a second one exits at once,
 * removing the temporary file first (unlink and _exit are async-signal-safe). ---- */
static volatile sig_atomic_t g_signalled;
static drama_session *volatile g_session;
static char g_tmp_path[PATH_MAX + 64];

static void on_signal(int sig) {
    (void)sig;
    if (g_signalled) {
        if (g_tmp_path[0]) unlink(g_tmp_path);
        _exit(DR_EXIT_CANCELLED);
    }
    g_signalled = 1;
    if (g_session) drama_session_cancel(g_session);
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* A closed pipe on -o - becomes a write error (EPIPE) with a message, not a silent kill. */
    signal(SIGPIPE, SIG_IGN);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama synthesize --model DIR (--text T | --text-file F) -o OUT [options]\n"
            "\n"
            "  --model DIR               model directory (config.json, weights, tokenizer, codec), or\n"
            "                            org/name[@rev] pulled into the model store by drama pull\n"
            "  --text T | --text-file F  text to speak (F = - reads stdin)\n"
            "  -o, --output OUT          output file; - writes to stdout\n"
            "  --format F                wav (PCM16, default) | wav-f32 | pcm16 (raw little-endian)\n"
            "  --reference AUDIO         reference voice clip (repeatable; reference i is speaker i)\n"
            "  --reference-codes FILE    CODES.json of a reference instead of audio (repeatable)\n"
            "  --reference-text TEXT     transcript of each reference, in the same order\n"
            "  --speaker N               speaker tag 0..15 for text that does not start with one\n"
            "  --seed S                  64-bit seed (negative = two's complement); default drawn\n"
            "  --temperature T           0..2, 0 = argmax for every draw (default 1.0)\n"
            "  --top-p P                 (0, 1] (default 0.9)\n"
            "  --cfg-gamma G             0..5 guidance strength with a reference (default 0 = off)\n"
            "  --max-frames N            failure cap per text batch (default 750)\n"
            "  --frames N                exactly N frames, earlier only at the end token (finish 'frames')\n"
            "  --frames-per-batch N      exactly N frames per text batch (long text on test models)\n"
            "  --chunk-tokens N          text tokens per batch of long text (default 64)\n"
            "  --context N               context rows before old batches leave the history (8192)\n"
            "  --threads N               worker threads (default: physical cores)\n"
            DR_CLI_BACKEND_HELP
            "  --stream                  write audio while generating\n"
            "  --stream-chunk-frames N   frames per streamed chunk (default: small first, then larger)\n"
            "  --low-memory              encode / generate / decode as separate phases, releasing the\n"
            "                            backbone and tower before decoding\n"
            "  --set NAME=VALUE          override an engine switch (repeatable)\n"
            "  --receipt FILE            write a JSON record of the run (also on failure)\n"
            "  --save-codes FILE         write the generated frames as CODES.json\n"
            "  --progress-json           one JSON event per line on stderr\n"
            "  -q, --quiet               no progress bar\n"
            "\n"
            "exit status: 0 ok, 1 error, 2 bad command line, 3 frame cap reached, 130 cancelled\n"
            "(SIGINT/SIGTERM). On any failure no output file is left behind.\n");
}

static int bad_value(const char *flag, const char *v, const char *why) {
    fprintf(stderr, "drama synthesize: %s: invalid value '%s': %s\n", flag, v ? v : "", why);
    return DR_EXIT_USAGE;
}

static int parse_int(const char *flag, const char *v, long lo, long hi, int *out) {
    long long x;
    if (!dr_cli_int("synthesize", flag, v, lo, hi, &x)) return DR_EXIT_USAGE;
    *out = (int)x;
    return 0;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, int lo_open, float *out) {
    double x;
    if (!dr_cli_num("synthesize", flag, v, lo, hi, lo_open, &x)) return DR_EXIT_USAGE;
    *out = (float)x;
    return 0;
}

static int parse_seed(const char *v, uint64_t *out) {
    return dr_cli_seed("synthesize", "--seed", v, out) ? 0 : DR_EXIT_USAGE;
}

/* Returns -1 when parsing succeeded, else the exit status. */
static int parse_args(int argc, char **argv, synth_args *a) {
    memset(a, 0, sizeof *a);
    drama_request_default(&a->req);
    a->format = NULL;
    int rc;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        /* Boolean flags. */
        if (!strcmp(f, "--stream")) { a->req.stream = 1; continue; }
        if (!strcmp(f, "--low-memory")) { a->low_memory = 1; continue; }
        if (!strcmp(f, "--progress-json")) { a->progress_json = 1; continue; }
        if (!strcmp(f, "-q") || !strcmp(f, "--quiet")) { a->quiet = 1; continue; }
        if (f[0] != '-') {
            fprintf(stderr, "drama synthesize: unexpected argument '%s' (see --help)\n", f);
            return DR_EXIT_USAGE;
        }
        /* Flags with a value: --flag V or --flag=V. */
        const char *v = NULL;
        char name[64];
        const char *eq = strncmp(f, "--", 2) == 0 ? strchr(f, '=') : NULL;
        if (eq && (size_t)(eq - f) < sizeof name) {
            memcpy(name, f, (size_t)(eq - f));
            name[eq - f] = '\0';
            v = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", f);
            if (i + 1 < argc) v = argv[i + 1], i++;
            else v = NULL;
        }
        if (!v) {
            fprintf(stderr, "drama synthesize: %s needs a value\n", name);
            return DR_EXIT_USAGE;
        }
        if (!strcmp(name, "--model")) a->model_dir = v;
        else if (!strcmp(name, "--text")) a->text = v;
        else if (!strcmp(name, "--text-file")) a->text_file = v;
        else if (!strcmp(name, "-o") || !strcmp(name, "--output")) a->out = v;
        else if (!strcmp(name, "--format")) {
            dr_wav_format fm;
            if (!dr_wav_format_parse(v, &fm)) return bad_value(name, v, "expected wav, wav-f32 or pcm16");
            a->format = v;
        } else if (!strcmp(name, "--reference") || !strcmp(name, "--reference-codes")) {
            if (a->n_refs == MAX_REFS) return bad_value(name, v, "at most 16 references (speakers 0..15)");
            if (!*v) return bad_value(name, v, "empty path");
            if (name[11] == '\0') a->ref_audio[a->n_refs++] = v;
            else a->ref_codes[a->n_refs++] = v;
        } else if (!strcmp(name, "--reference-text")) {
            if (a->n_ref_texts == MAX_REFS) return bad_value(name, v, "at most 16 references");
            a->ref_text[a->n_ref_texts++] = v;
        } else if (!strcmp(name, "--speaker")) {
            if ((rc = parse_int(name, v, 0, 15, &a->req.speaker))) return rc;
        } else if (!strcmp(name, "--seed")) {
            if ((rc = parse_seed(v, &a->req.seed))) return rc;
            a->req.seed_set = 1;
        } else if (!strcmp(name, "--temperature")) {
            if ((rc = parse_float(name, v, 0, 2, 0, &a->req.temperature))) return rc;
        } else if (!strcmp(name, "--top-p")) {
            if ((rc = parse_float(name, v, 0, 1, 1, &a->req.top_p))) return rc;
        } else if (!strcmp(name, "--cfg-gamma")) {
            if ((rc = parse_float(name, v, 0, 5, 0, &a->req.cfg_gamma))) return rc;
        } else if (!strcmp(name, "--max-frames")) {
            if ((rc = parse_int(name, v, 1, 1000000, &a->req.max_frames))) return rc;
            a->max_frames_given = 1;
        } else if (!strcmp(name, "--frames")) {
            if ((rc = parse_int(name, v, 1, 1000000, &a->req.frames))) return rc;
        } else if (!strcmp(name, "--frames-per-batch")) {
            if ((rc = parse_int(name, v, 1, 1000000, &a->req.frames_per_batch))) return rc;
        } else if (!strcmp(name, "--context")) {
            if ((rc = parse_int(name, v, 1, 1 << 30, &a->req.context))) return rc;
        } else if (!strcmp(name, "--chunk-tokens")) {
            if ((rc = parse_int(name, v, 1, 1000000, &a->req.chunk_tokens))) return rc;
        } else if (!strcmp(name, "--threads")) {
            if ((rc = parse_int(name, v, 1, 4096, &a->threads))) return rc;
        } else if ((rc = dr_cli_backend_value("synthesize", name, v, &a->backend)) != 0) {
            if (rc < 0) return DR_EXIT_USAGE;
            rc = 0;
        } else if (!strcmp(name, "--stream-chunk-frames")) {
            if ((rc = parse_int(name, v, 1, 1000000, &a->req.stream_chunk_frames))) return rc;
        } else if (!strcmp(name, "--set")) {
            if (a->n_sets == MAX_SETS) return bad_value(name, v, "at most 64 --set flags");
            if (!strchr(v, '=')) return bad_value(name, v, "expected NAME=VALUE");
            a->sets[a->n_sets++] = v;
        } else if (!strcmp(name, "--receipt")) a->receipt = v;
        else if (!strcmp(name, "--save-codes")) a->save_codes = v;
        else {
            fprintf(stderr, "drama synthesize: unknown option '%s' (see --help)\n", name);
            return DR_EXIT_USAGE;
        }
    }
    if (!a->model_dir) return bad_value("--model", "", "required");
    if (!a->text == !a->text_file) {
        fprintf(stderr, "drama synthesize: give exactly one of --text and --text-file\n");
        return DR_EXIT_USAGE;
    }
    if (!a->out) return bad_value("-o", "", "an output path is required (- for stdout)");
    if (a->n_ref_texts != a->n_refs) {
        fprintf(stderr,
                "drama synthesize: --reference-text: %d transcript(s) for %d reference(s); give one "
                "--reference-text per --reference/--reference-codes, in the same order\n",
                a->n_ref_texts, a->n_refs);
        return DR_EXIT_USAGE;
    }
    for (int r = 0; r < a->n_refs; r++)
        if (!a->ref_text[r][0]) return bad_value("--reference-text", "", "a transcript must not be empty");
    if (a->req.frames > a->req.max_frames) {
        if (!a->max_frames_given) a->req.max_frames = a->req.frames; /* the default cap yields */
    }
    if (a->req.frames > a->req.max_frames) { /* an explicit cap below an explicit count */
        fprintf(stderr, "drama synthesize: --frames %d exceeds --max-frames %d\n", a->req.frames, a->req.max_frames);
        return DR_EXIT_USAGE;
    }
    if (a->req.frames_per_batch > a->req.max_frames) {
        if (!a->max_frames_given) a->req.max_frames = a->req.frames_per_batch;
        else return bad_value("--frames-per-batch", "", "exceeds --max-frames");
    }
    if (a->req.frames && a->req.frames_per_batch) {
        fprintf(stderr, "drama synthesize: --frames and --frames-per-batch exclude each other\n");
        return DR_EXIT_USAGE;
    }
    /* One run, three files: none may overwrite another (same spelling; "-" is a stream). */
    const char *outs[3] = {a->out, a->receipt, a->save_codes};
    const char *out_flags[3] = {"-o", "--receipt", "--save-codes"};
    for (int i = 0; i < 3; i++)
        for (int k = i + 1; k < 3; k++)
            if (outs[i] && outs[k] && strcmp(outs[i], "-") && !strcmp(outs[i], outs[k])) {
                fprintf(stderr, "drama synthesize: %s and %s name the same file '%s'\n", out_flags[i], out_flags[k],
                        outs[i]);
                return DR_EXIT_USAGE;
            }
    if (a->save_codes && !strcmp(a->save_codes, "-") && !strcmp(a->out, "-")) {
        fprintf(stderr, "drama synthesize: --save-codes - and -o - would both write to stdout\n");
        return DR_EXIT_USAGE;
    }
    if (a->req.stream_chunk_frames && !a->req.stream) {
        fprintf(stderr, "drama synthesize: --stream-chunk-frames needs --stream\n");
        return DR_EXIT_USAGE;
    }
    if (a->req.cfg_gamma > 0 && a->n_refs == 0)
        DR_WARN("drama synthesize: --cfg-gamma has no effect without a reference (the model's own voice is never guided)");
    return -1;
}

/* ---- progress ---- */

typedef struct run_ctx {
    synth_args *a;
    dr_wav_out *wav;
    drama_error write_err;
    int tty_bar;
    int64_t chunks;
    double t0;
    double last_draw;
    int sample_rate;
    const char *pause_env;  /* test hook, see on_audio */
    long pause_frames;      /* test hook: DRAMA_TEST_PAUSE_AFTER_FRAMES, see on_event */
} run_ctx;

static void pause_for_signal(void);

static int on_event(void *user, const drama_event *ev) {
    run_ctx *c = user;
    if (ev->type == DRAMA_EVENT_CHUNK) return g_signalled ? 1 : 0; /* on_audio reports chunks */
    /* test hook: wait for the signal once this many frames are generated (whole mode, mid-generation) */
    int pause = c->pause_frames > 0 && ev->type == DRAMA_EVENT_FRAMES && ev->frames == c->pause_frames;
    if (c->a->progress_json) {
        const char *kind = ev->type == DRAMA_EVENT_PHASE ? "phase" : "frames";
        json_t *j = json_pack("{s:s, s:s, s:f, s:I}", "event", kind, "phase", drama_phase_name(ev->phase), "t",
                              dr_clock_s() - c->t0, "rss_bytes", (json_int_t)ev->rss_bytes);
        if (ev->type != DRAMA_EVENT_PHASE) {
            json_object_set_new(j, "batch", json_integer(ev->batch));
            json_object_set_new(j, "batches", json_integer(ev->n_batches));
            json_object_set_new(j, "frames", json_integer(ev->frames));
            json_object_set_new(j, "frames_target", json_integer(ev->frames_target));
            json_object_set_new(j, "audio_seconds", json_real(ev->audio_seconds));
        }
        dr_progress_json_event(j);
    } else if (c->tty_bar && ev->type == DRAMA_EVENT_FRAMES &&
               (ev->frames == ev->frames_target || dr_clock_s() - c->last_draw >= 0.1)) {
        c->last_draw = dr_clock_s(); /* redraw at most 10 times a second */
        int64_t tgt = ev->frames_target > 0 ? ev->frames_target : 1;
        int fill = (int)(30 * (ev->frames > tgt ? tgt : ev->frames) / tgt);
        char bar[31];
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] batch %d/%d  frame %" PRId64 "/%" PRId64 "  %.1f s audio  %.1f s",
                bar, ev->batch + 1, ev->n_batches, ev->frames, ev->frames_target, ev->audio_seconds, ev->elapsed_s);
        fflush(stderr);
    } else if (c->tty_bar && ev->type == DRAMA_EVENT_PHASE) {
        fprintf(stderr, "\r%-90s\r%s...", "", drama_phase_name(ev->phase));
        fflush(stderr);
    }
    if (pause) pause_for_signal();
    return g_signalled ? 1 : 0;
}

/* Test hook: DRAMA_TEST_PAUSE_AFTER_CHUNK=1 makes the CLI wait for a signal after delivering
 * its first chunk, so tests can send SIGINT "after the first chunk" without timing races. */
static void pause_for_signal(void) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    while (!g_signalled) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

static int on_audio(void *user, const float *samples, size_t n) {
    run_ctx *c = user;
    if (!c->a->req.stream) dr_wav_out_set_expected(c->wav, dr_wav_out_samples(c->wav) + n);
    if (dr_wav_out_write(c->wav, samples, n, &c->write_err) != DRAMA_OK) return 1;
    c->chunks++;
    if (c->a->progress_json) {
        json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:I, s:I}", "event", "chunk", "chunk",
                              (json_int_t)c->chunks, "samples", (json_int_t)n, "samples_total",
                              (json_int_t)dr_wav_out_samples(c->wav), "audio_seconds",
                              (double)dr_wav_out_samples(c->wav) / c->sample_rate, "t", dr_clock_s() - c->t0, "bytes",
                              (json_int_t)dr_wav_out_bytes(c->wav), "rss_bytes", (json_int_t)dr_mem_rss_bytes());
        dr_progress_json_event(j);
    }
    if (c->pause_env && c->chunks == 1) pause_for_signal();
    return g_signalled ? 1 : 0;
}

/* ---- receipt ---- */

static json_t *phases_json(const drama_result *r) {
    json_t *o = json_object();
    for (int p = 0; p < DRAMA_PHASE_COUNT; p++) {
        const drama_phase_stats *s = &r->phases[p];
        if (!s->ran) continue;
        json_object_set_new(o, drama_phase_name(p),
                            json_pack("{s:f, s:I, s:I, s:I}", "wall_s", s->wall_s, "peak_rss_bytes",
                                      (json_int_t)s->peak_rss_bytes, "rss_end_bytes", (json_int_t)s->rss_end_bytes,
                                      "rss_file_end_bytes", (json_int_t)s->rss_file_end_bytes));
    }
    return o;
}

static json_t *settings_json(const synth_args *a, const drama_result *r, const char *format) {
    const drama_request *q = &a->req;
    json_t *refs = json_array();
    for (int i = 0; i < a->n_refs; i++)
        json_array_append_new(refs, json_pack("{s:s?, s:s?, s:s}", "audio", a->ref_audio[i], "codes", a->ref_codes[i],
                                              "transcript", a->ref_text[i]));
    json_t *sets = json_array();
    for (int i = 0; i < a->n_sets; i++) json_array_append_new(sets, json_string(a->sets[i]));
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, r->seed);
    json_t *o = json_pack("{s:s?, s:s?, s:o, s:i, s:s, s:b, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:b, s:i, s:b, s:s, s:s, s:o}",
                     "text", a->text, "text_file", a->text_file, "references", refs, "speaker", q->speaker, "seed", seed,
                     "seed_given", q->seed_set, "temperature", (double)q->temperature, "top_p", (double)q->top_p,
                     "cfg_gamma", (double)q->cfg_gamma, "max_frames", q->max_frames, "frames", q->frames,
                     "chunk_tokens", q->chunk_tokens, "threads", a->threads, "stream", q->stream,
                     "stream_chunk_frames", q->stream_chunk_frames, "low_memory", a->low_memory, "format", format,
                     "output", a->out, "set", sets);
    if (o) json_object_set_new(o, "frames_per_batch", json_integer(q->frames_per_batch));
    if (o) json_object_set_new(o, "context", json_integer(q->context > 0 ? q->context : 8192));
    return o;
}

/* Returns 0 when the receipt was written. */
static int write_receipt(const synth_args *a, const drama_result *r, const char *format, drama_status st,
                         const drama_error *err, const char *out_sha, uint64_t out_bytes, double wall) {
    json_t *files = NULL;
    drama_error herr = {0};
    if (dr_receipt_dir_files(a->model_dir, &files, &herr) != DRAMA_OK) files = json_null();
    char abs[PATH_MAX];
    if (!realpath(a->model_dir, abs)) snprintf(abs, sizeof abs, "%s", a->model_dir);
    json_t *j = json_object();
    json_object_set_new(j, "engine", json_pack("{s:s, s:s, s:s}", "name", "drama.c", "version", drama_version(),
                                               "commit", drama_git_commit()));
    json_object_set_new(j, "status", json_string(st == DRAMA_OK ? "ok" : drama_status_name(st)));
    json_object_set_new(j, "finish_reason", json_string(r->finish_reason[0] ? r->finish_reason : "error"));
    if (st != DRAMA_OK) json_object_set_new(j, "error", json_string(err->message));
    json_object_set_new(j, "model", json_pack("{s:s, s:o}", "dir", abs, "files", files));
    json_object_set_new(j, "settings", settings_json(a, r, format));
    json_object_set_new(j, "prompt_tokens", json_integer(r->prompt_tokens));
    json_object_set_new(j, "batches", json_integer(r->n_batches));
    json_object_set_new(j, "frames", json_integer(r->frames));
    json_object_set_new(j, "samples_per_frame", json_integer(r->samples_per_frame));
    json_object_set_new(j, "samples", json_integer(r->samples));
    json_object_set_new(j, "sample_rate", json_integer(r->sample_rate));
    json_object_set_new(j, "audio_seconds", json_real(r->audio_seconds));
    json_object_set_new(j, "wall_s", json_real(wall));
    json_object_set_new(j, "time_to_first_audio_s", r->time_to_first_audio_s > 0 ? json_real(r->time_to_first_audio_s) : json_null());
    json_object_set_new(j, "real_time_factor", r->audio_seconds > 0 ? json_real(wall / r->audio_seconds) : json_null());
    json_object_set_new(j, "phases", phases_json(r));
    /* Phase windows reset the kernel's peak, so the run's peak is the largest window. */
    int64_t peak = dr_mem_peak_bytes();
    for (int p = 0; p < DRAMA_PHASE_COUNT; p++)
        if (r->phases[p].ran && r->phases[p].peak_rss_bytes > peak) peak = r->phases[p].peak_rss_bytes;
    json_object_set_new(j, "peak_rss_bytes", json_integer(peak));
    if (out_sha)
        json_object_set_new(j, "output", json_pack("{s:s, s:s, s:I, s:s}", "path", a->out, "format", format, "bytes",
                                                   (json_int_t)out_bytes, "sha256", out_sha));
    else
        json_object_set_new(j, "output", json_null());
    drama_error werr = {0};
    int bad = dr_receipt_write(a->receipt, j, &werr) != DRAMA_OK;
    if (bad) fprintf(stderr, "drama synthesize: --receipt: %s\n", werr.message);
    json_decref(j);
    return bad;
}

/* An output named by a flag (-o, --receipt, --save-codes) must be creatable before any work
 * starts: its folder exists and is writable, and the path is not a folder. */
static drama_status check_output_path(const char *flag, const char *path, drama_error *err) {
    if (!path || !strcmp(path, "-")) return DRAMA_OK;
    if (!*path) return dr_fail(err, DRAMA_EINVAL, "%s: the path is empty", flag);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return dr_fail(err, DRAMA_EIO, "%s: %s is a directory", flag, path);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dr_fail(err, DRAMA_EIO, "%s: %s: folder %s does not exist", flag, path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: %s: folder %s is not writable: %s", flag, path, dir, strerror(errno));
    return DRAMA_OK;
}

static int exit_code_for(drama_status st) {
    switch (st) {
    case DRAMA_OK: return DR_EXIT_OK;
    case DRAMA_EFRAMELIMIT: return DR_EXIT_FRAME_LIMIT;
    case DRAMA_ECANCELLED: return DR_EXIT_CANCELLED;
    default: return DR_EXIT_ERROR;
    }
}

int cmd_synthesize(int argc, char **argv) {
    synth_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    char model_dir[4096]; /* --model org/name[@rev]: a pull in the model store (docs/pull.md) */
    drama_error merr = {0};
    if (dr_pull_resolve_model(a.model_dir, model_dir, sizeof model_dir, &merr) != DRAMA_OK) {
        fprintf(stderr, "drama synthesize: %s\n", merr.message);
        return DR_EXIT_ERROR;
    }
    a.model_dir = model_dir;
    double t0 = dr_clock_s();
    drama_error err = {0};
    drama_status st = DRAMA_OK;
    drama_result res;
    memset(&res, 0, sizeof res);
    char *text_buf = NULL;
    drama_model *model = NULL;
    drama_session *session = NULL;
    run_ctx ctx = {.a = &a, .t0 = t0, .pause_env = getenv("DRAMA_TEST_PAUSE_AFTER_CHUNK")};
    if (ctx.pause_env && !*ctx.pause_env) ctx.pause_env = NULL;
    const char *pf = getenv("DRAMA_TEST_PAUSE_AFTER_FRAMES");
    ctx.pause_frames = pf ? atol(pf) : 0;
    ctx.tty_bar = !a.quiet && !a.progress_json && isatty(STDERR_FILENO);
    dr_wav_format fmt = DR_WAV_PCM16;
    if (a.format) dr_wav_format_parse(a.format, &fmt);
    char out_sha[65] = {0};
    uint64_t out_bytes = 0;
    int published = 0;
    install_signals();

    drama_reference refs[MAX_REFS];
    memset(refs, 0, sizeof refs); /* fields not set here (in-memory audio, codes) stay unset */
    for (int i = 0; i < a.n_refs; i++) {
        refs[i].audio_path = a.ref_audio[i];
        refs[i].codes_path = a.ref_codes[i];
        refs[i].transcript = a.ref_text[i];
    }
    a.req.references = refs;
    a.req.n_references = a.n_refs;
    st = check_output_path("--receipt", a.receipt, &err);
    if (st != DRAMA_OK) a.receipt = NULL; /* it could not be written either */
    if (st == DRAMA_OK) st = check_output_path("--save-codes", a.save_codes, &err);
    if (st != DRAMA_OK) goto done;
    if (a.text_file) {
        if (dr_read_text_file(a.text_file, DR_FILE_MAX_BYTES, &text_buf, &err)) {
            dr_error_prefix(&err, "--text-file: ");
            st = err.code;
            goto done;
        }
        a.req.text = text_buf;
    } else {
        a.req.text = a.text;
    }

    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = a.threads;
    mo.low_memory = a.low_memory;
    mo.backend = (drama_backend)a.backend.want; /* the same values */
    mo.device = a.backend.device;
    a.sets[a.n_sets] = NULL;
    mo.set = a.n_sets ? a.sets : NULL;
    st = drama_model_open(&model, a.model_dir, &mo, &err);
    if (st != DRAMA_OK) goto done;
    st = drama_session_create(&session, model, &err);
    if (st != DRAMA_OK) goto done;
    g_session = session;
    if (g_signalled) drama_session_cancel(session);
    /* Open the output before any generation so a bad -o fails in milliseconds. */
    ctx.sample_rate = drama_model_sample_rate(model);
    st = dr_wav_out_open(&ctx.wav, a.out, fmt, ctx.sample_rate, 0, &err);
    if (st != DRAMA_OK) goto done;
    snprintf(g_tmp_path, sizeof g_tmp_path, "%s", dr_wav_out_temp_path(ctx.wav));

    st = drama_synthesize(session, &a.req, on_audio, on_event, &ctx, &res, &err);
    if (st != DRAMA_OK && ctx.write_err.code != DRAMA_OK) {
        /* The writer's message is the cause; the pipeline only saw "cancelled by callback". */
        err = ctx.write_err;
        st = err.code;
        snprintf(res.finish_reason, sizeof res.finish_reason, "error");
    }
    if (st == DRAMA_OK && g_signalled) {
        st = dr_fail(&err, DRAMA_ECANCELLED, "cancelled by signal");
        snprintf(res.finish_reason, sizeof res.finish_reason, "cancelled");
    }
    if (st == DRAMA_OK && a.save_codes) {
        dr_codes codes = {.n_frames = res.frames, .n_codebooks = res.n_codebooks, .data = res.codes};
        st = dr_codes_write(a.save_codes, &codes, &err);
        if (st != DRAMA_OK) {
            dr_error_prefix(&err, "--save-codes: ");
            snprintf(res.finish_reason, sizeof res.finish_reason, "error");
        }
    }
    if (st == DRAMA_OK) {
        out_bytes = dr_wav_out_bytes(ctx.wav);
        st = dr_wav_out_commit(ctx.wav, out_sha, &err);
        ctx.wav = NULL;
        g_tmp_path[0] = '\0';
        published = st == DRAMA_OK;
        if (!published && a.save_codes) unlink(a.save_codes);
    }

done:
    if (ctx.wav) {
        dr_wav_out_abort(ctx.wav); /* removes the temporary file: nothing is published */
        ctx.wav = NULL;
    }
    g_tmp_path[0] = '\0';
    g_session = NULL;
    double wall = dr_clock_s() - t0;
    if (ctx.tty_bar) fprintf(stderr, "\r%-100s\r", "");
    if (st == DRAMA_ECANCELLED && !res.finish_reason[0]) snprintf(res.finish_reason, sizeof res.finish_reason, "cancelled");
    if (st != DRAMA_OK && !res.finish_reason[0]) snprintf(res.finish_reason, sizeof res.finish_reason, "error");
    if (st != DRAMA_OK)
        fprintf(stderr, "drama synthesize: %s [%s]%s\n", err.message[0] ? err.message : drama_status_name(st),
                strcmp(res.finish_reason, "error") ? res.finish_reason : drama_status_name(st),
                strcmp(a.out, "-") ? "; no output file written" : "");
    if (a.progress_json) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:f, s:f}", "event", "done", "status",
                              st == DRAMA_OK ? "ok" : drama_status_name(st), "finish_reason", res.finish_reason,
                              "frames", (json_int_t)res.frames, "audio_seconds", res.audio_seconds, "t", wall);
        dr_progress_json_event(j);
    } else if (st == DRAMA_OK && !a.quiet) {
        fprintf(stderr, "%s: %" PRId64 " frames, %.2f s of audio in %.2f s (RTF %.2f), seed %" PRIu64 ", %s\n",
                strcmp(a.out, "-") ? a.out : "stdout", res.frames, res.audio_seconds, wall,
                res.audio_seconds > 0 ? wall / res.audio_seconds : 0.0, res.seed, res.finish_reason);
    }
    int receipt_failed = 0;
    if (a.receipt)
        receipt_failed = write_receipt(&a, &res, dr_wav_format_name(fmt), st, &err, published ? out_sha : NULL,
                                       out_bytes, wall);
    drama_result_free(&res);
    drama_session_free(session);
    drama_model_close(model);
    free(text_buf);
    /* The audio is published, but a run whose record was asked for and lost is not a success. */
    if (st == DRAMA_OK && receipt_failed) return DR_EXIT_ERROR;
    return exit_code_for(st);
}
