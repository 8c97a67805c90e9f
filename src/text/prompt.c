/* prompt.c - prompt segments -> row matrix (spec/TEXT.md sections 2 and 3). */
#include "text/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "text/tok_internal.h"

void dr_prompt_options_default(dr_prompt_options *opt) {
    opt->plain_instruction = "convert the provided text to speech";
    opt->reference_instruction = "convert the provided text to speech reference to the following:";
    opt->reference_text_header = "\n\nText:\n";
    opt->reference_speech_header = "\n\nSpeech:\n";
    opt->transcript_joiner = "\n";
    opt->reference_speaker_tags = 1;
    opt->default_speaker_tag = 0;
    opt->system_without_reference = 1;
}

/* ---------------------------------------------------------------- ids */

static drama_status need_id(const dr_tok *tok, const char *name, int32_t *id, drama_error *err) {
    *id = dr_tok_id(tok, name);
    if (*id < 0) return dr_fail(err, DRAMA_EFORMAT, "tokenizer: token \"%s\" is missing (needed by the prompt)", name);
    return DRAMA_OK;
}

drama_status dr_prompt_resolve_ids(const dr_tok *tok, dr_prompt_ids *ids, drama_error *err) {
    memset(ids, 0, sizeof *ids);
    drama_status st = need_id(tok, "<|im_start|>", &ids->im_start, err);
    if (!st) st = need_id(tok, "<|im_end|>", &ids->im_end, err);
    if (!st) st = need_id(tok, "<|voice|>", &ids->voice, err);
    if (!st) st = need_id(tok, "<|semantic:0|>", &ids->semantic_start, err);
    if (st) return st;
    char name[64];
    /* the semantic block must be contiguous (MODEL.md 3.4): count it from S */
    for (int32_t i = 1;; i++) {
        snprintf(name, sizeof name, "<|semantic:%d|>", (int)i);
        int32_t id = dr_tok_id(tok, name);
        if (id < 0) {
            ids->n_semantic = i;
            break;
        }
        if (id != ids->semantic_start + i)
            return dr_fail(err, DRAMA_EFORMAT, "tokenizer: \"%s\" has id %d, expected %d (semantic ids must be contiguous)",
                           name, (int)id, (int)(ids->semantic_start + i));
    }
    for (int i = 0; i < DR_PROMPT_SPEAKERS; i++) {
        snprintf(name, sizeof name, "<|speaker:%d|>", i);
        int32_t id;
        size_t ml;
        /* only an added token is a single id; otherwise the tag is ordinary text (S2-Pro) */
        ids->speaker[i] = dr_tok_match_added(tok, name, strlen(name), 0, &id, &ml) && ml == strlen(name) ? id : -1;
    }
    return DRAMA_OK;
}

/* ---------------------------------------------------------------- validation */

size_t dr_prompt_speaker_tag_at(const char *text, size_t len, size_t pos, int *speaker) {
    static const char head[] = "<|speaker:";
    const size_t hl = sizeof head - 1;
    if (len - pos < hl + 3 || memcmp(text + pos, head, hl) != 0) return 0;
    size_t i = pos + hl;
    int n = 0, digits = 0;
    while (i < len && text[i] >= '0' && text[i] <= '9' && digits < 3) n = n * 10 + (text[i++] - '0'), digits++;
    if (digits == 0 || (digits > 1 && text[pos + hl] == '0') || n >= DR_PROMPT_SPEAKERS) return 0;
    if (len - i < 2 || text[i] != '|' || text[i + 1] != '>') return 0;
    if (speaker) *speaker = n;
    return i + 2 - pos;
}

/* Anything shaped like <|speaker:[^|>]*|> (TEXT.md 2.3); returns its length or 0. */
static size_t speaker_like_at(const char *text, size_t len, size_t pos) {
    static const char head[] = "<|speaker:";
    const size_t hl = sizeof head - 1;
    if (len - pos < hl || memcmp(text + pos, head, hl) != 0) return 0;
    for (size_t i = pos + hl; i < len; i++) {
        if (text[i] == '>') return 0;
        if (text[i] == '|') return i + 1 < len && text[i + 1] == '>' ? i + 2 - pos : 0;
    }
    return 0;
}

