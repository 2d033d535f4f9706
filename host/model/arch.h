// Architectures: one table each (host/model/arch_<name>.c), registered in
// host/model/arch.c. A table says everything the rest of vela needs to know
// about an architecture: its GGUF name, its RoPE mode, the structure of a
// block (which ops the forward pass runs), hyperparameter defaults and
// llama.cpp's quirks, and every tensor it reads, each with its shape as
// data (dims of the hyperparameters), whether it may be absent and which
// field of struct model / struct model_layer it fills.
//
// Who walks the tables: the loader's shape checks, loading and byte counts
// (host/model/model.c), the synthetic-model writer (tools/mkmodel), the
// benchmark's bytes-per-token (tools/cmd_bench.c, through
// model_layer_size) and the forward pass (host/forward refuses a block it
// does not run). Adding an architecture: README, "Adding an
// architecture".
#ifndef VELA_HOST_MODEL_ARCH_H
#define VELA_HOST_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/model/layout.h"
#include "host/ops/backend.h"

// A dimension of a tensor, as a function of the hyperparameters
// (struct arch_dims, filled from struct model_hparams or a mkmodel config).
enum arch_dim {
    ARCH_DIM_1 = 0,      // 1: the unused second dim of a vector
    ARCH_DIM_N_EMBD,     // n_embd
    ARCH_DIM_N_VOCAB,    // n_vocab
    ARCH_DIM_N_FF,       // n_ff
    ARCH_DIM_N_Q,        // n_head * head_dim (Q's rows)
    ARCH_DIM_N_K,        // n_head_kv * head_dim (K's rows)
    ARCH_DIM_N_V,        // n_head_kv * head_dim_v (V's rows)
    ARCH_DIM_N_O,        // n_head * head_dim_v (attn_output's row length)
    ARCH_DIM_HEAD_DIM,   // head_dim (per-head Q/K norms)
    ARCH_DIM_N_ROT_HALF, // n_rot / 2 (rope_freqs)
    ARCH_DIM_N_EXPERT,   // n_expert (the third dim of an expert stack)
    ARCH_DIM_N_FF_EXP,   // n_ff_exp (one expert's feed-forward width)
    ARCH_DIM_N_FF_SHEXP, // n_ff_shexp (the shared expert's width)
    ARCH_DIM_N_HEAD,     // n_head (attention sinks: one per query head)
    ARCH_DIM_COUNT
};

// The hyperparameters a shape is made of, indexed by enum arch_dim.
struct arch_dims {
    int64_t d[ARCH_DIM_COUNT];
};
// The expert dims are 0 after arch_dims_make; arch_dims_set_moe sets them
// (only the tables of blocks with experts use them).
void arch_dims_make(struct arch_dims *dims, int n_embd, int n_vocab, int n_ff, int n_head,
                    int n_head_kv, int head_dim, int head_dim_v, int n_rot);
void arch_dims_set_moe(struct arch_dims *dims, int n_expert, int n_ff_exp, int n_ff_shexp);

// What a tensor is: picks its weight type class and initial values in
// mkmodel, its part of a quantization mix.
enum arch_role {
    ARCH_ROLE_TOKEN_EMBD,
    ARCH_ROLE_OUTPUT, // the LM head; when absent, tied to token_embd
    ARCH_ROLE_ATTN_Q,
    ARCH_ROLE_ATTN_K,
    ARCH_ROLE_ATTN_V,
    ARCH_ROLE_ATTN_O,
    ARCH_ROLE_FFN_GATE,
    ARCH_ROLE_FFN_UP,
    ARCH_ROLE_FFN_DOWN,
    ARCH_ROLE_NORM,        // an RMS norm weight inside a block
    ARCH_ROLE_OUTPUT_NORM, // the final norm before the head
    ARCH_ROLE_BIAS,
    ARCH_ROLE_ROPE_FREQS, // per-dimension RoPE frequency factors
    // The router (ffn_gate_inp) and the shared expert's gate vector
    // (ffn_gate_inp_shexp): matrices llama.cpp never quantizes (F32 in
    // mkmodel and vela quantize). The expert stacks and the shared expert
    // take the FFN_GATE / FFN_UP / FFN_DOWN roles.
    ARCH_ROLE_FFN_GATE_INP,
    ARCH_ROLE_ATTN_SINKS, // one logit per query head (gpt-oss; host/ops/backend.h, attn_args)
};

