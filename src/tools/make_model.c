/* make_model.c - `drama make-model`: shapes, validation, config.json and the driver.
 * The tensor list and the shard writing are in make_model_weights.c; the codec in
 * make_model_codec.c; the tokenizer in make_model_tokenizer.c. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "tools/make_model.h"
#include "tools/make_model_internal.h"

/* ---- counter-based generator ---- */

static uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

double dr_mm_uniform(uint64_t seed, uint64_t key, uint64_t index) {
    uint64_t x = fmix64(seed * 0x9E3779B97F4A7C15ULL ^ key);
    x = fmix64(x ^ (index * 0xBF58476D1CE4E5B9ULL + 0x94D049BB133111EBULL));
    return (double)(x >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

uint64_t dr_mm_key_bits(uint64_t seed, uint64_t key) { return fmix64(fmix64(seed * 0x9E3779B97F4A7C15ULL ^ key) ^ 0x6A09E667F3BCC909ULL); }

uint64_t dr_mm_name_key(const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
    return fmix64(h);
}

/* ---- shapes ---- */

static void codec_tiny(dr_mm_codec *c) {
    /* The golden tiny codec's widths (real strides and codebooks, small widths and windows). */
    *c = (dr_mm_codec){.encoder_dim = 4, .latent_dim = 64, .decoder_dim = 64, .n_enc_rates = 4,
                       .enc_rates = {2, 4, 8, 8}, .n_dec_rates = 4, .dec_rates = {8, 8, 4, 2}, .n_down = 2,
                       .down_factor = {2, 2}, .ru_kernel = 7, .convnext_kernel = 7, .convnext_ratio = 4,
                       .enc_tf = {1, 1, 64, 192, 16}, .pre = {1, 2, 32, 192, 8}, .post = {1, 2, 32, 192, 8},
                       .semantic_codebook_size = 4096, .n_codebooks = 9, .codebook_size = 1024,
                       .codebook_dim = 8};
}

static void codec_real(dr_mm_codec *c) {
    /* CODEC.md 9: the real codec (modded_dac_vq.yaml). */
    *c = (dr_mm_codec){.encoder_dim = 64, .latent_dim = 1024, .decoder_dim = 1536, .n_enc_rates = 4,
                       .enc_rates = {2, 4, 8, 8}, .n_dec_rates = 4, .dec_rates = {8, 8, 4, 2}, .n_down = 2,
                       .down_factor = {2, 2}, .ru_kernel = 7, .convnext_kernel = 7, .convnext_ratio = 4,
                       .enc_tf = {4, 16, 64, 3072, 512}, .pre = {8, 16, 64, 3072, 128},
                       .post = {8, 16, 64, 3072, 128}, .semantic_codebook_size = 4096, .n_codebooks = 9,
                       .codebook_size = 1024, .codebook_dim = 8};
}

int dr_mm_shape_defaults(const char *shape, dr_mm_options *o) {
    memset(o, 0, sizeof *o);
    o->experts = DR_MM_BF16;
    o->q4_group = 64;
    o->layout = DR_MM_PER_EXPERT;
    o->shards = 2;
    o->seed = 1;
    o->with_codec = 1;
    dr_mm_dims *d = &o->dims;
    if (!strcmp(shape, "tiny") || !strcmp(shape, "custom")) {
        /* The public tiny shape of the golden set (golden/README.md "The tiny model"). */
        *d = (dr_mm_dims){.vocab = 0, .hidden = 64, .layers = 8, .full_attention_interval = 4, .heads = 4,
                          .kv_heads = 2, .head_dim = 64, .rope_theta = 1e7, .partial_rotary = 0.25,
                          .lin_k_heads = 4, .lin_k_dim = 32, .lin_v_heads = 8, .lin_v_dim = 32, .conv_kernel = 4,
                          .experts = 16, .top_k = 4, .moe_inter = 64, .shared_inter = 64, .max_positions = 32768,
                          .a_dim = 64, .a_heads = 4, .a_kv_heads = 2, .a_head_dim = 32, .a_inter = 192,
                          .codebooks = 10, .code_vocab = 4096, .shared_layers = 4, .a_rotary = 0.5,
                          .a_rope_base = 1e7, .head_rows = 1024, .speakers = 16};
        codec_tiny(&d->codec);
        return 1;
    }
    if (!strcmp(shape, "full")) {
        /* MODEL.md 3.2 (Qwen3.5-35B-A3B values) and 3.3. The tower widths are not public: S2-Pro's
         * fast decoder values (2560, 32, 8, 128, 9728) stand in. vocab: Qwen3.5's 248320 rows. */
        *d = (dr_mm_dims){.vocab = 248320, .hidden = 2048, .layers = 40, .full_attention_interval = 4,
                          .heads = 16, .kv_heads = 2, .head_dim = 256, .rope_theta = 1e7, .partial_rotary = 0.25,
                          .lin_k_heads = 16, .lin_k_dim = 128, .lin_v_heads = 32, .lin_v_dim = 128,
                          .conv_kernel = 4, .experts = 256, .top_k = 8, .moe_inter = 512, .shared_inter = 512,
                          .max_positions = 262144, .a_dim = 2560, .a_heads = 32, .a_kv_heads = 8,
                          .a_head_dim = 128, .a_inter = 9728, .codebooks = 10, .code_vocab = 4096,
                          .shared_layers = 4, .a_rotary = 0.5, .a_rope_base = 1e7, .head_rows = 1024,
                          .speakers = 16};
        codec_real(&d->codec);
        o->shards = 8;
        o->experts = DR_MM_FP8; /* as released */
        return 1;
    }
    return 0;
}

#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond)) return dr_fail(err, DRAMA_EINVAL, __VA_ARGS__); \
    } while (0)

drama_status dr_mm_validate(const dr_mm_options *o, drama_error *err) {
    const dr_mm_dims *d = &o->dims;
    CHECK(d->hidden > 0 && d->hidden <= 65536, "--hidden: %d out of range", d->hidden);
    CHECK(d->layers > 0 && d->layers <= 1024, "--layers: %d out of range", d->layers);
    CHECK(d->full_attention_interval > 0, "--full-attention-interval: must be positive");
    CHECK(d->heads > 0 && d->kv_heads > 0 && d->heads % d->kv_heads == 0,
          "--heads %d / --kv-heads %d: heads must be a positive multiple of kv heads", d->heads, d->kv_heads);
    CHECK(d->head_dim > 0 && d->head_dim % 2 == 0, "--head-dim: %d must be positive and even", d->head_dim);
    CHECK(d->partial_rotary > 0 && d->partial_rotary <= 1, "--partial-rotary: must be in (0, 1]");
    int rot = (int)(d->partial_rotary * d->head_dim + 0.5);
    CHECK(rot > 0 && rot % 2 == 0, "--partial-rotary: %g x head_dim %d must give an even number of rotated dims",
          d->partial_rotary, d->head_dim);
    CHECK(d->lin_k_heads > 0 && d->lin_v_heads > 0 && d->lin_v_heads % d->lin_k_heads == 0,
          "--linear-value-heads %d must be a multiple of --linear-key-heads %d", d->lin_v_heads, d->lin_k_heads);
    CHECK(d->lin_k_dim > 0 && d->lin_v_dim > 0, "--linear-key-dim / --linear-value-dim: must be positive");
    CHECK(d->conv_kernel > 0 && d->conv_kernel <= 64, "--conv-kernel: %d out of range", d->conv_kernel);
    CHECK(d->experts > 0 && d->experts <= 4096, "--num-experts: %d out of range", d->experts);
    CHECK(d->top_k > 0 && d->top_k <= d->experts, "--top-k: %d must be in [1, num experts %d]", d->top_k,
          d->experts);
    CHECK(d->moe_inter > 0 && d->shared_inter > 0, "--moe-inter / --shared-inter: must be positive");
    CHECK(d->a_dim > 0 && d->a_heads > 0 && d->a_kv_heads > 0 && d->a_heads % d->a_kv_heads == 0,
          "--tower-heads %d / --tower-kv-heads %d: heads must be a positive multiple of kv heads", d->a_heads,
          d->a_kv_heads);
    CHECK(d->a_head_dim > 0 && d->a_head_dim % 2 == 0, "--tower-head-dim: must be positive and even");
    CHECK(d->a_inter > 0, "--tower-inter: must be positive");
    /* The engine's tower refuses more than 15 codebooks (model/tower.c: one RNG slot per residual
     * codebook, 14 of them): a generated model must load. */
    CHECK(d->codebooks >= 2 && d->codebooks <= 15, "--codebooks: %d out of range [2, 15]", d->codebooks);
    CHECK(d->code_vocab > 0 && d->code_vocab <= 65536, "--code-vocab: %d out of range", d->code_vocab);
    CHECK(d->shared_layers >= 0 && d->shared_layers <= 64, "--tower-shared-layers: out of range");
    CHECK(d->head_rows > 0, "--head-rows: must be positive");
    CHECK(d->speakers >= 0 && d->speakers <= 1024, "--speakers: out of range");
    dr_mm_token_ids ids;
    dr_mm_token_layout(d, &ids);
    CHECK(d->vocab == 0 || d->vocab >= ids.n_tokens, "--vocab: %lld is smaller than the tokenizer (%lld tokens)",
          (long long)d->vocab, (long long)ids.n_tokens);
    CHECK(o->shards >= 1 && o->shards <= 99999, "--shards: %d out of range", o->shards);
    CHECK(o->prune_keep == 0 || (o->prune_keep >= d->top_k && o->prune_keep <= d->experts),
          "--prune: %d must be in [top-k %d, num experts %d]", o->prune_keep, d->top_k, d->experts);
    CHECK(o->layout == DR_MM_PER_EXPERT || o->experts == DR_MM_BF16,
          "--layout fused: only generated with --experts bf16 (quantised experts are written per expert)");
    if (o->experts == DR_MM_Q4) {
        CHECK(o->q4_group == 32 || o->q4_group == 64 || o->q4_group == 128, "--q4-group: %d (32, 64 or 128)",
              o->q4_group);
        CHECK(d->hidden % o->q4_group == 0 && d->moe_inter % o->q4_group == 0,
              "--q4-group %d must divide hidden %d and moe-inter %lld", o->q4_group, d->hidden,
              (long long)d->moe_inter);
    }
    if (o->experts == DR_MM_NVFP4)
        CHECK(d->hidden % 16 == 0 && d->moe_inter % 16 == 0, "--experts nvfp4: hidden and moe-inter must be multiples of 16");
    const dr_mm_codec *c = &d->codec;
    CHECK(c->n_enc_rates >= 1 && c->n_enc_rates <= DR_MM_MAX_RATES && c->n_dec_rates >= 1 &&
              c->n_dec_rates <= DR_MM_MAX_RATES && c->n_down >= 0 && c->n_down <= DR_MM_MAX_RATES,
          "codec: rate lists out of range");
    CHECK(c->encoder_dim > 0 && c->latent_dim > 0 && c->decoder_dim > 0, "codec: widths must be positive");
    CHECK(c->decoder_dim % (1 << c->n_dec_rates) == 0, "codec: decoder_dim %d must be divisible by 2^%d",
          c->decoder_dim, c->n_dec_rates);
    return DRAMA_OK;
}

/* ---- config.json (the schema of golden/tiny-drama3/config.json) ---- */

static drama_status write_config(const char *dir, const dr_mm_options *o, const dr_mm_token_ids *ids,
                                 int64_t vocab, drama_error *err) {
    const dr_mm_dims *d = &o->dims;
    json_t *tc = json_object();
    json_object_set_new(tc, "model_type", json_string("qwen3_5_moe_text"));
    json_object_set_new(tc, "vocab_size", json_integer(vocab));
    json_object_set_new(tc, "hidden_size", json_integer(d->hidden));
    json_object_set_new(tc, "num_hidden_layers", json_integer(d->layers));
    json_t *lt = json_array();
    for (int i = 0; i < d->layers; i++)
        json_array_append_new(lt, json_string(mm_is_full(d, i) ? "full_attention" : "linear_attention"));
    json_object_set_new(tc, "layer_types", lt);
    json_object_set_new(tc, "full_attention_interval", json_integer(d->full_attention_interval));
    json_object_set_new(tc, "num_attention_heads", json_integer(d->heads));
    json_object_set_new(tc, "num_key_value_heads", json_integer(d->kv_heads));
    json_object_set_new(tc, "head_dim", json_integer(d->head_dim));
    json_object_set_new(tc, "attn_output_gate", json_true());
    json_object_set_new(tc, "attention_bias", json_false());
    json_object_set_new(tc, "rms_norm_eps", json_real(1e-6));
    int half = (int)(d->partial_rotary * d->head_dim + 0.5) / 2, x = (half + 2) / 3;
    json_t *rope = json_object();
    json_object_set_new(rope, "rope_type", json_string("default"));
    json_object_set_new(rope, "rope_theta", json_real(d->rope_theta));
    json_object_set_new(rope, "partial_rotary_factor", json_real(d->partial_rotary));
    json_object_set_new(rope, "mrope_interleaved", json_true());
    json_object_set_new(rope, "mrope_section", json_pack("[i,i,i]", x, x, half - 2 * x));
    json_object_set_new(tc, "rope_parameters", rope);
    json_object_set_new(tc, "num_experts", json_integer(d->experts));
    json_object_set_new(tc, "num_experts_per_tok", json_integer(d->top_k));
    json_object_set_new(tc, "moe_intermediate_size", json_integer(d->moe_inter));
    json_object_set_new(tc, "shared_expert_intermediate_size", json_integer(d->shared_inter));
    json_object_set_new(tc, "norm_topk_prob", json_true());
    json_object_set_new(tc, "linear_conv_kernel_dim", json_integer(d->conv_kernel));
    json_object_set_new(tc, "linear_key_head_dim", json_integer(d->lin_k_dim));
    json_object_set_new(tc, "linear_value_head_dim", json_integer(d->lin_v_dim));
    json_object_set_new(tc, "linear_num_key_heads", json_integer(d->lin_k_heads));
    json_object_set_new(tc, "linear_num_value_heads", json_integer(d->lin_v_heads));
    json_object_set_new(tc, "hidden_act", json_string("silu"));
    json_object_set_new(tc, "max_position_embeddings", json_integer(d->max_positions));
    json_object_set_new(tc, "mamba_ssm_dtype", json_string("float32"));
    json_object_set_new(tc, "mtp_num_hidden_layers", json_integer(0));
    json_object_set_new(tc, "tie_word_embeddings", json_false());
    json_object_set_new(tc, "initializer_range", json_real(0.02));
    json_object_set_new(tc, "dtype", json_string("bfloat16"));

    json_t *ac = json_object();
    json_object_set_new(ac, "dim", json_integer(d->a_dim));
    json_object_set_new(ac, "n_head", json_integer(d->a_heads));
    json_object_set_new(ac, "n_local_heads", json_integer(d->a_kv_heads));
    json_object_set_new(ac, "head_dim", json_integer(d->a_head_dim));
    json_object_set_new(ac, "intermediate_size", json_integer(d->a_inter));
    json_object_set_new(ac, "norm_eps", json_real(1e-6));
    json_object_set_new(ac, "num_codebooks", json_integer(d->codebooks));
    json_object_set_new(ac, "vocab_size", json_integer(d->code_vocab));
    json_object_set_new(ac, "shared_enrichment_layers", json_integer(d->shared_layers));
    json_object_set_new(ac, "rope_base", json_real(d->a_rope_base));
    json_object_set_new(ac, "rotary_percent", json_real(d->a_rotary));
    json_object_set_new(ac, "vq_backbone_codebooks", json_integer(d->codebooks));

    json_t *root = json_object();
    json_object_set_new(root, "architectures", json_pack("[s]", "FishOmniModel"));
    json_object_set_new(root, "model_type", json_string("fish_omni"));
    json_object_set_new(root, "text_config", tc);
    json_object_set_new(root, "audio_decoder_config", ac);
    json_object_set_new(root, "semantic_start_token_id", json_integer(ids->semantic_start));
    json_object_set_new(root, "semantic_end_token_id", json_integer(ids->semantic_end));
    json_object_set_new(root, "audio_pad_token_id", json_integer(ids->audio_pad));
    json_object_set_new(root, "eos_token_id", json_integer(ids->im_end));
    json_object_set_new(root, "pad_token_id", json_integer(ids->pad));
    json_object_set_new(root, "tie_word_embeddings", json_false());
    json_object_set_new(root, "dtype", json_string("bfloat16"));
    static const char *const excluded[] = {"lm_head", "model.language_model.embed_tokens", "self_attn",
                                           "linear_attn", "shared_expert", "shared_expert_gate", "mlp.gate",
                                           "audio_decoder", "audio_decoder_mtp", "audio_decoder_mtp_shared"};
    json_t *q = NULL;
    if (o->experts == DR_MM_FP8) {
        json_t *skip = json_array();
        for (size_t i = 0; i < sizeof excluded / sizeof excluded[0]; i++) json_array_append_new(skip, json_string(excluded[i]));
        q = json_pack("{s:s, s:s, s:s, s:[i,i], s:o}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                      "dynamic", "weight_block_size", 128, 128, "modules_to_not_convert", skip);
    } else if (o->experts == DR_MM_NVFP4) {
        q = json_pack("{s:s, s:s, s:i, s:n, s:[s,s,s,s,s,s,s]}", "quant_method", "modelopt", "quant_algo", "NVFP4",
                      "group_size", 16, "kv_cache_quant_algo", "exclude_modules", "lm_head",
                      "model.language_model.embed_tokens", "*self_attn*", "*linear_attn*", "*shared_expert*",
                      "*mlp.gate", "audio_decoder*");
    } else if (o->experts == DR_MM_Q4) {
        q = json_pack("{s:i, s:i, s:s}", "group_size", o->q4_group, "bits", 4, "mode", "affine");
        json_object_set(root, "quantization", q);
    }
    if (q) json_object_set_new(root, "quantization_config", q);
    json_object_set_new(root, "transformers_version", json_string("5.17.0"));

    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(15));
    if (rc == 0 && o->experts == DR_MM_NVFP4) {
        /* ModelOpt writes hf_quant_config.json next to config.json (FORMATS.md 4.6). */
        json_t *h = json_pack("{s:{s:s,s:s}, s:{s:s, s:n, s:i, s:O}}", "producer", "name", "drama make-model",
                              "version", "1", "quantization", "quant_algo", "NVFP4", "kv_cache_quant_algo",
                              "group_size", 16, "exclude_modules", json_object_get(q, "exclude_modules"));
        snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
        rc = h ? json_dump_file(h, path, JSON_INDENT(1)) : -1;
        json_decref(h);
    }
    json_decref(root);
    if (rc != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot write", path);
    return DRAMA_OK;
}

/* Everything is written into DIR/.make-model.partial first and moved into DIR only when every
 * file is complete: a failure (bad hook, disk full, too many shards) leaves DIR as it was. */
#define STAGE_NAME ".make-model.partial"

static void remove_stage(const char *stage) {
    struct stat sb;
    if (lstat(stage, &sb) != 0) return;
    if (!S_ISDIR(sb.st_mode)) { /* never follow a link planted there: remove the link itself */
        unlink(stage);
        return;
    }
    DIR *d = opendir(stage);
    if (d) {
        struct dirent *e;
        char path[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(path, sizeof path, "%s/%s", stage, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(stage);
}

/* Move every staged file into dir (same file system: renames), after removing the shards and
 * the NVFP4 hf_quant_config.json an earlier run may have left there. */
static drama_status publish_stage(const char *stage, const char *dir, drama_error *err) {
    mm_remove_stale(dir);
    char from[4096], to[4096];
    snprintf(to, sizeof to, "%s/hf_quant_config.json", dir);
    snprintf(from, sizeof from, "%s/hf_quant_config.json", stage);
    struct stat sb;
    if (stat(from, &sb) != 0) unlink(to);
    DIR *d = opendir(stage);
    if (!d) return dr_fail(err, DRAMA_EIO, "%s: cannot list: %s", stage, strerror(errno));
    drama_status st = DRAMA_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(from, sizeof from, "%s/%s", stage, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        if (rename(from, to) != 0)
            st = dr_fail(err, DRAMA_EIO, "%s: cannot move to %s: %s", from, to, strerror(errno));
    }
    closedir(d);
    return st;
}

drama_status dr_make_model(const char *dir, const dr_mm_options *o, drama_error *err) {
    drama_status st = dr_mm_validate(o, err);
    if (st) return st;
    if ((st = dr_make_dirs(dir, err))) return st;
    char stage[4096];
    if (strlen(dir) + sizeof STAGE_NAME + 1 > sizeof stage - 64)
        return dr_fail(err, DRAMA_EINVAL, "output directory: path too long '%s'", dir);
    snprintf(stage, sizeof stage, "%s/%s", dir, STAGE_NAME);
    remove_stage(stage); /* left by a killed run */
    if (mkdir(stage, 0777) != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot create directory: %s", stage, strerror(errno));
    dr_mm_token_ids ids;
    st = dr_mm_write_tokenizer(stage, &o->dims, &ids, err);
    int64_t vocab = o->dims.vocab ? o->dims.vocab : ids.n_tokens;
    if (!st) st = write_config(stage, o, &ids, vocab, err);
    if (!st) st = mm_write_weights(stage, o, vocab, err);
    if (!st && o->with_codec) {
        dr_mm_codec codec = o->dims.codec; /* one semantic codebook + the model's residual ones */
        codec.n_codebooks = o->dims.codebooks - 1;
        st = dr_mm_write_codec(stage, &codec, o->seed, err);
    }
    if (!st) st = publish_stage(stage, dir, err);
    remove_stage(stage);
    return st;
}
