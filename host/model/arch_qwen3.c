// qwen3: Qwen3 (dense). The llama block with NeoX RoPE, no Q/K/V biases, and
// an RMS norm over each head of Q and of K (attn_q_norm / attn_k_norm, one
// weight per head dimension) before RoPE. The head dimension comes from
// qwen3.attention.key_length and need not be n_embd / n_head.
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer[] = {
    ARCH_LAYER_QWEN3_ATTN,
    ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_FFN_PROJ,
    {0},
};

const struct arch arch_qwen3 = {
    .id = MODEL_ARCH_QWEN3,
    .name = "qwen3",
    .summary = "NeoX RoPE, per-head Q/K RMS norm",
    ARCH_QWEN3_FIELDS,
    .layer = layer,
};
