// The step API (see step.h): slots, a bounded queue and one batch per step.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/engine/draft.h"
#include "host/engine/step.h"
#include "host/ops/selfextend.h"
#include "host/split/context.h"
#include "kv/policy.h"

// --- the step API's state: slots, queue, the step batch

// A submitted request: the caller's description with owned copies.
struct sched_req {
    uint64_t id;
    struct engine_request p;   // p.tokens / p.stop_tokens point at the copies below
    int32_t *tokens;           // [n_tokens]
    int32_t *stop;             // [n_stop_tokens]
    struct sampler_bias *bias; // [p.sp.n_bias]
    struct engine_req_stats st;
};

enum slot_state { SLOT_FREE, SLOT_PROMPT, SLOT_GEN };

// One sequence being decoded. Its sequence id in the cache is its slot index.
struct slot {
    enum slot_state state;
    struct sched_req *rq; // NULL when free
    int n_consumed;       // prompt tokens decoded (or shared)
    int32_t n_past;       // position of the next token
    int n_cells;          // cells holding this sequence
    int32_t next;         // the sampled token waiting to be decoded; -1: none yet
    int out_row;          // index in this step's batch of the row it samples from; -1: none
    int32_t out_pos;
    int share_from; // slot whose prompt cells it will share; -1: none
    bool can_share; // no shift can ever move this sequence's prompt cells
    bool started_now;
    const char *end_why;    // set during a step (engine_cancel from a callback, on_rows):
                            // it ends after the step with this reason
    int chunk_b0, chunk_c0; // its prompt chunk in this step: batch index, prompt index
    uint8_t row_how;        // this step: what its row gives back (enum forward_row)
    // Its rows this step: the next token's and one per draft token (n_draft,
    // speculative decoding), out_row.. in the batch.
    int n_draft;
    int n_proposed; // drafts the draft model made for this step (draft[0..n_proposed))
    int32_t draft[ENGINE_SPEC_MAX];
    int32_t amax[ENGINE_SPEC_MAX + 1]; // the tokens the backend picked (argmax or sample op)
    float *last; // [n_last][n_vocab] its rows (sampling on the host); kept across requests
    int n_last;
    // A speculating request's tokens so far, prompt and sampled (what the
    // n-gram drafter looks in); kept across requests.
    int32_t *seen;
    int n_seen, cap_seen;
    // The tokens of this slot's cells, positions 0..n_hist-1, while no
    // policy moved them (hist_ok): what a request with reuse_cells compares
    // its prompt against. Kept across requests, as `last`.
    int32_t *hist;
    int n_hist, cap_hist;
    bool hist_ok;
    uint64_t last_used; // the engine's tick when its last request ended (0: never)
    struct sampler *smp;
    struct tokenizer_stream *stream;
    struct kv_policy pol; // context shift, self-extend, ... (kv/policy.h)
    // The exact self-extend G and W (G 1: off) its request's tokens attend
    // with, and the ones its kept cells (hist) were computed with: K/V of
    // later layers come from earlier layers' attention, so a request with
    // other values reuses only cells no far key reached (se_shared_prefix).
    int se_g, se_w;
};

struct engine_sched {
    struct engine_sched_config cfg; // as resolved (n_slots, n_queue_max >= 1)
    int n_ctx_seq;                  // cells per slot
    struct slot *slots;             // [cfg.n_slots]
    struct sched_req **queue;       // [cfg.n_queue_max] ring
    int q_head, q_len;
    struct sample_params *rows; // [cap] this step's rows' sample parameters, in batch order
    uint8_t *how;               // [cap] this step's rows' enum forward_row, in batch order
    int cap;                    // the step batch: n_slots * n_batch entries
    int32_t *tok, *pos, *seq;
    int32_t *se; // [cap][2] each entry's exact self-extend G, W (the slot's)
    int8_t *want;
    uint64_t next_id;
    uint64_t tick; // counts requests ending (slot.last_used)
    struct engine_stats st;
    struct draft_state *draft; // the draft model's sequences (NULL until a request uses it)
    bool in_step;
    // Set by a hook (engine_generate_batch's stop): the step samples no
    // further slot.
    bool halt;
};

void engine_request_default(struct engine_request *r) {
    memset(r, 0, sizeof *r);
    sampler_params_default(&r->sp);
    r->n_predict = -1;
    r->ctx_shift = true;
    r->n_keep = 0;
    r->ga_n = 1;
    r->ga_w = 512;
    engine_spec_default(&r->spec);
}

// ---------------------------------------------------------------------------
// Lifecycle

static void req_free(struct sched_req *q) {
    if (!q)
        return;
    free(q->tokens);
    free(q->stop);
    free(q->bias);
    free(q);
}

static struct sched_req *queue_at(const struct engine_sched *s, int i) {
    return s->queue[(s->q_head + i) % s->cfg.n_queue_max];
}

void engine_sched_free(struct engine_sched *s) {
    if (!s)
        return;
    for (int i = 0; s->slots && i < s->cfg.n_slots; i++) {
        sampler_free(s->slots[i].smp);
        tokenizer_stream_free(s->slots[i].stream);
        free(s->slots[i].last);
        free(s->slots[i].hist);
        free(s->slots[i].seen);
        req_free(s->slots[i].rq);
    }
    for (int i = 0; s->queue && i < s->q_len; i++)
        req_free(queue_at(s, i));
    free(s->slots);
    free(s->queue);
    free(s->rows);
    free(s->tok);
    free(s->pos);
    free(s->seq);
    free(s->se);
    free(s->want);
    free(s->how);
    draft_state_free(s->draft);
    free(s);
}

// The configuration with its defaults filled in, checked against the context.
static int sched_resolve(const struct engine *e, const struct engine_sched_config *c,
                         struct engine_sched_config *out, int *n_ctx_seq, struct verr *err) {
    const struct forward_config *cfg = context_config(e->ctx);
    const int n_batch = cfg->n_batch;
    struct engine_sched_config r = *c;
    if (r.n_slots == 0)
        r.n_slots = cfg->n_seq_max;
    if (r.n_queue_max == 0)
        r.n_queue_max = 256;
    // Every generating request takes one token of the budget; prompts get
    // the rest, so the budget must leave them some.
    if (r.n_step_tokens == 0)
        r.n_step_tokens = n_batch > r.n_slots ? n_batch : r.n_slots + 1;
    if (r.n_slots < 1 || r.n_slots > cfg->n_seq_max ||
        cfg->n_outputs_max < (r.n_slots < n_batch ? r.n_slots : n_batch))
        return verr_set(err, VERR_RANGE,
                        "%d slots: the context was opened for %d sequences (%d logits rows)",
                        r.n_slots, cfg->n_seq_max, cfg->n_outputs_max);
    if (!(r.slot_similarity >= 0 && r.slot_similarity <= 1))
        return verr_set(err, VERR_RANGE, "slot prompt similarity %g: 0 .. 1",
                        (double)r.slot_similarity);
    if (r.n_queue_max < 1 || r.n_queue_max > (1 << 20))
        return verr_set(err, VERR_RANGE, "queue of %d requests: 1 .. %d", r.n_queue_max, 1 << 20);
    if (r.n_step_tokens < -1 || (r.n_step_tokens > 0 && r.n_step_tokens <= r.n_slots))
        return verr_set(err, VERR_RANGE,
                        "step budget %d: -1 (none), 0 (n_batch) or more than the %d slots "
                        "(each generating request takes a token of it)",
                        r.n_step_tokens, r.n_slots);
    *n_ctx_seq = cfg->n_ctx / r.n_slots;
    if (*n_ctx_seq < 5)
        return verr_set(err, VERR_RANGE,
                        "a context of %d cells leaves %d per slot for %d slots; each needs at "
                        "least 5 (raise -c)",
                        cfg->n_ctx, *n_ctx_seq, r.n_slots);
    *out = r;
    return 0;
}

