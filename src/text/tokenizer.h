/* tokenizer.h - byte-level BPE driven by a Hugging Face tokenizer.json (spec/TEXT.md section 1).
 *
 * Encoding one segment: added tokens are matched in the raw text first (leftmost, longest at the
 * same place); each stretch between them is NFC-normalised (utf8proc), split by the file's
 * pre-tokenizer regex (PCRE2, UTF + UCP; every match and every gap is a piece), mapped byte to
 * code point, then merged by rank. No BOS/EOS is ever added.
 *
 * Thread safety: a loaded tokenizer is read-only except for an internal piece -> ids cache that
 * is guarded by a mutex, so one dr_tok may be shared by threads. */
#ifndef DRAMA_TEXT_TOKENIZER_H
#define DRAMA_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct dr_tok dr_tok;

/* A growable list of token ids (caller-owned; free with dr_ids_free). */
typedef struct dr_ids {
    int32_t *data;
    int64_t n;
    int64_t cap;
} dr_ids;

drama_status dr_ids_push(dr_ids *ids, int32_t id, drama_error *err);
drama_status dr_ids_append(dr_ids *ids, const int32_t *src, int64_t n, drama_error *err);
void dr_ids_free(dr_ids *ids); /* frees data and zeroes the struct; accepts NULL */

/* Load tokenizer.json; plain or gzip-compressed (.json.gz; detected from the content).
 * Load errors name the file and the JSON path at fault (e.g. `model.merges[12]`). */
drama_status dr_tok_load(const char *path, dr_tok **out, drama_error *err);
/* Same; with threads >= 2 the NFC check table (a pure function of utf8proc, ~5 ms) is built on a
 * thread of its own while the file is read and parsed (DRAMA_TOK_NFC_THREAD=0: not). */
drama_status dr_tok_load_threads(const char *path, int threads, dr_tok **out, drama_error *err);
/* Same from memory (plain JSON or gzip bytes); `label` names it in messages. For tests and fuzzing. */
drama_status dr_tok_load_memory(const void *data, size_t size, const char *label, dr_tok **out,
                                drama_error *err);
void dr_tok_free(dr_tok *tok);

/* Encode `len` bytes of UTF-8 `text` and append the ids to `out`. Invalid UTF-8 is an error
 * naming the byte offset. Added tokens written in the text become their ids (no validation
 * here: the prompt builder validates user text). */
drama_status dr_tok_encode(dr_tok *tok, const char *text, size_t len, dr_ids *out, drama_error *err);

/* Decode ids to text (malloc'd, NUL-terminated, free with free()). Added tokens give their
 * content; invalid UTF-8 in the result becomes U+FFFD. Unknown ids are an error naming the index. */
drama_status dr_tok_decode(const dr_tok *tok, const int32_t *ids, int64_t n, char **out, size_t *out_len,
                           drama_error *err);

/* The id of a token string (added token content or vocabulary entry), or -1 when absent. */
int32_t dr_tok_id(const dr_tok *tok, const char *token);
/* The string of an id (added token content, else the vocabulary string in byte-level form),
 * or NULL for an unused id. */
const char *dr_tok_token(const dr_tok *tok, int32_t id);
/* 1 + the largest id in use (vocabulary or added token). */
int64_t dr_tok_vocab_size(const dr_tok *tok);
/* Number of vocabulary entries, merges, added tokens. */
int64_t dr_tok_n_vocab(const dr_tok *tok);
int64_t dr_tok_n_merges(const dr_tok *tok);
int64_t dr_tok_n_added(const dr_tok *tok);
/* Added token i (file order): its content, id and `special` flag. */
void dr_tok_added_at(const dr_tok *tok, int64_t i, const char **content, int32_t *id, int *special);
/* The pre-tokenizer split pattern as read from the file, and which known pattern it is:
 * "qwen2" (Qwen2/Qwen3), "qwen3.5" (adds \p{M}, TEXT.md 1.3) or "custom" (any other regex; it is
 * still used as written). For `drama inspect`. */
const char *dr_tok_split_pattern(const dr_tok *tok);
const char *dr_tok_pattern_kind(const dr_tok *tok);

/* If an added token starts at text[pos] (raw match, longest first), store its id and byte length
 * and return 1; else return 0. Used by the prompt builder to validate user text. */
int dr_tok_match_added(const dr_tok *tok, const char *text, size_t len, size_t pos, int32_t *id,
                       size_t *match_len);

/* Check that text[0..len) is valid UTF-8 (no overlongs, surrogates or values above U+10FFFF).
 * On failure the error names `what` and the byte offset. */
drama_status dr_utf8_check(const char *text, size_t len, const char *what, drama_error *err);

/* Drop every cached piece (for benchmarks that measure the cold path). */
void dr_tok_clear_cache(dr_tok *tok);

#endif
