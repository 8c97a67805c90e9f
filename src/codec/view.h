/* view.h - a codec handle that shares another's weights with its own thread pool, and the size
 * of a decoder stream's state (for the engine's memory reservations).
 *
 * A dr_codec is immutable after load and encode/decode keep their state per call or per stream,
 * so several threads may encode with one set of weights at the same time, provided each uses its
 * own pool (dr_pool is not reentrant) or none. A view is how a caller without access to the
 * original's pool encodes (drama_encode_audio on connection threads: pool NULL, inline). */
#ifndef DRAMA_CODEC_VIEW_H
#define DRAMA_CODEC_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

/* A view of c running on `pool` (NULL = inline). Valid while c lives; free with
 * dr_codec_view_free (never dr_codec_free: the weights are c's). */
drama_status dr_codec_view_create(const dr_codec *c, dr_pool *pool, dr_codec **out, drama_error *err);
void dr_codec_view_free(dr_codec *view);

/* Bytes a decoder stream holds (its state) plus an upper bound of what one feed of
 * `chunk_frames` frames allocates while it runs (activations of the widest stage). */
size_t dr_codec_stream_bytes(const dr_codec *c, int64_t chunk_frames);

#endif
