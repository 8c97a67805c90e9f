/* bench_tower.c - the codebook tower's time per frame (13 layers + 9 heads, one position) and
 * per teacher-forced prefill row, at the tiny golden shape and at the full shape (MODEL.md 3.3:
 * S2-Pro's fast decoder 2560 / 32 / 8 / 128 / 9728 stands in for the unpublished Drama 3 values;
 * input hidden 2048 = the backbone's). Weights are random BF16 in memory (never expanded).
 *
 *   bench_tower [--shape tiny|full|both] [--threads N] [--frames F] [--context P] [--batch B]
 * The last column steps B sessions together (dr_tower_generate_many): per-session cost of a
 * frame when the weights are streamed once for the whole batch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/pool.h"
#include "model/tower.h"
#include "num/weight.h"

typedef struct table {
    int n, cap;
    dr_tensor *t;
    char **names;
} table;

static uint64_t g_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (uint32_t)(g_state >> 16);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* A BF16 tensor of uniform values in [-scale, scale] (+ offset), 1-D or 2-D. */
static void add(table *tb, const char *name, int64_t rows, int64_t cols, float scale, float offset) {
    if (tb->n == tb->cap) {
        tb->cap = tb->cap ? tb->cap * 2 : 256;
        tb->t = realloc(tb->t, (size_t)tb->cap * sizeof *tb->t);
        tb->names = realloc(tb->names, (size_t)tb->cap * sizeof *tb->names);
    }
    int64_t n = rows * (cols > 0 ? cols : 1);
    uint16_t *d = malloc((size_t)n * 2);
    if (!d) {
        fprintf(stderr, "bench_tower: out of memory for %s\n", name);
        exit(1);
    }
    /* a short random pattern repeated: filling gigabytes with fresh randoms costs more than the bench */
    uint16_t pat[4096];
    for (int i = 0; i < 4096; i++) pat[i] = to_bf16(offset + scale * ((float)(rnd32() % 20001) / 10000.0f - 1.0f));
    for (int64_t i = 0; i < n; i++) d[i] = pat[(i * 2654435761u + (uint64_t)(i >> 12)) % 4096];
    dr_tensor *t = &tb->t[tb->n];
    memset(t, 0, sizeof *t);
    tb->names[tb->n] = strdup(name);
    t->name = tb->names[tb->n];
    t->dtype = DR_DT_BF16;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->data = (const uint8_t *)d;
    t->nbytes = (size_t)n * 2;
    tb->n++;
}

static const dr_tensor *find(void *ctx, const char *name) {
    table *tb = ctx;
    for (int i = 0; i < tb->n; i++)
        if (!strcmp(tb->names[i], name)) return &tb->t[i];
    return NULL;
}

