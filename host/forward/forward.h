// The one forward pass, written against struct backend_ops: a batch of
// (token, pos, seq_id, wants_logits) entries goes through
//   embed (x sqrt(n_embd): gemma3)
//   -> [rms_norm -> q,k,v (+bias) -> per-head q/k rms_norm (qwen3, gemma3)
//       -> rope(q) -> rope_kv_store(k, v) -> attention over the KV cache
//       (through the sliding window on gemma3's local layers, which rotate
//       with their own RoPE base) -> out proj (-> rms_norm: gemma3) + residual
//       -> rms_norm -> swiglu or geglu(gate, up) -> down (-> rms_norm) +
//       residual, or with experts: rms_norm -> router -> moe_route ->
//       moe_ffn (+ the gated shared expert: qwen2moe) + residual] x n_layer
//   -> rows that want logits -> final norm -> lm head -> per row: the logits,
//      their argmax, or the token the backend's sample op picks. q,k,v, gate/up +
// swiglu/geglu and proj + residual are the backend's fused matmul ops (one
// launch each for CUDA decode batches). Which optional steps run is the
// architecture's table (host/model/arch.h, struct arch_block).
//
// A struct forward_ctx is one stage's context: its layers' KV cache and
// scratch. The decode driver (host/split/pipeline.c, for one stage or
// several) runs a decode as forward_batch_begin on the front stage, then per
// stage forward_stage_upload and forward_stage_run for each micro-batch, and
// forward_stage_download on the last; host/split/context.h is what the
// engine calls.
//
// Contract: scratch buffers are sized for n_batch tokens and n_outputs_max
// output rows when the context is created and never reallocated; a batch
// larger than that is refused (callers split prompts into chunks of
// n_batch).
#ifndef VELA_HOST_FORWARD_H
#define VELA_HOST_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "kv/kv.h"

// RoPE settings from the command line, with llama.cpp's "not set" values;
// forward_rope_resolve merges them with the model's hparams as llama.cpp's
// context creation does.
struct rope_overrides {
    int scaling;            // --rope-scaling; ROPE_SCALING_UNSPECIFIED: the model's
    float freq_base;        // --rope-freq-base; 0: the model's
    float freq_scale;       // --rope-freq-scale (or 1/--rope-scale); 0: the model's
    int yarn_orig_ctx;      // --yarn-orig-ctx; 0: the model's
    float yarn_ext_factor;  // --yarn-ext-factor; < 0: 1 for yarn, else 0
    float yarn_attn_factor; // --yarn-attn-factor (1); multiplied by the model's attn_factor
    float yarn_beta_fast;   // --yarn-beta-fast (32)
    float yarn_beta_slow;   // --yarn-beta-slow (1)
};

void rope_overrides_default(struct rope_overrides *o);
// Fills rp for model m; rp->freq_factors = m->rope_freqs.
void forward_rope_resolve(const struct model *m, const struct rope_overrides *o,
                          struct rope_params *rp);

#define FORWARD_CTX_CAP 4096 // n_ctx 0: the model's trained context, at most this

struct forward_config {
    int n_ctx;             // KV cells; 0: the model's n_ctx_train, at most FORWARD_CTX_CAP
    int n_batch;           // most tokens per decode, >= 1
    int n_outputs_max;     // most rows wanting logits per decode; 0: n_batch
    int n_seq_max;         // sequence ids 0..n_seq_max-1; 0: 1
    enum ggml_type type_k; // F16 (default), F32, or a quantized type the backend runs (kv.h)
    enum ggml_type type_v;
    struct rope_overrides rope;
    // --no-cuda-graph (or VELA_NO_CUDA_GRAPH=1 in the environment): never
    // record decode steps into backend graphs (see forward.c, "graphs").
    bool no_graph;
    // The unrotated cache mode (host/ops/selfextend.h): K is stored without
    // rotation and attention applies RoPE to q and K; a KV shift (seq_add,
    // context shift) is then a metadata update, K is never rewritten.
    bool k_unrotated;
    // Exact self-extend (host/ops/selfextend.h): group size G and neighbor
    // window W. se_g <= 1: off. se_g > 1 turns k_unrotated on and needs
    // 1 <= se_w < n_ctx_train; n_ctx 0 then sizes the cache for the extended
    // context (n_ctx_train - W) * G + W (forward_selfextend_ctx).
    int se_g, se_w;
    // --no-attn-rot (or VELA_ATTN_ROT_DISABLE=1, as llama.cpp's
    // LLAMA_ATTN_ROT_DISABLE): no Hadamard rotation of a quantized cache
    // (forward_ctx.rot_k / rot_v).
    bool no_attn_rot;
};

// Parts of at most this many tokens are recorded into backend graphs (the
// mat-vec path of the CUDA backend) and replayed.
#define FORWARD_GRAPH_MAX_TOK 8
// Graphs kept per context (least recently used ones are destroyed).
#define FORWARD_GRAPH_CACHE 32

