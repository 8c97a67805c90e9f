/* audio_in.h - reference audio input (CODEC.md section 7): any file libsndfile can decode (WAV,
 * FLAC, Ogg Vorbis/Opus, MP3 where the installed library supports it), mixed to mono (mean of
 * the channels), resampled with soxr (very high quality) to the target rate when it differs.
 * No normalisation, trimming or dithering. Errors name the source and the reason: unreadable or
 * unsupported file, zero samples, non-finite samples, duration above the cap, a truncated file
 * (a WAV/AIFF/RF64/AU/W64 chunk or form size past the end of the file, fewer frames decoded
 * than the header states). A RIFF data size of 0xFFFFFFFF (streaming writers) means "to the
 * end". Path "-" is stdin (a pipe has no size to check: it reads to its end). */
#ifndef DRAMA_IO_AUDIO_IN_H
#define DRAMA_IO_AUDIO_IN_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct dr_audio_in_opts {
    int target_rate;    /* 0: 44100 */
    double max_seconds; /* duration cap of the input; 0: 30 s; negative: no cap */
} dr_audio_in_opts;

/* Read `path` into a malloc'd mono float array at the target rate (free with free()). */
drama_status dr_audio_read(const char *path, const dr_audio_in_opts *opts, float **samples, int64_t *n,
                           drama_error *err);
/* Same from bytes in memory (an uploaded file); `label` names it in messages. */
drama_status dr_audio_read_memory(const void *data, size_t size, const char *label, const dr_audio_in_opts *opts,
                                  float **samples, int64_t *n, drama_error *err);

#endif
