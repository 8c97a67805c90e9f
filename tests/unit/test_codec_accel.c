/* The device-decoder seam of the codec (dr_codec_accel, codec.h) without a device: a stand-in
 * accelerator that decodes on a second CPU codec. Streams of a codec with one attached go through
 * it (create, feed in sub-chunks of <= 16 frames, reset, free), the samples equal the CPU decode
 * bit for bit, codes are checked before it is called, a failing feed resets the stream, views stay
 * on the CPU, and detaching or freeing the codec frees the accelerator once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "codec/codec.h"
#include "codec/view.h"
#include "testutil.h"

typedef struct fake {
    dr_codec *cpu;          /* decodes for the stand-in */
    int creates, frees, resets, feeds, max_feed, fail_at, ctx_freed;
} fake;

static fake g_fake;

static drama_status f_create(void *ctx, void **st, drama_error *err) {
    fake *f = ctx;
    f->creates++;
    return dr_codec_stream_create(f->cpu, (dr_codec_stream **)st, err);
}
static void f_free(void *ctx, void *st) {
    ((fake *)ctx)->frees++;
    dr_codec_stream_free(st);
}
static void f_reset(void *ctx, void *st) {
    ((fake *)ctx)->resets++;
    dr_codec_stream_reset(st);
}
static drama_status f_feed(void *ctx, void *st, const int32_t *codes, int64_t n, float *out, drama_error *err) {
    fake *f = ctx;
    f->feeds++;
    if (n > f->max_feed) f->max_feed = (int)n;
    if (f->fail_at && f->feeds == f->fail_at) return dr_fail(err, DRAMA_EINTERNAL, "stand-in: planted failure");
    return dr_codec_stream_feed(st, codes, n, out, err);
}
static void f_ctx_free(void *ctx) { ((fake *)ctx)->ctx_freed++; }

static dr_codec *open_codec(void) {
    dr_codec *c = NULL;
    drama_error e = {0};
    if (dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_ALL, &c, &e)) fail_msg("codec load: %s", e.message);
    return c;
}

static void attach(dr_codec *c) {
    dr_codec_accel a = {"stand-in", &g_fake, f_create, f_free, f_reset, f_feed, f_ctx_free};
    dr_codec_set_accel(c, &a);
}

static void test_seam(void **state) {
    (void)state;
    memset(&g_fake, 0, sizeof g_fake);
    g_fake.cpu = open_codec();
    dr_codec *c = open_codec(), *ref = open_codec();
    const dr_codec_config *cf = dr_codec_cfg(c);
    int K = cf->num_codebooks, FL = cf->frame_length;
    int64_t T = 40;
    int32_t *codes = malloc((size_t)(T * K) * sizeof *codes);
    for (int64_t i = 0; i < T * K; i++) codes[i] = (int32_t)((i * 7919) % (i % K ? cf->codebook_size : cf->semantic_codebook_size));
    float *want = malloc((size_t)(T * FL) * 4), *got = malloc((size_t)(T * FL) * 4);
    drama_error e = {0};
    assert_int_equal(dr_codec_decode(ref, codes, T, want, &e), DRAMA_OK);
    assert_string_equal(dr_codec_decoder_name(c), "cpu");
    attach(c);
    assert_string_equal(dr_codec_decoder_name(c), "stand-in");
    /* a view (the encoder's) stays on the CPU */
    dr_codec *view = NULL;
    assert_int_equal(dr_codec_view_create(c, NULL, &view, &e), DRAMA_OK);
    assert_string_equal(dr_codec_decoder_name(view), "cpu");
    dr_codec_view_free(view);
    /* a whole decode of 40 frames: one stream, sub-chunks 16 + 16 + 8 */
    assert_int_equal(dr_codec_decode(c, codes, T, got, &e), DRAMA_OK);
    assert_int_equal(g_fake.creates, 1);
    assert_int_equal(g_fake.frees, 1);
    assert_int_equal(g_fake.feeds, 3);
    assert_int_equal(g_fake.max_feed, 16);
    assert_memory_equal(got, want, (size_t)(T * FL) * 4);
    /* a negative code is refused before the accelerator runs */
    dr_codec_stream *s = NULL;
    assert_int_equal(dr_codec_stream_create(c, &s, &e), DRAMA_OK);
    codes[5 * K + 2] = -3;
    assert_int_equal(dr_codec_stream_feed(s, codes, T, got, &e), DRAMA_EINVAL);
    printf("negative code: %s\n", e.message);
    assert_int_equal(g_fake.feeds, 3);
    codes[5 * K + 2] = 1;
    /* a failing feed resets the stream (frames back to 0) */
    g_fake.fail_at = 5;
    dr_error_clear(&e);
    assert_int_equal(dr_codec_stream_feed(s, codes, T, got, &e), DRAMA_EINTERNAL);
    assert_int_equal(dr_codec_stream_frames(s), 0);
    assert_true(g_fake.resets >= 1);
    g_fake.fail_at = 0;
    dr_codec_stream_free(s);
    assert_int_equal(g_fake.frees, 2);
    /* detaching frees the accelerator once; the codec decodes on the CPU again */
    dr_codec_set_accel(c, NULL);
    assert_int_equal(g_fake.ctx_freed, 1);
    assert_string_equal(dr_codec_decoder_name(c), "cpu");
    assert_int_equal(dr_codec_decode(c, codes, T, got, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(ref, codes, T, want, &e), DRAMA_OK);
    assert_memory_equal(got, want, (size_t)(T * FL) * 4);
    /* freeing a codec with one attached frees it too */
    attach(c);
    dr_codec_free(c);
    assert_int_equal(g_fake.ctx_freed, 2);
    dr_codec_free(ref);
    dr_codec_free(g_fake.cpu);
    free(codes), free(want), free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_seam)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
