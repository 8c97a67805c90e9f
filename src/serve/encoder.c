/* encoder.c - wav / pcm (+ soxr) / mp3 (LAME) / opus (libopusenc) response encoders. */
#include "serve/encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <lame/lame.h>
#include <opus/opusenc.h>
#include <soxr.h>

#include "io/wav_out.h"

struct dr_encoder {
    dr_encoder_opts o;
    soxr_t soxr;            /* pcm at another rate */
    lame_global_flags *lame;
    OggOpusEnc *ope;
    OggOpusComments *comments;
    dr_bytes *sink;         /* where libopusenc's page callback appends (set around each call) */
    int sink_failed;
    uint64_t fed;           /* samples fed so far (for messages) */
    float *tmp;             /* resampler output */
    size_t tmp_cap;
};

int dr_audio_format_parse(const char *name, dr_audio_format *out) {
    static const char *const names[] = {"wav", "pcm", "mp3", "opus"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(name, names[k])) {
            *out = (dr_audio_format)k;
            return 1;
        }
    return 0;
}

const char *dr_audio_format_name(dr_audio_format f) {
    static const char *const names[] = {"wav", "pcm", "mp3", "opus"};
    return names[f];
}

const char *dr_audio_format_content_type(dr_audio_format f, int openai) {
    switch (f) {
    case DR_AF_WAV: return "audio/wav";
    case DR_AF_PCM: return openai ? "audio/pcm" : "application/octet-stream";
    case DR_AF_MP3: return "audio/mpeg";
    default: return "audio/ogg";
    }
}

static int opus_write(void *user, const unsigned char *ptr, opus_int32 len) {
    dr_encoder *enc = user;
    if (!enc->sink || dr_bytes_append(enc->sink, ptr, (size_t)len)) {
        enc->sink_failed = 1;
        return 1;
    }
    return 0;
}

static int opus_close(void *user) { return 0; }

drama_status dr_encoder_create(dr_encoder **out, const dr_encoder_opts *opts, dr_bytes *bytes, drama_error *err) {
    *out = NULL;
    if (opts->in_rate <= 0) return dr_fail(err, DRAMA_EINVAL, "encoder: sample rate %d", opts->in_rate);
    dr_encoder *enc = calloc(1, sizeof *enc);
    if (!enc) return dr_fail(err, DRAMA_ENOMEM, "encoder: out of memory");
    enc->o = *opts;
    if (enc->o.pcm_rate <= 0) enc->o.pcm_rate = opts->in_rate;
    drama_status st = DRAMA_OK;
    if (opts->format == DR_AF_WAV) {
        uint8_t h[44];
        dr_wav_pcm16_header(h, opts->in_rate, UINT64_MAX);
        if (dr_bytes_append(bytes, h, sizeof h)) st = dr_fail(err, DRAMA_ENOMEM, "encoder: out of memory");
    } else if (opts->format == DR_AF_PCM && enc->o.pcm_rate != opts->in_rate) {
        soxr_error_t se;
        soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
        soxr_quality_spec_t q = soxr_quality_spec(SOXR_VHQ, 0);
        enc->soxr = soxr_create(opts->in_rate, enc->o.pcm_rate, 1, &se, &io, &q, NULL);
        if (!enc->soxr) st = dr_fail(err, DRAMA_EINTERNAL, "encoder: soxr %d -> %d Hz: %s", opts->in_rate,
                                     enc->o.pcm_rate, se ? se : "failed");
    } else if (opts->format == DR_AF_MP3) {
        enc->lame = lame_init();
        if (!enc->lame ||
            (lame_set_num_channels(enc->lame, 1), lame_set_in_samplerate(enc->lame, opts->in_rate),
             lame_set_out_samplerate(enc->lame, opts->in_rate), lame_set_mode(enc->lame, MONO),
             lame_set_VBR(enc->lame, vbr_off), lame_set_brate(enc->lame, 128), lame_set_bWriteVbrTag(enc->lame, 0),
             lame_set_write_id3tag_automatic(enc->lame, 0), lame_init_params(enc->lame)) < 0)
            st = dr_fail(err, DRAMA_EUNSUPPORTED, "encoder: LAME refuses mono %d Hz CBR 128 kbit/s", opts->in_rate);
    } else if (opts->format == DR_AF_OPUS) {
        OpusEncCallbacks cb = {opus_write, opus_close};
        int oe = 0;
        enc->comments = ope_comments_create();
        enc->sink = bytes;
        if (enc->comments) enc->ope = ope_encoder_create_callbacks(&cb, enc, enc->comments, opts->in_rate, 1, 0, &oe);
        if (!enc->ope) {
            st = dr_fail(err, DRAMA_EUNSUPPORTED, "encoder: libopusenc at %d Hz: %s", opts->in_rate,
                         enc->comments ? ope_strerror(oe) : "out of memory");
        } else if (ope_encoder_ctl(enc->ope, OPE_SET_SERIALNO((opus_int32)opts->opus_serial)) != OPE_OK ||
                   ope_encoder_flush_header(enc->ope) != OPE_OK || enc->sink_failed) {
            st = dr_fail(err, DRAMA_EINTERNAL, "encoder: Ogg Opus header failed");
        }
        enc->sink = NULL;
    }
    if (st != DRAMA_OK) {
        dr_encoder_free(enc);
        return st;
    }
    *out = enc;
    return DRAMA_OK;
}

