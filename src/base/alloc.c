#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

int dr_mul_size(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

void *dr_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    size_t rounded = (bytes + DR_ALIGN - 1) & ~(size_t)(DR_ALIGN - 1);
    if (rounded < bytes) return NULL;
    return aligned_alloc(DR_ALIGN, rounded);
}

void *dr_calloc(size_t count, size_t size) {
    size_t bytes;
    if (!dr_mul_size(count, size, &bytes)) return NULL;
    void *p = dr_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void dr_free(void *p) { free(p); }
