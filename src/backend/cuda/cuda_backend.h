/* cuda_backend.h - the CUDA backend (plain C API): device context, weights uploaded in their
 * stored format, and y[n][out] = x[n][in] W^T with fp32 accumulation for every dr_wfmt.
 *
 * Design (docs/cuda.md): memory-bound matrix-vector products. One warp per output row, each lane
 * streams 16-byte chunks of the row and dequantises them in registers (no wider copy of W is ever
 * made); the 32 lane sums are combined by a fixed shuffle tree. Row i of y depends only on row i
 * of x and on W: results are bit-identical for any n, any row range and any batch grouping.
 *
 * Pointers named x/y are DEVICE pointers (dr_cuda_malloc). Products are queued on the context's
 * stream and return at once; dr_cuda_sync waits and reports errors of queued work.
 * Every function is safe to call on a machine without a driver or GPU: dr_cuda_open then fails
 * with DRAMA_EUNSUPPORTED and a message saying so. */
#ifndef DRAMA_BACKEND_CUDA_BACKEND_H
#define DRAMA_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the engine's headers are C: their functions have C linkage in the .cu files too */
#endif

#include "base/error.h"
#include "num/weight.h"

#define DR_CUDA_MAX_BATCH 16 /* jobs of one dr_cuda_matmul_batch launch (more are split) */

typedef struct dr_cuda dr_cuda;               /* a device and its stream */
typedef struct dr_cuda_weight dr_cuda_weight; /* a dr_weight's stored bytes in device memory */

typedef struct dr_cuda_info {
    int device;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t global_mem;
    size_t l2_bytes;
    int driver_version, runtime_version; /* 13000 = 13.0 */
} dr_cuda_info;

/* Usable CUDA devices; 0 when there is no driver or no GPU (never fails). If why is set, it
 * receives the runtime's reason when the count is 0. */
int dr_cuda_device_count(char *why, size_t why_size);

/* Opens device `device` (0-based) with its own stream. No device: DRAMA_EUNSUPPORTED, "no CUDA
 * device: <reason>". */
drama_status dr_cuda_open(int device, dr_cuda **out, drama_error *err);
void dr_cuda_close(dr_cuda *c);
const dr_cuda_info *dr_cuda_get_info(const dr_cuda *c);

/* Device buffers (cudaMalloc: 256-byte aligned). Copies are synchronous with respect to the
 * context's stream (they wait for queued products). */
drama_status dr_cuda_malloc(dr_cuda *c, size_t bytes, void **dptr, drama_error *err);
void dr_cuda_free(dr_cuda *c, void *dptr);
drama_status dr_cuda_to_device(dr_cuda *c, void *dst, const void *src, size_t bytes, drama_error *err);
drama_status dr_cuda_to_host(dr_cuda *c, void *dst, const void *src, size_t bytes, drama_error *err);
drama_status dr_cuda_memset(dr_cuda *c, void *dst, int byte, size_t bytes, drama_error *err);
/* Waits for queued work; reports a failure of any of it. */
drama_status dr_cuda_sync(dr_cuda *c, drama_error *err);

/* Copies the stored bytes of `w` (codes and companions, unchanged, no dequantisation) to the
 * device. Each row is placed at a 16-byte aligned pitch (padding is zero, never read as data).
 * Checks the descriptor and names w->name on failure. The dr_weight's memory is not kept. */
drama_status dr_cuda_weight_upload(dr_cuda *c, const dr_weight *w, dr_cuda_weight **out, drama_error *err);
void dr_cuda_weight_free(dr_cuda_weight *w);
/* Device bytes dr_cuda_weight_upload would hold for w (0 with err set when w cannot be uploaded). */
size_t dr_cuda_weight_bytes_for(const dr_weight *w, drama_error *err);
int64_t dr_cuda_weight_rows(const dr_cuda_weight *w);
int64_t dr_cuda_weight_cols(const dr_cuda_weight *w);
size_t dr_cuda_weight_device_bytes(const dr_cuda_weight *w); /* device memory held */

/* y[n][rows] = x[n][cols] W^T (device pointers, rows of x contiguous; any n >= 0). Queued. */
drama_status dr_cuda_matmul(dr_cuda *c, const dr_cuda_weight *w, const float *x, int64_t n, float *y,
                            drama_error *err);
/* Only output rows [r0, r1): y[n][r1 - r0], bit-identical to those columns of the full product. */
drama_status dr_cuda_matmul_rows(dr_cuda *c, const dr_cuda_weight *w, int64_t r0, int64_t r1, const float *x,
                                 int64_t n, float *y, drama_error *err);

/* Several independent products in as few launches as possible (one per weight format and
 * DR_CUDA_MAX_BATCH jobs): e.g. the 8 routed experts of a token. r0 == r1 == 0 means all rows. */
typedef struct dr_cuda_job {
    const dr_cuda_weight *w;
    const float *x; /* [n][cols] */
    int64_t n;
    float *y;       /* [n][r1 - r0], rows y_ld floats apart when y_ld > 0 */
    int64_t r0, r1;
    int64_t y_ld;   /* 0: r1 - r0; else >= r1 - r0 (e.g. the end-token row beside the semantic rows) */
    int add;        /* 1: y += x W^T (residual add fused into the store) */
    float *y2;      /* NULL, or a second destination laid out as y that gets y2 += x W^T (y is written
                       too: a product followed by the residual add of its output, in one launch) */
    const float *norm_w; /* with norm: x W^T is rms_norm(x, norm_w, norm_eps) W^T (norm_w NULL: no
                            weight), the norm formed as dr_cuda_rms_norm's, bit for bit; n = 1 and
                            cols <= DR_CUDA_NORM_MAX_COLS only */
    double norm_eps;
    int norm;
    float *norm_y;  /* with norm: NULL, or where the normed x is written too */
} dr_cuda_job;
#define DR_CUDA_NORM_MAX_COLS 11776 /* MV1_MAX_COLS: the fused norm lives in matvec1_kernel */
drama_status dr_cuda_matmul_batch(dr_cuda *c, const dr_cuda_job *jobs, int count, drama_error *err);

/* Timing with CUDA events on the context's stream: runs fn(arg) `calls` times between two events
 * and returns the elapsed milliseconds divided by calls. For benchmarks only. */
drama_status dr_cuda_time(dr_cuda *c, drama_status (*fn)(void *arg), void *arg, int calls, double *ms_per_call,
                          drama_error *err);

/* Device memory bandwidth measured now: the best of 5 device-to-device copies of `bytes` (split in
 * two halves of one allocation), counted as bytes read + bytes written per second. */
drama_status dr_cuda_copy_bandwidth(dr_cuda *c, size_t bytes, double *bytes_per_s, drama_error *err);

#ifdef __cplusplus
}
#endif

#endif
