/* state.c - see state.h. */
#include "model/state.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "base/alloc.h"

dr_backend *dr_bb_state_backend(const dr_bb_state *s) { return s->be ? s->be : dr_backend_cpu_memory(); }

/* The ops' view of s, written after every change of its buffers. */
static drama_status write_seq(dr_bb_state *s, drama_error *err) {
    dr_seq v = {s->kv, s->conv, s->rec, s->cap, s->pos, s->kv_dim, s->conv_len, s->rec_len};
    return dr_bk_upload(dr_bb_state_backend(s), s->seq, &v, sizeof v, err);
}

/* A zeroed state of the given sizes with room for `reserve` positions (create and clone). */
static drama_status state_alloc(dr_backend *be, int n_attn, int n_gdn, int64_t kv_dim, int64_t conv_len,
                                int64_t rec_len, int64_t reserve, dr_bb_state **out, drama_error *err) {
    *out = NULL;
    dr_bb_state *s = calloc(1, sizeof *s);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "backbone state: out of memory");
    s->be = be;
    s->n_attn = n_attn;
    s->n_gdn = n_gdn;
    s->kv_dim = kv_dim;
    s->conv_len = conv_len;
    s->rec_len = rec_len;
    dr_backend *b = dr_bb_state_backend(s);
    drama_status st = dr_bk_alloc(b, sizeof(dr_seq), (void **)&s->seq, err);
    if (!st) st = dr_bk_alloc_n(b, (size_t)(n_gdn > 0 ? n_gdn : 1) * (size_t)(conv_len > 0 ? conv_len : 1), sizeof(float),
                                (void **)&s->conv, err);
    if (!st) st = dr_bk_alloc_n(b, (size_t)(n_gdn > 0 ? n_gdn : 1) * (size_t)(rec_len > 0 ? rec_len : 1), sizeof(float),
                                (void **)&s->rec, err);
    if (!st) st = dr_bb_state_reserve(s, reserve > 0 ? reserve : 64, err);
    if (st) {
        dr_bb_state_free(s);
        return st;
    }
    *out = s;
    return DRAMA_OK;
}

drama_status dr_bb_state_create_on(dr_backend *be, const dr_backbone *bb, int64_t reserve, dr_bb_state **out,
                                   drama_error *err) {
    const dr_bb_dims *d = &bb->d;
    int64_t C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv;
    return state_alloc(be, bb->n_attn, bb->n_gdn, (int64_t)d->nkv * d->hd, (int64_t)(d->K > 1 ? d->K - 1 : 0) * C,
                       (int64_t)d->nv * d->dk * d->dv, reserve, out, err);
}

drama_status dr_bb_state_create(const dr_backbone *bb, int64_t reserve, dr_bb_state **out, drama_error *err) {
    return dr_bb_state_create_on(NULL, bb, reserve, out, err);
}

void dr_bb_state_free(dr_bb_state *s) {
    if (!s) return;
    dr_backend *b = dr_bb_state_backend(s);
    dr_bk_free(b, s->kv);
    dr_bk_free(b, s->conv);
    dr_bk_free(b, s->rec);
    dr_bk_free(b, s->seq);
    free(s);
}

void dr_bb_state_reset(dr_bb_state *s) {
    if (!s) return;
    dr_backend *b = dr_bb_state_backend(s);
    s->pos = 0;
    dr_bk_zero(b, (char *)s->seq + offsetof(dr_seq, pos), sizeof(int64_t));
    dr_bk_zero(b, s->conv, (size_t)s->n_gdn * (size_t)s->conv_len * sizeof(float));
    dr_bk_zero(b, s->rec, (size_t)s->n_gdn * (size_t)s->rec_len * sizeof(float));
}

drama_status dr_bb_state_reserve(dr_bb_state *s, int64_t positions, drama_error *err) {
    if (positions <= s->cap) return DRAMA_OK;
    drama_status st = dr_bk_grow_kv(dr_bb_state_backend(s), &s->kv, &s->cap, positions, s->n_attn, s->kv_dim, s->pos,
                                    "backbone state", err);
    return st ? st : write_seq(s, err);
}

drama_status dr_bb_state_copy(dr_bb_state *dst, const dr_bb_state *src, drama_error *err) {
    if (dst == src) return DRAMA_OK;
    if (dst->n_attn != src->n_attn || dst->n_gdn != src->n_gdn || dst->kv_dim != src->kv_dim ||
        dst->conv_len != src->conv_len || dst->rec_len != src->rec_len)
        return dr_fail(err, DRAMA_EINVAL, "backbone state copy: states belong to different backbones");
    dr_backend *b = dr_bb_state_backend(dst);
    if (b->kind != dr_bb_state_backend(src)->kind)
        return dr_fail(err, DRAMA_EINVAL, "backbone state copy: states live on different backends");
    drama_status st = dr_bb_state_reserve(dst, src->pos, err);
    if (st) return st;
    dr_bk_copy_kv(b, dst->kv, dst->cap, src->kv, src->cap, src->n_attn, src->kv_dim, src->pos);
    dr_bk_copy(b, dst->conv, src->conv, (size_t)src->n_gdn * (size_t)src->conv_len * sizeof(float));
    dr_bk_copy(b, dst->rec, src->rec, (size_t)src->n_gdn * (size_t)src->rec_len * sizeof(float));
    dst->pos = src->pos;
    return write_seq(dst, err);
}

drama_status dr_bb_state_clone(const dr_bb_state *src, dr_bb_state **out, drama_error *err) {
    drama_status st = state_alloc(src->be, src->n_attn, src->n_gdn, src->kv_dim, src->conv_len, src->rec_len, src->pos,
                                  out, err);
    if (st) return st;
    if ((st = dr_bb_state_copy(*out, src, err))) {
        dr_bb_state_free(*out);
        *out = NULL;
    }
    return st;
}

size_t dr_bb_state_bytes(const dr_bb_state *s) {
    if (!s) return 0;
    return sizeof *s + sizeof(dr_seq) + (size_t)s->n_attn * 2 * (size_t)s->cap * (size_t)s->kv_dim * sizeof(float) +
           (size_t)s->n_gdn * (size_t)(s->conv_len + s->rec_len) * sizeof(float);
}
