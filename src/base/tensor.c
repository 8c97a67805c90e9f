#include "base/tensor.h"

#include <string.h>

static const struct { const char *name; size_t bits; } k_dtypes[DR_DT_COUNT] = {
    [DR_DT_INVALID] = {"INVALID", 0}, [DR_DT_BOOL] = {"BOOL", 8},  [DR_DT_U8] = {"U8", 8},
    [DR_DT_I8] = {"I8", 8},           [DR_DT_U16] = {"U16", 16},    [DR_DT_I16] = {"I16", 16},
    [DR_DT_U32] = {"U32", 32},         [DR_DT_I32] = {"I32", 32},    [DR_DT_U64] = {"U64", 64},
    [DR_DT_I64] = {"I64", 64},         [DR_DT_F16] = {"F16", 16},    [DR_DT_BF16] = {"BF16", 16},
    [DR_DT_F32] = {"F32", 32},         [DR_DT_F64] = {"F64", 64},    [DR_DT_F8_E4M3] = {"F8_E4M3", 8},
    [DR_DT_F8_E5M2] = {"F8_E5M2", 8},
    [DR_DT_F8_E8M0] = {"F8_E8M0", 8},  [DR_DT_F4] = {"F4", 4},
};

dr_dtype dr_dtype_from_name(const char *name) {
    if (!name) return DR_DT_INVALID;
    for (int i = 1; i < DR_DT_COUNT; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) return (dr_dtype)i;
    return DR_DT_INVALID;
}

const char *dr_dtype_name(dr_dtype dt) {
    return (dt > 0 && dt < DR_DT_COUNT) ? k_dtypes[dt].name : "INVALID";
}

size_t dr_dtype_bits(dr_dtype dt) { return (dt > 0 && dt < DR_DT_COUNT) ? k_dtypes[dt].bits : 0; }

size_t dr_dtype_size(dr_dtype dt) {
    size_t bits = dr_dtype_bits(dt);
    return bits % 8 ? 0 : bits / 8;
}

int64_t dr_tensor_numel(const dr_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
