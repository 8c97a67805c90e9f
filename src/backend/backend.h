/* backend.h - the backend seam: the coarse operations the model (src/model) and the frame step
 * (src/gen/framestep.c) are written against, on memory the backend owns. docs/cuda.md
 * ("The backend seam") explains the design; this header is the contract.
 *
 * A dr_backend is a kind, a table of function pointers (dr_backend_ops) and the backend's own
 * state. The CPU backend (backend/cpu/cpu_backend.h) implements every op with the kernels of
 * backend/cpu/{matmul,ops}.h; the CUDA backend implements the same table with device kernels.
 * The model never knows which one runs: it allocates through the backend, moves data only
 * through upload/download/copy, and computes only through the ops.
 *
 * Three kinds of pointers cross the seam:
 *   - backend memory (activations, states, tables; from alloc): device pointers on CUDA, host
 *     pointers on the CPU. Callers may offset them (pointer arithmetic) but never dereference them.
 *   - model constants: `const dr_weight *` and the fp32 vectors of the bound model (norm weights,
 *     conv kernels, -exp(A_log), dt_bias, RoPE frequencies), passed as the host objects the model
 *     was bound with, always whole (never offset). A backend resolves them to its resident copy,
 *     made once by dr_model_upload (model/upload.h) through upload_weight / upload_vec; the CPU
 *     backend uses them in place.
 *   - host memory: only the src of upload, the dst of download, and the args structs themselves
 *     (read when the op is issued).
 *
 * Ops are queued and return nothing: errors of queued work (a failed launch, an out-of-memory
 * inside an op) are reported by sync; data-dependent failures (a router without a finite score,
 * a NaN logit, a code out of range) are written to dr_op_status arrays in backend memory that
 * the host reads after the call. Nothing inside a frame step reads backend memory on the host,
 * so a backend may record a frame step once (run_region) and replay it: positions, lengths,
 * counters and flags are backend memory (dr_seq, dr_gen_lane) that the ops read and update.
 *
 * Determinism (CPU, and the contract any backend states against): row i of every op's output
 * depends only on row i of its inputs and its own state, never on the other rows of the call.
 */
#ifndef DRAMA_BACKEND_BACKEND_H
#define DRAMA_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "num/weight.h"

typedef struct dr_backend dr_backend;

typedef enum dr_backend_kind { DR_BACKEND_CPU = 0, DR_BACKEND_CUDA = 1 } dr_backend_kind;

/* ---------------- data the ops read and write (backend memory) ---------------- */

/* Per-row / per-lane failure, the first one kept (code 0 = none). The host formats the message
 * (dr_draw_fail below for draws; model/ and gen/ for the rest) after the call. */
typedef enum dr_fault {
    DR_FAULT_NONE = 0,
    DR_FAULT_ROUTER,       /* a = layer: the router gave no finite score */
    DR_FAULT_HIDDEN,       /* a = element index: non-finite tower input */
    DR_FAULT_CODE,         /* a = code, b = codebook slot, c = tower layer: code outside the table */
    DR_FAULT_DRAW          /* a = draw (dr_draw_kind), b = dr_draw_reason, c = frame f, d = candidate */
} dr_fault;

typedef struct dr_op_status {
    int32_t code;          /* drama_status */
    int32_t fault;         /* dr_fault */
    int32_t a, b;
    int64_t c, d;
} dr_op_status;

/* One sequence's cache: the backbone's per-request state (K/V of the attention layers, conv
 * window and recurrent matrix of the DeltaNet layers) or a tower cache (K/V only). The host
 * writes it when the cache is created or grows (between frames, never inside one); the ops read
 * the pointers and advance pos. All K/V of a sequence is one block so a lane is one pointer. */
typedef struct dr_seq {
    float *kv;             /* attention layer l: K at kv + 2*l*cap*kv_dim, V at + cap*kv_dim */
    float *conv;           /* DeltaNet layer l: window [K-1][C] at conv + l*conv_len, oldest first */
    float *rec;            /* DeltaNet layer l: [nv][dk][dv] at rec + l*rec_len */
    int64_t cap;           /* positions the K/V area holds */
    int64_t pos;           /* rows consumed = position of the next row */
    int64_t kv_dim, conv_len, rec_len;
} dr_seq;

