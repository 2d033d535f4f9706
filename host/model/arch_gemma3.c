// gemma3: Gemma 3 (text). NeoX RoPE; the embedding scaled by sqrt(n_embd);
// four RMS norms per block (before and after attention, before and after
// the feed-forward); per-head Q/K RMS norm before RoPE; GeGLU feed-forward
// (tanh GELU); usually a tied head; attention scaled by 1/sqrt(head_dim)
// (1/sqrt(n_embd / n_head) for the 62-layer 27B, as llama.cpp does). With
// gemma3.attention.sliding_window, five local (windowed) layers for every
// global one by default (gemma3.attention.sliding_window_pattern), the local
// ones with their own RoPE base (host/model/model.h).
#include "host/model/arch.h"
#include "host/model/layout.h"

static const struct arch_tensor layer[] = {
    ARCH_LAYER_VEC("attn_norm.weight", N_EMBD, false, NORM, attn_norm),
    ARCH_LAYER_ATTN_PROJ,
    ARCH_LAYER_VEC("post_attention_norm.weight", N_EMBD, false, NORM, attn_post_norm),
    ARCH_LAYER_VEC("attn_k_norm.weight", HEAD_DIM, false, NORM, attn_k_norm),
    ARCH_LAYER_VEC("attn_q_norm.weight", HEAD_DIM, false, NORM, attn_q_norm),
    ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm),
    ARCH_LAYER_FFN_PROJ,
    ARCH_LAYER_VEC("post_ffw_norm.weight", N_EMBD, false, NORM, ffn_post_norm),
    {0},
};

const struct arch arch_gemma3 = {
    .id = MODEL_ARCH_GEMMA3,
    .name = "gemma3",
    .summary = "sandwich norms, Q/K norm, GeGLU, sliding-window layers",
    .rope_mode = ROPE_MODE_NEOX,
    .block =
        {
            .qk_norm = true,
            .post_attn_norm = true,
            .post_ffn_norm = true,
            .ffn = ARCH_FFN_GEGLU,
            .embd_scale = true,
            .sliding_window_pattern = 6,
            .attn_scale_embd_layers = 62,
        },
    .rope_freq_base = 10000.0f,
    .synth_norm_eps = 1e-6f,
    .synth_rope_freq_base = 1000000.0f,
    .lcpp_quirks = ARCH_LCPP_NO_ROPE_FREQS,
    .globals = arch_globals_llama,
    .layer = layer,
};
