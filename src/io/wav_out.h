/* wav_out.h - audio output: WAV PCM16, WAV 32-bit float, or raw little-endian PCM16.
 *
 * Publication rule: a path other than "-" is written to "<path>.tmp.<pid>" and renamed onto
 * <path> only by dr_wav_out_commit; dr_wav_out_abort (or a failed commit) removes the temporary
 * file, so a cancelled or failed run never leaves a partial or published file.
 *
 * Streaming: samples may be written in any number of calls. The header is written first with
 * the sizes known so far and patched at commit, so a file written in chunks is byte-identical to
 * the same samples written in one call. "-" writes to stdout: if stdout is a regular file the
 * header is patched too; on a pipe the header (written with the first samples) carries the expected
 * sample count (dr_wav_out_set_expected, or the one given at open), or 0xFFFFFFFF sizes ("unknown length", as streaming writers do) when it is not known.
 *
 * PCM16 conversion is s = clamp(lrint(x * 32768), -32768, 32767) (CODEC.md 8); float output
 * keeps the samples unchanged. Non-finite samples are an error (nothing is written for them). */
#ifndef DRAMA_IO_WAV_OUT_H
#define DRAMA_IO_WAV_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum dr_wav_format {
    DR_WAV_PCM16 = 0, /* "wav" */
    DR_WAV_F32 = 1,   /* "wav-f32" */
    DR_WAV_RAW16 = 2  /* "pcm16": raw little-endian signed 16-bit, no header */
} dr_wav_format;

typedef struct dr_wav_out dr_wav_out;

/* "wav" | "wav-f32" | "pcm16" (also "raw") -> format; returns 0 when the name is unknown. */
int dr_wav_format_parse(const char *name, dr_wav_format *out);
const char *dr_wav_format_name(dr_wav_format fmt);
/* Bytes before the first sample for a format (0 for raw). */
size_t dr_wav_header_bytes(dr_wav_format fmt);

/* PCM16 of one sample (CODEC.md 8); the one conversion, also used by the server's encoders. */
int16_t dr_pcm16_from_float(float x);
/* The 44-byte PCM16 mono header for n samples; n = UINT64_MAX: unknown length (0xFFFFFFFF sizes). */
void dr_wav_pcm16_header(uint8_t h[44], int sample_rate, uint64_t n);

/* Opens path ("-" = stdout) for writing. expected_samples: the final sample count when known
 * (used only for a header that cannot be patched later), else 0. Fails (naming the path)
 * when the temporary file cannot be created, so a bad -o is reported before any work. */
drama_status dr_wav_out_open(dr_wav_out **out, const char *path, dr_wav_format fmt, int sample_rate,
                             uint64_t expected_samples, drama_error *err);
/* Changes the expected sample count before the first write (whole-file output to a pipe knows
 * it only when the audio is ready). */
void dr_wav_out_set_expected(dr_wav_out *w, uint64_t expected_samples);
/* Appends n mono samples. */
drama_status dr_wav_out_write(dr_wav_out *w, const float *samples, size_t n, drama_error *err);
/* Patches the header, flushes, renames the temporary file onto the path, computes the SHA-256
 * of the published bytes (hex, 65 bytes with NUL) into sha256_hex if not NULL, and frees w.
 * On failure the temporary file is removed and w is freed as well. */
drama_status dr_wav_out_commit(dr_wav_out *w, char sha256_hex[65], drama_error *err);
/* Discards everything: removes the temporary file, frees w. NULL is accepted. */
void dr_wav_out_abort(dr_wav_out *w);

uint64_t dr_wav_out_samples(const dr_wav_out *w);    /* samples written so far */
uint64_t dr_wav_out_bytes(const dr_wav_out *w);      /* bytes written so far, header included */
/* The temporary path being written ("" for stdout). Exposed so a signal handler can unlink it
 * on a forced exit; the string lives as long as w. */
const char *dr_wav_out_temp_path(const dr_wav_out *w);

#endif
