/* cpu_lanes.c - the frame step's lane ops on the CPU (backend.h): guidance, the semantic draw with
 * the redraw window and the end token, the acoustic draws, the next backbone rows. Draw n of a
 * lane is 16*f + slot with f from the lane's counter, so the codes depend on nothing but the
 * lane's logits, parameters and counter. */
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"

void dr_cpu_op_guidance(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand) {
    (void)be;
    for (int i = 0; i < n; i++) {
        const dr_step_lane *l = &lanes[i];
        if (l->guided) dr_op_guidance(l->logits_c, l->logits_u, n_cand, l->g->sp.cfg_gamma, l->logits);
        else memcpy(l->logits, l->logits_c, (size_t)n_cand * sizeof(float));
    }
}

/* The sampler's scratch for `cap` candidates (grown once; the backend is driven by one thread). */
static dr_sample_ws *scratch(dr_backend *be, int cap) {
    dr_sample_ws *ws = &((dr_cpu_backend *)be->impl)->ws;
    if (ws->cap >= cap) return ws;
    dr_sample_ws_free(ws);
    return dr_sample_ws_init(ws, cap, NULL) ? NULL : ws;
}

static void no_scratch(dr_op_status *st, int kind, uint64_t f, int cap) {
    st->code = DRAMA_ENOMEM;
    st->fault = DR_FAULT_DRAW;
    st->a = kind;
    st->b = DR_DRAW_SCRATCH;
    st->c = (int64_t)f;
    st->d = cap;
}

void dr_cpu_op_sample_semantic(dr_backend *be, const dr_step_lane *lanes, int n, int n_cand, dr_step_io io) {
    dr_sample_ws *ws = scratch(be, n_cand);
    for (int i = 0; i < n; i++) {
        dr_gen_lane *g = lanes[i].g;
        int32_t *code = io.codes + (int64_t)i * DR_MAX_CODEBOOKS;
        dr_op_status *st = &io.status[i];
        uint64_t f = g->draw++;
        code[0] = 0;
        io.ended[i] = 0;
        if (st->code) continue; /* an earlier failure of this step */
        if (!ws) {
            no_scratch(st, DR_DRAW_SEMANTIC, f, n_cand);
            continue;
        }
        int t = 0;
        dr_sample_semantic_st(lanes[i].logits, n_cand, &g->sp, f, g->window, g->window_len, ws, &t, st);
        if (st->code) continue;
        if (t == n_cand - 1) {
            io.ended[i] = 1;
            continue;
        }
        code[0] = t;
        if (g->window_len == DR_RAS_MAX) {
            memmove(g->window, g->window + 1, (DR_RAS_MAX - 1) * sizeof g->window[0]);
            g->window_len--;
        }
        g->window[g->window_len++] = t;
    }
}

void dr_cpu_op_sample_acoustic(dr_backend *be, const dr_step_lane *lanes, int n, int codebook, const float *logits,
                               int head_vocab, dr_step_io io) {
    dr_sample_ws *ws = scratch(be, head_vocab);
    for (int i = 0; i < n; i++) {
        dr_op_status *st = &io.status[i];
        int code = 0;
        if (!io.ended[i] && !st->code) {
            const dr_gen_lane *g = lanes[i].g;
            if (!ws) no_scratch(st, codebook, g->draw - 1, head_vocab);
            else
                dr_sample_acoustic_st(logits + (int64_t)i * head_vocab, head_vocab, &g->sp, g->draw - 1, codebook, ws,
                                      &code, st);
            if (st->code) code = 0; /* the lane is lost; the others go on */
        }
        io.codes[(int64_t)i * DR_MAX_CODEBOOKS + codebook] = code;
    }
}

void dr_cpu_op_frame_rows(dr_backend *be, const int32_t *codes, const int32_t *lane_of_row, int64_t m, int nc,
                          int64_t sem_start, int32_t *rows) {
    (void)be;
    for (int64_t r = 0; r < m; r++) {
        const int32_t *c = codes + (int64_t)lane_of_row[r] * DR_MAX_CODEBOOKS;
        int32_t *row = rows + r * (nc + 1);
        row[0] = (int32_t)(sem_start + c[0]);
        for (int j = 0; j < nc; j++) row[1 + j] = c[j];
    }
}
