/* loader.h - binding checkpoint tensors by name, and the findings report of MODEL.md 4.5.
 *
 * A dr_loader is a view of a checkpoint's tensor names after the `names.rename` switch, with a
 * "consumed" mark per tensor. Model parts (backbone, tower) ask for the tensors they expect;
 * every problem becomes a finding instead of an early return, so one load reports everything:
 *
 *   missing      expected, absent                                    fatal
 *   mis-shaped   present with another shape: "expected [..], found [..]" fatal
 *   unsupported  dtype/format combination the engine cannot use      fatal
 *   incomplete   quantised weight without its companions, or the reverse fatal
 *   unexpected   present and not consumed                            warning (fatal: loader.strict)
 *   ignored      known harmless extras                               info
 *
 * Typical use:
 *   dr_loader_create(ckpt, cfg, &ld, err);
 *   dr_backbone_bind(bb, ld, ...);  dr_tower_bind(..., dr_loader_find, ld, ...);
 *   dr_loader_finish(ld);                      // untaken tensors -> unexpected / incomplete
 *   dr_findings_print(dr_loader_findings(ld), stdout);
 *   if (dr_findings_check(dr_loader_findings(ld), strict, err)) fail;
 */
#ifndef DRAMA_MODEL_LOADER_H
#define DRAMA_MODEL_LOADER_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "base/tensor.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "num/weight.h"

typedef enum dr_finding_kind {
    DR_FIND_MISSING = 0,
    DR_FIND_MISSHAPED,
    DR_FIND_UNSUPPORTED,
    DR_FIND_INCOMPLETE,
    DR_FIND_UNEXPECTED,
    DR_FIND_IGNORED,
    DR_FIND_KIND_COUNT
} dr_finding_kind;

typedef struct dr_finding {
    dr_finding_kind kind;
    char *name;    /* tensor (or field) at fault */
    char *detail;  /* e.g. "expected [64, 64], found [64, 32]" */
} dr_finding;

typedef struct dr_findings {
    int n, cap;
    dr_finding *items;
} dr_findings;

const char *dr_finding_kind_name(dr_finding_kind k); /* "missing", "mis-shaped", ... */
void dr_findings_add(dr_findings *f, dr_finding_kind kind, const char *name, const char *fmt, ...) DR_PRINTF(4, 5);
int dr_findings_count(const dr_findings *f, dr_finding_kind kind);
/* Fatal findings: missing, mis-shaped, unsupported, incomplete; unexpected too when strict. */
int dr_findings_fatal(const dr_findings *f, int strict);
/* One line per finding: "missing: NAME" / "mis-shaped: NAME: expected [..], found [..]". */
void dr_findings_print(const dr_findings *f, FILE *out);
/* DRAMA_OK when nothing is fatal; else DRAMA_ESHAPE (or EUNSUPPORTED) with a message that
 * counts the fatal findings and names the first few. */
drama_status dr_findings_check(const dr_findings *f, int strict, drama_error *err);
void dr_findings_clear(dr_findings *f);

typedef struct dr_loader dr_loader;

/* Build the renamed name view (switch names.rename; invalid regexes are errors naming the rule). */
drama_status dr_loader_create(const dr_ckpt *ckpt, const dr_config *cfg, dr_loader **out, drama_error *err);
void dr_loader_free(dr_loader *ld);

const dr_ckpt *dr_loader_ckpt(const dr_loader *ld);
const dr_config *dr_loader_config(const dr_loader *ld);
dr_findings *dr_loader_findings(dr_loader *ld);

/* Names after renaming, sorted; and whether each was consumed. */
int64_t dr_loader_count(const dr_loader *ld);
const char *dr_loader_name_at(const dr_loader *ld, int64_t i);
const dr_tensor *dr_loader_tensor_at(const dr_loader *ld, int64_t i);
int dr_loader_taken_at(const dr_loader *ld, int64_t i);

/* Lookup without consuming; NULL when absent. */
const dr_tensor *dr_loader_peek(const dr_loader *ld, const char *name);
/* Lookup and mark consumed; NULL when absent (no finding recorded). */
const dr_tensor *dr_loader_take(dr_loader *ld, const char *name);
/* Same as take, with the signature of dr_tower_find_fn (ctx is the dr_loader). */
const dr_tensor *dr_loader_find(void *ld, const char *name);
/* Mark as a known harmless extra (finding "ignored"). */
void dr_loader_ignore(dr_loader *ld, const char *name, const char *why);

/* Backbone prefix (MODEL.md 4.1) over the renamed names: `forced` wins when non-NULL. */
drama_status dr_loader_detect_prefix(const dr_loader *ld, const char *forced, char *buf, size_t buflen,
                                     drama_error *err);

/* Take a dense float tensor that must have exactly `ndim` dims equal to `shape` (-1 = any) and
 * convert it to fp32 (malloc'd, numel values). Findings on absence/shape/dtype; returns NULL then. */
float *dr_loader_take_f32(dr_loader *ld, const char *name, int ndim, const int64_t *shape, int64_t *numel);

/* Bind weight `name` (any storage format of FORMATS.md 4, companions found by name and consumed)
 * as logical [rows, cols] (-1 = any). For a fused 3-D tensor pass the expert slot in `slice`
 * (>= 0) and the expected leading dimension in `n_slices`; otherwise slice = -1.
 * Returns 1 when *out is usable; else 0 with a finding recorded. */
int dr_loader_bind(dr_loader *ld, const char *name, int64_t rows, int64_t cols, int64_t slice, int64_t n_slices,
                   dr_weight *out);

/* Every tensor not taken becomes "unexpected" ("incomplete" when it is a quantisation companion
 * whose weight was never bound). Call once, after every part has bound its tensors. */
void dr_loader_finish(dr_loader *ld);

#endif
