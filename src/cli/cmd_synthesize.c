/* cmd_synthesize.c - `drama synthesize`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_synthesize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama synthesize: not implemented yet\n");
    return DR_EXIT_ERROR;
}
