/* cpu_backend.c - the CPU backend: memory, the element-wise and data-movement ops, the table.
 * The mixers are in cpu_mixers.c, the MoE in cpu_moe.c, the lane (sampling) ops in cpu_lanes.c. */
#include "backend/cpu/cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "base/alloc.h"

/* ---------------- memory ---------------- */

static drama_status cpu_alloc(dr_backend *be, size_t bytes, int zeroed, void **out, drama_error *err) {
    (void)be;
    *out = zeroed ? dr_calloc(bytes ? bytes : 1, 1) : dr_alloc(bytes ? bytes : 1);
    if (!*out) return dr_fail(err, DRAMA_ENOMEM, "cpu backend: out of memory for %zu bytes", bytes);
    return DRAMA_OK;
}

static void cpu_free(dr_backend *be, void *p) {
    (void)be;
    dr_free(p);
}

static drama_status cpu_move(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    (void)be;
    (void)err;
    memmove(dst, src, bytes);
    return DRAMA_OK;
}

static void cpu_copy(dr_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_zero(dr_backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
}

static drama_status cpu_sync(dr_backend *be, drama_error *err) {
    (void)be;
    (void)err;
    return DRAMA_OK;
}

/* ---------------- resident constants: the mapped / bound host objects are used in place ---------------- */

static drama_status cpu_plan(dr_backend *be, const dr_upload_plan *p, drama_error *err) {
    (void)be;
    (void)p;
    (void)err;
    return DRAMA_OK;
}

static size_t cpu_weight_bytes(dr_backend *be, const dr_weight *w) {
    (void)be;
    (void)w;
    return 0;
}

static drama_status cpu_upload_weight(dr_backend *be, const dr_weight *w, drama_error *err) {
    (void)be;
    (void)w;
    (void)err;
    return DRAMA_OK;
}

static drama_status cpu_upload_vec(dr_backend *be, const float *v, int64_t n, drama_error *err) {
    (void)be;
    (void)v;
    (void)n;
    (void)err;
    return DRAMA_OK;
}

static drama_status cpu_run_region(dr_backend *be, const void *owner, uint64_t key, dr_region_fn fn, void *ctx,
                                   drama_error *err) {
    (void)be;
    (void)owner;
    (void)key;
    (void)err;
    fn(ctx);
    return DRAMA_OK;
}

static void cpu_forget_region(dr_backend *be, const void *owner) {
    (void)be;
    (void)owner;
}

/* ---------------- model ops ---------------- */

static void cpu_matmul(dr_backend *be, const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y) {
    dr_cpu_matmul_rows(w, r0, r1, x, n, y, dr_cpu_pool_of(be));
}

static void embed_row(const dr_embed_args *a, const int32_t *row, float *x, float *tmp, double *acc) {
    int64_t H = a->H, tok = row[0];
    int audio = a->sem_start >= 0 && tok >= a->sem_start && tok < a->sem_start + a->n_sem;
    if (!audio) {
        dr_weight_dequant_row(a->embed, tok, x);
        return;
    }
    for (int64_t j = 0; j < H; j++) acc[j] = 0.0;
    if (a->add_token_embedding) {
        dr_weight_dequant_row(a->embed, tok, tmp);
        for (int64_t j = 0; j < H; j++) acc[j] += tmp[j];
    }
    int n = a->in_codebooks;
    for (int k = 0; k < n; k++) {
        dr_weight_dequant_row(a->code_table, (int64_t)row[1 + k] + (int64_t)k * a->code_stride, tmp);
        for (int64_t j = 0; j < H; j++) acc[j] += tmp[j];
    }
    double scale = a->code_scale_rsqrt ? 1.0 / sqrt((double)n + 1.0) : 1.0;
    for (int64_t j = 0; j < H; j++) x[j] = (float)(acc[j] * scale);
}

static void cpu_embed(dr_backend *be, const dr_embed_args *a, const int32_t *rows, int64_t n, float *x) {
    (void)be;
    float *tmp = dr_alloc((size_t)a->H * sizeof(float));
    double *acc = malloc((size_t)a->H * sizeof(double));
    if (!tmp || !acc) {
        for (int64_t j = 0; j < n * a->H; j++) x[j] = NAN; /* no memory: loud, never silent */
    } else {
        for (int64_t i = 0; i < n; i++) embed_row(a, rows + i * a->width, x + i * a->H, tmp, acc);
    }
    dr_free(tmp);
    free(acc);
}

static void cpu_rms_norm(dr_backend *be, const float *x, const float *w, double eps, int64_t dim, int64_t n, float *y) {
    (void)be;
    for (int64_t i = 0; i < n; i++) dr_op_rms_norm(x + i * dim, w, eps, dim, y + i * dim);
}

static void cpu_gated_rms_norm(dr_backend *be, float *x, const float *w, int per_head, const float *z, double eps,
                               int64_t heads, int64_t dv, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t o = (i * heads + h) * dv;
            dr_op_gated_rms_norm(x + o, w + (per_head ? h * dv : 0), z + o, (float)eps, dv);
        }
}

