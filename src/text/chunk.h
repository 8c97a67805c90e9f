/* chunk.h - long text into batches under a token budget (spec/TEXT.md section 4; the policy is
 * written out in docs/text.md). Nothing the user wrote is dropped: text before the first speaker
 * tag is a turn of its own; only whitespace at turn and batch edges is trimmed.
 *
 * Each batch is the user text of one generation turn; the generator builds batch k's prompt as
 * system (+ references), then every earlier batch j as user(text_j) + generation start + its
 * frames + end turn, then user(text_k) + generation start (see prompt.h). */
#ifndef DRAMA_TEXT_CHUNK_H
#define DRAMA_TEXT_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "text/tokenizer.h"

/* Defaults (dr_chunk_options_default): max_tokens 64 (setting chunk_tokens), max_bytes 0 (no
 * byte limit; /v1/tts passes its chunk_length, default 200), max_turns 5, default_speaker_tag 0
 * (the prompt switch of the same name: tags untagged leading text with <|speaker:0|>). */
typedef struct dr_chunk_options {
    int64_t max_tokens;      /* text tokens per batch (tags included); 0 = no limit */
    int64_t max_bytes;       /* UTF-8 bytes per batch; 0 = no limit */
    int max_turns;           /* speaker turns per batch, >= 1 */
    int default_speaker_tag;
} dr_chunk_options;

void dr_chunk_options_default(dr_chunk_options *opt);

typedef struct dr_chunks {
    int64_t n;
    char **text;   /* n batch texts, NUL-terminated, owned */
    size_t *len;
} dr_chunks;

/* Validate the whole text (prompt rules: empty_text, reserved_token, invalid_speaker_tag,
 * invalid_utf8) and split it into batches, in order. A text that fits one batch (and has at
 * most max_turns turns) is returned unchanged as the single batch. */
drama_status dr_chunk_text(dr_tok *tok, const char *text, size_t len, const dr_chunk_options *opt, dr_chunks *out,
                           drama_error *err);
void dr_chunks_free(dr_chunks *chunks);

#endif