int engine_sched_configure(struct engine *e, const struct engine_sched_config *c,
                           struct verr *err) {
    if (e->sched && e->sched->in_step)
        return verr_set(err, VERR_RANGE, "the slots cannot change from a request's callback");
    if (engine_n_active(e) || engine_n_queued(e))
        return verr_set(err, VERR_RANGE,
                        "the engine has %d requests running and %d queued: the slots can "
                        "change only when it is idle",
                        engine_n_active(e), engine_n_queued(e));
    struct engine_sched_config r;
    int n_ctx_seq = 0;
    int rc = sched_resolve(e, c, &r, &n_ctx_seq, err);
    if (rc)
        return rc;
    struct engine_sched *s = calloc(1, sizeof *s);
    if (!s)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    s->cfg = r;
    s->n_ctx_seq = n_ctx_seq;
    s->cap = r.n_slots * context_config(e->ctx)->n_batch;
    s->slots = calloc((size_t)r.n_slots, sizeof *s->slots);
    s->queue = calloc((size_t)r.n_queue_max, sizeof *s->queue);
    s->rows = malloc((size_t)s->cap * sizeof *s->rows);
    s->how = malloc((size_t)s->cap);
    s->tok = malloc((size_t)s->cap * sizeof *s->tok);
    s->pos = malloc((size_t)s->cap * sizeof *s->pos);
    s->seq = malloc((size_t)s->cap * sizeof *s->seq);
    s->se = malloc((size_t)s->cap * 2 * sizeof *s->se);
    s->want = malloc((size_t)s->cap);
    if (!s->slots || !s->queue || !s->rows || !s->tok || !s->pos || !s->seq || !s->se || !s->want ||
        !s->how) {
        engine_sched_free(s);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    // Ids stay unique over the engine's life.
    s->next_id = e->sched ? e->sched->next_id : 1;
    engine_sched_free(e->sched);
    e->sched = s;
    return 0;
}

static int sched_get(struct engine *e, struct verr *err) {
    if (e->sched)
        return 0;
    struct engine_sched_config c = {0};
    return engine_sched_configure(e, &c, err);
}

int engine_n_active(const struct engine *e) {
    const struct engine_sched *s = e->sched;
    int n = 0;
    for (int i = 0; s && i < s->cfg.n_slots; i++)
        n += s->slots[i].state != SLOT_FREE;
    return n;
}

int engine_n_queued(const struct engine *e) {
    return e->sched ? e->sched->q_len : 0;
}

void engine_sched_config_get(const struct engine *e, struct engine_sched_config *out) {
    if (e->sched)
        *out = e->sched->cfg;
    else
        memset(out, 0, sizeof *out);
}

enum engine_slot_state engine_slot_state(const struct engine *e, int slot) {
    const struct engine_sched *s = e->sched;
    if (!s || slot < 0 || slot >= s->cfg.n_slots || s->slots[slot].state == SLOT_FREE)
        return ENGINE_SLOT_FREE;
    return s->slots[slot].state == SLOT_PROMPT ? ENGINE_SLOT_PROMPT : ENGINE_SLOT_GEN;
}

void engine_sched_halt(struct engine *e) {
    if (e->sched)
        e->sched->halt = true;
}

const struct engine_stats *engine_sched_stats(const struct engine *e) {
    static const struct engine_stats none;
    return e->sched ? &e->sched->st : &none;
}

// ---------------------------------------------------------------------------
// Submit

static int check_sampler(const struct sampler_params *p, int n_vocab, struct verr *err) {
    if (!isfinite(p->temp) || !isfinite(p->top_p) || !isfinite(p->min_p) ||
        !isfinite(p->repeat_penalty) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty))
        return verr_set(err, VERR_RANGE, "a sampler value is not a finite number");
    if (p->repeat_last_n < -1)
        return verr_set(err, VERR_RANGE, "repeat_last_n %d: -1 (the context), 0 (off) or > 0",
                        p->repeat_last_n);
    return sampler_check_bias(p->bias, p->n_bias, n_vocab, err);
}

static int check_tokens(const int32_t *t, int n, int V, const char *what, struct verr *err) {
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= V)
            return verr_set(err, VERR_RANGE, "%stoken id %d is out of range (n_vocab %d)", what,
                            t[i], V);
    return 0;
}

// The exact self-extend G and W request r attends with (G 1: off; W then 0):
// its own, or the context's (forward_config se_g / se_w).
static void request_se(const struct engine *e, const struct engine_request *r, int *g, int *w) {
    const struct forward_config *c = context_config(e->ctx);
    *g = r->se_g != 0 ? r->se_g : c->se_g > 1 ? c->se_g : 1;
    *w = r->se_g != 0 ? r->se_w : c->se_w;
    if (*g == 1)
        *w = 0;
}

// The request's KV policy (kv/policy.h): n_keep as llama-cli resolves it (-1
// or more than the prompt: the prompt; else BOS kept on top), n_predict -2
// never shifts, and its exact self-extend (request_se) when it generates.
static void policy_params(const struct engine *e, const struct engine_request *r,
                          struct kv_policy_params *pp) {
    kv_policy_params_default(pp);
    pp->n_keep = r->n_keep;
    if (pp->n_keep < 0 || pp->n_keep > r->n_tokens)
        pp->n_keep = r->n_tokens;
    else if (e->tok && tokenizer_bos(e->tok) >= 0 && r->tokens[0] == tokenizer_bos(e->tok))
        pp->n_keep += 1;
    pp->ctx_shift = r->ctx_shift && r->n_predict != -2;
    pp->ga_n = r->ga_n;
    pp->ga_w = r->ga_w;
    if (!r->on_rows)
        request_se(e, r, &pp->se_g, &pp->se_w);
}

// A request's own self-extend values: G 0 (the context's), 1 (off) or > 1
// with a W the model allows, on a context that caches K unrotated.
static int check_request_se(const struct engine *e, const struct engine_request *r,
                            struct verr *err) {
    int n_ctx_se;
    if (r->se_g < 0)
        return verr_set(err, VERR_RANGE,
                        "self-extend: group size G = %d: 0 (the context's), 1 (off) or more",
                        r->se_g);
    if (r->se_g <= 1)
        return 0;
    if (!context_config(e->ctx)->k_unrotated)
        return verr_set(err, VERR_RANGE,
                        "self-extend G = %d for one request needs a context that caches K "
                        "unrotated (k_unrotated, or se_g > 1 for every request)",
                        r->se_g);
    if (e->m->hp.sliding_window > 0)
        return verr_set(err, VERR_UNSUPPORTED,
                        "self-extend with %s's sliding-window layers is not supported",
                        model_arch_name(e->m->hp.arch));
    return forward_selfextend_ctx(&e->m->hp, r->se_g, r->se_w, &n_ctx_se, err);
}

