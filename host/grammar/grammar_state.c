// One request's matcher: the stacks of the text accepted so far, checked
// and advanced token by token (llama_grammar_accept_impl and the single
// candidate case of llama_grammar_apply_impl).
#include "host/grammar/grammar_impl.h"

#include <stdlib.h>
#include <string.h>

int grammar_state_new(struct grammar_state **out, struct grammar *g, struct verr *err) {
    *out = NULL;
    struct grammar_state *st = calloc(1, sizeof *st);
    if (!st)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    st->g = grammar_ref(g);
    grammar_state_reset(st);
    if (st->cur.overflow || st->cur.n == 0) {
        grammar_state_free(st);
        return verr_set(err, VERR_FULL,
                        "grammar: its start expands to more than %d stacks or %d levels",
                        GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH);
    }
    *out = st;
    return 0;
}

void grammar_state_free(struct grammar_state *st) {
    if (!st)
        return;
    grammar_free(st->g);
    gstacks_free(&st->cur);
    gstacks_free(&st->a);
    gstacks_free(&st->b);
    gstacks_free(&st->next);
    gscratch_free(&st->w);
    for (size_t i = 0; i < st->n_levels; i++)
        gstacks_free(&st->levels[i]);
    free(st->levels);
    free(st->mark);
    free(st);
}

void grammar_state_reset(struct grammar_state *st) {
    grammar_initial_stacks(st->g, &st->cur, &st->w);
    st->partial = (struct gpartial){0, 0};
    st->overflow = false;
}

bool grammar_state_can_end(const struct grammar_state *st) {
    if (st->partial.n_remain > 0)
        return false;
    for (size_t i = 0; i < st->cur.n; i++)
        if (st->cur.start[i + 1] == st->cur.start[i])
            return true;
    return false;
}

bool grammar_state_done(const struct grammar_state *st) {
    return grammar_state_can_end(st) && st->cur.n == 1;
}

const struct gstacks *grammar_run_bytes(struct grammar_state *st, const struct gstacks *in,
                                        struct gpartial *p, const uint8_t *bytes, size_t n) {
    const struct gstacks *cur = in;
    struct gstacks *bufs[2] = {&st->a, &st->b};
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        const int r = gutf8_push(p, bytes[i], &cp);
        if (r < 0)
            return NULL;
        if (r == 0)
            continue;
        struct gstacks *out = bufs[k];
        k ^= 1;
        grammar_accept_cp(st->g, cur, cp, out, &st->w);
        if (out->overflow)
            st->overflow = true;
        if (out->n == 0 || out->overflow)
            return NULL;
        cur = out;
    }
    if (p->n_remain > 0 && !grammar_partial_ok(st->g, cur, *p))
        return NULL;
    return cur;
}

// Whether the token element at the top of a stack (position top) takes id.
static bool token_elem_takes(const struct grammar *g, uint32_t top, int32_t id) {
    const struct gelem *e = &g->elems[top];
    return (e->type == GE_TOKEN && e->value == (uint32_t)id) ||
           (e->type == GE_TOKEN_NOT && e->value != (uint32_t)id);
}

static bool is_token_elem(const struct grammar *g, uint32_t top) {
    return g->elems[top].type == GE_TOKEN || g->elems[top].type == GE_TOKEN_NOT;
}

bool grammar_state_allows(const struct grammar_state *cst, const struct grammar_vocab *v,
                          int32_t id) {
    // The scratch buffers change, the state does not.
    struct grammar_state *st = (struct grammar_state *)cst;
    if (id < 0 || id >= v->n_tokens)
        return false;
    if (v->eog[id])
        return grammar_state_can_end(st);
    for (size_t i = 0; i < st->cur.n; i++) {
        size_t len;
        const uint32_t *stk = gstacks_at(&st->cur, i, &len);
        if (len && is_token_elem(st->g, stk[len - 1]) && token_elem_takes(st->g, stk[len - 1], id))
            return true;
    }
    const size_t n = v->off[id + 1] - v->off[id];
    struct gpartial p = st->partial;
    return n > 0 && grammar_run_bytes(st, &st->cur, &p, (const uint8_t *)v->bytes + v->off[id], n);
}

