/* test_model_config.c - config.json parsing and the switch layers (MODEL.md 3, 10). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/config.h"
#include "testutil.h"

static const char *MINI =
    "{\"model_type\": \"fish_omni\", \"architectures\": [\"FishOmniModel\"], \"extra_top\": 1,"
    " \"text_config\": {\"vocab_size\": 300, \"hidden_size\": 48, \"num_hidden_layers\": 6,"
    "  \"full_attention_interval\": 3, \"num_attention_heads\": 6, \"num_key_value_heads\": 3, \"head_dim\": 16,"
    "  \"rms_norm_eps\": 1e-5, \"rope_theta\": 5000, \"partial_rotary_factor\": 0.5,"
    "  \"linear_conv_kernel_dim\": 3, \"linear_num_key_heads\": 2, \"linear_key_head_dim\": 8,"
    "  \"linear_num_value_heads\": 4, \"linear_value_head_dim\": 12, \"num_experts\": 10,"
    "  \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 40, \"shared_expert_intermediate_size\": 24,"
    "  \"mystery\": true},"
    " \"my_audio\": {\"dim\": 32, \"n_head\": 4, \"n_local_heads\": 1, \"head_dim\": 8, \"intermediate_size\": 50,"
    "  \"num_codebooks\": 5, \"vocab_size\": 64, \"shared_enrichment_layers\": 2, \"rope_base\": 1e4,"
    "  \"rotary_percent\": 0.5},"
    " \"eos_token_id\": [7, 9],"
    " \"drama_engine\": {\"backbone.norm_offset\": 0.0, \"tower.qk_norm\": true}}";

static dr_config *load_mem(const char *cfg, const char *engine, const char *const *sets, int n, drama_error *e) {
    dr_config *c = NULL;
    memset(e, 0, sizeof *e);
    dr_config_from_memory(cfg, strlen(cfg), "config.json", engine, engine ? strlen(engine) : 0, sets, n, &c, e);
    return c;
}

static void test_tiny_golden(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_golden("tiny-drama3"));
    dr_config *c = NULL;
    drama_error e = {0};
    assert_int_equal(dr_config_load(dir, NULL, 0, &c, &e), DRAMA_OK);
    assert_non_null(c);
    assert_string_equal(c->model_type, "fish_omni");
    assert_int_equal(c->text.hidden_size, 64);
    assert_int_equal(c->text.n_layers, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(c->text.layer_types[i], (i % 4 == 3) ? DR_LAYER_FULL : DR_LAYER_LINEAR);
    assert_int_equal(c->text.n_heads, 4);
    assert_int_equal(c->text.n_kv_heads, 2);
    assert_int_equal(c->text.head_dim, 64);
    assert_int_equal(c->text.rope_dims, 16);
    assert_true(c->text.rope_theta == 1e7);
    assert_int_equal(c->text.mrope_section[0], 3);
    assert_int_equal(c->text.lin_k_heads, 4);
    assert_int_equal(c->text.lin_v_heads, 8);
    assert_int_equal(c->text.lin_k_dim, 32);
    assert_int_equal(c->text.conv_kernel, 4);
    assert_int_equal(c->text.n_experts, 16);
    assert_int_equal(c->text.n_experts_per_tok, 4);
    assert_int_equal(c->text.moe_intermediate, 64);
    assert_int_equal(c->text.vocab_size, 6124);
    assert_true(c->text.norm_topk_prob);
    assert_false(c->text.tie_word_embeddings);
    assert_string_equal(c->audio.key, "audio_decoder_config");
    assert_int_equal(c->audio.num_codebooks, 10);
    assert_int_equal(c->audio.n_layers, 13);
    assert_int_equal(c->audio.vq_backbone_codebooks, 10);
    assert_int_equal(c->tokens.semantic_start, 2012);
    assert_int_equal(c->tokens.semantic_end, 6107);
    assert_int_equal(c->tokens.n_eos, 1);
    assert_int_equal(c->tokens.eos[0], 2003);
    /* every switch at its default */
    assert_true(c->sw.backbone_prefix == NULL);
    assert_true(c->sw.backbone_norm_offset == 1.0);
    assert_int_equal(c->sw.input_codebooks, 10);
    assert_true(c->sw.input_code_scale_rsqrt);
    assert_true(c->sw.input_add_token_embedding);
    assert_int_equal(c->sw.tower_code_stride, 4096);
    assert_int_equal(c->sw.tower_rope_dims, 16);
    assert_int_equal(c->sw.tower_head_vocab, 1024);
    assert_string_equal(c->sw.end_token, "<|im_end|>");
    assert_string_equal(c->sw.prompt_reference_text_header, "\n\nText:\n");
    assert_true(c->sw.prompt_system_without_reference);
    for (int i = 0; i < dr_switch_def_count(); i++) assert_int_equal(c->switch_sources[i], DR_SRC_BUILTIN);
    int w = -1;
    assert_int_equal(dr_config_check_token_ids(c, 2012, 4096, 2003, &w, &e), DRAMA_OK);
    assert_int_equal(w, 0);
    assert_int_equal(dr_config_check_token_ids(c, 2012, 4096, 2002, &w, &e), DRAMA_OK);
    assert_int_equal(w, 1);
    assert_int_not_equal(dr_config_check_token_ids(c, 2013, 4096, 2003, &w, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "2012"));
    assert_non_null(strstr(e.message, "2013"));
    memset(&e, 0, sizeof e);
    assert_int_not_equal(dr_config_check_token_ids(c, 2012, 4000, 2003, &w, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "semantic_end_token_id"));
    dr_config_free(c);
}

