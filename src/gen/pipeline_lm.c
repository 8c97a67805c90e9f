/* pipeline_lm.c - the language-model side of the pipeline (see pipeline_adapt.h): backbone +
 * tower lifetime (gen/session.h), prompt rows per batch (text/prompt.h) and the frame loop
 * (gen/frameloop.h); plus text batching and audio references. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "gen/frameloop.h"
#include "gen/pipeline_adapt.h"
#include "gen/session.h"
#include "io/audio_in.h"
#include "text/chunk.h"

struct dr_pl_lm {
    dr_gen_lm *g;
};

struct dr_pl_gen {
    dr_gen_session *s;
    dr_gen_options o;       /* kept to start a fresh session when the history is trimmed */
    dr_pl_gen_params p;
    int nc;
    int started;            /* a prompt has been built */
    int guided_prompt;      /* an unconditional prompt is kept (gamma > 0 and a reference) */
    dr_prompt cond, uncond; /* the whole prompt so far, history included (TEXT.md 4.5) */
    int64_t cond_fed, uncond_fed; /* rows already in the backbone states */
    int64_t cond_prefix, uncond_prefix; /* rows of the voice prefix (TEXT.md 2.1 segments 1-6) of
                                           prompts built from scratch with references, else 0 */
    dr_codes *hist;         /* [n_hist] frames of each batch, in order (the last is the current) */
    int n_hist;
    int first_kept;         /* oldest batch still in the prompt history (TEXT.md 4.6) */
    int64_t align;          /* prefill pieces cut at multiples of this position (next_piece) */
};

drama_status dr_pl_encode_audio(drama_model *m, const dr_codec *codec, const char *path, const void *data, size_t n,
                                double max_seconds, dr_codes *out, double *duration_s, drama_error *err) {
    memset(out, 0, sizeof *out);
    if (duration_s) *duration_s = 0;
    if (!codec) return dr_fail(err, DRAMA_EINTERNAL, "pipeline: codec not loaded for encoding");
    const dr_codec_config *cc = dr_codec_cfg(codec);
    dr_audio_in_opts ao = {.target_rate = cc->sample_rate, .max_seconds = max_seconds};
    float *x = NULL;
    int64_t ns = 0;
    drama_status st = path ? dr_audio_read(path, &ao, &x, &ns, err)
                           : dr_audio_read_memory(data, n, "audio", &ao, &x, &ns, err);
    if (st != DRAMA_OK) {
        dr_error_set_reason(err, "bad_audio"); /* the input's fault: unreadable, empty, non-finite, too long */
        free(x);
        return st;
    }
    if (duration_s) *duration_s = (double)ns / cc->sample_rate;
    int32_t *codes = NULL;
    int64_t frames = 0;
    st = dr_codec_encode(codec, x, ns, &codes, &frames, NULL, NULL, err);
    free(x);
    if (st != DRAMA_OK) return st;
    if (frames <= 0) {
        free(codes);
        return dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "%s: no frames after encoding", path ? path : "audio");
    }
    out->n_frames = frames;
    out->n_codebooks = cc->num_codebooks;
    out->data = codes;
    if (out->n_codebooks != m->cfg->audio.num_codebooks) {
        dr_codes_free(out);
        return dr_fail(err, DRAMA_ESHAPE, "codec gives %d codebooks per frame, the model expects %d",
                       cc->num_codebooks, m->cfg->audio.num_codebooks);
    }
    return DRAMA_OK;
}

