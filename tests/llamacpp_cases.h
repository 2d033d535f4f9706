// The models, tokens and KV cache types of tests/test_llamacpp_agree.c,
// shared with whatever regenerates tests/data/llamacpp/ (see the README
// there). Each case is a `vela mkmodel` config given twice: as the flags of
// the command line (`flags`, for people and for the README) and as overrides
// of mkmodel_config_default (`lc_case_config`, for the test); the two write
// byte-identical files.
#ifndef VELA_TESTS_LLAMACPP_CASES_H
#define VELA_TESTS_LLAMACPP_CASES_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/types.h"
#include "tools/mkmodel/mkmodel.h"

// Tokens evaluated as one sequence from position 0 (ids < 596, the size of
// the generated vocabulary): tok[i] = (7919 * i + 13) % 596.
#define LC_N_TOKENS 32
// Positions whose logits are stored (every 8th, ending with the last).
#define LC_N_ROWS 4
static const int lc_rows[LC_N_ROWS] = {7, 15, 23, 31};

static inline void lc_tokens(int32_t tok[LC_N_TOKENS]) {
    for (int i = 0; i < LC_N_TOKENS; i++)
        tok[i] = (int32_t)((7919 * i + 13) % 596);
}

// How llama.cpp computes the matrix products of a case's weights on the CPU,
// which sets the tolerance class (see the test).
enum lc_kind {
    LC_EXACT_F32, // F32 weights and KV cache: float rounding only
    LC_KV_F16,    // F16 KV cache: llama.cpp also rounds Q and the attention weights to F16
    LC_W_F16,     // F16 weights: activations rounded to F16 before each product
    LC_W_BF16,    // BF16 weights: activations rounded to BF16
    LC_W_Q8,      // Q8_0/Q4_x/Q5_x weights: activations quantized to Q8_0/Q8_1
    LC_W_QK,      // K-quant weights: activations quantized to Q8_K
};

struct lc_case {
    const char *name;  // also the file name of the reference: <name>.bin
    const char *flags; // the equivalent `vela mkmodel` flags (besides -o and -q)
    enum lc_kind kind;
    enum ggml_type kv;         // KV cache type of both engines
    bool partial_rot_emulated; // llama.cpp refuses llama files with n_rot < head_dim, so it
                               // was given a derived file (see the README)
    // overrides of mkmodel_config_default (0: keep the default)
    enum mkmodel_arch arch;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, n_rot, n_ctx;
    enum ggml_type type;     // every matrix; omitted: 0, GGML_TYPE_F32
    enum ggml_type type_ffn; // the feed-forward's matrices where not 0 (F32): --type-ffn
    enum mkmodel_mix mix;
    bool tied;
    enum mkmodel_rope_scaling scaling;
    float scale;
    int yarn_orig_ctx;
    bool rope_freqs;
    int sliding_window, swa_pattern;       // gemma3's local layers
    int n_expert, n_expert_used, n_ff_exp; // experts (qwen3moe, qwen2moe, llama = Mixtral)
};

// Small shapes: 2 layers; 128 wide for the F32 semantics cases, 256 wide
// (and ff 512) for the weight-type cases so that every K-quant block fits.
#define LC_SMALL(h, hkv) .n_embd = 128, .n_layer = 2, .n_head = h, .n_head_kv = hkv, .n_ff = 256
#define LC_WIDE .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512
#define LC_SMALL_FLAGS(h, hkv)                                                                     \
    "--n-embd 128 --n-layer 2 --n-head " #h " --n-head-kv " #hkv " --n-ff 256"
#define LC_WIDE_FLAGS "--n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 512"
#define LC_YARN_FLAGS "--ctx 8192 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 2048"
#define LC_YARN                                                                                    \
    .n_ctx = 8192, .scaling = MKMODEL_ROPE_SCALING_YARN, .scale = 4, .yarn_orig_ctx = 2048

#define LC_ARCH(name) ((enum mkmodel_arch)MODEL_ARCH_##name)

