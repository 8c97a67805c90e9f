/* fuzz_serve_msgpack.c - msgpack request bodies of drama serve (libFuzzer): the msgpack reader (count and
 * depth pre-scan, then msgpack-c), then the /v1/tts,
 * /v1/audio/speech and voice-upload field rules; assertions in serve_request_check.h. */
#include <stddef.h>
#include <stdint.h>

#include "serve_request_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return check_body(dr_val_parse_msgpack, data, size); }
