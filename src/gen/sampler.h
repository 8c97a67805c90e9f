/* sampler.h - sampling settings and the draws (TEXT.md section 5).
 *
 * The draw itself is the CPU reference of the backend's sampling ops (backend/cpu/sample.h:
 * dr_sample, dr_sample_semantic, dr_sample_acoustic, dr_sample_distribution); a frame step
 * draws through the backend (backend.h: sample_semantic / sample_acoustic), at the same draw
 * indices 16*f + slot, so a seed gives the same codes on every backend. This header adds the
 * settings: defaults and validation, and guidance.
 */
#ifndef DRAMA_GEN_SAMPLER_H
#define DRAMA_GEN_SAMPLER_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/sample.h"
#include "base/error.h"

/* TEXT.md 5.7 defaults; seed 0 (callers that want a drawn seed set it). */
void dr_sampler_params_default(dr_sampler_params *p);
/* Every value finite and in range; the error names the parameter and the value. */
drama_status dr_sampler_params_validate(const dr_sampler_params *p, drama_error *err);

/* Classifier-free guidance (TEXT.md 5.5): out = cond + gamma * (cond - uncond); a candidate
 * excluded (-inf) in cond stays excluded. out may alias cond. */
void dr_guidance_combine(const float *cond, const float *uncond, int n, float gamma, float *out);

#endif
