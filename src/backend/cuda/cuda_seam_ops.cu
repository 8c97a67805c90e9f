/* cuda_seam_ops.cu - the model and lane ops of the CUDA backend (backend.h's table), each a call of
 * the device kernels that `drama contract` checks (cuda_ops.h, cuda_seam_kernels.h), with the
 * model's host objects (weights, fp32 vectors, MoE tables) resolved to their resident twins.
 *
 * Queued products: matmul appends to a queue that is launched (cs_flush) before any other op, when
 * a product would read or overwrite what a queued one touches, or when 16 wait; the queue becomes
 * one launch per weight format. An add whose source is a queued product's output becomes that
 * product's second store (y2 += acc), unless a queued product reads the add's target.
 *
 * Fused norms: a one-row rms_norm is held back (b->pnorm); the products that read exactly its
 * output take its input and stage the norm themselves (dr_cuda_job.norm, bit-identical to the norm
 * kernel) and write the output too; any other op first launches the norm if no product took it. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_seam_impl.h"
#include "backend/cuda/gemm.h"

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = (const char *)a, *y = (const char *)b;
    return x < y + bn && y < x + an;
}

static size_t job_y_bytes(const dr_cuda_job *j) { return (size_t)j->n * (size_t)(j->r1 - j->r0) * sizeof(float); }
static size_t job_x_bytes(const dr_cuda_job *j) { return (size_t)j->n * (size_t)dr_cuda_weight_cols(j->w) * sizeof(float); }

void cs_prof_begin(cs_impl *b) {
    if (b->profile && !b->capturing) cudaEventRecord(b->ev0, b->c->stream);
}

void cs_prof_end_bytes(cs_impl *b, int kind, double bytes) {
    if (!b->profile || b->capturing) return;
    float ms = 0;
    cudaEventRecord(b->ev1, b->c->stream);
    cudaEventSynchronize(b->ev1);
    cudaEventElapsedTime(&ms, b->ev0, b->ev1);
    int r = b->in_region != 0;
    b->prof_ms[r][kind] += ms;
    b->prof_bytes[r][kind] += bytes;
    b->prof_n[r][kind]++;
}

void cs_prof_end(cs_impl *b, int kind) { cs_prof_end_bytes(b, kind, 0); }

/* stored bytes of the rows a job reads */
static double job_w_bytes(const dr_cuda_job *j) {
    int64_t rows = dr_cuda_weight_rows(j->w);
    return rows > 0 ? (double)dr_cuda_weight_device_bytes(j->w) * (double)(j->r1 - j->r0) / (double)rows : 0.0;
}

static void check(cs_impl *b, drama_status st, const drama_error *e);

/* the held-back norm as its own launch, unless a launched product wrote it */
static void pnorm_resolve(cs_impl *b) {
    if (!b->pnorm.active) return;
    b->pnorm.active = 0;
    if (b->pnorm.used) return;
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_rms_norm(b->c, b->pnorm.x, b->pnorm.dim, b->pnorm.w, b->pnorm.eps, 1, b->pnorm.dim, b->pnorm.y,
                              b->pnorm.dim, &e),
          &e);
    cs_prof_end(b, CSP_NORM);
}

void cs_flush(cs_impl *b) {
    if (!b->n_pend) {
        pnorm_resolve(b);
        return;
    }
    drama_error e = {};
    /* many rows with BF16 weights outside a frame step (a prefill): the tensor-core product (gemm.h;
     * each weight read once for up to 64 rows); the queued jobs are independent, so they may launch
     * in two groups */
    dr_cuda_job tc[CS_MAX_PENDING];
    int ntc = 0, nrest = 0;
    double wtc = 0;
    for (int i = 0; i < b->n_pend; i++) {
        if (b->tc_on && !b->in_step && b->pend[i].n >= DR_CUDA_GEMM_MIN_N && dr_cuda_gemm_ok(&b->pend[i]))
            tc[ntc++] = b->pend[i], wtc += job_w_bytes(&b->pend[i]);
        else b->pend[nrest++] = b->pend[i];
    }
    drama_status st = DRAMA_OK;
    if (ntc) {
        cs_prof_begin(b);
        st = dr_cuda_gemm_batch(b->c, tc, ntc, 0, &e);
        cs_prof_end_bytes(b, CSP_GEMM, wtc);
    }
    b->n_pend = nrest;
    double wb = 0;
    int all1 = 1;
    for (int i = 0; i < b->n_pend; i++) wb += job_w_bytes(&b->pend[i]), all1 &= b->pend[i].n == 1;
    if (!st && b->n_pend) {
        cs_prof_begin(b);
        st = dr_cuda_matmul_batch(b->c, b->pend, b->n_pend, &e);
        cs_prof_end_bytes(b, all1 ? CSP_MATMUL1 : CSP_MATMUL, wb);
    }
    b->n_pend = 0;
    if (st) cs_fail(b, st, &e);
    pnorm_resolve(b);
}

