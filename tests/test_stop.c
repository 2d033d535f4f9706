// Stop strings (host/engine/stop.h): what is shown after each piece, what
// is held back, that a stop string is found across pieces and never shown,
// several stop strings, UTF-8 split across pieces, flush and reset. The
// expected outputs follow from llama-server's stop-word rule (show the text
// up to the earliest full stop string; hold back a suffix that is a prefix
// of a stop string) and are written out by hand for each case.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/stop.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static struct stop_matcher *make(const char *const *stops, int n) {
    struct stop_matcher *m = NULL;
    struct verr err = {0};
    cr_assert_eq(stop_new(&m, stops, n, &err), 0, "%s", err.msg);
    return m;
}

// Pushes each piece and checks what is shown after it ("|"-free strings).
static void run(struct stop_matcher *m, const char *const *pieces, const char *const *want,
                size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        struct verr err = {0};
        cr_assert_eq(stop_push(m, pieces[i], strlen(pieces[i]), &s, &len, &err), 0, "%s", err.msg);
        cr_expect(len == strlen(want[i]) && !memcmp(s, want[i], len),
                  "piece %zu '%s': showed '%.*s', expected '%s'", i, pieces[i], (int)len, s,
                  want[i]);
    }
}

// The whole text shown over a run, pieces then flush.
static char *shown_all(struct stop_matcher *m, const char *const *pieces, size_t n) {
    size_t cap = 1, len = 0;
    for (size_t i = 0; i < n; i++)
        cap += strlen(pieces[i]);
    char *all = calloc(cap, 1);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        cr_assert_eq(stop_push(m, pieces[i], strlen(pieces[i]), &s, &l, NULL), 0);
        memcpy(all + len, s, l);
        len += l;
    }
    const char *s;
    size_t l;
    stop_flush(m, &s, &l);
    memcpy(all + len, s, l);
    return all;
}

Test(stop, across_pieces_and_never_shown) {
    const char *stops[] = {"</s>"};
    struct stop_matcher *m = make(stops, 1);
    const char *pieces[] = {"Hello", " wor", "ld<", "/", "s", ">after"};
    const char *want[] = {"Hello", " wor", "ld", "", "", ""};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), 0);
    cr_expect_eq(stop_held(m), 0);
    // Nothing after the stop, pushed or flushed.
    const char *s;
    size_t len;
    cr_expect_eq(stop_push(m, "more", 4, &s, &len, NULL), 0);
    cr_expect_eq(len, 0);
    stop_flush(m, &s, &len);
    cr_expect_eq(len, 0);
    stop_free(m);
}

Test(stop, held_back_then_released) {
    const char *stops[] = {"STOP"};
    struct stop_matcher *m = make(stops, 1);
    // "ST" could begin STOP: held; "STx" cannot: released whole.
    const char *pieces[] = {"aS", "T", "x", "ST", "OPS"};
    const char *want[] = {"a", "", "STx", "", ""};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), 0);
    stop_free(m);
}

Test(stop, inside_one_piece) {
    const char *stops[] = {"\n\n"};
    struct stop_matcher *m = make(stops, 1);
    const char *pieces[] = {"one\n\ntwo"};
    const char *want[] = {"one"};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), 0);
    stop_free(m);
}

Test(stop, several_earliest_wins) {
    const char *stops[] = {"world", "lo w", "o"};
    struct stop_matcher *m = make(stops, 3);
    // "l" could begin "lo w": held. In "hello world", "lo w" starts at 3,
    // "o" at 4, "world" at 6: "lo w" wins and "hel" is all that is shown.
    const char *pieces[] = {"hel", "lo world"};
    const char *want[] = {"he", "l"};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), 1);
    stop_free(m);
    // Same start: the earlier in the list.
    const char *stops2[] = {"ab", "abc"};
    m = make(stops2, 2);
    const char *p2[] = {"xabc"};
    const char *w2[] = {"x"};
    run(m, p2, w2, 1);
    cr_expect_eq(stop_hit(m), 0);
    stop_free(m);
    // The held-back suffix is the longest over all stops: "ab" could begin
    // "abc" even though "b" alone begins nothing.
    const char *stops3[] = {"abc", "bd"};
    m = make(stops3, 2);
    const char *p3[] = {"zab", "d"};
    const char *w3[] = {"z", "a"};
    run(m, p3, w3, 2);
    cr_expect_eq(stop_hit(m), 1);
    stop_free(m);
}

Test(stop, no_stops_shows_everything) {
    struct stop_matcher *m = make(NULL, 0);
    const char *pieces[] = {"a", "</s>", "b"};
    const char *want[] = {"a", "</s>", "b"};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), -1);
    stop_free(m);
}

