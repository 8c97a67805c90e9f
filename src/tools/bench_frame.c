/* bench_frame.c - `drama bench frame`: the whole frame step (guidance-free semantic draw, the
 * tower's codebook chain with its draws, one backbone step) at batch 1 on a model directory, on
 * the CPU or the CUDA backend, against the memory-bandwidth floor; and the time to the first
 * frame's codes for a prompt prefilled from scratch and for a cached voice prefix.
 *
 * The prompt is synthetic, --prompt-rows P rows: 10% text rows, 60% audio rows (a stand-in
 * reference voice, random codes), 30% text rows. The voice prefix is the first 70%.
 *
 *   ttfa_prompt   session create + prefill of the P rows + the first frame, codes on the host
 *                 (first call of the process: includes graph capture and workspace growth; then
 *                 again on a fresh session: the steady value)
 *   ttfa_cached   clone of a prefilled voice-prefix session (the prompt cache's snapshot) +
 *                 prefill of the request's text rows + the first frame, codes on the host
 *   ms_per_frame  --frames N frames after W warm-up frames, each pulled to the host
 *
 * "First audio" in the ttfa_* lines is codes-ready. When the model directory has a codec, the
 * decode of the first streamed chunk (DR_STREAM_FIRST_CHUNK frames of this run's codes, a fresh
 * stream, on the same backend choice: the CUDA decoder with --backend cuda) is timed too, and
 * ttfa_cached_voice_audio = ttfa_cached_voice + (chunk - 1) x ms_per_frame + that decode.
 *
 * Bytes per frame are the stored bytes of the weights one frame step reads: every dense backbone
 * and tower matrix, top_k of each layer's kept experts (their mean size), the head rows the
 * restricted logits score (n_semantic + 1) and the tower heads' head_vocab rows, one embedding row
 * and the code-table rows of a frame; fp32 vectors (norms, conv kernels) counted whole. The
 * bandwidth is the backend's own measurement in the same run (CUDA: a device-to-device copy, read
 * + write; CPU: a multi-threaded read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cli_args.h"
#include "codec/codec.h"
#include "gen/frameloop.h"
#include "gen/pipeline.h"
#include "gen/session.h"
#include "model/upload.h"
#include "num/weight.h"
#include "tools/bench.h"

typedef struct frame_bytes {
    const dr_gen_lm *lm;
    double dense, experts, head, tower, vectors;
} frame_bytes;

static double rows_bytes(const dr_weight *w, int64_t rows) {
    return w->rows > 0 ? (double)dr_weight_bytes(w) * (double)(rows < w->rows ? rows : w->rows) / (double)w->rows : 0.0;
}

static drama_status count_weight(void *ctx, const dr_weight *w, const char *part, drama_error *err) {
    (void)err;
    frame_bytes *b = ctx;
    const dr_backbone *bb = &b->lm->bb;
    const dr_tower *t = &b->lm->tower;
    if (w == &bb->embed) b->dense += rows_bytes(w, 1);
    else if (w == &bb->code_table) b->dense += rows_bytes(w, bb->d.in_codebooks);
    else if (w == &bb->head) b->head += rows_bytes(w, b->lm->model.bb.n_candidates);
    else if (w == &t->code_table) b->tower += rows_bytes(w, t->n_layers);
    else if (t->heads && w >= t->heads && w < t->heads + t->n_heads_out) b->tower += rows_bytes(w, t->d.head_vocab);
    else if (!strcmp(part, "tower")) b->tower += (double)dr_weight_bytes(w);
    else if (strcmp(part, "experts")) b->dense += (double)dr_weight_bytes(w);
    return DRAMA_OK; /* experts: counted per layer below */
}

static drama_status count_vec(void *ctx, const float *x, int64_t n, const char *part, drama_error *err) {
    (void)x, (void)part, (void)err;
    ((frame_bytes *)ctx)->vectors += (double)n * sizeof(float);
    return DRAMA_OK;
}

static void count_bytes(const dr_gen_lm *lm, frame_bytes *b) {
    memset(b, 0, sizeof *b);
    b->lm = lm;
    dr_model_visitor v = {b, count_weight, count_vec};
    drama_error e = {0};
    dr_model_visit(&lm->bb, &lm->tower, &v, &e);
    for (int L = 0; L < lm->bb.d.n_layers; L++) {
        const dr_bb_moe *m = &lm->bb.layers[L].moe;
        double all = 0;
        for (int k = 0; k < m->n_kept; k++) {
            const dr_bb_expert *x = &m->experts[k];
            all += (double)(x->fused ? dr_weight_bytes(&x->gate_up)
                                     : dr_weight_bytes(&x->gate) + dr_weight_bytes(&x->up)) +
                   (double)dr_weight_bytes(&x->down);
        }
        int used = lm->bb.d.topk < m->n_kept ? lm->bb.d.topk : m->n_kept;
        if (m->n_kept > 0) b->experts += all / m->n_kept * used;
    }
}