enum arch_kind {
    ARCH_MATRIX, // ggml [ne0 = n_in, ne1 = n_out], any weight type: a struct backend_weight;
                 // an expert stack [n_in, n_out, n_expert] is one backend_weight of
                 // n_expert * n_out rows (host/ops/backend.h, struct moe_args); a
                 // matrix of one row (ne1 = ARCH_DIM_1) is a 1-D tensor in the file
    ARCH_VECTOR, // [ne0], or [ne0, ne1] when ne[1] is not ARCH_DIM_1 (per-expert biases
                 // [n_ff_exp, n_expert]); F32, F16 or BF16 in the file, F32 on the backend:
                 // a float * to ne0 * ne1 floats
};

// Which stages of a model split by layers hold a tensor (host/model/model.h,
// layer_begin). File order follows it too: FIRST and EVERY, then the
// blocks, then LAST (as llama.cpp's converters write them).
enum arch_place {
    ARCH_PLACE_LAYER, // "blk.<il>.<name>", in struct model_layer; the stage holding layer il
    ARCH_PLACE_FIRST, // the first stage (token_embd; the last stage's too when the head is tied)
    ARCH_PLACE_EVERY, // every stage (rope_freqs)
    ARCH_PLACE_LAST,  // the last stage (the head)
};

struct arch_tensor {
    const char *name;    // a layer tensor's suffix ("attn_q.weight"), else the whole name
    enum arch_kind kind; // matrix or vector
    enum arch_dim ne[3]; // ggml order (ne[0] is the row length); unused dims are ARCH_DIM_1
                         // (ne[2] is ARCH_DIM_N_EXPERT for an expert stack only)
    bool optional;       // may be absent (a NULL vector, an untied head)
    enum arch_place place;
    enum arch_role role;
    size_t field; // offsetof(struct model_layer, ...) for ARCH_PLACE_LAYER, else
                  // offsetof(struct model, ...): a struct backend_weight or a float *
};

// The feed-forward's gated activation.
enum arch_ffn {
    ARCH_FFN_SWIGLU = 0, // silu(gate) * up (llama, qwen2)
    ARCH_FFN_GEGLU = 1,  // gelu(gate) * up (gemma)
};

// The structure of a block, beyond llama's (pre-norm attention and
// feed-forward, each added to the residual). One field per feature; the
// zero value of each is llama's. host/forward checks that it runs them all.
struct arch_block {
    bool bias_qkv;              // Q/K/V biases required (attn_q/k/v.bias)
    bool qk_norm;               // per-head RMS norm of Q and K before RoPE (qwen3, gemma3)
    bool post_attn_norm;        // RMS norm of the attention output before the residual (gemma2)
    bool post_ffn_norm;         // likewise of the feed-forward output
    enum arch_ffn ffn;          // the gated activation
    bool embd_scale;            // the embedding is scaled by sqrt(n_embd) (gemma)
    int sliding_window_pattern; // 0: every layer attends to all; n: the default of
                                // {arch}.attention.sliding_window_pattern when the file
                                // has {arch}.attention.sliding_window: layer il is local
                                // (windowed) unless il % n == n - 1 (gemma3: 6)
    // The window is required: {arch}.attention.sliding_window must be in the
    // file (gpt-oss; gemma3 runs every layer globally without it).
    bool swa_required;
    // The local layers rotate with the file's RoPE base and scaling
    // (llama.cpp's gpt-oss: rope_freq_base/scale_train_swa = the trained
    // ones; {arch}.rope.freq_base_swa overrides the base), not with base
    // 10000 unscaled (gemma3).
    bool swa_rope_trained;
    // The output projection has a bias (attn_output.bias, gpt-oss).
    bool bias_o;
    // The attention of every layer has sinks (attn_sinks.weight, gpt-oss).
    bool attn_sinks;
    // The attention scale of llama.cpp's gemma3 (its f_attention_scale):
    // 1/sqrt(head_dim), but 1/sqrt(n_embd / n_head) for a model of
    // `attn_scale_embd_layers` layers (Gemma 3 27B, query_pre_attn_scalar =
    // n_embd / n_head); 0: always 1/sqrt(head_dim).
    int attn_scale_embd_layers;
};

