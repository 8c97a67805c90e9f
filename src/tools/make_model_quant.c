/* make_model_quant.c - routed-expert matrices in the stored format chosen by --experts.
 * The source of every matrix is its BF16-rounded random values; the encoders are num/quant.h
 * (FORMATS.md 6 and 4.4), so a generated quantised model is what `drama optimize` would make
 * of the BF16 model with the same seed. */
#include <math.h>
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

/* One encoded expert matrix with all its components. */
typedef struct mm_qslot {
    int layer, expert, proj;      /* what is held; layer -1 = nothing */
    float *src, *partner;         /* the source matrix; nvfp4: the gate/up partner for the shared scale */
    size_t src_cap;
    uint8_t *part[MM_Q_KINDS];    /* bytes per component kind */
    size_t len[MM_Q_KINDS], cap[MM_Q_KINDS];
    drama_error err;              /* of the last encode into this slot */
} mm_qslot;

struct mm_quant_cache {
    int n;
    mm_qslot *slots;
};

mm_quant_cache *mm_quant_cache_new(int nslots) {
    mm_quant_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n = nslots > 0 ? nslots : 1;
    c->slots = calloc((size_t)c->n, sizeof *c->slots);
    if (!c->slots) {
        free(c);
        return NULL;
    }
    for (int i = 0; i < c->n; i++) c->slots[i].layer = -1;
    return c;
}

void mm_quant_cache_free(mm_quant_cache *c) {
    if (!c) return;
    for (int s = 0; s < c->n; s++) {
        free(c->slots[s].src);
        free(c->slots[s].partner);
        for (int i = 0; i < MM_Q_KINDS; i++) free(c->slots[s].part[i]);
    }
    free(c->slots);
    free(c);
}

int mm_quant_cache_slots(const mm_quant_cache *c) { return c->n; }

static uint8_t *slot(mm_qslot *c, int kind, size_t n) {
    if (c->cap[kind] < n) {
        uint8_t *p = realloc(c->part[kind], n);
        if (!p) return NULL;
        c->part[kind] = p;
        c->cap[kind] = n;
    }
    c->len[kind] = n;
    return c->part[kind];
}

/* --expert-fill direct: random bytes from a counter-based stream keyed by (seed, layer, expert,
 * proj, component), made valid and bounded per format: FP8 codes keep exponent fields 9..14 (no
 * NaN, |code| < 448) under a block scale amp / 448; NVFP4 nibbles are any of the 16 E2M1 codes,
 * block scales E4M3 in [0.5, 1) and weight_scale_2 = amp / 6 (|w| < amp); BF16 keeps sign and
 * mantissa under the exponent of amp / 2;
 * q4 words any, scales amp / 8, biases -8 scale (w in [-amp, amp)). */
static void fill_bytes(uint64_t key, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = key ^ (i * 0x9E3779B97F4A7C15ULL);
        x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ULL, x ^= x >> 33;
        size_t m = n - i < 8 ? n - i : 8;
        memcpy(p + i, &x, m);
    }
}

