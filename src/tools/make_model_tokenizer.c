/* make_model_tokenizer.c - tokenizer.json for a generated model: a byte-level BPE with the 256
 * byte tokens, a few English merges, then the model's added tokens (S2-Pro specials, the semantic
 * block, the speaker tags), with Qwen3's normalizer / pre-tokenizer / decoder blocks (TEXT.md 1.1)
 * so the engine's tokenizer loads it like the real one. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tools/make_model.h"

/* S2-Pro's special tokens, in id order (README "Token ids"). */
static const char *const k_specials[] = {
    "<|endoftext|>", "<|pad|>",  "<|im_start|>",   "<|im_end|>",     "<|phoneme_start|>", "<|phoneme_end|>",
    "<|text|>",      "<|voice|>", "<|interleave|>", "<|audio_start|>", "<|audio_end|>",     "<|audio_pad|>",
};
#define N_SPECIALS ((int)(sizeof k_specials / sizeof k_specials[0]))

/* Merges in raw bytes; each part must already be a token when the merge is reached. */
static const char *const k_merges[][2] = {
    {" ", "t"},  {"h", "e"},  {" t", "he"}, {"i", "n"},  {"e", "r"},  {"a", "n"},   {" ", "a"},
    {"o", "n"},  {"r", "e"},  {" ", "s"},   {"e", "n"},  {"a", "t"},  {"o", "u"},   {" ", "w"},
    {"i", "s"},  {"e", "s"},  {" ", "o"},   {" ", "c"},  {"in", "g"}, {" ", "b"},   {"o", "r"},
    {"e", "d"},  {"l", "l"},  {" ", "f"},   {" ", "m"},  {" ", "p"},  {"a", "r"},   {"i", "t"},
    {" ", "d"},  {" ", "h"},  {" ", " "},   {"  ", "  "}, {" ", "i"}, {"a", "l"},   {"n", "d"},
    {" a", "nd"}, {" o", "f"}, {" t", "o"},  {" i", "s"}, {" i", "n"}, {"l", "e"},   {"o", "m"},
    {" s", "t"}, {"r", "o"},  {" t", "h"}, {" th", "at"}, {".", "\n"}, {"\n", "\n"},
};
#define N_MERGES ((int)(sizeof k_merges / sizeof k_merges[0]))

/* GPT-2 byte-to-unicode map (TEXT.md 1.2 step 5): byte -> code point, and the id order of the
 * 256 byte tokens (printable bytes first, then the 68 remapped ones). */
static void byte_map(int cp[256], int order[256]) {
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (printable) {
            cp[b] = b;
            order[n++] = b;
        }
    }
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!printable) {
            cp[b] = 256 + extra++;
            order[n++] = b;
        }
    }
}

static size_t put_utf8(char *o, int c) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    o[0] = (char)(0xE0 | (c >> 12));
    o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (char)(0x80 | (c & 0x3F));
    return 3;
}

/* Raw bytes -> byte-level token string. */
static void map_bytes(const int cp[256], const char *raw, char *out, size_t cap) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p && n + 4 < cap; p++) n += put_utf8(out + n, cp[*p]);
    out[n] = 0;
}

void dr_mm_token_layout(const dr_mm_dims *d, dr_mm_token_ids *ids) {
    int64_t base = 256 + N_MERGES;
    ids->endoftext = base + 0;
    ids->pad = base + 1;
    ids->im_start = base + 2;
    ids->im_end = base + 3;
    ids->audio_pad = base + 11;
    ids->semantic_start = base + N_SPECIALS;
    ids->semantic_end = ids->semantic_start + d->code_vocab - 1;
    ids->speaker0 = ids->semantic_end + 1;
    ids->n_tokens = ids->speaker0 + d->speakers;
}

static json_t *added(int64_t id, const char *content) {
    json_t *t = json_object();
    json_object_set_new(t, "id", json_integer(id));
    json_object_set_new(t, "content", json_string(content));
    json_object_set_new(t, "single_word", json_false());
    json_object_set_new(t, "lstrip", json_false());
    json_object_set_new(t, "rstrip", json_false());
    json_object_set_new(t, "normalized", json_false());
    json_object_set_new(t, "special", json_true());
    return t;
}

/* Qwen3's blocks (TEXT.md 1.1 and 1.3). */
static const char k_qwen3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *byte_level(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", 0);
}

drama_status dr_mm_write_tokenizer(const char *dir, const dr_mm_dims *d, dr_mm_token_ids *ids,
                                   drama_error *err) {
    int cp[256], order[256];
    byte_map(cp, order);
    dr_mm_token_layout(d, ids);

    json_t *vocab = json_object(), *merges = json_array();
    char tok[64], a[64], b[64], raw[64];
    for (int i = 0; i < 256; i++) {
        size_t n = put_utf8(tok, cp[order[i]]);
        tok[n] = 0;
        json_object_set_new(vocab, tok, json_integer(i));
    }
    for (int m = 0; m < N_MERGES; m++) {
        map_bytes(cp, k_merges[m][0], a, sizeof a);
        map_bytes(cp, k_merges[m][1], b, sizeof b);
        snprintf(raw, sizeof raw, "%s%s", k_merges[m][0], k_merges[m][1]);
        map_bytes(cp, raw, tok, sizeof tok);
        if (!json_object_get(vocab, a) || !json_object_get(vocab, b) || json_object_get(vocab, tok)) {
            json_decref(vocab);
            json_decref(merges);
            return dr_fail(err, DRAMA_EINTERNAL, "tokenizer merge %d (%s + %s) is not well formed", m, a, b);
        }
        json_object_set_new(vocab, tok, json_integer(256 + m));
        json_array_append_new(merges, json_pack("[s,s]", a, b));
    }
    json_t *add = json_array();
    int64_t id = 256 + N_MERGES;
    for (int i = 0; i < N_SPECIALS; i++) json_array_append_new(add, added(id++, k_specials[i]));
    for (int i = 0; i < d->code_vocab; i++) {
        snprintf(tok, sizeof tok, "<|semantic:%d|>", i);
        json_array_append_new(add, added(id++, tok));
    }
    for (int i = 0; i < d->speakers; i++) {
        snprintf(tok, sizeof tok, "<|speaker:%d|>", i);
        json_array_append_new(add, added(id++, tok));
    }

    json_t *model = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0);
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", merges);
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", k_qwen3_pattern,
                              "behavior", "Isolated", "invert", 0);
    json_t *pre = json_pack("{s:s, s:[o,o]}", "type", "Sequence", "pretokenizers", split, byte_level());
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:{s:s}, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                             "padding", "added_tokens", add, "normalizer", "type", "NFC", "pre_tokenizer", pre,
                             "post_processor", byte_level(), "decoder", byte_level(), "model", model);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = root ? json_dump_file(root, path, JSON_INDENT(1)) : -1;
    json_decref(root);
    if (rc != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot write", path);

    json_t *tc = json_pack("{s:s, s:n, s:s, s:s, s:n, s:b, s:b, s:b, s:b}", "tokenizer_class",
                           "PreTrainedTokenizerFast", "bos_token", "eos_token", "<|im_end|>", "pad_token", "<|pad|>",
                           "unk_token", "add_bos_token", 0, "add_eos_token", 0, "clean_up_tokenization_spaces", 0,
                           "split_special_tokens", 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = tc ? json_dump_file(tc, path, JSON_INDENT(1)) : -1;
    json_decref(tc);
    if (rc != 0) return dr_fail(err, DRAMA_EIO, "%s: cannot write", path);
    return DRAMA_OK;
}