// Mixture of experts: the feed-forward of a block with experts is
// llama.cpp's build_moe_ffn: router logits = ffn_gate_inp h (+ its bias
// where the table has ffn_gate_inp.bias), k = {arch}.expert_used_count of
// {arch}.expert_count experts chosen and weighted by the gating
// (backend_ops.moe_route), their weighted sum (backend_ops.moe_ffn, with
// the experts' biases where the table has them), plus a gated shared expert
// where the table has one.
struct arch_moe {
    bool required;          // every block has experts (qwen3moe); false: only when the file's
                            // {arch}.expert_count > 0 (llama: Mixtral), else the dense table
    enum moe_gating gating; // softmax over all (optionally renormalised, llama.cpp's norm_w),
                            // or softmax over the top k logits (gpt-oss)
    enum moe_act act;       // the experts' activation (SwiGLU, or gpt-oss's swiglu_oai)
    bool ff_exp_key;        // an expert's width is {arch}.expert_feed_forward_length (default
                            // n_ff / k); false: n_ff (llama.cpp's llama)
    bool shexp;             // a shared expert of width {arch}.expert_shared_feed_forward_length
                            // (default n_ff), scaled by sigmoid(ffn_gate_inp_shexp . h) (qwen2moe)
};

// llama.cpp's checks of this architecture that vela does not share: mkmodel
// notes files that llama.cpp would refuse.
enum {
    ARCH_LCPP_ROT_FULL = 1u << 0,      // its loader refuses rope.dimension_count != head dim
    ARCH_LCPP_ROT_ASSERT = 1u << 1,    // its graph asserts n_rot == head dim (an abort)
    ARCH_LCPP_Q_SQUARE = 1u << 2,      // it expects attn_q.weight to be n_embd x n_embd
    ARCH_LCPP_NO_ROPE_FREQS = 1u << 3, // it refuses rope_freqs.weight
};

struct arch {
    enum model_arch id;
    const char *name;    // general.architecture, and the prefix of its metadata keys
    const char *summary; // one line for --help
    enum rope_mode rope_mode;
    struct arch_block block;
    float rope_freq_base; // the loader's default when {arch}.rope.freq_base is absent
    // What a synthetic model (vela mkmodel) takes by default: the values of
    // the architecture's published models.
    float synth_norm_eps, synth_rope_freq_base;
    unsigned lcpp_quirks; // ARCH_LCPP_*
    // Terminated by an entry whose name is NULL, in the order of the checks
    // (the first problem is the one reported) and, within a place (enum
    // arch_place), of the file.
    const struct arch_tensor *globals; // outside the blocks
    const struct arch_tensor *layer;   // of every block; NULL when moe.required
    struct arch_moe moe;
    // Of every block of a file with experts ({arch}.expert_count > 0); NULL:
    // the architecture has none (such a file is refused).
    const struct arch_tensor *layer_moe;
};

// The block table of a model with (experts) or without experts; NULL when
// the architecture has no such block.
static inline const struct arch_tensor *arch_layer_table(const struct arch *a, bool experts) {
    return experts ? a->layer_moe : a->layer;
}