static void check(cs_impl *b, drama_status st, const drama_error *e) {
    if (st) cs_fail(b, st, e);
}

/* ---------------- products ---------------- */

static void op_matmul(dr_backend *be, const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y) {
    cs_impl *b = CS(be);
    if (n <= 0 || r1 <= r0) return;
    const dr_cuda_weight *d = cs_weight(b, w);
    if (!d) return;
    dr_cuda_job j = {d, x, n, y, r0, r1, 0, 0, NULL, NULL, 0, 0, NULL};
    if (b->pnorm.active) { /* a product of the held-back norm's output stages the norm itself */
        size_t nb = (size_t)b->pnorm.dim * sizeof(float), ob = job_y_bytes(&j);
        if (n == 1 && x == b->pnorm.y && dr_cuda_weight_cols(d) == b->pnorm.dim && !overlap(y, ob, b->pnorm.x, nb) &&
            !overlap(y, ob, b->pnorm.y, nb)) {
            j.x = b->pnorm.x;
            j.norm = 1, j.norm_w = b->pnorm.w, j.norm_eps = b->pnorm.eps, j.norm_y = b->pnorm.y;
            b->pnorm.used = 1;
        } else {
            cs_flush(b); /* launches the norm (or its products) first */
        }
    }
    size_t xb = job_x_bytes(&j), yb = job_y_bytes(&j);
    for (int i = 0; i < b->n_pend; i++) {
        const dr_cuda_job *p = &b->pend[i];
        size_t pyb = job_y_bytes(p);
        if (overlap(p->y, pyb, x, xb) || overlap(p->y, pyb, y, yb) || overlap(p->x, job_x_bytes(p), y, yb) ||
            (p->y2 && (overlap(p->y2, pyb, x, xb) || overlap(p->y2, pyb, y, yb)))) {
            cs_flush(b);
            break;
        }
    }
    if (b->n_pend == CS_MAX_PENDING) cs_flush(b);
    b->pend[b->n_pend++] = j;
}

static void op_restricted_logits(dr_backend *be, const dr_weight *head, int64_t sem_row, int64_t n_sem, int64_t end_row,
                                 const float *x, int64_t n, float *logits) {
    cs_impl *b = CS(be);
    cs_flush(b);
    const dr_cuda_weight *d = cs_weight(b, head);
    if (!d || n <= 0) return;
    dr_cuda_job jobs[2] = {{d, x, n, logits, sem_row, sem_row + n_sem, n_sem + 1, 0, NULL, NULL, 0, 0, NULL},
                           {d, x, n, logits + n_sem, end_row, end_row + 1, n_sem + 1, 0, NULL, NULL, 0, 0, NULL}};
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_matmul_batch(b->c, jobs, 2, &e), &e);
    cs_prof_end_bytes(b, CSP_LOGITS, job_w_bytes(&jobs[0]) + job_w_bytes(&jobs[1]));
}

/* ---------------- element-wise ---------------- */

static void op_add(dr_backend *be, float *x, const float *y, int64_t count) {
    cs_impl *b = CS(be);
    size_t xb = (size_t)count * sizeof(float);
    for (int i = 0; i < b->n_pend; i++) { /* the residual add of a queued product's output */
        dr_cuda_job *p = &b->pend[i];
        if (p->y != y || p->y2 || (int64_t)(job_y_bytes(p) / sizeof(float)) != count) continue;
        int clash = 0;
        for (int k = 0; k < b->n_pend; k++)
            clash |= overlap(b->pend[k].x, job_x_bytes(&b->pend[k]), x, xb) ||
                     (k != i && (overlap(b->pend[k].y, job_y_bytes(&b->pend[k]), x, xb) ||
                                 (b->pend[k].y2 && overlap(b->pend[k].y2, job_y_bytes(&b->pend[k]), x, xb))));
        if (clash) break;
        p->y2 = x;
        return;
    }
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_add(b->c, x, y, count, &e), &e);
    cs_prof_end(b, CSP_ELEMENT);
}

