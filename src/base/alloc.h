/* alloc.h - aligned allocation with size-overflow checks. Free with dr_free. */
#ifndef DRAMA_BASE_ALLOC_H
#define DRAMA_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#define DR_ALIGN 64

void *dr_alloc(size_t bytes);                 /* 64-byte aligned, uninitialised; NULL on failure */
void *dr_calloc(size_t count, size_t size);   /* zeroed; NULL on overflow or failure */
void dr_free(void *p);
/* a*b into *out without overflow; returns 0 on overflow. */
int dr_mul_size(size_t a, size_t b, size_t *out);

#endif