static drama_status encode_direct(mm_qslot *c, const dr_mm_options *o, int layer, int e, int proj, int64_t rows,
                                  int64_t cols, drama_error *err) {
    size_t n = (size_t)(rows * cols);
    double amp = proj == 2 ? 0.5 * sqrt(3.0 / (double)o->dims.moe_inter) : sqrt(3.0 / (double)o->dims.hidden);
    uint64_t key = dr_mm_key_bits(o->seed, ((uint64_t)layer << 32) ^ ((uint64_t)e << 8) ^ (uint64_t)proj);
    switch (o->experts) {
    case DR_MM_BF16: {
        uint16_t *b = (uint16_t *)slot(c, MM_Q_BF16, n * 2);
        if (!b) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        fill_bytes(key, (uint8_t *)b, n * 2);
        for (size_t i = 0; i < n; i++) /* sign, exponent of amp / 2 .. amp, random mantissa */
            b[i] = (uint16_t)((b[i] & 0x807F) | (dr_f32_to_bf16((float)(amp * 0.5)) & 0x7F80));
        break;
    }
    case DR_MM_FP8: {
        size_t ns = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128));
        uint8_t *codes = slot(c, MM_Q_FP8_W, n), *sc = slot(c, MM_Q_FP8_SCALE, ns * 4);
        if (!codes || !sc) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        fill_bytes(key, codes, n);
        for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)((codes[i] & 0x87) | ((9 + (codes[i] >> 3 & 7) % 6) << 3));
        float s = (float)(amp / 448.0);
        for (size_t i = 0; i < ns; i++) memcpy(sc + 4 * i, &s, 4);
        break;
    }
    case DR_MM_NVFP4: {
        uint8_t *packed = slot(c, MM_Q_NV_W, n / 2), *sc = slot(c, MM_Q_NV_SCALE, n / 16);
        uint8_t *s2 = slot(c, MM_Q_NV_SCALE2, 4), *in = slot(c, MM_Q_NV_INPUT, 4);
        if (!packed || !sc || !s2 || !in) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        fill_bytes(key, packed, n / 2);
        fill_bytes(key ^ 0x5CA1E5ULL, sc, n / 16);
        for (size_t i = 0; i < n / 16; i++) sc[i] = (uint8_t)(0x30 | (sc[i] & 7)); /* E4M3 exponent 6: [0.5, 1) */
        float gs = (float)(amp / 6.0), one = 1.0f;
        memcpy(s2, &gs, 4);
        memcpy(in, &one, 4);
        break;
    }
    case DR_MM_Q4: {
        size_t ng = (size_t)(rows * (cols / o->q4_group));
        uint8_t *words = slot(c, MM_Q_AF_W, n / 2), *sc = slot(c, MM_Q_AF_SCALES, ng * 2),
                *bi = slot(c, MM_Q_AF_BIASES, ng * 2);
        if (!words || !sc || !bi) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
        fill_bytes(key, words, n / 2);
        uint16_t s = dr_f32_to_bf16((float)(amp / 8.0)), b = dr_f32_to_bf16((float)(-amp));
        for (size_t i = 0; i < ng; i++) memcpy(sc + 2 * i, &s, 2), memcpy(bi + 2 * i, &b, 2);
        break;
    }
    }
    c->layer = layer;
    c->expert = e;
    c->proj = proj;
    return DRAMA_OK;
}

static drama_status encode(mm_qslot *c, const dr_mm_options *o, int layer, int e, int proj, drama_error *err) {
    int64_t rows = proj == 2 ? o->dims.hidden : o->dims.moe_inter;
    int64_t cols = proj == 2 ? o->dims.moe_inter : o->dims.hidden;
    size_t n = (size_t)(rows * cols);
    c->layer = -1;
    if (o->expert_fill == DR_MM_FILL_DIRECT) return encode_direct(c, o, layer, e, proj, rows, cols, err);
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

typedef struct prep_ctx {
    mm_quant_cache *c;
    const dr_mm_options *o;
    const mm_qsrc *src;
} prep_ctx;

static void prep_one(void *ctx, int64_t i, int worker) {
    (void)worker;
    prep_ctx *p = ctx;
    mm_qslot *sl = &p->c->slots[i];
    sl->err = (drama_error){0};
    encode(sl, p->o, p->src[i].layer, p->src[i].expert, p->src[i].proj, &sl->err);
}

drama_status mm_quant_prepare(mm_quant_cache *c, const dr_mm_options *o, dr_pool *pool, const mm_qsrc *src, int n,
                              drama_error *err) {
    if (n > c->n) n = c->n;
    prep_ctx p = {c, o, src};
    dr_pool_run(pool, n, prep_one, &p); /* slot i <- source i: independent of the thread count */
    for (int i = 0; i < n; i++)
        if (c->slots[i].err.code) return dr_fail(err, c->slots[i].err.code, "%s", c->slots[i].err.message);
    return DRAMA_OK;
}

int mm_quant_has(const mm_quant_cache *c, int layer, int expert, int proj) {
    for (int i = 0; i < c->n; i++)
        if (c->slots[i].layer == layer && c->slots[i].expert == expert && c->slots[i].proj == proj) return 1;
    return 0;
}

drama_status mm_quant_get(mm_quant_cache *c, const dr_mm_options *o, int layer, int expert, int proj, int kind,
                          const void **bytes, size_t *nbytes, drama_error *err) {
    mm_qslot *sl = NULL;
    for (int i = 0; i < c->n && !sl; i++)
        if (c->slots[i].layer == layer && c->slots[i].expert == expert && c->slots[i].proj == proj) sl = &c->slots[i];
    if (!sl) { /* not prepared: encode here */
        sl = &c->slots[0];
        drama_status st = encode(sl, o, layer, expert, proj, err);
        if (st) return st;
    }
    if (kind < 0 || kind >= MM_Q_KINDS || !sl->part[kind])
        return dr_fail(err, DRAMA_EINTERNAL, "expert component %d not produced", kind);
    *bytes = sl->part[kind];
    *nbytes = sl->len[kind];
    return DRAMA_OK;
}
