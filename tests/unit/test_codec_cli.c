/* `drama codec decode|encode` end to end on the tiny codec ($DRAMA_BIN; skipped when absent):
 * golden codes -> 32-bit float WAV equal to the golden waveform within 1e-4, the golden signal
 * (as a float WAV) -> the golden codes exactly, out-of-range codes rejected (not clamped), and bad
 * files and options (codes, codec.pth truncated or with a hostile pickle, audio) refused with a
 * named cause and no output. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <sndfile.h>

#include "io/codes_json.h"
#include "testutil.h"

#define GOLD "codec/codec-golden.safetensors"

static const char *bin(void) {
    const char *b = getenv("DRAMA_BIN");
    return b && access(b, X_OK) == 0 ? b : NULL;
}

static int run(const char *cmd) {
    printf("$ %s\n", cmd);
    fflush(stdout);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_codes(const char *path, const char *golden_name, int64_t *frames_out) {
    int64_t n;
    int32_t *g = tu_load_i32(tu_golden(GOLD), golden_name, &n);
    int64_t T = n / 10;
    dr_codes c;
    drama_error e = {0};
    assert_int_equal(dr_codes_create(&c, T, 10, &e), DRAMA_OK);
    for (int k = 0; k < 10; k++)
        for (int64_t f = 0; f < T; f++) c.data[f * 10 + k] = g[k * T + f];
    assert_int_equal(dr_codes_write(path, &c, &e), DRAMA_OK);
    dr_codes_free(&c);
    free(g);
    if (frames_out) *frames_out = T;
}

static void test_cli_decode_encode(void **state) {
    (void)state;
    if (!bin()) skip();
    const char *dir = tu_tmpdir();
    char codes[512], wav[512], cmd[2048], in[512], out[512];
    snprintf(codes, sizeof codes, "%s/codes.json", dir);
    snprintf(wav, sizeof wav, "%s/out.wav", dir);
    write_codes(codes, "decode.codes", NULL);
    snprintf(cmd, sizeof cmd, "%s codec decode --codec %s %s -o %s --f32 --threads 2", bin(), tu_golden("tiny-drama3"), codes, wav);
    assert_int_equal(run(cmd), 0);
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(wav, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.samplerate, 44100);
    assert_int_equal(info.channels, 1);
    int64_t n;
    float *ref = tu_load_f32(tu_golden(GOLD), "decode.wav", &n);
    assert_int_equal(info.frames, n);
    float *x = malloc((size_t)n * sizeof *x);
    assert_int_equal(sf_readf_float(sf, x, n), n);
    sf_close(sf);
    assert_true(tu_report("cli decode --f32", tu_compare_f32(x, ref, n), 1e-4));
    free(x), free(ref);
    /* encode: golden signal through a float WAV (exact) */
    float *sig = tu_load_f32(tu_golden(GOLD), "encode.wav", &n);
    snprintf(in, sizeof in, "%s/in.wav", dir);
    SF_INFO wi = {.samplerate = 44100, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_FLOAT};
    sf = sf_open(in, SFM_WRITE, &wi);
    assert_non_null(sf);
    assert_int_equal(sf_writef_float(sf, sig, n), n);
    sf_close(sf);
    free(sig);
    snprintf(out, sizeof out, "%s/enc.json", dir);
    snprintf(cmd, sizeof cmd, "%s codec encode --codec %s %s -o %s", bin(), tu_golden("tiny-drama3"), in, out);
    assert_int_equal(run(cmd), 0);
    dr_codes got = {0};
    drama_error e = {0};
    assert_int_equal(dr_codes_read(out, 10, NULL, &got, &e), DRAMA_OK);
    int32_t *g = tu_load_i32(tu_golden(GOLD), "encode.codes", &n);
    int64_t T = n / 10;
    assert_int_equal(got.n_frames, T);
    int bad = 0;
    for (int k = 0; k < 10; k++)
        for (int64_t f = 0; f < T; f++) bad += got.data[f * 10 + k] != g[k * T + f];
    printf("cli encode: %d of %lld codes differ\n", bad, (long long)n);
    assert_int_equal(bad, 0);
    dr_codes_free(&got);
    free(g);
    tu_rm_rf(dir);
}