drama_status dr_pl_text_batches(drama_model *m, const drama_request *req, dr_pl_text *out, drama_error *err) {
    dr_chunk_options co;
    dr_chunk_options_default(&co);
    if (req->chunk_tokens > 0) co.max_tokens = req->chunk_tokens;
    if (req->chunk_bytes > 0) co.max_bytes = req->chunk_bytes;
    co.default_speaker_tag = m->cfg->sw.prompt_default_speaker_tag;
    dr_chunks ch;
    memset(&ch, 0, sizeof ch);
    drama_status st = dr_chunk_text(m->tok, out->full, strlen(out->full), &co, &ch, err);
    if (st != DRAMA_OK) return st;
    if (ch.n <= 0) {
        dr_chunks_free(&ch);
        return dr_fail(err, DRAMA_EEMPTY, "text: nothing to speak");
    }
    out->batch = calloc((size_t)ch.n, sizeof *out->batch);
    if (!out->batch) {
        dr_chunks_free(&ch);
        return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < ch.n; i++) {
        out->batch[i] = ch.text[i];
        ch.text[i] = NULL;
        out->n_batches++;
    }
    dr_chunks_free(&ch);
    return DRAMA_OK;
}

drama_status dr_pl_lm_acquire(drama_model *m, drama_error *err) {
    if (m->lm) return DRAMA_OK;
    dr_pl_lm *lm = calloc(1, sizeof *lm);
    if (!lm) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    drama_status st = dr_gen_lm_open_on(m->dir, (const char *const *)m->sets, m->n_sets, m->threads, m->pool,
                                        &m->backend, m->tok, &lm->g, err); /* m->tok: parsed once */
    if (st != DRAMA_OK) {
        free(lm);
        return st;
    }
    m->lm = lm;
    return DRAMA_OK;
}

struct dr_gen_lm *dr_pl_lm_model(drama_model *m) { return m->lm ? m->lm->g : NULL; }

void dr_pl_lm_free(dr_pl_lm *lm) {
    if (!lm) return;
    dr_gen_lm_close(lm->g);
    free(lm);
}

void dr_pl_lm_release(drama_model *m) {
    if (m->engines > 0) return; /* an engine runs on it */
    dr_pl_lm_free(m->lm);
    m->lm = NULL;
}

drama_status dr_pl_gen_create(drama_model *m, const dr_pl_gen_params *p, dr_pl_gen **out, drama_error *err) {
    *out = NULL;
    if (!m->lm) return dr_fail(err, DRAMA_EINTERNAL, "pipeline: language model not loaded");
    dr_pl_gen *g = calloc(1, sizeof *g);
    if (!g) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    g->p = *p;
    g->nc = m->cfg->audio.num_codebooks;
    dr_gen_options_default(&g->o);
    dr_sampler_params_default(&g->o.sp);
    g->o.sp.temperature = p->temperature;
    g->o.sp.top_p = p->top_p;
    g->o.sp.cfg_gamma = p->cfg_gamma;
    g->o.sp.seed = p->seed;
    g->o.sp.frame_cap = p->frame_cap;
    g->o.has_reference = p->has_reference;
    g->guided_prompt = p->cfg_gamma > 0 && p->has_reference;
    g->align = m->cfg->sw.deltanet_prefill_recurrent ? 1 : DR_GDN_CHUNK;
    drama_status st = dr_gen_session_create(&m->lm->g->model, &g->o, &g->s, err);
    if (st != DRAMA_OK) {
        free(g);
        return st;
    }
    *out = g;
    return DRAMA_OK;
}

/* One prompt from scratch: system (+ references), then batches first..b-1 as history (user turn,
 * generation start, their frames, end of turn), then batch b's user turn and generation start. */
static drama_status build_prompt(dr_pl_gen *g, dr_prompt *pr, drama_model *m, const dr_pl_text *text, int first,
                                 int b, const dr_pl_refs *refs, int with_refs, int64_t *prefix_rows,
                                 drama_error *err) {
    dr_prompt_options opt;
    dr_prompt_options_from_switches(&m->cfg->sw, &opt);
    dr_reference r[16];
    int n = with_refs ? refs->n : 0;
    for (int i = 0; i < n; i++) {
        r[i].text = refs->transcript[i];
        r[i].codes = &refs->codes[i];
    }
    drama_status st = dr_prompt_begin(pr, m->tok, &opt, g->nc, err);
    if (st == DRAMA_OK) st = dr_prompt_system(pr, r, n, err);
    *prefix_rows = st == DRAMA_OK && refs->n > 0 ? pr->rows.n_rows : 0;
    for (int j = first; st == DRAMA_OK && j < b; j++) {
        st = dr_prompt_user(pr, text->batch[j], strlen(text->batch[j]), err);
        if (st == DRAMA_OK) st = dr_prompt_generation_start(pr, err);
        if (st == DRAMA_OK) st = dr_prompt_frames(pr, &g->hist[j], err);
        if (st == DRAMA_OK) st = dr_prompt_end_turn(pr, err);
    }
    if (st == DRAMA_OK) st = dr_prompt_user(pr, text->batch[b], strlen(text->batch[b]), err);
    if (st == DRAMA_OK) st = dr_prompt_generation_start(pr, err);
    return st;
}

