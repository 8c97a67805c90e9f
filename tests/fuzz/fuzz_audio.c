/* fuzz_audio.c - the reference-audio reader on in-memory bytes (libFuzzer): libsndfile's decoders
 * behind our container check (truncated WAV/AIFF/RF64), mixing and resampling to 44.1 kHz with the
 * production cap (30 s). A failure must carry a message and return no samples; a success must
 * return 1 .. 30 s of finite samples. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "io/audio_in.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__lsan_default_suppressions(void);

/* libvorbis 1.3.7 (through libsndfile 1.2.0) leaks its vorbis_info when a corrupt Ogg fails to
 * open (xiph/vorbis#125); we never call libvorbis ourselves, so its leaks are not ours to find. */
const char *__lsan_default_suppressions(void) { return "leak:libvorbis.so\nleak:libogg.so\n"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    float *x = NULL;
    int64_t n = 0;
    drama_error err = {0};
    if (dr_audio_read_memory(data, size, "fuzz.wav", NULL, &x, &n, &err) != DRAMA_OK) {
        if (!err.message[0] || x || n) abort();
        return 0;
    }
    if (!x || n < 1 || n > 30 * 44100 + 32) abort(); /* + the resampler's rounding */
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) abort();
    free(x);
    return 0;
}
