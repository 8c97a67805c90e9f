/* matmul.h - products with weights in their stored format (num/weight.h), on the CPU.
 * y[n][out] = sum_k x[n][k] * W[out][k], fp32 activations, fp32 accumulation, dequantisation
 * fused into the dot product. Results are bit-identical for any thread count and for any n
 * (row i of y depends only on row i of x). Threads from pool (NULL = inline). */
#ifndef DRAMA_BACKEND_CPU_MATMUL_H
#define DRAMA_BACKEND_CPU_MATMUL_H

#include <stdint.h>

#include "base/pool.h"
#include "num/weight.h"

void dr_cpu_matmul(const dr_weight *w, const float *x, int64_t n, float *y, dr_pool *pool);
/* Only output rows [r0, r1) of W: y[n][r1-r0]. Used for the restricted logits slice of lm_head. */
void dr_cpu_matmul_rows(const dr_weight *w, int64_t r0, int64_t r1, const float *x, int64_t n, float *y,
                        dr_pool *pool);

#endif
