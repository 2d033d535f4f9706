// Test helpers (header-only) for host/grammar: llama.cpp's example grammars
// as vela's tests use them (written out for these tests: json, arithmetic,
// list, chess, japanese), whole-text matching, and the brute-force allowed
// set the token trie walk is compared with.
#ifndef VELA_TESTS_GRAMMAR_HELPERS_H
#define VELA_TESTS_GRAMMAR_HELPERS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/grammar/grammar.h"
#include "tools/default_model.h"

// The default model (SmolLM2-135M-Instruct Q4_1) in $VELA_CACHE or
// ~/.cache/vela, into path; false when it is not there at its full size.
static inline bool gh_smollm2_path(char *path, size_t cap) {
    const char *dir = getenv("VELA_CACHE");
    char home[1024];
    if (!dir || !*dir) {
        snprintf(home, sizeof home, "%s/.cache/vela", getenv("HOME") ? getenv("HOME") : "/root");
        dir = home;
    }
    snprintf(path, cap, "%s/%s", dir, TOOLS_DEFAULT_MODEL_FILE);
    struct stat sb;
    return stat(path, &sb) == 0 && sb.st_size == TOOLS_DEFAULT_MODEL_BYTES;
}

static const char GH_JSON[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
    "[1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char GH_ARITHMETIC[] = "root  ::= (expr \"=\" ws term \"\\n\")+\n"
                                    "expr  ::= term ([-+*/] term)*\n"
                                    "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
                                    "ident ::= [a-z] [a-z0-9_]* ws\n"
                                    "num   ::= [0-9]+ ws\n"
                                    "ws    ::= [ \\t\\n]*\n";

static const char GH_LIST[] = "root ::= item+\n"
                              "\n"
                              "# Excludes various line break characters\n"
                              "item ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ \"\\n\"\n";

static const char GH_CHESS[] = "# `root` specifies the pattern for the overall output\n"
                               "root ::= (\n"
                               "    # it must start with the characters \"1. \"\n"
                               "    \"1. \" move \" \" move \"\\n\"\n"
                               "\n"
                               "    # then further moves, numbered with one or two digits\n"
                               "    ([1-9] [0-9]? \". \" move \" \" move \"\\n\")+\n"
                               ")\n"
                               "\n"
                               "move    ::= (pawn | nonpawn | castle) [+#]?\n"
                               "pawn    ::= [a-h] [1-8]\n"
                               "nonpawn ::= [NBKQR] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
                               "castle  ::= \"O-O\" \"-O\"?\n";

static const char GH_JAPANESE[] = "root        ::= jp-char+ ([ \\t\\n] jp-char+)*\n"
                                  "jp-char     ::= hiragana | katakana | punctuation | cjk\n"
                                  "hiragana    ::= [ぁ-ゟ]\n"
                                  "katakana    ::= [ァ-ヿ]\n"
                                  "punctuation ::= [、-〾]\n"
                                  "cjk         ::= [一-鿿]\n";

// g parsed from text (asserting success).
static inline struct grammar *gh_parse(const char *text) {
    struct grammar *g = NULL;
    struct verr err = {0};
    int rc = grammar_parse(&g, text, strlen(text), NULL, &err);
    cr_assert_eq(rc, 0, "grammar_parse: %s\n%s", err.msg, text);
    return g;
}

// Whether g matches the whole of s.
static inline bool gh_matches(struct grammar *g, const char *s) {
    struct grammar_state *st = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_state_new(&st, g, &err), 0, "%s", err.msg);
    bool ok = grammar_state_accept_bytes(st, s, strlen(s), &err) == 0 && grammar_state_can_end(st);
    grammar_state_free(st);
    return ok;
}

// Whether s can begin a match of g.
static inline bool gh_prefix(struct grammar *g, const char *s) {
    struct grammar_state *st = NULL;
    struct verr err = {0};
    cr_assert_eq(grammar_state_new(&st, g, &err), 0, "%s", err.msg);
    bool ok = grammar_state_accept_bytes(st, s, strlen(s), &err) == 0;
    grammar_state_free(st);
    return ok;
}

static int gh_cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The trie walk's allowed set against grammar_state_allows on every token:
// asserts they are the same set; returns its size.
static inline int32_t gh_check_allowed(struct grammar_state *st, const struct grammar_vocab *v,
                                       const char *what) {
    const int32_t n_vocab = grammar_vocab_n_tokens(v);
    int32_t *ids = malloc((size_t)n_vocab * sizeof *ids), n = -1;
    struct verr err = {0};
    cr_assert_eq(grammar_state_allowed(st, v, ids, &n, &err), 0, "%s: %s", what, err.msg);
    qsort(ids, (size_t)n, sizeof *ids, gh_cmp_i32);
    int32_t k = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        const bool brute = grammar_state_allows(st, v, id);
        const bool walk = k < n && ids[k] == id;
        cr_assert_eq(walk, brute, "%s: token %d: trie walk %s it, the check of every token %s it",
                     what, id, walk ? "allows" : "refuses", brute ? "allows" : "refuses");
        k += walk;
    }
    cr_assert_eq(k, n, "%s: the walk listed %d ids, %d distinct in range", what, n, k);
    free(ids);
    return n;
}

#endif
