/* testbackend.h - the backend the golden tests run on (the parity scaffolding of issue 13):
 * DRAMA_TEST_BACKEND = cpu (default), cuda or auto, DRAMA_TEST_DEVICE = GPU index. The same test
 * program then checks the CPU or the GPU against the same goldens and bounds; ctest registers a
 * `_cuda` twin of each such test in CUDA builds. A backend that cannot open on this machine (no
 * GPU, no CUDA in the build) ends the program with 77: ctest shows it as skipped, never passed. */
#ifndef DRAMA_TESTBACKEND_H
#define DRAMA_TESTBACKEND_H

#include "backend/backend.h"
#include "backend/select/select.h"
#include "model/backbone.h"
#include "model/tower.h"

dr_backend_choice tu_backend_choice(void);
const char *tu_backend_name(void);
/* The backend states are made on: NULL for the CPU (states in host memory, each call with the
 * test's own pool, so thread counts stay under test), else the opened backend, the model
 * constants of bb / tower uploaded to it (either may be NULL). Free with dr_backend_free. */
dr_backend *tu_backend_open(const dr_backbone *bb, const dr_tower *tower);
/* After a call that opens a backend failed: exit 77 (printing why) when the test backend is not
 * the CPU and the failure says it is unavailable here; otherwise return. */
void tu_backend_skip_unavailable(drama_status st, const drama_error *e);

#endif
