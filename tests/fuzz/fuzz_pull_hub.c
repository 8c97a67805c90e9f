/* fuzz_pull_hub.c - what `drama pull` reads from a hub (libFuzzer): the revision answer, tree
 * pages (the input split at its first NUL into two pages, so duplicates across pages are reached),
 * the Link header and REPO[@REVISION]. A failure must carry a message; a success must obey
 * pull.h: every path passes dr_manifest_path_ok, a finished tree is sorted with each path once,
 * every id is well formed, and
 * a next link is a piece of the header. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/sha256.h"
#include "io/manifest.h"
#include "tools/pull.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tree(const dr_pull_tree *t) {
    for (int64_t i = 0; i < t->count; i++) {
        const dr_pull_entry *f = &t->files[i];
        const char *why = NULL;
        if (!f->path || !dr_manifest_path_ok(f->path, &why)) abort();
        if (strlen(f->git_oid) != 40 || strspn(f->git_oid, "0123456789abcdef") != 40) abort();
        if (f->lfs != !!f->sha256[0] || (f->lfs && !dr_sha256_is_hex(f->sha256))) abort();
        if (i && strcmp(t->files[i - 1].path, f->path) >= 0) abort(); /* finished: sorted, unique */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    drama_error err = {0};
    char commit[41];
    if (dr_pull_parse_revision(text, size, "fuzz", commit, &err) == DRAMA_OK) {
        if (strlen(commit) != 40 || strspn(commit, "0123456789abcdef") != 40) abort();
    } else if (!err.message[0]) {
        abort();
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    dr_pull_tree t = {0};
    drama_error e1 = {0}, e2 = {0};
    if (dr_pull_parse_tree(text, n1, "page 1", &t, &e1) != DRAMA_OK && !e1.message[0]) abort();
    if (nul && e1.code == DRAMA_OK &&
        dr_pull_parse_tree((const char *)nul + 1, size - n1 - 1, "page 2", &t, &e2) != DRAMA_OK && !e2.message[0])
        abort();
    drama_error e3 = {0};
    if (dr_pull_tree_finish(&t, "tree", &e3) == DRAMA_OK) check_tree(&t);
    else if (!e3.message[0]) abort();
    dr_pull_tree_clear(&t);
    char *z = malloc(size + 1);
    if (!z) return 0;
    memcpy(z, data, size);
    z[size] = 0;
    char out[512];
    if (dr_pull_link_next(z, out, sizeof out) && (!out[0] || !strstr(z, out))) abort();
    char repo[128], rev[256];
    const char *why = NULL;
    if (dr_pull_split_spec(z, repo, sizeof repo, rev, sizeof rev, &why)) {
        if (!dr_pull_repo_ok(repo, &why)) abort();
    } else if (!why) {
        abort();
    }
    free(z);
    return 0;
}
