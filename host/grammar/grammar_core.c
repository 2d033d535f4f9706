// The grammar object (references, names, printing, the left-recursion
// check) and the pushdown-stack operations the matcher and the trie walk
// share (llama.cpp's llama_grammar_advance_stack / match_char /
// match_partial_char).
#include "host/grammar/grammar_impl.h"

#include <stdlib.h>
#include <string.h>

struct grammar *grammar_ref(struct grammar *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_free(struct grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1)
        return;
    if (g->rule_names)
        for (uint32_t i = 0; i < g->n_rules; i++)
            free(g->rule_names[i]);
    free(g->rule_names);
    free(g->rule_start);
    free(g->elems);
    free(g);
}

int grammar_n_rules(const struct grammar *g) {
    return (int)g->n_rules;
}

const char *grammar_rule_name(const struct grammar *g, int rule) {
    return rule >= 0 && (uint32_t)rule < g->n_rules ? g->rule_names[rule] : NULL;
}

static bool is_end_of_seq(const struct gelem *e) {
    return e->type == GE_END || e->type == GE_ALT;
}

static bool is_char_elem(uint32_t t) {
    return t == GE_CHAR || t == GE_CHAR_NOT || t == GE_CHAR_ALT || t == GE_CHAR_RNG_UPPER ||
           t == GE_CHAR_ANY;
}

// --- printing ------------------------------------------------------------------

static void print_cp(FILE *f, uint32_t c) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\' && c != ']' && c != '-')
        fputc((int)c, f);
    else if (c <= 0xFF)
        fprintf(f, "\\x%02X", c);
    else if (c <= 0xFFFF)
        fprintf(f, "\\u%04X", c);
    else
        fprintf(f, "\\U%08X", c);
}

void grammar_print(const struct grammar *g, FILE *f) {
    for (uint32_t r = 0; r < g->n_rules; r++) {
        fprintf(f, "%s ::=", g->rule_names[r]);
        for (const struct gelem *e = g->elems + g->rule_start[r]; e->type != GE_END; e++) {
            switch (e->type) {
            case GE_ALT:
                fprintf(f, " |");
                break;
            case GE_RULE_REF:
                fprintf(f, " %s", g->rule_names[e->value]);
                break;
            case GE_CHAR:
            case GE_CHAR_NOT:
                fprintf(f, e->type == GE_CHAR ? " [" : " [^");
                print_cp(f, e->value);
                break;
            case GE_CHAR_RNG_UPPER:
                fputc('-', f);
                print_cp(f, e->value);
                break;
            case GE_CHAR_ALT:
                print_cp(f, e->value);
                break;
            case GE_CHAR_ANY:
                fprintf(f, " .");
                break;
            case GE_TOKEN:
            case GE_TOKEN_NOT:
                fprintf(f, e->type == GE_TOKEN ? " <[%u]>" : " !<[%u]>", e->value);
                break;
            }
            if ((e->type == GE_CHAR || e->type == GE_CHAR_NOT || e->type == GE_CHAR_ALT ||
                 e->type == GE_CHAR_RNG_UPPER) &&
                !(e[1].type == GE_CHAR_ALT || e[1].type == GE_CHAR_RNG_UPPER))
                fputc(']', f);
        }
        fputc('\n', f);
    }
}

// --- left recursion ------------------------------------------------------------

// Rules that can match the empty string: an alternative whose elements are
// all references to such rules (a fixed point, so indirect cases count).
static void find_nullable(const struct grammar *g, bool *nullable) {
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            bool alt_ok = true;
            for (const struct gelem *e = g->elems + g->rule_start[r];; e++) {
                if (is_end_of_seq(e)) {
                    if (alt_ok) {
                        nullable[r] = changed = true;
                        break;
                    }
                    if (e->type == GE_END)
                        break;
                    alt_ok = true;
                } else if (e->type != GE_RULE_REF || !nullable[e->value]) {
                    alt_ok = false;
                }
            }
        }
    }
}

// Calls visit(rule s) for every rule s that rule r can begin with: the
// references of each alternative up to and including its first one that is
// not nullable. Returns the count written to out.
static uint32_t left_refs(const struct grammar *g, const bool *nullable, uint32_t r,
                          uint32_t *out) {
    uint32_t n = 0;
    bool open = true;
    for (const struct gelem *e = g->elems + g->rule_start[r];; e++) {
        if (is_end_of_seq(e)) {
            if (e->type == GE_END)
                return n;
            open = true;
        } else if (open && e->type == GE_RULE_REF) {
            out[n++] = e->value;
            open = nullable[e->value];
        } else {
            open = false;
        }
    }
}

