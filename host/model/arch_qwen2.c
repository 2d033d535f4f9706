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
    ARCH_QWEN2_FIELDS,
    .block = {.bias_qkv = true, .ffn = ARCH_FFN_SWIGLU},
    .layer = layer,
};