/* The live prompt continued with batch b: batch b-1's frames (already in the states, so they
 * count as fed), the end of its turn, then batch b's user turn and generation start. */
static drama_status continue_prompt(dr_pl_gen *g, dr_prompt *pr, int64_t *fed, const dr_pl_text *text, int b,
                                    drama_error *err) {
    drama_status st = dr_prompt_frames(pr, &g->hist[b - 1], err);
    if (st == DRAMA_OK) *fed = pr->rows.n_rows;
    if (st == DRAMA_OK) st = dr_prompt_end_turn(pr, err);
    if (st == DRAMA_OK) st = dr_prompt_user(pr, text->batch[b], strlen(text->batch[b]), err);
    if (st == DRAMA_OK) st = dr_prompt_generation_start(pr, err);
    return st;
}

static void free_prompts(dr_pl_gen *g) {
    if (!g->started) return;
    dr_prompt_free(&g->cond);
    if (g->guided_prompt) dr_prompt_free(&g->uncond);
    g->started = 0;
}

/* Both prompts from scratch with history from batch `first` on. */
static drama_status rebuild(dr_pl_gen *g, drama_model *m, const dr_pl_text *text, int first, int b,
                            const dr_pl_refs *refs, drama_error *err) {
    free_prompts(g);
    g->started = 1;
    memset(&g->uncond, 0, sizeof g->uncond);
    g->cond_prefix = g->uncond_prefix = 0;
    drama_status st = build_prompt(g, &g->cond, m, text, first, b, refs, 1, &g->cond_prefix, err);
    if (st == DRAMA_OK && g->guided_prompt)
        st = build_prompt(g, &g->uncond, m, text, first, b, refs, 0, &g->uncond_prefix, err);
    g->cond_fed = g->uncond_fed = 0;
    return st;
}

drama_status dr_pl_gen_prompt(dr_pl_gen *g, drama_model *m, const dr_pl_text *text, int b, const dr_pl_refs *refs,
                              int64_t context, int64_t frames_ahead, int64_t *prompt_rows, drama_error *err) {
    drama_status st;
    if (b == 0) {
        st = rebuild(g, m, text, 0, 0, refs, err);
    } else {
        st = continue_prompt(g, &g->cond, &g->cond_fed, text, b, err);
        if (st == DRAMA_OK && g->guided_prompt) st = continue_prompt(g, &g->uncond, &g->uncond_fed, text, b, err);
        /* TEXT.md 4.6: when this batch's prompt plus its frames would overflow the context, the
         * oldest batches leave the history (system and references stay) and the prompt is
         * prefilled anew in a fresh state; the draw counter carries on. */
        if (st == DRAMA_OK && context > 0 && g->cond.rows.n_rows + frames_ahead > context) {
            int first = g->first_kept;
            while (st == DRAMA_OK && first < b) {
                first++;
                st = rebuild(g, m, text, first, b, refs, err);
                if (g->cond.rows.n_rows + frames_ahead <= context) break;
            }
            if (st == DRAMA_OK) {
                g->first_kept = first;
                g->o.draw_base += dr_gen_draws(g->s);
                dr_gen_session_free(g->s);
                g->s = NULL;
                st = dr_gen_session_create(&m->lm->g->model, &g->o, &g->s, err);
            }
        }
    }
    if (st != DRAMA_OK) return st;
    /* Only batch 0 starts with the voice prefix in a fresh session with no draws (the snapshot's
     * draw counter is 0); a trimmed later batch re-prefills it in its own session. */
    if (b > 0) g->cond_prefix = g->uncond_prefix = 0;
    *prompt_rows = g->cond.rows.n_rows;
    /* A new, empty frame list for this batch. */
    dr_codes *h = realloc(g->hist, (size_t)(g->n_hist + 1) * sizeof *h);
    if (!h) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    g->hist = h;
    memset(&g->hist[g->n_hist], 0, sizeof *h);
    st = dr_codes_create(&g->hist[g->n_hist], 0, g->nc, err);
    if (st == DRAMA_OK) g->n_hist++;
    return st;
}

