/* tokenizer.c - loading tokenizer.json (spec/TEXT.md section 1.1) and id/string lookups.
 * Encoding and decoding are in tok_encode.c. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/file.h"
#include "text/tok_internal.h"

/* ---------------------------------------------------------------- string map */

uint32_t tok_hash(const char *s, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

int tok_strmap_get(const tok_strmap *m, const char *key, size_t len, int32_t *val) {
    if (!m->cap) return 0;
    uint32_t h = tok_hash(key, len);
    for (uint32_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const tok_strmap_slot *s = &m->slots[i];
        if (!s->key) return 0;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            *val = s->val;
            return 1;
        }
    }
}

static int strmap_grow(tok_strmap *m) {
    uint32_t cap = m->cap ? m->cap * 2 : 64;
    if (cap < m->cap) return 0;
    tok_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return 0;
    for (uint32_t j = 0; j < m->cap; j++) {
        tok_strmap_slot *s = &m->slots[j];
        if (!s->key) continue;
        uint32_t i = s->hash & (cap - 1);
        while (slots[i].key) i = (i + 1) & (cap - 1);
        slots[i] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 1;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val) {
    if (len > UINT32_MAX) return 0;
    if ((uint64_t)(m->count + 1) * 4 > (uint64_t)m->cap * 3 && !strmap_grow(m)) return 0;
    uint32_t h = tok_hash(key, len);
    uint32_t i = h & (m->cap - 1);
    for (; m->slots[i].key; i = (i + 1) & (m->cap - 1)) {
        tok_strmap_slot *s = &m->slots[i];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return 1;
        }
    }
    char *copy = malloc(len + 1);
    if (!copy) return 0;
    memcpy(copy, key, len);
    copy[len] = '\0';
    m->slots[i] = (tok_strmap_slot){copy, (uint32_t)len, h, val};
    m->count++;
    return 1;
}

void tok_strmap_clear(tok_strmap *m) {
    for (uint32_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- merge table */

static uint64_t pair_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

int tok_pair_get(const dr_tok *tok, int32_t left, int32_t right, int32_t *rank, int32_t *merged) {
    if (!tok->pair_cap) return 0;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = pair_hash(key) & (tok->pair_cap - 1);; i = (i + 1) & (tok->pair_cap - 1)) {
        const tok_pair_slot *s = &tok->pairs[i];
        if (s->key == TOK_PAIR_EMPTY) return 0;
        if (s->key == key) {
            *rank = s->rank;
            *merged = s->merged;
            return 1;
        }
    }
}

/* Later duplicates overwrite earlier ones, as the reference library's map does. */
static void pair_put(dr_tok *tok, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t i = pair_hash(key) & (tok->pair_cap - 1);
    while (tok->pairs[i].key != TOK_PAIR_EMPTY && tok->pairs[i].key != key) i = (i + 1) & (tok->pair_cap - 1);
    tok->pairs[i] = (tok_pair_slot){key, rank, merged};
}

/* ---------------------------------------------------------------- byte-level map */

/* Bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves; the other 68 to U+0100.. in order. */
static void build_byte_map(dr_tok *tok) {
    int next = 0x100;
    for (int i = 0; i < 0x144; i++) tok->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = keep ? b : next++;
        tok->cp_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            tok->byte_char[b][0] = (char)cp;
            tok->byte_char_len[b] = 1;
        } else {
            tok->byte_char[b][0] = (char)(0xC0 | (cp >> 6));
            tok->byte_char[b][1] = (char)(0x80 | (cp & 0x3F));
            tok->byte_char_len[b] = 2;
        }
    }
}

/* ---------------------------------------------------------------- loading */

static drama_status set_id_str(dr_tok *tok, int32_t id, const char *s, size_t len, drama_error *err) {
    char *copy = malloc(len + 1);
    if (!copy) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    memcpy(copy, s, len);
    copy[len] = '\0';
    free(tok->id_str[id]);
    tok->id_str[id] = copy;
    return DRAMA_OK;
}

/* A flag that must be absent, null, false or "" (the unsupported BPE options). */
static int is_off(json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && json_string_length(v) == 0);
}

