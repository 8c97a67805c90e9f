/* bench_decode.c - `drama bench decode`: the backbone's decode step at full width against the
 * memory-bandwidth floor.
 *
 * The backbone is built in memory at the dimensions of `drama make-model --shape full` (read from
 * dr_mm_shape_defaults: hidden 2048, 256 experts top-8, the layer mix of full_attention_interval),
 * with --layers layers. Dense weights are BF16 (as released); routed experts are in the --experts
 * format, encoded by make-model's encoders (mm_quant_get) and copied so that every expert has its
 * own memory: a step's experts are never in a cache because an earlier step read them. When all
 * E experts per layer do not fit in --max-gib, each layer keeps the first P (the pruned-model
 * path: the router picks among the kept), and the output says so. The router is random, so the
 * experts change from step to step. The head is trimmed to the semantic block + end row (the
 * rows a decode step scores), as `drama optimize` can store it.
 *
 * The step runs through dr_backbone_step_batch (one row per lane, the real code path). Bytes per
 * step count the stored bytes (codes + scales) of every weight a step reads; with lanes > 1 the
 * routed experts are counted as the expected number of distinct experts the lanes select
 * (uniform routing), which the output labels. The bandwidth is measured in the same run on the
 * same pool (dr_bench_read_gbs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/cli_args.h"
#include "base/pool.h"
#include "model/backbone.h"
#include "model/state.h"
#include "num/formats.h"
#include "num/weight.h"
#include "tools/bench.h"
#include "tools/make_model.h"
#include "tools/make_model_quant.h"

typedef struct dec_opts {
    long long layers, lanes, threads, steps, context, prefill, piece;
    double max_gib;
    int recurrent; /* --deltanet-recurrent: switch deltanet.prefill=recurrent for the prefill */
    dr_mm_format fmt;
} dec_opts;

/* every allocation of the synthetic model */
typedef struct arena {
    void **p;
    int n, cap;
    size_t bytes;
} arena;

static void *arena_alloc(arena *a, size_t bytes) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 1024;
        void **np = realloc(a->p, (size_t)cap * sizeof *np);
        if (!np) return NULL;
        a->p = np;
        a->cap = cap;
    }
    void *q = dr_alloc(bytes ? bytes : 1);
    if (!q) return NULL;
    a->p[a->n++] = q;
    a->bytes += bytes;
    return q;
}

static void arena_free(arena *a) {
    for (int i = 0; i < a->n; i++) dr_free(a->p[i]);
    free(a->p);
}

