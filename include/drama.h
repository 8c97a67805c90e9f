/* drama.h - the public C API of drama.c, a native engine for Fish Audio Drama 3.
 *
 * Error model: every call returns a drama_status (0 = DRAMA_OK). On failure the object passed
 * in (or the drama_error the caller supplied) holds a message naming the file, tensor, field or
 * byte offset at fault; drama_status_name() gives the code's stable name.
 * Ownership: whoever calls *_open / *_create frees with the matching *_close / *_free.
 */
#ifndef DRAMA_H
#define DRAMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DRAMA_VERSION "0.1.0"

typedef enum drama_status {
    DRAMA_OK = 0,
    DRAMA_EINVAL = 1,       /* invalid argument or parameter (names the parameter) */
    DRAMA_EIO = 2,          /* file could not be read or written (names the file) */
    DRAMA_EFORMAT = 3,      /* malformed file contents (names file, field, byte offset) */
    DRAMA_ESHAPE = 4,       /* tensor missing or of the wrong shape/dtype (names the tensor) */
    DRAMA_EUNSUPPORTED = 5, /* valid input the engine cannot use (names what) */
    DRAMA_ENOMEM = 6,       /* allocation failed or a size limit was exceeded */
    DRAMA_EHASH = 7,        /* SHA-256 mismatch against a manifest */
    DRAMA_ENUMERIC = 8,     /* non-finite values where finite ones are required */
    DRAMA_ECANCELLED = 9,   /* cancelled by the caller or a signal */
    DRAMA_EFRAMELIMIT = 10, /* generation reached the frame cap without the end token */
    DRAMA_EEMPTY = 11,      /* empty input or empty generation */
    DRAMA_EINTERNAL = 12    /* a bug: please report */
} drama_status;

/* A caller-owned error record: code plus a human message. */
typedef struct drama_error {
    drama_status code;
    char message[1024];
} drama_error;

const char *drama_status_name(drama_status code);
const char *drama_version(void);      /* "0.1.0" */
const char *drama_git_commit(void);   /* commit the library was built from */

#ifdef __cplusplus
}
#endif
#endif
