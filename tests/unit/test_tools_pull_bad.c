/* test_tools_pull_bad.c - what `drama pull` reads from a hub (revision, tree pages, Link headers,
 * repo ids, globs, git blob ids with known answers) and the model store's resolution of
 * `--model org/name[@rev]`; every refusal names the entry. Also under valgrind (_bad). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/sha256.h"
#include "io/manifest.h"
#include "testutil.h"
#include "tools/pull.h"

#define C40 "0123456789abcdef0123456789abcdef01234567"
#define S64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static void test_revision(void **state) {
    (void)state;
    char commit[41];
    drama_error err = {0};
    const char *ok = "{\"id\":\"org/m\",\"sha\":\"" C40 "\",\"siblings\":[]}";
    assert_int_equal(dr_pull_parse_revision(ok, strlen(ok), "rev", commit, &err), DRAMA_OK);
    assert_string_equal(commit, C40);
    struct { const char *text, *msg; } bad[] = {
        {"{\"id\":\"org/m\"}", "no string field \"sha\""},
        {"{\"sha\":\"0123456789ABCDEF0123456789abcdef01234567\"}", "not 40 lowercase hex"},
        {"{\"sha\":\"0123\"}", "not 40 lowercase hex"},
        {"[1]", "expected a JSON object"},
        {"{\"sha\":", "not JSON"},
        {"{\"sha\":\"" C40 "\",\"sha\":\"" C40 "\"}", "not JSON"}, /* duplicate keys refused */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drama_error e = {0};
        assert_int_not_equal(dr_pull_parse_revision(bad[i].text, strlen(bad[i].text), "rev", commit, &e), DRAMA_OK);
        if (!strstr(e.message, bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, e.message, bad[i].msg);
        assert_non_null(strstr(e.message, "rev"));
    }
}

static void test_tree(void **state) {
    (void)state;
    dr_pull_tree t = {0};
    drama_error err = {0};
    const char *p1 = "[{\"type\":\"directory\",\"oid\":\"" C40 "\",\"size\":0,\"path\":\"sub\"},"
                     "{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":12,\"path\":\"config.json\"},"
                     "{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":5000,\"path\":\"sub/w.safetensors\","
                     "\"lfs\":{\"oid\":\"" S64 "\",\"size\":5000,\"pointerSize\":134},\"xetHash\":\"x\"}]";
    assert_int_equal(dr_pull_parse_tree(p1, strlen(p1), "page 1", &t, &err), DRAMA_OK);
    assert_int_equal(t.count, 2); /* the directory is not a file */
    assert_string_equal(t.files[0].path, "config.json");
    assert_int_equal(t.files[0].lfs, 0);
    assert_int_equal(t.files[0].size, 12);
    assert_string_equal(t.files[0].sha256, "");
    assert_string_equal(t.files[1].path, "sub/w.safetensors");
    assert_int_equal(t.files[1].lfs, 1);
    assert_string_equal(t.files[1].sha256, S64);
    assert_int_equal(dr_pull_tree_finish(&t, "tree", &err), DRAMA_OK);
    const char *p2 = "[{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a.txt\"},"
                     "{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"config.json\"}]";
    assert_int_equal(dr_pull_parse_tree(p2, strlen(p2), "page 2", &t, &err), DRAMA_OK);
    drama_error e2 = {0};
    assert_int_not_equal(dr_pull_tree_finish(&t, "org/m@c: file list", &e2), DRAMA_OK); /* across pages */
    assert_non_null(strstr(e2.message, "org/m@c: file list: path 'config.json' listed twice"));
    assert_string_equal(t.files[0].path, "a.txt"); /* sorted by path */
    dr_pull_tree_clear(&t);
    struct { const char *entry, *msg; } bad[] = {
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"../evil\"}", "path '../evil' refused"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"/etc/passwd\"}", "path '/etc/passwd' refused"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a\\\\b\"}", "refused"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a/../../b\"}", "refused"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\".partial/x.part\"}", "where downloads are staged"},
        {"{\"type\":\"file\",\"oid\":\"xyz\",\"size\":1,\"path\":\"a\"}", "'a': \"oid\" is not a 40-hex"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":-1,\"path\":\"a\"}", "'a': \"size\" is not a byte count"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1.5,\"path\":\"a\"}", "\"size\" is not a byte count"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a\",\"lfs\":{\"oid\":\"abc\",\"size\":1}}",
         "\"lfs.oid\" is not a 64-hex SHA-256"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a\",\"lfs\":{\"oid\":\"" S64 "\",\"size\":2}}",
         "\"lfs.size\" 2 differs from \"size\" 1"},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1,\"path\":\"a\",\"lfs\":7}", "\"lfs.oid\""},
        {"{\"type\":\"file\",\"oid\":\"" C40 "\",\"size\":1}", "no string \"type\" or \"path\""},
        {"7", "entry 0 is not an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "[%s]", bad[i].entry);
        drama_error e = {0};
        dr_pull_tree tt = {0};
        assert_int_not_equal(dr_pull_parse_tree(text, strlen(text), "tree", &tt, &e), DRAMA_OK);
        if (!strstr(e.message, bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, e.message, bad[i].msg);
        dr_pull_tree_clear(&tt);
    }
    drama_error e = {0};
    assert_int_not_equal(dr_pull_parse_tree("{}", 2, "tree", &t, &e), DRAMA_OK);
    assert_non_null(strstr(e.message, "expected a JSON array"));
    dr_pull_tree_clear(&t);
}

