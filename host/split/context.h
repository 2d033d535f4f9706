// The context: what the engine decodes through, and the only way above this
// layer to the KV cache. It owns the stages a model runs on (one device is
// a pipeline of one stage, host/split/pipeline.h), every stage's forward
// context and recorded graphs, the KV bookkeeping (the front stage's cache;
// the others follow it at each decode) and the results of the last decode.
//
// A decode takes a plan: the batch, and for each entry that wants a row what
// comes back (logits on the host, the argmax, or a token sampled on the
// backend with the row's sampler parameters); a sequence may have several
// rows. It gives a result: the rows in batch order, their batch indices,
// ids and logits. Between decodes the caller edits the cache through the
// sequence functions and the KV policies below (they take effect at the
// next decode). llama.cpp's llama_decode + llama_memory_* and vLLM's
// scheduler output -> model runner output are the same shape.
//
// Contract: not thread-safe; one thread decodes and edits. Errors leave the
// cache as it was.
#ifndef VELA_HOST_SPLIT_CONTEXT_H
#define VELA_HOST_SPLIT_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "gguf/verr.h"
#include "host/forward/forward.h"
#include "host/split/pipeline.h"
#include "kv/policy.h"

struct context;

// Loads the model as lc says (pipeline_load_ex) and makes a context of cfg
// over it, which owns the load.
int context_open(struct context **out, const struct load_config *lc,
                 const struct forward_config *cfg, const struct gguf_file *f,
                 model_progress_fn progress, void *progress_user, struct verr *err);
// A context of cfg (resolved against the model: forward_config_resolve)
// over a loaded pipeline. own: the context frees p when freed (and here on
// failure); otherwise p is borrowed and must outlive it (engine_reopen and
// benchmarks make several contexts over one load).
int context_create(struct context **out, struct pipeline *p, const struct forward_config *cfg,
                   bool own, struct verr *err);
void context_free(struct context *c);

// Under mpirun, a rank other than 0: loads this rank's stage as lc / cfg
// say (the flags rank 0 got), takes rank 0's context shape and serves its
// decodes until rank 0 frees its context.
int context_serve_rank(const struct load_config *lc, const struct forward_config *cfg,
                       struct verr *err);

// --- what the context is
// The front stage's model: hparams, name (its own layers only when split).
const struct model *context_model(const struct context *c);
const struct forward_config *context_config(const struct context *c); // as resolved
const struct rope_params *context_rope(const struct context *c);
// K and V bytes of the whole cache (every layer, every cell).
double context_kv_bytes(const struct context *c);
const char *context_backend_name(const struct context *c); // the front stage's
// The split's plan and transport, or NULL with one stage.
const char *context_describe(const struct context *c);
// Whether FORWARD_ROW_SAMPLE rows can be decoded: not when the last stage
// runs in another process (sample rows are not sent there).
bool context_can_sample(const struct context *c);
// The stages (benchmarks read their times, tests their caches).
struct pipeline *context_pipeline(const struct context *c);
// Stage s's forward context, NULL when it runs in another process.
const struct forward_ctx *context_stage(const struct context *c, int s);
// Graph counts of every local stage added up.
struct forward_graph_stats context_graph_stats(const struct context *c);

// --- decoding
struct context_plan {
    struct forward_batch batch; // batch.logits says which entries give a row (NULL: the last)
    const uint8_t *how;         // [rows] enum forward_row of each row, batch order; NULL: LOGITS
    const struct sample_params *sp; // [rows] the SAMPLE rows' parameters (host memory; a
                                    // retried decode passes the same, whose draws were taken once)
};

struct context_result {
    int n_rows;
    int n_vocab;
    const int32_t *batch_idx; // [n_rows] the batch entry of each row
    const int32_t *ids;       // [n_rows] the token of each ARGMAX / SAMPLE row
    const float *logits;      // [n_rows][n_vocab] each LOGITS row's logits
};

// Decodes the plan; *res (optional) points into the context until the next
// decode. Errors: VERR_RANGE (a token outside the vocabulary, a negative
// position, a bad seq id, a batch outside [1, n_batch], more rows than
// n_outputs_max, a SAMPLE row without parameters), VERR_FULL (no contiguous
// room in the KV cache: retry with a smaller batch), VERR_UNSUPPORTED (SAMPLE
// rows with the head in another process), or the backend's error; the
// cache is then as before the call.
int context_decode(struct context *c, const struct context_plan *plan, struct context_result *res,
                   struct verr *err);
// context_decode of the batch with every row LOGITS.
int context_decode_logits(struct context *c, const struct forward_batch *b,
                          struct context_result *res, struct verr *err);
// The last decode's result.
void context_last_result(const struct context *c, struct context_result *res);

static inline const float *context_row_logits(const struct context_result *res, int r) {
    return res->logits + (size_t)r * (size_t)res->n_vocab;
}

// --- the cache: kv/kv.h's sequence operations on the context's cells
int context_clear(struct context *c, struct verr *err);
int context_seq_rm(struct context *c, int seq, int32_t p0, int32_t p1, struct verr *err);
int context_seq_cp(struct context *c, int src, int dst, int32_t p0, int32_t p1, struct verr *err);
int context_seq_keep(struct context *c, int seq, struct verr *err);
int context_seq_add(struct context *c, int seq, int32_t p0, int32_t p1, int32_t delta,
                    struct verr *err);
int context_seq_div(struct context *c, int seq, int32_t p0, int32_t p1, int d, struct verr *err);
int32_t context_seq_pos_max(const struct context *c, int seq);
int context_cells_used(const struct context *c);

// --- KV policies (kv/policy.h) over the context's cache
int context_policy_init(const struct context *c, struct kv_policy *pol,
                        const struct kv_policy_params *pp, int seq, int n_ctx_seq,
                        struct verr *err);
int context_policy_before_batch(struct context *c, struct kv_policy *pol, int32_t *n_past,
                                struct verr *err);
int context_policy_make_room(struct context *c, struct kv_policy *pol, int32_t *n_past,
                             int *n_cells, int32_t *n_discard, struct verr *err);

#endif
