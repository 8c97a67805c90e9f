/* pull_internal.h - the HTTP side of `drama pull` (pull_http.c), shared with pull.c. */
#ifndef DRAMA_TOOLS_PULL_INTERNAL_H
#define DRAMA_TOOLS_PULL_INTERNAL_H

#include "tools/pull.h"

/* SHA-256 and the git blob id of one file's bytes, computed in one pass (pull_hub.c). */
typedef struct dr_pull_digest {
    void *sha256, *sha1; /* EVP_MD_CTX */
} dr_pull_digest;
/* Starts both digests for a file of `size` bytes (the blob id's header holds the size). 0 on failure. */
int dr_pull_digest_start(dr_pull_digest *d, uint64_t size);
void dr_pull_digest_add(dr_pull_digest *d, const void *p, size_t n);
/* The lowercase hex digests (either may be NULL); frees the contexts (also after a failed start). */
void dr_pull_digest_end(dr_pull_digest *d, char sha256[65], char git_oid[41]);

typedef struct dr_http dr_http;

/* One libcurl handle for a pull. `origin` (scheme://host[:port] of the endpoint) is the only place
 * the token is sent: curl drops it on redirects to another host, scheme or port
 * (CURLOPT_UNRESTRICTED_AUTH off), and pagination links to another origin are refused. */
drama_status dr_http_open(dr_http **out, const char *endpoint, const dr_pull_options *o, drama_error *err);
void dr_http_close(dr_http *h);

/* GET url (JSON, 64 MiB at most) with retries; *body malloc'd and NUL-terminated. `next` gets the
 * Link rel="next" target ("" when none), refused unless it has the endpoint's origin. `what`
 * names the request in messages ("org/name@main: revision"). */
drama_status dr_http_get_json(dr_http *h, const char *url, const char *what, char **body, size_t *len, char *next,
                              size_t next_len, drama_error *err);

/* Bytes of one download, for progress: called as they are written. */
typedef void (*dr_http_progress_fn)(void *user, uint64_t file_done);

/* Downloads f (from url, a /resolve/ URL of `commit`) into `partial`, resuming from what it
 * already holds (Range: bytes=N-; a 200 answer restarts it), with SHA-256 and the git blob SHA-1
 * computed over every byte while streaming, and the byte count held to f->size. On success the
 * partial holds f->size bytes (fsync'd) and sha256/git_oid hold its digests (the caller compares
 * and renames). A failure that a rerun can resume (network after the retries, disk full) keeps
 * the partial and says so; any other (a server that lies about the size or serves another
 * commit, an HTTP error) deletes it. *resumed says whether a Range request was answered 206. */
drama_status dr_http_download(dr_http *h, const char *url, const dr_pull_entry *f, const char *commit,
                              const char *partial, char sha256[65], char git_oid[41], int *resumed,
                              dr_http_progress_fn progress, void *user, drama_error *err);

#endif