static void test_link(void **state) {
    (void)state;
    char out[256];
    assert_true(dr_pull_link_next("<https://h/api/x?cursor=2>; rel=\"next\"", out, sizeof out));
    assert_string_equal(out, "https://h/api/x?cursor=2");
    assert_true(dr_pull_link_next("<https://h/p1>; rel=\"prev\", <https://h/p3>; rel=\"next\"", out, sizeof out));
    assert_string_equal(out, "https://h/p3");
    assert_true(dr_pull_link_next("<https://h/a>; title=\"x, rel=next\"; rel=last, <https://h/b>; rel=next", out, sizeof out));
    assert_string_equal(out, "https://h/b");
    assert_true(dr_pull_link_next("<https://h/c>; REL=\"last next\"", out, sizeof out));
    assert_string_equal(out, "https://h/c");
    assert_false(dr_pull_link_next("<https://h/a>; title=\"; rel=next\"", out, sizeof out)); /* quoted */
    assert_false(dr_pull_link_next("<https://h/a>; prel=next", out, sizeof out));
    assert_false(dr_pull_link_next("<https://h/a>; rel=\"prev\"", out, sizeof out));
    assert_false(dr_pull_link_next("<https://h/a>; rel=\"nextpage\"", out, sizeof out));
    assert_false(dr_pull_link_next("", out, sizeof out));
    assert_false(dr_pull_link_next("<https://h/a; rel=next", out, sizeof out));
    assert_false(dr_pull_link_next("<https://h/a-long-one>; rel=next", out, 8)); /* does not fit */
}

