/* optimize.h - `drama optimize`: re-encode the routed experts of a checkpoint (FP8 block, NVFP4,
 * MLX affine q4/q8, BF16), optionally dropping experts (pruning), and write a new model directory
 * (../shared/spec/FORMATS.md section 6; docs/optimize.md).
 *
 * Every non-expert tensor is copied byte for byte under its name and dtype; experts are written in
 * the per-expert 2-D layout with original ids, one expert at a time (memory: one expert's three
 * matrices in fp32 plus their encodings). The output is built in DST.partial and renamed to DST at
 * the end; any failure removes DST.partial, so a failed run leaves nothing behind.
 */
#ifndef DRAMA_TOOLS_OPTIMIZE_H
#define DRAMA_TOOLS_OPTIMIZE_H

#include <stdint.h>

#include "base/error.h"

typedef enum dr_opt_format {
    DR_OPT_KEEP = 0, /* experts copied as stored (per-expert source) or sliced (dense fused source) */
    DR_OPT_BF16,     /* dense BF16 */
    DR_OPT_FP8,      /* block FP8 E4M3, 128 x 128 blocks, F32 weight_scale_inv */
    DR_OPT_NVFP4,    /* ModelOpt NVFP4 (weight, weight_scale, weight_scale_2) */
    DR_OPT_AFFINE    /* MLX affine (q4 by default): weight U32, scales, biases */
} dr_opt_format;

typedef struct dr_opt_options {
    const char *src;          /* source model directory */
    const char *dst;          /* output directory (must not exist, or be empty) */
    dr_opt_format experts;
    int affine_bits;          /* 4 or 8 (DR_OPT_AFFINE); 0 = 4 */
    int affine_group;         /* 32, 64 or 128; 0 = 64 */
    const char *prune_file;   /* JSON {"<layer>": [kept ids], ...}, or an index.json carrying
                                 metadata.drama_experts; NULL = no pruning */
    int prune_k;              /* keep the K most used experts per layer (needs calibration); 0 = off */
    const char *calibration;  /* ROWS.json for prune_k */
    uint64_t shard_size;      /* bytes per shard at most (a bigger single expert or tensor gets its
                                 own shard); 0 = 4 GiB */
    int threads;              /* encoding workers; <= 0 = physical cores. Output never depends on it. */
    int quiet;                /* no progress lines on stderr */
} dr_opt_options;

/* What a run did (also in DST/drama-optimize.json). */
typedef struct dr_opt_report {
    int64_t tensors_copied;   /* non-expert tensors, byte for byte */
    int64_t experts_written;  /* (layer, expert) pairs written */
    int64_t experts_dropped;  /* stored in the source, pruned away */
    int64_t tensors_written;  /* all tensors of the output */
    int shards;
    uint64_t total_size;      /* tensor bytes */
    double seconds;
    int64_t peak_rss;         /* bytes, -1 unknown */
} dr_opt_report;

/* Parse "fp8" | "nvfp4" | "q4" | "bf16" | "keep"; 0 on an unknown name. */
int dr_opt_format_parse(const char *s, dr_opt_format *out);
const char *dr_opt_format_name(dr_opt_format f);

/* Run. report may be NULL. */
drama_status dr_optimize(const dr_opt_options *o, dr_opt_report *report, drama_error *err);

#endif
