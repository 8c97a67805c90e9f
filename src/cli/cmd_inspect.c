/* cmd_inspect.c - `drama inspect DIR [--set name=value]...` (docs/tools.md). Exit 0 when the
 * checkpoint is loadable, 1 when something fatal was found, 2 on a bad command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "tools/inspect.h"

static void usage(FILE *f) {
    fprintf(f, "usage: drama inspect DIR [--set name=value]...\n\n"
               "Prints the files, config summary, every switch with value and source, token ids,\n"
               "shards, the tensor inventory, backbone prefix and expert layouts, the codec, the chat\n"
               "template and every finding against what the engine expects. Exit 0 when loadable.\n");
}

int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    int n_sets = 0, rc = DR_EXIT_OK;
    if (!sets) return DR_EXIT_ERROR;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(sets);
            return DR_EXIT_OK;
        }
        if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc || !strchr(argv[i + 1], '=')) {
                fprintf(stderr, "drama inspect: --set needs name=value\n");
                free(sets);
                return DR_EXIT_USAGE;
            }
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            sets[n_sets++] = argv[i] + 6;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "drama inspect: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            free(sets);
            return DR_EXIT_USAGE;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        usage(stderr);
        free(sets);
        return DR_EXIT_USAGE;
    }
    dr_inspect_options o = {.sets = sets, .n_sets = n_sets};
    drama_error err = {0};
    int loadable = 0;
    if (dr_inspect(dir, &o, stdout, &loadable, &err)) {
        fprintf(stderr, "drama inspect: %s\n", err.message);
        rc = DR_EXIT_ERROR;
    } else if (!loadable) {
        fprintf(stderr, "drama inspect: %s is not loadable (see findings)\n", dir);
        rc = DR_EXIT_ERROR;
    }
    free(sets);
    return rc;
}