int64_t dr_pl_gen_pending(const dr_pl_gen *g) {
    if (!g->started) return 0;
    return g->cond.rows.n_rows - g->cond_fed + (g->guided_prompt ? g->uncond.rows.n_rows - g->uncond_fed : 0);
}

void dr_pl_gen_prefix(const dr_pl_gen *g, int64_t *cond_rows, int64_t *uncond_rows) {
    *cond_rows = g->cond_fed == 0 ? g->cond_prefix : 0;
    *uncond_rows = g->cond_fed == 0 && g->guided_prompt ? g->uncond_prefix : 0;
}

const int32_t *dr_pl_gen_rows(const dr_pl_gen *g, int uncond, int64_t *n_rows) {
    const dr_prompt *p = uncond ? &g->uncond : &g->cond;
    if (!g->started || (uncond && !g->guided_prompt)) {
        *n_rows = 0;
        return NULL;
    }
    *n_rows = p->rows.n_rows;
    return p->rows.data;
}

int dr_pl_gen_is_guided(const dr_pl_gen *g) { return g->guided_prompt; }

int64_t dr_pl_gen_fed(const dr_pl_gen *g, int uncond) { return uncond ? g->uncond_fed : g->cond_fed; }

/* Rows of a piece from position fed toward fed + want, never past end (a forced cut: the prompt's
 * end or the voice prefix): an inner cut lands on a multiple of align (DR_GDN_CHUNK positions with
 * deltanet.prefill=chunked, so whole DeltaNet blocks run in the chunked form and the result does
 * not depend on the budget; 1 when row by row); when no multiple lies in (fed, fed + want] the
 * piece runs to the next one (at most one block). */
static int64_t aligned_piece(int64_t fed, int64_t want, int64_t end, int64_t align) {
    if (fed + want >= end) return end - fed;
    int64_t cut = (fed + want) / align * align;
    if (cut <= fed) cut = (fed / align + 1) * align;
    return (cut < end ? cut : end) - fed;
}

/* Rows of the next call, from positions fc (conditional) and fu (unconditional), rc and ru rows
 * left before their cuts: unguided, about `budget` (0: all); guided, both prompts advance in
 * proportion, each cut aligned; the unconditional may finish first (later calls carry none) but
 * never after the conditional, so both reach their cuts by the same call. */
static void next_piece(int64_t fc, int64_t rc, int64_t fu, int64_t ru, int64_t budget, int64_t align, int64_t *c,
                       int64_t *u) {
    *u = 0;
    if (budget <= 0) {
        *c = rc;
        *u = ru;
        return;
    }
    if (ru <= 0) {
        *c = aligned_piece(fc, budget, fc + rc, align);
        return;
    }
    int64_t pieces = (rc + ru + budget - 1) / budget;
    if (pieces > rc) pieces = rc;
    if (pieces < 1) pieces = 1;
    *c = aligned_piece(fc, (rc + pieces - 1) / pieces, fc + rc, align);
    *u = *c == rc ? ru : aligned_piece(fu, (ru + pieces - 1) / pieces, fu + ru, align);
}

