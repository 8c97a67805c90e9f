/* wav_out.c - WAV / raw PCM writer with temp-file publication (see wav_out.h). */
#include "io/wav_out.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "base/alloc.h"

#define WAV_PCM16_HEADER 44u
#define WAV_F32_HEADER 58u /* RIFF + fmt (18, cbSize 0) + fact + data: the form float WAV requires */
#define WAV_UNKNOWN 0xFFFFFFFFu

struct dr_wav_out {
    dr_wav_format fmt;
    int sample_rate;
    int fd;
    int is_stdout;
    int seekable;            /* header can be patched at commit */
    uint64_t expected;       /* hint for a header that cannot be patched */
    int header_done;         /* a pipe's header waits for the first write (expected may change) */
    uint64_t samples;
    uint64_t bytes;
    EVP_MD_CTX *sha;         /* hash of the bytes as written (used when not patched) */
    char *path;              /* final path ("-" for stdout) */
    char *tmp_path;          /* "<path>.tmp.<pid>", or "" for stdout */
};

int dr_wav_format_parse(const char *name, dr_wav_format *out) {
    if (!name) return 0;
    if (!strcmp(name, "wav") || !strcmp(name, "wav-pcm16")) { *out = DR_WAV_PCM16; return 1; }
    if (!strcmp(name, "wav-f32")) { *out = DR_WAV_F32; return 1; }
    if (!strcmp(name, "pcm16") || !strcmp(name, "raw")) { *out = DR_WAV_RAW16; return 1; }
    return 0;
}

const char *dr_wav_format_name(dr_wav_format fmt) {
    switch (fmt) {
    case DR_WAV_PCM16: return "wav";
    case DR_WAV_F32: return "wav-f32";
    case DR_WAV_RAW16: return "pcm16";
    }
    return "?";
}

size_t dr_wav_header_bytes(dr_wav_format fmt) {
    return fmt == DR_WAV_PCM16 ? WAV_PCM16_HEADER : fmt == DR_WAV_F32 ? WAV_F32_HEADER : 0;
}

static size_t sample_bytes(dr_wav_format fmt) { return fmt == DR_WAV_F32 ? 4 : 2; }

static void put_u16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

/* Header for n samples; n = UINT64_MAX means "unknown length" (0xFFFFFFFF sizes). */
static size_t header_for(dr_wav_format fmt, int sample_rate, uint64_t n, uint8_t *h) {
    size_t hb = dr_wav_header_bytes(fmt), sb = sample_bytes(fmt);
    if (hb == 0) return 0;
    uint32_t data = n == UINT64_MAX ? WAV_UNKNOWN : (uint32_t)(n * sb);
    uint32_t riff = n == UINT64_MAX ? WAV_UNKNOWN : (uint32_t)(hb - 8 + n * sb);
    uint32_t frames = n == UINT64_MAX ? WAV_UNKNOWN : (uint32_t)n;
    memcpy(h, "RIFF", 4); put_u32(h + 4, riff); memcpy(h + 8, "WAVE", 4);
    memcpy(h + 12, "fmt ", 4);
    put_u32(h + 16, fmt == DR_WAV_F32 ? 18 : 16);
    put_u16(h + 20, fmt == DR_WAV_F32 ? 3 : 1); /* IEEE float : PCM */
    put_u16(h + 22, 1);                           /* mono */
    put_u32(h + 24, (uint32_t)sample_rate);
    put_u32(h + 28, (uint32_t)sample_rate * (uint32_t)sb);
    put_u16(h + 32, (uint32_t)sb);
    put_u16(h + 34, (uint32_t)(8 * sb));
    uint8_t *p = h + 36;
    if (fmt == DR_WAV_F32) {
        put_u16(p, 0); p += 2; /* cbSize */
        memcpy(p, "fact", 4); put_u32(p + 4, 4); put_u32(p + 8, frames); p += 12;
    }
    memcpy(p, "data", 4); put_u32(p + 4, data);
    return hb;
}

static size_t build_header(const dr_wav_out *w, uint64_t n, uint8_t *h) {
    return header_for(w->fmt, w->sample_rate, n, h);
}

void dr_wav_pcm16_header(uint8_t h[44], int sample_rate, uint64_t n) { header_for(DR_WAV_PCM16, sample_rate, n, h); }

int16_t dr_pcm16_from_float(float x) {
    long v = lrint((double)x * 32768.0);
    if (v > 32767) v = 32767;
    if (v < -32768) v = -32768;
    return (int16_t)v;
}

/* write() until done; retries EINTR (a signal handler may run mid-write). */
static int write_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k; n -= (size_t)k; off += k;
    }
    return 0;
}

