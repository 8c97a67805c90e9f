/* state_bytes.c - see state_bytes.h. */
#include "model/state_bytes.h"

#include "model/state.h"

int64_t dr_state_capacity_for(int64_t reserve, int64_t positions) {
    int64_t cap = 64;
    int64_t need = positions > reserve ? positions : reserve;
    while (cap < need) cap *= 2;
    return cap;
}

size_t dr_bb_state_bytes_for(const dr_backbone *bb, int64_t reserve, int64_t positions) {
    const dr_bb_dims *d = &bb->d;
    size_t kv_dim = (size_t)d->nkv * (size_t)d->hd;
    size_t C = 2 * (size_t)d->nk * (size_t)d->dk + (size_t)d->nv * (size_t)d->dv;
    size_t conv_len = (size_t)(d->K > 1 ? d->K - 1 : 0) * C, rec_len = (size_t)d->nv * d->dk * d->dv;
    size_t cap = (size_t)dr_state_capacity_for(reserve, positions);
    size_t kv_layer = 2 * cap * kv_dim * sizeof(float);
    /* the K/V of all layers is one block: growing keeps the old one (half the size) until copied */
    return sizeof(dr_bb_state) + sizeof(dr_seq) + (size_t)bb->n_attn * (kv_layer + kv_layer / 2) +
           (size_t)bb->n_gdn * (conv_len + rec_len) * sizeof(float);
}

size_t dr_tower_cache_bytes_for(const dr_tower *t, int64_t reserve, int64_t positions) {
    size_t kv_dim = (size_t)t->d.n_kv_head * (size_t)t->d.head_dim;
    size_t cap = (size_t)dr_state_capacity_for(reserve, positions);
    size_t layer = 2 * cap * kv_dim * sizeof(float);
    /* one block for all layers: growing keeps the old one (half the size) until copied */
    return sizeof(dr_tower_cache) + sizeof(dr_seq) + (size_t)t->n_layers * (layer + layer / 2);
}
