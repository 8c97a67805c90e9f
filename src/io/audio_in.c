/* audio_in.c - decode (libsndfile), mix to mono, resample (soxr). See audio_in.h. */
#include "io/audio_in.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sndfile.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct membuf {
    const uint8_t *data;
    sf_count_t size, pos;
} membuf;

static sf_count_t mem_len(void *u) { return ((membuf *)u)->size; }
static sf_count_t mem_seek(sf_count_t off, int whence, void *u) {
    membuf *m = u;
    sf_count_t p = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->pos + off : m->size + off;
    if (p < 0 || p > m->size) return -1;
    return m->pos = p;
}
static sf_count_t mem_read(void *dst, sf_count_t n, void *u) {
    membuf *m = u;
    if (n > m->size - m->pos) n = m->size - m->pos;
    if (n > 0) memcpy(dst, m->data + m->pos, (size_t)n), m->pos += n;
    return n > 0 ? n : 0;
}
static sf_count_t mem_write(const void *src, sf_count_t n, void *u) {
    (void)src, (void)n, (void)u;
    return 0;
}
static sf_count_t mem_tell(void *u) { return ((membuf *)u)->pos; }

/* The bytes of the input for the container check: a file descriptor (pread) or memory. */
typedef struct byte_src {
    int fd;
    const uint8_t *mem;
    uint64_t size;
} byte_src;

static int src_read(const byte_src *s, uint64_t off, void *buf, size_t n) {
    if (off > s->size || n > s->size - off) return 0;
    if (s->mem) {
        memcpy(buf, s->mem + off, n);
        return 1;
    }
    return pread(s->fd, buf, n, (off_t)off) == (ssize_t)n;
}

static uint64_t get_u32(const uint8_t *p, int big) {
    return big ? (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3]
               : (uint64_t)p[3] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[1] << 8 | p[0];
}
static uint64_t get_u64le(const uint8_t *p) { return get_u32(p + 4, 0) << 32 | get_u32(p, 0); }

#define SIZE_UNKNOWN 0xFFFFFFFFu /* streaming writers' "runs to the end of the file" (RIFF) */

/* Sony Wave64: 16-byte GUID chunk ids, 64-bit little-endian sizes that count the 24-byte chunk
 * header, chunks aligned to 8 bytes; the form size is the whole file's. */
static drama_status check_w64(const byte_src *s, const char *label, drama_error *err) {
    static const uint8_t riff_id[16] = {'r', 'i', 'f', 'f', 0x2E, 0x91, 0xCF, 0x11,
                                        0xA5, 0xD6, 0x28, 0xDB, 0x04, 0xC1, 0x00, 0x00};
    static const uint8_t data_id[16] = {'d', 'a', 't', 'a', 0xF3, 0xAC, 0xD3, 0x11,
                                        0x8C, 0xD1, 0x00, 0xC0, 0x4F, 0x8E, 0xDB, 0x8A};
    uint8_t h[24];
    if (!src_read(s, 0, h, 24) || memcmp(h, riff_id, 16)) return DRAMA_OK;
    uint64_t file = s->size, form_size = get_u64le(h + 16);
    for (uint64_t pos = 40, k = 0; k < 4096 && pos + 24 <= file; k++) {
        if (!src_read(s, pos, h, 24))
            return dr_fail(err, DRAMA_EIO, "%s: read error at byte %llu", label, (unsigned long long)pos);
        uint64_t size = get_u64le(h + 16);
        if (size < 24 || size > file - pos) {
            if (!memcmp(h, data_id, 16))
                return dr_fail(err, DRAMA_EFORMAT, "%s: the W64 'data' chunk at byte %llu declares %llu bytes but the "
                               "file holds only %llu from there (truncated file?)", label, (unsigned long long)pos,
                               (unsigned long long)size, (unsigned long long)(file - pos));
            break;
        }
        if (!memcmp(h, data_id, 16)) break;
        pos += (size + 7) & ~(uint64_t)7;
    }
    if (form_size <= file) return DRAMA_OK;
    return dr_fail(err, DRAMA_EFORMAT, "%s: the W64 header declares %llu bytes but the file has %llu (truncated file?)",
                   label, (unsigned long long)form_size, (unsigned long long)file);
}

/* libsndfile silently shortens a WAV/AIFF/AU/W64 whose sizes run past the end of the file (a
 * truncated download); walk the chunk headers (bounded) and refuse what the header promises but
 * the file lacks. Other containers pass through: compressed ones report truncation while decoding. */
