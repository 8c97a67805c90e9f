/* The codec decoder on the CUDA device (backend/cuda/cuda_codec.h) with the tiny golden codec:
 * decode and clamp vs the golden waveforms (max abs 1e-4, the CPU test's bound) and vs the CPU
 * decode of the same codes (max abs 1e-4); streaming in chunks 1/4/11, 1/4/25/rest on a 3x longer
 * stream and one frame per call bit-identical to the device's whole decode; negative codes refused.
 * Exit 77 (skipped, reason printed) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_codec.h"
#include "codec/codec.h"
#include "testutil.h"

#define GOLD "codec/codec-golden.safetensors"

static dr_codec *g_dev, *g_cpu; /* the same codec.pth: one on the device, one on the CPU */

static int setup(void **state) {
    (void)state;
    drama_error e = {0};
    if (dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_DECODER, &g_dev, &e) ||
        dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_DECODER, &g_cpu, &e)) {
        fprintf(stderr, "codec load: %s\n", e.message);
        return -1;
    }
    if (dr_cuda_codec_attach(g_dev, 0, &e)) {
        fprintf(stderr, "attach: %s\n", e.message);
        return -1;
    }
    if (strcmp(dr_codec_decoder_name(g_dev), "cuda") || strcmp(dr_codec_decoder_name(g_cpu), "cpu")) return -1;
    printf("device decoder: %zu bytes of weights\n", dr_cuda_codec_weight_bytes(g_dev));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dr_codec_free(g_dev);
    dr_codec_free(g_cpu);
    return 0;
}

/* golden codes are [codebook][frame]; the engine takes [frame][codebook] */
static int32_t *load_codes(const char *name, int64_t *frames) {
    return tu_load_codes(tu_golden(GOLD), name, dr_codec_cfg(g_dev)->num_codebooks, frames);
}

static void feed_chunks(dr_codec_stream *s, const int32_t *codes, const int64_t *chunks, int n_chunks, int K, int FL,
                        float *out) {
    drama_error e = {0};
    int64_t f = 0;
    dr_codec_stream_reset(s);
    for (int i = 0; i < n_chunks; i++) {
        if (dr_codec_stream_feed(s, codes + f * K, chunks[i], out + f * FL, &e)) fail_msg("%s", e.message);
        f += chunks[i];
    }
    assert_int_equal(dr_codec_stream_frames(s), f);
}

static void first_diff(const float *a, const float *b, int64_t n, int FL, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a))
            fail_msg("%s: sample %lld (frame %lld) differs: %.9g vs %.9g", what, (long long)i, (long long)(i / FL), a[i], b[i]);
    printf("%s: %lld samples bit-identical to the whole device decode\n", what, (long long)n);
}

static void test_decode(void **state) {
    (void)state;
    int64_t T, n;
    int32_t *codes = load_codes("decode.codes", &T);
    float *ref = tu_load_f32(tu_golden(GOLD), "decode.wav", &n);
    const dr_codec_config *cf = dr_codec_cfg(g_dev);
    int K = cf->num_codebooks, FL = cf->frame_length;
    assert_int_equal(n, T * FL);
    float *out = malloc((size_t)n * 4), *cpu = malloc((size_t)n * 4), *st = malloc((size_t)n * 4);
    drama_error e = {0};
    assert_int_equal(dr_codec_decode(g_dev, codes, T, out, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(g_cpu, codes, T, cpu, &e), DRAMA_OK);
    assert_true(tu_report("cuda decode vs golden decode.wav", tu_compare_f32(out, ref, n), 1e-4));
    assert_true(tu_report("cuda decode vs cpu decode", tu_compare_f32(out, cpu, n), 1e-4));
    for (int64_t i = 0; i < n; i++) assert_true(out[i] > -1.0f && out[i] < 1.0f);
    dr_codec_stream *s;
    assert_int_equal(dr_codec_stream_create(g_dev, &s, &e), DRAMA_OK);
    int64_t c3[3] = {1, 4, 11};
    assert_int_equal(c3[0] + c3[1] + c3[2], T);
    feed_chunks(s, codes, c3, 3, K, FL, st);
    first_diff(st, out, n, FL, "cuda stream 1/4/11");
    int64_t ones[64];
    assert_true(T <= 64);
    for (int64_t i = 0; i < T; i++) ones[i] = 1;
    feed_chunks(s, codes, ones, (int)T, K, FL, st);
    first_diff(st, out, n, FL, "cuda stream 1 frame per call");
    /* a negative code: refused before anything runs; the stream goes on */
    codes[3] = -1;
    assert_int_equal(dr_codec_stream_feed(s, codes, 1, st, &e), DRAMA_EINVAL);
    printf("negative code: %s\n", e.message);
    dr_codec_stream_free(s);
    free(codes), free(ref), free(out), free(cpu), free(st);
}

static void test_clamp(void **state) {
    (void)state;
    int64_t T, n;
    int32_t *codes = load_codes("clamp.codes", &T);
    float *ref = tu_load_f32(tu_golden(GOLD), "clamp.wav", &n);
    float *out = malloc((size_t)n * 4);
    drama_error e = {0};
    assert_int_equal(dr_codec_decode(g_dev, codes, T, out, &e), DRAMA_OK);
    assert_true(tu_report("cuda clamp.wav", tu_compare_f32(out, ref, n), 1e-4));
    free(codes), free(ref), free(out);
}

/* 1, 4, 25, the rest on the golden codes three times over (the K/V ring and every history wrap) */
static void test_stream_long(void **state) {
    (void)state;
    int64_t T0, n0;
    int32_t *codes0 = load_codes("decode.codes", &T0);
    float *ref = tu_load_f32(tu_golden(GOLD), "decode.wav", &n0);
    const dr_codec_config *cf = dr_codec_cfg(g_dev);
    int64_t K = cf->num_codebooks, FL = cf->frame_length, T = 3 * T0, n = T * FL;
    int32_t *codes = malloc((size_t)(T * K) * sizeof *codes);
    for (int r = 0; r < 3; r++) memcpy(codes + r * T0 * K, codes0, (size_t)(T0 * K) * sizeof *codes);
    float *whole = malloc((size_t)n * 4), *st = malloc((size_t)n * 4), *cpu = malloc((size_t)n * 4);
    drama_error e = {0};
    assert_int_equal(dr_codec_decode(g_dev, codes, T, whole, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(g_cpu, codes, T, cpu, &e), DRAMA_OK);
    assert_true(tu_report("cuda long stream: first frames vs golden", tu_compare_f32(whole, ref, n0), 1e-4));
    assert_true(tu_report("cuda long stream vs cpu", tu_compare_f32(whole, cpu, n), 1e-4));
    dr_codec_stream *s;
    assert_int_equal(dr_codec_stream_create(g_dev, &s, &e), DRAMA_OK);
    int64_t chunks[4] = {1, 4, 25, T - 30};
    feed_chunks(s, codes, chunks, 4, (int)K, (int)FL, st);
    first_diff(st, whole, n, (int)FL, "cuda stream 1/4/25/rest");
    dr_codec_stream_free(s);
    free(codes0), free(codes), free(ref), free(whole), free(st), free(cpu);
}

int main(void) {
    char why[256] = "";
    if (dr_cuda_device_count(why, sizeof why) <= 0) {
        printf("skipped: no CUDA device (%s)\n", why[0] ? why : "none found");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_clamp),
        cmocka_unit_test(test_stream_long),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
