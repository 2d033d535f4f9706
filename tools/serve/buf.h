// A growable byte buffer, NUL-terminated after its bytes: the text of a
// generated answer, an SSE stream waiting to be sent, a request body.
#ifndef VELA_TOOLS_SERVE_BUF_H
#define VELA_TOOLS_SERVE_BUF_H

#include <stdlib.h>
#include <string.h>

struct buf {
    char *p; // [len] + NUL; NULL while empty
    size_t len, cap;
};

// Appends s[0..n); -1 when out of memory (the buffer is unchanged).
static inline int buf_add(struct buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *t = realloc(b->p, cap);
        if (!t)
            return -1;
        b->p = t;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static inline void buf_free(struct buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

#endif
