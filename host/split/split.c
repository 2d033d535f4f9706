// The executor over a pipeline of stages, and opening a model on one device
// or several (see split.h).
#include "host/split/split.h"

#include <stdlib.h>
#include <string.h>

int split_load(struct split_model *sm, const struct load_config *lc,
               const struct forward_config *cfg, const struct gguf_file *f,
               model_progress_fn progress, void *progress_user, struct verr *err) {
    memset(sm, 0, sizeof *sm);
    return pipeline_load_ex(lc, cfg, f, progress, progress_user, &sm->pipe, &sm->be, &sm->m, err);
}

void split_model_free(struct split_model *sm) {
    if (sm->pipe) {
        pipeline_free(sm->pipe);
    } else {
        model_free(sm->m);
        backend_destroy(sm->be);
    }
    memset(sm, 0, sizeof *sm);
}

struct pipe_exec {
    struct executor x;
    struct forward_ctx front;
    struct pipeline_ctx *pc;
    struct split_model sm; // owned when own
    bool own;
};

static int pipe_decode(struct executor *x, const struct forward_batch *b, enum forward_head head,
                       const struct sample_params *sp, struct verr *err) {
    struct pipe_exec *pe = x->impl;
    struct forward_ctx *fc = &pe->front;
    if (head == FORWARD_HEAD_SAMPLE && !x->ops->can_sample(x))
        return verr_set(err, VERR_UNSUPPORTED,
                        "forward: sampling on the backend with the head in another process");
    if (head == FORWARD_HEAD_SAMPLE && !sp)
        return verr_set(err, VERR_RANGE, "forward: no sample rows");
    int n_out = 0;
    int rc = forward_batch_begin(fc, b, &n_out, err);
    if (rc)
        return rc;
    fc->sp = head == FORWARD_HEAD_SAMPLE ? sp : NULL;
    rc = pipeline_decode(pe->pc, b, n_out, head != FORWARD_HEAD_LOGITS, err);
    fc->sp = NULL;
    if (rc) {
        forward_batch_undo(fc, b);
        return rc;
    }
    fc->n_out = n_out;
    return 0;
}

static bool pipe_can_sample(const struct executor *x) {
    const struct pipe_exec *pe = x->impl;
    return !pe->sm.pipe->ctl;
}

static const char *pipe_describe(const struct executor *x) {
    const struct pipe_exec *pe = x->impl;
    return pe->sm.pipe->plan_text;
}

static void pipe_destroy(struct executor *x) {
    struct pipe_exec *pe = x->impl;
    pipeline_ctx_free(pe->pc);
    forward_free(&pe->front);
    if (pe->own)
        split_model_free(&pe->sm);
    free(pe);
}

static const struct executor_ops pipe_ops = {
    .decode = pipe_decode,
    .can_sample = pipe_can_sample,
    .describe = pipe_describe,
    .destroy = pipe_destroy,
};

static int pipe_create(struct executor **out, struct split_model *sm,
                       const struct forward_config *cfg, bool own, struct verr *err) {
    struct pipe_exec *pe = calloc(1, sizeof *pe);
    if (!pe)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    pe->sm = *sm;
    pe->own = own;
    int rc = forward_init_front(&pe->front, sm->m, cfg, err);
    if (!rc && (rc = pipeline_ctx_init(&pe->pc, sm->pipe, &pe->front, &pe->front.cfg, err)))
        forward_free(&pe->front);
    if (rc) {
        free(pe);
        return rc;
    }
    pe->x =
        (struct executor){.ops = &pipe_ops, .fc = &pe->front, .m = sm->m, .be = sm->be, .impl = pe};
    *out = &pe->x;
    return 0;
}

int split_executor_create(struct executor **out, struct split_model *sm,
                          const struct forward_config *cfg, bool own, struct verr *err) {
    *out = NULL;
    struct forward_config c = *cfg;
    forward_config_resolve(&c, &sm->m->hp);
    int rc = sm->pipe ? pipe_create(out, sm, &c, own, err)
                      : forward_executor_create(out, sm->be, sm->m, &c, own, err);
    // forward_executor_create frees what it owns on failure; a pipeline is
    // freed here.
    if (rc && own && sm->pipe)
        split_model_free(sm);
    if (own)
        memset(sm, 0, sizeof *sm);
    return rc;
}

int split_open(struct executor **out, const struct load_config *lc,
               const struct forward_config *cfg, const struct gguf_file *f,
               model_progress_fn progress, void *progress_user, struct verr *err) {
    *out = NULL;
    struct split_model sm;
    int rc = split_load(&sm, lc, cfg, f, progress, progress_user, err);
    if (rc)
        return rc;
    return split_executor_create(out, &sm, cfg, true, err);
}

struct pipeline *split_pipeline(const struct executor *x) {
    return x && x->ops == &pipe_ops ? ((const struct pipe_exec *)x->impl)->sm.pipe : NULL;
}

struct pipeline_ctx *split_pipeline_ctx(const struct executor *x) {
    return x && x->ops == &pipe_ops ? ((const struct pipe_exec *)x->impl)->pc : NULL;
}
