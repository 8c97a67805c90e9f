/* tensor.h - dtypes and zero-copy tensor views shared by every stage.
 * A dr_tensor never owns its data: it points into a mapping (safetensors, torch zip) or into a
 * buffer whose owner is documented where the view is produced. Data may be unaligned. */
#ifndef DRAMA_BASE_TENSOR_H
#define DRAMA_BASE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum dr_dtype {
    DR_DT_INVALID = 0,
    DR_DT_BOOL, DR_DT_U8, DR_DT_I8, DR_DT_U16, DR_DT_I16, DR_DT_U32, DR_DT_I32, DR_DT_U64, DR_DT_I64,
    DR_DT_F16, DR_DT_BF16, DR_DT_F32, DR_DT_F64,
    DR_DT_F8_E4M3, DR_DT_F8_E5M2,
    DR_DT_F8_E8M0, /* known to safetensors; no engine role uses it (reported when bound) */
    DR_DT_F4,      /* packed half-byte elements; no engine role uses it as a dtype */
    DR_DT_COUNT
} dr_dtype;

#define DR_MAX_DIMS 8

typedef struct dr_tensor {
    const char *name;     /* owned by the container that produced the view */
    dr_dtype dtype;
    int ndim;
    int64_t shape[DR_MAX_DIMS];
    const uint8_t *data;  /* little-endian, row-major, possibly unaligned */
    size_t nbytes;
} dr_tensor;

/* safetensors dtype name ("BF16", "F8_E4M3", ...) <-> enum; unknown names give DR_DT_INVALID. */
dr_dtype dr_dtype_from_name(const char *name);
const char *dr_dtype_name(dr_dtype dt);
size_t dr_dtype_size(dr_dtype dt); /* whole bytes per element; 0 for invalid and for F4 */
size_t dr_dtype_bits(dr_dtype dt); /* bits per element (F4: 4); 0 for invalid */
int64_t dr_tensor_numel(const dr_tensor *t);

#endif