static const struct lc_case lc_cases[] = {
    // semantics, everything F32
    {"llama_mha_f32", LC_SMALL_FLAGS(4, 4), LC_EXACT_F32, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_SMALL(4, 4)},
    {"llama_gqa_f32", LC_SMALL_FLAGS(8, 2), LC_EXACT_F32, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_SMALL(8, 2)},
    {"llama_gqa_f32_kvf16", LC_SMALL_FLAGS(8, 2), LC_KV_F16, GGML_TYPE_F16, false,
     MKMODEL_ARCH_LLAMA, LC_SMALL(8, 2)},
    {"llama_headdim64_f32", LC_SMALL_FLAGS(4, 2) " --head-dim 64", LC_EXACT_F32, GGML_TYPE_F32,
     false, MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), .head_dim = 64},
    {"llama_partial_rot_f32", LC_SMALL_FLAGS(4, 2) " --n-rot 16", LC_EXACT_F32, GGML_TYPE_F32, true,
     MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), .n_rot = 16},
    {"llama_linear_f32", LC_SMALL_FLAGS(4, 2) " --rope-scaling linear --rope-scale 2", LC_EXACT_F32,
     GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2),
     .scaling = MKMODEL_ROPE_SCALING_LINEAR, .scale = 2},
    {"llama_yarn_f32", LC_SMALL_FLAGS(4, 2) " " LC_YARN_FLAGS, LC_EXACT_F32, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), LC_YARN},
    {"llama_rope_freqs_f32", LC_SMALL_FLAGS(4, 2) " --rope-freqs", LC_EXACT_F32, GGML_TYPE_F32,
     false, MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), .rope_freqs = true},
    {"llama_tied_f32", LC_SMALL_FLAGS(4, 2) " --tied", LC_EXACT_F32, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), .tied = true},
    {"qwen2_f32", "--arch qwen2 " LC_SMALL_FLAGS(4, 2), LC_EXACT_F32, GGML_TYPE_F32, false,
     MKMODEL_ARCH_QWEN2, LC_SMALL(4, 2)},
    {"qwen2_yarn_f32", "--arch qwen2 " LC_SMALL_FLAGS(4, 2) " " LC_YARN_FLAGS, LC_EXACT_F32,
     GGML_TYPE_F32, false, MKMODEL_ARCH_QWEN2, LC_SMALL(4, 2), LC_YARN},
    {"qwen2_tied_f32_kvf16", "--arch qwen2 " LC_SMALL_FLAGS(4, 2) " --tied", LC_KV_F16,
     GGML_TYPE_F16, false, MKMODEL_ARCH_QWEN2, LC_SMALL(4, 2), .tied = true},
    // weight types (F32 KV cache)
    {"llama_f16", LC_WIDE_FLAGS " --type f16", LC_W_F16, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_F16},
    {"llama_bf16", LC_WIDE_FLAGS " --type bf16", LC_W_BF16, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_WIDE, .type = GGML_TYPE_BF16},
    {"llama_q8_0", LC_WIDE_FLAGS " --type q8_0", LC_W_Q8, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q8_0},
    {"llama_q4_0", LC_WIDE_FLAGS " --type q4_0", LC_W_Q8, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q4_0},
    {"llama_q4_1", LC_WIDE_FLAGS " --type q4_1", LC_W_Q8, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q4_1},
    {"llama_q5_0", LC_WIDE_FLAGS " --type q5_0", LC_W_Q8, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q5_0},
    {"llama_q5_1", LC_WIDE_FLAGS " --type q5_1", LC_W_Q8, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q5_1},
    {"llama_q2_k", LC_WIDE_FLAGS " --type q2_k", LC_W_QK, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q2_K},
    {"llama_q3_k", LC_WIDE_FLAGS " --type q3_k", LC_W_QK, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q3_K},
    {"llama_q4_k", LC_WIDE_FLAGS " --type q4_k", LC_W_QK, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q4_K},
    {"llama_q5_k", LC_WIDE_FLAGS " --type q5_k", LC_W_QK, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q5_K},
    {"llama_q6_k", LC_WIDE_FLAGS " --type q6_k", LC_W_QK, GGML_TYPE_F32, false, MKMODEL_ARCH_LLAMA,
     LC_WIDE, .type = GGML_TYPE_Q6_K},
    {"llama_iq4_nl", LC_WIDE_FLAGS " --type iq4_nl", LC_W_Q8, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_WIDE, .type = GGML_TYPE_IQ4_NL},
    {"llama_iq4_xs", LC_WIDE_FLAGS " --type iq4_xs", LC_W_QK, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_WIDE, .type = GGML_TYPE_IQ4_XS},
    {"llama_q4_k_m", LC_WIDE_FLAGS " --mix q4_k_m", LC_W_QK, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_WIDE, .mix = MKMODEL_MIX_Q4_K_M},
    {"qwen2_q4_0", "--arch qwen2 " LC_WIDE_FLAGS " --type q4_0", LC_W_Q8, GGML_TYPE_F32, false,
     MKMODEL_ARCH_QWEN2, LC_WIDE, .type = GGML_TYPE_Q4_0},
    {"qwen2_tied_q8_0", "--arch qwen2 " LC_WIDE_FLAGS " --tied --type q8_0", LC_W_Q8, GGML_TYPE_F32,
     false, MKMODEL_ARCH_QWEN2, LC_WIDE, .type = GGML_TYPE_Q8_0, .tied = true},
    // qwen3: per-head Q/K norms, 4 heads x 64 = 256 != n_embd 128
    {"qwen3_f32", "--arch qwen3 " LC_SMALL_FLAGS(4, 2) " --head-dim 64", LC_EXACT_F32,
     GGML_TYPE_F32, false, (enum mkmodel_arch)MODEL_ARCH_QWEN3, LC_SMALL(4, 2), .head_dim = 64},
    {"qwen3_tied_f32_kvf16", "--arch qwen3 " LC_SMALL_FLAGS(4, 2) " --head-dim 64 --tied",
     LC_KV_F16, GGML_TYPE_F16, false, (enum mkmodel_arch)MODEL_ARCH_QWEN3, LC_SMALL(4, 2),
     .head_dim = 64, .tied = true},
    // gemma3: layer 0 local (window 8 < 32 tokens, RoPE base 10000), layer 1
    // global (base 1e6); embedding scale, sandwich norms, Q/K norms, GeGLU
    {"gemma3_swa_f32",
     "--arch gemma3 " LC_SMALL_FLAGS(4, 2) " --head-dim 64 --tied --sliding-window 8 "
                                           "--swa-pattern 2",
     LC_EXACT_F32, GGML_TYPE_F32, false, (enum mkmodel_arch)MODEL_ARCH_GEMMA3, LC_SMALL(4, 2),
     .head_dim = 64, .tied = true, .sliding_window = 8, .swa_pattern = 2},
    {"gemma3_swa_q8_0",
     "--arch gemma3 " LC_WIDE_FLAGS " --tied --sliding-window 8 --swa-pattern 2 "
     "--type q8_0",
     LC_W_Q8, GGML_TYPE_F32, false, (enum mkmodel_arch)MODEL_ARCH_GEMMA3, LC_WIDE,
     .type = GGML_TYPE_Q8_0, .tied = true, .sliding_window = 8, .swa_pattern = 2},
    // Experts (issue #32): 8 (or 16) per block, 2 (or 4) per token; routed
    // by llama.cpp's build_moe_ffn. qwen3moe renormalises the chosen weights,
    // qwen2moe does not and adds its sigmoid-gated shared expert (ff 256 or
    // 512: --n-ff), Mixtral (--arch mixtral: llama with experts)
    // renormalises, each expert --n-ff wide. Routers stay F32 in the
    // quantized files, as llama-quantize keeps them.
    {"qwen3moe_f32", "--arch qwen3moe " LC_SMALL_FLAGS(4, 2) " --head-dim 64 --n-expert 8",
     LC_EXACT_F32, GGML_TYPE_F32, false, LC_ARCH(QWEN3MOE), LC_SMALL(4, 2), .head_dim = 64,
     .n_expert = 8},
    {"qwen3moe_e16k4_f32",
     "--arch qwen3moe " LC_SMALL_FLAGS(4, 2) " --head-dim 64 --n-expert 16 --n-expert-used 4 "
                                             "--n-ff-exp 64",
     LC_EXACT_F32, GGML_TYPE_F32, false, LC_ARCH(QWEN3MOE), LC_SMALL(4, 2), .head_dim = 64,
     .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 64},
    {"qwen3moe_q8_0", "--arch qwen3moe " LC_WIDE_FLAGS " --n-expert 8 --type q8_0", LC_W_Q8,
     GGML_TYPE_F32, false, LC_ARCH(QWEN3MOE), LC_WIDE, .type = GGML_TYPE_Q8_0, .n_expert = 8},
    {"qwen2moe_f32", "--arch qwen2moe " LC_SMALL_FLAGS(4, 2) " --n-expert 8", LC_EXACT_F32,
     GGML_TYPE_F32, false, LC_ARCH(QWEN2MOE), LC_SMALL(4, 2), .n_expert = 8},
    {"qwen2moe_q4_0", "--arch qwen2moe " LC_WIDE_FLAGS " --n-expert 8 --type q4_0", LC_W_Q8,
     GGML_TYPE_F32, false, LC_ARCH(QWEN2MOE), LC_WIDE, .type = GGML_TYPE_Q4_0, .n_expert = 8},
    {"mixtral_f32", "--arch mixtral " LC_SMALL_FLAGS(4, 2), LC_EXACT_F32, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_SMALL(4, 2), .n_expert = 8},
    {"mixtral_q4_1", "--arch mixtral " LC_WIDE_FLAGS " --type q4_1", LC_W_Q8, GGML_TYPE_F32, false,
     MKMODEL_ARCH_LLAMA, LC_WIDE, .type = GGML_TYPE_Q4_1, .n_expert = 8},
    // llama-quantize's Q4_K_M mix of an 8-expert file: Q4_K stacks, Q6_K
    // ffn_down_exps in the layers use_more_bits picks, Mixtral's Q8_0
    // attn_k / attn_v and Q5_K attn_output
    {"qwen3moe_q4_k_m", "--arch qwen3moe " LC_WIDE_FLAGS " --n-expert 8 --mix q4_k_m", LC_W_QK,
     GGML_TYPE_F32, false, LC_ARCH(QWEN3MOE), LC_WIDE, .mix = MKMODEL_MIX_Q4_K_M, .n_expert = 8},
    // gpt-oss (issue #35): attention sinks, layer 0 local (window 8 < 32
    // tokens, the global layers' RoPE), Q/K/V/output biases, the router's
    // bias and a softmax over its top-k logits, experts with biases and
    // swiglu_oai; heads of 64 as the real model's (4 x 64 != n_embd). The
    // second: MXFP4 experts (llama.cpp's Q8_0 activations), YaRN.
    {"gptoss_f32",
     "--arch gpt-oss " LC_SMALL_FLAGS(4, 2) " --head-dim 64 --n-expert 8 --sliding-window 8",
     LC_EXACT_F32, GGML_TYPE_F32, false, LC_ARCH(GPTOSS), LC_SMALL(4, 2), .head_dim = 64,
     .sliding_window = 8, .n_expert = 8},
    {"gptoss_yarn_mxfp4",
     "--arch gpt-oss " LC_WIDE_FLAGS " --head-dim 64 --n-expert 8 --sliding-window 8 "
     "--type-ffn mxfp4 " LC_YARN_FLAGS,
     LC_W_Q8, GGML_TYPE_F32, false, LC_ARCH(GPTOSS), LC_WIDE, .head_dim = 64,
     .type_ffn = GGML_TYPE_MXFP4, LC_YARN, .sliding_window = 8, .n_expert = 8},
};
#define LC_N_CASES ((int)(sizeof lc_cases / sizeof lc_cases[0]))

