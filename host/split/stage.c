// The in-process transport and device memory queries (see stage.h).
#include "host/split/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct inproc {
    void *staging; // host memory, grown to the largest transfer
    size_t cap;
};

static int inproc_xfer(struct transport *t, int from, const void *src, int to, void *dst,
                       size_t bytes, struct verr *err) {
    if (from < 0 || to < 0 || from >= t->n_stages || to >= t->n_stages)
        return verr_set(err, VERR_RANGE, "transport: stages %d -> %d outside [0, %d)", from, to,
                        t->n_stages);
    if (bytes == 0)
        return 0;
    struct inproc *ip = t->impl;
    struct backend *a = t->be[from], *b = t->be[to];
    if (ip->cap < bytes) {
        void *p = realloc(ip->staging, bytes);
        if (!p)
            return verr_set(err, VERR_NOMEM, "transport: no host memory for %zu bytes", bytes);
        ip->staging = p;
        ip->cap = bytes;
    }
    // The download is ordered after the sender's enqueued work; waiting for
    // it makes the staging buffer complete before the receiver reads it.
    if (a->ops->download(a, ip->staging, src, bytes) || a->ops->sync(a))
        return verr_set(err, a->err.code ? a->err.code : VERR_BACKEND,
                        "transport: stage %d (%s): reading %zu bytes: %s", from, a->ops->name,
                        bytes, a->err.msg);
    if (b->ops->upload(b, dst, ip->staging, bytes))
        return verr_set(err, b->err.code ? b->err.code : VERR_BACKEND,
                        "transport: stage %d (%s): writing %zu bytes: %s", to, b->ops->name, bytes,
                        b->err.msg);
    return 0;
}

static void inproc_destroy(struct transport *t) {
    struct inproc *ip = t->impl;
    if (ip)
        free(ip->staging);
    free(ip);
    free(t);
}

static const struct transport_ops inproc_ops = {
    .name = "in-process",
    .xfer = inproc_xfer,
    .destroy = inproc_destroy,
};

int transport_inproc_create(struct transport **out, struct backend *const *be, int n,
                            struct verr *err) {
    *out = NULL;
    if (n < 1 || n > PLAN_MAX_DEVICES)
        return verr_set(err, VERR_RANGE, "transport: %d stages", n);
    struct transport *t = calloc(1, sizeof *t);
    struct inproc *ip = calloc(1, sizeof *ip);
    if (!t || !ip) {
        free(t);
        free(ip);
        return verr_set(err, VERR_NOMEM, "out of host memory");
    }
    for (int s = 0; s < n; s++) {
        if (!be[s]) {
            free(t);
            free(ip);
            return verr_set(err, VERR_RANGE, "transport: in-process needs every stage local");
        }
        t->be[s] = be[s];
    }
    t->ops = &inproc_ops;
    t->n_stages = n;
    t->impl = ip;
    *out = t;
    return 0;
}

void transport_destroy(struct transport *t) {
    if (t && t->ops && t->ops->destroy)
        t->ops->destroy(t);
}
