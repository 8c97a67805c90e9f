/* fuzz_safetensors.c - libFuzzer target: any byte string through the safetensors validator; an
 * accepted image must give views inside the buffer that convert to float without faults. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dr_st_file *f = NULL;
    drama_error err = {0};
    if (dr_st_open_memory(data, size, "fuzz", &f, &err) != DRAMA_OK) {
        if (f || !err.message[0]) abort(); /* failures always name the problem and return no handle */
        return 0;
    }
    for (int64_t i = 0; i < dr_st_metadata_count(f); i++) {
        const char *k, *v;
        dr_st_metadata_at(f, i, &k, &v);
        if (dr_st_metadata(f, k) == NULL) abort();
    }
    for (int64_t i = 0; i < dr_st_count(f); i++) {
        const dr_tensor *t = dr_st_at(f, i);
        if (t->data < data || t->data + t->nbytes > data + size) abort();
        if (dr_st_find(f, t->name) != t) abort();
        int64_t n = dr_tensor_numel(t);
        if (n > 0 && n <= 4096) {
            float *out = malloc((size_t)n * sizeof *out);
            /* every whole-byte dtype converts; packed sub-byte F4 is refused with a message */
            drama_error cerr = {0};
            if (out && dr_st_to_f32(t, out, &cerr) != DRAMA_OK && (dr_dtype_size(t->dtype) != 0 || !cerr.message[0]))
                abort();
            free(out);
        }
    }
    dr_st_close(f);
    return 0;
}
