/* commands.h - the `drama` subcommands. Each takes argv after the subcommand name
 * (argv[0] is the subcommand) and returns the process exit status (docs/cli.md lists them). */
#ifndef DRAMA_CLI_COMMANDS_H
#define DRAMA_CLI_COMMANDS_H

#include "backend/select/select.h"

int cmd_inspect(int argc, char **argv);     /* cmd_inspect.c */
int cmd_make_model(int argc, char **argv);  /* cmd_make_model.c */
int cmd_verify(int argc, char **argv);      /* cmd_verify.c: SHA-256 against a manifest */
int cmd_forward(int argc, char **argv);     /* cmd_forward.c */
int cmd_generate(int argc, char **argv);    /* cmd_generate.c */
int cmd_tokenize(int argc, char **argv);    /* cmd_tokenize.c */
int cmd_prompt(int argc, char **argv);      /* cmd_prompt.c */
int cmd_codec(int argc, char **argv);       /* cmd_codec.c: encode | decode */
int cmd_synthesize(int argc, char **argv);  /* cmd_synthesize.c */
int cmd_contract(int argc, char **argv);    /* cmd_contract.c */
int cmd_optimize(int argc, char **argv);    /* cmd_optimize.c */
int cmd_pull(int argc, char **argv);        /* cmd_pull.c: download + verify from a hub */
int cmd_serve(int argc, char **argv);       /* cmd_serve.c: the HTTP server */
int cmd_bench(int argc, char **argv);       /* cmd_bench.c: benchmarks with their roofline */

/* `--backend cpu|cuda|auto` / `--device N` at argv[*i] (cli_backend.c): 1 = taken (*i at its
 * value), 0 = not one of them, -1 = bad or missing value (printed; exit DR_EXIT_USAGE). The
 * _value form takes the flag and its value (NULL: missing) separately. */
int dr_cli_backend_arg(const char *cmd, int argc, char **argv, int *i, dr_backend_choice *c);
int dr_cli_backend_value(const char *cmd, const char *flag, const char *value, dr_backend_choice *c);
#define DR_CLI_BACKEND_HELP                                                                                            \
    "  --backend B               cpu | cuda | auto (default auto: CUDA when a usable GPU is present)\n"             \
    "  --device N                GPU index for cuda (default 0)\n"

/* Exit statuses shared by all commands. */
enum {
    DR_EXIT_OK = 0,
    DR_EXIT_ERROR = 1,       /* any failure not listed below */
    DR_EXIT_USAGE = 2,       /* bad command line */
    DR_EXIT_FRAME_LIMIT = 3, /* generation hit the frame cap: nothing published */
    DR_EXIT_CANCELLED = 130  /* SIGINT/SIGTERM: nothing published (128 + SIGINT) */
};

#endif