/* 1 when something other than whitespace and valid speaker tags remains (there is speech). */
static int has_speech(const char *text, size_t len) {
    for (size_t pos = tok_skip_space(text, len, 0); pos < len; pos = tok_skip_space(text, len, pos)) {
        size_t tag = dr_prompt_speaker_tag_at(text, len, pos, NULL);
        if (!tag) return 1;
        pos += tag;
    }
    return 0;
}

drama_status dr_prompt_validate_text(const dr_tok *tok, const char *text, size_t len, const char *what,
                                     drama_error *err) {
    if (!what) what = "text";
    drama_error local = {0};
    if (dr_utf8_check(text, len, what, &local) != DRAMA_OK)
        return dr_fail_reason(err, DRAMA_EINVAL, "invalid_utf8", "invalid_utf8: %s", local.message);
    if (tok_skip_space(text, len, 0) == len)
        return dr_fail_reason(err, DRAMA_EEMPTY, "empty_text", "empty_text: %s is empty after trimming whitespace", what);
    for (size_t pos = 0; pos < len;) {
        size_t n = dr_prompt_speaker_tag_at(text, len, pos, NULL);
        if (n) {
            pos += n;
            continue;
        }
        /* checked before added tokens: a tokenizer may carry more tags than the 16 speakers */
        n = speaker_like_at(text, len, pos);
        if (n)
            return dr_fail_reason(err, DRAMA_EINVAL, "invalid_speaker_tag",
                           "invalid_speaker_tag: %s contains \"%.*s\" at byte offset %zu (tags are <|speaker:N|>, N = 0..%d)",
                           what, (int)(n > 64 ? 64 : n), text + pos, pos, DR_PROMPT_SPEAKERS - 1);
        int32_t id;
        size_t ml;
        if (dr_tok_match_added(tok, text, len, pos, &id, &ml))
            return dr_fail_reason(err, DRAMA_EINVAL, "reserved_token", "reserved_token: %s contains \"%s\" at byte offset %zu", what,
                           dr_tok_token(tok, id), pos);
        pos++;
    }
    if (!has_speech(text, len))
        return dr_fail_reason(err, DRAMA_EEMPTY, "empty_text", "empty_text: %s has only speaker tags and whitespace", what);
    return DRAMA_OK;
}

