/* optimize_experts.c - the expert side of `drama optimize`: which experts are kept, and each kept
 * expert dequantised exactly (FORMATS.md 4) and re-encoded with num/quant.h (FORMATS.md 6). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/file.h"
#include "num/formats.h"
#include "num/quant.h"
#include "num/weight.h"
#include "tools/optimize_internal.h"

const char *const opt_proj_names[OPT_NPROJ] = {"gate_proj", "up_proj", "down_proj"};

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void set_comp(opt_comp *c, const char *suffix, dr_dtype dt, int ndim, int64_t d0, int64_t d1) {
    c->suffix = suffix;
    c->dtype = dt;
    c->ndim = ndim;
    c->shape[0] = d0;
    c->shape[1] = d1;
    int64_t n = ndim == 0 ? 1 : ndim == 1 ? d0 : d0 * d1;
    c->nbytes = (size_t)n * dr_dtype_size(dt);
}

int opt_components(const opt_target *t, int64_t rows, int64_t cols, opt_comp out[OPT_MAX_COMP], const char **why) {
    *why = NULL;
    switch (t->fmt) {
    case DR_OPT_KEEP:
    case DR_OPT_BF16:
        set_comp(&out[0], "weight", t->fmt == DR_OPT_BF16 ? DR_DT_BF16 : t->dense, 2, rows, cols);
        return 1;
    case DR_OPT_FP8:
        set_comp(&out[0], "weight", DR_DT_F8_E4M3, 2, rows, cols);
        set_comp(&out[1], "weight_scale_inv", DR_DT_F32, 2, cdiv(rows, 128), cdiv(cols, 128));
        return 2;
    case DR_OPT_NVFP4:
        if (cols % 16) {
            *why = "NVFP4 needs an input width that is a multiple of 16";
            return 0;
        }
        set_comp(&out[0], "weight", DR_DT_U8, 2, rows, cols / 2);
        set_comp(&out[1], "weight_scale", DR_DT_F8_E4M3, 2, rows, cols / 16);
        set_comp(&out[2], "weight_scale_2", DR_DT_F32, 0, 0, 0);
        return 3;
    case DR_OPT_AFFINE:
        if (cols % t->group || (cols * t->bits) % 32) {
            *why = "affine needs an input width that is a multiple of the group size (and of 32 / bits)";
            return 0;
        }
        set_comp(&out[0], "weight", DR_DT_U32, 2, rows, cols * t->bits / 32);
        set_comp(&out[1], "scales", t->dense, 2, rows, cols / t->group);
        set_comp(&out[2], "biases", t->dense, 2, rows, cols / t->group);
        return 3;
    }
    *why = "unknown format";
    return 0;
}

/* ---- encoder ---- */

drama_status opt_encoder_init(opt_encoder *enc, const dr_backbone *bb, const opt_target *t, int check_exact,
                              int nslots, dr_pool *pool, drama_error *err) {
    memset(enc, 0, sizeof *enc);
    enc->bb = bb;
    enc->t = *t;
    enc->check_exact = check_exact;
    enc->pool = pool;
    enc->nslots = nslots < 1 ? 1 : nslots;
    enc->slots = calloc((size_t)enc->nslots, sizeof(opt_slot));
    if (!enc->slots) return dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory for %d expert slots", enc->nslots);
    int64_t H = bb->d.H, I = bb->d.I;
    for (int s = 0; s < enc->nslots; s++) {
        opt_slot *sl = &enc->slots[s];
        for (int p = 0; p < OPT_NPROJ; p++) {
            int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
            const char *why;
            sl->ncomp[p] = opt_components(t, rows, cols, sl->comp[p], &why);
            if (!sl->ncomp[p])
                return dr_fail(err, DRAMA_EUNSUPPORTED, "optimize: --experts %s: expert %s [%lld, %lld]: %s",
                               dr_opt_format_name(t->fmt), opt_proj_names[p], (long long)rows, (long long)cols, why);
            sl->w[p] = dr_alloc((size_t)(rows * cols) * sizeof(float));
            if (!sl->w[p]) return dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory for an expert matrix");
            for (int c = 0; c < sl->ncomp[p]; c++) {
                sl->bytes[p][c] = dr_alloc(sl->comp[p][c].nbytes ? sl->comp[p][c].nbytes : 1);
                if (!sl->bytes[p][c]) return dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory for an expert matrix");
            }
        }
    }
    return DRAMA_OK;
}

void opt_encoder_free(opt_encoder *enc) {
    if (!enc->slots) return;
    for (int s = 0; s < enc->nslots; s++)
        for (int p = 0; p < OPT_NPROJ; p++) {
            dr_free(enc->slots[s].w[p]);
            for (int c = 0; c < OPT_MAX_COMP; c++) dr_free(enc->slots[s].bytes[p][c]);
        }
    free(enc->slots);
    enc->slots = NULL;
}

