/* cli_backend.c - `--backend cpu|cuda|auto` and `--device N`, the same on every command that runs
 * the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli_args.h"
#include "cli/commands.h"

int dr_cli_backend_value(const char *cmd, const char *flag, const char *v, dr_backend_choice *c) {
    if (strcmp(flag, "--backend") && strcmp(flag, "--device")) return 0;
    if (!v) {
        fprintf(stderr, "drama %s: %s: missing value\n", cmd, flag);
        return -1;
    }
    if (!strcmp(flag, "--backend")) {
        drama_error e = {0};
        if (dr_backend_parse(v, &c->want, &e)) {
            fprintf(stderr, "drama %s: --%s\n", cmd, e.message);
            return -1;
        }
        return 1;
    }
    long long d;
    if (!dr_cli_int(cmd, "--device", v, 0, 1023, &d)) return -1;
    c->device = (int)d;
    return 1;
}

int dr_cli_backend_arg(const char *cmd, int argc, char **argv, int *i, dr_backend_choice *c) {
    const char *a = argv[*i];
    if (strcmp(a, "--backend") && strcmp(a, "--device")) return 0;
    const char *v = *i + 1 < argc ? argv[++*i] : NULL;
    return dr_cli_backend_value(cmd, a, v, c);
}
