/* engine_plan.c - what a request needs before it runs (drama_request_plan), and the checks a
 * server makes on other threads before admission: text validation, reference encoding, the codec
 * fingerprint (include/drama.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "base/receipt.h"
#include "codec/view.h"
#include "gen/engine_internal.h"
#include "gen/session.h"
#include "io/audio_in.h"
#include "model/state_bytes.h"
#include "text/prompt.h"

int drama_model_codebooks(const drama_model *model) { return model ? model->n_codebooks : 0; }

void drama_codes_free(int32_t *codes) { free(codes); }

const char *drama_model_codec_fingerprint(drama_model *m) {
    if (!m) return NULL;
    pthread_mutex_lock(&m->info_lock);
    if (!m->fingerprint_done) {
        char path[4096];
        drama_error e = {0};
        int cached = 0;
        if (dr_codec_file(m->dir, path, sizeof path, &e) == DRAMA_OK &&
            dr_sha256_file_cached_hex(path, m->fingerprint, &cached, &e) == DRAMA_OK)
            m->fingerprint_done = 1;
    }
    const char *r = m->fingerprint_done ? m->fingerprint : NULL;
    pthread_mutex_unlock(&m->info_lock);
    return r;
}

drama_status drama_validate_text(const drama_model *m, const char *text, int64_t max_code_points, drama_error *err) {
    if (!m) return dr_fail(err, DRAMA_EINVAL, "drama_validate_text: model is NULL");
    if (!text) return dr_fail(err, DRAMA_EINVAL, "text: missing");
    size_t len = strlen(text);
    if (max_code_points > 0) {
        int64_t cps = 0;
        for (size_t i = 0; i < len; i++) cps += ((unsigned char)text[i] & 0xC0) != 0x80;
        if (cps > max_code_points)
            return dr_fail_reason(err, DRAMA_EINVAL, "text_too_long", "text_too_long: %lld code points, at most %lld",
                                  (long long)cps, (long long)max_code_points);
    }
    return dr_prompt_validate_text(m->tok, text, len, "text", err);
}

drama_status drama_encode_audio(drama_model *m, const void *data, size_t n, double max_seconds, int32_t **codes,
                                int64_t *n_frames, double *duration_s, drama_error *err) {
    if (codes) *codes = NULL;
    if (n_frames) *n_frames = 0;
    if (duration_s) *duration_s = 0;
    if (!m || !codes || !n_frames) return dr_fail(err, DRAMA_EINVAL, "drama_encode_audio: model, codes or n_frames is NULL");
    if (!data || n == 0) return dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "audio: no bytes");
    dr_codes out;
    memset(&out, 0, sizeof out);
    drama_status st;
    /* Fast path: the codec is loaded with its encoder; encode on this thread through the view
     * (no pool), any number of threads at once. */
    pthread_rwlock_rdlock(&m->codec_lock);
    int have = m->enc_view != NULL;
    if (have) st = dr_pl_encode_audio(m, m->enc_view, NULL, data, n, max_seconds, &out, duration_s, err);
    pthread_rwlock_unlock(&m->codec_lock);
    if (!have) {
        /* No codec yet (or low-memory mode): load it between requests, encode, and in low-memory
         * mode give it back. */
        pthread_mutex_lock(&m->run_lock);
        st = dr_pl_codec_acquire(m, DR_CODEC_LOAD_ENCODER, err);
        if (st == DRAMA_OK) {
            pthread_rwlock_rdlock(&m->codec_lock);
            st = m->enc_view ? dr_pl_encode_audio(m, m->enc_view, NULL, data, n, max_seconds, &out, duration_s, err)
                             : dr_fail(err, DRAMA_EINTERNAL, "codec loaded without its encoder");
            pthread_rwlock_unlock(&m->codec_lock);
        }
        if (m->low_memory) dr_pl_codec_release(m);
        pthread_mutex_unlock(&m->run_lock);
    }
    if (st != DRAMA_OK) return st;
    *codes = out.data;
    *n_frames = out.n_frames;
    return DRAMA_OK;
}

/* ---- request plans ---- */

/* Rows a prompt segment list makes, built with the real builder (so switches and tokenization
 * count exactly as they will). */