static uint64_t next_rand(uint64_t *s) { /* xorshift64: fill speed matters, values do not */
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float frand(uint64_t *s) { return (float)(next_rand(s) >> 40) / 8388608.0f - 1.0f; }

typedef struct builder {
    arena a;
    uint64_t rng;
    drama_error err;
    int failed;
} builder;

static int bind(builder *b, const dr_tensor *w, const dr_tensor *s, const dr_tensor *s2, const dr_tensor *bias,
                int64_t cols, dr_weight *out) {
    if (b->failed) return 0;
    if (dr_weight_bind_ex(w, s, s2, bias, -1, 128, 128, cols, out, &b->err)) b->failed = 1;
    return !b->failed;
}

/* BF16 [rows, cols], uniform in +-1/sqrt(cols) so activations stay O(1) */
static dr_weight dense(builder *b, const char *name, int64_t rows, int64_t cols) {
    dr_weight w = {0};
    uint16_t *d = b->failed ? NULL : arena_alloc(&b->a, (size_t)(rows * cols) * 2);
    if (!d) {
        if (!b->failed) dr_fail(&b->err, DRAMA_ENOMEM, "out of memory for %s", name);
        b->failed = 1;
        return w;
    }
    float sc = 1.0f / sqrtf((float)cols);
    for (int64_t i = 0; i < rows * cols; i++) d[i] = dr_f32_to_bf16(frand(&b->rng) * sc);
    dr_tensor t = {name, DR_DT_BF16, 2, {rows, cols}, (const uint8_t *)d, (size_t)(rows * cols) * 2};
    bind(b, &t, NULL, NULL, NULL, 0, &w);
    return w;
}

static float *vec(builder *b, int64_t n, float base, float spread) {
    float *v = b->failed ? NULL : arena_alloc(&b->a, (size_t)n * sizeof(float));
    if (!v) {
        if (!b->failed) dr_fail(&b->err, DRAMA_ENOMEM, "out of memory");
        b->failed = 1;
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) v[i] = base + spread * frand(&b->rng);
    return v;
}

/* One encoded expert matrix (proj 0 gate, 1 up, 2 down): its components as make-model writes them. */
typedef struct expert_tmpl {
    int n;
    mm_q_component c[MM_Q_MAX];
    const void *bytes[MM_Q_MAX];
    size_t nbytes[MM_Q_MAX];
    int64_t rows, cols;
} expert_tmpl;

static int load_tmpl(builder *b, mm_quant_cache *qc, const dr_mm_options *o, int proj, expert_tmpl *t) {
    t->rows = proj == 2 ? o->dims.hidden : o->dims.moe_inter;
    t->cols = proj == 2 ? o->dims.moe_inter : o->dims.hidden;
    t->n = mm_quant_components(o, t->rows, t->cols, t->c);
    for (int i = 0; i < t->n; i++)
        if (mm_quant_get(qc, o, 0, 0, proj, t->c[i].kind, &t->bytes[i], &t->nbytes[i], &b->err)) return 0;
    return 1;
}

/* A fresh copy of the template in its own memory, bound like the loader binds a stored expert. */
static dr_weight expert_copy(builder *b, const expert_tmpl *t, const char *name) {
    dr_weight w = {0};
    dr_tensor ts[MM_Q_MAX] = {{0}};
    for (int i = 0; i < t->n; i++) {
        uint8_t *d = b->failed ? NULL : arena_alloc(&b->a, t->nbytes[i]);
        if (!d) {
            if (!b->failed) dr_fail(&b->err, DRAMA_ENOMEM, "out of memory for the experts");
            b->failed = 1;
            return w;
        }
        memcpy(d, t->bytes[i], t->nbytes[i]);
        ts[i] = (dr_tensor){name, t->c[i].dtype, t->c[i].ndim, {t->c[i].shape[0], t->c[i].shape[1]}, d, t->nbytes[i]};
    }
    const dr_tensor *scale = NULL, *scale2 = NULL, *bias = NULL;
    for (int i = 1; i < t->n; i++) {
        int k = t->c[i].kind;
        if (k == MM_Q_FP8_SCALE || k == MM_Q_NV_SCALE || k == MM_Q_AF_SCALES) scale = &ts[i];
        else if (k == MM_Q_NV_SCALE2) scale2 = &ts[i];
        else if (k == MM_Q_AF_BIASES) bias = &ts[i];
    }
    bind(b, &ts[0], scale, scale2, bias, t->cols, &w);
    return w;
}

typedef struct dec_model {
    dr_backbone bb;
    int P;                 /* distinct experts per layer */
    double mixer_bytes;    /* per step: attention / DeltaNet projections, router, shared expert */
    double expert_bytes;   /* one routed expert (gate + up + down) */
    double io_bytes;       /* embedding rows and head slice of one lane */
} dec_model;

static void release(dec_model *m) {
    dr_backbone *bb = &m->bb;
    for (int L = 0; bb->layers && L < bb->d.n_layers; L++) {
        free(bb->layers[L].moe.kept);
        free(bb->layers[L].moe.slot);
        free(bb->layers[L].moe.experts);
    }
    free(bb->layers);
    free(bb->rope_inv_freq);
    free(bb->d.kinds);
}

static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (size_t)kb * 1024;
}

