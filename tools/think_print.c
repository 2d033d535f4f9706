// The terminal's view of a reasoning model's answer (see think_print.h).
#include "tools/think_print.h"

#include <unistd.h>

#define DIM "\x1b[2m"
#define RESET "\x1b[0m"

void think_print_init(struct think_print *p, FILE *out, bool split, struct buf *answer) {
    *p = (struct think_print){.out = out, .split = split, .nl = true, .answer = answer};
    p->dim = isatty(fileno(out));
    harmony_init(&p->hp);
}

static void put(struct think_print *p, const char *s, size_t n) {
    if (!n)
        return;
    fwrite(s, 1, n, p->out);
    p->nl = s[n - 1] == '\n';
}

// llama-cli's block markers, on lines of their own.
static void set_thinking(struct think_print *p, bool on) {
    if (on == p->thinking)
        return;
    if (!p->nl)
        put(p, "\n", 1);
    if (on) {
        put(p, "[Start thinking]\n\n", 18);
        if (p->dim)
            fputs(DIM, p->out);
    } else {
        if (p->dim)
            fputs(RESET, p->out);
        put(p, "[End thinking]\n\n", 16);
    }
    p->thinking = on;
}

static int take(void *user, enum harmony_part part, const char *s, size_t n) {
    struct think_print *p = user;
    if (part == HARMONY_REASONING) {
        set_thinking(p, true);
        put(p, s, n);
    } else if (part == HARMONY_CONTENT) {
        set_thinking(p, false);
        put(p, s, n);
        if (p->answer && buf_add(p->answer, s, n))
            return -1;
    }
    return 0;
}

int think_print_text(struct think_print *p, const char *s, size_t n) {
    if (!p->split) {
        put(p, s, n);
        if (p->answer && !p->rc && buf_add(p->answer, s, n))
            p->rc = -1;
    } else if (!p->rc) {
        p->rc = harmony_push(&p->hp, s, n, take, p);
    }
    fflush(p->out);
    return p->split && harmony_done(&p->hp);
}

int think_print_end(struct think_print *p) {
    if (p->split && !p->rc)
        p->rc = harmony_flush(&p->hp, take, p);
    if (p->thinking && p->dim) // cut off while thinking: no end line, as llama-cli
        fputs(RESET, p->out);
    p->thinking = false;
    fflush(p->out);
    return p->rc;
}
