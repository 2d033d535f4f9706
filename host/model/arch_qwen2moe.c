// qwen2moe: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B. qwen2's attention (NeoX
// RoPE; llama.cpp takes the Q/K/V biases as optional here); every
// feed-forward is routed: softmax over all experts, the top k with their
// probabilities as weights (not renormalised), plus a shared expert (SwiGLU,
// width qwen2moe.expert_shared_feed_forward_length) scaled by
// sigmoid(ffn_gate_inp_shexp . h), h the normed input.
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer_moe[] = {
    ARCH_LAYER_LLAMA_ATTN(true),
    ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_MOE_EXPS,
    ARCH_LAYER_MAT("ffn_gate_inp_shexp.weight", N_EMBD, 1, false, FFN_GATE_INP, ffn_gate_inp_shexp),
    ARCH_LAYER_MAT("ffn_gate_shexp.weight", N_EMBD, N_FF_SHEXP, false, FFN_GATE, ffn_gate_shexp),
    ARCH_LAYER_MAT("ffn_down_shexp.weight", N_FF_SHEXP, N_EMBD, false, FFN_DOWN, ffn_down_shexp),
    ARCH_LAYER_MAT("ffn_up_shexp.weight", N_EMBD, N_FF_SHEXP, false, FFN_UP, ffn_up_shexp),
    {0},
};

const struct arch arch_qwen2moe = {
    .id = MODEL_ARCH_QWEN2MOE,
    .name = "qwen2moe",
    .summary = "qwen2 attention, routed experts + a gated shared expert",
    ARCH_QWEN2_FIELDS,
    .block = {.ffn = ARCH_FFN_SWIGLU},
    .layer = NULL,
    .moe = {.required = true, .gating = MOE_GATING_SOFTMAX, .ff_exp_key = true, .shexp = true},
    .layer_moe = layer_moe,
};