static drama_status build(dec_model *m, builder *b, const dr_mm_options *o, double max_bytes) {
    const dr_mm_dims *dm = &o->dims;
    dr_backbone *bb = &m->bb;
    dr_bb_dims *d = &bb->d;
    *d = (dr_bb_dims){.H = dm->hidden, .n_layers = dm->layers, .nh = dm->heads, .nkv = dm->kv_heads,
                      .hd = dm->head_dim, .rope_theta = dm->rope_theta, .eps = 1e-6f, .norm_offset = 1.0f,
                      .attn_gate = 1, .nk = dm->lin_k_heads, .dk = dm->lin_k_dim, .nv = dm->lin_v_heads,
                      .dv = dm->lin_v_dim, .K = dm->conv_kernel, .E = dm->experts, .topk = dm->top_k,
                      .I = dm->moe_inter, .Is = dm->shared_inter, .norm_topk = 1, .n_codebooks = dm->codebooks,
                      .in_codebooks = dm->codebooks, .code_stride = dm->code_vocab, .code_scale_rsqrt = 1,
                      .add_token_embedding = 1, .gdn_recurrent = 1};
    d->rope_dims = (int)(dm->head_dim * dm->partial_rotary) & ~1;
    int64_t H = d->H, C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv, vd = (int64_t)d->nv * d->dv;
    d->kinds = malloc((size_t)d->n_layers * sizeof *d->kinds);
    bb->layers = calloc((size_t)d->n_layers, sizeof *bb->layers);
    bb->rope_inv_freq = malloc((size_t)(d->rope_dims / 2 + 1) * sizeof(float));
    if (!d->kinds || !bb->layers || !bb->rope_inv_freq) return dr_fail(&b->err, DRAMA_ENOMEM, "out of memory");
    for (int i = 0; i < d->rope_dims / 2; i++)
        bb->rope_inv_freq[i] = (float)(1.0 / pow(d->rope_theta, 2.0 * i / d->rope_dims));
    for (int L = 0; L < d->n_layers; L++)
        d->kinds[L] = (L + 1) % dm->full_attention_interval == 0 ? DR_LAYER_FULL : DR_LAYER_LINEAR;

    /* dense parts first: what is left of the budget decides how many experts stay distinct */
    double mix = 0;
    for (int L = 0; L < d->n_layers && !b->failed; L++) {
        dr_bb_layer *ly = &bb->layers[L];
        ly->kind = d->kinds[L];
        ly->idx = ly->kind == DR_LAYER_FULL ? bb->n_attn++ : bb->n_gdn++;
        ly->in_norm = vec(b, H, 1.0f, 0.05f);
        ly->post_norm = vec(b, H, 1.0f, 0.05f);
        if (ly->kind == DR_LAYER_FULL) {
            dr_bb_attn *t = &ly->attn;
            t->q = dense(b, "q_proj", (int64_t)d->nh * d->hd * 2, H);
            t->k = dense(b, "k_proj", (int64_t)d->nkv * d->hd, H);
            t->v = dense(b, "v_proj", (int64_t)d->nkv * d->hd, H);
            t->o = dense(b, "o_proj", H, (int64_t)d->nh * d->hd);
            t->q_norm = vec(b, d->hd, 1.0f, 0.05f);
            t->k_norm = vec(b, d->hd, 1.0f, 0.05f);
            mix += (double)(dr_weight_bytes(&t->q) + dr_weight_bytes(&t->k) + dr_weight_bytes(&t->v) +
                            dr_weight_bytes(&t->o));
        } else {
            dr_bb_gdn *g = &ly->gdn;
            g->qkv = dense(b, "in_proj_qkv", C, H);
            g->z = dense(b, "in_proj_z", vd, H);
            g->b = dense(b, "in_proj_b", d->nv, H);
            g->a = dense(b, "in_proj_a", d->nv, H);
            g->out = dense(b, "out_proj", H, vd);
            g->conv_w = vec(b, C * d->K, 0.0f, 0.5f);
            g->neg_A = vec(b, d->nv, -1.0f, 0.5f);
            g->dt_bias = vec(b, d->nv, -3.0f, 1.0f);
            g->norm = vec(b, d->dv, 1.0f, 0.05f);
            mix += (double)(dr_weight_bytes(&g->qkv) + dr_weight_bytes(&g->z) + dr_weight_bytes(&g->b) +
                            dr_weight_bytes(&g->a) + dr_weight_bytes(&g->out));
        }
        dr_bb_moe *mo = &ly->moe;
        mo->router = dense(b, "router", d->E, H);
        mo->sh_gate = dense(b, "shared.gate", d->Is, H);
        mo->sh_up = dense(b, "shared.up", d->Is, H);
        mo->sh_down = dense(b, "shared.down", H, d->Is);
        mo->sh_gate_proj = dense(b, "shared_expert_gate", 1, H);
        mix += (double)(dr_weight_bytes(&mo->router) + dr_weight_bytes(&mo->sh_gate) + dr_weight_bytes(&mo->sh_up) +
                        dr_weight_bytes(&mo->sh_down) + dr_weight_bytes(&mo->sh_gate_proj));
    }
    /* token rows: a small text block, then the semantic block and the end token; the head holds
     * only the rows a step scores (semantic block, then end) */
    int64_t n_sem = dm->code_vocab, text = 1024, vocab = text + n_sem + 1;
    bb->final_norm = vec(b, H, 1.0f, 0.05f);
    bb->embed = dense(b, "embed_tokens", vocab, H);
    bb->head = dense(b, "lm_head", n_sem + 1, H);
    bb->code_table = dense(b, "codebook_embeddings", (int64_t)dm->codebooks * dm->code_vocab, H);
    if (b->failed) return b->err.code;
    if (dr_backbone_set_tokens(bb, text, n_sem, text + n_sem, &b->err)) return b->err.code;
    m->mixer_bytes = mix;
    m->io_bytes = (double)(n_sem + 1) * (double)bb->head.row_bytes +
                  (double)(dm->codebooks + 1) * (double)bb->embed.row_bytes;

    mm_quant_cache *qc = mm_quant_cache_new(3);
    expert_tmpl t[3];
    if (!qc) return dr_fail(&b->err, DRAMA_ENOMEM, "out of memory");
    for (int p = 0; p < 3; p++)
        if (!load_tmpl(b, qc, o, p, &t[p])) {
            mm_quant_cache_free(qc);
            return b->err.code ? b->err.code : DRAMA_EINVAL;
        }
    double one = 0;
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < t[p].n; i++) one += (double)t[p].nbytes[i];
    double left = max_bytes - (double)b->a.bytes;
    long long P = left > 0 ? (long long)(left / (one * d->n_layers)) : 0;
    if (P > d->E) P = d->E;
    if (P < d->topk) {
        mm_quant_cache_free(qc);
        return dr_fail(&b->err, DRAMA_ENOMEM,
                       "%d experts per layer (%.2f GB) do not fit in --max-gib %.2f next to %.2f GB "
                       "of dense weights; use fewer --layers or a larger --max-gib",
                       d->topk, one * d->topk * d->n_layers / 1e9, max_bytes / (1 << 30), (double)b->a.bytes / 1e9);
    }
    m->P = (int)P;
    for (int L = 0; L < d->n_layers && !b->failed; L++) {
        dr_bb_moe *mo = &bb->layers[L].moe;
        mo->n_kept = m->P;
        mo->kept = malloc((size_t)m->P * sizeof(int));
        mo->slot = malloc((size_t)d->E * sizeof(int));
        mo->experts = calloc((size_t)m->P, sizeof(dr_bb_expert));
        if (!mo->kept || !mo->slot || !mo->experts) {
            dr_fail(&b->err, DRAMA_ENOMEM, "out of memory");
            b->failed = 1;
            break;
        }
        for (int e = 0; e < d->E; e++) mo->slot[e] = e < m->P ? e : -1;
        for (int e = 0; e < m->P; e++) {
            mo->kept[e] = e;
            mo->experts[e].gate = expert_copy(b, &t[0], "expert.gate");
            mo->experts[e].up = expert_copy(b, &t[1], "expert.up");
            mo->experts[e].down = expert_copy(b, &t[2], "expert.down");
        }
    }
    mm_quant_cache_free(qc);
    m->expert_bytes = one;
    return b->failed ? b->err.code : DRAMA_OK;
}