drama_status dr_pl_gen_prefill(dr_pl_gen *g, int64_t max_rows, int64_t stop_cond, int64_t stop_uncond, int64_t *used,
                               drama_error *err) {
    *used = 0;
    if (!g->started) return dr_fail(err, DRAMA_EINTERNAL, "pipeline: prefill before a prompt");
    int64_t end_c = g->cond.rows.n_rows, end_u = g->guided_prompt ? g->uncond.rows.n_rows : 0;
    /* the voice prefix is always a cut, cached or not, so a cached voice changes no bit */
    if (stop_cond <= g->cond_fed && g->cond_prefix > g->cond_fed && (!g->guided_prompt || g->uncond_prefix > 0)) {
        stop_cond = g->cond_prefix;
        stop_uncond = g->uncond_prefix;
    }
    if (stop_cond > g->cond_fed && stop_cond < end_c) {
        end_c = stop_cond;
        if (g->guided_prompt) end_u = stop_uncond;
    }
    int64_t rc = end_c - g->cond_fed, ru = g->guided_prompt ? end_u - g->uncond_fed : 0;
    if (rc <= 0) return DRAMA_OK;
    if (g->guided_prompt && (ru < 0 || (g->uncond_fed == 0 && ru == 0)))
        return dr_fail(err, DRAMA_EINTERNAL, "pipeline: guided prefill without unconditional rows");
    int64_t c, u;
    next_piece(g->cond_fed, rc, g->uncond_fed, ru, max_rows, g->align, &c, &u);
    const int64_t w = g->cond.rows.n_cols;
    const int32_t *urows = u > 0 ? g->uncond.rows.data + g->uncond_fed * w : NULL;
    drama_status st = dr_gen_prefill(g->s, g->cond.rows.data + g->cond_fed * w, c, urows, u, err);
    if (st != DRAMA_OK) return st;
    g->cond_fed += c;
    g->uncond_fed += u;
    *used = c + u;
    return DRAMA_OK;
}

drama_status dr_pl_gen_restore(dr_pl_gen *g, const dr_gen_session *snap, int64_t cond_rows, int64_t uncond_rows,
                               drama_error *err) {
    if (!g->started || g->cond_fed != 0 || cond_rows > g->cond.rows.n_rows ||
        (g->guided_prompt && uncond_rows > g->uncond.rows.n_rows))
        return dr_fail(err, DRAMA_EINTERNAL, "pipeline: snapshot restored into a prompt it does not start");
    dr_gen_session *s = NULL;
    drama_status st = dr_gen_session_clone(snap, &s, err);
    if (st == DRAMA_OK) st = dr_gen_set_params(s, &g->o.sp, err);
    if (st != DRAMA_OK) {
        dr_gen_session_free(s);
        return st;
    }
    dr_gen_session_free(g->s);
    g->s = s;
    g->cond_fed = cond_rows;
    g->uncond_fed = g->guided_prompt ? uncond_rows : 0;
    return DRAMA_OK;
}

dr_gen_session *dr_pl_gen_session(dr_pl_gen *g) { return g->s; }

void dr_pl_gen_begin_frames(dr_pl_gen *g, int64_t budget) { dr_gen_set_frames(g->s, budget > 0 ? (int)budget : 0); }

drama_status dr_pl_gen_keep(dr_pl_gen *g, const int32_t *frame, drama_error *err) {
    if (g->n_hist == 0) return dr_fail(err, DRAMA_EINTERNAL, "pipeline: frames before a prompt");
    dr_codes *c = &g->hist[g->n_hist - 1];
    int64_t n = c->n_frames + 1;
    int32_t *d = realloc(c->data, (size_t)n * (size_t)g->nc * sizeof *d);
    if (!d) return dr_fail(err, DRAMA_ENOMEM, "out of memory keeping frames");
    memcpy(d + c->n_frames * g->nc, frame, (size_t)g->nc * sizeof *d);
    c->data = d;
    c->n_frames = n;
    return DRAMA_OK;
}

void dr_pl_gen_free(dr_pl_gen *g) {
    if (!g) return;
    dr_gen_session_free(g->s);
    free_prompts(g);
    for (int i = 0; i < g->n_hist; i++) dr_codes_free(&g->hist[i]);
    free(g->hist);
    free(g);
}