// One recorded part of a decode (struct forward_part): tokens [t0, t0+n_tok),
// output rows [r0, r0+n_out), attention over n_kv cells (a multiple of
// BACKEND_KV_BUCKET or n_ctx); bit i of argmax: row r0+i ends in its argmax.
struct forward_graph {
    void *exec; // the backend's; NULL: the slot is free
    int t0, n_tok, r0, n_out, n_kv;
    uint32_t argmax;
    uint64_t last_use;
};

struct forward_graph_stats {
    int64_t recorded; // graphs recorded (evicted or stale ones included)
    int64_t replays;  // steps run by replaying a graph
    int64_t eager;    // graph-eligible steps run eagerly (recording failed)
    int live;         // graphs held now (<= FORWARD_GRAPH_CACHE)
};

void forward_config_default(struct forward_config *c);
// Checks exact self-extend's G and W against hp (VERR_RANGE with a message
// naming them: G < 1, W < 1, W >= n_ctx_train) and gives the context it
// makes usable, (n_ctx_train - W) * G + W (n_ctx_train when G == 1).
int forward_selfextend_ctx(const struct model_hparams *hp, int se_g, int se_w, int *n_ctx_out,
                           struct verr *err);
// Fills in what depends on the model: n_ctx 0 becomes the model's context
// (at most FORWARD_CTX_CAP), and n_batch is capped at n_ctx (a batch never
// needs more cells than the context has; llama.cpp caps it too).
void forward_config_resolve(struct forward_config *c, const struct model_hparams *hp);

struct forward_batch {
    int n_tok;
    const int32_t *token; // [n_tok]
    const int32_t *pos;   // [n_tok]
    const int32_t *seq;   // [n_tok]
    const int8_t *logits; // [n_tok] non-zero: this entry wants logits; NULL: the last only
    // Exact self-extend per token (host/ops/selfextend.h), for contexts in
    // the unrotated cache mode (cfg.k_unrotated, or cfg.se_g > 1): se[2t] is
    // token t's group size G >= 1 (1: ordinary attention) and se[2t + 1] its
    // neighbor window W (1 <= W < n_ctx_train when G > 1). Sequences of one
    // batch may so use different values (K is cached unrotated); a sequence
    // keeps its values, since the K/V of later layers come from earlier
    // layers' attention. NULL: cfg.se_g / se_w for every token.
    const int32_t *se; // [n_tok][2] or NULL
};

struct forward_ctx {
    const struct model *m;
    struct backend *be; // the model's
    struct forward_config cfg;
    struct rope_params rope;
    struct rope_params rope_swa; // sliding-window layers' (host/model/model.h)
    float attn_scale;            // 1/sqrt(head_dim), or the architecture's
    struct kv_cache kv;
    // The attention rotation of a quantized cache (llama.cpp's attn_rot_k /
    // attn_rot_v; backend_attn_rot_block): rot_k > 0: q and k are
    // Hadamard-rotated after RoPE with that block, so K is cached rotated
    // (not in the unrotated cache mode, where attention applies RoPE to the
    // cached K itself); rot_v > 0: v is rotated before the store and the
    // attention output rotated back. Attention scores and outputs are those
    // of the unrotated vectors (H is orthonormal and symmetric); what
    // changes is the quantization error, spread over each block. 0: off.
    int rot_k, rot_v;

    // backend scratch, sized once for n_batch tokens / n_out output rows
    float *x;          // [n_batch][n_embd] residual stream
    float *xn;         // [n_batch][n_embd] normed input of a sub-block
    float *q;          // [n_batch][n_head*head_dim]
    float *k;          // [n_batch][n_head_kv*head_dim]
    float *v;          // [n_batch][n_head_kv*head_dim_v]
    float *attn;       // [n_batch][n_head*head_dim_v]
    float *gate;       // [n_batch][n_ff]; with experts [n_batch][n_ff_shexp] or NULL
    float *up;         // likewise
    float *xo;         // [n_out][n_embd] rows that want logits
    float *logits;     // [n_out][n_vocab]
    int32_t *d_tok;    // [n_batch]
    int32_t *d_pos;    // [n_batch]
    int32_t *d_seq;    // [n_batch]
    int32_t *d_cells;  // [n_batch]
    int32_t *d_rows;   // [n_out]
    int32_t *d_argmax; // [n_out]
    int32_t *d_se;     // [n_batch][2] each token's (G, W); the unrotated cache mode only
    int se_default_n;  // leading entries of d_se that hold cfg's (G, W) (batches without se)

    // backend scratch of blocks with experts (hp.n_expert > 0; NULL elsewhere)
    float *router;     // [n_batch][n_expert] router logits
    int32_t *moe_ids;  // [n_batch][n_expert_used] each token's experts
    float *moe_w;      // [n_batch][n_expert_used] their weights
    float *moe_out;    // [n_batch][n_embd] the routed (+ shared) feed-forward's output
    float *moe_tmp;    // [BACKEND_MOE_TMP(n_batch, n_expert_used, n_embd, n_ff_exp)]
    float *shexp_gate; // [n_batch] the shared expert's gate logit (qwen2moe), else NULL