/* One row of a call: its sequence and position. hold != NULL with *hold != 0 (a lane whose
 * semantic draw ended it in this frame step) means: leave seq unchanged for this row; its
 * outputs are unspecified, and no op fails or disturbs another row because of them. */
typedef struct dr_seq_row {
    dr_seq *seq;
    int64_t off;           /* the row's position is seq->pos + off */
    const int32_t *hold;
} dr_seq_row;

static inline float *dr_seq_k(const dr_seq *s, int layer) { return s->kv + (int64_t)2 * layer * s->cap * s->kv_dim; }
static inline float *dr_seq_v(const dr_seq *s, int layer) { return dr_seq_k(s, layer) + s->cap * s->kv_dim; }

/* Sampling settings of one request (TEXT.md 5.7). */
typedef struct dr_sampler_params {
    float temperature;     /* 0..2; 0 = argmax for every draw (and no redraw) */
    float top_p;           /* (0, 1]; 1 disables */
    int semantic_top_k;    /* 0..4097; 0 = off */
    int acoustic_top_k;    /* 0..1024; 0 = off */
    int ras_window;        /* 0..64; 0 disables the repetition-aware redraw */
    float ras_temperature; /* (0, 2] */
    float ras_top_p;       /* (0, 1] */
    float cfg_gamma;       /* 0..5; 0 = no guidance */
    uint64_t seed;         /* any 64-bit value */
    int frame_cap;         /* >= 1, default 750 */
} dr_sampler_params;

#define DR_RAS_MAX 64      /* the largest ras_window */
#define DR_MAX_CODEBOOKS 16

/* A session's device-side generation state: plain data (a clone is a copy). */
typedef struct dr_gen_lane {
    dr_sampler_params sp;
    uint64_t draw;         /* index f of the next semantic draw (draw_base + draws made) */
    int32_t window_len;    /* semantic codes of this batch's frames, oldest first */
    int32_t window[DR_RAS_MAX];
} dr_gen_lane;

/* One session of a frame step (built by the host when the step's sessions change). */
typedef struct dr_step_lane {
    dr_gen_lane *g;
    float *logits_c, *logits_u;  /* [n_cand] restricted logits of the conditional / unconditional state */
    float *logits;               /* [n_cand] what the semantic draw uses (after guidance) */
    float *pend_h;               /* [H] the hidden the next tower chain starts from */
    float *head_logits;          /* [NC-1][head_vocab] of the last frame */
    int32_t guided;
    int32_t pad_;
} dr_step_lane;

/* What one frame step leaves for its n lanes (backend memory; the host downloads it after the
 * step). The arrays are the step's own, so their addresses stay fixed while it is replayed. */
typedef struct dr_step_io {
    int32_t *codes;            /* [n][DR_MAX_CODEBOOKS]: the frame c0..c_{NC-1} (c0 = 0 when ended) */
    int32_t *ended;            /* [n]: the semantic draw gave the end token */
    dr_op_status *status;      /* [n]: first failure of the draws and the tower chain */
} dr_step_io;

/* Draw kinds and reasons (DR_FAULT_DRAW). */
typedef enum dr_draw_kind { DR_DRAW_SEMANTIC = 0, DR_DRAW_REDRAW = -1 /* codebook j: j >= 1 */ } dr_draw_kind;
typedef enum dr_draw_reason {
    DR_DRAW_NAN = 1,       /* d = candidate */
    DR_DRAW_POSINF,        /* d = candidate */
    DR_DRAW_ALL_EXCLUDED,
    DR_DRAW_SCRATCH,       /* d = candidates beyond the sampler's scratch (internal) */
    DR_DRAW_SLOT           /* codebook outside the RNG slots (internal) */
} dr_draw_reason;

/* The message of a draw failure: "<what>: <reason>", what = "semantic draw of frame F",
 * "semantic redraw of frame F" or "codebook J draw of frame F" (what_override replaces it).
 * Returns s->code. */
