/* cmd_contract.c - `drama contract [--only PATTERN] [--no-limits] [--threads N] [--seed S] [--list]
 * [--golden DIR]`:
 * every registered kernel against its float64 reference plus the planted controls (docs/contract.md).
 * Exit 0 when every kernel passes and every control is red, 1 otherwise, 2 on a bad command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli_args.h"
#include "cli/commands.h"
#include "tools/contract.h"

static void usage(FILE *f) {
    fprintf(f, "usage: drama contract [--only PATTERN] [--no-limits] [--threads N] [--seed S] [--list]\n"
               "                      [--golden DIR]\n\n"
               "Checks every kernel (matmul per stored format and code path on the CPU and on CUDA,\n"
               "the ops of the backbone, tower and sampler, the codec's kernels) against a float64\n"
               "reference on random, ragged and adversarial fixtures, and runs planted defects that\n"
               "must be caught. PATTERN is a glob or a substring, matched against each name and\n"
               "against <backend>/<name> (e.g. cuda, 'cpu*/matmul.nvfp4'). --no-limits skips the timing runs (times are reported,\n"
               "never enforced). --golden (default $DRAMA_GOLDEN) adds the format fixtures of\n"
               "ref/quant-units.safetensors. The last line is\n"
               "  SUMMARY N kernels: P pass, F fail; C controls: R red as planted, M missed\n");
}

int cmd_contract(int argc, char **argv) {
    dr_contract_options o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        } else if (!strcmp(a, "--only") && i + 1 < argc) {
            o.only = argv[++i];
        } else if (!strncmp(a, "--only=", 7)) {
            o.only = a + 7;
        } else if (!strcmp(a, "--golden") && i + 1 < argc) {
            o.golden = argv[++i];
        } else if (!strcmp(a, "--no-limits")) {
            o.no_limits = 1;
        } else if (!strcmp(a, "--list")) {
            o.list = 1;
        } else if ((!strcmp(a, "--threads") || !strcmp(a, "--seed")) && i + 1 < argc) {
            long long t;
            if (a[2] == 't') {
                if (!dr_cli_int("contract", a, argv[i + 1], 1, 1024, &t)) return DR_EXIT_USAGE;
                o.threads = (int)t;
            } else if (!dr_cli_seed("contract", a, argv[i + 1], &o.seed)) {
                return DR_EXIT_USAGE;
            }
            i++;
        } else {
            fprintf(stderr, "drama contract: unexpected argument '%s'\n", a);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    dr_contract_summary s;
    int rc = dr_contract_run(&o, stdout, &s);
    if (o.list && s.listed == 0) {
        fprintf(stderr, "drama contract: no kernel matches '%s'\n", o.only ? o.only : "");
        return DR_EXIT_USAGE;
    }
    if (!o.list && s.kernels == 0 && s.controls == 0) {
        if (s.not_run)
            fprintf(stderr, "drama contract: none of the %d selected entries can run here: %s\n", s.not_run,
                    s.not_run_why);
        else
            fprintf(stderr, "drama contract: no kernel matches '%s'\n", o.only ? o.only : "");
        return DR_EXIT_USAGE;
    }
    return rc ? DR_EXIT_ERROR : DR_EXIT_OK;
}
