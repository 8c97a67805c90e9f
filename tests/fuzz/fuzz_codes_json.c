/* fuzz_codes_json.c - CODES.json parser (libFuzzer). The input is parsed with any width and no
 * bounds, and with the model's 10 codebooks and their bounds (4096 semantic, 1024 others). A
 * failure must carry a message; a success must obey codes_json.h (the width, every code inside
 * its bound, dr_codes_check agrees) and survive a write + re-parse unchanged. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/codes_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const int32_t k_upper[10] = {4096, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024};

static void check(const dr_codes *c, int64_t width, const int32_t *upper) {
    if (c->n_frames < 0) abort();
    if (width > 0 && c->n_codebooks != width) abort();
    if (c->n_frames > 0 && (c->n_codebooks < 1 || !c->data)) abort();
    for (int64_t f = 0; f < c->n_frames; f++)
        for (int64_t k = 0; k < c->n_codebooks; k++) {
            int32_t v = c->data[f * c->n_codebooks + k];
            if (v < 0 || (upper && v >= upper[k])) abort();
        }
    drama_error err = {0};
    if (upper && dr_codes_check(c, upper, "fuzz", &err)) abort();
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    if (!fp) return;
    drama_status st = dr_codes_write_stream(fp, c, &err);
    fclose(fp);
    if (st) abort(); /* the writer takes whatever the parser produced */
    dr_codes back;
    if (dr_codes_parse(text, len, "roundtrip", c->n_codebooks > 0 ? c->n_codebooks : 0, NULL, &back, &err)) abort();
    if (back.n_frames != c->n_frames) abort();
    if (c->n_frames && (back.n_codebooks != c->n_codebooks ||
                        memcmp(back.data, c->data, (size_t)(c->n_frames * c->n_codebooks) * sizeof *c->data)))
        abort();
    dr_codes_free(&back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int k = 0; k < 2; k++) {
        int64_t width = k ? 10 : 0;
        const int32_t *upper = k ? k_upper : NULL;
        dr_codes c;
        drama_error err = {0};
        if (dr_codes_parse((const char *)data, size, "fuzz.json", width, upper, &c, &err) == DRAMA_OK) {
            check(&c, width, upper);
            dr_codes_free(&c);
        } else if (!err.message[0] || c.data) {
            abort();
        }
    }
    return 0;
}
