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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/sha256.h"
#include "io/codes_json.h"
#include "serve/request.h"

#define VOICE_MAX_FILE ((size_t)1 << 30)
#define VOICE_MAX_META ((size_t)1 << 20)
/* A .tmp-/.trash- entry older than this is an interrupted write or delete (another replica's
 * live one lasts milliseconds: the slow encoding happens before the directory is written). */
#define VOICE_STALE_S (10 * 60)
/* Attempts at a consistent read of a voice directory that keeps changing under the reader. */
#define VOICE_READ_TRIES 4

struct dr_voices {
    pthread_mutex_t mu;
    char *dir;                 /* NULL: memory only */
    char fingerprint[65];
    int n_codebooks;
    dr_voice_encode_fn encode;
    void *encode_user;
    dr_voice **items;          /* sorted by id */
    int n, cap;
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

/* 16 random hex digits: names of temporary entries unique across replicas and hosts. */
static void random_hex(char out[17]) {
    uint8_t r[8] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t t = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)out;
        memcpy(r, &t, sizeof r);
    }
    for (int k = 0; k < 8; k++) snprintf(out + 2 * k, 3, "%02x", r[k]);
}

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, n, f) == n;
    ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

/* fsync of a directory: its entries (a rename into it) survive a crash. */
static void sync_dir(const char *dir) {
    FILE *f = fopen(dir, "r");
    if (!f) return;
    if (fsync(fileno(f))) DR_WARN("voices: fsync %s: %s", dir, strerror(errno));
    fclose(f);
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

static char *meta_text(const dr_voices *v, const dr_voice *voice) {
    json_t *meta = json_pack("{s:s, s:s, s:I, s:i, s:f, s:s, s:s, s:I}", "id", voice->id, "uid", voice->uid, "frames",
                             (json_int_t)voice->n_frames, "n_codebooks", voice->n_codebooks, "duration_s",
                             voice->duration_s, "sha256", voice->sha256, "fingerprint", v->fingerprint, "created",
                             (json_int_t)voice->created);
    char *text = meta ? json_dumps(meta, JSON_INDENT(2)) : NULL;
    json_decref(meta);
    return text;
}

/* codes.json then meta.json into dir. In a live voice directory (a re-encoding) each file goes
 * through a uniquely named temporary + rename, so a reader sees old or new files, never a torn
 * one, and two replicas rewriting at once do not write into the same temporary. */
static int write_meta_files(const dr_voices *v, const char *dir, dr_voice *voice, int live, drama_error *err) {
    char p[PATH_MAX], tmp[PATH_MAX], rnd[17];
    random_hex(rnd);
    char *text = meta_text(v, voice);
    dr_codes codes = {voice->n_frames, voice->n_codebooks, voice->codes};
    snprintf(p, sizeof p, "%s/codes.json", dir);
    snprintf(tmp, sizeof tmp, "%s/.codes-%s.json", dir, rnd);
    drama_status st = dr_codes_write(live ? tmp : p, &codes, err);
    if (st == DRAMA_OK && live && rename(tmp, p))
        st = dr_fail(err, DRAMA_EIO, "%s: cannot rename into place: %s", p, strerror(errno));
    snprintf(p, sizeof p, "%s/meta.json", dir);
    snprintf(tmp, sizeof tmp, "%s/.meta-%s.json", dir, rnd);
    if (st == DRAMA_OK && (!text || write_file(live ? tmp : p, text, strlen(text)) || (live && rename(tmp, p))))
        st = dr_fail(err, DRAMA_EIO, "%s: cannot write: %s", p, strerror(errno));
    if (st != DRAMA_OK && live) unlink(tmp);
    if (st == DRAMA_OK && text) dr_sha256_hex(text, strlen(text), voice->meta_sig);
    free(text);
    return st == DRAMA_OK ? 0 : -1;
}

static int write_voice_dir(dr_voices *v, dr_voice *voice, dr_api_error *e) {
    char tmp[PATH_MAX], p[PATH_MAX], final[PATH_MAX], rnd[17];
    random_hex(rnd);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%s", v->dir, voice->id, rnd);
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
    ok &= ok && write_meta_files(v, tmp, voice, 0, &err) == 0;
    if (ok) sync_dir(tmp);
    /* rename fails when the id exists (a directory that is not empty): the 409 is race-free
     * between threads, processes and replicas sharing the directory */
    if (ok && rename(tmp, final) == 0) {
        sync_dir(v->dir);
        return 0;
    }
    int exists = ok && (errno == EEXIST || errno == ENOTEMPTY);
    if (!exists) dr_log(DR_LOG_ERROR, "voices: cannot store %s: %s %s", final, strerror(errno), err.message);
    remove_tree(tmp);
    if (exists) return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", voice->id);
    return dr_api_fail(e, 500, "internal", NULL, "the voice could not be stored");
}

static int dir_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* One pass over DIR/<id>: meta.json, text, audio, codes, then meta.json again. Files of a voice
 * directory are never changed in place, and a replaced voice has a new uid, so equal meta bytes
 * before and after mean every file read belongs to one version. Returns 0 (voice set), 1 when
 * the directory changed meanwhile (retry), -1 when it is unusable (err set). */
static int read_voice_once(dr_voices *v, const char *dir, dr_voice *voice, drama_error *err) {
    char p[PATH_MAX], *meta_bytes = NULL, *meta_again = NULL, *audio = NULL, *codes_text = NULL;
    size_t meta_len = 0, again_len = 0, audio_len = 0, codes_len = 0;
    json_t *meta = NULL;
    int rc = -1;
    snprintf(p, sizeof p, "%s/meta.json", dir);
    if (dr_read_file(p, VOICE_MAX_META, &meta_bytes, &meta_len, err) != DRAMA_OK) goto done;
    json_error_t je;
    meta = json_loadb(meta_bytes, meta_len, JSON_REJECT_DUPLICATES, &je);
    if (!meta) {
        dr_fail(err, DRAMA_EFORMAT, "%s: line %d: %s", p, je.line, je.text);
        goto done;
    }
    snprintf(p, sizeof p, "%s/text.txt", dir);
    if (dr_read_text_file(p, 1 << 20, &voice->text, err) != DRAMA_OK) goto done;
    snprintf(p, sizeof p, "%s/audio.bin", dir);
    if (dr_read_file(p, VOICE_MAX_FILE, &audio, &audio_len, err) != DRAMA_OK) goto done;
    voice->audio = (uint8_t *)audio;
    voice->audio_len = audio_len;
    audio = NULL;
    json_t *fp = json_object_get(meta, "fingerprint");
    int same_codec = json_is_string(fp) && !strcmp(json_string_value(fp), v->fingerprint);
    snprintf(p, sizeof p, "%s/codes.json", dir);
    if (same_codec && dr_read_file(p, VOICE_MAX_FILE, &codes_text, &codes_len, err) != DRAMA_OK) goto done;
    snprintf(p, sizeof p, "%s/meta.json", dir);
    if (dr_read_file(p, VOICE_MAX_META, &meta_again, &again_len, err) != DRAMA_OK) goto done;
    if (again_len != meta_len || memcmp(meta_again, meta_bytes, meta_len)) {
        rc = 1;
        goto done;
    }
    dr_sha256_hex(voice->audio, voice->audio_len, voice->sha256);
    json_t *sha = json_object_get(meta, "sha256"), *uid = json_object_get(meta, "uid");
    if (json_is_string(sha) && strcmp(json_string_value(sha), voice->sha256)) {
        dr_fail(err, DRAMA_EFORMAT, "%s/audio.bin: SHA-256 %s, meta.json records %s", dir, voice->sha256,
                json_string_value(sha));
        goto done;
    }
    snprintf(voice->uid, sizeof voice->uid, "%s", json_is_string(uid) ? json_string_value(uid) : "");
    dr_sha256_hex(meta_bytes, meta_len, voice->meta_sig);
    json_t *created = json_object_get(meta, "created");
    voice->created = json_is_integer(created) ? (int64_t)json_integer_value(created) : 0;
    if (same_codec) {
        dr_codes codes = {0};
        snprintf(p, sizeof p, "%s/codes.json", dir);
        if (dr_codes_parse(codes_text, codes_len, p, v->n_codebooks, NULL, &codes, err) != DRAMA_OK) goto done;
        voice->codes = codes.data;
        voice->n_frames = codes.n_frames;
        voice->n_codebooks = (int)codes.n_codebooks;
        json_t *dur = json_object_get(meta, "duration_s");
        voice->duration_s = json_is_number(dur) ? json_number_value(dur) : 0;
    }
    rc = 0;
done:
    json_decref(meta);
    free(meta_bytes);
    free(meta_again);
    free(audio);
    free(codes_text);
    return rc;
}

/* Reads DIR/<id>; re-encodes when the fingerprint differs. NULL when there is no such voice
 * (*gone set: deleted, maybe meanwhile by another replica) or it is unusable (logged). */
static dr_voice *load_voice(dr_voices *v, const char *id, int *gone) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", v->dir, id);
    *gone = 0;
    drama_error err = {0};
    for (int attempt = 0; attempt < VOICE_READ_TRIES; attempt++) {
        dr_voice *voice = calloc(1, sizeof *voice);
        if (!voice) return NULL;
        snprintf(voice->id, sizeof voice->id, "%s", id);
        voice->refs = 1;
        memset(&err, 0, sizeof err);
        int rc = read_voice_once(v, dir, voice, &err);
        if (rc == 0 && !voice->codes) {
            dr_api_error e = {0};
            DR_INFO("voices: %s was encoded by another codec: re-encoding it from its audio", id);
            if (v->encode(v->encode_user, voice->audio, voice->audio_len, "audio", &voice->codes, &voice->n_frames,
                          &voice->duration_s, &e)) {
                dr_fail(&err, DRAMA_EFORMAT, "%s", e.message);
                rc = -1;
            } else {
                voice->n_codebooks = v->n_codebooks;
                if (write_meta_files(v, dir, voice, 1, &err)) DR_WARN("voices: %s: %s (kept in memory)", id, err.message);
            }
        }
        if (rc == 0) return voice;
        voice_free(voice);
        if (!dir_exists(dir)) {
            *gone = 1; /* deleted before or while it was read */
            return NULL;
        }
        if (rc < 0) break;
    }
    if (!err.message[0]) dr_fail(&err, DRAMA_EIO, "%s: changed during %d consecutive reads", dir, VOICE_READ_TRIES);
    DR_WARN("voices: skipping %s: %s", dir, err.message);
    return NULL;
}

