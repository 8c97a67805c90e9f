/* audio_in.c - decode (libsndfile), mix to mono, resample (soxr). See audio_in.h. */
#include "io/audio_in.h"

#include <math.h>
#include <sndfile.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

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
    /* a decoder error part way (a truncated FLAC loses sync) must not yield a silently shortened clip */
    if (got < frames && sf_error(sf)) {
        free(inter), free(mono);
        return dr_fail(err, DRAMA_EFORMAT, "%s: decoding stopped after %lld of %lld frames (truncated or corrupt?): %s",
                       label, (long long)got, (long long)frames, sf_strerror(sf));
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
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    if (!sf) return dr_fail(err, DRAMA_EIO, "%s: cannot read audio: %s", path, sf_strerror(NULL));
    drama_status rc = read_sf(sf, &info, path, opts, samples, n, err);
    sf_close(sf);
    return rc;
}

drama_status dr_audio_read_memory(const void *data, size_t size, const char *label, const dr_audio_in_opts *opts,
                                  float **samples, int64_t *n, drama_error *err) {
    *samples = NULL;
    *n = 0;
    if (!label) label = "audio";
    if (!data || size == 0) return dr_fail(err, DRAMA_EEMPTY, "%s: empty audio data", label);
    membuf m = {data, (sf_count_t)size, 0};
    SF_VIRTUAL_IO vio = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &m);
    if (!sf) return dr_fail(err, DRAMA_EFORMAT, "%s: cannot decode audio: %s", label, sf_strerror(NULL));
    drama_status rc = read_sf(sf, &info, label, opts, samples, n, err);
    sf_close(sf);
    return rc;
}
