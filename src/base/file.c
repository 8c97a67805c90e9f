/* file.c - dr_read_file (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/path.h"

static drama_status too_large(drama_error *err, const char *path, unsigned long long n, size_t max_bytes, int exact) {
    return dr_fail(err, DRAMA_EFORMAT, "%s: too large (%s%llu bytes, limit %zu)", path, exact ? "" : "over ", n,
                   max_bytes);
}

drama_status dr_read_file(const char *path, size_t max_bytes, char **out, size_t *len, drama_error *err) {
    *out = NULL;
    *len = 0;
    if (!path || !*path) return dr_fail(err, DRAMA_EINVAL, "empty file name");
    if (max_bytes > ((size_t)1 << 40)) max_bytes = (size_t)1 << 40; /* keeps max_bytes + 2 from wrapping */
    int is_stdin = strcmp(path, "-") == 0;
    char link_target[4096];
    FILE *f = is_stdin ? stdin : fopen(dr_path_follow_placeholder(path, link_target, sizeof link_target), "rb");
    if (!f) return dr_fail(err, DRAMA_EIO, "%s: cannot read: %s", path, strerror(errno));
    const char *name = is_stdin ? "stdin" : path;
    drama_status st = DRAMA_OK;
    size_t cap = 65536; /* a stream's size is unknown: grow from here */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) st = dr_fail(err, DRAMA_EIO, "%s: cannot read: %s", name, strerror(EISDIR));
        else if (S_ISREG(sb.st_mode) && (unsigned long long)sb.st_size > max_bytes)
            st = too_large(err, name, (unsigned long long)sb.st_size, max_bytes, 1);
        else if (S_ISREG(sb.st_mode)) cap = (size_t)sb.st_size + 2; /* +1 to see end of file, +1 for the NUL */
    }
    if (cap > max_bytes + 2) cap = max_bytes + 2;
    char *buf = st ? NULL : malloc(cap);
    if (!st && !buf) st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", name);
    size_t n = 0;
    while (!st) {
        if (n + 1 == cap) { /* full: room for one more byte than the limit is all that is ever needed */
            if (n > max_bytes) {
                st = too_large(err, name, max_bytes, max_bytes, 0);
                break;
            }
            size_t grown = cap > (max_bytes + 2) / 2 ? max_bytes + 2 : cap * 2;
            char *nb = realloc(buf, grown);
            if (!nb) {
                st = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory (%zu bytes)", name, grown);
                break;
            }
            buf = nb;
            cap = grown;
        }
        errno = 0;
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = dr_fail(err, DRAMA_EIO, "%s: cannot read: %s", name, strerror(errno ? errno : EIO));
            break;
        }
    }
    if (!is_stdin) fclose(f);
    else clearerr(f);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return DRAMA_OK;
}

drama_status dr_read_text_file(const char *path, size_t max_bytes, char **out, drama_error *err) {
    size_t len;
    drama_status st = dr_read_file(path, max_bytes, out, &len, err);
    if (st) return st;
    size_t nul = strlen(*out);
    if (nul == len) return DRAMA_OK;
    free(*out);
    *out = NULL;
    return dr_fail(err, DRAMA_EFORMAT, "%s: text contains a NUL byte at offset %zu", strcmp(path, "-") ? path : "stdin", nul);
}

drama_status dr_read_json_file(const char *path, size_t max_bytes, int optional, json_t **out, drama_error *err) {
    *out = NULL;
    char link_target[4096];
    if (optional && path && strcmp(path, "-") != 0 &&
        access(dr_path_follow_placeholder(path, link_target, sizeof link_target), F_OK) != 0 && errno == ENOENT)
        return DRAMA_OK;
    char *text;
    size_t len;
    drama_status st = dr_read_file(path, max_bytes, &text, &len, err);
    if (st) return st;
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!*out) return dr_fail(err, DRAMA_EFORMAT, "%s: line %d column %d: %s", path, je.line, je.column, je.text);
    return DRAMA_OK;
}

drama_status dr_make_dirs(const char *dir, drama_error *err) {
    char buf[4096];
    size_t n = dir ? strlen(dir) : 0;
    if (n == 0 || n >= sizeof buf) return dr_fail(err, DRAMA_EINVAL, "bad directory path '%s'", dir ? dir : "");
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return dr_fail(err, DRAMA_EIO, "%s: cannot create directory: %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return dr_fail(err, DRAMA_EIO, "%s: not a directory", dir);
    return DRAMA_OK;
}