static void test_variants_quant(void **state) {
    (void)state;
    const char *names[] = {"variants/fp8-block", "variants/nvfp4", "variants/mlx-affine4"};
    for (int i = 0; i < 3; i++) {
        dr_config *c = NULL;
        drama_error e = {0};
        assert_int_equal(dr_config_load(tu_golden(names[i]), NULL, 0, &c, &e), DRAMA_OK);
        assert_true(c->quant.present);
        if (i == 0) {
            assert_string_equal(c->quant.quant_method, "fp8");
            assert_int_equal(c->quant.block_rows, 128);
        } else if (i == 1) {
            assert_string_equal(c->quant.quant_algo, "NVFP4");
            assert_int_equal(c->quant.group_size, 16);
        } else {
            assert_int_equal(c->quant.bits, 4);
            assert_int_equal(c->quant.group_size, 64);
            assert_string_equal(c->quant.mode, "affine");
        }
        dr_config_free(c);
    }
}

static void test_layers_and_sources(void **state) {
    (void)state;
    drama_error e;
    const char *sets[] = {"tower.qk_norm=false", "end_token=<|endoftext|>", "input.codebooks=3",
                          "names.rename=[[\"^foo\\\\.\", \"bar.\"]]"};
    dr_config *c = load_mem(MINI, "{\"input.code_scale\": \"none\", \"tower.qk_norm\": true}", sets, 4, &e);
    assert_non_null(c);
    /* interval rule: full iff (i+1) % 3 == 0 */
    for (int i = 0; i < 6; i++) assert_int_equal(c->text.layer_types[i], (i + 1) % 3 == 0 ? DR_LAYER_FULL : DR_LAYER_LINEAR);
    assert_int_equal(c->text.rope_dims, 8);
    assert_string_equal(c->audio.key, "my_audio"); /* auto-detected by num_codebooks */
    assert_int_equal(c->audio.n_layers, 6);
    assert_int_equal(c->tokens.n_eos, 2);
    assert_true(c->sw.backbone_norm_offset == 0.0);
    assert_false(c->sw.input_code_scale_rsqrt);
    assert_false(c->sw.tower_qk_norm);
    assert_string_equal(c->sw.end_token, "<|endoftext|>");
    assert_int_equal(c->sw.input_codebooks, 3);
    assert_int_equal(c->sw.n_rename, 1);
    assert_string_equal(c->sw.rename[0].pattern, "^foo\\.");
    assert_int_equal(c->sw.tower_code_stride, 64);
    assert_int_equal(c->sw.tower_rope_dims, 4);
    dr_switch_source src;
    char buf[128];
    assert_true(dr_config_switch_text(c, "backbone.norm_offset", buf, sizeof buf, &src));
    assert_int_equal(src, DR_SRC_CONFIG);
    assert_true(dr_config_switch_text(c, "input.code_scale", buf, sizeof buf, &src));
    assert_int_equal(src, DR_SRC_ENGINE_FILE);
    assert_string_equal(buf, "\"none\"");
    assert_true(dr_config_switch_text(c, "tower.qk_norm", buf, sizeof buf, &src));
    assert_int_equal(src, DR_SRC_CLI);
    assert_string_equal(buf, "false");
    assert_true(dr_config_switch_text(c, "loader.strict", buf, sizeof buf, &src));
    assert_int_equal(src, DR_SRC_BUILTIN);
    /* unknown fields kept */
    int saw_top = 0, saw_text = 0;
    for (int i = 0; i < c->n_unknown; i++) {
        if (strcmp(c->unknown[i], "extra_top") == 0) saw_top = 1;
        if (strcmp(c->unknown[i], "text_config.mystery") == 0) saw_text = 1;
    }
    assert_true(saw_top && saw_text);
    dr_config_free(c);
}

/* Replace the first occurrence of `from` in MINI by `to` and expect an error containing `want`. */
static void expect_error(const char *from, const char *to, const char *const *sets, int n, const char *want) {
    char cfg[4096];
    const char *p = strstr(MINI, from);
    assert_non_null(p);
    snprintf(cfg, sizeof cfg, "%.*s%s%s", (int)(p - MINI), MINI, to, p + strlen(from));
    drama_error e;
    dr_config *c = load_mem(cfg, NULL, sets, n, &e);
    if (c || !strstr(e.message, want)) printf("message: %s (wanted %s)\n", e.message, want);
    assert_null(c);
    assert_int_not_equal(e.code, DRAMA_OK);
    assert_non_null(strstr(e.message, want));
}