static int contains_speaker_tag(const char *text, size_t len) {
    for (size_t pos = 0; pos < len; pos++)
        if (text[pos] == '<' && dr_prompt_speaker_tag_at(text, len, pos, NULL)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- builder */

drama_status dr_prompt_begin(dr_prompt *p, dr_tok *tok, const dr_prompt_options *opt, int64_t n_codebooks,
                             drama_error *err) {
    memset(p, 0, sizeof *p);
    if (n_codebooks < 1 || n_codebooks > 1024)
        return dr_fail(err, DRAMA_EINVAL, "prompt: number of codebooks %lld out of range", (long long)n_codebooks);
    p->tok = tok;
    if (opt) p->opt = *opt;
    else dr_prompt_options_default(&p->opt);
    p->n_codebooks = n_codebooks;
    p->rows.n_cols = 1 + n_codebooks;
    return dr_prompt_resolve_ids(tok, &p->ids, err);
}

void dr_prompt_free(dr_prompt *p) {
    if (!p) return;
    dr_rows_free(&p->rows);
    p->cap_rows = 0;
}

void dr_prompt_take_rows(dr_prompt *p, dr_rows *out) {
    *out = p->rows;
    out->prefill = out->n_rows;
    memset(&p->rows, 0, sizeof p->rows);
    p->rows.n_cols = 1 + p->n_codebooks;
    p->cap_rows = 0;
}

/* Room for `extra` more rows, zero-filled. */
static drama_status grow_rows(dr_prompt *p, int64_t extra, drama_error *err) {
    int64_t need = p->rows.n_rows + extra;
    if (need <= p->cap_rows) return DRAMA_OK;
    int64_t cap = p->cap_rows ? p->cap_rows : 256;
    while (cap < need) cap *= 2;
    size_t bytes;
    if (!dr_mul_size((size_t)cap, (size_t)p->rows.n_cols * sizeof(int32_t), &bytes))
        return dr_fail(err, DRAMA_ENOMEM, "prompt: too many rows");
    int32_t *data = realloc(p->rows.data, bytes);
    if (!data) return dr_fail(err, DRAMA_ENOMEM, "prompt: out of memory (%lld rows)", (long long)cap);
    memset(data + p->rows.n_rows * p->rows.n_cols, 0, (size_t)(cap - p->rows.n_rows) * (size_t)p->rows.n_cols * sizeof(int32_t));
    p->rows.data = data;
    p->cap_rows = cap;
    return DRAMA_OK;
}

drama_status dr_prompt_literal(dr_prompt *p, const char *text, size_t len, drama_error *err) {
    dr_ids ids = {0};
    drama_status st = dr_tok_encode(p->tok, text, len, &ids, err);
    if (!st) st = grow_rows(p, ids.n, err);
    for (int64_t i = 0; !st && i < ids.n; i++) {
        int32_t *row = p->rows.data + p->rows.n_rows * p->rows.n_cols;
        memset(row, 0, (size_t)p->rows.n_cols * sizeof *row);
        row[0] = ids.data[i];
        p->rows.n_rows++;
    }
    p->rows.prefill = p->rows.n_rows;
    dr_ids_free(&ids);
    return st;
}

static drama_status literal_str(dr_prompt *p, const char *s, drama_error *err) {
    return dr_prompt_literal(p, s, strlen(s), err);
}

drama_status dr_prompt_frames(dr_prompt *p, const dr_codes *codes, drama_error *err) {
    if (codes->n_frames > 0 && codes->n_codebooks != p->n_codebooks)
        return dr_fail(err, DRAMA_ESHAPE, "prompt: frames have %lld codebooks, the model uses %lld",
                       (long long)codes->n_codebooks, (long long)p->n_codebooks);
    for (int64_t f = 0; f < codes->n_frames; f++)
        for (int64_t k = 0; k < p->n_codebooks; k++) {
            int32_t c = codes->data[f * p->n_codebooks + k];
            if (c < 0 || c >= p->ids.n_semantic)
                return dr_fail(err, DRAMA_EINVAL, "prompt: frame %lld codebook %lld: code %d outside 0..%d", (long long)f,
                               (long long)k, (int)c, (int)p->ids.n_semantic - 1);
        }
    drama_status st = grow_rows(p, codes->n_frames, err);
    if (st) return st;
    for (int64_t f = 0; f < codes->n_frames; f++) {
        int32_t *row = p->rows.data + p->rows.n_rows * p->rows.n_cols;
        const int32_t *c = codes->data + f * p->n_codebooks;
        row[0] = p->ids.semantic_start + c[0];
        memcpy(row + 1, c, (size_t)p->n_codebooks * sizeof *c);
        p->rows.n_rows++;
    }
    p->rows.prefill = p->rows.n_rows;
    return DRAMA_OK;
}

/* A growable string for assembling the transcripts segment. */
typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

static int sb_add(strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *g = realloc(b->s, cap);
        if (!g) return 0;
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 1;
}

drama_status dr_prompt_system(dr_prompt *p, const dr_reference *refs, int n_refs, drama_error *err) {
    const dr_prompt_options *o = &p->opt;
    if (n_refs < 0 || n_refs > DR_PROMPT_SPEAKERS)
        return dr_fail(err, DRAMA_EINVAL, "prompt: %d references (at most %d: reference i is speaker i)", n_refs,
                       DR_PROMPT_SPEAKERS);
    p->has_reference = n_refs > 0;
    if (n_refs == 0) {
        if (!o->system_without_reference) return DRAMA_OK;
        drama_status st = literal_str(p, "<|im_start|>system\n", err);
        if (!st) st = literal_str(p, o->plain_instruction, err);
        if (!st) st = literal_str(p, "<|im_end|>\n", err);
        return st;
    }
    for (int i = 0; i < n_refs; i++) {
        char what[64];
        snprintf(what, sizeof what, "reference %d transcript", i);
        drama_status st = dr_prompt_validate_text(p->tok, refs[i].text, strlen(refs[i].text), what, err);
        if (st) return st;
        if (!refs[i].codes || refs[i].codes->n_frames < 1)
            return dr_fail(err, DRAMA_EEMPTY, "prompt: reference %d has no frames", i);
    }
    strbuf b = {0};
    int ok = sb_add(&b, o->reference_instruction, strlen(o->reference_instruction)) &&
             sb_add(&b, o->reference_text_header, strlen(o->reference_text_header));
    drama_status st = ok ? literal_str(p, "<|im_start|>system\n", err) : dr_fail(err, DRAMA_ENOMEM, "prompt: out of memory");
    if (!st) st = dr_prompt_literal(p, b.s, b.n, err);
    b.n = 0;
    for (int i = 0; !st && i < n_refs; i++) { /* all transcripts form one segment */
        const char *t = refs[i].text;
        size_t tl = strlen(t);
        char tag[32];
        snprintf(tag, sizeof tag, "<|speaker:%d|>", i);
        ok = 1;
        if (i > 0) ok = sb_add(&b, o->transcript_joiner, strlen(o->transcript_joiner));
        if (ok && o->reference_speaker_tags && !contains_speaker_tag(t, tl)) ok = sb_add(&b, tag, strlen(tag));
        if (ok) ok = sb_add(&b, t, tl);
        if (!ok) st = dr_fail(err, DRAMA_ENOMEM, "prompt: out of memory");
    }
    if (!st) st = dr_prompt_literal(p, b.s, b.n, err);
    free(b.s);
    if (!st) st = literal_str(p, o->reference_speech_header, err);
    for (int i = 0; !st && i < n_refs; i++) {
        st = dr_prompt_frames(p, refs[i].codes, err);
        if (st) dr_error_prefix(err, "reference %d: ", i);
    }
    if (!st) st = literal_str(p, "<|im_end|>\n", err);
    return st;
}

drama_status dr_prompt_user(dr_prompt *p, const char *text, size_t len, drama_error *err) {
    drama_status st = dr_prompt_validate_text(p->tok, text, len, "text", err);
    if (st) return st;
    char *tagged = NULL;
    if (p->opt.default_speaker_tag && !dr_prompt_speaker_tag_at(text, len, tok_skip_space(text, len, 0), NULL)) {
        static const char tag[] = "<|speaker:0|>";
        tagged = malloc(len + sizeof tag);
        if (!tagged) return dr_fail(err, DRAMA_ENOMEM, "prompt: out of memory");
        memcpy(tagged, tag, sizeof tag - 1);
        memcpy(tagged + sizeof tag - 1, text, len);
        text = tagged;
        len += sizeof tag - 1;
    }
    st = literal_str(p, "<|im_start|>user\n", err);
    if (!st) st = dr_prompt_literal(p, text, len, err);
    if (!st) st = literal_str(p, "<|im_end|>\n", err);
    free(tagged);
    return st;
}

drama_status dr_prompt_generation_start(dr_prompt *p, drama_error *err) {
    return literal_str(p, "<|im_start|>assistant\n<|voice|>", err);
}

drama_status dr_prompt_end_turn(dr_prompt *p, drama_error *err) { return literal_str(p, "<|im_end|>\n", err); }

drama_status dr_prompt_build(dr_tok *tok, const dr_prompt_options *opt, int64_t n_codebooks,
                             const dr_reference *refs, int n_refs, const char *text, dr_rows *out,
                             drama_error *err) {
    memset(out, 0, sizeof *out);
    dr_prompt p;
    drama_status st = dr_prompt_begin(&p, tok, opt, n_codebooks, err);
    if (!st) st = dr_prompt_system(&p, refs, n_refs, err);
    if (!st) st = dr_prompt_user(&p, text, strlen(text), err);
    if (!st) st = dr_prompt_generation_start(&p, err);
    if (!st) dr_prompt_take_rows(&p, out);
    dr_prompt_free(&p);
    return st;
}
