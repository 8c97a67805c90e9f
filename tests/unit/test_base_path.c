/* base/path: following symbolic links stored as text files (git without symlink support). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "base/path.h"
#include "testutil.h"

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_follows_relative_placeholder(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char a[1024], b[1024], p[1024], buf[4096];
    snprintf(a, sizeof a, "%s/real", dir);
    snprintf(b, sizeof b, "%s/variant", dir);
    mkdir(a, 0755);
    mkdir(b, 0755);
    snprintf(p, sizeof p, "%s/real/w.safetensors", dir);
    put(p, "not a link, real data that is long enough\n");
    snprintf(p, sizeof p, "%s/variant/w.safetensors", dir);
    put(p, "../real/w.safetensors\n");
    const char *r = dr_path_follow_placeholder(p, buf, sizeof buf);
    assert_ptr_equal(r, buf);
    char want[1024];
    snprintf(want, sizeof want, "%s/variant/../real/w.safetensors", dir);
    assert_string_equal(r, want);
    /* a real file is returned unchanged */
    snprintf(p, sizeof p, "%s/real/w.safetensors", dir);
    assert_ptr_equal(dr_path_follow_placeholder(p, buf, sizeof buf), p);
}

static void test_refuses_other_names_absolute_and_dangling(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char p[1024], q[1024], buf[4096];
    snprintf(q, sizeof q, "%s/target.json", dir);
    put(q, "{}");
    snprintf(p, sizeof p, "%s/other.json", dir);
    put(p, "target.json");                 /* different base name */
    assert_ptr_equal(dr_path_follow_placeholder(p, buf, sizeof buf), p);
    snprintf(p, sizeof p, "%s/passwd", dir);
    put(p, "/etc/passwd");                  /* absolute */
    assert_ptr_equal(dr_path_follow_placeholder(p, buf, sizeof buf), p);
    snprintf(p, sizeof p, "%s/gone.bin", dir);
    put(p, "missing/gone.bin");             /* dangling */
    assert_ptr_equal(dr_path_follow_placeholder(p, buf, sizeof buf), p);
    snprintf(p, sizeof p, "%s/two.txt", dir);
    put(p, "a/two.txt\nb/two.txt");         /* two lines */
    assert_ptr_equal(dr_path_follow_placeholder(p, buf, sizeof buf), p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_relative_placeholder),
        cmocka_unit_test(test_refuses_other_names_absolute_and_dangling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
