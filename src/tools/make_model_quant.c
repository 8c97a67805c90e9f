/* make_model_quant.c - routed-expert matrices in the stored format chosen by --experts.
 * The source of every matrix is its BF16-rounded random values; the encoders are num/quant.h
 * (FORMATS.md 6 and 4.4), so a generated quantised model is what `drama optimize` would make
 * of the BF16 model with the same seed. */
#include <stdlib.h>
#include <string.h>

#include "num/formats.h"
#include "num/quant.h"
#include "tools/make_model_quant.h"

static mm_q_component comp(int kind, const char *suffix, dr_dtype dt, int ndim, int64_t d0, int64_t d1) {
    mm_q_component c = {kind, suffix, dt, ndim, {d0, d1}};
    return c;
}

int mm_quant_components(const dr_mm_options *o, int64_t rows, int64_t cols, mm_q_component out[MM_Q_MAX]) {
    switch (o->experts) {
    case DR_MM_BF16:
        out[0] = comp(MM_Q_BF16, "weight", DR_DT_BF16, 2, rows, cols);
        return 1;
    case DR_MM_FP8:
        out[0] = comp(MM_Q_FP8_W, "weight", DR_DT_F8_E4M3, 2, rows, cols);
        out[1] = comp(MM_Q_FP8_SCALE, "weight_scale_inv", DR_DT_F32, 2, (rows + 127) / 128, (cols + 127) / 128);
        return 2;
    case DR_MM_NVFP4:
        out[0] = comp(MM_Q_NV_W, "weight", DR_DT_U8, 2, rows, cols / 2);
        out[1] = comp(MM_Q_NV_SCALE, "weight_scale", DR_DT_F8_E4M3, 2, rows, cols / 16);
        out[2] = comp(MM_Q_NV_SCALE2, "weight_scale_2", DR_DT_F32, 0, 0, 0);
        out[3] = comp(MM_Q_NV_INPUT, "input_scale", DR_DT_F32, 0, 0, 0);
        return 4;
    case DR_MM_Q4:
        out[0] = comp(MM_Q_AF_W, "weight", DR_DT_U32, 2, rows, cols / 8);
        out[1] = comp(MM_Q_AF_SCALES, "scales", DR_DT_BF16, 2, rows, cols / o->q4_group);
        out[2] = comp(MM_Q_AF_BIASES, "biases", DR_DT_BF16, 2, rows, cols / o->q4_group);
        return 3;
    }
    return 0;
}

struct mm_quant_cache {
    int layer, expert, proj;      /* what is held; layer -1 = nothing */
    float *src, *partner;         /* the source matrix; nvfp4: the gate/up partner for the shared scale */
    size_t src_cap;
    uint8_t *part[MM_Q_KINDS];    /* bytes per component kind */
    size_t len[MM_Q_KINDS], cap[MM_Q_KINDS];
};

mm_quant_cache *mm_quant_cache_new(void) {
    mm_quant_cache *c = calloc(1, sizeof *c);
    if (c) c->layer = -1;
    return c;
}

void mm_quant_cache_free(mm_quant_cache *c) {
    if (!c) return;
    free(c->src);
    free(c->partner);
    for (int i = 0; i < MM_Q_KINDS; i++) free(c->part[i]);
    free(c);
}

static uint8_t *slot(mm_quant_cache *c, int kind, size_t n) {
    if (c->cap[kind] < n) {
        uint8_t *p = realloc(c->part[kind], n);
        if (!p) return NULL;
        c->part[kind] = p;
        c->cap[kind] = n;
    }
    c->len[kind] = n;
    return c->part[kind];
}

