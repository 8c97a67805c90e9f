/* Reference-audio input (CODEC.md 7): float WAV read exactly, stereo mixed to mono, other rates
 * resampled to 44.1 kHz, FLAC decoded, and every bad input refused with a named error. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sndfile.h>

#include "io/audio_in.h"
#include "testutil.h"

static void write_audio(const char *path, int format, int rate, int ch, const float *x, int64_t frames) {
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    if (!sf) fail_msg("cannot write %s: %s", path, sf_strerror(NULL));
    sf_command(sf, SFC_SET_NORM_FLOAT, NULL, SF_TRUE);
    assert_int_equal(sf_writef_float(sf, x, frames), frames);
    sf_close(sf);
}

static void test_float_wav_exact_and_memory(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/a.wav", dir);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = 0.9f * sinf(0.01f * (float)i * (float)i) + 1e-7f * (float)i;
    write_audio(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 44100, 1, x, 1000);
    float *y;
    int64_t n;
    drama_error e = {0};
    assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_OK);
    assert_int_equal(n, 1000);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    size_t len;
    char *bytes = tu_read_file(path, &len);
    assert_int_equal(dr_audio_read_memory(bytes, len, "upload", NULL, &y, &n, &e), DRAMA_OK);
    assert_int_equal(n, 1000);
    assert_memory_equal(x, y, sizeof x);
    free(y);
    assert_int_equal(dr_audio_read_memory(bytes, 10, "upload", NULL, &y, &n, &e), DRAMA_EFORMAT);
    free(bytes);
    tu_rm_rf(dir);
}

static void test_stereo_resampled(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/s.flac", dir);
    int rate = 22050;
    int64_t frames = rate; /* 1 s */
    float *x = malloc((size_t)frames * 2 * sizeof *x);
    for (int64_t i = 0; i < frames; i++) {
        float s = 0.5f * sinf(2.0f * (float)M_PI * 440.0f * (float)i / (float)rate);
        x[2 * i] = s + 0.25f, x[2 * i + 1] = s - 0.25f; /* mean = s */
    }
    write_audio(path, SF_FORMAT_FLAC | SF_FORMAT_PCM_24, rate, 2, x, frames);
    float *y;
    int64_t n;
    drama_error e = {0};
    assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_OK);
    printf("22050 Hz stereo FLAC, %lld frames -> %lld samples at 44100 Hz\n", (long long)frames, (long long)n);
    assert_true(llabs(n - 2 * frames) <= 2);
    double *want = malloc((size_t)n * sizeof *want);
    for (int64_t i = 2000; i < n - 2000; i++) want[i] = 0.5 * sin(2 * M_PI * 440.0 * (double)i / 44100.0);
    assert_true(tu_report("resampled sine", tu_compare_f32_f64(y + 2000, want + 2000, n - 4000), 1e-3));
    free(want), free(y), free(x);
    tu_rm_rf(dir);
}

static void test_bad_inputs(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[512];
    float *y = NULL;
    int64_t n;
    drama_error e = {0};
    /* unreadable */
    assert_int_equal(dr_audio_read("/nonexistent/ref.wav", NULL, &y, &n, &e), DRAMA_EIO);
    assert_non_null(strstr(e.message, "/nonexistent/ref.wav"));
    snprintf(path, sizeof path, "%s/junk.wav", dir);
    tu_write_file(path, "this is not audio at all, not even close", 40);
    dr_error_clear(&e);
    assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_EIO);
    /* empty */
    snprintf(path, sizeof path, "%s/empty.wav", dir);
    write_audio(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 1, NULL, 0);
    dr_error_clear(&e);
    assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_EEMPTY);
    printf("%s\n", e.message);
    /* non-finite */
    float bad[4] = {0.1f, NAN, 0.2f, 0.3f};
    snprintf(path, sizeof path, "%s/nan.wav", dir);
    write_audio(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 44100, 1, bad, 4);
    dr_error_clear(&e);
    assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_ENUMERIC);
    printf("%s\n", e.message);
    /* too long for the cap */
    float *x = calloc(2 * 8000, sizeof *x);
    snprintf(path, sizeof path, "%s/long.wav", dir);
    write_audio(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 1, x, 2 * 8000);
    dr_audio_in_opts o = {.max_seconds = 1.5};
    dr_error_clear(&e);
    assert_int_equal(dr_audio_read(path, &o, &y, &n, &e), DRAMA_EINVAL);
    printf("%s\n", e.message);
    assert_non_null(strstr(e.message, "cap"));
    o.max_seconds = -1; /* no cap */
    assert_int_equal(dr_audio_read(path, &o, &y, &n, &e), DRAMA_OK);
    assert_int_equal(n, 2 * 44100);
    free(y);
    /* a non-finite cap is refused (NaN would silently disable it) */
    o.max_seconds = NAN;
    dr_error_clear(&e);
    assert_int_equal(dr_audio_read(path, &o, &y, &n, &e), DRAMA_EINVAL);
    printf("%s\n", e.message);
    assert_non_null(strstr(e.message, "finite"));
    o.max_seconds = INFINITY;
    assert_int_equal(dr_audio_read(path, &o, &y, &n, &e), DRAMA_EINVAL);
    /* truncated compressed files: an error, never a silently shortened clip */
    for (int i = 0; i < 2 * 8000; i++) x[i] = 0.3f * sinf(0.01f * (float)i) + 0.05f * sinf(0.37f * (float)(i * i % 1009));
    static const int fmts[2] = {SF_FORMAT_FLAC | SF_FORMAT_PCM_16, SF_FORMAT_OGG | SF_FORMAT_VORBIS};
    for (int f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/whole.%s", dir, f ? "ogg" : "flac");
        write_audio(path, fmts[f], 8000, 1, x, 2 * 8000);
        dr_error_clear(&e);
        if (dr_audio_read(path, NULL, &y, &n, &e)) fail_msg("%s", e.message); /* the whole file reads */
        assert_true(llabs(n - 2 * 44100) <= 2);
        free(y);
        size_t len;
        char *bytes = tu_read_file(path, &len);
        snprintf(path, sizeof path, "%s/half.%s", dir, f ? "ogg" : "flac");
        tu_write_file(path, bytes, len / 2);
        dr_error_clear(&e);
        assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_EFORMAT);
        assert_null(y);
        printf("%s\n", e.message);
        assert_non_null(strstr(e.message, "half."));
        dr_error_clear(&e);
        assert_int_equal(dr_audio_read_memory(bytes, len / 2, "upload", NULL, &y, &n, &e), DRAMA_EFORMAT);
        assert_null(y);
        free(bytes);
    }
    free(x);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_wav_exact_and_memory),
        cmocka_unit_test(test_stereo_resampled),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
