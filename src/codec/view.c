/* view.c - codec views and stream sizes (view.h). */
#include "codec/view.h"

#include <stdlib.h>
#include <string.h>

#include "codec/internal.h"

drama_status dr_codec_view_create(const dr_codec *c, dr_pool *pool, dr_codec **out, drama_error *err) {
    *out = NULL;
    dr_codec *v = malloc(sizeof *v);
    if (!v) return dr_fail(err, DRAMA_ENOMEM, "codec view: out of memory");
    *v = *c; /* every weight pointer shared; nothing is owned by the view */
    v->owned = NULL;
    v->n_owned = v->cap_owned = 0;
    v->pool = pool;
    memset(&v->accel, 0, sizeof v->accel); /* a view decodes and encodes on the CPU */
    *out = v;
    return DRAMA_OK;
}

void dr_codec_view_free(dr_codec *view) { free(view); }

size_t dr_codec_stream_bytes(const dr_codec *c, int64_t chunk_frames) {
    const dr_codec_config *cf = &c->cfg;
    size_t bytes = sizeof(cd_state);
    for (int i = 0; i < c->n_conv_states[0]; i++) bytes += (size_t)c->conv_state_size[0][i] * sizeof(float);
    for (int i = 0; i < c->n_tf_states[0]; i++) {
        const dr_codec_tf_config *t = &c->tf_of_state[0][i]->cfg;
        bytes += 2 * ((size_t)t->n_layer * (size_t)(t->window_size - 1) * (size_t)(t->n_head * t->head_dim) + 1) *
                 sizeof(float);
    }
    /* Activations: the widest [channels][time] of any decoder stage, times the buffers a stage
     * keeps at once (input, output, a residual branch and its history-extended copy). */
    int64_t frames = chunk_frames > 0 ? chunk_frames : 1;
    int64_t widest = (int64_t)cf->latent_dim * frames, len = frames;
    for (int i = 0; i < cf->n_down; i++) len *= cf->down_factor[i];
    int64_t ch = cf->decoder_dim;
    if ((int64_t)cf->decoder_dim * len > widest) widest = (int64_t)cf->decoder_dim * len;
    for (int b = 0; b < cf->n_decoder_rates; b++) {
        len *= cf->decoder_rates[b];
        ch = ch / 2 > 0 ? ch / 2 : 1;
        if (ch * len > widest) widest = ch * len;
    }
    int64_t pcm = frames * cf->frame_length;
    if (pcm > widest) widest = pcm;
    bytes += (size_t)widest * 4 * sizeof(float);
    return bytes;
}