typedef struct row_counts {
    int64_t sys_c, sys_u;    /* system message with / without the references */
    int64_t gen_start, end_turn;
    int64_t *user;           /* [n_batches] the user turn of each batch */
} row_counts;

static drama_status count_rows(drama_model *m, const dr_pl_text *text, const dr_reference *refs, int n_refs,
                               row_counts *rc, drama_error *err) {
    dr_prompt_options opt;
    dr_prompt_options_from_switches(&m->cfg->sw, &opt);
    int nc = m->cfg->audio.num_codebooks;
    rc->user = calloc((size_t)text->n_batches, sizeof *rc->user);
    if (!rc->user) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    dr_prompt p;
    drama_status st = dr_prompt_begin(&p, m->tok, &opt, nc, err);
    if (st == DRAMA_OK) st = dr_prompt_system(&p, refs, n_refs, err);
    rc->sys_c = p.rows.n_rows;
    dr_prompt_free(&p);
    if (st == DRAMA_OK) st = dr_prompt_begin(&p, m->tok, &opt, nc, err);
    if (st == DRAMA_OK) st = dr_prompt_system(&p, NULL, 0, err);
    rc->sys_u = p.rows.n_rows;
    int64_t base = p.rows.n_rows;
    if (st == DRAMA_OK) st = dr_prompt_generation_start(&p, err);
    rc->gen_start = p.rows.n_rows - base;
    base = p.rows.n_rows;
    if (st == DRAMA_OK) st = dr_prompt_end_turn(&p, err);
    rc->end_turn = p.rows.n_rows - base;
    for (int b = 0; st == DRAMA_OK && b < text->n_batches; b++) {
        base = p.rows.n_rows;
        st = dr_prompt_user(&p, text->batch[b], strlen(text->batch[b]), err);
        rc->user[b] = p.rows.n_rows - base;
    }
    dr_prompt_free(&p);
    return st;
}

/* Frames the reference will give: codes as they are, audio by its decoded length. */
static drama_status ref_frames(drama_model *m, const drama_reference *r, int64_t *frames, drama_error *err) {
    if (r->codes) {
        *frames = r->n_code_frames;
        return *frames > 0 ? DRAMA_OK : dr_fail_reason(err, DRAMA_EEMPTY, "bad_audio", "codes: no frames");
    }
    if (r->codes_path) {
        int32_t upper[64];
        dr_codes c;
        drama_status st = dr_pl_codes_bounds(m, m->n_codebooks, upper, err);
        if (st == DRAMA_OK) st = dr_codes_read(r->codes_path, m->n_codebooks, upper, &c, err);
        if (st != DRAMA_OK) return st;
        *frames = c.n_frames;
        dr_codes_free(&c);
        return *frames > 0 ? DRAMA_OK : dr_fail(err, DRAMA_EEMPTY, "%s: no frames", r->codes_path);
    }
    dr_audio_in_opts ao = {.target_rate = m->sample_rate, .max_seconds = 0};
    float *x = NULL;
    int64_t n = 0;
    drama_status st = r->audio_path ? dr_audio_read(r->audio_path, &ao, &x, &n, err)
                                    : dr_audio_read_memory(r->audio_data, r->audio_bytes, "audio", &ao, &x, &n, err);
    free(x);
    if (st != DRAMA_OK) {
        dr_error_set_reason(err, "bad_audio");
        return st;
    }
    *frames = (n + m->samples_per_frame - 1) / m->samples_per_frame;
    return DRAMA_OK;
}

/* Scratch one prefill call of `rows` rows allocates (backbone activations, MoE rows, tower
 * activations, the frame loop's copies), over a state of `positions` positions. */
