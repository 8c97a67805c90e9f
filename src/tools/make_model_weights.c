/* make_model_weights.c - the weight tensors of a generated model: the list (names and shapes of
 * MODEL.md 4.2-4.4 for the given dims), their values, shard assignment, streaming writes through
 * dr_st_writer, and model.safetensors.index.json.
 *
 * Values: element i of a tensor is a function of (seed, name, i) only. Routed experts are keyed
 * by their per-expert 2-D name in every layout, so the fused layout holds the same numbers as the
 * per-expert one, and quantised experts are encodings of the same BF16 matrices (a quantised
 * model equals `drama optimize` of the BF16 one, up to the encoder). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "num/formats.h"
#include "tools/make_model_internal.h"
#include "tools/make_model_quant.h"

#define PFX "model.language_model."

typedef enum { INIT_LINEAR, INIT_ZNORM, INIT_ONENORM, INIT_ALOG, INIT_DTBIAS } init_kind;
/* What a tensor's bytes are: a dense tensor, a fused expert tensor (slices from per-expert
 * sources), or one component of a quantised per-expert matrix. */
typedef enum { PART_DENSE, PART_FUSED_GU, PART_FUSED_DOWN, PART_QUANT } part_kind;

typedef struct mm_t {
    char *name;
    dr_dtype dtype;
    int ndim;
    int64_t shape[3];
    init_kind init;
    part_kind part;
    int component;          /* PART_QUANT: MM_Q_* of make_model_quant.h */
    double amp;             /* uniform half-width for INIT_LINEAR */
    int layer, expert, proj;/* experts: proj 0 gate, 1 up, 2 down */
    int shard;
    uint64_t bytes;
} mm_t;

typedef struct mm_list {
    mm_t *t;
    int n, cap;
    int failed;
} mm_list;

static mm_t *add(mm_list *l, dr_dtype dt, init_kind init, double amp, int ndim, int64_t d0, int64_t d1,
                 int64_t d2, const char *fmt, ...) DR_PRINTF(9, 10);

static mm_t *add(mm_list *l, dr_dtype dt, init_kind init, double amp, int ndim, int64_t d0, int64_t d1,
                 int64_t d2, const char *fmt, ...) {
    if (l->failed) return NULL;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 1024;
        mm_t *nt = realloc(l->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            l->failed = 1;
            return NULL;
        }
        l->t = nt;
        l->cap = cap;
    }
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    mm_t *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) {
        l->failed = 1;
        return NULL;
    }
    t->dtype = dt;
    t->init = init;
    t->amp = amp;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->layer = t->expert = t->proj = -1;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (uint64_t)t->shape[i];
    t->bytes = numel * dr_dtype_size(dt);
    l->n++;
    return t;
}

/* Half-width of a uniform distribution with standard deviation gain/sqrt(fan_in). */
static double lin_amp(double gain, int64_t fan_in) { return gain * sqrt(3.0 / (double)fan_in); }

static const char *const k_proj[3] = {"gate_proj", "up_proj", "down_proj"};

/* The source of expert (layer, e, proj): its per-expert BF16 name, shape and scale. */
static void expert_source(const dr_mm_dims *d, int layer, int e, int proj, char *name, size_t cap,
                          int64_t *rows, int64_t *cols, double *amp) {
    snprintf(name, cap, PFX "layers.%d.mlp.experts.%d.%s.weight", layer, e, k_proj[proj]);
    *rows = proj == 2 ? d->hidden : d->moe_inter;
    *cols = proj == 2 ? d->moe_inter : d->hidden;
    *amp = proj == 2 ? lin_amp(0.5, d->moe_inter) : lin_amp(1.0, d->hidden);
}

