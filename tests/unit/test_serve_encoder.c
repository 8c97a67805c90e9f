/* test_serve_encoder.c - response encoders (API.md 3.2, 3.3, 4; CODEC.md 8): PCM16 rounding and
 * clamping, the streaming WAV header and its patch, whole = streamed for any chunking of
 * wav/pcm, the 24 kHz resampler (length and pitch kept), MP3 frame headers (MPEG-1 Layer III,
 * 128 kbit/s, 44.1 kHz, mono), Ogg Opus headers (input rate, serial), non-finite samples. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/encoder.h"

#define RATE 44100

static float *sine(size_t n, double hz, double amp) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(amp * sin(2 * M_PI * hz * (double)i / RATE));
    return x;
}

/* Encodes x in chunks of `chunk` samples (0 = one feed) into out. */
static void encode(dr_audio_format f, int pcm_rate, const float *x, size_t n, size_t chunk, dr_bytes *out) {
    dr_encoder_opts o = {f, RATE, pcm_rate, 1234};
    dr_encoder *enc = NULL;
    drama_error err = {0};
    assert_int_equal(dr_encoder_create(&enc, &o, out, &err), DRAMA_OK);
    if (!chunk) chunk = n;
    for (size_t i = 0; i < n; i += chunk)
        assert_int_equal(dr_encoder_feed(enc, x + i, n - i < chunk ? n - i : chunk, out, &err), DRAMA_OK);
    assert_int_equal(dr_encoder_finish(enc, out, &err), DRAMA_OK);
    dr_encoder_free(enc);
}

static uint32_t u32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void test_pcm16_and_wav(void **st) {
    const float x[] = {0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 0.99999f, 1.5f, -1.5f, 1.0f / 65536, 3.0f / 65536};
    const int16_t want[] = {0, 32767, -32768, 16384, -16384, 32767, 32767, -32768, 0, 2}; /* lrint: ties to even */
    dr_bytes out = {0};
    encode(DR_AF_WAV, 0, x, 10, 3, &out);
    assert_int_equal(out.len, 44 + 20);
    assert_memory_equal(out.data, "RIFF", 4);
    assert_int_equal(u32(out.data + 4), 0xFFFFFFFFu); /* streaming: unknown sizes */
    assert_int_equal(u32(out.data + 40), 0xFFFFFFFFu);
    assert_int_equal(u32(out.data + 24), RATE);
    assert_int_equal(u32(out.data + 28), 2 * RATE);
    for (int k = 0; k < 10; k++) {
        int16_t s = (int16_t)(out.data[44 + 2 * k] | out.data[45 + 2 * k] << 8);
        if (s != want[k]) fail_msg("sample %d (%g): %d, want %d", k, x[k], s, want[k]);
    }
    dr_encoder_wav_patch(out.data, out.len);
    assert_int_equal(u32(out.data + 4), out.len - 8);
    assert_int_equal(u32(out.data + 40), 20);
    dr_bytes_free(&out);
}

static void test_chunking_invariant(void **st) {
    size_t n = 5 * 2048 + 77;
    float *x = sine(n, 440, 0.8);
    for (int f = DR_AF_WAV; f <= DR_AF_PCM; f++) {
        dr_bytes one = {0}, many = {0};
        encode((dr_audio_format)f, 0, x, n, 0, &one);
        encode((dr_audio_format)f, 0, x, n, 333, &many);
        assert_int_equal(one.len, many.len);
        assert_memory_equal(one.data, many.data, one.len);
        assert_int_equal(one.len, (f == DR_AF_WAV ? 44 : 0) + 2 * n);
        dr_bytes_free(&one);
        dr_bytes_free(&many);
    }
    /* the same chunk schedule gives the same bytes for every format (whole = streamed) */
    for (int f = DR_AF_WAV; f <= DR_AF_OPUS; f++) {
        dr_bytes a = {0}, b = {0};
        encode((dr_audio_format)f, f == DR_AF_PCM ? 24000 : 0, x, n, 2048 * 4, &a);
        encode((dr_audio_format)f, f == DR_AF_PCM ? 24000 : 0, x, n, 2048 * 4, &b);
        assert_true(a.len > 0);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.data, b.data, a.len);
        dr_bytes_free(&a);
        dr_bytes_free(&b);
    }
    free(x);
}

static int zero_crossings(const int16_t *s, size_t n) {
    int c = 0;
    for (size_t i = 1; i < n; i++) c += (s[i - 1] < 0) != (s[i] < 0);
    return c;
}

