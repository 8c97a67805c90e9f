/* api_error.h - the JSON error envelope of API.md 1.1: every refused request carries an HTTP
 * status, a type, a stable machine code, the field at fault (dotted path with indexes, or none)
 * and a message. The first failure wins, as with drama_error. */
#ifndef DRAMA_SERVE_API_ERROR_H
#define DRAMA_SERVE_API_ERROR_H

#include "base/error.h"

typedef struct dr_api_error {
    int status;          /* HTTP status; 0 = no error */
    char code[32];       /* API.md 7, e.g. "out_of_range" */
    char param[128];     /* "references[1].audio"; empty = null */
    char message[512];
    int retry_after_s;   /* > 0: a Retry-After header */
} dr_api_error;

/* Record an error (ignored when e already holds one); returns the status. The type follows
 * from the status (400 invalid_request_error, 401 authentication_error, ...). */
int dr_api_fail(dr_api_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    DR_PRINTF(5, 6);
const char *dr_api_error_type(int status);
/* The envelope as a malloc'd JSON string (free with free()). */
char *dr_api_error_json(const dr_api_error *e);

#endif
