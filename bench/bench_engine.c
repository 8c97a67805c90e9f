/* bench_engine.c - the batched engine (include/drama.h): time to first audio for a cached vs an
 * uncached voice, and aggregate frames per second at several lane counts.
 *
 *   bench_engine [--model DIR] [--threads N] [--frames F] [--lanes 1,2,4] [--ref-frames R] [--reps K]
 *
 * TTFA: a streamed request (first chunk of 4 frames) with a voice of R reference frames, from
 * drama_engine_start to the first audio callback (drama_result.time_to_first_audio_s). Uncached:
 * a fresh voice each time (its prefix is prefilled, then snapshotted); cached: the same voice
 * again (the prefix state is cloned from the prompt cache). The engine is otherwise idle.
 * Throughput: L requests of F frames started together on L lanes; frames / wall time (prefills
 * included), and frames / time once every lane has prefilled (the batched steps alone). "ideal"
 * is L x the 1-lane generation rate (each lane as fast as one alone); ratio = measured / ideal.
 * Stall: tick times of a generating lane while a newcomer with a long voice prefills, by slice
 * policy, against its ticks alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drama.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int discard(void *user, const float *x, size_t n) {
    (void)user;
    (void)x;
    (void)n;
    return 0;
}

static int32_t *voice_codes(int nc, int frames, int salt) {
    int32_t *c = malloc((size_t)frames * nc * sizeof *c);
    for (int f = 0; f < frames; f++)
        for (int k = 0; k < nc; k++) c[f * nc + k] = (f * 7 + k * 13 + salt * 31) % 1000;
    return c;
}

static int run_one(drama_engine *e, const drama_request *r, drama_result *res) {
    drama_lane h = 0;
    drama_error err = {0};
    if (drama_engine_start(e, r, discard, NULL, NULL, &h, &err) != DRAMA_OK) {
        fprintf(stderr, "start: %s\n", err.message);
        return 1;
    }
    while (!drama_lane_done(e, h))
        if (drama_engine_step(e, &err) != DRAMA_OK) return 1;
    drama_status st = drama_lane_result(e, h, res, &err);
    drama_lane_release(e, h);
    if (st != DRAMA_OK) fprintf(stderr, "request: %s\n", err.message);
    return st != DRAMA_OK;
}

int main(int argc, char **argv) {
    const char *model = NULL, *lanes_arg = "1,2,4";
    int threads = 0, frames = 50, ref_frames = 100, reps = 5, n_set = 0;
    const char *set[9] = {NULL}; /* --set SWITCH=VALUE (e.g. deltanet.prefill=recurrent), NULL-terminated */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--frames") && i + 1 < argc) frames = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lanes") && i + 1 < argc) lanes_arg = argv[++i];
        else if (!strcmp(argv[i], "--ref-frames") && i + 1 < argc) ref_frames = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_set < 8) set[n_set++] = argv[++i];
        else {
            fprintf(stderr, "usage: bench_engine [--model DIR] [--threads N] [--frames F] [--lanes 1,2,4] "
                            "[--ref-frames R] [--reps K] [--set SWITCH=VALUE]...\n");
            return 2;
        }
    }
    char def[4096];
    if (!model) {
        const char *g = getenv("DRAMA_GOLDEN");
        snprintf(def, sizeof def, "%s/tiny-drama3", g ? g : "../shared/golden");
        model = def;
    }
    if (frames < 1 || ref_frames < 1 || reps < 1) {
        fprintf(stderr, "bench_engine: --frames, --ref-frames and --reps must be positive\n");
        return 2;
    }
    drama_model_options mo;
    drama_model_options_default(&mo);
    mo.threads = threads;
    mo.set = n_set ? set : NULL;
    drama_model *m = NULL;
    drama_error err = {0};
    if (drama_model_open(&m, model, &mo, &err) != DRAMA_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.message);
        return 1;
    }
    int nc = drama_model_codebooks(m);
    printf("bench_engine: model %s, threads %d, commit %s\n", model, threads, drama_git_commit());
    for (int i = 0; i < n_set; i++) printf("  --set %s\n", set[i]);
    printf("\n");

    /* ---- time to first audio ---- */
    drama_engine_options eo;
    drama_engine_options_default(&eo);
    eo.lanes = 1;
    eo.prompt_cache_bytes = (int64_t)1 << 30;
    eo.memory_budget_bytes = -1;
    drama_engine *e = NULL;
    if (drama_engine_create(&e, m, &eo, &err) != DRAMA_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.message);
        return 1;
    }
    drama_request r;
    drama_request_default(&r);
    r.text = "Hello there, this is the benchmark speaking.";
    r.frames = 8;
    r.stream = 1;
    r.stream_first_frames = 4;
    r.seed_set = 1;
    double unc = 0, cac = 0, unc_min = 1e9, cac_min = 1e9;
    int64_t prompt_rows = 0;
    for (int k = 0; k < reps; k++) {
        int32_t *codes = voice_codes(nc, ref_frames, k);
        drama_reference ref = {.transcript = "A voice for the benchmark.", .codes = codes, .n_code_frames = ref_frames};
        r.references = &ref;
        r.n_references = 1;
        drama_result a, b;
        r.seed = (uint64_t)k;
        if (run_one(e, &r, &a)) return 1;
        r.seed = (uint64_t)k + 1000;
        if (run_one(e, &r, &b)) return 1;
        if (a.voice_cached || !b.voice_cached) {
            fprintf(stderr, "bench_engine: expected a miss then a hit\n");
            return 1;
        }
        prompt_rows = a.prompt_tokens;
        unc += a.time_to_first_audio_s;
        cac += b.time_to_first_audio_s;
        if (a.time_to_first_audio_s < unc_min) unc_min = a.time_to_first_audio_s;
        if (b.time_to_first_audio_s < cac_min) cac_min = b.time_to_first_audio_s;
        drama_result_free(&a);
        drama_result_free(&b);
        free(codes);
    }
    drama_engine_free(e);
    printf("time to first audio (stream, first chunk 4 frames; voice of %d frames, prompt %lld rows; %d reps)\n",
           ref_frames, (long long)prompt_rows, reps);
    printf("| voice | mean ms | min ms |\n|---|---|---|\n");
    printf("| uncached | %.2f | %.2f |\n| cached | %.2f | %.2f |\n", 1e3 * unc / reps, 1e3 * unc_min, 1e3 * cac / reps,
           1e3 * cac_min);
    printf("cached / uncached = %.3f\n\n", cac / unc);

    /* ---- stall of a generating lane while a newcomer prefills ---- */
    printf("stall: one lane generating while a newcomer with a voice of %d frames prefills\n", 3 * ref_frames);
    printf("| prefill slices | ticks while prefilling | max tick ms | median tick ms alone |\n|---|---|---|---|\n");
    const int slices[3] = {-1, 32, 0};
    for (int si = 0; si < 3; si++) {
        drama_engine_options so;
        drama_engine_options_default(&so);
        so.lanes = 2;
        so.prefill_slice_rows = slices[si];
        so.memory_budget_bytes = -1;
        if (drama_engine_create(&e, m, &so, &err) != DRAMA_OK) return 1;
        drama_request bgq;
        drama_request_default(&bgq);
        bgq.text = "Background lane.";
        bgq.frames = 400;
        bgq.seed_set = 1;
        drama_lane hb = 0, hn = 0;
        if (drama_engine_start(e, &bgq, discard, NULL, NULL, &hb, &err) != DRAMA_OK) return 1;
        double alone[64];
        for (int t = 0; t < 64; t++) { /* ticks with only the background lane */
            double t0 = now_s();
            drama_engine_step(e, &err);
            alone[t] = now_s() - t0;
        }
        for (int a = 1; a < 64; a++)
            for (int b = a; b > 0 && alone[b - 1] > alone[b]; b--) {
                double x = alone[b];
                alone[b] = alone[b - 1];
                alone[b - 1] = x;
            }
        int32_t *codes = voice_codes(nc, 3 * ref_frames, 99);
        drama_reference ref = {.transcript = "A long voice.", .codes = codes, .n_code_frames = 3 * ref_frames};
        drama_request nq = r;
        nq.references = &ref;
        nq.n_references = 1;
        if (drama_engine_start(e, &nq, discard, NULL, NULL, &hn, &err) != DRAMA_OK) return 1;
        double worst = 0;
        int ticks = 0;
        for (;;) {
            drama_engine_stats es;
            drama_engine_get_stats(e, &es);
            if (es.lanes_prefilling == 0) break;
            double t0 = now_s();
            drama_engine_step(e, &err);
            double dt = now_s() - t0;
            if (dt > worst) worst = dt;
            ticks++;
        }
        printf("| %s | %d | %.2f | %.2f |\n", slices[si] < 0 ? "auto" : slices[si] ? "32 rows" : "whole", ticks,
               1e3 * worst, 1e3 * alone[32]);
        free(codes);
        drama_engine_free(e);
    }
    printf("\n");

    /* ---- aggregate frames per second ---- */
    printf("aggregate throughput (%d frames per request, no voice, all requests started together)\n", frames);
    printf("| lanes | requests | wall s | frames/s (wall) | generation frames/s | ideal (lanes x 1-lane) | ratio |\n"
           "|---|---|---|---|---|---|---|\n");
    double one_lane = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", lanes_arg);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int L = atoi(tok);
        if (L < 1) continue;
        eo.lanes = L;
        eo.prompt_cache_bytes = 0;
        if (drama_engine_create(&e, m, &eo, &err) != DRAMA_OK) {
            fprintf(stderr, "bench_engine: %s\n", err.message);
            return 1;
        }
        drama_request q;
        drama_request_default(&q);
        q.text = "Throughput text for every lane of the benchmark.";
        q.frames = frames;
        q.max_frames = frames > 750 ? frames : 750;
        q.seed_set = 1;
        drama_lane *h = calloc((size_t)L, sizeof *h);
        double t0 = now_s();
        for (int i = 0; i < L; i++) {
            q.seed = (uint64_t)i;
            if (drama_engine_start(e, &q, discard, NULL, NULL, &h[i], &err) != DRAMA_OK) {
                fprintf(stderr, "start: %s\n", err.message);
                return 1;
            }
        }
        int64_t total = 0, gen_frames0 = -1;
        double t_gen = 0;
        for (int left = L; left > 0;) {
            if (gen_frames0 < 0) { /* the generation-only clock starts once every lane has prefilled */
                drama_engine_stats es;
                drama_engine_get_stats(e, &es);
                if (es.lanes_prefilling == 0) {
                    gen_frames0 = es.frames_generated;
                    t_gen = now_s();
                }
            }
            if (drama_engine_step(e, &err) != DRAMA_OK) return 1;
            for (int i = 0; i < L; i++)
                if (h[i] && drama_lane_done(e, h[i])) {
                    drama_result res;
                    if (drama_lane_result(e, h[i], &res, &err) != DRAMA_OK) {
                        fprintf(stderr, "request: %s\n", err.message);
                        return 1;
                    }
                    total += res.frames;
                    drama_result_free(&res);
                    drama_lane_release(e, h[i]);
                    h[i] = 0;
                    left--;
                }
        }
        double t1 = now_s(), wall = t1 - t0, fps = (double)total / wall;
        double gfps = t1 > t_gen ? (double)(total - gen_frames0) / (t1 - t_gen) : 0;
        if (L == 1 || one_lane == 0) one_lane = gfps / L;
        printf("| %d | %d | %.3f | %.1f | %.1f | %.1f | %.2f |\n", L, L, wall, fps, gfps, one_lane * L,
               gfps / (one_lane * L));
        free(h);
        drama_engine_free(e);
    }
    drama_model_close(m);
    return 0;
}
