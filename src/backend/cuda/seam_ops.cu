/* seam_ops.cu - the seam's small ops on the device (backend.h): the gated output norm, the
 * element-wise add and SwiGLU, the finiteness check, row scatter / gather through pointer tables,
 * position advance, and the frame's next backbone rows. Each is the CPU backend's loop
 * (backend/cpu/cpu_backend.c) with one thread per element or a block per row. */
#include "backend/cuda/cuda_seam_kernels.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/dev_rows.cuh"

#define EW_THREADS 256

static unsigned ew_blocks(int64_t count) {
    int64_t b = (count + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

/* block (head h, row i): dr_op_gated_rms_norm (rms norm with eps as float, then * silu(z)) */
__global__ void gated_norm_kernel(float *x, const float *w, int per_head, const float *z, double eps, int64_t heads,
                                  int dv) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ double sh[32];
    const int64_t o = ((int64_t)blockIdx.y * heads + blockIdx.x) * dv;
    block_rms_norm(x + o, w + (per_head ? (int64_t)blockIdx.x * dv : 0), eps, dv, x + o, sh);
    __syncthreads();
    for (int i = threadIdx.x; i < dv; i += blockDim.x) x[o + i] = fmul(x[o + i], dsilu(z[o + i]));
}

drama_status dr_cuda_seam_gated_norm(dr_cuda *c, float *x, const float *w, int per_head, const float *z, double eps,
                                     int64_t heads, int64_t dv, int64_t n, drama_error *err) {
    if (n <= 0 || heads <= 0) return DRAMA_OK;
    if (heads > 65535 || n > 65535) return dr_fail(err, DRAMA_EUNSUPPORTED, "CUDA gated norm: %lld x %lld", (long long)n, (long long)heads);
    dim3 grid((unsigned)heads, (unsigned)n);
    dr_launch(c->pdl, gated_norm_kernel, grid, 128, 0, c->stream, x, w, per_head, z, (double)(float)eps, heads,
              (int)dv);
    return dr_cuda_check(cudaGetLastError(), "gated norm launch", err);
}

__global__ void add_kernel(float *x, const float *y, int64_t count) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = fadd(x[i], y[i]);
}

drama_status dr_cuda_seam_add(dr_cuda *c, float *x, const float *y, int64_t count, drama_error *err) {
    if (count <= 0) return DRAMA_OK;
    dr_launch(c->pdl, add_kernel, ew_blocks(count), EW_THREADS, 0, c->stream, x, y, count);
    return dr_cuda_check(cudaGetLastError(), "add launch", err);
}

__global__ void swiglu_kernel(const float *g, const float *u, int64_t count, float *y) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fmul(dsilu(g[i]), u[i]);
}

drama_status dr_cuda_seam_swiglu(dr_cuda *c, const float *g, const float *u, int64_t count, float *y, drama_error *err) {
    if (count <= 0) return DRAMA_OK;
    dr_launch(c->pdl, swiglu_kernel, ew_blocks(count), EW_THREADS, 0, c->stream, g, u, count, y);
    return dr_cuda_check(cudaGetLastError(), "swiglu launch", err);
}

/* block per row: the first non-finite element (lowest index) -> DR_FAULT_HIDDEN */
__global__ void check_finite_kernel(const float *x, int64_t width, dr_op_status *status) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    __shared__ int first;
    const int64_t r = blockIdx.x;
    if (threadIdx.x == 0) first = 0x7FFFFFFF;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
        if (!isfinite(x[r * width + i])) atomicMin(&first, (int)i);
    __syncthreads();
    if (threadIdx.x == 0 && first != 0x7FFFFFFF && !status[r].code)
        status[r].code = DRAMA_ENUMERIC, status[r].fault = DR_FAULT_HIDDEN, status[r].a = first;
}

