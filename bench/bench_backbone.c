/* bench_backbone - one backbone decode step at the tiny and at the full Drama 3 shape.
 *
 * Usage: bench_backbone [--shape tiny|full|both] [--format fp8|q4|bf16|all] [--threads N]
 *                       [--steps N] [--context N]
 *
 * The backbone is built in memory from random weights: every dense tensor BF16 (as released),
 * routed experts encoded with num/quant.h (block FP8 128x128, or MLX affine 4-bit group 64).
 * Full shape: hidden 2048, 40 layers (3 DeltaNet : 1 attention), 256 experts top-8 of width 512,
 * shared expert 512, attention 16/2 heads of 256, DeltaNet 16x128 keys / 32x128 values.
 *
 * Memory: 256 distinct experts x 40 layers would be 32 GB in FP8. Each layer therefore holds 8
 * distinct expert buffers (= top-k) and its 256 expert slots point at buffer e % 8; the router is
 * all zeros, so every step selects experts 0..7 (ties to the lower id), i.e. 8 different buffers
 * per layer and a per-step working set of 1+ GB: far beyond the last-level cache, so every step
 * streams its weights from DRAM as a real checkpoint would. GB/s counts stored weight bytes
 * (codes + scales) read per step: mixers, router, shared expert, 8 experts, head slice.
 * The bandwidth line is a threaded read-only sum over 512 MiB. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/pool.h"
#include "model/backbone.h"
#include "model/state.h"
#include "num/quant.h"
#include "num/weight.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float frand(void) { return (float)(rnd() & 0xFFFFFF) / 8388608.0f - 1.0f; }

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

typedef struct shape {
    const char *name;
    int64_t H, vocab, I, Is;
    int layers, nh, nkv, hd, nk, dk, nv, dv, K, E, topk, codebooks;
    int distinct_experts; /* expert buffers per layer */
} shape;

static const shape TINY = {"tiny", 64, 6124, 64, 64, 8, 4, 2, 64, 4, 32, 8, 32, 4, 16, 4, 10, 16};
static const shape FULL = {"full", 2048, 8200, 512, 512, 40, 16, 2, 256, 16, 128, 32, 128, 4, 256, 8, 10, 8};

/* Every allocation of the synthetic model, freed at the end. */
typedef struct arena {
    void **p;
    int n, cap;
    size_t bytes;
} arena;

