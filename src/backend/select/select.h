/* select.h - choosing a backend: `--backend cpu|cuda|auto` and `--device N`.
 * auto = CUDA when this build has the CUDA backend and a usable GPU is present, else the CPU;
 * cuda without one fails with the reason (no CUDA in this build, no device, device index out of
 * range, or the backend cannot run the model). */
#ifndef DRAMA_BACKEND_SELECT_SELECT_H
#define DRAMA_BACKEND_SELECT_SELECT_H

#include "backend/backend.h"
#include "base/error.h"
#include "base/pool.h"
#include "codec/codec.h"

/* the values of drama_backend (include/drama.h) */
typedef enum dr_backend_want { DR_WANT_AUTO = 0, DR_WANT_CPU = 1, DR_WANT_CUDA = 2 } dr_backend_want;

typedef struct dr_backend_choice {
    dr_backend_want want;
    int device;               /* GPU index (CUDA); 0 by default */
} dr_backend_choice;

/* "cpu", "cuda" or "auto"; the error names the value. */
drama_status dr_backend_parse(const char *name, dr_backend_want *out, drama_error *err);
const char *dr_backend_want_name(dr_backend_want w);

/* Opens the chosen backend (pool: the CPU backend's threads, not owned). Free with dr_backend_free. */
drama_status dr_backend_open(const dr_backend_choice *c, dr_pool *pool, dr_backend **out, drama_error *err);

/* Where the codec decoder runs for that choice: cuda attaches the device decoder to c (failure:
 * the reason, c stays on the CPU), auto attaches it when a GPU is usable (else the CPU, quietly),
 * cpu leaves c alone. *where (may be NULL) receives "cpu" or "cuda". */
drama_status dr_backend_codec_attach(const dr_backend_choice *ch, dr_codec *c, const char **where, drama_error *err);

#endif
