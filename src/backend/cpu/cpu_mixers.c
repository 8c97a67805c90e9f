/* cpu_mixers.c - the attention and DeltaNet ops on the CPU (backend.h: dr_attn_args,
 * dr_gdn_args). Work is split by (row, head) for attention and by conv channel block / value
 * head for DeltaNet; each DeltaNet task walks the rows in order: complete position-aligned
 * blocks of DR_GDN_CHUNK rows of one sequence in the chunked form (gdn_chunk.c), every other row
 * by the recurrence (all rows when args->recurrent), so a prefill split at multiples of
 * DR_GDN_CHUNK positions (where the pipeline and the backbone cut) changes no bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"

static int held(const dr_seq_row *r) { return r->hold && *r->hold; }
static int64_t row_pos(const dr_seq_row *r) { return r->seq->pos + r->off; }

/* ---------------- attention ---------------- */

/* pool.h work units per multiply-add of an attention (see dr_cpu_op_attention) */
#define ATTN_COST_F64 5.0
#define ATTN_COST_F32 2.0

typedef struct attn_ctx {
    const dr_attn_args *a;
    float *scratch;     /* [n_workers][max_pos] */
    int64_t max_pos;
} attn_ctx;

/* Task t = row * nh + head: attend over positions 0..pos of the row's sequence. */
static void attend_task(void *vctx, int64_t t, int worker) {
    const attn_ctx *c = vctx;
    const dr_attn_args *a = c->a;
    int64_t row = t / a->nh;
    int j = (int)(t % a->nh);
    int m = j / (a->nh / a->nkv);
    const dr_seq *s = a->rows[row].seq;
    const float *q = a->q + row * a->q_stride + (int64_t)j * a->q_head_stride;
    float *o = a->out + row * (int64_t)a->nh * a->hd + (int64_t)j * a->hd;
    const float *k = dr_seq_k(s, a->layer) + (int64_t)m * a->hd, *v = dr_seq_v(s, a->layer) + (int64_t)m * a->hd;
    float *scratch = c->scratch + (int64_t)worker * c->max_pos;
    if (a->f64) {
        dr_op_attend_f64(q, k, v, row_pos(&a->rows[row]) + 1, s->kv_dim, a->hd, 1.0 / sqrt((double)a->hd), scratch, o);
    } else {
        dr_op_attend(q, k, v, row_pos(&a->rows[row]) + 1, s->kv_dim, a->hd, 1.0f / sqrtf((float)a->hd), scratch, o);
        if (a->gated) dr_op_sigmoid_mul(o, q + a->hd, a->hd);
    }
}

static void rope(const dr_attn_args *a, float *x, const float *cs) {
    if (a->rope_interleaved) dr_op_rope_interleaved(x, a->rope_half, cs, cs + a->rope_half);
    else dr_op_rope_half(x, a->rope_half, cs, cs + a->rope_half);
}