static void cpu_add(dr_backend *be, float *x, const float *y, int64_t count) {
    (void)be;
    for (int64_t j = 0; j < count; j++) x[j] += y[j];
}

static void cpu_swiglu(dr_backend *be, const float *g, const float *u, int64_t count, float *y) {
    (void)be;
    dr_op_swiglu(g, u, count, y);
}

static void cpu_restricted_logits(dr_backend *be, const dr_weight *head, int64_t sem_row, int64_t n_sem,
                                  int64_t end_row, const float *x, int64_t n, float *logits) {
    int64_t nl = n_sem + 1;
    float *tmp = dr_alloc((size_t)(n_sem > 0 ? n_sem : 1) * sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!tmp) {
        for (int64_t j = 0; j < n * nl; j++) logits[j] = NAN;
        return;
    }
    dr_pool *pool = dr_cpu_pool_of(be);
    dr_cpu_matmul_rows(head, sem_row, sem_row + n_sem, x, n, tmp, pool);
    for (int64_t i = 0; i < n; i++) memcpy(logits + i * nl, tmp + i * n_sem, (size_t)n_sem * sizeof(float));
    dr_cpu_matmul_rows(head, end_row, end_row + 1, x, n, tmp, pool);
    for (int64_t i = 0; i < n; i++) logits[i * nl + n_sem] = tmp[i];
    dr_free(tmp);
}

static void set_status(dr_op_status *s, drama_status code, dr_fault fault, int32_t a, int32_t b, int64_t c) {
    if (!s || s->code) return; /* the first failure is kept */
    s->code = code;
    s->fault = fault;
    s->a = a;
    s->b = b;
    s->c = c;
}

static void cpu_tower_input(dr_backend *be, const dr_tower_in_args *a) {
    (void)be;
    int64_t de = a->de, dh = a->dh, xw = de + dh;
    for (int64_t r = 0; r < a->n; r++) {
        float *e = a->e + r * de;
        float *x = a->x + r * xw;
        float *xe = a->hidden_first ? x + dh : x;
        float *xh = a->hidden_first ? x : x + de;
        int on = !a->masked_all && (!a->mask || a->mask[r]);
        int32_t cd = on ? a->codes[r * a->codes_ld] : 0;
        int64_t row = (int64_t)cd + (int64_t)a->slot * a->code_stride;
        if (on && (cd < 0 || cd >= a->code_stride || row >= a->code_table->rows)) {
            set_status(a->status ? &a->status[r] : NULL, DRAMA_EINVAL, DR_FAULT_CODE, cd, a->slot, a->layer);
            on = 0;
        }
        /* rms(0) = 0, so a masked row contributes nothing */
        if (on) {
            dr_weight_dequant_row(a->code_table, row, e);
            dr_op_rms_norm(e, a->enorm, a->eps, de, xe);
        } else {
            memset(xe, 0, (size_t)de * sizeof(float));
        }
        dr_op_rms_norm(a->h + r * dh, a->hnorm, a->eps, dh, xh);
    }
}

static void cpu_check_finite(dr_backend *be, const float *x, int64_t width, int64_t n, dr_op_status *status) {
    (void)be;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < width; i++)
            if (!isfinite(x[r * width + i])) {
                set_status(&status[r], DRAMA_ENUMERIC, DR_FAULT_HIDDEN, (int32_t)i, 0, 0);
                break;
            }
}

static int held(const dr_seq_row *r) { return r->hold && *r->hold; }

static void cpu_scatter_rows(dr_backend *be, const float *src, int64_t width, int64_t n, float *const *dst,
                             int64_t dst_off, const dr_seq_row *rows) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        if (dst[i] && !(rows && held(&rows[i])))
            memcpy(dst[i] + dst_off, src + i * width, (size_t)width * sizeof(float));
}

