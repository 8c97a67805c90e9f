/* cmd_tokenize.c - `drama tokenize`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama tokenize: not implemented yet\n");
    return DR_EXIT_ERROR;
}