static drama_status check_normalizer(dr_tok *tok, json_t *norm, const char *path, drama_error *err) {
    if (!norm || json_is_null(norm)) return DRAMA_OK;
    const char *type = json_string_value(json_object_get(norm, "type"));
    if (type && strcmp(type, "NFC") == 0) {
        tok->nfc = 1;
        return DRAMA_OK;
    }
    json_t *list = json_object_get(norm, "normalizers");
    if (type && strcmp(type, "Sequence") == 0 && json_is_array(list)) {
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            drama_status st = check_normalizer(tok, json_array_get(list, i), sub, err);
            if (st) return st;
        }
        return DRAMA_OK;
    }
    return dr_fail(err, DRAMA_EUNSUPPORTED, "%s: unsupported normalizer type \"%s\" (accepted: null, NFC, Sequence)",
                   path, type ? type : "?");
}

/* Sequence[Split{Regex, Isolated, invert false}, ByteLevel{add_prefix_space false, use_regex false}]. */
static drama_status check_pre_tokenizer(dr_tok *tok, json_t *pre, drama_error *err) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    json_t *list = json_object_get(pre, "pretokenizers");
    if (!type || strcmp(type, "Sequence") != 0 || !json_is_array(list) || json_array_size(list) != 2)
        return dr_fail(err, DRAMA_EUNSUPPORTED,
                       "pre_tokenizer: unsupported (accepted: a Sequence of a regex Split and a ByteLevel)");
    json_t *split = json_array_get(list, 0), *byte_level = json_array_get(list, 1);
    const char *t0 = json_string_value(json_object_get(split, "type"));
    if (!t0 || strcmp(t0, "Split") != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].type: expected \"Split\"");
    const char *pattern = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    if (!pattern)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": ...}");
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior: expected \"Isolated\"");
    if (!is_off(json_object_get(split, "invert")))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].invert: expected false");
    const char *t1 = json_string_value(json_object_get(byte_level, "type"));
    if (!t1 || strcmp(t1, "ByteLevel") != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1].type: expected \"ByteLevel\"");
    if (!is_off(json_object_get(byte_level, "add_prefix_space")))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1].add_prefix_space: expected false");
    if (!is_off(json_object_get(byte_level, "use_regex")))
        return dr_fail(err, DRAMA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1].use_regex: expected false");
    tok->pattern = strdup(pattern);
    if (!tok->pattern) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    return DRAMA_OK;
}

/* PCRE2 with UCP makes \s also match U+180E, which the reference engine (Oniguruma) does not;
 * rewrite \s and \S to the exact Oniguruma set so both engines produce identical pieces. */
#define ONIG_SPACE "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static char *translate_pattern(const char *p) {
    /* a two-byte escape grows to at most sizeof ONIG_SPACE + 3 bytes: 64 per input byte is enough */
    size_t n = strlen(p), cap = n * 64 + 256;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            i++;
            if (e == 's' && in_class) o += sprintf(o, "%s", ONIG_SPACE);
            else if (e == 's') o += sprintf(o, "[%s]", ONIG_SPACE);
            else if (e == 'S' && !in_class) o += sprintf(o, "[^%s]", ONIG_SPACE);
            else {
                *o++ = '\\';
                *o++ = e;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            *o++ = c;
            if (p[i + 1] == '^') *o++ = p[++i];
            if (p[i + 1] == ']') *o++ = p[++i]; /* a leading ] is literal */
            continue;
        }
        if (in_class && c == '[' && p[i + 1] == ':') { /* POSIX [:name:] inside a class */
            const char *end = strstr(p + i + 2, ":]");
            if (end) {
                size_t k = (size_t)(end + 2 - (p + i));
                memcpy(o, p + i, k);
                o += k;
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        *o++ = c;
    }
    *o = '\0';
    return out;
}

static drama_status compile_pattern(dr_tok *tok, drama_error *err) {
    char *translated = translate_pattern(tok->pattern);
    if (!translated) return dr_fail(err, DRAMA_ENOMEM, "out of memory");
    int code;
    PCRE2_SIZE offset;
    tok->re = pcre2_compile((PCRE2_SPTR)translated, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                            &code, &offset, NULL);
    free(translated);
    if (!tok->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return dr_fail(err, DRAMA_EFORMAT, "pre_tokenizer.pretokenizers[0].pattern.Regex: does not compile: %s", msg);
    }
    pcre2_jit_compile(tok->re, PCRE2_JIT_COMPLETE); /* optional speed-up; the interpreter is the fallback */
    return DRAMA_OK;
}