/* Kept experts of a layer: all, or the `keep` with the smallest hash (sorted ascending). */
static int kept_experts(const dr_mm_options *o, int layer, int *ids) {
    int E = o->dims.experts;
    if (!o->prune_keep) {
        for (int e = 0; e < E; e++) ids[e] = e;
        return E;
    }
    char key[64];
    snprintf(key, sizeof key, "prune.layer.%d", layer);
    uint64_t k = dr_mm_name_key(key);
    int n = 0;
    for (int e = 0; e < E; e++) {
        /* rank of e = number of experts with a smaller (hash, id) */
        double he = dr_mm_uniform(o->seed, k, (uint64_t)e);
        int rank = 0;
        for (int f = 0; f < E; f++) {
            double hf = dr_mm_uniform(o->seed, k, (uint64_t)f);
            if (hf < he || (hf == he && f < e)) rank++;
        }
        if (rank < o->prune_keep) ids[n++] = e;
    }
    return n;
}

static void build_list(const dr_mm_options *o, int64_t vocab, mm_list *l, int **kept, int *n_kept) {
    const dr_mm_dims *d = &o->dims;
    int64_t H = d->hidden;
    int64_t conv_ch = 2LL * d->lin_k_heads * d->lin_k_dim + (int64_t)d->lin_v_heads * d->lin_v_dim;
    int64_t vdim = (int64_t)d->lin_v_heads * d->lin_v_dim;
    add(l, DR_DT_BF16, INIT_LINEAR, 0.5 * sqrt(3.0), 2, vocab, H, 0, PFX "embed_tokens.weight");
    for (int L = 0; L < d->layers; L++) {
        add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, H, 0, 0, PFX "layers.%d.input_layernorm.weight", L);
        add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, H, 0, 0, PFX "layers.%d.post_attention_layernorm.weight", L);
        if (mm_is_full(d, L)) {
            int64_t q = (int64_t)d->heads * d->head_dim, kv = (int64_t)d->kv_heads * d->head_dim;
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, 2 * q, H, 0, PFX "layers.%d.self_attn.q_proj.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, kv, H, 0, PFX "layers.%d.self_attn.k_proj.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, kv, H, 0, PFX "layers.%d.self_attn.v_proj.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(0.5, q), 2, H, q, 0, PFX "layers.%d.self_attn.o_proj.weight", L);
            add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, d->head_dim, 0, 0, PFX "layers.%d.self_attn.q_norm.weight", L);
            add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, d->head_dim, 0, 0, PFX "layers.%d.self_attn.k_norm.weight", L);
        } else {
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, conv_ch, H, 0, PFX "layers.%d.linear_attn.in_proj_qkv.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, vdim, H, 0, PFX "layers.%d.linear_attn.in_proj_z.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, d->lin_v_heads, H, 0, PFX "layers.%d.linear_attn.in_proj_b.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, d->lin_v_heads, H, 0, PFX "layers.%d.linear_attn.in_proj_a.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, d->conv_kernel), 3, conv_ch, 1, d->conv_kernel,
                PFX "layers.%d.linear_attn.conv1d.weight", L);
            add(l, DR_DT_F32, INIT_ALOG, 0, 1, d->lin_v_heads, 0, 0, PFX "layers.%d.linear_attn.A_log", L);
            add(l, DR_DT_F32, INIT_DTBIAS, 0, 1, d->lin_v_heads, 0, 0, PFX "layers.%d.linear_attn.dt_bias", L);
            add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, d->lin_v_dim, 0, 0, PFX "layers.%d.linear_attn.norm.weight", L);
            add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(0.5, vdim), 2, H, vdim, 0, PFX "layers.%d.linear_attn.out_proj.weight", L);
        }
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, d->experts, H, 0, PFX "layers.%d.mlp.gate.weight", L);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, d->shared_inter, H, 0, PFX "layers.%d.mlp.shared_expert.gate_proj.weight", L);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, d->shared_inter, H, 0, PFX "layers.%d.mlp.shared_expert.up_proj.weight", L);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(0.5, d->shared_inter), 2, H, d->shared_inter, 0,
            PFX "layers.%d.mlp.shared_expert.down_proj.weight", L);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, H), 2, 1, H, 0, PFX "layers.%d.mlp.shared_expert_gate.weight", L);
    }
    add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, H, 0, 0, PFX "norm.weight");
    add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(2, H), 2, vocab, H, 0, "lm_head.weight");
    int64_t V = d->code_vocab, D = d->a_dim;
    add(l, DR_DT_BF16, INIT_LINEAR, 0.5 * sqrt(3.0), 2, d->codebooks * V, H, 0, "audio_decoder.codebook_embeddings.weight");
    /* Tower (MODEL.md 4.4, H1): De = D (code-table width); Dh = H for shared layer 0, else D. */
    int n_tower = d->shared_layers + d->codebooks - 1;
    for (int t = 0; t < n_tower; t++) {
        char pre[64];
        if (t < d->shared_layers) snprintf(pre, sizeof pre, "audio_decoder_mtp_shared.layers.%d.", t);
        else snprintf(pre, sizeof pre, "audio_decoder_mtp.layers.%d.", t - d->shared_layers);
        int64_t Dh = t == 0 ? H : D, qkv = (int64_t)(d->a_heads + 2 * d->a_kv_heads) * d->a_head_dim;
        int64_t att = (int64_t)d->a_heads * d->a_head_dim, F = d->a_inter;
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(0.5, att), 2, D, att, 0, "%sattention.wo.weight", pre);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, D), 2, qkv, D, 0, "%sattention.wqkv.weight", pre);
        add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, D, 0, 0, "%sattention_norm.weight", pre);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, D + Dh), 2, D, D + Dh, 0, "%seh_proj.weight", pre);
        add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, D, 0, 0, "%senorm.weight", pre);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, D), 2, F, D, 0, "%sfeed_forward.w1.weight", pre);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(0.5, F), 2, D, F, 0, "%sfeed_forward.w2.weight", pre);
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(1, D), 2, F, D, 0, "%sfeed_forward.w3.weight", pre);
        add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, D, 0, 0, "%sffn_norm.weight", pre);
        add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, Dh, 0, 0, "%shnorm.weight", pre);
        add(l, DR_DT_BF16, INIT_ONENORM, 0, 1, D, 0, 0, "%sout_norm.weight", pre);
    }
    add(l, DR_DT_BF16, INIT_LINEAR, 0.5 * sqrt(3.0), 2, d->codebooks * V, D, 0,
        "audio_decoder_mtp.codebook_embeddings.weight");
    for (int j = 0; j + 1 < d->codebooks; j++)
        add(l, DR_DT_BF16, INIT_LINEAR, lin_amp(2, D), 2, d->head_rows, D, 0, "audio_decoder_mtp.heads.%d.weight", j);

    /* Routed experts last, layer by layer (they go to shards 2..N). */
    for (int L = 0; L < d->layers; L++) {
        n_kept[L] = kept_experts(o, L, kept[L]);
        if (o->layout == DR_MM_FUSED) {
            mm_t *t = add(l, DR_DT_BF16, INIT_LINEAR, 0, 3, n_kept[L], 2 * d->moe_inter, H,
                          PFX "layers.%d.mlp.experts.gate_up_proj", L);
            if (t) t->part = PART_FUSED_GU, t->layer = L;
            t = add(l, DR_DT_BF16, INIT_LINEAR, 0, 3, n_kept[L], H, d->moe_inter, PFX "layers.%d.mlp.experts.down_proj", L);
            if (t) t->part = PART_FUSED_DOWN, t->layer = L;
            continue;
        }
        for (int k = 0; k < n_kept[L]; k++) {
            int e = kept[L][k];
            for (int p = 0; p < 3; p++) {
                char src[256];
                int64_t rows, cols;
                double amp;
                expert_source(d, L, e, p, src, sizeof src, &rows, &cols, &amp);
                mm_q_component comp[MM_Q_MAX];
                int nc = mm_quant_components(o, rows, cols, comp);
                for (int c = 0; c < nc; c++) {
                    mm_t *t = add(l, comp[c].dtype, INIT_LINEAR, amp, comp[c].ndim, comp[c].shape[0],
                                  comp[c].shape[1], 0, PFX "layers.%d.mlp.experts.%d.%s.%s", L, e, k_proj[p],
                                  comp[c].suffix);
                    if (t) t->part = PART_QUANT, t->component = comp[c].kind, t->layer = L, t->expert = e, t->proj = p;
                }
            }
        }
    }
}

