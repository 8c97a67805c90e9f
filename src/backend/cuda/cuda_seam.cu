/* cuda_seam.cu - the CUDA backend of the seam (cuda_seam.h): memory, resident weights and vectors
 * (found again by the host objects the model passes), regions as CUDA graphs, and the op table.
 * Ops return nothing: a failure is kept (the first one) and reported by sync. Consecutive products
 * are queued and launched together (one launch per format for up to 16 products that do not read
 * each other's outputs), and a residual add of a queued product's output is folded into that
 * product's store; neither changes a bit of any result. The ops themselves: cuda_seam_ops.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_seam.h"
#include "backend/cuda/cuda_seam_impl.h"

/* ---------------- host pointer -> device object ---------------- */

static uint64_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

void *cs_map_get(const cs_map *m, const void *key) {
    if (!m->cap || !key) return NULL;
    for (size_t i = hash_ptr(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) return NULL;
        if (m->keys[i] == key) return m->vals[i];
    }
}

int cs_map_put(cs_map *m, const void *key, void *val) {
    if ((m->count + 1) * 2 > m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 1024;
        const void **nk = (const void **)calloc(nc, sizeof *nk);
        void **nv = (void **)calloc(nc, sizeof *nv);
        if (!nk || !nv) {
            free(nk), free(nv);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = hash_ptr(m->keys[i]) & (nc - 1);
            while (nk[j]) j = (j + 1) & (nc - 1);
            nk[j] = m->keys[i], nv[j] = m->vals[i];
        }
        free(m->keys), free(m->vals);
        m->keys = nk, m->vals = nv, m->cap = nc;
    }
    size_t i = hash_ptr(key) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->keys[i]) m->count++;
    m->keys[i] = key, m->vals[i] = val;
    return 0;
}

static void cs_map_free(cs_map *m) {
    free(m->keys), free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---------------- failures of queued ops ---------------- */

void cs_fail(cs_impl *b, drama_status st, const drama_error *e) {
    if (b->fail) return;
    b->fail = st;
    b->err = *e;
}

void cs_failf(cs_impl *b, drama_status st, const char *what) {
    drama_error e = {};
    dr_fail(&e, st, "CUDA backend: %s", what);
    cs_fail(b, st, &e);
}

/* ---------------- memory ---------------- */

static drama_status cs_alloc(dr_backend *be, size_t bytes, int zeroed, void **out, drama_error *err) {
    cs_impl *b = CS(be);
    *out = NULL;
    if (b->capturing) return dr_fail(err, DRAMA_EINTERNAL, "CUDA backend: allocation inside a recorded region");
    drama_status st = dr_cuda_malloc(b->c, bytes ? bytes : 1, out, err);
    if (!st && zeroed) st = dr_cuda_memset(b->c, *out, 0, bytes ? bytes : 1, err);
    if (!st && zeroed) st = dr_cuda_sync(b->c, err);
    return st;
}

static void cs_free(dr_backend *be, void *p) {
    cs_impl *b = CS(be);
    cs_flush(b);
    if (p) {
        cudaStreamSynchronize(b->c->stream); /* queued work may still read it */
        dr_cuda_free(b->c, p);
    }
}

static drama_status cs_upload(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    cs_impl *b = CS(be);
    cs_flush(b);
    return dr_cuda_to_device(b->c, dst, src, bytes, err);
}

static drama_status cs_download(dr_backend *be, void *dst, const void *src, size_t bytes, drama_error *err) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_status st = dr_cuda_to_host(b->c, dst, src, bytes, err);
    if (!st && b->fail) {
        st = b->fail;
        if (err) *err = b->err;
        b->fail = DRAMA_OK;
    }
    return st;
}

static void cs_copy(dr_backend *be, void *dst, const void *src, size_t bytes) {
    cs_impl *b = CS(be);
    cs_flush(b);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->c->stream);
    if (e != cudaSuccess) cs_failf(b, DRAMA_EINTERNAL, cudaGetErrorString(e));
}

static void cs_zero(dr_backend *be, void *dst, size_t bytes) {
    cs_impl *b = CS(be);
    cs_flush(b);
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, b->c->stream);
    if (e != cudaSuccess) cs_failf(b, DRAMA_EINTERNAL, cudaGetErrorString(e));
}

