/* rows_json.c - ROWS.json reader and writer (see rows_json.h). */
#include "io/rows_json.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "io/json_matrix.h"

drama_status dr_rows_create(dr_rows *out, int64_t n_rows, int64_t n_cols, drama_error *err) {
    memset(out, 0, sizeof *out);
    if (n_rows < 0 || n_cols < 1)
        return dr_fail(err, DRAMA_EINVAL, "rows: invalid matrix shape %lld x %lld", (long long)n_rows,
                       (long long)n_cols);
    out->data = dr_int_matrix_alloc(n_rows, n_cols);
    if (!out->data)
        return dr_fail(err, DRAMA_ENOMEM, "rows: matrix %lld x %lld too large or out of memory", (long long)n_rows,
                       (long long)n_cols);
    out->n_rows = n_rows;
    out->n_cols = n_cols;
    out->prefill = n_rows;
    return DRAMA_OK;
}

void dr_rows_free(dr_rows *rows) {
    if (!rows) return;
    free(rows->data);
    memset(rows, 0, sizeof *rows);
}

drama_status dr_rows_parse(const char *json, size_t len, const char *label, int64_t expect_cols,
                           dr_rows *out, drama_error *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = "ROWS.json";
    dr_json_matrix_spec spec = {.key = "rows", .row_name = "row", .token_column = 1, .width = expect_cols};
    json_t *root;
    int64_t n_rows, n_cols;
    drama_status st = dr_json_matrix_parse(json, len, label, &spec, &root, &out->data, &n_rows, &n_cols, err);
    if (st) return st;
    out->n_rows = n_rows;
    out->n_cols = n_cols;
    out->prefill = n_rows;
    json_t *prefill = json_object_get(root, "prefill");
    if (prefill && (!json_is_integer(prefill) || json_integer_value(prefill) < 0 || json_integer_value(prefill) > n_rows))
        st = dr_fail(err, DRAMA_EFORMAT, "%s: \"prefill\": expected an integer in 0..%lld (the number of rows)", label,
                     (long long)n_rows);
    else if (prefill)
        out->prefill = json_integer_value(prefill);
    json_decref(root);
    if (st) dr_rows_free(out);
    return st;
}

drama_status dr_rows_read(const char *path, int64_t expect_cols, dr_rows *out, drama_error *err) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    drama_status st = dr_read_file(path, DR_FILE_MAX_BYTES, &text, &len, err);
    if (st) return st;
    st = dr_rows_parse(text, len, strcmp(path, "-") == 0 ? "stdin" : path, expect_cols, out, err);
    free(text);
    return st;
}

drama_status dr_rows_write_stream(FILE *f, const dr_rows *rows, drama_error *err) {
    if (rows->n_rows < 0 || rows->prefill < 0 || rows->prefill > rows->n_rows || (rows->n_rows && !rows->data))
        return dr_fail(err, DRAMA_EINVAL, "rows: inconsistent matrix (rows %lld, prefill %lld)",
                       (long long)rows->n_rows, (long long)rows->prefill);
    fputs("{\"rows\": [", f);
    for (int64_t r = 0; r < rows->n_rows; r++) {
        fputs(r ? ",\n  [" : "\n  [", f);
        for (int64_t c = 0; c < rows->n_cols; c++)
            fprintf(f, c ? ", %d" : "%d", (int)rows->data[r * rows->n_cols + c]);
        fputc(']', f);
    }
    fprintf(f, "%s], \"prefill\": %lld}\n", rows->n_rows ? "\n" : "", (long long)rows->prefill);
    if (ferror(f)) return dr_fail(err, DRAMA_EIO, "ROWS.json: write error");
    return DRAMA_OK;
}

/* Through "<path>.tmp" + rename ("-" = stdout), so a failure leaves no file. */
drama_status dr_io_write_file(const char *path, dr_io_writer write, const void *ctx, drama_error *err) {
    if (!*path) return dr_fail(err, DRAMA_EINVAL, "output: empty file name");
    if (strcmp(path, "-") == 0) {
        drama_status st = write(stdout, ctx, err);
        if (!st && fflush(stdout) != 0) st = dr_fail(err, DRAMA_EIO, "stdout: write error");
        return st;
    }
    size_t n = strlen(path) + 5;
    char *tmp = malloc(n);
    if (!tmp) return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", path);
    snprintf(tmp, n, "%s.tmp", path);
    /* a stale temporary, or a link planted at its name, is removed and never written through */
    if (unlink(tmp) != 0 && errno != ENOENT) {
        drama_status st = dr_fail(err, DRAMA_EIO, "%s: cannot remove the old temporary: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        drama_status st = dr_fail(err, DRAMA_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd), remove(tmp);
        free(tmp);
        return st;
    }
    drama_status st = write(f, ctx, err);
    if (fclose(f) != 0 && !st) st = dr_fail(err, DRAMA_EIO, "%s: write error", tmp);
    if (!st && rename(tmp, path) != 0) st = dr_fail(err, DRAMA_EIO, "%s: cannot rename: %s", path, strerror(errno));
    if (st) remove(tmp);
    free(tmp);
    return st;
}

static drama_status write_rows(FILE *f, const void *rows, drama_error *err) { return dr_rows_write_stream(f, rows, err); }

drama_status dr_rows_write(const char *path, const dr_rows *rows, drama_error *err) {
    return dr_io_write_file(path, write_rows, rows, err);
}
