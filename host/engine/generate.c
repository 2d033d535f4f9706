// engine_generate_batch / engine_generate (engine.h): a fixed list of prompts
// run to the end as a loop over the step API (step.h): the prompts are
// submitted in order as the queue has room and the engine steps until every
// one has ended. The slots are n_parallel, the step has no token budget
// (every prompt being read adds a chunk of n_batch, as llama.cpp's parallel
// example does) and prompt i samples with seed + i, so the tokens, events and
// statistics are those of the run-to-completion loop this replaced.
#include <stdlib.h>
#include <string.h>

#include "host/engine/engine.h"
#include "host/engine/step.h"

void engine_gen_params_default(struct engine_gen_params *g) {
    memset(g, 0, sizeof *g);
    g->n_predict = -1;
    g->n_parallel = 1;
    g->ctx_shift = true;
    g->n_keep = 0;
    g->ga_n = 1;
    g->ga_w = 512;
    sampler_params_default(&g->sp);
    engine_spec_default(&g->spec);
}

// samples: the prompts are copies of one (engine_generate), which the
// messages then call "the prompt".
static int check_params(const struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                        bool samples, const struct engine_gen_params *g, int n_ctx_seq,
                        struct verr *err) {
    const struct forward_config *cfg = context_config(e->ctx);
    const int n_par = g->n_parallel, V = e->m->hp.n_vocab;
    if (n_prompts < 1)
        return verr_set(err, VERR_RANGE, "no prompt");
    if (n_par < 1 || n_par > cfg->n_seq_max ||
        cfg->n_outputs_max < (n_par < cfg->n_batch ? n_par : cfg->n_batch))
        return verr_set(err, VERR_RANGE,
                        "--parallel %d: the context was opened for %d sequences (%d logits rows)",
                        n_par, cfg->n_seq_max, cfg->n_outputs_max);
    if (n_ctx_seq < 5)
        return verr_set(err, VERR_RANGE,
                        "a context of %d cells leaves %d per sequence for --parallel %d; each "
                        "needs at least 5 (raise -c)",
                        cfg->n_ctx, n_ctx_seq, n_par);
    if (g->n_predict < -2)
        return verr_set(err, VERR_RANGE,
                        "n_predict %d: -1 (until EOG) or -2 (until the context is "
                        "full) or >= 0",
                        g->n_predict);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.ga_n = g->ga_n;
    pp.ga_w = g->ga_w;
    pp.se_g = cfg->se_g;
    pp.se_w = cfg->se_w;
    struct kv_policy pol;
    int rc = context_policy_init(e->ctx, &pol, &pp, 0, n_ctx_seq, err);
    if (rc)
        return rc;
    for (int i = 0; i < n_prompts; i++) {
        const struct engine_prompt *p = &prompts[i];
        if (p->n_tokens < 1 || !p->tokens)
            return verr_set(err, VERR_RANGE, "prompt %d is empty", i);
        // llama-cli's limit: room for a few generated tokens after the prompt.
        if (p->n_tokens > n_ctx_seq - 4) {
            if (n_prompts == 1 || samples)
                return verr_set(err, VERR_RANGE, "prompt is too long (%d tokens, max %d)",
                                p->n_tokens, n_ctx_seq - 4);
            return verr_set(err, VERR_RANGE, "prompt %d is too long (%d tokens, max %d)", i,
                            p->n_tokens, n_ctx_seq - 4);
        }
        for (int t = 0; t < p->n_tokens; t++)
            if (p->tokens[t] < 0 || p->tokens[t] >= V)
                return samples || n_prompts == 1
                           ? verr_set(err, VERR_RANGE, "token id %d is out of range (n_vocab %d)",
                                      p->tokens[t], V)
                           : verr_set(err, VERR_RANGE,
                                      "prompt %d: token id %d is out of range (n_vocab %d)", i,
                                      p->tokens[t], V);
    }
    return 0;
}

// The run: the caller's callbacks see prompt indices; a non-zero return
// from either stops every sequence ("stopped"), as it always did.
struct gen_loop {
    struct engine *e;
    const struct engine_gen_params *g;
    engine_event_fn cb;
    void *user;
    int n_queue_max; // the step API's queue, as configured for this loop
    bool halt;
};

struct gen_item {
    struct gen_loop *w;
    int i; // prompt index
};

static int on_req_event(void *user, const struct engine_req_event *ev) {
    struct gen_item *it = user;
    struct gen_loop *w = it->w;
    // A failed step ends its requests with "error"; the caller gets the
    // error code instead.
    if (ev->ev == ENGINE_EV_DONE && !strcmp(ev->text, "error"))
        return 0;
    if (w->cb && w->cb(w->user, ev->ev, it->i, ev->token, ev->text, ev->len) &&
        ev->ev == ENGINE_EV_TOKEN) {
        w->halt = true;
        engine_sched_halt(w->e); // the step samples no further slot
    }
    return 0;
}

static int on_req_logits(void *user, uint64_t id, int32_t pos, const float *logits) {
    struct gen_item *it = user;
    (void)id;
    if (it->w->g->on_logits(it->w->g->logits_user, it->i, pos, logits)) {
        it->w->halt = true;
        engine_sched_halt(it->w->e);
    }
    return 0;
}

