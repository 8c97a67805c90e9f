/* session.h - the language model a generation session runs on: a model directory opened and
 * bound (config + switches, checkpoint, loader findings, backbone, tower, token ids), and the
 * adapter that lets the frame loop (gen/frameloop.h) drive the CPU backbone.
 *
 *   dr_gen_lm *lm;  dr_gen_lm_open(dir, sets, n_sets, threads, &lm, err);
 *   dr_gen_session_create(&lm->model, &opts, &s, err);  dr_gen_prefill(...);  dr_gen_next(...)
 */
#ifndef DRAMA_GEN_SESSION_H
#define DRAMA_GEN_SESSION_H

#include <stdint.h>

#include "base/error.h"
#include "base/pool.h"
#include "gen/frameloop.h"
#include "io/checkpoint.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/tower.h"
#include "text/tokenizer.h"

/* The frame loop's backbone interface over model/backbone.h (impl = this struct). */
/* The adapter holds no mutable state; the pool is not reentrant, so one model (one pool) is
 * driven by one thread at a time (batch sessions with dr_gen_next_many instead). */
typedef struct dr_gen_cpu_backbone {
    const dr_backbone *bb;
    dr_pool *pool;
} dr_gen_cpu_backbone;

/* Fill `out` to drive `bb` (token ids already set on bb) through `impl` (caller-owned, zeroed). */
void dr_gen_backbone_cpu(dr_gen_cpu_backbone *impl, const dr_backbone *bb, dr_pool *pool, dr_gen_backbone *out);
void dr_gen_backbone_cpu_release(dr_gen_cpu_backbone *impl);

typedef struct dr_gen_lm {
    dr_config *cfg;
    dr_tok *tok;
    dr_ckpt *ckpt;
    dr_loader *ld;
    dr_pool *pool;            /* owned when created here */
    int own_pool;
    dr_backbone bb;
    dr_tower tower;
    int32_t semantic_start, n_semantic, end_id;
    dr_gen_cpu_backbone cpu;
    dr_gen_model model;       /* what sessions run on */
} dr_gen_lm;

/* Open DIR: config.json (+ drama-engine.json, `--set` overrides), tokenizer.json, the checkpoint;
 * bind backbone and tower through one loader (every finding reported at once; unexpected tensors
 * are fatal with loader.strict). threads <= 0: all CPUs. pool may be given (then not owned). */
drama_status dr_gen_lm_open(const char *dir, const char *const *sets, int n_sets, int threads, dr_pool *pool,
                            dr_gen_lm **out, drama_error *err);
void dr_gen_lm_close(dr_gen_lm *lm);

#endif
