// The token trie of a vocabulary and the walk that lists every token a
// matcher state allows: one stack-set step per trie node, a dead prefix
// skips its whole subtree (llama.cpp checks every candidate token instead).
#include "host/grammar/grammar_impl.h"

#include <stdlib.h>
#include <string.h>

// The vocabulary qsort compares through (qsort has no user pointer).
static const struct grammar_vocab *sort_vocab;

static int cmp_bytes(const void *a, const void *b) {
    const struct grammar_vocab *v = sort_vocab;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const size_t nx = v->off[x + 1] - v->off[x], ny = v->off[y + 1] - v->off[y];
    const int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], nx < ny ? nx : ny);
    if (c)
        return c;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return (x > y) - (x < y);
}

void grammar_vocab_free(struct grammar_vocab *v) {
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->eog);
    free(v->eog_ids);
    free(v->byte);
    free(v->depth);
    free(v->skip);
    free(v->tok);
    free(v->sorted);
    free(v);
}

int32_t grammar_vocab_n_tokens(const struct grammar_vocab *v) {
    return v->n_tokens;
}

size_t grammar_vocab_n_nodes(const struct grammar_vocab *v) {
    return v->n_nodes;
}

// Copies the tokens' bytes and flags; lists the trie's tokens in byte order.
static int vocab_copy(struct grammar_vocab *v, const char *const *bytes, const size_t *lens,
                      const bool *is_eog, struct verr *err) {
    const int32_t n = v->n_tokens;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] > 0xFFFF)
            return verr_set(err, VERR_RANGE,
                            "grammar vocabulary: token %d has %zu bytes (at most 65535)", i,
                            lens[i]);
        total += lens[i];
    }
    v->bytes = malloc(total ? total : 1);
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->eog = calloc((size_t)n, 1);
    v->eog_ids = malloc((size_t)n * sizeof *v->eog_ids);
    v->sorted = malloc((size_t)n * sizeof *v->sorted);
    if (!v->bytes || !v->off || !v->eog || !v->eog_ids || !v->sorted)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    v->off[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i])
            memcpy(v->bytes + v->off[i], bytes[i], lens[i]);
        v->off[i + 1] = v->off[i] + lens[i];
        if (is_eog && is_eog[i]) {
            v->eog[i] = 1;
            v->eog_ids[v->n_eog++] = i;
        } else if (lens[i]) {
            v->sorted[v->n_sorted++] = i;
            if (lens[i] > v->max_len)
                v->max_len = (uint32_t)lens[i];
        }
    }
    sort_vocab = v;
    qsort(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, cmp_bytes);
    return 0;
}

// The trie in preorder from the sorted tokens: each token adds the nodes
// past its common prefix with the one before it. A token's node never comes
// before the previous token's (a later token in byte order either extends
// the path, shares it, or branches off into new nodes), so each node's
// tokens are a run of `sorted`.
static int trie_build(struct grammar_vocab *v, struct verr *err) {
    size_t cap = 1;
    for (int32_t k = 0; k < v->n_sorted; k++)
        cap += v->off[v->sorted[k] + 1] - v->off[v->sorted[k]];
    if (cap > UINT32_MAX / 2)
        return verr_set(err, VERR_RANGE, "grammar vocabulary: %zu trie nodes", cap);
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof *v->depth);
    v->skip = malloc(cap * sizeof *v->skip);
    v->tok = malloc((cap + 1) * sizeof *v->tok);
    uint32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path);
    uint32_t *node_of = malloc(((size_t)v->n_sorted + 1) * sizeof *node_of);
    uint32_t *stack = malloc(cap * sizeof *stack);
    int rc = 0;
    if (!v->byte || !v->depth || !v->skip || !v->tok || !path || !node_of || !stack) {
        rc = verr_set(err, VERR_NOMEM, "out of host memory");
        goto out;
    }
    uint32_t n = 1;
    v->byte[0] = 0;
    v->depth[0] = 0;
    path[0] = 0;
    for (int32_t k = 0; k < v->n_sorted; k++) {
        const int32_t id = v->sorted[k];
        const char *s = v->bytes + v->off[id];
        const size_t len = v->off[id + 1] - v->off[id];
        size_t lcp = 0;
        if (k > 0) {
            const int32_t pid = v->sorted[k - 1];
            const size_t plen = v->off[pid + 1] - v->off[pid];
            const char *ps = v->bytes + v->off[pid];
            while (lcp < len && lcp < plen && s[lcp] == ps[lcp])
                lcp++;
        }
        for (size_t d = lcp + 1; d <= len; d++) {
            v->byte[n] = (uint8_t)s[d - 1];
            v->depth[n] = (uint16_t)d;
            path[d] = n++;
        }
        node_of[k] = path[len];
    }
    v->n_nodes = n;
    int32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->tok[i] = (uint32_t)k;
        while (k < v->n_sorted && node_of[k] == i)
            k++;
    }
    v->tok[n] = (uint32_t)v->n_sorted;
    // skip[i]: the first node after i's subtree (the next one no deeper than i).
    uint32_t top = 0;
    for (uint32_t i = 0; i < n; i++) {
        while (top > 0 && v->depth[stack[top - 1]] >= v->depth[i])
            v->skip[stack[--top]] = i;
        stack[top++] = i;
    }
    while (top > 0)
        v->skip[stack[--top]] = n;
