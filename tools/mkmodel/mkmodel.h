// mkmodel: synthetic GGUF models that llama.cpp and vela can load.
//
// A model is described by a `struct mkmodel_config` (shape, weight types,
// RoPE metadata, tokenizer, seed) and written with mkmodel_write, which
// streams every tensor to disk: rows are generated and quantized by worker
// threads while one thread writes, so a 7B-shaped file never sits in memory.
//
// Contract:
// - Metadata keys and tensor names, shapes (ggml order: ne[0] is the row
//   length) and types follow llama.cpp exactly, for every architecture of
//   host/model/arch.h's registry (`llama`: normal RoPE, experts with
//   n_expert > 0 (Mixtral); `qwen2`: NeoX RoPE, Q/K/V biases; `qwen3`: Q/K
//   norms; `gemma3`: sandwich norms, GeGLU, sliding window; `qwen3moe`,
//   `qwen2moe`: experts): the tensors are the table's (the one with experts
//   when n_expert > 0), in its order, required ones and of the optional ones
//   the untied head and rope_freqs when asked; expert stacks are 3-D
//   [n_in, n_out, n_expert], qwen2moe's ffn_gate_inp_shexp 1-D [n_embd].
// - The routers (ffn_gate_inp, ffn_gate_inp_shexp) are F32 whatever the
//   types asked, as llama-quantize keeps them.
// - The file's bytes depend only on the config (seed included), never on
//   n_threads.
// - Weights are seeded random numbers scaled so that activations stay finite
//   through any number of layers and the logits have a spread of a few units:
//   token_embd ~ N(0, 1), matrices ~ N(0, 1/n_in), output.weight ~ N(0, 4/n_embd)
//   (logits ~ N(0, 2^2)), norm weights ~ N(1, 0.1^2), biases ~ N(0, 0.5^2).
//   Tied models take output_norm.weight ~ N(0, 4/n_embd) instead: weights of
//   both signs cancel the head's preference for the input token (a row of
//   token_embd dotted with itself), which would make greedy decoding repeat it.
// - Matrices are written by one of two paths (cfg->weights):
//   exact: the N(0, s^2) floats above, quantized by quant_quantize_row (slow
//     for K-quants: ~0.5-1 us per weight);
//   fast: random but valid blocks written directly, no floats: quant bits
//     straight from the generator, scales chosen so the dequantized values have
//     mean 0 and the same std s (per-block scale gains vary over [0.75, 1.25],
//     K-quant sub-block scales over the upper half of their range, signed
//     types are symmetric: Q4_0/Q5_0/Q6_K never use their most negative level);
//     F32/F16/BF16 draw from a 4096-level N(0, s^2) table. ~1 ns per weight.
//   Vectors (norms, biases, rope factors) always take the exact path; so does
//   every tensor of a model whose weights are exact. The default (AUTO) is fast
//   above MKMODEL_FAST_PARAMS parameters and exact below, so small models (and
//   the llama.cpp reference data made from them) keep their bytes.
// - A quantized type whose block size does not divide a tensor's row length
//   falls back as llama.cpp's quantize does (Q4_K -> Q5_0, Q5_K -> Q5_1,
//   Q6_K -> Q8_0, anything else or still not fitting -> F16); each fallback
//   is reported through cfg->log.
// - Validation errors name the `vela mkmodel` flag of the offending field
//   (e.g. "--n-head-kv 3 does not divide --n-head 8").
#ifndef VELA_HOST_MKMODEL_H
#define VELA_HOST_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "host/model/arch.h"

// The registry's ids (host/model/arch.h): any registered enum model_arch
// value is accepted; these two keep their old names.
enum mkmodel_arch {
    MKMODEL_ARCH_LLAMA = MODEL_ARCH_LLAMA, // normal RoPE, no biases
    MKMODEL_ARCH_QWEN2 = MODEL_ARCH_QWEN2, // NeoX RoPE, Q/K/V biases
};

// A llama.cpp file type whose types the matrices take (tools/mkmodel/ftype.h):
// its LLAMA_FTYPE id (ftype_find(name)->id), or MKMODEL_MIX_NONE.
enum mkmodel_mix {
    MKMODEL_MIX_NONE = 0,    // every matrix takes its class's type
    MKMODEL_MIX_Q4_K_M = 15, // Q4_K, with Q6_K for output.weight and for attn_v /
                             // ffn_down in the layers llama.cpp's use_more_bits picks
};

// How matrices are generated (see the contract above).
enum mkmodel_weights {
    MKMODEL_WEIGHTS_AUTO = 0,  // fast above MKMODEL_FAST_PARAMS parameters, else exact
    MKMODEL_WEIGHTS_EXACT = 1, // floats, then quantized [--exact-weights]
    MKMODEL_WEIGHTS_FAST = 2,  // random blocks written directly [--fast-weights]
};
#define MKMODEL_FAST_PARAMS 1000000000LL

enum mkmodel_rope_scaling {
    MKMODEL_ROPE_SCALING_NONE = 0,
    MKMODEL_ROPE_SCALING_LINEAR = 1,
    MKMODEL_ROPE_SCALING_YARN = 2,
};

// Called with one line (no trailing newline) for every note worth showing to
// a user: type fallbacks, the vocabulary size taken from --vocab.
typedef void (*mkmodel_log_fn)(void *ctx, const char *msg);
// Called by the writing (calling) thread as data is written: bytes of tensor
// data written so far and in total.
typedef void (*mkmodel_progress_fn)(void *ctx, uint64_t done, uint64_t total);

