/* test_text_tokenizer_bad.c - malformed or unsupported tokenizer.json files fail to load with a
 * message naming the JSON path at fault, never crash, and leak nothing (also run under valgrind).
 * Each case edits the golden tiny tokenizer in memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "testutil.h"
#include "text/tokenizer.h"

/* The tiny tokenizer with only its first 16 added tokens (keeps valgrind runs short). */
static json_t *g_base;

static json_t *base(void) {
    if (!g_base) {
        json_error_t jerr;
        g_base = json_load_file(tu_golden("tiny-drama3/tokenizer.json"), 0, &jerr);
        assert_non_null(g_base);
        json_t *added = json_object_get(g_base, "added_tokens");
        while (json_array_size(added) > 16) json_array_remove(added, json_array_size(added) - 1);
    }
    return json_deep_copy(g_base);
}

static int teardown(void **state) {
    (void)state;
    json_decref(g_base);
    return 0;
}

static void expect_fail(json_t *root, const char *needle) {
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    assert_non_null(text);
    dr_tok *tok = (dr_tok *)1;
    drama_error err = {0};
    drama_status st = dr_tok_load_memory(text, strlen(text), "tok.json", &tok, &err);
    free(text);
    printf("  %-45s -> %s\n", needle, err.message);
    assert_int_not_equal(st, DRAMA_OK);
    assert_null(tok);
    assert_non_null(strstr(err.message, needle));
    assert_non_null(strstr(err.message, "tok.json"));
}

#define MODEL(r) json_object_get((r), "model")
#define PRE(r, i) json_array_get(json_object_get(json_object_get((r), "pre_tokenizer"), "pretokenizers"), (i))

static void bad_files(void **state) {
    (void)state;
    json_t *r;
    r = base(); json_object_set_new(MODEL(r), "type", json_string("WordPiece")); expect_fail(r, "model.type");
    r = base(); json_object_set_new(MODEL(r), "byte_fallback", json_true()); expect_fail(r, "model.byte_fallback");
    r = base(); json_object_set_new(MODEL(r), "continuing_subword_prefix", json_string("##"));
    expect_fail(r, "model.continuing_subword_prefix");
    r = base(); json_object_set_new(MODEL(r), "dropout", json_real(0.1)); expect_fail(r, "model.dropout");
    r = base(); json_object_set_new(MODEL(r), "unk_token", json_string("<unk>")); expect_fail(r, "model.unk_token");
    r = base(); json_object_set_new(MODEL(r), "ignore_merges", json_string("yes")); expect_fail(r, "model.ignore_merges");
    r = base(); json_object_set_new(MODEL(r), "vocab", json_array()); expect_fail(r, "model.vocab");
    r = base(); json_object_set_new(json_object_get(MODEL(r), "vocab"), "zz-bad", json_integer(-5));
    expect_fail(r, "model.vocab[\"zz-bad\"]");
    r = base(); json_array_set_new(json_object_get(MODEL(r), "merges"), 12, json_string("nosuch token"));
    expect_fail(r, "model.merges[12]");
    r = base(); json_array_set_new(json_object_get(MODEL(r), "merges"), 3, json_integer(7)); expect_fail(r, "model.merges[3]");
    r = base(); json_object_set_new(MODEL(r), "merges", json_object()); expect_fail(r, "model.merges");
    r = base(); json_object_set_new(r, "normalizer", json_pack("{ss}", "type", "NFKC")); expect_fail(r, "normalizer");
    r = base(); json_object_set_new(PRE(r, 0), "behavior", json_string("Removed"));
    expect_fail(r, "pre_tokenizer.pretokenizers[0].behavior");
    r = base(); json_object_set_new(PRE(r, 0), "invert", json_true()); expect_fail(r, "pre_tokenizer.pretokenizers[0].invert");
    r = base(); json_object_set_new(PRE(r, 0), "pattern", json_pack("{ss}", "String", " "));
    expect_fail(r, "pre_tokenizer.pretokenizers[0].pattern");
    r = base(); json_object_set_new(PRE(r, 0), "pattern", json_pack("{ss}", "Regex", "(unclosed"));
    expect_fail(r, "pre_tokenizer.pretokenizers[0].pattern.Regex");
    r = base(); json_object_set_new(PRE(r, 1), "add_prefix_space", json_true());
    expect_fail(r, "pre_tokenizer.pretokenizers[1].add_prefix_space");
    r = base(); json_object_set_new(PRE(r, 1), "use_regex", json_true()); expect_fail(r, "pre_tokenizer.pretokenizers[1].use_regex");
    r = base(); json_object_set_new(r, "pre_tokenizer", json_null()); expect_fail(r, "pre_tokenizer");
    r = base(); json_object_set_new(r, "decoder", json_pack("{ss}", "type", "WordPiece")); expect_fail(r, "decoder.type");
    r = base(); json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 5), "id", json_string("x"));
    expect_fail(r, "added_tokens[5].id");
    r = base(); json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 2), "content", json_string(""));
    expect_fail(r, "added_tokens[2].content");
    r = base(); json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 2), "id", json_integer(1 << 30));
    expect_fail(r, "added_tokens[2].id");
    r = base(); json_object_del(r, "model"); expect_fail(r, "model");
}

static void bad_bytes(void **state) {
    (void)state;
    dr_tok *tok;
    drama_error err = {0};
    const char *trunc = "{\"model\": {\"type\": \"BPE\"";
    assert_int_equal(dr_tok_load_memory(trunc, strlen(trunc), "t.json", &tok, &err), DRAMA_EFORMAT);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "t.json: invalid JSON at line 1"));
    /* a gzip stream cut in half */
    const char *plain = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}";
    unsigned char gz[256];
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    assert_int_equal(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    zs.next_in = (unsigned char *)plain;
    zs.avail_in = (uInt)strlen(plain);
    zs.next_out = gz;
    zs.avail_out = sizeof gz;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    size_t n = zs.total_out;
    deflateEnd(&zs);
    dr_error_clear(&err);
    assert_int_equal(dr_tok_load_memory(gz, n / 2, "t.json.gz", &tok, &err), DRAMA_EFORMAT);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "gzip"));
    /* the whole stream decompresses, then fails on the missing pre_tokenizer */
    dr_error_clear(&err);
    assert_int_not_equal(dr_tok_load_memory(gz, n, "t.json.gz", &tok, &err), DRAMA_OK);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "pre_tokenizer"));
    dr_error_clear(&err);
    assert_int_equal(dr_tok_load("/nonexistent/tokenizer.json", &tok, &err), DRAMA_EIO);
    assert_non_null(strstr(err.message, "/nonexistent/tokenizer.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(bad_files), cmocka_unit_test(bad_bytes)};
    return cmocka_run_group_tests(tests, NULL, teardown);
}
