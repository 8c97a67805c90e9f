/* codes_json.c - CODES.json reader and writer (see codes_json.h). */
#include "io/codes_json.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/json_matrix.h"
#include "io/rows_json.h"

drama_status dr_codes_create(dr_codes *out, int64_t n_frames, int64_t n_codebooks, drama_error *err) {
    memset(out, 0, sizeof *out);
    if (n_frames < 0 || n_codebooks < 1)
        return dr_fail(err, DRAMA_EINVAL, "codes: invalid shape %lld frames x %lld codebooks", (long long)n_frames,
                       (long long)n_codebooks);
    out->data = dr_int_matrix_alloc(n_frames, n_codebooks);
    if (!out->data)
        return dr_fail(err, DRAMA_ENOMEM, "codes: %lld frames x %lld codebooks too large or out of memory",
                       (long long)n_frames, (long long)n_codebooks);
    out->n_frames = n_frames;
    out->n_codebooks = n_codebooks;
    return DRAMA_OK;
}

void dr_codes_free(dr_codes *codes) {
    if (!codes) return;
    free(codes->data);
    memset(codes, 0, sizeof *codes);
}

drama_status dr_codes_check(const dr_codes *codes, const int32_t *upper, const char *label, drama_error *err) {
    if (!label) label = "codes";
    for (int64_t f = 0; f < codes->n_frames; f++)
        for (int64_t k = 0; k < codes->n_codebooks; k++) {
            int32_t v = codes->data[f * codes->n_codebooks + k];
            if (v < 0 || (upper && v >= upper[k]))
                return dr_fail(err, DRAMA_EFORMAT, "%s: frame %lld codebook %lld: code %d outside 0..%d", label,
                               (long long)f, (long long)k, (int)v, upper ? (int)upper[k] - 1 : INT32_MAX);
        }
    return DRAMA_OK;
}

drama_status dr_codes_parse(const char *json, size_t len, const char *label, int64_t n_codebooks,
                            const int32_t *upper, dr_codes *out, drama_error *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = "CODES.json";
    if (upper && n_codebooks <= 0)
        return dr_fail(err, DRAMA_EINVAL, "%s: per-codebook bounds need the number of codebooks", label);
    dr_json_matrix_spec spec = {.key = "codes", .row_name = "frame", .width = n_codebooks, .upper = upper};
    json_t *root;
    drama_status st =
        dr_json_matrix_parse(json, len, label, &spec, &root, &out->data, &out->n_frames, &out->n_codebooks, err);
    if (!st) json_decref(root);
    return st;
}

drama_status dr_codes_read(const char *path, int64_t n_codebooks, const int32_t *upper, dr_codes *out,
                           drama_error *err) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    drama_status st = dr_read_file(path, DR_FILE_MAX_BYTES, &text, &len, err);
    if (st) return st;
    st = dr_codes_parse(text, len, strcmp(path, "-") == 0 ? "stdin" : path, n_codebooks, upper, out, err);
    free(text);
    return st;
}

drama_status dr_codes_write_stream(FILE *f, const dr_codes *codes, drama_error *err) {
    if (codes->n_frames < 0 || (codes->n_frames && !codes->data))
        return dr_fail(err, DRAMA_EINVAL, "CODES.json: inconsistent matrix (%lld frames)", (long long)codes->n_frames);
    fputs("{\"codes\": [", f);
    for (int64_t r = 0; r < codes->n_frames; r++) {
        fputs(r ? ",\n  [" : "\n  [", f);
        for (int64_t k = 0; k < codes->n_codebooks; k++)
            fprintf(f, k ? ", %d" : "%d", (int)codes->data[r * codes->n_codebooks + k]);
        fputc(']', f);
    }
    fputs(codes->n_frames ? "\n]}\n" : "]}\n", f);
    if (ferror(f)) return dr_fail(err, DRAMA_EIO, "CODES.json: write error");
    return DRAMA_OK;
}

static drama_status write_codes(FILE *f, const void *codes, drama_error *err) {
    return dr_codes_write_stream(f, codes, err);
}

drama_status dr_codes_write(const char *path, const dr_codes *codes, drama_error *err) {
    return dr_io_write_file(path, write_codes, codes, err);
}