static void test_names(void **state) {
    (void)state;
    const char *why = NULL;
    assert_true(dr_pull_repo_ok("fishaudio/drama-3", &why));
    assert_true(dr_pull_repo_ok("org_1/Name.v2", &why));
    const char *bad[] = {"", "noslash", "a/b/c", "../x", "a/..b", "-a/b", "a/b.", "a b/c", "a/b?", "a/",
                         "ab/cd.............................................................................................x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (dr_pull_repo_ok(bad[i], &why) || !why) fail_msg("repo '%s' accepted", bad[i]);
    char repo[128], rev[256];
    assert_true(dr_pull_split_spec("org/m@main", repo, sizeof repo, rev, sizeof rev, &why));
    assert_string_equal(repo, "org/m");
    assert_string_equal(rev, "main");
    assert_true(dr_pull_split_spec("org/m", repo, sizeof repo, rev, sizeof rev, &why));
    assert_string_equal(rev, "");
    assert_true(dr_pull_split_spec("org/m@refs/pr/1", repo, sizeof repo, rev, sizeof rev, &why));
    assert_string_equal(rev, "refs/pr/1");
    assert_false(dr_pull_split_spec("org/m@", repo, sizeof repo, rev, sizeof rev, &why));
    assert_false(dr_pull_split_spec("org/m@a b", repo, sizeof repo, rev, sizeof rev, &why));
    assert_false(dr_pull_split_spec("./models/x", repo, sizeof repo, rev, sizeof rev, &why));
    assert_true(dr_pull_is_commit(C40));
    assert_true(dr_pull_is_commit("0123456789ABCDEF0123456789abcdef01234567"));
    assert_false(dr_pull_is_commit("main"));
    assert_false(dr_pull_is_commit(C40 "0"));
    char esc[64];
    assert_true(dr_pull_url_escape("refs/pr/1", 0, esc, sizeof esc));
    assert_string_equal(esc, "refs%2Fpr%2F1");
    assert_true(dr_pull_url_escape("a b/c+d.json", 1, esc, sizeof esc));
    assert_string_equal(esc, "a%20b/c%2Bd.json");
    assert_false(dr_pull_url_escape("abcdef", 1, esc, 4));
}

static void test_glob_and_blob(void **state) {
    (void)state;
    assert_true(dr_pull_glob_match("*.json", "config.json"));
    assert_true(dr_pull_glob_match("*.json", "sub/dir/x.json")); /* '*' crosses '/' as in huggingface_hub */
    assert_true(dr_pull_glob_match("extra/", "extra/notes.txt"));
    assert_false(dr_pull_glob_match("extra/", "extras.txt"));
    assert_true(dr_pull_glob_match("model-0000[12]-of-*.safetensors", "model-00002-of-00002.safetensors"));
    assert_false(dr_pull_glob_match("*.safetensors", "config.json"));
    /* known answers: git hash-object of "", "hello\n", and huggingface_hub's docstring example */
    char hex[41];
    dr_pull_git_blob_id("", 0, hex);
    assert_string_equal(hex, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    dr_pull_git_blob_id("hello\n", 6, hex);
    assert_string_equal(hex, "ce013625030ba8dba906f756967f9e9ca394464a");
    dr_pull_git_blob_id("Hello, World!", 13, hex);
    assert_string_equal(hex, "b45ef6fec89518d314f546fd6c3025367b721684");
}

static void make_pull(const char *root, const char *repo, const char *commit, int complete) {
    char p[4096];
    dr_pull_store_dir(root, repo, commit, p, sizeof p);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    assert_int_equal(system(cmd), 0);
    if (complete) {
        strcat(p, "/" DR_PULL_RECEIPT_NAME);
        tu_write_file(p, "{}", 2);
    }
}

static void test_store(void **state) {
    (void)state;
    const char *tmp = tu_tmpdir();
    char data[4096], root[4096], dir[4096], want[4096];
    snprintf(data, sizeof data, "%s/data", tmp);
    setenv("XDG_DATA_HOME", data, 1);
    assert_true(dr_pull_store_root(root, sizeof root));
    snprintf(want, sizeof want, "%s/drama/models", data);
    assert_string_equal(root, want);
    const char *c1 = "1111111111111111111111111111111111111111", *c2 = "2222222222222222222222222222222222222222";
    drama_error err = {0};
    /* nothing pulled yet: a repo spec fails naming the store, other arguments pass unchanged */
    assert_int_not_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "holds no complete pull"));
    dr_error_clear(&err);
    assert_int_equal(dr_pull_resolve_model("./not/a/spec", dir, sizeof dir, &err), DRAMA_OK);
    assert_string_equal(dir, "./not/a/spec");
    make_pull(root, "org/m", c1, 1);
    assert_int_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK); /* the only complete pull */
    dr_pull_store_dir(root, "org/m", c1, want, sizeof want);
    assert_string_equal(dir, want);
    make_pull(root, "org/m", c2, 0); /* incomplete: no receipt */
    assert_int_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK);
    assert_string_equal(dir, want);
    assert_int_not_equal(dr_pull_resolve_model("org/m@2222222222222222222222222222222222222222", dir, sizeof dir, &err),
                         DRAMA_OK);
    assert_non_null(strstr(err.message, "is an incomplete pull"));
    dr_error_clear(&err);
    make_pull(root, "org/m", c2, 1);
    assert_int_not_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK); /* two: ambiguous */
    assert_non_null(strstr(err.message, "holds several complete pulls"));
    dr_error_clear(&err);
    assert_int_equal(dr_pull_store_write_ref(root, "org/m", "main", c2, &err), DRAMA_OK);
    assert_int_equal(dr_pull_store_write_ref(root, "org/m", "refs/pr/1", c1, &err), DRAMA_OK);
    assert_int_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK); /* refs/main */
    dr_pull_store_dir(root, "org/m", c2, want, sizeof want);
    assert_string_equal(dir, want);
    assert_int_equal(dr_pull_resolve_model("org/m@refs/pr/1", dir, sizeof dir, &err), DRAMA_OK);
    dr_pull_store_dir(root, "org/m", c1, want, sizeof want);
    assert_string_equal(dir, want);
    assert_int_equal(dr_pull_resolve_model("org/m@1111111111111111111111111111111111111111", dir, sizeof dir, &err),
                     DRAMA_OK);
    assert_string_equal(dir, want);
    assert_int_not_equal(dr_pull_resolve_model("org/m@v2", dir, sizeof dir, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "no pull of 'v2' recorded"));
    dr_error_clear(&err);
    /* an existing directory named like a repo wins */
    char local[4096], cwd[4096];
    snprintf(local, sizeof local, "%s/org/m", tmp);
    snprintf(cwd, sizeof cwd, "mkdir -p '%s'", local);
    assert_int_equal(system(cwd), 0);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(tmp), 0);
    assert_int_equal(dr_pull_resolve_model("org/m", dir, sizeof dir, &err), DRAMA_OK);
    assert_string_equal(dir, "org/m");
    assert_int_equal(chdir(cwd), 0);
    tu_rm_rf(tmp);
}

