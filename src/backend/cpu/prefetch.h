/* prefetch.h - the software prefetch distances of the SIMD n = 1 loops (matmul_avx2.c,
 * matmul_avx512.c; included inside their x86 sections, after <immintrin.h>; matmul.c takes the constants).
 * The rows of one call are short, interleaved streams that the hardware prefetcher ramps up on too
 * late. A worker's next call takes the next rows in memory, so `ahead` = the call's span of bytes
 * (times the fewest spans that reach PF_AHEAD) prefetches the same place in the rows that come
 * next: each line one call before it is read. */
#ifndef DRAMA_BACKEND_CPU_PREFETCH_H
#define DRAMA_BACKEND_CPU_PREFETCH_H

#include <stdint.h>

#ifndef PF_AHEAD
#define PF_AHEAD 512 /* the least distance, and the distance for spans past PF_SPAN_MAX */
#endif
#define PF_SPAN_MAX 16384 /* farther than this would push the current rows out of L1 */
#ifndef SCAN_AHEAD
#define SCAN_AHEAD 2048 /* the FP8 NaN scan: a fast loop, so further ahead */
#endif
#define PREFETCH(p) _mm_prefetch((const char *)(p) + ahead, _MM_HINT_T0)
/* lines [p + ahead, p + ahead + bytes), at most 4 KiB: a per-row side stream (scales) */
#define PREFETCH_SPAN(p, bytes, ahead)                                  \
    for (int64_t o_ = 0; o_ < (int64_t)(bytes) && o_ < 4096; o_ += 64) \
    _mm_prefetch((const char *)(p) + (ahead) + o_, _MM_HINT_T0)

/* The one-row-stream distance on AMD (dr_cpu_pf_stream): measured on the 2-core EPYC (Zen 3) dev VM,
 * bench/RESULTS.md "CPU n = 1 products on the 2-core AMD": bf16 rows of 1-12 KiB at 1 and 2 threads
 * ran at 100-110% of the read probe with 512-1024, 85-90% with none, 70-79% one 4 KiB row ahead. */
#ifndef PF_STREAM_AMD
#define PF_STREAM_AMD 1024
#endif
/* the distance for a call reading its rows' bytes up to offset `end` of a `total`-byte stream;
 * 0 (the lines being read) where p + ahead would pass the stream's end: pointer arithmetic past
 * one past the end is UB even though a prefetch never faults, and those rows do not exist */
static inline int64_t pf_ahead(int64_t span, int64_t end, int64_t total) {
    int64_t a = span > PF_SPAN_MAX || span <= 0 ? PF_AHEAD : span * ((PF_AHEAD + span - 1) / span);
    return end + a <= total ? a : 0;
}
/* The distance for a loop that reads one row per call, i.e. one sequential stream over the rows
 * (the AVX2 fused_row): dr_cpu_pf_stream() bytes where the CPU's policy sets one (matmul.c: AMD,
 * where a prefetch a page or more ahead of a single stream costs a quarter of the bandwidth), else
 * the one-call-ahead rule of pf_ahead (tuned on Intel). */
int64_t dr_cpu_pf_stream(void);
/* DRAMA_CPU_PF_STREAM's value: a byte count in [0, PF_SPAN_MAX], else (unset, empty, not a number,
 * out of range: warned) dflt */
int64_t dr_cpu_pf_stream_parse(const char *env, int64_t dflt);
static inline int64_t pf_ahead_stream(int64_t span, int64_t end, int64_t total) {
    int64_t s = dr_cpu_pf_stream();
    if (s <= 0) return pf_ahead(span, end, total);
    return end + s <= total ? s : 0;
}
/* the code stream of rows [r, r + nr) of w */
#define PF_AHEAD_ROWS(w, r, nr) pf_ahead((nr) * (w)->row_bytes, ((r) + (nr)) * (w)->row_bytes, (w)->rows * (w)->row_bytes)
/* the one-row stream of row r (pf_ahead_stream) */
#define PF_STREAM_ROW(w, r) pf_ahead_stream((w)->row_bytes, ((r) + 1) * (w)->row_bytes, (w)->rows * (w)->row_bytes)

#endif
