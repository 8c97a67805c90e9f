/* cuda_seam.h - the CUDA backend of the seam (backend/backend.h): device memory, the model's
 * weights resident in their stored format, every op on the device, and each recorded region (a
 * frame step per lane count) captured once as a CUDA graph and replayed. Design: docs/cuda.md. */
#ifndef DRAMA_BACKEND_CUDA_SEAM_H
#define DRAMA_BACKEND_CUDA_SEAM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"
#include "base/error.h"

/* Opens device `device` as a backend (free with dr_backend_free). No device: DRAMA_EUNSUPPORTED.
 * DRAMA_CUDA_GRAPHS=0 in the environment runs regions directly instead of capturing them. */
drama_status dr_backend_cuda_create(int device, dr_backend **out, drama_error *err);

#ifdef __cplusplus
}
#endif

#endif
