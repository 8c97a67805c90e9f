/* optimize_internal.h - shared between optimize.c (plan, shards, files) and optimize_experts.c
 * (kept sets, expert encoding). Not a public interface. */
#ifndef DRAMA_TOOLS_OPTIMIZE_INTERNAL_H
#define DRAMA_TOOLS_OPTIMIZE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/pool.h"
#include "base/tensor.h"
#include "model/backbone.h"
#include "model/config.h"
#include "tools/optimize.h"

#define OPT_MAX_COMP 4
#define OPT_NPROJ 3 /* gate, up, down */

extern const char *const opt_proj_names[OPT_NPROJ]; /* "gate_proj", "up_proj", "down_proj" */

/* One stored tensor of an encoded expert matrix: name = "<base>." + suffix. */
typedef struct opt_comp {
    const char *suffix;
    dr_dtype dtype;
    int ndim;          /* 0 = scalar */
    int64_t shape[2];
    size_t nbytes;
} opt_comp;

/* What the encoder writes for the experts. */
typedef struct opt_target {
    dr_opt_format fmt;   /* never DR_OPT_KEEP here: keep of a fused dense source becomes dense */
    dr_dtype dense;      /* dtype of dense experts and of affine scales/biases */
    int bits, group;     /* affine */
} opt_target;

/* Components of one [rows, cols] matrix in the target format, in write order; returns their
 * count, or 0 when the shape does not fit the format (*why says why). */
int opt_components(const opt_target *t, int64_t rows, int64_t cols, opt_comp out[OPT_MAX_COMP], const char **why);

/* Encoded experts, `nslots` at a time. */
typedef struct opt_slot {
    int layer, slot;                       /* backbone layer, expert slot in that layer */
    int ncomp[OPT_NPROJ];
    opt_comp comp[OPT_NPROJ][OPT_MAX_COMP];
    uint8_t *bytes[OPT_NPROJ][OPT_MAX_COMP];
    float *w[OPT_NPROJ];                   /* dequantised source, fp32 */
    drama_error err;
    drama_status st;
} opt_slot;

typedef struct opt_encoder {
    const dr_backbone *bb;
    opt_target t;
    int check_exact;     /* source experts quantised: refuse values BF16 cannot hold exactly */
    int nslots;
    opt_slot *slots;
    dr_pool *pool;
} opt_encoder;

drama_status opt_encoder_init(opt_encoder *enc, const dr_backbone *bb, const opt_target *t, int check_exact,
                              int nslots, dr_pool *pool, drama_error *err);
void opt_encoder_free(opt_encoder *enc);
/* Encode experts (layer[i], slot[i]) for i < n (n <= nslots) into slots 0..n-1, in parallel.
 * The first failure (in index order) is returned. */
drama_status opt_encoder_run(opt_encoder *enc, const int *layers, const int *slots, int n, drama_error *err);

/* Give the pages of a read-only mapping range back to the kernel (madvise DONTNEED on the whole
 * pages inside it): the source is read once, so its pages need not stay in the resident set.
 * They are read again from the file if touched later. */
void opt_drop_pages(const void *p, size_t n);

/* Kept sets: keep[L * E + e] = 1 when expert e of layer L is written. Starts as the source's
 * stored sets; the prune file / calibration narrows them. Errors name the layer or expert. */
drama_status opt_keep_from_file(const char *path, const dr_backbone *bb, unsigned char *keep, drama_error *err);
/* optimize_calib.c: the k experts the router selects most often on the calibration rows. Sets the
 * backbone's token ids (from cfg) to run it. */
drama_status opt_keep_from_calibration(const char *rows_path, int k, const dr_config *cfg, dr_backbone *bb,
                                       dr_pool *pool, unsigned char *keep, drama_error *err);

#endif