// Speculation needs rows that only the sampler reads and positions that
// only a context shift moves.
static int check_spec(const struct engine *e, const struct engine_request *r, int n_batch,
                      struct verr *err) {
    if (r->spec.type == ENGINE_SPEC_NONE)
        return 0;
    if (r->spec.type == ENGINE_SPEC_DRAFT && !e->draft)
        return verr_set(err, VERR_RANGE,
                        "speculative type draft: the engine has no draft model (-md FILE)");
    if (r->on_logits || r->on_rows)
        return verr_set(err, VERR_RANGE,
                        "speculative decoding with a logits hook (on_logits, on_rows) is not "
                        "supported");
    if (r->ga_n != 1)
        return verr_set(err, VERR_RANGE,
                        "speculative decoding with self-extend (--grp-attn-n %d) is not supported",
                        r->ga_n);
    return engine_spec_check(&r->spec, n_batch, err);
}

static int check_request(const struct engine *e, const struct engine_request *r, struct verr *err) {
    const int V = e->m->hp.n_vocab, n_batch = context_config(e->ctx)->n_batch;
    // llama-cli's limit: room for a few generated tokens after the prompt;
    // a request that only reads its prompt may fill the context.
    const int max = e->sched->n_ctx_seq - (r->on_rows ? 0 : 4);
    if (!r->tokens || r->n_tokens < 1)
        return verr_set(err, VERR_RANGE, "the prompt is empty");
    if (r->n_tokens > max)
        return verr_set(err, VERR_RANGE, "prompt is too long (%d tokens, max %d)", r->n_tokens,
                        max);
    int rc = check_tokens(r->tokens, r->n_tokens, V, "", err);
    if (rc)
        return rc;
    if (r->n_predict < -2)
        return verr_set(err, VERR_RANGE,
                        "n_predict %d: -1 (until a stop), -2 (until a stop or the context is "
                        "full) or >= 0",
                        r->n_predict);
    if (r->on_rows && r->n_predict != 0)
        return verr_set(err, VERR_RANGE,
                        "a request that takes every row (on_rows) generates nothing: n_predict "
                        "%d must be 0",
                        r->n_predict);
    if (r->on_rows && context_config(e->ctx)->n_outputs_max < n_batch)
        return verr_set(err, VERR_RANGE, "the context keeps logits of %d rows, the batch is %d",
                        context_config(e->ctx)->n_outputs_max, n_batch);
    if (r->n_stop_tokens < 0 || r->n_stop_tokens > ENGINE_MAX_STOP_TOKENS ||
        (r->n_stop_tokens > 0 && !r->stop_tokens))
        return verr_set(err, VERR_RANGE, "%d stop tokens: 0 .. %d", r->n_stop_tokens,
                        ENGINE_MAX_STOP_TOKENS);
    if ((rc = check_tokens(r->stop_tokens, r->n_stop_tokens, V, "stop ", err)))
        return rc;
    if ((rc = check_request_se(e, r, err)))
        return rc;
    if ((rc = check_spec(e, r, n_batch, err)))
        return rc;
    struct kv_policy_params pp;
    struct kv_policy pol;
    policy_params(e, r, &pp);
    if ((rc = context_policy_init(e->ctx, &pol, &pp, 0, e->sched->n_ctx_seq, err)))
        return rc;
    return check_sampler(&r->sp, V, err);
}

int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id,
                  struct verr *err) {
    if (id)
        *id = 0;
    int rc = sched_get(e, err);
    if (rc || (rc = check_request(e, r, err)))
        return rc;
    struct engine_sched *s = e->sched;
    if (s->q_len == s->cfg.n_queue_max)
        return verr_set(err, VERR_FULL, "the queue is full (%d requests waiting)", s->q_len);
    struct sched_req *q = calloc(1, sizeof *q);
    if (q) {
        q->tokens = malloc((size_t)r->n_tokens * sizeof *q->tokens);
        q->stop = malloc(((size_t)r->n_stop_tokens + 1) * sizeof *q->stop);
        q->bias = malloc(((size_t)r->sp.n_bias + 1) * sizeof *q->bias);
    }
    if (!q || !q->tokens || !q->stop || !q->bias) {
        req_free(q);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    memcpy(q->tokens, r->tokens, (size_t)r->n_tokens * sizeof *q->tokens);
    if (r->n_stop_tokens)
        memcpy(q->stop, r->stop_tokens, (size_t)r->n_stop_tokens * sizeof *q->stop);
    q->p = *r;
    q->p.tokens = q->tokens;
    q->p.stop_tokens = q->stop;
    if (r->sp.n_bias)
        memcpy(q->bias, r->sp.bias, (size_t)r->sp.n_bias * sizeof *q->bias);
    q->p.sp.bias = q->bias;
    if (q->p.sp.repeat_last_n < 0)
        q->p.sp.repeat_last_n = s->n_ctx_seq;
    q->id = s->next_id++;
    q->st.n_prompt = r->n_tokens;
    q->st.seed = r->sp.seed;
    q->st.t_submit_ms = engine_now_ms();
    q->st.ttft_ms = -1;
    s->queue[(s->q_head + s->q_len) % s->cfg.n_queue_max] = q;
    s->q_len++;
    if (id)
        *id = q->id;
    return 0;
}

// ---------------------------------------------------------------------------
// Slots

static int req_emit(struct sched_req *q, enum engine_event ev, int32_t tok, const char *text,
                    size_t len) {
    if (!q->p.cb)
        return 0;
    struct engine_req_event x = {ev, q->id, tok, text, len, &q->st};
    return q->p.cb(q->p.user, &x);
}

// Routes self-extend's log lines to the request as notes.
static void note_line(void *user, const char *line) {
    struct slot *sl = user;
    req_emit(sl->rq, ENGINE_EV_NOTE, -1, line, strlen(line));
}

static bool same_prompt(const struct slot *a, const struct slot *b) {
    const struct engine_request *x = &a->rq->p, *y = &b->rq->p;
    return a->se_g == b->se_g && a->se_w == b->se_w && x->n_tokens == y->n_tokens &&
           !memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * sizeof *x->tokens);
}

// The length of the common prefix of a slot's kept tokens and a prompt.
static int common_prefix(const int32_t *hist, int n_hist, const struct engine_request *r) {
    int p = 0;
    while (p < n_hist && p < r->n_tokens && hist[p] == r->tokens[p])
        p++;
    return p;
}

// Prompt tokens of r whose cells the slot still holds from its previous
// request (sl->hist[0..n_hist) at positions 0..n_hist-1): the common
// prefix, less one token (the last prompt token is decoded again, for its
// logits). 0 when r does not ask for it or its policy regroups positions
// (llama.cpp's self-extend). Exact self-extend never moves a position; the
// kept cells were computed with (kept_g, kept_w), so with other values only
// the positions no far key reached are what a fresh run computes
// (se_same_prefix).
static int reusable_prefix(const struct slot *sl, const struct engine_request *r, int n_hist,
                           int kept_g, int kept_w) {
    if (!r->reuse_cells || r->on_rows || sl->pol.kind == KV_POLICY_SELFEXTEND)
        return 0;
    int p = common_prefix(sl->hist, n_hist, r);
    const int32_t same = se_same_prefix(kept_g, kept_w, sl->se_g, sl->se_w);
    p = p < same ? p : same;
    return p < r->n_tokens - 1 ? p : r->n_tokens - 1;
}

