/* receipt.c - clocks, resident memory, cached file hashes, receipt writing (see receipt.h). */
#include "base/receipt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/sha256.h"

double dr_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "Key:   1234 kB" from /proc/self/status, in bytes; -1 when absent. */
static int64_t proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    size_t kl = strlen(key);
    int64_t v = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            long long kb = 0;
            if (sscanf(line + kl + 1, "%lld", &kb) == 1) v = (int64_t)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

int64_t dr_mem_rss_bytes(void) { return proc_status_kb("VmRSS"); }
int64_t dr_mem_rss_file_bytes(void) { return proc_status_kb("RssFile"); }

int64_t dr_mem_peak_bytes(void) {
    int64_t v = proc_status_kb("VmHWM");
    if (v >= 0) return v;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) return (int64_t)ru.ru_maxrss * 1024;
    return -1;
}

int dr_mem_peak_reset(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

drama_status dr_sha256_file_hex(const char *path, char hex[65], drama_error *err) {
    return dr_sha256_file(path, hex, NULL, NULL, err);
}

drama_status dr_sha256_file_cached_hex(const char *path, char hex[65], int *cached, drama_error *err) {
    char cache[4096];
    int have = dr_sha256_default_cache(cache, sizeof cache);
    return dr_sha256_file_cached(path, have ? cache : NULL, hex, cached, NULL, err);
}

static int write_json_atomic(const char *path, const json_t *j, FILE *fallback) {
    if (!strcmp(path, "-")) {
        int r = json_dumpf(j, fallback, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', fallback);
        return r;
    }
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    int r = json_dumpf(j, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (r == 0 && fputc('\n', f) == EOF) r = -1;
    if (fclose(f) != 0) r = -1;
    if (r == 0 && rename(tmp, path) != 0) r = -1;
    if (r != 0) unlink(tmp);
    return r;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

drama_status dr_receipt_dir_files(const char *dir, json_t **out, drama_error *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return dr_fail(err, DRAMA_EIO, "%s: cannot list the model directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    drama_status s = DRAMA_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) { s = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory listing", dir); break; }
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) { s = dr_fail(err, DRAMA_ENOMEM, "%s: out of memory listing", dir); break; }
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    json_t *arr = json_array();
    for (size_t i = 0; s == DRAMA_OK && i < n; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        char hex[65];
        int cached = 0;
        s = dr_sha256_file_cached_hex(p, hex, &cached, err);
        if (s != DRAMA_OK) break;
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s, s:b}", "file", names[i], "bytes",
                                             (json_int_t)st.st_size, "sha256", hex, "cached", cached));
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (s != DRAMA_OK) {
        json_decref(arr);
        return s;
    }
    *out = arr;
    return DRAMA_OK;
}

drama_status dr_receipt_write(const char *path, const json_t *receipt, drama_error *err) {
    if (!path || !*path) return dr_fail(err, DRAMA_EINVAL, "receipt path is empty");
    if (write_json_atomic(path, receipt, stderr) != 0)
        return dr_fail(err, DRAMA_EIO, "%s: cannot write the receipt: %s", path, strerror(errno));
    return DRAMA_OK;
}