// The stacks whose token element takes id, advanced past it, into st->next.
static void advance_token_elems(struct grammar_state *st, int32_t id) {
    gstacks_clear(&st->next);
    for (size_t i = 0; i < st->cur.n; i++) {
        size_t len;
        const uint32_t *stk = gstacks_at(&st->cur, i, &len);
        if (!len || !is_token_elem(st->g, stk[len - 1]) ||
            !token_elem_takes(st->g, stk[len - 1], id))
            continue;
        uint32_t small[64], *nx = len <= 64 ? small : malloc(len * sizeof *nx);
        if (!nx) {
            st->next.overflow = true;
            return;
        }
        memcpy(nx, stk, (len - 1) * sizeof *nx);
        size_t n = len - 1;
        const uint32_t after = stk[len - 1] + 1;
        if (st->g->elems[after].type != GE_END && st->g->elems[after].type != GE_ALT)
            nx[n++] = after;
        grammar_advance_stack(st->g, nx, n, &st->next, &st->w);
        if (nx != small)
            free(nx);
    }
}

// Makes set the current stacks (swapping buffers where it can).
static int take_stacks(struct grammar_state *st, struct gstacks *set) {
    if (set == &st->cur)
        return 0;
    if (set == &st->next || set == &st->a || set == &st->b) {
        struct gstacks t = st->cur;
        st->cur = *set;
        *set = t;
        return 0;
    }
    return gstacks_copy(&st->cur, set);
}

static int rejected(struct verr *err, const struct grammar_vocab *v, int32_t id, bool overflow) {
    if (overflow)
        return verr_set(err, VERR_FULL,
                        "grammar: more than %d stacks or %d levels after token %d: the grammar is "
                        "too ambiguous",
                        GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH, id);
    if (id < 0 || !v || id >= v->n_tokens)
        return verr_set(err, VERR_RANGE, "grammar: token %d is not in the vocabulary", id);
    const size_t n = v->off[id + 1] - v->off[id];
    return verr_set(err, VERR_RANGE, "grammar: token %d (\"%.*s\") is not allowed here", id,
                    (int)(n < 40 ? n : 40), v->bytes + v->off[id]);
}

int grammar_state_accept(struct grammar_state *st, const struct grammar_vocab *v, int32_t id,
                         struct verr *err) {
    st->overflow = false;
    if (id < 0 || id >= v->n_tokens)
        return rejected(err, NULL, id, false);
    if (v->eog[id])
        return grammar_state_can_end(st) ? 0 : rejected(err, v, id, false);
    advance_token_elems(st, id);
    struct gpartial p = st->partial;
    const size_t n = v->off[id + 1] - v->off[id];
    const struct gstacks *by_text =
        n ? grammar_run_bytes(st, &st->cur, &p, (const uint8_t *)v->bytes + v->off[id], n) : NULL;
    if (st->next.overflow || st->overflow)
        return rejected(err, v, id, true);
    if (!by_text && st->next.n == 0)
        return rejected(err, v, id, false);
    if (by_text && st->next.n == 0) {
        if (take_stacks(st, (struct gstacks *)by_text))
            return verr_set(err, VERR_NOMEM, "out of host memory");
        st->partial = p;
        return 0;
    }
    if (by_text) {
        for (size_t i = 0; i < by_text->n; i++) {
            size_t len;
            const uint32_t *stk = gstacks_at(by_text, i, &len);
            gstacks_add(&st->next, stk, len);
        }
        st->partial = p;
    } else {
        st->partial = (struct gpartial){0, 0};
    }
    if (st->next.overflow)
        return rejected(err, v, id, true);
    return take_stacks(st, &st->next) ? verr_set(err, VERR_NOMEM, "out of host memory") : 0;
}

int grammar_state_accept_bytes(struct grammar_state *st, const char *bytes, size_t n,
                               struct verr *err) {
    st->overflow = false;
    struct gpartial p = st->partial;
    const struct gstacks *s = grammar_run_bytes(st, &st->cur, &p, (const uint8_t *)bytes, n);
    if (!s)
        return st->overflow
                   ? rejected(err, NULL, -1, true)
                   : verr_set(err, VERR_RANGE, "grammar: the text \"%.*s\" is not allowed here",
                              (int)(n < 40 ? n : 40), bytes);
    if (take_stacks(st, (struct gstacks *)s))
        return verr_set(err, VERR_NOMEM, "out of host memory");
    st->partial = p;
    return 0;
}
