/* pipeline_internal.h - the structs behind drama_model / drama_session and the model-facing
 * steps of a request (pipeline_run.c). Private to src/gen/pipeline*.c. */
#ifndef DRAMA_GEN_PIPELINE_INTERNAL_H
#define DRAMA_GEN_PIPELINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/select/select.h"
#include "base/pool.h"
#include "codec/codec.h"
#include "drama.h"
#include "gen/pipeline.h"
#include "model/config.h"
#include "text/tokenizer.h"

typedef struct dr_pl_lm dr_pl_lm; /* backbone + tower (+ their checkpoint mapping) */

struct drama_model {
    char *dir;
    int threads;
    int low_memory;
    dr_backend_choice backend; /* where the language model runs */
    char **sets;      /* copies of the --set overrides */
    int n_sets;
    dr_config *cfg;
    dr_tok *tok;
    dr_pool *pool;
    dr_codec *codec;  /* decoder + encoder */
    dr_pl_lm *lm;     /* NULL while released (low-memory mode between requests) */
    int sample_rate, samples_per_frame, n_codebooks; /* from the codec config, at open */
    pthread_mutex_t run_lock; /* one request (or engine tick) at a time (shared pool, lazy loads) */
    /* drama_encode_audio runs on other threads: it reads the codec under codec_lock (writers: the
     * codec's load and release) through enc_view, the same weights on no pool */
    pthread_rwlock_t codec_lock;
    unsigned codec_parts;     /* DR_CODEC_LOAD_* bits of m->codec */
    struct dr_codec *enc_view;
    pthread_mutex_t info_lock; /* the fingerprint, computed once */
    int fingerprint_done;
    char fingerprint[65];
    atomic_int engines;       /* public engines alive: weights and codec stay loaded */
};

struct drama_session {
    drama_model *model;
    atomic_int cancel;
};

drama_status dr_pl_model_open(drama_model **out, const char *dir, const drama_model_options *opt,
                              drama_error *err);
void dr_pl_model_close(drama_model *m);
void dr_pl_session_release(drama_session *s);

drama_status dr_pl_run(drama_session *s, const drama_request *req, drama_audio_fn on_audio, drama_event_fn on_event,
                       void *user, drama_result *res, drama_error *err);

#endif