static drama_status load_vocab(dr_tok *tok, json_t *vocab, drama_error *err) {
    if (!json_is_object(vocab)) return dr_fail(err, DRAMA_EFORMAT, "model.vocab: expected an object token -> id");
    const char *key;
    json_t *v;
    int64_t max_id = -1;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= TOK_MAX_ID)
            return dr_fail(err, DRAMA_EFORMAT, "model.vocab[\"%.64s\"]: expected an id in 0..%d", key, TOK_MAX_ID - 1);
        if (id > max_id) max_id = id;
    }
    tok->n_ids = max_id + 1;
    tok->n_vocab = (int64_t)json_object_size(vocab);
    return DRAMA_OK;
}

static drama_status load_added(dr_tok *tok, json_t *added, drama_error *err) {
    if (!added || json_is_null(added)) return DRAMA_OK;
    if (!json_is_array(added)) return dr_fail(err, DRAMA_EFORMAT, "added_tokens: expected an array");
    tok->n_added = (int64_t)json_array_size(added);
    tok->added = calloc((size_t)tok->n_added + 1, sizeof *tok->added);
    if (!tok->added) return dr_fail(err, DRAMA_ENOMEM, "added_tokens: out of memory");
    for (int64_t i = 0; i < tok->n_added; i++) {
        json_t *a = json_array_get(added, (size_t)i), *id = json_object_get(a, "id");
        json_t *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_ID)
            return dr_fail(err, DRAMA_EFORMAT, "added_tokens[%lld].id: expected an integer in 0..%d", (long long)i,
                           TOK_MAX_ID - 1);
        if (!json_is_string(content) || json_string_length(content) == 0)
            return dr_fail(err, DRAMA_EFORMAT, "added_tokens[%lld].content: expected a non-empty string", (long long)i);
        tok_added *t = &tok->added[i];
        t->len = json_string_length(content);
        t->content = malloc(t->len + 1);
        if (!t->content) return dr_fail(err, DRAMA_ENOMEM, "added_tokens: out of memory");
        memcpy(t->content, json_string_value(content), t->len + 1);
        if (dr_utf8_check(t->content, t->len, "added token content", NULL) != DRAMA_OK || memchr(t->content, 0, t->len))
            return dr_fail(err, DRAMA_EFORMAT, "added_tokens[%lld].content: invalid UTF-8 or NUL", (long long)i);
        t->id = (int32_t)json_integer_value(id);
        t->special = json_is_true(json_object_get(a, "special"));
        t->single_word = json_is_true(json_object_get(a, "single_word"));
        t->lstrip = json_is_true(json_object_get(a, "lstrip"));
        t->rstrip = json_is_true(json_object_get(a, "rstrip"));
        t->normalized = json_is_true(json_object_get(a, "normalized"));
        if (t->id >= tok->n_ids) tok->n_ids = t->id + 1;
    }
    return DRAMA_OK;
}

static drama_status load_merges(dr_tok *tok, json_t *merges, drama_error *err) {
    if (!json_is_array(merges)) return dr_fail(err, DRAMA_EFORMAT, "model.merges: expected an array");
    size_t n = json_array_size(merges);
    if (n >= (size_t)INT32_MAX) return dr_fail(err, DRAMA_EFORMAT, "model.merges: too many merges");
    tok->n_merges = (int64_t)n;
    uint64_t cap = 64;
    while (cap < (uint64_t)n * 2) cap *= 2;
    tok->pairs = malloc(cap * sizeof *tok->pairs);
    if (!tok->pairs) return dr_fail(err, DRAMA_ENOMEM, "model.merges: out of memory");
    for (uint64_t i = 0; i < cap; i++) tok->pairs[i].key = TOK_PAIR_EMPTY;
    tok->pair_cap = cap;
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (json_is_string(m)) { /* "a b": exactly one space (tokens never hold a raw space) */
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (sp && !strchr(sp + 1, ' ') && sp != s && sp[1]) {
                a = s;
                alen = (size_t)(sp - s);
                b = sp + 1;
                blen = strlen(b);
            }
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        }
        if (!a) return dr_fail(err, DRAMA_EFORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
        int32_t ia = 0, ib = 0, im = 0;
        int has_a = tok_strmap_get(&tok->vocab, a, alen, &ia), has_b = tok_strmap_get(&tok->vocab, b, blen, &ib);
        if (!has_a || !has_b)
            return dr_fail(err, DRAMA_EFORMAT, "model.merges[%zu]: token \"%.*s\" not in model.vocab", i,
                           (int)(has_a ? blen : alen), has_a ? b : a);
        if (alen + blen >= sizeof buf)
            return dr_fail(err, DRAMA_EFORMAT, "model.merges[%zu]: merged token too long", i);
        memcpy(buf, a, alen);
        memcpy(buf + alen, b, blen);
        if (!tok_strmap_get(&tok->vocab, buf, alen + blen, &im))
            return dr_fail(err, DRAMA_EFORMAT, "model.merges[%zu]: merged token \"%.*s\" not in model.vocab", i,
                           (int)(alen + blen), buf);
        pair_put(tok, ia, ib, (int32_t)i, im);
    }
    return DRAMA_OK;
}

