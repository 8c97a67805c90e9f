#include "base/path.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* One step: returns 1 and writes the target into out when `path` is a placeholder. */
static int follow_once(const char *path, char *out, size_t outlen) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size >= 1024) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char text[1024];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = '\0';
    if (n == 0 || text[0] == '/' || strlen(text) != n) return 0; /* empty, absolute or has NUL */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)text[i] < 0x20) return 0;               /* more than one line */
    if (strcmp(base_name(text), base_name(path)) != 0) return 0;
    const char *slash = strrchr(path, '/');
    int dirlen = slash ? (int)(slash - path + 1) : 0;
    if ((size_t)snprintf(out, outlen, "%.*s%s", dirlen, path, text) >= outlen) return 0;
    struct stat tst;
    return stat(out, &tst) == 0 && S_ISREG(tst.st_mode);
}

const char *dr_path_follow_placeholder(const char *path, char *buf, size_t buflen) {
    char cur[4096], next[4096];
    if (!path || strlen(path) >= sizeof cur) return path;
    strcpy(cur, path);
    int hops = 0;
    while (hops < 8 && follow_once(cur, next, sizeof next)) {
        strcpy(cur, next);
        hops++;
    }
    if (hops == 0 || strlen(cur) >= buflen) return path;
    strcpy(buf, cur);
    return buf;
}
