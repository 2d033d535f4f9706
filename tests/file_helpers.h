// Files for tests that read what a run wrote, and their temporary folders.
#ifndef VELA_TESTS_FILE_HELPERS_H
#define VELA_TESTS_FILE_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A whole file (at most 1 MiB) as a NUL-terminated malloc'd string; "" when
// it cannot be read.
static inline char *test_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 20);
    size_t n = f ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

// "$env/<name>" when the variable env is set, else
// "<this folder>/data/<sub>/<name>": the data committed beside the tests
// (the build passes absolute source paths, so __FILE__ locates them).
static inline void test_data_path(char *buf, size_t cap, const char *env, const char *sub,
                                  const char *name) {
    const char *dir = getenv(env);
    if (dir) {
        snprintf(buf, cap, "%s/%s", dir, name);
        return;
    }
    const char *src = __FILE__;
    const char *slash = strrchr(src, '/');
    int n = slash ? (int)(slash - src) : 1;
    snprintf(buf, cap, "%.*s/data/%s/%s", n, slash ? src : ".", sub, name);
}

// A fresh folder /tmp/<prefix>_XXXXXX into dir (cap bytes); NULL on failure.
static inline char *test_tmpdir_make(char *dir, size_t cap, const char *prefix) {
    snprintf(dir, cap, "/tmp/%s_XXXXXX", prefix);
    return mkdtemp(dir);
}

// "<dir>/<name>" into buf; returns buf.
static inline const char *test_tmp_path(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

// Removes test_tmpdir_make's folder and what is in it; the shell's status.
static inline int test_tmpdir_remove(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

// A Criterion suite whose every test gets a fresh folder `tmpdir` (removed
// after it) and tmp_path(buf, cap, name) = "<tmpdir>/<name>". The file
// includes criterion/criterion.h first.
#define TEST_SUITE_WITH_TMPDIR(suite, prefix)                                                      \
    static char tmpdir[256];                                                                       \
    static void setup_tmp(void) {                                                                  \
        cr_assert_not_null(test_tmpdir_make(tmpdir, sizeof tmpdir, prefix));                       \
    }                                                                                              \
    static void teardown_tmp(void) {                                                               \
        cr_expect_eq(test_tmpdir_remove(tmpdir), 0);                                               \
    }                                                                                              \
    static inline const char *tmp_path(char *buf, size_t cap, const char *name) {                  \
        return test_tmp_path(buf, cap, tmpdir, name);                                              \
    }                                                                                              \
    TestSuite(suite, .init = setup_tmp, .fini = teardown_tmp)

#endif
