/* safetensors.h - read (mmap, fully validated, zero-copy) and write safetensors files.
 * Rules: ../shared/spec/FORMATS.md section 1. The reader validates the whole header at open and
 * reports the file, tensor and byte offset at fault. Views stay valid until dr_st_close. */
#ifndef DRAMA_IO_SAFETENSORS_H
#define DRAMA_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/tensor.h"

typedef struct dr_st_file dr_st_file;

/* Open and validate `path` (mmap, read-only). On failure *out is NULL and err names the fault. */
drama_status dr_st_open(const char *path, dr_st_file **out, drama_error *err);
/* Validate an in-memory image (no mmap; `data` must outlive the handle). For fuzzing and tests. */
drama_status dr_st_open_memory(const void *data, size_t size, const char *label, dr_st_file **out,
                               drama_error *err);
void dr_st_close(dr_st_file *f);

const char *dr_st_path(const dr_st_file *f);
int64_t dr_st_count(const dr_st_file *f);                      /* tensors, in header order */
const dr_tensor *dr_st_at(const dr_st_file *f, int64_t i);
const dr_tensor *dr_st_find(const dr_st_file *f, const char *name); /* NULL when absent */
/* __metadata__ value for key, or NULL. Keys in order via dr_st_metadata_at. */
const char *dr_st_metadata(const dr_st_file *f, const char *key);
int64_t dr_st_metadata_count(const dr_st_file *f);
void dr_st_metadata_at(const dr_st_file *f, int64_t i, const char **key, const char **value);
size_t dr_st_header_len(const dr_st_file *f);                  /* N, the header byte count */
size_t dr_st_file_size(const dr_st_file *f);

/* Copy a tensor of any float dtype (F32/F16/BF16/F64/F8_E4M3) into float32; ints I32/I64/U8 to float too.
 * `out` holds numel values. Handles unaligned data. */
drama_status dr_st_to_f32(const dr_tensor *t, float *out, drama_error *err);

/* ---- writer: declare every tensor, then stream their data in the same order ----
 * Written to "<path>.tmp" and renamed over `path` by dr_st_writer_finish; dr_st_writer_abort
 * (or a failed finish) removes the temporary. Memory stays bounded by the header size. */
typedef struct dr_st_writer dr_st_writer;

drama_status dr_st_writer_create(const char *path, dr_st_writer **out, drama_error *err);
drama_status dr_st_writer_metadata(dr_st_writer *w, const char *key, const char *value, drama_error *err);
drama_status dr_st_writer_declare(dr_st_writer *w, const char *name, dr_dtype dtype, int ndim,
                                  const int64_t *shape, drama_error *err);
/* Append bytes of the declared tensors, in declaration order; may be called many times per tensor. */
drama_status dr_st_writer_write(dr_st_writer *w, const void *bytes, size_t n, drama_error *err);
drama_status dr_st_writer_finish(dr_st_writer *w, drama_error *err); /* frees w */
void dr_st_writer_abort(dr_st_writer *w);                            /* frees w */
/* Options, before the first write: pad header to 8 bytes (default 1); 0 mimics MLX writers. */
void dr_st_writer_set_padding(dr_st_writer *w, int pad_to_8);

#endif
