// The generation engine (see engine.h): llama-cli's main loop over the one
// forward pass, the sampler and the streaming detokenizer.
#include "host/engine/engine.h"
#include "host/engine/step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

void engine_config_default(struct engine_config *c) {
    memset(c, 0, sizeof *c);
    load_config_default(&c->load);
    forward_config_default(&c->ctx);
    c->ctx.n_ctx = 0;
    c->ctx.n_seq_max = 0;
}

// The tokenizer of an open file, checked against the model's vocabulary.
static int open_tokenizer(struct engine *e, const struct gguf_file *f, const char *path, bool need,
                          struct verr *err) {
    if (gguf_find_key(f, "tokenizer.ggml.model") < 0) {
        if (!need)
            return 0;
        return verr_set(err, VERR_NOTFOUND,
                        "%s: the model has no tokenizer (no tokenizer.ggml.model key)", path);
    }
    int rc = tokenizer_load(&e->tok, f, err);
    if (rc)
        return verr_wrap(err, "%s: tokenizer", path);
    if (tokenizer_n_vocab(e->tok) > e->m->hp.n_vocab)
        return verr_set(err, VERR_FORMAT,
                        "%s: the tokenizer has %d tokens but token_embd.weight only %d rows", path,
                        tokenizer_n_vocab(e->tok), e->m->hp.n_vocab);
    return 0;
}

int engine_open(struct engine **out, const struct engine_config *c, struct verr *err) {
    *out = NULL;
    double t0 = engine_now_ms();
    const char *path = c->load.model_path;
    if (!path)
        return verr_set(err, VERR_RANGE, "no model given (-m FILE)");
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    struct forward_config fcfg = c->ctx;
    fcfg.n_seq_max = fcfg.n_seq_max > 0 ? fcfg.n_seq_max : 1;
    fcfg.n_outputs_max = fcfg.n_outputs_max > 0 ? fcfg.n_outputs_max : fcfg.n_seq_max;
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        goto fail;
    // One backend, or a model split over several devices (e->m is then
    // stage 0's, see host/split/pipeline.h).
    if ((rc =
             pipeline_load_ex(&c->load, &fcfg, f, c->progress, c->progress_user, &e->weights, err)))
        goto fail;
    e->m = e->weights->stage[0].m;
    if ((rc = open_tokenizer(e, f, path, c->need_tokenizer, err)))
        goto fail;
    forward_config_resolve(&fcfg, &e->m->hp);
    if ((rc = engine_reopen(e, &fcfg, err)))
        goto fail;
    gguf_close(f);
    e->t_load_ms = engine_now_ms() - t0;
    *out = e;
    return 0;
fail:
    gguf_close(f);
    engine_close(e);
    return rc;
}

int engine_reopen(struct engine *e, const struct forward_config *cfg, struct verr *err) {
    engine_sched_free(e->sched); // its requests' cells go with the cache
    e->sched = NULL;
    context_free(e->ctx);
    e->ctx = NULL;
    int rc = context_create(&e->ctx, e->weights, cfg, false, err);
    if (!rc)
        e->m = context_model(e->ctx);
    return rc;
}

void engine_close(struct engine *e) {
    if (!e)
        return;
    engine_sched_free(e->sched);
    engine_close(e->draft);
    context_free(e->ctx);
    tokenizer_free(e->tok);
    pipeline_free(e->weights);
    free(e);
}

// engine_eval_ex as a request of the step API that takes every row: its
// self-extend notes and rows go to the caller's callbacks; the time spent in
// rows is not the evaluation's.
struct eval_loop {
    const struct engine_eval_params *p;
    engine_rows_fn rows;
    void *user;
    double spent_in_rows;
    int rc; // the first non-zero return of rows
};

static int eval_event(void *user, const struct engine_req_event *ev) {
    struct eval_loop *l = user;
    if (ev->ev == ENGINE_EV_NOTE && l->p && l->p->cb)
        l->p->cb(l->p->user, ENGINE_EV_NOTE, 0, -1, ev->text, ev->len);
    return 0;
}

static int eval_rows(void *user, uint64_t id, int first, int n, const float *logits) {
    struct eval_loop *l = user;
    (void)id;
    if (!l->rows || l->rc)
        return l->rc;
    double t = engine_now_ms();
    l->rc = l->rows(l->user, first, n, logits);
    l->spent_in_rows += engine_now_ms() - t;
    return l->rc;
}

static int eval_check(const struct engine *e, const int32_t *tokens, int n_tokens, int ga_n,
                      int ga_w, struct verr *err) {
    const struct forward_config *cfg = context_config(e->ctx);
    const int n_ctx = cfg->n_ctx, n_batch = cfg->n_batch;
    if (n_tokens < 1)
        return verr_set(err, VERR_RANGE, "no tokens to evaluate");
    if (engine_n_active(e) || engine_n_queued(e))
        return verr_set(err, VERR_RANGE, "the engine is serving requests (engine_submit)");
    // Every token takes a cell, self-extend or not.
    if (n_tokens > n_ctx)
        return verr_set(err, VERR_RANGE, "%d tokens do not fit in the context of %d (-c)", n_tokens,
                        n_ctx);
    if (cfg->n_outputs_max < n_batch)
        return verr_set(err, VERR_RANGE,
                        "engine_eval: the context keeps logits of %d rows, "
                        "the batch is %d",
                        cfg->n_outputs_max, n_batch);
    for (int t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= e->m->hp.n_vocab)
            return verr_set(err, VERR_RANGE, "token id %d is out of range (n_vocab %d)", tokens[t],
                            e->m->hp.n_vocab);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.ga_n = ga_n;
    pp.ga_w = ga_w;
    struct kv_policy pol;
    return context_policy_init(e->ctx, &pol, &pp, 0, n_ctx, err);
}