// Whether slot t keeps cells a later request may reuse.
static bool slot_keeps(const struct slot *t) {
    return t->hist_ok && t->n_hist > 0;
}

// The free slot queued request q takes (engine_sched_config.slot_similarity),
// -1 when none is free.
static int slot_pick(const struct engine_sched *s, const struct sched_req *q) {
    int best = -1, best_p = 0, empty = -1, lru = -1;
    for (int si = 0; si < s->cfg.n_slots; si++) {
        const struct slot *t = &s->slots[si];
        if (t->state != SLOT_FREE)
            continue;
        if (!slot_keeps(t)) {
            if (empty < 0)
                empty = si;
            continue;
        }
        if (lru < 0 || t->last_used < s->slots[lru].last_used)
            lru = si;
        if (!q->p.reuse_cells || q->p.on_rows)
            continue;
        const int p = common_prefix(t->hist, t->n_hist, &q->p);
        if (p > best_p && (double)p > (double)s->cfg.slot_similarity * t->n_hist) {
            best = si;
            best_p = p;
        }
    }
    return best >= 0 ? best : empty >= 0 ? empty : lru;
}

// Records the tokens decoded at positions n_hist.. of the slot (its history
// for reuse_cells); a gap (a policy moved positions) ends the record.
static void hist_add(struct slot *sl, int32_t pos, const int32_t *tok, int n) {
    if (!sl->hist_ok || pos != sl->n_hist)
        sl->hist_ok = false;
    if (!sl->hist_ok)
        return;
    if (sl->n_hist + n > sl->cap_hist) {
        int cap = sl->cap_hist ? sl->cap_hist : 256;
        while (cap < sl->n_hist + n)
            cap *= 2;
        int32_t *t = realloc(sl->hist, (size_t)cap * sizeof *t);
        if (!t) {
            sl->hist_ok = false;
            return;
        }
        sl->hist = t;
        sl->cap_hist = cap;
    }
    memcpy(sl->hist + sl->n_hist, tok, (size_t)n * sizeof *tok);
    sl->n_hist += n;
}

// Appends tokens to what a speculating slot's drafter looks in.
static int seen_add(struct slot *sl, const int32_t *tok, int n, struct verr *err) {
    if (sl->n_seen + n > sl->cap_seen) {
        int cap = sl->cap_seen ? sl->cap_seen : 256;
        while (cap < sl->n_seen + n)
            cap *= 2;
        int32_t *t = realloc(sl->seen, (size_t)cap * sizeof *t);
        if (!t)
            return verr_set(err, VERR_NOMEM, "out of host memory");
        sl->seen = t;
        sl->cap_seen = cap;
    }
    memcpy(sl->seen + sl->n_seen, tok, (size_t)n * sizeof *tok);
    sl->n_seen += n;
    return 0;
}

// Slot si takes request q. On failure the slot stays active and the step's
// error path ends it.
static int slot_start(struct engine *e, struct engine_sched *s, int si, struct sched_req *q,
                      struct verr *err) {
    struct slot *sl = &s->slots[si];
    float *last = sl->last;
    int32_t *hist = sl->hist, *seen = sl->seen;
    const int n_hist = sl->hist_ok ? sl->n_hist : 0, cap_hist = sl->cap_hist;
    const int n_last = sl->n_last, cap_seen = sl->cap_seen;
    const uint64_t last_used = sl->last_used;
    const int kept_g = sl->se_g, kept_w = sl->se_w; // what hist's cells were computed with
    memset(sl, 0, sizeof *sl);
    sl->last = last;
    sl->n_last = n_last;
    sl->hist = hist;
    sl->cap_hist = cap_hist;
    sl->seen = seen;
    sl->cap_seen = cap_seen;
    sl->state = SLOT_PROMPT;
    sl->rq = q;
    sl->out_row = -1;
    sl->share_from = -1;
    sl->next = -1;
    sl->started_now = true;
    sl->last_used = last_used;
    const struct engine_request *r = &q->p;
    request_se(e, r, &sl->se_g, &sl->se_w);
    q->st.t_start_ms = engine_now_ms();
    struct kv_policy_params pp;
    policy_params(e, r, &pp);
    int rc = context_policy_init(e->ctx, &sl->pol, &pp, si, s->n_ctx_seq, err);
    if (rc)
        return rc;
    if (sl->pol.kind == KV_POLICY_SELFEXTEND) {
        sl->pol.se.log = note_line;
        sl->pol.se.log_user = sl;
    }
    // Shared cells would move for every sharer when the policy of one of
    // them moves its positions (seq_add moves a cell for all its
    // sequences), so only a sequence whose positions never move shares.
    const int64_t n_positions = r->n_predict >= 0 ? (int64_t)r->n_tokens + r->n_predict : INT64_MAX;
    sl->can_share = !r->on_rows && !kv_policy_may_move(&sl->pol, n_positions);
    if ((rc = sampler_create(&sl->smp, &r->sp, e->m->hp.n_vocab, err)))
        return rc;
    q->st.seed = sampler_seed(sl->smp);
    for (int t = 0; t < r->n_tokens; t++)
        sampler_accept_prompt(sl->smp, r->tokens[t]);
    if (r->spec.type != ENGINE_SPEC_NONE && (rc = seen_add(sl, r->tokens, r->n_tokens, err)))
        return rc;
    if (e->tok && (rc = tokenizer_stream_new(&sl->stream, e->tok, false, err)))
        return rc;
    // Cells another user of the cache (engine_eval) left: the first request
    // of an idle engine starts from an empty cache, unless other slots keep
    // cells for reuse (then the cache holds only the slots' own cells).
    bool alone = true;
    for (int t = 0; t < s->cfg.n_slots; t++)
        alone = alone && (t == si || (s->slots[t].state == SLOT_FREE && !slot_keeps(&s->slots[t])));
    // A request started before this one in this step with the same prompt
    // (slots are taken in queue order, not slot order: slot_pick) reads it
    // for both: sharing its cells decodes nothing, reusing kept ones decodes
    // the rest, so sharing comes first.
    int share = -1;
    for (int t = 0; sl->can_share && share < 0 && t < s->cfg.n_slots; t++) {
        const struct slot *o = &s->slots[t];
        if (t != si && o->state == SLOT_PROMPT && o->started_now && o->share_from < 0 &&
            o->can_share && same_prompt(o, sl))
            share = t;
    }
    const int reuse = share >= 0 ? 0 : reusable_prefix(sl, r, n_hist, kept_g, kept_w);
    if (reuse > 0) {
        if ((rc = context_seq_rm(e->ctx, si, reuse, -1, err)))
            return rc;
        sl->n_consumed = sl->n_cells = reuse;
        sl->n_past = reuse;
        sl->n_hist = reuse;
        sl->hist_ok = true;
        q->st.n_prompt_reused = reuse;
        return 0;
    }
    sl->hist_ok = true; // n_hist 0: this request's tokens are recorded from position 0
    if (context_cells_used(e->ctx) &&
        (rc = alone ? context_clear(e->ctx, err) : context_seq_rm(e->ctx, si, -1, -1, err)))
        return rc;
    sl->share_from = share;
    return 0;
}

