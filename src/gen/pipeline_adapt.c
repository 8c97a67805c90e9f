/* pipeline_adapt.c - model open/close, text preparation, references and codec lifetime for the
 * pipeline (see pipeline_adapt.h). The language-model adapter is in pipeline_lm.c. */
#include "gen/pipeline_adapt.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "codec/view.h"

/* ---- model ---- */

drama_status dr_pl_model_open(drama_model **out, const char *dir, const drama_model_options *opt,
                              drama_error *err) {
    drama_model *m = calloc(1, sizeof *m);
    if (!m) return dr_fail(err, DRAMA_ENOMEM, "out of memory opening %s", dir);
    drama_status st = DRAMA_OK;
    pthread_mutex_init(&m->run_lock, NULL);
    pthread_rwlock_init(&m->codec_lock, NULL);
    pthread_mutex_init(&m->info_lock, NULL);
    m->dir = strdup(dir);
    m->threads = opt->threads;
    m->low_memory = opt->low_memory;
    /* drama_backend and dr_backend_want share their values */
    m->backend = (dr_backend_choice){(dr_backend_want)opt->backend, opt->device};
    if (!m->dir) st = dr_fail(err, DRAMA_ENOMEM, "out of memory opening %s", dir);
    for (int i = 0; st == DRAMA_OK && opt->set && opt->set[i]; i++) {
        char **s = realloc(m->sets, (size_t)(m->n_sets + 1) * sizeof *s);
        if (!s) { st = dr_fail(err, DRAMA_ENOMEM, "out of memory"); break; }
        m->sets = s;
        m->sets[m->n_sets] = strdup(opt->set[i]);
        if (!m->sets[m->n_sets]) { st = dr_fail(err, DRAMA_ENOMEM, "out of memory"); break; }
        m->n_sets++;
    }
    /* The cheap parts load now so a wrong directory fails at once; weights load per request
     * (the "load" phase) and stay resident unless low_memory. */
    if (st == DRAMA_OK) st = dr_config_load(dir, (const char *const *)m->sets, m->n_sets, &m->cfg, err);
    if (st == DRAMA_OK) {
        m->pool = dr_pool_create(m->threads);
        if (!m->pool) st = dr_fail(err, DRAMA_ENOMEM, "cannot create a pool of %d threads", m->threads);
    }
    if (st == DRAMA_OK) { /* with the pool's thread count (the default resolved there) */
        char p[4096];
        snprintf(p, sizeof p, "%s/tokenizer.json", dir);
        st = dr_tok_load_threads(p, dr_pool_threads(m->pool), &m->tok, err);
    }
    if (st == DRAMA_OK) st = dr_pl_codec_geometry(m, &m->sample_rate, &m->samples_per_frame, &m->n_codebooks, err);
    if (st != DRAMA_OK) {
        dr_pl_model_close(m);
        return st;
    }
    *out = m;
    return DRAMA_OK;
}

void dr_pl_model_close(drama_model *m) {
    if (!m) return;
    m->engines = 0; /* closing under a live engine is the caller's bug; free everything anyway */
    dr_pl_lm_release(m);
    dr_pl_codec_release(m);
    dr_pool_free(m->pool);
    dr_tok_free(m->tok);
    dr_config_free(m->cfg);
    for (int i = 0; i < m->n_sets; i++) free(m->sets[i]);
    free(m->sets);
    free(m->dir);
    pthread_mutex_destroy(&m->run_lock);
    pthread_rwlock_destroy(&m->codec_lock);
    pthread_mutex_destroy(&m->info_lock);
    free(m);
}

void dr_pl_session_release(drama_session *s) { (void)s; }

uint64_t dr_pl_random_seed(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 32;
    }
    return x;
}

/* ---- codec ---- */

/* Frames flow between model and codec unchanged: both must agree on their width and on the
 * geometry the output was opened with. */
