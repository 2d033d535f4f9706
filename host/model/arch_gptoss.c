// gpt-oss: OpenAI's gpt-oss-20b and -120b, as llama.cpp reads them
// (LLM_ARCH_OPENAI_MOE). NeoX RoPE (YaRN in the published files); layers
// alternate between a sliding window ({arch}.attention.sliding_window,
// required; even layers local by default) and full attention, the local
// ones rotating as the global ones; biases on Q, K, V and the output;
// learned attention sinks (one logit per head, host/ops/backend.h); the
// tensor named post_attention_norm is the feed-forward's input norm (on the
// residual after attention); every feed-forward is routed: router logits
// with a bias, the top k logits and a softmax over them as weights, experts
// with biases and swiglu_oai (alpha 1.702, limit 7: llama.cpp's constants,
// which the files do not carry).
//
// vela requires the Q/K/V biases llama.cpp takes as optional (every
// published file has them; mkmodel writes only required tensors).
#include "host/model/arch.h"
#include "host/model/layout.h"

// An expert stack's bias: [ne0, n_expert] F32.
#define GPTOSS_EXPS_BIAS(name, ne0, field)                                                         \
    {                                                                                              \
        name, ARCH_VECTOR, {ARCH_DIM_##ne0, ARCH_DIM_N_EXPERT, ARCH_DIM_1}, false,                 \
            ARCH_PLACE_LAYER, ARCH_ROLE_BIAS, offsetof(struct model_layer, field)                  \
    }

// In llama.cpp's order of creation (llama_model_openai_moe::load_arch_tensors).
static const struct arch_tensor layer_moe[] = {
    ARCH_LAYER_VEC("attn_norm.weight", N_EMBD, false, NORM, attn_norm),
    ARCH_LAYER_VEC("post_attention_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_MAT("attn_q.weight", N_EMBD, N_Q, false, ATTN_Q, wq),
    ARCH_LAYER_MAT("attn_k.weight", N_EMBD, N_K, false, ATTN_K, wk),
    ARCH_LAYER_MAT("attn_v.weight", N_EMBD, N_V, false, ATTN_V, wv),
    ARCH_LAYER_VEC("attn_q.bias", N_Q, false, BIAS, bq),
    ARCH_LAYER_VEC("attn_k.bias", N_K, false, BIAS, bk),
    ARCH_LAYER_VEC("attn_v.bias", N_V, false, BIAS, bv),
    ARCH_LAYER_MAT("attn_output.weight", N_O, N_EMBD, false, ATTN_O, wo),
    ARCH_LAYER_VEC("attn_sinks.weight", N_HEAD, false, ATTN_SINKS, attn_sinks),
    ARCH_LAYER_MOE_EXPS,
    ARCH_LAYER_VEC("attn_output.bias", N_EMBD, false, BIAS, bo),
    ARCH_LAYER_VEC("ffn_gate_inp.bias", N_EXPERT, false, BIAS, ffn_gate_inp_b),
    GPTOSS_EXPS_BIAS("ffn_gate_exps.bias", N_FF_EXP, ffn_gate_exps_b),
    GPTOSS_EXPS_BIAS("ffn_down_exps.bias", N_EMBD, ffn_down_exps_b),
    GPTOSS_EXPS_BIAS("ffn_up_exps.bias", N_FF_EXP, ffn_up_exps_b),
    {0},
};

const struct arch arch_gptoss = {
    .id = MODEL_ARCH_GPTOSS,
    .name = "gpt-oss",
    .summary = "attention sinks, alternating sliding windows, biased experts (swiglu_oai)",
    .rope_mode = ROPE_MODE_NEOX,
    .block =
        {
            .bias_qkv = true,
            .ffn = ARCH_FFN_SWIGLU,
            .sliding_window_pattern = 2,
            .swa_required = true,
            .swa_rope_trained = true,
            .bias_o = true,
            .attn_sinks = true,
        },
    .rope_freq_base = 10000.0f,
    .synth_norm_eps = 1e-5f,
    .synth_rope_freq_base = 150000.0f,
    .lcpp_quirks = ARCH_LCPP_NO_ROPE_FREQS,
    .globals = arch_globals_llama,
    .layer = NULL,
    .moe =
        {
            .required = true,
            .gating = MOE_GATING_SOFTMAX_WEIGHT,
            .act = MOE_ACT_SWIGLU_OAI,
            .ff_exp_key = true,
        },
    .layer_moe = layer_moe,
};