static void op_swiglu(dr_backend *be, const float *g, const float *u, int64_t count, float *y) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_swiglu(b->c, g, u, count, y, &e), &e);
    cs_prof_end(b, CSP_ELEMENT);
}

static void op_rms_norm(dr_backend *be, const float *x, const float *w, double eps, int64_t dim, int64_t n, float *y) {
    cs_impl *b = CS(be);
    cs_flush(b);
    const float *wd = w ? cs_vec(b, w) : NULL;
    if (w && !wd) return;
    size_t nb = (size_t)dim * sizeof(float);
    if (b->fuse_norm && n == 1 && dim <= DR_CUDA_NORM_MAX_COLS && !overlap(x, nb, y, nb)) {
        b->pnorm.x = x, b->pnorm.w = wd, b->pnorm.y = y, b->pnorm.eps = eps, b->pnorm.dim = dim;
        b->pnorm.active = 1, b->pnorm.used = 0;
        return;
    }
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_rms_norm(b->c, x, dim, wd, eps, n, dim, y, dim, &e), &e);
    cs_prof_end(b, CSP_NORM);
}

static void op_gated_rms_norm(dr_backend *be, float *x, const float *w, int per_head, const float *z, double eps,
                              int64_t heads, int64_t dv, int64_t n) {
    cs_impl *b = CS(be);
    cs_flush(b);
    const float *wd = cs_vec(b, w);
    if (!wd) return;
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_gated_norm(b->c, x, wd, per_head, z, eps, heads, dv, n, &e), &e);
    cs_prof_end(b, CSP_NORM);
}

static void op_embed(dr_backend *be, const dr_embed_args *a, const int32_t *rows, int64_t n, float *x) {
    cs_impl *b = CS(be);
    cs_flush(b);
    const dr_cuda_weight *tok = cs_weight(b, a->embed);
    const dr_cuda_weight *codes = a->in_codebooks > 0 ? cs_weight(b, a->code_table) : NULL;
    if (!tok || (a->in_codebooks > 0 && !codes)) return;
    dr_cuda_embed_params p = {a->sem_start, a->n_sem, a->width, a->in_codebooks, a->code_stride, a->add_token_embedding,
                              a->code_scale_rsqrt ? 1.0 / sqrt((double)a->in_codebooks + 1.0) : 1.0};
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_embed(b->c, tok, codes, &p, rows, n, x, NULL, &e), &e);
    cs_prof_end(b, CSP_EMBED);
}

/* ---------------- mixers and the MoE ---------------- */

/* a workspace of at least `bytes`, grown only outside recorded regions */
static void *workspace(cs_impl *b, void **ws, size_t *have, size_t bytes) {
    if (*have >= bytes) return *ws;
    if (b->capturing) {
        cs_failf(b, DRAMA_EINTERNAL, "workspace growth inside a recorded region");
        return NULL;
    }
    cudaStreamSynchronize(b->c->stream);
    dr_cuda_free(b->c, *ws);
    *ws = NULL;
    *have = 0;
    drama_error e = {};
    size_t want = bytes + bytes / 2;
    if (dr_cuda_malloc(b->c, want, ws, &e)) {
        cs_fail(b, DRAMA_ENOMEM, &e);
        return NULL;
    }
    *have = want;
    return *ws;
}

static void op_attention(dr_backend *be, const dr_attn_args *a) {
    cs_impl *b = CS(be);
    cs_flush(b);
    if (a->n <= 0) return;
    const float *freq = a->rope_half ? cs_vec(b, a->rope_freq) : NULL;
    const float *qn = a->q_norm ? cs_vec(b, a->q_norm) : NULL, *kn = a->k_norm ? cs_vec(b, a->k_norm) : NULL;
    if ((a->rope_half && !freq) || (a->q_norm && !qn) || (a->k_norm && !kn)) return;
    /* the score scale as each CPU form computes it: double for the tower, fp32 for the backbone */
    double scale = a->f64 ? 1.0 / sqrt((double)a->hd) : (double)(1.0f / sqrtf((float)a->hd));
    dr_cuda_attn_shape s = {a->nh, a->nkv, a->hd, a->rope_half, a->rope_interleaved, freq, qn, kn, a->eps, scale};
    size_t need = dr_cuda_attn_ws_bytes(&s, a->n, 0);
    void *ws = workspace(b, &b->attn_ws, &b->attn_ws_bytes, need);
    if (!ws) return;
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_attention(b->c, &s, a->rows, a->layer, a->n, a->q, a->q_stride, a->q_head_stride, a->k, a->v,
                                    a->kv_stride, a->gated && !a->f64, ws, b->attn_ws_bytes, a->out, &e),
          &e);
    cs_prof_end(b, CSP_ATTN);
}