static drama_status load_model(dr_tok *tok, json_t *model, drama_error *err) {
    if (!json_is_object(model)) return dr_fail(err, DRAMA_EFORMAT, "model: expected an object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "model.type: \"%s\" is not supported (expected \"BPE\")",
                       type ? type : "(missing)");
    static const char *off[] = {"byte_fallback", "continuing_subword_prefix", "end_of_word_suffix",
                                "dropout",       "unk_token",                 "fuse_unk"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (!is_off(json_object_get(model, off[i])))
            return dr_fail(err, DRAMA_EUNSUPPORTED, "model.%s: unsupported value (expected false, null or empty)", off[i]);
    json_t *ignore = json_object_get(model, "ignore_merges");
    if (ignore && !json_is_boolean(ignore))
        return dr_fail(err, DRAMA_EFORMAT, "model.ignore_merges: expected a boolean");
    tok->ignore_merges = json_is_true(ignore);
    return load_vocab(tok, json_object_get(model, "vocab"), err);
}

/* Build the id tables once the vocabulary size (including added ids) is known. */
static drama_status build_tables(dr_tok *tok, json_t *vocab, drama_error *err) {
    tok->id_str = calloc((size_t)tok->n_ids + 1, sizeof *tok->id_str);
    if (!tok->id_str) return dr_fail(err, DRAMA_ENOMEM, "model.vocab: out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        size_t len = strlen(key); /* jansson keys with NUL would be truncated: reject them below */
        int32_t id = (int32_t)json_integer_value(v);
        if (!tok_strmap_put(&tok->vocab, key, len, id)) return dr_fail(err, DRAMA_ENOMEM, "model.vocab: out of memory");
        drama_status st = set_id_str(tok, id, key, len, err);
        if (st) return st;
    }
    for (int64_t i = 0; i < tok->n_added; i++) {
        tok_added *t = &tok->added[i];
        if (!tok_strmap_put(&tok->added_map, t->content, t->len, (int32_t)i))
            return dr_fail(err, DRAMA_ENOMEM, "added_tokens: out of memory");
        drama_status st = set_id_str(tok, t->id, t->content, t->len, err);
        if (st) return st;
        tok->added_first[(unsigned char)t->content[0]] = 1;
    }
    /* distinct content lengths, longest first, for longest-match lookups */
    tok->added_lens = malloc(((size_t)tok->n_added + 1) * sizeof *tok->added_lens);
    if (!tok->added_lens) return dr_fail(err, DRAMA_ENOMEM, "added_tokens: out of memory");
    for (int64_t i = 0; i < tok->n_added; i++) {
        uint32_t len = (uint32_t)tok->added[i].len;
        int j = 0;
        while (j < tok->n_added_lens && tok->added_lens[j] > len) j++;
        if (j < tok->n_added_lens && tok->added_lens[j] == len) continue;
        memmove(tok->added_lens + j + 1, tok->added_lens + j, (size_t)(tok->n_added_lens - j) * sizeof(uint32_t));
        tok->added_lens[j] = len;
        tok->n_added_lens++;
    }
    build_byte_map(tok);
    for (int b = 0; b < 256; b++) {
        int32_t id;
        tok->byte_id[b] = tok_strmap_get(&tok->vocab, tok->byte_char[b], tok->byte_char_len[b], &id) ? id : -1;
    }
    return DRAMA_OK;
}

/* the NFC bitmap built on a thread of its own while the file is read and parsed */
typedef struct nfc_pre {
    pthread_t thread;
    int started;
    uint8_t *table;
} nfc_pre;

static void *nfc_main(void *arg) {
    ((nfc_pre *)arg)->table = tok_nfc_table();
    return NULL;
}

/* joins the thread (once) and hands its table over: NULL when none or out of memory */
static uint8_t *nfc_take(nfc_pre *pre) {
    if (!pre) return NULL;
    if (pre->started) pthread_join(pre->thread, NULL);
    pre->started = 0;
    uint8_t *t = pre->table;
    pre->table = NULL;
    return t;
}

static drama_status load_json(dr_tok *tok, json_t *root, nfc_pre *pre, drama_error *err) {
    if (!json_is_object(root)) return dr_fail(err, DRAMA_EFORMAT, "expected a JSON object at the top level");
    json_t *model = json_object_get(root, "model");
    drama_status st = load_model(tok, model, err);
    if (!st) st = load_added(tok, json_object_get(root, "added_tokens"), err);
    if (!st) st = check_normalizer(tok, json_object_get(root, "normalizer"), "normalizer", err);
    if (!st) st = check_pre_tokenizer(tok, json_object_get(root, "pre_tokenizer"), err);
    if (st) return st;
    const char *dec = json_string_value(json_object_get(json_object_get(root, "decoder"), "type"));
    if (!dec || strcmp(dec, "ByteLevel") != 0)
        return dr_fail(err, DRAMA_EUNSUPPORTED, "decoder.type: \"%s\" is not supported (expected \"ByteLevel\")",
                       dec ? dec : "(missing)");
    st = build_tables(tok, json_object_get(model, "vocab"), err);
    if (!st) st = load_merges(tok, json_object_get(model, "merges"), err);
    if (!st) st = compile_pattern(tok, err);
    if (!st && tok->nfc) {
        tok->nfc_unstable = nfc_take(pre); /* NULL: built here */
        st = tok_build_nfc_table(tok, err);
    }
    return st;
}

/* gzip bytes -> plain bytes, capped so that a small hostile file cannot ask for gigabytes. */
static drama_status gunzip(const unsigned char *data, size_t size, char **out, size_t *out_len, drama_error *err) {
    const size_t limit = (size_t)1 << 30;
    size_t cap = size * 4 + 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return dr_fail(err, DRAMA_ENOMEM, "gzip: out of memory");
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
        free(buf);
        return dr_fail(err, DRAMA_ENOMEM, "gzip: cannot initialise zlib");
    }
    zs.next_in = (unsigned char *)data;
    zs.avail_in = size > UINT32_MAX ? UINT32_MAX : (uInt)size;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (len == cap) {
            if (cap >= limit) break;
            char *grown = realloc(buf, cap * 2);
            if (!grown) break;
            buf = grown;
            cap *= 2;
        }
        zs.next_out = (unsigned char *)buf + len;
        size_t room = cap - len;
        uInt given = room > UINT32_MAX ? UINT32_MAX : (uInt)room;
        zs.avail_out = given;
        rc = inflate(&zs, Z_NO_FLUSH);
        len += given - zs.avail_out;
        if (rc == Z_BUF_ERROR && zs.avail_out) break; /* input ended before the stream did */
    }
    inflateEnd(&zs);
    if (rc == Z_OK) {
        free(buf);
        return dr_fail(err, DRAMA_ENOMEM, "gzip: decompressed size over %zu bytes", limit);
    }
    if (rc != Z_STREAM_END) {
        free(buf);
        return dr_fail(err, DRAMA_EFORMAT, "gzip: corrupt or truncated stream at compressed byte %lu (zlib %d)",
                       (unsigned long)zs.total_in, rc);
    }
    *out = buf;
    *out_len = len;
    return DRAMA_OK;
}

