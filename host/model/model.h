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
#include "host/model/layout.h"
#include "host/ops/backend.h"

// "llama", "qwen2": the registered table's name (host/model/arch.h).
const char *model_arch_name(enum model_arch arch);
// "none", "linear", "yarn"; -1 (ROPE_SCALING_UNSPECIFIED) when unknown.
int rope_scaling_from_name(const char *name);
const char *rope_scaling_name(enum rope_scaling_type t);

// The dims tensor shapes are made of (host/model/arch.h), from hp.
void model_arch_dims(const struct model_hparams *hp, struct arch_dims *dims);
// The block table of hp's architecture: the one with experts when
// hp->n_expert > 0 (model_read_hparams checked that it exists).
const struct arch_tensor *model_layer_table(const struct model_hparams *hp);

// Reads and checks the hyperparameters only (no tensor data is touched, but
// token_embd.weight must exist for n_vocab). `f->path` names the file in messages.
int model_read_hparams(const struct gguf_file *f, struct model_hparams *hp, struct verr *err);

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
// their type, vectors as F32; absent optional ones count 0; every expert)
// and the multiply-adds of its matrices per token (of an expert stack, the
// k experts a token goes through), from the architecture's table.
void model_layer_size(const struct model_hparams *hp, const struct model_layer *L, double *bytes,
                      double *matmul_params);
// Bytes of a loaded layer's weights that one forward pass over n_tok tokens
// reads: model_layer_size's bytes, but of an expert stack only the experts
// the tokens are expected to route to, n_expert * (1 - (1 - k/n_expert)^n_tok)
// for uniform, independent routing (k of them for one token, nearly all of
// them for a prompt batch).
double model_layer_bytes_read(const struct model_hparams *hp, const struct model_layer *L,
                              int n_tok);
// Opens `path`, loads, closes the file.
int model_load_file(struct model **out, const char *path, struct backend *be, struct verr *err);
void model_free(struct model *m);

#endif
