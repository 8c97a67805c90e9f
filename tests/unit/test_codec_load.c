/* Codec configuration and loading: codec-real.json equals the built-in defaults, the expected
 * inventory of the real configuration equals golden codec-real-inventory.json, the tiny codec's
 * inventory equals its codec.pth, all weight-norm spellings load to the same decoder, and bad
 * tensor sets / codec.json files are refused with named errors. Results do not depend on the
 * thread count. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/pool.h"
#include "codec/codec.h"
#include "io/safetensors.h"
#include "io/torchzip.h"
#include "testutil.h"

static void test_real_json_equals_defaults(void **state) {
    (void)state;
    dr_codec_config def, real, tiny;
    dr_codec_config_default(&def);
    dr_codec_config_default(&real);
    drama_error e = {0};
    assert_int_equal(dr_codec_config_read(tu_golden("codec/codec-real.json"), &real, &e), DRAMA_OK);
    assert_true(dr_codec_config_equal(&def, &real));
    assert_int_equal(dr_codec_config_validate(&real, &e), DRAMA_OK);
    dr_codec_config_default(&tiny);
    assert_int_equal(dr_codec_config_read(tu_golden("codec/codec.json"), &tiny, &e), DRAMA_OK);
    assert_false(dr_codec_config_equal(&def, &tiny));
    assert_int_equal(tiny.pre.window_size, 8);
    assert_int_equal(tiny.enc_tf.window_size, 16);
    assert_int_equal(tiny.pre.n_head, 2);
    assert_int_equal(tiny.encoder_dim, 4);
}

static void test_bad_json(void **state) {
    (void)state;
    static const char *bad[][2] = {
        {"{\"sample_rate\": 44100, \"typo_key\": 1}", "typo_key"},
        {"{\"quantizer\": {\"pre_module\": {\"windw_size\": 8}}}", "quantizer.pre_module.windw_size"},
        {"{\"causal\": false}", "causal"},
        {"{\"encoder_rates\": [2, \"4\"]}", "encoder_rates"},
        {"{\"quantizer\": {\"convnext\": {\"gelu\": \"tanh\"}}}", "gelu"},
        {"{\"encoder_transformer\": {\"layer_scale\": false}}", "layer_scale"},
        {"{\"encoder_transformer\": {\"rope_cos_sin_dtype\": \"fp16\"}}", "rope_cos_sin_dtype"},
        {"[1, 2]", "expected an object"},
        {"{\"sample_rate\": 44100", "invalid JSON"},
        {"{\"a\": 1, \"a\": 2}", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dr_codec_config c;
        dr_codec_config_default(&c);
        drama_error e = {0};
        assert_int_not_equal(dr_codec_config_parse(bad[i][0], strlen(bad[i][0]), "x.json", &c, &e), DRAMA_OK);
        printf("  %s\n", e.message);
        if (!strstr(e.message, bad[i][1])) fail_msg("'%s' lacks '%s'", e.message, bad[i][1]);
    }
    /* consistency: hop_length must be the product of the encoder rates */
    dr_codec_config c;
    dr_codec_config_default(&c);
    drama_error e = {0};
    const char *j = "{\"hop_length\": 256}";
    assert_int_equal(dr_codec_config_parse(j, strlen(j), "x.json", &c, &e), DRAMA_OK);
    assert_int_not_equal(dr_codec_config_validate(&c, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "hop_length"));
}

typedef struct inv {
    json_t *list;
    int64_t params;
} inv;

static void collect(void *ctx, const char *name, int ndim, const int64_t *shape) {
    inv *v = ctx;
    json_t *s = json_array();
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) json_array_append_new(s, json_integer(shape[i])), n *= shape[i];
    json_array_append_new(v->list, json_pack("{s:s, s:o}", "name", name, "shape", s));
    v->params += n;
}

