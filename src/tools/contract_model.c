/* contract_model.c - `drama contract` entries for model-level element-wise kernels. (registry hook; entries to come) */
#include "tools/contract_internal.h"

int ct_model_kernels(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}

int ct_model_controls(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}
