/* error.h - error records: a code plus a message naming what is at fault.
 * Functions that can fail take a `drama_error *err` (may be NULL) and return a drama_status.
 * The first failure wins: later dr_fail calls on an error that is already set are ignored,
 * so the innermost, most precise message survives; callers add context with dr_error_prefix. */
#ifndef DRAMA_BASE_ERROR_H
#define DRAMA_BASE_ERROR_H

#include "drama.h"

#if defined(__GNUC__)
#define DR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DR_PRINTF(a, b)
#endif

/* Record code + formatted message in err (if err is set and still OK); returns code. */
drama_status dr_fail(drama_error *err, drama_status code, const char *fmt, ...) DR_PRINTF(3, 4);
/* The same, also recording a stable machine reason (drama.h: "empty_text", "bad_audio", ...). */
drama_status dr_fail_reason(drama_error *err, drama_status code, const char *reason, const char *fmt, ...)
    DR_PRINTF(4, 5);
/* Set the reason of an error already set, when it has none (callers that know why input failed). */
void dr_error_set_reason(drama_error *err, const char *reason);
/* Prepend context ("model/config.json: ") to an error already set. */
void dr_error_prefix(drama_error *err, const char *fmt, ...) DR_PRINTF(2, 3);
void dr_error_clear(drama_error *err);

#endif