static void op_deltanet(dr_backend *be, const dr_gdn_args *a) {
    cs_impl *b = CS(be);
    cs_flush(b);
    if (a->n <= 0) return;
    const float *cw = cs_vec(b, a->conv_w), *cb = a->conv_b ? cs_vec(b, a->conv_b) : NULL;
    const float *na = cs_vec(b, a->neg_A), *dt = cs_vec(b, a->dt_bias);
    if (!cw || (a->conv_b && !cb) || !na || !dt) return;
    dr_cuda_gdn_shape s = {a->nk, a->dk, a->nv, a->dv, a->K, cw, cb, na, dt, NULL, 0, 0.0};
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_deltanet(b->c, &s, a->rows, a->layer, a->n, 2, a->u, a->y, a->a, a->b, a->out, &e), &e);
    cs_prof_end(b, CSP_GDN);
}

/* The layer's device tables, made at its first call (a prefill: never inside a recorded region). */
static const dr_cuda_moe *moe_tables(cs_impl *b, const dr_moe_args *a) {
    dr_cuda_moe *m = (dr_cuda_moe *)cs_map_get(&b->moes, a->w);
    if (m) return m;
    if (b->capturing) {
        cs_failf(b, DRAMA_EINTERNAL, "MoE tables first needed inside a recorded region");
        return NULL;
    }
    const dr_moe_weights *w = a->w;
    int k = w->n_kept;
    const dr_cuda_weight **g = (const dr_cuda_weight **)calloc((size_t)k, sizeof *g);
    const dr_cuda_weight **u = (const dr_cuda_weight **)calloc((size_t)k, sizeof *u);
    const dr_cuda_weight **gu = (const dr_cuda_weight **)calloc((size_t)k, sizeof *gu);
    const dr_cuda_weight **dn = (const dr_cuda_weight **)calloc((size_t)k, sizeof *dn);
    int ok = g && u && gu && dn, fused = k > 0 && w->experts[0].fused;
    for (int i = 0; ok && i < k; i++) {
        const dr_moe_expert *x = &w->experts[i];
        if (x->fused != fused) {
            cs_failf(b, DRAMA_EUNSUPPORTED, "MoE layer mixes fused and per-expert layouts");
            ok = 0;
            break;
        }
        if (fused) ok = (gu[i] = cs_weight(b, &x->gate_up)) != NULL;
        else ok = (g[i] = cs_weight(b, &x->gate)) && (u[i] = cs_weight(b, &x->up));
        ok = ok && (dn[i] = cs_weight(b, &x->down));
    }
    dr_cuda_moe_desc d = {a->E, a->topk, a->norm_topk, k, a->H, a->I, a->Is, w->slot, g, u, gu, dn, fused,
                          ok ? cs_weight(b, &w->router) : NULL, ok ? cs_weight(b, &w->sh_gate) : NULL,
                          ok ? cs_weight(b, &w->sh_up) : NULL, ok ? cs_weight(b, &w->sh_down) : NULL,
                          ok ? cs_weight(b, &w->sh_gate_proj) : NULL};
    drama_error e = {};
    if (ok && !dr_cuda_moe_create(b->c, &d, &m, &e)) {
        if (cs_map_put(&b->moes, a->w, m)) {
            dr_cuda_moe_free(m);
            m = NULL;
            cs_failf(b, DRAMA_ENOMEM, "out of host memory");
        }
    } else if (ok) {
        cs_fail(b, DRAMA_EINTERNAL, &e);
    }
    free(g), free(u), free(gu), free(dn);
    return m;
}

static void op_moe(dr_backend *be, const dr_moe_args *a) {
    cs_impl *b = CS(be);
    cs_flush(b);
    if (a->n <= 0) return;
    const dr_cuda_moe *m = moe_tables(b, a);
    if (!m) return;
    void *ws = workspace(b, &b->moe_ws, &b->moe_ws_bytes, dr_cuda_moe_ws_bytes(m, a->n));
    if (!ws) return;
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_moe(b->c, m, a->n, a->x, a->out, ws, b->moe_ws_bytes, a->layer,
                                b->tc_on && !b->in_step, a->status, &e), &e);
    cs_prof_end(b, CSP_MOE);
}

