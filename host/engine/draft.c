// The draft model (draft.h).
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/draft.h"
#include "host/engine/spec.h"
#include "host/split/context.h"

// What a sequence's cache holds: tokens seen[base + i] at positions i.
struct draft_seq {
    int32_t *tok; // [n] (capacity n_ctx_seq)
    int n;
    int base;
};

struct draft_state {
    struct engine *d;
    int n_seq, n_ctx_seq, n_batch;
    struct draft_seq *seq; // [n_seq]
    int cap;               // batch entries
    int32_t *btok, *bpos, *bseq, *owner;
    int8_t *bwant;
};

static int vocab_differs(const struct tokenizer *a, const struct tokenizer *b, struct verr *err) {
    const int32_t n = tokenizer_n_vocab(a);
    if (tokenizer_n_vocab(b) != n)
        return verr_set(err, VERR_FORMAT,
                        "the draft model's vocabulary has %d tokens, the target's %d: they must "
                        "be the same",
                        (int)tokenizer_n_vocab(b), (int)n);
    if (tokenizer_bos(a) != tokenizer_bos(b) || tokenizer_eos(a) != tokenizer_eos(b))
        return verr_set(err, VERR_FORMAT,
                        "the draft model's BOS/EOS tokens (%d/%d) are not the target's (%d/%d)",
                        (int)tokenizer_bos(b), (int)tokenizer_eos(b), (int)tokenizer_bos(a),
                        (int)tokenizer_eos(a));
    for (int32_t i = 0; i < n; i++) {
        size_t la = 0, lb = 0;
        const char *ta = tokenizer_token_text(a, i, &la), *tb = tokenizer_token_text(b, i, &lb);
        if (la != lb || (la && memcmp(ta, tb, la)))
            return verr_set(err, VERR_FORMAT,
                            "the draft model's vocabulary differs from the target's at token %d "
                            "('%.*s' in the draft, '%.*s' in the target)",
                            (int)i, (int)(lb > 40 ? 40 : lb), tb ? tb : "",
                            (int)(la > 40 ? 40 : la), ta ? ta : "");
    }
    return 0;
}

int engine_draft_attach(struct engine *e, struct engine *d, struct verr *err) {
    if (!e->tok || !d->tok)
        return verr_set(err, VERR_FORMAT,
                        "speculative decoding with a draft model needs both models' tokenizers");
    if (e->m->hp.n_vocab != d->m->hp.n_vocab)
        return verr_set(err, VERR_FORMAT,
                        "the draft model has %d logits per row, the target %d: they must be the "
                        "same",
                        d->m->hp.n_vocab, e->m->hp.n_vocab);
    if (e->draft)
        return verr_set(err, VERR_RANGE, "the engine has a draft model already");
    int rc = vocab_differs(e->tok, d->tok, err);
    if (rc)
        return rc;
    e->draft = d;
    return 0;
}

void draft_state_free(struct draft_state *st) {
    if (!st)
        return;
    for (int i = 0; st->seq && i < st->n_seq; i++)
        free(st->seq[i].tok);
    free(st->seq);
    free(st->btok);
    free(st->bpos);
    free(st->bseq);
    free(st->owner);
    free(st->bwant);
    free(st);
}

int draft_state_new(struct draft_state **out, struct engine *d, int n_seq, struct verr *err) {
    *out = NULL;
    const struct forward_config *c = context_config(d->ctx);
    if (c->n_seq_max < n_seq || c->n_outputs_max < n_seq)
        return verr_set(err, VERR_RANGE,
                        "the draft model's context holds %d sequences (%d logits rows), the "
                        "target has %d slots",
                        c->n_seq_max, c->n_outputs_max, n_seq);
    if (c->n_ctx / n_seq < 2 * (ENGINE_SPEC_MAX + 1))
        return verr_set(err, VERR_RANGE,
                        "the draft model's context of %d cells leaves %d per slot for %d slots; "
                        "it needs at least %d",
                        c->n_ctx, c->n_ctx / n_seq, n_seq, 2 * (ENGINE_SPEC_MAX + 1));
    // The cache starts empty: what another state's sequences left is not
    // recorded in this one.
    int rc = context_clear(d->ctx, err);
    if (rc)
        return rc;
    struct draft_state *st = calloc(1, sizeof *st);
    if (!st)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    st->d = d;
    st->n_seq = n_seq;
    st->n_ctx_seq = c->n_ctx / n_seq;
    st->n_batch = c->n_batch;
    st->cap = n_seq * st->n_ctx_seq;
    st->seq = calloc((size_t)n_seq, sizeof *st->seq);
    st->btok = malloc((size_t)st->cap * sizeof *st->btok);
    st->bpos = malloc((size_t)st->cap * sizeof *st->bpos);
    st->bseq = malloc((size_t)st->cap * sizeof *st->bseq);
    st->owner = malloc((size_t)st->cap * sizeof *st->owner);
    st->bwant = malloc((size_t)st->cap);
    bool ok = st->seq && st->btok && st->bpos && st->bseq && st->owner && st->bwant;
    for (int i = 0; ok && i < n_seq; i++)
        ok = (st->seq[i].tok = malloc((size_t)st->n_ctx_seq * sizeof(int32_t))) != NULL;
    if (!ok) {
        draft_state_free(st);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    *out = st;
    return 0;
}

// Sequence r's cache brought to its tokens: cells past the prefix it
// shares with them leave, and the tokens still to decode (at least the
// last, whose row gives the first draft) join the batch at *n. The cache
// holds seen[base..]; when that leaves no room for the drafts, base moves
// to keep the last half of the cells (drafts only need the recent text).
static int seq_sync(struct draft_state *st, const struct draft_req *r, int ri, int *n,
                    struct verr *err) {
    struct draft_seq *q = &st->seq[r->seq];
    if (r->n_seen + r->max + 1 <= st->n_ctx_seq) {
        if (q->base)
            q->base = q->n = 0;
    } else if (r->n_seen < q->base || r->n_seen - q->base + r->max + 1 > st->n_ctx_seq) {
        q->base = r->n_seen - st->n_ctx_seq / 2;
        q->n = 0;
    }
    const int len = r->n_seen - q->base;
    const int32_t *t = r->seen + q->base;
    int p = 0;
    while (p < q->n && p < len - 1 && q->tok[p] == t[p])
        p++;
    int rc = context_seq_rm(st->d->ctx, r->seq, p, -1, err);
    if (rc)
        return rc;
    for (q->n = p; q->n < len; q->n++, (*n)++) {
        q->tok[q->n] = t[q->n];
        st->btok[*n] = t[q->n];
        st->bpos[*n] = q->n;
        st->bseq[*n] = r->seq;
        st->bwant[*n] = q->n == len - 1;
        st->owner[*n] = ri;
    }
    return 0;
}

// The argmax of a logits row and its probability.
static int32_t row_top(const float *l, int V, float *p) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)l[i] - (double)l[best]);
    *p = (float)(1.0 / sum);
    return best;
}

