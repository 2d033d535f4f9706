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
#include "host/backend.h"
#include "host/forward.h"
#include "host/model.h"
#include "host/sampler.h"

enum args_backend {
    ARGS_BACKEND_AUTO = 0, // cuda when a GPU is usable, else cpu
    ARGS_BACKEND_CPU = 1,
    ARGS_BACKEND_CUDA = 2,
};

#define ARGS_CTX_CAP 4096 // -c 0 (default): the model's context, at most this

struct args_model {
    const char *model_path;     // -m, --model
    enum args_backend backend;  // --backend cpu|cuda
    int device;                 // --device N (CUDA ordinal, 0)
    int n_threads;              // -t, --threads (0: all cores)
    int n_ctx;                  // -c, --ctx-size (0: the model's, capped at ARGS_CTX_CAP)
    int n_batch;                // -b, --batch-size (512)
    enum ggml_type type_k;      // --cache-type-k f32|f16 (f16)
    enum ggml_type type_v;      // --cache-type-v f32|f16 (f16)
    struct rope_overrides rope; // --rope-* / --yarn-*
    bool verbose;               // --verbose, -v
    bool no_progress;           // --no-progress: no load progress on stderr
    bool no_cuda_graph;         // --no-cuda-graph (forward_config.no_graph)
    int matvec_act;             // --matvec-act q8|f32: backend.act_q8 (ARGS_ACT_*)
    // Several devices (host/pipeline.h), llama.cpp's flags. --main-gpu / -mg sets `device`.
    int split_mode;           // --split-mode layer|none (ARGS_SPLIT_*; layer by default)
    const char *tensor_split; // --tensor-split, -ts "3,1"; NULL: by free memory
    const char *devices;      // --devices, -dev "0,1" / "cpu,cpu"; NULL: every GPU
    int n_ubatch;             // --ubatch-size, -ub: pipeline micro-batch (0: auto)
};

enum args_split_mode {
    ARGS_SPLIT_LAYER = 0, // contiguous layer ranges per device (the default)
    ARGS_SPLIT_NONE = 1,  // everything on --main-gpu
    ARGS_SPLIT_ROW = 2,   // llama.cpp's row split: refused
};

enum args_act {
    ARGS_ACT_DEFAULT = 0, // the backend's own default
    ARGS_ACT_Q8 = 1,      // 8-bit activations, integer dots (backend.act_q8 on)
    ARGS_ACT_F32 = 2,     // f32 activations (act_q8 off)
};

void args_model_default(struct args_model *a);
int args_parse_model(struct args_model *a, int argc, char **argv, int *i, struct verr *err);
void args_help_model(FILE *out);

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

// The backend the flags ask for: --backend cuda without CUDA (or without a
// GPU) is an error saying so; auto takes cuda when a GPU is usable.
int args_backend_create(const struct args_model *a, struct backend **out, struct verr *err);
// Applies the flags that tune a created backend (--matvec-act): every stage's
// backend gets the same settings.
void args_backend_tune(const struct args_model *a, struct backend *be);
// The context size to use: -c, or the model's context capped at ARGS_CTX_CAP.
int args_resolve_ctx(const struct args_model *a, const struct model_hparams *hp);
// A forward config from the flags (n_ctx resolved against hp).
void args_forward_config(const struct args_model *a, const struct model_hparams *hp,
                         struct forward_config *fc);

#endif
