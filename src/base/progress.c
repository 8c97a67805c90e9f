#include "base/progress.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void draw(dr_progress *p) {
    enum { WIDTH = 30 };
    double frac = p->total ? (double)p->done / (double)p->total : 0;
    if (frac > 1) frac = 1;
    char bar[WIDTH + 1];
    int fill = (int)(frac * WIDTH);
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : ' ';
    bar[WIDTH] = 0;
    /* \r + clear-to-end keeps one line however the label length changes */
    fprintf(stderr, "\r%-32.32s [%s] %5.1f%% %8.1f/%.1f MB\033[K", p->label, bar, frac * 100,
            (double)p->done / 1e6, (double)p->total / 1e6);
    fflush(stderr);
    p->drawn = 1;
    p->last_draw = now_s();
}

void dr_progress_begin(dr_progress *p, const char *label, uint64_t total, int enable) {
    memset(p, 0, sizeof *p);
    if (enable < 0) enable = isatty(STDERR_FILENO) && !getenv("DRAMA_NO_PROGRESS");
    p->enabled = enable;
    p->total = total;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
}

void dr_progress_label(dr_progress *p, const char *label) {
    if (!p || !p->enabled) return;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
}

void dr_progress_add(dr_progress *p, uint64_t n) {
    if (!p || !p->enabled) return;
    p->done += n;
    if (!p->drawn || now_s() - p->last_draw >= 0.1) draw(p);
}

void dr_progress_end(dr_progress *p) {
    if (!p || !p->enabled) return;
    draw(p);
    fputc('\n', stderr);
    p->drawn = 0;
    p->enabled = 0;
}

void dr_progress_json_event(json_t *ev) {
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s) {
        fprintf(stderr, "%s\n", s);
        fflush(stderr);
        free(s);
    }
    json_decref(ev);
}