static void stats_finish(struct engine_req_stats *st) {
    st->tpot_ms = st->n_gen > 1 ? (st->t_last_ms - st->t_first_ms) / (st->n_gen - 1) : 0;
}

// Flushes the stream (flush: false on errors), frees the slot's cells and
// state, reports why it ended and frees the request.
static int slot_finish(struct engine *e, struct engine_sched *s, int si, const char *why,
                       bool flush, struct verr *err) {
    struct slot *sl = &s->slots[si];
    struct sched_req *q = sl->rq;
    const char *txt;
    size_t len = 0;
    if (sl->stream && flush) {
        tokenizer_stream_flush(sl->stream, &txt, &len);
        if (len)
            req_emit(q, ENGINE_EV_TOKEN, -1, txt, len);
    }
    // After a failed step the cells no longer agree with the record: none is kept.
    const bool keep = q->p.keep_cells && strcmp(why, "error") != 0;
    int rc = keep ? 0 : context_seq_rm(e->ctx, si, -1, -1, err);
    if (!keep)
        sl->hist_ok = false;
    sl->last_used = ++s->tick;
    sampler_free(sl->smp);
    tokenizer_stream_free(sl->stream);
    sl->smp = NULL;
    sl->stream = NULL;
    sl->state = SLOT_FREE;
    sl->rq = NULL;
    sl->end_why = NULL;
    // Who waited to share its prompt reads it itself.
    for (int t = 0; t < s->cfg.n_slots; t++)
        if (s->slots[t].share_from == si)
            s->slots[t].share_from = -1;
    s->st.n_seq++;
    stats_finish(&q->st);
    req_emit(q, ENGINE_EV_DONE, sl->next, why, strlen(why));
    req_free(q);
    return rc;
}

static int end_active(struct engine *e, struct engine_sched *s, const char *why, bool flush,
                      struct verr *err) {
    int rc = 0;
    for (int si = 0; si < s->cfg.n_slots; si++)
        if (s->slots[si].state != SLOT_FREE) {
            int r = slot_finish(e, s, si, why, flush, err);
            rc = rc ? rc : r;
        }
    return rc;
}

int engine_end_all(struct engine *e, const char *why, struct verr *err) {
    struct engine_sched *s = e->sched;
    if (!s)
        return 0;
    int rc = end_active(e, s, why, strcmp(why, "error") != 0, err);
    for (int i = 0; i < s->q_len; i++)
        req_free(queue_at(s, i));
    s->q_len = 0;
    s->q_head = 0;
    return rc;
}

static struct sched_req *find_req(const struct engine_sched *s, uint64_t id, int *slot, int *qi) {
    *slot = *qi = -1;
    for (int i = 0; s && id && i < s->cfg.n_slots; i++)
        if (s->slots[i].rq && s->slots[i].rq->id == id) {
            *slot = i;
            return s->slots[i].rq;
        }
    for (int i = 0; s && id && i < s->q_len; i++)
        if (queue_at(s, i)->id == id) {
            *qi = i;
            return queue_at(s, i);
        }
    return NULL;
}

int engine_req_stats_get(const struct engine *e, uint64_t id, struct engine_req_stats *out) {
    int slot, qi;
    struct sched_req *q = find_req(e->sched, id, &slot, &qi);
    if (!q)
        return VERR_NOTFOUND;
    *out = q->st;
    stats_finish(out);
    return 0;
}

int engine_cancel(struct engine *e, uint64_t id, struct verr *err) {
    struct engine_sched *s = e->sched;
    int si, qi;
    struct sched_req *q = find_req(s, id, &si, &qi);
    if (!q)
        return verr_set(err, VERR_NOTFOUND, "request %llu is not active or queued",
                        (unsigned long long)id);
    if (si >= 0) {
        if (s->in_step) {
            s->slots[si].end_why = "cancelled";
            return 0;
        }
        return slot_finish(e, s, si, "cancelled", true, err);
    }
    for (int i = qi; i + 1 < s->q_len; i++)
        s->queue[(s->q_head + i) % s->cfg.n_queue_max] = queue_at(s, i + 1);
    s->q_len--;
    stats_finish(&q->st);
    req_emit(q, ENGINE_EV_DONE, -1, "cancelled", strlen("cancelled"));
    req_free(q);
    return 0;
}

// ---------------------------------------------------------------------------
// The step

// Before the step's entry for a generating slot: room for one more token in
// its share of the cells, as its policy makes it (a context shift, or
// nothing). Returns 1 when the slot must end with "context full".
static int make_room(struct engine *e, struct engine_sched *s, int si, struct verr *err) {
    struct slot *sl = &s->slots[si];
    const int32_t n_past = sl->n_past;
    int32_t n_discard = 0;
    int rc = context_policy_make_room(e->ctx, &sl->pol, &sl->n_past, &sl->n_cells, &n_discard, err);
    if (rc < 0 || n_discard <= 0)
        return rc;
    char line[160];
    snprintf(line, sizeof line, "context shift: n_past = %d, n_keep = %d, n_discard = %d", n_past,
             sl->pol.n_keep, n_discard);
    s->st.n_ctx_shifts++;
    sl->rq->st.n_ctx_shifts++;
    req_emit(sl->rq, ENGINE_EV_SHIFT, n_discard, line, strlen(line));
    return rc;
}

struct step_count {
    int n, n_p, n_g; // batch entries; of those prompt and generated tokens
};

// The most draft tokens slot sl may verify this step: its request's n_max,
// the room its share of the cells leaves before a shift would be due (so
// shifts happen where they would without speculation) and the tokens it
// may still generate.
static int slot_draft_max(const struct engine_sched *s, const struct slot *sl) {
    const struct engine_request *r = &sl->rq->p;
    if (r->spec.type == ENGINE_SPEC_NONE)
        return 0;
    const int used = sl->n_past > sl->n_cells ? sl->n_past : sl->n_cells;
    int k = r->spec.n_max;
    k = k < s->n_ctx_seq - 2 - used ? k : s->n_ctx_seq - 2 - used;
    if (r->n_predict >= 0 && k > r->n_predict - sl->rq->st.n_gen - 1)
        k = r->n_predict - sl->rq->st.n_gen - 1;
    return k > 0 ? k : 0;
}

// Slot sl's drafts for this step (sl->draft, sl->n_draft): at most max
// (the step's budget and rows) and slot_draft_max; none when fewer than the
// request's n_min.
static void slot_draft(const struct engine_sched *s, struct slot *sl, int max) {
    const struct engine_request *r = &sl->rq->p;
    int k = slot_draft_max(s, sl);
    k = k < max ? k : max;
    sl->n_draft = 0;
    if (k <= 0)
        return;
    if (r->spec.type == ENGINE_SPEC_NGRAM)
        k = spec_ngram_draft(sl->seen, sl->n_seen, r->spec.ngram_n, sl->draft, k);
    else
        k = k < sl->n_proposed ? k : sl->n_proposed;
    sl->n_draft = k >= r->spec.n_min ? k : 0;
}