static int cmp_json_name(const void *a, const void *b) {
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

static void test_real_inventory(void **state) {
    (void)state;
    dr_codec_config c;
    dr_codec_config_default(&c);
    inv v = {json_array(), 0};
    drama_error e = {0};
    assert_int_equal(dr_codec_expected(&c, collect, &v, &e), DRAMA_OK);
    json_error_t je;
    json_t *g = json_load_file(tu_golden("codec/codec-real-inventory.json"), 0, &je);
    assert_non_null(g);
    json_t *gt = json_object_get(g, "tensors");
    size_t n = json_array_size(gt);
    printf("expected inventory: %zu tensors, %lld numbers; golden: %zu, %lld\n", json_array_size(v.list),
           (long long)v.params, n, (long long)json_integer_value(json_object_get(g, "n_params")));
    assert_int_equal(json_array_size(v.list), n);
    assert_int_equal(v.params, json_integer_value(json_object_get(g, "n_params")));
    json_t **a = malloc(n * sizeof *a), **b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) a[i] = json_array_get(v.list, i), b[i] = json_array_get(gt, i);
    qsort(a, n, sizeof *a, cmp_json_name);
    qsort(b, n, sizeof *b, cmp_json_name);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const char *na = json_string_value(json_object_get(a[i], "name")), *nb = json_string_value(json_object_get(b[i], "name"));
        if (strcmp(na, nb) || !json_equal(json_object_get(a[i], "shape"), json_object_get(b[i], "shape"))) {
            if (bad++ < 5) printf("differs: %s vs %s\n", na, nb);
        }
    }
    assert_int_equal(bad, 0);
    free(a), free(b);
    /* The golden real inventory itself, as tensors (names, shapes, F32; no data), passes the
     * load check with the built-in defaults and no codec.json, in both the 535-entry form and
     * the 541-entry form with the six stale S1-era buffers (CODEC.md 10.3, their real shapes). */
    dr_tensor *ts = calloc(n + 6, sizeof *ts);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(gt, i), *sh = json_object_get(x, "shape");
        ts[i].name = json_string_value(json_object_get(x, "name"));
        ts[i].dtype = DR_DT_F32;
        ts[i].ndim = (int)json_array_size(sh);
        int64_t numel = 1;
        for (int d = 0; d < ts[i].ndim; d++) numel *= ts[i].shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
        ts[i].nbytes = (size_t)numel * 4;
    }
    json_t *extra = json_object_get(g, "s1_era_extra_buffers");
    assert_int_equal(json_array_size(extra), 6);
    for (size_t i = 0; i < 6; i++) {
        dr_tensor *t = &ts[n + i];
        t->name = json_string_value(json_array_get(extra, i));
        t->dtype = DR_DT_F32;
        int64_t len = strstr(t->name, "encoder.") ? 16384 : 4096;
        int rope = strstr(t->name, "freqs_cis") != NULL;
        t->ndim = rope ? 3 : 2;
        t->shape[0] = len, t->shape[1] = rope ? 32 : len, t->shape[2] = 2;
        t->nbytes = (size_t)(len * (rope ? 64 : len)) * 4;
    }
    for (int form = 0; form < 2; form++) {
        dr_codec *checked = NULL;
        size_t count = form ? n + 6 : n;
        if (dr_codec_load(ts, (int64_t)count, &c, 0, "codec-real-inventory", &checked, &e))
            fail_msg("%zu-entry real inventory: %s", count, e.message);
        assert_true(dr_codec_config_equal(dr_codec_cfg(checked), &c));
        printf("real inventory, %zu entries: passes the load check with the defaults\n", count);
        dr_codec_free(checked);
    }
    free(ts);
    json_decref(g);
    json_decref(v.list);
}

static dr_pth *open_tiny(void) {
    dr_pth *p;
    drama_error e = {0};
    assert_int_equal(dr_pth_open(tu_golden("tiny-drama3/codec.pth"), &p, &e), DRAMA_OK);
    return p;
}

static void tiny_cfg(dr_codec_config *c) {
    drama_error e = {0};
    dr_codec_config_default(c);
    assert_int_equal(dr_codec_config_read(tu_golden("tiny-drama3/codec.json"), c, &e), DRAMA_OK);
}

