// Test helper (header-only): a context (host/split/context.h) over a backend
// and model the test made itself, decodes whose rows all come back the same
// way (logits, argmax or sampled), and llama-cli's context shift through the
// context's sequence operations. Included by tests/test_forward.c and the
// tests/gpu/ forward tests.
#ifndef VELA_TESTS_CONTEXT_HELPERS_H
#define VELA_TESTS_CONTEXT_HELPERS_H

#include <stdint.h>
#include <stdlib.h>

#include "gguf/verr.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"

// A context of cfg (resolved against m, as every context is) over m and its
// backend m->be, a pipeline of one stage that borrows them: context_free
// leaves both to the caller, who frees them after the context.
static inline int test_ctx_wrap(struct context **out, struct model *m,
                                const struct forward_config *cfg, struct verr *err) {
    *out = NULL;
    struct pipeline *p = NULL;
    int rc = pipeline_wrap(&p, m->be, m, false, err);
    return rc ? rc : context_create(out, p, cfg, true, err);
}

// Rows the batch gives: its entries that want logits (NULL flags: the last).
static inline int test_ctx_n_rows(const struct forward_batch *b) {
    if (!b->logits)
        return 1;
    int n = 0;
    for (int t = 0; t < b->n_tok; t++)
        n += b->logits[t] != 0;
    return n;
}

// Decodes b with every row `how` (FORWARD_ROW_LOGITS / _ARGMAX / _SAMPLE;
// sp: the SAMPLE rows' parameters, [rows]); *res as context_decode.
static inline int test_ctx_decode_all(struct context *c, const struct forward_batch *b,
                                      enum forward_row how, const struct sample_params *sp,
                                      struct context_result *res, struct verr *err) {
    const int n = test_ctx_n_rows(b);
    uint8_t *h = malloc(n > 0 ? (size_t)n : 1);
    if (!h)
        return verr_set(err, VERR_NOMEM, "out of host memory");
    for (int r = 0; r < n; r++)
        h[r] = (uint8_t)how;
    const struct context_plan plan = {.batch = *b, .how = h, .sp = sp};
    int rc = context_decode(c, &plan, res, err);
    free(h);
    return rc;
}

// kv_context_shift (llama-cli's context shift) on the context's cache: keeps
// positions [0, n_keep) of seq, removes half of the rest and moves the
// remainder down by that much (*n_discard).
static inline int test_ctx_shift(struct context *c, int seq, int32_t n_keep, int32_t n_past,
                                 int32_t *n_discard, struct verr *err) {
    if (n_keep < 0 || n_keep > n_past)
        return verr_set(err, VERR_RANGE, "context shift: n_keep %d must be in [0, n_past = %d]",
                        n_keep, n_past);
    const int32_t d = (n_past - n_keep) / 2;
    int rc = context_seq_rm(c, seq, n_keep, n_keep + d, err);
    if (!rc)
        rc = context_seq_add(c, seq, n_keep + d, n_past, -d, err);
    if (!rc && n_discard)
        *n_discard = d;
    return rc;
}

#endif
