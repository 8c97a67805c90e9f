#include "base/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/file.h"

#define BLOCK (1u << 20)
#define SHA_CACHE_MAX_BYTES ((size_t)256 << 20) /* the digest cache: ~200 bytes per file */

static void to_hex(const unsigned char *md, char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = 0;
}

void dr_sha256_hex(const void *data, size_t n, char hex[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
    to_hex(md, hex);
}

int dr_sha256_is_hex(const char *s) {
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

drama_status dr_sha256_file(const char *path, char hex[65], uint64_t *size, dr_progress *progress,
                            drama_error *err) {
    if (!path || !hex) return dr_fail(err, DRAMA_EINVAL, "dr_sha256_file: NULL argument");
    hex[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dr_fail(err, DRAMA_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char *buf = malloc(BLOCK);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    drama_status st = DRAMA_OK;
    uint64_t total = 0;
    if (!buf || !ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = dr_fail(err, DRAMA_ENOMEM, "%s: cannot start SHA-256", path);
        goto done;
    }
    for (;;) {
        ssize_t got = read(fd, buf, BLOCK);
        if (got < 0) {
            if (errno == EINTR) continue;
            st = dr_fail(err, DRAMA_EIO, "%s: read failed at byte offset %llu: %s", path,
                         (unsigned long long)total, strerror(errno));
            goto done;
        }
        if (got == 0) break;
        EVP_DigestUpdate(ctx, buf, (size_t)got);
        total += (uint64_t)got;
        dr_progress_add(progress, (uint64_t)got);
    }
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    to_hex(md, hex);
    if (size) *size = total;
done:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return st;
}

int dr_sha256_default_cache(char *buf, size_t buflen) {
    const char *d = getenv("DRAMA_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (d && *d) n = snprintf(buf, buflen, "%s/verified-sha256.json", d);
    else if (x && *x) n = snprintf(buf, buflen, "%s/drama/verified-sha256.json", x);
    else if (h && *h) n = snprintf(buf, buflen, "%s/.cache/drama/verified-sha256.json", h);
    else n = -1;
    if (n < 0 || (size_t)n >= buflen) {
        if (buflen) buf[0] = 0;
        return 0;
    }
    return 1;
}

/* Creates the cache's folder chain (best effort). */
static void make_parents(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        dr_make_dirs(dir, NULL);
    }
}

static int entry_matches(json_t *e, const struct stat *sb, int64_t mtime_ns) {
    return json_is_object(e) && json_integer_value(json_object_get(e, "size")) == (json_int_t)sb->st_size &&
           json_integer_value(json_object_get(e, "mtime_ns")) == mtime_ns &&
           json_integer_value(json_object_get(e, "inode")) == (json_int_t)sb->st_ino &&
           dr_sha256_is_hex(json_string_value(json_object_get(e, "sha256")));
}

/* Records abs (with identity sb) -> hex in cache and rewrites cache_path (temp + rename, best effort). */
static void cache_store(json_t *cache, const char *cache_path, const char *abs, const struct stat *sb, const char *hex) {
    int64_t mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    json_object_set_new(json_object_get(cache, "files"), abs,
                        json_pack("{s:I, s:I, s:I, s:s}", "size", (json_int_t)sb->st_size, "mtime_ns",
                                  (json_int_t)mtime_ns, "inode", (json_int_t)sb->st_ino, "sha256", hex));
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", cache_path, (long)getpid());
    make_parents(cache_path);
    unlink(tmp); /* a stale temporary or a planted link is replaced, never written through */
    if (json_dump_file(cache, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) == 0) {
        if (rename(tmp, cache_path) != 0) unlink(tmp);
    } else {
        unlink(tmp);
    }
}

/* The cache's JSON (a missing or damaged cache starts empty). */
static json_t *cache_load(const char *cache_path) {
    json_t *cache = NULL;
    if (dr_read_json_file(cache_path, SHA_CACHE_MAX_BYTES, 1, &cache, NULL) != DRAMA_OK) cache = NULL;
    if (!json_is_object(cache) || !json_is_object(json_object_get(cache, "files"))) {
        json_decref(cache);
        cache = json_pack("{s:s, s:i, s:{}}", "format", "drama-sha256-cache", "version", 1, "files");
    }
    return cache;
}

void dr_sha256_cache_put(const char *cache_path, const char *path, const char hex[65]) {
    char abs[PATH_MAX];
    struct stat sb;
    if (!cache_path || !dr_sha256_is_hex(hex) || !realpath(path, abs) || stat(abs, &sb) != 0 || !S_ISREG(sb.st_mode))
        return;
    json_t *cache = cache_load(cache_path);
    if (cache) cache_store(cache, cache_path, abs, &sb, hex);
    json_decref(cache);
}

drama_status dr_sha256_file_cached(const char *path, const char *cache_path, char hex[65], int *from_cache,
                                   dr_progress *progress, drama_error *err) {
    if (from_cache) *from_cache = 0;
    if (!cache_path) return dr_sha256_file(path, hex, NULL, progress, err);
    if (!path || !hex) return dr_fail(err, DRAMA_EINVAL, "dr_sha256_file_cached: NULL argument");
    char abs[PATH_MAX];
    struct stat sb;
    if (!realpath(path, abs) || stat(abs, &sb) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: cannot stat: %s", path, strerror(errno));
    int64_t mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    json_t *cache = cache_load(cache_path);
    json_t *files = json_object_get(cache, "files");
    json_t *e = json_object_get(files, abs);
    if (entry_matches(e, &sb, mtime_ns)) {
        snprintf(hex, 65, "%s", json_string_value(json_object_get(e, "sha256")));
        if (from_cache) *from_cache = 1;
        dr_progress_add(progress, (uint64_t)sb.st_size);
        json_decref(cache);
        return DRAMA_OK;
    }
    drama_status st = dr_sha256_file(abs, hex, NULL, progress, err);
    if (st != DRAMA_OK) {
        json_decref(cache);
        return st;
    }
    /* The file may have changed while it was hashed: cache only when its identity is unchanged. */
    struct stat after;
    if (stat(abs, &after) == 0 && after.st_size == sb.st_size && after.st_mtim.tv_sec == sb.st_mtim.tv_sec &&
        after.st_mtim.tv_nsec == sb.st_mtim.tv_nsec && after.st_ino == sb.st_ino)
        cache_store(cache, cache_path, abs, &sb, hex);
    json_decref(cache);
    return DRAMA_OK;
}
