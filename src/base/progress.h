/* progress.h - a one-line progress bar on stderr, drawn only when stderr is a terminal (and
 * DRAMA_NO_PROGRESS is unset), so logs and pipes never see it. Redraws are rate-limited; the
 * bar never affects results. Also the JSON-lines events of `--progress-json`. */
#ifndef DRAMA_BASE_PROGRESS_H
#define DRAMA_BASE_PROGRESS_H

#include <stdint.h>

typedef struct dr_progress {
    int enabled;        /* 0: every call is a no-op */
    char label[64];
    uint64_t total;     /* bytes (or units) expected; 0 = unknown */
    uint64_t done;
    double last_draw;   /* monotonic seconds of the last redraw */
    int drawn;          /* a line is on screen and must be finished by dr_progress_end */
} dr_progress;

/* Start a bar; `enable` < 0 decides by isatty(stderr), 0 disables, 1 forces (tests). */
void dr_progress_begin(dr_progress *p, const char *label, uint64_t total, int enable);
void dr_progress_label(dr_progress *p, const char *label); /* e.g. the file being hashed */
void dr_progress_add(dr_progress *p, uint64_t n);
void dr_progress_end(dr_progress *p); /* final redraw + newline when anything was drawn */

/* `--progress-json`: one compact JSON object per line on stderr, flushed; takes the reference. */
struct json_t;
void dr_progress_json_event(struct json_t *ev);

#endif
