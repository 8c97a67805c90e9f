/* test_io_checkpoint.c - sharded and single-file checkpoints: the golden tiny model and every variant
 * (symlinked shards), the index parser, warnings, and backbone prefix detection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/checkpoint.h"
#include "testutil.h"

/* Opens a golden model folder and checks what every valid checkpoint must satisfy. */
static dr_ckpt *open_checked(const char *dir) {
    dr_ckpt *c = NULL;
    drama_error err = {0};
    if (dr_ckpt_open(dir, &c, &err) != DRAMA_OK) fail_msg("%s", err.message);
    int64_t sum = 0;
    for (int i = 0; i < dr_ckpt_shard_count(c); i++) sum += dr_st_count(dr_ckpt_shard(c, i));
    assert_int_equal(dr_ckpt_count(c), sum);
    for (int64_t k = 0; k < dr_ckpt_count(c); k++) {
        const dr_tensor *t = dr_ckpt_at(c, k);
        assert_ptr_equal(dr_ckpt_find(c, t->name), t);
        if (k) assert_true(strcmp(dr_ckpt_at(c, k - 1)->name, t->name) < 0); /* sorted, unique */
        const char *shard = dr_ckpt_shard_of(c, t->name);
        assert_non_null(shard);
        int found = 0;
        for (int i = 0; i < dr_ckpt_shard_count(c); i++)
            if (dr_st_find(dr_ckpt_shard(c, i), t->name) == t)
                found = !strcmp(strrchr(dr_st_path(dr_ckpt_shard(c, i)), '/') + 1, shard);
        assert_true(found);
    }
    for (int i = 0; i < dr_ckpt_warning_count(c); i++) printf("  warning: %s\n", dr_ckpt_warning(c, i));
    return c;
}

static void test_tiny_drama3(void **state) {
    (void)state;
    dr_ckpt *c = open_checked(tu_golden("tiny-drama3"));
    assert_int_equal(dr_ckpt_shard_count(c), 2);
    assert_int_equal(dr_ckpt_warning_count(c), 0);
    const dr_tensor *emb = dr_ckpt_find(c, "model.language_model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, DR_DT_BF16);
    assert_int_equal(emb->ndim, 2);
    assert_string_equal(dr_ckpt_shard_of(c, emb->name), "model-00001-of-00002.safetensors");
    const json_t *meta = dr_ckpt_index_metadata(c);
    assert_non_null(meta);
    assert_true(json_is_integer(json_object_get(meta, "total_size")));
    char prefix[256];
    drama_error err = {0};
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_OK);
    assert_string_equal(prefix, "model.language_model.");
    assert_int_equal(dr_ckpt_detect_prefix(c, "custom.", prefix, sizeof prefix, &err), DRAMA_OK);
    assert_string_equal(prefix, "custom.");
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, 5, &err), DRAMA_EINVAL); /* buffer too small */
    printf("tiny-drama3: %lld tensors in %d shards, prefix detected\n", (long long)dr_ckpt_count(c),
           dr_ckpt_shard_count(c));
    dr_ckpt_close(c);
}

static void test_variants(void **state) {
    (void)state;
    const char *names[] = {"fp8-block", "fused-experts", "mlx-affine4", "nvfp4", "pruned"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "variants/%s", names[i]);
        dr_ckpt *c = open_checked(tu_model_dir(rel));
        assert_int_equal(dr_ckpt_warning_count(c), 0);
        char prefix[256];
        drama_error err = {0};
        assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_OK);
        assert_string_equal(prefix, "model.language_model.");
        const json_t *meta = dr_ckpt_index_metadata(c);
        if (!strcmp(names[i], "pruned")) assert_true(json_is_object(json_object_get(meta, "drama_experts")));
        printf("%-14s %5lld tensors in %d shards\n", names[i], (long long)dr_ckpt_count(c), dr_ckpt_shard_count(c));
        dr_ckpt_close(c);
    }
}

/* Writes a single-file model with the given tensor names (all F32 [2]). */
static void write_model(const char *path, const char *const *names, int n, int pad) {
    dr_st_writer *w = NULL;
    drama_error err = {0};
    assert_int_equal(dr_st_writer_create(path, &w, &err), DRAMA_OK);
    dr_st_writer_set_padding(w, pad);
    int64_t shape[1] = {2};
    for (int i = 0; i < n; i++) assert_int_equal(dr_st_writer_declare(w, names[i], DR_DT_F32, 1, shape, &err), DRAMA_OK);
    float v[2] = {1, 2};
    for (int i = 0; i < n; i++) assert_int_equal(dr_st_writer_write(w, v, sizeof v, &err), DRAMA_OK);
    if (dr_st_writer_finish(w, &err) != DRAMA_OK) fail_msg("%s", err.message);
}

