/* fuzz_tokenizer.c - the text front end on hostile input (libFuzzer). The first byte picks:
 *   0, 1: encode the rest (arbitrary bytes: invalid UTF-8 must fail cleanly), decode the ids
 *         back (must be valid UTF-8), and decode ids made from the raw bytes;
 *   2:    prompt validation and chunking with a small budget taken from the second byte;
 *   3:    load a tokenizer.json (plain or gzip) from the rest and encode with it.
 * The fixed tokenizer is $DRAMA_GOLDEN/tiny-drama3/tokenizer.json when available, else a small
 * byte-level one built here. Must never crash, hang or leak. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chunk.h"
#include "text/prompt.h"
#include "text/tokenizer.h"

/* All 256 byte characters, a few merges, and the Drama 3 added tokens. */
static char *builtin_tokenizer_json(void) {
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    int next = 0x100, id = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int cp = keep ? b : next++;
        char s[4] = {0};
        if (cp < 0x80) s[0] = (char)cp;
        else s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, s, json_integer(id++));
    }
    const char *pairs[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xc4\xa0", "t"}, {"o", "\xc4\xa0"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char m[16];
        snprintf(m, sizeof m, "%s%s", pairs[i][0], pairs[i][1]);
        json_object_set_new(vocab, m, json_integer(id++));
        json_array_append_new(merges, json_pack("[ss]", pairs[i][0], pairs[i][1]));
    }
    const char *names[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|voice|>"};
    for (size_t i = 0; i < 4; i++)
        json_array_append_new(added, json_pack("{sisssbsbsbsbsb}", "id", id++, "content", names[i], "special", 1,
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0));
    for (int i = 0; i < 8 + 16; i++) {
        char name[32];
        if (i < 8) snprintf(name, sizeof name, "<|semantic:%d|>", i);
        else snprintf(name, sizeof name, "<|speaker:%d|>", i - 8);
        json_array_append_new(added, json_pack("{sisssbsbsbsbsb}", "id", id++, "content", name, "special", 1,
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0));
    }
    json_t *split = json_object(), *pattern = json_object(), *byte_level = json_object(), *pre = json_object();
    json_object_set_new(pattern, "Regex",
                        json_string("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
    json_object_set_new(split, "type", json_string("Split"));
    json_object_set_new(split, "pattern", pattern);
    json_object_set_new(split, "behavior", json_string("Isolated"));
    json_object_set_new(split, "invert", json_false());
    json_object_set_new(byte_level, "type", json_string("ByteLevel"));
    json_object_set_new(pre, "type", json_string("Sequence"));
    json_object_set_new(pre, "pretokenizers", json_pack("[oo]", split, byte_level));
    json_t *model = json_object(), *root = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "model", model);
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "pre_tokenizer", pre);
    json_object_set_new(root, "decoder", json_pack("{ss}", "type", "ByteLevel"));
    char *s = root ? json_dumps(root, 0) : NULL;
    json_decref(root);
    return s;
}

static dr_tok *fixed_tokenizer(void) {
    static dr_tok *tok;
    static int tried;
    if (tried) return tok;
    tried = 1;
    const char *golden = getenv("DRAMA_GOLDEN");
    if (golden) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tiny-drama3/tokenizer.json", golden);
        if (dr_tok_load(path, &tok, NULL) == DRAMA_OK) return tok;
    }
    char *json = builtin_tokenizer_json();
    drama_error err = {0};
    if (!json || dr_tok_load_memory(json, strlen(json), "builtin", &tok, &err) != DRAMA_OK) {
        fprintf(stderr, "fuzz_tokenizer: built-in tokenizer does not load: %s\n", err.message);
        abort();
    }
    free(json);
    return tok;
}

static void check_utf8(const char *s, size_t n) {
    if (dr_utf8_check(s, n, "decoded", NULL) != DRAMA_OK) abort(); /* decode must always give valid UTF-8 */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    dr_tok *tok = fixed_tokenizer();
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int mode = data[0] % 4;
    if (mode <= 1) {
        dr_ids ids = {0};
        if (dr_tok_encode(tok, text, len, &ids, NULL) == DRAMA_OK) {
            char *back = NULL;
            size_t blen = 0;
            if (dr_tok_decode(tok, ids.data, ids.n, &back, &blen, NULL) != DRAMA_OK) abort();
            check_utf8(back, blen);
            free(back);
        }
        dr_ids_free(&ids);
        int32_t raw[64];
        int64_t n = 0;
        for (size_t i = 0; i + 2 <= len && n < 64; i += 2)
            raw[n++] = (int32_t)(((uint32_t)(uint8_t)text[i] << 8 | (uint8_t)text[i + 1]) % (uint32_t)(dr_tok_vocab_size(tok) + 4));
        char *out = NULL;
        size_t olen = 0;
        if (dr_tok_decode(tok, raw, n, &out, &olen, NULL) == DRAMA_OK) check_utf8(out, olen);
        free(out);
    } else if (mode == 2 && len >= 1) {
        dr_chunk_options opt;
        dr_chunk_options_default(&opt);
        opt.max_tokens = 1 + (uint8_t)text[0] % 40;
        opt.max_bytes = (uint8_t)text[0] & 0x80 ? 16 + (uint8_t)text[0] % 64 : 0;
        opt.max_turns = 1 + (uint8_t)text[0] % 5;
        dr_prompt_validate_text(tok, text + 1, len - 1, "text", NULL);
        dr_chunks c;
        if (dr_chunk_text(tok, text + 1, len - 1, &opt, &c, NULL) == DRAMA_OK && c.n < 1) abort();
        dr_chunks_free(&c);
    } else if (mode == 3) {
        dr_tok *t = NULL;
        if (dr_tok_load_memory(text, len, "fuzz.json", &t, NULL) == DRAMA_OK) {
            static const char sample[] = "Hello, world! 你好 <|im_start|>x\n\n  y";
            dr_ids ids = {0};
            dr_tok_encode(t, sample, sizeof sample - 1, &ids, NULL);
            char *back = NULL;
            size_t blen = 0;
            if (dr_tok_decode(t, ids.data, ids.n, &back, &blen, NULL) == DRAMA_OK) check_utf8(back, blen);
            free(back);
            dr_ids_free(&ids);
            dr_tok_free(t);
        }
    }
    return 0;
}