drama_status dr_draw_fail(const dr_op_status *s, const char *what_override, drama_error *err);

/* ---------------- op arguments (host structs, read when the op is issued) ---------------- */

/* Input embedding of backbone rows [token, c0..c_{NC-1}] (MODEL.md 6). Rows are valid (checked
 * by the caller). x = E_tok[token] at text rows; at audio rows (E_tok[token] if add_token +
 * sum_{k<in_codebooks} E_code[c_k + k*V]) * scale, summed in double, rounded once. */
typedef struct dr_embed_args {
    const dr_weight *embed, *code_table;
    int64_t H, sem_start, n_sem, code_stride;
    int width;                 /* row width 1 + NC */
    int in_codebooks, add_token_embedding, code_scale_rsqrt;
} dr_embed_args;

/* Attention over a K/V cache, decode and prefill alike (MODEL.md 5.3, TOWER-H1.md): per row
 * and head, q and k get their RMS norm (when given) and RoPE at the row's position; every new
 * K/V is written at its position before any row attends (rows of one sequence see each other
 * causally); each query attends over positions 0..its own; gated: o *= sigmoid(gate). */
typedef struct dr_attn_args {
    const dr_seq_row *rows;
    int64_t n;
    int layer;                 /* K/V slot in the sequence */
    int nh, nkv, hd;
    float *q;                  /* head j of row i at q + i*q_stride + j*q_head_stride (gate at + hd) */
    int64_t q_stride, q_head_stride;
    float *k, *v;              /* the rows' new keys / values: row i at + i*kv_stride, head m at + m*hd */
    int64_t kv_stride;
    const float *q_norm, *k_norm; /* [hd] weights (offset added) or NULL: no norm */
    double eps;
    const float *rope_freq;    /* [rope_half] */
    int rope_half;             /* rotated pairs */
    int rope_interleaved;      /* 0: pairs (x[i], x[i+half]); 1: (x[2i], x[2i+1]) */
    int gated;
    int f64;                   /* 0: fp32 scores (backbone); 1: float64 accumulation (tower) */
    float *out;                /* [n][nh*hd] */
} dr_attn_args;

/* Gated DeltaNet mixer after its input projections (MODEL.md 5.4): the causal conv with the
 * sequence's window, SiLU, l2-normalised q/k (q scaled by 1/sqrt(dk)), gates g = -exp(A_log) *
 * softplus(a + dt_bias) and beta = sigmoid(b) (in place in a, b), the fp32 delta-rule recurrence
 * row by row in position order (prefill == the same rows as single steps, bit for bit); on the
 * CPU with `recurrent` 0 (switch deltanet.prefill=chunked, the default), complete
 * position-aligned blocks of DR_GDN_CHUNK (16) rows of one sequence take the chunked form instead
 * (within fp32 rounding). The CUDA backend ignores `recurrent` (always row by row). */
typedef struct dr_gdn_args {
    const dr_seq_row *rows;
    int64_t n;
    int layer;                 /* DeltaNet slot in the sequence */
    int nk, dk, nv, dv, K;
    const float *conv_w;       /* [C][K] */
    const float *conv_b;       /* [C] or NULL */
    const float *neg_A, *dt_bias; /* [nv] */
    float *u;                  /* [n][C] projected q|k|v before the conv */
    float *y;                  /* [n][C] scratch: after conv + SiLU */
    float *a, *b;              /* [n][nv] gate inputs, overwritten with g and beta */
    float *out;                /* [n][nv*dv] */
    int recurrent;             /* 1: row by row only (switch deltanet.prefill = recurrent; default chunked) */
} dr_gdn_args;

/* The weights of one MoE layer as the MoE op reads them (model/backbone_load.c binds them). */
typedef struct dr_moe_expert {
    int fused;                 /* 1: gate_up holds [2I, H] (gate rows then up rows) */
    dr_weight gate, up, gate_up, down;
} dr_moe_expert;