static int usage(FILE *f) {
    fprintf(f, "usage: drama bench decode [--layers N] [--experts q4|fp8|nvfp4|bf16] [--lanes B] [--threads T]\n"
               "                          [--steps S] [--context C] [--max-gib G] [--prefill P [--prefill-piece N]\n"
               "                          [--deltanet-recurrent|--deltanet-chunked]]\n"
               "  The backbone decode step at full width (make-model --shape full dimensions, N layers,\n"
               "  default 40) built in memory: ms per step, bytes read per step, the read bandwidth\n"
               "  measured in the same run, and last `ratio_to_floor X`.\n"
               "  --lanes B     sessions decoded together (default 1)   --threads T (default: physical cores)\n"
               "  --steps S     timed steps (default 8) after C prefill rows per lane (default 16)\n"
               "  --max-gib G   memory for the model (default: half of MemAvailable); experts past it are pruned\n"
               "  --prefill P   also time one P-row prefill of a fresh session (dr_backbone_forward): rows/s\n"
               "  --prefill-piece N   that prefill in calls of N rows, cut where they fall (default: one call)\n"
               "  --deltanet-recurrent  that prefill with deltanet.prefill=recurrent (row by row); the default\n"
               "                      (also --deltanet-chunked) is chunked, the model's default\n");
    return f == stdout ? 0 : 2;
}

