/* chunk.c - long text into batches (spec/TEXT.md section 4, policy in docs/text.md).
 *
 * Turns are split at speaker tags. Each turn body is cut into units at a level of detail:
 * level 0 sentences (and line breaks), 1 clauses, 2 words (whitespace), 3 code points; a
 * bracketed direction of at most 64 bytes is one indivisible unit at every level. Units are
 * packed greedily into batches; a unit that does not fit an empty batch is cut at the next level,
 * and an indivisible unit over budget becomes a batch of its own. Budgets are checked on the
 * exact batch text (tokenised), so tokens are never estimated. */
#include "text/chunk.h"

#include <stdlib.h>
#include <string.h>

#include "text/prompt.h"
#include "text/tok_internal.h"

#define MAX_DIRECTION_BYTES 64

void dr_chunk_options_default(dr_chunk_options *opt) {
    opt->max_tokens = 64;
    opt->max_bytes = 0;
    opt->max_turns = 5;
    opt->default_speaker_tag = 0;
}

void dr_chunks_free(dr_chunks *chunks) {
    if (!chunks) return;
    for (int64_t i = 0; i < chunks->n; i++) free(chunks->text[i]);
    free(chunks->text);
    free(chunks->len);
    memset(chunks, 0, sizeof *chunks);
}

/* ---------------------------------------------------------------- characters */

static uint32_t cp_at(const char *t, size_t end, size_t pos, size_t *next) {
    uint32_t cp = 0xFFFD;
    int bad, k = tok_utf8_next((const unsigned char *)t + pos, end - pos, &cp, &bad);
    *next = pos + (k ? (size_t)k : 1);
    return cp;
}

static int is_newline(uint32_t c) { return c == '\n' || c == '\r' || c == 0x85 || c == 0x2028 || c == 0x2029; }

/* Sentence ends; full-width ones end a sentence even without a following space (CJK text has none). */
static int is_sentence_end(uint32_t c) { return c == '.' || c == '!' || c == '?' || c == 0x2026; }
static int is_fullwidth_end(uint32_t c) { return c == 0x3002 || c == 0xFF01 || c == 0xFF1F; }
static int is_clause_mark(uint32_t c) {
    return c == ',' || c == ';' || c == ':' || c == 0xFF0C || c == 0xFF1B || c == 0xFF1A || c == 0x3001 || c == 0x2014;
}
static int is_closer(uint32_t c) {
    return c == '"' || c == '\'' || c == ')' || c == ']' || c == '}' || c == 0x201D || c == 0x2019 || c == 0x300D ||
           c == 0x300F || c == 0x300B || c == 0x3009 || c == 0x3011 || c == 0xFF09 || c == 0x00BB;
}

static uint32_t closing_bracket(uint32_t c) {
    switch (c) {
    case '[': return ']';
    case '(': return ')';
    case '<': return '>';
    case '{': return '}';
    case 0xFF08: return 0xFF09; /* （） */
    case 0x3010: return 0x3011; /* 【】 */
    default: return 0;
    }
}

/* End of a bracketed direction starting at pos (at most 64 bytes), or 0. */
static size_t direction_end(const char *t, size_t end, size_t pos) {
    size_t next;
    uint32_t close = closing_bracket(cp_at(t, end, pos, &next));
    if (!close) return 0;
    for (size_t p = next; p < end && p - pos < MAX_DIRECTION_BYTES;) {
        uint32_t c = cp_at(t, end, p, &next);
        if (c == close) return next - pos <= MAX_DIRECTION_BYTES ? next : 0;
        p = next;
    }
    return 0;
}

/* End of the unit that starts at pos, at the given level (see the file comment). */
static size_t unit_end(const char *t, size_t end, size_t pos, int level) {
    size_t next;
    if (level >= 3) {
        size_t d = direction_end(t, end, pos);
        if (d) return d;
        cp_at(t, end, pos, &next);
        return next;
    }
    size_t p = pos;
    while (p < end) {
        size_t d = direction_end(t, end, p);
        if (d) {
            p = d;
            continue;
        }
        uint32_t c = cp_at(t, end, p, &next);
        if (level == 0 && is_newline(c)) return tok_skip_space(t, end, next);
        if (level == 0 && (is_sentence_end(c) || is_fullwidth_end(c))) {
            int fullwidth = is_fullwidth_end(c);
            size_t q = next, qn;
            for (;;) { /* runs like "?!" or "...", then closing quotes and brackets */
                if (q >= end) return end;
                uint32_t d2 = cp_at(t, end, q, &qn);
                if (!is_sentence_end(d2) && !is_fullwidth_end(d2) && !is_closer(d2)) break;
                fullwidth |= is_fullwidth_end(d2);
                q = qn;
            }
            uint32_t after = cp_at(t, end, q, &qn);
            if (fullwidth || tok_is_space(after)) return tok_skip_space(t, end, q);
            p = q;
            continue;
        }
        if (level == 1 && is_clause_mark(c)) return tok_skip_space(t, end, next);
        if (level == 2 && tok_is_space(c)) return tok_skip_space(t, end, next);
        p = next;
    }
    return end;
}

