/* torchzip.h - read a PyTorch `torch.save` archive (codec.pth) without Python (CODEC.md section 10).
 *
 * The file is mmapped; the ZIP central directory is validated (stored entries only, data inside
 * the file, unique names, ZIP64 accepted), the single `<prefix>/data.pkl` is run through the
 * restricted unpickler (io/unpickle.h) and every tensor of the state dict becomes a dr_tensor
 * view into the mapping. Last, every member's bytes are checked against its CRC-32 (an error
 * names the member); this reads the whole file once at open. Views of non-contiguous tensors are copies owned by the handle.
 * A `{"state_dict": {...}}` wrapper is unwrapped (its other keys ignored). Names are kept as
 * stored (no prefix stripping here). Views stay valid until dr_pth_close. */
#ifndef DRAMA_IO_TORCHZIP_H
#define DRAMA_IO_TORCHZIP_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"

typedef struct dr_pth dr_pth;

drama_status dr_pth_open(const char *path, dr_pth **out, drama_error *err);
/* Same checks on an in-memory image (`data` must outlive the handle); for fuzzing and tests. */
drama_status dr_pth_open_memory(const void *data, size_t size, const char *label, dr_pth **out,
                                drama_error *err);
void dr_pth_close(dr_pth *p);

int64_t dr_pth_count(const dr_pth *p);                    /* tensors, in pickle order */
const dr_tensor *dr_pth_at(const dr_pth *p, int64_t i);
const dr_tensor *dr_pth_find(const dr_pth *p, const char *name); /* NULL when absent */
const char *dr_pth_prefix(const dr_pth *p);               /* the archive's directory name */
const char *dr_pth_path(const dr_pth *p);

#endif