// Decodes batch entries [0, n) in pieces of at most n_batch (halved when
// the cache has no contiguous room, as the step does); each row gives its
// owner a draft, or ends its drafting (go) below p_min or at max.
static int decode_rows(struct draft_state *st, int n, struct draft_req *reqs, bool *go,
                       struct verr *err) {
    const int V = st->d->m->hp.n_vocab;
    int piece = st->n_batch;
    for (int i = 0; i < n;) {
        const int nb = n - i < piece ? n - i : piece;
        const struct forward_batch b = {nb,           st->btok + i,  st->bpos + i,
                                        st->bseq + i, st->bwant + i, NULL};
        struct context_result res;
        int rc = context_decode_logits(st->d->ctx, &b, &res, err);
        if (rc == VERR_FULL && nb > 1) {
            piece = nb / 2;
            continue;
        }
        if (rc)
            return rc;
        for (int o = 0; o < res.n_rows; o++) {
            const int ri = st->owner[i + res.batch_idx[o]];
            struct draft_req *r = &reqs[ri];
            float p;
            const int32_t tok = row_top(context_row_logits(&res, o), V, &p);
            if (p < r->p_min) {
                go[ri] = false;
                continue;
            }
            r->out[r->n_out++] = tok;
            go[ri] = r->n_out < r->max;
        }
        i += nb;
    }
    return 0;
}

static int draft_run(struct draft_state *st, struct draft_req *reqs, int n, bool *go,
                     struct verr *err) {
    int nb = 0, rc;
    for (int ri = 0; ri < n; ri++) {
        reqs[ri].n_out = 0;
        go[ri] = true;
        if ((rc = seq_sync(st, &reqs[ri], ri, &nb, err)))
            return rc;
    }
    for (;;) {
        if ((rc = decode_rows(st, nb, reqs, go, err)))
            return rc;
        nb = 0;
        for (int ri = 0; ri < n; ri++) {
            if (!go[ri])
                continue;
            struct draft_seq *q = &st->seq[reqs[ri].seq];
            q->tok[q->n] = reqs[ri].out[reqs[ri].n_out - 1];
            st->btok[nb] = q->tok[q->n];
            st->bpos[nb] = q->n++;
            st->bseq[nb] = reqs[ri].seq;
            st->bwant[nb] = 1;
            st->owner[nb++] = ri;
        }
        if (nb == 0)
            return 0;
    }
}

int draft_step(struct draft_state *st, struct draft_req *reqs, int n, struct verr *err) {
    bool go[n > 0 ? n : 1];
    for (int ri = 0; ri < n; ri++)
        if (reqs[ri].seq < 0 || reqs[ri].seq >= st->n_seq || reqs[ri].n_seen < 1 ||
            reqs[ri].max < 1 || reqs[ri].max > ENGINE_SPEC_MAX)
            return verr_set(err, VERR_RANGE, "draft request %d: bad sequence or counts", ri);
    int rc = draft_run(st, reqs, n, go, err);
    if (rc)
        for (int ri = 0; ri < n; ri++) {
            st->seq[reqs[ri].seq].n = 0;
            reqs[ri].n_out = 0;
            context_seq_rm(st->d->ctx, reqs[ri].seq, -1, -1, NULL);
        }
    return rc;
}