/* Broken-checkpoint hooks (dr_mm_options.test_*): only dense tensors can be mis-shaped. */
static mm_t *find_tensor(mm_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static drama_status apply_test_hooks(const dr_mm_options *o, mm_list *l, drama_error *err) {
    if (o->test_omit) {
        mm_t *t = find_tensor(l, o->test_omit);
        if (!t) return dr_fail(err, DRAMA_EINVAL, "--test-omit: no tensor named %s", o->test_omit);
        free(t->name);
        memmove(t, t + 1, (size_t)(l->t + l->n - (t + 1)) * sizeof *t);
        l->n--;
    }
    if (o->test_misshape) {
        mm_t *t = find_tensor(l, o->test_misshape);
        if (!t || t->part != PART_DENSE || t->ndim < 1)
            return dr_fail(err, DRAMA_EINVAL, "--test-misshape: no dense tensor named %s", o->test_misshape);
        t->bytes = t->bytes / (uint64_t)t->shape[0] * (uint64_t)(t->shape[0] + 1);
        t->shape[0] += 1;
    }
    if (o->test_extra) {
        if (find_tensor(l, o->test_extra)) return dr_fail(err, DRAMA_EINVAL, "--test-extra: %s exists", o->test_extra);
        add(l, DR_DT_BF16, INIT_ZNORM, 0, 1, 4, 0, 0, "%s", o->test_extra);
        if (l->failed) return dr_fail(err, DRAMA_ENOMEM, "make-model: out of memory");
    }
    return DRAMA_OK;
}

/* ---- values ---- */

static float init_value(init_kind k, double amp, double u) {
    switch (k) {
    case INIT_LINEAR: return (float)(amp * u);
    case INIT_ZNORM: return (float)(0.05 * u);     /* zero-centred norms: y = x/rms * (1 + w) */
    case INIT_ONENORM: return (float)(1.0 + 0.05 * u);
    case INIT_ALOG: return (float)log(1.0 + 7.5 * (u + 1.0)); /* log U(1, 16) */
    case INIT_DTBIAS: {                             /* softplus^-1(dt), dt log-uniform [1e-3, 1e-1] */
        double dt = exp(log(1e-3) + 0.5 * (u + 1.0) * log(100.0));
        return (float)log(expm1(dt));
    }
    }
    return 0;
}

enum { CHUNK = 1 << 20, BLOCK = 1 << 14 };

/* A piece of a dense tensor, filled in parallel blocks of BLOCK values (each value depends only
 * on its index, so the bytes do not depend on the thread count). */
typedef struct fill_ctx {
    const dr_mm_options *o;
    const mm_t *t;
    uint64_t key;
    int64_t off, n;
    float *buf;
    uint16_t *bf16;           /* NULL: keep F32 */
    /* fused expert rows: */
    int layer, expert, proj;
    int64_t r0, cols;
} fill_ctx;

static void fill_dense(void *ctx, int64_t b, int worker) {
    (void)worker;
    fill_ctx *f = ctx;
    int64_t lo = b * BLOCK, hi = lo + BLOCK < f->n ? lo + BLOCK : f->n;
    for (int64_t j = lo; j < hi; j++) {
        f->buf[j] = init_value(f->t->init, f->t->amp, dr_mm_uniform(f->o->seed, f->key, (uint64_t)(f->off + j)));
        if (f->bf16) f->bf16[j] = dr_f32_to_bf16(f->buf[j]);
    }
}

static void fill_rows(void *ctx, int64_t r, int worker) {
    (void)worker;
    fill_ctx *f = ctx;
    float *row = f->buf + r * f->cols;
    mm_expert_rows(f->o, f->layer, f->expert, f->proj, f->r0 + r, 1, row);
    for (int64_t c = 0; c < f->cols; c++) f->bf16[r * f->cols + c] = dr_f32_to_bf16(row[c]);
}

/* Rows [r0, r0+nr) of a per-expert source matrix, rounded through BF16 like a stored weight. */
void mm_expert_rows(const dr_mm_options *o, int layer, int e, int proj, int64_t r0, int64_t nr, float *out) {
    char src[256];
    int64_t rows, cols;
    double amp;
    expert_source(&o->dims, layer, e, proj, src, sizeof src, &rows, &cols, &amp);
    uint64_t key = dr_mm_name_key(src);
    for (int64_t i = 0; i < nr * cols; i++) {
        float v = init_value(INIT_LINEAR, amp, dr_mm_uniform(o->seed, key, (uint64_t)(r0 * cols + i)));
        out[i] = dr_bf16_to_f32(dr_f32_to_bf16(v));
    }
}

static drama_status write_tensor(dr_st_writer *w, const dr_mm_options *o, const mm_list *l, int idx, const int *kept,
                                 float *buf, void *scratch, mm_quant_cache *qc, dr_pool *pool, drama_error *err) {
    const mm_t *t = &l->t[idx];
    drama_status st = DRAMA_OK;
    if (t->part == PART_DENSE) {
        int64_t numel = 1;
        for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
        fill_ctx f = {.o = o, .t = t, .key = dr_mm_name_key(t->name), .buf = buf,
                      .bf16 = t->dtype == DR_DT_BF16 ? scratch : NULL};
        for (int64_t off = 0; off < numel && !st; off += CHUNK) {
            f.off = off;
            f.n = numel - off < CHUNK ? numel - off : CHUNK;
            dr_pool_run(pool, (f.n + BLOCK - 1) / BLOCK, fill_dense, &f);
            st = f.bf16 ? dr_st_writer_write(w, f.bf16, (size_t)f.n * 2, err)
                        : dr_st_writer_write(w, buf, (size_t)f.n * 4, err); /* little-endian hosts */
        }
        return st;
    }
    if (t->part == PART_FUSED_GU || t->part == PART_FUSED_DOWN) {
        /* slice k = the k-th kept expert; gate_up = gate rows then up rows */
        int64_t cols = t->shape[2];
        int64_t rows_per = CHUNK / cols > 0 ? CHUNK / cols : 1;
        fill_ctx f = {.o = o, .t = t, .buf = buf, .bf16 = scratch, .layer = t->layer, .cols = cols};
        for (int64_t k = 0; k < t->shape[0] && !st; k++) {
            int parts = t->part == PART_FUSED_GU ? 2 : 1;
            for (int p = 0; p < parts && !st; p++) {
                int64_t rows = t->part == PART_FUSED_GU ? t->shape[1] / 2 : t->shape[1];
                f.expert = kept[k];
                f.proj = t->part == PART_FUSED_GU ? p : 2;
                for (int64_t r = 0; r < rows && !st; r += rows_per) {
                    int64_t nr = rows - r < rows_per ? rows - r : rows_per;
                    f.r0 = r;
                    dr_pool_run(pool, nr, fill_rows, &f);
                    st = dr_st_writer_write(w, scratch, (size_t)(nr * cols) * 2, err);
                }
            }
        }
        return st;
    }
    if (!mm_quant_has(qc, t->layer, t->expert, t->proj)) {
        /* encode this matrix and the next ones of the same shard in parallel */
        mm_qsrc src[64];
        int n = 0, cap = mm_quant_cache_slots(qc) < 64 ? mm_quant_cache_slots(qc) : 64;
        for (int i = idx; i < l->n && n < cap; i++) {
            const mm_t *u = &l->t[i];
            if (u->part != PART_QUANT || u->shard != t->shard) continue;
            int seen = 0;
            for (int k = 0; k < n && !seen; k++)
                seen = src[k].layer == u->layer && src[k].expert == u->expert && src[k].proj == u->proj;
            if (!seen) src[n++] = (mm_qsrc){u->layer, u->expert, u->proj};
        }
        if ((st = mm_quant_prepare(qc, o, pool, src, n, err))) return st;
    }
    const void *bytes;
    size_t nbytes;
    if ((st = mm_quant_get(qc, o, t->layer, t->expert, t->proj, t->component, &bytes, &nbytes, err))) return st;
    if (nbytes != t->bytes) return dr_fail(err, DRAMA_EINTERNAL, "%s: encoder gave %zu bytes, declared %llu", t->name,
                                           nbytes, (unsigned long long)t->bytes);
    return dr_st_writer_write(w, bytes, nbytes, err);
}

/* ---- shards and index ---- */

static void assign_shards(mm_list *l, int shards) {
    int first_expert = l->n;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].layer >= 0) {
            first_expert = i;
            break;
        }
    if (shards == 1 || first_expert == l->n) {
        for (int i = 0; i < l->n; i++) l->t[i].shard = 0;
        return;
    }
    /* shard 0: everything but routed experts (as the golden layout); experts split by bytes */
    uint64_t total = 0, cum = 0;
    for (int i = first_expert; i < l->n; i++) total += l->t[i].bytes;
    int ex_shards = shards - 1;
    for (int i = 0; i < l->n; i++) {
        if (i < first_expert) {
            l->t[i].shard = 0;
            continue;
        }
        int s = total ? (int)((cum * (uint64_t)ex_shards) / total) : 0;
        l->t[i].shard = 1 + (s < ex_shards ? s : ex_shards - 1);
        /* an expert (all its matrices and companions; a fused layer's pair) stays in one shard */
        if (i > first_expert && l->t[i].layer == l->t[i - 1].layer && l->t[i].expert == l->t[i - 1].expert)
            l->t[i].shard = l->t[i - 1].shard;
        cum += l->t[i].bytes;
    }
}

