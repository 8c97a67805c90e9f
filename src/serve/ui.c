/* ui.c - GET / (index.html) and GET /ui/<file> (its script and style sheet): static bytes
 * embedded in the binary, no auth (the page asks for the key itself). With --no-ui these routes
 * do not exist (http.c answers 404 before any handler). */
#include <string.h>

#include "serve/server_internal.h"
#include "serve/ui.h"

const dr_embedded_file *dr_ui_find(const char *name) {
    if (!name || strchr(name, '/')) return NULL;
    for (const dr_embedded_file *f = dr_ui_files; f->name; f++)
        if (!strcmp(f->name, name)) return f;
    return NULL;
}

const char *dr_ui_content_type(const char *name) {
    static const struct { const char *ext, *type; } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".svg", "image/svg+xml"},
    };
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        size_t e = strlen(types[k].ext);
        if (n > e && !strcmp(name + n - e, types[k].ext)) return types[k].type;
    }
    return "application/octet-stream";
}

const char *dr_ui_csp(void) {
    return "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
           "media-src 'self' blob:; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; "
           "base-uri 'none'";
}

enum MHD_Result dr_handle_ui(dr_server *s, dr_conn *c) {
    /* "/" is the page; "/ui/NAME" leaves NAME in c->id (a prefix route) */
    const dr_embedded_file *f = dr_ui_find(c->route->prefix ? c->id : "index.html");
    if (!f) {
        dr_api_error e = {0};
        dr_api_fail(&e, 404, "not_found", NULL, "no playground file %.100s", c->id);
        return dr_respond_error(c, &e);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(f->size, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", dr_ui_content_type(f->name));
    MHD_add_response_header(r, "Content-Security-Policy", dr_ui_csp());
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return dr_respond(c, 200, r);
}
