// Test helper (header-only, included by test_pipeline.c and
// gpu/test_pipeline_cuda.c): a model with its forward context (struct run),
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
#include "host/split/pipeline.h"
#include "host/split/split.h"
#include "kv/kv.h"
#include "kv/selfextend.h"
#include "tools/args.h"

struct run {
    struct executor *x;     // one backend or the pipeline (host/split/split.h)
    struct model *m;        // x's front model
    struct forward_ctx *fc; // x's front context: the cache the KV operations go to
};

// Loads the model file at path as `a` says (split_open: one backend, or a
// stage per device) and a forward context for 8 outputs and 4 sequences. On
// an error nothing stays loaded and *r is zero.
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
    rc = split_open(&r->x, &lc, &fcfg, f, NULL, NULL, err);
    if (!rc) {
        r->m = (struct model *)r->x->m;
        r->fc = r->x->fc;
    }
    gguf_close(f);
    return rc;
}

static inline void close_run(struct run *r) {
    executor_destroy(r->x);
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
        cr_assert_eq(executor_decode(r->x, &b, FORWARD_HEAD_LOGITS, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(r->fc->n_out, k);
        memcpy(out + (size_t)i * V, r->fc->h_logits, sizeof(float) * (size_t)k * V);
    }
    return out;
}

// The same KV operations on the front's cache of a split model and on a
// single model: every stage's cache must follow. *out1: the logits [10][V] of
// seqs 0 and 1 after seq cp / rm / add / div; *out2: [27][V], after a context
// shift of seq 0 (3 rows), then self-extend on seq 2 (24 rows).
static inline void kv_script(struct run *r, float **out1, float **out2) {
    struct verr err = {0};
    const int V = r->m->hp.n_vocab;
    free(decode_seq(r, 0, 0, 12, 8, 0));
    struct kv_cache *kv = &r->fc->kv;
    cr_assert_eq(kv_seq_cp(kv, 0, 1, -1, -1, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_seq_rm(kv, 0, 4, 8, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_seq_add(kv, 0, 8, -1, -4, &err), 0, "%s", err.msg); // a shift: K rotates
    cr_assert_eq(kv_seq_div(kv, 1, 0, 12, 2, &err), 0, "%s", err.msg);
    *out1 = malloc(sizeof(float) * 2 * 5 * V);
    float *s0 = decode_seq(r, 0, 8, 5, 8, 1);
    float *s1 = decode_seq(r, 1, 6, 5, 8, 2);
    memcpy(*out1, s0, sizeof(float) * 5 * V);
    memcpy(*out1 + 5 * V, s1, sizeof(float) * 5 * V);
    free(s0);
    free(s1);

    // Context shift (llama-cli's --keep) on seq 0, then self-extend on seq 2.
    int32_t n_discard = 0;
    cr_assert_eq(kv_seq_keep(kv, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(kv_context_shift(kv, 0, 2, 13, &n_discard, &err), 0, "%s", err.msg);
    cr_assert_gt(n_discard, 0);
    float *c = decode_seq(r, 0, 13 - n_discard, 3, 8, 3);
    cr_assert_eq(kv_clear(kv, &err), 0, "%s", err.msg);
    struct kv_selfextend se;
    cr_assert_eq(kv_selfextend_init(&se, kv, 2, 8, 2, &err), 0, "%s", err.msg);
    int32_t n_past = 0;
    *out2 = malloc(sizeof(float) * (3 + 24) * V);
    memcpy(*out2, c, sizeof(float) * 3 * V);
    free(c);
    for (int i = 0; i < 24; i += 4) {
        cr_assert_eq(kv_selfextend_apply(&se, kv, &n_past, &err), 0, "%s", err.msg);
        float *g = decode_seq(r, 2, n_past, 4, 4, 10 + i);
        memcpy(*out2 + (size_t)(3 + i) * V, g, sizeof(float) * 4 * V);
        free(g);
        n_past += 4;
    }
}

#endif
