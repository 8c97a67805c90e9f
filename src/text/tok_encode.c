/* tok_encode.c - encoding (spec/TEXT.md section 1.2), decoding, and the bounded piece cache. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"

/* ---------------------------------------------------------------- id lists */

drama_status dr_ids_append(dr_ids *ids, const int32_t *src, int64_t n, drama_error *err) {
    if (n <= 0) return DRAMA_OK;
    if (ids->n + n > ids->cap) {
        int64_t cap = ids->cap ? ids->cap : 64;
        while (cap < ids->n + n) cap *= 2;
        int32_t *grown = realloc(ids->data, (size_t)cap * sizeof *grown);
        if (!grown) return dr_fail(err, DRAMA_ENOMEM, "token ids: out of memory (%lld ids)", (long long)cap);
        ids->data = grown;
        ids->cap = cap;
    }
    memcpy(ids->data + ids->n, src, (size_t)n * sizeof *src);
    ids->n += n;
    return DRAMA_OK;
}

drama_status dr_ids_push(dr_ids *ids, int32_t id, drama_error *err) { return dr_ids_append(ids, &id, 1, err); }

void dr_ids_free(dr_ids *ids) {
    if (!ids) return;
    free(ids->data);
    memset(ids, 0, sizeof *ids);
}

/* ---------------------------------------------------------------- UTF-8 */