static drama_status codec_matches(const drama_model *m, const dr_codec *codec, drama_error *err) {
    const dr_codec_config *cc = dr_codec_cfg(codec);
    if (cc->num_codebooks != m->cfg->audio.num_codebooks || (m->sample_rate && cc->sample_rate != m->sample_rate) ||
        (m->samples_per_frame && cc->frame_length != m->samples_per_frame))
        return dr_fail(err, DRAMA_ESHAPE,
                       "%s: the codec (%d codebooks, %d Hz, %d samples per frame) does not match the model "
                       "(config.json audio num_codebooks %d; codec.json %d Hz, %d samples per frame)",
                       m->dir, cc->num_codebooks, cc->sample_rate, cc->frame_length, m->cfg->audio.num_codebooks,
                       m->sample_rate, m->samples_per_frame);
    return DRAMA_OK;
}

/* The rest of dr_pl_codec_acquire once the codec's files are open (c is consumed). */
static drama_status codec_install(drama_model *m, dr_codec *c, unsigned load, drama_error *err) {
    drama_status st = codec_matches(m, c, err);
    /* the decoder runs where the language model runs (--backend); the encoder stays on the CPU */
    if (st == DRAMA_OK && (load & DR_CODEC_LOAD_DECODER)) st = dr_backend_codec_attach(&m->backend, c, NULL, err);
    dr_codec *view = NULL;
    if (st == DRAMA_OK && (load & DR_CODEC_LOAD_ENCODER)) st = dr_codec_view_create(c, NULL, &view, err);
    if (st != DRAMA_OK) {
        dr_codec_free(c);
        return st;
    }
    dr_codec_set_pool(c, m->pool);
    pthread_rwlock_wrlock(&m->codec_lock);
    m->codec = c;
    m->codec_parts = load;
    m->enc_view = view;
    pthread_rwlock_unlock(&m->codec_lock);
    return DRAMA_OK;
}

drama_status dr_pl_codec_acquire(drama_model *m, unsigned parts, drama_error *err) {
    if (m->codec) return DRAMA_OK;
    unsigned load = m->low_memory ? parts : DR_CODEC_LOAD_ALL;
    dr_codec *c = NULL;
    drama_status st = dr_codec_open(m->dir, load, &c, err);
    return st == DRAMA_OK ? codec_install(m, c, load, err) : st;
}

struct dr_pl_codec_preload {
    pthread_t thread;
    const char *dir;
    dr_codec *c;
    drama_status st;
    drama_error err;
};

static void *preload_main(void *arg) {
    dr_pl_codec_preload *p = arg;
    p->st = dr_codec_open(p->dir, DR_CODEC_LOAD_ALL, &p->c, &p->err);
    return NULL;
}

dr_pl_codec_preload *dr_pl_codec_preload_start(drama_model *m) {
    if (m->codec || m->low_memory || dr_pool_threads(m->pool) < 2) return NULL;
    dr_pl_codec_preload *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->dir = m->dir;
    if (pthread_create(&p->thread, NULL, preload_main, p) != 0) {
        free(p);
        return NULL; /* the codec loads on the caller's thread later, as without a preload */
    }
    return p;
}

drama_status dr_pl_codec_preload_finish(drama_model *m, dr_pl_codec_preload *p, int use, drama_error *err) {
    if (!p) return DRAMA_OK;
    pthread_join(p->thread, NULL);
    drama_status st = p->st;
    if (st != DRAMA_OK && use && err) *err = p->err;
    if (st == DRAMA_OK && use && !m->codec) st = codec_install(m, p->c, DR_CODEC_LOAD_ALL, err);
    else dr_codec_free(p->c); /* failed (NULL), not wanted, or a codec came in meanwhile */
    free(p);
    return use ? st : DRAMA_OK;
}

drama_status dr_pl_codec_check(drama_model *m, drama_error *err) {
    if (m->codec) return DRAMA_OK; /* checked when it was acquired */
    dr_codec *probe = NULL;        /* parts 0: tensor names and shapes only, no weights copied */
    drama_status st = dr_codec_open(m->dir, 0, &probe, err);
    if (st == DRAMA_OK) st = codec_matches(m, probe, err);
    dr_codec_free(probe);
    return st;
}

