/* voices.c - the voice catalog (see voices.h): sorted array in memory, one directory per voice. */
#include "serve/voices.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/sha256.h"
#include "io/codes_json.h"
#include "serve/request.h"

#define VOICE_MAX_FILE ((size_t)1 << 30)

struct dr_voices {
    pthread_mutex_t mu;
    char *dir;                 /* NULL: memory only */
    char fingerprint[65];
    int n_codebooks;
    dr_voice_encode_fn encode;
    void *encode_user;
    dr_voice **items;          /* sorted by id */
    int n, cap;
    atomic_uint tmp_counter;
};

static void voice_free(dr_voice *voice) {
    if (!voice) return;
    free(voice->text);
    free(voice->audio);
    free(voice->codes);
    free(voice);
}

void dr_voice_release(dr_voice *voice) {
    if (voice && atomic_fetch_sub((atomic_int *)&voice->refs, 1) == 1) voice_free(voice);
}

static dr_voice *voice_ref(dr_voice *voice) {
    atomic_fetch_add((atomic_int *)&voice->refs, 1);
    return voice;
}

/* Index of id, or -(insertion point) - 1. Called with the lock held. */
static int find(const dr_voices *v, const char *id) {
    int lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(v->items[mid]->id, id);
        if (!c) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -lo - 1;
}

static int insert(dr_voices *v, dr_voice *voice) {
    int at = find(v, voice->id);
    if (at >= 0) return -1;
    at = -at - 1;
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 16;
        dr_voice **items = realloc(v->items, (size_t)cap * sizeof *items);
        if (!items) return -1;
        v->items = items;
        v->cap = cap;
    }
    memmove(v->items + at + 1, v->items + at, (size_t)(v->n - at) * sizeof *v->items);
    v->items[at] = voice;
    v->n++;
    return 0;
}

/* ---- files ---- */

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, n, f) == n;
    ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

static int remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p); /* voice directories hold plain files only */
    }
    closedir(d);
    return rmdir(dir);
}

static int write_meta_files(const dr_voices *v, const char *dir, const dr_voice *voice, drama_error *err) {
    char p[PATH_MAX];
    json_t *meta = json_pack("{s:s, s:I, s:i, s:f, s:s, s:s, s:I}", "id", voice->id, "frames", (json_int_t)voice->n_frames,
                             "n_codebooks", voice->n_codebooks, "duration_s", voice->duration_s, "sha256", voice->sha256,
                             "fingerprint", v->fingerprint, "created", (json_int_t)voice->created);
    char *text = meta ? json_dumps(meta, JSON_INDENT(2)) : NULL;
    json_decref(meta);
    dr_codes codes = {voice->n_frames, voice->n_codebooks, voice->codes};
    snprintf(p, sizeof p, "%s/codes.json", dir);
    drama_status st = dr_codes_write(p, &codes, err);
    snprintf(p, sizeof p, "%s/meta.json", dir);
    if (st == DRAMA_OK && (!text || write_file(p, text, strlen(text))))
        st = dr_fail(err, DRAMA_EIO, "%s: cannot write: %s", p, strerror(errno));
    free(text);
    return st == DRAMA_OK ? 0 : -1;
}

