/* cuda_seam_impl.h - INTERNAL to the CUDA backend (cuda_seam.cu, cuda_seam_ops.cu): its state. */
#ifndef DRAMA_BACKEND_CUDA_SEAM_IMPL_H
#define DRAMA_BACKEND_CUDA_SEAM_IMPL_H

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif
#include "backend/cuda/cuda_seam_kernels.h"

/* open-addressing map from a host object (weight, vector, MoE table) to its device twin */
typedef struct cs_map {
    const void **keys;
    void **vals;
    size_t cap, count;
} cs_map;
void *cs_map_get(const cs_map *m, const void *key);
int cs_map_put(cs_map *m, const void *key, void *val);

#define CS_MAX_GRAPHS 64
#define CS_MAX_PENDING 16

typedef struct cs_graph {
    const void *owner;
    uint64_t key;
    cudaGraphExec_t exec;
    size_t nodes;
} cs_graph;

typedef struct cs_impl {
    dr_cuda *c;
    cs_map weights, vecs, moes;
    size_t planned, resident;
    int graphs_on, capturing;
    int tc_on; /* products of >= DR_CUDA_GEMM_MIN_N rows with BF16 weights on the tensor cores (gemm.h) */
    int in_step; /* inside a region (a frame step): products stay on the matvec, so a lane's values never
                    depend on how many lanes share its step */
    cs_graph graphs[CS_MAX_GRAPHS];
    int n_graphs;
    size_t last_graph_nodes;
    /* queued products, launched together by cs_flush */
    dr_cuda_job pend[CS_MAX_PENDING];
    int n_pend;
    /* a one-row rms_norm held back for the products that read its output: they stage the norm of
     * its input themselves (dr_cuda_job.norm) and write y; cs_flush launches it if none did */
    struct {
        const float *x, *w;
        float *y;
        double eps;
        int64_t dim;
        int active, used;
    } pnorm;
    int fuse_norm; /* DRAMA_CUDA_FUSE_NORM=0: every rms_norm is its own launch */
    /* workspaces, grown outside recorded regions */
    void *attn_ws, *moe_ws;
    size_t attn_ws_bytes, moe_ws_bytes;
    drama_status fail; /* first failure of a queued op */
    drama_error err;
    /* DRAMA_CUDA_PROFILE=1: each op outside a recorded region timed with events (it then waits
     * for the op), summed per kind, apart for ops inside a region run directly (the frame step
     * with DRAMA_CUDA_GRAPHS=0) and outside (prefill), printed when the backend closes */
    int profile, in_region;
    int64_t prof_regions;
    cudaEvent_t ev0, ev1;
    double prof_ms[2][16], prof_bytes[2][16];
    int64_t prof_n[2][16];
} cs_impl;

enum { CSP_MATMUL1, CSP_MATMUL, CSP_GEMM, CSP_EMBED, CSP_NORM, CSP_ELEMENT, CSP_ATTN, CSP_GDN, CSP_MOE, CSP_LOGITS, CSP_TOWER_IN,
       CSP_MOVE, CSP_GUIDE, CSP_SEMANTIC, CSP_ACOUSTIC, CSP_KINDS };
void cs_prof_begin(cs_impl *b);
void cs_prof_end(cs_impl *b, int kind);
void cs_prof_end_bytes(cs_impl *b, int kind, double bytes); /* with the weight bytes the op read */

#define CS(be) ((cs_impl *)(be)->impl)

void cs_fail(cs_impl *b, drama_status st, const drama_error *e);
void cs_failf(cs_impl *b, drama_status st, const char *what);
void cs_flush(cs_impl *b);                      /* launches the queued products */
const dr_cuda_weight *cs_weight(cs_impl *b, const dr_weight *w);
const float *cs_vec(cs_impl *b, const float *v);
void cs_fill_table(dr_backend_ops *t);
const dr_backend_ops *cs_ops_table(void);

/* the kernels' one-time settings (shared memory opt-ins), made before any capture */
drama_status dr_cuda_kernels_init(dr_cuda *c, drama_error *err);

#endif
