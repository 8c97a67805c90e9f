/* cuda_backend.cu - host side of the CUDA backend: device context, weight upload, argument
 * checks and launches (kernels in matvec.cu). Every CUDA call is checked; a failure names the
 * call, the tensor and the runtime's message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_contract.h"
#include "backend/cuda/cuda_internal.h"

static const char *wname(const dr_weight *w) { return (w && w->name) ? w->name : "(unnamed weight)"; }

static drama_status cuda_fail(drama_error *err, cudaError_t e, const char *what) {
    return dr_fail(err, e == cudaErrorMemoryAllocation ? DRAMA_ENOMEM : DRAMA_EINTERNAL, "CUDA %s: %s (%s)", what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

drama_status dr_cuda_check(cudaError_t e, const char *what, drama_error *err) {
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, what);
}

drama_status dr_cuda_smem_optin(const void *fn, const char *what, drama_error *err) {
    int dev = 0, optin = 0;
    cudaFuncAttributes fa;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, fn);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes);
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, what);
}

extern "C" int dr_cuda_device_count(char *why, size_t why_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && why_size) snprintf(why, why_size, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    if (n <= 0 && why && why_size) snprintf(why, why_size, "the driver reports no devices");
    return n > 0 ? n : 0;
}

extern "C" drama_status dr_cuda_open(int device, dr_cuda **out, drama_error *err) {
    if (!out) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_open: out is NULL");
    *out = NULL;
    char why[200] = "";
    int count = dr_cuda_device_count(why, sizeof why);
    if (count == 0) return dr_fail(err, DRAMA_EUNSUPPORTED, "no CUDA device: %s", why);
    if (device < 0 || device >= count)
        return dr_fail(err, DRAMA_EINVAL, "CUDA device %d does not exist (%d present)", device, count);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaSetDevice");
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaGetDeviceProperties");
    dr_cuda *c = (dr_cuda *)calloc(1, sizeof *c);
    if (!c) return dr_fail(err, DRAMA_ENOMEM, "dr_cuda_open: out of host memory");
    c->info.device = device;
    snprintf(c->info.name, sizeof c->info.name, "%s", p.name);
    c->info.cc_major = p.major;
    c->info.cc_minor = p.minor;
    c->info.sm_count = p.multiProcessorCount;
    c->info.global_mem = p.totalGlobalMem;
    c->info.l2_bytes = (size_t)p.l2CacheSize;
    cudaDriverGetVersion(&c->info.driver_version);
    cudaRuntimeGetVersion(&c->info.runtime_version);
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return cuda_fail(err, e, "cudaStreamCreate");
    }
    /* DRAMA_CUDA_XT=0: the n = 1 kernels stage x in the plain layout (to compare; default transposed) */
    const char *xt = getenv("DRAMA_CUDA_XT");
    c->xt = !(xt && !strcmp(xt, "0"));
    /* DRAMA_CUDA_MV1_PERSIST=0: the n = 1 kernel with one row per warp (to compare; default persistent) */
    const char *pw = getenv("DRAMA_CUDA_MV1_PERSIST");
    c->mv1_one_row = pw && !strcmp(pw, "0");
    /* DRAMA_CUDA_MV1_L2PF=MiB (opt-in until measured on a GPU): the n = 1 kernel's blocks prefetch their part
     * of the first MiB of a launch's weight rows into L2 before they wait on the previous kernel */
    const char *pf = getenv("DRAMA_CUDA_MV1_L2PF");
    c->mv1_l2pf = pf ? (int64_t)atoi(pf) * ((int64_t)1 << 20) : 0;
    if (c->mv1_l2pf < 0) c->mv1_l2pf = 0;
    /* DRAMA_CUDA_PDL=0: plain launches (default: programmatic dependent launch on sm_90+; pdl.cuh) */
    const char *pdl = getenv("DRAMA_CUDA_PDL");
    c->pdl = p.major >= 9 && !(pdl && !strcmp(pdl, "0"));
    /* DRAMA_CUDA_SAMPLE=0: the sampler that sorts every candidate, =nolist: the faster draw without the
     * nucleus list (to compare; default the faster draw, sample.cu) */
    const char *smp = getenv("DRAMA_CUDA_SAMPLE");
    c->sample = smp && !strcmp(smp, "0") ? 0 : smp && !strcmp(smp, "nolist") ? 4 : 1;
    *out = c;
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_set_xt(dr_cuda *c, int xt, drama_error *err) {
    if (!c || xt < 0 || xt > 1) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_set_xt: bad argument");
    c->xt = xt;
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_set_mv1_l2pf(dr_cuda *c, int64_t bytes, drama_error *err) {
    if (!c || bytes < 0) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_set_mv1_l2pf: bad argument");
    c->mv1_l2pf = bytes;
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_set_mv1_one_row(dr_cuda *c, int one_row, drama_error *err) {
    if (!c || one_row < 0 || one_row > 1) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_set_mv1_one_row: bad argument");
    c->mv1_one_row = one_row;
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_set_pdl(dr_cuda *c, int pdl, drama_error *err) {
    if (!c || pdl < 0 || pdl > 1) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_set_pdl: bad argument");
    c->pdl = pdl && c->info.cc_major >= 9;
    return DRAMA_OK;
}

extern "C" int dr_cuda_pdl(const dr_cuda *c) { return c ? c->pdl : 0; }

extern "C" void dr_cuda_close(dr_cuda *c) {
    if (!c) return;
    cudaSetDevice(c->info.device);
    cudaStreamSynchronize(c->stream);
    cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" const dr_cuda_info *dr_cuda_get_info(const dr_cuda *c) { return c ? &c->info : NULL; }

extern "C" drama_status dr_cuda_malloc(dr_cuda *c, size_t bytes, void **dptr, drama_error *err) {
    if (!c || !dptr) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_malloc: NULL context or out pointer");
    *dptr = NULL;
    cudaError_t e = cudaMalloc(dptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *dptr = NULL;
        return dr_fail(err, DRAMA_ENOMEM, "CUDA cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return DRAMA_OK;
}

extern "C" void dr_cuda_free(dr_cuda *c, void *dptr) {
    (void)c;
    if (dptr) cudaFree(dptr);
}

static drama_status copy(dr_cuda *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what,
                         drama_error *err) {
    if (!c || (bytes && (!dst || !src))) return dr_fail(err, DRAMA_EINVAL, "%s: NULL context or pointer", what);
    if (!bytes) return DRAMA_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, what);
}

extern "C" drama_status dr_cuda_to_device(dr_cuda *c, void *dst, const void *src, size_t bytes, drama_error *err) {
    return copy(c, dst, src, bytes, cudaMemcpyHostToDevice, "dr_cuda_to_device", err);
}

extern "C" drama_status dr_cuda_to_host(dr_cuda *c, void *dst, const void *src, size_t bytes, drama_error *err) {
    return copy(c, dst, src, bytes, cudaMemcpyDeviceToHost, "dr_cuda_to_host", err);
}

extern "C" drama_status dr_cuda_memset(dr_cuda *c, void *dst, int byte, size_t bytes, drama_error *err) {
    if (!c || (bytes && !dst)) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_memset: NULL context or pointer");
    cudaError_t e = cudaMemsetAsync(dst, byte, bytes, c->stream);
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, "cudaMemsetAsync");
}

extern "C" drama_status dr_cuda_sync(dr_cuda *c, drama_error *err) {
    if (!c) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_sync: NULL context");
    cudaError_t e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, "queued work");
}

/* ---- weights ---- */

static int scale_dt(dr_dtype dt) {
    switch (dt) {
    case DR_DT_F32: return MV_S_F32;
    case DR_DT_BF16: return MV_S_BF16;
    case DR_DT_F16: return MV_S_F16;
    default: return -1;
    }
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Checks w and fills the device-side geometry: format id, bytes a row needs, scale bytes. */
static drama_status plan(const dr_weight *w, dr_cuda_weight *d, size_t *need, size_t *scale_bytes,
                         drama_error *err) {
    const char *nm = wname(w);
    if (w->rows <= 0 || w->cols <= 0 || w->rows > INT32_MAX || w->cols > ((int64_t)1 << 40))
        return dr_fail(err, DRAMA_ESHAPE, "%s: invalid shape [%lld, %lld]", nm, (long long)w->rows,
                       (long long)w->cols);
    if (!w->data) return dr_fail(err, DRAMA_EINVAL, "%s: no data", nm);
    int64_t cols = w->cols;
    size_t el = 0;
    *scale_bytes = 0;
    d->scale_dt = MV_S_F32;
    d->global_scale = w->global_scale;
    switch (w->fmt) {
    case DR_WF_F32: d->fmt = MV_F32; *need = (size_t)cols * 4; break;
    case DR_WF_F16: d->fmt = MV_F16; *need = (size_t)cols * 2; break;
    case DR_WF_BF16: d->fmt = MV_BF16; *need = (size_t)cols * 2; break;
    case DR_WF_FP8_TENSOR: d->fmt = MV_FP8_TENSOR; *need = (size_t)cols; break;
    case DR_WF_FP8_BLOCK:
        d->fmt = MV_FP8_BLOCK;
        *need = (size_t)cols;
        if (w->block_rows <= 0 || w->block_cols <= 0)
            return dr_fail(err, DRAMA_ESHAPE, "%s: invalid FP8 block size %d x %d", nm, w->block_rows, w->block_cols);
        if (w->scale_cols != cdiv(cols, w->block_cols))
            return dr_fail(err, DRAMA_ESHAPE, "%s: %lld scale columns, %lld columns in blocks of %d need %lld", nm,
                           (long long)w->scale_cols, (long long)cols, w->block_cols,
                           (long long)cdiv(cols, w->block_cols));
        d->scale_dt = scale_dt(w->scale_dtype);
        el = d->scale_dt == MV_S_F32 ? 4 : 2;
        *scale_bytes = (size_t)cdiv(w->rows, w->block_rows) * (size_t)w->scale_cols * el;
        break;
    case DR_WF_NVFP4:
        d->fmt = MV_NVFP4;
        if (cols % 16)
            return dr_fail(err, DRAMA_ESHAPE, "%s: NVFP4 needs a multiple of 16 columns, got %lld", nm, (long long)cols);
        if (w->scale_cols != cols / 16)
            return dr_fail(err, DRAMA_ESHAPE, "%s: %lld NVFP4 scale columns, expected %lld", nm,
                           (long long)w->scale_cols, (long long)(cols / 16));
        *need = (size_t)cols / 2;
        *scale_bytes = (size_t)w->rows * (size_t)w->scale_cols;
        break;
    case DR_WF_AFFINE: {
        if (w->bits != 4 && w->bits != 8)
            return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: affine bits %d (4 or 8 supported)", nm, w->bits);
        d->fmt = w->bits == 4 ? MV_AFF4 : MV_AFF8;
        int chunk = w->bits == 4 ? 32 : 16; /* values per 16-byte chunk: one group must cover it */
        if (w->group <= 0 || w->group % chunk || cols % w->group)
            return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: affine %d-bit group %d over %lld columns (group must be a multiple of %d dividing the columns)",
                           nm, w->bits, w->group, (long long)cols, chunk);
        if (w->scale_cols != cols / w->group)
            return dr_fail(err, DRAMA_ESHAPE, "%s: %lld affine scale columns, expected %lld", nm,
                           (long long)w->scale_cols, (long long)(cols / w->group));
        if (!w->biases) return dr_fail(err, DRAMA_EINVAL, "%s: affine weight without biases", nm);
        d->scale_dt = scale_dt(w->scale_dtype);
        el = d->scale_dt == MV_S_F32 ? 4 : 2;
        *need = (size_t)cols * (size_t)w->bits / 8;
        *scale_bytes = (size_t)w->rows * (size_t)w->scale_cols * el;
        break;
    }
    default: return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: weight format %d not supported by the CUDA backend", nm, (int)w->fmt);
    }
    if (d->scale_dt < 0) return dr_fail(err, DRAMA_ESHAPE, "%s: scale dtype must be F32, BF16 or F16", nm);
    if (*scale_bytes && !w->scales) return dr_fail(err, DRAMA_EINVAL, "%s: no scales", nm);
    if (w->row_bytes < *need)
        return dr_fail(err, DRAMA_ESHAPE, "%s: row stride %zu bytes, a row of %lld columns needs %zu", nm, w->row_bytes,
                       (long long)cols, *need);
    d->rows = w->rows;
    d->cols = cols;
    d->scale_cols = w->scale_cols;
    d->block_rows = w->block_rows;
    d->block_cols = w->block_cols;
    d->group = w->group;
    return DRAMA_OK;
}

extern "C" size_t dr_cuda_weight_bytes_for(const dr_weight *w, drama_error *err) {
    dr_cuda_weight d;
    memset(&d, 0, sizeof d);
    size_t need = 0, sb = 0;
    if (!w || plan(w, &d, &need, &sb, err)) return 0;
    return (need + 15) / 16 * 16 * (size_t)d.rows + sb * (w->fmt == DR_WF_AFFINE ? 2 : 1);
}

extern "C" drama_status dr_cuda_weight_upload(dr_cuda *c, const dr_weight *w, dr_cuda_weight **out,
                                              drama_error *err) {
    if (!c || !w || !out) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_weight_upload: NULL argument");
    *out = NULL;
    dr_cuda_weight *d = (dr_cuda_weight *)calloc(1, sizeof *d);
    if (!d) return dr_fail(err, DRAMA_ENOMEM, "%s: out of host memory", wname(w));
    d->ctx = c;
    snprintf(d->name, sizeof d->name, "%s", wname(w));
    size_t need = 0, sbytes = 0;
    drama_status st = plan(w, d, &need, &sbytes, err);
    if (st) {
        free(d);
        return st;
    }
    d->pitch = (need + 15) / 16 * 16;
    size_t data_bytes = d->pitch * (size_t)d->rows;
    if (data_bytes / (size_t)d->rows != d->pitch) {
        free(d);
        return dr_fail(err, DRAMA_ENOMEM, "%s: size overflow", wname(w));
    }
    cudaError_t e = cudaMalloc((void **)&d->data, data_bytes);
    if (e == cudaSuccess && sbytes) e = cudaMalloc((void **)&d->scales, sbytes);
    if (e == cudaSuccess && sbytes && w->fmt == DR_WF_AFFINE) e = cudaMalloc((void **)&d->biases, sbytes);
    /* zero padding: the tail chunk of a row decodes it (and then discards it) */
    if (e == cudaSuccess && d->pitch != need) e = cudaMemsetAsync(d->data, 0, data_bytes, c->stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync(d->data, d->pitch, w->data, w->row_bytes, need, (size_t)d->rows, cudaMemcpyHostToDevice,
                              c->stream);
    if (e == cudaSuccess && sbytes) e = cudaMemcpyAsync(d->scales, w->scales, sbytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess && d->biases)
        e = cudaMemcpyAsync(d->biases, w->biases, sbytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    d->device_bytes = data_bytes + sbytes * (d->biases ? 2 : 1);
    if (e != cudaSuccess) {
        dr_fail(err, e == cudaErrorMemoryAllocation ? DRAMA_ENOMEM : DRAMA_EINTERNAL, "%s: upload of %zu bytes: %s",
                d->name, d->device_bytes, cudaGetErrorString(e));
        dr_cuda_weight_free(d);
        return e == cudaErrorMemoryAllocation ? DRAMA_ENOMEM : DRAMA_EINTERNAL;
    }
    *out = d;
    return DRAMA_OK;
}

extern "C" void dr_cuda_weight_free(dr_cuda_weight *w) {
    if (!w) return;
    if (w->data) cudaFree(w->data);
    if (w->scales) cudaFree(w->scales);
    if (w->biases) cudaFree(w->biases);
    free(w);
}

extern "C" int64_t dr_cuda_weight_rows(const dr_cuda_weight *w) { return w ? w->rows : 0; }
extern "C" int64_t dr_cuda_weight_cols(const dr_cuda_weight *w) { return w ? w->cols : 0; }
extern "C" size_t dr_cuda_weight_device_bytes(const dr_cuda_weight *w) { return w ? w->device_bytes : 0; }

/* ---- products ---- */

static drama_status make_job(const dr_cuda_job *in, int i, mv_job *j, drama_error *err) {
    const dr_cuda_weight *w = in->w;
    if (!w) return dr_fail(err, DRAMA_EINVAL, "CUDA matmul job %d: no weight", i);
    int64_t r0 = in->r0, r1 = in->r1;
    if (r0 == 0 && r1 == 0) r1 = w->rows;
    if (r0 < 0 || r1 > w->rows || r0 > r1)
        return dr_fail(err, DRAMA_EINVAL, "%s: row range [%lld, %lld) outside [0, %lld)", w->name, (long long)r0,
                       (long long)r1, (long long)w->rows);
    if (in->n < 0) return dr_fail(err, DRAMA_EINVAL, "%s: negative row count n=%lld", w->name, (long long)in->n);
    if (in->n > 0 && r1 > r0 && (!in->x || !in->y))
        return dr_fail(err, DRAMA_EINVAL, "%s: NULL x or y device pointer", w->name);
    if (in->y_ld < 0 || (in->y_ld > 0 && in->y_ld < r1 - r0))
        return dr_fail(err, DRAMA_EINVAL, "%s: y row stride %lld below the %lld rows asked", w->name,
                       (long long)in->y_ld, (long long)(r1 - r0));
    if (in->norm && (in->n != 1 || w->cols > DR_CUDA_NORM_MAX_COLS))
        return dr_fail(err, DRAMA_EINVAL, "%s: a fused norm needs n = 1 and at most %d columns (n=%lld, %lld)", w->name,
                       DR_CUDA_NORM_MAX_COLS, (long long)in->n, (long long)w->cols);
    memset(j, 0, sizeof *j);
    j->data = w->data;
    j->scales = w->scales;
    j->biases = w->biases;
    j->x = in->x;
    j->y = in->y;
    j->pitch = (int64_t)w->pitch;
    j->r0 = r0;
    j->r1 = r1;
    j->n = in->n;
    j->cols = w->cols;
    j->scale_cols = w->scale_cols;
    j->global_scale = w->global_scale;
    j->scale_dt = w->scale_dt;
    j->block_rows = w->block_rows;
    j->block_cols = w->block_cols;
    j->group = w->group;
    j->x_vec = ((uintptr_t)in->x % 16 == 0) && (w->cols % 4 == 0);
    j->fmt = w->fmt;
    j->y_ld = in->y_ld;
    j->add = in->add;
    j->y2 = in->y2;
    j->norm = in->norm;
    j->norm_w = in->norm_w;
    j->norm_eps = in->norm_eps;
    j->norm_y = in->norm_y;
    return DRAMA_OK;
}

mv_job dr_cuda_weight_view(const dr_cuda_weight *w) {
    mv_job j;
    memset(&j, 0, sizeof j);
    j.data = w->data;
    j.scales = w->scales;
    j.biases = w->biases;
    j.pitch = (int64_t)w->pitch;
    j.r1 = w->rows;
    j.cols = w->cols;
    j.scale_cols = w->scale_cols;
    j.global_scale = w->global_scale;
    j.scale_dt = w->scale_dt;
    j.block_rows = w->block_rows;
    j.block_cols = w->block_cols;
    j.group = w->group;
    j.fmt = w->fmt;
    j.x_vec = w->cols % 4 == 0; /* the kernels' activation buffers are 16-byte aligned */
    return j;
}

/* The kernel of a launch: matvec.cu's, or its planted defect (cuda_contract.h). */
static cudaError_t launch(dr_cuda *c, int fmt, int defect, const mv_batch *b) {
    return defect ? dr_cuda_launch_matvec_defect(fmt, defect, b, c->stream) : dr_cuda_launch_matvec(fmt, b, c->stream);
}

static drama_status flush(dr_cuda *c, int fmt, int defect, mv_batch *b, drama_error *err) {
    if (b->count == 0) return DRAMA_OK;
    cudaError_t e = cudaSuccess;
    b->xt = c->xt;
    b->one_row = c->mv1_one_row;
    b->pdl = c->pdl;
    b->l2pf = c->mv1_l2pf;
    if (b->max_rows > 0 && b->max_n > 0) e = launch(c, fmt, defect, b);
    b->count = 0;
    b->max_rows = b->max_n = 0;
    return e == cudaSuccess ? DRAMA_OK : cuda_fail(err, e, "matvec launch");
}

static drama_status batch(dr_cuda *c, const dr_cuda_job *jobs, int count, int defect, drama_error *err) {
    if (!c || (count > 0 && !jobs)) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_matmul_batch: NULL argument");
    if (count < 0) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_matmul_batch: negative count %d", count);
    for (int i = 0; i < count; i++) { /* check everything before queueing anything */
        mv_job j;
        drama_status st = make_job(&jobs[i], i, &j, err);
        if (st) return st;
        if (jobs[i].w->ctx != c) return dr_fail(err, DRAMA_EINVAL, "%s: uploaded to another CUDA context", jobs[i].w->name);
    }
    int cur = -1; /* the context's device (checked, set only when another is current: never inside a capture) */
    if ((cudaGetDevice(&cur) != cudaSuccess || cur != c->info.device) && cudaSetDevice(c->info.device) != cudaSuccess)
        return dr_fail(err, DRAMA_EINTERNAL, "cudaSetDevice failed");
    /* one launch per format, in job order; the grouping cannot change any result */
    mv_batch *bp = (mv_batch *)malloc(sizeof *bp); /* ~2 KB: the kernel parameter block */
    if (!bp) return dr_fail(err, DRAMA_ENOMEM, "dr_cuda_matmul_batch: out of host memory");
    drama_status st = DRAMA_OK;
    for (int fmt = 0; fmt < MV_NFMT && !st; fmt++) {
        memset(bp, 0, sizeof *bp);
        for (int i = 0; i < count && !st; i++) {
            if (jobs[i].w->fmt != fmt) continue;
            mv_job *j = &bp->job[bp->count];
            make_job(&jobs[i], i, j, err);
            if (j->r1 - j->r0 > bp->max_rows) bp->max_rows = j->r1 - j->r0;
            if (j->n > bp->max_n) bp->max_n = j->n;
            if (++bp->count == DR_CUDA_MAX_BATCH) st = flush(c, fmt, defect, bp, err);
        }
        if (!st) st = flush(c, fmt, defect, bp, err);
    }
    free(bp);
    return st;
}

extern "C" drama_status dr_cuda_matmul_batch(dr_cuda *c, const dr_cuda_job *jobs, int count, drama_error *err) {
    return batch(c, jobs, count, DR_CUDA_DEFECT_NONE, err);
}

extern "C" drama_status dr_cuda_matmul_batch_defect(dr_cuda *c, const dr_cuda_job *jobs, int count, int defect,
                                                    drama_error *err) {
    if (defect < 0 || defect >= DR_CUDA_DEFECT_COUNT)
        return dr_fail(err, DRAMA_EINVAL, "dr_cuda_matmul_batch_defect: unknown defect %d", defect);
    return batch(c, jobs, count, defect, err);
}

extern "C" drama_status dr_cuda_matmul_rows(dr_cuda *c, const dr_cuda_weight *w, int64_t r0, int64_t r1,
                                            const float *x, int64_t n, float *y, drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_matmul_rows: NULL weight");
    if (r0 < 0 || r1 > w->rows || r0 > r1)
        return dr_fail(err, DRAMA_EINVAL, "%s: row range [%lld, %lld) outside [0, %lld)", w->name, (long long)r0,
                       (long long)r1, (long long)w->rows);
    if (r0 == r1) return DRAMA_OK; /* nothing asked (and not the "all rows" job marker) */
    dr_cuda_job j = {w, x, n, y, r0, r1, 0, 0, NULL, NULL, 0, 0, NULL};
    return dr_cuda_matmul_batch(c, &j, 1, err);
}

extern "C" drama_status dr_cuda_matmul(dr_cuda *c, const dr_cuda_weight *w, const float *x, int64_t n, float *y,
                                       drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_matmul: NULL weight");
    return dr_cuda_matmul_rows(c, w, 0, w->rows, x, n, y, err);
}

extern "C" drama_status dr_cuda_time(dr_cuda *c, drama_status (*fn)(void *arg), void *arg, int calls,
                                     double *ms_per_call, drama_error *err) {
    if (!c || !fn || calls <= 0 || !ms_per_call) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_time: bad argument");
    cudaEvent_t a, b;
    cudaError_t e = cudaEventCreate(&a);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaEventCreate");
    e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        cudaEventDestroy(a);
        return cuda_fail(err, e, "cudaEventCreate");
    }
    drama_status st = DRAMA_OK;
    e = cudaEventRecord(a, c->stream);
    for (int i = 0; i < calls && !st && e == cudaSuccess; i++) st = fn(arg);
    if (e == cudaSuccess) e = cudaEventRecord(b, c->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(b);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (st) return st;
    if (e != cudaSuccess) return cuda_fail(err, e, "event timing");
    *ms_per_call = (double)ms / calls;
    return DRAMA_OK;
}

extern "C" drama_status dr_cuda_copy_bandwidth(dr_cuda *c, size_t bytes, double *bytes_per_s, drama_error *err) {
    if (!c || !bytes_per_s || bytes < 2) return dr_fail(err, DRAMA_EINVAL, "dr_cuda_copy_bandwidth: bad argument");
    size_t half = bytes / 2 / 256 * 256;
    uint8_t *buf = NULL;
    cudaError_t e = cudaMalloc((void **)&buf, 2 * half);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaMalloc (bandwidth probe)");
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double best = 0;
    e = cudaMemsetAsync(buf, 1, 2 * half, c->stream);
    for (int rep = 0; rep < 6 && e == cudaSuccess; rep++) { /* the first is a warm-up */
        cudaEventRecord(a, c->stream);
        e = cudaMemcpyAsync(buf + half, buf, half, cudaMemcpyDeviceToDevice, c->stream);
        cudaEventRecord(b, c->stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        double bps = ms > 0 ? 2.0 * (double)half / (ms * 1e-3) : 0;
        if (rep > 0 && bps > best) best = bps;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(buf);
    if (e != cudaSuccess) return cuda_fail(err, e, "bandwidth probe");
    *bytes_per_s = best;
    return DRAMA_OK;
}
