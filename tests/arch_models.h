// Small qwen3 / gemma3 models for the tests of the architectures' forward
// pass (tests/test_arch_forward.c, tests/gpu/test_forward_cuda_arch.c),
// written by mkmodel (seed 42, the generated 596-token vocabulary), and
// the load check of the loader's refusals (test_model_arch, test_moe).
#ifndef VELA_TESTS_ARCH_MODELS_H
#define VELA_TESTS_ARCH_MODELS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "host/model/arch.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "tools/mkmodel/mkmodel.h"

// 2 layers, 4 heads (2 KV heads) of head_dim, n_embd wide (n_head *
// head_dim != n_embd in the tests), F32 unless type says otherwise. gemma3:
// tied, `window` (0: none) on layer 0 only (pattern 2), the local layers'
// RoPE base base_swa (0: llama.cpp's default, 10000).
static inline void arch_test_config(struct mkmodel_config *c, enum model_arch arch, int n_embd,
                                    int head_dim, enum ggml_type type, int window, float base_swa) {
    mkmodel_config_default(c);
    c->arch = (enum mkmodel_arch)arch;
    c->n_embd = n_embd;
    c->n_layer = 2;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->n_ff = 2 * n_embd;
    c->head_dim = head_dim;
    c->type = type;
    c->n_threads = 2;
    if (arch == MODEL_ARCH_GEMMA3) {
        c->tied = true;
        c->sliding_window = window;
        c->swa_pattern = 2;
        c->rope_freq_base_swa = base_swa;
    }
}

// Writes the model to a fresh temporary file named in path (the caller
// unlinks it).
static inline void arch_test_write(const struct mkmodel_config *c, char path[64]) {
    snprintf(path, 64, "/tmp/vela_test_arch_XXXXXX");
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(c, path, &err), 0, "%s", err.msg);
}

// A model with experts: n_layer blocks of n_embd, 4 heads (2 KV heads),
// feed-forward n_ff (each expert's width too, and the shared expert's),
// n_expert experts of which k are used, matrices of `type`; 2 writer threads.
static inline void arch_test_moe_config(struct mkmodel_config *c, enum model_arch arch, int n_embd,
                                        int n_layer, int n_ff, int n_expert, int k,
                                        enum ggml_type type) {
    mkmodel_config_default(c);
    c->arch = (enum mkmodel_arch)arch;
    c->n_embd = n_embd;
    c->n_layer = n_layer;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->n_ff = n_ff;
    c->n_expert = n_expert;
    c->n_expert_used = k;
    if (arch_get(arch)->moe.ff_exp_key)
        c->n_ff_exp = n_ff;
    c->type = type;
    c->n_threads = 2;
}

// Loads path on a one-thread CPU backend and frees it; returns the status,
// err the message (no model is left behind on a failure).
static inline int arch_test_try_load(const char *path, struct verr *err) {
    struct backend *be;
    struct verr berr = {0};
    cr_assert_eq(backend_cpu_create(&be, 1, &berr), 0, "%s", berr.msg);
    struct model *m = NULL;
    int rc = model_load_file(&m, path, be, err);
    if (rc)
        cr_expect_null(m);
    model_free(m);
    backend_destroy(be);
    return rc;
}

#endif