// Prompt i as a request; seed: its sampler seed.
static void make_request(struct engine_request *r, const struct engine_gen_params *g,
                         const struct engine_prompt *p, uint32_t seed, struct gen_item *it) {
    engine_request_default(r);
    r->tokens = p->tokens;
    r->n_tokens = p->n_tokens;
    r->sp = g->sp;
    r->sp.seed = seed;
    r->n_predict = g->n_predict;
    r->ignore_eos = g->ignore_eos;
    r->ctx_shift = g->ctx_shift;
    r->n_keep = g->n_keep;
    r->ga_n = g->ga_n;
    r->ga_w = g->ga_w;
    r->spec = g->spec;
    r->cb = on_req_event;
    r->on_logits = g->on_logits ? on_req_logits : NULL;
    r->user = it;
}

// Sequence 0's seed (a random one picked now when asked for); sequence i
// uses it + i.
static int base_seed(const struct engine *e, const struct sampler_params *sp, uint32_t *out,
                     struct verr *err) {
    *out = sp->seed;
    if (sp->seed != SAMPLER_SEED_RANDOM)
        return 0;
    struct sampler_params p = *sp;
    p.repeat_last_n = 0;
    struct sampler *smp;
    int rc = sampler_create(&smp, &p, e->m->hp.n_vocab, err);
    if (rc)
        return rc;
    *out = sampler_seed(smp);
    sampler_free(smp);
    return 0;
}

// Submits prompts from *next while the queue takes them, then steps once.
static int loop_step(struct gen_loop *w, const struct engine_prompt *prompts, int n_prompts,
                     struct gen_item *items, uint32_t base, int *next, struct verr *err) {
    while (*next < n_prompts && engine_n_queued(w->e) < w->n_queue_max) {
        int i = *next;
        uint32_t seed = i == 0 ? base : base + (uint32_t)i;
        if (i > 0 && seed == SAMPLER_SEED_RANDOM)
            seed = 0;
        struct engine_request r;
        items[i] = (struct gen_item){w, i};
        make_request(&r, w->g, &prompts[i], seed, &items[i]);
        int rc = engine_submit(w->e, &r, NULL, err);
        if (rc)
            return rc;
        (*next)++;
    }
    return engine_step(w->e, err);
}

static int generate(struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                    bool samples, const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err) {
    memset(st, 0, sizeof *st);
    const int n_par = g->n_parallel;
    const int n_ctx_seq = n_par >= 1 ? context_config(e->ctx)->n_ctx / n_par : 0;
    int rc = check_params(e, prompts, n_prompts, samples, g, n_ctx_seq, err);
    if (rc)
        return rc;
    if (engine_n_active(e) || engine_n_queued(e))
        return verr_set(err, VERR_RANGE, "the engine is serving requests (engine_submit)");
    uint32_t base;
    if ((rc = base_seed(e, &g->sp, &base, err)))
        return rc;
    struct engine_sched_config saved;
    engine_sched_config_get(e, &saved);
    struct engine_sched_config c = {.n_slots = n_par, .n_queue_max = n_par, .n_step_tokens = -1};
    struct gen_item *items = malloc((size_t)n_prompts * sizeof *items);
    if (!items)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    if ((rc = engine_sched_configure(e, &c, err)) || (rc = context_clear(e->ctx, err)))
        goto out;
    struct gen_loop w = {.e = e, .g = g, .cb = cb, .user = user, .n_queue_max = c.n_queue_max};
    int next = 0;
    double t_start = engine_now_ms();
    // (0 with prompts left: every started one ended within the step)
    while (((rc = loop_step(&w, prompts, n_prompts, items, base, &next, err)) == 1 ||
            (rc == 0 && next < n_prompts)) &&
           !w.halt)
        ;
    if (rc < 0)
        goto out;
    // A stop requested by a callback still flushes and ends every sequence.
    if (w.halt && (rc = engine_end_all(e, "stopped", err)))
        goto out;
    *st = *engine_sched_stats(e);
    st->seed = base;
    st->t_total_ms = engine_now_ms() - t_start;
out:
    if (rc)
        engine_end_all(e, "error", NULL);
    // The step API's own configuration again (the defaults when it had none).
    engine_sched_configure(e, &saved, NULL);
    free(items);
    return rc;
}

int engine_generate_batch(struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                          const struct engine_gen_params *g, engine_event_fn cb, void *user,
                          struct engine_stats *st, struct verr *err) {
    return generate(e, prompts, n_prompts, false, g, cb, user, st, err);
}

int engine_generate(struct engine *e, const int32_t *prompt, int n_prompt,
                    const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err) {
    int n = g->n_parallel > 0 ? g->n_parallel : 1;
    if (n > KV_SEQ_MAX_LIMIT) {
        memset(st, 0, sizeof *st);
        return verr_set(err, VERR_RANGE, "--parallel %d is more than %d", n, KV_SEQ_MAX_LIMIT);
    }
    struct engine_prompt *ps = malloc((size_t)n * sizeof *ps);
    if (!ps) {
        memset(st, 0, sizeof *st);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    for (int i = 0; i < n; i++)
        ps[i] = (struct engine_prompt){prompt, n_prompt};
    int rc = generate(e, ps, n, true, g, cb, user, st, err);
    free(ps);
    return rc;
}
