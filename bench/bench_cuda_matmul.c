/* bench_cuda_matmul.c - the CUDA backend's products on the Drama 3 shapes: microseconds per call
 * (CUDA events, warm, median of 31 samples) and GB/s of stored weight bytes (dr_weight_bytes)
 * against the H200's ~4.8 TB/s. Each sample runs the product over enough copies of the weight
 * (>= 4x the L2) that every call reads its weight from device memory, not from the L2.
 * Built only with the CUDA backend. Usage: bench_cuda_matmul [samples] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "num/formats.h"
#include "num/weight.h"

#define PEAK_GBS 4800.0

static uint64_t rng = 12345;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

typedef struct shape {
    const char *what;
    dr_wfmt fmt;
    int64_t rows, cols;
    int a, b; /* FP8 block size / affine bits, group */
} shape;

/* Random stored bytes with valid scales (the timing does not depend on the values, but NaN
 * codes and zeros are avoided so that no special path is measured). */
static uint8_t *make(const shape *s, dr_weight *w) {
    memset(w, 0, sizeof *w);
    w->fmt = s->fmt, w->rows = s->rows, w->cols = s->cols, w->global_scale = 1.0f, w->name = s->what;
    size_t need = 0, sb = 0;
    switch (s->fmt) {
    case DR_WF_BF16: need = s->cols * 2; break;
    case DR_WF_FP8_BLOCK:
        need = s->cols, w->block_rows = s->a, w->block_cols = s->b, w->scale_dtype = DR_DT_F32;
        w->scale_cols = (s->cols + s->b - 1) / s->b;
        sb = (size_t)((s->rows + s->a - 1) / s->a) * w->scale_cols * 4;
        break;
    case DR_WF_NVFP4:
        need = s->cols / 2, w->scale_cols = s->cols / 16, sb = s->rows * w->scale_cols, w->global_scale = 0.01f;
        break;
    case DR_WF_AFFINE:
        need = s->cols * s->a / 8, w->bits = s->a, w->group = s->b, w->scale_dtype = DR_DT_BF16;
        w->scale_cols = s->cols / s->b, sb = s->rows * w->scale_cols * 2;
        break;
    default: break;
    }
    w->row_bytes = need;
    uint8_t *mem = malloc(need * s->rows + 2 * sb + 16);
    uint8_t *d = mem;
    for (size_t i = 0; i < need * s->rows; i++) {
        d[i] = (uint8_t)rnd();
        if (s->fmt == DR_WF_FP8_BLOCK && (d[i] & 0x7F) == 0x7F) d[i] = 0x3C;
        if (s->fmt == DR_WF_BF16 && (i & 1)) d[i] = (uint8_t)(0x3C + (d[i] & 0x81)); /* |v| ~ 0.01 .. 1 */
    }
    w->data = d;
    uint8_t *sc = d + need * s->rows;
    if (s->fmt == DR_WF_NVFP4)
        for (size_t i = 0; i < sb; i++) sc[i] = (uint8_t)(0x30 + rnd() % 16);
    if (s->fmt == DR_WF_FP8_BLOCK)
        for (size_t i = 0; i + 4 <= sb; i += 4) {
            float v = 0.001f * (float)(1 + rnd() % 7);
            memcpy(sc + i, &v, 4);
        }
    if (s->fmt == DR_WF_AFFINE) /* scales then biases */
        for (size_t i = 0; i + 2 <= 2 * sb; i += 2) {
            uint16_t h = dr_f32_to_bf16(0.01f * (float)(1 + rnd() % 5));
            memcpy(sc + i, &h, 2);
        }
    w->scales = sc;
    w->biases = sc + sb;
    return mem;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One timed call: job set `next` of the rotation. */
typedef struct timed {
    dr_cuda *c;
    dr_cuda_job *jobs; /* copies x per_call */
    int copies, per_call, next;
    int separate;      /* 1: one launch per job instead of one batched launch */
    drama_error err;
} timed;

static drama_status one_call(void *arg) {
    timed *t = arg;
    dr_cuda_job *j = t->jobs + (size_t)t->next * t->per_call;
    t->next = (t->next + 1) % t->copies;
    if (!t->separate) return dr_cuda_matmul_batch(t->c, j, t->per_call, &t->err);
    for (int i = 0; i < t->per_call; i++) {
        drama_status st = dr_cuda_matmul_batch(t->c, j + i, 1, &t->err);
        if (st) return st;
    }
    return DRAMA_OK;
}

/* Median microseconds per call of `per_call` products of shape s with n activation rows. */
static int bench(dr_cuda *c, const shape *s, int n, int per_call, int separate, int samples, double *us, double *gbs) {
    dr_weight w;
    uint8_t *mem = make(s, &w);
    size_t wbytes = dr_weight_bytes(&w);
    size_t l2 = dr_cuda_get_info(c)->l2_bytes;
    int sets = (int)((4 * l2 + wbytes * per_call - 1) / (wbytes * per_call));
    if (sets < 2) sets = 2;
    if (sets > 1024) sets = 1024;
    int nw = sets * per_call;
    dr_cuda_weight **dw = calloc(nw, sizeof *dw);
    dr_cuda_job *jobs = calloc(nw, sizeof *jobs);
    drama_error e = {0};
    float *x = malloc(sizeof(float) * n * s->cols);
    for (int64_t i = 0; i < n * s->cols; i++) x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    void *dx = NULL, *dy = NULL;
    int ok = !dr_cuda_malloc(c, sizeof(float) * n * s->cols, &dx, &e) &&
             !dr_cuda_malloc(c, sizeof(float) * n * s->rows * per_call, &dy, &e) &&
             !dr_cuda_to_device(c, dx, x, sizeof(float) * n * s->cols, &e);
    for (int i = 0; i < nw && ok; i++) {
        ok = !dr_cuda_weight_upload(c, &w, &dw[i], &e);
        jobs[i] = (dr_cuda_job){dw[i], dx, n, (float *)dy + (size_t)(i % per_call) * n * s->rows, 0, 0, 0, 0, NULL,
                                NULL, 0, 0, NULL};
    }
    timed t = {c, jobs, sets, per_call, 0, separate, {0}};
    double *ms = malloc(sizeof(double) * samples);
    double warm;
    for (int i = 0; i < 3 && ok; i++) ok = !dr_cuda_time(c, one_call, &t, sets, &warm, &e);
    for (int i = 0; i < samples && ok; i++) ok = !dr_cuda_time(c, one_call, &t, sets, &ms[i], &e);
    if (ok) {
        qsort(ms, samples, sizeof(double), cmp_double);
        *us = ms[samples / 2] * 1000.0;
        *gbs = (double)wbytes * per_call / (*us * 1e-6) / 1e9;
    } else {
        printf("FAILED %s: %s %s\n", s->what, e.message, t.err.message);
    }
    for (int i = 0; i < nw; i++) dr_cuda_weight_free(dw[i]);
    dr_cuda_free(c, dx);
    dr_cuda_free(c, dy);
    free(dw), free(jobs), free(x), free(ms), free(mem);
    return ok;
}

int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 31;
    if (samples < 1) samples = 1;
    drama_error e = {0};
    dr_cuda *c = NULL;
    if (dr_cuda_open(0, &c, &e)) {
        printf("bench_cuda_matmul: %s\n", e.message);
        return 77;
    }
    const dr_cuda_info *in = dr_cuda_get_info(c);
    printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MiB; median of %d samples, weights rotated over >= 4x L2\n",
           in->name, in->cc_major, in->cc_minor, in->sm_count, in->l2_bytes / 1048576.0, samples);
    const shape shapes[] = {
        {"expert gate/up fp8-block", DR_WF_FP8_BLOCK, 512, 2048, 128, 128},
        {"expert down fp8-block", DR_WF_FP8_BLOCK, 2048, 512, 128, 128},
        {"expert gate/up nvfp4", DR_WF_NVFP4, 512, 2048, 0, 0},
        {"expert down nvfp4", DR_WF_NVFP4, 2048, 512, 0, 0},
        {"expert gate/up affine4 g64", DR_WF_AFFINE, 512, 2048, 4, 64},
        {"expert down affine4 g64", DR_WF_AFFINE, 2048, 512, 4, 64},
        {"expert gate/up bf16", DR_WF_BF16, 512, 2048, 0, 0},
        {"dense bf16", DR_WF_BF16, 2048, 2048, 0, 0},
        {"lm_head slice bf16", DR_WF_BF16, 4097, 2048, 0, 0},
        {"launch floor: 4 rows bf16", DR_WF_BF16, 4, 2048, 0, 0},
        /* the large dense products of a frame (MODEL.md 4.2, the full tower shape of make-model) */
        {"deltanet in_proj_qkv / attn q_proj bf16", DR_WF_BF16, 8192, 2048, 0, 0},
        {"deltanet in_proj_z bf16", DR_WF_BF16, 4096, 2048, 0, 0},
        {"deltanet out_proj / attn o_proj bf16", DR_WF_BF16, 2048, 4096, 0, 0},
        {"tower w1 / w3 bf16", DR_WF_BF16, 9728, 2560, 0, 0},
        {"tower w2 bf16", DR_WF_BF16, 2560, 9728, 0, 0},
        {"tower wqkv bf16", DR_WF_BF16, 6144, 2560, 0, 0},
        {"tower eh_proj bf16", DR_WF_BF16, 2560, 4608, 0, 0},
    };
    const int ns[] = {1, 4, 16};
    double copy_bps = 0;
    if (dr_cuda_copy_bandwidth(c, (size_t)2 << 30, &copy_bps, &e) == DRAMA_OK)
        printf("device-to-device copy (1 GiB each way, best of 5): %.0f GB/s (read + write)\n", copy_bps / 1e9);
    else
        printf("copy bandwidth probe failed: %s\n", e.message);
    double ref_gbs = copy_bps > 0 ? copy_bps / 1e9 : PEAK_GBS;
    printf("| shape | [out, in] | n | launches x products | us/call | GB/s | %% of 4.8 TB/s | %% of copy |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        for (int t = 0; t < (k >= 10 ? 1 : 3); t++) { /* the large dense products at n = 1 only */
            double us, gbs;
            if (bench(c, &shapes[k], ns[t], 1, 0, samples, &us, &gbs))
                printf("| %s | [%lld, %lld] | %d | 1 x 1 | %.2f | %.0f | %.1f | %.1f |\n", shapes[k].what,
                       (long long)shapes[k].rows, (long long)shapes[k].cols, ns[t], us, gbs, 100.0 * gbs / PEAK_GBS,
                       100.0 * gbs / ref_gbs);
        }
    }
    /* the 8 routed experts of one token: one batched launch vs 8 launches */
    for (int k = 0; k < 6; k += 1) { /* gate/up and down of each quantised format */
        for (int sep = 0; sep < 2; sep++) {
            double us, gbs;
            if (bench(c, &shapes[k], 1, 8, sep, samples, &us, &gbs))
                printf("| 8 experts %s | [%lld, %lld] | 1 | %s | %.2f | %.0f | %.1f | %.1f |\n", shapes[k].what + 7,
                       (long long)shapes[k].rows, (long long)shapes[k].cols, sep ? "8 x 1" : "1 x 8", us, gbs,
                       100.0 * gbs / PEAK_GBS, 100.0 * gbs / ref_gbs);
        }
    }
    dr_cuda_close(c);
    return 0;
}
