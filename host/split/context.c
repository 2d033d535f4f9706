// The context over a pipeline of stages (see context.h).
#include "host/split/context.h"

#include <stdlib.h>
#include <string.h>

struct context {
    struct pipeline *p;
    struct pipeline_ctx *pc;
    struct forward_ctx *front; // pc's front stage: the bookkeeping and the results
    bool own;                  // p is freed with the context
};

int context_create(struct context **out, struct pipeline *p, const struct forward_config *cfg,
                   bool own, struct verr *err) {
    *out = NULL;
    struct context *c = calloc(1, sizeof *c);
    int rc = c ? 0 : verr_set(err, VERR_NOMEM, "out of host memory");
    struct forward_config fc = *cfg;
    for (int s = 0; s < p->n_stages; s++)
        if (p->stage[s].m) {
            forward_config_resolve(&fc, &p->stage[s].m->hp);
            break;
        }
    // Under mpirun every rank's stage gets rank 0's shapes (n_ctx, batch, cache types).
    if (!rc && p->ctl && p->ctl->rank == 0)
        rc = pipeline_mpi_bcast_config(p->ctl, &fc, err);
    if (!rc)
        rc = pipeline_ctx_init(&c->pc, p, &fc, err);
    if (rc) {
        free(c);
        if (own)
            pipeline_free(p);
        return rc;
    }
    c->p = p;
    c->own = own;
    c->front = c->pc->fc[c->pc->front];
    *out = c;
    return 0;
}

int context_open(struct context **out, const struct load_config *lc,
                 const struct forward_config *cfg, const struct gguf_file *f,
                 model_progress_fn progress, void *progress_user, struct verr *err) {
    *out = NULL;
    struct pipeline *p = NULL;
    int rc = pipeline_load_ex(lc, cfg, f, progress, progress_user, &p, err);
    return rc ? rc : context_create(out, p, cfg, true, err);
}

void context_free(struct context *c) {
    if (!c)
        return;
    pipeline_ctx_free(c->pc);
    if (c->own)
        pipeline_free(c->p);
    free(c);
}

int context_serve_rank(const struct load_config *lc, const struct forward_config *lcfg,
                       struct verr *err) {
    if (!lc->model_path)
        return verr_set(err, VERR_RANGE, "MPI worker: no model (-m)");
    struct gguf_file *f = NULL;
    struct pipeline *p = NULL;
    struct pipeline_ctx *pc = NULL;
    int rc = gguf_open(&f, lc->model_path, err);
    if (!rc)
        rc = pipeline_load(lc, lcfg, f, &p, err);
    if (!rc && !p->ctl)
        rc = verr_set(err, VERR_RANGE, "MPI worker: the model is not split");
    // Every stage's cache and scratch take rank 0's shapes.
    struct forward_config cfg;
    forward_config_default(&cfg);
    if (!rc)
        rc = pipeline_mpi_bcast_config(p->ctl, &cfg, err);
    if (!rc)
        rc = pipeline_ctx_init(&pc, p, &cfg, err);
    if (!rc)
        rc = pipeline_serve(pc, err);
    pipeline_ctx_free(pc);
    pipeline_free(p);
    gguf_close(f);
    return rc;
}

// --- what the context is

const struct model *context_model(const struct context *c) {
    return c->front->m;
}

const struct forward_config *context_config(const struct context *c) {
    return &c->front->cfg;
}

const struct rope_params *context_rope(const struct context *c) {
    return &c->front->rope;
}

double context_kv_bytes(const struct context *c) {
    const struct kv_cache *kv = &c->front->kv;
    return (double)(kv->k_row_bytes + kv->v_row_bytes) * c->front->cfg.n_ctx *
           c->front->m->hp.n_layer;
}

const char *context_backend_name(const struct context *c) {
    return c->front->be->ops->name;
}

const char *context_describe(const struct context *c) {
    return c->p->n_stages > 1 ? c->p->plan_text : NULL;
}

bool context_can_sample(const struct context *c) {
    return !c->p->ctl;
}

struct pipeline *context_pipeline(const struct context *c) {
    return c->p;
}

const struct forward_ctx *context_stage(const struct context *c, int s) {
    return s >= 0 && s < c->p->n_stages ? c->pc->fc[s] : NULL;
}

struct forward_graph_stats context_graph_stats(const struct context *c) {
    struct forward_graph_stats t = {0};
    for (int s = 0; s < c->p->n_stages; s++) {
        const struct forward_ctx *fc = c->pc->fc[s];
        if (!fc)
            continue;
        t.recorded += fc->graph_stats.recorded;
        t.replays += fc->graph_stats.replays;
        t.eager += fc->graph_stats.eager;
        t.live += fc->graph_stats.live;
    }
    return t;
}

// --- decoding

void context_last_result(const struct context *c, struct context_result *res) {
    const struct forward_ctx *fc = c->front;
    *res = (struct context_result){.n_rows = fc->n_out,
                                   .n_vocab = fc->m->hp.n_vocab,
                                   .batch_idx = fc->out_batch_idx,
                                   .ids = fc->h_argmax,
                                   .logits = fc->h_logits};
}

int context_decode(struct context *c, const struct context_plan *plan, struct context_result *res,
                   struct verr *err) {
    int rc = pipeline_decode(c->pc, &plan->batch, plan->how, plan->sp, err);
    if (!rc && res)
        context_last_result(c, res);
    return rc;
}

int context_decode_logits(struct context *c, const struct forward_batch *b,
                          struct context_result *res, struct verr *err) {
    const struct context_plan plan = {.batch = *b};
    return context_decode(c, &plan, res, err);
}

// --- the cache

int context_clear(struct context *c, struct verr *err) {
    return kv_clear(&c->front->kv, err);
}

int context_seq_rm(struct context *c, int seq, int32_t p0, int32_t p1, struct verr *err) {
    return kv_seq_rm(&c->front->kv, seq, p0, p1, err);
}

int context_seq_cp(struct context *c, int src, int dst, int32_t p0, int32_t p1, struct verr *err) {
    return kv_seq_cp(&c->front->kv, src, dst, p0, p1, err);
}

int context_seq_keep(struct context *c, int seq, struct verr *err) {
    return kv_seq_keep(&c->front->kv, seq, err);
}

int context_seq_add(struct context *c, int seq, int32_t p0, int32_t p1, int32_t delta,
                    struct verr *err) {
    return kv_seq_add(&c->front->kv, seq, p0, p1, delta, err);
}

int context_seq_div(struct context *c, int seq, int32_t p0, int32_t p1, int d, struct verr *err) {
    return kv_seq_div(&c->front->kv, seq, p0, p1, d, err);
}

int32_t context_seq_pos_max(const struct context *c, int seq) {
    return kv_seq_pos_max(&c->front->kv, seq);
}

int context_cells_used(const struct context *c) {
    return c->front->kv.used;
}

int context_policy_init(const struct context *c, struct kv_policy *pol,
                        const struct kv_policy_params *pp, int seq, int n_ctx_seq,
                        struct verr *err) {
    return kv_policy_init(pol, pp, &c->front->kv, seq, n_ctx_seq, err);
}

int context_policy_before_batch(struct context *c, struct kv_policy *pol, int32_t *n_past,
                                struct verr *err) {
    return kv_policy_before_batch(pol, &c->front->kv, n_past, err);
}

int context_policy_make_room(struct context *c, struct kv_policy *pol, int32_t *n_past,
                             int *n_cells, int32_t *n_discard, struct verr *err) {
    return kv_policy_make_room(pol, &c->front->kv, n_past, n_cells, n_discard, err);
}