static void *arena_alloc(arena *a, size_t bytes) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->p = realloc(a->p, (size_t)a->cap * sizeof(void *));
        if (!a->p) abort();
    }
    void *q = dr_alloc(bytes ? bytes : 1);
    if (!q) {
        fprintf(stderr, "bench_backbone: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    a->p[a->n++] = q;
    a->bytes += bytes;
    return q;
}

static void arena_free(arena *a) {
    for (int i = 0; i < a->n; i++) dr_free(a->p[i]);
    free(a->p);
}

static void bind_or_die(const dr_tensor *w, const dr_tensor *s, const dr_tensor *s2, const dr_tensor *b, dr_weight *out,
                        int64_t cols) {
    drama_error e = {0};
    if (dr_weight_bind_ex(w, s, s2, b, -1, 128, 128, cols, out, &e)) {
        fprintf(stderr, "bind %s: %s\n", w->name, e.message);
        exit(1);
    }
}

/* Dense BF16 [rows, cols], values uniform in +-1/sqrt(cols) (outputs stay O(1)). */
static dr_weight dense(arena *a, const char *name, int64_t rows, int64_t cols) {
    uint16_t *d = arena_alloc(a, (size_t)(rows * cols) * 2);
    float sc = 1.0f / sqrtf((float)cols);
    for (int64_t i = 0; i < rows * cols; i++) d[i] = to_bf16(frand() * sc);
    dr_tensor t = {name, DR_DT_BF16, 2, {rows, cols}, (const uint8_t *)d, (size_t)(rows * cols) * 2};
    dr_weight w;
    bind_or_die(&t, NULL, NULL, NULL, &w, 0);
    return w;
}

static dr_weight zeros(arena *a, const char *name, int64_t rows, int64_t cols) {
    uint16_t *d = arena_alloc(a, (size_t)(rows * cols) * 2);
    memset(d, 0, (size_t)(rows * cols) * 2);
    dr_tensor t = {name, DR_DT_BF16, 2, {rows, cols}, (const uint8_t *)d, (size_t)(rows * cols) * 2};
    dr_weight w;
    bind_or_die(&t, NULL, NULL, NULL, &w, 0);
    return w;
}

static float *vec(arena *a, int64_t n, float base, float spread) {
    float *v = arena_alloc(a, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = base + spread * frand();
    return v;
}

/* An expert matrix [rows, cols] in `fmt`, encoded once from random floats (template) and copied
 * into fresh memory for each distinct buffer. */
typedef struct tmpl {
    int fmt; /* 0 bf16, 1 fp8, 2 q4 */
    int64_t rows, cols;
    uint8_t *codes, *scales, *biases;
    size_t codes_n, scales_n, biases_n;
} tmpl;

static void make_template(tmpl *t, int fmt, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    t->fmt = fmt;
    t->rows = rows;
    t->cols = cols;
    float *src = malloc((size_t)(rows * cols) * sizeof(float));
    float sc = 1.0f / sqrtf((float)cols);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = frand() * sc;
    drama_error e = {0};
    if (fmt == 0) {
        t->codes_n = (size_t)(rows * cols) * 2;
        t->codes = malloc(t->codes_n);
        for (int64_t i = 0; i < rows * cols; i++) ((uint16_t *)(void *)t->codes)[i] = to_bf16(src[i]);
    } else if (fmt == 1) {
        t->codes_n = (size_t)(rows * cols);
        t->scales_n = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128)) * sizeof(float);
        t->codes = malloc(t->codes_n);
        t->scales = malloc(t->scales_n);
        if (dr_quant_fp8_block(src, rows, cols, 128, 128, t->codes, (float *)(void *)t->scales, &e)) goto fail;
    } else {
        t->codes_n = (size_t)(rows * cols) / 2;
        t->scales_n = t->biases_n = (size_t)(rows * (cols / 64)) * 2;
        t->codes = malloc(t->codes_n);
        t->scales = malloc(t->scales_n);
        t->biases = malloc(t->biases_n);
        if (dr_quant_affine(src, rows, cols, 4, 64, DR_DT_BF16, t->codes, t->scales, t->biases, &e)) goto fail;
    }
    free(src);
    return;
fail:
    fprintf(stderr, "encode: %s\n", e.message);
    exit(1);
}

static void free_template(tmpl *t) {
    free(t->codes);
    free(t->scales);
    free(t->biases);
}

static dr_weight from_template(arena *a, const tmpl *t, const char *name) {
    uint8_t *c = arena_alloc(a, t->codes_n);
    memcpy(c, t->codes, t->codes_n);
    dr_tensor w = {name, DR_DT_BF16, 2, {t->rows, t->cols}, c, t->codes_n}, s = {0}, b = {0};
    dr_weight out;
    if (t->fmt == 0) {
        bind_or_die(&w, NULL, NULL, NULL, &out, 0);
    } else if (t->fmt == 1) {
        uint8_t *sc = arena_alloc(a, t->scales_n);
        memcpy(sc, t->scales, t->scales_n);
        w.dtype = DR_DT_F8_E4M3;
        s = (dr_tensor){"scale_inv", DR_DT_F32, 2, {(t->rows + 127) / 128, (t->cols + 127) / 128}, sc, t->scales_n};
        bind_or_die(&w, &s, NULL, NULL, &out, 0);
    } else {
        uint8_t *sc = arena_alloc(a, t->scales_n), *bi = arena_alloc(a, t->biases_n);
        memcpy(sc, t->scales, t->scales_n);
        memcpy(bi, t->biases, t->biases_n);
        w.dtype = DR_DT_U32;
        w.shape[1] = t->cols / 8;
        s = (dr_tensor){"scales", DR_DT_BF16, 2, {t->rows, t->cols / 64}, sc, t->scales_n};
        b = (dr_tensor){"biases", DR_DT_BF16, 2, {t->rows, t->cols / 64}, bi, t->biases_n};
        bind_or_die(&w, &s, NULL, &b, &out, t->cols);
    }
    return out;
}

