/* cmd_verify.c - `drama verify DIR [--manifest F] [--reverify] [--write]`: check a model directory
 * against its drama-manifest.json (FORMATS.md section 7), reporting every mismatch, or write one. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/sha256.h"
#include "cli/commands.h"
#include "io/manifest.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: drama verify DIR [--manifest FILE] [--reverify] [--write]\n"
            "  Checks every file listed in DIR/" DR_MANIFEST_NAME " (or FILE): size, then SHA-256.\n"
            "  --manifest FILE  manifest to use instead of DIR/" DR_MANIFEST_NAME "\n"
            "  --reverify       ignore the digest cache and rehash every file\n"
            "  --write          write DIR/" DR_MANIFEST_NAME " (or FILE) listing every regular file of DIR\n"
            "Exit status: 0 all files match, 1 a mismatch or error, 2 bad usage.\n");
}

typedef struct tally {
    int ok, bad;
} tally;

static void print_finding(const dr_manifest_finding *f, void *user) {
    tally *t = user;
    if (!strcmp(f->kind, "ok")) {
        t->ok++;
        printf("ok        %s%s\n", f->file->path, f->from_cache ? " (cached)" : "");
    } else if (!strcmp(f->kind, "missing")) {
        t->bad++;
        printf("MISSING   %s\n", f->file->path);
    } else if (!strcmp(f->kind, "size")) {
        t->bad++;
        printf("SIZE      %s: expected %llu bytes, actual %llu\n", f->file->path, (unsigned long long)f->file->size,
               (unsigned long long)f->actual_size);
    } else {
        t->bad++;
        printf("MISMATCH  %s: expected sha256 %s, actual %s\n", f->file->path, f->file->sha256, f->actual_sha256);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Regular files directly in dir (symlinks followed), except the manifest itself. */
static int list_files(const char *dir, const char *skip, char ***out, int *n) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **v = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || (skip && !strcmp(e->d_name, skip))) continue;
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char **nv = realloc(v, (size_t)(count + 1) * sizeof *v);
        if (!nv) break;
        v = nv;
        if ((v[count] = strdup(e->d_name))) count++;
    }
    closedir(d);
    if (count) qsort(v, (size_t)count, sizeof *v, cmp_str);
    *out = v;
    *n = count;
    return 0;
}

static void free_list(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

int cmd_verify(int argc, char **argv) {
    const char *dir = NULL, *manifest = NULL;
    int reverify = 0, write = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return DR_EXIT_OK;
        } else if (!strcmp(argv[i], "--manifest") && i + 1 < argc) {
            manifest = argv[++i];
        } else if (!strcmp(argv[i], "--reverify")) {
            reverify = 1;
        } else if (!strcmp(argv[i], "--write")) {
            write = 1;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "drama verify: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return DR_EXIT_USAGE;
        }
    }
    if (!dir) {
        usage(stderr);
        return DR_EXIT_USAGE;
    }
    char mpath[4096];
    if (manifest) snprintf(mpath, sizeof mpath, "%s", manifest);
    else snprintf(mpath, sizeof mpath, "%s/%s", dir, DR_MANIFEST_NAME);
    drama_error err = {0};

    if (write) {
        char **files = NULL;
        int n = 0;
        const char *base = strrchr(mpath, '/');
        if (list_files(dir, base ? base + 1 : mpath, &files, &n) != 0) {
            fprintf(stderr, "drama verify: %s: cannot list the directory\n", dir);
            return DR_EXIT_ERROR;
        }
        drama_status st = dr_manifest_write(dir, (const char *const *)files, n, mpath, &err);
        free_list(files, n);
        if (st != DRAMA_OK) {
            fprintf(stderr, "drama verify: %s\n", err.message);
            return DR_EXIT_ERROR;
        }
        printf("wrote %s (%d files)\n", mpath, n);
        return DR_EXIT_OK;
    }

    dr_manifest *m = NULL;
    if (dr_manifest_load(mpath, &m, &err) != DRAMA_OK) {
        fprintf(stderr, "drama verify: %s\n", err.message);
        return DR_EXIT_ERROR;
    }
    char cache[4096];
    const char *cache_path = (!reverify && dr_sha256_default_cache(cache, sizeof cache)) ? cache : NULL;
    tally t = {0};
    drama_status st = dr_manifest_verify(m, dir, cache_path, print_finding, &t, &err);

    /* Files present but not listed are "unverified" (FORMATS.md 7 rule 3): a warning, not a failure. */
    char **files = NULL;
    int n = 0;
    if (list_files(dir, DR_MANIFEST_NAME, &files, &n) == 0) {
        for (int i = 0; i < n; i++)
            if (!dr_manifest_find(m, files[i])) printf("unverified %s (not in the manifest)\n", files[i]);
        free_list(files, n);
    }
    dr_manifest_free(m);
    printf("%d ok, %d failed\n", t.ok, t.bad);
    if (st != DRAMA_OK) {
        fprintf(stderr, "drama verify: %s\n", err.message);
        return DR_EXIT_ERROR;
    }
    return DR_EXIT_OK;
}
