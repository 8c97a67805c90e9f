/* drama.h - the public C API of drama.c, a native engine for Fish Audio Drama 3.
 *
 * Error model: every call returns a drama_status (0 = DRAMA_OK). On failure the object passed
 * in (or the drama_error the caller supplied) holds a message naming the file, tensor, field or
 * byte offset at fault; drama_status_name() gives the code's stable name.
 * Ownership: whoever calls *_open / *_create frees with the matching *_close / *_free.
 */
#ifndef DRAMA_H
#define DRAMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DRAMA_VERSION "0.1.0"

typedef enum drama_status {
    DRAMA_OK = 0,
    DRAMA_EINVAL = 1,       /* invalid argument or parameter (names the parameter) */
    DRAMA_EIO = 2,          /* file could not be read or written (names the file) */
    DRAMA_EFORMAT = 3,      /* malformed file contents (names file, field, byte offset) */
    DRAMA_ESHAPE = 4,       /* tensor missing or of the wrong shape/dtype (names the tensor) */
    DRAMA_EUNSUPPORTED = 5, /* valid input the engine cannot use (names what) */
    DRAMA_ENOMEM = 6,       /* allocation failed or a size limit was exceeded */
    DRAMA_EHASH = 7,        /* SHA-256 mismatch against a manifest */
    DRAMA_ENUMERIC = 8,     /* non-finite values where finite ones are required */
    DRAMA_ECANCELLED = 9,   /* cancelled by the caller or a signal */
    DRAMA_EFRAMELIMIT = 10, /* generation reached the frame cap without the end token */
    DRAMA_EEMPTY = 11,      /* empty input or empty generation */
    DRAMA_EINTERNAL = 12    /* a bug: please report */
} drama_status;

/* A caller-owned error record: code plus a human message. */
typedef struct drama_error {
    drama_status code;
    char message[1024];
} drama_error;

const char *drama_status_name(drama_status code);
const char *drama_version(void);      /* "0.1.0" */
const char *drama_git_commit(void);   /* commit the library was built from */

/* ---- Synthesis: model -> session -> synthesize --------------------------------------------
 * A model is the opened directory (config, tokenizer, weights mapped, codec). A session holds
 * one request's state at a time (backbone/tower state, codec streaming state, sampler). One
 * thread uses a session; drama_session_cancel may be called from any thread or a signal
 * handler. Sessions of one model may live on several threads, but their requests run one at a
 * time (the model's thread pool is shared; drama_synthesize waits for the model). Same request + seed + model + build => identical codes and audio bytes, whatever
 * the thread count or streaming chunking. */

typedef struct drama_model drama_model;
typedef struct drama_session drama_session;

typedef struct drama_model_options {
    int threads;             /* worker threads; 0 = all online CPUs */
    int low_memory;          /* 1: backbone and tower are mapped only while generating and
                                released before decoding (three phases); 0: kept resident */
    const char *const *set;  /* NULL-terminated "switch=value" overrides (MODEL.md 10), or NULL */
} drama_model_options;

void drama_model_options_default(drama_model_options *opt);
drama_status drama_model_open(drama_model **out, const char *dir, const drama_model_options *opt,
                              drama_error *err);
void drama_model_close(drama_model *model);
/* Output geometry of a model (from its codec configuration): samples per second and per frame. */
int drama_model_sample_rate(const drama_model *model);
int drama_model_samples_per_frame(const drama_model *model);

drama_status drama_session_create(drama_session **out, drama_model *model, drama_error *err);
void drama_session_free(drama_session *session);
/* Requests cancellation: the running synthesize returns DRAMA_ECANCELLED at the next frame
 * boundary. Async-signal-safe (sets one lock-free atomic flag). The flag is cleared when the
 * next drama_synthesize starts. */
void drama_session_cancel(drama_session *session);

/* A reference voice: audio file (decoded, mono, resampled, encoded by the codec) or codes
 * (CODES.json), plus its transcript. Reference i is speaker i. */
typedef struct drama_reference {
    const char *audio_path;  /* WAV/FLAC/... file, or NULL */
    const char *codes_path;  /* CODES.json instead of audio, or NULL */
    const char *transcript;  /* required, non-empty */
} drama_reference;