void dr_pl_codec_release(drama_model *m) {
    if (m->engines > 0) return; /* an engine runs on it */
    pthread_rwlock_wrlock(&m->codec_lock);
    dr_codec_view_free(m->enc_view);
    dr_codec_free(m->codec);
    m->enc_view = NULL;
    m->codec = NULL;
    m->codec_parts = 0;
    pthread_rwlock_unlock(&m->codec_lock);
}

drama_status dr_pl_codec_geometry(drama_model *m, int *sample_rate, int *samples_per_frame, int *n_codebooks,
                                  drama_error *err) {
    dr_codec_config cc;
    if (m->codec) {
        cc = *dr_codec_cfg(m->codec);
    } else {
        dr_codec_config_default(&cc);
        char p[4096];
        snprintf(p, sizeof p, "%s/codec.json", m->dir);
        if (access(p, F_OK) == 0) {
            drama_status st = dr_codec_config_read(p, &cc, err);
            if (st != DRAMA_OK) return st;
        }
    }
    *sample_rate = cc.sample_rate;
    *samples_per_frame = cc.frame_length;
    *n_codebooks = m->cfg->audio.num_codebooks;
    if (*sample_rate <= 0 || *samples_per_frame <= 0 || *n_codebooks <= 0)
        return dr_fail(err, DRAMA_EFORMAT, "%s: codec sample rate %d / frame length %d / codebooks %d not usable",
                       m->dir, *sample_rate, *samples_per_frame, *n_codebooks);
    return DRAMA_OK;
}

/* ---- references ---- */

drama_status dr_pl_codes_bounds(drama_model *m, int nc, int32_t *upper, drama_error *err) {
    /* Bounds from the model: c0 indexes the semantic tokens, c1.. the tower heads (CODEC.md 2:
     * codes from outside are rejected, never clamped). */
    int64_t sem = m->cfg->audio.vocab_size;
    int head = m->cfg->sw.tower_head_vocab > 0 ? m->cfg->sw.tower_head_vocab : 1024;
    if (m->codec) {
        const dr_codec_config *cc = dr_codec_cfg(m->codec);
        if (cc->semantic_codebook_size > 0) sem = cc->semantic_codebook_size;
        if (cc->codebook_size > 0) head = cc->codebook_size;
    }
    if (sem <= 0 || nc > 64) return dr_fail(err, DRAMA_EFORMAT, "model: cannot derive code ranges");
    upper[0] = (int32_t)sem;
    for (int k = 1; k < nc; k++) upper[k] = head;
    return DRAMA_OK;
}

/* Codes given in memory: copied and range-checked like a CODES.json file (CODEC.md 2). */
static drama_status copy_codes(const drama_reference *r, int nc, const int32_t *upper, dr_codes *out,
                               drama_error *err) {
    if (r->n_code_frames <= 0) return dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "codes: no frames");
    if (r->n_code_frames > INT32_MAX) return dr_fail(err, DRAMA_EINVAL, "codes: %lld frames", (long long)r->n_code_frames);
    drama_status st = dr_codes_create(out, r->n_code_frames, nc, err);
    if (st != DRAMA_OK) return st;
    memcpy(out->data, r->codes, (size_t)r->n_code_frames * (size_t)nc * sizeof(int32_t));
    st = dr_codes_check(out, upper, "codes", err);
    if (st != DRAMA_OK) dr_codes_free(out);
    return st;
}