out:
    free(path);
    free(node_of);
    free(stack);
    return rc;
}

int grammar_vocab_new(struct grammar_vocab **out, int32_t n_tokens, const char *const *bytes,
                      const size_t *lens, const bool *is_eog, struct verr *err) {
    *out = NULL;
    if (n_tokens <= 0)
        return verr_set(err, VERR_RANGE, "grammar vocabulary: %d tokens", n_tokens);
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    v->n_tokens = n_tokens;
    int rc = vocab_copy(v, bytes, lens, is_eog, err);
    if (!rc)
        rc = trie_build(v, err);
    if (rc) {
        grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

// --- the walk ------------------------------------------------------------------

// One stack set per trie depth, and the token marks, sized for v.
static int walk_reserve(struct grammar_state *st, const struct grammar_vocab *v) {
    const size_t levels = (size_t)v->max_len + 1;
    if (st->n_levels < levels) {
        struct gstacks *l = realloc(st->levels, levels * sizeof *l);
        if (!l)
            return VERR_NOMEM;
        memset(l + st->n_levels, 0, (levels - st->n_levels) * sizeof *l);
        st->levels = l;
        st->n_levels = levels;
    }
    if (st->n_mark < (size_t)v->n_tokens) {
        uint8_t *m = calloc((size_t)v->n_tokens, 1);
        if (!m)
            return VERR_NOMEM;
        free(st->mark);
        st->mark = m;
        st->n_mark = (size_t)v->n_tokens;
    }
    return 0;
}

static void emit(struct grammar_state *st, int32_t id, int32_t *ids, int32_t *n) {
    if (!st->mark[id]) {
        st->mark[id] = 1;
        ids[(*n)++] = id;
    }
}

// Tokens that token elements on top of the stacks take.
static void walk_token_elems(struct grammar_state *st, const struct grammar_vocab *v, int32_t *ids,
                             int32_t *n) {
    for (size_t i = 0; i < st->cur.n; i++) {
        size_t len;
        const uint32_t *stk = gstacks_at(&st->cur, i, &len);
        if (!len)
            continue;
        const struct gelem *e = &st->g->elems[stk[len - 1]];
        if (e->type == GE_TOKEN && e->value < (uint32_t)v->n_tokens && !v->eog[e->value])
            emit(st, (int32_t)e->value, ids, n);
        else if (e->type == GE_TOKEN_NOT)
            for (int32_t id = 0; id < v->n_tokens; id++)
                if (!v->eog[id] && (uint32_t)id != e->value)
                    emit(st, id, ids, n);
    }
}

struct level {
    const struct gstacks *set;
    struct gpartial p;
};

// The trie below the root, in preorder: lv[d] is the state after the
// first d bytes of the current node's path.
static int walk_trie(struct grammar_state *st, const struct grammar_vocab *v, struct level *lv,
                     int32_t *ids, int32_t *n) {
    for (uint32_t i = 1; i < v->n_nodes;) {
        const uint16_t d = v->depth[i];
        struct gpartial p = lv[d - 1].p;
        const struct gstacks *set = lv[d - 1].set;
        uint32_t cp;
        const int r = gutf8_push(&p, v->byte[i], &cp);
        if (r > 0) {
            grammar_accept_cp(st->g, set, cp, &st->levels[d], &st->w);
            if (st->levels[d].overflow)
                return VERR_FULL;
            set = &st->levels[d];
        }
        if (r < 0 || set->n == 0 || (p.n_remain > 0 && !grammar_partial_ok(st->g, set, p))) {
            i = v->skip[i];
            continue;
        }
        lv[d] = (struct level){set, p};
        for (uint32_t k = v->tok[i]; k < v->tok[i + 1]; k++)
            emit(st, v->sorted[k], ids, n);
        i++;
    }
    return 0;
}

int grammar_state_allowed(struct grammar_state *st, const struct grammar_vocab *v, int32_t *ids,
                          int32_t *n_ids, struct verr *err) {
    *n_ids = 0;
    if (walk_reserve(st, v))
        return verr_set(err, VERR_NOMEM, "out of host memory");
    struct level small[64];
    struct level *lv = v->max_len < 64 ? small : malloc(((size_t)v->max_len + 1) * sizeof *lv);
    if (!lv)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    int32_t n = 0;
    if (grammar_state_can_end(st))
        for (int32_t k = 0; k < v->n_eog; k++)
            emit(st, v->eog_ids[k], ids, &n);
    walk_token_elems(st, v, ids, &n);
    lv[0] = (struct level){&st->cur, st->partial};
    const int rc = walk_trie(st, v, lv, ids, &n);
    for (int32_t k = 0; k < n; k++)
        st->mark[ids[k]] = 0;
    if (lv != small)
        free(lv);
    if (rc)
        return verr_set(err, VERR_FULL,
                        "grammar: more than %d stacks or %d levels: the grammar is too ambiguous",
                        GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH);
    *n_ids = n;
    return 0;
}