static void cpu_gather_rows(dr_backend *be, float *dst, int64_t width, int64_t n, const float *const *src) {
    (void)be;
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * width, src[i], (size_t)width * sizeof(float));
}

static void cpu_advance(dr_backend *be, const dr_seq_row *rows, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++)
        if (!held(&rows[i])) rows[i].seq->pos++;
}

/* ---------------- the table ---------------- */

static const dr_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_move,
    .download = cpu_move,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .plan = cpu_plan,
    .weight_bytes = cpu_weight_bytes,
    .upload_weight = cpu_upload_weight,
    .upload_vec = cpu_upload_vec,
    .run_region = cpu_run_region,
    .forget_region = cpu_forget_region,
    .matmul = cpu_matmul,
    .embed = cpu_embed,
    .rms_norm = cpu_rms_norm,
    .gated_rms_norm = cpu_gated_rms_norm,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .attention = dr_cpu_op_attention,
    .deltanet = dr_cpu_op_deltanet,
    .moe = dr_cpu_op_moe,
    .restricted_logits = cpu_restricted_logits,
    .tower_input = cpu_tower_input,
    .check_finite = cpu_check_finite,
    .scatter_rows = cpu_scatter_rows,
    .gather_rows = cpu_gather_rows,
    .advance = cpu_advance,
    .guidance = dr_cpu_op_guidance,
    .sample_semantic = dr_cpu_op_sample_semantic,
    .sample_acoustic = dr_cpu_op_sample_acoustic,
    .frame_rows = dr_cpu_op_frame_rows,
    .bandwidth = NULL,
};

const dr_backend_ops *dr_backend_cpu_ops(void) { return &cpu_ops; }

void dr_backend_cpu_init(dr_backend *be, dr_cpu_backend *impl, dr_pool *pool) {
    memset(be, 0, sizeof *be);
    memset(impl, 0, sizeof *impl);
    impl->pool = pool;
    be->kind = DR_BACKEND_CPU;
    be->name = "cpu";
    be->host_memory = 1;
    be->ops = &cpu_ops;
    be->impl = impl;
    snprintf(be->description, sizeof be->description, "cpu (%s, %d thread%s)", dr_cpu_path_name(dr_cpu_best_path()),
             pool ? dr_pool_threads(pool) : 1, pool && dr_pool_threads(pool) > 1 ? "s" : "");
}

void dr_backend_cpu_release(dr_backend *be) {
    if (!be || !be->impl) return;
    dr_sample_ws_free(&((dr_cpu_backend *)be->impl)->ws);
}

typedef struct cpu_heap {
    dr_backend be;
    dr_cpu_backend impl;
} cpu_heap;

static void cpu_destroy(dr_backend *be) {
    dr_backend_cpu_release(be);
    free(be); /* be is the first member of its cpu_heap */
}

drama_status dr_backend_cpu_create(dr_pool *pool, dr_backend **out, drama_error *err) {
    *out = NULL;
    cpu_heap *h = calloc(1, sizeof *h);
    if (!h) return dr_fail(err, DRAMA_ENOMEM, "cpu backend: out of memory");
    dr_backend_cpu_init(&h->be, &h->impl, pool);
    h->be.destroy = cpu_destroy;
    *out = &h->be;
    return DRAMA_OK;
}

dr_backend *dr_cpu_call_begin(dr_cpu_call *c, dr_backend *be, dr_pool *pool) {
    if (be) return c->be = be;
    dr_backend_cpu_init(&c->cpu, &c->impl, pool);
    return c->be = &c->cpu;
}

void dr_cpu_call_end(dr_cpu_call *c) {
    if (c->be == &c->cpu) dr_backend_cpu_release(&c->cpu);
}

static dr_cpu_backend memory_impl;
static dr_backend memory_be = {.kind = DR_BACKEND_CPU, .name = "cpu", .host_memory = 1, .ops = &cpu_ops,
                               .impl = &memory_impl, .description = "cpu (memory only)"};

dr_backend *dr_backend_cpu_memory(void) { return &memory_be; }

dr_pool *dr_backend_cpu_pool(const dr_backend *be) {
    return be && be->kind == DR_BACKEND_CPU ? ((const dr_cpu_backend *)be->impl)->pool : NULL;
}
