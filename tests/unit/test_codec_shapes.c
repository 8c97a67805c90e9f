/* The codec at a configuration unlike the golden ones (3 encoder/decoder stages, other strides,
 * 4 codebooks of other sizes, other widths, heads and windows), random weights made from
 * dr_codec_expected: it loads, decodes causally (changing frame j changes nothing before sample
 * frame_length * j), streams bit-identically in any chunking, encodes ceil(n / frame) frames
 * deterministically, and is only checked (nothing loaded) with parts = 0. BF16 weights are
 * widened at load. */
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

static const char *k_json =
    "{\"encoder_rates\": [2, 4, 3], \"decoder_rates\": [3, 4, 2], \"hop_length\": 24, \"frame_length\": 96,"
    " \"quantizer\": {\"downsample_factor\": [2, 2], \"n_codebooks\": 3, \"codebook_size\": 40,"
    "   \"semantic_codebook_size\": 50, \"codebook_dim\": 4, \"input_dim\": 48,"
    "   \"pre_module\": {\"n_head\": 3, \"n_local_heads\": 3, \"head_dim\": 16, \"window_size\": 3},"
    "   \"post_module\": {\"n_head\": 2, \"n_local_heads\": 2, \"head_dim\": 24, \"window_size\": 5}},"
    " \"encoder_transformer\": {\"n_head\": 2, \"n_local_heads\": 2, \"head_dim\": 24, \"window_size\": 6,"
    "   \"block\": \"encoder.block.3.block.5\", \"rope_cos_sin_dtype\": \"float32\"},"
    " \"codes\": {\"num_codebooks\": 4, \"decode_upper_clamp\": [49, 39, 39, 39]}}";

typedef struct set {
    dr_tensor t[600];
    char *names[600];
    float *data[600];
    int n;
    uint64_t rng;
} set;

static float urand(set *s) {
    s->rng ^= s->rng << 13, s->rng ^= s->rng >> 7, s->rng ^= s->rng << 17;
    return (float)(s->rng >> 40) / (float)(1 << 24);
}

static int ends(const char *a, const char *b) {
    size_t x = strlen(a), y = strlen(b);
    return x >= y && !strcmp(a + x - y, b);
}

static void add(void *ctx, const char *name, int ndim, const int64_t *shape) {
    set *s = ctx;
    assert_true(s->n < 600);
    dr_tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    s->names[s->n] = strdup(name);
    t->name = s->names[s->n];
    t->dtype = DR_DT_F32;
    t->ndim = ndim;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], n *= shape[i];
    float *d = malloc((size_t)n * 4 + 4);
    int gain = ends(name, ".alpha") || ends(name, "original0") || ends(name, "weight_g") || ends(name, "norm.weight") ||
               ends(name, ".gamma") || ends(name, "codebook.weight");
    double fan = ndim >= 2 ? (double)(n / shape[0]) : 1.0;
    for (int64_t i = 0; i < n; i++) d[i] = gain ? 0.5f + urand(s) : (float)((2.0 * urand(s) - 1.0) * sqrt(3.0 / fan));
    t->data = (const uint8_t *)d;
    t->nbytes = (size_t)n * 4;
    s->data[s->n++] = d;
}

static void free_set(set *s) {
    for (int i = 0; i < s->n; i++) free(s->names[i]), free(s->data[i]);
}

static void cfg(dr_codec_config *c) {
    drama_error e = {0};
    dr_codec_config_default(c);
    c->encoder_dim = 6, c->latent_dim = 48, c->decoder_dim = 32;
    c->enc_tf.dim = 48, c->enc_tf.n_layer = 2, c->enc_tf.intermediate_size = 40;
    c->pre.dim = 48, c->pre.n_layer = 1, c->pre.intermediate_size = 56;
    c->post.dim = 48, c->post.n_layer = 2, c->post.intermediate_size = 64;
    if (dr_codec_config_parse(k_json, strlen(k_json), "shapes.json", c, &e)) fail_msg("%s", e.message);
    if (dr_codec_config_validate(c, &e)) fail_msg("%s", e.message);
}

