// Shared command-line flags of the model-running commands (run, eval,
// bench): model, backend, threads, context, batch, KV cache types, RoPE
// overrides, and the sampler flags, with llama.cpp's names and defaults.
//
// Contract: the parsers never print and never exit. Each looks at argv[*i];
// when it is one of its flags it consumes the flag and its value, advances
// *i past them and returns 1; when the flag belongs to someone else it
// returns 0 and leaves *i alone; a missing or bad value ("--temp abc") is
// VERR_RANGE with a message naming the flag. Commands try each group in turn
// and report whatever nobody claimed as unknown (usage error, exit 2).
#ifndef VELA_HOST_ARGS_H
#define VELA_HOST_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "host/backend/sampler.h"
#include "host/engine/engine.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/pipeline.h"

struct args_model {
    const char *model_path;     // -m, --model
    enum load_backend backend;  // --backend cpu|cuda
    int device;                 // --device N (CUDA ordinal, 0)
    int n_threads;              // -t, --threads (0: all cores)
    int n_ctx;                  // -c, --ctx-size (0: the model's, capped at FORWARD_CTX_CAP)
    int n_batch;                // -b, --batch-size (512)
    enum ggml_type type_k;      // --cache-type-k f32|f16 (f16)
    enum ggml_type type_v;      // --cache-type-v f32|f16 (f16)
    struct rope_overrides rope; // --rope-* / --yarn-*
    bool verbose;               // --verbose, -v
    bool no_progress;           // --no-progress: no load progress on stderr
    bool no_cuda_graph;         // --no-cuda-graph (forward_config.no_graph)
    bool k_unrotated;           // --kv-unrotated (forward_config.k_unrotated)
    int matvec_act;             // --matvec-act q8|f32: backend.act_q8 (BACKEND_ACT_*)
    // Several devices (host/pipeline.h), llama.cpp's flags. --main-gpu / -mg sets `device`.
    int split_mode;           // --split-mode layer|none (LOAD_SPLIT_*; layer by default)
    const char *tensor_split; // --tensor-split, -ts "3,1"; NULL: by free memory
    const char *devices;      // --devices, -dev "0,1" / "cpu,cpu"; NULL: every GPU
    int n_ubatch;             // --ubatch-size, -ub: pipeline micro-batch (0: auto)
    // --self-extend G W, -se: exact self-extend (host/ops/selfextend.h); 0: off
    int se_g, se_w;
};

void args_model_default(struct args_model *a);
int args_parse_model(struct args_model *a, int argc, char **argv, int *i, struct verr *err);
void args_help_model(FILE *out);
// The same with the -c line's text after the flag replaced by ctx_text (a
// command whose -c 0 means something else; NULL: the usual text).
void args_help_model_ctx(FILE *out, const char *ctx_text);

// --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n
// --presence-penalty --frequency-penalty --seed (-s)
int args_parse_sampler(struct sampler_params *s, int argc, char **argv, int *i, struct verr *err);
void args_help_sampler(FILE *out);

// Value helpers for a command's own flags: read argv[*i + 1] as the value
// of flag argv[*i], advance *i by 2. VERR_RANGE with "FLAG: ..." otherwise.
int args_value_str(int argc, char **argv, int *i, const char **out, struct verr *err);
int args_value_int(int argc, char **argv, int *i, long min, long max, int *out, struct verr *err);
int args_value_float(int argc, char **argv, int *i, float *out, struct verr *err);
// A flag equal to `name` or `alias` (alias may be NULL).
bool args_is(const char *arg, const char *name, const char *alias);

// The library's configuration from the flags: where and how the model runs
// (host/split/pipeline.h) and the context (host/forward/forward.h; n_ctx 0
// stays 0, the model's context capped at FORWARD_CTX_CAP, resolved when the
// model is known).
void args_load_config(const struct args_model *a, struct load_config *lc);
void args_ctx_config(const struct args_model *a, struct forward_config *fc);
// With --self-extend: checks a prompt of n_prompt tokens against the
// extended context (n_ctx_train - W) * G + W of hp and the cache (n_ctx
// cells), VERR_RANGE with a message when it does not fit; with verbose,
// prints the extension to `out`. Without the flag it does nothing.
int args_selfextend_check(const struct args_model *a, const struct model_hparams *hp, int n_ctx,
                          int n_prompt, FILE *out, struct verr *err);
// Both, into an engine config (engine_config_default for the rest).
void args_engine_config(const struct args_model *a, struct engine_config *c);

// Under mpirun, a rank other than 0 serves its pipeline stage with the
// model flags of the command line (the others belong to rank 0): returns
// true and sets *status (the exit status); false on rank 0 or outside mpirun.
bool args_mpi_worker(int argc, char **argv, int *status);

#endif