static void test_tiny_inventory_equals_pth(void **state) {
    (void)state;
    dr_codec_config c;
    tiny_cfg(&c);
    inv v = {json_array(), 0};
    drama_error e = {0};
    assert_int_equal(dr_codec_expected(&c, collect, &v, &e), DRAMA_OK);
    dr_pth *p = open_tiny();
    assert_int_equal((int64_t)json_array_size(v.list), dr_pth_count(p));
    size_t i;
    json_t *x;
    json_array_foreach(v.list, i, x) {
        const dr_tensor *t = dr_pth_find(p, json_string_value(json_object_get(x, "name")));
        if (!t) fail_msg("expected %s not in codec.pth", json_string_value(json_object_get(x, "name")));
        json_t *s = json_object_get(x, "shape");
        assert_int_equal((int)json_array_size(s), t->ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(json_integer_value(json_array_get(s, (size_t)d)), t->shape[d]);
    }
    dr_pth_close(p);
    json_decref(v.list);
}

/* --- tensor-set surgery on the tiny codec --- */
typedef struct tset {
    dr_tensor *t;
    int64_t n;
    char **names;
    void **bufs;
    int nbufs;
} tset;

static tset copy_set(dr_pth *p, const char *prefix) {
    tset s = {0};
    s.n = dr_pth_count(p);
    s.t = calloc((size_t)s.n + 8, sizeof *s.t);
    s.names = calloc((size_t)s.n + 8, sizeof *s.names);
    s.bufs = calloc(64, sizeof *s.bufs);
    for (int64_t i = 0; i < s.n; i++) {
        s.t[i] = *dr_pth_at(p, i);
        s.names[i] = malloc(strlen(s.t[i].name) + strlen(prefix) + 1);
        sprintf(s.names[i], "%s%s", prefix, s.t[i].name);
        s.t[i].name = s.names[i];
    }
    return s;
}

static void free_set(tset *s) {
    for (int64_t i = 0; i < s->n + 8; i++) free(s->names[i]);
    for (int i = 0; i < s->nbufs; i++) free(s->bufs[i]);
    free(s->t), free(s->names), free(s->bufs);
}

static int64_t idx(tset *s, const char *name) {
    for (int64_t i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return i;
    fail_msg("no tensor %s", name);
    return -1;
}

static void rename_t(tset *s, const char *from, const char *to) {
    int64_t i = idx(s, from);
    free(s->names[i]);
    s->names[i] = strdup(to);
    s->t[i].name = s->names[i];
}

static void remove_t(tset *s, const char *name) {
    int64_t i = idx(s, name);
    free(s->names[i]);
    for (int64_t k = i; k + 1 < s->n; k++) s->t[k] = s->t[k + 1], s->names[k] = s->names[k + 1];
    s->n--;
    s->names[s->n] = NULL;
}

/* replace m's new-style pair by a pre-folded m.weight computed here in fp64 */
static void prefold(tset *s, const char *m) {
    char g[256], v[256];
    snprintf(g, sizeof g, "%s.parametrizations.weight.original0", m);
    snprintf(v, sizeof v, "%s.parametrizations.weight.original1", m);
    dr_tensor tg = s->t[idx(s, g)], tv = s->t[idx(s, v)];
    int64_t rows = tv.shape[0], row = tv.shape[1] * tv.shape[2];
    float *w = malloc((size_t)(rows * row) * 4);
    s->bufs[s->nbufs++] = w;
    for (int64_t o = 0; o < rows; o++) {
        float gv, x;
        memcpy(&gv, tg.data + 4 * o, 4);
        double ss = 0;
        for (int64_t k = 0; k < row; k++) memcpy(&x, tv.data + 4 * (o * row + k), 4), ss += (double)x * x;
        double sc = (double)gv / sqrt(ss);
        for (int64_t k = 0; k < row; k++) memcpy(&x, tv.data + 4 * (o * row + k), 4), w[o * row + k] = (float)(x * sc);
    }
    remove_t(s, g);
    int64_t i = idx(s, v);
    free(s->names[i]);
    s->names[i] = malloc(strlen(m) + 8);
    sprintf(s->names[i], "%s.weight", m);
    s->t[i].name = s->names[i];
    s->t[i].data = (const uint8_t *)w;
}

static float *decode_with(const tset *s, const dr_codec_config *c, const int32_t *codes, int64_t T, dr_pool *pool,
                          drama_error *e) {
    dr_codec *codec = NULL;
    if (dr_codec_load(s->t, s->n, c, DR_CODEC_LOAD_DECODER, "set", &codec, e)) return NULL;
    dr_codec_set_pool(codec, pool);
    float *out = malloc((size_t)(T * c->frame_length) * sizeof *out);
    assert_int_equal(dr_codec_decode(codec, codes, T, out, e), DRAMA_OK);
    dr_codec_free(codec);
    return out;
}

static int32_t k_codes[6 * 10];

static void make_codes(void) {
    uint32_t x = 12345;
    for (int i = 0; i < 60; i++) x = x * 1664525u + 1013904223u, k_codes[i] = (int32_t)((x >> 8) % ((i % 10) ? 1024 : 4096));
}

/* A decoder-only load never reads (so never copies) an encoder-side weight: with every one of them
 * filled with NaN it still loads and decodes bit-identically (to ref), while an encoder load
 * refuses them. */
static void check_decoder_only_skips_encoder(dr_pth *p, dr_codec_config c, const float *ref) {
    drama_error e = {0};
    tset s = copy_set(p, "");
    size_t most = 0;
    for (int64_t i = 0; i < s.n; i++) most = s.t[i].nbytes > most ? s.t[i].nbytes : most;
    float *nan = malloc(most);
    for (size_t k = 0; k < most / 4; k++) nan[k] = NAN;
    s.bufs[s.nbufs++] = nan;
    static const char *enc_only[] = {"encoder.", "quantizer.downsample.", "quantizer.pre_module."};
    int poisoned = 0;
    for (int64_t i = 0; i < s.n; i++)
        for (int k = 0; k < 3; k++)
            if (!strncmp(s.t[i].name, enc_only[k], strlen(enc_only[k]))) s.t[i].data = (const uint8_t *)nan, poisoned++;
    printf("  %d encoder-side tensors filled with NaN\n", poisoned);
    assert_true(poisoned > 100);
    float *out = decode_with(&s, &c, k_codes, 6, NULL, &e);
    if (!out) fail_msg("%s", e.message);
    assert_memory_equal(out, ref, (size_t)(6 * c.frame_length) * 4);
    dr_codec *codec = NULL;
    assert_int_equal(dr_codec_load(s.t, s.n, &c, DR_CODEC_LOAD_ENCODER, "poisoned", &codec, &e), DRAMA_ESHAPE);
    printf("  %.160s\n", e.message);
    assert_non_null(strstr(e.message, "non-finite"));
    free(out);
    free_set(&s);
}

static void test_spellings_and_threads(void **state) {
    (void)state;
    make_codes();
    dr_codec_config c;
    tiny_cfg(&c);
    dr_pth *p = open_tiny();
    drama_error e = {0};
    tset base = copy_set(p, "");
    float *ref = decode_with(&base, &c, k_codes, 6, NULL, &e);
    assert_non_null(ref);
    int64_t n = 6 * c.frame_length;
    /* threads: 1 vs 3 workers, bit-identical */
    dr_pool *pool = dr_pool_create(3);
    float *thr = decode_with(&base, &c, k_codes, 6, pool, &e);
    assert_memory_equal(thr, ref, (size_t)n * 4);
    dr_pool_free(pool);
    free(thr);
    check_decoder_only_skips_encoder(p, c, ref);
    /* old spelling for a conv, pre-folded weights, a generator. prefix, stale buffers: same decoder */
    tset alt = copy_set(p, "generator.");
    rename_t(&alt, "generator.decoder.model.0.conv.parametrizations.weight.original0", "generator.decoder.model.0.conv.weight_g");
    rename_t(&alt, "generator.decoder.model.0.conv.parametrizations.weight.original1", "generator.decoder.model.0.conv.weight_v");
    prefold(&alt, "generator.decoder.model.1.block.1.conv");
    prefold(&alt, "generator.decoder.model.6.conv");
    alt.t[alt.n] = alt.t[0];
    alt.names[alt.n] = strdup("quantizer.post_module.causal_mask"); /* not generator.*: dropped */
    alt.t[alt.n].name = alt.names[alt.n];
    alt.n++;
    alt.t[alt.n] = alt.t[0];
    alt.names[alt.n] = strdup("generator.quantizer.post_module.freqs_cis"); /* stale: ignored */
    alt.t[alt.n].name = alt.names[alt.n];
    alt.n++;
    float *out = decode_with(&alt, &c, k_codes, 6, NULL, &e);
    if (!out) fail_msg("%s", e.message);
    assert_true(tu_report("alternative spellings vs canonical", tu_compare_f32(out, ref, n), 0.0));
    free(out);
    free_set(&alt);
    free(ref);
    free_set(&base);
    dr_pth_close(p);
}

static void expect_load_fail(tset *s, const dr_codec_config *c, const char *needle) {
    dr_codec *codec = NULL;
    drama_error e = {0};
    assert_int_not_equal(dr_codec_load(s->t, s->n, c, DR_CODEC_LOAD_ALL, "bad", &codec, &e), DRAMA_OK);
    assert_null(codec);
    printf("  %s\n", e.message);
    if (!strstr(e.message, needle)) fail_msg("'%s' lacks '%s'", e.message, needle);
}

static void test_bad_tensor_sets(void **state) {
    (void)state;
    dr_codec_config c;
    tiny_cfg(&c);
    dr_pth *p = open_tiny();
    tset s = copy_set(p, "");
    remove_t(&s, "decoder.model.2.block.2.block.1.conv.bias");
    expect_load_fail(&s, &c, "missing decoder.model.2.block.2.block.1.conv.bias");
    free_set(&s);
    s = copy_set(p, "");
    remove_t(&s, "quantizer.quantizer.quantizers.3.in_proj.weight_g");
    expect_load_fail(&s, &c, "incomplete weight norm");
    free_set(&s);
    s = copy_set(p, "");
    rename_t(&s, "decoder.model.5.alpha", "decoder.model.5.alpha_typo");
    expect_load_fail(&s, &c, "unexpected tensor decoder.model.5.alpha_typo");
    free_set(&s);
    s = copy_set(p, "");
    s.t[idx(&s, "decoder.model.5.alpha")].shape[1] = 7;
    expect_load_fail(&s, &c, "decoder.model.5.alpha has shape [1,7,1]");
    free_set(&s);
    s = copy_set(p, "");
    s.t[idx(&s, "encoder.block.0.conv.bias")].dtype = DR_DT_I32;
    expect_load_fail(&s, &c, "dtype I32");
    free_set(&s);
    /* codec.json disagreeing with the shapes, and the defaults (real codec) on the tiny tensors */
    s = copy_set(p, "");
    dr_codec_config c2 = c;
    drama_error e = {0};
    const char *j = "{\"latent_dim\": 32}";
    assert_int_equal(dr_codec_config_parse(j, strlen(j), "x.json", &c2, &e), DRAMA_OK);
    expect_load_fail(&s, &c2, "latent_dim");
    /* a decode clamp past the codebook would let the decoder read outside its tables */
    c2 = c;
    dr_error_clear(&e);
    j = "{\"codes\": {\"decode_upper_clamp\": [4095, 1023, 1023, 1023, 1023, 1023, 1023, 1023, 1024, 1023]}}";
    assert_int_equal(dr_codec_config_parse(j, strlen(j), "x.json", &c2, &e), DRAMA_OK);
    expect_load_fail(&s, &c2, "decode_upper_clamp[8] = 1024");
    dr_codec_config_default(&c2);
    expect_load_fail(&s, &c2, "wqkv");
    free_set(&s);
    dr_pth_close(p);
}

/* codec.safetensors (+ codec.json) in a directory loads to the same decoder as codec.pth */
static void test_safetensors_dir(void **state) {
    (void)state;
    make_codes();
    dr_pth *p = open_tiny();
    const char *dir = tu_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/codec.safetensors", dir);
    dr_st_writer *w;
    drama_error e = {0};
    assert_int_equal(dr_st_writer_create(path, &w, &e), DRAMA_OK);
    for (int64_t i = 0; i < dr_pth_count(p); i++) {
        const dr_tensor *t = dr_pth_at(p, i);
        assert_int_equal(dr_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, &e), DRAMA_OK);
    }
    for (int64_t i = 0; i < dr_pth_count(p); i++)
        assert_int_equal(dr_st_writer_write(w, dr_pth_at(p, i)->data, dr_pth_at(p, i)->nbytes, &e), DRAMA_OK);
    assert_int_equal(dr_st_writer_finish(w, &e), DRAMA_OK);
    size_t n;
    char *js = tu_read_file(tu_golden("tiny-drama3/codec.json"), &n);
    snprintf(path, sizeof path, "%s/codec.json", dir);
    tu_write_file(path, js, n);
    free(js);
    dr_codec *a = NULL, *b = NULL;
    assert_int_equal(dr_codec_open(dir, DR_CODEC_LOAD_DECODER, &a, &e), DRAMA_OK);
    assert_int_equal(dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_DECODER, &b, &e), DRAMA_OK);
    int64_t FL = dr_codec_cfg(a)->frame_length;
    float *ya = malloc((size_t)(6 * FL) * 4), *yb = malloc((size_t)(6 * FL) * 4);
    assert_int_equal(dr_codec_decode(a, k_codes, 6, ya, &e), DRAMA_OK);
    assert_int_equal(dr_codec_decode(b, k_codes, 6, yb, &e), DRAMA_OK);
    assert_memory_equal(ya, yb, (size_t)(6 * FL) * 4);
    free(ya), free(yb);
    dr_codec_free(a), dr_codec_free(b);
    /* without codec.json the defaults (real codec) do not fit the tiny tensors: named error */
    assert_int_equal(unlink(path), 0);
    assert_int_not_equal(dr_codec_open(dir, DR_CODEC_LOAD_DECODER, &a, &e), DRAMA_OK);
    printf("  %s\n", e.message);
    tu_rm_rf(dir);
    dr_pth_close(p);
}

