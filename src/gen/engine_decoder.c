/* engine_decoder.c - a lane's codec decode on its own thread, overlapped with generation
 * (drama_synthesize, whole mode). The engine pushes each kept frame into a bounded queue; the
 * decoder thread takes them in runs of MIN_RUN..MAX_RUN frames and feeds its own codec stream on
 * its own pool. The codec gives the same samples for any chunking and thread count, so the audio
 * is byte-identical to decoding after generation.
 *
 * Every way out joins the thread: finish (no more frames: the rest is decoded), free (stop: frames
 * not yet decoded are dropped; called by the lane's cleanup on success, failure and cancel). A
 * push waits only while the queue is full and the thread is still running, so a thread that
 * failed or stopped never leaves the engine waiting.
 *
 * With a pool of 2+ threads the language model can keep every core busy, and the decoder (the
 * faster of the two on the CPU) would then take cores from the frame step's workers in the middle
 * of its short products. So the decoder thread lowers its own priority (nice +DECODE_NICE, only
 * this thread) and starts its pool from there, so its workers inherit it: it runs on what the
 * language model leaves (its workers' idle polls yield, the sampler's gaps), the rest after the
 * last frame at full speed (nothing else runs then). DRAMA_DECODE_NICE=0: the old equal share.
 * While a feed runs, the language model's pool is told (dr_pool_yield_to) that its idle workers
 * should yield their core; between feeds they poll without yielding and answer the next product
 * at once. The decoder's own pool always yields (it is the background work). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/alloc.h"
#include "gen/engine_internal.h"

#define QUEUE_FRAMES 128 /* default: frames generated ahead of the decoder at most (then generation waits) */
#define MIN_RUN 8        /* frames per stream feed while generation runs (small feeds use the pool poorly) */
#define MAX_RUN 16       /* the codec's own sub-chunk */
/* nice increment of the decoder thread beside a language model of 2+ threads: 10 is a weight of
 * 110 against 1024, so it still gets ~10% of a contended core; 19 (weight 15) starved it on the
 * 2-core AMD (tiny model: 20 ms of decode left after the last frame, 4-8 ms at 10) */
#define DECODE_NICE 10

struct dr_decoder {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t more; /* frames queued, final or stop: the thread waits on it */
    pthread_cond_t room; /* queue space or the thread exited: push waits on it */
    int32_t *queue;      /* [qcap][nc] ring */
    int qcap, head, count, nc;
    int final, stop, exited;
    drama_status status; /* the thread's failure (read after exited) */
    drama_error err;
    dr_codec_stream *stream;
    dr_pool *pool;       /* started by the decoder thread (its priority); never NULL once it runs */
    dr_pool *lm;         /* the language model's pool (dr_pool_yield_to during feeds) */
    int threads, nice;
    int64_t spf;
    float *pcm; /* the thread's until finish hands it over */
    int64_t len, cap;
    int32_t run[MAX_RUN * DR_CODEC_MAX_BOOKS];
};

int dr_decoder_queue_frames(void) {
    const char *e = getenv("DRAMA_DECODE_OVERLAP");
    if (!e || !*e) return QUEUE_FRAMES;
    long v = strtol(e, NULL, 10);
    if (v <= 0) return 0; /* "0" (or not a number): off */
    if (v == 1) return QUEUE_FRAMES;
    return v < MIN_RUN ? MIN_RUN : v > 65536 ? 65536 : (int)v;
}

static drama_status grow(dr_decoder *d, int64_t samples) {
    if (samples <= d->cap) return DRAMA_OK;
    int64_t cap = d->cap ? d->cap : d->spf * 64;
    while (cap < samples) cap *= 2;
    size_t bytes;
    if (!dr_mul_size((size_t)cap, sizeof(float), &bytes)) return dr_fail(&d->err, DRAMA_ENOMEM, "audio buffer size overflow");
    float *p = realloc(d->pcm, bytes);
    if (!p) return dr_fail(&d->err, DRAMA_ENOMEM, "out of memory for %lld samples of audio", (long long)cap);
    d->pcm = p, d->cap = cap;
    return DRAMA_OK;
}

/* DRAMA_DECODE_NICE: the nice increment beside 2+ threads (0: none); default DECODE_NICE */
static int decode_nice(int threads) {
    if (threads < 2) return 0;
    const char *e = getenv("DRAMA_DECODE_NICE");
    long v = e && *e ? strtol(e, NULL, 10) : DECODE_NICE;
    return v < 0 ? 0 : v > 19 ? 19 : (int)v;
}

static void *decoder_main(void *arg) {
    dr_decoder *d = arg;
    drama_status st = DRAMA_OK;
#ifdef __linux__
    /* this thread only (Linux threads have their own nice); raising it needs no privilege */
    if (d->nice > 0) {
        pid_t tid = (pid_t)syscall(SYS_gettid);
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)tid);
        if (errno == 0) (void)setpriority(PRIO_PROCESS, (id_t)tid, cur + d->nice);
    }
