// The harmony parser (host/tokenizer/chat_harmony.h) on generated texts
// written by hand in the format of gpt-oss's template and llama.cpp's parser
// (common/parsers/gpt-oss.cpp): what each part receives is compared with the
// text between the markers, pushed whole, then split at every byte boundary
// (two pieces) and one byte at a time (the same concatenations expected).
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/chat_harmony.h"
#include "tests/rng_splitmix.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

// Each part's text, with the tool names separated by '|'.
struct parts {
    char text[4][1024];
    size_t len[4];
    int n_emit;
};

static int collect(void *user, enum harmony_part part, const char *s, size_t n) {
    struct parts *p = user;
    cr_assert(part >= 0 && part < 4);
    cr_assert(p->len[part] + n + 2 < sizeof p->text[part]);
    cr_assert_gt(n, 0, "an empty emit");
    if (part == HARMONY_TOOL_NAME && p->len[part])
        p->text[part][p->len[part]++] = '|';
    memcpy(p->text[part] + p->len[part], s, n);
    p->len[part] += n;
    p->text[part][p->len[part]] = '\0';
    p->n_emit++;
    return 0;
}

// Parses text in pieces cut at cuts[0..n_cuts) (ascending), then flushes.
static void parse_cut(const char *text, const size_t *cuts, size_t n_cuts, struct parts *p,
                      bool *done) {
    memset(p, 0, sizeof *p);
    struct harmony h;
    harmony_init(&h);
    size_t from = 0, len = strlen(text);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        cr_assert_eq(harmony_push(&h, text + from, to - from, collect, p), 0);
        from = to;
    }
    *done = harmony_done(&h);
    cr_assert_eq(harmony_flush(&h, collect, p), 0);
}

struct want {
    const char *text;
    const char *content, *reasoning, *tool_names, *tool_args;
    bool done;
};

static void expect_parts(const struct parts *p, bool done, const struct want *w, const char *how) {
    const char *want[4] = {w->content, w->reasoning, w->tool_names, w->tool_args};
    static const char *const names[4] = {"content", "reasoning", "tool names", "tool args"};
    for (int k = 0; k < 4; k++)
        cr_expect_str_eq(p->text[k], want[k], "%s of %s (%s)", names[k], w->text, how);
    cr_expect_eq(done, w->done, "done of %s (%s)", w->text, how);
}

static void check(const struct want *w) {
    struct parts p;
    bool done;
    parse_cut(w->text, NULL, 0, &p, &done);
    expect_parts(&p, done, w, "whole");
    const size_t len = strlen(w->text);
    for (size_t cut = 0; cut <= len; cut++) {
        parse_cut(w->text, &cut, 1, &p, &done);
        char how[64];
        snprintf(how, sizeof how, "split at byte %zu", cut);
        expect_parts(&p, done, w, how);
    }
    size_t *cuts = malloc(len * sizeof *cuts);
    for (size_t i = 0; i < len; i++)
        cuts[i] = i;
    parse_cut(w->text, cuts, len, &p, &done);
    expect_parts(&p, done, w, "byte by byte");
    free(cuts);
}

Test(harmony, analysis_then_final) {
    check(&(struct want){
        "<|channel|>analysis<|message|>User says hi. Reply.<|end|><|start|>assistant<|channel|>"
        "final<|message|>Hello! How can I help?<|return|>",
        "Hello! How can I help?", "User says hi. Reply.", "", "", true});
}

Test(harmony, final_only) {
    check(&(struct want){"<|channel|>final<|message|>Just the answer.<|return|>",
                         "Just the answer.", "", "", "", true});
}

// Cut off mid-analysis (max_tokens): what was written is reasoning, no
// answer; a marker cut in half is text after all.
Test(harmony, truncated_in_analysis) {
    check(&(struct want){"<|channel|>analysis<|message|>Let me think about <b> and <|e", "",
                         "Let me think about <b> and <|e", "", "", false});
    check(&(struct want){"<|channel|>analy", "", "", "", "", false});
}

// Text after the end of the answer is not shown.
Test(harmony, nothing_after_return) {
    check(&(struct want){"<|channel|>final<|message|>A<|return|>B<|start|>assistant", "A", "", "",
                         "", true});
}

