// The grammar module's internals, shared by its parser, matcher and trie:
// llama.cpp's flat rule encoding (llama_grammar_element), stack sets and
// UTF-8 partial characters. Not for use outside host/grammar/.
#ifndef VELA_HOST_GRAMMAR_IMPL_H
#define VELA_HOST_GRAMMAR_IMPL_H

#include <stdatomic.h>

#include "host/grammar/grammar.h"

// One element of a rule. A rule is a list of alternatives separated by ALT
// and closed by END; a character class is CHAR or CHAR_NOT followed by
// CHAR_ALT (another char) and CHAR_RNG_UPPER (the upper end of a range
// starting at the element before it).
enum grammar_etype {
    GE_END = 0,
    GE_ALT,
    GE_RULE_REF, // value: rule id
    GE_CHAR,     // value: code point
    GE_CHAR_NOT, // value: code point, class negated
    GE_CHAR_RNG_UPPER,
    GE_CHAR_ALT,
    GE_CHAR_ANY,  // '.'
    GE_TOKEN,     // value: token id
    GE_TOKEN_NOT, // value: token id
};

struct gelem {
    uint32_t type;
    uint32_t value;
};

struct grammar {
    atomic_int refs;
    struct gelem *elems; // [n_elems] every rule, each ending with GE_END
    uint32_t n_elems;
    uint32_t *rule_start; // [n_rules] index of each rule's first element
    char **rule_names;    // [n_rules]
    uint32_t n_rules;
    uint32_t root;
};

// A set of stacks; stack i is pos[start[i] .. start[i + 1]) (bottom first),
// each entry an index into grammar.elems pointing at a terminal element
// (a character class or a token element) on top, or an empty stack (the
// grammar has ended on this path).
struct gstacks {
    uint32_t *pos;
    size_t n_pos, cap_pos;
    uint32_t *start; // [n + 1]
    uint32_t *hash;  // [n]
    size_t n, cap;
    bool overflow; // a limit was passed while filling it
};

void gstacks_clear(struct gstacks *s);
void gstacks_free(struct gstacks *s);
// Appends stk[0..len) unless an equal stack is present.
void gstacks_add(struct gstacks *s, const uint32_t *stk, size_t len);
int gstacks_copy(struct gstacks *dst, const struct gstacks *src);
static inline const uint32_t *gstacks_at(const struct gstacks *s, size_t i, size_t *len) {
    *len = s->start[i + 1] - s->start[i];
    return s->pos + s->start[i];
}

// Scratch space the matcher reuses between calls.
struct gscratch {
    struct gstacks todo, seen;
    uint32_t *tmp;
    size_t cap_tmp;
};
void gscratch_free(struct gscratch *w);

// Expands stk[0..len) into stacks whose top is a terminal (or empty), added
// to out: llama_grammar_advance_stack.
void grammar_advance_stack(const struct grammar *g, const uint32_t *stk, size_t len,
                           struct gstacks *out, struct gscratch *w);
// Every stack of in that takes code point cp, advanced, into out (cleared first).
void grammar_accept_cp(const struct grammar *g, const struct gstacks *in, uint32_t cp,
                       struct gstacks *out, struct gscratch *w);

// A character whose first bytes have been read: value holds their payload
// bits, n_remain the continuation bytes still to come (0: none pending).
struct gpartial {
    uint32_t value;
    int n_remain;
};
// Whether some stack of s can take a character that starts like p.
bool grammar_partial_ok(const struct grammar *g, const struct gstacks *s, struct gpartial p);

// Reads one byte into the partial character p. Returns 1 when a code point
// is complete (*cp), 0 when more bytes are needed, -1 on malformed UTF-8
// (and on a NUL byte).
static inline int gutf8_push(struct gpartial *p, uint8_t b, uint32_t *cp) {
    if (p->n_remain > 0) {
        if ((b >> 6) != 2)
            return -1;
        p->value = (p->value << 6) | (b & 0x3Fu);
        if (--p->n_remain > 0)
            return 0;
        *cp = p->value;
        p->value = 0;
        return 1;
    }
    if (b == 0)
        return -1;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xC0 && b < 0xE0)
        p->value = b & 0x1Fu, p->n_remain = 1;
    else if (b >= 0xE0 && b < 0xF0)
        p->value = b & 0x0Fu, p->n_remain = 2;
    else if (b >= 0xF0 && b < 0xF8)
        p->value = b & 0x07u, p->n_remain = 3;
    else
        return -1;
    return 0;
}

// The set of stacks at the start of g.
void grammar_initial_stacks(const struct grammar *g, struct gstacks *out, struct gscratch *w);

// Token byte strings and their trie. The trie's nodes are in preorder (node
// 0 the root, the empty prefix): node i spells the bytes of its ancestors
// then byte[i]; its subtree is [i, skip[i]); the tokens whose bytes end
// exactly there are sorted[tok[i] .. tok[i + 1]).
struct grammar_vocab {
    int32_t n_tokens;
    char *bytes;  // every token's bytes, one after the other
    size_t *off;  // [n_tokens + 1]
    uint8_t *eog; // [n_tokens]
    int32_t *eog_ids;
    int32_t n_eog;
    uint32_t n_nodes;
    uint8_t *byte;   // [n_nodes]
    uint16_t *depth; // [n_nodes]
    uint32_t *skip;  // [n_nodes]
    uint32_t *tok;   // [n_nodes + 1]
    int32_t *sorted; // [n_sorted] ids of the non-empty, non-EOG tokens in byte order
    int32_t n_sorted;
    uint32_t max_len; // bytes of the longest token in the trie
};

struct grammar_state {
    struct grammar *g;
    struct gstacks cur;      // where the text so far has left the grammar
    struct gpartial partial; // a character begun but not finished
    struct gscratch w;
    struct gstacks a, b, next;
    bool overflow;          // the last operation passed a limit
    struct gstacks *levels; // [n_levels] the trie walk's sets, one per depth
    size_t n_levels;
    uint8_t *mark; // [n_mark] tokens already listed by grammar_state_allowed
    size_t n_mark;
};

// Runs bytes[0..n) through the stacks of in after the partial character *p:
// the stacks left (in itself, or st->a / st->b) and the new *p, or NULL
// when no stack takes them (or they are not UTF-8).
const struct gstacks *grammar_run_bytes(struct grammar_state *st, const struct gstacks *in,
                                        struct gpartial *p, const uint8_t *bytes, size_t n);

#endif
