/* bench_codec.c - `drama bench codec`: the codec at the REAL size (CODEC.md 1: 10 codebooks, 2048
 * samples per frame, 8-layer post_module, 1536-wide decoder) with random fp32 weights made in
 * memory from the expected inventory (dr_codec_expected): frames/s, x real time, GFLOP/s and the
 * share of the machine's fp32 FMA peak, for a whole decode, a stream fed one frame per call, and
 * an encode of the decoded audio.
 *
 * FLOPs per frame come from the loaded layers (dr_codec_flops_per_frame, codec/flops.c). Peak =
 * cores x FMA units x fp32 lanes per unit x 2 x clock: cores = the pool's threads (at most the
 * online CPUs); FMA units and lanes are what the microarchitecture executes per cycle (defaults: 2
 * units; 16 lanes for AVX-512 on Intel and AMD Zen 5, 8 otherwise: Zen 4 runs 512-bit FMAs on two
 * 256-bit pipes; --fma-units / --lanes override); the clock is measured on all pool threads at once (core_ghz;
 * the mean), cpuinfo's "cpu MHz" replaces it when it is implausible, --clock-ghz states it; the
 * line says which was used. Each mode also shows its process CPU time and GFLOP per CPU-second
 * against one core's peak (the kernels' efficiency on a shared machine), and the whole decode is
 * broken down by stage (dr_codec_stream_set_profile) to show which stages scale. The bench ends with
 * `ratio_to_floor X` = decode time / (FLOPs / peak), the compute floor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/select/select.h"
#include "base/cli_args.h"
#include "base/pool.h"
#include "codec/codec.h"
#include "tools/bench.h"

typedef struct inv {
    dr_tensor *t;
    int64_t n, cap, max_numel;
    int oom;
} inv;

static void collect(void *ctx, const char *name, int ndim, const int64_t *shape) {
    inv *v = ctx;
    if (v->oom) return;
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 1024;
        dr_tensor *nt = realloc(v->t, (size_t)cap * sizeof *nt);
        if (!nt) {
            v->oom = 1;
            return;
        }
        v->t = nt, v->cap = cap;
    }
    dr_tensor *t = &v->t[v->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) {
        v->oom = 1;
        return;
    }
    v->n++;
    t->dtype = DR_DT_F32;
    t->ndim = ndim;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], numel *= shape[i];
    t->nbytes = (size_t)numel * 4;
    if (numel > v->max_numel) v->max_numel = numel;
}

static int ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GHz of one core while it runs: a chain of dependent 64-bit multiplies (latency 3 cycles on
 * every x86-64 core since Core 2 and Zen; an add chain is not used because Golden Cove folds
 * add-immediate chains in the renamer and read 10 GHz on a 2.1 GHz Xeon), timed in this
 * thread's CPU time so that time the thread spent descheduled on a busy machine does not count;
 * best of 3 runs */
static double core_ghz(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t x = 3, m = 0x9e3779b97f4a7c15ull, n = 30000000;
        double t0 = thread_cpu_s();
        for (uint64_t i = 0; i < n; i += 8)
            __asm__ volatile("imul %1,%0\n\timul %1,%0\n\timul %1,%0\n\timul %1,%0\n\t"
                             "imul %1,%0\n\timul %1,%0\n\timul %1,%0\n\timul %1,%0"
                             : "+r"(x)
                             : "r"(m));
        double dt = thread_cpu_s() - t0, ghz = dt > 0 ? 3.0 * (double)n / dt / 1e9 : 0;
        if (ghz > best) best = ghz;
    }
    return best;
#else
    return 0;
#endif
}

static void ghz_task(void *ctx, int64_t i, int worker) {
    (void)worker;
    ((double *)ctx)[i] = core_ghz();
}

