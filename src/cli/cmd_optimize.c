/* cmd_optimize.c - `drama optimize --model SRC --out DST ...`: re-encode / prune the routed experts
 * of a checkpoint into a new model directory (docs/optimize.md, FORMATS.md section 6). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli_args.h"
#include "cli/commands.h"
#include "tools/optimize.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama optimize --model SRC --out DST [--experts keep|bf16|fp8|nvfp4|q4]\n"
            "       drama optimize SRC --output DST ...   (the same, as mere.run's and MLX's tools spell it)\n"
            "         [--q4-group 32|64|128 | --group-size 32|64|128] [--q4-bits 4|8]\n"
            "         [--prune-experts FILE.json | --prune K --calibration ROWS.json]\n"
            "         [--shard-size BYTES] [--threads N] [--quiet]\n\n"
            "Writes DST (through DST.partial, renamed at the end; a non-empty DST is refused):\n"
            "every non-expert tensor copied byte for byte, routed experts re-encoded per expert with\n"
            "original ids, config.json with the format's quantisation entry, the index (with\n"
            "metadata.drama_experts when pruned), tokenizer/template/codec files, NOTICE,\n"
            "drama-manifest.json and the receipt drama-optimize.json.\n"
            "  --experts keep     copy the stored experts (default; with pruning)\n"
            "  --experts bf16     dense BF16\n"
            "  --experts fp8      block FP8 E4M3, 128x128 blocks, F32 weight_scale_inv\n"
            "  --experts nvfp4    NVFP4 (ModelOpt layout), gate/up share weight_scale_2\n"
            "  --experts q4       MLX affine, --q4-bits 4 (default) or 8, --q4-group 64 (default)\n"
            "  --group-size G     the same as --q4-group G (the affine quantisation group)\n"
            "  --prune-experts F  keep per layer the ids in F: {\"<layer>\": [ids], ...} (or an index.json\n"
            "                     with metadata.drama_experts); layers not listed keep all their experts\n"
            "  --shard-size B     at most B bytes per shard (default 4 GiB)\n");
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    return dr_cli_int("optimize", flag, s, lo, hi, out);
}

int cmd_optimize(int argc, char **argv) {
    dr_opt_options o;
    memset(&o, 0, sizeof o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        }
        if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            continue;
        }
        if (a[0] != '-' && !o.src) { /* FORMATS.md 6 form: drama optimize SRC --output DST */
            o.src = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "drama optimize: %s: %s\n", a, a[0] == '-' ? "missing value" : "unexpected argument");
            usage(stderr);
            return DR_EXIT_USAGE;
        }
        const char *v = argv[++i];
        long long n = 0;
        if (!strcmp(a, "--model")) o.src = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "--output")) o.dst = v;
        else if (!strcmp(a, "--experts")) {
            if (!dr_opt_format_parse(v, &o.experts)) {
                fprintf(stderr, "drama optimize: --experts: unknown format '%s' (keep, bf16, fp8, nvfp4, q4)\n", v);
                return DR_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--q4-group") || !strcmp(a, "--group-size")) {
            if (!parse_int(a, v, 1, 1 << 20, &n)) return DR_EXIT_USAGE;
            if (n != 32 && n != 64 && n != 128) {
                fprintf(stderr, "drama optimize: %s %lld: expected 32, 64 or 128\n", a, n);
                return DR_EXIT_USAGE;
            }
            o.affine_group = (int)n;
        } else if (!strcmp(a, "--q4-bits")) {
            if (!parse_int(a, v, 1, 64, &n)) return DR_EXIT_USAGE;
            if (n != 4 && n != 8) {
                fprintf(stderr, "drama optimize: --q4-bits %lld: expected 4 or 8\n", n);
                return DR_EXIT_USAGE;
            }
            o.affine_bits = (int)n;
        } else if (!strcmp(a, "--prune-experts")) o.prune_file = v;
        else if (!strcmp(a, "--prune")) {
            if (!parse_int(a, v, 1, 1 << 20, &n)) return DR_EXIT_USAGE;
            o.prune_k = (int)n;
        } else if (!strcmp(a, "--calibration")) o.calibration = v;
        else if (!strcmp(a, "--shard-size")) {
            if (!parse_int(a, v, 1, INT64_MAX, &n)) return DR_EXIT_USAGE;
            o.shard_size = (uint64_t)n;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 4096, &n)) return DR_EXIT_USAGE;
            o.threads = (int)n;
        } else {
            fprintf(stderr, "drama optimize: unknown option '%s'\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    if (!o.src || !o.dst) {
        fprintf(stderr, "drama optimize: SRC (--model SRC) and DST (--out/--output DST) are required\n");
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    if (o.prune_file && o.prune_k) {
        fprintf(stderr, "drama optimize: --prune-experts and --prune exclude each other\n");
        return DR_EXIT_USAGE;
    }
    if ((o.prune_k != 0) != (o.calibration != NULL)) {
        fprintf(stderr, "drama optimize: --prune K and --calibration ROWS.json go together\n");
        return DR_EXIT_USAGE;
    }
    if (o.experts != DR_OPT_AFFINE && (o.affine_bits || o.affine_group)) {
        fprintf(stderr, "drama optimize: --q4-bits/--q4-group/--group-size need --experts q4\n");
        return DR_EXIT_USAGE;
    }
    drama_error err = {0};
    dr_opt_report rep;
    if (dr_optimize(&o, &rep, &err) != DRAMA_OK) {
        fprintf(stderr, "drama optimize: %s\n", err.message);
        return DR_EXIT_ERROR;
    }
    printf("%s: %lld tensors copied, %lld experts written (%s), %lld pruned, %lld tensors in %d shard%s, "
           "%llu bytes, %.2f s\n",
           o.dst, (long long)rep.tensors_copied, (long long)rep.experts_written, dr_opt_format_name(o.experts),
           (long long)rep.experts_dropped, (long long)rep.tensors_written, rep.shards, rep.shards == 1 ? "" : "s",
           (unsigned long long)rep.total_size, rep.seconds);
    return DR_EXIT_OK;
}