static drama_status load_memory(const void *data, size_t size, const char *label, nfc_pre *pre, dr_tok **out,
                                drama_error *err) {
    *out = NULL;
    if (!label) label = "tokenizer.json";
    char *plain = NULL;
    size_t plain_len = size;
    const unsigned char *bytes = data;
    if (size >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) {
        drama_status st = gunzip(bytes, size, &plain, &plain_len, err);
        if (st) {
            dr_error_prefix(err, "%s: ", label);
            return st;
        }
        bytes = (const unsigned char *)plain;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes, plain_len, JSON_REJECT_DUPLICATES, &jerr);
    free(plain);
    if (!root)
        return dr_fail(err, DRAMA_EFORMAT, "%s: invalid JSON at line %d column %d (byte %d): %s", label, jerr.line,
                       jerr.column, jerr.position, jerr.text);
    dr_tok *tok = calloc(1, sizeof *tok);
    if (!tok) {
        json_decref(root);
        return dr_fail(err, DRAMA_ENOMEM, "%s: out of memory", label);
    }
    pthread_mutex_init(&tok->cache_lock, NULL);
    tok->label = strdup(label);
    drama_status st = tok->label ? load_json(tok, root, pre, err) : dr_fail(err, DRAMA_ENOMEM, "out of memory");
    json_decref(root);
    if (st) {
        dr_error_prefix(err, "%s: ", label);
        dr_tok_free(tok);
        return st;
    }
    *out = tok;
    return DRAMA_OK;
}

