// The layer split plan (--split-mode layer): which device holds which
// contiguous range of layers, and how much memory each stage needs.
//
// A pure function of sizes: the bytes of each layer's weights, the KV cache
// and scratch a stage needs, the first stage's embedding table, the last
// stage's output norm and LM head, each device's free memory and the
// --tensor-split proportions. No backend, no file: tests run it on the CPU
// with made-up numbers.
//
// Semantics follow llama.cpp's layer split (llama_model_load, split_mode
// LAYER): proportions are normalised to a cumulative split, layer il goes to
// the first device whose cumulative share exceeds il / n_layer, so the ranges
// are contiguous and in device order. Without --tensor-split the proportions
// are each device's free memory. Differences from llama.cpp, on purpose:
// - a device whose proportion is 0 gets no layers and is not a stage; every
//   device with a proportion > 0 gets at least one layer (more such devices
//   than layers is an error, not a silently idle GPU);
// - the plan checks each stage's total (weights + its share of the KV cache
//   + scratch) against its device's free memory and refuses, naming the
//   device and both numbers, instead of failing later in cudaMalloc.
#ifndef VELA_HOST_PLAN_H
#define VELA_HOST_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/ops/backend.h"
#include "host/ops/transport.h"

#define PLAN_MAX_DEVICES TRANSPORT_MAX_STAGES

struct plan_input {
    int n_layer;
    const size_t *layer_bytes; // [n_layer] weights of layer il
    size_t kv_bytes_per_layer; // K + V of one layer for the whole context
    size_t embed_bytes;        // first stage only: token embedding table
    size_t head_bytes;         // last stage only: output norm + LM head (tied: the table again)
    size_t scratch_bytes;      // every stage: activations for one batch
    size_t head_scratch_bytes; // last stage only: logits rows
    size_t reserve_bytes;      // kept free on every device (allocator slack, CUDA context)
    int n_devices;             // 1..PLAN_MAX_DEVICES
    const char *const *device_names; // [n_devices] for messages ("cuda:0", "cpu"); NULL: "device i"
    const size_t *free_bytes;        // [n_devices]; BACKEND_MEM_UNLIMITED: no limit
    const float *split; // [n_devices] proportions (>= 0, sum > 0), or NULL: by free memory
};

struct plan_stage {
    int device;          // index into the input's devices
    int l0, l1;          // layers [l0, l1)
    size_t weight_bytes; // layers + embedding (first) + head (last)
    size_t kv_bytes;
    size_t scratch_bytes;
    size_t total_bytes; // weight + kv + scratch
    size_t free_bytes;  // the device's free memory (BACKEND_MEM_UNLIMITED: unknown / no limit)
};

struct plan {
    int n_stages;
    int n_layer;
    struct plan_stage stage[PLAN_MAX_DEVICES];
};

// Makes the plan. Errors (VERR_RANGE unless said): n_layer < 1, no devices or
// more than PLAN_MAX_DEVICES, a negative / non-finite proportion or all zero,
// more devices with a share than layers, VERR_NOMEM when a stage does not fit
// in its device's free memory (the message names the stage, its layers, the
// bytes needed and free, and what to try).
int plan_make(struct plan *out, const struct plan_input *in, struct verr *err);

// One line per stage ("stage 0: cuda:0  layers 0-15 (16)  weights 3.1 GiB  KV
// 256 MiB  scratch 40 MiB  total 3.4 GiB of 79.1 GiB free"), into buf.
void plan_format(const struct plan *p, const char *const *device_names, char *buf, size_t cap);

// Parses --tensor-split: numbers separated by ',' or '/' ("3,1", "0.6/0.4").
// Fewer values than devices is allowed (the rest are 0, as llama.cpp); *n gets
// the count. VERR_RANGE naming the bad value otherwise (not a number,
// negative, more than max values, all zero).
int plan_parse_split(const char *s, float *out, int max, int *n, struct verr *err);

// Parses --devices: entries separated by ','; each is "cpu", a CUDA ordinal
// ("0"), or "cudaN" / "CUDAN" / "cuda:N" (llama.cpp's names). A device may
// repeat ("cpu,cpu", "0,0": several stages on one device). VERR_RANGE naming
// the bad entry otherwise; existence is checked later (plan_check_devices).
int plan_parse_devices(const char *s, struct backend_device *out, int max, int *n,
                       struct verr *err);

// VERR_NOTFOUND when a CUDA device is not among the n_cuda visible ones (or
// VERR_UNSUPPORTED when vela was built without CUDA: built_with_cuda false).
int plan_check_devices(const struct backend_device *d, int n, int n_cuda, bool built_with_cuda,
                       struct verr *err);

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

#endif