typedef struct drama_request {
    const char *text;                       /* UTF-8, required */
    const drama_reference *references;      /* n_references entries, may be NULL when 0 */
    int n_references;
    int speaker;             /* >= 0: text not starting with a speaker tag gets <|speaker:N|>; -1: none */
    float temperature;       /* 0..2, 0 = argmax for every draw (default 1.0) */
    float top_p;             /* (0, 1] (default 0.9) */
    float cfg_gamma;         /* 0..5; guidance only with a reference (default 0) */
    uint64_t seed;           /* used when seed_set, else drawn from the OS and reported */
    int seed_set;
    int max_frames;          /* failure cap per text batch (default 750) */
    int frames;              /* > 0: exactly this many frames (stops early only at the end token) */
    int frames_per_batch;    /* > 0: exactly this many frames per text batch (long text on models
                                that never emit the end token, e.g. random test models) */
    int stream;              /* 1: audio delivered chunk by chunk while generating */
    int stream_chunk_frames; /* frames per streamed chunk; 0 = small first chunk, then larger */
    int chunk_tokens;        /* text tokens per batch of long text; 0 = default (64) */
    int context;             /* rows of context before the oldest batches are dropped from the
                                history of a long text (TEXT.md 4.6); 0 = default (8192) */
} drama_request;

void drama_request_default(drama_request *req);

/* Phases of a request, in order; a phase that did not run has ran = 0. */
enum {
    DRAMA_PHASE_LOAD = 0,    /* mapping backbone/tower weights (low-memory: per request) */
    DRAMA_PHASE_ENCODE = 1,  /* reference audio -> codes */
    DRAMA_PHASE_GENERATE = 2,/* prompt prefill + frame loop (+ decode while streaming) */
    DRAMA_PHASE_DECODE = 3,  /* codes -> audio (whole mode) */
    DRAMA_PHASE_COUNT = 4
};
const char *drama_phase_name(int phase); /* "load", "encode", "generate", "decode" */

typedef struct drama_phase_stats {
    int ran;
    double wall_s;
    int64_t peak_rss_bytes;  /* peak resident set during the phase (Linux: VmHWM after reset) */
    int64_t rss_end_bytes;   /* resident set when the phase ended */
} drama_phase_stats;

typedef struct drama_result {
    char finish_reason[24];  /* end_token | frames | frame_limit | cancelled | empty_generation |
                                numerical_error | error */
    uint64_t seed;           /* the seed actually used */
    int64_t prompt_tokens;   /* rows of the first batch's prompt */
    int n_batches;           /* text batches (long text is chunked) */
    int64_t frames;          /* frames generated, all batches */
    int n_codebooks;
    int32_t *codes;          /* frames x n_codebooks, frame-major; owned, drama_result_free */
    int sample_rate;
    int64_t samples;         /* = frames * samples_per_frame */
    int samples_per_frame;
    double audio_seconds;
    double wall_s;           /* whole request */
    double time_to_first_audio_s; /* request start -> first audio delivered */
    double real_time_factor; /* wall_s / audio_seconds */
    drama_phase_stats phases[DRAMA_PHASE_COUNT];
} drama_result;

void drama_result_free(drama_result *res); /* frees codes; the struct itself is the caller's */

/* Progress events (phase changes, frames, chunks). A nonzero return cancels the request. */
typedef enum drama_event_type {
    DRAMA_EVENT_PHASE = 0,   /* a phase starts: phase */
    DRAMA_EVENT_FRAMES = 1,  /* frames generated so far: frames, audio_seconds */
    DRAMA_EVENT_CHUNK = 2    /* audio delivered: samples_total, audio_seconds */
} drama_event_type;

typedef struct drama_event {
    drama_event_type type;
    int phase;
    int batch, n_batches;
    int64_t frames;
    int64_t frames_target;   /* --frames N, else the cap */
    int64_t samples_total;
    double audio_seconds;
    double elapsed_s;
    int64_t rss_bytes;
} drama_event;

typedef int (*drama_event_fn)(void *user, const drama_event *ev);
/* Audio delivery: n mono float samples in (-1, 1) at result.sample_rate. Return nonzero to
 * cancel (e.g. the writer failed). */
typedef int (*drama_audio_fn)(void *user, const float *samples, size_t n);

/* Runs one request. Whole mode (req->stream = 0) delivers all audio after generation (in one or
 * more calls); stream mode delivers it in chunks as frames are produced. On failure (including
 * frame_limit and cancelled) res->finish_reason says why and the caller must discard the audio
 * it received. res may be NULL; if not, free it with drama_result_free. */
drama_status drama_synthesize(drama_session *session, const drama_request *req, drama_audio_fn on_audio,
                              drama_event_fn on_event, void *user, drama_result *res, drama_error *err);

#ifdef __cplusplus
}
#endif
#endif
