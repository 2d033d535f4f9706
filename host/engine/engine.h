// The generation engine: opens a model (backend, weights, tokenizer, forward
// context with its KV cache) and runs llama-cli's generation loop: the prompt
// in chunks of n_batch, then one token at a time through the sampler, with
// context shift (--keep) or self-extend (--grp-attn-n/-w), for one sequence
// or for many prompts decoded together in one cache (llama.cpp's parallel
// example: slots, continuous batching, a queue of prompts).
//
// Underneath is the step API (host/engine/step.h): requests submitted at any
// time, one batch per engine_step, cancel. engine_generate_batch,
// engine_generate and engine_eval_ex are loops over it (generate.c,
// engine.c) and must not be called while requests of the step API run.
//
// Contract: library code, never prints; text and events go through the
// callback. Timings are measured with CLOCK_MONOTONIC around the decodes
// (prompt) and around decode + sample (generation).
#ifndef VELA_HOST_ENGINE_H
#define VELA_HOST_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/backend/sampler.h"
#include "host/engine/core.h"
#include "host/engine/spec.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/tokenizer/tokenizer.h"

// What engine_open opens: the model, where it runs (load), and its context.
struct engine_config {
    struct load_config load;   // model path, backend, devices, threads (host/split/pipeline.h)
    struct forward_config ctx; // n_ctx (0: the model's, capped), n_batch, cache types, RoPE;
                               // n_seq_max: sequences the cache holds (0: 1);
                               // n_outputs_max: logits rows per decode (0: 1 per sequence)
    bool need_tokenizer;       // fail when the file has no tokenizer.ggml.* keys
    // Optional: the weights' progress to the backend (host/model/model.h); the
    // library never prints, tools/ draws the bar.
    model_progress_fn progress;
    void *progress_user;
};
void engine_config_default(struct engine_config *c);

int engine_open(struct engine **out, const struct engine_config *c, struct verr *err);
void engine_close(struct engine *e);
// Replaces the context (cache, scratch) with one for cfg, keeping the
// weights: `vela eval` sizes the cache once it knows the token count.
int engine_reopen(struct engine *e, const struct forward_config *cfg, struct verr *err);

// Context and sequences. The cache has n_ctx cells (-c) shared by up to
// n_parallel sequences decoded together; each sequence may use n_ctx /
// n_parallel of them (llama-server's per-slot context), so a sequence's
// output does not depend on what the others do: it is the output of a run
// of that prompt alone with -c n_ctx / n_parallel.
//
// Context shift (llama-cli): when a sequence (without self-extend) reaches
// n_past + 1 >= its context, the first n_keep tokens stay, half of the rest
// (n_discard = (n_past - n_keep) / 2) is removed and the remainder moved
// down by n_discard. n_keep follows llama-cli: -1 or more than the prompt
// keeps the whole prompt, else n_keep + 1 when the prompt starts with BOS.
struct engine_gen_params {
    int n_predict;            // -n: tokens to generate per sequence; -1: until EOG (forever with
                              // context shift); -2: until EOG or the context is full
    int n_parallel;           // --parallel: sequences decoded together (1)
    bool ctx_shift;           // context shift when a sequence's context is full (default: on);
                              // off: the sequence stops with "context full"
    int n_keep;               // --keep (0)
    int ga_n;                 // --grp-attn-n: self-extend group factor (1: off); excludes the
                              // context shift, as in llama-cli
    int ga_w;                 // --grp-attn-w: self-extend width (512)
    bool ignore_eos;          // --ignore-eos: end-of-generation tokens do not end a sequence
    struct sampler_params sp; // sequence i samples with seed sp.seed + i
    struct engine_spec spec;  // speculative decoding of every sequence (step.h, spec.h)
    // Optional: called with the logits row each sampled token is drawn from,
    // before sampling (pos: the position of the token that produced the row).
    // Setting it turns off picking tokens on the backend (the argmax shortcut of
    // greedy sampling, the sample op otherwise): every row comes to the host.
    int (*on_logits)(void *user, int seq, int32_t pos, const float *logits);
    void *logits_user;
};

void engine_gen_params_default(struct engine_gen_params *g);

struct engine_prompt {
    const int32_t *tokens; // [n_tokens]
    int n_tokens;          // >= 1
};

// A loop over the step API (host/engine/step.h; generate.c); the engine must
// have no request of its own running (VERR_RANGE).
// Generates for every prompt, at most g->n_parallel at a time, in one cache:
// llama.cpp's parallel example with continuous batching. Each step decodes
// together the next token of every generating sequence and the next chunk
// (n_batch tokens) of every prompt being read; prompts waiting in the queue
// start, in order, as soon as a sequence ends and frees its slot (its cells
// are removed with seq_rm). Prompts equal to one starting in the same step
// share its cells (seq_cp) when no shift can move them. The cache is
// cleared first.
// Errors, with the cache untouched: VERR_RANGE (a prompt longer than n_ctx /
// n_parallel - 4: "prompt is too long (N tokens, max M)", a token outside the
// vocabulary, n_parallel outside [1, the sequences the context was opened
// for], bad self-extend values); later: the forward pass's errors.
int engine_generate_batch(struct engine *e, const struct engine_prompt *prompts, int n_prompts,
                          const struct engine_gen_params *g, engine_event_fn cb, void *user,
                          struct engine_stats *st, struct verr *err);

// g->n_parallel samples of one prompt (sample i uses seed + i): engine_generate_batch
// over n_parallel copies of the prompt.
int engine_generate(struct engine *e, const int32_t *prompt, int n_prompt,
                    const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err);

// Evaluates tokens as one sequence in chunks of n_batch with every token's
// logits wanted; calls rows(user, first, n, logits [n][n_vocab]) after each
// chunk, first being the index of the chunk's first token. The cache is
// cleared first. With ga_n != 1, self-extend regroups the positions before
// each chunk as in engine_generate (p->cb gets its "shift:" / "div:" lines as
// ENGINE_EV_NOTE).
struct engine_eval_params {
    int ga_n; // 1: off
    int ga_w;
    engine_event_fn cb; // optional, for ENGINE_EV_NOTE
    void *user;
};
typedef int (*engine_rows_fn)(void *user, int first, int n, const float *logits);
int engine_eval_ex(struct engine *e, const int32_t *tokens, int n_tokens,
                   const struct engine_eval_params *p, engine_rows_fn rows, void *user,
                   double *t_ms, struct verr *err);
// engine_eval_ex without self-extend.
int engine_eval(struct engine *e, const int32_t *tokens, int n_tokens, engine_rows_fn rows,
                void *user, double *t_ms, struct verr *err);

// A summary of the model and context for --verbose, one line per entry,
// written into buf.
void engine_describe(const struct engine *e, char *buf, size_t cap);

#endif
