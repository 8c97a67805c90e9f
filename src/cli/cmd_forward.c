/* cmd_forward.c - `drama forward`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_forward(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama forward: not implemented yet\n");
    return DR_EXIT_ERROR;
}