int grammar_check_left_recursion(const struct grammar *g, struct verr *err);
int grammar_check_left_recursion(const struct grammar *g, struct verr *err) {
    const uint32_t n = g->n_rules;
    bool *nullable = calloc(n, sizeof *nullable);
    uint8_t *state = calloc(n, 1); // 0 new, 1 on the path, 2 done
    uint32_t *stack = malloc((size_t)n * sizeof *stack), *next = malloc((size_t)n * sizeof *next);
    uint32_t *refs = malloc(g->n_elems * sizeof *refs),
             *ref_off = malloc((n + 1) * sizeof *ref_off);
    int rc = 0;
    if (!nullable || !state || !stack || !next || !refs || !ref_off) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    find_nullable(g, nullable);
    ref_off[0] = 0;
    for (uint32_t r = 0; r < n; r++)
        ref_off[r + 1] = ref_off[r] + left_refs(g, nullable, r, refs + ref_off[r]);
    // Depth-first search without recursion: next[d] is the next edge to try
    // from stack[d].
    for (uint32_t s = 0; s < n && !rc; s++) {
        if (state[s])
            continue;
        uint32_t d = 0;
        stack[0] = s;
        next[0] = ref_off[s];
        state[s] = 1;
        while (!rc) {
            const uint32_t v = stack[d];
            if (next[d] == ref_off[v + 1]) {
                state[v] = 2;
                if (d-- == 0)
                    break;
                continue;
            }
            const uint32_t w = refs[next[d]++];
            if (state[w] == 1)
                rc = verr_set(err, VERR_UNSUPPORTED,
                              "grammar: left recursion: rule '%s' can begin with itself "
                              "(llama.cpp refuses it too; move the recursion to the right)",
                              g->rule_names[w]);
            else if (state[w] == 0) {
                state[w] = 1;
                stack[++d] = w;
                next[d] = ref_off[w];
            }
        }
    }
out:
    free(nullable);
    free(state);
    free(stack);
    free(next);
    free(refs);
    free(ref_off);
    return rc;
}

// --- stack sets ----------------------------------------------------------------