static void test_resample_24k(void **st) {
    size_t n = RATE; /* one second of 441 Hz */
    float *x = sine(n, 441, 0.5);
    dr_bytes out = {0};
    encode(DR_AF_PCM, 24000, x, n, 2048 * 16, &out);
    size_t got = out.len / 2;
    assert_true(got >= 23990 && got <= 24010);
    int16_t *s = malloc(out.len);
    memcpy(s, out.data, out.len);
    int zc = zero_crossings(s + 1000, 22000); /* away from the filter's edges */
    double hz = zc / 2.0 / (22000 / 24000.0);
    if (fabs(hz - 441) > 3) fail_msg("resampled pitch %.1f Hz, want 441", hz);
    int16_t peak = 0;
    for (size_t i = 1000; i < 23000; i++) peak = s[i] > peak ? s[i] : peak;
    assert_true(abs(peak - 16384) < 200);
    free(s);
    free(x);
    dr_bytes_free(&out);
}

static void test_mp3_frames(void **st) {
    size_t n = RATE * 2;
    float *x = sine(n, 300, 0.5);
    dr_bytes out = {0};
    encode(DR_AF_MP3, 0, x, n, 2048 * 16, &out);
    /* CBR 128 kbit/s at 44.1 kHz: 417 or 418 bytes per 1152-sample frame; walk the frames */
    size_t off = 0, frames = 0;
    while (off + 4 <= out.len) {
        const uint8_t *h = out.data + off;
        if (h[0] != 0xFF || (h[1] & 0xFE) != 0xFA) fail_msg("no MPEG-1 Layer III sync at byte %zu", off);
        assert_int_equal(h[2] >> 4, 9);          /* bitrate index 9 = 128 kbit/s */
        assert_int_equal((h[2] >> 2) & 3, 0);    /* 44100 Hz */
        assert_int_equal(h[3] >> 6, 3);          /* single channel */
        off += 144 * 128000 / RATE + ((h[2] >> 1) & 1);
        frames++;
    }
    assert_int_equal(off, out.len);
    assert_true(frames >= n / 1152 && frames <= n / 1152 + 4);
    free(x);
    dr_bytes_free(&out);
}

static void test_opus_headers(void **st) {
    size_t n = RATE;
    float *x = sine(n, 300, 0.5);
    dr_bytes out = {0};
    encode(DR_AF_OPUS, 0, x, n, 2048 * 16, &out);
    assert_true(out.len > 100);
    assert_memory_equal(out.data, "OggS", 4);
    assert_int_equal(u32(out.data + 14), 1234);  /* stream serial number */
    assert_memory_equal(out.data + 28, "OpusHead", 8);
    assert_int_equal(out.data[37], 1);           /* channels */
    assert_int_equal(u32(out.data + 40), RATE);  /* input sample rate */
    /* every page starts with the capture pattern and the last one ends the stream */
    size_t off = 0, last = 0;
    while (off + 27 <= out.len) {
        assert_memory_equal(out.data + off, "OggS", 4);
        last = off;
        size_t segs = out.data[off + 26], body = 0;
        for (size_t k = 0; k < segs; k++) body += out.data[off + 27 + k];
        off += 27 + segs + body;
    }
    assert_int_equal(off, out.len);
    assert_true(out.data[last + 5] & 4); /* end of stream */
    free(x);
    dr_bytes_free(&out);
}

static void test_nonfinite(void **st) {
    for (int f = DR_AF_WAV; f <= DR_AF_OPUS; f++) {
        dr_encoder_opts o = {(dr_audio_format)f, RATE, 0, 1};
        dr_encoder *enc = NULL;
        dr_bytes out = {0};
        drama_error err = {0};
        assert_int_equal(dr_encoder_create(&enc, &o, &out, &err), DRAMA_OK);
        float x[4] = {0, 0.1f, NAN, 0};
        assert_int_equal(dr_encoder_feed(enc, x, 4, &out, &err), DRAMA_ENUMERIC);
        assert_non_null(strstr(err.message, "sample 2"));
        dr_encoder_free(enc);
        dr_bytes_free(&out);
    }
    dr_audio_format f;
    assert_true(dr_audio_format_parse("opus", &f) && f == DR_AF_OPUS);
    assert_false(dr_audio_format_parse("aac", &f));
    assert_string_equal(dr_audio_format_content_type(DR_AF_PCM, 1), "audio/pcm");
    assert_string_equal(dr_audio_format_content_type(DR_AF_PCM, 0), "application/octet-stream");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcm16_and_wav), cmocka_unit_test(test_chunking_invariant),
        cmocka_unit_test(test_resample_24k),  cmocka_unit_test(test_mp3_frames),
        cmocka_unit_test(test_opus_headers),  cmocka_unit_test(test_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
