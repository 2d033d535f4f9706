// The generation engine: opens a model (backend, weights, tokenizer, forward
// context with its KV cache) and runs llama-cli's generation loop: the prompt
// in chunks of n_batch, then one token at a time through the sampler, with
// context shift (--keep) or self-extend (--grp-attn-n/-w) when asked, for one
// sequence or for n_parallel sequences sharing the prompt's cells.
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
#include "host/args.h"
#include "host/backend.h"
#include "host/forward.h"
#include "host/model.h"
#include "host/sampler.h"
#include "host/tokenizer.h"

struct engine_open_params {
    int n_seq_max;       // sequences the cache holds (1)
    int n_outputs_max;   // rows wanting logits per decode (0: 1 per sequence)
    int n_ctx;           // 0: from the flags (args_resolve_ctx)
    bool need_tokenizer; // fail when the file has no tokenizer.ggml.* keys
};

struct engine {
    struct backend *be;
    struct model *m;
    struct tokenizer *tok; // NULL when the file has none and it was not needed
    struct forward_ctx fc;
    double t_load_ms; // open + load + upload + context
};

int engine_open(struct engine **out, const struct args_model *a, const struct engine_open_params *p,
                struct verr *err);
void engine_close(struct engine *e);

// Monotonic milliseconds.
double engine_now_ms(void);

struct engine_gen_params {
    int n_predict;  // -n: tokens to generate per sequence; < 0: until EOG / context end
    int n_parallel; // --parallel: sequences sampled from one prompt (1)
    bool ctx_shift; // --context-shift: when the context is full, drop half of it
    int n_keep;     // --keep: tokens kept at the start on a context shift (-1: all of
                    // the prompt); the BOS token is always kept
    int ga_n;       // --grp-attn-n: self-extend group factor (1: off)
    int ga_w;       // --grp-attn-w: self-extend width (512)
    struct sampler_params sp;
};

void engine_gen_params_default(struct engine_gen_params *g);

enum engine_event {
    ENGINE_EV_TOKEN, // a sampled token; text/len: its printable piece (maybe empty)
    ENGINE_EV_DONE,  // a sequence ended; text: why ("eog", "n_predict", "context full")
    ENGINE_EV_NOTE,  // a log line (context shift, self-extend); text: the line
};

// Return non-zero to stop generating (all sequences).
typedef int (*engine_event_fn)(void *user, enum engine_event ev, int seq, int32_t token,
                               const char *text, size_t len);

struct engine_stats {
    int n_prompt;     // prompt tokens evaluated
    int n_gen;        // tokens sampled (all sequences)
    int n_decode_gen; // decodes during generation
    double t_prompt_ms;
    double t_gen_ms;
    uint32_t seed; // the sampler seed used (of sequence 0)
    int n_ctx_shifts;
};

// Runs the loop over prompt[0..n_prompt) (n_prompt >= 1). The cache is
// cleared first. Errors: VERR_RANGE (prompt longer than n_ctx - 4, bad
// parameters), the forward pass's errors.
int engine_generate(struct engine *e, const int32_t *prompt, int n_prompt,
                    const struct engine_gen_params *g, engine_event_fn cb, void *user,
                    struct engine_stats *st, struct verr *err);

// Evaluates tokens as one sequence from position 0 in chunks of n_batch with
// every position's logits wanted; calls rows(user, first_pos, n, logits
// [n][n_vocab]) after each chunk. The cache is cleared first.
typedef int (*engine_rows_fn)(void *user, int first_pos, int n, const float *logits);
int engine_eval(struct engine *e, const int32_t *tokens, int n_tokens, engine_rows_fn rows,
                void *user, double *t_ms, struct verr *err);

// A summary of the model and context for --verbose, one line per entry,
// written into buf.
void engine_describe(const struct engine *e, char *buf, size_t cap);

#endif
