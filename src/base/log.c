#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static dr_log_level g_level = DR_LOG_WARN;

void dr_log_set_level(dr_log_level level) { g_level = level; }
dr_log_level dr_log_get_level(void) { return g_level; }

void dr_log(dr_log_level level, const char *fmt, ...) {
    if (level > g_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "drama: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