static void test_manifest_from_digests(void **state) {
    (void)state;
    const char *tmp = tu_tmpdir();
    char a[4096], cache[4096], mpath[4096];
    snprintf(a, sizeof a, "%s/a.bin", tmp);
    tu_write_file(a, "abc", 3);
    dr_manifest_file files[2] = {{.path = "z/b.bin", .size = 1}, {.path = "a.bin", .size = 3}};
    snprintf(files[0].sha256, 65, "%s", S64);
    dr_sha256_hex("abc", 3, files[1].sha256);
    snprintf(mpath, sizeof mpath, "%s/m.json", tmp);
    drama_error err = {0};
    assert_int_equal(dr_manifest_write_files(files, 2, mpath, &err), DRAMA_OK);
    dr_manifest *m = NULL;
    assert_int_equal(dr_manifest_load(mpath, &m, &err), DRAMA_OK);
    assert_int_equal(m->count, 2);
    assert_string_equal(m->files[0].path, "a.bin"); /* sorted */
    assert_string_equal(m->files[1].sha256, S64);
    dr_manifest_free(m);
    dr_manifest_file evil = {.path = "../x", .size = 1};
    snprintf(evil.sha256, 65, "%s", S64);
    assert_int_not_equal(dr_manifest_write_files(&evil, 1, mpath, &err), DRAMA_OK);
    assert_non_null(strstr(err.message, "'../x'"));
    /* a digest recorded for a file as it is now is used by the next cached check */
    snprintf(cache, sizeof cache, "%s/cache.json", tmp);
    char hex[65];
    int from_cache = 0;
    dr_sha256_cache_put(cache, a, S64); /* deliberately not the real digest: the cache must be what answers */
    assert_int_equal(dr_sha256_file_cached(a, cache, hex, &from_cache, NULL, NULL), DRAMA_OK);
    assert_int_equal(from_cache, 1);
    assert_string_equal(hex, S64);
    tu_write_file(a, "abcd", 4); /* a changed file is hashed again */
    assert_int_equal(dr_sha256_file_cached(a, cache, hex, &from_cache, NULL, NULL), DRAMA_OK);
    assert_int_equal(from_cache, 0);
    tu_rm_rf(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_revision), cmocka_unit_test(test_tree), cmocka_unit_test(test_link),
        cmocka_unit_test(test_names), cmocka_unit_test(test_glob_and_blob), cmocka_unit_test(test_store),
        cmocka_unit_test(test_manifest_from_digests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