static int parse(int argc, char **argv, dec_opts *o) {
    const char *cmd = "bench decode";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long *dst = !strcmp(a, "--layers")    ? &o->layers
                         : !strcmp(a, "--lanes")   ? &o->lanes
                         : !strcmp(a, "--threads") ? &o->threads
                         : !strcmp(a, "--steps")   ? &o->steps
                         : !strcmp(a, "--context") ? &o->context
                         : !strcmp(a, "--prefill") ? &o->prefill
                         : !strcmp(a, "--prefill-piece") ? &o->piece
                                                   : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout) == 0 ? 1 : 2;
        if (dst) {
            long long lo = dst == &o->threads || dst == &o->context || dst == &o->prefill || dst == &o->piece ? 0 : 1;
            if (!dr_cli_int(cmd, a, v, lo, dst == &o->layers ? 1024 : dst == &o->threads ? 4096 : 1 << 16, dst)) return 2;
            i++;
        } else if (!strcmp(a, "--deltanet-chunked") || !strcmp(a, "--deltanet-recurrent")) {
            o->recurrent = !strcmp(a, "--deltanet-recurrent");
        } else if (!strcmp(a, "--max-gib")) {
            if (!dr_cli_num(cmd, a, v, 0, 1 << 20, 1, &o->max_gib)) return 2;
            i++;
        } else if (!strcmp(a, "--experts")) {
            if (!v) return fprintf(stderr, "drama bench decode: --experts needs a value\n"), 2;
            if (!strcmp(v, "q4")) o->fmt = DR_MM_Q4;
            else if (!strcmp(v, "fp8")) o->fmt = DR_MM_FP8;
            else if (!strcmp(v, "nvfp4")) o->fmt = DR_MM_NVFP4;
            else if (!strcmp(v, "bf16")) o->fmt = DR_MM_BF16;
            else return fprintf(stderr, "drama bench decode: --experts '%s': expected q4, fp8, nvfp4 or bf16\n", v), 2;
            i++;
        } else {
            fprintf(stderr, "drama bench decode: unknown option '%s'\n", a);
            return usage(stderr);
        }
    }
    return 0;
}

static const char *fmt_name(dr_mm_format f) {
    return f == DR_MM_Q4 ? "q4" : f == DR_MM_FP8 ? "fp8" : f == DR_MM_NVFP4 ? "nvfp4" : "bf16";
}

/* rows of `lanes` sessions at position p: text rows, then audio rows (token = semantic code) */
static void make_rows(const dr_backbone *bb, int lanes, int64_t p, uint64_t *rng, int32_t *rows) {
    int width = dr_backbone_row_width(bb);
    for (int l = 0; l < lanes; l++) {
        int32_t *r = rows + (int64_t)l * width;
        memset(r, 0, (size_t)width * sizeof *r);
        if (p < 4) {
            r[0] = (int32_t)(next_rand(rng) % (uint64_t)bb->sem_start);
        } else {
            for (int k = 1; k < width; k++) r[k] = (int32_t)(next_rand(rng) % (uint64_t)bb->d.code_stride);
            r[0] = (int32_t)(bb->sem_start + r[1]);
        }
    }
}