static void wav_free(dr_wav_out *w) {
    if (!w) return;
    if (w->sha) EVP_MD_CTX_free(w->sha);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

void dr_wav_out_abort(dr_wav_out *w) {
    if (!w) return;
    if (!w->is_stdout) {
        if (w->fd >= 0) close(w->fd);
        unlink(w->tmp_path);
    }
    wav_free(w);
}

static drama_status emit(dr_wav_out *w, const void *buf, size_t n, drama_error *err) {
    if (write_all(w->fd, buf, n) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: write failed after %llu bytes: %s",
                       w->is_stdout ? "stdout" : w->tmp_path, (unsigned long long)w->bytes, strerror(errno));
    EVP_DigestUpdate(w->sha, buf, n);
    w->bytes += n;
    return DRAMA_OK;
}

/* The header goes out before the first sample: sizes 0 when it will be patched, else the
 * expected count, else "unknown" (0xFFFFFFFF). */
static drama_status write_header_once(dr_wav_out *w, drama_error *err) {
    if (w->header_done) return DRAMA_OK;
    w->header_done = 1;
    uint8_t h[64];
    uint64_t n = w->seekable ? 0 : w->expected ? w->expected : UINT64_MAX;
    size_t hb = build_header(w, n, h);
    return hb ? emit(w, h, hb, err) : DRAMA_OK;
}

drama_status dr_wav_out_open(dr_wav_out **out, const char *path, dr_wav_format fmt, int sample_rate,
                             uint64_t expected_samples, drama_error *err) {
    *out = NULL;
    if (!path || !*path) return dr_fail(err, DRAMA_EINVAL, "output path is empty");
    if (fmt != DR_WAV_PCM16 && fmt != DR_WAV_F32 && fmt != DR_WAV_RAW16)
        return dr_fail(err, DRAMA_EINVAL, "output format %d is unknown", (int)fmt);
    if (sample_rate <= 0 || sample_rate > 1000000)
        return dr_fail(err, DRAMA_EINVAL, "output sample rate %d is out of range", sample_rate);
    dr_wav_out *w = calloc(1, sizeof *w);
    if (!w) return dr_fail(err, DRAMA_ENOMEM, "out of memory opening %s", path);
    w->fmt = fmt;
    w->sample_rate = sample_rate;
    w->fd = -1;
    w->expected = expected_samples;
    w->sha = EVP_MD_CTX_new();
    w->path = strdup(path);
    w->is_stdout = !strcmp(path, "-");
    size_t tn = strlen(path) + 32;
    w->tmp_path = calloc(1, tn);
    if (!w->sha || !w->path || !w->tmp_path || EVP_DigestInit_ex(w->sha, EVP_sha256(), NULL) != 1) {
        wav_free(w);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory opening %s", path);
    }
    if (w->is_stdout) {
        w->fd = STDOUT_FILENO;
        struct stat st;
        /* Patch only a regular file we are at the start of: that is what `> file` gives. Not
         * with O_APPEND (`>> file`): Linux pwrite would append the patch instead. */
        int fl = fcntl(w->fd, F_GETFL);
        w->seekable = fstat(w->fd, &st) == 0 && S_ISREG(st.st_mode) && lseek(w->fd, 0, SEEK_CUR) == 0 &&
                      fl >= 0 && !(fl & O_APPEND);
    } else {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            wav_free(w);
            return dr_fail(err, DRAMA_EIO, "output %s is a directory", path);
        }
        snprintf(w->tmp_path, tn, "%s.tmp.%ld", path, (long)getpid());
        w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (w->fd < 0) {
            int e = errno;
            drama_status s = dr_fail(err, DRAMA_EIO, "cannot create output %s (temporary %s): %s", path,
                                     w->tmp_path, strerror(e));
            wav_free(w);
            return s;
        }
        w->seekable = 1;
    }
    if (w->seekable) {
        drama_status s = write_header_once(w, err);
        if (s != DRAMA_OK) {
            dr_wav_out_abort(w);
            return s;
        }
    }
    *out = w;
    return DRAMA_OK;
}

void dr_wav_out_set_expected(dr_wav_out *w, uint64_t expected_samples) {
    if (w) w->expected = expected_samples;
}

