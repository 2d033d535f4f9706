// qwen2: Qwen2 / Qwen2.5. The llama block with NeoX RoPE and required Q/K/V
// biases.
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer[] = {
    ARCH_LAYER_LLAMA(false),
    {0},
};

const struct arch arch_qwen2 = {
    .id = MODEL_ARCH_QWEN2,
    .name = "qwen2",
    .summary = "NeoX RoPE, Q/K/V biases",
    .rope_mode = ROPE_MODE_NEOX,
    .block = {.bias_qkv = true, .ffn = ARCH_FFN_SWIGLU},
    .rope_freq_base = 10000.0f,
    .synth_norm_eps = 1e-6f,
    .synth_rope_freq_base = 1000000.0f,
    .lcpp_quirks = ARCH_LCPP_ROT_ASSERT | ARCH_LCPP_Q_SQUARE | ARCH_LCPP_NO_ROPE_FREQS,
    .globals = arch_globals_llama,
    .layer = layer,
};