static void table_free(table *tb) {
    for (int i = 0; i < tb->n; i++) {
        free((void *)tb->t[i].data);
        free(tb->names[i]);
    }
    free(tb->t);
    free(tb->names);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Process CPU time (all threads): on a shared machine wall time includes waiting for a core. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static drama_status pick_argmax(void *ctx, int codebook, const float *l, int n, int *code, drama_error *err) {
    (void)ctx;
    (void)codebook;
    (void)err;
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    *code = b;
    return DRAMA_OK;
}

static drama_status pick_argmax_many(void *ctx, int row, int codebook, const float *l, int n, int *code,
                                     drama_error *err) {
    (void)row;
    return pick_argmax(ctx, codebook, l, n, code, err);
}

static int g_batch = 4;

static void run_shape(const char *label, int H, int D, int nh, int nkv, int hd, int F, int threads, int frames,
                      int context) {
    dr_tower_dims d;
    memset(&d, 0, sizeof d);
    d.dim = D;
    d.n_head = nh;
    d.n_kv_head = nkv;
    d.head_dim = hd;
    d.ffn = F;
    d.eps = 1e-6;
    d.num_codebooks = 10;
    d.n_shared = 4;
    d.code_stride = 4096;
    d.head_vocab = 1024;
    d.rope_dims = hd / 2;
    d.rope_base = 1e7;
    d.code_table = "audio_decoder_mtp.codebook_embeddings.weight";
    table tb = {0};
    char n[160];
    int L = d.n_shared + d.num_codebooks - 1;
    for (int l = 0; l < L; l++) {
        char p[64];
        if (l < d.n_shared) snprintf(p, sizeof p, "audio_decoder_mtp_shared.layers.%d.", l);
        else snprintf(p, sizeof p, "audio_decoder_mtp.layers.%d.", l - d.n_shared);
        int dh = l ? D : H;
#define NM(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
        add(&tb, NM("enorm.weight"), D, 0, 0.05f, 1.0f);
        add(&tb, NM("hnorm.weight"), dh, 0, 0.05f, 1.0f);
        add(&tb, NM("attention_norm.weight"), D, 0, 0.05f, 1.0f);
        add(&tb, NM("ffn_norm.weight"), D, 0, 0.05f, 1.0f);
        add(&tb, NM("out_norm.weight"), D, 0, 0.05f, 1.0f);
        add(&tb, NM("eh_proj.weight"), D, D + dh, 1.7f / sqrtf((float)(D + dh)), 0);
        add(&tb, NM("attention.wqkv.weight"), (int64_t)(nh + 2 * nkv) * hd, D, 1.7f / sqrtf((float)D), 0);
        add(&tb, NM("attention.wo.weight"), D, (int64_t)nh * hd, 1.7f / sqrtf((float)(nh * hd)), 0);
        add(&tb, NM("feed_forward.w1.weight"), F, D, 1.7f / sqrtf((float)D), 0);
        add(&tb, NM("feed_forward.w3.weight"), F, D, 1.7f / sqrtf((float)D), 0);
        add(&tb, NM("feed_forward.w2.weight"), D, F, 1.7f / sqrtf((float)F), 0);
#undef NM
    }
    add(&tb, d.code_table, (int64_t)d.num_codebooks * d.code_stride, D, 1.0f, 0);
    for (int j = 0; j < d.num_codebooks - 1; j++) {
        snprintf(n, sizeof n, "audio_decoder_mtp.heads.%d.weight", j);
        add(&tb, n, 1024, D, 3.4f / sqrtf((float)D), 0);
    }
    dr_tower t;
    drama_error e = {0};
    if (dr_tower_bind(&t, &d, find, &tb, &e)) {
        fprintf(stderr, "bench_tower: %s\n", e.message);
        exit(1);
    }
    double bytes = 0; /* weights a frame reads: every layer matrix and the used head rows */
    for (int l = 0; l < L; l++) {
        dr_tower_layer *y = &t.layers[l];
        bytes += (double)dr_weight_bytes(&y->eh_proj) + dr_weight_bytes(&y->wqkv) + dr_weight_bytes(&y->wo) +
                 dr_weight_bytes(&y->w1) + dr_weight_bytes(&y->w2) + dr_weight_bytes(&y->w3);
    }
    for (int j = 0; j < d.num_codebooks - 1; j++) bytes += (double)d.head_vocab * D * 2;
    dr_pool *pool = dr_pool_create(threads);
    dr_tower_cache *c;
    if (dr_tower_cache_create(&t, context + frames + 1, &c, &e)) {
        fprintf(stderr, "bench_tower: %s\n", e.message);
        exit(1);
    }
    /* teacher-forced context rows (the prefill of a prompt) */
    float *h = malloc((size_t)context * H * sizeof(float));
    int32_t *codes = calloc((size_t)context * 10, sizeof(int32_t));
    uint8_t *mask = malloc((size_t)context);
    for (int64_t i = 0; i < (int64_t)context * H; i++) h[i] = (float)(rnd32() % 2001) / 1000.0f - 1.0f;
    for (int r = 0; r < context; r++) {
        mask[r] = r % 3 != 0;
        for (int j = 0; j < 10; j++) codes[r * 10 + j] = (int32_t)(rnd32() % 1024);
    }
    double t0 = now_s();
    if (context && dr_tower_forward(&t, c, context, h, codes, mask, NULL, NULL, pool, &e)) {
        fprintf(stderr, "bench_tower: %s\n", e.message);
        exit(1);
    }
    double t1 = now_s();
    int32_t out[10];
    double best = 1e30, total = 0, c0 = cpu_s();
    for (int f = 0; f < frames; f++) {
        double a = now_s();
        if (dr_tower_generate(&t, c, h + (int64_t)(f % (context ? context : 1)) * H, 17 + f, pick_argmax, NULL, out,
                              NULL, pool, &e)) {
            fprintf(stderr, "bench_tower: %s\n", e.message);
            exit(1);
        }
        double b = now_s() - a;
        total += b;
        if (b < best) best = b;
    }
    double cpu = cpu_s() - c0;
    /* g_batch sessions stepped together: the weights are streamed once per step */
    double batch_best = 0;
    if (g_batch > 1) {
        dr_tower_cache **cs = calloc((size_t)g_batch, sizeof *cs);
        float *hb = malloc((size_t)g_batch * H * sizeof(float));
        int32_t *c0s = malloc((size_t)g_batch * sizeof(int32_t)), *cb = malloc((size_t)g_batch * 10 * sizeof(int32_t));
        drama_status *rs = malloc((size_t)g_batch * sizeof(drama_status));
        for (int b = 0; b < g_batch; b++) {
            if (dr_tower_cache_create(&t, context + frames + 1, &cs[b], &e) ||
                (context && dr_tower_forward(&t, cs[b], context, h, codes, mask, NULL, NULL, pool, &e))) {
                fprintf(stderr, "bench_tower: %s\n", e.message);
                exit(1);
            }
            memcpy(hb + (int64_t)b * H, h + (int64_t)(b % (context ? context : 1)) * H, (size_t)H * sizeof(float));
            c0s[b] = 100 + b;
        }
        batch_best = 1e30;
        for (int f = 0; f < frames; f++) {
            double a = now_s();
            if (dr_tower_generate_many(&t, cs, g_batch, hb, c0s, pick_argmax_many, NULL, cb, NULL, rs, NULL, pool, &e)) {
                fprintf(stderr, "bench_tower: %s\n", e.message);
                exit(1);
            }
            double b = now_s() - a;
            if (b < batch_best) batch_best = b;
        }
        for (int b = 0; b < g_batch; b++) dr_tower_cache_free(cs[b]);
        free(cs); free(hb); free(c0s); free(cb); free(rs);
    }
    printf("| %-5s | %4d | %4d | %2d/%d/%3d | %5d | %7.3f | %2d | %7d | %9.3f | %9.3f | %9.3f | %9.3f | %6.2f | %d: %.3f |\n",
           label, H, D, nh, nkv, hd, F, bytes / 1e9, threads, context, context ? (t1 - t0) * 1e3 / context : 0.0,
           total * 1e3 / frames, best * 1e3, cpu * 1e3 / frames, bytes / best / 1e9, g_batch,
           g_batch > 1 ? batch_best * 1e3 / g_batch : best * 1e3);
    free(h);
    free(codes);
    free(mask);
    dr_tower_cache_free(c);
    dr_pool_free(pool);
    dr_tower_release(&t);
    table_free(&tb);
}

static int usage(void) {
    fprintf(stderr, "usage: bench_tower [--shape tiny|full|both] [--threads N] [--frames F] [--context P] [--batch B]\n");
    return 2;
}

/* A flag's integer value in [lo, hi]; anything else is a usage error (never a silent default). */
static int int_arg(const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "bench_tower: %s: expected an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int main(int argc, char **argv) {
    const char *shape = "both";
    int threads = 0, frames = 0, context = -1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--shape")) {
            shape = v;
            ok = !strcmp(v, "tiny") || !strcmp(v, "full") || !strcmp(v, "both");
        } else if (ok && !strcmp(a, "--threads")) ok = int_arg(a, v, 1, 1024, &threads);
        else if (ok && !strcmp(a, "--frames")) ok = int_arg(a, v, 1, 1000000, &frames);
        else if (ok && !strcmp(a, "--context")) ok = int_arg(a, v, 0, 1000000, &context);
        else if (ok && !strcmp(a, "--batch")) ok = int_arg(a, v, 1, 256, &g_batch);
        else ok = 0;
        if (!ok) return usage();
    }
    dr_pool *probe = dr_pool_create(threads);
    threads = dr_pool_threads(probe);
    dr_pool_free(probe);
    printf("| shape | H    | D    | heads q/kv/hd | F | weights GB | thr | context | prefill ms/row | ms/frame (mean) | "
           "ms/frame (best) | CPU ms/frame | GB/s (best) | batch B: ms/frame per session (best) |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (strcmp(shape, "full"))
        run_shape("tiny", 64, 64, 4, 2, 32, 192, threads, frames > 0 ? frames : 200, context >= 0 ? context : 100);
    if (strcmp(shape, "tiny"))
        run_shape("full", 2048, 2560, 32, 8, 128, 9728, threads, frames > 0 ? frames : 5, context >= 0 ? context : 16);
    return 0;
}
