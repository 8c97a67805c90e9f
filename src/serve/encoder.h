/* encoder.h - response audio encoders (API.md 3.2, 3.3, 4): one interface for every format,
 * fed float chunks, giving bytes. A whole response runs the same chunk schedule as a stream and
 * concatenates the bytes, so whole = streamed (for wav, up to the sizes in header bytes 4-7 and
 * 40-43, patched with dr_encoder_wav_patch).
 *
 *   wav   44-byte PCM16 header with unknown (0xFFFFFFFF) sizes, then PCM16 LE samples
 *   pcm   PCM16 LE samples; with pcm_rate != in_rate resampled first (soxr, very high quality,
 *         streaming, so /v1/audio/speech gets 24 kHz)
 *   mp3   LAME: MPEG-1 Layer III, CBR 128 kbit/s, mono, no Xing/ID3 tags
 *   opus  libopusenc: Ogg Opus, input rate recorded in the header, fixed stream serial number
 * PCM16 conversion is io/wav_out.h's dr_pcm16_from_float (CODEC.md 8: round and clamp). A
 * non-finite sample fails the feed (DRAMA_ENUMERIC) naming its index. */
#ifndef DRAMA_SERVE_ENCODER_H
#define DRAMA_SERVE_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "serve/bytes.h"

typedef enum { DR_AF_WAV = 0, DR_AF_PCM = 1, DR_AF_MP3 = 2, DR_AF_OPUS = 3 } dr_audio_format;

/* "wav" | "pcm" | "mp3" | "opus"; returns 0 when the name is not one of them. */
int dr_audio_format_parse(const char *name, dr_audio_format *out);
const char *dr_audio_format_name(dr_audio_format f);
/* Content-Type of a response; `openai`: pcm is audio/pcm (API.md 4), else octet-stream. */
const char *dr_audio_format_content_type(dr_audio_format f, int openai);

typedef struct dr_encoder_opts {
    dr_audio_format format;
    int in_rate;          /* the model's sample rate */
    int pcm_rate;         /* pcm output rate; 0 = in_rate */
    uint32_t opus_serial; /* Ogg stream serial number (fixed so that bytes are reproducible) */
} dr_encoder_opts;

typedef struct dr_encoder dr_encoder;

/* Creates the encoder and appends the stream's first bytes (wav header, Ogg Opus headers). */
drama_status dr_encoder_create(dr_encoder **out, const dr_encoder_opts *opts, dr_bytes *bytes, drama_error *err);
/* Encodes n samples, appending whatever output is ready. */
drama_status dr_encoder_feed(dr_encoder *enc, const float *x, size_t n, dr_bytes *bytes, drama_error *err);
/* Flushes the encoder's tail (mp3 last frames, opus final page, resampler tail). */
drama_status dr_encoder_finish(dr_encoder *enc, dr_bytes *bytes, drama_error *err);
void dr_encoder_free(dr_encoder *enc);
/* Writes the exact RIFF and data sizes into a complete wav body of len bytes. */
void dr_encoder_wav_patch(uint8_t *body, size_t len);

#endif
