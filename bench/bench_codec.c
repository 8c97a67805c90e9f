/* bench_codec.c - the codec decoder's speed at the REAL codec size (CODEC.md 1: 10 codebooks,
 * 2048 samples per frame, 8-layer post_module, 1536-wide decoder) with random fp32 weights made
 * in memory from the expected inventory (dr_codec_expected). Reports frames/s for a whole decode
 * and for streaming one frame per call, and the real-time factor (21.53 frames/s = real time).
 * Optionally the encoder too.
 *
 *   bench_codec [--threads N] [--frames F] [--encode]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/pool.h"
#include "codec/codec.h"

typedef struct inv {
    dr_tensor *t;
    int64_t n, cap, max_numel;
} inv;

static void collect(void *ctx, const char *name, int ndim, const int64_t *shape) {
    inv *v = ctx;
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1024;
        v->t = realloc(v->t, (size_t)v->cap * sizeof *v->t);
        if (!v->t) exit(1);
    }
    dr_tensor *t = &v->t[v->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = DR_DT_F32;
    t->ndim = ndim;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], numel *= shape[i];
    t->nbytes = (size_t)numel * 4;
    if (numel > v->max_numel) v->max_numel = numel;
}

static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* resident set size now, in MB (Linux /proc; 0 elsewhere) */
static double rss_mb(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
    return (double)resident * 4096.0 / (1024.0 * 1024.0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = 0, frames = 8, do_encode = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--frames") && i + 1 < argc) frames = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--encode")) do_encode = 1;
        else {
            fprintf(stderr, "usage: bench_codec [--threads N] [--frames F] [--encode]\n");
            return 2;
        }
    }
    if (frames < 1) frames = 1;
    dr_codec_config cfg;
    dr_codec_config_default(&cfg);
    inv v = {0};
    drama_error err = {0};
    if (dr_codec_expected(&cfg, collect, &v, &err)) return fprintf(stderr, "%s\n", err.message), 1;
    /* Shared random buffers keep generation cheap: weights ~U(-1,1)/32 (fan-in ~1000), gains,
     * alphas, norm weights and layer scales ~U(0.5, 1.5) scaled to stay finite. */
    float *sym = malloc((size_t)v.max_numel * 4), *pos = malloc((size_t)v.max_numel * 4);
    if (!sym || !pos) return fprintf(stderr, "out of memory\n"), 1;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < v.max_numel; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float u = (float)(x >> 40) / (float)(1 << 24);
        sym[i] = (2.0f * u - 1.0f) / 32.0f;
        pos[i] = 0.5f + u;
    }
    for (int64_t i = 0; i < v.n; i++) {
        const char *nm = v.t[i].name;
        int gain = ends(nm, ".alpha") || ends(nm, "original0") || ends(nm, "weight_g") || ends(nm, "norm.weight") ||
                   ends(nm, ".gamma") || ends(nm, "ffn_norm.weight") || ends(nm, "attention_norm.weight");
        v.t[i].data = (const uint8_t *)(gain ? pos : sym);
        if (ends(nm, "codebook.weight")) v.t[i].data = (const uint8_t *)pos;
    }
    dr_pool *pool = dr_pool_create(threads);
    unsigned parts = DR_CODEC_LOAD_DECODER | (do_encode ? DR_CODEC_LOAD_ENCODER : 0);
    double rss_before = rss_mb(), t0 = now();
    dr_codec *codec;
    if (dr_codec_load(v.t, v.n, &cfg, parts, "random real-size codec", &codec, &err))
        return fprintf(stderr, "%s\n", err.message), 1;
    double t_load = now() - t0;
    dr_codec_set_pool(codec, pool);
    int K = cfg.num_codebooks;
    int32_t *codes = malloc((size_t)frames * K * sizeof *codes);
    for (int i = 0; i < frames * K; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        codes[i] = (int32_t)(x % (uint64_t)(i % K ? cfg.codebook_size : cfg.semantic_codebook_size));
    }
    float *a = malloc((size_t)frames * cfg.frame_length * 4), *b = malloc((size_t)frames * cfg.frame_length * 4);
    double rate = (double)cfg.sample_rate / cfg.frame_length;
    /* the source tensors share two small buffers, so the peak is what the loaded codec holds */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("codec %s, real size (%lld tensors), random fp32 weights, %d threads, load+fold %.2f s\n",
           do_encode ? "decoder+encoder" : "decoder only", (long long)v.n, dr_pool_threads(pool), t_load);
    printf("memory: the loaded codec holds %.0f MB resident (peak RSS during load %.0f MB)\n", rss_mb() - rss_before,
           (double)ru.ru_maxrss / 1024.0);
    printf("%-22s %7s %9s %9s %10s\n", "mode", "frames", "seconds", "frames/s", "x realtime");
    t0 = now();
    if (dr_codec_decode(codec, codes, frames, a, &err)) return fprintf(stderr, "%s\n", err.message), 1;
    double tw = now() - t0;
    printf("%-22s %7d %9.3f %9.2f %10.3f\n", "decode whole", frames, tw, frames / tw, frames / tw / rate);
    dr_codec_stream *s;
    if (dr_codec_stream_create(codec, &s, &err)) return fprintf(stderr, "%s\n", err.message), 1;
    t0 = now();
    for (int f = 0; f < frames; f++)
        if (dr_codec_stream_feed(s, codes + f * K, 1, b + (int64_t)f * cfg.frame_length, &err))
            return fprintf(stderr, "%s\n", err.message), 1;
    double ts = now() - t0;
    printf("%-22s %7d %9.3f %9.2f %10.3f\n", "decode stream, 1/call", frames, ts, frames / ts, frames / ts / rate);
    int same = !memcmp(a, b, (size_t)frames * cfg.frame_length * 4);
    printf("streaming == whole decode (bitwise): %s\n", same ? "yes" : "NO");
    dr_codec_stream_free(s);
    if (do_encode) {
        int32_t *enc = NULL;
        int64_t T;
        t0 = now();
        if (dr_codec_encode(codec, a, (int64_t)frames * cfg.frame_length, &enc, &T, NULL, NULL, &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        double te = now() - t0;
        printf("%-22s %7lld %9.3f %9.2f %10.3f\n", "encode", (long long)T, te, T / te, T / te / rate);
        free(enc);
    }
    dr_codec_free(codec);
    dr_pool_free(pool);
    for (int64_t i = 0; i < v.n; i++) free((char *)v.t[i].name);
    free(v.t), free(sym), free(pos), free(codes), free(a), free(b);
    return same ? 0 : 1;
}
