// The stages a model runs on, and the one decode driver. A model runs on one
// device (a pipeline of one stage) or split by layers into stages
// (--split-mode layer, --devices, --tensor-split): each stage holds a
// contiguous range of layers and their KV cache on its own backend; the
// hidden state goes from stage to stage through a transport
// (host/split/stage.h, NCCL, MPI); embeddings run on the first stage, the
// final norm and LM head on the last.
//
// pipeline_load plans the split and loads every stage into a struct
// pipeline, which owns every local stage (backend and weights) and the
// transport. A pipeline_ctx holds every local stage's forward context; the
// front one's cache (stage 0's, or this rank's) keeps the KV bookkeeping
// every caller edits (host/split/context.h). pipeline_decode claims the
// batch's cells on the front cache, brings every other stage's cache to the
// same cells (positions, deltas, sequence sets; after a kv_clear of the
// front, zeroing the stage's K/V too) and runs the stages; each stage
// applies the pending K shift to its own layers and replays its recorded
// graphs for small parts.
//
// Pipelining: a decode's batch is cut into micro-batches (--ubatch-size,
// default ceil(n_tok / n_stages)); micro-batch k+1 is enqueued on stage s
// right after micro-batch k was handed to stage s+1. Backends and transports
// that run asynchronously (CUDA streams, NCCL) overlap the stages; the CPU
// runs them one after the other and gives the same results.
//
// One process drives every local stage. With mpirun (host/split/mpi.h) each
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
#include "host/split/mpi.h"
#include "host/split/plan.h"
#include "host/split/stage.h"

struct pipeline_stage {
    struct backend_device dev; // the CPU, or a CUDA device
    char name[48];             // "cpu", "cuda:1", "rank2:cuda:0"
    int l0, l1;                // layers [l0, l1)
    struct backend *be;        // NULL when the stage runs in another process
    struct model *m;           // its layers (NULL when remote); stage 0's is the caller's
    bool owned;                // be and m belong to the pipeline
};

struct pipeline {
    int n_stages;
    struct pipeline_stage stage[PLAN_MAX_DEVICES];
    struct plan plan;
    char plan_text[4096];     // plan_format's lines, for --verbose and logs
    struct transport *tp;     // NULL with one stage
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

// Every local stage's forward context.
struct pipeline_ctx {
    struct pipeline *p;
    int front;                                // the first local stage: its cache decides
    struct forward_ctx *fc[PLAN_MAX_DEVICES]; // NULL: another process's stage
    uint8_t *how_logits;                      // [n_outputs_max] every row FORWARD_ROW_LOGITS
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

// Loads the model as lc says into *pipe: one device (a pipeline of one
// stage), or plans the split, creates every stage's backend and loads its
// layers; the pipeline owns every stage. cfg: the context the load must
// leave room for (n_ctx 0: the model's), as pipeline_plan.
int pipeline_load(const struct load_config *lc, const struct forward_config *cfg,
                  const struct gguf_file *f, struct pipeline **pipe, struct verr *err);
// pipeline_load with the load's progress (every stage's bytes as one total)
// and, for one device, the check of weights + KV cache + scratch against the
// backend's free memory before anything is allocated (a split is checked by
// its plan). cfg->n_outputs_max: logits rows the context will keep (0: n_batch).
int pipeline_load_ex(const struct load_config *lc, const struct forward_config *cfg,
                     const struct gguf_file *f, model_progress_fn progress, void *progress_user,
                     struct pipeline **pipe, struct verr *err);
// A pipeline of one stage over a backend and model the caller made (tests,
// benchmarks); own: the pipeline frees them (and does on failure).
int pipeline_wrap(struct pipeline **out, struct backend *be, struct model *m, bool own,
                  struct verr *err);
// What pipeline_load_ex checks a one-device load against, from host/split/plan.c's
// accounting for this context: lp's kv_bytes (n_ctx cells of every layer's K
// and V), scratch_bytes (activations of n_batch tokens, n_outputs_max logits
// rows, the cache's cell mirrors) and reserve_bytes (256 MiB on a GPU).
int pipeline_load_budget(const struct load_config *lc, const struct forward_config *cfg,
                         const struct gguf_file *f, const struct backend_device *d,
                         struct model_load_params *lp, struct verr *err);

// Frees the stages the pipeline owns and the transport.
void pipeline_free(struct pipeline *p);

// A context of cfg for every local stage.
int pipeline_ctx_init(struct pipeline_ctx **out, struct pipeline *p,
                      const struct forward_config *cfg, struct verr *err);
void pipeline_ctx_free(struct pipeline_ctx *pc);

// The decode driver (rank 0): claims the batch's cells on the front cache
// (forward_batch_begin), brings the other stages' caches along, runs every
// stage and leaves the results in the front context: fc->n_out rows,
// out_batch_idx, h_logits for LOGITS rows, h_argmax for the others. how and
// sp as forward_stage_run (how NULL: every row LOGITS; no SAMPLE row when
// the head runs in another process: VERR_UNSUPPORTED). On an error the
// cache is as it was before the call.
int pipeline_decode(struct pipeline_ctx *pc, const struct forward_batch *b, const uint8_t *how,
                    const struct sample_params *sp, struct verr *err);

// Multi-process: a rank other than 0 serves decodes for its stage until rank
// 0 frees the pipeline.
int pipeline_serve(struct pipeline_ctx *pc, struct verr *err);

#endif