drama_status dr_cuda_seam_check_finite(dr_cuda *c, const float *x, int64_t width, int64_t n, dr_op_status *status,
                                       drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    dr_launch(c->pdl, check_finite_kernel, (unsigned)n, EW_THREADS, 0, c->stream, x, width, status);
    return dr_cuda_check(cudaGetLastError(), "check_finite launch", err);
}

__global__ void scatter_kernel(const float *src, int64_t width, float *const *dst, int64_t dst_off, const dr_seq_row *rows) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int64_t r = blockIdx.y;
    float *d = dst[r];
    if (!d || (rows && rows[r].hold && *rows[r].hold)) return;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < width; i += (int64_t)gridDim.x * blockDim.x)
        d[dst_off + i] = src[r * width + i];
}

drama_status dr_cuda_seam_scatter_rows(dr_cuda *c, const float *src, int64_t width, int64_t n, float *const *dst,
                                       int64_t dst_off, const dr_seq_row *rows, drama_error *err) {
    if (n <= 0 || width <= 0) return DRAMA_OK;
    dim3 grid((unsigned)((width + EW_THREADS - 1) / EW_THREADS < 16 ? (width + EW_THREADS - 1) / EW_THREADS : 16), (unsigned)n);
    dr_launch(c->pdl, scatter_kernel, grid, EW_THREADS, 0, c->stream, src, width, dst, dst_off, rows);
    return dr_cuda_check(cudaGetLastError(), "scatter launch", err);
}

__global__ void gather_kernel(float *dst, int64_t width, const float *const *src) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    const int64_t r = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < width; i += (int64_t)gridDim.x * blockDim.x)
        dst[r * width + i] = src[r][i];
}

drama_status dr_cuda_seam_gather_rows(dr_cuda *c, float *dst, int64_t width, int64_t n, const float *const *src,
                                      drama_error *err) {
    if (n <= 0 || width <= 0) return DRAMA_OK;
    dim3 grid((unsigned)((width + EW_THREADS - 1) / EW_THREADS < 16 ? (width + EW_THREADS - 1) / EW_THREADS : 16), (unsigned)n);
    dr_launch(c->pdl, gather_kernel, grid, EW_THREADS, 0, c->stream, dst, width, src);
    return dr_cuda_check(cudaGetLastError(), "gather launch", err);
}

/* one thread: rows of one sequence add up, in order (no atomics needed, nothing else runs) */
__global__ void advance_kernel(const dr_seq_row *rows, int64_t n) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    for (int64_t i = 0; i < n; i++)
        if (!(rows[i].hold && *rows[i].hold)) rows[i].seq->pos++;
}

drama_status dr_cuda_seam_advance(dr_cuda *c, const dr_seq_row *rows, int64_t n, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    dr_launch(c->pdl, advance_kernel, 1, 1, 0, c->stream, rows, n);
    return dr_cuda_check(cudaGetLastError(), "advance launch", err);
}

__global__ void frame_rows_kernel(const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc, int64_t sem_start,
                                  int32_t *rows) {
    pdl_enter(); /* pdl.cuh: everything below may read what the previous kernel wrote */
    for (int64_t r = blockIdx.x * blockDim.x + threadIdx.x; r < m; r += gridDim.x * blockDim.x) {
        const int32_t *cd = codes + (int64_t)lane_of_row[r] * DR_MAX_CODEBOOKS;
        int32_t *row = rows + r * (nc + 1);
        row[0] = (int32_t)(sem_start + cd[0]);
        for (int j = 0; j < nc; j++) row[1 + j] = cd[j];
    }
}

drama_status dr_cuda_seam_frame_rows(dr_cuda *c, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                                     int64_t sem_start, int32_t *rows, drama_error *err) {
    if (m <= 0) return DRAMA_OK;
    dr_launch(c->pdl, frame_rows_kernel, 1, 64, 0, c->stream, codes, lane_of_row, m, nc, sem_start, rows);
    return dr_cuda_check(cudaGetLastError(), "frame rows launch", err);
}
