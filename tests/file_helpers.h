// Files for tests that read what a run wrote.
#ifndef VELA_TESTS_FILE_HELPERS_H
#define VELA_TESTS_FILE_HELPERS_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
