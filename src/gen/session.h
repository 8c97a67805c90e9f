/* session.h - the language model a generation session runs on: a model directory opened and
 * bound (config + switches, checkpoint, loader findings, backbone, tower, token ids) and put on
 * a backend (backend/select/select.h: cpu, cuda or auto).
 *
 *   dr_gen_lm *lm;  dr_gen_lm_open(dir, sets, n_sets, threads, NULL, &lm, err);
 *   dr_gen_session_create(&lm->model, &opts, &s, err);  dr_gen_prefill(...);  dr_gen_next(...)
 */
#ifndef DRAMA_GEN_SESSION_H
#define DRAMA_GEN_SESSION_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/select/select.h"
#include "base/error.h"
#include "base/pool.h"
#include "gen/frameloop.h"
#include "io/checkpoint.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/tower.h"
#include "text/tokenizer.h"

typedef struct dr_gen_lm {
    dr_config *cfg;
    const dr_tok *tok;
    dr_tok *own_tok;          /* tok when loaded here (freed at close), else NULL */
    dr_ckpt *ckpt;
    dr_loader *ld;
    dr_pool *pool;            /* owned when created here */
    int own_pool;
    dr_backbone bb;
    dr_tower tower;
    int32_t semantic_start, n_semantic, end_id;
    dr_backend *be;           /* the backbone and tower are uploaded to it (owned) */
    dr_gen_model model;       /* what sessions run on */
} dr_gen_lm;

/* Open DIR: config.json (+ drama-engine.json, `--set` overrides), tokenizer.json, the checkpoint;
 * bind backbone and tower through one loader (every finding reported at once; unexpected tensors
 * are fatal with loader.strict). threads <= 0: physical cores. pool may be given (then not owned).
 * Runs on the CPU backend. */
drama_status dr_gen_lm_open(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                            dr_gen_lm **out, drama_error *err);
/* The same on the chosen backend (NULL: auto), with DIR's tokenizer already loaded by the caller
 * (borrowed: it must outlive the model; NULL: loaded here), so that it is not parsed twice. */
drama_status dr_gen_lm_open_on(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                               const dr_backend_choice *backend, const dr_tok *tok, dr_gen_lm **out,
                               drama_error *err);
void dr_gen_lm_close(dr_gen_lm *lm);

#endif