/* ---------------- the tower's input, checks and data movement ---------------- */

static void op_tower_input(dr_backend *be, const dr_tower_in_args *a) {
    cs_impl *b = CS(be);
    cs_flush(b);
    const dr_cuda_weight *t = cs_weight(b, a->code_table);
    const float *en = cs_vec(b, a->enorm), *hn = cs_vec(b, a->hnorm);
    if (!t || !en || !hn) return;
    dr_cuda_tower_in p = {t, a->code_stride, a->slot, en, hn, a->de, a->dh, a->eps, a->hidden_first, a->masked_all};
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_tower_input_rows(b->c, &p, a->layer, a->n, a->codes, a->codes_ld, a->mask, a->h, a->x, a->status, &e),
          &e);
    cs_prof_end(b, CSP_TOWER_IN);
}

static void op_check_finite(dr_backend *be, const float *x, int64_t width, int64_t n, dr_op_status *status) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_check_finite(b->c, x, width, n, status, &e), &e);
    cs_prof_end(b, CSP_MOVE);
}

static void op_scatter_rows(dr_backend *be, const float *src, int64_t width, int64_t n, float *const *dst, int64_t dst_off,
                            const dr_seq_row *rows) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_scatter_rows(b->c, src, width, n, dst, dst_off, rows, &e), &e);
    cs_prof_end(b, CSP_MOVE);
}

static void op_gather_rows(dr_backend *be, float *dst, int64_t width, int64_t n, const float *const *src) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_gather_rows(b->c, dst, width, n, src, &e), &e);
    cs_prof_end(b, CSP_MOVE);
}

static void op_advance(dr_backend *be, const dr_seq_row *rows, int64_t n) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_advance(b->c, rows, n, &e), &e);
    cs_prof_end(b, CSP_MOVE);
}

/* ---------------- the frame step's lane ops ---------------- */

static void op_guidance(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_lanes_guidance(b->c, lanes, n, n_cand, &e), &e);
    cs_prof_end(b, CSP_GUIDE);
}

static void op_sample_semantic(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand, dr_step_io io) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_sample_semantic(b->c, lanes, n, n_cand, io, &e), &e);
    cs_prof_end(b, CSP_SEMANTIC);
}

static void op_sample_acoustic(dr_backend *be, const dr_step_lane *lanes, int n, int codebook, const float *logits,
                               int head_vocab, dr_step_io io) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_sample_acoustic(b->c, lanes, n, codebook, logits, head_vocab, io, &e), &e);
    cs_prof_end(b, CSP_ACOUSTIC);
}

static void op_frame_rows(dr_backend *be, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                          int64_t sem_start, int32_t *rows) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_error e = {};
    cs_prof_begin(b);
    check(b, dr_cuda_seam_frame_rows(b->c, codes, lane_of_row, m, nc, sem_start, rows, &e), &e);
    cs_prof_end(b, CSP_MOVE);
}

/* ---------------- the table ---------------- */

static dr_backend_ops table;
static int table_ready;

const dr_backend_ops *cs_ops_table(void) {
    if (table_ready) return &table;
    cs_fill_table(&table);
    table.matmul = op_matmul;
    table.embed = op_embed;
    table.rms_norm = op_rms_norm;
    table.gated_rms_norm = op_gated_rms_norm;
    table.add = op_add;
    table.swiglu = op_swiglu;
    table.attention = op_attention;
    table.deltanet = op_deltanet;
    table.moe = op_moe;
    table.restricted_logits = op_restricted_logits;
    table.tower_input = op_tower_input;
    table.check_finite = op_check_finite;
    table.scatter_rows = op_scatter_rows;
    table.gather_rows = op_gather_rows;
    table.advance = op_advance;
    table.guidance = op_guidance;
    table.sample_semantic = op_sample_semantic;
    table.sample_acoustic = op_sample_acoustic;
    table.frame_rows = op_frame_rows;
    table_ready = 1;
    return &table;
}

drama_status dr_cuda_kernels_init(dr_cuda *c, drama_error *err) {
    (void)c;
    drama_status st = dr_cuda_attn_init(err);
    return st ? st : dr_cuda_sample_init(err);
}
