/* pull.h - `drama pull`: a checkpoint from a Hugging Face-compatible hub (libcurl), pinned to a
 * commit, every file verified (LFS: SHA-256 while streaming; git files: their blob id) before it is
 * moved into place, resumable with Range, into a local model store (docs/pull.md). */
#ifndef DRAMA_TOOLS_PULL_H
#define DRAMA_TOOLS_PULL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DR_PULL_RECEIPT_NAME "drama-pull.json"
#define DR_PULL_PARTIAL_DIR ".partial"
#define DR_PULL_DEFAULT_ENDPOINT "https://huggingface.co"

/* ---- the hub's answers (pull_hub.c; pure functions, fuzzed by tests/fuzz/fuzz_pull_hub.c) ---- */

typedef struct dr_pull_entry {
    char *path;       /* relative, '/'-separated, passes dr_manifest_path_ok */
    uint64_t size;    /* bytes of the file (the LFS object's size for LFS files) */
    char git_oid[41]; /* git blob id: of the content (git files), of the pointer (LFS files) */
    int lfs;          /* 1: stored in LFS, sha256 is the hub's digest of the content */
    char sha256[65];  /* LFS: the hub's digest; git files: filled in once downloaded and checked */
} dr_pull_entry;

typedef struct dr_pull_tree {
    int64_t count, cap;
    dr_pull_entry *files; /* files only (directories are skipped), in the hub's order */
} dr_pull_tree;

/* `GET /api/models/{repo}/revision/{rev}`: the commit (`sha`, 40 lowercase hex digits). */
drama_status dr_pull_parse_revision(const char *text, size_t len, const char *label, char commit[41],
                                    drama_error *err);
/* One page of `GET /api/models/{repo}/tree/{commit}?recursive=true` (a JSON array), appended to
 * tree. Refuses, naming the entry: a path that breaks FORMATS.md 7 rule 1 (absolute, `..`,
 * backslash), a bad oid/sha256/size, an LFS size that disagrees with the entry's size. */
drama_status dr_pull_parse_tree(const char *text, size_t len, const char *label, dr_pull_tree *tree,
                                drama_error *err);
/* After the last page: sorts the files by path (the download order) and refuses a path listed twice
 * (on any pages). */
drama_status dr_pull_tree_finish(dr_pull_tree *t, const char *label, drama_error *err);
void dr_pull_tree_clear(dr_pull_tree *t); /* frees the entries, keeps t usable */

/* The target of `rel="next"` in a Link header value (RFC 8288, as the Hub and GitHub send it),
 * copied into out. Returns 0 when there is none or it does not fit. */
int dr_pull_link_next(const char *link, char *out, size_t outlen);

/* `org/name` as the Hub spells repo ids: two parts of [A-Za-z0-9._-], none starting or ending
 * with '.' or '-', no "..", at most 96 characters. 0 and *why when not. */
int dr_pull_repo_ok(const char *repo, const char **why);
/* 1 when rev is a full commit id (40 hex digits, either case). */
int dr_pull_is_commit(const char *rev);
/* Splits "org/name[@rev]" into repo (validated) and rev ("" when absent). 0 and *why on error. */
int dr_pull_split_spec(const char *spec, char *repo, size_t repo_len, char *rev, size_t rev_len, const char **why);
/* huggingface_hub's allow_patterns rule: fnmatch without FNM_PATHNAME ('*' crosses '/'), a
 * pattern ending in '/' matches everything under that folder. */
int dr_pull_glob_match(const char *pattern, const char *path);
/* Git's blob id of n bytes: sha1("blob <n>\0" + data), 40 lowercase hex digits. */
void dr_pull_git_blob_id(const void *data, size_t n, char hex[41]);
/* Percent-encodes s into out (RFC 3986 unreserved kept, '/' kept when keep_slash). 0 when too long. */
int dr_pull_url_escape(const char *s, int keep_slash, char *out, size_t outlen);

/* ---- the local model store (pull_store.c) ---- */

/* $XDG_DATA_HOME/drama/models, else $HOME/.local/share/drama/models. 0 when neither is set. */
int dr_pull_store_root(char *buf, size_t buflen);
/* What `--model ARG` names: ARG itself when it is an existing directory; otherwise, when ARG is
 * "org/name[@rev]", the complete pull (drama-pull.json present) in the store: @40hex that commit,
 * @ref the commit recorded for that branch/tag when it was pulled, no @ the ref "main" when
 * recorded, else the only commit pulled. Any other ARG is copied unchanged (the loader reports
 * it). A repo spec with nothing in the store fails naming the store folder and the pull to run. */
drama_status dr_pull_resolve_model(const char *arg, char *dir, size_t dir_len, drama_error *err);
/* Store folder of a pull: root/org/name/commit (and root/org/name/refs/<ref> records refs). */
int dr_pull_store_dir(const char *root, const char *repo, const char *commit, char *buf, size_t buflen);
drama_status dr_pull_store_write_ref(const char *root, const char *repo, const char *ref, const char *commit,
                                     drama_error *err);

/* ---- the pull (pull.c) ---- */

typedef enum {
    DR_PULL_EV_RESOLVED, /* commit known: ev->commit; total bytes known: ev->total */
    DR_PULL_EV_FILE,     /* a file starts: ev->path, ev->action ("download", "resume", "reuse") */
    DR_PULL_EV_BYTES,    /* bytes arrived (rate-limited): ev->file_done / file_size, done / total */
    DR_PULL_EV_VERIFIED, /* a file is verified and in place */
    DR_PULL_EV_RETRY,    /* a transient failure: ev->message, ev->attempt, ev->wait_s */
} dr_pull_event_kind;

typedef struct dr_pull_event {
    dr_pull_event_kind kind;
    const char *commit;
    const char *path;
    const char *action;
    const char *message;
    uint64_t file_done, file_size, done, total;
    int attempt;
    double wait_s, t;
} dr_pull_event;

typedef struct dr_pull_options {
    const char *repo;       /* "org/name" */
    const char *revision;   /* branch, tag or 40-hex commit; NULL/"" = "main" */
    const char *endpoint;   /* NULL: $HF_ENDPOINT, else https://huggingface.co */
    const char *token;      /* sent as "Authorization: Bearer" to the endpoint's host only; never logged */
    const char *dir;        /* NULL: the store folder of the commit */
    const char *const *include; /* globs (dr_pull_glob_match); NULL/0 = every file */
    int n_include;
    int allow_latest;       /* accept a branch/tag (else only a pinned 40-hex commit) */
    int retries;            /* attempts after the first per request without progress (default 5) */
    double retry_wait_s;    /* first backoff wait, doubled per retry up to 8x (default 1 s) */
    long timeout_s;         /* connect timeout, and a transfer with no byte for this long is cut (60) */
    uint64_t test_enospc_after; /* test hook: writes fail with ENOSPC after this many bytes (0 = off) */
    void (*on_event)(const dr_pull_event *ev, void *user);
    void *user;
} dr_pull_options;

void dr_pull_options_default(dr_pull_options *o);

typedef struct dr_pull_result {
    char commit[41];
    char dir[4096];
    int64_t files, downloaded, reused;
    uint64_t bytes_total, bytes_downloaded;
    double seconds;
} dr_pull_result;

/* Resolves the revision, lists the tree, downloads and verifies every selected file into
 * dir/.partial/ and renames it into dir, then writes drama-manifest.json and drama-pull.json.
 * An unpinned mutable revision without allow_latest fails (DRAMA_EINVAL) naming its commit. */
drama_status dr_pull(const dr_pull_options *o, dr_pull_result *res, drama_error *err);

#endif
