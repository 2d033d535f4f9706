// Grammar-constrained sampling: llama.cpp's GBNF grammars (grammars/README.md
// there), an incremental matcher per request, and a token trie per
// vocabulary that finds every token a matcher state allows without looking
// at the tokens a pruned prefix rules out.
//
// Three objects:
//   struct grammar        a parsed grammar: immutable, shared by reference
//                         (grammar_ref / grammar_free), safe to read from
//                         many threads;
//   struct grammar_vocab  the token byte strings of one vocabulary and their
//                         trie: built once per model, immutable, shared by
//                         every request;
//   struct grammar_state  one request's position in its grammar: llama.cpp's
//                         set of pushdown stacks plus a pending partial UTF-8
//                         character; owned by one thread at a time.
//
// Semantics follow llama.cpp (src/llama-grammar.cpp): a grammar matches code
// points; a token is allowed when its bytes, decoded as UTF-8 after the
// state's pending partial character, keep at least one stack alive (a token
// that ends inside a character is allowed when some stack can still take a
// character that starts with those bytes); an end-of-generation token is
// allowed only where the grammar can end. Where vela differs, it is
// stricter: malformed UTF-8 in a token (a continuation byte out of place, a
// NUL byte) rejects the token; the end is allowed only without a pending
// partial character; left recursion is found through rules that can match
// the empty string indirectly too.
//
// Token elements (<[id]>, !<[id]>, <text>) match a token by id: its bytes
// are not read, so a control token whose text is not shown may be named.
//
// Contract: functions returning int give 0 or a negative VERR_* code with a
// message in err (when err is not NULL); nothing prints or exits.
#ifndef VELA_HOST_GRAMMAR_H
#define VELA_HOST_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/verr.h"

// Limits that keep a hostile grammar from exhausting memory or time; a
// request that would pass one fails with VERR_FULL.
#define GRAMMAR_MAX_TEXT (1u << 20)  // bytes of grammar text
#define GRAMMAR_MAX_ELEMS (1u << 20) // elements after repetitions are expanded
#define GRAMMAR_MAX_STACKS 4096      // stacks one state may hold
#define GRAMMAR_MAX_DEPTH 2048       // elements one stack may hold

// ---------------------------------------------------------------------------
// Parsing

struct grammar;

struct grammar_opts {
    const char *root; // the start rule; NULL: "root"
    // Resolves <text> token elements to an id (TOKENIZER_NULL-style -1 when
    // there is no token with exactly that text); NULL: <text> is refused and
    // only <[id]> may name tokens.
    int32_t (*find_token)(void *user, const char *text, size_t len);
    void *find_user;
};

// Parses GBNF text[0..len) (UTF-8). Errors (VERR_FORMAT) name the line and
// column, what was expected and what was found ("grammar:3:14: expected
// ')', found '|'"); an undefined rule names its first use; a missing start
// rule, left recursion (VERR_UNSUPPORTED) and the limits above are refused.
// opts may be NULL.
int grammar_parse(struct grammar **out, const char *text, size_t len,
                  const struct grammar_opts *opts, struct verr *err);
// Another reference to g (the same object); each reference is freed once.
struct grammar *grammar_ref(struct grammar *g);
void grammar_free(struct grammar *g);

int grammar_n_rules(const struct grammar *g);
// A rule's name: the user's, or "<name>_<id>" for the rules groups and
// repetitions generate (as llama.cpp names them).
const char *grammar_rule_name(const struct grammar *g, int rule);
// Writes every rule in GBNF (llama.cpp's llama_grammar_parser::print form),
// one per line; for tests and --verbose.
void grammar_print(const struct grammar *g, FILE *f);

// ---------------------------------------------------------------------------
// The vocabulary

struct grammar_vocab;

// Builds the token trie of n_tokens tokens: bytes[i][0..lens[i]) is what
// token i adds to the output text (not NUL-terminated; a control token
// whose text is never shown has length 0), is_eog[i] marks end-of-generation
// tokens (NULL: none). Everything is copied. Tokens with no bytes are
// allowed only where a token element names them; end-of-generation tokens
// only where the grammar can end.
int grammar_vocab_new(struct grammar_vocab **out, int32_t n_tokens, const char *const *bytes,
                      const size_t *lens, const bool *is_eog, struct verr *err);
void grammar_vocab_free(struct grammar_vocab *v);
int32_t grammar_vocab_n_tokens(const struct grammar_vocab *v);
// Nodes of the trie (the root included), for tests and the benchmark.
size_t grammar_vocab_n_nodes(const struct grammar_vocab *v);

// ---------------------------------------------------------------------------
// The matcher

struct grammar_state;

// A state at the start of g (holds a reference to g).
int grammar_state_new(struct grammar_state **out, struct grammar *g, struct verr *err);
void grammar_state_free(struct grammar_state *st);
// Back to the start of the grammar.
void grammar_state_reset(struct grammar_state *st);
// True when the text so far is a complete match (an end-of-generation token
// is allowed now).
bool grammar_state_can_end(const struct grammar_state *st);
// True when no text at all can follow: the grammar has ended and nothing
// but its end is left.
bool grammar_state_done(const struct grammar_state *st);

// Whether token id of v is allowed next (end-of-generation tokens: when the
// grammar can end). Ids outside v are not allowed.
bool grammar_state_allows(const struct grammar_state *st, const struct grammar_vocab *v,
                          int32_t id);
// Advances st past token id. A token that is not allowed leaves st unchanged
// and fails with VERR_RANGE; an end-of-generation token leaves st unchanged.
int grammar_state_accept(struct grammar_state *st, const struct grammar_vocab *v, int32_t id,
                         struct verr *err);
// Advances st past raw text bytes[0..n) (no token elements can match them):
// VERR_RANGE, st unchanged, when the grammar does not allow them.
int grammar_state_accept_bytes(struct grammar_state *st, const char *bytes, size_t n,
                               struct verr *err);

// Every token of v allowed next, by walking v's trie with st: a prefix no
// stack can take prunes every token under it. Writes the ids (in no
// particular order, each once) to ids [grammar_vocab_n_tokens(v)] and their
// count to *n_ids. VERR_FULL: the grammar's stacks grew past the limits.
int grammar_state_allowed(struct grammar_state *st, const struct grammar_vocab *v, int32_t *ids,
                          int32_t *n_ids, struct verr *err);

#endif