/* ---------------------------------------------------------------- turns and batches */

typedef struct turn {
    const char *tag;  /* speaker tag text (in the input, or the default tag), NULL if untagged */
    size_t tag_len;
    size_t start, end; /* body, trimmed */
} turn;

typedef struct entry {
    int turn;
    size_t start, end;
} entry;

typedef struct packer {
    dr_tok *tok;
    const dr_chunk_options *opt;
    const char *text;
    const turn *turns;
    entry *cur;       /* the open batch: one entry per turn, at most max_turns */
    int n_cur;
    char *buf;        /* scratch for batch text */
    size_t buf_cap;
    dr_chunks *out;
    int64_t out_cap;
} packer;

/* Batch text of `n` entries into p->buf; returns its length or (size_t)-1 on allocation failure. */
static size_t render(packer *p, const entry *e, int n) {
    size_t need = 1;
    for (int i = 0; i < n; i++) need += p->turns[e[i].turn].tag_len + (e[i].end - e[i].start) + 1;
    if (need > p->buf_cap) {
        char *g = realloc(p->buf, need * 2);
        if (!g) return (size_t)-1;
        p->buf = g;
        p->buf_cap = need * 2;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const turn *t = &p->turns[e[i].turn];
        size_t s = tok_skip_space(p->text, e[i].end, e[i].start), f = e[i].end;
        while (f > s) { /* trim trailing whitespace */
            size_t q = f - 1;
            while (q > s && ((unsigned char)p->text[q] & 0xC0) == 0x80) q--;
            size_t nx;
            if (!tok_is_space(cp_at(p->text, f, q, &nx))) break;
            f = q;
        }
        if (f == s) continue; /* nothing left to say in this entry */
        if (o) p->buf[o++] = '\n';
        if (t->tag) memcpy(p->buf + o, t->tag, t->tag_len), o += t->tag_len;
        memcpy(p->buf + o, p->text + s, f - s);
        o += f - s;
    }
    p->buf[o] = '\0';
    return o;
}

/* Does the batch of these entries fit the budgets? -1 on error. */
static int fits(packer *p, const entry *e, int n, drama_error *err) {
    size_t len = render(p, e, n);
    if (len == (size_t)-1) return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory"), -1;
    if (p->opt->max_bytes > 0 && (int64_t)len > p->opt->max_bytes) return 0;
    if (p->opt->max_tokens <= 0) return 1;
    dr_ids ids = {0};
    if (dr_tok_encode(p->tok, p->buf, len, &ids, err)) return -1;
    int ok = ids.n <= p->opt->max_tokens;
    dr_ids_free(&ids);
    return ok;
}

