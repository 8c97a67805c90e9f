#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifndef DRAMA_GIT_COMMIT /* builds other than CMake's (device_build.sh) define it themselves */
#include "drama_git_commit.h" /* generated at every build by scripts/git-commit.cmake */
#endif

static drama_status vfail(drama_error *err, drama_status code, const char *reason, const char *fmt, va_list ap)
    DR_PRINTF(4, 0);
static drama_status vfail(drama_error *err, drama_status code, const char *reason, const char *fmt, va_list ap) {
    if (!err || err->code != DRAMA_OK) return code;
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    snprintf(err->reason, sizeof err->reason, "%s", reason ? reason : "");
    return code;
}

drama_status dr_fail(drama_error *err, drama_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

drama_status dr_fail_reason(drama_error *err, drama_status code, const char *reason, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(err, code, reason, fmt, ap);
    va_end(ap);
    return code;
}

void dr_error_set_reason(drama_error *err, const char *reason) {
    if (!err || err->code == DRAMA_OK || err->reason[0]) return;
    snprintf(err->reason, sizeof err->reason, "%s", reason ? reason : "");
}

void dr_error_prefix(drama_error *err, const char *fmt, ...) {
    if (!err || err->code == DRAMA_OK) return;
    char head[512], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    snprintf(err->message, sizeof err->message, "%s%s", head, old);
}

void dr_error_clear(drama_error *err) {
    if (!err) return;
    err->code = DRAMA_OK;
    err->message[0] = '\0';
    err->reason[0] = '\0';
}

const char *drama_status_name(drama_status code) {
    switch (code) {
    case DRAMA_OK: return "ok";
    case DRAMA_EINVAL: return "invalid_argument";
    case DRAMA_EIO: return "io_error";
    case DRAMA_EFORMAT: return "format_error";
    case DRAMA_ESHAPE: return "shape_error";
    case DRAMA_EUNSUPPORTED: return "unsupported";
    case DRAMA_ENOMEM: return "out_of_memory";
    case DRAMA_EHASH: return "hash_mismatch";
    case DRAMA_ENUMERIC: return "numerical_error";
    case DRAMA_ECANCELLED: return "cancelled";
    case DRAMA_EFRAMELIMIT: return "frame_limit";
    case DRAMA_EEMPTY: return "empty";
    case DRAMA_EINTERNAL: return "internal_error";
    case DRAMA_EBUSY: return "busy";
    }
    return "unknown";
}

const char *drama_version(void) { return DRAMA_VERSION; }
const char *drama_git_commit(void) { return DRAMA_GIT_COMMIT; }