/* Build the whole backbone; returns the stored weight bytes one decode step reads. */
static size_t build(dr_backbone *bb, const shape *sh, int fmt, arena *a) {
    memset(bb, 0, sizeof *bb);
    dr_bb_dims *d = &bb->d;
    d->H = sh->H;
    d->n_layers = sh->layers;
    d->kinds = malloc((size_t)sh->layers * sizeof(dr_layer_kind));
    for (int L = 0; L < sh->layers; L++) d->kinds[L] = (L + 1) % 4 == 0 ? DR_LAYER_FULL : DR_LAYER_LINEAR;
    d->nh = sh->nh; d->nkv = sh->nkv; d->hd = sh->hd; d->rope_dims = sh->hd / 4; d->rope_theta = 1e7;
    d->eps = 1e-6f; d->norm_offset = 1.0f; d->attn_gate = 1;
    d->nk = sh->nk; d->dk = sh->dk; d->nv = sh->nv; d->dv = sh->dv; d->K = sh->K;
    d->E = sh->E; d->topk = sh->topk; d->I = sh->I; d->Is = sh->Is; d->norm_topk = 1;
    d->n_codebooks = sh->codebooks; d->in_codebooks = sh->codebooks; d->code_stride = 4096;
    d->code_scale_rsqrt = 1; d->add_token_embedding = 1;
    int64_t H = sh->H, C = 2 * (int64_t)sh->nk * sh->dk + (int64_t)sh->nv * sh->dv, vd = (int64_t)sh->nv * sh->dv;
    size_t step_bytes = 0;
    bb->layers = calloc((size_t)sh->layers, sizeof(dr_bb_layer));
    int half = d->rope_dims / 2;
    bb->rope_inv_freq = malloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++) bb->rope_inv_freq[i] = (float)(1.0 / pow(1e7, 2.0 * i / d->rope_dims));
    tmpl gt, dt;
    make_template(&gt, fmt, sh->I, H);
    make_template(&dt, fmt, H, sh->I);
    for (int L = 0; L < sh->layers; L++) {
        dr_bb_layer *ly = &bb->layers[L];
        ly->kind = d->kinds[L];
        ly->idx = ly->kind == DR_LAYER_FULL ? bb->n_attn++ : bb->n_gdn++;
        ly->in_norm = vec(a, H, 1.0f, 0.05f);
        ly->post_norm = vec(a, H, 1.0f, 0.05f);
        if (ly->kind == DR_LAYER_FULL) {
            dr_bb_attn *t = &ly->attn;
            t->q = dense(a, "q_proj", (int64_t)sh->nh * sh->hd * 2, H);
            t->k = dense(a, "k_proj", (int64_t)sh->nkv * sh->hd, H);
            t->v = dense(a, "v_proj", (int64_t)sh->nkv * sh->hd, H);
            t->o = dense(a, "o_proj", H, (int64_t)sh->nh * sh->hd);
            t->q_norm = vec(a, sh->hd, 1.0f, 0.05f);
            t->k_norm = vec(a, sh->hd, 1.0f, 0.05f);
            step_bytes += dr_weight_bytes(&t->q) + dr_weight_bytes(&t->k) + dr_weight_bytes(&t->v) + dr_weight_bytes(&t->o);
        } else {
            dr_bb_gdn *g = &ly->gdn;
            g->qkv = dense(a, "in_proj_qkv", C, H);
            g->z = dense(a, "in_proj_z", vd, H);
            g->b = dense(a, "in_proj_b", sh->nv, H);
            g->a = dense(a, "in_proj_a", sh->nv, H);
            g->out = dense(a, "out_proj", H, vd);
            g->conv_w = vec(a, C * sh->K, 0.0f, 0.5f);
            g->neg_A = vec(a, sh->nv, -1.0f, 0.5f);
            g->dt_bias = vec(a, sh->nv, -3.0f, 1.0f);
            g->norm = vec(a, sh->dv, 1.0f, 0.05f);
            step_bytes += dr_weight_bytes(&g->qkv) + dr_weight_bytes(&g->z) + dr_weight_bytes(&g->b) +
                          dr_weight_bytes(&g->a) + dr_weight_bytes(&g->out);
        }
        dr_bb_moe *m = &ly->moe;
        m->router = zeros(a, "router", sh->E, H); /* all ties: experts 0..k-1, distinct buffers */
        m->sh_gate = dense(a, "shared.gate", sh->Is, H);
        m->sh_up = dense(a, "shared.up", sh->Is, H);
        m->sh_down = dense(a, "shared.down", H, sh->Is);
        m->sh_gate_proj = dense(a, "shared_expert_gate", 1, H);
        step_bytes += dr_weight_bytes(&m->router) + dr_weight_bytes(&m->sh_gate) + dr_weight_bytes(&m->sh_up) +
                      dr_weight_bytes(&m->sh_down) + dr_weight_bytes(&m->sh_gate_proj);
        m->n_kept = sh->E;
        m->kept = malloc((size_t)sh->E * sizeof(int));
        m->slot = malloc((size_t)sh->E * sizeof(int));
        m->experts = calloc((size_t)sh->E, sizeof(dr_bb_expert));
        int P = sh->distinct_experts < sh->E ? sh->distinct_experts : sh->E;
        for (int e = 0; e < sh->E; e++) {
            m->kept[e] = m->slot[e] = e;
            if (e < P) {
                m->experts[e].gate = from_template(a, &gt, "expert.gate");
                m->experts[e].up = from_template(a, &gt, "expert.up");
                m->experts[e].down = from_template(a, &dt, "expert.down");
            } else {
                m->experts[e] = m->experts[e % P];
            }
        }
        step_bytes += (size_t)sh->topk * (dr_weight_bytes(&m->experts[0].gate) + dr_weight_bytes(&m->experts[0].up) +
                                          dr_weight_bytes(&m->experts[0].down));
    }
    free_template(&gt);
    free_template(&dt);
    bb->final_norm = vec(a, H, 1.0f, 0.05f);
    bb->embed = dense(a, "embed_tokens", sh->vocab, H);
    bb->head = dense(a, "lm_head", sh->vocab, H);
    bb->code_table = dense(a, "codebook_embeddings", (int64_t)sh->codebooks * 4096, H);
    if (dr_backbone_set_tokens(bb, sh->vocab - 4096 - 8, 4096, 3, NULL)) abort();
    step_bytes += (size_t)(bb->n_sem + 1) * bb->head.row_bytes + (size_t)(sh->codebooks + 1) * bb->embed.row_bytes;
    return step_bytes;
}

