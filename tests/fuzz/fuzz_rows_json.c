/* fuzz_rows_json.c - ROWS.json parser (libFuzzer). The input is parsed with any width and with
 * the model's width (11 = token + 10 codes). A failure must carry a message; a success must obey
 * rows_json.h (0 <= prefill <= rows, values 0..INT32_MAX, the requested width) and survive a
 * write + re-parse unchanged. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/rows_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const dr_rows *r, int64_t expect_cols) {
    if (r->n_rows < 0 || r->prefill < 0 || r->prefill > r->n_rows) abort();
    if (expect_cols > 0 && r->n_cols != expect_cols) abort();
    if (r->n_rows > 0 && (r->n_cols < 1 || !r->data)) abort();
    for (int64_t i = 0; i < r->n_rows * r->n_cols; i++)
        if (r->data[i] < 0) abort();
    /* round trip through the writer */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    drama_error err = {0};
    drama_status st = dr_rows_write_stream(f, r, &err);
    fclose(f);
    if (st) abort();
    dr_rows back;
    if (dr_rows_parse(text, len, "roundtrip", r->n_cols > 0 ? r->n_cols : 0, &back, &err)) abort();
    if (back.n_rows != r->n_rows || back.prefill != r->prefill) abort();
    if (r->n_rows && (back.n_cols != r->n_cols ||
                      memcmp(back.data, r->data, (size_t)(r->n_rows * r->n_cols) * sizeof *r->data)))
        abort();
    dr_rows_free(&back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int64_t widths[2] = {0, 11};
    for (int k = 0; k < 2; k++) {
        dr_rows r;
        drama_error err = {0};
        if (dr_rows_parse((const char *)data, size, "fuzz.json", widths[k], &r, &err) == DRAMA_OK) {
            check(&r, widths[k]);
            dr_rows_free(&r);
        } else if (!err.message[0] || r.data) {
            abort(); /* a failure names its cause and leaves nothing allocated */
        }
    }
    return 0;
}
