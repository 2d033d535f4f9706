// qwen3moe: Qwen3 with experts (Qwen3-30B-A3B, Qwen3-235B-A22B,
// Qwen3-Coder-30B-A3B). qwen3's attention (NeoX RoPE, per-head Q/K RMS
// norm, head dim from qwen3moe.attention.key_length); every feed-forward is
// routed: softmax over all experts, the top k, their weights renormalised
// to sum 1 (llama.cpp hard-codes norm_w for this architecture), no shared
// expert. An expert's width is qwen3moe.expert_feed_forward_length.
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer_moe[] = {
    ARCH_LAYER_QWEN3_ATTN,
    ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_MOE_EXPS,
    {0},
};

const struct arch arch_qwen3moe = {
    .id = MODEL_ARCH_QWEN3MOE,
    .name = "qwen3moe",
    .summary = "qwen3 attention, routed experts (top-k renormalised)",
    ARCH_QWEN3_FIELDS,
    .layer = NULL,
    .moe = {.required = true, .gating = MOE_GATING_SOFTMAX_RENORM, .ff_exp_key = true},
    .layer_moe = layer_moe,
};