int engine_eval_ex(struct engine *e, const int32_t *tokens, int n_tokens,
                   const struct engine_eval_params *p, engine_rows_fn rows, void *user,
                   double *t_ms, struct verr *err) {
    const int ga_n = p ? p->ga_n : 1, ga_w = p ? p->ga_w : 512;
    int rc = eval_check(e, tokens, n_tokens, ga_n, ga_w, err);
    if (rc)
        return rc;
    struct engine_sched_config saved;
    engine_sched_config_get(e, &saved);
    // One slot of the whole context, a chunk of n_batch tokens a step.
    struct engine_sched_config c = {.n_slots = 1, .n_queue_max = 1, .n_step_tokens = -1};
    if ((rc = engine_sched_configure(e, &c, err)) || (rc = context_clear(e->ctx, err)))
        goto out;
    struct eval_loop l = {.p = p, .rows = rows, .user = user};
    struct engine_request r;
    engine_request_default(&r);
    r.tokens = tokens;
    r.n_tokens = n_tokens;
    r.n_predict = 0;
    r.ga_n = ga_n;
    r.ga_w = ga_w;
    r.cb = eval_event;
    r.on_rows = eval_rows;
    r.user = &l;
    r.keep_cells = true;
    double t0 = engine_now_ms();
    if ((rc = engine_submit(e, &r, NULL, err)))
        goto out;
    while ((rc = engine_step(e, err)) == 1 && !l.rc)
        ;
    if (rc >= 0 && l.rc) {
        rc = l.rc > 0 ? verr_set(err, VERR_IO, "writing logits failed") : l.rc;
        engine_end_all(e, "stopped", NULL);
    }
    if (!rc && t_ms)
        *t_ms = engine_now_ms() - t0 - l.spent_in_rows;
out:
    engine_sched_configure(e, &saved, NULL);
    return rc;
}

int engine_eval(struct engine *e, const int32_t *tokens, int n_tokens, engine_rows_fn rows,
                void *user, double *t_ms, struct verr *err) {
    return engine_eval_ex(e, tokens, n_tokens, NULL, rows, user, t_ms, err);
}

void engine_describe(const struct engine *e, char *buf, size_t cap) {
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    const struct forward_config *cfg = context_config(e->ctx);
    const struct rope_params *rp = context_rope(e->ctx);
    snprintf(buf, cap,
             "model: %s (%s), %.2f M parameters, %.2f MiB of weights (%s), output %s\n"
             "hparams: n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d/%d, n_ff %d, "
             "n_vocab %d, n_ctx_train %d, rms_eps %g\n"
             "rope: %s, n_rot %d, freq_base %g, freq_scale %g, scaling %s, ext_factor %g, "
             "attn_factor %g, beta_fast %g, beta_slow %g, n_ctx_orig %d%s\n"
             "context: backend %s, n_ctx %d, n_batch %d, n_seq_max %d, cache %s/%s, "
             "KV %.2f MiB\n"
             "tokenizer: %s",
             m->name, model_arch_name(hp->arch), (double)m->n_params / 1e6,
             (double)m->n_bytes / (1024.0 * 1024.0), ggml_type_name(m->weight_type),
             m->output_tied ? "tied to token_embd" : "separate", hp->n_embd, hp->n_layer,
             hp->n_head, hp->n_head_kv, hp->head_dim, hp->head_dim_v, hp->n_ff, hp->n_vocab,
             hp->n_ctx_train, hp->norm_eps, rp->mode == ROPE_MODE_NEOX ? "neox" : "normal",
             rp->n_rot, rp->freq_base, rp->freq_scale, rope_scaling_name(hp->rope_scaling),
             rp->ext_factor, rp->attn_factor, rp->beta_fast, rp->beta_slow, rp->n_ctx_orig,
             rp->freq_factors ? ", rope_freqs.weight" : "", context_backend_name(e->ctx),
             cfg->n_ctx, cfg->n_batch, cfg->n_seq_max, ggml_type_name(cfg->type_k),
             ggml_type_name(cfg->type_v), context_kv_bytes(e->ctx) / (1024.0 * 1024.0),
             e->tok ? (tokenizer_get_type(e->tok) == TOKENIZER_SPM ? "spm (llama)" : "bpe (gpt2)")
                    : "none");
    const char *plan = context_describe(e->ctx); // NULL with one stage
    if (plan) {
        size_t n = strlen(buf);
        if (n < cap)
            snprintf(buf + n, cap - n, "\nsplit:\n%s", plan);
    }
}
