/* pipeline_lm.c - the language-model side of the pipeline (see pipeline_adapt.h): backbone +
 * tower lifetime, prompt prefill and the frame loop; plus text batching and audio references.
 * TEMPORARY: the backbone, frame loop, chunker and audio reader are still being written by
 * their owners; until they land these calls fail with DRAMA_EUNSUPPORTED naming what is
 * missing. */
#include <stdlib.h>
#include <string.h>

#include "gen/pipeline_adapt.h"

struct dr_pl_lm {
    int unused;
};

struct dr_pl_gen {
    int unused;
};

drama_status dr_pl_encode_audio_file(drama_model *m, const char *path, dr_codes *out, drama_error *err) {
    (void)m;
    (void)out;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: audio references need io/audio_in (not built yet)", path);
}

drama_status dr_pl_text_batches(drama_model *m, const drama_request *req, dr_pl_text *out, drama_error *err) {
    (void)m;
    (void)req;
    out->batch = calloc(1, sizeof *out->batch);
    if (!out->batch) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    out->batch[0] = strdup(out->full);
    if (!out->batch[0]) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    out->n_batches = 1;
    return DRAMA_OK;
}

drama_status dr_pl_lm_acquire(drama_model *m, drama_error *err) {
    (void)m;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "backbone/frame loop not built yet");
}

void dr_pl_lm_free(dr_pl_lm *lm) { free(lm); }

void dr_pl_lm_release(drama_model *m) {
    dr_pl_lm_free(m->lm);
    m->lm = NULL;
}

drama_status dr_pl_gen_create(drama_model *m, const dr_pl_gen_params *p, dr_pl_gen **out, drama_error *err) {
    (void)m;
    (void)p;
    *out = NULL;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "frame loop not built yet");
}

drama_status dr_pl_gen_prompt(dr_pl_gen *g, drama_model *m, const dr_pl_text *text, int b, const dr_pl_refs *refs,
                              int64_t *prompt_rows, drama_error *err) {
    (void)g; (void)m; (void)text; (void)b; (void)refs; (void)prompt_rows;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "frame loop not built yet");
}

drama_status dr_pl_gen_frames(dr_pl_gen *g, int64_t budget, dr_pl_frame_fn fn, void *ctx, int *ended,
                              drama_error *err) {
    (void)g; (void)budget; (void)fn; (void)ctx; (void)ended;
    return dr_fail(err, DRAMA_EUNSUPPORTED, "frame loop not built yet");
}

void dr_pl_gen_free(dr_pl_gen *g) { free(g); }