static drama_status cs_sync(dr_backend *be, drama_error *err) {
    cs_impl *b = CS(be);
    cs_flush(b);
    drama_status st = dr_cuda_sync(b->c, err);
    if (!st && b->fail) {
        st = b->fail;
        if (err) *err = b->err;
    }
    b->fail = DRAMA_OK;
    return st;
}

/* ---------------- resident constants ---------------- */

static const char *gib(size_t b, char *buf, size_t n) {
    snprintf(buf, n, "%.2f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

/* The whole plan must fit in what the device has free, with room for states and activations. */
static drama_status cs_plan(dr_backend *be, const dr_upload_plan *p, drama_error *err) {
    cs_impl *b = CS(be);
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) return dr_fail(err, DRAMA_EINTERNAL, "CUDA cudaMemGetInfo: %s", cudaGetErrorString(e));
    const size_t reserve = (size_t)2 << 30; /* states, workspaces, graphs */
    size_t avail = free_b > reserve ? free_b - reserve : 0;
    struct { const char *what; size_t bytes; } parts[] = {
        {"dense weights", p->dense}, {"expert weights", p->experts}, {"tower weights", p->tower}, {"fp32 vectors", p->vectors}};
    size_t sum = 0;
    char a[32], c[32], d[32];
    for (int i = 0; i < 4; i++) {
        sum += parts[i].bytes;
        if (sum > avail)
            return dr_fail(err, DRAMA_ENOMEM,
                           "CUDA device %d (%s): the model does not fit: %s need %s on top of %s already planned, "
                           "%s free (%s kept for states and activations)",
                           b->c->info.device, b->c->info.name, parts[i].what, gib(parts[i].bytes, a, sizeof a),
                           gib(sum - parts[i].bytes, c, sizeof c), gib(free_b, d, sizeof d), "2 GiB");
    }
    b->planned = sum;
    return DRAMA_OK;
}

static size_t cs_weight_bytes(dr_backend *be, const dr_weight *w) {
    (void)be;
    if (!w || w->rows <= 0) return 0;
    return dr_cuda_weight_bytes_for(w, NULL);
}

static drama_status cs_upload_weight(dr_backend *be, const dr_weight *w, drama_error *err) {
    cs_impl *b = CS(be);
    if (!w || w->rows <= 0 || cs_map_get(&b->weights, w)) return DRAMA_OK; /* an empty table, or shared */
    dr_cuda_weight *d = NULL;
    drama_status st = dr_cuda_weight_upload(b->c, w, &d, err);
    if (st) return st;
    if (cs_map_put(&b->weights, w, d)) {
        dr_cuda_weight_free(d);
        return dr_fail(err, DRAMA_ENOMEM, "CUDA backend: out of host memory");
    }
    b->resident += dr_cuda_weight_device_bytes(d);
    return DRAMA_OK;
}

static drama_status cs_upload_vec(dr_backend *be, const float *v, int64_t n, drama_error *err) {
    cs_impl *b = CS(be);
    if (!v || n <= 0 || cs_map_get(&b->vecs, v)) return DRAMA_OK;
    void *d = NULL;
    drama_status st = dr_cuda_malloc(b->c, (size_t)n * sizeof(float), &d, err);
    if (!st) st = dr_cuda_to_device(b->c, d, v, (size_t)n * sizeof(float), err);
    if (!st && cs_map_put(&b->vecs, v, d)) st = dr_fail(err, DRAMA_ENOMEM, "CUDA backend: out of host memory");
    if (st) {
        dr_cuda_free(b->c, d);
        return st;
    }
    b->resident += (size_t)n * sizeof(float);
    return DRAMA_OK;
}

const dr_cuda_weight *cs_weight(cs_impl *b, const dr_weight *w) {
    const dr_cuda_weight *d = (const dr_cuda_weight *)cs_map_get(&b->weights, w);
    if (!d) {
        char msg[200];
        snprintf(msg, sizeof msg, "weight %s was not uploaded", w && w->name ? w->name : "(unnamed)");
        cs_failf(b, DRAMA_EINTERNAL, msg);
    }
    return d;
}

const float *cs_vec(cs_impl *b, const float *v) {
    if (!v) return NULL;
    const float *d = (const float *)cs_map_get(&b->vecs, v);
    if (!d) cs_failf(b, DRAMA_EINTERNAL, "a model vector was not uploaded");
    return d;
}

/* ---------------- recorded regions: one CUDA graph per (owner, key) ---------------- */

static drama_status cs_run_region(dr_backend *be, const void *owner, uint64_t key, dr_region_fn fn, void *ctx,
                                  drama_error *err) {
    cs_impl *b = CS(be);
    cs_flush(b);
    if (!b->graphs_on) {
        b->in_region = 1, b->in_step = 1;
        b->prof_regions++;
        fn(ctx);
        cs_flush(b);
        b->in_region = 0, b->in_step = 0;
        return DRAMA_OK;
    }
    for (int i = 0; i < b->n_graphs; i++)
        if (b->graphs[i].owner == owner && b->graphs[i].key == key)
            return dr_cuda_check(cudaGraphLaunch(b->graphs[i].exec, b->c->stream), "cudaGraphLaunch", err);
    if (b->n_graphs == CS_MAX_GRAPHS) return dr_fail(err, DRAMA_EINTERNAL, "CUDA backend: too many recorded regions");
    drama_status st = dr_cuda_check(cudaStreamBeginCapture(b->c->stream, cudaStreamCaptureModeThreadLocal),
                                    "cudaStreamBeginCapture", err);
    if (st) return st;
    b->capturing = 1, b->in_step = 1;
    fn(ctx);
    cs_flush(b);
    b->capturing = 0, b->in_step = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(b->c->stream, &g);
    if (b->fail) { /* an op could not be issued: nothing recorded */
        if (g) cudaGraphDestroy(g);
        st = b->fail;
        if (err) *err = b->err;
        b->fail = DRAMA_OK;
        return st;
    }
    cudaGraphExec_t x = NULL;
    size_t nodes = 0;
    if (e == cudaSuccess) {
        e = cudaGraphInstantiate(&x, g, 0);
        cudaGraphGetNodes(g, NULL, &nodes);
    }
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) { /* nothing of the failed capture ran: run the region directly from now on */
        (void)cudaGetLastError();
        fprintf(stderr, "drama: cuda: recording a region as a graph failed (%s); running without graphs\n",
                cudaGetErrorString(e));
        b->graphs_on = 0;
        b->in_step = 1;
        fn(ctx);
        cs_flush(b);
        b->in_step = 0;
        return DRAMA_OK;
    }
    b->graphs[b->n_graphs++] = (cs_graph){owner, key, x, nodes};
    b->last_graph_nodes = nodes;
    if (getenv("DRAMA_CUDA_VERBOSE")) fprintf(stderr, "drama: cuda: region recorded as a graph of %zu nodes\n", nodes);
    return dr_cuda_check(cudaGraphLaunch(x, b->c->stream), "cudaGraphLaunch", err);
}

