// qwen3, gemma3 (host/model/arch_qwen3.c, arch_gemma3.c) and the MoE architectures
// through the whole forward pass on the CUDA backend against the CPU backend: per-head Q/K
// norms, a head dimension other than n_embd / n_head, gemma3's embedding
// scale, sandwich norms, GeGLU, and sliding-window layers (window 5 over 20
// tokens, every other layer local, the local layers with their own RoPE
// base). Models come from mkmodel (seed 42); the 20 tokens run as one batch
// (GEMM path) and one token at a time (mat-vec path, CUDA graphs, which
// every one-token step must replay). The mixture-of-experts architectures
// (qwen3moe, qwen2moe with its gated shared expert, Mixtral, gpt-oss) run the same
// way with F32 and Q4_0 stacks (the 20-token Q4_0 batch takes the grouped
// tensor-core GEMM). Skips itself without a CUDA device.
//
// Tolerances, relative to the largest |logit| of the CPU result, as in
// tests/gpu/test_forward_cuda.c:
// - F32 weights, and quantized weights in decode batches (mat-vec, f32
//   activations): 1e-4. Float summation orders; GeGLU's f16 rounding of
//   gelu(gate) flips one f16 step (2^-11) for the few gates within float
//   noise of a rounding boundary, each moving one of n_ff terms of the down
//   projection (observed: 1.7e-5 for gemma3).
// - The 20-token batch with quantized weights (GEMM, activations rounded to
//   f16), or with an F16 KV cache (tensor-core attention, f16 q and softmax
//   weights): 2e-2 and 1e-3.
// - act_q8 decode: 2e-2. Both sides round activations to q8_1 alike, but an
//   activation within float noise of a rounding boundary moves by a whole
//   step (1/127 of its block's max), and these models are narrow (128 wide,
//   Q/K normed per head), so one flip shows: observed up to 8.6e-3 (qwen3,
//   F16 KV). A semantic slip (a window, a norm, a RoPE base) moves logits by
//   O(0.1) and fails every tolerance here.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "tests/arch_models.h"
#include "tests/context_helpers.h"
#include "tools/mkmodel/mkmodel.h"

#define ARCH_N_TOK 20

// Logits of every one of the ARCH_N_TOK tokens, fed n_batch at a time.
static void arch_logits(struct model *m, int n_batch, enum ggml_type kv, float *out) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = n_batch;
    cfg.type_k = cfg.type_v = kv;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, m, &cfg, &err), 0, "%s: %s", m->be->ops->name, err.msg);
    int32_t tok[ARCH_N_TOK], pos[ARCH_N_TOK], seq[ARCH_N_TOK] = {0};
    int8_t want[ARCH_N_TOK];
    for (int t = 0; t < ARCH_N_TOK; t++) {
        tok[t] = (t * 37 + 5) % m->hp.n_vocab;
        pos[t] = t;
        want[t] = 1;
    }
    const size_t V = (size_t)m->hp.n_vocab;
    for (int i = 0; i < ARCH_N_TOK; i += n_batch) {
        const int nb = ARCH_N_TOK - i < n_batch ? ARCH_N_TOK - i : n_batch;
        const struct forward_batch b = {nb, tok + i, pos + i, seq + i, want + i, NULL};
        struct context_result res;
        cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "%s: %s", m->be->ops->name,
                     err.msg);
        cr_assert_eq(res.n_rows, nb);
        for (int r = 0; r < nb; r++)
            memcpy(out + (size_t)(i + r) * V, context_row_logits(&res, r), V * sizeof(float));
    }
    // One-token steps on a backend with graphs replay them: no op of the
    // forward pass (the qwen2moe shared expert's gate included) leaves the
    // device or fails to record. One step may run eagerly: the first act_q8
    // step allocates the backend's q8_1 copy of the activations, which a
    // recording refuses.
    if (n_batch == 1 && m->be->ops->graph_begin) {
        const struct forward_graph_stats st = context_graph_stats(c);
        cr_expect(st.replays >= ARCH_N_TOK - 1,
                  "%s %s: %d steps, graphs recorded %lld, replayed %lld, eager %lld",
                  m->be->ops->name, model_arch_name(m->hp.arch), ARCH_N_TOK, (long long)st.recorded,
                  (long long)st.replays, (long long)st.eager);
    }
    context_free(c);
}

