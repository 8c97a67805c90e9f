/* Golden tests of the codec (golden/README.md "Codec"): decode of fixed codes, the decoder's
 * clamp, streaming chunkings (1, 4, 11; 1, 4, 25, the rest) bit-identical to the whole decode, encode codes exact,
 * intermediates as diagnostics. Bound: waveform max abs 1e-4 (RMSE reported). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/pool.h"
#include "codec/codec.h"
#include "testutil.h"

#define GOLD "codec/codec-golden.safetensors"

static dr_codec *g_codec;

static int setup(void **state) {
    (void)state;
    drama_error e = {0};
    if (dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_ALL, &g_codec, &e)) {
        fprintf(stderr, "codec load: %s\n", e.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dr_codec_free(g_codec);
    return 0;
}

/* golden codes are [codebook][frame]; the engine takes [frame][codebook] */
static int32_t *load_codes(const char *name, int64_t *frames) {
    return tu_load_codes(tu_golden(GOLD), name, dr_codec_cfg(g_codec)->num_codebooks, frames);
}

typedef struct taps {
    const char *prefix;
    int checked;
} taps;

static void tap_compare(void *ctx, const char *name, const float *x, int ch, int64_t steps) {
    taps *t = ctx;
    char gname[64];
    snprintf(gname, sizeof gname, "%s.%s", t->prefix, name);
    int64_t n;
    float *ref = tu_load_f32(tu_golden(GOLD), gname, &n);
    if (n != ch * steps) {
        printf("%s: size %lld != golden %lld (streamed in chunks?)\n", gname, (long long)(ch * steps), (long long)n);
        free(ref);
        return;
    }
    char label[80];
    snprintf(label, sizeof label, "%s (diagnostic)", gname);
    tu_report(label, tu_compare_f32(x, ref, n), 1e30);
    t->checked++;
    free(ref);
}

static void test_decode(void **state) {
    (void)state;
    int64_t T, n;
    int32_t *codes = load_codes("decode.codes", &T);
    float *ref = tu_load_f32(tu_golden(GOLD), "decode.wav", &n);
    int FL = dr_codec_cfg(g_codec)->frame_length;
    assert_int_equal(n, T * FL);
    float *out = malloc((size_t)n * sizeof *out);
    dr_codec_stream *s;
    drama_error e = {0};
    assert_int_equal(dr_codec_stream_create(g_codec, &s, &e), DRAMA_OK);
    taps tp = {"decode", 0};
    dr_codec_stream_set_tap(s, tap_compare, &tp);
    if (dr_codec_stream_feed(s, codes, T, out, &e)) fail_msg("%s", e.message);
    assert_int_equal(tp.checked, 3);
    assert_true(tu_report("decode.wav", tu_compare_f32(out, ref, n), 1e-4));
    /* streaming: chunks of 1, 4, then 11 frames, bit-identical to the whole decode */
    float *st = malloc((size_t)n * sizeof *st);
    dr_codec_stream_reset(s);
    dr_codec_stream_set_tap(s, NULL, NULL);
    int64_t chunks[3] = {1, 4, 11}, f = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dr_codec_stream_feed(s, codes + f * 10, chunks[i], st + f * FL, &e), DRAMA_OK);
        char label[64];
        snprintf(label, sizeof label, "stream chunk %d (%lld frames)", i, (long long)chunks[i]);
        assert_true(tu_report(label, tu_compare_f32(st + f * FL, ref + f * FL, chunks[i] * FL), 1e-4));
        f += chunks[i];
    }
    assert_int_equal(f, T);
    assert_int_equal(dr_codec_stream_frames(s), T);
    assert_memory_equal(st, out, (size_t)n * sizeof *st);
    /* every frame one at a time, and a prefix: also bit-identical */
    dr_codec_stream_reset(s);
    for (int64_t k = 0; k < T; k++) assert_int_equal(dr_codec_stream_feed(s, codes + k * 10, 1, st + k * FL, &e), DRAMA_OK);
    assert_memory_equal(st, out, (size_t)n * sizeof *st);
    assert_int_equal(dr_codec_decode(g_codec, codes, 5, st, &e), DRAMA_OK);
    assert_memory_equal(st, out, (size_t)5 * FL * sizeof *st);
    for (int64_t i = 0; i < n; i++) assert_true(out[i] > -1.0f && out[i] < 1.0f);
    dr_codec_stream_free(s);
    free(codes), free(ref), free(out), free(st);
}

static void test_clamp(void **state) {
    (void)state;
    int64_t T, n;
    int32_t *codes = load_codes("clamp.codes", &T);
    float *ref = tu_load_f32(tu_golden(GOLD), "clamp.wav", &n);
    float *out = malloc((size_t)n * sizeof *out);
    drama_error e = {0};
    /* entry points reject such codes ... */
    assert_int_equal(dr_codec_check_codes(dr_codec_cfg(g_codec), codes, T, "clamp.codes", &e), DRAMA_EINVAL);
    printf("check_codes: %s\n", e.message);
    /* ... the decoder clamps them as the reference does */
    dr_error_clear(&e);
    assert_int_equal(dr_codec_decode(g_codec, codes, T, out, &e), DRAMA_OK);
    assert_true(tu_report("clamp.wav", tu_compare_f32(out, ref, n), 1e-4));
    codes[3] = -1;
    assert_int_equal(dr_codec_decode(g_codec, codes, T, out, &e), DRAMA_EINVAL);
    free(codes), free(ref), free(out);
}