typedef struct dr_moe_weights {
    dr_weight router;          /* [E, H] */
    dr_weight sh_gate, sh_up, sh_down, sh_gate_proj; /* shared expert; sh_gate_proj is [1, H] */
    int n_kept;                /* stored experts */
    int *kept;                 /* [n_kept] original ids, ascending */
    int *slot;                 /* [E] slot of an original id, -1 if pruned */
    dr_moe_expert *experts;    /* [n_kept], by slot */
    int fused_layout;
} dr_moe_weights;

/* The whole MoE layer (MODEL.md 5.5): fp32 router softmax with pruned and non-finite scores
 * excluded, top-k (ties to the lower id), renormalisation, SwiGLU experts in their stored format,
 * sigmoid-gated shared expert; each row sums its experts in rank order. A row with no finite
 * score gets DR_FAULT_ROUTER in status[row] (ENUMERIC) and only the shared expert's output. */
typedef struct dr_moe_args {
    const dr_moe_weights *w;
    int E, topk, norm_topk;
    int64_t H, I, Is;
    int layer;
    const float *x;            /* [n][H] */
    int64_t n;
    float *out;                /* [n][H] */
    dr_op_status *status;      /* [n] */
} dr_moe_args;

/* The tower layer input (TOWER-H1.md): x = concat(enorm(E[code + slot*V]) or 0 when masked,
 * hnorm(h)) in the order the switch says. A code outside [0, V) (or past the table) gives
 * DR_FAULT_CODE (EINVAL) in status[row] and an embedding of zeros. */
typedef struct dr_tower_in_args {
    const dr_weight *code_table;
    int64_t code_stride;       /* V */
    int slot, layer;
    const int32_t *codes;      /* row r embeds codes[r * codes_ld] */
    int64_t codes_ld;
    const uint8_t *mask;       /* [n] 0/1, or NULL: every row embeds its code */
    int masked_all;            /* 1: no row embeds (shared layers with tower.shared_code none) */
    const float *enorm, *hnorm; /* [de], [dh] (offset added) */
    double eps;
    int de, dh, hidden_first;
    const float *h;            /* [n][dh] */
    float *x;                  /* [n][de + dh] */
    float *e;                  /* [n][de] scratch */
    int64_t n;
    dr_op_status *status;      /* [n] or NULL */
} dr_tower_in_args;

/* ---------------- the table ---------------- */

/* What dr_model_upload will ask the backend to hold, by part (bytes in stored format). */
typedef struct dr_upload_plan {
    size_t dense, experts, tower, vectors;
    int64_t n_weights, n_vectors;
} dr_upload_plan;

typedef void (*dr_region_fn)(void *ctx);

