// host/grammar: the GBNF parser on llama.cpp's example grammars and on
// broken ones (errors name line and column), the matcher (whole strings,
// UTF-8 classes and characters split across tokens, repetition bounds, the
// end), and the token trie walk against a check of every token, on a
// synthetic vocabulary and on SmolLM2's real one (skipped where the model
// is not in the cache).
#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "host/engine/constrain.h"
#include "tests/grammar_helpers.h"
#include "tools/default_model.h"

// --- parsing ---------------------------------------------------------------------

Test(grammar, parses_the_example_grammars) {
    const char *texts[] = {GH_JSON, GH_ARITHMETIC, GH_LIST, GH_CHESS, GH_JAPANESE};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct grammar *g = gh_parse(texts[i]);
        cr_expect_gt(grammar_n_rules(g), 1);
        grammar_free(g);
    }
}

// An error's message, asserting that parsing fails with code.
static void expect_error(const char *text, int code, const char *want) {
    struct grammar *g = NULL;
    struct verr err = {0};
    int rc = grammar_parse(&g, text, strlen(text), NULL, &err);
    cr_expect_eq(rc, code, "%s: rc %d (%s)", text, rc, err.msg);
    cr_expect_null(g);
    cr_expect(strstr(err.msg, want), "%s\ngot:  %s\nwant: %s", text, err.msg, want);
}

Test(grammar, errors_name_line_column_and_what_was_expected) {
    expect_error("root ::= \"a\" | (\"b\"]\n", VERR_FORMAT,
                 "grammar:1:20: expected ')', found ']'");
    expect_error("root ::= [a-", VERR_FORMAT, "grammar:1:13: expected a character");
    expect_error("root ::= foo\n", VERR_FORMAT,
                 "grammar:1:10: rule 'foo' is used but never defined");
    expect_error("root ::= \"\\q\"\n", VERR_FORMAT, "grammar:1:12: expected an escape");
    expect_error("root ::= \"a\"{3,1}\n", VERR_FORMAT, "grammar:1:13: the maximum is below");
    expect_error("root ::= \"a\"{2001}\n", VERR_FORMAT, "at most 2000 repetitions");
    expect_error("root \"a\"\n", VERR_FORMAT,
                 "grammar:1:6: expected '::=' after the rule name 'root', found '\"'");
    expect_error("# comment\nroot ::= \"a\"\n  x ::= \"b\" )\n", VERR_FORMAT,
                 "grammar:3:13: expected a line break or the end of the rule 'x', found ')'");
    expect_error("root ::= * \"a\"\n", VERR_FORMAT, "grammar:1:10: a repetition needs an item");
    expect_error("root ::= \"\\x4\"\n", VERR_FORMAT, "grammar:1:14: expected 2 hex digits");
    expect_error("root ::= \"abc\n", VERR_FORMAT, "expected '\"' to close the string");
    expect_error("start ::= \"a\"\n", VERR_FORMAT, "no rule 'root'");
    expect_error("root ::= <think>\n", VERR_FORMAT, "needs a vocabulary");
    expect_error("root ::= \"a\"\nroot ::= \"b\" \x01\n", VERR_FORMAT, "grammar:2:14:");
    // Left recursion, direct and through a rule that can be empty.
    expect_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n",
                 VERR_UNSUPPORTED, "left recursion: rule 'expr'");
    expect_error("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= c\nc ::= \"\" | \"z\"\n",
                 VERR_UNSUPPORTED, "left recursion: rule 'a'");
    // Nested repetitions multiply: llama.cpp's threshold.
    expect_error("root ::= ((\"a\"{0,100}){0,100})\n", VERR_FORMAT, "nested repetitions too large");
}

