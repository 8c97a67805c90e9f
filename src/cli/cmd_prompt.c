/* cmd_prompt.c - `drama prompt`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_prompt(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama prompt: not implemented yet\n");
    return DR_EXIT_ERROR;
}