static int64_t prefill_scratch(const dr_gen_lm *g, int64_t rows, int64_t positions, int workers) {
    const dr_bb_dims *d = &g->bb.d;
    const dr_tower_dims *t = &g->tower.d;
    int64_t H = d->H, nl = g->model.bb.n_candidates, kvd = (int64_t)d->nkv * d->hd, qd = (int64_t)d->nh * d->hd;
    int64_t C = 2 * (int64_t)d->nk * d->dk + (int64_t)d->nv * d->dv, vd = (int64_t)d->nv * d->dv;
    int64_t I = d->I > d->Is ? d->I : d->Is;
    int64_t bb = 3 * H + (H > nl ? H : nl) + 2 * qd + 2 * kvd + qd + 2 * C + 2 * vd + 2 * d->nv + d->E +
                 2 * (int64_t)d->topk * H + (int64_t)d->topk * I + 1 + H + nl;
    int64_t tw = (int64_t)t->dim * 8 + g->tower.input_dim * 2 + 2 * g->tower.ffn + t->head_vocab +
                 (int64_t)(t->n_head + 2 * t->n_kv_head) * t->head_dim;
    int64_t loop = 2 * H + t->num_codebooks + 1;
    int64_t gdn = dr_op_gdn_chunk_scratch(DR_GDN_CHUNK, d->dk, d->dv); /* per worker, chunked DeltaNet */
    return (rows + 1) * (bb + tw + loop) * (int64_t)sizeof(float) +
           (int64_t)workers * (positions * 2 + gdn) * (int64_t)sizeof(float);
}

/* The generation session's own buffers (logits, hidden, sampler workspace). */
static int64_t session_fixed(const dr_gen_lm *g) {
    int64_t nl = g->model.bb.n_candidates, hv = g->tower.d.head_vocab, nc = g->tower.d.num_codebooks;
    int64_t cap = nl > hv ? nl : hv;
    return (int64_t)(g->bb.d.H + 3 * nl + (nc - 1) * hv + nc + 1 + 4 * cap) * (int64_t)sizeof(float) + 4096;
}

int64_t dr_plan_snapshot_bytes(drama_model *m, int64_t cond_rows, int64_t uncond_rows) {
    const dr_gen_lm *g = dr_pl_lm_model(m);
    if (!g) return 0;
    int64_t b = (int64_t)dr_bb_state_bytes_for(&g->bb, 256, cond_rows) +
                (int64_t)dr_tower_cache_bytes_for(&g->tower, 256, cond_rows) + session_fixed(g);
    if (uncond_rows > 0) b += (int64_t)dr_bb_state_bytes_for(&g->bb, 256, uncond_rows);
    return b;
}

