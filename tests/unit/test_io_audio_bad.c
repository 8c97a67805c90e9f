/* Truncated and odd-but-valid reference audio (audio_in.h): a WAV/AIFF/W64 cut anywhere is an
 * error naming the file and the declared vs present bytes, never a silently shorter clip; streaming
 * "unknown length" sizes, extra chunks and trailing bytes still load every sample. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sndfile.h>
#include <unistd.h>

#include "io/audio_in.h"
#include "testutil.h"

#define FRAMES 101

static void put32(uint8_t *p, uint32_t v) { p[0] = v & 255, p[1] = v >> 8 & 255, p[2] = v >> 16 & 255, p[3] = v >> 24; }

static void chunk(uint8_t *buf, size_t *len, const char *id, const void *body, uint32_t n) {
    memcpy(buf + *len, id, 4);
    put32(buf + *len + 4, n);
    memcpy(buf + *len + 8, body, n);
    *len += 8 + n;
    if (n & 1) buf[(*len)++] = 0;
}

/* A 44.1 kHz mono 16-bit WAV of FRAMES samples with optional chunks before and after the data. */
static size_t make_wav(uint8_t *buf, int16_t *pcm, int list_before, int list_after) {
    for (int i = 0; i < FRAMES; i++) pcm[i] = (int16_t)((i * 2654435761u) >> 17) - 16384;
    size_t len = 12;
    memcpy(buf, "RIFF\0\0\0\0WAVE", 12);
    uint8_t fmt[16] = {1, 0, 1, 0}; /* PCM, 1 channel */
    put32(fmt + 4, 44100), put32(fmt + 8, 88200), fmt[12] = 2, fmt[14] = 16;
    chunk(buf, &len, "fmt ", fmt, 16);
    static const char info[] = "INFOISFT\x06\0\0\0drama\0"; /* a LIST INFO with one software tag */
    if (list_before) chunk(buf, &len, "LIST", info, sizeof info - 1);
    for (int i = 0; i < FRAMES; i++) {
        uint8_t le[2] = {(uint8_t)(pcm[i] & 255), (uint8_t)((uint16_t)pcm[i] >> 8)};
        memcpy(buf + len + 8 + 2 * i, le, 2);
    }
    memcpy(buf + len, "data", 4);
    put32(buf + len + 4, 2 * FRAMES);
    len += 8 + 2 * FRAMES;
    if (list_after) chunk(buf, &len, "LIST", info, sizeof info - 1);
    put32(buf + 4, (uint32_t)len - 8);
    return len;
}

static size_t find(const uint8_t *buf, size_t len, const char *id) {
    for (size_t i = 12; i + 4 <= len; i++)
        if (!memcmp(buf + i, id, 4)) return i;
    fail_msg("no %s chunk", id);
    return 0;
}

static void expect_samples(const uint8_t *buf, size_t len, const int16_t *pcm, const char *what) {
    float *y = NULL;
    int64_t n = 0;
    drama_error e = {0};
    if (dr_audio_read_memory(buf, len, what, NULL, &y, &n, &e)) fail_msg("%s: %s", what, e.message);
    assert_int_equal(n, FRAMES);
    for (int i = 0; i < FRAMES; i++) assert_true(y[i] == (float)pcm[i] / 32768.0f);
    free(y);
}

static void expect_error(const uint8_t *buf, size_t len, const char *what, const char *needle) {
    float *y = (float *)1;
    int64_t n = 7;
    drama_error e = {0};
    drama_status st = dr_audio_read_memory(buf, len, what, NULL, &y, &n, &e);
    if (st == DRAMA_OK) fail_msg("%s (%zu bytes) loaded %lld samples", what, len, (long long)n);
    assert_null(y);
    assert_int_equal(n, 0);
    assert_non_null(strstr(e.message, what));
    if (needle && !strstr(e.message, needle)) fail_msg("%s: '%s' not in: %s", what, needle, e.message);
}

