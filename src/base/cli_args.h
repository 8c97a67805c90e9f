/* cli_args.h - the one way `drama` subcommands (and bench tools) parse numeric flag values. Each returns 1 and sets
 * *out when V is a whole, in-range value, else prints "drama CMD: FLAG: invalid value 'V': why"
 * to stderr and returns 0 (the caller exits DR_EXIT_USAGE). A NULL V is a missing value. */
#ifndef DRAMA_CLI_ARGS_H
#define DRAMA_CLI_ARGS_H

#include <stdint.h>

int dr_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out);
/* A finite number in [lo, hi]; lo_open makes the interval (lo, hi]. */
int dr_cli_num(const char *cmd, const char *flag, const char *v, double lo, double hi, int lo_open, double *out);
/* Any 64-bit integer: a negative value keeps its two's-complement bits (TEXT.md 5.6). */
int dr_cli_seed(const char *cmd, const char *flag, const char *v, uint64_t *out);

#endif
