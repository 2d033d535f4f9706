// Stop strings (see stop.h). The matcher keeps only the text not handed
// back yet: a stop string that ends in future text must begin in a suffix of
// the text that is a prefix of it, and that suffix is exactly what is held
// back, so searching the held text plus the new piece finds every stop.
#include "host/engine/stop.h"

#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    char **stops; // [n]
    size_t *lens; // [n]
    int n;
    char *held; // [held_len] text not handed back yet
    size_t held_len, held_cap;
    char *show; // [show_cap] what the last call handed back
    size_t show_cap;
    int hit; // the stop string found, -1
};

int stop_new(struct stop_matcher **out, const char *const *stops, int n, struct verr *err) {
    *out = NULL;
    if (n < 0 || n > STOP_MAX_STRINGS)
        return verr_set(err, VERR_RANGE, "%d stop strings: at most %d", n, STOP_MAX_STRINGS);
    for (int i = 0; i < n; i++) {
        size_t len = stops[i] ? strlen(stops[i]) : 0;
        if (len == 0)
            return verr_set(err, VERR_RANGE, "stop string %d is empty", i);
        if (len > STOP_MAX_LEN)
            return verr_set(err, VERR_RANGE, "stop string %d is %zu bytes: at most %d", i, len,
                            STOP_MAX_LEN);
    }
    struct stop_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return verr_set(err, VERR_NOMEM, "out of memory for a stop matcher");
    m->hit = -1;
    m->stops = calloc((size_t)n + 1, sizeof *m->stops);
    m->lens = calloc((size_t)n + 1, sizeof *m->lens);
    bool ok = m->stops && m->lens;
    for (int i = 0; ok && i < n; i++) {
        m->stops[i] = strdup(stops[i]);
        m->lens[i] = strlen(stops[i]);
        ok = m->stops[i] != NULL;
        m->n = i + 1;
    }
    if (!ok) {
        stop_free(m);
        return verr_set(err, VERR_NOMEM, "out of memory for %d stop strings", n);
    }
    *out = m;
    return 0;
}

void stop_free(struct stop_matcher *m) {
    if (!m)
        return;
    for (int i = 0; m->stops && i < m->n; i++)
        free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->held);
    free(m->show);
    free(m);
}

int stop_hit(const struct stop_matcher *m) {
    return m->hit;
}

size_t stop_held(const struct stop_matcher *m) {
    return m->held_len;
}

void stop_reset(struct stop_matcher *m) {
    m->held_len = 0;
    m->hit = -1;
}

size_t stop_utf8_complete(const char *s, size_t n) {
    // Walk back over at most 3 continuation bytes to the lead byte.
    size_t i = n, back = 0;
    while (i > 0 && back < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--, back++;
    if (i == 0)
        return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 && lead <= 0xF4   ? 4
                  : lead >= 0xE0 && lead <= 0xEF ? 3
                  : lead >= 0xC2 && lead <= 0xDF ? 2
                                                 : 1;
    // The sequence from the lead byte holds back + 1 bytes of need.
    return need > back + 1 ? i - 1 : n;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    size_t c = need * 2;
    char *p = realloc(*buf, c);
    if (!p)
        return -1;
    *buf = p;
    *cap = c;
    return 0;
}

// The first occurrence of needle[0..nn) in hay[0..nh), or NULL (memmem is
// not in C11 or POSIX 2008).
static const char *find_bytes(const char *hay, size_t nh, const char *needle, size_t nn) {
    for (size_t i = 0; nn <= nh && i <= nh - nn; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, nn))
            return hay + i;
    return NULL;
}

// The earliest stop string in held[0..held_len): its index and offset.
static int find_stop(const struct stop_matcher *m, size_t *at) {
    int best = -1;
    for (int i = 0; i < m->n; i++) {
        if (m->lens[i] > m->held_len)
            continue;
        const char *p = find_bytes(m->held, m->held_len, m->stops[i], m->lens[i]);
        if (p && (best < 0 || (size_t)(p - m->held) < *at)) {
            best = i;
            *at = (size_t)(p - m->held);
        }
    }
    return best;
}

// The longest suffix of held that is a proper prefix of some stop string.
static size_t partial_stop(const struct stop_matcher *m) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = m->lens[i] - 1 < m->held_len ? m->lens[i] - 1 : m->held_len;
        for (; k > best; k--)
            if (!memcmp(m->held + m->held_len - k, m->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

// Hands back held[0..n) and keeps the rest.
static int hand_back(struct stop_matcher *m, size_t n, const char **show, size_t *show_len) {
    if (grow(&m->show, &m->show_cap, n + 1))
        return -1;
    memcpy(m->show, m->held, n);
    m->show[n] = '\0';
    memmove(m->held, m->held + n, m->held_len - n);
    m->held_len -= n;
    *show = m->show;
    *show_len = n;
    return 0;
}

int stop_push(struct stop_matcher *m, const char *text, size_t len, const char **show,
              size_t *show_len, struct verr *err) {
    *show = "";
    *show_len = 0;
    if (m->hit >= 0 || len == 0)
        return 0;
    if (grow(&m->held, &m->held_cap, m->held_len + len))
        return verr_set(err, VERR_NOMEM, "out of memory holding %zu bytes of text",
                        m->held_len + len);
    memcpy(m->held + m->held_len, text, len);
    m->held_len += len;
    size_t at = 0;
    int hit = find_stop(m, &at);
    size_t n = 0;
    if (hit >= 0) {
        m->hit = hit;
        n = at;
    } else {
        n = stop_utf8_complete(m->held, m->held_len - partial_stop(m));
    }
    if (hand_back(m, n, show, show_len))
        return verr_set(err, VERR_NOMEM, "out of memory handing back %zu bytes", n);
    if (hit >= 0)
        m->held_len = 0; // the stop string and what followed it are dropped
    return 0;
}

void stop_flush(struct stop_matcher *m, const char **show, size_t *show_len) {
    *show = "";
    *show_len = 0;
    if (m->hit >= 0 || m->held_len == 0)
        return;
    // Swap the buffers: the held text becomes what is shown, without a copy.
    char *p = m->show;
    size_t cap = m->show_cap;
    m->show = m->held;
    m->show_cap = m->held_cap;
    m->held = p;
    m->held_cap = cap;
    *show = m->show;
    *show_len = m->held_len;
    m->held_len = 0;
}