void opt_drop_pages(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (!p || page <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Rows [r0, r0 + rows) of weight w, dequantised exactly, into out. */
static void dequant_rows(const dr_weight *w, int64_t r0, int64_t rows, float *out) {
    for (int64_t r = 0; r < rows; r++) dr_weight_dequant_row(w, r0 + r, out + r * w->cols);
}

static int is_dense(const dr_weight *w) { return w->fmt == DR_WF_F32 || w->fmt == DR_WF_F16 || w->fmt == DR_WF_BF16; }

static void store_dense(dr_dtype dt, const float *src, int64_t n, uint8_t *dst) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == DR_DT_F32) {
            memcpy(dst + i * 4, &src[i], 4);
        } else {
            uint16_t h = dt == DR_DT_BF16 ? dr_f32_to_bf16(src[i]) : dr_f32_to_f16(src[i]);
            dst[i * 2] = (uint8_t)(h & 0xFF);
            dst[i * 2 + 1] = (uint8_t)(h >> 8);
        }
    }
}

static void encode_one(void *ctx, int64_t i, int worker) {
    (void)worker;
    opt_encoder *enc = ctx;
    opt_slot *sl = &enc->slots[i];
    const dr_backbone *bb = enc->bb;
    const dr_bb_moe *m = &bb->layers[sl->layer].moe;
    const dr_bb_expert *x = &m->experts[sl->slot];
    int e = m->kept[sl->slot];
    int64_t H = bb->d.H, I = bb->d.I;
    drama_error *err = &sl->err;
    memset(err, 0, sizeof *err);
    sl->st = DRAMA_OK;
    const dr_weight *src[OPT_NPROJ];
    int64_t r0[OPT_NPROJ] = {0, 0, 0};
    if (x->fused) {
        src[0] = src[1] = &x->gate_up;
        r0[1] = I; /* gate rows 0..I-1, then up rows I..2I-1 */
    } else {
        src[0] = &x->gate;
        src[1] = &x->up;
    }
    src[2] = &x->down;
    for (int p = 0; p < OPT_NPROJ; p++) {
        int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
        dequant_rows(src[p], r0[p], rows, sl->w[p]);
        opt_drop_pages(src[p]->data + r0[p] * src[p]->row_bytes, (size_t)rows * src[p]->row_bytes);
        if (enc->check_exact && !is_dense(src[p])) {
            /* A quantised source is re-encoded only when its values are exactly what a BF16 model
             * would hold; otherwise the second quantisation would compound the first one's error. */
            for (int64_t j = 0; j < rows * cols; j++) {
                float v = sl->w[p][j];
                if (dr_bf16_to_f32(dr_f32_to_bf16(v)) != v) {
                    sl->st = dr_fail(err, DRAMA_EUNSUPPORTED,
                                     "%s (layer %d expert %d %s): the source is already quantised and its value at "
                                     "row %lld, column %lld (%.9g) is not exact in BF16; refusing to quantise twice "
                                     "(use --experts keep to copy the stored experts)",
                                     src[p]->name ? src[p]->name : "expert", sl->layer, e, opt_proj_names[p],
                                     (long long)(j / cols), (long long)(j % cols), (double)v);
                    return;
                }
            }
        }
    }
    float gs_gate_up = 1.0f;
    if (enc->t.fmt == DR_OPT_NVFP4) {
        /* gate and up share weight_scale_2: the larger of their two amax (FORMATS.md 6) */
        float a = dr_quant_amax(sl->w[0], I * H), b = dr_quant_amax(sl->w[1], I * H);
        gs_gate_up = dr_quant_nvfp4_global_scale(a > b ? a : b);
    }
    for (int p = 0; p < OPT_NPROJ; p++) {
        int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
        uint8_t **b = sl->bytes[p];
        drama_status st = DRAMA_OK;
        switch (enc->t.fmt) {
        case DR_OPT_KEEP:
        case DR_OPT_BF16:
            store_dense(sl->comp[p][0].dtype, sl->w[p], rows * cols, b[0]);
            break;
        case DR_OPT_FP8:
            st = dr_quant_fp8_block(sl->w[p], rows, cols, 128, 128, b[0], (float *)(void *)b[1], err);
            break;
        case DR_OPT_NVFP4: {
            float gs = p == 2 ? dr_quant_nvfp4_global_scale(dr_quant_amax(sl->w[2], rows * cols)) : gs_gate_up;
            st = dr_quant_nvfp4(sl->w[p], rows, cols, gs, b[0], b[1], err);
            memcpy(b[2], &gs, 4);
            break;
        }
        case DR_OPT_AFFINE:
            st = dr_quant_affine(sl->w[p], rows, cols, enc->t.bits, enc->t.group, enc->t.dense, b[0], b[1], b[2], err);
            break;
        }
        if (st) {
            dr_error_prefix(err, "layer %d expert %d %s", sl->layer, e, opt_proj_names[p]);
            sl->st = st;
            return;
        }
    }
}

