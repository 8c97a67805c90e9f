/* cmd_make_model.c - `drama make-model DIR`: write a random-weight checkpoint (docs/tools.md). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli_args.h"
#include "cli/commands.h"
#include "tools/make_model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama make-model DIR [--shape tiny|full|custom] [--seed S]\n"
            "         [--experts bf16|fp8|nvfp4|q4] [--q4-group 32|64|128] [--prune K]\n"
            "         [--layout per-expert|fused] [--shards N] [--codec tiny|real|none] [--threads N]\n"
            "         [--expert-fill encode|direct] [dimension flags]\n\n"
            "Writes config.json, sharded safetensors + index, tokenizer.json and codec.safetensors +\n"
            "codec.json with seeded random weights (same seed -> identical files).\n"
            "  --shape tiny    the golden tiny shape (hidden 64, 8 layers, 16 experts top-4); default\n"
            "  --shape full    Drama 3 shapes (hidden 2048, 40 layers, 256 experts top-8, 13-layer tower)\n"
            "  --shape custom  tiny, then the dimension flags below\n"
            "  --expert-fill direct  routed experts as random stored codes (valid, bounded scales)\n"
            "                  instead of encodings of the BF16 values: seconds at full shape; for\n"
            "                  benchmarks and backend parity (default encode)\n"
            "Dimension flags (override the shape): --hidden --layers --full-attention-interval --heads\n"
            "  --kv-heads --head-dim --partial-rotary --linear-key-heads --linear-key-dim\n"
            "  --linear-value-heads --linear-value-dim --conv-kernel --num-experts --top-k --moe-inter\n"
            "  --shared-inter --vocab --tower-dim --tower-heads --tower-kv-heads --tower-head-dim\n"
            "  --tower-inter --tower-shared-layers --codebooks --code-vocab --head-rows --speakers\n"
            "Test hooks (broken checkpoints for inspect tests): --test-omit NAME, --test-misshape NAME\n"
            "  (one more row), --test-extra NAME (an extra BF16 [4] tensor)\n");
}

typedef struct dim_flag {
    const char *name;
    int is64;
    size_t offset;
} dim_flag;

#define DI(n, f) {n, 0, offsetof(dr_mm_dims, f)}
#define DL(n, f) {n, 1, offsetof(dr_mm_dims, f)}
static const dim_flag k_dims[] = {
    DI("--hidden", hidden), DI("--layers", layers), DI("--full-attention-interval", full_attention_interval),
    DI("--heads", heads), DI("--kv-heads", kv_heads), DI("--head-dim", head_dim),
    DI("--linear-key-heads", lin_k_heads), DI("--linear-key-dim", lin_k_dim),
    DI("--linear-value-heads", lin_v_heads), DI("--linear-value-dim", lin_v_dim),
    DI("--conv-kernel", conv_kernel), DI("--num-experts", experts), DI("--top-k", top_k),
    DL("--moe-inter", moe_inter), DL("--shared-inter", shared_inter), DL("--vocab", vocab),
    DI("--tower-dim", a_dim), DI("--tower-heads", a_heads), DI("--tower-kv-heads", a_kv_heads),
    DI("--tower-head-dim", a_head_dim), DL("--tower-inter", a_inter), DI("--tower-shared-layers", shared_layers),
    DI("--codebooks", codebooks), DI("--code-vocab", code_vocab), DI("--head-rows", head_rows),
    DI("--speakers", speakers),
};

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    long long v;
    if (!dr_cli_int("make-model", flag, s, lo, hi, &v)) return 0;
    *out = v;
    return 1;
}

int cmd_make_model(int argc, char **argv) {
    const char *dir = NULL, *shape = "tiny", *codec = NULL;
    /* First pass: the shape decides the defaults that every other flag overrides. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[i + 1];
    }
    dr_mm_options o;
    if (!dr_mm_shape_defaults(shape, &o)) {
        fprintf(stderr, "drama make-model: --shape: unknown shape '%s' (tiny, full, custom)\n", shape);
        return DR_EXIT_USAGE;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (dir) {
                fprintf(stderr, "drama make-model: unexpected argument '%s'\n", a);
                return DR_EXIT_USAGE;
            }
            dir = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "drama make-model: %s needs a value\n", a);
            return DR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        int64_t n;
        if (!strcmp(a, "--shape")) continue;
        if (!strcmp(a, "--seed")) {
            if (!parse_i64(a, v, 0, INT64_MAX, &n)) return DR_EXIT_USAGE;
            o.seed = (uint64_t)n;
        } else if (!strcmp(a, "--experts")) {
            if (!strcmp(v, "bf16")) o.experts = DR_MM_BF16;
            else if (!strcmp(v, "fp8")) o.experts = DR_MM_FP8;
            else if (!strcmp(v, "nvfp4")) o.experts = DR_MM_NVFP4;
            else if (!strcmp(v, "q4")) o.experts = DR_MM_Q4;
            else {
                fprintf(stderr, "drama make-model: --experts: '%s' (bf16, fp8, nvfp4, q4)\n", v);
                return DR_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--q4-group")) {
            if (!parse_i64(a, v, 1, 4096, &n)) return DR_EXIT_USAGE;
            o.q4_group = (int)n;
        } else if (!strcmp(a, "--prune")) {
            if (!parse_i64(a, v, 0, 1 << 20, &n)) return DR_EXIT_USAGE;
            o.prune_keep = (int)n;
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "per-expert")) o.layout = DR_MM_PER_EXPERT;
            else if (!strcmp(v, "fused")) o.layout = DR_MM_FUSED;
            else {
                fprintf(stderr, "drama make-model: --layout: '%s' (per-expert, fused)\n", v);
                return DR_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--shards")) {
            if (!parse_i64(a, v, 1, 99999, &n)) return DR_EXIT_USAGE;
            o.shards = (int)n;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_i64(a, v, 0, 1024, &n)) return DR_EXIT_USAGE;
            o.threads = (int)n;
        } else if (!strcmp(a, "--expert-fill")) {
            if (!strcmp(v, "encode")) o.expert_fill = DR_MM_FILL_ENCODE;
            else if (!strcmp(v, "direct")) o.expert_fill = DR_MM_FILL_DIRECT;
            else {
                fprintf(stderr, "drama make-model: --expert-fill: '%s' (encode, direct)\n", v);
                return DR_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--test-omit")) {
            o.test_omit = v;
        } else if (!strcmp(a, "--test-misshape")) {
            o.test_misshape = v;
        } else if (!strcmp(a, "--test-extra")) {
            o.test_extra = v;
        } else if (!strcmp(a, "--codec")) {
            codec = v;
        } else if (!strcmp(a, "--partial-rotary")) {
            if (!dr_cli_num("make-model", a, v, -HUGE_VAL, HUGE_VAL, 0, &o.dims.partial_rotary)) return DR_EXIT_USAGE;
        } else {
            size_t k;
            for (k = 0; k < sizeof k_dims / sizeof k_dims[0]; k++)
                if (!strcmp(a, k_dims[k].name)) break;
            if (k == sizeof k_dims / sizeof k_dims[0]) {
                fprintf(stderr, "drama make-model: unknown option '%s' (see --help)\n", a);
                return DR_EXIT_USAGE;
            }
            if (!parse_i64(a, v, 0, k_dims[k].is64 ? INT64_MAX / 4 : (1 << 24), &n)) return DR_EXIT_USAGE;
            char *field = (char *)&o.dims + k_dims[k].offset;
            if (k_dims[k].is64) memcpy(field, &n, sizeof n);
            else {
                int x = (int)n;
                memcpy(field, &x, sizeof x);
            }
        }
    }
    if (!dir) {
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    if (codec) {
        dr_mm_options ref;
        if (!strcmp(codec, "none")) o.with_codec = 0;
        else if (!strcmp(codec, "tiny") || !strcmp(codec, "real")) {
            dr_mm_shape_defaults(!strcmp(codec, "tiny") ? "tiny" : "full", &ref);
            o.dims.codec = ref.dims.codec;
        } else {
            fprintf(stderr, "drama make-model: --codec: '%s' (tiny, real, none)\n", codec);
            return DR_EXIT_USAGE;
        }
    }
    drama_error err = {0};
    if (dr_make_model(dir, &o, &err)) {
        fprintf(stderr, "drama make-model: %s\n", err.message);
        return err.code == DRAMA_EINVAL ? DR_EXIT_USAGE : DR_EXIT_ERROR;
    }
    printf("wrote %s (shape %s, experts %s, seed %llu)\n", dir, shape,
           (const char *[]){"bf16", "fp8", "nvfp4", "q4"}[o.experts], (unsigned long long)o.seed);
    return DR_EXIT_OK;
}