Test(grammar, syntax_details) {
    // Alternatives continue on the next line after '|', groups span lines,
    // comments anywhere, CRLF line ends, escapes and '.'.
    struct grammar *g =
        gh_parse("root ::= \"a\" |\n  \"b\" # comment\r\nx ::= (\n \"c\"\n | \"d\" )\n");
    cr_expect(gh_matches(g, "a") && gh_matches(g, "b") && !gh_matches(g, "c"));
    grammar_free(g);
    g = gh_parse("root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\" [\\[\\]\\-] .");
    cr_expect(gh_matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\-z"));
    cr_expect(gh_matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\]\xe4\xb8\x80"));
    cr_expect(!gh_matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\x"));
    grammar_free(g);
    // Token elements by id; <text> through a lookup.
    g = gh_parse("root ::= <[5]> !<[7]>\n");
    cr_expect_eq(grammar_n_rules(g), 1);
    grammar_free(g);
    // Names with '-' and '_'; a group's rules are named after their rule.
    g = gh_parse("root ::= my-rule_2 (\"x\")\nmy-rule_2 ::= \"y\"\n");
    cr_expect_str_eq(grammar_rule_name(g, 0), "root");
    cr_expect_str_eq(grammar_rule_name(g, 2), "root_2");
    grammar_free(g);
}

// --- matching --------------------------------------------------------------------

Test(grammar, example_grammars_accept_and_refuse) {
    struct grammar *g = gh_parse(GH_JSON);
    cr_expect(gh_matches(g, "{\"a\": [1, 2.5e3, \"x\\n\\u00e9\", true, null, {}]}"));
    cr_expect(gh_matches(g, "{}"));
    cr_expect(!gh_matches(g, "{\"a\": }"));
    cr_expect(!gh_matches(g, "{\"a\": 01}"));
    cr_expect(!gh_matches(g, "[1]"), "json.gbnf's root is an object");
    cr_expect(gh_prefix(g, "{\"a\": [1, "));
    cr_expect(!gh_prefix(g, "{\"a\" 1"));
    grammar_free(g);

    g = gh_parse(GH_ARITHMETIC);
    cr_expect(gh_matches(g, "x = 1\n"));
    cr_expect(gh_matches(g, "(a+b)*c = 42\ny2 = y\n"));
    cr_expect(!gh_matches(g, "x = \n"));
    grammar_free(g);

    g = gh_parse(GH_CHESS);
    cr_expect(gh_matches(g, "1. e4 e5\n2. Nf3 Nc6\n"));
    cr_expect(gh_matches(g, "1. e4 e5\n2. O-O-O Qxd8#\n"));
    cr_expect(!gh_matches(g, "1. e4 e5\n"), "at least one more move");
    cr_expect(!gh_matches(g, "1. e9 e5\n2. a1 a2\n"));
    grammar_free(g);

    g = gh_parse(GH_LIST);
    cr_expect(gh_matches(g, "- one\n- two\n"));
    cr_expect(!gh_matches(g, "- \n"));
    cr_expect(!gh_matches(g, "- a\xe2\x80\xa8\n"), "U+2028 is excluded");
    grammar_free(g);
}

Test(grammar, utf8_classes_and_split_characters) {
    struct grammar *g = gh_parse(GH_JAPANESE);
    cr_expect(gh_matches(g, "こんにちは 世界"));
    cr_expect(!gh_matches(g, "hello"));
    cr_expect(!gh_matches(g, "こんにちは\xe4"), "an unfinished character cannot end");
    // The bytes of one character across three calls (tokens).
    struct grammar_state *st = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_state_new(&st, g, &err), 0);
    const char *hi = "\xe3\x81\x82"; // あ
    cr_expect_eq(grammar_state_accept_bytes(st, hi, 1, &err), 0, "%s", err.msg);
    cr_expect(!grammar_state_can_end(st));
    cr_expect_eq(grammar_state_accept_bytes(st, hi + 1, 1, &err), 0, "%s", err.msg);
    cr_expect_eq(grammar_state_accept_bytes(st, hi + 2, 1, &err), 0, "%s", err.msg);
    cr_expect(grammar_state_can_end(st));
    // A lead byte no class can take (U+0400.. is in none of them) is refused
    // at once; so is a continuation byte out of place.
    cr_expect_eq(grammar_state_accept_bytes(st, "\xd0", 1, &err), VERR_RANGE);
    cr_expect_eq(grammar_state_accept_bytes(st, "\x81", 1, &err), VERR_RANGE);
    grammar_state_free(st);
    grammar_free(g);
    // Negated classes take any character but theirs, multi-byte ones too.
    g = gh_parse("root ::= [^a-z]+");
    cr_expect(gh_matches(g, "\xf0\x9f\x98\x80"
                            "A1"));
    cr_expect(!gh_matches(g, "Ab"));
    grammar_free(g);
}

Test(grammar, repetition_bounds) {
    struct grammar *g = gh_parse("root ::= \"a\"{2,4}");
    const char *yes[] = {"aa", "aaa", "aaaa"}, *no[] = {"", "a", "aaaaa"};
    for (int i = 0; i < 3; i++) {
        cr_expect(gh_matches(g, yes[i]), "%s", yes[i]);
        cr_expect(!gh_matches(g, no[i]), "%s", no[i]);
    }
    grammar_free(g);
    g = gh_parse("root ::= [0-9]{3} \"-\" [0-9]{2,} \"-\" (\"x\" \"y\"){0,2}");
    cr_expect(gh_matches(g, "123-45-"));
    cr_expect(gh_matches(g, "123-456789-xyxy"));
    cr_expect(!gh_matches(g, "12-45-"));
    cr_expect(!gh_matches(g, "123-4-"));
    cr_expect(!gh_matches(g, "123-45-xyxyxy"));
    cr_expect(!gh_matches(g, "123-45-xyx"));
    grammar_free(g);
    g = gh_parse("root ::= \"a\"+ \"b\"* \"c\"?");
    cr_expect(gh_matches(g, "a") && gh_matches(g, "aabbc") && !gh_matches(g, "bc"));
    grammar_free(g);
}

Test(grammar, end_of_grammar) {
    struct grammar *g = gh_parse("root ::= \"ab\" \"c\"?");
    struct grammar_state *st = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_state_new(&st, g, &err), 0);
    cr_expect(!grammar_state_can_end(st));
    cr_expect_eq(grammar_state_accept_bytes(st, "ab", 2, &err), 0);
    cr_expect(grammar_state_can_end(st), "\"ab\" is a whole match");
    cr_expect(!grammar_state_done(st), "\"c\" may follow");
    cr_expect_eq(grammar_state_accept_bytes(st, "c", 1, &err), 0);
    cr_expect(grammar_state_done(st));
    cr_expect_eq(grammar_state_accept_bytes(st, "c", 1, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "not allowed here"), "%s", err.msg);
    grammar_state_reset(st);
    cr_expect(!grammar_state_can_end(st));
    grammar_state_free(st);
    grammar_free(g);
}