static int write_voice_dir(dr_voices *v, const dr_voice *voice, dr_api_error *e) {
    char tmp[PATH_MAX], p[PATH_MAX], final[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d-%u", v->dir, voice->id, (int)getpid(), atomic_fetch_add(&v->tmp_counter, 1));
    snprintf(final, sizeof final, "%s/%s", v->dir, voice->id);
    drama_error err = {0};
    if (mkdir(tmp, 0755)) {
        dr_log(DR_LOG_ERROR, "voices: cannot create %s: %s", tmp, strerror(errno));
        return dr_api_fail(e, 500, "internal", NULL, "the voice could not be stored");
    }
    int ok = 1;
    snprintf(p, sizeof p, "%s/audio.bin", tmp);
    ok &= write_file(p, voice->audio, voice->audio_len) == 0;
    snprintf(p, sizeof p, "%s/text.txt", tmp);
    ok &= ok && write_file(p, voice->text, strlen(voice->text)) == 0;
    ok &= ok && write_meta_files(v, tmp, voice, &err) == 0;
    if (ok && rename(tmp, final) == 0) return 0;
    int exists = ok && (errno == EEXIST || errno == ENOTEMPTY);
    if (!exists) dr_log(DR_LOG_ERROR, "voices: cannot store %s: %s %s", final, strerror(errno), err.message);
    remove_tree(tmp);
    if (exists) return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", voice->id);
    return dr_api_fail(e, 500, "internal", NULL, "the voice could not be stored");
}

/* Reads DIR/<id>; re-encodes when the fingerprint differs. NULL (logged) when unusable. */
static dr_voice *load_voice(dr_voices *v, const char *id) {
    char dir[PATH_MAX], p[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", v->dir, id);
    drama_error err = {0};
    dr_voice *voice = calloc(1, sizeof *voice);
    json_t *meta = NULL;
    char *audio = NULL;
    size_t audio_len = 0;
    if (!voice) return NULL;
    snprintf(voice->id, sizeof voice->id, "%s", id);
    voice->refs = 1;
    snprintf(p, sizeof p, "%s/meta.json", dir);
    if (dr_read_json_file(p, 1 << 20, 0, &meta, &err) != DRAMA_OK) goto bad;
    snprintf(p, sizeof p, "%s/text.txt", dir);
    if (dr_read_text_file(p, 1 << 20, &voice->text, &err) != DRAMA_OK) goto bad;
    snprintf(p, sizeof p, "%s/audio.bin", dir);
    if (dr_read_file(p, VOICE_MAX_FILE, &audio, &audio_len, &err) != DRAMA_OK) goto bad;
    voice->audio = (uint8_t *)audio;
    voice->audio_len = audio_len;
    dr_sha256_hex(audio, audio_len, voice->sha256);
    json_t *created = json_object_get(meta, "created"), *fp = json_object_get(meta, "fingerprint");
    voice->created = json_is_integer(created) ? (int64_t)json_integer_value(created) : 0;
    if (json_is_string(fp) && !strcmp(json_string_value(fp), v->fingerprint)) {
        dr_codes codes = {0};
        snprintf(p, sizeof p, "%s/codes.json", dir);
        if (dr_codes_read(p, v->n_codebooks, NULL, &codes, &err) != DRAMA_OK) goto bad;
        voice->codes = codes.data;
        voice->n_frames = codes.n_frames;
        voice->n_codebooks = (int)codes.n_codebooks;
        json_t *dur = json_object_get(meta, "duration_s");
        voice->duration_s = json_is_number(dur) ? json_number_value(dur) : 0;
    } else {
        dr_api_error e = {0};
        DR_INFO("voices: %s was encoded by another codec: re-encoding it from its audio", id);
        if (v->encode(v->encode_user, voice->audio, voice->audio_len, "audio", &voice->codes, &voice->n_frames,
                      &voice->duration_s, &e)) {
            dr_fail(&err, DRAMA_EFORMAT, "%s", e.message);
            goto bad;
        }
        voice->n_codebooks = v->n_codebooks;
        if (write_meta_files(v, dir, voice, &err)) DR_WARN("voices: %s: %s (kept in memory)", id, err.message);
    }
    json_decref(meta);
    return voice;
bad:
    DR_WARN("voices: skipping %s: %s", dir, err.message);
    json_decref(meta);
    voice_free(voice);
    return NULL;
}

drama_status dr_voices_open(dr_voices **out, const char *dir, const char *fingerprint, int n_codebooks,
                            dr_voice_encode_fn encode, void *encode_user, drama_error *err) {
    *out = NULL;
    dr_voices *v = calloc(1, sizeof *v);
    if (!v) return dr_fail(err, DRAMA_ENOMEM, "voices: out of memory");
    pthread_mutex_init(&v->mu, NULL);
    snprintf(v->fingerprint, sizeof v->fingerprint, "%s", fingerprint ? fingerprint : "");
    v->n_codebooks = n_codebooks;
    v->encode = encode;
    v->encode_user = encode_user;
    if (dir) {
        v->dir = strdup(dir);
        if (!v->dir || (mkdir(dir, 0755) && errno != EEXIST)) {
            dr_voices_free(v);
            return dr_fail(err, DRAMA_EIO, "--voices-dir %s: cannot create: %s", dir, strerror(errno));
        }
        DIR *d = opendir(dir);
        if (!d) {
            dr_fail(err, DRAMA_EIO, "--voices-dir %s: cannot read: %s", dir, strerror(errno));
            dr_voices_free(v);
            return DRAMA_EIO;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            char p[PATH_MAX];
            if (!strncmp(de->d_name, ".tmp-", 5) || !strncmp(de->d_name, ".trash-", 7)) {
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                remove_tree(p); /* an interrupted write or delete */
                continue;
            }
            if (!dr_voice_id_valid(de->d_name, strlen(de->d_name))) continue;
            dr_voice *voice = load_voice(v, de->d_name);
            if (voice && insert(v, voice)) voice_free(voice);
        }
        closedir(d);
    }
    *out = v;
    return DRAMA_OK;
}

void dr_voices_free(dr_voices *v) {
    if (!v) return;
    for (int k = 0; k < v->n; k++) dr_voice_release(v->items[k]);
    free(v->items);
    free(v->dir);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

int dr_voices_add(dr_voices *v, const char *id, const char *text, const uint8_t *audio, size_t audio_len,
                  dr_voice **out, dr_api_error *e) {
    if (out) *out = NULL;
    pthread_mutex_lock(&v->mu);
    int exists = find(v, id) >= 0;
    pthread_mutex_unlock(&v->mu);
    if (exists) return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", id);
    dr_voice *voice = calloc(1, sizeof *voice);
    if (!voice || !(voice->text = strdup(text)) || !(voice->audio = malloc(audio_len ? audio_len : 1))) {
        voice_free(voice);
        return dr_api_fail(e, 500, "internal", NULL, "out of memory");
    }
    snprintf(voice->id, sizeof voice->id, "%s", id);
    memcpy(voice->audio, audio, audio_len);
    voice->audio_len = audio_len;
    voice->refs = 1;
    voice->created = (int64_t)time(NULL);
    voice->n_codebooks = v->n_codebooks;
    dr_sha256_hex(audio, audio_len, voice->sha256);
    /* encoding runs outside the lock: it is the slow part and other requests go on meanwhile */
    if (v->encode(v->encode_user, audio, audio_len, "audio", &voice->codes, &voice->n_frames, &voice->duration_s, e) ||
        (v->dir && write_voice_dir(v, voice, e))) {
        voice_free(voice);
        return e->status;
    }
    pthread_mutex_lock(&v->mu);
    int rc = insert(v, voice);
    pthread_mutex_unlock(&v->mu);
    if (rc) {
        voice_free(voice);
        return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", id);
    }
    if (out) *out = voice_ref(voice);
    return 0;
}

dr_voice *dr_voices_get(dr_voices *v, const char *id) {
    pthread_mutex_lock(&v->mu);
    int at = find(v, id);
    dr_voice *voice = at >= 0 ? voice_ref(v->items[at]) : NULL;
    pthread_mutex_unlock(&v->mu);
    return voice;
}

int dr_voices_delete(dr_voices *v, const char *id) {
    pthread_mutex_lock(&v->mu);
    int at = find(v, id);
    if (at < 0) {
        pthread_mutex_unlock(&v->mu);
        return -1;
    }
    dr_voice *voice = v->items[at];
    memmove(v->items + at, v->items + at + 1, (size_t)(v->n - at - 1) * sizeof *v->items);
    v->n--;
    if (v->dir) {
        /* renamed out of the catalog first, so a crash mid-delete leaves no half voice */
        char final[PATH_MAX], trash[PATH_MAX];
        snprintf(final, sizeof final, "%s/%s", v->dir, id);
        snprintf(trash, sizeof trash, "%s/.trash-%s-%d-%u", v->dir, id, (int)getpid(), atomic_fetch_add(&v->tmp_counter, 1));
        if (rename(final, trash) == 0) remove_tree(trash);
        else DR_WARN("voices: cannot remove %s: %s", final, strerror(errno));
    }
    pthread_mutex_unlock(&v->mu);
    dr_voice_release(voice);
    return 0;
}

json_t *dr_voice_json(const dr_voice *voice) {
    return json_pack("{s:s, s:s, s:I, s:f, s:I}", "id", voice->id, "text", voice->text, "frames",
                     (json_int_t)voice->n_frames, "duration_s", voice->duration_s, "created", (json_int_t)voice->created);
}

json_t *dr_voices_list_json(dr_voices *v) {
    json_t *arr = json_array();
    pthread_mutex_lock(&v->mu);
    for (int k = 0; k < v->n && arr; k++) json_array_append_new(arr, dr_voice_json(v->items[k]));
    pthread_mutex_unlock(&v->mu);
    return arr ? json_pack("{s:o}", "voices", arr) : NULL;
}

int dr_voices_count(dr_voices *v) {
    pthread_mutex_lock(&v->mu);
    int n = v->n;
    pthread_mutex_unlock(&v->mu);
    return n;
}
