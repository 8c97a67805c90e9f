/* api_error.c - the JSON error envelope (API.md 1.1). */
#include "serve/api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

int dr_api_fail(dr_api_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
    if (!e || e->status) return e ? e->status : status;
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

const char *dr_api_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 409: return "conflict_error";
    case 422: return "generation_error";
    case 429: return "overloaded_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

char *dr_api_error_json(const dr_api_error *e) {
    json_t *inner = json_pack("{s:s, s:s, s:o, s:s}", "type", dr_api_error_type(e->status), "code", e->code,
                              "param", e->param[0] ? json_string(e->param) : json_null(), "message",
                              e->message);
    /* a message that is not valid UTF-8 (it quotes client bytes) is replaced, never dropped */
    if (!inner)
        inner = json_pack("{s:s, s:s, s:o, s:s}", "type", dr_api_error_type(e->status), "code", e->code, "param",
                          json_null(), "message", "(message not valid UTF-8)");
    json_t *root = json_pack("{s:o}", "error", inner);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}