// gpt-oss's stray commentary channel before the analysis, a preamble on the
// commentary channel (content, as llama.cpp's parser), markers' look-alikes
// in the text.
Test(harmony, stray_and_preamble) {
    check(&(struct want){"<|channel|>commentary to=assistant<|channel|>analysis<|message|>a<|x|>b"
                         "<|end|><|start|>assistant<|channel|>commentary<|message|>Checking. "
                         "<|end|><|start|>assistant<|channel|>final<|message|>Done <|en<|return|>",
                         "Checking. Done <|en", "a<|x|>b", "", "", true});
}

// A model that does not write harmony: everything is content.
Test(harmony, plain_text) {
    check(&(struct want){"Hello <|channel|> world", "Hello <|channel|> world", "", "", "", false});
    check(&(struct want){"<b>bold</b>", "<b>bold</b>", "", "", "", false});
}

// Tool calls, the recipient in the channel and in the role; a built-in
// tool's call is dropped.
Test(harmony, tool_calls) {
    check(&(struct want){"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                         "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                         "<|message|>{\"city\":\"Paris\"}<|call|>",
                         "", "Need weather.", "get_weather", "{\"city\":\"Paris\"}", true});
    check(&(struct want){" to=functions.add<|channel|>commentary json<|message|>{\"a\":1}<|call|>",
                         "", "", "add", "{\"a\":1}", true});
    check(&(struct want){"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>"
                         "commentary to=browser.search<|message|>{\"q\":1}<|end|><|start|>"
                         "assistant<|channel|>final<|message|>y<|return|>",
                         "y", "x", "", "", true});
}

// Random texts built from harmony's pieces (markers, channel names,
// recipients, fragments of markers, plain text): each part's text is the
// same whole, cut at random points and byte by byte, and nothing is lost or
// invented: every byte emitted comes from the text (no part is longer than
// it).
Test(harmony, random_texts_split_anywhere) {
    static const char *const pieces[] = {"<|channel|>",
                                         "<|message|>",
                                         "<|start|>",
                                         "<|end|>",
                                         "<|return|>",
                                         "<|call|>",
                                         "<|constrain|>",
                                         "analysis",
                                         "final",
                                         "commentary",
                                         " to=functions.f",
                                         " to=browser.x",
                                         " to=assistant",
                                         "assistant",
                                         "json",
                                         "hi ",
                                         "<",
                                         "|",
                                         "<|",
                                         "<|e",
                                         "\n",
                                         "{\"a\":1}"};
    rng_seed(35);
    for (int c = 0; c < 2000; c++) {
        char text[512] = "";
        const int n = irand(0, 24);
        for (int i = 0; i < n; i++)
            strcat(text, pieces[irand(0, (int)LEN(pieces) - 1)]);
        const size_t len = strlen(text);
        struct parts whole, cut;
        bool done_whole, done_cut;
        parse_cut(text, NULL, 0, &whole, &done_whole);
        size_t cuts[3];
        for (int k = 0; k < 3; k++)
            cuts[k] = (size_t)irand(0, (int)len);
        for (int a = 0; a < 3; a++) // ascending
            for (int b = a + 1; b < 3; b++)
                if (cuts[b] < cuts[a]) {
                    size_t t = cuts[a];
                    cuts[a] = cuts[b];
                    cuts[b] = t;
                }
        parse_cut(text, cuts, 3, &cut, &done_cut);
        size_t sum = 0;
        for (int k = 0; k < 4; k++) {
            cr_assert_str_eq(cut.text[k], whole.text[k], "part %d of \"%s\" cut at %zu %zu %zu", k,
                             text, cuts[0], cuts[1], cuts[2]);
            sum += k == HARMONY_TOOL_NAME ? 0 : whole.len[k];
        }
        cr_assert_eq(done_cut, done_whole, "%s", text);
        cr_assert_leq(sum, len, "more text out than in: %s", text);
    }
}

// An emit that fails stops the push with its code.
static int refuse(void *user, enum harmony_part part, const char *s, size_t n) {
    (void)user, (void)part, (void)s, (void)n;
    return -7;
}

Test(harmony, emit_error) {
    struct harmony h;
    harmony_init(&h);
    const char *t = "<|channel|>final<|message|>text";
    cr_expect_eq(harmony_push(&h, t, strlen(t), refuse, NULL), -7);
}