void dr_cpu_op_attention(dr_backend *be, const dr_attn_args *a) {
    dr_pool *pool = dr_cpu_pool_of(be);
    int n_workers = pool ? dr_pool_threads(pool) : 1;
    int64_t n = a->n, hd = a->hd, kvd = (int64_t)a->nkv * hd;
    int64_t max_pos = 0;
    double work = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = row_pos(&a->rows[i]) + 1;
        if (p > max_pos) max_pos = p;
        work += (double)a->nh * (double)p * hd;
    }
    /* per multiply-add, a position costs more than a SIMD product's (pool.h's unit): an exp per
     * position, and in float64 scalar dots; measured on the tiny model ~5x (float64) */
    work *= a->f64 ? ATTN_COST_F64 : ATTN_COST_F32;
    float *scratch = dr_alloc((size_t)(n_workers * (max_pos > 0 ? max_pos : 1)) * sizeof(float));
    float *cs = malloc((size_t)(2 * (a->rope_half > 0 ? a->rope_half : 1)) * sizeof(float));
    if (!scratch || !cs) {
        for (int64_t j = 0; j < n * a->nh * hd; j++) a->out[j] = NAN; /* no memory: loud, never silent */
        dr_free(scratch);
        free(cs);
        return;
    }
    /* norm + RoPE per row, then append K/V at the row's position (all appends before any attend,
     * so rows of one prefill see each other causally); a held row's cache slot past its length
     * is overwritten by whatever next fills that position */
    for (int64_t i = 0; i < n; i++) {
        int64_t p = row_pos(&a->rows[i]);
        dr_op_rope_cos_sin(a->rope_freq, a->rope_half, p, cs, cs + a->rope_half);
        for (int j = 0; j < a->nh; j++) {
            float *qh = a->q + i * a->q_stride + (int64_t)j * a->q_head_stride;
            if (a->q_norm) dr_op_rms_norm(qh, a->q_norm, a->eps, hd, qh);
            rope(a, qh, cs);
        }
        for (int m = 0; m < a->nkv; m++) {
            float *kh = a->k + i * a->kv_stride + (int64_t)m * hd;
            if (a->k_norm) dr_op_rms_norm(kh, a->k_norm, a->eps, hd, kh);
            rope(a, kh, cs);
        }
        dr_seq *s = a->rows[i].seq;
        memcpy(dr_seq_k(s, a->layer) + p * s->kv_dim, a->k + i * a->kv_stride, (size_t)kvd * sizeof(float));
        memcpy(dr_seq_v(s, a->layer) + p * s->kv_dim, a->v + i * a->kv_stride, (size_t)kvd * sizeof(float));
    }
    attn_ctx c = {a, scratch, max_pos};
    /* small attention (the tower's short context) stays on this thread; the result is the same
     * either way (one (row, head) per index) */
    dr_pool_run_work(pool, n * a->nh, attend_task, &c, 2 * work);
    dr_free(scratch);
    free(cs);
}

/* ---------------- DeltaNet ---------------- */

#define CONV_BLOCK 256

typedef struct gdn_ctx {
    const dr_gdn_args *a;
    int64_t C;
    float *mem;      /* [nv][dv] scratch, one per value head */
    float *chunk;    /* [n_workers][chunk_len] scratch of the chunked form, or NULL */
    int64_t chunk_len;
} gdn_ctx;

/* Rows i .. i + DR_GDN_CHUNK - 1 form a complete block: one sequence, consecutive offsets, none
 * held, the first at a position that is a multiple of DR_GDN_CHUNK. Aligning to the position
 * (not to the call) makes the result independent of how a prefill is split into calls. */
static int chunk_at(const dr_gdn_args *a, int64_t i) {
    if (i + DR_GDN_CHUNK > a->n || row_pos(&a->rows[i]) % DR_GDN_CHUNK) return 0;
    for (int64_t t = 0; t < DR_GDN_CHUNK; t++) {
        const dr_seq_row *r = &a->rows[i + t];
        if (r->seq != a->rows[i].seq || r->off != a->rows[i].off + t || held(r)) return 0;
    }
    return 1;
}