    // host results of the last decode
    int n_out;              // rows that wanted logits
    int32_t *out_batch_idx; // [n_out] batch index of output row r
    float *h_logits;        // [n_out][n_vocab] rows of FORWARD_ROW_LOGITS
    int32_t *h_argmax;      // [n_out] ids of FORWARD_ROW_ARGMAX / _SAMPLE rows
    int32_t *h_cells;       // [n_batch] scratch
    int32_t *h_rows;        // [n_out] scratch
    int32_t *h_se;          // [n_batch][2] scratch: cfg's (G, W) per token (unrotated mode)
    // Recorded decode steps (backend graph ops; see forward.c, "graphs").
    bool graphs_on;      // the backend has graph ops and they were not disabled
    int graph_fail_run;  // recordings failed in a row; graphs go off at a limit
    uint64_t graph_tick; // LRU clock
    struct forward_graph graphs[FORWARD_GRAPH_CACHE];
    struct forward_graph_stats graph_stats;
};

// Backend bytes of the scratch forward_init allocates for blocks with
// experts (router logits, ids, weights, output, moe_ffn's scratch, the shared
// expert's gate) for n_batch tokens; 0 for a dense model. The dense buffers
// gate and up are n_ff_shexp wide then (forward_ctx).
size_t forward_moe_scratch_bytes(const struct model_hparams *hp, size_t n_batch);

int forward_init(struct forward_ctx *fc, const struct model *m, const struct forward_config *cfg,
                 struct verr *err);
// forward_init for the front stage of a pipeline whose last stage runs in
// another process: it also keeps the head's buffers (the last stage's
// logits and ids land there) when m has no head.
int forward_init_front(struct forward_ctx *fc, const struct model *m,
                       const struct forward_config *cfg, struct verr *err);
void forward_free(struct forward_ctx *fc);

// What a decode gives back for one output row.
enum forward_row {
    FORWARD_ROW_LOGITS = 0, // the logits row, on the host
    FORWARD_ROW_ARGMAX = 1, // its argmax only (the logits stay on the backend)
    FORWARD_ROW_SAMPLE = 2, // the token ops->sample picks with the row's sample_params
};

// The first half of every decode, on the front stage (the one whose cache
// keeps the bookkeeping): checks the batch (b->se included), lists its
// output rows (fc->h_rows and fc->out_batch_idx, *n_out of them) and claims
// its cells (fc->h_cells, kv_find_slot). Errors: VERR_RANGE (a token id
// outside the vocabulary, a negative position, a bad seq id, n_tok outside
// [1, n_batch], too many outputs), VERR_FULL (no room in the KV cache); on
// an error nothing was claimed. After a later failure, forward_batch_undo
// gives the cells back.
int forward_batch_begin(struct forward_ctx *fc, const struct forward_batch *b, int *n_out,
                        struct verr *err);
void forward_batch_undo(struct forward_ctx *fc, const struct forward_batch *b);

// --- one stage's part of a decode. Token ranges [t0, t0+n) index the batch;
// the residual stream of token t is row t of fc->x, so micro-batches of one
// decode never share rows and can be in flight on several stages at once.

// kv_prepare on fc's cache (the pending shift, the mirrors), then uploads the
// batch's tokens, positions, seq ids, cells [n_tok], output rows [n_out]
// (batch indices, ascending) and, in the unrotated cache mode, each token's
// self-extend G and W (b->se or the context's).
int forward_stage_upload(struct forward_ctx *fc, const struct forward_batch *b,
                         const int32_t *cells, const int32_t *rows, int n_out, struct verr *err);

// One micro-batch on one stage.
struct forward_part {
    int t0, n;  // tokens [t0, t0+n) of the batch
    int r0, nr; // the output rows among them: [r0, r0+nr) (head only)
    bool embed; // first stage: x rows = the tokens' embeddings
    bool head;  // last stage: final norm, LM head and each row's result
};
// Runs the part: embed, fc's layers [m->layer_begin, m->layer_end) over x
// rows [t0, t0+n), the head. how[r] (enum forward_row, [n_out]; NULL: every
// row LOGITS) says what row r gives: logits rows stay in fc->logits, ARGMAX
// and SAMPLE rows leave their id in fc->d_argmax (SAMPLE with sp[r], host
// memory, [n_out]; a retried decode passes the same sp, whose draws were
// taken once). Parts of at most FORWARD_GRAPH_MAX_TOK tokens replay a
// recorded graph when the backend has them (see forward.c, "graphs").
int forward_stage_run(struct forward_ctx *fc, const struct forward_part *pt, const uint8_t *how,
                      const struct sample_params *sp, struct verr *err);
// Downloads the n_out rows' results (last stage): LOGITS rows into h_logits
// [n_out][n_vocab] (their rows), the others' ids into h_ids [n_out]; then
// waits for fc's backend.
int forward_stage_download(struct forward_ctx *fc, int n_out, const uint8_t *how, float *h_logits,
                           int32_t *h_ids, struct verr *err);

#endif