typedef struct dr_backend_ops {
    /* --- memory: zeroed on alloc when `zeroed`, else uninitialised (workspaces); upload/download
     * are synchronous (download waits for queued work); copy and zero are queued --- */
    drama_status (*alloc)(dr_backend *be, size_t bytes, int zeroed, void **out, drama_error *err);
    void (*free)(dr_backend *be, void *p);
    drama_status (*upload)(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err);
    drama_status (*download)(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err);
    void (*copy)(dr_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(dr_backend *be, void *dst, size_t bytes);
    /* waits for queued work; reports the first failure of any of it */
    drama_status (*sync)(dr_backend *be, drama_error *err);

    /* --- resident model constants (dr_model_upload): plan first (a backend that cannot hold
     * it fails naming the part that does not fit), then every weight and vector once --- */
    drama_status (*plan)(dr_backend *be, const dr_upload_plan *p, drama_error *err);
    size_t (*weight_bytes)(dr_backend *be, const dr_weight *w);      /* what upload_weight will hold */
    drama_status (*upload_weight)(dr_backend *be, const dr_weight *w, drama_error *err);
    drama_status (*upload_vec)(dr_backend *be, const float *v, int64_t n, drama_error *err);

    /* --- a capturable region: fn(ctx) issues only queued ops. A backend may record what fn
     * issues under (owner, key) the first time and replay it afterwards, so fn must issue the
     * same ops with the same arguments whenever it runs with the same (owner, key); values in
     * backend memory may differ. forget drops every record of owner (its buffers are going). */
    drama_status (*run_region)(dr_backend *be, const void *owner, uint64_t key, dr_region_fn fn, void *ctx,
                               drama_error *err);
    void (*forget_region)(dr_backend *be, const void *owner);

    /* --- model ops (model constants as in the header comment; the rest backend memory) --- */
    /* y[n][r1-r0] = x[n][cols] W[r0..r1)^T, W in its stored format, fp32 accumulation */
    void (*matmul)(dr_backend *be, const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y);
    void (*embed)(dr_backend *be, const dr_embed_args *a, const int32_t *rows, int64_t n, float *x);
    /* y[i] = rms_norm(x[i]) * w for n rows of dim; w NULL = 1; y may be x */
    void (*rms_norm)(dr_backend *be, const float *x, const float *w, double eps, int64_t dim, int64_t n, float *y);
    /* x[h] = rms_norm(x[h], w) * silu(z[h]) for n rows of heads x dv; w [dv], or [heads*dv] when per_head */
    void (*gated_rms_norm)(dr_backend *be, float *x, const float *w, int per_head, const float *z, double eps,
                           int64_t heads, int64_t dv, int64_t n);
    void (*add)(dr_backend *be, float *x, const float *y, int64_t count);               /* x += y */
    void (*swiglu)(dr_backend *be, const float *g, const float *u, int64_t count, float *y); /* silu(g)*u */
    void (*attention)(dr_backend *be, const dr_attn_args *a);
    void (*deltanet)(dr_backend *be, const dr_gdn_args *a);
    void (*moe)(dr_backend *be, const dr_moe_args *a);
    /* logits[n][n_sem + 1]: head rows [sem_row, + n_sem), then end_row, of x [n][cols] */
    void (*restricted_logits)(dr_backend *be, const dr_weight *head, int64_t sem_row, int64_t n_sem,
                              int64_t end_row, const float *x, int64_t n, float *logits);
    void (*tower_input)(dr_backend *be, const dr_tower_in_args *a);
    /* status[i] gets DR_FAULT_HIDDEN (ENUMERIC) when row i of x [n][width] holds a NaN or inf */
    void (*check_finite)(dr_backend *be, const float *x, int64_t width, int64_t n, dr_op_status *status);
    /* dst[i] + dst_off (dst[i] a backend pointer, NULL skips) <- row i of src [n][width], unless
     * rows (may be NULL) holds row i */
    void (*scatter_rows)(dr_backend *be, const float *src, int64_t width, int64_t n, float *const *dst,
                         int64_t dst_off, const dr_seq_row *rows);
    /* row i of dst [n][width] <- src[i] */
    void (*gather_rows)(dr_backend *be, float *dst, int64_t width, int64_t n, const float *const *src);
    /* rows[i].seq->pos += 1 for every row that does not hold (rows of one sequence add up) */
    void (*advance)(dr_backend *be, const dr_seq_row *rows, int64_t n);

    /* --- the frame step's lane ops (TEXT.md 5; lanes [n] and out [n] in backend memory) --- */
    /* logits = guided ? cond + gamma (cond - uncond) (cond -inf stays -inf) : cond */
    void (*guidance)(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand);
    /* semantic draw from lanes[i].logits at f = g->draw (then g->draw++), the redraw when the
     * code is in the window; io.codes[i][0], io.ended[i] (end = candidate n_cand-1; code 0 then),
     * io.status[i]; a code that is not the end token joins the window */
    void (*sample_semantic)(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand, dr_step_io io);
    /* acoustic draw of codebook j (1..NC-1) at f = g->draw - 1 from logits [n][head_vocab] into
     * io.codes[i][j]; lanes that ended or failed draw nothing (code 0) */
    void (*sample_acoustic)(dr_backend *be, const dr_step_lane *lanes, int n, int codebook, const float *logits,
                            int head_vocab, dr_step_io io);
    /* rows[r] = [sem_start + c0, c0..c_{NC-1}] of lane lane_of_row[r] for m rows */
    void (*frame_rows)(dr_backend *be, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                       int64_t sem_start, int32_t *rows);

    /* --- measurement (bench): read bandwidth of the backend's memory in bytes/s, measured now
     * over `bytes` (CPU: a STREAM-like read; CUDA: a device-to-device copy) --- */
    drama_status (*bandwidth)(dr_backend *be, size_t bytes, double *bytes_per_s, drama_error *err);
} dr_backend_ops;

struct dr_backend {
    dr_backend_kind kind;
    const char *name;          /* "cpu", "cuda" */
    int host_memory;           /* 1: backend memory is host memory the host may read between ops */
    int device;                /* device index (CUDA), 0 for the CPU */
    char description[160];     /* e.g. "cpu (avx2, 16 threads)", "cuda: NVIDIA H200 (device 0)" */
    const dr_backend_ops *ops;
    void *impl;
    void (*destroy)(dr_backend *be); /* frees the backend itself (dr_backend_free) */
};

void dr_backend_free(dr_backend *be);

/* ---------------- calls as the model writes them ---------------- */

/* zeroed memory */
static inline drama_status dr_bk_alloc(dr_backend *be, size_t bytes, void **out, drama_error *err) {
    return be->ops->alloc(be, bytes, 1, out, err);
}
/* count elements of size bytes each, overflow checked; zeroed, or uninitialised (scratch) */
drama_status dr_bk_alloc_n(dr_backend *be, size_t count, size_t size, void **out, drama_error *err);
drama_status dr_bk_alloc_scratch(dr_backend *be, size_t count, size_t size, void **out, drama_error *err);
static inline void dr_bk_free(dr_backend *be, void *p) {
    if (p) be->ops->free(be, p);
}
static inline drama_status dr_bk_upload(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    return bytes ? be->ops->upload(be, dst, src, bytes, err) : DRAMA_OK;
}
static inline drama_status dr_bk_download(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    return bytes ? be->ops->download(be, dst, src, bytes, err) : DRAMA_OK;
}
static inline void dr_bk_copy(dr_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) be->ops->copy(be, dst, src, bytes);
}
static inline void dr_bk_zero(dr_backend *be, void *dst, size_t bytes) {
    if (bytes) be->ops->zero(be, dst, bytes);
}
static inline drama_status dr_bk_sync(dr_backend *be, drama_error *err) { return be->ops->sync(be, err); }
/* Positions [0, len) of every layer's K and V from one K/V block to another (dr_seq layout;
 * capacities may differ). Queued. */