// --- tokens and the trie -------------------------------------------------------------

// A synthetic vocabulary: every string of 1..3 bytes over a small alphabet
// (ASCII, a JSON quote and brace, a space, and the bytes of é and 世 so that
// partial characters and stray continuation bytes occur), one empty control
// token, two end-of-generation tokens.
struct synth_vocab {
    char tok[4096][4];
    const char *bytes[4096];
    size_t lens[4096];
    bool eog[4096];
    int32_t n;
};

static void synth_build(struct synth_vocab *sv) {
    static const char alpha[] = {'a', '1',    '"',    '{',    '}',    ' ',   ':',
                                 ',', '\xc3', '\xa9', '\xe4', '\xb8', '\x96'};
    const int na = (int)sizeof alpha;
    sv->n = 0;
    for (int len = 1; len <= 3; len++) {
        int total = 1;
        for (int k = 0; k < len; k++)
            total *= na;
        for (int x = 0; x < total; x++) {
            int v = x;
            for (int k = 0; k < len; k++, v /= na)
                sv->tok[sv->n][k] = alpha[v % na];
            sv->lens[sv->n] = (size_t)len;
            sv->n++;
        }
    }
    sv->lens[sv->n++] = 0; // a control token
    sv->eog[sv->n] = true;
    sv->lens[sv->n++] = 0;
    sv->eog[sv->n] = true;
    memcpy(sv->tok[sv->n], "</s>", 4);
    sv->lens[sv->n++] = 4;
    for (int32_t i = 0; i < sv->n; i++)
        sv->bytes[i] = sv->tok[i];
}

// Walks g with the tokens of text, checking the allowed set at every step.
static void check_walk(struct grammar *g, const struct grammar_vocab *v, const char *const *steps,
                       int n_steps, const char *what) {
    struct grammar_state *st = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_state_new(&st, g, &err), 0, "%s", err.msg);
    char label[256];
    for (int i = 0; i <= n_steps; i++) {
        snprintf(label, sizeof label, "%s after %d steps", what, i);
        gh_check_allowed(st, v, label);
        if (i < n_steps)
            cr_assert_eq(grammar_state_accept_bytes(st, steps[i], strlen(steps[i]), &err), 0,
                         "%s: step %d \"%s\": %s", what, i, steps[i], err.msg);
    }
    grammar_state_free(st);
}