/* Called with the lock held: the catalog entry for id becomes `voice` (NULL: removed). */
static void cache_set(dr_voices *v, const char *id, dr_voice *voice) {
    int at = find(v, id);
    if (at >= 0) {
        dr_voice *old = v->items[at];
        if (voice) v->items[at] = voice;
        else {
            memmove(v->items + at, v->items + at + 1, (size_t)(v->n - at - 1) * sizeof *v->items);
            v->n--;
        }
        dr_voice_release(old);
    } else if (voice && insert(v, voice)) {
        dr_voice_release(voice);
    }
}

/* Entries left by an interrupted write or delete, old enough not to be another replica's. */
static void remove_stale(const char *dir, const char *name) {
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (lstat(p, &sb) == 0 && time(NULL) - sb.st_mtime > VOICE_STALE_S) remove_tree(p);
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
            if (!strncmp(de->d_name, ".tmp-", 5) || !strncmp(de->d_name, ".trash-", 7)) {
                remove_stale(dir, de->d_name);
                continue;
            }
            if (!dr_voice_id_valid(de->d_name, strlen(de->d_name))) continue;
            int gone = 0;
            dr_voice *voice = load_voice(v, de->d_name, &gone);
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
    char final[PATH_MAX];
    int exists;
    if (v->dir) {
        snprintf(final, sizeof final, "%s/%s", v->dir, id);
        exists = dir_exists(final); /* an early answer only: the rename below decides */
    } else {
        pthread_mutex_lock(&v->mu);
        exists = find(v, id) >= 0;
        pthread_mutex_unlock(&v->mu);
    }
    if (exists) return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", id);
    dr_voice *voice = calloc(1, sizeof *voice);
    if (!voice || !(voice->text = strdup(text)) || !(voice->audio = malloc(audio_len ? audio_len : 1))) {
        voice_free(voice);
        return dr_api_fail(e, 500, "internal", NULL, "out of memory");
    }
    snprintf(voice->id, sizeof voice->id, "%s", id);
    random_hex(voice->uid);
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
    int rc = 0;
    if (v->dir) cache_set(v, id, voice_ref(voice)); /* the directory is the truth: replaces a stale entry */
    else rc = insert(v, voice_ref(voice));
    pthread_mutex_unlock(&v->mu);
    if (rc) {
        dr_voice_release(voice); /* the catalog's reference */
        dr_voice_release(voice);
        return dr_api_fail(e, 409, "voice_exists", "id", "voice '%s' already exists", id);
    }
    if (out) *out = voice;
    else dr_voice_release(voice);
    return 0;
}

