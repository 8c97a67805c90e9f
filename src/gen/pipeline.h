/* pipeline.h - internals of the public synthesis API (include/drama.h), exposed for unit tests:
 * request validation, the streaming chunk schedule, and per-phase clocks/memory.
 *
 * The pipeline: text -> batches (text/) -> prompt rows (+ reference codes from the codec encoder
 * or CODES.json) -> frame loop (gen/, guidance when a reference and cfg_gamma > 0) -> codec
 * streaming decoder -> audio callback. Whole mode decodes after generation (with --low-memory the
 * backbone and tower are released first); stream mode decodes chunk by chunk while generating.
 * Both feed the same decoder the same frames, so the samples are bit-identical (CODEC.md 6). */
#ifndef DRAMA_GEN_PIPELINE_H
#define DRAMA_GEN_PIPELINE_H

#include <stdint.h>

#include "base/error.h"
#include "drama.h"

/* Default streaming schedule: a small first chunk (low time to first audio), then larger ones
 * (fewer, cheaper decoder calls). */
#define DR_STREAM_FIRST_CHUNK 4
#define DR_STREAM_NEXT_CHUNK 16
/* Rows of backbone context a long text may occupy before old batches leave it (TEXT.md 4.6). */
#define DR_DEFAULT_CONTEXT 8192

/* Frames in streamed chunk number k (0-based): `requested` for every chunk when > 0, else the
 * default schedule. */
int dr_stream_chunk_frames(int k, int requested);
/* The request's schedule (drama_request.stream_first_frames / stream_chunk_frames): chunk 0 has
 * `first` frames when > 0, later chunks `next` when > 0; unset values as dr_stream_chunk_frames. */
int dr_stream_schedule(int k, int first, int next);

/* Every field of a request in range, each error naming the field (as a CLI flag would). */
drama_status dr_request_validate(const drama_request *req, drama_error *err);

/* Per-phase clock and resident-memory window. */
typedef struct dr_phase_clock {
    int phase;       /* current phase, -1 none */
    double t_start;
    double t_request;/* request start, for event timestamps */
} dr_phase_clock;

void dr_phase_begin(dr_phase_clock *pc, drama_result *res, int phase);
void dr_phase_end(dr_phase_clock *pc, drama_result *res);

/* The prompt layout a model's prompt.* switches select (MODEL.md 10) over the defaults of
 * text/prompt.h: the one mapping, used by the pipeline and by `drama prompt`. */
struct dr_switches;
struct dr_prompt_options;
void dr_prompt_options_from_switches(const struct dr_switches *sw, struct dr_prompt_options *opt);

#endif