static void test_other_shapes(void **state) {
    (void)state;
    dr_codec_config c;
    cfg(&c);
    set *s = calloc(1, sizeof *s);
    s->rng = 0x1234567887654321ull;
    drama_error e = {0};
    assert_int_equal(dr_codec_expected(&c, add, s, &e), DRAMA_OK);
    printf("random codec: %d tensors\n", s->n);
    /* check only: nothing loaded, no decoder */
    dr_codec *codec = NULL;
    assert_int_equal(dr_codec_load(s->t, s->n, &c, 0, "check", &codec, &e), DRAMA_OK);
    dr_codec_stream *st = NULL;
    assert_int_not_equal(dr_codec_stream_create(codec, &st, &e), DRAMA_OK);
    dr_codec_free(codec);
    /* the derived config from the tensors alone (no codec.json shape keys) agrees */
    if (dr_codec_load(s->t, s->n, &c, DR_CODEC_LOAD_ALL, "shapes", &codec, &e)) fail_msg("%s", e.message);
    const dr_codec_config *lc = dr_codec_cfg(codec);
    assert_int_equal(lc->num_codebooks, 4);
    assert_int_equal(lc->frame_length, 96);
    assert_int_equal(lc->post.n_layer, 2);
    int K = 4, FL = 96, T = 9;
    int32_t a[9 * 4], b[9 * 4];
    for (int i = 0; i < T * K; i++) a[i] = b[i] = (int32_t)((uint32_t)(i * 2654435761u) >> 7) % (i % K ? 40 : 50);
    b[5 * K + 2] = (b[5 * K + 2] + 7) % 40; /* change frame 5 */
    float *ya = malloc(sizeof(float) * T * FL), *yb = malloc(sizeof(float) * T * FL), *yc = malloc(sizeof(float) * T * FL);
    assert_int_equal(dr_codec_decode(codec, a, T, ya, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(codec, b, T, yb, &e), DRAMA_OK);
    assert_memory_equal(ya, yb, sizeof(float) * 5 * FL); /* causal: nothing before frame 5 changes */
    double diff = 0;
    for (int i = 5 * FL; i < T * FL; i++) diff += fabs(ya[i] - yb[i]);
    printf("change at frame 5: sum |diff| after = %.4g\n", diff);
    assert_true(diff > 0);
    for (int i = 0; i < T * FL; i++) assert_true(isfinite(ya[i]) && fabsf(ya[i]) <= 1.0f);
    /* streaming 2 + 3 + 4 frames, with 2 threads: bit-identical */
    dr_pool *pool = dr_pool_create(2);
    assert_int_equal(dr_codec_stream_create(codec, &st, &e), DRAMA_OK);
    dr_codec_stream_set_pool(st, pool);
    assert_int_equal(dr_codec_stream_feed(st, a, 2, yc, &e), DRAMA_OK);
    assert_int_equal(dr_codec_stream_feed(st, a + 2 * K, 3, yc + 2 * FL, &e), DRAMA_OK);
    assert_int_equal(dr_codec_stream_feed(st, a + 5 * K, 4, yc + 5 * FL, &e), DRAMA_OK);
    assert_memory_equal(ya, yc, sizeof(float) * T * FL);
    dr_codec_stream_free(st);
    dr_codec_set_pool(codec, pool);
    /* encode: ceil(n / 96) frames, codes in range, same result with and without threads */
    int32_t *c1 = NULL, *c2 = NULL;
    int64_t T1, T2;
    assert_int_equal(dr_codec_encode(codec, ya, 8 * FL + 5, &c1, &T1, NULL, NULL, &e), DRAMA_OK);
    assert_int_equal(T1, 9);
    dr_codec_set_pool(codec, NULL);
    assert_int_equal(dr_codec_encode(codec, ya, 8 * FL + 5, &c2, &T2, NULL, NULL, &e), DRAMA_OK);
    assert_memory_equal(c1, c2, sizeof(int32_t) * T1 * K);
    assert_int_equal(dr_codec_check_codes(lc, c1, T1, "encoded", &e), DRAMA_OK);
    /* sample arithmetic (CODEC.md 5): T = ceil(N / frame_length); the prefix of a clip encodes the
     * complete frames identically (only the zero-padded last frame depends on later audio) */
    static const int64_t ns[][2] = {{1, 1}, {95, 1}, {96, 1}, {97, 2}, {3 * 96, 3}};
    for (int i = 0; i < 5; i++) {
        int32_t *cc = NULL;
        int64_t TT;
        assert_int_equal(dr_codec_encode(codec, ya, ns[i][0], &cc, &TT, NULL, NULL, &e), DRAMA_OK);
        assert_int_equal(TT, ns[i][1]);
        if (ns[i][0] % FL == 0) assert_memory_equal(cc, c1, sizeof(int32_t) * TT * K);
        free(cc);
    }
    free(c2);
    assert_int_equal(dr_codec_encode(codec, ya, 0, &c2, &T2, NULL, NULL, &e), DRAMA_EEMPTY);
    ya[3] = NAN;
    assert_int_equal(dr_codec_encode(codec, ya, 10, &c2, &T2, NULL, NULL, &e), DRAMA_ENUMERIC);
    /* out-of-range codes: rejected by the check, clamped by the decoder */
    a[1] = 45;
    assert_int_equal(dr_codec_check_codes(lc, a, T, "a", &e), DRAMA_EINVAL);
    free(c1), free(c2), free(ya), free(yb), free(yc);
    dr_codec_free(codec);
    dr_pool_free(pool);
    free_set(s);
    free(s);
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void test_bf16_widened(void **state) {
    (void)state;
    dr_codec_config c;
    cfg(&c);
    set *s = calloc(1, sizeof *s);
    s->rng = 99;
    drama_error e = {0};
    assert_int_equal(dr_codec_expected(&c, add, s, &e), DRAMA_OK);
    /* round every weight to bf16 first (the f32 reference), then store half of them as BF16 */
    for (int i = 0; i < s->n; i++) {
        int64_t n = (int64_t)s->t[i].nbytes / 4;
        for (int64_t k = 0; k < n; k++) {
            uint32_t u = (uint32_t)bf16(s->data[i][k]) << 16;
            memcpy(&s->data[i][k], &u, 4);
        }
    }
    dr_codec *ref = NULL, *half = NULL;
    assert_int_equal(dr_codec_load(s->t, s->n, &c, DR_CODEC_LOAD_DECODER, "f32", &ref, &e), DRAMA_OK);
    uint16_t *store[600] = {0};
    for (int i = 0; i < s->n; i += 2) {
        int64_t n = (int64_t)s->t[i].nbytes / 4;
        store[i] = malloc((size_t)n * 2 + 2);
        for (int64_t k = 0; k < n; k++) store[i][k] = bf16(s->data[i][k]);
        s->t[i].dtype = DR_DT_BF16;
        s->t[i].data = (const uint8_t *)store[i];
        s->t[i].nbytes = (size_t)n * 2;
    }
    assert_int_equal(dr_codec_load(s->t, s->n, &c, DR_CODEC_LOAD_DECODER, "bf16", &half, &e), DRAMA_OK);
    int32_t codes[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    float ya[3 * 96], yb[3 * 96];
    assert_int_equal(dr_codec_decode(ref, codes, 3, ya, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(half, codes, 3, yb, &e), DRAMA_OK);
    assert_memory_equal(ya, yb, sizeof ya); /* same values, widened exactly */
    for (int i = 0; i < s->n; i++) free(store[i]);
    dr_codec_free(ref), dr_codec_free(half);
    free_set(s);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_bf16_widened),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