/* rows [P][1 + nc]: 10% text, 60% audio, 30% text; *prefix = the first 70% */
static int32_t *make_prompt(const dr_gen_lm *lm, int64_t P, int64_t *prefix) {
    int nc = lm->tower.d.num_codebooks;
    int32_t *r = calloc((size_t)(P * (nc + 1)), sizeof *r);
    if (!r) return NULL;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int64_t t0 = P / 10, a1 = t0 + (P * 6) / 10;
    for (int64_t i = 0; i < P; i++) {
        int32_t *row = r + i * (nc + 1);
        if (i >= t0 && i < a1) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int32_t c0 = (int32_t)(s % (uint64_t)lm->n_semantic);
            row[0] = lm->semantic_start + c0;
            row[1] = c0;
            for (int j = 2; j <= nc; j++) row[j] = (int32_t)((s >> (3 * j)) % (uint64_t)lm->tower.d.head_vocab);
        } else {
            row[0] = 32 + (int32_t)((i * 7) % 90); /* byte-level text tokens */
        }
    }
    *prefix = a1;
    return r;
}

/* prefill rows into a fresh session (or a clone of `from`), then the first frame; seconds, and its
 * parts (session create or clone, prefill, first frame: each ends when its work is done, since
 * prefill and the frame wait for the device) */
static drama_status first_frame(dr_gen_lm *lm, const dr_gen_options *o, const dr_gen_session *from,
                                const int32_t *rows, int64_t n, dr_gen_session **keep, double *sec, double part[3],
                                drama_error *err) {
    int32_t frame[32];
    dr_gen_finish fin = DR_FINISH_NONE;
    dr_gen_session *s = NULL;
    double t0 = dr_bench_now();
    drama_status st = from ? dr_gen_session_clone(from, &s, err) : dr_gen_session_create(&lm->model, o, &s, err);
    double t1 = dr_bench_now();
    if (!st && n > 0) st = dr_gen_prefill(s, rows, n, NULL, 0, err);
    double t2 = dr_bench_now();
    if (!st) st = dr_gen_next(s, frame, &fin, err);
    *sec = dr_bench_now() - t0;
    part[0] = t1 - t0, part[1] = t2 - t1, part[2] = t0 + *sec - t2;
    if (!st && fin != DR_FINISH_NONE) st = dr_fail(err, DRAMA_EEMPTY, "the first draw was the end token");
    if (keep && !st) *keep = s;
    else dr_gen_session_free(s);
    return st;
}

static int usage(FILE *f) {
    fprintf(f, "usage: drama bench frame --model DIR [--backend cpu|cuda|auto] [--device N] [--frames N]\n"
               "                         [--prompt-rows P] [--warmup W] [--threads T] [--seed S]\n\n"
               "The frame step at batch 1 (ms per frame, bytes read per frame, GB/s, ratio_to_floor against\n"
               "the backend's bandwidth measured in the same run) and the time to the first frame's codes for\n"
               "a P-row prompt (default 100) and for a cached voice prefix (its first 70%%). Codec decode of the\n"
               "first chunk is not included. Defaults: 64 frames, 4 warm-up frames, seed 1.\n");
    return f == stdout ? 0 : 2;
}

/* the first streamed chunk's decode (best of 3 fresh streams after a warm-up one) and the time to
 * first audio it gives a cached voice; a line saying why when it cannot run */