// The draft model's drafts for every generating slot that asks for them,
// in one draft step (draft.h), before the step batch is built.
static int step_draft(struct engine *e, struct engine_sched *s, struct verr *err) {
    struct draft_req reqs[s->cfg.n_slots > 0 ? s->cfg.n_slots : 1];
    int n = 0, rc;
    for (int si = 0; si < s->cfg.n_slots; si++) {
        struct slot *sl = &s->slots[si];
        sl->n_proposed = 0;
        if (sl->state != SLOT_GEN || sl->rq->p.spec.type != ENGINE_SPEC_DRAFT)
            continue;
        const int max = slot_draft_max(s, sl);
        if (max > 0)
            reqs[n++] = (struct draft_req){
                si, sl->seen, sl->n_seen, max, sl->rq->p.spec.p_min, sl->draft, 0};
    }
    if (n == 0)
        return 0;
    if (!s->draft && (rc = draft_state_new(&s->draft, e->draft, s->cfg.n_slots, err)))
        return rc;
    if ((rc = draft_step(s->draft, reqs, n, err)))
        return rc;
    for (int i = 0; i < n; i++)
        s->slots[reqs[i].seq].n_proposed = reqs[i].n_out;
    return 0;
}

// Appends slot si's entries: its next token and its drafts, or the next
// chunk of its prompt (at most nb tokens).
static void add_entries(struct engine_sched *s, int si, int nb, struct step_count *c) {
    struct slot *sl = &s->slots[si];
    int n = c->n;
    if (sl->state == SLOT_GEN) {
        const int k = sl->n_draft;
        hist_add(sl, sl->n_past, &sl->next, 1);
        hist_add(sl, sl->n_past + 1, sl->draft, k);
        for (int t = 0; t <= k; t++) {
            s->tok[n + t] = t == 0 ? sl->next : sl->draft[t - 1];
            s->pos[n + t] = sl->n_past + t;
            s->seq[n + t] = si;
            s->se[2 * (n + t)] = sl->se_g;
            s->se[2 * (n + t) + 1] = sl->se_w;
            s->want[n + t] = 1;
        }
        sl->out_row = n;
        sl->out_pos = sl->n_past;
        c->n += 1 + k, c->n_g += 1 + k;
        sl->n_past += 1 + k;
        sl->n_cells += 1 + k;
        return;
    }
    const int32_t *prompt = sl->rq->p.tokens;
    const int8_t all = sl->rq->p.on_rows != NULL;
    sl->chunk_b0 = n;
    sl->chunk_c0 = sl->n_consumed;
    hist_add(sl, sl->n_past, prompt + sl->n_consumed, nb);
    for (int t = 0; t < nb; t++) {
        s->tok[n + t] = prompt[sl->n_consumed + t];
        s->pos[n + t] = sl->n_past + t;
        s->seq[n + t] = si;
        s->se[2 * (n + t)] = sl->se_g;
        s->se[2 * (n + t) + 1] = sl->se_w;
        s->want[n + t] = all;
    }
    sl->n_consumed += nb;
    sl->n_past += nb;
    sl->n_cells += nb;
    sl->rq->st.n_prompt_eval += nb;
    if (sl->n_consumed == sl->rq->p.n_tokens) {
        s->want[n + nb - 1] = 1;
        sl->out_row = n + nb - 1;
        sl->out_pos = sl->n_past - 1;
    }
    c->n += nb, c->n_p += nb;
}

// The step batch: a token per generating slot, then prompt chunks under the
// budget, in slot order.
static int step_build(struct engine *e, struct engine_sched *s, struct step_count *c,
                      struct verr *err) {
    const int n_batch = context_config(e->ctx)->n_batch;
    int left = INT_MAX; // prompt and draft tokens the budget still allows (may go below 0)
    bool took_prompt = false;
    if (s->cfg.n_step_tokens > 0) {
        left = s->cfg.n_step_tokens;
        for (int si = 0; si < s->cfg.n_slots; si++)
            left -= s->slots[si].state == SLOT_GEN;
    }
    // Rows left for drafts: every active slot may give one; a context that
    // keeps a batch of rows takes any piece of the batch.
    const int n_out = context_config(e->ctx)->n_outputs_max;
    int rows_left = n_out >= n_batch ? INT_MAX : n_out - engine_n_active(e);
    for (int si = 0; si < s->cfg.n_slots; si++) {
        struct slot *sl = &s->slots[si];
        int rc, nb = 0;
        sl->out_row = -1;
        sl->n_draft = 0;
        if (sl->state == SLOT_GEN) {
            if ((rc = make_room(e, s, si, err)) < 0)
                return rc;
            if (rc == 1) {
                if ((rc = slot_finish(e, s, si, "context full", true, err)))
                    return rc;
                continue;
            }
            slot_draft(s, sl, left < rows_left ? left : rows_left);
            left -= sl->n_draft;
            rows_left -= sl->n_draft;
        } else if (sl->state != SLOT_PROMPT || sl->share_from >= 0) {
            continue;
        } else {
            nb = sl->rq->p.n_tokens - sl->n_consumed;
            nb = nb < n_batch ? nb : n_batch;
            // Self-extend regroups positions before each chunk, so its chunks
            // are those of the request alone (n_batch tokens): whole, when
            // they fit or no other prompt took budget in this step.
            if (nb > left && (sl->pol.kind != KV_POLICY_SELFEXTEND || took_prompt))
                nb = sl->pol.kind == KV_POLICY_SELFEXTEND ? 0 : left;
            if (nb <= 0)
                continue;
            left -= nb;
            took_prompt = true;
        }
        if ((rc = context_policy_before_batch(e->ctx, &sl->pol, &sl->n_past, err)))
            return rc;
        add_entries(s, si, nb, c);
    }
    return 0;
}

// What a request's rows give back (enum forward_row): the argmax on the
// backend when it is greedy without penalties; the backend's sample op when
// it has no penalties and no logits hook and the context can sample; else
// the logits come to the host. It depends on the request alone, never on
// the others decoded with it (nor on its drafts).
static uint8_t slot_how(const struct slot *sl, bool can_sample) {
    const struct engine_request *r = &sl->rq->p;
    if (r->on_logits || r->on_rows || !sampler_penalties_off(sl->smp))
        return FORWARD_ROW_LOGITS;
    if (r->sp.temp <= 0)
        return FORWARD_ROW_ARGMAX;
    // A speculating request draws its rows on the host, in order, only as
    // far as it keeps drafts: the draws are those it takes without drafts.
    return can_sample && r->spec.type == ENGINE_SPEC_NONE ? FORWARD_ROW_SAMPLE : FORWARD_ROW_LOGITS;
}

