/* test_libdrama.c - a program that knows only include/drama.h and links only libdrama.a (the
 * drama_lib target): the archive must hold everything the public API needs. It synthesizes a
 * few frames from the golden tiny model twice (argmax, then seeded sampling whole vs streamed)
 * and checks what the API promises: samples = frames x samples_per_frame, finite audio, the same
 * request twice gives the same samples, streaming gives the whole output's samples, a bad model
 * directory is an error with a message. Plain C (no cmocka): exit 0 pass, 1 fail, 77 skip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drama.h"

typedef struct pcm {
    float *x;
    size_t n, cap;
} pcm;

static int collect(void *user, const float *samples, size_t n) {
    pcm *p = user;
    if (p->n + n > p->cap) {
        size_t cap = (p->n + n) * 2;
        float *x = realloc(p->x, cap * sizeof *x);
        if (!x) return 1;
        p->x = x, p->cap = cap;
    }
    memcpy(p->x + p->n, samples, n * sizeof *samples);
    p->n += n;
    return 0;
}

static int fails;
#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond)) {                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                       \
            fputc('\n', stderr);                                \
            fails++;                                            \
        }                                                       \
    } while (0)

static drama_status run(drama_session *s, float temperature, int stream, pcm *out, drama_result *res,
                        drama_error *err) {
    drama_request q;
    drama_request_default(&q);
    q.text = "Linked through libdrama.";
    q.temperature = temperature;
    q.seed = 1234, q.seed_set = 1;
    q.frames = 5;
    q.stream = stream;
    q.stream_chunk_frames = stream ? 2 : 0;
    memset(out, 0, sizeof *out);
    return drama_synthesize(s, &q, collect, NULL, out, res, err);
}

int main(void) {
    const char *golden = getenv("DRAMA_GOLDEN");
    if (!golden) {
        printf("skip: DRAMA_GOLDEN is not set\n");
        return 77;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tiny-drama3", golden);
    printf("libdrama %s (%s)\n", drama_version(), drama_git_commit());

    drama_error err = {0};
    drama_model *bad = NULL;
    CHECK(drama_model_open(&bad, "/nonexistent/model", NULL, &err) != DRAMA_OK && bad == NULL, "bad dir opened");
    CHECK(strstr(err.message, "/nonexistent/model") != NULL, "message does not name the dir: %s", err.message);

    drama_model *m = NULL;
    drama_session *s = NULL;
    memset(&err, 0, sizeof err);
    if (drama_model_open(&m, dir, NULL, &err) != DRAMA_OK || drama_session_create(&s, m, &err) != DRAMA_OK) {
        fprintf(stderr, "FAIL: %s: %s\n", dir, err.message);
        drama_model_close(m);
        return 1;
    }
    int spf = drama_model_samples_per_frame(m);
    CHECK(spf > 0 && drama_model_sample_rate(m) > 0, "geometry %d / %d", spf, drama_model_sample_rate(m));

    pcm a, b, c;
    drama_result ra, rb, rc;
    drama_status sa = run(s, 0.0f, 0, &a, &ra, &err);
    CHECK(sa == DRAMA_OK, "argmax run: %s", err.message);
    drama_status sb = run(s, 1.0f, 0, &b, &rb, &err);
    CHECK(sb == DRAMA_OK, "sampled run: %s", err.message);
    drama_status sc = run(s, 1.0f, 1, &c, &rc, &err);
    CHECK(sc == DRAMA_OK, "streamed run: %s", err.message);
    if (sa == DRAMA_OK && sb == DRAMA_OK && sc == DRAMA_OK) {
        CHECK(ra.frames == 5 && !strcmp(ra.finish_reason, "frames"), "frames %lld, finish %s", (long long)ra.frames,
              ra.finish_reason);
        CHECK(a.n == (size_t)(ra.frames * spf) && (int64_t)a.n == ra.samples, "samples %zu vs %lld frames x %d", a.n,
              (long long)ra.frames, spf);
        size_t bad_at = a.n;
        for (size_t i = 0; i < a.n && bad_at == a.n; i++)
            if (!isfinite(a.x[i]) || fabsf(a.x[i]) > 1.0f) bad_at = i;
        CHECK(bad_at == a.n, "sample %zu is not finite or outside [-1, 1]", bad_at);
        CHECK(b.n == c.n && memcmp(b.x, c.x, b.n * sizeof *b.x) == 0, "streamed samples differ from whole (%zu vs %zu)",
              c.n, b.n);
        CHECK(ra.codes && rb.codes && ra.n_codebooks > 0, "codes not returned");
        printf("frames %lld, samples %zu, prompt %lld rows, seed %llu\n", (long long)ra.frames, a.n,
               (long long)ra.prompt_tokens, (unsigned long long)rb.seed);
    }
    drama_result_free(&ra), drama_result_free(&rb), drama_result_free(&rc);
    free(a.x), free(b.x), free(c.x);
    drama_session_free(s);
    drama_model_close(m);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
