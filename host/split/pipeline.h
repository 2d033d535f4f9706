// A model split by layers into stages (--split-mode layer, --devices,
// --tensor-split): each stage holds a contiguous range of layers and their KV
// cache on its own backend; the hidden state goes from stage to stage through
// a transport (host/stage.h); embeddings run on the first stage, the final
// norm and LM head on the last.
//
// How it plugs in: pipeline_load plans the split and loads every stage into
// a struct pipeline, which owns every local stage (backend and weights) and
// the transport. host/split/split.h wraps it in an executor
// (host/forward/executor.h): a front forward context on stage 0's model
// (forward_init_front), whose cache keeps the KV bookkeeping every caller
// uses (sequence ops, context shift and self-extend act on it), and a
// pipeline_ctx with every other stage's context. Each decode claims the
// batch's cells on the front cache, first brings every other stage's cache
// to the same cells (positions, deltas, sequence sets; after a kv_clear of
// the front, zeroing the stage's K/V too); each stage then applies the
// pending K shift to its own layers.
//
// Pipelining: a decode's batch is cut into micro-batches (--ubatch-size,
// default ceil(n_tok / n_stages)); micro-batch k+1 is enqueued on stage s
// right after micro-batch k was handed to stage s+1. Backends and transports
// that run asynchronously (CUDA streams, NCCL) overlap the stages; the CPU
// runs them one after the other and gives the same results.
//
// One process drives every local stage. With mpirun (host/mpi.c) each
// process holds one stage; rank 0 runs the engine and broadcasts each
// decode's batch and KV bookkeeping to the others (struct pipeline_ctl).
#ifndef VELA_HOST_PIPELINE_H
#define VELA_HOST_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "gguf/verr.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/plan.h"
#include "host/split/stage.h"

// Where and how a model runs: the library's load configuration (tools/
// fills it from llama.cpp's flags, named beside each field).
enum load_backend {
    LOAD_BACKEND_AUTO = 0, // cuda when a GPU is usable, else cpu
    LOAD_BACKEND_CPU = 1,
    LOAD_BACKEND_CUDA = 2,
};
enum load_split_mode {
    LOAD_SPLIT_LAYER = 0, // contiguous layer ranges per device (the default)
    LOAD_SPLIT_NONE = 1,  // everything on main_device
    LOAD_SPLIT_ROW = 2,   // llama.cpp's row split: refused
};
struct load_config {
    const char *model_path;          // -m
    enum load_backend backend;       // --backend (auto)
    int main_device;                 // --device / --main-gpu: CUDA ordinal (0)
    struct backend_settings be;      // -t (0: all cores), --matvec-act (the backend's)
    enum load_split_mode split_mode; // --split-mode (layer)
    // --devices: "cpu", CUDA ordinals or "cudaN"/"cuda:N", comma separated
    // (plan_parse_devices); NULL: every visible GPU, or the CPU without one.
    const char *devices;
    // --tensor-split: proportions "3,1" (plan_parse_split); NULL: by free memory.
    const char *tensor_split;
    int n_ubatch; // --ubatch-size: pipeline micro-batch tokens (0: ceil(n_tok / n_stages))
};
void load_config_default(struct load_config *c);

// Control channel between the processes of a multi-process pipeline (MPI).
struct pipeline_ctl {
    int rank, n_ranks;
    // Rank 0's bytes to every rank.
    int (*bcast)(struct pipeline_ctl *c, void *buf, size_t bytes, struct verr *err);
    // Every rank's value to every rank: out[r] = rank r's v.
    int (*allgather)(struct pipeline_ctl *c, uint64_t v, uint64_t *out, struct verr *err);
    void (*destroy)(struct pipeline_ctl *c);
    void *impl;
};

struct pipeline_stage {
    struct backend_device dev;
    char name[48];      // "cpu", "cuda:1", "rank2:cuda:0"
    int l0, l1;         // layers [l0, l1)
    struct backend *be; // NULL when the stage runs in another process
    struct model *m;    // its layers (NULL when remote); stage 0's is the caller's
    bool owned;         // be and m belong to the pipeline (every local stage)
};

struct pipeline {
    int n_stages;
    struct pipeline_stage stage[PLAN_MAX_DEVICES];
    struct plan plan;
    char plan_text[4096]; // plan_format's lines, for --verbose and logs
    struct transport *tp;
    struct pipeline_ctl *ctl; // NULL in one process
    int n_ubatch;             // micro-batch tokens; 0: ceil(n_tok / n_stages)