Test(grammar, trie_walk_equals_checking_every_token_synthetic) {
    static struct synth_vocab sv;
    synth_build(&sv);
    struct grammar_vocab *v = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_vocab_new(&v, sv.n, sv.bytes, sv.lens, sv.eog, &err), 0, "%s", err.msg);
    cr_expect_lt(grammar_vocab_n_nodes(v), (size_t)sv.n * 2, "shared prefixes share nodes");
    struct grammar *g = gh_parse(GH_JSON);
    const char *json_steps[] = {"{", "\"a", "\xc3", "\xa9\"", ": ", "1", "1}"};
    check_walk(g, v, json_steps, 7, "json");
    grammar_free(g);
    g = gh_parse("root ::= [^a]* \"\xe4\xb8\x96\" | <[3]> \"a\"");
    const char *cjk_steps[] = {"1", "\xe4", "\xb8"};
    check_walk(g, v, cjk_steps, 3, "cjk");
    grammar_free(g);
    // Token elements: the tokens they name, with or without bytes.
    g = gh_parse("root ::= <[5]> (!<[0]>)? \"a\"");
    struct grammar_state *st = NULL;
    cr_assert_eq(grammar_state_new(&st, g, &err), 0);
    cr_expect_eq(gh_check_allowed(st, v, "token element"), 1);
    cr_expect(grammar_state_allows(st, v, 5));
    cr_expect_eq(grammar_state_accept(st, v, 5, &err), 0, "%s", err.msg);
    const int32_t control = sv.n - 3;
    cr_expect(grammar_state_allows(st, v, control), "!<[0]> takes a token without bytes");
    cr_expect(grammar_state_allows(st, v, 1), "!<[0]> takes any other token");
    gh_check_allowed(st, v, "negated token element");
    grammar_state_free(st);
    grammar_free(g);
    grammar_vocab_free(v);
}

Test(grammar, eog_only_where_the_grammar_can_end) {
    static struct synth_vocab sv;
    synth_build(&sv);
    struct grammar_vocab *v = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_vocab_new(&v, sv.n, sv.bytes, sv.lens, sv.eog, &err), 0, "%s", err.msg);
    struct grammar *g = gh_parse("root ::= \"a\"+");
    struct grammar_state *st = NULL;
    cr_assert_eq(grammar_state_new(&st, g, &err), 0);
    const int32_t eog = sv.n - 2;
    cr_expect(!grammar_state_allows(st, v, eog));
    cr_expect_eq(grammar_state_accept(st, v, eog, &err), VERR_RANGE);
    cr_expect_eq(grammar_state_accept(st, v, 0, &err), 0, "token 0 is \"a\": %s", err.msg);
    cr_expect(grammar_state_allows(st, v, eog));
    cr_expect(!grammar_state_allows(st, v, sv.n - 3), "an empty control token is never text");
    cr_expect_eq(grammar_state_accept(st, v, eog, &err), 0);
    grammar_state_free(st);
    grammar_free(g);
    grammar_vocab_free(v);
}

// --- the real vocabulary ---------------------------------------------------------------

Test(grammar, trie_walk_equals_checking_every_token_smollm2, .timeout = 300) {
    char path[1200];
    if (!gh_smollm2_path(path, sizeof path))
        cr_skip_test("%s not in the model cache (bash tools/model_cache.sh fetches it)",
                     TOOLS_DEFAULT_MODEL_FILE);
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    struct grammar_vocab *v = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    cr_assert_eq(tokenizer_load(&t, f, &err), 0, "%s", err.msg);
    cr_assert_eq(constrain_vocab_new(&v, t, &err), 0, "%s", err.msg);
    cr_log_info("SmolLM2: %d tokens, %zu trie nodes", grammar_vocab_n_tokens(v),
                grammar_vocab_n_nodes(v));
    struct grammar *g = gh_parse(GH_JSON);
    const char *json_steps[] = {"{",    "\"na", "me\"",       ": ", "\"", "Bob \xc3",
                                "\xa9", "\", ", "\"age\": 4", "2",  "}"};
    check_walk(g, v, json_steps, 11, "json on SmolLM2");
    grammar_free(g);
    g = gh_parse(GH_CHESS);
    const char *chess_steps[] = {"1. e4", " e5\n", "2"};
    check_walk(g, v, chess_steps, 3, "chess on SmolLM2");
    grammar_free(g);
    g = gh_parse(GH_JAPANESE);
    const char *jp_steps[] = {"\xe3\x81", "\x82"};
    check_walk(g, v, jp_steps, 2, "japanese on SmolLM2");
    grammar_free(g);
    // <text> token elements name the token with that text.
    struct grammar *gt = NULL;
    const char *txt = "root ::= <|im_end|> \"x\"";
    cr_assert_eq(constrain_parse(&gt, t, txt, strlen(txt), NULL, &err), 0, "%s", err.msg);
    grammar_free(gt);
    grammar_vocab_free(v);
    tokenizer_free(t);
    gguf_close(f);
}