// Each row of the step's batch: its kind (s->how) and, for the sample op,
// its parameters (s->rows; the draw is taken here, once, in batch order:
// the draw sampler_sample would take later). A row that requests waiting to
// share its prompt will copy stays ARGMAX only when every one of them is
// greedy too; else it and they take the logits.
static int step_rows(struct engine *e, struct engine_sched *s, int n, struct verr *err) {
    const bool can_sample = context_can_sample(e->ctx);
    for (int si = 0; si < s->cfg.n_slots; si++)
        if (s->slots[si].state != SLOT_FREE)
            s->slots[si].row_how = slot_how(&s->slots[si], can_sample);
    for (int pass = 0; pass < 2; pass++)
        for (int si = 0; si < s->cfg.n_slots; si++) {
            struct slot *sl = &s->slots[si];
            if (sl->state != SLOT_PROMPT || sl->share_from < 0)
                continue;
            struct slot *src = &s->slots[sl->share_from];
            const bool greedy = src->row_how == FORWARD_ROW_ARGMAX &&
                                slot_how(sl, can_sample) == FORWARD_ROW_ARGMAX;
            if (pass == 0 && !greedy)
                src->row_how = FORWARD_ROW_LOGITS;
            if (pass == 1)
                sl->row_how = greedy ? FORWARD_ROW_ARGMAX : FORWARD_ROW_LOGITS;
        }
    for (int bi = 0, o = 0; bi < n; bi++) {
        if (!s->want[bi])
            continue;
        struct slot *sl = &s->slots[s->seq[bi]];
        s->how[o] = sl->row_how;
        if (sl->row_how == FORWARD_ROW_SAMPLE)
            sampler_next_params(sl->smp, &s->rows[o]);
        o++;
    }
    const size_t row = (size_t)e->m->hp.n_vocab * sizeof(float);
    for (int si = 0; si < s->cfg.n_slots; si++) {
        struct slot *sl = &s->slots[si];
        if (sl->state == SLOT_FREE || sl->row_how != FORWARD_ROW_LOGITS ||
            sl->n_last >= 1 + sl->n_draft)
            continue;
        float *t = realloc(sl->last, (size_t)(1 + sl->n_draft) * row);
        if (!t)
            return verr_set(err, VERR_NOMEM, "out of host memory");
        sl->last = t;
        sl->n_last = 1 + sl->n_draft;
    }
    return 0;
}

// After the piece of the step batch from entry i: the rows of the requests
// that take every row, one call per request and piece.
static void deliver_rows(struct engine_sched *s, int i, const struct context_result *res) {
    for (int o = 0, k; o < res->n_rows; o += k) {
        const int bi = i + res->batch_idx[o], si = s->seq[bi];
        for (k = 1; o + k < res->n_rows && s->seq[i + res->batch_idx[o + k]] == si; k++)
            ;
        struct slot *sl = si >= 0 && si < s->cfg.n_slots ? &s->slots[si] : NULL;
        if (!sl || !sl->rq || !sl->rq->p.on_rows || sl->end_why)
            continue;
        const struct engine_request *r = &sl->rq->p;
        if (r->on_rows(r->user, sl->rq->id, sl->chunk_c0 + (bi - sl->chunk_b0), k,
                       context_row_logits(res, o)))
            sl->end_why = "stopped";
    }
}

// Decodes entries [0, n) of the step batch in pieces of at most n_batch
// tokens; a piece that finds no contiguous run of free cells is retried in
// halves (llama.cpp's parallel example), down to single tokens, which always
// fit since every sequence stays within its share of the cells. Each output
// row is stored with the slot it belongs to. A retried piece passes the same
// sample rows again, so no draw is taken twice.
static int step_decode(struct engine *e, struct engine_sched *s, int n, struct verr *err) {
    const struct forward_config *cfg = context_config(e->ctx);
    const int V = e->m->hp.n_vocab, n_slots = s->cfg.n_slots;
    int piece = cfg->n_batch;
    int o_base = 0; // output rows of the step before entry i
    for (int i = 0; i < n;) {
        int nb = n - i < piece ? n - i : piece;
        const struct context_plan plan = {.batch = {nb, s->tok + i, s->pos + i, s->seq + i,
                                                    s->want + i,
                                                    cfg->k_unrotated ? s->se + 2 * i : NULL},
                                          .how = s->how + o_base,
                                          .sp = s->rows + o_base};
        struct context_result res;
        int rc = context_decode(e->ctx, &plan, &res, err);
        if (rc == VERR_FULL && nb > 1) {
            piece = nb / 2;
            s->st.n_batch_splits++;
            continue;
        }
        if (rc)
            return rc;
        for (int o = 0; o < res.n_rows; o++) {
            int bi = i + res.batch_idx[o];
            int si = s->seq[bi];
            if (si < 0 || si >= n_slots)
                continue;
            struct slot *sl = &s->slots[si];
            const int j = bi - sl->out_row; // 0: its next token's row; j: draft j's
            if (sl->out_row < 0 || j < 0 || j > sl->n_draft)
                continue;
            if (plan.how[o] != FORWARD_ROW_LOGITS)
                sl->amax[j] = res.ids[o];
            else
                memcpy(sl->last + (size_t)j * V, context_row_logits(&res, o),
                       (size_t)V * sizeof(float));
        }
        deliver_rows(s, i, &res);
        o_base += res.n_rows;
        i += nb;
    }
    return 0;
}

// Requests that share a prompt read just now take its cells and its row.
static int step_share(struct engine *e, struct engine_sched *s, struct verr *err) {
    const int V = e->m->hp.n_vocab;
    for (int si = 0; si < s->cfg.n_slots; si++) {
        struct slot *sl = &s->slots[si];
        if (sl->state != SLOT_PROMPT || sl->share_from < 0)
            continue;
        const struct slot *src = &s->slots[sl->share_from];
        if (src->out_row < 0 || src->state != SLOT_PROMPT)
            continue; // its prompt is still being read
        int rc = context_seq_cp(e->ctx, sl->share_from, si, -1, -1, err);
        if (rc)
            return rc;
        sl->n_consumed = src->n_consumed;
        sl->n_past = src->n_past;
        sl->n_cells = src->n_cells;
        sl->out_row = src->out_row;
        sl->out_pos = src->out_pos;
        sl->amax[0] = src->amax[0];
        if (src->row_how == FORWARD_ROW_LOGITS)
            memcpy(sl->last, src->last, (size_t)V * sizeof(float));
        sl->share_from = -1;
        // Its cells are the source's: so is the record of their tokens.
        sl->n_hist = 0;
        sl->hist_ok = src->hist_ok;
        if (src->hist_ok)
            hist_add(sl, 0, src->hist, src->n_hist);
    }
    return 0;
}

// The request's grammar has matched a whole output and can take nothing
// more: it ends as at an end-of-generation token, a step sooner.
static bool grammar_done(const struct sampler *smp) {
    const struct grammar_state *g = sampler_grammar_state(smp);
    return g && grammar_state_done(g);
}

static bool is_stop_token(const struct engine_request *r, int32_t tok) {
    for (int i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] == tok)
            return true;
    return false;
}