static void test_single_file_and_prefix(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *ok[] = {"x.embed_tokens.weight", "x.layers.0.input_layernorm.weight",
                        "audio_decoder.embed_tokens.weight", "lonely.embed_tokens.weight"};
    write_model(path, ok, 4, 0);
    dr_ckpt *c = NULL;
    drama_error err = {0};
    assert_int_equal(dr_ckpt_open(dir, &c, &err), DRAMA_OK);
    assert_int_equal(dr_ckpt_shard_count(c), 1);
    assert_null(dr_ckpt_index_metadata(c));
    assert_string_equal(dr_ckpt_shard_of(c, "lonely.embed_tokens.weight"), "model.safetensors");
    char prefix[64];
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_OK);
    assert_string_equal(prefix, "x.");
    dr_ckpt_close(c);

    /* empty prefix is legal */
    const char *bare[] = {"embed_tokens.weight", "layers.0.input_layernorm.weight"};
    write_model(path, bare, 2, 1);
    assert_int_equal(dr_ckpt_open(dir, &c, &err), DRAMA_OK);
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_OK);
    assert_string_equal(prefix, "");
    dr_ckpt_close(c);

    /* two candidates: an error listing both */
    const char *two[] = {"a.embed_tokens.weight", "a.layers.0.input_layernorm.weight", "b.embed_tokens.weight",
                         "b.layers.0.input_layernorm.weight"};
    write_model(path, two, 4, 1);
    assert_int_equal(dr_ckpt_open(dir, &c, &err), DRAMA_OK);
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_ESHAPE);
    printf("ambiguous: %s\n", err.message);
    assert_non_null(strstr(err.message, "'a.'"));
    assert_non_null(strstr(err.message, "'b.'"));
    dr_ckpt_close(c);

    /* none */
    const char *none[] = {"audio_decoder.embed_tokens.weight", "foo"};
    write_model(path, none, 2, 1);
    err = (drama_error){0};
    assert_int_equal(dr_ckpt_open(dir, &c, &err), DRAMA_OK);
    assert_int_equal(dr_ckpt_detect_prefix(c, NULL, prefix, sizeof prefix, &err), DRAMA_ESHAPE);
    assert_non_null(strstr(err.message, "0 candidates"));
    dr_ckpt_close(c);
    assert_int_equal(tu_rm_rf(dir), 0);
}

/* Warnings: index + single file, unreferenced shard, total_size mismatch; metadata of any JSON. */
static void test_warnings(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[4096];
    const char *s1[] = {"p.embed_tokens.weight", "p.layers.0.input_layernorm.weight"};
    const char *s2[] = {"head.weight"};
    snprintf(path, sizeof path, "%s/first.safetensors", dir);
    write_model(path, s1, 2, 1);
    snprintf(path, sizeof path, "%s/second.safetensors", dir);
    write_model(path, s2, 1, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_model(path, s2, 1, 1);
    snprintf(path, sizeof path, "%s/stray.safetensors", dir);
    write_model(path, s2, 1, 1);
    const char *index = "{\"metadata\": {\"total_size\": 999, \"list\": [1, {\"a\": null}], \"n\": 2.5},\n"
                        " \"weight_map\": {\"p.embed_tokens.weight\": \"first.safetensors\",\n"
                        "  \"p.layers.0.input_layernorm.weight\": \"first.safetensors\",\n"
                        "  \"head.weight\": \"second.safetensors\"}}";
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    tu_write_file(path, index, strlen(index));
    dr_ckpt *c = NULL;
    drama_error err = {0};
    if (dr_ckpt_open(dir, &c, &err) != DRAMA_OK) fail_msg("%s", err.message);
    assert_int_equal(dr_ckpt_count(c), 3);
    assert_string_equal(dr_ckpt_shard_of(c, "head.weight"), "second.safetensors");
    int both = 0, stray = 0, total = 0, single = 0;
    for (int i = 0; i < dr_ckpt_warning_count(c); i++) {
        const char *w = dr_ckpt_warning(c, i);
        printf("warning: %s\n", w);
        both += strstr(w, "index wins") != NULL;
        stray += strstr(w, "'stray.safetensors'") != NULL;
        single += strstr(w, "'model.safetensors' is not referenced") != NULL;
        total += strstr(w, "total_size is 999 but the tensors hold 24 bytes") != NULL;
    }
    assert_int_equal(both + stray + total + single, 4);
    assert_int_equal(dr_ckpt_warning_count(c), 4);
    assert_true(json_is_array(json_object_get(dr_ckpt_index_metadata(c), "list")));
    dr_ckpt_close(c);
    assert_int_equal(tu_rm_rf(dir), 0);
}

static void test_parse_index(void **state) {
    (void)state;
    const char *text = "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\", \"c\": \"s1.safetensors\"}}";
    dr_ckpt_index *ix = NULL;
    drama_error err = {0};
    assert_int_equal(dr_ckpt_parse_index(text, strlen(text), "idx", &ix, &err), DRAMA_OK);
    assert_int_equal(ix->count, 3);
    assert_int_equal(ix->nshards, 2);
    assert_string_equal(ix->shards[ix->shard_of[2]], "s1.safetensors");
    assert_null(ix->metadata);
    assert_int_equal(ix->has_total_size, 0);
    dr_ckpt_index_free(ix);
    dr_ckpt_index_free(NULL);
    dr_ckpt_close(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_drama3), cmocka_unit_test(test_variants),
        cmocka_unit_test(test_single_file_and_prefix), cmocka_unit_test(test_warnings),
        cmocka_unit_test(test_parse_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
