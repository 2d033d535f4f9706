// What a loaded model is, as data: the architecture's id, the
// hyperparameters, and where every weight lives (struct model, struct
// model_layer). The architecture tables (host/model/arch*.c) name these
// fields; the loader (host/model/model.h) fills them.
#ifndef VELA_HOST_MODEL_LAYOUT_H
#define VELA_HOST_MODEL_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/ops/backend.h"

// The registry's ids (stable: tests and mkmodel configs use them).
enum model_arch {
    MODEL_ARCH_LLAMA = 0,    // Llama 2/3, Mistral, TinyLlama: normal RoPE
    MODEL_ARCH_QWEN2 = 1,    // NeoX RoPE, Q/K/V biases
    MODEL_ARCH_QWEN3 = 2,    // NeoX RoPE, per-head Q/K RMS norm
    MODEL_ARCH_GEMMA3 = 3,   // sandwich norms, GeGLU, sliding-window layers
    MODEL_ARCH_QWEN3MOE = 4, // qwen3 attention, routed experts (renormalised)
    MODEL_ARCH_QWEN2MOE = 5, // qwen2 attention, routed experts + a gated shared expert
    MODEL_ARCH_GPTOSS = 6,   // sinks, alternating windows, biased experts with swiglu_oai
    MODEL_ARCH_COUNT
};

enum rope_scaling_type {
    ROPE_SCALING_UNSPECIFIED = -1, // CLI only: take the model's
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,
    ROPE_SCALING_YARN = 2,
};

struct model_hparams {
    enum model_arch arch;
    int n_ctx_train;          // {arch}.context_length
    int n_embd;               // {arch}.embedding_length
    int n_layer;              // {arch}.block_count
    int n_ff;                 // {arch}.feed_forward_length
    int n_head;               // {arch}.attention.head_count
    int n_head_kv;            // {arch}.attention.head_count_kv (default n_head)
    int head_dim;             // {arch}.attention.key_length (default n_embd / n_head)
    int head_dim_v;           // {arch}.attention.value_length (default n_embd / n_head)
    int n_rot;                // {arch}.rope.dimension_count (default head_dim)
    int n_vocab;              // token_embd.weight ne[1]
    float norm_eps;           // {arch}.attention.layer_norm_rms_epsilon
    enum rope_mode rope_mode; // the architecture's
    float rope_freq_base;     // {arch}.rope.freq_base (default: the architecture's, 10000)
    float rope_freq_scale; // 1 / {arch}.rope.scaling.factor (or rope.scale_linear); 1 when absent
    enum rope_scaling_type rope_scaling; // {arch}.rope.scaling.type (default linear, as llama.cpp)
    int n_ctx_orig_yarn;    // {arch}.rope.scaling.original_context_length (default n_ctx_train)
    float rope_attn_factor; // {arch}.rope.scaling.attn_factor (default 1)
    bool has_bias_qkv;      // the architecture requires Q/K/V biases (qwen2)
    // Sliding-window attention (gemma3; all 0 elsewhere): a local layer's
    // query at position p sees a cell at position c only if p - c <
    // sliding_window (llama.cpp's LLAMA_SWA_TYPE_STANDARD); which layers are
    // local: model_layer_is_swa. Local layers rotate with their own RoPE
    // base and no scaling (llama.cpp's rope_freq_base_train_swa, default
    // 10000, and rope_freq_scale_train_swa = 1).
    int sliding_window;       // {arch}.attention.sliding_window; 0: no local layers
    int swa_pattern;          // {arch}.attention.sliding_window_pattern (the arch's default)
    float rope_freq_base_swa; // {arch}.rope.freq_base_swa (default 10000)
    // Mixture of experts (host/model/arch.h, struct arch_moe); all 0 on a
    // dense model. 1 <= n_expert_used <= n_expert when n_expert > 0.
    int n_expert;      // {arch}.expert_count
    int n_expert_used; // {arch}.expert_used_count (k)
    int n_ff_exp;      // {arch}.expert_feed_forward_length (default n_ff / k), or n_ff (llama)
    int n_ff_shexp;    // {arch}.expert_shared_feed_forward_length (default n_ff); 0: no
                       // shared expert
};

