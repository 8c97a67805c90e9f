/* cmd_bench.c - `drama bench SUBCOMMAND [options]`: benchmarks printed as a table that ends with
 * the roofline (`ratio_to_floor`). Each subcommand lives in src/tools/bench_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "tools/bench.h"

typedef struct bench_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} bench_cmd;

static const bench_cmd k_benches[] = {
    {"bandwidth", dr_bench_bandwidth_main, "memory read bandwidth (the roofline every bench divides by)"},
    {"decode", dr_bench_decode_main, "backbone decode step at full width (synthetic model) vs the bandwidth floor"},
    {"frame", dr_bench_frame_main, "the frame step at batch 1 on a model (cpu|cuda) vs the floor; time to first codes"},
    {"codec", dr_bench_codec_main, "codec decode/encode at the real size: frames/s, x real time, % of the fp32 FMA peak"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: drama bench SUBCOMMAND [options]\n\n");
    for (size_t i = 0; i < sizeof k_benches / sizeof k_benches[0]; i++)
        fprintf(f, "  %-10s %s\n", k_benches[i].name, k_benches[i].help);
    fprintf(f, "\nRun `drama bench SUBCOMMAND --help` for its options. Every bench ends with the line\n"
               "`ratio_to_floor X`: measured time / (bytes moved / bandwidth measured in the same run).\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DR_EXIT_USAGE : DR_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_benches / sizeof k_benches[0]; i++)
        if (!strcmp(argv[1], k_benches[i].name)) return k_benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "drama bench: unknown benchmark '%s'\n\n", argv[1]);
    usage(stderr);
    return DR_EXIT_USAGE;
}