Test(stop, flush_releases_held_text) {
    const char *stops[] = {"<|im_end|>"};
    struct stop_matcher *m = make(stops, 1);
    const char *pieces[] = {"The end <|im"};
    char *all = shown_all(m, pieces, 1);
    cr_expect_str_eq(all, "The end <|im", "generation ended another way: nothing is lost");
    free(all);
    cr_expect_eq(stop_hit(m), -1);
    // reset: a new text with the same stops.
    stop_reset(m);
    const char *p2[] = {"x<|im_", "end|>y"};
    all = shown_all(m, p2, 2);
    cr_expect_str_eq(all, "x");
    cr_expect_eq(stop_hit(m), 0);
    free(all);
    stop_reset(m);
    cr_expect_eq(stop_hit(m), -1);
    stop_free(m);
}

// UTF-8: "é" is C3 A9, "€" E2 82 AC, "😀" F0 9F 98 80.
Test(stop, utf8_never_split) {
    const char *stops[] = {"\xe2\x82\xac"}; // €
    struct stop_matcher *m = make(stops, 1);
    const char *pieces[] = {"caf\xc3", "\xa9 \xf0\x9f", "\x98", "\x80!", "5\xe2\x82", "\xac"};
    const char *want[] = {"caf", "\xc3\xa9 ", "", "\xf0\x9f\x98\x80!", "5", ""};
    run(m, pieces, want, LEN(pieces));
    cr_expect_eq(stop_hit(m), 0);
    stop_free(m);
    // A stop string that is not ASCII, across pieces, with its first byte
    // alone in a piece: held, then dropped.
    const char *stops2[] = {"\xc3\xa9t\xc3\xa9"}; // été
    m = make(stops2, 1);
    const char *p2[] = {"l'\xc3", "\xa9t", "\xc3", "\xa9 fin"};
    const char *w2[] = {"l'", "", "", ""};
    run(m, p2, w2, LEN(p2));
    cr_expect_eq(stop_hit(m), 0);
    stop_free(m);
}

Test(stop, utf8_complete) {
    cr_expect_eq(stop_utf8_complete("abc", 3), 3);
    cr_expect_eq(stop_utf8_complete("ab\xc3", 3), 2);
    cr_expect_eq(stop_utf8_complete("ab\xc3\xa9", 4), 4);
    cr_expect_eq(stop_utf8_complete("\xf0\x9f\x98", 3), 0);
    cr_expect_eq(stop_utf8_complete("\xf0\x9f\x98\x80", 4), 4);
    cr_expect_eq(stop_utf8_complete("\xe2\x82", 2), 0);
    cr_expect_eq(stop_utf8_complete("a\x80\x80\x80\x80", 5), 5, "stray continuation bytes");
    cr_expect_eq(stop_utf8_complete("a\xff", 2), 2, "not UTF-8: complete");
    cr_expect_eq(stop_utf8_complete("", 0), 0);
}

Test(stop, bad_stop_strings) {
    struct stop_matcher *m = NULL;
    struct verr err = {0};
    const char *empty[] = {"a", ""};
    cr_expect_eq(stop_new(&m, empty, 2, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "stop string 1 is empty"), "%s", err.msg);
    cr_expect_null(m);
    char *big = malloc(STOP_MAX_LEN + 2);
    memset(big, 'x', STOP_MAX_LEN + 1);
    big[STOP_MAX_LEN + 1] = '\0';
    const char *bigs[] = {big};
    cr_expect_eq(stop_new(&m, bigs, 1, &err), VERR_RANGE);
    free(big);
    const char *many[STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= STOP_MAX_STRINGS; i++)
        many[i] = "s";
    cr_expect_eq(stop_new(&m, many, STOP_MAX_STRINGS + 1, &err), VERR_RANGE);
    cr_expect_eq(stop_new(&m, many, STOP_MAX_STRINGS, &err), 0, "%s", err.msg);
    stop_free(m);
    stop_free(NULL);
}

// Whatever the pieces, the text shown is the text up to the first stop
// string: every way of cutting one text into 1..3 pieces gives the same.
Test(stop, any_cut_same_text) {
    const char *text = "ab</s>cd";
    const char *stops[] = {"</s>", "d"};
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++)
        for (size_t j = i; j <= n; j++) {
            char a[16], b[16], c[16];
            snprintf(a, sizeof a, "%.*s", (int)i, text);
            snprintf(b, sizeof b, "%.*s", (int)(j - i), text + i);
            snprintf(c, sizeof c, "%s", text + j);
            const char *pieces[] = {a, b, c};
            struct stop_matcher *m = make(stops, 2);
            char *all = shown_all(m, pieces, 3);
            cr_expect_str_eq(all, "ab", "cut at %zu, %zu", i, j);
            cr_expect_eq(stop_hit(m), 0);
            free(all);
            stop_free(m);
        }
}