static void test_errors_name_the_field(void **state) {
    (void)state;
    expect_error("\"num_experts\": 10", "\"num_experts\": -2", NULL, 0,
                 "config.json: text_config.num_experts: expected positive integer");
    expect_error("\"num_experts\": 10", "\"num_experts\": \"ten\"", NULL, 0, "text_config.num_experts");
    expect_error("\"hidden_size\": 48,", "", NULL, 0, "text_config.hidden_size: missing");
    expect_error("\"rope_theta\": 5000", "\"rope_theta\": null", NULL, 0, "text_config.rope_theta");
    expect_error("\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": 1e300", NULL, 0,
                 "text_config.rms_norm_eps: outside the fp32 range");
    expect_error("\"full_attention_interval\": 3", "\"full_attention_interval\": 0", NULL, 0,
                 "text_config.full_attention_interval");
    expect_error("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4", NULL, 0, "num_key_value_heads");
    expect_error("\"fish_omni\"", "\"qwen\"", NULL, 0, "model_type");
    expect_error("\"n_head\": 4", "\"n_head\": 0", NULL, 0, "my_audio.n_head");
    expect_error("\"eos_token_id\": [7, 9]", "\"eos_token_id\": [\"x\"]", NULL, 0, "eos_token_id");
    expect_error("\"tower.qk_norm\": true", "\"tower.qk_nrm\": true", NULL, 0, "unknown switch \"tower.qk_nrm\"");
    expect_error("\"tower.qk_norm\": true", "\"tower.qk_norm\": 3", NULL, 0, "switch tower.qk_norm");
    expect_error("\"my_audio\"", "\"audio_x\": {\"num_codebooks\": 1}, \"my_audio\"", NULL, 0, "audio_config_key");
    const char *bad1[] = {"no_such.switch=1"};
    expect_error("\"extra_top\": 1", "\"extra_top\": 1", bad1, 1, "unknown switch \"no_such.switch\"");
    const char *bad2[] = {"input.code_scale=cube"};
    expect_error("\"extra_top\": 1", "\"extra_top\": 1", bad2, 1, "input.code_scale: expected one of rsqrt|none");
    const char *bad3[] = {"input.codebooks=9"};
    expect_error("\"extra_top\": 1", "\"extra_top\": 1", bad3, 1, "input.codebooks");
    const char *bad4[] = {"loader.strict"};
    expect_error("\"extra_top\": 1", "\"extra_top\": 1", bad4, 1, "name=value");
    /* allow_model_type lets another model_type through */
    const char *ok[] = {"loader.allow_model_type=[\"qwen\"]"};
    char cfg[4096];
    const char *p = strstr(MINI, "\"fish_omni\"");
    snprintf(cfg, sizeof cfg, "%.*s\"qwen\"%s", (int)(p - MINI), MINI, p + strlen("\"fish_omni\""));
    drama_error e;
    dr_config *c = load_mem(cfg, NULL, ok, 1, &e);
    assert_non_null(c);
    dr_config_free(c);
    /* garbage never crashes */
    const char *junk[] = {"", "[]", "{", "null", "{\"model_type\": \"fish_omni\", \"text_config\": []}"};
    for (int i = 0; i < 5; i++) {
        c = load_mem(junk[i], NULL, NULL, 0, &e);
        assert_null(c);
        assert_int_not_equal(e.code, DRAMA_OK);
    }
}

/* CONFIRMED tower values fill in for absent fields, with a warning. */
static void test_audio_defaults(void **state) {
    (void)state;
    char cfg[4096];
    const char *a = strstr(MINI, ", \"rope_base\": 1e4");
    assert_non_null(a);
    const char *b = strstr(MINI, ",  \"rotary_percent\": 0.5");
    assert_non_null(b);
    snprintf(cfg, sizeof cfg, "%.*s%.*s%s", (int)(a - MINI), MINI, (int)(b - (a + strlen(", \"rope_base\": 1e4"))),
             a + strlen(", \"rope_base\": 1e4"), b + strlen(",  \"rotary_percent\": 0.5"));
    drama_error e;
    dr_config *c = load_mem(cfg, NULL, NULL, 0, &e);
    if (!c) printf("%s\n%s\n", cfg, e.message);
    assert_non_null(c);
    assert_true(c->audio.rope_base == 1e7);
    assert_int_equal(c->sw.tower_rope_dims, 8); /* min(64, head_dim 8) */
    assert_true(c->n_warnings >= 2);
    dr_config_free(c);
}

static void test_registry(void **state) {
    (void)state;
    assert_true(dr_switch_def_count() >= 31);
    assert_non_null(dr_switch_def_find("prompt.system_without_reference"));
    assert_non_null(dr_switch_def_find("tower.rope_freq_dims"));
    assert_null(dr_switch_def_find("nope"));
    for (int i = 0; i < dr_switch_def_count(); i++) {
        const dr_switch_def *d = dr_switch_def_at(i);
        assert_non_null(d->doc);
        assert_true(strlen(d->doc) > 5);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_golden),         cmocka_unit_test(test_variants_quant),
        cmocka_unit_test(test_layers_and_sources),  cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_registry),            cmocka_unit_test(test_audio_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
