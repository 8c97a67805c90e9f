/* fuzz_serve_json.c - JSON request bodies of drama serve (libFuzzer): the strict JSON reader, then the /v1/tts,
 * /v1/audio/speech and voice-upload field rules; assertions in serve_request_check.h. */
#include <stddef.h>
#include <stdint.h>

#include "serve_request_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return check_body(dr_val_parse_json, data, size); }
