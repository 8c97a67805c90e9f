/* cmd_inspect.c - `drama inspect`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama inspect: not implemented yet\n");
    return DR_EXIT_ERROR;
}
