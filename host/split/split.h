// Opening a model for the engine: loads it on one device or as a pipeline of
// stages (host/split/pipeline.h) and gives an executor over it
// (host/forward/executor.h), so the layers above never know which.
#ifndef VELA_HOST_SPLIT_SPLIT_H
#define VELA_HOST_SPLIT_SPLIT_H

#include <stdbool.h>

#include "gguf/gguf.h"
#include "gguf/verr.h"
#include "host/forward/executor.h"
#include "host/split/pipeline.h"

// Loaded weights: one backend and its model, or a pipeline owning every
// stage (then be and m are stage 0's, or this rank's under mpirun).
struct split_model {
    struct pipeline *pipe; // NULL: one device
    struct backend *be;
    struct model *m;
};

// pipeline_load_ex into *sm.
int split_load(struct split_model *sm, const struct load_config *lc,
               const struct forward_config *cfg, const struct gguf_file *f,
               model_progress_fn progress, void *progress_user, struct verr *err);
// Frees what split_load loaded; safe on a zeroed struct.
void split_model_free(struct split_model *sm);

// An executor over sm with a context of cfg, resolved against the model
// (forward_config_resolve: n_ctx 0 is the model's, n_batch at most n_ctx). own: the
// executor takes sm's contents (freed when it is destroyed, or here on
// failure; *sm is zeroed either way); otherwise it borrows them (a benchmark
// makes one executor per test over one load).
int split_executor_create(struct executor **out, struct split_model *sm,
                          const struct forward_config *cfg, bool own, struct verr *err);
// split_load, then split_executor_create owning what was loaded.
int split_open(struct executor **out, const struct load_config *lc,
               const struct forward_config *cfg, const struct gguf_file *f,
               model_progress_fn progress, void *progress_user, struct verr *err);

// The pipeline below x, or NULL with one device (benchmarks read its stage
// times, tests its stages); its contexts (every stage's cache), or NULL.
struct pipeline *split_pipeline(const struct executor *x);
struct pipeline_ctx *split_pipeline_ctx(const struct executor *x);

#endif
