// The whole forward pass on the CUDA backend against the CPU backend (and the
// float64 reference of tests/tiny_model.h) on tiny llama / qwen2 models:
// the same file is loaded on both backends and the same tokens run through
// both, as one prompt batch (GEMM path, > CUDA_MATVEC_MAX_TOK tokens) and
// token by token (mat-vec path). Skips itself without a CUDA device.
//
// Tolerances, relative to the largest |logit| of the CPU result:
// - F32 weights: 1e-4. Both sides accumulate in float32, in other orders
//   (warp reductions, cuBLAS tiles); ~1e-6 per dot product, through two
//   layers and an f32 or f16 KV cache that both backends round the same way.
// - F16 / BF16 / quantized weights: 2e-2. Batches above CUDA_MATVEC_MAX_TOK
//   round activations to f16 (bf16 for BF16 weights: 8 bits of mantissa,
//   ~4e-3 relative per element) before the GEMM.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/backend.h"
#include "host/forward.h"
#include "host/model.h"
#include "tests/tiny_model.h"

static void run_tokens(struct model *m, int n_batch, enum ggml_type kv, const int32_t *tok, int n,
                       bool argmax, float *out, int32_t *amax) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = n_batch;
    cfg.type_k = cfg.type_v = kv;
    struct forward_ctx fc;
    struct verr err = {0};
    cr_assert_eq(forward_init(&fc, m, &cfg, &err), 0, "%s: %s", m->be->ops->name, err.msg);
    const int V = m->hp.n_vocab;
    int32_t pos[64], seq[64] = {0};
    int8_t want[64];
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        want[t] = 1;
    }
    for (int i = 0; i < n; i += n_batch) {
        int nb = n - i < n_batch ? n - i : n_batch;
        struct forward_batch b = {nb, tok + i, pos + i, seq + i, want + i};
        int rc = argmax ? forward_decode_argmax(&fc, &b, &err) : forward_decode(&fc, &b, &err);
        cr_assert_eq(rc, 0, "%s: %s", m->be->ops->name, err.msg);
        for (int r = 0; r < nb; r++) {
            if (argmax)
                amax[i + r] = forward_argmax(&fc, r);
            else
                memcpy(out + (size_t)(i + r) * V, forward_logits(&fc, r), sizeof(float) * V);
        }
    }
    forward_free(&fc);
}

static void compare_backends(const struct tiny_cfg *cfg, double tol, const char *label) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    char path[128];
    tiny_temp_path(path, sizeof path, "fwdcuda");
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(cfg, path, &w, &err), 0, "%s", err.msg);
    struct backend *cpu, *gpu;
    cr_assert_eq(backend_cpu_create(&cpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    struct model *mc, *mg;
    cr_assert_eq(model_load_file(&mc, path, cpu, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&mg, path, gpu, &err), 0, "%s", err.msg);

    const int n = 20, V = cfg->n_vocab;
    int32_t tok[20];
    for (int t = 0; t < n; t++)
        tok[t] = (t * 11 + 2) % V;
    float *lc = malloc(sizeof(float) * n * V), *lg = malloc(sizeof(float) * n * V);
    int32_t ac[20], ag[20];
    static const int batches[] = {512, 1, 3};
    for (int kv = 0; kv < 2; kv++) {
        enum ggml_type kt = kv ? GGML_TYPE_F16 : GGML_TYPE_F32;
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            run_tokens(mc, batches[bi], kt, tok, n, false, lc, NULL);
            run_tokens(mg, batches[bi], kt, tok, n, false, lg, NULL);
            double scale = 1, worst = 0;
            for (int i = 0; i < n * V; i++) {
                scale = fmax(scale, fabs(lc[i]));
                worst = fmax(worst, fabs((double)lg[i] - lc[i]));
            }
            cr_log_info("%s: %s KV, batch %d: cuda vs cpu worst relative logit error %.3g", label,
                        ggml_type_name(kt), batches[bi], worst / scale);
            cr_expect_lt(worst / scale, tol, "%s: %s KV, batch %d: worst relative error %g", label,
                         ggml_type_name(kt), batches[bi], worst / scale);
        }
        // argmax on the device agrees with the CPU wherever the top two
        // logits are not within the tolerance of each other
        run_tokens(mc, 4, kt, tok, n, true, NULL, ac);
        run_tokens(mg, 4, kt, tok, n, true, NULL, ag);
        run_tokens(mc, 4, kt, tok, n, false, lc, NULL);
        for (int t = 0; t < n; t++) {
            const float *row = lc + (size_t)t * V;
            float gap = INFINITY;
            for (int v = 0; v < V; v++)
                if (v != ac[t])
                    gap = fminf(gap, row[ac[t]] - row[v]);
            if (gap > 1e-3f)
                cr_expect_eq(ag[t], ac[t], "%s: argmax of row %d", label, t);
        }
    }
    free(lc);
    free(lg);
    model_free(mc);
    model_free(mg);
    backend_destroy(cpu);
    backend_destroy(gpu);
    tiny_weights_free(&w);
    unlink(path);
}

Test(forward_cuda, llama_gqa_f32) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    compare_backends(&c, 1e-4, "llama f32");
}

Test(forward_cuda, qwen2_bias_partial_rot) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.n_rot = 8;
    compare_backends(&c, 1e-4, "qwen2 n_rot 8");
}

Test(forward_cuda, yarn_rope_freqs) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.scaling_type = "yarn";
    c.scaling_factor = 4;
    c.orig_ctx = 8;
    c.rope_freqs = true;
    compare_backends(&c, 1e-4, "llama yarn");
}

Test(forward_cuda, weight_types) {
    static const enum ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                           GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                           GGML_TYPE_Q5_1};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_default(&c, "llama");
        c.wtype = types[i];
        compare_backends(&c, 2e-2, ggml_type_name(types[i]));
    }
}

Test(forward_cuda, k_quants) {
    static const enum ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_default(&c, "qwen2");
        c.n_embd = 256;
        c.n_ff = 256;
        c.head_dim = 64;
        c.n_rot = 64;
        c.n_head_kv = 1;
        c.n_layer = 1;
        c.wtype = types[i];
        compare_backends(&c, 2e-2, ggml_type_name(types[i]));
    }
}