static void test_cli_rejects_out_of_range(void **state) {
    (void)state;
    if (!bin()) skip();
    const char *dir = tu_tmpdir();
    char codes[512], wav[512], cmd[2048];
    snprintf(codes, sizeof codes, "%s/clamp.json", dir);
    snprintf(wav, sizeof wav, "%s/out.wav", dir);
    write_codes(codes, "clamp.codes", NULL);
    snprintf(cmd, sizeof cmd, "%s codec decode --codec %s %s -o %s 2>&1", bin(), tu_golden("tiny-drama3"), codes, wav);
    assert_int_not_equal(run(cmd), 0);
    assert_int_not_equal(access(wav, F_OK), 0); /* nothing published */
    snprintf(cmd, sizeof cmd, "%s codec decode --codec %s %s/missing.json -o %s 2>&1", bin(), tu_golden("tiny-drama3"), dir, wav);
    assert_int_not_equal(run(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s codec encode --codec %s %s -o %s/x.json 2>&1", bin(), tu_golden("tiny-drama3"), codes, dir);
    assert_int_not_equal(run(cmd), 0); /* a JSON file is not audio */
    snprintf(cmd, sizeof cmd, "%s codec frobnicate 2>&1", bin());
    assert_int_equal(run(cmd), 2);
    tu_rm_rf(dir);
}

/* run `drama codec ARGS -o OUT`: exit code want, stderr naming the problem, nothing at OUT */
static void expect_cli(const char *dir, const char *args, int want, const char *needle) {
    char cmd[4096], out[512], log[512];
    snprintf(out, sizeof out, "%s/out.any", dir);
    snprintf(log, sizeof log, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s codec %s -o %s 2>%s", bin(), args, out, log);
    int rc = run(cmd);
    size_t n;
    char *msg = tu_read_file(log, &n);
    printf("  -> %d: %.200s", rc, msg);
    assert_int_equal(rc, want);
    if (!strstr(msg, needle)) fail_msg("stderr lacks '%s'", needle);
    assert_int_not_equal(access(out, F_OK), 0);
    free(msg);
}

/* bad files and options: each a clear message, a non-zero exit, no output */
static void test_cli_bad_inputs(void **state) {
    (void)state;
    if (!bin()) skip();
    const char *dir = tu_tmpdir(), *tiny = tu_golden("tiny-drama3");
    char path[512], args[2048];
    snprintf(path, sizeof path, "%s/narrow.json", dir);
    const char *narrow = "{\"codes\": [[1, 2, 3]]}", *none = "{\"codes\": []}";
    tu_write_file(path, narrow, strlen(narrow));
    snprintf(args, sizeof args, "decode --codec %s %s", tiny, path);
    expect_cli(dir, args, 1, "10 codes");
    snprintf(path, sizeof path, "%s/none.json", dir);
    tu_write_file(path, none, strlen(none));
    snprintf(args, sizeof args, "decode --codec %s %s", tiny, path);
    expect_cli(dir, args, 1, "no frames");
    snprintf(args, sizeof args, "decode --codec %s/codec.pth %s", tiny, path);
    expect_cli(dir, args, 1, "not a directory");
    /* a truncated codec.pth (with its codec.json) */
    size_t n;
    char *pth = tu_read_file(tu_golden("tiny-drama3/codec.pth"), &n), *js = tu_read_file(tu_golden("tiny-drama3/codec.json"), &n);
    snprintf(path, sizeof path, "%s/codec.pth", dir);
    tu_write_file(path, pth, 100000);
    snprintf(path, sizeof path, "%s/codec.json", dir);
    tu_write_file(path, js, n);
    free(pth), free(js);
    snprintf(args, sizeof args, "decode --codec %s %s/none.json", dir, dir);
    expect_cli(dir, args, 1, "truncated");
    /* a hostile pickle: the state dict's GLOBAL renamed, in place, to a same-length callable */
    pth = tu_read_file(tu_golden("tiny-drama3/codec.pth"), &n);
    const char *from = "collections\nOrderedDict", *to = "subprocess\ncheck_output";
    char *at = memmem(pth, n, from, strlen(from));
    assert_non_null(at);
    memcpy(at, to, strlen(to));
    snprintf(path, sizeof path, "%s/codec.pth", dir);
    tu_write_file(path, pth, n);
    free(pth);
    expect_cli(dir, args, 1, "global 'subprocess.check_output' is not allowed");
    /* encode: audio that is too long for the cap, a non-finite cap, empty audio, a truncated FLAC */
    float x[8000];
    for (int i = 0; i < 8000; i++) x[i] = 0.3f * sinf(0.02f * (float)i) + 0.1f * sinf(0.31f * (float)(i * i % 997));
    SF_INFO wi = {.samplerate = 8000, .channels = 1, .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16};
    snprintf(path, sizeof path, "%s/in.flac", dir);
    SNDFILE *sf = sf_open(path, SFM_WRITE, &wi);
    assert_non_null(sf);
    assert_int_equal(sf_writef_float(sf, x, 8000), 8000);
    sf_close(sf);
    snprintf(args, sizeof args, "encode --codec %s %s --max-seconds 0.5", tiny, path);
    expect_cli(dir, args, 1, "cap");
    snprintf(args, sizeof args, "encode --codec %s %s --max-seconds nan", tiny, path);
    expect_cli(dir, args, 2, "--max-seconds");
    char *flac = tu_read_file(path, &n);
    snprintf(path, sizeof path, "%s/half.flac", dir);
    tu_write_file(path, flac, n / 2);
    free(flac);
    snprintf(args, sizeof args, "encode --codec %s %s", tiny, path);
    expect_cli(dir, args, 1, "truncated");
    wi.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
    snprintf(path, sizeof path, "%s/empty.wav", dir);
    sf = sf_open(path, SFM_WRITE, &wi);
    assert_non_null(sf);
    sf_close(sf);
    snprintf(args, sizeof args, "encode --codec %s %s", tiny, path);
    expect_cli(dir, args, 1, "no samples");
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_decode_encode),
        cmocka_unit_test(test_cli_rejects_out_of_range),
        cmocka_unit_test(test_cli_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
