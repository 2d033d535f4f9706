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
    .rope_mode = ROPE_MODE_NEOX,
    .block = {.qk_norm = true, .ffn = ARCH_FFN_SWIGLU},
    .rope_freq_base = 10000.0f,
    .synth_norm_eps = 1e-6f,
    .synth_rope_freq_base = 1000000.0f,
    .lcpp_quirks = ARCH_LCPP_ROT_ASSERT | ARCH_LCPP_NO_ROPE_FREQS,
    .globals = arch_globals_llama,
    .layer = layer,
};