/* The chunking of the issue (1, 4, 25, the rest) on a stream longer than the golden one (the
 * golden codes three times over, so the attention window and every conv history wrap many
 * times): bit-identical to the whole decode, with and without threads, and its first frames
 * equal the golden decode (no look-ahead). */
static void test_stream_1_4_25_rest(void **state) {
    (void)state;
    int64_t T0, n0;
    int32_t *codes0 = load_codes("decode.codes", &T0);
    float *ref = tu_load_f32(tu_golden(GOLD), "decode.wav", &n0);
    const dr_codec_config *cf = dr_codec_cfg(g_codec);
    int64_t K = cf->num_codebooks, FL = cf->frame_length, T = 3 * T0, n = T * FL;
    assert_true(T > 1 + 4 + 25);
    int32_t *codes = malloc((size_t)(T * K) * sizeof *codes);
    for (int r = 0; r < 3; r++) memcpy(codes + r * T0 * K, codes0, (size_t)(T0 * K) * sizeof *codes);
    float *whole = malloc((size_t)n * sizeof *whole), *st = malloc((size_t)n * sizeof *st);
    drama_error e = {0};
    assert_int_equal(dr_codec_decode(g_codec, codes, T, whole, &e), DRAMA_OK);
    assert_true(tu_report("stream 1/4/25/rest: first frames vs golden", tu_compare_f32(whole, ref, n0), 1e-4));
    dr_pool *pool = dr_pool_create(2);
    for (int threads = 0; threads < 2; threads++) {
        dr_codec_stream *s;
        assert_int_equal(dr_codec_stream_create(g_codec, &s, &e), DRAMA_OK);
        dr_codec_stream_set_pool(s, threads ? pool : NULL);
        int64_t chunks[4] = {1, 4, 25, T - 30}, f = 0;
        for (int i = 0; i < 4; i++) {
            if (dr_codec_stream_feed(s, codes + f * K, chunks[i], st + f * FL, &e)) fail_msg("%s", e.message);
            f += chunks[i];
        }
        assert_int_equal(dr_codec_stream_frames(s), T);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&st[i], &whole[i], sizeof *st))
                fail_msg("threads %d: sample %lld (frame %lld) differs: %.9g vs %.9g", threads, (long long)i,
                         (long long)(i / FL), st[i], whole[i]);
        printf("chunks 1/4/25/%lld (%s): %lld samples bit-identical to the whole decode\n", (long long)(T - 30),
               threads ? "2 threads" : "inline", (long long)n);
        dr_codec_stream_free(s);
    }
    dr_pool_free(pool);
    free(codes0), free(codes), free(ref), free(whole), free(st);
}

/* the encoder runs in chunks: gather each intermediate, compare at the end */
typedef struct gather {
    const char *names[3];
    float *buf[3];
    int ch[3];
    int64_t len[3];
} gather;

static void tap_gather(void *ctx, const char *name, const float *x, int ch, int64_t steps) {
    gather *g = ctx;
    for (int i = 0; i < 3; i++) {
        if (strcmp(g->names[i], name)) continue;
        int64_t old = g->len[i];
        float *nb = malloc((size_t)(ch * (old + steps)) * sizeof *nb);
        for (int c = 0; c < ch; c++) {
            if (old) memcpy(nb + c * (old + steps), g->buf[i] + c * old, (size_t)old * 4);
            memcpy(nb + c * (old + steps) + old, x + c * steps, (size_t)steps * 4);
        }
        free(g->buf[i]);
        g->buf[i] = nb, g->ch[i] = ch, g->len[i] = old + steps;
    }
}

static void test_encode(void **state) {
    (void)state;
    int64_t n, T, Tg;
    float *wav = tu_load_f32(tu_golden(GOLD), "encode.wav", &n);
    int32_t *ref = load_codes("encode.codes", &Tg);
    int32_t *codes = NULL;
    drama_error e = {0};
    gather g = {{"z_enc", "z_down", "z_pre"}, {0}, {0}, {0}};
    if (dr_codec_encode(g_codec, wav, n, &codes, &T, tap_gather, &g, &e)) fail_msg("%s", e.message);
    taps tp = {"encode", 0};
    for (int i = 0; i < 3; i++) {
        tap_compare(&tp, g.names[i], g.buf[i], g.ch[i], g.len[i]);
        free(g.buf[i]);
    }
    assert_int_equal(tp.checked, 3);
    assert_int_equal(T, Tg);
    assert_int_equal(T, (n + 2047) / 2048);
    int K = dr_codec_cfg(g_codec)->num_codebooks, bad = 0;
    float *margin = tu_load_f32(tu_golden(GOLD), "encode.vq_margin", NULL);
    for (int64_t f = 0; f < T; f++)
        for (int k = 0; k < K; k++)
            if (codes[f * K + k] != ref[f * K + k]) {
                if (bad++ < 10)
                    printf("mismatch frame %lld codebook %d: %d vs golden %d (margin %.3g)\n", (long long)f, k,
                           codes[f * K + k], ref[f * K + k], margin[k * T + f]);
            }
    printf("encode.codes: %d of %lld codes differ\n", bad, (long long)(T * K));
    assert_int_equal(bad, 0);
    free(wav), free(ref), free(codes), free(margin);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_clamp),
        cmocka_unit_test(test_stream_1_4_25_rest),
        cmocka_unit_test(test_encode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
