// Engine tests' common scaffolding: a tiny model written to a temp file, and
// an engine opened on it the way vela's commands open one (tools/args.h).
#ifndef VELA_TESTS_ENGINE_HELPERS_H
#define VELA_TESTS_ENGINE_HELPERS_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>

#include "host/engine/engine.h"
#include "host/engine/step.h"
#include "tests/tiny_model.h"
#include "tools/args.h"

// Writes the tiny model `cfg` to a temp file named after tag; returns its
// path (malloc'd; the caller unlinks and frees it).
static inline char *engine_test_model(const struct tiny_cfg *cfg, const char *tag) {
    struct tiny_weights w;
    char *path = malloc(128);
    cr_assert(path);
    tiny_temp_path(path, 128, tag);
    struct verr err = {0};
    cr_assert_eq(tiny_write(cfg, path, &w, &err), 0, "tiny_write: %s", err.msg);
    tiny_weights_free(&w);
    return path;
}

struct engine_test_cfg {
    int n_ctx;           // cells in all
    int n_batch;         // tokens per forward pass
    int n_seq;           // sequences, each with a logits row per decode
    int n_outputs;       // logits rows per decode (0: n_seq)
    const char *devices; // NULL: one CPU backend; "cpu,cpu": two stages
    bool f32_cache;      // F32 K/V (default F16)
    int type_k, type_v;  // K / V cache types when > 0 (GGML_TYPE_*: F16, BF16, Q8_0, ...)
    bool k_unrotated;    // --kv-unrotated
    int n_threads;       // CPU threads (0: 2)
    int act;             // --matvec-act: BACKEND_ACT_* (0: the backend's default)
};

// An engine on the model at path: CPU backend, as c says.
static inline struct engine *engine_test_open(const char *path, const struct engine_test_cfg *c) {
    struct args_model am;
    args_model_default(&am);
    am.model_path = path;
    am.backend = LOAD_BACKEND_CPU;
    am.n_threads = c->n_threads > 0 ? c->n_threads : 2;
    am.matvec_act = c->act;
    am.n_ctx = c->n_ctx;
    am.n_batch = c->n_batch;
    am.devices = c->devices;
    if (c->f32_cache)
        am.type_k = am.type_v = GGML_TYPE_F32;
    if (c->type_k > 0)
        am.type_k = (enum ggml_type)c->type_k;
    if (c->type_v > 0)
        am.type_v = (enum ggml_type)c->type_v;
    am.k_unrotated = c->k_unrotated;
    struct engine_config op;
    args_engine_config(&am, &op);
    op.ctx.n_seq_max = c->n_seq;
    op.ctx.n_outputs_max = c->n_outputs > 0 ? c->n_outputs : c->n_seq;
    struct engine *e = NULL;
    struct verr err = {0};
    cr_assert_eq(engine_open(&e, &op, &err), 0, "engine_open: %s", err.msg);
    return e;
}

// Steps e until it has nothing left to do (every request ended).
static inline void engine_test_run_to_end(struct engine *e) {
    struct verr err = {0};
    int rc, n = 0;
    while ((rc = engine_step(e, &err)) == 1)
        cr_assert_lt(++n, 100000, "the engine never goes idle");
    cr_assert_eq(rc, 0, "engine_step: %s", err.msg);
    cr_assert_eq(engine_n_active(e), 0);
    cr_assert_eq(engine_n_queued(e), 0);
}

#endif
