/* log.h - leveled logging to stderr. The level is process-wide configuration set once by the
 * CLI (not hidden state that changes results). */
#ifndef DRAMA_BASE_LOG_H
#define DRAMA_BASE_LOG_H

#include "base/error.h"

typedef enum { DR_LOG_ERROR = 0, DR_LOG_WARN = 1, DR_LOG_INFO = 2, DR_LOG_DEBUG = 3 } dr_log_level;

void dr_log_set_level(dr_log_level level);
dr_log_level dr_log_get_level(void);
void dr_log(dr_log_level level, const char *fmt, ...) DR_PRINTF(2, 3);

#define DR_WARN(...) dr_log(DR_LOG_WARN, __VA_ARGS__)
#define DR_INFO(...) dr_log(DR_LOG_INFO, __VA_ARGS__)
#define DR_DEBUG(...) dr_log(DR_LOG_DEBUG, __VA_ARGS__)

#endif
