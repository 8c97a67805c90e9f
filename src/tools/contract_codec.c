/* contract_codec.c - `drama contract` entries for the codec's kernels (src/codec): conv, transposed conv, snake, layer norm, transformer pieces. (registry hook; entries to come) */
#include "tools/contract_internal.h"

int ct_codec_kernels(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}

int ct_codec_controls(ct_kernel *out, int max) {
    (void)out;
    (void)max;
    return 0;
}