static drama_status append_pcm16(const float *x, size_t n, dr_bytes *bytes, drama_error *err) {
    uint8_t buf[4096];
    for (size_t i = 0; i < n; i += sizeof buf / 2) {
        size_t m = n - i < sizeof buf / 2 ? n - i : sizeof buf / 2;
        for (size_t j = 0; j < m; j++) {
            uint16_t u = (uint16_t)dr_pcm16_from_float(x[i + j]);
            buf[2 * j] = (uint8_t)u;
            buf[2 * j + 1] = (uint8_t)(u >> 8);
        }
        if (dr_bytes_append(bytes, buf, 2 * m)) return dr_fail(err, DRAMA_ENOMEM, "encoder: out of memory");
    }
    return DRAMA_OK;
}

/* Runs the resampler over n samples (NULL = flush) and appends its PCM16 output. */
static drama_status resample(dr_encoder *enc, const float *x, size_t n, dr_bytes *bytes, drama_error *err) {
    size_t want = (size_t)((double)(n ? n : 4096) * enc->o.pcm_rate / enc->o.in_rate) + 256;
    if (want > enc->tmp_cap) {
        float *t = realloc(enc->tmp, want * sizeof *t);
        if (!t) return dr_fail(err, DRAMA_ENOMEM, "encoder: out of memory");
        enc->tmp = t;
        enc->tmp_cap = want;
    }
    for (;;) {
        size_t idone = 0, odone = 0;
        soxr_error_t se = soxr_process(enc->soxr, x, n, &idone, enc->tmp, enc->tmp_cap, &odone);
        if (se) return dr_fail(err, DRAMA_EINTERNAL, "encoder: soxr: %s", se);
        drama_status st = append_pcm16(enc->tmp, odone, bytes, err);
        if (st != DRAMA_OK) return st;
        if (x) {
            x += idone;
            n -= idone;
            if (n == 0 && odone < enc->tmp_cap) return DRAMA_OK;
        } else if (odone == 0) {
            return DRAMA_OK;
        }
    }
}

static drama_status lame_out(dr_encoder *enc, int got, unsigned char *buf, dr_bytes *bytes, drama_error *err) {
    if (got < 0) return dr_fail(err, DRAMA_EINTERNAL, "encoder: LAME error %d", got);
    if (dr_bytes_append(bytes, buf, (size_t)got)) return dr_fail(err, DRAMA_ENOMEM, "encoder: out of memory");
    return DRAMA_OK;
}

drama_status dr_encoder_feed(dr_encoder *enc, const float *x, size_t n, dr_bytes *bytes, drama_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return dr_fail(err, DRAMA_ENUMERIC, "encoder: sample %llu is not finite",
                           (unsigned long long)(enc->fed + i));
    enc->fed += n;
    switch (enc->o.format) {
    case DR_AF_WAV: return append_pcm16(x, n, bytes, err);
    case DR_AF_PCM: return enc->soxr ? resample(enc, x, n, bytes, err) : append_pcm16(x, n, bytes, err);
    case DR_AF_MP3: {
        enum { BLOCK = 8192 };
        unsigned char buf[BLOCK * 5 / 4 + 7200]; /* LAME's documented worst case */
        for (size_t i = 0; i < n; i += BLOCK) {
            int m = (int)(n - i < BLOCK ? n - i : BLOCK);
            drama_status st = lame_out(enc, lame_encode_buffer_ieee_float(enc->lame, x + i, x + i, m, buf, (int)sizeof buf),
                                       buf, bytes, err);
            if (st != DRAMA_OK) return st;
        }
        return DRAMA_OK;
    }
    default: {
        enc->sink = bytes;
        int rc = ope_encoder_write_float(enc->ope, x, (int)n);
        enc->sink = NULL;
        if (rc != OPE_OK || enc->sink_failed)
            return dr_fail(err, DRAMA_EINTERNAL, "encoder: libopusenc: %s", rc != OPE_OK ? ope_strerror(rc) : "out of memory");
        return DRAMA_OK;
    }
    }
}

drama_status dr_encoder_finish(dr_encoder *enc, dr_bytes *bytes, drama_error *err) {
    if (enc->soxr) return resample(enc, NULL, 0, bytes, err);
    if (enc->lame) {
        unsigned char buf[7200];
        return lame_out(enc, lame_encode_flush(enc->lame, buf, (int)sizeof buf), buf, bytes, err);
    }
    if (enc->ope) {
        enc->sink = bytes;
        int rc = ope_encoder_drain(enc->ope);
        enc->sink = NULL;
        if (rc != OPE_OK || enc->sink_failed)
            return dr_fail(err, DRAMA_EINTERNAL, "encoder: libopusenc drain: %s", rc != OPE_OK ? ope_strerror(rc) : "out of memory");
    }
    return DRAMA_OK;
}

void dr_encoder_free(dr_encoder *enc) {
    if (!enc) return;
    if (enc->soxr) soxr_delete(enc->soxr);
    if (enc->lame) lame_close(enc->lame);
    if (enc->ope) ope_encoder_destroy(enc->ope);
    if (enc->comments) ope_comments_destroy(enc->comments);
    free(enc->tmp);
    free(enc);
}

void dr_encoder_wav_patch(uint8_t *body, size_t len) {
    if (len < 44) return;
    uint32_t riff = (uint32_t)(len - 8), data = (uint32_t)(len - 44);
    for (int k = 0; k < 4; k++) {
        body[4 + k] = (uint8_t)(riff >> (8 * k));
        body[40 + k] = (uint8_t)(data >> (8 * k));
    }
}