static drama_status check_container(const byte_src *s, const char *label, drama_error *err) {
    uint8_t h[12];
    if (!src_read(s, 0, h, 12)) return DRAMA_OK;
    int au_big = !memcmp(h, ".snd", 4);
    if (au_big || !memcmp(h, "dns.", 4)) { /* Sun AU: data offset and size in the header */
        uint64_t off = get_u32(h + 4, au_big), size = get_u32(h + 8, au_big);
        if (size == SIZE_UNKNOWN || off > s->size || size <= s->size - off) return DRAMA_OK;
        return dr_fail(err, DRAMA_EFORMAT, "%s: the AU header declares %llu bytes of audio at byte %llu but the file "
                       "holds only %llu there (truncated file?)", label, (unsigned long long)size,
                       (unsigned long long)off, (unsigned long long)(s->size - off));
    }
    if (!memcmp(h, "riff", 4)) return check_w64(s, label, err);
    int riff = !memcmp(h + 8, "WAVE", 4) && (!memcmp(h, "RIFF", 4) || !memcmp(h, "RIFX", 4) ||
                                             !memcmp(h, "RF64", 4) || !memcmp(h, "BW64", 4));
    int aiff = !memcmp(h, "FORM", 4) && (!memcmp(h + 8, "AIFF", 4) || !memcmp(h + 8, "AIFC", 4));
    if (!riff && !aiff) return DRAMA_OK;
    int big = aiff || !memcmp(h, "RIFX", 4), rf64 = !memcmp(h, "RF64", 4) || !memcmp(h, "BW64", 4);
    char form[5] = {0}, data_id[5];
    memcpy(form, h, 4);
    memcpy(data_id, aiff ? "SSND" : "data", 5);
    uint64_t file = s->size, form_size = get_u32(h + 4, big), data_size64 = SIZE_UNKNOWN;
    int have_ds64 = 0;
    uint64_t pos = 12;
    for (int k = 0; k < 4096 && pos + 8 <= file; k++) {
        uint8_t c[8];
        if (!src_read(s, pos, c, 8))
            return dr_fail(err, DRAMA_EIO, "%s: read error at byte %llu", label, (unsigned long long)pos);
        char id[5] = {0};
        memcpy(id, c, 4);
        uint64_t size = get_u32(c + 4, big), room = file - pos - 8;
        if (rf64 && !strcmp(id, "ds64") && size >= 16 && room >= 16) { /* RF64: the real 64-bit sizes */
            uint8_t d[16];
            if (!src_read(s, pos + 8, d, 16))
                return dr_fail(err, DRAMA_EIO, "%s: read error at byte %llu", label, (unsigned long long)pos);
            form_size = get_u64le(d), data_size64 = get_u64le(d + 8), have_ds64 = 1;
        }
        if (!strcmp(id, data_id)) {
            if (riff && size == SIZE_UNKNOWN) {
                if (!have_ds64) return DRAMA_OK; /* unknown length (a pipe's WAV): libsndfile reads to the end */
                size = data_size64;
            }
            if (size > room)
                return dr_fail(err, DRAMA_EFORMAT, "%s: the '%s' chunk at byte %llu declares %llu bytes of audio but "
                               "the file holds only %llu after its header (truncated file?)", label, id,
                               (unsigned long long)pos, (unsigned long long)size, (unsigned long long)room);
            break;
        }
        if (size > room) break; /* a misread layout is not proof of truncation: the form size decides */
        pos += 8 + size + (size & 1); /* chunks are padded to an even length */
    }
    if ((riff && form_size == SIZE_UNKNOWN && !have_ds64) || form_size <= file - 8) return DRAMA_OK;
    return dr_fail(err, DRAMA_EFORMAT, "%s: the %s header declares %llu bytes but the file has %llu (truncated file?)",
                   label, form, (unsigned long long)(form_size + 8), (unsigned long long)file);
}

