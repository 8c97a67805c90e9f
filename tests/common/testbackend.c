/* testbackend.c - see testbackend.h. */
#include "testbackend.h"

#include <stdio.h>
#include <stdlib.h>

#include "model/upload.h"

dr_backend_choice tu_backend_choice(void) {
    dr_backend_choice c = {DR_WANT_CPU, 0};
    const char *b = getenv("DRAMA_TEST_BACKEND"), *d = getenv("DRAMA_TEST_DEVICE");
    drama_error e = {0};
    if (b && *b && dr_backend_parse(b, &c.want, &e)) {
        fprintf(stderr, "DRAMA_TEST_BACKEND: %s\n", e.message);
        exit(2);
    }
    if (d && *d) c.device = atoi(d);
    return c;
}

const char *tu_backend_name(void) { return dr_backend_want_name(tu_backend_choice().want); }

void tu_backend_skip_unavailable(drama_status st, const drama_error *e) {
    if (!st || tu_backend_choice().want == DR_WANT_CPU || st != DRAMA_EUNSUPPORTED) return;
    printf("SKIP: backend %s is not available here: %s\n", tu_backend_name(), e->message);
    exit(77);
}

dr_backend *tu_backend_open(const dr_backbone *bb, const dr_tower *tower) {
    dr_backend_choice c = tu_backend_choice();
    if (c.want == DR_WANT_CPU) return NULL;
    dr_backend *be = NULL;
    drama_error e = {0};
    drama_status st = dr_backend_open(&c, NULL, &be, &e);
    tu_backend_skip_unavailable(st, &e);
    if (!st) st = dr_model_upload(be, bb, tower, &e);
    if (st) {
        fprintf(stderr, "backend %s: %s\n", tu_backend_name(), e.message);
        exit(1);
    }
    printf("backend under test: %s\n", be->description);
    return be;
}
