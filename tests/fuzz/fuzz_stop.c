// libFuzzer target for the stop-string matcher (host/engine/stop.h), which
// vela serve feeds with clients' stop strings and the model's text. The
// input is cut into stop strings and text pieces; the text shown (every
// stop_push, then stop_flush) must be the text up to the earliest stop
// string in the text pushed so far, at the first piece after which there is
// one (a stop is final once complete: later text cannot reveal an earlier
// one), or the whole text when none occurs; and a stop must be reported
// exactly then.
//
// Input: bytes up to the first 0xFF are the stop strings, separated by 0x00
// (empty ones skipped, at most 8); the rest is the text, cut into pieces at
// each 0xFE byte (the separators are not part of the text).
//
// Build and run: see tests/fuzz/README.md (target fuzz_stop).
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/stop.h"

#define MAX_STOPS 8

// The first occurrence of needle in hay, or -1.
static long find(const uint8_t *hay, size_t nh, const char *needle, size_t nn) {
    for (size_t i = 0; nn <= nh && i + nn <= nh; i++)
        if (!memcmp(hay + i, needle, nn))
            return (long)i;
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *ff = memchr(data, 0xFF, size);
    if (!ff)
        return 0;
    char *stops[MAX_STOPS];
    int n_stops = 0;
    for (const uint8_t *p = data; p < ff && n_stops < MAX_STOPS;) {
        const uint8_t *z = memchr(p, 0x00, (size_t)(ff - p));
        const uint8_t *end = z ? z : ff;
        if (end > p) {
            stops[n_stops] = strndup((const char *)p, (size_t)(end - p));
            if (!stops[n_stops])
                abort();
            n_stops++;
        }
        p = end + 1;
    }
    const uint8_t *text = ff + 1;
    size_t n_text = size - (size_t)(text - data);

    // The reference: the text (separators removed) piece by piece; after the
    // first piece that completes a stop, the text up to the earliest stop.
    uint8_t *whole = malloc(n_text + 1);
    size_t n_whole = 0;
    long cut = -1;
    for (size_t i = 0; i <= n_text && cut < 0; i++) {
        if (i < n_text && text[i] != 0xFE) {
            whole[n_whole++] = text[i];
            continue;
        }
        for (int s = 0; s < n_stops; s++) {
            long at = find(whole, n_whole, stops[s], strlen(stops[s]));
            if (at >= 0 && (cut < 0 || at < cut))
                cut = at;
        }
    }
    size_t want = cut >= 0 ? (size_t)cut : n_whole;

    struct stop_matcher *m = NULL;
    if (stop_new(&m, (const char *const *)stops, n_stops, NULL))
        abort();
    uint8_t *shown = malloc(n_text + 1);
    size_t n_shown = 0;
    const uint8_t *piece = text;
    for (size_t i = 0; i <= n_text; i++) {
        if (i < n_text && text[i] != 0xFE)
            continue;
        const char *s;
        size_t n;
        if (stop_push(m, (const char *)piece, (size_t)(text + i - piece), &s, &n, NULL))
            abort();
        if (n_shown + n > n_text)
            abort(); // more shown than was pushed
        memcpy(shown + n_shown, s, n);
        n_shown += n;
        piece = text + i + 1;
    }
    const char *s;
    size_t n;
    stop_flush(m, &s, &n);
    if (n_shown + n > n_text)
        abort();
    memcpy(shown + n_shown, s, n);
    n_shown += n;
    if (n_shown != want || memcmp(shown, whole, want) != 0)
        abort(); // not the text up to the first stop
    if ((stop_hit(m) >= 0) != (cut >= 0))
        abort(); // a stop reported without one, or missed
    stop_free(m);
    free(shown);
    free(whole);
    for (int i = 0; i < n_stops; i++)
        free(stops[i]);
    return 0;
}