static void codec_first_chunk(const char *model, const dr_backend_choice *bc, const int32_t *codes, long long n, int nk,
                              double cached, double per) {
    drama_error err = {0};
    dr_codec *c = NULL;
    float *pcm = NULL;
    const char *where = "cpu";
    double best = 0;
    if (n < 1) {
        printf("codec_first_chunk: not run (no frames)\n");
        return;
    }
    drama_status st = dr_codec_open(model, DR_CODEC_LOAD_DECODER, &c, &err);
    if (!st && dr_codec_cfg(c)->num_codebooks != nk)
        st = dr_fail(&err, DRAMA_EINVAL, "the codec has %d codebooks, the model %d", dr_codec_cfg(c)->num_codebooks, nk);
    if (!st) st = dr_codec_check_codes(dr_codec_cfg(c), codes, n, "bench frame codes", &err);
    if (!st) st = dr_backend_codec_attach(bc, c, &where, &err);
    if (!st && !(pcm = malloc((size_t)n * dr_codec_cfg(c)->frame_length * sizeof *pcm)))
        st = dr_fail(&err, DRAMA_ENOMEM, "out of memory");
    for (int rep = 0; rep < 4 && !st; rep++) { /* rep 0 grows the decoder's buffers */
        dr_codec_stream *s = NULL;
        if ((st = dr_codec_stream_create(c, &s, &err))) break;
        double t0 = dr_bench_now();
        st = dr_codec_stream_feed(s, codes, n, pcm, &err);
        double dt = dr_bench_now() - t0;
        dr_codec_stream_free(s);
        if (rep > 0 && (best == 0 || dt < best)) best = dt;
    }
    if (st) {
        printf("codec_first_chunk: not run (%s)\n", err.message);
    } else {
        char unit[160];
        snprintf(unit, sizeof unit, "ms (decode of the first %lld frames on %s, fresh stream)", n, where);
        dr_bench_line("codec_first_chunk", best * 1e3, 2, unit);
        snprintf(unit, sizeof unit, "ms (ttfa_cached_voice + %lld x ms_per_frame + codec_first_chunk)", n - 1);
        dr_bench_line("ttfa_cached_voice_audio", (cached + (double)(n - 1) * per + best) * 1e3, 2, unit);
    }
    free(pcm);
    dr_codec_free(c);
}