drama_status dr_plan_request(drama_model *m, const drama_request *req, int64_t prefill_rows_max, drama_plan *plan,
                             drama_error *err) {
    memset(plan, 0, sizeof *plan);
    drama_status st = dr_request_validate(req, err);
    if (st != DRAMA_OK) return st;
    const dr_gen_lm *g = dr_pl_lm_model(m);
    if (!g) return dr_fail(err, DRAMA_EINTERNAL, "plan: the language model is not loaded");
    dr_pl_text text;
    st = dr_pl_text_prepare(m, req, &text, err);
    if (st != DRAMA_OK) return st;
    int nc = m->n_codebooks, nref = req->n_references;
    dr_codes codes[16];
    dr_reference refs[16];
    memset(codes, 0, sizeof codes);
    int64_t ref_rows = 0;
    for (int i = 0; st == DRAMA_OK && i < nref; i++) {
        int64_t f = 0;
        st = ref_frames(m, &req->references[i], &f, err);
        if (st != DRAMA_OK) dr_error_prefix(err, "reference %d: ", i);
        if (st == DRAMA_OK) st = dr_codes_create(&codes[i], f, nc, err); /* zeros: only the count matters */
        refs[i].text = req->references[i].transcript;
        refs[i].codes = &codes[i];
        ref_rows += f;
    }
    row_counts rc;
    memset(&rc, 0, sizeof rc);
    if (st == DRAMA_OK) st = count_rows(m, &text, refs, nref, &rc, err);
    plan->n_batches = text.n_batches;
    plan->guided = nref > 0 && req->cfg_gamma > 0;
    int64_t context = req->context > 0 ? req->context : DR_DEFAULT_CONTEXT;
    /* frames per batch at most, as the pipeline plans them (TEXT.md 4.6 uses the same figure) */
    int64_t ahead = req->frames > 0 ? req->frames : req->frames_per_batch > 0 ? req->frames_per_batch : req->max_frames;
    if (ahead > req->max_frames) ahead = req->max_frames;
    plan->frame_cap = ahead;
    plan->max_frames = req->frames > 0 ? req->frames : ahead * text.n_batches;
    if (st == DRAMA_OK) {
        plan->prompt_rows = rc.sys_c + rc.user[0] + rc.gen_start;
        plan->uncond_rows = plan->guided ? rc.sys_u + rc.user[0] + rc.gen_start : 0;
        plan->prefix_rows = nref > 0 ? rc.sys_c : 0;
        /* the state's rows: the whole history when it fits, else at most the context (older
         * batches leave it); every batch alone must fit */
        int64_t total = rc.sys_c, longest_prompt = 0;
        for (int b = 0; b < text.n_batches; b++) {
            int64_t alone = rc.sys_c + rc.user[b] + rc.gen_start + ahead;
            if (alone > context && st == DRAMA_OK)
                st = dr_fail_reason(err, DRAMA_EINVAL, "request_too_large",
                                    "request_too_large: batch %d needs %lld rows (prompt + %lld frames), the context "
                                    "holds %lld",
                                    b, (long long)alone, (long long)ahead, (long long)context);
            int64_t prompt = total + rc.user[b] + rc.gen_start;
            if (prompt > longest_prompt) longest_prompt = prompt;
            total = prompt + ahead + rc.end_turn;
        }
        plan->max_rows = total - rc.end_turn < context ? total - rc.end_turn : context;
        if (longest_prompt > context) longest_prompt = context;
        int64_t max_rows_u = plan->guided ? plan->max_rows - (rc.sys_c - rc.sys_u) : 0;
        /* a slice's cuts land on DeltaNet blocks: up to one block more per prompt (dr_pl_gen_prefill) */
        int64_t slice = prefill_rows_max > 0 ? prefill_rows_max + DR_GDN_CHUNK : longest_prompt;
        int64_t prefill = slice < longest_prompt ? slice : longest_prompt;
        int W = 1 + nc, workers = dr_pool_threads(m->pool);
        int64_t chunk = req->stream_first_frames > req->stream_chunk_frames ? req->stream_first_frames
                                                                            : req->stream_chunk_frames;
        if (chunk < DR_STREAM_NEXT_CHUNK) chunk = DR_STREAM_NEXT_CHUNK;
        int64_t b = dr_plan_snapshot_bytes(m, plan->max_rows, max_rows_u);
        b += prefill_scratch(g, plan->guided ? 2 * prefill : prefill, plan->max_rows, workers);
        b += 2 * (plan->max_rows + max_rows_u) * W * (int64_t)sizeof(int32_t) * 2; /* prompts (capacity doubling) */
        b += 4 * plan->max_frames * nc * (int64_t)sizeof(int32_t);                /* frames: lane + history */
        b += 2 * ref_rows * nc * (int64_t)sizeof(int32_t);                         /* reference codes */
        for (int i = 0; i < nref; i++) b += (int64_t)req->references[i].audio_bytes; /* the request's copy */
        if (m->codec) b += (int64_t)dr_codec_stream_bytes(m->codec, chunk);
        int64_t pcm_frames = req->stream ? chunk : plan->max_frames;
        b += pcm_frames * m->samples_per_frame * (int64_t)sizeof(float);
        b += (int64_t)strlen(req->text) * 4 + 65536; /* text, batches, small structs */
        plan->state_bytes = b;
    }
    free(rc.user);
    for (int i = 0; i < nref; i++) dr_codes_free(&codes[i]);
    dr_pl_text_free(&text);
    if (st != DRAMA_OK) memset(plan, 0, sizeof *plan);
    return st;
}

drama_status drama_request_plan(drama_model *m, const drama_request *req, drama_plan *plan, drama_error *err) {
    if (!plan) return dr_fail(err, DRAMA_EINVAL, "drama_request_plan: plan is NULL");
    memset(plan, 0, sizeof *plan);
    if (!m) return dr_fail(err, DRAMA_EINVAL, "drama_request_plan: model is NULL");
    /* The sizes come from the bound model. An engine keeps it loaded and unchanged (no lock: this
     * runs beside the engine's ticks); otherwise load it between requests, under the run lock. */
    if (atomic_load(&m->engines) > 0 && m->lm) return dr_plan_request(m, req, 0, plan, err);
    pthread_mutex_lock(&m->run_lock);
    drama_status st = dr_pl_lm_acquire(m, err);
    if (st == DRAMA_OK) st = dr_plan_request(m, req, 0, plan, err);
    if (m->low_memory) dr_pl_lm_release(m);
    pthread_mutex_unlock(&m->run_lock);
    return st;
}