/* Every cut of a valid WAV short of its full length fails; the whole file and extra chunks load. */
static void test_wav_cut_anywhere(void **state) {
    (void)state;
    uint8_t buf[1024];
    int16_t pcm[FRAMES];
    for (int layout = 0; layout < 4; layout++) {
        size_t len = make_wav(buf, pcm, layout & 1, layout >> 1);
        expect_samples(buf, len, pcm, "whole.wav");
        int refused = 0;
        for (size_t cut = 1; cut < len; cut++) {
            char what[64];
            snprintf(what, sizeof what, "cut%zu.wav", cut);
            expect_error(buf, cut, what, NULL);
            refused++;
        }
        printf("layout %d (LIST before %d, after %d): %zu bytes load, all %d shorter cuts refused\n", layout,
               layout & 1, layout >> 1, len, refused);
    }
    /* the messages: declared vs present bytes */
    size_t len = make_wav(buf, pcm, 0, 0);
    expect_error(buf, len - 10, "middata.wav", "declares 202 bytes of audio but the file holds only 192");
    expect_error(buf, 30, "midheader.wav", "RIFF header declares 246 bytes but the file has 30");
    expect_error(buf, 40, "middatahdr.wav", "declares 246 bytes but the file has 40");
}

static void test_wav_valid_variants(void **state) {
    (void)state;
    uint8_t buf[1100];
    int16_t pcm[FRAMES];
    /* streaming writers (a WAV written to a pipe, ours included): 0xFFFFFFFF = up to the end */
    size_t len = make_wav(buf, pcm, 1, 0);
    put32(buf + find(buf, len, "data") + 4, 0xFFFFFFFFu);
    expect_samples(buf, len, pcm, "stream-data.wav");
    put32(buf + 4, 0xFFFFFFFFu);
    expect_samples(buf, len, pcm, "stream-both.wav");
    /* a data size of 0 holds no audio: refused as empty, not read past */
    len = make_wav(buf, pcm, 0, 0);
    put32(buf + find(buf, len, "data") + 4, 0);
    expect_error(buf, len, "zero-data.wav", "no samples");
    /* trailing bytes past the RIFF size (an appended tag) are ignored */
    len = make_wav(buf, pcm, 0, 1);
    memcpy(buf + len, "TAG junk after the RIFF form", 28);
    expect_samples(buf, len + 28, pcm, "trailing.wav");
    /* a RIFF size even one byte over the file is a cut file */
    put32(buf + 4, (uint32_t)len - 7);
    expect_error(buf, len, "oneover.wav", "RIFF header declares");
    /* a data size past the end of the file fails even with a right RIFF size */
    len = make_wav(buf, pcm, 0, 0);
    put32(buf + find(buf, len, "data") + 4, 2 * FRAMES + 2);
    expect_error(buf, len, "bigdata.wav", "declares 204 bytes of audio but the file holds only 202");
}

/* Files written by libsndfile in other uncompressed containers: whole loads, half is refused. */
static void test_containers_half(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    static const struct { const char *name; int format; } kinds[] = {
        {"a.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16},       {"a.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16},
        {"a.aifc", SF_FORMAT_AIFF | SF_FORMAT_FLOAT},      {"a.rf64", SF_FORMAT_RF64 | SF_FORMAT_PCM_24},
        {"x.wav", SF_FORMAT_WAVEX | SF_FORMAT_FLOAT},      {"a.mp3", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III},
        {"a.au", SF_FORMAT_AU | SF_FORMAT_PCM_16},          {"l.au", SF_FORMAT_AU | SF_FORMAT_FLOAT | SF_ENDIAN_LITTLE},
        {"rifx.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16 | SF_ENDIAN_BIG}, {"a.w64", SF_FORMAT_W64 | SF_FORMAT_PCM_16},
    };
    float x[8000];
    for (int i = 0; i < 8000; i++) x[i] = 0.3f * (float)((i * 37 % 101) - 50) / 50.0f;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, kinds[k].name);
        SF_INFO info = {.samplerate = 44100, .channels = 1, .format = kinds[k].format};
        if (!sf_format_check(&info)) {
            printf("%s: this libsndfile cannot write it; skipped\n", kinds[k].name);
            continue;
        }
        SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
        if (!sf) fail_msg("cannot write %s: %s", path, sf_strerror(NULL));
        assert_int_equal(sf_writef_float(sf, x, 8000), 8000);
        sf_close(sf);
        float *y = NULL;
        int64_t n = 0;
        drama_error e = {0};
        if (dr_audio_read(path, NULL, &y, &n, &e)) fail_msg("%s", e.message);
        assert_true(n > 7000);
        free(y);
        size_t len;
        char *bytes = tu_read_file(path, &len);
        snprintf(path, sizeof path, "%s/half-%s", dir, kinds[k].name);
        tu_write_file(path, bytes, len / 2);
        dr_error_clear(&e);
        y = (float *)1;
        assert_int_equal(dr_audio_read(path, NULL, &y, &n, &e), DRAMA_EFORMAT);
        assert_null(y);
        assert_non_null(strstr(e.message, path));
        printf("%s\n", e.message);
        free(bytes);
    }
    tu_rm_rf(dir);
}

