// The case files of llama.cpp's tests/test-tokenizer-0: a .inp whose cases
// are separated by "\n__ggml_vocab_test__\n" (so a case never carries the
// newline before the separator) and files with one line of integers per
// case (the .out's token ids, or other per-case numbers). The file includes
// criterion/criterion.h first.
#ifndef VELA_TESTS_VOCAB_CASES_H
#define VELA_TESTS_VOCAB_CASES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char VOCAB_CASE_SEP[] = "\n__ggml_vocab_test__\n";

// A whole file as a malloc'd NUL-terminated buffer (*len bytes, which may
// hold NULs); NULL when it cannot be read.
static inline char *vocab_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

// Parses the line at *p (up to '\n' or end) as integers into v (at most
// max), moves *p past it and returns the count.
static inline int vocab_next_ints(const char **p, const char *end, int32_t *v, int max) {
    const char *eol = memchr(*p, '\n', (size_t)(end - *p));
    if (!eol)
        eol = end;
    int n = 0;
    const char *q = *p;
    while (q < eol) {
        while (q < eol && *q == ' ')
            q++;
        if (q >= eol)
            break;
        char *e;
        long x = strtol(q, &e, 10);
        cr_assert(e > q && e <= eol, "bad number near '%.20s'", q);
        cr_assert_lt(n, max);
        v[n++] = (int32_t)x;
        q = e;
    }
    *p = eol < end ? eol + 1 : eol;
    return n;
}

// Iterates the cases of a .inp together with the lines of a per-case file.
struct vocab_cursor {
    const char *ip, *iend, *op, *oend;
    bool done;
};

// Returns false when done. *text / *len: the case, *ids / *n_ids: its line.
static inline bool vocab_next_case(struct vocab_cursor *c, const char **text, size_t *len,
                                   int32_t *ids, int *n_ids, int max_ids) {
    if (c->done || c->ip >= c->iend)
        return false;
    const char *sep = strstr(c->ip, VOCAB_CASE_SEP);
    *text = c->ip;
    if (sep && sep < c->iend) {
        *len = (size_t)(sep - c->ip);
        c->ip = sep + strlen(VOCAB_CASE_SEP);
    } else {
        *len = (size_t)(c->iend - c->ip);
        c->done = true;
    }
    *n_ids = vocab_next_ints(&c->op, c->oend, ids, max_ids);
    return true;
}

static inline void vocab_print_ids(const char *label, const int32_t *ids, int n) {
    fprintf(stderr, "    %s:", label);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

#endif
