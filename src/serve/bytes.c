/* bytes.c - growable byte buffer. */
#include "serve/bytes.h"

#include <stdlib.h>
#include <string.h>

int dr_bytes_append(dr_bytes *b, const void *p, size_t n) {
    if (n == 0) return 0;
    if (n > SIZE_MAX - b->len - 1) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0; /* text bodies can be used as C strings */
    return 0;
}

void dr_bytes_consume(dr_bytes *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void dr_bytes_free(dr_bytes *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