/* One P-row prefill of a fresh session, best of 2 (the first also warms the pages). */
static int prefill_line(dr_backbone *bb, const dec_opts *o, dr_pool *pool) {
    int width = dr_backbone_row_width(bb);
    int64_t P = o->prefill;
    int32_t *rows = malloc((size_t)(P * width) * sizeof *rows);
    float *hidden = malloc((size_t)(P * bb->d.H) * sizeof *hidden);
    dr_bb_state *st = NULL;
    drama_error e = {0};
    uint64_t rng = 777;
    int rc = 1;
    if (!rows || !hidden || dr_bb_state_create(bb, P + 1, &st, &e)) {
        fprintf(stderr, "drama bench decode: --prefill: %s\n", e.code ? e.message : "out of memory");
        goto out;
    }
    for (int64_t p = 0; p < P; p++) make_rows(bb, 1, p, &rng, rows + p * width);
    bb->d.gdn_recurrent = o->recurrent;
    int64_t piece = o->piece > 0 ? o->piece : P;
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < 2; r++) {
        dr_bb_state_reset(st);
        double c0 = dr_bench_cpu_s(), t0 = dr_bench_now();
        for (int64_t r0 = 0; r0 < P; r0 += piece) { /* pieces as a caller cuts them */
            int64_t n = P - r0 < piece ? P - r0 : piece;
            if (dr_backbone_forward(bb, st, rows + r0 * width, n, hidden + r0 * bb->d.H, NULL, NULL, pool, &e)) {
                fprintf(stderr, "drama bench decode: --prefill: %s\n", e.message);
                goto out;
            }
        }
        double t = dr_bench_now() - t0, c = dr_bench_cpu_s() - c0;
        if (t < best) best = t;
        if (c < best_cpu) best_cpu = c;
    }
    bb->d.gdn_recurrent = 1;
    printf("  prefill of %lld rows in calls of %lld, deltanet.prefill=%s\n", (long long)P, (long long)piece,
           o->recurrent ? "recurrent" : "chunked");
    dr_bench_line("prefill_rows_per_s", (double)P / best, 1, "rows/s");
    dr_bench_line("prefill_best", best * 1e3, 1, "ms");
    dr_bench_line("prefill_cpu_best", best_cpu * 1e3, 1, "ms (process CPU time, all threads; spin included)");
    rc = 0;
out:
    dr_bb_state_free(st);
    free(rows);
    free(hidden);
    return rc;
}