static drama_status encode(mm_quant_cache *c, const dr_mm_options *o, int layer, int e, int proj, drama_error *err) {
    int64_t rows = proj == 2 ? o->dims.hidden : o->dims.moe_inter;
    int64_t cols = proj == 2 ? o->dims.moe_inter : o->dims.hidden;
    size_t n = (size_t)(rows * cols);
    if (c->src_cap < n) {
        float *a = realloc(c->src, n * sizeof *a), *b = a ? realloc(c->partner, n * sizeof *b) : NULL;
        if (a) c->src = a;
        if (b) c->partner = b;
        if (!a || !b) return dr_fail(err, DRAMA_ENOMEM, "out of memory for a [%lld, %lld] expert matrix",
                                     (long long)rows, (long long)cols);
        c->src_cap = n;
    }
    c->layer = -1;
    mm_expert_rows(o, layer, e, proj, 0, rows, c->src);
    drama_status st = DRAMA_OK;
    switch (o->experts) {
    case DR_MM_BF16: {
        uint16_t *b = (uint16_t *)slot(c, MM_Q_BF16, n * 2);
        if (!b) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) b[i] = dr_f32_to_bf16(c->src[i]);
        break;
    }
    case DR_MM_FP8: {
        size_t ns = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128));
        uint8_t *codes = slot(c, MM_Q_FP8_W, n), *sc = slot(c, MM_Q_FP8_SCALE, ns * 4);
        if (!codes || !sc) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        float *tmp = malloc(ns * sizeof *tmp);
        if (!tmp) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        st = dr_quant_fp8_block(c->src, rows, cols, 128, 128, codes, tmp, err);
        memcpy(sc, tmp, ns * 4);
        free(tmp);
        break;
    }
    case DR_MM_NVFP4: {
        /* gate and up of one expert share weight_scale_2 (the larger amax of the two) */
        float amax = dr_quant_amax(c->src, (int64_t)n);
        if (proj != 2) {
            mm_expert_rows(o, layer, e, 1 - proj, 0, rows, c->partner);
            float a2 = dr_quant_amax(c->partner, (int64_t)n);
            if (a2 > amax) amax = a2;
        }
        float gs = dr_quant_nvfp4_global_scale(amax), one = 1.0f;
        uint8_t *packed = slot(c, MM_Q_NV_W, n / 2), *sc = slot(c, MM_Q_NV_SCALE, n / 16);
        uint8_t *s2 = slot(c, MM_Q_NV_SCALE2, 4), *in = slot(c, MM_Q_NV_INPUT, 4);
        if (!packed || !sc || !s2 || !in) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        memcpy(s2, &gs, 4);
        memcpy(in, &one, 4); /* input_scale: present as in ModelOpt files, unused by weight-only use */
        st = dr_quant_nvfp4(c->src, rows, cols, gs, packed, sc, err);
        break;
    }
    case DR_MM_Q4: {
        size_t ng = (size_t)(rows * (cols / o->q4_group));
        uint8_t *words = slot(c, MM_Q_AF_W, n / 2), *sc = slot(c, MM_Q_AF_SCALES, ng * 2),
                *bi = slot(c, MM_Q_AF_BIASES, ng * 2);
        if (!words || !sc || !bi) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        st = dr_quant_affine(c->src, rows, cols, 4, o->q4_group, DR_DT_BF16, words, sc, bi, err);
        break;
    }
    }
    if (st) return st;
    c->layer = layer;
    c->expert = e;
    c->proj = proj;
    return DRAMA_OK;
}

drama_status mm_quant_get(mm_quant_cache *c, const dr_mm_options *o, int layer, int expert, int proj, int kind,
                          const void **bytes, size_t *nbytes, drama_error *err) {
    if (c->layer != layer || c->expert != expert || c->proj != proj) {
        drama_status st = encode(c, o, layer, expert, proj, err);
        if (st) return st;
    }
    if (kind < 0 || kind >= MM_Q_KINDS || !c->part[kind])
        return dr_fail(err, DRAMA_EINTERNAL, "expert component %d not produced", kind);
    *bytes = c->part[kind];
    *nbytes = c->len[kind];
    return DRAMA_OK;
}
