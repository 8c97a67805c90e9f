/* ui.h - the playground page of `drama serve` (issue 15, docs/serve.md "Playground"): the files
 * of src/serve/ui/ embedded at build time (scripts/embed-files.cmake writes the table) and the
 * headers they are served with. The HTTP handler is dr_handle_ui (server_internal.h). */
#ifndef DRAMA_SERVE_UI_H
#define DRAMA_SERVE_UI_H

#include <stddef.h>

typedef struct dr_embedded_file {
    const char *name;            /* file name in src/serve/ui/, e.g. "app.js" */
    const unsigned char *data;   /* size bytes (NUL after them) */
    size_t size;
} dr_embedded_file;

/* The generated table, ended by a {NULL, NULL, 0} row. */
extern const dr_embedded_file dr_ui_files[];

/* The embedded file of that name, or NULL (names never contain '/'). */
const dr_embedded_file *dr_ui_find(const char *name);
/* Content-Type for a file name by its extension (html, js, css, svg; else octet-stream). */
const char *dr_ui_content_type(const char *name);
/* The Content-Security-Policy of every playground response: only this server's own scripts,
 * styles and API, audio from blob: URLs, nothing inline, no frames. */
const char *dr_ui_csp(void);

#endif