/* Stereo AIFF and W64 cut anywhere through memory: refused. */
static void test_aiff_w64_cut_anywhere(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    static const struct { const char *name; int format; } kinds[] = {
        {"c.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16}, {"c.w64", SF_FORMAT_W64 | SF_FORMAT_PCM_16}};
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, kinds[k].name);
        SF_INFO info = {.samplerate = 44100, .channels = 2, .format = kinds[k].format};
        SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
        assert_non_null(sf);
        short x[2 * 50];
        for (int i = 0; i < 100; i++) x[i] = (short)(i * 300 - 15000);
        assert_int_equal(sf_writef_short(sf, x, 50), 50);
        sf_close(sf);
        size_t len;
        uint8_t *bytes = (uint8_t *)tu_read_file(path, &len);
        float *y = NULL;
        int64_t n = 0;
        drama_error e = {0};
        if (dr_audio_read_memory(bytes, len, kinds[k].name, NULL, &y, &n, &e)) fail_msg("%s", e.message);
        assert_int_equal(n, 50);
        free(y);
        for (size_t cut = 1; cut < len; cut++) expect_error(bytes, cut, kinds[k].name, NULL);
        printf("%s: %zu bytes load, all shorter cuts refused\n", kinds[k].name, len);
        free(bytes);
    }
    tu_rm_rf(dir);
}

/* "-" reads stdin: a redirected file is checked like a path; a pipe (no size) reads to its end. */
static void test_stdin(void **state) {
    (void)state;
    uint8_t buf[1024];
    int16_t pcm[FRAMES];
    size_t len = make_wav(buf, pcm, 0, 1);
    const char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/in.wav", dir);
    int saved = dup(STDIN_FILENO);
    float *y = NULL;
    int64_t n = 0;
    drama_error e = {0};
    for (int cut = 0; cut < 2; cut++) {
        tu_write_file(path, buf, cut ? len - 30 : len);
        assert_non_null(freopen(path, "rb", stdin));
        dr_error_clear(&e);
        drama_status st = dr_audio_read("-", NULL, &y, &n, &e);
        if (cut) {
            assert_int_equal(st, DRAMA_EFORMAT);
            printf("stdin, cut: %s\n", e.message);
        } else {
            if (st) fail_msg("%s", e.message);
            assert_int_equal(n, FRAMES);
            free(y);
        }
    }
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], buf, len), (ssize_t)len); /* fits the pipe buffer */
    close(fds[1]);
    dup2(fds[0], STDIN_FILENO);
    close(fds[0]);
    dr_error_clear(&e);
    if (dr_audio_read("-", NULL, &y, &n, &e)) fail_msg("pipe: %s", e.message);
    assert_int_equal(n, FRAMES);
    for (int i = 0; i < FRAMES; i++) assert_true(y[i] == (float)pcm[i] / 32768.0f);
    free(y);
    dup2(saved, STDIN_FILENO);
    close(saved);
    tu_rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wav_cut_anywhere),
        cmocka_unit_test(test_wav_valid_variants),
        cmocka_unit_test(test_containers_half),
        cmocka_unit_test(test_aiff_w64_cut_anywhere),
        cmocka_unit_test(test_stdin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
