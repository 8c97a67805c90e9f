/* cuda_internal.h - what cuda_backend.cu (host API) and matvec.cu (kernels) share. C++ only. */
#ifndef DRAMA_BACKEND_CUDA_INTERNAL_H
#define DRAMA_BACKEND_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"

/* Kernel-side format ids: AFFINE splits by bit width (chunk geometry differs). */
enum mv_fmt { MV_F32, MV_F16, MV_BF16, MV_FP8_BLOCK, MV_FP8_TENSOR, MV_NVFP4, MV_AFF4, MV_AFF8, MV_NFMT };

/* Scale element types on the device. */
enum mv_sdt { MV_S_F32 = 0, MV_S_BF16 = 1, MV_S_F16 = 2 };

struct dr_cuda {
    dr_cuda_info info;
    cudaStream_t stream;
    int xt;  /* the n = 1 kernels' staging of x: 1 chunk-transposed (default), 0 plain (DRAMA_CUDA_XT) */
    int mv1_one_row; /* the n = 1 kernel: one row per warp (1, DRAMA_CUDA_MV1_PERSIST=0) or persistent warps (0, default) */
    int pdl; /* 1: kernels launched with programmatic dependent launch (default), 0 plain (DRAMA_CUDA_PDL; pdl.cuh) */
    int64_t mv1_l2pf; /* > 0 (DRAMA_CUDA_MV1_L2PF=MiB, opt-in): the n = 1 kernel prefetches the first that many bytes of a launch's weights into L2 before its wait */
    int sample; /* sampler kernels: 1 the faster draw (default), 0 the sort-everything one (DRAMA_CUDA_SAMPLE=0), 4 nolist; 2, 3 controls */
};

struct dr_cuda_weight {
    dr_cuda *ctx;
    int fmt;             /* mv_fmt */
    int64_t rows, cols;
    uint8_t *data;       /* rows x pitch, rows 16-byte aligned, zero padded */
    size_t pitch;
    uint8_t *scales;     /* as stored, contiguous (FP8_BLOCK, NVFP4, AFFINE) */
    uint8_t *biases;     /* AFFINE */
    int scale_dt;        /* mv_sdt */
    int64_t scale_cols;
    float global_scale;
    int block_rows, block_cols, group;
    size_t device_bytes;
    char name[96];
};

/* One product of a launch. */
struct mv_job {
    const uint8_t *data;
    const uint8_t *scales;
    const uint8_t *biases;
    const float *x;
    float *y;
    int64_t pitch;
    int64_t r0, r1, n, cols, scale_cols;
    float global_scale;
    int scale_dt, block_rows, block_cols, group;
    int x_vec; /* x rows are 16-byte aligned and cols % 4 == 0: float4 loads */
    int fmt;   /* mv_fmt (kernels that take several formats dispatch on it) */
    int64_t y_ld;  /* y row stride in floats (0: r1 - r0) */
    int add;   /* 1: y += x W^T (the residual add of the CPU's x[j] += mix[j]) */
    float *y2; /* NULL, or also y2 += x W^T at y's offsets */
    const float *norm_w; /* norm: x staged as rms_norm(x, norm_w, norm_eps) (matvec1 only) */
    double norm_eps;
    int norm;
    float *norm_y; /* norm: NULL, or the normed x written there (by each job's block 0) */
    int pblocks;   /* n = 1 kernel: this job's blocks (set at launch: matvec_kernel.cuh mv1_share_blocks) */
};

struct mv_batch {
    mv_job job[DR_CUDA_MAX_BATCH];
    int count;
    int xt;           /* n = 1 kernels: x staged chunk-transposed (1, DRAMA_CUDA_XT) or plain (0) */
    int one_row;      /* n = 1 kernel: one row per warp (1, DRAMA_CUDA_MV1_PERSIST=0) or persistent warps (0) */
    int pdl;          /* the context's pdl (pdl.cuh): launched with programmatic stream serialization */
    int64_t l2pf;     /* n = 1 kernel: > 0, the first l2pf / count bytes of each job's rows prefetched into L2 before the wait (dr_cuda.mv1_l2pf) */
    int64_t max_rows; /* largest r1 - r0 over the jobs */
    int64_t max_n;
};

/* The geometry of an uploaded weight as a job with no x, y or rows (device kernels that read
 * weights other than through dr_cuda_matmul take it; cuda_backend.cu). */
mv_job dr_cuda_weight_view(const dr_cuda_weight *w);

/* Lets kernel fn use as much dynamic shared memory as the device allows next to its static
 * shared memory (the opt-in above 48 KiB). */
drama_status dr_cuda_smem_optin(const void *fn, const char *what, drama_error *err);

/* DRAMA_OK, or the runtime's error for `what` (cudaGetLastError after a launch). */
drama_status dr_cuda_check(cudaError_t e, const char *what, drama_error *err);

/* Launches one kernel for all jobs of b (same fmt). Returns the launch error. */
cudaError_t dr_cuda_launch_matvec(int fmt, const mv_batch *b, cudaStream_t stream);
/* The same with a planted defect (cuda_contract.h; matvec_defect.cu); cudaErrorInvalidValue for a
 * defect not compiled for fmt. */
cudaError_t dr_cuda_launch_matvec_defect(int fmt, int defect, const mv_batch *b, cudaStream_t stream);

#endif