// --- the sampler hook ------------------------------------------------------------------

#include "host/backend/sampler.h"

// The sampler keeps to the grammar whatever the logits say, lets the end
// token through only at the end, and a dead end is an error, not a token.
Test(grammar, sampler_follows_the_grammar) {
    static struct synth_vocab sv;
    synth_build(&sv);
    struct grammar_vocab *v = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_vocab_new(&v, sv.n, sv.bytes, sv.lens, sv.eog, &err), 0, "%s", err.msg);
    struct grammar *g = gh_parse("root ::= \"{\" \"1\"+ \"}\"");
    float *logits = calloc((size_t)sv.n, sizeof *logits);
    for (int32_t i = 0; i < sv.n; i++)
        logits[i] = (float)(i % 7); // the grammar's tokens are not the likely ones
    struct sampler_params p;
    sampler_params_default(&p);
    p.seed = 7;
    p.grammar = g;
    p.grammar_vocab = v;
    struct sampler *s = NULL;
    cr_assert_eq(sampler_create(&s, &p, sv.n, &err), 0, "%s", err.msg);
    grammar_free(g); // the sampler holds its own reference
    cr_expect(!sampler_penalties_off(s), "a grammar keeps sampling on the host");
    char out[64] = "";
    size_t n = 0;
    for (int step = 0; step < 40; step++) {
        int32_t tok = -1;
        cr_assert_eq(sampler_sample_checked(s, logits, &tok, &err), 0, "%s", err.msg);
        cr_assert_eq(sampler_accept_checked(s, tok, &err), 0, "%s", err.msg);
        if (sv.eog[tok])
            break;
        memcpy(out + n, sv.bytes[tok], sv.lens[tok]);
        n += sv.lens[tok];
        cr_assert_lt(n, sizeof out - 4);
    }
    out[n] = '\0';
    struct grammar *check = gh_parse("root ::= \"{\" \"1\"+ \"}\"");
    cr_expect(gh_matches(check, out), "sampled \"%s\"", out);
    grammar_free(check);
    // Greedy too, and a token the grammar refuses is refused by accept.
    sampler_reset(s);
    cr_expect_eq(sampler_accept(s, 0), VERR_RANGE, "\"a\" cannot start it");
    sampler_free(s);
    // A vocabulary without end tokens: once the grammar has ended, nothing can follow.
    struct grammar_vocab *v2 = NULL;
    cr_assert_eq(grammar_vocab_new(&v2, sv.n, sv.bytes, sv.lens, NULL, &err), 0);
    p.grammar = g = gh_parse("root ::= \"a\"");
    p.grammar_vocab = v2;
    p.temp = 0;
    cr_assert_eq(sampler_create(&s, &p, sv.n, &err), 0, "%s", err.msg);
    int32_t tok = -1;
    cr_expect_eq(sampler_sample_checked(s, logits, &tok, &err), 0, "%s", err.msg);
    cr_expect_eq(tok, 0, "greedy over the one allowed token");
    cr_expect_eq(sampler_accept(s, tok), 0);
    cr_expect_eq(sampler_sample_checked(s, logits, &tok, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "no end-of-generation token"), "%s", err.msg);
    cr_expect_eq(sampler_sample(s, logits), -1);
    // Without a vocabulary, or one of another size: refused.
    p.grammar_vocab = NULL;
    struct sampler *bad = NULL;
    cr_expect_eq(sampler_create(&bad, &p, sv.n, &err), VERR_RANGE);
    sampler_free(s);
    grammar_free(g);
    grammar_vocab_free(v2);
    grammar_vocab_free(v);
    free(logits);
}
