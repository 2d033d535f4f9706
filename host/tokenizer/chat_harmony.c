// The harmony format's generated text (see chat_harmony.h).
#include "host/tokenizer/chat_harmony.h"

#include <string.h>

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

enum { ST_FIRST, ST_HEAD, ST_BODY, ST_DONE };

#define PART_DROP (-1)

// What ends a body: <|end|> and <|start|> a message, <|return|> and
// <|call|> the answer.
static const char *const body_end[] = {"<|end|>", "<|start|>", "<|return|>", "<|call|>"};

// How the first header of an answer may begin; other text is plain content.
static const char *const head_open[] = {"<|channel|>", "<|start|>", " to=", "<|constrain|>"};

// Output gathered into runs of one part, handed to emit when the part
// changes, the run is full or the push ends.
struct out {
    harmony_emit_fn emit;
    void *user;
    int part;
    char buf[256];
    size_t n;
    int rc;
};

static void out_flush(struct out *o) {
    if (o->n && !o->rc)
        o->rc = o->emit(o->user, (enum harmony_part)o->part, o->buf, o->n);
    o->n = 0;
}

static void out_put(struct out *o, int part, const char *s, size_t n) {
    if (part == PART_DROP)
        return;
    if (part != o->part)
        out_flush(o);
    o->part = part;
    for (size_t i = 0; i < n; i++) {
        if (o->n == sizeof o->buf)
            out_flush(o);
        o->buf[o->n++] = s[i];
    }
}

static bool ends_with(const char *s, size_t n, const char *tail) {
    size_t t = strlen(tail);
    return n >= t && !memcmp(s + n - t, tail, t);
}

// s[0..n) is a proper prefix of one of words[0..k), or begins with one.
static bool prefix_of_any(const char *s, size_t n, const char *const *words, size_t k,
                          bool or_begins) {
    for (size_t i = 0; i < k; i++) {
        size_t w = strlen(words[i]);
        if (n < w ? !memcmp(s, words[i], n) : or_begins && !memcmp(s, words[i], w))
            return true;
    }
    return false;
}

// The word after the last `key` in the header (up to a space, '<' or the
// end), or NULL where there is none.
static const char *head_word(const struct harmony *h, const char *key, size_t *len) {
    const char *at = NULL;
    const size_t k = strlen(key);
    for (size_t i = 0; i + k <= h->n_head; i++)
        if (!memcmp(h->head + i, key, k))
            at = h->head + i + k;
    if (!at)
        return NULL;
    const char *end = h->head + h->n_head;
    size_t n = 0;
    while (at + n < end && at[n] != ' ' && at[n] != '<')
        n++;
    *len = n;
    return at;
}

static bool word_is(const char *w, size_t n, const char *s) {
    return w && n == strlen(s) && !memcmp(w, s, n);
}

// A complete header (ending in <|message|>): the part its body goes to.
static int head_part(struct harmony *h, struct out *o) {
    if (h->head_over)
        return PART_DROP;
    size_t nc = 0, nr = 0;
    const char *ch = head_word(h, "<|channel|>", &nc);
    const char *to = head_word(h, " to=", &nr);
    if (!to && h->n_head >= 3 && !memcmp(h->head, "to=", 3))
        to = head_word(h, "to=", &nr);
    static const char fn[] = "functions.";
    if (to && nr > sizeof fn - 1 && !memcmp(to, fn, sizeof fn - 1)) {
        out_put(o, HARMONY_TOOL_NAME, to + sizeof fn - 1, nr - (sizeof fn - 1));
        out_flush(o); // one name, one emit
        return HARMONY_TOOL_ARGS;
    }
    if (to && !word_is(to, nr, "assistant"))
        return PART_DROP; // a built-in tool's call
    return word_is(ch, nc, "analysis") ? HARMONY_REASONING : HARMONY_CONTENT;
}

static void head_add(struct harmony *h, char c) {
    if (h->n_head == sizeof h->head) { // keep the tail, where the markers are looked for
        h->head_over = true;
        memmove(h->head, h->head + sizeof h->head / 2, sizeof h->head / 2);
        h->n_head = sizeof h->head / 2;
    }
    h->head[h->n_head++] = c;
}

static void head_reset(struct harmony *h) {
    h->n_head = 0;
    h->head_over = false;
}

// One byte of a header.
static void head_byte(struct harmony *h, char c, struct out *o) {
    head_add(h, c);
    if (h->state == ST_FIRST &&
        !prefix_of_any(h->head, h->n_head, head_open, LEN(head_open), true)) {
        out_put(o, HARMONY_CONTENT, h->head, h->n_head); // not harmony: plain content
        head_reset(h);
        h->state = ST_BODY;
        h->part = HARMONY_CONTENT;
        return;
    }
    if (ends_with(h->head, h->n_head, "<|message|>")) {
        h->part = head_part(h, o);
        h->state = ST_BODY;
        head_reset(h);
    } else if (ends_with(h->head, h->n_head, "<|return|>") ||
               ends_with(h->head, h->n_head, "<|call|>")) {
        h->state = ST_DONE;
    } else if (ends_with(h->head, h->n_head, "<|end|>")) {
        head_reset(h); // a message without a body
        h->state = ST_HEAD;
    }
}

// One byte of a body: held while it may begin a marker.
static void body_byte(struct harmony *h, char c, struct out *o) {
    h->hold[h->n_hold++] = c;
    for (;;) {
        for (size_t i = 0; i < LEN(body_end); i++)
            if (h->n_hold == strlen(body_end[i]) && !memcmp(h->hold, body_end[i], h->n_hold)) {
                h->n_hold = 0;
                if (i >= 2)
                    h->state = ST_DONE;
                else
                    h->state = ST_HEAD; // after <|start|> comes the role: part of the header
                return;
            }
        if (!h->n_hold || prefix_of_any(h->hold, h->n_hold, body_end, LEN(body_end), false))
            return;
        out_put(o, h->part, h->hold, 1);
        memmove(h->hold, h->hold + 1, --h->n_hold);
    }
}

void harmony_init(struct harmony *h) {
    memset(h, 0, sizeof *h);
    h->state = ST_FIRST;
    h->part = HARMONY_CONTENT;
}

int harmony_push(struct harmony *h, const char *text, size_t len, harmony_emit_fn emit,
                 void *user) {
    struct out o = {.emit = emit, .user = user, .part = HARMONY_CONTENT};
    for (size_t i = 0; i < len && h->state != ST_DONE && !o.rc; i++) {
        if (h->state == ST_BODY)
            body_byte(h, text[i], &o);
        else
            head_byte(h, text[i], &o);
    }
    out_flush(&o);
    return o.rc;
}

int harmony_flush(struct harmony *h, harmony_emit_fn emit, void *user) {
    struct out o = {.emit = emit, .user = user, .part = HARMONY_CONTENT};
    if (h->state == ST_BODY)
        out_put(&o, h->part, h->hold, h->n_hold);
    h->n_hold = 0;
    head_reset(h);
    out_flush(&o);
    return o.rc;
}

bool harmony_done(const struct harmony *h) {
    return h->state == ST_DONE;
}

int chat_reasoning_from_name(const char *name, enum chat_reasoning *out) {
    if (!strcmp(name, "auto") || !strcmp(name, "deepseek"))
        *out = CHAT_REASONING_AUTO;
    else if (!strcmp(name, "none"))
        *out = CHAT_REASONING_NONE;
    else
        return -1;
    return 0;
}