drama_status dr_wav_out_write(dr_wav_out *w, const float *samples, size_t n, drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "wav writer is NULL");
    if (n && !samples) return dr_fail(err, DRAMA_EINVAL, "samples is NULL");
    size_t sb = sample_bytes(w->fmt), hb = dr_wav_header_bytes(w->fmt);
    drama_status hs = write_header_once(w, err);
    if (hs != DRAMA_OK) return hs;
    /* RIFF sizes are 32-bit: refuse rather than write a header that lies. */
    if (hb && (w->samples + n) * sb + hb - 8 > 0xFFFFFFFEull)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: audio exceeds the 4 GiB WAV limit at sample %llu",
                       w->path, (unsigned long long)(w->samples + n));
    enum { CHUNK = 4096 };
    uint8_t buf[CHUNK * 4];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < m; j++) {
            float x = samples[i + j];
            if (!isfinite(x))
                return dr_fail(err, DRAMA_ENUMERIC, "%s: sample %llu is not finite", w->path,
                               (unsigned long long)(w->samples + i + j));
            if (w->fmt == DR_WAV_F32) {
                uint32_t u;
                memcpy(&u, &x, 4);
                put_u32(buf + 4 * j, u);
            } else {
                put_u16(buf + 2 * j, (uint32_t)(uint16_t)dr_pcm16_from_float(x));
            }
        }
        drama_status s = emit(w, buf, m * sb, err);
        if (s != DRAMA_OK) return s;
    }
    w->samples += n;
    return DRAMA_OK;
}

static void hex_digest(const uint8_t *d, char out[65]) {
    static const char hexd[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hexd[d[i] >> 4];
        out[2 * i + 1] = hexd[d[i] & 15];
    }
    out[64] = '\0';
}

/* SHA-256 of a whole file from an open fd (used after the header was patched). */
static int hash_fd(int fd, uint8_t digest[32]) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) { EVP_MD_CTX_free(c); return -1; }
    uint8_t buf[65536];
    off_t off = 0;
    for (;;) {
        ssize_t k = pread(fd, buf, sizeof buf, off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { EVP_MD_CTX_free(c); return -1; }
        if (k == 0) break;
        EVP_DigestUpdate(c, buf, (size_t)k);
        off += k;
    }
    unsigned int len = 0;
    EVP_DigestFinal_ex(c, digest, &len);
    EVP_MD_CTX_free(c);
    return 0;
}

drama_status dr_wav_out_commit(dr_wav_out *w, char sha256_hex[65], drama_error *err) {
    if (!w) return dr_fail(err, DRAMA_EINVAL, "wav writer is NULL");
    const char *name = w->is_stdout ? "stdout" : w->tmp_path;
    drama_status hs = write_header_once(w, err);
    if (hs != DRAMA_OK) {
        dr_wav_out_abort(w);
        return hs;
    }
    uint8_t digest[32];
    int patched = 0;
    uint8_t h[64];
    size_t hb = build_header(w, w->samples, h);
    if (w->seekable && hb) {
        if (pwrite_all(w->fd, h, hb, 0) != 0) {
            drama_status s = dr_fail(err, DRAMA_EIO, "%s: cannot patch the WAV header: %s", name, strerror(errno));
            dr_wav_out_abort(w);
            return s;
        }
        patched = 1;
    }
    if (!w->is_stdout && fsync(w->fd) != 0 && errno != EINVAL) {
        drama_status s = dr_fail(err, DRAMA_EIO, "%s: fsync failed: %s", name, strerror(errno));
        dr_wav_out_abort(w);
        return s;
    }
    if (patched) {
        /* `> file` opens stdout write-only: read the file back through a fresh descriptor. */
        int rfd = w->fd;
        if (w->is_stdout && (fcntl(w->fd, F_GETFL) & O_ACCMODE) == O_WRONLY)
            rfd = open("/proc/self/fd/1", O_RDONLY | O_CLOEXEC);
        int bad = rfd < 0 || hash_fd(rfd, digest) != 0;
        if (rfd >= 0 && rfd != w->fd) close(rfd);
        if (bad) {
            drama_status s = dr_fail(err, DRAMA_EIO, "%s: cannot read back for hashing: %s", name, strerror(errno));
            dr_wav_out_abort(w);
            return s;
        }
    } else {
        unsigned int len = 0;
        EVP_DigestFinal_ex(w->sha, digest, &len);
    }
    if (!w->is_stdout) {
        if (close(w->fd) != 0) {
            w->fd = -1;
            drama_status s = dr_fail(err, DRAMA_EIO, "%s: close failed: %s", name, strerror(errno));
            dr_wav_out_abort(w);
            return s;
        }
        w->fd = -1;
        if (rename(w->tmp_path, w->path) != 0) {
            drama_status s = dr_fail(err, DRAMA_EIO, "cannot rename %s to %s: %s", w->tmp_path, w->path,
                                     strerror(errno));
            dr_wav_out_abort(w);
            return s;
        }
    }
    if (sha256_hex) hex_digest(digest, sha256_hex);
    wav_free(w);
    return DRAMA_OK;
}

uint64_t dr_wav_out_samples(const dr_wav_out *w) { return w ? w->samples : 0; }
uint64_t dr_wav_out_bytes(const dr_wav_out *w) { return w ? w->bytes : 0; }
const char *dr_wav_out_temp_path(const dr_wav_out *w) { return w ? w->tmp_path : ""; }
