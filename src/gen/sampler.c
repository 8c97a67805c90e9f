/* sampler.c - TEXT.md section 5: settings and guidance (the draw is backend/cpu/sample.c). */
#include "gen/sampler.h"

#include <math.h>

#include "backend/cpu/ops.h"

void dr_sampler_params_default(dr_sampler_params *p) {
    p->temperature = 1.0f;
    p->top_p = 0.9f;
    p->semantic_top_k = 0;
    p->acoustic_top_k = 30;
    p->ras_window = 10;
    p->ras_temperature = 1.0f;
    p->ras_top_p = 0.9f;
    p->cfg_gamma = 0.0f;
    p->seed = 0;
    p->frame_cap = 750;
}

/* lo_open / hi_open: whether the bound itself is excluded. */
static drama_status check_range(const char *name, double v, double lo, int lo_open, double hi, int hi_open,
                                drama_error *err) {
    int ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (ok) return DRAMA_OK;
    return dr_fail(err, DRAMA_EINVAL, "%s: must be finite and in %c%g, %g%c, got %g", name, lo_open ? '(' : '[',
                   lo, hi, hi_open ? ')' : ']', v);
}

drama_status dr_sampler_params_validate(const dr_sampler_params *p, drama_error *err) {
    drama_status st;
    if ((st = check_range("temperature", p->temperature, 0, 0, 2, 0, err))) return st;
    if ((st = check_range("top_p", p->top_p, 0, 1, 1, 0, err))) return st;
    if ((st = check_range("semantic_top_k", p->semantic_top_k, 0, 0, 4097, 0, err))) return st;
    if ((st = check_range("acoustic_top_k", p->acoustic_top_k, 0, 0, 1024, 0, err))) return st;
    if ((st = check_range("ras_window", p->ras_window, 0, 0, 64, 0, err))) return st;
    if ((st = check_range("ras_temperature", p->ras_temperature, 0, 1, 2, 0, err))) return st;
    if ((st = check_range("ras_top_p", p->ras_top_p, 0, 1, 1, 0, err))) return st;
    if ((st = check_range("cfg_gamma", p->cfg_gamma, 0, 0, 5, 0, err))) return st;
    if (p->frame_cap < 1) return dr_fail(err, DRAMA_EINVAL, "frame_cap: must be at least 1, got %d", p->frame_cap);
    return DRAMA_OK;
}

void dr_guidance_combine(const float *cond, const float *uncond, int n, float gamma, float *out) {
    dr_op_guidance(cond, uncond, n, gamma, out);
}
