/* cmd_contract.c - `drama contract`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_contract(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama contract: not implemented yet\n");
    return DR_EXIT_ERROR;
}
