/* prompt.h - the Drama 3 prompt as a row matrix (spec/TEXT.md sections 2 and 3).
 *
 * A prompt is a list of segments; each literal segment is tokenised on its own (ids are never
 * merged across a segment boundary) and becomes text rows [id, 0, ..., 0]; each audio frame
 * (c0..cK-1) becomes the row [S + c0, c0, ..., cK-1] with S = id("<|semantic:0|>").
 * Every structural id is resolved from the tokenizer by name; no id is a literal here.
 *
 * One-shot use: dr_prompt_build(). Long text (TEXT.md 4.5) composes the same pieces with the
 * builder: dr_prompt_begin, dr_prompt_system, then per earlier batch dr_prompt_user +
 * dr_prompt_generation_start + dr_prompt_frames + dr_prompt_end_turn, then dr_prompt_user +
 * dr_prompt_generation_start for the current batch. The unconditional prompt of guidance
 * (TEXT.md 5.5) is the same calls with no references. */
#ifndef DRAMA_TEXT_PROMPT_H
#define DRAMA_TEXT_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "io/codes_json.h"
#include "io/rows_json.h"
#include "text/tokenizer.h"

/* Speaker tags are <|speaker:N|> with N = 0..DR_PROMPT_SPEAKERS-1 (TEXT.md 1.4, 2.1). */
#define DR_PROMPT_SPEAKERS 16

/* The prompt switches of TEXT.md 2.4. Strings are borrowed (must outlive the builder).
 * dr_prompt_options_default fills the documented defaults:
 *   plain_instruction        "convert the provided text to speech"
 *   reference_instruction    "convert the provided text to speech reference to the following:"
 *   reference_text_header    "\n\nText:\n"
 *   reference_speech_header  "\n\nSpeech:\n"
 *   transcript_joiner        "\n"
 *   reference_speaker_tags   1  (prefix reference i's transcript with <|speaker:i|> unless it
 *                                already contains a speaker tag)
 *   default_speaker_tag      0  (1: prepend <|speaker:0|> to user text that does not start with a tag)
 *   system_without_reference 1  (0: no system message at all when there is no reference) */
typedef struct dr_prompt_options {
    const char *plain_instruction;
    const char *reference_instruction;
    const char *reference_text_header;
    const char *reference_speech_header;
    const char *transcript_joiner;
    int reference_speaker_tags;
    int default_speaker_tag;
    int system_without_reference;
} dr_prompt_options;

void dr_prompt_options_default(dr_prompt_options *opt);

/* Ids the prompt needs, resolved by name at dr_prompt_begin. */
typedef struct dr_prompt_ids {
    int32_t im_start, im_end, voice;
    int32_t semantic_start;  /* S = id("<|semantic:0|>") */
    int32_t n_semantic;      /* contiguous <|semantic:i|> ids from S (checked) */
    int32_t speaker[DR_PROMPT_SPEAKERS]; /* id of <|speaker:i|> when it is an added token, else -1 */
} dr_prompt_ids;

drama_status dr_prompt_resolve_ids(const dr_tok *tok, dr_prompt_ids *ids, drama_error *err);

/* One reference clip: its transcript and its frames (n_codebooks codes each). */
typedef struct dr_reference {
    const char *text;     /* NUL-terminated UTF-8 transcript */
    const dr_codes *codes;
} dr_reference;

/* Validation of user text and transcripts (TEXT.md 2.3). Fails with err->reason and the start of
 * the message set to the stable reason name: "invalid_utf8" (byte offset), "empty_text" (only whitespace and speaker tags; DRAMA_EEMPTY),
 * "reserved_token" (the token and its byte offset), "invalid_speaker_tag" (tag and offset).
 * `what` names the text in messages ("text", "reference 1 transcript"). */
drama_status dr_prompt_validate_text(const dr_tok *tok, const char *text, size_t len, const char *what,
                                     drama_error *err);
/* Parse a valid speaker tag at text[pos] ("<|speaker:N|>", N in range, no leading zero).
 * Returns its byte length and stores N, or returns 0. */
size_t dr_prompt_speaker_tag_at(const char *text, size_t len, size_t pos, int *speaker);

/* The builder: rows grow as segments are added. */
typedef struct dr_prompt {
    dr_tok *tok;
    dr_prompt_options opt;
    dr_prompt_ids ids;
    int64_t n_codebooks;  /* rows have 1 + n_codebooks columns */
    dr_rows rows;         /* rows.n_rows rows filled; prefill = n_rows */
    int64_t cap_rows;
    int has_reference;    /* set by dr_prompt_system */
} dr_prompt;

drama_status dr_prompt_begin(dr_prompt *p, dr_tok *tok, const dr_prompt_options *opt, int64_t n_codebooks,
                             drama_error *err);
void dr_prompt_free(dr_prompt *p);
/* Move the rows out (the builder keeps nothing); prefill = all rows. */
void dr_prompt_take_rows(dr_prompt *p, dr_rows *out);

/* System message with zero or more references (validated; reference i is speaker i). */
drama_status dr_prompt_system(dr_prompt *p, const dr_reference *refs, int n_refs, drama_error *err);
/* <|im_start|>user\n, the text (validated), <|im_end|>\n: three segments. */
drama_status dr_prompt_user(dr_prompt *p, const char *text, size_t len, drama_error *err);
/* <|im_start|>assistant\n<|voice|> (generation starts after it). */
drama_status dr_prompt_generation_start(dr_prompt *p, drama_error *err);
/* One audio row per frame; codes must have n_codebooks codebooks, c0 < n_semantic. */
drama_status dr_prompt_frames(dr_prompt *p, const dr_codes *codes, drama_error *err);
/* <|im_end|>\n after an assistant turn's frames. */
drama_status dr_prompt_end_turn(dr_prompt *p, drama_error *err);
/* Tokenise one literal segment on its own and append its text rows (no validation). */
drama_status dr_prompt_literal(dr_prompt *p, const char *text, size_t len, drama_error *err);

/* The whole single-batch prompt: system (+ references), user text, generation start. */
drama_status dr_prompt_build(dr_tok *tok, const dr_prompt_options *opt, int64_t n_codebooks,
                             const dr_reference *refs, int n_refs, const char *text, dr_rows *out,
                             drama_error *err);

#endif
