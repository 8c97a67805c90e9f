/* bytes.h - a growable byte buffer (response bodies, uploads, encoder output). */
#ifndef DRAMA_SERVE_BYTES_H
#define DRAMA_SERVE_BYTES_H

#include <stddef.h>
#include <stdint.h>

typedef struct dr_bytes {
    uint8_t *data;
    size_t len, cap;
} dr_bytes;

/* Append n bytes; returns 0, or -1 when memory runs out (the buffer is unchanged). */
int dr_bytes_append(dr_bytes *b, const void *p, size_t n);
/* Remove the first n bytes (those already sent). */
void dr_bytes_consume(dr_bytes *b, size_t n);
void dr_bytes_free(dr_bytes *b);

#endif