/* Maximal-subpart rule (Unicode / WHATWG), the same as the reference library's lossy decoding. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, int *bad_len) {
    unsigned b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b >= 0xC2 && b <= 0xDF) need = 1, v = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, v = b & 0x0F, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, v = b & 0x07, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else {
        *bad_len = 1;
        return 0;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n || s[i] < lo || s[i] > hi) {
            *bad_len = i;
            return 0;
        }
        v = v << 6 | (s[i] & 0x3F);
        lo = 0x80, hi = 0xBF;
    }
    *cp = v;
    return need + 1;
}

drama_status dr_utf8_check(const char *text, size_t len, const char *what, drama_error *err) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int bad, k = tok_utf8_next(s + i, len - i, &cp, &bad);
        if (!k)
            return dr_fail(err, DRAMA_EINVAL, "%s: invalid UTF-8 at byte offset %zu (byte 0x%02X)", what ? what : "text",
                           i, s[i]);
        i += (size_t)k;
    }
    return DRAMA_OK;
}

int tok_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t tok_skip_space(const char *text, size_t len, size_t pos) {
    while (pos < len) {
        uint32_t cp;
        int bad, k = tok_utf8_next((const unsigned char *)text + pos, len - pos, &cp, &bad);
        if (!k || !tok_is_space(cp)) break;
        pos += (size_t)k;
    }
    return pos;
}

static int is_word_char(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) || c == '_';
}

/* Start of the code point that ends just before s[i] (i > 0). */
static size_t prev_char(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

static uint32_t char_at(const char *s, size_t len, size_t i) {
    uint32_t cp = 0;
    int bad;
    if (!tok_utf8_next((const unsigned char *)s + i, len - i, &cp, &bad)) cp = 0xFFFD;
    return cp;
}

/* ---------------------------------------------------------------- added tokens */

/* Longest added token at text[pos] that satisfies its single_word rule; index into tok->added. */
static int64_t match_added_at(const dr_tok *tok, const char *text, size_t len, size_t pos) {
    if (!tok->added_first[(unsigned char)text[pos]]) return -1;
    for (int k = 0; k < tok->n_added_lens; k++) {
        size_t l = tok->added_lens[k];
        int32_t idx;
        if (l > len - pos || !tok_strmap_get(&tok->added_map, text + pos, l, &idx)) continue;
        const tok_added *t = &tok->added[idx];
        if (t->single_word && ((pos > 0 && is_word_char(char_at(text, len, prev_char(text, pos)))) ||
                               (pos + l < len && is_word_char(char_at(text, len, pos + l)))))
            continue;
        return idx;
    }
    return -1;
}

int dr_tok_match_added(const dr_tok *tok, const char *text, size_t len, size_t pos, int32_t *id, size_t *match_len) {
    if (pos >= len) return 0;
    int64_t idx = match_added_at(tok, text, len, pos);
    if (idx < 0) return 0;
    if (id) *id = tok->added[idx].id;
    if (match_len) *match_len = tok->added[idx].len;
    return 1;
}

/* ---------------------------------------------------------------- BPE of one piece */

typedef struct merge_entry {
    int32_t rank, pos, left, right, merged;
} merge_entry;

static int entry_less(const merge_entry *a, const merge_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(merge_entry *heap, int64_t *n, merge_entry e) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!entry_less(&e, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = e;
}

static merge_entry heap_pop(merge_entry *heap, int64_t *n) {
    merge_entry top = heap[0], last = heap[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && entry_less(&heap[c + 1], &heap[c])) c++;
        if (!entry_less(&heap[c], &last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0) heap[i] = last;
    return top;
}

static void push_pair(const dr_tok *tok, merge_entry *heap, int64_t *n, const int32_t *id, int32_t pos, int32_t right) {
    int32_t rank, merged;
    if (tok_pair_get(tok, id[pos], id[right], &rank, &merged))
        heap_push(heap, n, (merge_entry){rank, pos, id[pos], id[right], merged});
}

/* Merge by rank with a priority queue: O(n log n) even for very long pieces. Symbols are a
 * linked list over the piece's bytes (each byte starts as one symbol: the byte-level map is 1:1);
 * stale queue entries are skipped by checking that the pair is still the one queued. */
static drama_status bpe_piece(const dr_tok *tok, const unsigned char *s, size_t n, dr_ids *out, drama_error *err) {
    if (tok->ignore_merges) {
        char stack[512];
        char *mapped = n * 2 < sizeof stack ? stack : malloc(n * 2 + 1);
        if (!mapped) return dr_fail(err, DRAMA_ENOMEM, "tokenizer: out of memory");
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(mapped + m, tok->byte_char[s[i]], tok->byte_char_len[s[i]]);
            m += tok->byte_char_len[s[i]];
        }
        int32_t whole;
        int found = tok_strmap_get(&tok->vocab, mapped, m, &whole);
        if (mapped != stack) free(mapped);
        if (found) return dr_ids_push(out, whole, err);
    }
    enum { SMALL = 64 };
    int32_t id_s[SMALL], next_s[SMALL], prev_s[SMALL];
    merge_entry heap_s[3 * SMALL];
    int32_t *id = id_s, *next = next_s, *prev = prev_s;
    merge_entry *heap = heap_s;
    void *block = NULL;
    if (n > SMALL) {
        if (n > (size_t)INT32_MAX / 4) return dr_fail(err, DRAMA_ENOMEM, "tokenizer: piece of %zu bytes too long", n);
        block = malloc(n * (3 * sizeof(int32_t) + 3 * sizeof(merge_entry)));
        if (!block) return dr_fail(err, DRAMA_ENOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
        heap = block;
        id = (int32_t *)(heap + 3 * n);
        next = id + n;
        prev = next + n;
    }
    drama_status st = DRAMA_OK;
    for (size_t i = 0; i < n; i++) {
        id[i] = tok->byte_id[s[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
        if (id[i] < 0) {
            st = dr_fail(err, DRAMA_EFORMAT, "tokenizer: byte 0x%02X has no vocabulary entry (\"%.*s\")", s[i],
                         (int)tok->byte_char_len[s[i]], tok->byte_char[s[i]]);
            goto done;
        }
    }
    int64_t nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(tok, heap, &nheap, id, (int32_t)i, (int32_t)i + 1);
    while (nheap > 0) {
        merge_entry e = heap_pop(heap, &nheap);
        int32_t r = next[e.pos];
        if (id[e.pos] != e.left || r < 0 || id[r] != e.right) continue; /* stale */
        id[e.pos] = e.merged;
        id[r] = -1;
        next[e.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = e.pos;
        if (prev[e.pos] >= 0) push_pair(tok, heap, &nheap, id, prev[e.pos], e.pos);
        if (next[e.pos] >= 0) push_pair(tok, heap, &nheap, id, e.pos, next[e.pos]);
    }
    for (int32_t i = n ? 0 : -1; i >= 0 && !st; i = next[i]) st = dr_ids_push(out, id[i], err);
done:
    free(block);
    return st;
}

/* ---------------------------------------------------------------- piece cache */

enum { CACHE_MAX_PIECE = 256, CACHE_MAX_POOL = 1 << 22 };

static drama_status encode_piece(dr_tok *tok, const char *s, size_t n, dr_ids *out, drama_error *err) {
    int cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        pthread_mutex_lock(&tok->cache_lock);
        int32_t idx;
        drama_status st = DRAMA_OK;
        int hit = tok_strmap_get(&tok->cache, s, n, &idx);
        if (hit) st = dr_ids_append(out, tok->cache_pool + tok->cache_entries[idx].offset, tok->cache_entries[idx].n, err);
        pthread_mutex_unlock(&tok->cache_lock);
        if (hit) return st;
    }
    int64_t start = out->n;
    drama_status st = bpe_piece(tok, (const unsigned char *)s, n, out, err);
    if (st || !cacheable) return st;
    int64_t count = out->n - start;
    pthread_mutex_lock(&tok->cache_lock);
    if (tok->cache.count >= TOK_CACHE_MAX || tok->cache_pool_n + count > CACHE_MAX_POOL) {
        tok_strmap_clear(&tok->cache);
        tok->cache_pool_n = 0;
    }
    if (!tok->cache_entries) tok->cache_entries = malloc(TOK_CACHE_MAX * sizeof *tok->cache_entries);
    if (!tok->cache_pool) {
        tok->cache_pool = malloc(CACHE_MAX_POOL * sizeof *tok->cache_pool);
        tok->cache_pool_cap = CACHE_MAX_POOL;
    }
    /* A failed cache allocation only costs speed. */
    int32_t idx = (int32_t)tok->cache.count, existing;
    /* another thread may have cached the same piece meanwhile: keep its entry */
    if (tok->cache_entries && tok->cache_pool && !tok_strmap_get(&tok->cache, s, n, &existing)) {
        if (tok_strmap_put(&tok->cache, s, n, idx)) {
            tok->cache_entries[idx] = (tok_cache_entry){tok->cache_pool_n, (int32_t)count};
            memcpy(tok->cache_pool + tok->cache_pool_n, out->data + start, (size_t)count * sizeof(int32_t));
            tok->cache_pool_n += count;
        }
    }
    pthread_mutex_unlock(&tok->cache_lock);
    return DRAMA_OK;
}

void dr_tok_clear_cache(dr_tok *tok) {
    pthread_mutex_lock(&tok->cache_lock);
    tok_strmap_clear(&tok->cache);
    tok->cache_pool_n = 0;
    pthread_mutex_unlock(&tok->cache_lock);
}

/* ---------------------------------------------------------------- stretches between added tokens */

/* NFC quick check: 1 when no code point of the stretch can change under NFC, so normalisation
 * (the most expensive step for non-Latin text) can be skipped. tok->nfc_unstable marks the code
 * points that may change (built at load, see tok_build_nfc_table). */
static int nfc_stable(const dr_tok *tok, const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int bad, k = tok_utf8_next(s + i, len - i, &cp, &bad);
        if (!k || (tok->nfc_unstable[cp >> 3] >> (cp & 7) & 1)) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* A code point may change under NFC, alone or with its neighbours, when it has a non-zero
 * combining class, can be the second half of a composition (utf8proc marks those with
 * comb_index >= 0x8000; Hangul jamo compose by rule), or is not its own NFC (singletons,
 * excluded compositions). A precomposed letter such as U+00E9 is stable: anything that could
 * combine with it is itself marked. (Checked exhaustively against utf8proc when written.) */
uint8_t *tok_nfc_table(void) {
    uint8_t *table = calloc(0x110000 / 8, 1);
    if (!table) return NULL;
    for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        int unstable = (cp >= 0x1100 && cp <= 0x11FF) || p->combining_class != 0 ||
                       (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000);
        if (!unstable && p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
            utf8proc_int32_t out[8];
            utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, out, 8, UTF8PROC_DECOMPOSE, NULL);
            /* recompose the decomposition; stable iff it gives the code point back */
            if (n > 0 && n <= 8) {
                utf8proc_ssize_t m = utf8proc_normalize_utf32(out, n, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
                unstable = !(m == 1 && out[0] == (utf8proc_int32_t)cp);
            } else {
                unstable = 1;
            }
        }
        if (unstable) table[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    return table;
}

drama_status tok_build_nfc_table(dr_tok *tok, drama_error *err) {
    if (!tok->nfc_unstable) tok->nfc_unstable = tok_nfc_table();
    return tok->nfc_unstable ? DRAMA_OK : dr_fail(err, DRAMA_ENOMEM, "tokenizer: out of memory");
}

static drama_status encode_stretch(dr_tok *tok, const char *text, size_t len, pcre2_match_data *md, dr_ids *out,
                                   drama_error *err) {
    if (len == 0) return DRAMA_OK;
    char *norm = NULL;
    const char *s = text;
    size_t n = len;
    if (tok->nfc) {
        if (!nfc_stable(tok, text, len)) {
            utf8proc_uint8_t *mapped = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &mapped,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0) return dr_fail(err, DRAMA_EINVAL, "NFC normalisation failed: %s", utf8proc_errmsg(r));
            norm = (char *)mapped;
            s = norm;
            n = (size_t)r;
        }
    }
    drama_status st = DRAMA_OK;
    size_t gap = 0, at = 0;
    while (at < n && !st) {
        int rc = pcre2_match(tok->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter has a heap stack */
            rc = pcre2_match(tok->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = dr_fail(err, DRAMA_EINVAL, "tokenizer: split pattern failed at byte %zu: %s", at, msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match: skip one code point, it stays in the gap */
            if (ms >= n) break;
            at = ms + 1;
            while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > gap) st = encode_piece(tok, s + gap, ms - gap, out, err);
        if (!st) st = encode_piece(tok, s + ms, me - ms, out, err);
        gap = at = me;
    }
    if (!st && gap < n) st = encode_piece(tok, s + gap, n - gap, out, err);
    free(norm);
    return st;
}

drama_status dr_tok_encode(dr_tok *tok, const char *text, size_t len, dr_ids *out, drama_error *err) {
    drama_status st = dr_utf8_check(text, len, "text", err);
    if (st) return st;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(tok->re, NULL);
    if (!md) return dr_fail(err, DRAMA_ENOMEM, "tokenizer: out of memory");
    size_t stretch = 0, pos = 0;
    while (pos < len && !st) {
        int64_t idx = match_added_at(tok, text, len, pos);
        if (idx < 0) {
            pos++;
            continue;
        }
        const tok_added *t = &tok->added[idx];
        size_t left = pos, right = pos + t->len;
        if (t->lstrip) /* absorb whitespace before the match into it */
            while (left > stretch && tok_is_space(char_at(text, len, prev_char(text, left))))
                left = prev_char(text, left);
        if (t->rstrip) right = tok_skip_space(text, len, right); /* and whitespace after it */
        st = encode_stretch(tok, text + stretch, left - stretch, md, out, err);
        if (!st) st = dr_ids_push(out, t->id, err);
        pos = stretch = right;
    }
    if (!st) st = encode_stretch(tok, text + stretch, len - stretch, md, out, err);
    pcre2_match_data_free(md);
    return st;
}

/* ---------------------------------------------------------------- decoding */

drama_status dr_tok_decode(const dr_tok *tok, const int32_t *ids, int64_t n, char **out, size_t *out_len,
                           drama_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t cap = 64, len = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *t = dr_tok_token(tok, ids[i]);
        if (!t) return dr_fail(err, DRAMA_EINVAL, "ids[%lld] = %d: no such token", (long long)i, (int)ids[i]);
        cap += strlen(t);
    }
    unsigned char *bytes = malloc(cap);
    if (!bytes) return dr_fail(err, DRAMA_ENOMEM, "decode: out of memory");
    for (int64_t i = 0; i < n; i++) {
        /* Every character goes back through the byte table; a token holding a character outside
         * it (an added token with a raw space, say) is copied as it is, as the reference does. */
        const char *t = dr_tok_token(tok, ids[i]);
        size_t tl = strlen(t), start = len, j = 0;
        while (j < tl) {
            uint32_t cp;
            int bad, k = tok_utf8_next((const unsigned char *)t + j, tl - j, &cp, &bad);
            if (!k || cp >= 0x144 || tok->cp_byte[cp] < 0) break;
            bytes[len++] = (unsigned char)tok->cp_byte[cp];
            j += (size_t)k;
        }
        if (j < tl) {
            memcpy(bytes + start, t, tl);
            len = start + tl;
        }
    }
    /* Lossy UTF-8: each maximal invalid subpart becomes U+FFFD (3 bytes, never more than 3x). */
    char *text = malloc(len * 3 + 1);
    if (!text) {
        free(bytes);
        return dr_fail(err, DRAMA_ENOMEM, "decode: out of memory");
    }
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int bad, k = tok_utf8_next(bytes + i, len - i, &cp, &bad);
        if (k) {
            memcpy(text + o, bytes + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(text + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)bad;
        }
    }
    text[o] = '\0';
    free(bytes);
    *out = text;
    if (out_len) *out_len = o;
    return DRAMA_OK;
}
