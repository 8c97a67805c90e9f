/* cmd_generate.c - `drama generate`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama generate: not implemented yet\n");
    return DR_EXIT_ERROR;
}