drama_status dr_tok_load_memory(const void *data, size_t size, const char *label, dr_tok **out, drama_error *err) {
    return load_memory(data, size, label, NULL, out, err);
}

drama_status dr_tok_load_threads(const char *path, int threads, dr_tok **out, drama_error *err) {
    *out = NULL;
    nfc_pre pre = {0};
    const char *e = getenv("DRAMA_TOK_NFC_THREAD"); /* "0": built after the parse, as with 1 thread */
    if (threads >= 2 && !(e && !strcmp(e, "0"))) pre.started = pthread_create(&pre.thread, NULL, nfc_main, &pre) == 0;
    char *data;
    size_t len;
    drama_status st = dr_read_file(path, DR_FILE_MAX_BYTES, &data, &len, err);
    if (!st) {
        st = load_memory(data, len, path, pre.started ? &pre : NULL, out, err);
        free(data);
    }
    free(nfc_take(&pre)); /* not used: the load failed or the tokenizer does no NFC */
    return st;
}

drama_status dr_tok_load(const char *path, dr_tok **out, drama_error *err) { return dr_tok_load_threads(path, 1, out, err); }

void dr_tok_free(dr_tok *tok) {
    if (!tok) return;
    if (tok->id_str)
        for (int64_t i = 0; i < tok->n_ids; i++) free(tok->id_str[i]);
    free(tok->id_str);
    tok_strmap_clear(&tok->vocab);
    tok_strmap_clear(&tok->added_map);
    for (int64_t i = 0; tok->added && i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->added_lens);
    free(tok->pairs);
    free(tok->pattern);
    free(tok->nfc_unstable);
    pcre2_code_free(tok->re);
    tok_strmap_clear(&tok->cache);
    free(tok->cache_entries);
    free(tok->cache_pool);
    pthread_mutex_destroy(&tok->cache_lock);
    free(tok->label);
    free(tok);
}

/* ---------------------------------------------------------------- lookups */

int32_t dr_tok_id(const dr_tok *tok, const char *token) {
    int32_t v;
    size_t len = strlen(token);
    if (tok_strmap_get(&tok->added_map, token, len, &v)) return tok->added[v].id;
    if (tok_strmap_get(&tok->vocab, token, len, &v)) return v;
    return -1;
}

const char *dr_tok_token(const dr_tok *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids ? tok->id_str[id] : NULL;
}

int64_t dr_tok_vocab_size(const dr_tok *tok) { return tok->n_ids; }
int64_t dr_tok_n_vocab(const dr_tok *tok) { return tok->n_vocab; }
int64_t dr_tok_n_merges(const dr_tok *tok) { return tok->n_merges; }
int64_t dr_tok_n_added(const dr_tok *tok) { return tok->n_added; }
const char *dr_tok_split_pattern(const dr_tok *tok) { return tok->pattern; }

const char *dr_tok_pattern_kind(const dr_tok *tok) {
    static const char qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                                "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char qwen35[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                                 "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (!strcmp(tok->pattern, qwen2)) return "qwen2";
    if (!strcmp(tok->pattern, qwen35)) return "qwen3.5";
    return "custom";
}

void dr_tok_added_at(const dr_tok *tok, int64_t i, const char **content, int32_t *id, int *special) {
    const tok_added *t = &tok->added[i];
    if (content) *content = t->content;
    if (id) *id = t->id;
    if (special) *special = t->special;
}