/* the all-core clock: every pool thread measures at once; the mean */
static double measure_ghz(dr_pool *pool) {
    int n = dr_pool_threads(pool);
    double g[4096] = {0}, sum = 0;
    if (n > 4096) n = 4096;
    dr_pool_run(pool, n, ghz_task, g);
    for (int i = 0; i < n; i++) sum += g[i];
    return n > 0 ? sum / n : 0;
}

/* first "cpu MHz", "vendor_id" and "cpu family" of /proc/cpuinfo (0 / "" when absent) */
static double cpuinfo(char *vendor, size_t vlen, int *family) {
    double mhz = 0;
    *family = 0;
    char line[512];
    vendor[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!c) continue;
        if (!mhz && !strncmp(line, "cpu MHz", 7)) mhz = atof(c + 1);
        if (!*family && !strncmp(line, "cpu family", 10)) *family = atoi(c + 1);
        if (!vendor[0] && !strncmp(line, "vendor_id", 9)) {
            snprintf(vendor, vlen, "%s", c + 1 + strspn(c + 1, " \t"));
            vendor[strcspn(vendor, "\n")] = 0;
        }
    }
    fclose(f);
    return mhz;
}

/* FNV-1a of n bytes: the bench's output hash (any kernel order or thread count gives the same) */
static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int usage(FILE *f) {
    fprintf(f, "usage: drama bench codec [--frames N] [--threads T] [--no-encode] [--fma-units U] [--lanes L] [--clock-ghz G]\n"
               "  The codec at the real size with random weights: whole decode, streaming one frame per call,\n"
               "  encode; frames/s, x real time, GFLOP/s and %% of the fp32 FMA peak (cores x FMA units x\n"
               "  lanes x 2 x clock: measured, cpuinfo's when the probe is implausible, or --clock-ghz G),\n"
               "  GFLOP per CPU-second against one core's peak, and the whole decode and the encode by stage.\n"
               "  --frames N (default 32)  --threads T (default: all CPUs)\n"
               "  DRAMA_CODEC_ISA=portable|avx2 runs a narrower kernel than the CPU's best.\n"
               "  --backend cpu|cuda|auto [--device N]: cuda decodes on the GPU (docs/cuda.md) after a warm-up, adds\n"
               "  the first streamed chunk (4 frames, a fresh stream) and the difference to the CPU decode.\n");
    return f == stdout ? 0 : 2;
}

typedef struct row {
    const char *mode;
    double frames, seconds, cpu_s;
} row;

/* core_peak: one core's peak (GFLOP/s); the last column is GFLOP per CPU-second over it, the
 * kernels' efficiency whatever else shares the machine */
static void print_row(const row *r, double rate, double flops_frame, double peak, double core_peak) {
    double fps = r->frames / r->seconds, gf = fps * flops_frame / 1e9;
    double gf_cpu = r->cpu_s > 0 ? r->frames * flops_frame / 1e9 / r->cpu_s : 0;
    printf("  %-24s %6.0f %9.3f %9.2f %8.3f %9.1f %7.1f%% %8.3f %7.1f%%\n", r->mode, r->frames, r->seconds, fps,
           fps / rate, gf, peak > 0 ? 100.0 * gf / peak : 0.0, r->cpu_s, core_peak > 0 ? 100.0 * gf_cpu / core_peak : 0.0);
}

