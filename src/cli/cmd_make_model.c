/* cmd_make_model.c - `drama make-model`. PLACEHOLDER until its issue lands: fails loudly. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_make_model(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "drama make-model: not implemented yet\n");
    return DR_EXIT_ERROR;
}
