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
    DRAMA_EINTERNAL = 12,   /* a bug: please report */
    DRAMA_EBUSY = 13        /* no free lane or no memory to reserve now: try again later */
} drama_status;

/* A caller-owned error record: code, a human message, and (for input a server refuses) a stable
 * machine reason, "" when none. Reasons set by this library: "empty_text", "text_too_long",
 * "invalid_utf8", "reserved_token", "invalid_speaker_tag" (drama_validate_text and every request
 * that carries text), "request_too_large" (drama_request_plan), "bad_audio" (drama_encode_audio
 * and audio references), "insufficient_memory", "no_free_lane" (drama_engine_start). They are the
 * `code` strings of API.md section 7; a server maps them one to one. */
typedef struct drama_error {
    drama_status code;
    char message[1024];
    char reason[32];
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

/* Where the model runs. AUTO: CUDA when the library has the CUDA backend and a usable GPU is
 * present, else the CPU; CUDA without one fails at the first request, naming the reason. */
typedef enum drama_backend { DRAMA_BACKEND_AUTO = 0, DRAMA_BACKEND_CPU = 1, DRAMA_BACKEND_CUDA = 2 } drama_backend;

typedef struct drama_model_options {
    int threads;             /* worker threads; 0 = all online CPUs */
    int low_memory;          /* 1: backbone and tower are mapped only while generating and
                                released before decoding (three phases); 0: kept resident */
    const char *const *set;  /* NULL-terminated "switch=value" overrides (MODEL.md 10), or NULL */
    drama_backend backend;   /* default DRAMA_BACKEND_AUTO */
    int device;              /* GPU index for CUDA (default 0) */
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

/* A reference voice: exactly one of an audio file, audio bytes in memory (any container the
 * file reader accepts: decoded, mono, resampled, encoded by the codec), a CODES.json file, or
 * codes in memory; plus its transcript. Reference i is speaker i. A request copies what it needs
 * when it starts: the caller's buffers may be freed after drama_engine_start returns.
 * Zero-initialize it (= {0} or memset) and set the fields you use: fields may be added. */
typedef struct drama_reference {
    const char *audio_path;  /* WAV/FLAC/... file, or NULL */
    const char *codes_path;  /* CODES.json instead of audio, or NULL */
    const char *transcript;  /* required, non-empty; validated like the text */
    const void *audio_data;  /* audio file bytes in memory, or NULL */
    size_t audio_bytes;
    const int32_t *codes;    /* codes in memory: n_code_frames x the model's codebooks, frame-major */
    int64_t n_code_frames;
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
    int stream_chunk_frames; /* frames per chunk after the first; 0 = 16 (API.md 3.3 "balanced") */
    int chunk_tokens;        /* text tokens per batch of long text; 0 = default (64) */
    int context;             /* rows of context before the oldest batches are dropped from the
                                history of a long text (TEXT.md 4.6); 0 = default (8192) */
    int stream_first_frames; /* frames of the first chunk; 0 = stream_chunk_frames when that is
                                set, else 4. API.md 3.3: normal = 10 then 25, balanced = 4 then 16.
                                Whole mode decodes on the same schedule (the samples are equal). */
    int chunk_bytes;         /* > 0: at most this many UTF-8 bytes per text batch as well
                                (/v1/tts chunk_length, TEXT.md 4.4); 0 = no byte budget */
} drama_request;

void drama_request_default(drama_request *req);
/* A deep copy of a request (its text, references and their buffers), owned by the copy: for
 * callers that keep requests beyond the caller's buffers (a queue). `model` gives the codes'
 * width. Free with drama_request_free. */
drama_status drama_request_copy(const drama_model *model, const drama_request *src, drama_request **out,
                                drama_error *err);
void drama_request_free(drama_request *req);

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
    int64_t rss_file_end_bytes; /* its file-backed part (mapped weights; Linux: RssFile), free of heap noise */
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
    int voice_cached;        /* 1: the reference prefix state came from the engine's prompt cache */
    int guided;              /* 1: classifier-free guidance ran (cfg_gamma > 0 and a reference) */
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

/* ---- Inputs checked before a request is admitted (any thread) ------------------------------
 * These calls may run on any thread at the same time as each other and as an engine or a
 * drama_synthesize on the same model: they use no thread pool and no shared mutable state. */

/* Audio file bytes (any container the reference reader accepts) -> codes, as a reference is
 * encoded (CODEC.md 7): decoded, mixed to mono, resampled to the codec rate, encoded in fp32 on
 * the calling thread. max_seconds caps the clip's duration (0 = 30 s, < 0 = no cap). On success
 * *codes (free with drama_codes_free) holds *n_frames x drama_model_codebooks() codes, frame-major,
 * and *duration_s the clip's duration. Failures of the input (unreadable, empty, non-finite, too
 * long) carry reason "bad_audio" and name what is wrong. */
drama_status drama_encode_audio(drama_model *model, const void *data, size_t n, double max_seconds, int32_t **codes,
                                int64_t *n_frames, double *duration_s, drama_error *err);
void drama_codes_free(int32_t *codes);
int drama_model_codebooks(const drama_model *model); /* codes per frame */
/* The codec fingerprint (CODEC.md 7): SHA-256 of the codec weights file, 64 lowercase hex digits,
 * computed once (through the digest cache) and kept; NULL when the file cannot be read. Stored
 * codes whose fingerprint differs must be re-encoded from their audio. */
const char *drama_model_codec_fingerprint(drama_model *model);

/* TEXT.md 2.3 on a text or transcript: DRAMA_OK, or a failure with err->reason one of
 * "invalid_utf8", "empty_text", "reserved_token", "invalid_speaker_tag", "text_too_long" (more
 * than max_code_points code points; <= 0: no limit), the message naming the byte offset. */
drama_status drama_validate_text(const drama_model *model, const char *text, int64_t max_code_points,
                                 drama_error *err);

/* What a request will need, computed without running it (tokenizes its text, reads its
 * references' sizes; nothing is encoded or allocated for the model). Errors as the request would
 * fail: invalid parameters (naming the field), text (with the reasons above), references, and
 * "request_too_large" when the first batch's prompt plus its frames cannot fit the context. */
typedef struct drama_plan {
    int n_batches;           /* text batches (TEXT.md 4) */
    int guided;              /* cfg_gamma > 0 and a reference: a second backbone state runs */
    int64_t prompt_rows;     /* rows of the first batch's conditional prompt */
    int64_t uncond_rows;     /* rows of the first batch's unconditional prompt (guided), else 0 */
    int64_t prefix_rows;     /* rows of the voice prefix (TEXT.md 2.1 segments 1-6), 0 without a
                                reference: the part the engine's prompt cache can hold */
    int64_t frame_cap;       /* frames per batch at most (the cap, or the exact count) */
    int64_t max_frames;      /* frames of the whole request at most */
    int64_t max_rows;        /* rows the conditional state can reach (prompt, history, frames) */
    int64_t state_bytes;     /* host bytes to reserve for the request's state while it runs:
                                backbone KV per row and DeltaNet state (twice when guided), tower
                                KV per row, codec stream, frames, prompts, prefill scratch */
} drama_plan;
drama_status drama_request_plan(drama_model *model, const drama_request *req, drama_plan *plan, drama_error *err);

/* ---- The batched engine --------------------------------------------------------------------
 * N lanes over one model, stepped together one tick at a time: each tick, requests that have
 * just started prefill (in slices, so the generating lanes are not stalled by a long prompt), then
 * every generating lane makes one frame in one batched model step, streamed chunks are decoded and
 * delivered, and finished lanes free their state. Requests join and leave between ticks
 * (continuous batching). Every request's codes and audio are identical to running it alone
 * (same seed), whatever else is in the batch, however its prefill was sliced, and whether its
 * voice prefix came from the prompt cache.
 *
 * Voice prompt cache: the generation state after a request's reference prefix (TEXT.md 2.1
 * segments 1-6; backbone incl. DeltaNet state, the guidance state, tower caches) is kept and
 * reused by later requests with the same prefix rows (the same reference codes, transcripts and
 * prompt switches: keyed by content, never by a voice id). LRU, bounded by prompt_cache_bytes;
 * guided and unguided requests use separate entries.
 *
 * Memory: a request reserves drama_plan.state_bytes when it starts and returns them when it
 * finishes; it starts only if reservations + prompt cache stay within memory_budget_bytes (the
 * cache gives up entries first). The engine never allocates state it has not reserved.
 *
 * Threading: one thread drives an engine (create, start, step, lane calls, stats, free); the
 * callbacks run on it, inside drama_engine_step. drama_lane_cancel may be called from any thread
 * or a signal handler. The engine holds the model's weights and codec for its lifetime; a
 * drama_synthesize on the same model waits between ticks. A low-memory model cannot serve an
 * engine (it unmaps weights between requests): DRAMA_EUNSUPPORTED. */

typedef struct drama_engine drama_engine;
typedef uint64_t drama_lane; /* one request in an engine; 0 is never a valid handle */

typedef struct drama_engine_options {
    int lanes;               /* requests stepped together, 1..256 (default 1) */
    int prefill_slice_rows;  /* prompt rows prefilled per tick (all newcomers together) while other
                                lanes generate: > 0 that many, 0 whole prompts, -1 (default) auto:
                                as many as take about one frame step (measured). With no lane
                                generating, a prompt is prefilled whole (nothing waits). Slicing
                                never changes a result: with deltanet.prefill=chunked (the
                                default) cuts land on 16-row blocks, so a tick takes at least one
                                block per prompt (or its rest) however small this is. */
    int64_t prompt_cache_bytes;  /* voice prefix snapshots; 0 = no cache (default) */
    int64_t memory_budget_bytes; /* reservations + prompt cache; 0 = default: 3/4 of physical memory
                                    (or the cgroup limit) minus what the process holds resident once
                                    the model is loaded; < 0 = no limit */
} drama_engine_options;

void drama_engine_options_default(drama_engine_options *opt);
/* Loads what the model needs to run (weights, codec) if not loaded yet: the slow part of
 * opening a model (the manifest is verified then). */
drama_status drama_engine_create(drama_engine **out, drama_model *model, const drama_engine_options *opt,
                                 drama_error *err);
/* Frees every lane (running requests are dropped without callbacks) and the prompt cache. */
void drama_engine_free(drama_engine *engine);

/* Takes a free lane for the request (copied: its strings and buffers may be freed on return),
 * validates it and reserves its memory; no model work runs here. The request runs in the
 * following ticks; on_audio / on_event are called from drama_engine_step (return nonzero to
 * cancel). Audio delivery follows the request's chunk schedule in stream mode; whole mode
 * delivers the request's audio in one call when it has finished. DRAMA_EBUSY with reason
 * "no_free_lane" or "insufficient_memory" when it cannot start now (nothing changed: try again
 * after a lane finishes); DRAMA_ENOMEM "insufficient_memory" when it can never fit the budget;
 * validation errors as drama_request_plan. */
drama_status drama_engine_start(drama_engine *engine, const drama_request *req, drama_audio_fn on_audio,
                                drama_event_fn on_event, void *user, drama_lane *lane, drama_error *err);
/* One tick (see above). Returns DRAMA_OK unless the engine itself failed; a request's failure is
 * its lane's result. Does nothing when no lane runs. */
drama_status drama_engine_step(drama_engine *engine, drama_error *err);
/* Requests cancellation: the lane finishes (finish_reason "cancelled", DRAMA_ECANCELLED) at the
 * next tick, its state and reservation freed then. Any thread; async-signal-safe (one lock-free
 * atomic store); a stale or released handle is ignored. */
void drama_lane_cancel(drama_engine *engine, drama_lane lane);
/* 1 once the lane's request has finished (success, failure or cancellation); 0 while it runs or
 * for a handle that is not in use. */
int drama_lane_done(const drama_engine *engine, drama_lane lane);
/* A finished lane's outcome: its status, *res (may be NULL; owns the codes on success, free with
 * drama_result_free) and *err (may be NULL). Callable once per request. */
drama_status drama_lane_result(drama_engine *engine, drama_lane lane, drama_result *res, drama_error *err);
/* Gives the lane back (a running request is dropped now, without callbacks). */
void drama_lane_release(drama_engine *engine, drama_lane lane);

typedef struct drama_engine_stats {
    int lanes_total;
    int lanes_busy;          /* started and not yet released */
    int lanes_prefilling;    /* preparing or prefilling */
    int lanes_generating;
    int64_t reserved_bytes;  /* reservations of running requests */
    int64_t memory_budget_bytes; /* < 0: no limit */
    int64_t prompt_cache_bytes, prompt_cache_entries;
    int64_t prompt_cache_hits, prompt_cache_misses, prompt_cache_evictions;
    int64_t frames_generated;/* frames made by every lane since create */
    int64_t ticks;           /* drama_engine_step calls that did work */
} drama_engine_stats;
void drama_engine_get_stats(const drama_engine *engine, drama_engine_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