static drama_status read_sf(SNDFILE *sf, const SF_INFO *info, const char *label, const dr_audio_in_opts *o,
                            float **samples, int64_t *n, drama_error *err) {
    int target = o && o->target_rate > 0 ? o->target_rate : 44100;
    double cap = o && o->max_seconds != 0 ? o->max_seconds : 30.0;
    if (isnan(cap) || isinf(cap)) /* a NaN cap would silently disable the check */
        return dr_fail(err, DRAMA_EINVAL, "%s: the duration cap must be a finite number of seconds (negative: none)", label);
    if (info->channels < 1 || info->samplerate < 1)
        return dr_fail(err, DRAMA_EFORMAT, "%s: bad audio header (%d channels, %d Hz)", label, info->channels,
                       info->samplerate);
    if (info->frames <= 0) return dr_fail(err, DRAMA_EEMPTY, "%s: the audio has no samples", label);
    /* libsndfile reports SF_COUNT_MAX when the header gives no length (a truncated Ogg, a pipe) */
    if (info->frames >= SF_COUNT_MAX / 2)
        return dr_fail(err, DRAMA_EFORMAT, "%s: the file states no length (truncated or corrupt?)", label);
    double secs = (double)info->frames / info->samplerate;
    if (cap > 0 && secs > cap)
        return dr_fail(err, DRAMA_EINVAL, "%s: %.2f s of audio is longer than the %.2f s cap", label, secs, cap);
    if (info->frames > ((int64_t)1 << 31) / info->channels)
        return dr_fail(err, DRAMA_EINVAL, "%s: audio too long (%lld frames)", label, (long long)info->frames);
    int64_t frames = info->frames;
    float *inter = malloc((size_t)frames * (size_t)info->channels * sizeof(float));
    float *mono = malloc((size_t)frames * sizeof(float));
    if (!inter || !mono) {
        free(inter), free(mono);
        return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    }
    sf_count_t got = sf_readf_float(sf, inter, frames);
    if (got <= 0) {
        free(inter), free(mono);
        return dr_fail(err, DRAMA_EFORMAT, "%s: could not decode any samples (truncated or corrupt?): %s", label,
                       sf_strerror(sf));
    }
    /* fewer frames than the header states must not yield a silently shortened clip: a truncated FLAC
     * loses sync (an error), a truncated MP3 just ends early (no error) */
    if (got < frames) {
        free(inter), free(mono);
        return dr_fail(err, DRAMA_EFORMAT, "%s: decoding stopped after %lld of %lld frames (truncated or corrupt?)%s%s",
                       label, (long long)got, (long long)frames, sf_error(sf) ? ": " : "",
                       sf_error(sf) ? sf_strerror(sf) : "");
    }
    frames = got;
    for (int64_t i = 0; i < frames; i++) {
        float s = 0.0f;
        for (int c = 0; c < info->channels; c++) {
            float v = inter[i * info->channels + c];
            if (!isfinite(v)) {
                free(inter), free(mono);
                return dr_fail(err, DRAMA_ENUMERIC, "%s: sample %lld (channel %d) is not finite", label, (long long)i, c);
            }
            s += v;
        }
        mono[i] = info->channels == 1 ? s : s / (float)info->channels;
    }
    free(inter);
    if (info->samplerate == target) {
        *samples = mono;
        *n = frames;
        return DRAMA_OK;
    }
    size_t olen = (size_t)ceil((double)frames * target / info->samplerate) + 16, odone = 0;
    float *out = malloc(olen * sizeof(float));
    if (!out) {
        free(mono);
        return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    }
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_VHQ, 0);
    soxr_error_t se = soxr_oneshot(info->samplerate, target, 1, mono, (size_t)frames, NULL, out, olen, &odone, &io, &q, NULL);
    free(mono);
    if (se) {
        free(out);
        return dr_fail(err, DRAMA_EINTERNAL, "%s: resampling %d -> %d Hz failed: %s", label, info->samplerate, target, se);
    }
    if (odone == 0) {
        free(out);
        return dr_fail(err, DRAMA_EEMPTY, "%s: no samples after resampling", label);
    }
    for (size_t i = 0; i < odone; i++)
        if (!isfinite(out[i])) {
            free(out);
            return dr_fail(err, DRAMA_ENUMERIC, "%s: resampled sample %zu is not finite", label, i);
        }
    *samples = out;
    *n = (int64_t)odone;
    return DRAMA_OK;
}

drama_status dr_audio_read(const char *path, const dr_audio_in_opts *opts, float **samples, int64_t *n,
                           drama_error *err) {
    *samples = NULL;
    *n = 0;
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : dup(STDIN_FILENO); /* "-": stdin, as sf_open */
    if (fd < 0) return dr_fail(err, DRAMA_EIO, "%s: cannot read audio: %s", path, strerror(errno));
    struct stat sb;
    drama_status rc = DRAMA_OK;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) { /* a pipe has no size to check against */
        byte_src src = {fd, NULL, (uint64_t)sb.st_size};
        rc = check_container(&src, path, err);
    }
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = rc ? NULL : sf_open_fd(fd, SFM_READ, &info, SF_FALSE);
    if (!rc && !sf) rc = dr_fail(err, DRAMA_EIO, "%s: cannot read audio: %s", path, sf_strerror(NULL));
    if (!rc) rc = read_sf(sf, &info, path, opts, samples, n, err);
    if (sf) sf_close(sf);
    close(fd);
    return rc;
}

drama_status dr_audio_read_memory(const void *data, size_t size, const char *label, const dr_audio_in_opts *opts,
                                  float **samples, int64_t *n, drama_error *err) {
    *samples = NULL;
    *n = 0;
    if (!label) label = "audio";
    if (!data || size == 0) return dr_fail(err, DRAMA_EEMPTY, "%s: empty audio data", label);
    byte_src src = {-1, data, size};
    drama_status rc = check_container(&src, label, err);
    if (rc) return rc;
    membuf m = {data, (sf_count_t)size, 0};
    SF_VIRTUAL_IO vio = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &m);
    if (!sf) return dr_fail(err, DRAMA_EFORMAT, "%s: cannot decode audio: %s", label, sf_strerror(NULL));
    rc = read_sf(sf, &info, label, opts, samples, n, err);
    sf_close(sf);
    return rc;
}
