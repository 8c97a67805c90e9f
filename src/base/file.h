/* file.h - the one whole-file reader: every small file loaded into memory (JSON, text, an index)
 * goes through dr_read_file, each caller passing the size limit that fits what the file holds. */
#ifndef DRAMA_BASE_FILE_H
#define DRAMA_BASE_FILE_H

#include <stddef.h>

#include "base/error.h"

/* Read all of `path` ("-" = standard input) into a malloc'd buffer (*out, free with free()) of
 * *len bytes plus a terminating NUL (not counted; the content may hold NULs of its own). A
 * symlink stored as a text file is followed (base/path.h). Fails, naming `path`, with
 *   DRAMA_EIO     "<path>: cannot read: <strerror>"   (missing, unreadable, a directory),
 *   DRAMA_EFORMAT "<path>: too large (N bytes, limit M)" when it holds more than max_bytes,
 *   DRAMA_ENOMEM  "<path>: out of memory".
 * Callers prefix what the file is ("codec config: ") with dr_error_prefix where it helps. */
drama_status dr_read_file(const char *path, size_t max_bytes, char **out, size_t *len, drama_error *err);
/* dr_read_file for text: also fails (DRAMA_EFORMAT) when the file holds a NUL byte, naming its offset. */
drama_status dr_read_text_file(const char *path, size_t max_bytes, char **out, drama_error *err);

/* dr_read_file, then parse as JSON (duplicate keys refused) into *out (json_decref it). A parse
 * failure is DRAMA_EFORMAT "<path>: line L column C: <reason>". With `optional`, a file that does
 * not exist is DRAMA_OK with *out = NULL; a file that exists must still read and parse. */
struct json_t;
drama_status dr_read_json_file(const char *path, size_t max_bytes, int optional, struct json_t **out,
                               drama_error *err);

/* mkdir -p: every missing folder of `dir`, mode 0777 (umask applies). Fails naming the folder that
 * could not be made (DRAMA_EIO), or `dir` when it exists but is not a directory. */
drama_status dr_make_dirs(const char *dir, drama_error *err);

/* The limit for inputs with no smaller natural bound (ROWS.json, CODES.json, tokenizer.json, text). */
#define DR_FILE_MAX_BYTES ((size_t)1 << 34)

#endif