dr_voice *dr_voices_get(dr_voices *v, const char *id) {
    dr_voice *voice = NULL;
    if (!v->dir) {
        pthread_mutex_lock(&v->mu);
        int at = find(v, id);
        voice = at >= 0 ? voice_ref(v->items[at]) : NULL;
        pthread_mutex_unlock(&v->mu);
        return voice;
    }
    /* the directory is shared with other replicas: meta.json, read on every lookup (a few
     * hundred bytes; on NFS the open revalidates), says whether the cached copy is current */
    char p[PATH_MAX], *meta = NULL, sig[65] = "";
    size_t meta_len = 0;
    drama_error err = {0};
    snprintf(p, sizeof p, "%s/%s/meta.json", v->dir, id);
    if (dr_read_file(p, VOICE_MAX_META, &meta, &meta_len, &err) == DRAMA_OK) dr_sha256_hex(meta, meta_len, sig);
    free(meta);
    pthread_mutex_lock(&v->mu);
    int at = find(v, id);
    if (at >= 0 && sig[0] && !strcmp(v->items[at]->meta_sig, sig)) voice = voice_ref(v->items[at]);
    pthread_mutex_unlock(&v->mu);
    if (voice) return voice;
    int gone = 0;
    voice = sig[0] ? load_voice(v, id, &gone) : NULL;
    pthread_mutex_lock(&v->mu);
    cache_set(v, id, voice ? voice_ref(voice) : NULL);
    pthread_mutex_unlock(&v->mu);
    return voice;
}

