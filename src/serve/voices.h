/* voices.h - the voice catalog of API.md 5: stored references (transcript + audio + codes).
 *
 * Storage (--voices-dir DIR): DIR/<id>/ holds audio.bin (the uploaded bytes), text.txt,
 * codes.json (CODES.json) and meta.json (uid, frames, duration_s, sha256, fingerprint, created).
 * A voice is written (each file fsync'd) into DIR/.tmp-<id>-<random>/ and renamed into place, so
 * a voice directory is always complete; an existing id makes the rename fail (409, race-free
 * between replicas). Paths are built only from ids that passed dr_voice_id_valid.
 *
 * Replicas: several processes (hosts, on a shared file system) may serve one DIR. The directory
 * is the truth and memory only a cache: every lookup reads the voice's meta.json and reloads the
 * voice when it changed (another replica re-created the id) or drops it when it is gone; the
 * list reads DIR. A voice is read consistently (meta.json before and after its files must be
 * equal, else it is read again). Delete renames DIR/<id> to .trash-<id>-<random> (atomic: of
 * two replicas deleting, one gets 0 and the other -1) and then removes it.
 *
 * At open, voices whose codec fingerprint differs from the loaded codec's are re-encoded from
 * their audio and their codes.json/meta.json replaced (each by its own temporary + rename);
 * .tmp-/.trash- entries older than 10 minutes (interrupted writes or deletes, never another
 * replica's live one) are removed; an unreadable voice is skipped with a warning. Without a
 * directory the catalog lives in memory.
 *
 * Voices are immutable and reference-counted: dr_voices_get returns a reference that stays
 * valid after a DELETE (requests already using the voice are unaffected). Thread-safe. */
#ifndef DRAMA_SERVE_VOICES_H
#define DRAMA_SERVE_VOICES_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/error.h"
#include "serve/api_error.h"

typedef struct dr_voice {
    char id[65];
    char *text;
    uint8_t *audio;
    size_t audio_len;
    int32_t *codes;           /* n_frames x n_codebooks, frame-major */
    int64_t n_frames;
    int n_codebooks;
    double duration_s;
    char sha256[65];          /* of the audio bytes */
    char uid[17];             /* random, new for every upload: a re-created id is another voice */
    char meta_sig[65];        /* SHA-256 of meta.json as read: the cache's validity check */
    int64_t created;          /* Unix seconds */
    int refs;                 /* atomic */
} dr_voice;

/* Encodes audio bytes to codes (the server: reference cache + drama_encode_audio). Failures of
 * the audio set e (400 bad_audio naming `param`). */
typedef int (*dr_voice_encode_fn)(void *user, const uint8_t *audio, size_t n, const char *param, int32_t **codes,
                                  int64_t *n_frames, double *duration_s, dr_api_error *e);

typedef struct dr_voices dr_voices;

drama_status dr_voices_open(dr_voices **out, const char *dir, const char *fingerprint, int n_codebooks,
                            dr_voice_encode_fn encode, void *encode_user, drama_error *err);
void dr_voices_free(dr_voices *v);

/* Encodes and stores a new voice; *out (may be NULL) gets a reference. 409 voice_exists,
 * 400 bad_audio, 500 when the directory cannot be written. */
int dr_voices_add(dr_voices *v, const char *id, const char *text, const uint8_t *audio, size_t audio_len,
                  dr_voice **out, dr_api_error *e);
/* A reference to the voice, or NULL when there is none. */
dr_voice *dr_voices_get(dr_voices *v, const char *id);
void dr_voice_release(dr_voice *voice);
/* Removes a voice (memory and disk); returns 0, or -1 when there is none. */
int dr_voices_delete(dr_voices *v, const char *id);
/* {"id", "text", "frames", "duration_s", "created"} of one voice, or a {"voices": [...]} list
 * sorted by id. */
json_t *dr_voice_json(const dr_voice *voice);
json_t *dr_voices_list_json(dr_voices *v);
int dr_voices_count(dr_voices *v);

#endif
