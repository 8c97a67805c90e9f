/* fuzz_manifest.c - drama-manifest.json parser (libFuzzer). A failure must carry a message; a
 * success must obey manifest.h: every path passes dr_manifest_path_ok, no two are equal (find
 * returns each entry itself), every digest is 64 lowercase hex digits. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dr_manifest *m = NULL;
    drama_error err = {0};
    if (dr_manifest_parse((const char *)data, size, "fuzz.json", &m, &err) != DRAMA_OK) {
        if (!err.message[0] || m) abort();
        return 0;
    }
    if (!m || m->count < 0 || (m->count && !m->files)) abort();
    for (int64_t i = 0; i < m->count; i++) {
        const dr_manifest_file *f = &m->files[i];
        const char *why = NULL;
        if (!f->path || !dr_manifest_path_ok(f->path, &why)) abort();
        if (dr_manifest_find(m, f->path) != f) abort();
        if (strlen(f->sha256) != 64 || strspn(f->sha256, "0123456789abcdef") != 64) abort();
    }
    dr_manifest_free(m);
    return 0;
}