// tol: decode batches (1 token); tol_batch: the 20-token batch (skipped
// when tol_batch is 0).
static void arch_compare(const struct mkmodel_config *mc, bool act_q8, double tol, double tol_batch,
                         const char *label) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    char path[64];
    arch_test_write(mc, path);
    struct verr err = {0};
    struct backend *cpu, *gpu;
    cr_assert_eq(backend_cpu_create(&cpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    cpu->act_q8 = gpu->act_q8 = act_q8;
    struct model *m_cpu, *m_gpu;
    cr_assert_eq(model_load_file(&m_cpu, path, cpu, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&m_gpu, path, gpu, &err), 0, "%s", err.msg);
    const size_t n = (size_t)ARCH_N_TOK * m_cpu->hp.n_vocab;
    float *lc = malloc(n * sizeof *lc), *lg = malloc(n * sizeof *lg);
    static const int batches[] = {ARCH_N_TOK, 1};
    for (int kv = 0; kv < 2; kv++) {
        const enum ggml_type kt = kv ? GGML_TYPE_F16 : GGML_TYPE_F32;
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            if (batches[bi] > 1 && tol_batch == 0)
                continue;
            arch_logits(m_cpu, batches[bi], kt, lc);
            arch_logits(m_gpu, batches[bi], kt, lg);
            double scale = 1, worst = 0;
            for (size_t i = 0; i < n; i++) {
                scale = fmax(scale, fabs(lc[i]));
                worst = fmax(worst, fabs((double)lg[i] - lc[i]));
            }
            const double t = batches[bi] == 1      ? tol
                             : kt == GGML_TYPE_F16 ? fmax(tol_batch, 1e-3)
                                                   : tol_batch;
            cr_log_info("%s: %s KV, batch %d: cuda vs cpu worst relative logit error %.3g", label,
                        ggml_type_name(kt), batches[bi], worst / scale);
            cr_expect_lt(worst / scale, t, "%s: %s KV, batch %d: worst relative error %g", label,
                         ggml_type_name(kt), batches[bi], worst / scale);
        }
    }
    free(lc);
    free(lg);
    model_free(m_cpu);
    model_free(m_gpu);
    backend_destroy(cpu);
    backend_destroy(gpu);
    unlink(path);
}

// Both architectures with weights of type t: qwen3, and gemma3 with a window
// of 5 over 20 tokens on layer 0 and a local RoPE base of its own.
static void arch_compare_both(enum ggml_type t, bool act_q8, double tol, double tol_batch,
                              const char *label) {
    for (int a = 0; a < 2; a++) {
        const enum model_arch arch = a ? MODEL_ARCH_GEMMA3 : MODEL_ARCH_QWEN3;
        struct mkmodel_config c;
        arch_test_config(&c, arch, 128, 64, t, 5, 20000.0f);
        char what[64];
        snprintf(what, sizeof what, "%s %s", model_arch_name(arch), label);
        arch_compare(&c, act_q8, tol, tol_batch, what);
    }
}

Test(forward_cuda_arch, f32) {
    arch_compare_both(GGML_TYPE_F32, false, 1e-4, 1e-4, "f32");
}

Test(forward_cuda_arch, q4_0) {
    arch_compare_both(GGML_TYPE_Q4_0, false, 1e-4, 2e-2, "q4_0");
}

Test(forward_cuda_arch, q4_0_act_q8) {
    arch_compare_both(GGML_TYPE_Q4_0, true, 2e-2, 0, "q4_0 act_q8");
}

// The mixture-of-experts architectures (host/model/arch_qwen3moe.c,
// arch_qwen2moe.c, Mixtral in arch_llama.c, gpt-oss): 2 layers of 128, 8
// experts of 64, k = 2 (qwen3moe: k = 8 = n_expert, every expert), weights
// of type t; gpt-oss with heads of 64, its sinks and biases and a window of
// 5 over the 20 tokens on layer 0.
// Decode batches run the router, the expert mat-vecs and the qwen2moe
// shared expert's gate inside CUDA graphs; the 20-token batch with
// quantized stacks runs the grouped tensor-core GEMM (F32 stacks: the
// expert mat-vecs over every pair).
static void gptoss_shape(struct mkmodel_config *c) {
    c->head_dim = 64;
    c->sliding_window = 5;
}

static void arch_compare_moe(enum ggml_type t, bool act_q8, double tol, double tol_batch,
                             const char *label) {
    static const enum model_arch archs[] = {MODEL_ARCH_QWEN3MOE, MODEL_ARCH_QWEN2MOE,
                                            MODEL_ARCH_LLAMA, MODEL_ARCH_GPTOSS};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        struct mkmodel_config c;
        const int k = archs[a] == MODEL_ARCH_QWEN3MOE ? 8 : 2;
        arch_test_moe_config(&c, archs[a], 128, 2, 64, 8, k, t);
        if (archs[a] == MODEL_ARCH_GPTOSS)
            gptoss_shape(&c);
        char what[64];
        snprintf(what, sizeof what, "%s %s",
                 archs[a] == MODEL_ARCH_LLAMA ? "mixtral" : model_arch_name(archs[a]), label);
        arch_compare(&c, act_q8, tol, tol_batch, what);
    }
}

Test(forward_cuda_arch, moe_f32) {
    arch_compare_moe(GGML_TYPE_F32, false, 1e-4, 1e-4, "f32");
}

Test(forward_cuda_arch, moe_q4_0) {
    arch_compare_moe(GGML_TYPE_Q4_0, false, 1e-4, 2e-2, "q4_0");
}

// gpt-oss as its files come (llama.cpp's MXFP4_MOE: MXFP4 expert stacks,
// Q8_0 elsewhere): the expert mat-vecs in MXFP4 with q8_1 activations for
// decode, and for the 20-token batch the experts' mat-vecs over every pair;
// the tolerances of the Q4_0 act_q8 cases.
Test(forward_cuda_arch, gptoss_mxfp4) {
    struct mkmodel_config c;
    arch_test_moe_config(&c, MODEL_ARCH_GPTOSS, 128, 2, 64, 8, 2, GGML_TYPE_Q8_0);
    c.type_ffn = GGML_TYPE_MXFP4;
    gptoss_shape(&c);
    arch_compare(&c, true, 2e-2, 2e-2, "gpt-oss mxfp4 act_q8");
}
