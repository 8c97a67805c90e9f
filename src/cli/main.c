/* main.c - `drama` entry point: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "drama.h"
#ifdef DRAMA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command k_commands[] = {
    {"synthesize", cmd_synthesize, "text (+ reference voices) to a WAV file"},
    {"inspect", cmd_inspect, "show a model directory and how it differs from what the engine expects"},
    {"make-model", cmd_make_model, "write a random-weight checkpoint in the real layout"},
    {"verify", cmd_verify, "check files against a SHA-256 manifest"},
    {"tokenize", cmd_tokenize, "text to token ids (or ids back to text)"},
    {"prompt", cmd_prompt, "build the prompt rows (ROWS.json) for a text"},
    {"forward", cmd_forward, "run the backbone on ROWS.json and dump hidden states and logits"},
    {"generate", cmd_generate, "prefill ROWS.json and generate frames (CODES.json)"},
    {"codec", cmd_codec, "encode audio to codes or decode codes to audio"},
    {"contract", cmd_contract, "check every kernel against a float64 reference"},
    {"pull", cmd_pull, "download a checkpoint from a Hugging Face-compatible hub, verified"},
    {"optimize", cmd_optimize, "re-encode (fp8, nvfp4, q4, bf16) or prune the routed experts"},
    {"bench", cmd_bench, "benchmarks printed with their roofline (ratio_to_floor)"},
    {"serve", cmd_serve, "HTTP server: fish-speech /v1/tts, OpenAI /v1/audio/speech, voices, metrics"},
};

static void usage(FILE *f) {
    fprintf(f, "drama %s (%s) - native inference for Fish Audio Drama 3\n\nusage: drama COMMAND [options]\n\n",
            drama_version(), drama_git_commit());
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "  %-12s %s\n\nRun `drama COMMAND --help` for a command's options.\n", "version",
            "print the version and commit");
}

/* Version, commit, and each backend compiled in with whether it is usable here. */
static void print_version(void) {
    printf("drama %s %s\nbackends: cpu (usable)", drama_version(), drama_git_commit());
#ifdef DRAMA_HAVE_CUDA
    char why[256] = "";
    int n = dr_cuda_device_count(why, sizeof why);
    if (n > 0) printf(", cuda (usable, %d device%s)", n, n == 1 ? "" : "s");
    else printf(", cuda (compiled in, not usable: %s)", why[0] ? why : "no device");
#endif
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DR_EXIT_USAGE : DR_EXIT_OK;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        print_version();
        return DR_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "drama: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return DR_EXIT_USAGE;
}
