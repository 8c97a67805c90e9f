/* tok_internal.h - the tokenizer's private state, shared by tokenizer.c (loading, lookups) and
 * tok_encode.c (encoding, decoding, the piece cache). Not part of the public interface. */
#ifndef DRAMA_TEXT_TOK_INTERNAL_H
#define DRAMA_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Ids are dense enough to index arrays; this bound keeps a hostile file from asking for huge ones. */
#define TOK_MAX_ID (1 << 24)
/* Piece cache bound: cleared when full (simple, and pieces repeat a lot within one text). */
#define TOK_CACHE_MAX 65536

/* Open-addressing map from byte strings to int32 values. Keys are owned by the map. */
typedef struct tok_strmap_slot {
    char *key;     /* NULL = empty slot */
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slots;
    uint32_t cap;   /* power of two */
    uint32_t count;
} tok_strmap;

uint32_t tok_hash(const char *s, size_t len);
int tok_strmap_get(const tok_strmap *m, const char *key, size_t len, int32_t *val);
/* Insert or overwrite; returns 0 on allocation failure. */
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t val);
void tok_strmap_clear(tok_strmap *m);

/* Merge table: (left id, right id) -> rank and merged id. */
typedef struct tok_pair_slot {
    uint64_t key;  /* left << 32 | right; TOK_PAIR_EMPTY when unused */
    int32_t rank;
    int32_t merged;
} tok_pair_slot;
#define TOK_PAIR_EMPTY UINT64_MAX

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    uint8_t special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* One cached piece: its ids live in the cache pool. */
typedef struct tok_cache_entry {
    int64_t offset;
    int32_t n;
} tok_cache_entry;

struct dr_tok {
    char *label;

    /* id -> string (vocabulary form, or added content); NULL for unused ids */
    char **id_str;
    int64_t n_ids;          /* 1 + largest id */
    int64_t n_vocab;
    tok_strmap vocab;       /* model.vocab */

    tok_added *added;
    int64_t n_added;
    tok_strmap added_map;   /* content -> index into added */
    uint8_t added_first[256];
    uint32_t *added_lens;   /* distinct content lengths, longest first */
    int n_added_lens;

    tok_pair_slot *pairs;
    uint64_t pair_cap;      /* power of two */
    int64_t n_merges;
    int ignore_merges;
    int nfc;
    uint8_t *nfc_unstable;  /* bitmap over code points that NFC may change (when nfc is set) */

    int32_t byte_id[256];   /* vocabulary id of each byte's mapped character, -1 if absent */
    char byte_char[256][4]; /* UTF-8 of each byte's mapped character */
    uint8_t byte_char_len[256];
    int16_t cp_byte[0x144]; /* mapped code point -> byte (-1: not a mapped code point) */

    char *pattern;          /* as in the file */
    pcre2_code *re;

    pthread_mutex_t cache_lock;
    tok_strmap cache;       /* piece bytes -> index into cache_entries */
    tok_cache_entry *cache_entries;
    int32_t *cache_pool;
    int64_t cache_pool_n, cache_pool_cap;
};

/* Look up a merge; returns 1 and fills rank/merged when (left, right) has one. */
int tok_pair_get(const dr_tok *tok, int32_t left, int32_t right, int32_t *rank, int32_t *merged);

/* Build nfc_unstable (tok_encode.c) unless it is already there; tok_nfc_table: the bitmap alone
 * (a pure function of utf8proc's tables, ~5 ms: built beside the JSON parse with 2+ threads),
 * NULL when out of memory. */
drama_status tok_build_nfc_table(dr_tok *tok, drama_error *err);
uint8_t *tok_nfc_table(void);

/* Decode one UTF-8 code point at s[i] (n bytes left). Returns its length (1..4) and sets *cp,
 * or 0 when the sequence is invalid (then *bad_len is the maximal invalid subpart, >= 1). */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, int *bad_len);

/* Unicode White_Space (what the reference's regex engine calls \s and Rust's char::is_whitespace):
 * the one whitespace rule of the text stage (added-token stripping, trimming, chunking). */
int tok_is_space(uint32_t c);
/* Byte offset of the first code point at or after pos that is not whitespace (len if none). */
size_t tok_skip_space(const char *text, size_t len, size_t pos);

#endif