void dr_bk_copy_kv(dr_backend *be, float *dst, int64_t dst_cap, const float *src, int64_t src_cap, int n_layers,
                   int64_t kv_dim, int64_t len);
/* A K/V block with room for `need` positions (capacity doubled from max(*cap, 64)), positions
 * [0, len) kept; *kv and *cap replaced. `what` names the cache in errors. */
drama_status dr_bk_grow_kv(dr_backend *be, float **kv, int64_t *cap, int64_t need, int n_layers, int64_t kv_dim,
                           int64_t len, const char *what, drama_error *err);

static inline void dr_bk_matmul(dr_backend *be, const dr_weight *w, const float *x, int64_t n, float *y) {
    be->ops->matmul(be, w, 0, w->rows, x, n, y);
}
static inline void dr_bk_matmul_rows(dr_backend *be, const dr_weight *w, int64_t r0, int64_t r1, const float *x,
                                     int64_t n, float *y) {
    be->ops->matmul(be, w, r0, r1, x, n, y);
}
static inline void dr_bk_rms_norm(dr_backend *be, const float *x, const float *w, double eps, int64_t dim, int64_t n,
                                  float *y) {
    be->ops->rms_norm(be, x, w, eps, dim, n, y);
}
static inline void dr_bk_add(dr_backend *be, float *x, const float *y, int64_t count) { be->ops->add(be, x, y, count); }
static inline void dr_bk_swiglu(dr_backend *be, const float *g, const float *u, int64_t count, float *y) {
    be->ops->swiglu(be, g, u, count, y);
}

#endif
