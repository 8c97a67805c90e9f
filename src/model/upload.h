/* upload.h - putting a bound model on a backend: every weight in its stored format and every
 * fp32 vector once, after the backend has seen the whole plan (backend.h: plan, upload_weight,
 * upload_vec). The CPU backend keeps using the mapped host objects; CUDA copies them to device
 * memory and refuses, before copying anything, a plan that does not fit. */
#ifndef DRAMA_MODEL_UPLOAD_H
#define DRAMA_MODEL_UPLOAD_H

#include "backend/backend.h"
#include "model/backbone.h"
#include "model/tower.h"

/* Calls w(ctx, weight, part) for every weight and v(ctx, vector, count, part) for every fp32 vector
 * of the backbone and the tower (either may be NULL), part = "dense", "experts" or "tower". */
typedef struct dr_model_visitor {
    void *ctx;
    drama_status (*weight)(void *ctx, const dr_weight *w, const char *part, drama_error *err);
    drama_status (*vec)(void *ctx, const float *v, int64_t n, const char *part, drama_error *err);
} dr_model_visitor;
drama_status dr_model_visit(const dr_backbone *bb, const dr_tower *t, const dr_model_visitor *v, drama_error *err);

/* The plan of bb + t on be (bytes as be will hold them). */
drama_status dr_model_plan(dr_backend *be, const dr_backbone *bb, const dr_tower *t, dr_upload_plan *plan,
                           drama_error *err);
/* Plan, then upload everything (bb or t may be NULL). */
drama_status dr_model_upload(dr_backend *be, const dr_backbone *bb, const dr_tower *t, drama_error *err);

#endif