// Slot si's token tok, sampled (picked: by the backend): the counts, its
// text and events; it ends the request for the reasons it may (stop: the
// request's hook asked).
static int emit_token(struct engine *e, struct engine_sched *s, int si, int32_t tok, bool picked,
                      bool stop, struct verr *err) {
    struct slot *sl = &s->slots[si];
    struct sched_req *q = sl->rq;
    const struct engine_request *r = &q->p;
    s->st.n_gen_backend += picked;
    q->st.n_gen_backend += picked;
    s->st.n_gen++;
    q->st.n_gen++;
    sl->next = tok;
    double now = engine_now_ms();
    if (q->st.n_gen == 1) {
        q->st.t_first_ms = now;
        q->st.ttft_ms = now - q->st.t_submit_ms;
    }
    q->st.t_last_ms = now;
    stats_finish(&q->st);
    const char *txt = "";
    size_t len = 0;
    int rc;
    if (r->spec.type != ENGINE_SPEC_NONE && (rc = seen_add(sl, &tok, 1, err)))
        return rc;
    if (sl->stream && tok < tokenizer_n_vocab(e->tok) &&
        (rc = tokenizer_stream_push(sl->stream, tok, &txt, &len, err)))
        return rc;
    stop |= req_emit(q, ENGINE_EV_TOKEN, tok, txt, len) != 0;
    const char *why = NULL;
    if (!r->ignore_eos && e->tok && tokenizer_is_eog(e->tok, tok))
        why = "eog";
    else if (is_stop_token(r, tok))
        why = "stop token";
    else if (r->n_predict >= 0 && q->st.n_gen >= r->n_predict)
        why = "n_predict";
    else if (grammar_done(sl->smp))
        why = "grammar end";
    else if (stop)
        why = "stopped";
    return why ? slot_finish(e, s, si, why, true, err) : 0;
}

// A speculating slot drew tok[0..n): the drafts they agree with keep their
// cells, the others' cells leave the cache, and the slot goes on after the
// last kept one.
static int spec_settle(struct engine *e, struct engine_sched *s, int si, const int32_t *tok, int n,
                       struct verr *err) {
    struct slot *sl = &s->slots[si];
    int a = 0;
    while (a < n && a < sl->n_draft && tok[a] == sl->draft[a])
        a++;
    const int32_t p0 = sl->out_pos + 1 + a;
    int rc = a < sl->n_draft ? context_seq_rm(e->ctx, si, p0, -1, err) : 0;
    sl->n_cells -= sl->n_draft - a;
    sl->n_past = p0;
    if (sl->hist_ok && sl->n_hist > p0)
        sl->n_hist = p0;
    s->st.n_drafted += sl->n_draft;
    s->st.n_accepted += a;
    sl->rq->st.n_drafted += sl->n_draft;
    sl->rq->st.n_accepted += a;
    return rc;
}

// Slot si's rows came out: its next token (picked: by the backend) and,
// for a speculating slot, each draft its sampler draws again, in order
// (spec.h): the tokens are those it gives without drafts.
static int sample_slot(struct engine *e, struct engine_sched *s, int si, bool picked,
                       struct verr *err) {
    struct slot *sl = &s->slots[si];
    struct sched_req *q = sl->rq;
    const struct engine_request *r = &q->p;
    const size_t V = (size_t)e->m->hp.n_vocab;
    sl->state = SLOT_GEN;
    if (r->n_predict == 0) // the prompt is read, nothing is sampled
        return slot_finish(e, s, si, "n_predict", true, err);
    bool stop = r->on_logits && r->on_logits(r->user, q->id, sl->out_pos, sl->last);
    int32_t tok[ENGINE_SPEC_MAX + 1];
    int n = 0, rc;
    struct verr gerr = {0};
    bool bad = false;
    for (int j = 0; j <= sl->n_draft; j++) {
        int32_t t = sl->amax[j];
        // A grammar that allows no token here (or grew past its limits)
        // ends the request, with the reason as a note before its end.
        if ((!picked && sampler_sample_checked(sl->smp, sl->last + j * V, &t, &gerr)) ||
            sampler_accept_checked(sl->smp, t, &gerr)) {
            bad = true;
            break;
        }
        tok[n++] = t;
        if (j == sl->n_draft || t != sl->draft[j] || grammar_done(sl->smp))
            break;
    }
    if (sl->n_draft && (rc = spec_settle(e, s, si, tok, n, err)))
        return rc;
    for (int j = 0; j < n; j++)
        if ((rc = emit_token(e, s, si, tok[j], picked, stop, err)) || sl->state == SLOT_FREE)
            return rc;
    if (bad) {
        note_line(sl, gerr.msg);
        return slot_finish(e, s, si, "grammar", true, err);
    }
    return 0;
}

static int step_once(struct engine *e, struct engine_sched *s, struct verr *err) {
    int rc;
    for (int si = 0; si < s->cfg.n_slots; si++)
        s->slots[si].started_now = false;
    for (int si; s->q_len && (si = slot_pick(s, queue_at(s, 0))) >= 0;) {
        struct sched_req *q = queue_at(s, 0);
        s->q_head = (s->q_head + 1) % s->cfg.n_queue_max;
        s->q_len--;
        if ((rc = slot_start(e, s, si, q, err)))
            return rc;
    }
    struct step_count c = {0};
    const double t_draft = engine_now_ms(); // the draft step is generation time
    if ((rc = step_draft(e, s, err)))
        return rc;
    s->st.t_gen_ms += engine_now_ms() - t_draft;
    if ((rc = step_build(e, s, &c, err)))
        return rc;
    if (c.n == 0)
        return 0; // every generating slot ended on a full context
    if ((rc = step_rows(e, s, c.n, err)))
        return rc;
    double t0 = engine_now_ms();
    if ((rc = step_decode(e, s, c.n, err)))
        return rc;
    double t_dec = engine_now_ms() - t0;
    s->st.t_prompt_ms += t_dec * c.n_p / c.n;
    s->st.t_gen_ms += t_dec * c.n_g / c.n;
    s->st.n_prompt += c.n_p;
    if (c.n_g)
        s->st.n_decode_gen++;
    if ((rc = step_share(e, s, err)))
        return rc;
    double ts = engine_now_ms();
    for (int si = 0; si < s->cfg.n_slots && !s->halt; si++) {
        const struct slot *sl = &s->slots[si];
        if (sl->out_row < 0 || sl->state == SLOT_FREE)
            continue;
        if ((rc = sample_slot(e, s, si, sl->row_how != FORWARD_ROW_LOGITS, err)))
            return rc;
    }
    s->st.t_gen_ms += engine_now_ms() - ts;
    return 0;
}

int engine_step(struct engine *e, struct verr *err) {
    struct engine_sched *s = e->sched;
    if (!s || (!engine_n_active(e) && !s->q_len))
        return 0;
    if (s->in_step)
        return verr_set(err, VERR_RANGE, "engine_step called from a request's callback");
    s->in_step = true;
    s->halt = false;
    int rc = step_once(e, s, err);
    s->in_step = false;
    if (rc < 0) {
        // The requests' positions and cells no longer agree with what was
        // decoded: they end; the queue waits for the next step.
        end_active(e, s, "error", false, NULL);
        return rc;
    }
    for (int si = 0; si < s->cfg.n_slots; si++)
        if (s->slots[si].state != SLOT_FREE && s->slots[si].end_why &&
            (rc = slot_finish(e, s, si, s->slots[si].end_why, true, err)))
            return rc;
    return engine_n_active(e) || s->q_len ? 1 : 0;
}
