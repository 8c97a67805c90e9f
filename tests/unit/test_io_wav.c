/* Unit tests of io/wav_out: headers, sample conversion, chunked == whole, publication by rename,
 * abort leaves nothing, errors name the path. Read-back goes through libsndfile (independent). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <openssl/evp.h>
#include <sndfile.h>

#include "io/wav_out.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/drama-wavtest-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *path_in(const char *name) {
    static char buf[4][512];
    static int slot;
    char *p = buf[slot++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static uint32_t u32le(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void make_signal(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(0.9 * sin(0.013 * (double)i) + 0.05 * cos(1.7 * (double)i));
    if (n > 4) { x[0] = 1.0f; x[1] = -1.0f; x[2] = 0.99999f; x[3] = -0.5f / 32768.0f; }
}

static void write_file(const char *path, dr_wav_format fmt, const float *x, size_t n, const size_t *chunks,
                       char hex[65]) {
    drama_error e = {0};
    dr_wav_out *w = NULL;
    unlink(path);
    assert_int_equal(dr_wav_out_open(&w, path, fmt, 44100, 0, &e), DRAMA_OK);
    /* Nothing is published before commit. */
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(access(dr_wav_out_temp_path(w), F_OK), 0);
    size_t off = 0;
    for (int c = 0; chunks && chunks[c] && off < n; c++) {
        size_t m = chunks[c] < n - off ? chunks[c] : n - off;
        assert_int_equal(dr_wav_out_write(w, x + off, m, &e), DRAMA_OK);
        off += m;
    }
    if (dr_wav_out_write(w, x + off, n - off, &e) != DRAMA_OK) fail_msg("%s", e.message);
    assert_int_equal(dr_wav_out_samples(w), n);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", dr_wav_out_temp_path(w));
    if (dr_wav_out_commit(w, hex, &e) != DRAMA_OK) fail_msg("%s", e.message);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
}

static void test_pcm16_header_and_values(void **state) {
    (void)state;
    enum { N = 5000 };
    float x[N];
    make_signal(x, N);
    char hex[65];
    const char *p = path_in("a.wav");
    write_file(p, DR_WAV_PCM16, x, N, NULL, hex);
    size_t len;
    uint8_t *b = slurp(p, &len);
    assert_non_null(b);
    assert_int_equal(len, 44 + 2 * N);
    assert_memory_equal(b, "RIFF", 4);
    assert_int_equal(u32le(b + 4), len - 8);
    assert_memory_equal(b + 8, "WAVEfmt ", 8);
    assert_int_equal(u32le(b + 24), 44100);
    assert_int_equal(u32le(b + 40), 2 * N);
    /* CODEC.md 8: 1.0 clamps to 32767 (never wraps), -1.0 is -32768, lrint rounds half to even. */
    int16_t s[4];
    memcpy(s, b + 44, sizeof s);
    assert_int_equal(s[0], 32767);
    assert_int_equal(s[1], -32768);
    assert_int_equal(s[2], 32767);
    assert_int_equal(s[3], 0);
    /* Independent read-back with libsndfile. */
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(p, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.frames, N);
    assert_int_equal(info.channels, 1);
    assert_int_equal(info.samplerate, 44100);
    assert_int_equal(info.format & SF_FORMAT_SUBMASK, SF_FORMAT_PCM_16);
    short *r = malloc(N * sizeof *r);
    assert_int_equal(sf_read_short(sf, r, N), N);
    sf_close(sf);
    double max_err = 0;
    for (int i = 4; i < N; i++) {
        double d = fabs((double)r[i] - (double)x[i] * 32768.0);
        if (d > max_err) max_err = d;
    }
    printf("pcm16 quantisation: max |s - x*32768| = %.3f (bound 0.5)\n", max_err);
    assert_true(max_err <= 0.5);
    /* The reported hash is the hash of the published bytes. */
    uint8_t d[32];
    unsigned int dl;
    EVP_Digest(b, len, d, &dl, EVP_sha256(), NULL);
    char want[65];
    for (int i = 0; i < 32; i++) snprintf(want + 2 * i, 3, "%02x", d[i]);
    assert_string_equal(hex, want);
    free(r);
    free(b);
}