static void conv_task(void *vctx, int64_t blk, int worker) {
    (void)worker;
    const gdn_ctx *c = vctx;
    const dr_gdn_args *a = c->a;
    int64_t c0 = blk * CONV_BLOCK, c1 = c0 + CONV_BLOCK < c->C ? c0 + CONV_BLOCK : c->C;
    for (int64_t i = 0; i < a->n; i++) {
        float *y = a->y + i * c->C;
        if (held(&a->rows[i])) { /* state untouched; the row's outputs are zeros */
            memset(y + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            continue;
        }
        const dr_seq *s = a->rows[i].seq;
        dr_op_conv_step(s->conv + (int64_t)a->layer * s->conv_len, a->u + i * c->C, a->conv_w, a->conv_b, a->K, c->C,
                        c0, c1, y);
        dr_op_silu(y + c0, c1 - c0);
    }
}

static void head_task(void *vctx, int64_t h, int worker) {
    const gdn_ctx *c = vctx;
    const dr_gdn_args *a = c->a;
    int64_t qk = (int64_t)a->nk * a->dk, vd = (int64_t)a->nv * a->dv;
    int kh = (int)(h / (a->nv / a->nk));
    for (int64_t i = 0; i < a->n; i++) {
        if (c->chunk && chunk_at(a, i)) {
            const dr_seq *s = a->rows[i].seq;
            const float *y = a->y + i * c->C;
            float *S = s->rec + (int64_t)a->layer * s->rec_len + h * (int64_t)a->dk * a->dv;
            dr_op_gdn_chunk(S, y + (int64_t)kh * a->dk, y + qk + (int64_t)kh * a->dk, c->C, y + 2 * qk + h * a->dv,
                            c->C, a->a + i * a->nv + h, a->b + i * a->nv + h, a->nv, DR_GDN_CHUNK, a->dk, a->dv,
                            c->chunk + (int64_t)worker * c->chunk_len, a->out + i * vd + h * a->dv, vd, 0);
            i += DR_GDN_CHUNK - 1;
            continue;
        }
        if (held(&a->rows[i])) {
            memset(a->out + i * (int64_t)a->nv * a->dv + h * a->dv, 0, (size_t)a->dv * sizeof(float));
            continue;
        }
        const dr_seq *s = a->rows[i].seq;
        const float *y = a->y + i * c->C;
        float *S = s->rec + (int64_t)a->layer * s->rec_len + h * (int64_t)a->dk * a->dv;
        dr_op_gdn_step(S, y + (int64_t)kh * a->dk, y + qk + (int64_t)kh * a->dk, y + 2 * qk + h * a->dv,
                       a->a[i * a->nv + h], a->b[i * a->nv + h], a->dk, a->dv, c->mem + h * a->dv,
                       a->out + i * (int64_t)a->nv * a->dv + h * a->dv);
    }
}

void dr_cpu_op_deltanet(dr_backend *be, const dr_gdn_args *a) {
    dr_pool *pool = dr_cpu_pool_of(be);
    int64_t n = a->n, nv = a->nv, vd = nv * a->dv, qk = (int64_t)a->nk * a->dk, C = 2 * qk + vd;
    float *mem = dr_alloc((size_t)vd * sizeof(float));
    if (!mem) {
        for (int64_t j = 0; j < n * vd; j++) a->out[j] = NAN;
        return;
    }
    gdn_ctx c = {a, C, mem, NULL, 0};
    if (!a->recurrent && n >= DR_GDN_CHUNK) {
        int n_workers = pool ? dr_pool_threads(pool) : 1;
        c.chunk_len = dr_op_gdn_chunk_scratch(DR_GDN_CHUNK, a->dk, a->dv);
        c.chunk = dr_alloc((size_t)(n_workers * c.chunk_len) * sizeof(float));
        if (!c.chunk) { /* loud, never a silent switch of form */
            for (int64_t j = 0; j < n * vd; j++) a->out[j] = NAN;
            dr_free(mem);
            return;
        }
    }
    dr_pool_run_work(pool, (C + CONV_BLOCK - 1) / CONV_BLOCK, conv_task, &c, (double)n * (double)C * (a->K + 2));
    /* q, k l2-normalised per key head (q also scaled by 1/sqrt(dk)); gates per value head */
    float qscale = 1.0f / sqrtf((float)a->dk);
    for (int64_t i = 0; i < n; i++) {
        float *yi = a->y + i * C;
        for (int h = 0; h < a->nk; h++) {
            dr_op_l2norm(yi + (int64_t)h * a->dk, a->dk, 1e-6f, qscale);
            dr_op_l2norm(yi + qk + (int64_t)h * a->dk, a->dk, 1e-6f, 1.0f);
        }
        dr_op_gdn_gates(a->a + i * nv, a->b + i * nv, a->neg_A, a->dt_bias, nv); /* g (log decay <= 0), beta */
    }
    /* 4 passes over each head's dk x dv state per row; the step's scalar-ish passes cost ~3x a
     * SIMD product per element (measured on the tiny model) */
    dr_pool_run_work(pool, nv, head_task, &c, 3.0 * 4.0 * (double)n * (double)nv * (double)a->dk * (double)a->dv);
    dr_free(c.chunk);
    dr_free(mem);
}