int dr_bench_frame_main(int argc, char **argv) {
    const char *model = NULL;
    long long frames = 64, prompt = 100, warmup = 4, threads = 0;
    uint64_t seed = 1;
    dr_backend_choice bc = {DR_WANT_AUTO, 0};
    const char *cmd = "bench frame";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long dev = 0;
        drama_error pe = {0};
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout);
        if (!v) {
            fprintf(stderr, "drama %s: %s: missing value (or unknown option)\n", cmd, a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--backend")) {
            if (dr_backend_parse(v, &bc.want, &pe)) {
                fprintf(stderr, "drama %s: --backend: %s\n", cmd, pe.message);
                return 2;
            }
        } else if (!strcmp(a, "--device")) {
            if (!dr_cli_int(cmd, a, v, 0, 1023, &dev)) return 2;
            bc.device = (int)dev;
        } else if (!strcmp(a, "--frames")) {
            if (!dr_cli_int(cmd, a, v, 1, 1000000, &frames)) return 2;
        } else if (!strcmp(a, "--prompt-rows")) {
            if (!dr_cli_int(cmd, a, v, 10, 100000, &prompt)) return 2;
        } else if (!strcmp(a, "--warmup")) {
            if (!dr_cli_int(cmd, a, v, 0, 1000, &warmup)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!dr_cli_int(cmd, a, v, 0, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!dr_cli_seed(cmd, a, v, &seed)) return 2;
        } else {
            fprintf(stderr, "drama %s: unknown option '%s'\n", cmd, a);
            return usage(stderr);
        }
    }
    if (!model) {
        fprintf(stderr, "drama %s: --model DIR is required\n", cmd);
        return usage(stderr);
    }
    drama_error err = {0};
    dr_gen_lm *lm = NULL;
    dr_gen_session *pre = NULL, *run = NULL;
    int32_t *rows = NULL;
    int rc = 1;
    drama_status st = dr_gen_lm_open_on(model, NULL, 0, (int)threads, NULL, &bc, NULL, &lm, &err);
    if (st) goto done;
    if (lm->tower.d.num_codebooks > 32) {
        st = dr_fail(&err, DRAMA_EUNSUPPORTED, "%d codebooks (at most 32)", lm->tower.d.num_codebooks);
        goto done;
    }
    dr_backend *be = lm->be;
    double bps = 0;
    const char *bw_from = be->kind == DR_BACKEND_CPU ? "multi-threaded read, this run" : "device-to-device copy (read + write), this run";
    if (be->ops->bandwidth && (st = be->ops->bandwidth(be, (size_t)1 << 30, &bps, &err))) goto done;
    if (!(bps > 0)) bps = dr_bench_read_gbs(lm->pool, 0, 0) * 1e9, bw_from = "multi-threaded read, this run";
    frame_bytes fb;
    count_bytes(lm, &fb);
    double bytes = fb.dense + fb.experts + fb.head + fb.tower + fb.vectors;

    int64_t prefix = 0, nc1 = lm->tower.d.num_codebooks + 1;
    if (!(rows = make_prompt(lm, prompt, &prefix))) {
        st = dr_fail(&err, DRAMA_ENOMEM, "out of memory for the prompt");
        goto done;
    }
    dr_gen_options o;
    dr_gen_options_default(&o);
    o.sp.seed = seed;
    o.sp.cfg_gamma = 0.0f; /* batch 1: one backbone state */
    o.has_reference = 1;
    o.sp.frame_cap = (int)(frames + warmup + 16);
    double cold = 0, warm = 0, cached = 0, tp = 0, pw[3], pc[3];
    if ((st = first_frame(lm, &o, NULL, rows, prompt, NULL, &cold, pw, &err))) goto done;
    if ((st = first_frame(lm, &o, NULL, rows, prompt, &run, &warm, pw, &err))) goto done;
    /* the voice prefix, prefilled once (what the prompt cache keeps), then cloned per request */
    if ((st = dr_gen_session_create(&lm->model, &o, &pre, &err))) goto done;
    double t0 = dr_bench_now();
    if ((st = dr_gen_prefill(pre, rows, prefix, NULL, 0, &err))) goto done;
    tp = dr_bench_now() - t0;
    for (int rep = 0; rep < 2; rep++) /* the first clone + step may grow workspaces: keep the second */
        if ((st = first_frame(lm, &o, pre, rows + prefix * nc1, prompt - prefix, NULL, &cached, pc, &err))) goto done;

    int32_t frame[32], chunk[DR_STREAM_FIRST_CHUNK * 32];
    int nk = lm->tower.d.num_codebooks;
    dr_gen_finish fin = DR_FINISH_NONE;
    long long made = 0;
    for (long long f = 0; f < warmup && !st && fin == DR_FINISH_NONE; f++) st = dr_gen_next(run, frame, &fin, &err);
    t0 = dr_bench_now();
    for (; made < frames && !st && fin == DR_FINISH_NONE; made++) {
        st = dr_gen_next(run, frame, &fin, &err);
        if (made < DR_STREAM_FIRST_CHUNK) memcpy(chunk + made * nk, frame, (size_t)nk * sizeof *frame);
    }
    double per = made ? (dr_bench_now() - t0) / (double)made : 0;
    if (st) goto done;
    if (fin != DR_FINISH_NONE) made--; /* the end-token draw made no frame */

    printf("bench frame: %s backend, model %s, batch 1, %lld frames timed after %lld warm-up%s\n", be->name, model,
           made, warmup, fin == DR_FINISH_END_TOKEN ? " (stopped at the end token)" : "");
    dr_bench_line("ms_per_frame", per * 1e3, 3, "ms");
    dr_bench_line("frames_per_s", per > 0 ? 1.0 / per : 0, 1, "frames/s");
    dr_bench_line("bytes_dense", fb.dense / 1e6, 3, "MB (backbone projections, router, shared expert)");
    dr_bench_line("bytes_experts", fb.experts / 1e6, 3, "MB (top_k of the kept experts per layer)");
    dr_bench_line("bytes_head_slice", fb.head / 1e6, 3, "MB (restricted logits rows)");
    dr_bench_line("bytes_tower", fb.tower / 1e6, 3, "MB (every layer + head rows)");
    dr_bench_line("bytes_vectors", fb.vectors / 1e6, 3, "MB (norms, conv kernels)");
    dr_bench_line("prompt_rows", (double)prompt, 0, "rows");
    dr_bench_line("ttfa_prompt_first_call", cold * 1e3, 2, "ms (codes ready; includes one-time setup)");
    dr_bench_line("ttfa_prompt", warm * 1e3, 2, "ms (codes ready, fresh session)");
    dr_bench_line("ttfa_prompt_prefill", pw[1] * 1e3, 2, "ms (of which: prefill of the rows)");
    dr_bench_line("ttfa_prompt_first_frame", pw[2] * 1e3, 2, "ms (of which: the first frame)");
    dr_bench_line("voice_prefix_prefill", tp * 1e3, 2, "ms (once per voice)");
    dr_bench_line("ttfa_cached_voice", cached * 1e3, 2, "ms (codes ready: clone + text rows + first frame)");
    dr_bench_line("ttfa_cached_clone", pc[0] * 1e3, 2, "ms (of which: clone of the prefix session)");
    dr_bench_line("ttfa_cached_text_rows", pc[1] * 1e3, 2, "ms (of which: prefill of the text rows)");
    dr_bench_line("ttfa_cached_first_frame", pc[2] * 1e3, 2, "ms (of which: the first frame)");
    codec_first_chunk(model, &bc, chunk, made < DR_STREAM_FIRST_CHUNK ? made : DR_STREAM_FIRST_CHUNK, nk, cached, per);
    dr_bench_roofline(per, bytes, bps / 1e9, bw_from);
    rc = 0;
done:
    if (st) fprintf(stderr, "drama %s: %s\n", cmd, err.message);
    free(rows);
    dr_gen_session_free(pre);
    dr_gen_session_free(run);
    dr_gen_lm_close(lm);
    return rc;
}
