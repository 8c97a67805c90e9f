/* backend.c - what every backend shares: draw-failure messages, checked allocation, free. */
#include "backend/backend.h"

#include <stdio.h>

#include "base/alloc.h"

drama_status dr_draw_fail(const dr_op_status *s, const char *what_override, drama_error *err) {
    char what[64];
    if (what_override) snprintf(what, sizeof what, "%s", what_override);
    else if (s->a == DR_DRAW_SEMANTIC) snprintf(what, sizeof what, "semantic draw of frame %llu", (unsigned long long)s->c);
    else if (s->a == DR_DRAW_REDRAW) snprintf(what, sizeof what, "semantic redraw of frame %llu", (unsigned long long)s->c);
    else snprintf(what, sizeof what, "codebook %d draw of frame %llu", s->a, (unsigned long long)s->c);
    drama_status code = s->code ? (drama_status)s->code : DRAMA_EINTERNAL;
    switch (s->b) {
    case DR_DRAW_NAN: return dr_fail(err, code, "%s: logit of candidate %lld is NaN", what, (long long)s->d);
    case DR_DRAW_POSINF: return dr_fail(err, code, "%s: logit of candidate %lld is +inf", what, (long long)s->d);
    case DR_DRAW_ALL_EXCLUDED: return dr_fail(err, code, "%s: every candidate is excluded (-inf)", what);
    case DR_DRAW_SCRATCH:
        return dr_fail(err, code, "%s: %lld candidates exceed the sampler's scratch", what, (long long)s->d);
    case DR_DRAW_SLOT: return dr_fail(err, code, "%s: codebook out of the slot range", what);
    default: return dr_fail(err, code, "%s: failed (reason %d)", what, s->b);
    }
}

static drama_status alloc_n(dr_backend *be, size_t count, size_t size, int zeroed, void **out, drama_error *err) {
    size_t bytes;
    *out = NULL;
    if (!dr_mul_size(count, size, &bytes))
        return dr_fail(err, DRAMA_ENOMEM, "%s backend: %zu x %zu bytes overflow", be->name, count, size);
    return be->ops->alloc(be, bytes ? bytes : 1, zeroed, out, err);
}

drama_status dr_bk_alloc_n(dr_backend *be, size_t count, size_t size, void **out, drama_error *err) {
    return alloc_n(be, count, size, 1, out, err);
}

drama_status dr_bk_alloc_scratch(dr_backend *be, size_t count, size_t size, void **out, drama_error *err) {
    return alloc_n(be, count, size, 0, out, err);
}

void dr_bk_copy_kv(dr_backend *be, float *dst, int64_t dst_cap, const float *src, int64_t src_cap, int n_layers,
                   int64_t kv_dim, int64_t len) {
    size_t used = (size_t)len * (size_t)kv_dim * sizeof(float);
    for (int l = 0; used && l < n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            dr_bk_copy(be, dst + ((int64_t)2 * l + kv) * dst_cap * kv_dim, src + ((int64_t)2 * l + kv) * src_cap * kv_dim,
                       used);
}

drama_status dr_bk_grow_kv(dr_backend *be, float **kv, int64_t *cap, int64_t need, int n_layers, int64_t kv_dim,
                           int64_t len, const char *what, drama_error *err) {
    if (need <= *cap) return DRAMA_OK;
    int64_t c = *cap > 0 ? *cap : 64;
    while (c < need) c *= 2;
    size_t layer, bytes;
    if (!dr_mul_size((size_t)c, (size_t)kv_dim * sizeof(float), &layer) ||
        !dr_mul_size(layer, (size_t)2 * (size_t)(n_layers > 0 ? n_layers : 1), &bytes))
        return dr_fail(err, DRAMA_ENOMEM, "%s: %lld positions overflow", what, (long long)need);
    float *nkv;
    /* uninitialised: a position is written before any row reads it */
    if (be->ops->alloc(be, bytes, 0, (void **)&nkv, NULL))
        return dr_fail(err, DRAMA_ENOMEM, "%s: cannot grow the K/V cache to %lld positions", what, (long long)c);
    if (*kv) dr_bk_copy_kv(be, nkv, c, *kv, *cap, n_layers, kv_dim, len);
    if (*kv) be->ops->free(be, *kv);
    *kv = nkv;
    *cap = c;
    return DRAMA_OK;
}

void dr_backend_free(dr_backend *be) {
    if (be && be->destroy) be->destroy(be);
}
