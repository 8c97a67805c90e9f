/* cmd_codec.c - `drama codec`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_codec(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama codec: not implemented yet\n");
    return DR_EXIT_ERROR;
}