static drama_status close_batch(packer *p, drama_error *err) {
    if (p->n_cur == 0) return DRAMA_OK;
    size_t len = render(p, p->cur, p->n_cur);
    p->n_cur = 0;
    if (len == (size_t)-1) return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
    if (len == 0) return DRAMA_OK;
    dr_chunks *c = p->out;
    if (c->n == p->out_cap) {
        int64_t cap = p->out_cap ? p->out_cap * 2 : 8;
        char **t = realloc(c->text, (size_t)cap * sizeof *t);
        if (t) c->text = t;
        size_t *l = t ? realloc(c->len, (size_t)cap * sizeof *l) : NULL;
        if (!l) return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
        c->len = l;
        p->out_cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
    memcpy(s, p->buf, len + 1);
    c->text[c->n] = s;
    c->len[c->n++] = len;
    return DRAMA_OK;
}

/* The open batch plus [s, e) of turn ti, into cand; returns the entry count or -1 (too many turns). */
static int extend(const packer *p, entry *cand, int ti, size_t s, size_t e) {
    memcpy(cand, p->cur, (size_t)p->n_cur * sizeof *cand);
    int n = p->n_cur;
    if (n > 0 && cand[n - 1].turn == ti) {
        cand[n - 1].end = e;
        return n;
    }
    if (n >= p->opt->max_turns) return -1;
    cand[n] = (entry){ti, s, e};
    return n + 1;
}

static drama_status pack_range(packer *p, int ti, size_t s, size_t e, int level, drama_error *err) {
    entry cand[64];
    for (size_t pos = s; pos < e;) {
        size_t u = unit_end(p->text, e, pos, level);
        int n = extend(p, cand, ti, pos, u);
        int ok = n > 0 ? fits(p, cand, n, err) : 0;
        if (ok < 0) return err ? err->code : DRAMA_EINTERNAL;
        if (!ok && p->n_cur > 0) { /* close the open batch and try again on an empty one */
            drama_status st = close_batch(p, err);
            if (st) return st;
            n = extend(p, cand, ti, pos, u);
            ok = fits(p, cand, n, err);
            if (ok < 0) return err ? err->code : DRAMA_EINTERNAL;
        }
        int finer = level + 1; /* the first finer level that actually divides this unit */
        while (!ok && finer <= 3 && unit_end(p->text, u, pos, finer) >= u) finer++;
        if (!ok && finer <= 3) {
            drama_status st = pack_range(p, ti, pos, u, finer, err);
            if (st) return st;
            pos = u;
            continue;
        }
        /* fits, or indivisible and over budget: then it is a batch of its own */
        memcpy(p->cur, cand, (size_t)n * sizeof *cand);
        p->n_cur = n;
        if (!ok) {
            drama_status st = close_batch(p, err);
            if (st) return st;
        }
        pos = u;
    }
    return DRAMA_OK;
}

drama_status dr_chunk_text(dr_tok *tok, const char *text, size_t len, const dr_chunk_options *opt, dr_chunks *out,
                           drama_error *err) {
    memset(out, 0, sizeof *out);
    dr_chunk_options def;
    if (!opt) {
        dr_chunk_options_default(&def);
        opt = &def;
    }
    if (opt->max_turns < 1 || opt->max_turns > 64 || opt->max_tokens < 0 || opt->max_bytes < 0)
        return dr_fail(err, DRAMA_EINVAL, "chunk: invalid options (max_turns %d, max_tokens %lld, max_bytes %lld)",
                       opt->max_turns, (long long)opt->max_tokens, (long long)opt->max_bytes);
    drama_status st = dr_prompt_validate_text(tok, text, len, "text", err);
    if (st) return st;

    /* turns: split at valid speaker tags; the text before the first tag is a turn of its own */
    static const char default_tag[] = "<|speaker:0|>";
    size_t cap = 8, n_turns = 0;
    turn *turns = malloc(cap * sizeof *turns);
    if (!turns) return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
    turn cur = {opt->default_speaker_tag ? default_tag : NULL, opt->default_speaker_tag ? sizeof default_tag - 1 : 0, 0, 0};
    for (size_t pos = 0;; pos++) {
        size_t tag = pos < len && text[pos] == '<' ? dr_prompt_speaker_tag_at(text, len, pos, NULL) : 0;
        if (!tag && pos < len) continue;
        cur.end = pos;
        cur.start = tok_skip_space(text, cur.end, cur.start);
        int keep = cur.start < cur.end && tok_skip_space(text, cur.end, cur.start) < cur.end;
        if (keep && n_turns == cap) {
            turn *g = realloc(turns, cap * 2 * sizeof *turns);
            if (!g) {
                free(turns);
                return dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
            }
            turns = g;
            cap *= 2;
        }
        if (keep) turns[n_turns++] = cur; /* whitespace-only turns carry no speech */
        if (pos >= len) break;
        cur = (turn){text + pos, tag, pos + tag, pos + tag};
        pos += tag - 1;
    }
    if (n_turns == 0) {
        free(turns);
        return dr_fail(err, DRAMA_EEMPTY, "empty_text: text has speaker tags but nothing to say");
    }

    packer p = {tok, opt, text, turns, NULL, 0, NULL, 0, out, 0};
    p.cur = malloc((size_t)(opt->max_turns + 1) * sizeof *p.cur);
    if (!p.cur) st = dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");

    /* a text that fits one batch is kept exactly as written */
    if (!st && n_turns <= (size_t)opt->max_turns) {
        dr_ids ids = {0};
        st = opt->max_tokens > 0 ? dr_tok_encode(tok, text, len, &ids, err) : DRAMA_OK;
        int whole = !st && (opt->max_tokens == 0 || ids.n <= opt->max_tokens) &&
                    (opt->max_bytes == 0 || (int64_t)len <= opt->max_bytes);
        dr_ids_free(&ids);
        if (whole) {
            out->text = malloc(sizeof *out->text);
            out->len = malloc(sizeof *out->len);
            char *copy = malloc(len + 1);
            if (!out->text || !out->len || !copy) {
                free(copy);
                st = dr_fail(err, DRAMA_ENOMEM, "chunk: out of memory");
            } else {
                memcpy(copy, text, len);
                copy[len] = '\0';
                out->text[0] = copy;
                out->len[0] = len;
                out->n = 1;
            }
            goto done;
        }
    }
    for (size_t i = 0; !st && i < n_turns; i++) st = pack_range(&p, (int)i, turns[i].start, turns[i].end, 0, err);
    if (!st) st = close_batch(&p, err);
done:
    free(p.cur);
    free(p.buf);
    free(turns);
    if (st) dr_chunks_free(out);
    return st;
}
