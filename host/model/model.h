// The model: hyperparameters read from GGUF metadata (llama.cpp's key names
// and defaults) and the tensor map (llama.cpp's tensor names, ggml shapes),
// with every weight uploaded into backend memory.
//
// Contract: model_load checks every tensor the architecture needs before it
// allocates anything on the backend; a missing or mis-shaped tensor, an
// unknown architecture or an unsupported weight type is refused with a
// message naming the tensor (or key) and what was expected. After a
// successful load the model no longer refers to the GGUF file.
#ifndef VELA_HOST_MODEL_H
#define VELA_HOST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "gguf/verr.h"
#include "host/model/arch.h"
#include "host/ops/backend.h"

enum rope_scaling_type {
    ROPE_SCALING_UNSPECIFIED = -1, // CLI only: take the model's
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1,
    ROPE_SCALING_YARN = 2,
};

// "llama", "qwen2": the registered table's name (host/model/arch.h).
const char *model_arch_name(enum model_arch arch);
// "none", "linear", "yarn"; -1 (ROPE_SCALING_UNSPECIFIED) when unknown.
int rope_scaling_from_name(const char *name);
const char *rope_scaling_name(enum rope_scaling_type t);

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
};

// Whether layer il attends through the sliding window (llama.cpp's
// set_swa_pattern: local unless il % pattern == pattern - 1; pattern 0:
// every layer local).
static inline bool model_layer_is_swa(const struct model_hparams *hp, int il) {
    return hp->sliding_window > 0 &&
           (hp->swa_pattern == 0 || il % hp->swa_pattern < hp->swa_pattern - 1);
}

// The dims tensor shapes are made of (host/model/arch.h), from hp.
void model_arch_dims(const struct model_hparams *hp, struct arch_dims *dims);

// Reads and checks the hyperparameters only (no tensor data is touched, but
// token_embd.weight must exist for n_vocab). `f->path` names the file in messages.
int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, struct verr *err);

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

// Progress of a load: `done` of `total` bytes have been handed to the
// backend (monotonic; the last call has done == total).
typedef void (*model_progress_fn)(void *user, uint64_t done, uint64_t total);

// How model_load_ex loads. Weights of a stage go into one backend allocation
// (each tensor at a 256-byte aligned offset), filled from the mapped file
// through two page-locked staging buffers when the backend has async
// uploads (ops->upload_async: the read of chunk i+1 overlaps the copy of
// chunk i), with ops->upload straight from the mapping otherwise (the CPU).
struct model_load_params {
    int l0, l1; // layers [l0, l1); l1 < 0: all (the default: 0, -1)
    // What the caller will allocate on the same backend after the weights
    // (host/split/pipeline.c computes them with host/split/plan.c): the load is refused
    // with VERR_NOMEM, before anything is allocated, when weights + these
    // exceed the free memory ops->mem_info reports.
    size_t kv_bytes;
    size_t scratch_bytes;
    size_t reserve_bytes;       // kept free: allocator slack, cuBLAS workspaces
    bool skip_memory_check;     // trust the caller (a plan checked already)
    size_t staging_bytes;       // each staging buffer / upload piece; 0: 64 MiB
    model_progress_fn progress; // optional; called on the loading thread
    void *progress_user;
    // Several loads shown as one: progress gets progress_base + done of
    // progress_total (0: the load's own total).
    uint64_t progress_base;
    uint64_t progress_total;
};

void model_load_params_default(struct model_load_params *p);

// Loads the model from an open GGUF file into `be`'s memory (p NULL: the
// defaults, every layer, no progress).
int model_load_ex(struct model **out, const struct gguf_file *f, struct backend *be,
                  const struct model_load_params *p, struct verr *err);
// Backend bytes model_load_ex allocates for layers [l0, l1) (l1 < 0: all),
// alignment padding included: the `total` its progress ends at.
int model_load_bytes(const struct gguf_file *f, int l0, int l1, size_t *bytes, struct verr *err);
// model_load_ex with the defaults.
int model_load(struct model **out, const struct gguf_file *f, struct backend *be, struct verr *err);
// Loads layers [l0, l1) only (0 <= l0 < l1 <= n_layer), with the embedding
// table when l0 == 0 and the output norm and head when l1 == n_layer (see
// layer_begin above). Every tensor of the file is still checked.
int model_load_layers(struct model **out, const struct gguf_file *f, struct backend *be, int l0,
                      int l1, struct verr *err);
// Backend bytes the weights will take, without loading anything: each
// layer's (layer_bytes [n_layer]), the embedding table's and the head's
// (output norm + output matrix, or the embedding table again when tied).
int model_weight_bytes(const struct gguf_file *f, const struct model_hparams *hp,
                       size_t *layer_bytes, size_t *embed_bytes, size_t *head_bytes,
                       struct verr *err);
// Bytes of a loaded layer's weights as they sit on the backend (matrices in
// their type, vectors as F32; absent optional ones count 0) and the
// multiply-adds of its matrices per token, from the architecture's table.
void model_layer_size(const struct model_hparams *hp, const struct model_layer *L, double *bytes,
                      double *matmul_params);
// Opens `path`, loads, closes the file.
int model_load_file(struct model **out, const char *path, struct backend *be, struct verr *err);
void model_free(struct model *m);

#endif