// The mkmodel config of a case (seed 42, the generated vocabulary).
static inline void lc_case_config(const struct lc_case *c, struct mkmodel_config *cfg) {
    mkmodel_config_default(cfg);
    cfg->arch = c->arch;
    cfg->n_embd = c->n_embd;
    cfg->n_layer = c->n_layer;
    cfg->n_head = c->n_head;
    cfg->n_head_kv = c->n_head_kv;
    cfg->n_ff = c->n_ff;
    cfg->head_dim = c->head_dim;
    cfg->n_rot = c->n_rot;
    if (c->n_ctx)
        cfg->n_ctx = c->n_ctx;
    cfg->type = c->type;
    if (c->type_ffn != GGML_TYPE_F32)
        cfg->type_ffn = (int)c->type_ffn;
    cfg->mix = c->mix;
    cfg->tied = c->tied;
    cfg->rope_scaling = c->scaling;
    if (c->scale != 0)
        cfg->rope_scale = c->scale;
    cfg->yarn_orig_ctx = c->yarn_orig_ctx;
    cfg->rope_freqs = c->rope_freqs;
    cfg->sliding_window = c->sliding_window;
    cfg->swa_pattern = c->swa_pattern;
    cfg->n_expert = c->n_expert;
    cfg->n_expert_used = c->n_expert_used;
    cfg->n_ff_exp = c->n_ff_exp;
    cfg->n_threads = 2;
}

#endif