drama_status dr_pl_refs_encode(drama_model *m, const drama_reference *refs, int n, dr_pl_refs *out,
                               drama_error *err) {
    memset(out, 0, sizeof *out);
    int nc = m->cfg->audio.num_codebooks;
    int32_t upper[64];
    drama_status st = DRAMA_OK;
    int need_encoder = 0;
    for (int i = 0; i < n; i++) need_encoder |= refs[i].audio_path != NULL || refs[i].audio_data != NULL;
    if (need_encoder) st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_ENCODER, err);
    if (st == DRAMA_OK) st = dr_pl_codes_bounds(m, nc, upper, err);
    for (int i = 0; st == DRAMA_OK && i < n; i++) {
        const drama_reference *r = &refs[i];
        out->transcript[i] = r->transcript;
        if (r->codes_path) {
            st = dr_codes_read(r->codes_path, nc, upper, &out->codes[i], err);
            if (st == DRAMA_OK && out->codes[i].n_frames == 0)
                st = dr_fail(err, DRAMA_EEMPTY, "%s: no frames", r->codes_path);
            if (st != DRAMA_OK) dr_error_prefix(err, "reference %d: ", i);
        } else if (r->codes) {
            st = copy_codes(r, nc, upper, &out->codes[i], err);
            if (st != DRAMA_OK) dr_error_prefix(err, "reference %d: ", i);
        } else {
            st = dr_pl_encode_audio(m, m->codec, r->audio_path, r->audio_data, r->audio_bytes, 0, &out->codes[i], NULL,
                                    err);
            if (st != DRAMA_OK) dr_error_prefix(err, "reference %d (%s): ", i, r->audio_path ? r->audio_path : "audio bytes");
        }
        out->n = i + 1;
    }
    if (m->low_memory) dr_pl_codec_release(m); /* the encoder is not needed again */
    if (st != DRAMA_OK) dr_pl_refs_free(out);
    return st;
}

void dr_pl_refs_free(dr_pl_refs *r) {
    for (int i = 0; i < r->n; i++) dr_codes_free(&r->codes[i]);
    memset(r, 0, sizeof *r);
}

/* ---- text ---- */

void dr_prompt_options_from_switches(const dr_switches *sw, dr_prompt_options *o) {
    dr_prompt_options_default(o);
    if (sw->prompt_plain_instruction) o->plain_instruction = sw->prompt_plain_instruction;
    if (sw->prompt_reference_instruction) o->reference_instruction = sw->prompt_reference_instruction;
    if (sw->prompt_reference_text_header) o->reference_text_header = sw->prompt_reference_text_header;
    if (sw->prompt_reference_speech_header) o->reference_speech_header = sw->prompt_reference_speech_header;
    if (sw->prompt_transcript_joiner) o->transcript_joiner = sw->prompt_transcript_joiner;
    o->reference_speaker_tags = sw->prompt_reference_speaker_tags;
    o->default_speaker_tag = sw->prompt_default_speaker_tag;
    o->system_without_reference = sw->prompt_system_without_reference;
}

drama_status dr_pl_text_prepare(drama_model *m, const drama_request *req, dr_pl_text *out, drama_error *err) {
    memset(out, 0, sizeof *out);
    const char *text = req->text;
    size_t len = strlen(text);
    /* --speaker N: text that does not start (after whitespace) with a speaker tag gets one. */
    size_t lead = 0;
    while (lead < len && (text[lead] == ' ' || text[lead] == '\t' || text[lead] == '\n' || text[lead] == '\r')) lead++;
    int sp = -1;
    int tagged = dr_prompt_speaker_tag_at(text, len, lead, &sp) > 0;
    size_t n = len + 32;
    out->full = malloc(n);
    if (!out->full) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    if (req->speaker >= 0 && !tagged) snprintf(out->full, n, "<|speaker:%d|>%s", req->speaker, text);
    else snprintf(out->full, n, "%s", text);
    drama_status st = dr_prompt_validate_text(m->tok, out->full, strlen(out->full), "text", err);
    for (int i = 0; st == DRAMA_OK && i < req->n_references; i++) {
        char what[48];
        snprintf(what, sizeof what, "reference %d transcript", i);
        const char *t = req->references[i].transcript;
        st = dr_prompt_validate_text(m->tok, t, strlen(t), what, err);
    }
    if (st == DRAMA_OK) st = dr_pl_text_batches(m, req, out, err);
    if (st != DRAMA_OK) dr_pl_text_free(out);
    return st;
}

void dr_pl_text_free(dr_pl_text *t) {
    for (int i = 0; i < t->n_batches; i++) free(t->batch[i]);
    free(t->batch);
    free(t->full);
    memset(t, 0, sizeof *t);
}