// The registered architectures.
const struct arch *arch_get(enum model_arch id); // NULL when not registered
const struct arch *arch_find(const char *name);  // by general.architecture; NULL when unknown
// "llama, qwen2": the registered names, for messages (truncated to cap);
// returns buf.
const char *arch_names(char *buf, size_t cap);

// The tensors llama-like architectures share outside the blocks:
// token_embd, output_norm, output (optional: tied), rope_freqs (optional).
extern const struct arch_tensor arch_globals_llama[];

// The fields of struct arch the Qwen families share (qwen2, qwen2moe,
// qwen3, qwen3moe): NeoX RoPE, llama.cpp's default base, the published
// models' norm eps and base for synthetic files, llama's global tensors.
#define ARCH_QWEN_FIELDS                                                                           \
    .rope_mode = ROPE_MODE_NEOX, .rope_freq_base = 10000.0f, .synth_norm_eps = 1e-6f,              \
    .synth_rope_freq_base = 1000000.0f, .globals = arch_globals_llama
// qwen2's (qwen2, qwen2moe): the above and llama.cpp's quirks for them.
#define ARCH_QWEN2_FIELDS                                                                          \
    ARCH_QWEN_FIELDS,                                                                              \
        .lcpp_quirks = ARCH_LCPP_ROT_ASSERT | ARCH_LCPP_Q_SQUARE | ARCH_LCPP_NO_ROPE_FREQS
// qwen3's (qwen3, qwen3moe): per-head Q/K norms, SwiGLU, llama.cpp's quirks.
#define ARCH_QWEN3_FIELDS                                                                          \
    ARCH_QWEN_FIELDS, .block = {.qk_norm = true, .ffn = ARCH_FFN_SWIGLU},                          \
                      .lcpp_quirks = ARCH_LCPP_ROT_ASSERT | ARCH_LCPP_NO_ROPE_FREQS