int dr_voices_delete(dr_voices *v, const char *id) {
    if (!v->dir) {
        pthread_mutex_lock(&v->mu);
        int at = find(v, id);
        if (at >= 0) cache_set(v, id, NULL);
        pthread_mutex_unlock(&v->mu);
        return at >= 0 ? 0 : -1;
    }
    /* renamed out of the catalog first: atomic, so of two replicas deleting one id exactly one
     * succeeds, a crash mid-delete leaves no half voice, and a reader mid-read sees it vanish */
    char final[PATH_MAX], trash[PATH_MAX], rnd[17];
    random_hex(rnd);
    snprintf(final, sizeof final, "%s/%s", v->dir, id);
    snprintf(trash, sizeof trash, "%s/.trash-%s-%s", v->dir, id, rnd);
    int rc = rename(final, trash);
    int err = errno;
    pthread_mutex_lock(&v->mu);
    cache_set(v, id, NULL);
    pthread_mutex_unlock(&v->mu);
    if (rc) {
        if (err != ENOENT) DR_WARN("voices: cannot remove %s: %s", final, strerror(err));
        return -1;
    }
    sync_dir(v->dir);
    remove_tree(trash);
    return 0;
}

json_t *dr_voice_json(const dr_voice *voice) {
    return json_pack("{s:s, s:s, s:I, s:f, s:I}", "id", voice->id, "text", voice->text, "frames",
                     (json_int_t)voice->n_frames, "duration_s", voice->duration_s, "created", (json_int_t)voice->created);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

json_t *dr_voices_list_json(dr_voices *v) {
    json_t *arr = json_array();
    if (!arr) return NULL;
    if (!v->dir) {
        pthread_mutex_lock(&v->mu);
        for (int k = 0; k < v->n; k++) json_array_append_new(arr, dr_voice_json(v->items[k]));
        pthread_mutex_unlock(&v->mu);
        return json_pack("{s:o}", "voices", arr);
    }
    /* the directory, not the cache: voices added or removed by other replicas show up */
    char **names = NULL;
    int n = 0, cap = 0;
    DIR *d = opendir(v->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!dr_voice_id_valid(de->d_name, strlen(de->d_name))) continue;
        if (n == cap) {
            char **grown = realloc(names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!grown) break;
            names = grown;
        }
        if ((names[n] = strdup(de->d_name))) n++;
    }
    if (d) closedir(d);
    else DR_WARN("voices: cannot read %s: %s", v->dir, strerror(errno));
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_names); /* names is NULL when n == 0 */
    for (int k = 0; k < n; k++) {
        dr_voice *voice = dr_voices_get(v, names[k]);
        if (voice) json_array_append_new(arr, dr_voice_json(voice));
        dr_voice_release(voice);
        free(names[k]);
    }
    free(names);
    /* entries whose directory is gone are dropped from the cache */
    pthread_mutex_lock(&v->mu);
    for (int k = v->n - 1; k >= 0; k--) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", v->dir, v->items[k]->id);
        if (!dir_exists(p)) cache_set(v, v->items[k]->id, NULL);
    }
    pthread_mutex_unlock(&v->mu);
    return json_pack("{s:o}", "voices", arr);
}

int dr_voices_count(dr_voices *v) {
    pthread_mutex_lock(&v->mu);
    int n = v->n;
    pthread_mutex_unlock(&v->mu);
    return n;
}