// Fields whose comment says "0: ..." take a derived default when 0; the
// flag of `vela mkmodel` that sets each field is given in brackets.
struct mkmodel_config {
    enum mkmodel_arch arch; // [--arch]
    char name[128];         // general.name [--name]; "": "vela-synthetic-<arch>"

    int n_embd;     // [--n-embd]
    int n_layer;    // [--n-layer]
    int n_head;     // [--n-head]
    int n_head_kv;  // [--n-head-kv] 0: n_head
    int n_ff;       // [--n-ff]
    int n_vocab;    // [--n-vocab] 0: the tokenizer's size; ignored with vocab_path
    int n_ctx;      // {arch}.context_length [--ctx]
    int head_dim;   // [--head-dim] 0: n_embd / n_head
    int n_rot;      // rope.dimension_count [--n-rot] 0: head_dim
    float norm_eps; // [--norm-eps] 0: the architecture's (1e-5 llama, 1e-6 qwen2)
    // Experts (host/model/arch.h, struct arch_moe): architectures whose
    // blocks always have them (qwen3moe, qwen2moe) take 8 by default; llama
    // with n_expert > 0 is Mixtral.
    int n_expert;      // {arch}.expert_count [--n-expert] 0: none, or 8 where required
    int n_expert_used; // {arch}.expert_used_count [--n-expert-used] 0: min(2, n_expert)
    int n_ff_exp;      // {arch}.expert_feed_forward_length [--n-ff-exp] 0: n_ff / k
                       // (llama: always n_ff, the key is not written)
    int n_ff_shexp;    // {arch}.expert_shared_feed_forward_length [--n-ff-shexp] 0: n_ff
                       // (qwen2moe only)

    // Weight types. type_* < 0 means "same as type"; with a mix, `type` is
    // ignored (the mix sets the base) but type_* still override.
    enum ggml_type type; // every matrix [--type]
    int type_embd;       // token_embd.weight [--type-embd]
    int type_output;     // output.weight [--type-output]
    int type_attn;       // attn_q/k/v/output [--type-attn]
    int type_ffn;        // ffn_gate/up/down [--type-ffn]
    int mix;             // enum mkmodel_mix, or any LLAMA_FTYPE id ftype_by_id knows [--mix]

    float rope_freq_base; // [--rope-freq-base] 0: the architecture's (10000 llama, 1e6 qwen2)
    enum mkmodel_rope_scaling rope_scaling; // [--rope-scaling]
    float rope_scale;                       // rope.scaling.factor [--rope-scale] (linear / yarn)
    int yarn_orig_ctx;       // rope.scaling.original_context_length [--yarn-orig-ctx]
                             // 0: n_ctx (written for yarn only)
    bool rope_freqs;         // add rope_freqs.weight, Llama 3.1 factors [--rope-freqs]
    float rope_freqs_factor; // [--rope-freqs-factor] 0: 8
    int rope_freqs_orig_ctx; // [--rope-freqs-orig-ctx] 0: 8192

    // Sliding-window attention (architectures with local layers: gemma3).
    int sliding_window;       // {arch}.attention.sliding_window [--sliding-window] 0: none
    int swa_pattern;          // {arch}.attention.sliding_window_pattern [--swa-pattern]
                              // 0: not written (the architecture's default, 6)
    float rope_freq_base_swa; // {arch}.rope.freq_base_swa [--rope-freq-base-swa]
                              // 0: not written (llama.cpp's default, 10000)

    bool tied;     // no output.weight: the head reuses token_embd [--tied]
    uint64_t seed; // [--seed]
    // Copy every tokenizer.* key from this GGUF file [--vocab]; NULL: a
    // generated byte-level BPE vocabulary (gpt2 model) padded to n_vocab.
    const char *vocab_path;

    enum mkmodel_weights weights; // [--fast-weights / --exact-weights] resolved to FAST or EXACT
    int n_threads;                // generating/quantizing workers [--threads] 0: online CPUs (>= 2)
    mkmodel_log_fn log;           // may be NULL
    mkmodel_progress_fn progress; // may be NULL
    void *cb_ctx;                 // passed to log and progress
};

// The `tiny` shape, F32, generated vocabulary, seed 42.
void mkmodel_config_default(struct mkmodel_config *cfg);

// Sets the shape (head_dim, n_rot and norm_eps back to their derived
// defaults), default weight type, RoPE base, tying and name of preset `name`
// over `cfg`; other fields are kept, so set flags afterwards.
// Returns VERR_NOTFOUND for an unknown name, with the list of presets.
int mkmodel_preset(struct mkmodel_config *cfg, const char *name, struct verr *err);

struct mkmodel_preset_info {
    const char *name;
    const char *summary;
};
// The presets, terminated by an entry whose name is NULL.
const struct mkmodel_preset_info *mkmodel_presets(void);

// Checks the config and fills every derived default (n_head_kv, head_dim,
// n_rot, norm_eps, rope_freq_base, n_vocab, ...) into *out. Reads the
// vocabulary file (when set) to learn n_vocab.
int mkmodel_resolve(const struct mkmodel_config *cfg, struct mkmodel_config *out, struct verr *err);

// Tokens in the generated vocabulary before padding: 256 byte tokens, the
// merges learned from a built-in English sample, and the special tokens.
int mkmodel_vocab_base_size(void);

// Number of weights (all tensors) the resolved config describes.
int64_t mkmodel_count_params(const struct mkmodel_config *resolved);

// Writes the model to `path` (replacing it). On failure the partial file is
// removed and err says why.
int mkmodel_write(const struct mkmodel_config *cfg, const char *path, struct verr *err);

#endif
