// Test helper (header-only, included by test_pipeline.c and
// gpu/test_pipeline_cuda.c): a model with its context (struct run),
// loaded whole or split into pipeline stages as the test's args_model says
// (each test fills those for its own backend), and what both tests do with
// one: decode a fixed token pattern, and run the KV script (sequence ops, a K
// shift, context shift, self-extend) whose logits a split model must
// reproduce bit for bit.
#ifndef VELA_TESTS_PIPELINE_HELPERS_H
#define VELA_TESTS_PIPELINE_HELPERS_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "kv/kv.h"
#include "kv/policy.h"
#include "tools/args.h"

struct run {
    struct context *c;     // one stage or several (host/split/context.h)
    const struct model *m; // c's front model
    struct pipeline *p;    // c's stages
};

// Loads the model file at path as `a` says (context_open: one backend, or a
// stage per device) and a context for 8 outputs and 4 sequences. On an
// error nothing stays loaded and *r is zero.
static inline int run_load(struct run *r, const struct args_model *a, const char *path,
                           struct verr *err) {
    memset(r, 0, sizeof *r);
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err);
    if (rc)
        return rc;
    struct load_config lc;
    struct forward_config fcfg;
    args_load_config(a, &lc);
    args_ctx_config(a, &fcfg);
    fcfg.n_outputs_max = 8;
    fcfg.n_seq_max = 4;
    rc = context_open(&r->c, &lc, &fcfg, f, NULL, NULL, err);
    if (!rc) {
        r->m = context_model(r->c);
        r->p = context_pipeline(r->c);
    }
    gguf_close(f);
    return rc;
}

static inline void close_run(struct run *r) {
    context_free(r->c);
    memset(r, 0, sizeof *r);
}

// Decodes tokens [0, n) of seq at positions p0.. in batches of nb (at most
// 8), every row wanting logits; returns the logits [n][n_vocab] (malloc'd).
static inline float *decode_seq(struct run *r, int seq, int p0, int n, int nb, int salt) {
    const int V = r->m->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n; i += nb) {
        int k = n - i < nb ? n - i : nb;
        int32_t tok[8], pos[8], sq[8];
        int8_t want[8];
        for (int t = 0; t < k; t++) {
            tok[t] = ((i + t) * 37 + 5 + salt) % V;
            pos[t] = p0 + i + t;
            sq[t] = seq;
            want[t] = 1;
        }
        struct forward_batch b = {k, tok, pos, sq, want, NULL};
        struct verr err = {0};
        struct context_result res;
        cr_assert_eq(context_decode_logits(r->c, &b, &res, &err), 0, "%s", err.msg);
        cr_assert_eq(res.n_rows, k);
        memcpy(out + (size_t)i * V, res.logits, sizeof(float) * (size_t)k * V);
    }
    return out;
}

// The same KV operations on a split model's context and on a single model's:
// every stage's cache must follow. *out1: the logits [10][V] of
// seqs 0 and 1 after seq cp / rm / add / div; *out2: [27][V], after a context
// shift of seq 0 (3 rows), then self-extend on seq 2 (24 rows).
static inline void kv_script(struct run *r, float **out1, float **out2) {
    struct verr err = {0};
    const int V = r->m->hp.n_vocab;
    free(decode_seq(r, 0, 0, 12, 8, 0));
    struct context *c = r->c;
    cr_assert_eq(context_seq_cp(c, 0, 1, -1, -1, &err), 0, "%s", err.msg);
    cr_assert_eq(context_seq_rm(c, 0, 4, 8, &err), 0, "%s", err.msg);
    cr_assert_eq(context_seq_add(c, 0, 8, -1, -4, &err), 0, "%s", err.msg); // a shift: K rotates
    cr_assert_eq(context_seq_div(c, 1, 0, 12, 2, &err), 0, "%s", err.msg);
    *out1 = malloc(sizeof(float) * 2 * 5 * V);
    float *s0 = decode_seq(r, 0, 8, 5, 8, 1);
    float *s1 = decode_seq(r, 1, 6, 5, 8, 2);
    memcpy(*out1, s0, sizeof(float) * 5 * V);
    memcpy(*out1 + 5 * V, s1, sizeof(float) * 5 * V);
    free(s0);
    free(s1);

    // Context shift (llama-cli's --keep) on seq 0 with 14 cells, then
    // self-extend on seq 2: the engine's KV policies (kv/policy.h).
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.n_keep = 2;
    struct kv_policy pol;
    int32_t n_past = 13, n_discard = 0;
    int n_cells = 13;
    cr_assert_eq(context_seq_keep(c, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(context_policy_init(c, &pol, &pp, 0, 14, &err), 0, "%s", err.msg);
    cr_assert_eq(context_policy_make_room(c, &pol, &n_past, &n_cells, &n_discard, &err), 0, "%s",
                 err.msg);
    cr_assert_gt(n_discard, 0);
    float *cs = decode_seq(r, 0, 13 - n_discard, 3, 8, 3);
    cr_assert_eq(context_clear(c, &err), 0, "%s", err.msg);
    kv_policy_params_default(&pp);
    pp.ga_n = 2;
    pp.ga_w = 8;
    cr_assert_eq(context_policy_init(c, &pol, &pp, 2, context_config(c)->n_ctx, &err), 0, "%s",
                 err.msg);
    n_past = 0;
    *out2 = malloc(sizeof(float) * (3 + 24) * V);
    memcpy(*out2, cs, sizeof(float) * 3 * V);
    free(cs);
    for (int i = 0; i < 24; i += 4) {
        cr_assert_eq(context_policy_before_batch(c, &pol, &n_past, &err), 0, "%s", err.msg);
        float *g = decode_seq(r, 2, n_past, 4, 4, 10 + i);
        memcpy(*out2 + (size_t)(3 + i) * V, g, sizeof(float) * 4 * V);
        free(g);
        n_past += 4;
    }
}

#endif