static void cs_forget_region(dr_backend *be, const void *owner) {
    cs_impl *b = CS(be);
    int k = 0;
    for (int i = 0; i < b->n_graphs; i++) {
        if (b->graphs[i].owner == owner) {
            cudaStreamSynchronize(b->c->stream);
            cudaGraphExecDestroy(b->graphs[i].exec);
        } else {
            b->graphs[k++] = b->graphs[i];
        }
    }
    b->n_graphs = k;
}

static drama_status cs_bandwidth(dr_backend *be, size_t bytes, double *bps, drama_error *err) {
    cs_impl *b = CS(be);
    cs_flush(b);
    return dr_cuda_copy_bandwidth(b->c, bytes, bps, err);
}

/* ---------------- the backend ---------------- */

static void cs_destroy(dr_backend *be) {
    cs_impl *b = CS(be);
    if (!b) {
        free(be);
        return;
    }
    cudaStreamSynchronize(b->c->stream);
    if (b->profile) {
        static const char *const kind[CSP_KINDS] = {"matmul_n1", "matmul", "gemm_tc", "embed", "norm", "element", "attention",
                                                    "deltanet", "moe", "logits", "tower_in", "move", "guidance",
                                                    "semantic", "acoustic"};
        for (int r = 0; r < 2; r++) {
            double tot = 0;
            for (int k = 0; k < CSP_KINDS; k++) tot += b->prof_ms[r][k];
            if (r) fprintf(stderr, "drama: cuda profile: inside %lld directly run regions (frame steps):\n",
                           (long long)b->prof_regions);
            else fprintf(stderr, "drama: cuda profile: outside regions (prefill, setup):\n");
            for (int k = 0; k < CSP_KINDS; k++) {
                if (!b->prof_n[r][k]) continue;
                double ms = b->prof_ms[r][k], per = b->prof_regions && r ? (double)b->prof_regions : 1.0;
                fprintf(stderr,
                        "drama: cuda profile: %-10s %8lld launches %10.3f ms %5.1f%% %8.2f us/launch %8.3f ms/region"
                        " %7.1f GB/s\n",
                        kind[k], (long long)b->prof_n[r][k], ms, tot > 0 ? 100.0 * ms / tot : 0.0,
                        1000.0 * ms / (double)b->prof_n[r][k], ms / per,
                        ms > 0 ? b->prof_bytes[r][k] / (ms * 1e6) : 0.0);
            }
            fprintf(stderr, "drama: cuda profile: total %10.3f ms\n", tot);
        }
        cudaEventDestroy(b->ev0);
        cudaEventDestroy(b->ev1);
    }
    for (int i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    for (size_t i = 0; i < b->weights.cap; i++)
        if (b->weights.keys[i]) dr_cuda_weight_free((dr_cuda_weight *)b->weights.vals[i]);
    for (size_t i = 0; i < b->vecs.cap; i++)
        if (b->vecs.keys[i]) dr_cuda_free(b->c, b->vecs.vals[i]);
    for (size_t i = 0; i < b->moes.cap; i++)
        if (b->moes.keys[i]) dr_cuda_moe_free((dr_cuda_moe *)b->moes.vals[i]);
    cs_map_free(&b->weights), cs_map_free(&b->vecs), cs_map_free(&b->moes);
    dr_cuda_free(b->c, b->attn_ws);
    dr_cuda_free(b->c, b->moe_ws);
    dr_cuda_close(b->c);
    free(b);
    free(be);
}

extern "C" drama_status dr_backend_cuda_create(int device, dr_backend **out, drama_error *err) {
    *out = NULL;
    dr_backend *be = (dr_backend *)calloc(1, sizeof *be);
    cs_impl *b = (cs_impl *)calloc(1, sizeof *b);
    if (!be || !b) {
        free(be), free(b);
        return dr_fail(err, DRAMA_ENOMEM, "CUDA backend: out of host memory");
    }
    drama_status st = dr_cuda_open(device, &b->c, err);
    if (!st) st = dr_cuda_kernels_init(b->c, err);
    if (st) {
        if (b->c) dr_cuda_close(b->c);
        free(be), free(b);
        return st;
    }
    const char *g = getenv("DRAMA_CUDA_GRAPHS"), *pr = getenv("DRAMA_CUDA_PROFILE");
    b->graphs_on = !(g && !strcmp(g, "0"));
    const char *tc = getenv("DRAMA_CUDA_TC");
    /* on by default: the exact split + fresh accumulator per k-step gives golden parity on the H200 (the
     * first, two-term chained version flipped codes: bench/RESULTS.md); DRAMA_CUDA_TC=0 keeps the matvec */
    b->tc_on = !(tc && !strcmp(tc, "0"));
    const char *fn = getenv("DRAMA_CUDA_FUSE_NORM");
    b->fuse_norm = !(fn && !strcmp(fn, "0"));
    b->profile = pr && !strcmp(pr, "1") && cudaEventCreate(&b->ev0) == cudaSuccess && cudaEventCreate(&b->ev1) == cudaSuccess;
    be->kind = DR_BACKEND_CUDA;
    be->name = "cuda";
    be->host_memory = 0;
    be->device = device;
    snprintf(be->description, sizeof be->description, "cuda: %.100s (device %d)%s%s", b->c->info.name, device,
             b->graphs_on ? "" : ", graphs off", b->tc_on ? "" : ", tensor-core products off");
    be->ops = cs_ops_table();
    be->impl = b;
    be->destroy = cs_destroy;
    *out = be;
    return DRAMA_OK;
}

/* the memory and region entries of the table (the model ops: cuda_seam_ops.cu) */
void cs_fill_table(dr_backend_ops *t) {
    t->alloc = cs_alloc;
    t->free = cs_free;
    t->upload = cs_upload;
    t->download = cs_download;
    t->copy = cs_copy;
    t->zero = cs_zero;
    t->sync = cs_sync;
    t->plan = cs_plan;
    t->weight_bytes = cs_weight_bytes;
    t->upload_weight = cs_upload_weight;
    t->upload_vec = cs_upload_vec;
    t->run_region = cs_run_region;
    t->forget_region = cs_forget_region;
    t->bandwidth = cs_bandwidth;
}