#endif
    /* a pool even of 1 thread (inline, no threads): a stream without one would use the codec's
     * pool, the language model's, which is not reentrant and busy with the frame step */
    if (!(d->pool = dr_pool_create(d->threads > 1 ? d->threads : 1)))
        st = dr_fail(&d->err, DRAMA_ENOMEM, "cannot create the decoder's pool of %d threads", d->threads);
    else {
        dr_codec_stream_set_pool(d->stream, d->pool);
        dr_pool_yield_to(d->pool, 1); /* background work: its idle workers give way */
    }
    pthread_mutex_lock(&d->mu);
    if (st != DRAMA_OK) d->stop = 1;
    for (;;) {
        while (!d->stop && !d->final && d->count < MIN_RUN) pthread_cond_wait(&d->more, &d->mu);
        if (d->stop || d->count == 0) break; /* stopped, or final with nothing left */
        int n = d->count < MAX_RUN ? d->count : MAX_RUN;
        for (int f = 0; f < n; f++)
            memcpy(d->run + (int64_t)f * d->nc, d->queue + (int64_t)((d->head + f) % d->qcap) * d->nc,
                   (size_t)d->nc * sizeof(int32_t));
        d->head = (d->head + n) % d->qcap;
        d->count -= n;
        pthread_cond_signal(&d->room);
        pthread_mutex_unlock(&d->mu);
        st = grow(d, d->len + n * d->spf);
        dr_pool_yield_to(d->lm, 1);
        if (st == DRAMA_OK) st = dr_codec_stream_feed(d->stream, d->run, n, d->pcm + d->len, &d->err);
        dr_pool_yield_to(d->lm, -1);
        pthread_mutex_lock(&d->mu);
        if (st != DRAMA_OK) break;
        d->len += n * d->spf;
    }
    d->status = st;
    d->exited = 1;
    pthread_cond_broadcast(&d->room);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

drama_status dr_decoder_start(const dr_codec *c, dr_pool *lm, int queue_frames, int nc, int64_t spf, dr_decoder **out,
                              drama_error *err) {
    *out = NULL;
    if (nc < 1 || nc > DR_CODEC_MAX_BOOKS) return dr_fail(err, DRAMA_EINTERNAL, "decoder: %d codebooks", nc);
    dr_decoder *d = calloc(1, sizeof *d);
    if (!d) return dr_fail(err, DRAMA_ENOMEM, "out of memory starting the decoder");
    d->nc = nc, d->spf = spf, d->qcap = queue_frames < MIN_RUN ? MIN_RUN : queue_frames;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->more, NULL);
    pthread_cond_init(&d->room, NULL);
    drama_status st = DRAMA_OK;
    if (!(d->queue = malloc((size_t)d->qcap * (size_t)nc * sizeof(int32_t))))
        st = dr_fail(err, DRAMA_ENOMEM, "out of memory starting the decoder");
    int threads = dr_pool_threads(lm);
    d->lm = lm, d->threads = threads, d->nice = decode_nice(threads);
    if (st == DRAMA_OK) st = dr_codec_stream_create(c, &d->stream, err);
    if (st == DRAMA_OK) {
        if (pthread_create(&d->thread, NULL, decoder_main, d) != 0)
            st = dr_fail(err, DRAMA_ENOMEM, "cannot start the decoder thread");
        else d->started = 1;
    }
    if (st != DRAMA_OK) {
        dr_decoder_free(d);
        return st;
    }
    *out = d;
    return DRAMA_OK;
}

/* the thread's failure as the caller's error */
static drama_status thread_failure(dr_decoder *d, drama_error *err) {
    if (d->status == DRAMA_OK) return dr_fail(err, DRAMA_EINTERNAL, "the decoder stopped early");
    if (err) *err = d->err;
    return d->status;
}

drama_status dr_decoder_push(dr_decoder *d, const int32_t *frame, drama_error *err) {
    pthread_mutex_lock(&d->mu);
    while (d->count == d->qcap && !d->exited) pthread_cond_wait(&d->room, &d->mu);
    if (d->exited) {
        drama_status st = thread_failure(d, err);
        pthread_mutex_unlock(&d->mu);
        return st;
    }
    memcpy(d->queue + (int64_t)((d->head + d->count) % d->qcap) * d->nc, frame, (size_t)d->nc * sizeof *frame);
    d->count++;
    if (d->count >= MIN_RUN) pthread_cond_signal(&d->more);
    pthread_mutex_unlock(&d->mu);
    return DRAMA_OK;
}

static void join(dr_decoder *d, int stop) {
    if (!d->started) return;
    pthread_mutex_lock(&d->mu);
    if (stop) d->stop = 1;
    else d->final = 1;
    pthread_cond_signal(&d->more);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    d->started = 0;
}

drama_status dr_decoder_finish(dr_decoder *d, float **pcm, int64_t *samples, drama_error *err) {
    *pcm = NULL, *samples = 0;
    join(d, 0);
    if (d->status != DRAMA_OK) return thread_failure(d, err);
    *pcm = d->pcm, *samples = d->len;
    d->pcm = NULL, d->len = d->cap = 0;
    return DRAMA_OK;
}

void dr_decoder_free(dr_decoder *d) {
    if (!d) return;
    join(d, 1);
    dr_codec_stream_free(d->stream);
    dr_pool_free(d->pool);
    free(d->queue);
    free(d->pcm);
    pthread_cond_destroy(&d->room);
    pthread_cond_destroy(&d->more);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
