/* bench.h - what every `drama bench` subcommand shares: a clock, the memory bandwidth measured in
 * the same run (the roofline), and one output format: a table of "name value unit" lines ending
 * with `ratio_to_floor X` = measured time / (bytes moved / measured bandwidth). */
#ifndef DRAMA_TOOLS_BENCH_H
#define DRAMA_TOOLS_BENCH_H

#include <stddef.h>

#include "base/pool.h"

double dr_bench_now(void);   /* monotonic seconds */
double dr_bench_cpu_s(void); /* CPU seconds of the whole process (all its threads) */

/* Read bandwidth in GB/s (1e9 bytes/s): every pool thread (NULL: the caller alone) sums its share
 * of a `bytes` buffer (0: 1 GiB, larger than any cache), best of `reps` passes (0: 5). 0 when the
 * buffer cannot be allocated. */
double dr_bench_read_gbs(dr_pool *pool, size_t bytes, int reps);

/* One table line: "  name  value unit" (value printed with %.*f). */
void dr_bench_line(const char *name, double value, int decimals, const char *unit);
/* The roofline block every bench ends with: bytes per step, bandwidth, floor and, last,
 * `ratio_to_floor X`. Returns the ratio (0 when bandwidth or bytes are 0). */
double dr_bench_roofline(double seconds_per_step, double bytes_per_step, double gbs, const char *bandwidth_from);

/* Subcommands (argv[0] is the subcommand name); each returns a process exit status. */
int dr_bench_bandwidth_main(int argc, char **argv); /* bench.c */
int dr_bench_decode_main(int argc, char **argv);    /* bench_decode.c */
int dr_bench_codec_main(int argc, char **argv);     /* bench_codec.c */
int dr_bench_frame_main(int argc, char **argv);     /* bench_frame.c */

#endif
