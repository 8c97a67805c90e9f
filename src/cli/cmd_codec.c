/* cmd_codec.c - `drama codec` (docs/codec.md):
 *
 *   drama codec decode --codec DIR CODES.json -o OUT.wav [--f32] [--threads N]
 *   drama codec encode --codec DIR IN.wav -o CODES.json [--max-seconds S] [--threads N]
 *
 * DIR holds codec.pth or codec.safetensors (and codec.json when its hyperparameters differ from
 * the real codec's). Codes read from a file are range-checked (an out-of-range code is an input
 * error, never clamped). Outputs are published atomically (temporary file + rename). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/cli_args.h"
#include "cli/commands.h"
#include "codec/codec.h"
#include "io/audio_in.h"
#include "io/codes_json.h"
#include "io/wav_out.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama codec decode --codec DIR CODES.json -o OUT.wav [--f32] [--threads N]\n"
            "       drama codec encode --codec DIR IN.wav -o CODES.json [--max-seconds S] [--threads N]\n"
            "  DIR: folder with codec.pth or codec.safetensors (+ codec.json)\n"
            "  decode: CODES.json is {\"codes\": [[c0..c9], ...]}; writes 44.1 kHz mono WAV (PCM16, or\n"
            "          32-bit float with --f32); \"-\" writes to stdout\n"
            "  encode: reads any audio libsndfile decodes, mixes to mono, resamples to 44.1 kHz;\n"
            "          the duration cap is --max-seconds (default 30, negative: none)\n");
}

static int fail(const char *what, const drama_error *err) {
    fprintf(stderr, "drama codec %s: %s\n", what, err->message);
    return DR_EXIT_ERROR;
}

typedef struct args {
    const char *codec_dir, *input, *output;
    int f32, threads;
    double max_seconds;
} args;

static int parse(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--codec") && i + 1 < argc) a->codec_dir = argv[++i];
        else if (!strcmp(s, "-o") && i + 1 < argc) a->output = argv[++i];
        else if (!strcmp(s, "--output") && i + 1 < argc) a->output = argv[++i];
        else if (!strcmp(s, "--f32")) a->f32 = 1;
        else if (!strcmp(s, "--threads") && i + 1 < argc) {
            long long v;
            if (!dr_cli_int("codec", s, argv[++i], 0, 1024, &v)) return 0;
            a->threads = (int)v;
        } else if (!strcmp(s, "--max-seconds") && i + 1 < argc) {
            if (!dr_cli_num("codec", s, argv[++i], -HUGE_VAL, HUGE_VAL, 0, &a->max_seconds)) return 0;
            if (a->max_seconds == 0)
                return fprintf(stderr, "drama codec: --max-seconds: must be nonzero (negative: no cap)\n"), 0;
        } else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            exit(DR_EXIT_OK);
        } else if (s[0] == '-' && s[1]) return fprintf(stderr, "drama codec: unknown option '%s'\n", s), 0;
        else if (!a->input) a->input = s;
        else return fprintf(stderr, "drama codec: unexpected argument '%s'\n", s), 0;
    }
    if (!a->codec_dir || !a->input || !a->output) return fprintf(stderr, "drama codec: --codec, an input and -o are required\n"), 0;
    return 1;
}

static int decode(const args *a) {
    drama_error err = {0};
    dr_codec *codec = NULL;
    dr_codes codes = {0};
    dr_codec_stream *stream = NULL;
    dr_wav_out *w = NULL;
    float *pcm = NULL;
    dr_pool *pool = NULL;
    int rc = DR_EXIT_ERROR;
    if (dr_codec_open(a->codec_dir, DR_CODEC_LOAD_DECODER, &codec, &err)) goto done;
    const dr_codec_config *cf = dr_codec_cfg(codec);
    int32_t upper[DR_CODEC_MAX_BOOKS];
    for (int k = 0; k < cf->num_codebooks; k++) upper[k] = k == 0 ? cf->semantic_codebook_size : cf->codebook_size;
    if (dr_codes_read(a->input, cf->num_codebooks, upper, &codes, &err)) goto done;
    if (dr_codec_check_codes(cf, codes.data, codes.n_frames, a->input, &err)) goto done;
    if (codes.n_frames == 0) {
        dr_fail(&err, DRAMA_EEMPTY, "%s: no frames", a->input);
        goto done;
    }
    pool = dr_pool_create(a->threads);
    dr_codec_set_pool(codec, pool);
    if (dr_codec_stream_create(codec, &stream, &err)) goto done;
    if (dr_wav_out_open(&w, a->output, a->f32 ? DR_WAV_F32 : DR_WAV_PCM16, cf->sample_rate,
                        (uint64_t)codes.n_frames * (uint64_t)cf->frame_length, &err))
        goto done;
    /* decode and write in pieces so memory stays bounded for long code files */
    const int64_t piece = 64;
    pcm = malloc((size_t)(piece * cf->frame_length) * sizeof *pcm);
    if (!pcm) {
        dr_fail(&err, DRAMA_ENOMEM, "out of memory");
        goto done;
    }
    for (int64_t f = 0; f < codes.n_frames; f += piece) {
        int64_t n = codes.n_frames - f < piece ? codes.n_frames - f : piece;
        if (dr_codec_stream_feed(stream, codes.data + f * codes.n_codebooks, n, pcm, &err)) goto done;
        if (dr_wav_out_write(w, pcm, (size_t)(n * cf->frame_length), &err)) goto done;
    }
    dr_wav_out *wc = w;
    w = NULL;
    if (dr_wav_out_commit(wc, NULL, &err)) goto done;
    if (strcmp(a->output, "-"))
        fprintf(stderr, "drama codec decode: %lld frames -> %lld samples (%.2f s) -> %s\n", (long long)codes.n_frames,
                (long long)(codes.n_frames * cf->frame_length),
                (double)(codes.n_frames * cf->frame_length) / cf->sample_rate, a->output);
    rc = DR_EXIT_OK;