static uint32_t stack_hash(const uint32_t *s, size_t n) {
    uint32_t h = 2166136261u ^ (uint32_t)n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

void gstacks_clear(struct gstacks *s) {
    s->n = 0;
    s->n_pos = 0;
    s->overflow = false;
    if (s->start)
        s->start[0] = 0;
}

void gstacks_free(struct gstacks *s) {
    free(s->pos);
    free(s->start);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

// Room for n_stacks more stacks holding n_pos more entries.
static bool gstacks_reserve(struct gstacks *s, size_t n_stacks, size_t n_pos) {
    if (s->n + n_stacks + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        while (cap < s->n + n_stacks + 1)
            cap *= 2;
        uint32_t *st = realloc(s->start, (cap + 1) * sizeof *st);
        if (st)
            s->start = st;
        uint32_t *h = st ? realloc(s->hash, cap * sizeof *h) : NULL;
        if (!h)
            return false;
        s->hash = h;
        if (!s->cap)
            s->start[0] = 0;
        s->cap = cap;
    }
    if (s->n_pos + n_pos > s->cap_pos) {
        size_t cap = s->cap_pos ? s->cap_pos * 2 : 64;
        while (cap < s->n_pos + n_pos)
            cap *= 2;
        uint32_t *p = realloc(s->pos, cap * sizeof *p);
        if (!p)
            return false;
        s->pos = p;
        s->cap_pos = cap;
    }
    return true;
}

// Index of stk in s, or -1.
static long gstacks_find(const struct gstacks *s, const uint32_t *stk, size_t len, uint32_t h) {
    for (size_t i = 0; i < s->n; i++)
        if (s->hash[i] == h && s->start[i + 1] - s->start[i] == len &&
            !memcmp(s->pos + s->start[i], stk, len * sizeof *stk))
            return (long)i;
    return -1;
}

static void gstacks_push(struct gstacks *s, const uint32_t *stk, size_t len, uint32_t h) {
    if (s->n >= GRAMMAR_MAX_STACKS || len > GRAMMAR_MAX_DEPTH || !gstacks_reserve(s, 1, len)) {
        s->overflow = true;
        return;
    }
    if (len)
        memcpy(s->pos + s->n_pos, stk, len * sizeof *stk);
    s->n_pos += len;
    s->hash[s->n] = h;
    s->start[++s->n] = (uint32_t)s->n_pos;
}

void gstacks_add(struct gstacks *s, const uint32_t *stk, size_t len) {
    const uint32_t h = stack_hash(stk, len);
    if (gstacks_find(s, stk, len, h) < 0)
        gstacks_push(s, stk, len, h);
}

int gstacks_copy(struct gstacks *dst, const struct gstacks *src) {
    gstacks_clear(dst);
    if (!gstacks_reserve(dst, src->n, src->n_pos))
        return VERR_NOMEM;
    if (src->n_pos)
        memcpy(dst->pos, src->pos, src->n_pos * sizeof *src->pos);
    memcpy(dst->start, src->start, (src->n + 1) * sizeof *src->start);
    if (src->n)
        memcpy(dst->hash, src->hash, src->n * sizeof *src->hash);
    dst->n = src->n;
    dst->n_pos = src->n_pos;
    dst->overflow = src->overflow;
    return 0;
}

void gscratch_free(struct gscratch *w) {
    gstacks_free(&w->todo);
    gstacks_free(&w->seen);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}

// --- advancing -----------------------------------------------------------------

static uint32_t *tmp_reserve(struct gscratch *w, size_t n) {
    if (n > w->cap_tmp) {
        size_t cap = w->cap_tmp ? w->cap_tmp * 2 : 64;
        while (cap < n)
            cap *= 2;
        uint32_t *t = realloc(w->tmp, cap * sizeof *t);
        if (!t)
            return NULL;
        w->tmp = t;
        w->cap_tmp = cap;
    }
    return w->tmp;
}

// The alternatives of the rule referenced by the top of cur[0..len) (at
// position top), each pushed to todo as its own stack.
static void expand_ref(const struct grammar *g, const uint32_t *cur, size_t len, uint32_t top,
                       struct gstacks *todo) {
    const struct gelem *e = g->elems;
    uint32_t sub = g->rule_start[e[top].value];
    for (;;) {
        // cur without its top, then what follows the reference, then the alternative
        size_t n = len - 1;
        const bool more = !is_end_of_seq(&e[top + 1]), alt = !is_end_of_seq(&e[sub]);
        if (todo->overflow || !gstacks_reserve(todo, 1, n + 2)) {
            todo->overflow = true;
            return;
        }
        uint32_t *dst = todo->pos + todo->n_pos;
        memcpy(dst, cur, n * sizeof *cur);
        if (more)
            dst[n++] = top + 1;
        if (alt)
            dst[n++] = sub;
        if (n > GRAMMAR_MAX_DEPTH) {
            todo->overflow = true;
            return;
        }
        todo->n_pos += n;
        todo->hash[todo->n] = 0;
        todo->start[++todo->n] = (uint32_t)todo->n_pos;
        while (!is_end_of_seq(&e[sub]))
            sub++;
        if (e[sub].type != GE_ALT)
            return;
        sub++;
    }
}

void grammar_advance_stack(const struct grammar *g, const uint32_t *stk, size_t len,
                           struct gstacks *out, struct gscratch *w) {
    struct gstacks *todo = &w->todo, *seen = &w->seen;
    gstacks_clear(todo);
    gstacks_clear(seen);
    gstacks_push(todo, stk, len, 0);
    while (todo->n > 0 && !todo->overflow && !seen->overflow) {
        // Pop the last stack into tmp (todo grows while it is expanded).
        const size_t n = todo->start[todo->n] - todo->start[todo->n - 1];
        uint32_t *cur = tmp_reserve(w, n + 1);
        if (!cur) {
            out->overflow = true;
            return;
        }
        if (n)
            memcpy(cur, todo->pos + todo->start[todo->n - 1], n * sizeof *cur);
        todo->n--;
        todo->n_pos = todo->start[todo->n];
        const uint32_t h = stack_hash(cur, n);
        if (gstacks_find(seen, cur, n, h) >= 0)
            continue;
        gstacks_push(seen, cur, n, h);
        if (n == 0) {
            gstacks_add(out, cur, 0);
            continue;
        }
        const uint32_t top = cur[n - 1];
        if (g->elems[top].type == GE_RULE_REF)
            expand_ref(g, cur, n, top, todo);
        else
            gstacks_add(out, cur, n); // a terminal: a character class or a token
    }
    if (todo->overflow || seen->overflow)
        out->overflow = true;
}

// Whether cp is in the class starting at e; *after: the element past the class.
static bool match_char(const struct gelem *e, uint32_t cp, const struct gelem **after) {
    const bool positive = e->type == GE_CHAR || e->type == GE_CHAR_ANY;
    bool found = false;
    do {
        if (e[1].type == GE_CHAR_RNG_UPPER) {
            found = found || (e->value <= cp && cp <= e[1].value);
            e += 2;
        } else if (e->type == GE_CHAR_ANY) {
            found = true;
            e += 1;
        } else {
            found = found || e->value == cp;
            e += 1;
        }
    } while (e->type == GE_CHAR_ALT);
    *after = e;
    return found == positive;
}

// Whether some character starting like p can be in the class at e
// (llama_grammar_match_partial_char).
static bool match_partial(const struct gelem *e, struct gpartial p) {
    const bool positive = e->type == GE_CHAR || e->type == GE_CHAR_ANY;
    if (p.n_remain <= 0 || (p.n_remain == 1 && p.value < 2))
        return false; // nothing pending, or an overlong 2-byte form of a 7-bit char
    uint32_t low = p.value << (p.n_remain * 6);
    const uint32_t high = low | ((1u << (p.n_remain * 6)) - 1);
    if (low == 0)
        low = p.n_remain == 2 ? 1u << 11 : p.n_remain == 3 ? 1u << 16 : low;
    do {
        if (e[1].type == GE_CHAR_RNG_UPPER) {
            if (e->value <= high && low <= e[1].value)
                return positive;
            e += 2;
        } else if (e->type == GE_CHAR_ANY) {
            return true;
        } else {
            if (low <= e->value && e->value <= high)
                return positive;
            e += 1;
        }
    } while (e->type == GE_CHAR_ALT);
    return !positive;
}

void grammar_accept_cp(const struct grammar *g, const struct gstacks *in, uint32_t cp,
                       struct gstacks *out, struct gscratch *w) {
    gstacks_clear(out);
    for (size_t i = 0; i < in->n && !out->overflow; i++) {
        size_t len;
        const uint32_t *stk = gstacks_at(in, i, &len);
        if (len == 0)
            continue;
        const struct gelem *top = &g->elems[stk[len - 1]];
        if (!is_char_elem(top->type))
            continue; // a token element: never matched by text
        const struct gelem *after;
        if (!match_char(top, cp, &after))
            continue;
        // The stack without its top, then the element after the class (if
        // any), in a buffer of its own: grammar_advance_stack uses w->tmp.
        uint32_t small[64], *next = len + 1 <= 64 ? small : malloc((len + 1) * sizeof *next);
        if (!next) {
            out->overflow = true;
            return;
        }
        memcpy(next, stk, (len - 1) * sizeof *stk);
        size_t n = len - 1;
        if (!is_end_of_seq(after))
            next[n++] = (uint32_t)(after - g->elems);
        grammar_advance_stack(g, next, n, out, w);
        if (next != small)
            free(next);
    }
}

bool grammar_partial_ok(const struct grammar *g, const struct gstacks *s, struct gpartial p) {
    for (size_t i = 0; i < s->n; i++) {
        size_t len;
        const uint32_t *stk = gstacks_at(s, i, &len);
        if (len && is_char_elem(g->elems[stk[len - 1]].type) &&
            match_partial(&g->elems[stk[len - 1]], p))
            return true;
    }
    return false;
}

void grammar_initial_stacks(const struct grammar *g, struct gstacks *out, struct gscratch *w) {
    gstacks_clear(out);
    uint32_t pos = g->rule_start[g->root];
    for (;;) {
        const uint32_t one = pos;
        grammar_advance_stack(g, &one, is_end_of_seq(&g->elems[pos]) ? 0 : 1, out, w);
        while (!is_end_of_seq(&g->elems[pos]))
            pos++;
        if (g->elems[pos].type != GE_ALT)
            return;
        pos++;
    }
}