    // Per-stage time (a hook for benchmarks): when `timing` is set, each
    // stage's work is waited for right after it is enqueued and its wall time
    // added to stage_ms[s] (this serialises the stages: measure, don't serve).
    bool timing;
    double stage_ms[PLAN_MAX_DEVICES];
    double xfer_ms;
    long n_decodes;
};

// Every stage's forward context for one front context (fc->pipe).
struct pipeline_ctx {
    struct pipeline *p;
    int front;                                // the stage of the context that owns this
    struct forward_ctx *fc[PLAN_MAX_DEVICES]; // [front]: the front (not owned); NULL: remote
};

// The devices the flags ask for (--devices, --split-mode, --main-gpu /
// --device, --backend), checked to exist. *n == 1 means no split.
int pipeline_resolve_devices(const struct load_config *lc, struct backend_device *devs, int *n,
                             struct verr *err);

// Plans the split of f's model over devs (n >= 1) for a context of n_ctx
// cells (0: from the flags) with the flags' batch, cache types and
// --tensor-split, from each device's free memory (free_bytes NULL: asks the
// devices; tests pass their own). Fills *out and its text.
int pipeline_plan(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, const struct backend_device *devs, int n,
                  const size_t *free_bytes, struct plan *out, char *text, size_t text_cap,
                  struct verr *err);

// Loads the model as lc says: with one device, its backend and the model
// (*pipe NULL, *be and *m caller-owned); with several, plans, creates every
// stage's backend, loads its layers and returns the pipeline (*pipe, owning
// every stage) with stage 0's backend and model in *be and *m (owned by the
// pipeline). cfg: the context the load must leave room for (n_ctx 0: the
// model's), as pipeline_plan.
int pipeline_load(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, struct pipeline **pipe, struct backend **be,
                  struct model **m, struct verr *err);
// pipeline_load with the load's progress (every stage's bytes as one total)
// and, for one device, the check of weights + KV cache + scratch against the
// backend's free memory before anything is allocated (a split is checked by
// its plan). cfg->n_outputs_max: logits rows the context will keep (0: n_batch).
int pipeline_load_ex(const struct load_config *lc, const struct forward_config *cfg,
                     const struct gguf_file *f, model_progress_fn progress, void *progress_user,
                     struct pipeline **pipe, struct backend **be, struct model **m,
                     struct verr *err);
// What pipeline_load_ex checks a one-device load against, from host/plan.c's
// accounting for this context: lp's kv_bytes (n_ctx cells of every layer's K
// and V), scratch_bytes (activations of n_batch tokens, n_outputs_max logits
// rows, the cache's cell mirrors) and reserve_bytes (256 MiB on a GPU).
int pipeline_load_budget(const struct load_config *lc, const struct forward_config *cfg,
                         const struct gguf_file *f, const struct backend_device *d,
                         struct model_load_params *lp, struct verr *err);

// Frees the stages the pipeline owns and the transport.
void pipeline_free(struct pipeline *p);

// Every other stage's context for a front context on stage 0's model (or,
// under mpirun, on this rank's).
int pipeline_ctx_init(struct pipeline_ctx **out, struct pipeline *p, struct forward_ctx *front,
                      const struct forward_config *cfg, struct verr *err);
void pipeline_ctx_free(struct pipeline_ctx *pc);

// The stages' part of forward_decode (after the front found the batch's
// cells in front->h_cells and its output rows in front->h_rows): results in
// front->h_logits / h_argmax.
int pipeline_decode(struct pipeline_ctx *pc, const struct forward_batch *b, int n_out,
                    bool argmax_only, struct verr *err);

// Multi-process: a rank other than 0 serves decodes for its stage until rank
// 0 frees the pipeline (host/mpi.c calls it).
int pipeline_serve(struct pipeline_ctx *pc, struct verr *err);

// Brings dst's bookkeeping to src's for the cells src changed since its last
// kv_prepare (and every cell after a clear); dst's K / V are untouched.
void pipeline_kv_follow(struct kv_cache *dst, const struct kv_cache *src);
// The same from arrays: cells [lo, hi) of pos, delta [hi-lo] and seq
// [hi-lo][seq_words], then head, used and the pending-shift flag.
void pipeline_kv_follow_range(struct kv_cache *dst, int lo, int hi, const int32_t *pos,
                              const int32_t *delta, const uint64_t *seq, int head, int used,
                              bool has_shift);

#endif
