// The engine's state and the types its parts share: struct engine, the
// events requests report, the statistics. engine.h (open, close, the loops)
// and step.h (the step API) both stand on it; neither includes the other's
// implementation.
#ifndef VELA_HOST_ENGINE_CORE_H
#define VELA_HOST_ENGINE_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "host/model/model.h"
#include "host/split/context.h"
#include "host/tokenizer/tokenizer.h"

struct engine_sched;

struct engine {
    struct pipeline *weights;   // the model on one device or several (owned)
    struct context *ctx;        // decodes over weights: the KV cache, config, results
    const struct model *m;      // context_model(ctx): hparams, name
    struct tokenizer *tok;      // NULL when the file has none and it was not needed
    struct engine_sched *sched; // the step API's slots and queue (step.h); NULL until used
    struct engine *draft;       // speculative decoding's draft model (draft.h, owned); NULL: none
    double t_load_ms;           // open + load + upload + context
};

// Monotonic milliseconds.
static inline double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

enum engine_event {
    ENGINE_EV_TOKEN, // a sampled token; text/len: its printable piece (maybe empty);
                     // token -1: text the stream held back, flushed at the end
    ENGINE_EV_DONE,  // a sequence ended; text: why ("eog", "n_predict", "context full",
                     // "stopped"); token: its last token
    ENGINE_EV_NOTE,  // a log line (self-extend rounds, sequence starts); text: the line
    ENGINE_EV_SHIFT, // a context shift of sequence seq; token: n_discard; text: a line
};

// Return non-zero to stop generating (all sequences). seq is the index of
// the prompt (engine_generate_batch) or of the sample (engine_generate).
typedef int (*engine_event_fn)(void *user, enum engine_event ev, int seq, int32_t token,
                               const char *text, size_t len);

struct engine_stats {
    int n_prompt;       // prompt tokens evaluated (a prompt shared by samples counts once)
    int n_gen;          // tokens sampled (all sequences)
    int n_gen_backend;  // of those, picked on the backend (argmax or sample op) from rows
                        // that never came to the host
    int n_decode_gen;   // decode steps that carried generated tokens
    int n_seq;          // sequences finished
    double t_prompt_ms; // decode time of prompt tokens (a step with both kinds is split
                        // by token count)
    double t_gen_ms;    // decode time of generated tokens + sampling
    double t_total_ms;  // the whole loop
    uint32_t seed;      // the sampler seed used by sequence 0
    int n_ctx_shifts;   // all sequences
    int n_batch_splits; // decodes retried with a smaller batch (fragmented cache)
    int n_drafted;      // draft tokens verified (speculative decoding)
    int n_accepted;     // of those, kept
};

#endif