static void release(dr_backbone *bb) {
    for (int L = 0; L < bb->d.n_layers; L++) {
        free(bb->layers[L].moe.kept);
        free(bb->layers[L].moe.slot);
        free(bb->layers[L].moe.experts);
    }
    free(bb->layers);
    free(bb->rope_inv_freq);
    free(bb->d.kinds);
}

typedef struct sum_ctx {
    const double *d;
    int64_t chunk, n;
    double *out;
} sum_ctx;

static void sum_task(void *vc, int64_t i, int w) {
    (void)w;
    sum_ctx *c = vc;
    int64_t a = i * c->chunk, b = a + c->chunk < c->n ? a + c->chunk : c->n;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t k = a; k + 4 <= b; k += 4) {
        s0 += c->d[k];
        s1 += c->d[k + 1];
        s2 += c->d[k + 2];
        s3 += c->d[k + 3];
    }
    c->out[i] = s0 + s1 + s2 + s3;
}

static double read_bandwidth(dr_pool *pool) {
    size_t bytes = (size_t)512 << 20;
    double *d = dr_alloc(bytes);
    if (!d) return 0;
    memset(d, 0, bytes);
    int64_t n = (int64_t)(bytes / 8), parts = 64;
    double out[64], best = 1e9;
    sum_ctx c = {d, (n + parts - 1) / parts, n, out};
    for (int r = 0; r < 4; r++) {
        double t0 = now_s();
        dr_pool_run(pool, parts, sum_task, &c);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    dr_free(d);
    return (double)bytes / best / 1e9;
}

static const char *FMT_NAMES[3] = {"bf16", "fp8", "q4"};

static void run_one(const shape *sh, int fmt, int steps, int context, dr_pool *pool, double bw) {
    arena a = {0};
    dr_backbone bb;
    double t0 = now_s();
    size_t step_bytes = build(&bb, sh, fmt, &a);
    double t_build = now_s() - t0;
    dr_bb_state *st = NULL;
    drama_error e = {0};
    if (dr_bb_state_create(&bb, context + steps + 1, &st, &e)) {
        fprintf(stderr, "%s\n", e.message);
        exit(1);
    }
    int width = 1 + sh->codebooks;
    int32_t *rows = calloc((size_t)(context + steps) * width, sizeof(int32_t));
    for (int i = 0; i < context + steps; i++) {
        int32_t *r = rows + (int64_t)i * width;
        if (i % 2 == 0) {
            r[0] = (int32_t)(rnd() % 1000);
        } else {
            r[1] = (int32_t)(rnd() % 4096);
            r[0] = (int32_t)(bb.sem_start + r[1]);
            for (int k = 2; k < width; k++) r[k] = (int32_t)(rnd() % 1024);
        }
    }
    int64_t nl = dr_backbone_n_logits(&bb);
    float *hidden = malloc((size_t)(context > 0 ? context : 1) * sh->H * sizeof(float));
    float *logits = malloc((size_t)(context > 0 ? context : 1) * nl * sizeof(float));
    double tp = now_s();
    if (context > 0 && dr_backbone_forward(&bb, st, rows, context, hidden, logits, NULL, pool, &e)) {
        fprintf(stderr, "prefill: %s\n", e.message);
        exit(1);
    }
    double t_prefill = now_s() - tp, best = 1e9, total = 0;
    clock_t c0 = clock();
    for (int s = 0; s < steps; s++) {
        double ts = now_s();
        if (dr_backbone_forward(&bb, st, rows + (int64_t)(context + s) * width, 1, hidden, logits, NULL, pool, &e)) {
            fprintf(stderr, "step: %s\n", e.message);
            exit(1);
        }
        double t = now_s() - ts;
        total += t;
        if (t < best) best = t;
    }
    double cpu_ms = 1e3 * (double)(clock() - c0) / CLOCKS_PER_SEC / steps;
    int finite = 1;
    for (int64_t j = 0; j < nl; j++) finite &= isfinite(logits[j]);
    double mean = total / steps;
    printf("| %s | %s | %d | %.3f | %.3f | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f%% |%s\n", sh->name,
           FMT_NAMES[fmt], dr_pool_threads(pool), (double)a.bytes / 1e9, (double)step_bytes / 1e9, context,
           context > 0 ? 1e3 * t_prefill / context : 0.0, 1e3 * mean, 1e3 * best, cpu_ms,
           (double)step_bytes / mean / 1e9, (double)step_bytes / best / 1e9, 100.0 * (double)step_bytes / best / 1e9 / bw,
           finite ? "" : " NON-FINITE");
    fflush(stdout);
    (void)t_build;
    free(rows);
    free(hidden);
    free(logits);
    dr_bb_state_free(st);
    release(&bb);
    arena_free(&a);
}

int main(int argc, char **argv) {
    const char *shape_name = "both", *fmt_name = "all";
    int threads = 0, steps = -1, context = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape_name = argv[++i];
        else if (!strcmp(argv[i], "--format") && i + 1 < argc) fmt_name = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--context") && i + 1 < argc) context = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_backbone [--shape tiny|full|both] [--format fp8|q4|bf16|all] "
                            "[--threads N] [--steps N] [--context N]\n");
            return 2;
        }
    }
    dr_pool *pool = dr_pool_create(threads);
    double bw = read_bandwidth(pool);
    printf("memory read bandwidth (threaded sum over 512 MiB, best of 4): %.2f GB/s\n\n", bw);
    printf("| shape | experts | thr | model GB | GB/step | context | prefill ms/row | ms/step (mean) | ms/step (best) "
           "| CPU ms/step | GB/s (mean) | GB/s (best) | of bandwidth |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 2; s++) {
        const shape *sh = s == 0 ? &TINY : &FULL;
        if (strcmp(shape_name, "both") && strcmp(shape_name, sh->name)) continue;
        for (int f = 0; f < 3; f++) {
            if (strcmp(fmt_name, "all") ? strcmp(fmt_name, FMT_NAMES[f]) != 0 : f == 0) continue;
            int st = steps > 0 ? steps : (s == 0 ? 200 : 5);
            int ctx = context >= 0 ? context : (s == 0 ? 100 : 8);
            run_one(sh, f, st, ctx, pool, bw);
        }
    }
    dr_pool_free(pool);
    return 0;
}
