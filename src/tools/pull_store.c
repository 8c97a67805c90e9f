/* pull_store.c - the local model store of `drama pull`: root/org/name/<commit>/ per pull (complete
 * once drama-pull.json is there) and root/org/name/refs/<ref> holding the commit a branch or tag
 * resolved to, and what `--model org/name[@rev]` names. */
#include "tools/pull.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

int dr_pull_store_root(char *buf, size_t buflen) {
    const char *x = getenv("XDG_DATA_HOME"), *h = getenv("HOME");
    int n = -1;
    if (x && *x) n = snprintf(buf, buflen, "%s/drama/models", x);
    else if (h && *h) n = snprintf(buf, buflen, "%s/.local/share/drama/models", h);
    if (n < 0 || (size_t)n >= buflen) {
        if (buflen) buf[0] = 0;
        return 0;
    }
    return 1;
}

int dr_pull_store_dir(const char *root, const char *repo, const char *commit, char *buf, size_t buflen) {
    int n = snprintf(buf, buflen, "%s/%s/%s", root, repo, commit);
    return n > 0 && (size_t)n < buflen;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int complete(const char *dir) {
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, DR_PULL_RECEIPT_NAME);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A ref name as one file name ("refs/pr/1" -> "refs%2Fpr%2F1"). */
static int ref_file(const char *root, const char *repo, const char *ref, char *buf, size_t buflen) {
    char esc[1024];
    if (!dr_pull_url_escape(ref, 0, esc, sizeof esc)) return 0;
    int n = snprintf(buf, buflen, "%s/%s/refs/%s", root, repo, esc);
    return n > 0 && (size_t)n < buflen;
}

drama_status dr_pull_store_write_ref(const char *root, const char *repo, const char *ref, const char *commit,
                                     drama_error *err) {
    char p[4096], dir[4096], tmp[4200];
    if (!ref_file(root, repo, ref, p, sizeof p)) return dr_fail(err, DRAMA_EINVAL, "ref '%s': name too long", ref);
    snprintf(dir, sizeof dir, "%s/%s/refs", root, repo);
    drama_status st = dr_make_dirs(dir, err);
    if (st != DRAMA_OK) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "%s\n", commit) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, p) != 0) ok = 0;
    if (!ok) {
        unlink(tmp);
        return dr_fail(err, DRAMA_EIO, "%s: cannot write: %s", p, strerror(errno));
    }
    return DRAMA_OK;
}

/* The commit a ref file records, or 0. */
static int read_ref(const char *root, const char *repo, const char *ref, char commit[41]) {
    char p[4096];
    char *text = NULL;
    if (!ref_file(root, repo, ref, p, sizeof p) || dr_read_text_file(p, 256, &text, NULL) != DRAMA_OK) return 0;
    text[strcspn(text, "\r\n")] = 0;
    int ok = dr_pull_is_commit(text);
    if (ok) snprintf(commit, 41, "%s", text);
    free(text);
    return ok;
}

drama_status dr_pull_resolve_model(const char *arg, char *dir, size_t dir_len, drama_error *err) {
    char repo[128], rev[256], root[4096], commit[41] = {0};
    if (!arg || !dir || !dir_len) return dr_fail(err, DRAMA_EINVAL, "dr_pull_resolve_model: NULL argument");
    snprintf(dir, dir_len, "%s", arg);
    if (is_dir(arg) || !dr_pull_split_spec(arg, repo, sizeof repo, rev, sizeof rev, NULL)) return DRAMA_OK;
    if (!dr_pull_store_root(root, sizeof root))
        return dr_fail(err, DRAMA_EINVAL, "--model %s: not a directory, and no model store (XDG_DATA_HOME and HOME unset)", arg);
    char repo_dir[4200];
    snprintf(repo_dir, sizeof repo_dir, "%s/%s", root, repo);
    if (dr_pull_is_commit(rev)) {
        for (char *c = rev; *c; c++)
            if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
        snprintf(commit, sizeof commit, "%s", rev);
    } else if (rev[0]) {
        if (!read_ref(root, repo, rev, commit))
            return dr_fail(err, DRAMA_EINVAL, "--model %s: not a directory, and %s has no pull of '%s' recorded "
                           "(run: drama pull %s@%s --allow-latest, or give the commit)", arg, repo_dir, rev, repo, rev);
    } else if (!read_ref(root, repo, "main", commit)) { /* no ref recorded: the only complete pull */
        DIR *d = opendir(repo_dir);
        int found = 0;
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            char p[8400];
            snprintf(p, sizeof p, "%s/%s", repo_dir, de->d_name);
            if (!dr_pull_is_commit(de->d_name) || !complete(p)) continue;
            if (found++ == 0) snprintf(commit, sizeof commit, "%s", de->d_name);
        }
        if (d) closedir(d);
        if (found != 1)
            return dr_fail(err, DRAMA_EINVAL, "--model %s: not a directory, and %s %s: name one as %s@COMMIT", arg,
                           repo_dir, found ? "holds several complete pulls" : "holds no complete pull (drama pull it first)",
                           repo);
    }
    char p[4096];
    if (!dr_pull_store_dir(root, repo, commit, p, sizeof p) || strlen(p) + 1 > dir_len)
        return dr_fail(err, DRAMA_EINVAL, "--model %s: store path too long", arg);
    if (!is_dir(p) || !complete(p))
        return dr_fail(err, DRAMA_EINVAL, "--model %s: %s %s (run: drama pull %s@%s)", arg, p,
                       is_dir(p) ? "is an incomplete pull (no " DR_PULL_RECEIPT_NAME ")" : "does not exist", repo, commit);
    snprintf(dir, dir_len, "%s", p);
    return DRAMA_OK;
}