int dr_bench_codec_main(int argc, char **argv) {
    long long frames = 32, threads = 0, units = 2, lanes = 0, device = 0;
    double clock_ghz = 0; /* --clock-ghz: stated instead of measured */
    int encode = 1;
    dr_backend_want want = DR_WANT_CPU;
    const char *cmd = "bench codec";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long *dst = !strcmp(a, "--frames")      ? &frames
                         : !strcmp(a, "--threads")   ? &threads
                         : !strcmp(a, "--fma-units") ? &units
                         : !strcmp(a, "--lanes")     ? &lanes
                         : !strcmp(a, "--device")    ? &device
                                                     : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "--clock-ghz")) {
            if (!dr_cli_num(cmd, a, v, 0.1, 10.0, 0, &clock_ghz)) return 2;
            i++;
            continue;
        }
        if (dst) {
            if (!dr_cli_int(cmd, a, v, dst == &threads || dst == &lanes || dst == &device ? 0 : 1, dst == &frames ? 100000 : 4096, dst))
                return 2;
            i++;
        } else if (!strcmp(a, "--backend")) {
            drama_error e = {0};
            if (!v || dr_backend_parse(v, &want, &e)) {
                fprintf(stderr, "drama bench codec: --backend: %s\n", v ? e.message : "missing value");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--no-encode")) {
            encode = 0;
        } else {
            fprintf(stderr, "drama bench codec: unknown option '%s'\n", a);
            return usage(stderr);
        }
    }
    dr_codec_config cfg;
    dr_codec_config_default(&cfg);
    inv v = {0};
    drama_error err = {0};
    int rc = 1;
    dr_pool *pool = NULL;
    dr_codec *codec = NULL;
    dr_codec_stream *s = NULL;
    float *sym = NULL, *pos = NULL, *a = NULL, *b = NULL, *ref = NULL;
    int32_t *codes = NULL, *enc = NULL;
    if (dr_codec_expected(&cfg, collect, &v, &err) || v.oom) {
        fprintf(stderr, "drama bench codec: %s\n", v.oom ? "out of memory" : err.message);
        goto done;
    }
    /* Shared random buffers keep generation cheap: weights ~U(-1,1)/32 (fan-in ~1000); gains,
     * alphas, norm weights, layer scales and codebooks ~U(0.5, 1.5). */
    sym = malloc((size_t)v.max_numel * 4), pos = malloc((size_t)v.max_numel * 4);
    if (!sym || !pos) {
        fprintf(stderr, "drama bench codec: out of memory\n");
        goto done;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < v.max_numel; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float u = (float)(x >> 40) / (float)(1 << 24);
        sym[i] = (2.0f * u - 1.0f) / 32.0f;
        pos[i] = 0.5f + u;
    }
    for (int64_t i = 0; i < v.n; i++) {
        const char *nm = v.t[i].name;
        int gain = ends(nm, ".alpha") || ends(nm, "original0") || ends(nm, "weight_g") || ends(nm, "norm.weight") ||
                   ends(nm, ".gamma") || ends(nm, "codebook.weight");
        v.t[i].data = (const uint8_t *)(gain ? pos : sym);
    }
    if (!(pool = dr_pool_create((int)threads))) {
        fprintf(stderr, "drama bench codec: cannot start %lld threads\n", threads);
        goto done;
    }
    unsigned parts = DR_CODEC_LOAD_DECODER | (encode ? DR_CODEC_LOAD_ENCODER : 0);
    double t0 = dr_bench_now();
    if (dr_codec_load(v.t, v.n, &cfg, parts, "random real-size codec", &codec, &err)) {
        fprintf(stderr, "drama bench codec: %s\n", err.message);
        goto done;
    }
    double t_load = dr_bench_now() - t0;
    dr_codec_set_pool(codec, pool);
    int K = cfg.num_codebooks, FL = cfg.frame_length;
    codes = malloc((size_t)frames * K * sizeof *codes);
    a = malloc((size_t)frames * FL * 4), b = malloc((size_t)frames * FL * 4);
    if (!codes || !a || !b) {
        fprintf(stderr, "drama bench codec: out of memory\n");
        goto done;
    }
    for (int64_t i = 0; i < frames * K; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        codes[i] = (int32_t)(x % (uint64_t)(i % K ? cfg.codebook_size : cfg.semantic_codebook_size));
    }
    /* the machine's fp32 FMA peak */
    char vendor[64];
    int family;
    double mhz = cpuinfo(vendor, sizeof vendor, &family), measured = measure_ghz(pool), ghz = measured;
    /* the measured clock unless it is implausible next to cpuinfo's nominal one (turbo reaches
     * ~1.8x nominal; a probe far outside that is broken on this core) or a clock was stated */
    const char *clock_src = "measured: dependent imul chain, 3 cycles each, in thread CPU time, mean of all threads";
    if (clock_ghz > 0) ghz = clock_ghz, clock_src = "stated with --clock-ghz";
    else if (mhz > 0 && (measured < 0.4e-3 * mhz || measured > 2.5e-3 * mhz))
        ghz = mhz / 1e3, clock_src = "cpuinfo's nominal MHz: the measured clock is implausible";
    else if (measured <= 0 && mhz > 0) ghz = mhz / 1e3, clock_src = "cpuinfo's nominal MHz: no probe on this CPU";
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = dr_pool_threads(pool);
    if (online > 0 && cores > online) cores = (int)online;
    const char *isa = dr_codec_isa(codec);
    /* 512-bit FMA pipes: Intel's AVX-512 cores and AMD from Zen 5 (family 26); Zen 4 (25) splits
     * a 512-bit FMA over its two 256-bit pipes */
    int wide512 = !strcmp(vendor, "GenuineIntel") || (!strcmp(vendor, "AuthenticAMD") && family >= 26);
    if (!lanes) lanes = !strcmp(isa, "avx512") && wide512 ? 16 : !strcmp(isa, "portable") ? 4 : 8;
    double peak = (double)cores * (double)units * (double)lanes * 2.0 * ghz;
    /* the device decoder: a CPU decode first (the reference of the parity line), then attach */
    const char *where = "cpu";
    double t_cpu = 0;
    if (want != DR_WANT_CPU) {
        if (!(ref = malloc((size_t)frames * FL * 4))) {
            fprintf(stderr, "drama bench codec: out of memory\n");
            goto done;
        }
        t0 = dr_bench_now();
        if (dr_codec_decode(codec, codes, frames, ref, &err)) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
        t_cpu = dr_bench_now() - t0;
        dr_backend_choice ch = {want, (int)device};
        t0 = dr_bench_now();
        if (dr_backend_codec_attach(&ch, codec, &where, &err)) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
        printf("bench codec: decoder on %s (upload %.2f s); the CPU decode of the same codes took %.3f s\n", where,
               dr_bench_now() - t0, t_cpu);
    }
    int on_dev = strcmp(where, "cpu") != 0;
    if (on_dev) peak = 0; /* the FMA peak above is the CPU's */
    double rate = (double)cfg.sample_rate / FL;
    double fd = dr_codec_flops_per_frame(codec, 0), fe = encode ? dr_codec_flops_per_frame(codec, 1) : 0;
    printf("bench codec: real-size codec (%lld tensors, random fp32 weights), %s kernels, %d threads, load %.2f s\n",
           (long long)v.n, isa, dr_pool_threads(pool), t_load);
    printf("  FLOPs per frame: decode %.3f G, encode %.3f G (codec/flops.c: 2 per multiply-add of every conv and\n"
           "  transformer weight, attention over the window; elementwise ops not counted); real time = %.2f frames/s\n",
           fd / 1e9, fe / 1e9, rate);
    double core_peak = on_dev ? 0 : (double)units * (double)lanes * 2.0 * ghz;
    printf("  clock %.3f GHz (%s); probe %.3f GHz, cpuinfo %.0f MHz, %s family %d\n", ghz, clock_src, measured, mhz,
           vendor[0] ? vendor : "vendor unknown", family);
    printf("  peak = %d cores x %lld FMA units x %lld fp32 lanes x 2 x %.3f GHz = %.1f GFLOP/s\n", cores, units, lanes,
           ghz, peak);
    printf("  %-24s %6s %9s %9s %8s %9s %8s %8s %8s\n", "mode", "frames", "seconds", "frames/s", "x RT", "GFLOP/s",
           "of peak", "CPU s", "per CPU");
    row whole = {"decode whole", (double)frames, 0, 0}, stream = {"decode stream, 1/call", (double)frames, 0, 0};
    double prof[DR_CODEC_N_STAGES] = {0}, sprof[DR_CODEC_N_STAGES] = {0}, c0;
    if (dr_codec_stream_create(codec, &s, &err)) {
        fprintf(stderr, "drama bench codec: %s\n", err.message);
        goto done;
    }
    if (on_dev && dr_codec_stream_feed(s, codes, frames, a, &err)) { /* the device: a warm-up decode first */
        fprintf(stderr, "drama bench codec: %s\n", err.message);
        goto done;
    }
    dr_codec_stream_reset(s);
    dr_codec_stream_set_profile(s, prof);
    t0 = dr_bench_now(), c0 = dr_bench_cpu_s();
    if (dr_codec_stream_feed(s, codes, frames, a, &err)) { /* a whole decode: one feed of everything */
        fprintf(stderr, "drama bench codec: %s\n", err.message);
        goto done;
    }
    whole.seconds = dr_bench_now() - t0, whole.cpu_s = dr_bench_cpu_s() - c0;
    print_row(&whole, rate, fd, peak, core_peak);
    dr_codec_stream_set_profile(s, on_dev ? NULL : sprof);
    dr_codec_stream_reset(s);
    t0 = dr_bench_now(), c0 = dr_bench_cpu_s();
    for (int64_t f = 0; f < frames; f++)
        if (dr_codec_stream_feed(s, codes + f * K, 1, b + f * FL, &err)) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
    stream.seconds = dr_bench_now() - t0, stream.cpu_s = dr_bench_cpu_s() - c0;
    dr_codec_stream_set_profile(s, NULL);
    print_row(&stream, rate, fd, peak, core_peak);
    int same = !memcmp(a, b, (size_t)frames * FL * 4);
    /* the first streamed chunk of a request (DR_STREAM_FIRST_CHUNK = 4 frames) on a fresh stream:
     * best of 5; its samples must equal the whole decode's */
    int64_t fc = frames < 4 ? frames : 4;
    double first = 0, first_create = 0;
    for (int r = 0; r < 5; r++) {
        dr_codec_stream *fs = NULL;
        t0 = dr_bench_now();
        if (dr_codec_stream_create(codec, &fs, &err)) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
        double t1 = dr_bench_now();
        drama_status fst = dr_codec_stream_feed(fs, codes, fc, b, &err);
        double t2 = dr_bench_now();
        dr_codec_stream_free(fs);
        if (fst) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
        if (first == 0 || t2 - t1 < first) first = t2 - t1, first_create = t1 - t0;
        if (memcmp(a, b, (size_t)fc * FL * 4)) same = 0;
    }
    char unit[128];
    snprintf(unit, sizeof unit, "ms (first streamed chunk: %lld frames = %.0f ms of audio; stream creation %.2f ms more)",
             (long long)fc, 1e3 * (double)fc / rate, first_create * 1e3);
    dr_bench_line("first_chunk_decode", first * 1e3, 2, unit);
    int nan = 0;
    if (ref) { /* device vs CPU: max abs, rms, relative to the largest CPU sample */
        double mx = 0, ss = 0, big = 0;
        for (int64_t i = 0; i < frames * FL; i++) {
            double d = fabs((double)a[i] - (double)ref[i]);
            if (!isfinite(a[i]) || !isfinite(ref[i])) nan = 1;
            if (d > mx) mx = d;
            if (fabs((double)ref[i]) > big) big = fabs((double)ref[i]);
            ss += d * d;
        }
        printf("  %s vs cpu decode: max abs %.3g, rms %.3g, max |cpu sample| %.3g (max rel %.3g), non-finite: %s\n",
               where, mx, sqrt(ss / (double)(frames * FL)), big, big > 0 ? mx / big : 0.0, nan ? "YES" : "no");
        printf("  whole decode: %s %.2f x faster than cpu\n", where, t_cpu / whole.seconds);
    }
    double eprof[DR_CODEC_N_ENC_STAGES] = {0};
    row e = {"encode", 0, 0, 0};
    if (encode) {
        int64_t T;
        t0 = dr_bench_now(), c0 = dr_bench_cpu_s();
        if (dr_codec_encode_ex(codec, a, frames * FL, &enc, &T, NULL, NULL, eprof, &err)) {
            fprintf(stderr, "drama bench codec: %s\n", err.message);
            goto done;
        }
        e.frames = (double)T, e.seconds = dr_bench_now() - t0;
        e.cpu_s = dr_bench_cpu_s() - c0;
        print_row(&e, rate, fe, peak, core_peak);
    }
    printf("  streaming == whole decode (bitwise): %s\n", same ? "yes" : "NO");
    printf("  output hash (FNV-1a): decode %016llx, encode codes %016llx\n",
           (unsigned long long)fnv(a, (size_t)frames * FL * 4),
           (unsigned long long)(enc ? fnv(enc, (size_t)e.frames * K * sizeof *enc) : 0));
    if (!on_dev)
        printf("  whole decode by stage (wall time; %% of peak at this thread count), then the stream's"
               " (1 frame a call):\n");
    for (int i = 0; i < DR_CODEC_N_STAGES && !on_dev; i++) {
        double f = dr_codec_stage_flops_per_frame(codec, i) * (double)frames;
        if (prof[i] <= 0 && f <= 0) continue;
        char name[64];
        printf("    %-26s %8.1f ms %5.1f%% of the time %9.1f GFLOP/s %6.1f%% of peak"
               " | stream %8.1f ms %6.1f%% of peak\n",
               dr_codec_stage_name(i, name, sizeof name), prof[i] * 1e3, 100.0 * prof[i] / whole.seconds,
               prof[i] > 0 ? f / prof[i] / 1e9 : 0.0, prof[i] > 0 && peak > 0 ? 100.0 * f / prof[i] / 1e9 / peak : 0.0,
               sprof[i] * 1e3, sprof[i] > 0 && peak > 0 ? 100.0 * f / sprof[i] / 1e9 / peak : 0.0);
    }
    if (encode && !on_dev) printf("  encode by stage (wall time; %% of peak at this thread count):\n");
    for (int i = 0; i < DR_CODEC_N_ENC_STAGES && encode && !on_dev; i++) {
        double f = dr_codec_enc_stage_flops_per_frame(codec, i) * e.frames;
        if (eprof[i] <= 0 && f <= 0) continue;
        char name[64];
        printf("    %-26s %8.1f ms %5.1f%% of the time %9.1f GFLOP/s %6.1f%% of peak\n",
               dr_codec_enc_stage_name(i, name, sizeof name), eprof[i] * 1e3, 100.0 * eprof[i] / e.seconds,
               eprof[i] > 0 ? f / eprof[i] / 1e9 : 0.0,
               eprof[i] > 0 && peak > 0 ? 100.0 * f / eprof[i] / 1e9 / peak : 0.0);
    }
    double floor_s = peak > 0 ? frames * fd / (peak * 1e9) : 0;
    dr_bench_line("decode_floor", floor_s * 1e3, 1, "ms (decode FLOPs / peak)");
    printf("ratio_to_floor %.2f\n", floor_s > 0 ? whole.seconds / floor_s : 0.0);
    rc = same && !nan ? 0 : 1;
done:
    dr_codec_stream_free(s);
    dr_codec_free(codec);
    dr_pool_free(pool);
    for (int64_t i = 0; i < v.n; i++) free((char *)v.t[i].name);
    free(v.t), free(sym), free(pos), free(codes), free(enc), free(a), free(b), free(ref);
    return rc;
}