// Shorthands for writing tables (in an arch_<name>.c, which includes
// host/model/layout.h for the fields): a matrix / vector of a block, by
// enum arch_dim and enum arch_role without their prefixes.
#define ARCH_LAYER_MAT(name, ne0, ne1, optional, role, field)                                      \
    {                                                                                              \
        name, ARCH_MATRIX, {ARCH_DIM_##ne0, ARCH_DIM_##ne1, ARCH_DIM_1}, optional,                 \
            ARCH_PLACE_LAYER, ARCH_ROLE_##role, offsetof(struct model_layer, field)                \
    }
// An expert stack of a block: [ne0, ne1, n_expert], required.
#define ARCH_LAYER_EXPS(name, ne0, ne1, role, field)                                               \
    {                                                                                              \
        name, ARCH_MATRIX, {ARCH_DIM_##ne0, ARCH_DIM_##ne1, ARCH_DIM_N_EXPERT}, false,             \
            ARCH_PLACE_LAYER, ARCH_ROLE_##role, offsetof(struct model_layer, field)                \
    }
#define ARCH_LAYER_VEC(name, ne0, optional, role, field)                                           \
    {                                                                                              \
        name, ARCH_VECTOR, {ARCH_DIM_##ne0, ARCH_DIM_1, ARCH_DIM_1}, optional, ARCH_PLACE_LAYER,   \
            ARCH_ROLE_##role, offsetof(struct model_layer, field)                                  \
    }

// The attention of llama-like architectures (llama, mistral, qwen2, ...) in
// llama.cpp's file order: pre-norm attention whose Q/K/V biases may be
// absent when `bias_optional`.
#define ARCH_LAYER_LLAMA_ATTN(bias_optional)                                                       \
    ARCH_LAYER_VEC("attn_norm.weight", N_EMBD, false, NORM, attn_norm),                            \
        ARCH_LAYER_MAT("attn_q.weight", N_EMBD, N_Q, false, ATTN_Q, wq),                           \
        ARCH_LAYER_VEC("attn_q.bias", N_Q, bias_optional, BIAS, bq),                               \
        ARCH_LAYER_MAT("attn_k.weight", N_EMBD, N_K, false, ATTN_K, wk),                           \
        ARCH_LAYER_VEC("attn_k.bias", N_K, bias_optional, BIAS, bk),                               \
        ARCH_LAYER_MAT("attn_v.weight", N_EMBD, N_V, false, ATTN_V, wv),                           \
        ARCH_LAYER_VEC("attn_v.bias", N_V, bias_optional, BIAS, bv),                               \
        ARCH_LAYER_MAT("attn_output.weight", N_O, N_EMBD, false, ATTN_O, wo)

// The block of llama-like architectures: the attention above, then the
// pre-norm SwiGLU feed-forward.
#define ARCH_LAYER_LLAMA(bias_optional)                                                            \
    ARCH_LAYER_LLAMA_ATTN(bias_optional),                                                          \
        ARCH_LAYER_VEC("ffn_norm.weight", N_EMBD, false, NORM, ffn_norm), ARCH_LAYER_FFN_PROJ

// The projections of a block without biases (qwen3, gemma3), in llama.cpp's
// file order: attention's Q, K, V and output; the feed-forward's gate, up
// and down.
#define ARCH_LAYER_ATTN_PROJ                                                                       \
    ARCH_LAYER_MAT("attn_q.weight", N_EMBD, N_Q, false, ATTN_Q, wq),                               \
        ARCH_LAYER_MAT("attn_k.weight", N_EMBD, N_K, false, ATTN_K, wk),                           \
        ARCH_LAYER_MAT("attn_v.weight", N_EMBD, N_V, false, ATTN_V, wv),                           \
        ARCH_LAYER_MAT("attn_output.weight", N_O, N_EMBD, false, ATTN_O, wo)
// qwen3's attention (qwen3, qwen3moe), in llama.cpp's file order: pre-norm,
// the projections without biases, per-head K and Q norms.
#define ARCH_LAYER_QWEN3_ATTN                                                                      \
    ARCH_LAYER_VEC("attn_norm.weight", N_EMBD, false, NORM, attn_norm), ARCH_LAYER_ATTN_PROJ,      \
        ARCH_LAYER_VEC("attn_k_norm.weight", HEAD_DIM, false, NORM, attn_k_norm),                  \
        ARCH_LAYER_VEC("attn_q_norm.weight", HEAD_DIM, false, NORM, attn_q_norm)

// The routed feed-forward of llama.cpp's MoE blocks, in its order: router,
// then the gate, down and up expert stacks.
#define ARCH_LAYER_MOE_EXPS                                                                        \
    ARCH_LAYER_MAT("ffn_gate_inp.weight", N_EMBD, N_EXPERT, false, FFN_GATE_INP, ffn_gate_inp),    \
        ARCH_LAYER_EXPS("ffn_gate_exps.weight", N_EMBD, N_FF_EXP, FFN_GATE, ffn_gate_exps),        \
        ARCH_LAYER_EXPS("ffn_down_exps.weight", N_FF_EXP, N_EMBD, FFN_DOWN, ffn_down_exps),        \
        ARCH_LAYER_EXPS("ffn_up_exps.weight", N_EMBD, N_FF_EXP, FFN_UP, ffn_up_exps)
#define ARCH_LAYER_FFN_PROJ                                                                        \
    ARCH_LAYER_MAT("ffn_gate.weight", N_EMBD, N_FF, false, FFN_GATE, w_gate),                      \
        ARCH_LAYER_MAT("ffn_up.weight", N_EMBD, N_FF, false, FFN_UP, w_up),                        \
        ARCH_LAYER_MAT("ffn_down.weight", N_FF, N_EMBD, false, FFN_DOWN, w_down)

#endif
