/* contract_cuda.c - `drama contract` entries for the CUDA kernels (src/backend/cuda). (registry hook; entries to come) */
#include "tools/contract_internal.h"

int ct_cuda_kernels(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}

int ct_cuda_controls(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}