done:
    if (rc) fail("decode", &err);
    dr_wav_out_abort(w);
    free(pcm);
    dr_codec_stream_free(stream);
    dr_codes_free(&codes);
    dr_codec_free(codec);
    dr_pool_free(pool);
    return rc;
}

static int encode(const args *a) {
    drama_error err = {0};
    dr_codec *codec = NULL;
    float *pcm = NULL;
    int32_t *codes = NULL;
    int64_t n = 0, frames = 0;
    dr_pool *pool = NULL;
    int rc = DR_EXIT_ERROR;
    if (dr_codec_open(a->codec_dir, DR_CODEC_LOAD_ENCODER, &codec, &err)) goto done;
    const dr_codec_config *cf = dr_codec_cfg(codec);
    dr_audio_in_opts o = {.target_rate = cf->sample_rate, .max_seconds = a->max_seconds};
    if (dr_audio_read(a->input, &o, &pcm, &n, &err)) goto done;
    pool = dr_pool_create(a->threads);
    dr_codec_set_pool(codec, pool);
    if (dr_codec_encode(codec, pcm, n, &codes, &frames, NULL, NULL, &err)) {
        dr_error_prefix(&err, "%s: ", a->input);
        goto done;
    }
    dr_codes out = {.n_frames = frames, .n_codebooks = cf->num_codebooks, .data = codes};
    if (dr_codes_write(a->output, &out, &err)) goto done;
    if (strcmp(a->output, "-"))
        fprintf(stderr, "drama codec encode: %lld samples -> %lld frames -> %s\n", (long long)n, (long long)frames,
                a->output);
    rc = DR_EXIT_OK;
done:
    if (rc) fail("encode", &err);
    free(pcm);
    free(codes);
    dr_codec_free(codec);
    dr_pool_free(pool);
    return rc;
}

int cmd_codec(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DR_EXIT_USAGE : DR_EXIT_OK;
    }
    args a;
    if (strcmp(argv[1], "decode") && strcmp(argv[1], "encode")) {
        fprintf(stderr, "drama codec: unknown action '%s' (decode or encode)\n", argv[1]);
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    if (!parse(argc, argv, &a)) {
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    return !strcmp(argv[1], "decode") ? decode(&a) : encode(&a);
}
