// The executor: what the engine decodes through, without knowing whether
// one device or a pipeline of several sits below it.
//
// An executor owns (or borrows) a model's weights and one forward context:
// the front context `fc`, whose KV cache holds the bookkeeping every caller
// uses (sequence ops, positions, context shift, self-extend act on
// x->fc->kv between decodes) and whose host arrays hold the results of the
// last decode (forward_logits / forward_argmax, n_out, out_batch_idx).
//
// Implementations:
// - one backend (forward_executor_create, here): decode is forward_decode*;
// - a pipeline of stages (host/split/): decode claims the cells on the front
//   cache, runs the stages, and leaves the last stage's results in fc.
#ifndef VELA_HOST_FORWARD_EXECUTOR_H
#define VELA_HOST_FORWARD_EXECUTOR_H

#include <stdbool.h>

#include "gguf/verr.h"
#include "host/forward/forward.h"

struct executor;

struct executor_ops {
    // Decodes the batch as forward_decode_head does on one backend. Errors
    // leave the cache as it was before the call.
    int (*decode)(struct executor *x, const struct forward_batch *b, enum forward_head head,
                  const struct sample_params *sp, struct verr *err);
    // Whether FORWARD_HEAD_SAMPLE can run: not when the last stage is in
    // another process (sample rows are not sent there).
    bool (*can_sample)(const struct executor *x);
    // Lines describing the split (plan, transport), or NULL with one device.
    const char *(*describe)(const struct executor *x);
    // Frees the context and whatever the executor owns (weights, backends).
    void (*destroy)(struct executor *x);
};

struct executor {
    const struct executor_ops *ops;
    struct forward_ctx *fc; // the front context: cache, config, last results
    const struct model *m;  // the front stage's model (hparams, name, weights)
    struct backend *be;     // the front stage's backend
    void *impl;
};

static inline int executor_decode(struct executor *x, const struct forward_batch *b,
                                  enum forward_head head, const struct sample_params *sp,
                                  struct verr *err) {
    return x->ops->decode(x, b, head, sp, err);
}
static inline bool executor_can_sample(const struct executor *x) {
    return x->ops->can_sample(x);
}
static inline const char *executor_describe(const struct executor *x) {
    return x->ops->describe(x);
}
static inline void executor_destroy(struct executor *x) {
    if (x)
        x->ops->destroy(x);
}

// An executor over one backend: a forward context for m on be with cfg.
// own: the executor frees m and be when destroyed (on failure too);
// otherwise they are borrowed and must outlive it.
int forward_executor_create(struct executor **out, struct backend *be, struct model *m,
                            const struct forward_config *cfg, bool own, struct verr *err);

#endif