// Whether layer il attends through the sliding window (llama.cpp's
// set_swa_pattern: local unless il % pattern == pattern - 1; pattern 0:
// every layer local).
static inline bool model_layer_is_swa(const struct model_hparams *hp, int il) {
    return hp->sliding_window > 0 &&
           (hp->swa_pattern == 0 || il % hp->swa_pattern < hp->swa_pattern - 1);
}

struct model_layer {
    float *attn_norm;             // [n_embd] F32
    struct backend_weight wq;     // [n_head*head_dim][n_embd]
    struct backend_weight wk;     // [n_head_kv*head_dim][n_embd]
    struct backend_weight wv;     // [n_head_kv*head_dim_v][n_embd]
    struct backend_weight wo;     // [n_embd][n_head*head_dim_v]
    float *bq;                    // [n_head*head_dim] F32 or NULL
    float *bk;                    // [n_head_kv*head_dim] F32 or NULL
    float *bv;                    // [n_head_kv*head_dim_v] F32 or NULL
    float *ffn_norm;              // [n_embd] F32
    struct backend_weight w_gate; // [n_ff][n_embd]
    struct backend_weight w_up;   // [n_ff][n_embd]
    struct backend_weight w_down; // [n_embd][n_ff]
    float *attn_q_norm;           // [head_dim] F32 or NULL (qwen3, gemma3)
    float *attn_k_norm;           // [head_dim] F32 or NULL
    float *attn_post_norm;        // [n_embd] F32 or NULL (gemma3)
    float *ffn_post_norm;         // [n_embd] F32 or NULL
    float *bo;                    // [n_embd] F32 or NULL (gpt-oss)
    float *attn_sinks;            // [n_head] F32 or NULL (gpt-oss)
    // A block with experts (hp.n_expert > 0) has these instead of w_gate,
    // w_up and w_down (zero there); expert e's rows of a stack are
    // [e * rows / n_expert, (e + 1) * rows / n_expert).
    struct backend_weight ffn_gate_inp;  // [n_expert][n_embd] the router, F32 (usually)
    struct backend_weight ffn_gate_exps; // [n_expert * n_ff_exp][n_embd]
    struct backend_weight ffn_up_exps;   // [n_expert * n_ff_exp][n_embd]
    struct backend_weight ffn_down_exps; // [n_expert * n_embd][n_ff_exp]
    // The router's and the experts' biases (gpt-oss; NULL elsewhere).
    float *ffn_gate_inp_b;  // [n_expert]
    float *ffn_gate_exps_b; // [n_expert][n_ff_exp]
    float *ffn_up_exps_b;   // [n_expert][n_ff_exp]
    float *ffn_down_exps_b; // [n_expert][n_embd]
    // The shared expert (qwen2moe; zero elsewhere): its gate vector, a
    // one-row matrix, and its SwiGLU feed-forward.
    struct backend_weight ffn_gate_inp_shexp; // [1][n_embd]
    struct backend_weight ffn_gate_shexp;     // [n_ff_shexp][n_embd]
    struct backend_weight ffn_up_shexp;       // [n_ff_shexp][n_embd]
    struct backend_weight ffn_down_shexp;     // [n_embd][n_ff_shexp]
};

struct model {
    struct model_hparams hp;
    char *name;                     // general.name, or the file's base name
    struct backend *be;             // not owned
    struct backend_weight tok_embd; // [n_vocab][n_embd]
    struct backend_weight output;   // [n_vocab][n_embd]; same data as tok_embd when tied
    bool output_tied;
    float *output_norm;         // [n_embd] F32
    float *rope_freqs;          // [n_rot/2] F32 or NULL
    struct model_layer *layers; // [n_layer]; only [layer_begin, layer_end) are loaded
    enum ggml_type weight_type; // type of most matmul weights (for display)
    size_t n_bytes;             // bytes of the weight tensors on the backend (no padding)
    int64_t n_params;

    // A stage of a model split by layers (host/split/pipeline.h) holds layers
    // [layer_begin, layer_end) only; tok_embd is loaded when layer_begin == 0
    // (or on the last stage when the output is tied to it), output_norm and
    // output when layer_end == n_layer. A whole model: 0 and n_layer.
    int layer_begin, layer_end;

    // backend allocations owned by the model (model_load_ex: one, every weight)
    void **allocs; // [n_allocs]
    int n_allocs;
    int cap_allocs;
};

#endif
