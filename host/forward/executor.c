// The executor over one backend (see executor.h).
#include "host/forward/executor.h"

#include <stdlib.h>

struct one_exec {
    struct executor x;
    struct forward_ctx fc;
    struct model *m;    // owned when own
    struct backend *be; // owned when own
    bool own;
};

static int one_decode(struct executor *x, const struct forward_batch *b, enum forward_head head,
                      const struct sample_params *sp, struct verr *err) {
    return forward_decode_head(x->fc, b, head, sp, err);
}

static bool one_can_sample(const struct executor *x) {
    return true;
}

static const char *one_describe(const struct executor *x) {
    return NULL;
}

static void one_destroy(struct executor *x) {
    struct one_exec *o = x->impl;
    forward_free(&o->fc);
    if (o->own) {
        model_free(o->m);
        backend_destroy(o->be);
    }
    free(o);
}

static const struct executor_ops one_ops = {
    .decode = one_decode,
    .can_sample = one_can_sample,
    .describe = one_describe,
    .destroy = one_destroy,
};

int forward_executor_create(struct executor **out, struct backend *be, struct model *m,
                            const struct forward_config *cfg, bool own, struct verr *err) {
    *out = NULL;
    struct one_exec *o = calloc(1, sizeof *o);
    int rc =
        o ? forward_init(&o->fc, m, cfg, err) : verr_set(err, VERR_NOMEM, "out of host memory");
    if (rc) {
        free(o);
        if (own) {
            model_free(m);
            backend_destroy(be);
        }
        return rc;
    }
    o->m = m;
    o->be = be;
    o->own = own;
    o->x = (struct executor){.ops = &one_ops, .fc = &o->fc, .m = m, .be = be, .impl = o};
    *out = &o->x;
    return 0;
}