drama_status opt_encoder_run(opt_encoder *enc, const int *layers, const int *slots, int n, drama_error *err) {
    if (n > enc->nslots) return dr_fail(err, DRAMA_EINTERNAL, "optimize: %d experts for %d slots", n, enc->nslots);
    for (int i = 0; i < n; i++) {
        enc->slots[i].layer = layers[i];
        enc->slots[i].slot = slots[i];
    }
    if (enc->pool && n > 1) dr_pool_run(enc->pool, n, encode_one, enc);
    else
        for (int i = 0; i < n; i++) encode_one(enc, i, 0);
    for (int i = 0; i < n; i++)
        if (enc->slots[i].st) {
            if (err && !err->code) *err = enc->slots[i].err;
            return enc->slots[i].st;
        }
    return DRAMA_OK;
}

/* ---- kept sets ---- */

/* The object {"<layer>": [ids]} inside a prune file: the file itself, its "drama_experts", or
 * "metadata"."drama_experts" (an index.json); a JSON string holding the object is accepted too. */
static json_t *prune_object(json_t *root) {
    json_t *o = root;
    json_t *meta = json_object_get(root, "metadata");
    if (json_is_object(meta) && json_object_get(meta, "drama_experts")) o = json_object_get(meta, "drama_experts");
    else if (json_object_get(root, "drama_experts")) o = json_object_get(root, "drama_experts");
    if (json_is_string(o)) return json_loads(json_string_value(o), JSON_REJECT_DUPLICATES, NULL);
    return json_incref(o);
}

drama_status opt_keep_from_file(const char *path, const dr_backbone *bb, unsigned char *keep, drama_error *err) {
    json_t *root;
    drama_status rst = dr_read_json_file(path, DR_FILE_MAX_BYTES, 0, &root, err);
    if (rst) return rst;
    json_t *o = json_is_object(root) ? prune_object(root) : NULL;
    json_decref(root);
    drama_status st = DRAMA_OK;
    int L = bb->d.n_layers, E = bb->d.E;
    if (!json_is_object(o)) {
        st = dr_fail(err, DRAMA_EFORMAT, "%s: expected an object {\"<layer>\": [kept expert ids], ...}", path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        char *end;
        long layer = strtol(key, &end, 10);
        if (!*key || *end || layer < 0 || layer >= L) {
            st = dr_fail(err, DRAMA_EINVAL, "%s: layer \"%s\": no such MoE layer (the model has layers 0..%d)", path,
                         key, L - 1);
            goto done;
        }
        if (!json_is_array(v)) {
            st = dr_fail(err, DRAMA_EFORMAT, "%s: layer %ld: expected an array of expert ids", path, layer);
            goto done;
        }
        const dr_bb_moe *m = &bb->layers[layer].moe;
        unsigned char *row = keep + (size_t)layer * E;
        unsigned char *want = calloc((size_t)E, 1);
        if (!want) {
            st = dr_fail(err, DRAMA_ENOMEM, "optimize: out of memory");
            goto done;
        }
        size_t i;
        json_t *id;
        int count = 0;
        json_array_foreach(v, i, id) {
            json_int_t e = json_is_integer(id) ? json_integer_value(id) : -1;
            if (!json_is_integer(id) || e < 0 || e >= E) {
                st = dr_fail(err, DRAMA_EINVAL, "%s: layer %ld, entry %zu: not an expert id in [0, %d)", path, layer, i, E);
            } else if (want[e]) {
                st = dr_fail(err, DRAMA_EINVAL, "%s: layer %ld: expert %lld listed twice", path, layer, (long long)e);
            } else if (m->slot[e] < 0) {
                st = dr_fail(err, DRAMA_EINVAL, "%s: layer %ld: expert %lld is not stored in the source checkpoint", path,
                             layer, (long long)e);
            }
            if (st) break;
            want[e] = 1;
            count++;
        }
        if (!st && count < bb->d.topk)
            st = dr_fail(err, DRAMA_EINVAL, "%s: layer %ld keeps %d experts, fewer than num_experts_per_tok %d", path,
                         layer, count, bb->d.topk);
        if (!st) memcpy(row, want, (size_t)E);
        free(want);
        if (st) goto done;
    }
done:
    json_decref(o);
    return st;
}
