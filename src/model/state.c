/* state.c - see state.h. */
#include "model/state.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

/* A zeroed state of the given sizes with room for `reserve` positions (create and clone). */
static drama_status state_alloc(int n_attn, int n_gdn, int64_t kv_dim, int64_t conv_len, int64_t rec_len,
                                int64_t reserve, dr_bb_state **out, drama_error *err) {
    *out = NULL;
    dr_bb_state *s = calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "backbone state: out of memory");
    s->n_attn = n_attn;
    s->n_gdn = n_gdn;
    s->kv_dim = kv_dim;
    s->conv_len = conv_len;
    s->rec_len = rec_len;
    s->k = calloc((size_t)(s->n_attn + 1), sizeof(float *));
    s->v = calloc((size_t)(s->n_attn + 1), sizeof(float *));
    s->conv = calloc((size_t)(s->n_gdn + 1), sizeof(float *));
    s->rec = calloc((size_t)(s->n_gdn + 1), sizeof(float *));
    if (!s->k || !s->v || !s->conv || !s->rec) goto oom;
    for (int i = 0; i < s->n_gdn; i++) {
        s->conv[i] = dr_calloc((size_t)(s->conv_len > 0 ? s->conv_len : 1), sizeof(float));
        s->rec[i] = dr_calloc((size_t)s->rec_len, sizeof(float));
        if (!s->conv[i] || !s->rec[i]) goto oom;
    }
    if (dr_bb_state_reserve(s, reserve > 0 ? reserve : 64, err)) {
        dr_bb_state_free(s);
        return err ? err->code : DRAMA_ENOMEM;
    }
    *out = s;
    return DRAMA_OK;
oom:
    dr_bb_state_free(s);
    return dr_fail(err, DRAMA_ENOMEM, "backbone state: out of memory");
}

drama_status dr_bb_state_create(const dr_backbone *bb, int64_t reserve, dr_bb_state **out, drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int64_t C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv;
    return state_alloc(bb->n_attn, bb->n_gdn, (int64_t)d->nkv * d->hd, (int64_t)(d->K > 1 ? d->K - 1 : 0) * C,
                       (int64_t)d->nv * d->dk * d->dv, reserve, out, err);
}

void dr_bb_state_free(dr_bb_state *s) {
    if (!s) return;
    for (int i = 0; s->k && i < s->n_attn; i++) dr_free(s->k[i]);
    for (int i = 0; s->v && i < s->n_attn; i++) dr_free(s->v[i]);
    for (int i = 0; s->conv && i < s->n_gdn; i++) dr_free(s->conv[i]);
    for (int i = 0; s->rec && i < s->n_gdn; i++) dr_free(s->rec[i]);
    free(s->k);
    free(s->v);
    free(s->conv);
    free(s->rec);
    free(s);
}

void dr_bb_state_reset(dr_bb_state *s) {
    if (!s) return;
    s->pos = 0;
    for (int i = 0; i < s->n_gdn; i++) {
        memset(s->conv[i], 0, (size_t)s->conv_len * sizeof(float));
        memset(s->rec[i], 0, (size_t)s->rec_len * sizeof(float));
    }
}

drama_status dr_bb_state_reserve(dr_bb_state *s, int64_t positions, drama_error *err) {
    if (positions <= s->cap) return DRAMA_OK;
    int64_t cap = s->cap > 0 ? s->cap : 64;
    while (cap < positions) cap *= 2;
    size_t bytes;
    if (!dr_mul_size((size_t)cap, (size_t)s->kv_dim * sizeof(float), &bytes))
        return dr_fail(err, DRAMA_ENOMEM, "backbone state: %lld positions overflow", (long long)positions);
    for (int i = 0; i < s->n_attn; i++) {
        float *nk = dr_alloc(bytes ? bytes : 1), *nv = dr_alloc(bytes ? bytes : 1);
        if (!nk || !nv) {
            dr_free(nk);
            dr_free(nv);
            return dr_fail(err, DRAMA_ENOMEM, "backbone state: cannot grow K/V cache to %lld positions",
                           (long long)cap);
        }
        size_t used = (size_t)s->pos * (size_t)s->kv_dim * sizeof(float);
        if (s->k[i] && used) {
            memcpy(nk, s->k[i], used);
            memcpy(nv, s->v[i], used);
        }
        dr_free(s->k[i]);
        dr_free(s->v[i]);
        s->k[i] = nk;
        s->v[i] = nv;
    }
    s->cap = cap;
    return DRAMA_OK;
}

drama_status dr_bb_state_copy(dr_bb_state *dst, const dr_bb_state *src, drama_error *err) {
    if (dst == src) return DRAMA_OK;
    if (dst->n_attn != src->n_attn || dst->n_gdn != src->n_gdn || dst->kv_dim != src->kv_dim ||
        dst->conv_len != src->conv_len || dst->rec_len != src->rec_len)
        return dr_fail(err, DRAMA_EINVAL, "backbone state copy: states belong to different backbones");
    if (dr_bb_state_reserve(dst, src->pos, err)) return err ? err->code : DRAMA_ENOMEM;
    size_t used = (size_t)src->pos * (size_t)src->kv_dim * sizeof(float);
    for (int i = 0; i < src->n_attn; i++) {
        if (used) {
            memcpy(dst->k[i], src->k[i], used);
            memcpy(dst->v[i], src->v[i], used);
        }
    }
    for (int i = 0; i < src->n_gdn; i++) {
        memcpy(dst->conv[i], src->conv[i], (size_t)src->conv_len * sizeof(float));
        memcpy(dst->rec[i], src->rec[i], (size_t)src->rec_len * sizeof(float));
    }
    dst->pos = src->pos;
    return DRAMA_OK;
}

drama_status dr_bb_state_clone(const dr_bb_state *src, dr_bb_state **out, drama_error *err) {
    drama_status st =
        state_alloc(src->n_attn, src->n_gdn, src->kv_dim, src->conv_len, src->rec_len, src->pos, out, err);
    if (st) return st;
    if (dr_bb_state_copy(*out, src, err)) {
        dr_bb_state_free(*out);
        *out = NULL;
        return err ? err->code : DRAMA_ENOMEM;
    }
    return DRAMA_OK;
}

size_t dr_bb_state_bytes(const dr_bb_state *s) {
    if (!s) return 0;
    return sizeof *s + (size_t)s->n_attn * 2 * (size_t)s->cap * (size_t)s->kv_dim * sizeof(float) +
           (size_t)s->n_gdn * (size_t)(s->conv_len + s->rec_len) * sizeof(float);
}