static void test_f32_exact_roundtrip(void **state) {
    (void)state;
    enum { N = 3001 };
    float x[N];
    make_signal(x, N);
    char hex[65];
    const char *p = path_in("f.wav");
    write_file(p, DR_WAV_F32, x, N, NULL, hex);
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(p, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.frames, N);
    assert_int_equal(info.format & SF_FORMAT_SUBMASK, SF_FORMAT_FLOAT);
    float *r = malloc(N * sizeof *r);
    sf_command(sf, SFC_SET_NORM_FLOAT, NULL, SF_FALSE);
    assert_int_equal(sf_read_float(sf, r, N), N);
    sf_close(sf);
    assert_memory_equal(r, x, N * sizeof *r); /* float output keeps samples unchanged */
    free(r);
}

static void test_chunked_equals_whole(void **state) {
    (void)state;
    enum { N = 2048 * 9 + 17 };
    float *x = malloc(N * sizeof *x);
    make_signal(x, N);
    const dr_wav_format fmts[3] = {DR_WAV_PCM16, DR_WAV_F32, DR_WAV_RAW16};
    for (int f = 0; f < 3; f++) {
        char h1[65], h2[65];
        const size_t chunks[] = {2048, 1, 8192, 5000, 0};
        write_file(path_in("whole"), fmts[f], x, N, NULL, h1);
        write_file(path_in("chunked"), fmts[f], x, N, chunks, h2);
        size_t l1, l2;
        uint8_t *a = slurp(path_in("whole"), &l1), *b = slurp(path_in("chunked"), &l2);
        assert_int_equal(l1, l2);
        assert_int_equal(l1, dr_wav_header_bytes(fmts[f]) + N * (fmts[f] == DR_WAV_F32 ? 4 : 2));
        assert_memory_equal(a, b, l1);
        assert_string_equal(h1, h2);
        free(a);
        free(b);
    }
    free(x);
}

static void test_abort_leaves_nothing(void **state) {
    (void)state;
    drama_error e = {0};
    dr_wav_out *w = NULL;
    const char *p = path_in("aborted.wav");
    assert_int_equal(dr_wav_out_open(&w, p, DR_WAV_PCM16, 44100, 0, &e), DRAMA_OK);
    float x[100] = {0};
    assert_int_equal(dr_wav_out_write(w, x, 100, &e), DRAMA_OK);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", dr_wav_out_temp_path(w));
    assert_non_null(strstr(tmp, ".tmp."));
    dr_wav_out_abort(w);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
    dr_wav_out_abort(NULL);
}

static void test_bad_inputs(void **state) {
    (void)state;
    drama_error e = {0};
    dr_wav_out *w = NULL;
    assert_int_equal(dr_wav_out_open(&w, "/nonexistent-dir-xyz/o.wav", DR_WAV_PCM16, 44100, 0, &e), DRAMA_EIO);
    assert_null(w);
    assert_non_null(strstr(e.message, "/nonexistent-dir-xyz/o.wav"));
    dr_error_clear(&e);
    assert_int_equal(dr_wav_out_open(&w, g_dir, DR_WAV_PCM16, 44100, 0, &e), DRAMA_EIO);
    assert_non_null(strstr(e.message, "directory"));
    dr_error_clear(&e);
    assert_int_equal(dr_wav_out_open(&w, path_in("x.wav"), DR_WAV_PCM16, 0, 0, &e), DRAMA_EINVAL);
    dr_error_clear(&e);
    assert_int_equal(dr_wav_out_open(&w, "", DR_WAV_PCM16, 44100, 0, &e), DRAMA_EINVAL);
    dr_error_clear(&e);
    /* NaN never reaches the file: the write fails with a message naming the sample. */
    assert_int_equal(dr_wav_out_open(&w, path_in("nan.wav"), DR_WAV_PCM16, 44100, 0, &e), DRAMA_OK);
    float x[3] = {0.1f, NAN, 0.2f};
    assert_int_equal(dr_wav_out_write(w, x, 3, &e), DRAMA_ENUMERIC);
    assert_non_null(strstr(e.message, "sample 1"));
    dr_wav_out_abort(w);
    assert_int_not_equal(access(path_in("nan.wav"), F_OK), 0);
    dr_wav_format f;
    assert_int_equal(dr_wav_format_parse("wav-f32", &f), 1);
    assert_int_equal(f, DR_WAV_F32);
    assert_int_equal(dr_wav_format_parse("pcm16", &f), 1);
    assert_int_equal(f, DR_WAV_RAW16);
    assert_int_equal(dr_wav_format_parse("mp3", &f), 0);
    assert_int_equal(dr_wav_format_parse(NULL, &f), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcm16_header_and_values),
        cmocka_unit_test(test_f32_exact_roundtrip),
        cmocka_unit_test(test_chunked_equals_whole),
        cmocka_unit_test(test_abort_leaves_nothing),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
