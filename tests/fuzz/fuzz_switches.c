/* fuzz_switches.c - engine switches (libFuzzer): `--set name=value` strings and drama-engine.json
 * applied to the tiny model's config.json (seeds/fuzz_config/tiny.json, read once through
 * $DRAMA_SRC or this file's path). Input: one --set string per line, then optionally a NUL byte
 * and drama-engine.json. A failure must carry a message; a success must print every switch as
 * JSON, and every switch set on the command line must report that source. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SETS 16

static char *g_config;
static size_t g_config_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char path[4096];
    const char *root = getenv("DRAMA_SRC"), *src = __FILE__, *slash = strrchr(src, '/');
    if (root) /* set by ctest */
        snprintf(path, sizeof path, "%s/tests/fuzz/seeds/fuzz_config/tiny.json", root);
    else /* this file's folder (CMake compiles it by its absolute path) */
        snprintf(path, sizeof path, "%.*s/seeds/fuzz_config/tiny.json", slash ? (int)(slash - src) : 1, slash ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_switches: cannot read %s\n", path);
        exit(1);
    }
    g_config = malloc(1 << 16);
    g_config_len = g_config ? fread(g_config, 1, 1 << 16, f) : 0;
    fclose(f);
    if (!g_config_len) exit(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t set_len = nul ? (size_t)(nul - data) : size;
    char *text = malloc(set_len + 1);
    if (!text) return 0;
    memcpy(text, data, set_len);
    text[set_len] = '\0';
    const char *sets[MAX_SETS];
    int n_sets = 0;
    for (char *line = text, *next; line && n_sets < MAX_SETS; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        sets[n_sets++] = line;
    }
    const char *engine = nul ? (const char *)nul + 1 : NULL;
    size_t engine_len = nul ? size - set_len - 1 : 0;
    dr_config *c = NULL;
    drama_error err = {0};
    if (dr_config_from_memory(g_config, g_config_len, "config.json", engine, engine_len, sets, n_sets, &c, &err)) {
        if (!err.message[0] || c) abort();
        free(text);
        return 0;
    }
    char buf[8192];
    for (int i = 0; i < dr_switch_def_count(); i++) {
        dr_switch_source src;
        const char *name = dr_switch_def_at(i)->name;
        if (!dr_config_switch_text(c, name, buf, sizeof buf, &src)) abort();
        if (strlen(buf) + 1 < sizeof buf) { /* printed whole: it must be JSON */
            json_t *j = json_loads(buf, JSON_DECODE_ANY, NULL);
            if (!j) abort();
            json_decref(j);
        }
    }
    for (int i = 0; i < n_sets; i++) { /* every accepted --set is in force, from the command line */
        const char *eq = strchr(sets[i], '=');
        char name[128];
        if (!eq || (size_t)(eq - sets[i]) >= sizeof name) abort();
        snprintf(name, sizeof name, "%.*s", (int)(eq - sets[i]), sets[i]);
        dr_switch_source src;
        if (!dr_config_switch_text(c, name, buf, sizeof buf, &src) || src != DR_SRC_CLI) abort();
    }
    dr_config_free(c);
    free(text);
    return 0;
}