int dr_bench_decode_main(int argc, char **argv) {
    dec_opts opt = {.layers = 40, .lanes = 1, .threads = 0, .steps = 8, .context = 16, .fmt = DR_MM_Q4};
    int pr = parse(argc, argv, &opt);
    if (pr) return pr == 1 ? 0 : 2;
    dr_mm_options mo;
    dr_mm_shape_defaults("full", &mo);
    mo.dims.layers = (int)opt.layers;
    mo.experts = opt.fmt;
    mo.threads = 1;
    double max_bytes = opt.max_gib > 0 ? opt.max_gib * (double)(1 << 30) : 0.5 * (double)mem_available();
    dr_pool *pool = dr_pool_create((int)opt.threads);
    if (!pool) {
        fprintf(stderr, "drama bench decode: cannot start %lld threads\n", opt.threads);
        return 1;
    }
    int lanes = (int)opt.lanes, rc = 1;
    builder b = {.rng = 0x9E3779B97F4A7C15ull};
    dec_model m;
    memset(&m, 0, sizeof m);
    dr_bb_state **st = calloc((size_t)lanes, sizeof *st);
    int width = 1 + mo.dims.codebooks;
    int32_t *rows = malloc((size_t)lanes * (size_t)width * sizeof *rows);
    float *hidden = NULL, *logits = NULL;
    double t0 = dr_bench_now();
    if (!st || !rows) {
        fprintf(stderr, "drama bench decode: out of memory\n");
        goto done;
    }
    if (build(&m, &b, &mo, max_bytes)) {
        fprintf(stderr, "drama bench decode: %s\n", b.err.message);
        goto done;
    }
    double t_build = dr_bench_now() - t0;
    hidden = malloc((size_t)lanes * (size_t)mo.dims.hidden * sizeof(float));
    logits = malloc((size_t)lanes * (size_t)dr_backbone_n_logits(&m.bb) * sizeof(float));
    drama_error e = {0};
    for (int l = 0; l < lanes && hidden && logits; l++)
        if (dr_bb_state_create(&m.bb, opt.context + opt.steps + 2, &st[l], &e)) {
            fprintf(stderr, "drama bench decode: %s\n", e.message);
            goto done;
        }
    if (!hidden || !logits) {
        fprintf(stderr, "drama bench decode: out of memory\n");
        goto done;
    }
    /* prefill: each lane's context row by row as decode steps (gives attention a history) */
    uint64_t rng = 12345;
    for (int64_t p = 0; p <= opt.context; p++) { /* the last one is the untimed warm-up step */
        make_rows(&m.bb, lanes, p, &rng, rows);
        if (dr_backbone_step_batch(&m.bb, st, lanes, rows, hidden, logits, pool, &e)) {
            fprintf(stderr, "drama bench decode: %s\n", e.message);
            goto done;
        }
    }
    double total = 0, best = 1e30;
    int finite = 1;
    for (int s = 0; s < opt.steps; s++) {
        make_rows(&m.bb, lanes, opt.context + 1 + s, &rng, rows);
        double ts = dr_bench_now();
        if (dr_backbone_step_batch(&m.bb, st, lanes, rows, hidden, logits, pool, &e)) {
            fprintf(stderr, "drama bench decode: %s\n", e.message);
            goto done;
        }
        double t = dr_bench_now() - ts;
        total += t;
        if (t < best) best = t;
        for (int64_t j = 0; j < lanes * dr_backbone_n_logits(&m.bb); j++) finite &= isfinite(logits[j]) != 0;
    }
    if (!finite) {
        fprintf(stderr, "drama bench decode: non-finite logits (the synthetic model is broken)\n");
        goto done;
    }
    double gbs = dr_bench_read_gbs(pool, 0, 5);
    /* expected distinct experts of `lanes` uniform top-k draws among P */
    double P = m.P, k = mo.dims.top_k;
    double experts = lanes == 1 ? k : P * (1.0 - pow(1.0 - k / P, lanes));
    double bytes = (m.mixer_bytes + (double)mo.dims.layers * experts * m.expert_bytes) + lanes * m.io_bytes;
    double mean = total / (double)opt.steps;
    printf("bench decode: %lld layers, experts %s, %d lanes, %d threads, %lld steps after %lld context rows\n",
           opt.layers, fmt_name(opt.fmt), lanes, dr_pool_threads(pool), opt.steps, opt.context);
    dr_bench_line("model_in_memory", (double)b.a.bytes / 1e9, 3, "GB");
    dr_bench_line("experts_distinct_per_layer", P, 0, P < mo.dims.experts ? "(the rest pruned: --max-gib)" : "");
    dr_bench_line("experts_read_per_layer", experts, 2, lanes == 1 ? "" : "(expected distinct, uniform routing)");
    dr_bench_line("build", t_build, 2, "s");
    dr_bench_line("step_best", best * 1e3, 3, "ms");
    dr_bench_line("step_mean", mean * 1e3, 3, "ms/step");
    dr_bench_line("per_lane", mean * 1e3 / lanes, 3, "ms/frame");
    if (opt.prefill > 0 && prefill_line(&m.bb, &opt, pool)) goto done;
    dr_bench_roofline(mean, bytes, gbs, "GB/s (read, same run, same threads)");
    rc = 0;
done:
    for (int l = 0; st && l < lanes; l++) dr_bb_state_free(st[l]);
    free(st);
    free(rows);
    free(hidden);
    free(logits);
    release(&m);
    arena_free(&b.a);
    dr_pool_free(pool);
    return rc;
}