static void shard_name(char *buf, size_t cap, int i, int n) {
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i + 1, n);
}

/* Remove shards of an earlier run in the same directory (only our own file names). */
void mm_remove_stale(const char *dir) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(dd))) {
        int a, b;
        char tail[32];
        if ((sscanf(e->d_name, "model-%5d-of-%5d.%31s", &a, &b, tail) == 3 && !strcmp(tail, "safetensors")) ||
            !strcmp(e->d_name, "model.safetensors")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(dd);
}

static drama_status write_index(const char *dir, const mm_list *l, int shards, const dr_mm_options *o,
                                int **kept, const int *n_kept, drama_error *err) {
    json_t *map = json_object(), *meta = json_object();
    uint64_t total = 0;
    char sname[64];
    for (int i = 0; i < l->n; i++) {
        shard_name(sname, sizeof sname, l->t[i].shard, shards);
        json_object_set_new(map, l->t[i].name, json_string(sname));
        total += l->t[i].bytes;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    if (o->prune_keep) {
        json_t *de = json_object();
        for (int L = 0; L < o->dims.layers; L++) {
            json_t *a = json_array();
            for (int k = 0; k < n_kept[L]; k++) json_array_append_new(a, json_integer(kept[L][k]));
            char key[16];
            snprintf(key, sizeof key, "%d", L);
            json_object_set_new(de, key, a);
        }
        json_object_set_new(meta, "drama_experts", de);
    }
    json_t *root = json_pack("{s:o, s:o}", "metadata", meta, "weight_map", map);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = root ? json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS) : -1;
    json_decref(root);
    if (rc != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot write", path);
    return DRAMA_OK;
}

drama_status mm_write_weights(const char *dir, const dr_mm_options *o, int64_t vocab, drama_error *err) {
    drama_status st = DRAMA_OK;
    mm_list l = {0};
    int L = o->dims.layers;
    int **kept = calloc((size_t)L, sizeof *kept);
    int *n_kept = calloc((size_t)L, sizeof *n_kept);
    float *buf = malloc(CHUNK * sizeof *buf);
    void *scratch = malloc(CHUNK * sizeof(float));
    dr_pool *pool = dr_pool_create(o->threads);
    int nth = pool ? dr_pool_threads(pool) : 1;
    mm_quant_cache *qc = mm_quant_cache_new(nth < 32 ? nth : 32);
    dr_st_writer *w = NULL;
    int ok = kept && n_kept && buf && scratch && qc && pool;
    for (int i = 0; ok && i < L; i++) ok = (kept[i] = malloc((size_t)o->dims.experts * sizeof(int))) != NULL;
    if (!ok) {
        st = dr_fail(err, DRAMA_ENOMEM, "make-model: out of memory");
        goto done;
    }
    build_list(o, vocab, &l, kept, n_kept);
    if (l.failed) {
        st = dr_fail(err, DRAMA_ENOMEM, "make-model: out of memory for the tensor list");
        goto done;
    }
    if ((st = apply_test_hooks(o, &l, err))) goto done;
    int shards = o->shards;
    int n_expert_tensors = 0;
    for (int i = 0; i < l.n; i++) n_expert_tensors += l.t[i].layer >= 0;
    if (shards > 1 && shards - 1 > n_expert_tensors) {
        st = dr_fail(err, DRAMA_EINVAL, "--shards %d: only %d expert tensors to spread over shards 2..%d", shards,
                     n_expert_tensors, shards);
        goto done;
    }
    assign_shards(&l, shards);
    for (int sh = 0; sh < shards; sh++) {
        int used = 0;
        for (int i = 0; i < l.n && !used; i++) used = l.t[i].shard == sh;
        if (!used) {
            st = dr_fail(err, DRAMA_EINVAL, "--shards %d: too many shards for the experts to fill (shard %d would be empty)",
                         shards, sh + 1);
            goto done;
        }
    }
    for (int s = 0; s < shards && !st; s++) {
        char path[4096], sname[64];
        shard_name(sname, sizeof sname, s, shards);
        snprintf(path, sizeof path, "%s/%s", dir, sname);
        if ((st = dr_st_writer_create(path, &w, err))) break;
        st = dr_st_writer_metadata(w, "format", "pt", err);
        for (int i = 0; i < l.n && !st; i++)
            if (l.t[i].shard == s) st = dr_st_writer_declare(w, l.t[i].name, l.t[i].dtype, l.t[i].ndim, l.t[i].shape, err);
        for (int i = 0; i < l.n && !st; i++)
            if (l.t[i].shard == s) {
                const int *kp = l.t[i].layer >= 0 ? kept[l.t[i].layer] : NULL;
                st = write_tensor(w, o, &l, i, kp, buf, scratch, qc, pool, err);
                if (st) dr_error_prefix(err, "%s: ", l.t[i].name);
            }
        if (!st) st = dr_st_writer_finish(w, err);
        else dr_st_writer_abort(w);
        w = NULL;
        if (st) dr_error_prefix(err, "%s: ", path);
    }
    if (!st) st = write_index(dir, &l, shards, o, kept, n_kept, err);
done:
    for (int i = 0; i < l.n; i++) free(l.t[i].name);
    free(l.t);
    for (int i = 0; kept && i < L; i++) free(kept[i]);
    free(kept);
    free(n_kept);
    free(buf);
    free(scratch);
    mm_quant_cache_free(qc);
    dr_pool_free(pool);
    return st;
}
