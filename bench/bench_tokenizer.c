/* bench_tokenizer - tokenizer throughput (MB/s of UTF-8 input) on a multilingual corpus.
 *
 * Usage: bench_tokenizer [--golden DIR] [--mb N] [--doc-bytes B]
 * The corpus is the golden encodings texts (65 texts: English, CJK, Arabic, Hebrew, Cyrillic,
 * Devanagari, Thai, emoji, code, numbers, tags) repeated, interleaved with generated text
 * (pseudo-words, CJK runs, numbers, punctuation), about N MB (default 4). It is encoded in
 * documents of about B bytes (default 1024) cut at code point boundaries, as a server would see
 * requests. "cold" clears the piece cache before every pass; "warm" keeps it (a long-running
 * server). Golden data: --golden, else $DRAMA_GOLDEN, else ../shared/golden from the cwd. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t rng = 12345;
static uint32_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

static void add(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) exit(1);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void add_cp(buf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    add(b, u, (size_t)n);
}

/* Generated text: pseudo-words from syllables, CJK runs, numbers, punctuation. */
static void add_generated(buf *b, size_t bytes) {
    static const char *syl[] = {"ka", "to", "ri", "en", "the", "and", "str", "ing", "ion", "qu", "ël", "ñа", "sch", "ou"};
    static const char *punct[] = {". ", ", ", "! ", "? ", "; ", " - ", "\n", "... ", " (", ") "};
    size_t end = b->n + bytes;
    while (b->n < end) {
        uint32_t r = next_rand() % 10;
        if (r < 6) {
            int k = 1 + (int)(next_rand() % 4);
            for (int i = 0; i < k; i++) {
                const char *s = syl[next_rand() % 14];
                add(b, s, strlen(s));
            }
            add(b, " ", 1);
        } else if (r < 8) {
            int k = 2 + (int)(next_rand() % 12);
            for (int i = 0; i < k; i++) add_cp(b, 0x4E00 + next_rand() % 0x5000);
            add_cp(b, 0x3002);
        } else if (r < 9) {
            char num[32];
            int n = snprintf(num, sizeof num, "%u ", next_rand() % 100000);
            add(b, num, (size_t)n);
        } else {
            const char *p = punct[next_rand() % 10];
            add(b, p, strlen(p));
        }
    }
}

static const char *golden_dir(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--golden")) return argv[i + 1];
    const char *env = getenv("DRAMA_GOLDEN");
    return env ? env : "../shared/golden";
}

static double arg_num(int argc, char **argv, const char *name, double def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atof(argv[i + 1]);
    return def;
}

static void run(const char *label, const char *path, const buf *corpus, size_t doc_bytes) {
    drama_error err = {0};
    dr_tok *tok = NULL;
    double t0 = now_s();
    if (dr_tok_load(path, &tok, &err)) {
        printf("%-10s load failed: %s\n", label, err.message);
        return;
    }
    double load_s = now_s() - t0;
    for (int mode = 0; mode < 2; mode++) {
        double best = 1e30, best_cpu = 1e30;
        int64_t tokens = 0;
        for (int rep = 0; rep < 3; rep++) {
            if (mode == 0) dr_tok_clear_cache(tok);
            dr_ids ids = {0};
            tokens = 0;
            double t = now_s(), c = cpu_s();
            for (size_t pos = 0; pos < corpus->n;) {
                size_t end = pos + doc_bytes < corpus->n ? pos + doc_bytes : corpus->n;
                while (end < corpus->n && ((unsigned char)corpus->s[end] & 0xC0) == 0x80) end++;
                ids.n = 0;
                if (dr_tok_encode(tok, corpus->s + pos, end - pos, &ids, &err)) {
                    printf("encode failed: %s\n", err.message);
                    exit(1);
                }
                tokens += ids.n;
                pos = end;
            }
            double dt = now_s() - t, dc = cpu_s() - c;
            if (dt < best) best = dt;
            if (dc < best_cpu) best_cpu = dc;
            dr_ids_free(&ids);
        }
        printf("| %-6s | %-4s | %8.2f | %8.2f | %10.0f | %6.2f | %6.2f |\n", label, mode ? "warm" : "cold",
               (double)corpus->n / best / 1e6, (double)corpus->n / best_cpu / 1e6, (double)tokens / best_cpu,
               (double)corpus->n / (double)tokens, load_s);
    }
    dr_tok_free(tok);
}

int main(int argc, char **argv) {
    const char *golden = golden_dir(argc, argv);
    double mb = arg_num(argc, argv, "--mb", 4);
    size_t doc_bytes = (size_t)arg_num(argc, argv, "--doc-bytes", 1024);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/qwen3-encodings.json", golden);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("bench_tokenizer: golden data not found (%s); pass --golden DIR or set DRAMA_GOLDEN\n", path);
        return 0;
    }
    json_t *items = json_object_get(root, "items");
    buf corpus = {0};
    while ((double)corpus.n < mb * 1e6) {
        for (size_t i = 0; i < json_array_size(items); i++) {
            json_t *t = json_object_get(json_array_get(items, i), "text");
            add(&corpus, json_string_value(t), json_string_length(t));
            add(&corpus, "\n", 1);
        }
        add_generated(&corpus, 4096);
    }
    json_decref(root);
    printf("corpus: %.2f MB (golden texts x n + generated), documents of %zu bytes\n", (double)corpus.n / 1e6, doc_bytes);
    printf("| tokenizer | cache | MB/s (wall, best of 3) | MB/s (CPU time) | tokens/s (CPU) | bytes/token | load s |\n"
           "|---|---|---|---|---|---|---|\n");
    snprintf(path, sizeof path, "%s/tokenizer/qwen3-tokenizer.json.gz", golden);
    run("qwen3", path, &corpus, doc_bytes);
    snprintf(path, sizeof path, "%s/tiny-drama3/tokenizer.json", golden);
    run("tiny", path, &corpus, doc_bytes);
    free(corpus.s);
    return 0;
}
