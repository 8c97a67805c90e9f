/* fuzz_config.c - config.json parsing from memory (libFuzzer). Input: the config text; if it
 * contains a NUL byte, the part after it is used as drama-engine.json. Must never crash or leak. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    const char *engine = nul ? (const char *)nul + 1 : NULL;
    size_t elen = nul ? size - len - 1 : 0;
    dr_config *c = NULL;
    drama_error e;
    memset(&e, 0, sizeof e);
    if (dr_config_from_memory(text, len, "config.json", engine, elen, NULL, 0, &c, &e) == DRAMA_OK) {
        char buf[256];
        for (int i = 0; i < dr_switch_def_count(); i++)
            dr_config_switch_text(c, dr_switch_def_at(i)->name, buf, sizeof buf, NULL);
    }
    dr_config_free(c);
    return 0;
}
