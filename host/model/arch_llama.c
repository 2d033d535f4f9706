// llama: Llama 2/3, Mistral, TinyLlama, ... Normal RoPE; Q/K/V biases are
// accepted when a conversion carries them (as llama.cpp does). A file with
// llama.expert_count > 0 is Mixtral: the same attention, and a routed
// feed-forward (softmax over all experts, the top k renormalised, each
// expert llama.feed_forward_length wide) in every block.
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer[] = {
    ARCH_LAYER_LLAMA(true),
    {0},
};

static const struct arch_tensor layer_moe[] = {
    ARCH_LAYER_LLAMA_ATTN(true),
    ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_MOE_EXPS,
    {0},
};

const struct arch arch_llama = {
    .id = MODEL_ARCH_LLAMA,
    .name = "llama",
    .summary = "normal RoPE",
    .rope_mode = ROPE_MODE_NORMAL,
    .block = {.ffn = ARCH_FFN_SWIGLU},
    .rope_freq_base = 10000.0f,
    .synth_norm_eps = 1e-5f,
    .synth_rope_freq_base = 10000.0f,
    .lcpp_quirks = ARCH_LCPP_ROT_FULL,
    .globals = arch_globals_llama,
    .layer = layer,
    .moe = {.gating = MOE_GATING_SOFTMAX_RENORM},
    .layer_moe = layer_moe,
};
