/* cmd_verify.c - `drama verify`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_verify(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama verify: not implemented yet\n");
    return DR_EXIT_ERROR;
}