static void test_open_dir_and_missing(void **state) {
    (void)state;
    dr_codec *codec = NULL;
    drama_error e = {0};
    assert_int_equal(dr_codec_open("/nonexistent-dir", DR_CODEC_LOAD_ALL, &codec, &e), DRAMA_EIO);
    assert_null(codec);
    dr_error_clear(&e);
    assert_int_equal(dr_codec_open(tu_golden("tiny-drama3/codec.pth"), DR_CODEC_LOAD_ALL, &codec, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "not a directory"));
    assert_null(codec);
    char *long_dir = malloc(5000);
    memset(long_dir, 'a', 4999), long_dir[4999] = '\0';
    dr_error_clear(&e);
    assert_int_equal(dr_codec_open(long_dir, DR_CODEC_LOAD_ALL, &codec, &e), DRAMA_EINVAL);
    assert_non_null(strstr(e.message, "path too long"));
    free(long_dir);
    assert_int_equal(dr_codec_open(tu_golden("tiny-drama3"), DR_CODEC_LOAD_DECODER, &codec, &e), DRAMA_OK);
    char file[1024];
    assert_int_equal(dr_codec_file(tu_golden("tiny-drama3"), file, sizeof file, &e), DRAMA_OK);
    assert_non_null(strstr(file, "tiny-drama3/codec.pth"));
    assert_int_equal(dr_codec_file("/nonexistent-dir", file, sizeof file, &e), DRAMA_EIO);
    /* the variants link their codec to tiny-drama3's */
    static const char *variants[] = {"variants/fp8-block", "variants/nvfp4", "variants/mlx-affine4", "variants/pruned",
                                     "variants/fused-experts"};
    for (int i = 0; i < 5; i++) {
        dr_codec *vc = NULL;
        const char *dir = tu_model_dir(variants[i]);
        if (dr_codec_open(dir, DR_CODEC_LOAD_DECODER, &vc, &e)) fail_msg("%s: %s", variants[i], e.message);
        assert_true(dr_codec_config_equal(dr_codec_cfg(vc), dr_codec_cfg(codec)));
        dr_codec_free(vc);
    }
    int32_t *codes = NULL;
    int64_t T;
    float x[4] = {0};
    assert_int_equal(dr_codec_encode(codec, x, 4, &codes, &T, NULL, NULL, &e), DRAMA_EINVAL); /* no encoder loaded */
    dr_codec_free(codec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_json_equals_defaults), cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_real_inventory),            cmocka_unit_test(test_tiny_inventory_equals_pth),
        cmocka_unit_test(test_spellings_and_threads),     cmocka_unit_test(test_bad_tensor_sets),
        cmocka_unit_test(test_open_dir_and_missing),      cmocka_unit_test(test_safetensors_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
