// The sampler: llama.cpp's default chain
//   penalties -> top_k -> top_p -> min_p -> temp -> dist
// over one row of logits, with a small seeded PRNG (xoshiro256**) so that a
// given seed always gives the same tokens for the same logits.
//
// With a grammar (host/grammar/grammar.h) the chain runs as llama.cpp's
// common_sampler runs it: first over every candidate as usual; only when the
// grammar refuses the token picked are the candidates cut down to the tokens
// the grammar allows (a walk of the vocabulary's token trie, not a check of
// every token) and the chain run again with a fresh draw.
//
// temp <= 0 is greedy: penalties are still applied, then the largest logit
// wins (lowest id on ties). The individual steps are exported so tests can
// check each against hand-computed distributions.
#ifndef VELA_HOST_SAMPLER_H
#define VELA_HOST_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/grammar/grammar.h"

#define SAMPLER_SEED_RANDOM 0xFFFFFFFFu // llama.cpp's LLAMA_DEFAULT_SEED: pick one at random

// One entry of a logit bias (llama.cpp's --logit-bias, OpenAI's
// logit_bias): bias is added to the token's logit before every other step
// of the chain; -INFINITY: the token is never picked. Entries of one token
// add up.
struct sampler_bias {
    int32_t token;
    float bias; // finite, or -INFINITY
};
#define SAMPLER_MAX_BIAS 4096 // entries per sampler

struct sampler_params {
    float temp;                      // 0.8; <= 0: greedy
    int top_k;                       // 40; <= 0: off
    float top_p;                     // 0.95; >= 1: off
    float min_p;                     // 0.05; <= 0: off
    float repeat_penalty;            // 1.0 (off)
    int repeat_last_n;               // 64; 0: off, -1: the whole context (the caller passes n_ctx)
    float presence_penalty;          // 0.0
    float frequency_penalty;         // 0.0
    uint32_t seed;                   // SAMPLER_SEED_RANDOM
    const struct sampler_bias *bias; // [n_bias] (sampler_create copies it); NULL: none
    int n_bias;                      // 0 .. SAMPLER_MAX_BIAS
    // A grammar the output must match (NULL: none): sampler_create takes a
    // reference, so the caller may free its own right after. grammar_vocab:
    // the model's token trie (grammar_vocab_new, built once per model and
    // shared by every sampler), required with a grammar, outliving them all.
    struct grammar *grammar;
    const struct grammar_vocab *grammar_vocab;
};

void sampler_params_default(struct sampler_params *p);

// A candidate token. `p` is valid after sampler_softmax.
struct sampler_cand {
    int32_t id;
    float logit;
    float p;
};

struct sampler_cands {
    struct sampler_cand *data; // [size]
    size_t size;
    bool sorted; // by logit, descending
};

// The steps of the chain, in llama.cpp's semantics.
//
// bias (first, as llama.cpp's logit_bias sampler): candidate id's logit +=
// the bias of every entry naming id; c must not be sorted yet (candidate i
// is token i).
void sampler_apply_bias(struct sampler_cands *c, const struct sampler_bias *b, int n);
// All keep at least one
// candidate (min_keep).
//
// penalties: for each candidate whose id occurs count > 0 times in
// last[0..n_last): logit = logit <= 0 ? logit * repeat : logit / repeat;
// logit -= count * freq + presence.
void sampler_apply_penalties(struct sampler_cands *c, const int32_t *last, int n_last, float repeat,
                             float freq, float presence);
// Keeps the k largest (sorted). k <= 0 keeps all.
void sampler_apply_top_k(struct sampler_cands *c, int k);
// Softmax, then keeps the smallest prefix whose probability sum is >= p.
void sampler_apply_top_p(struct sampler_cands *c, float p, size_t min_keep);
// Keeps candidates whose logit >= max_logit + ln(p), i.e. probability >= p * max probability.
void sampler_apply_min_p(struct sampler_cands *c, float p, size_t min_keep);
// logit /= t (t > 0).
void sampler_apply_temp(struct sampler_cands *c, float t);
// Sorts descending (if not yet) and fills p with the softmax of the logits.
void sampler_softmax(struct sampler_cands *c);

// xoshiro256** seeded through splitmix64.
struct sampler_rng {
    uint64_t s[4];
};
void sampler_rng_seed(struct sampler_rng *r, uint64_t seed);
uint64_t sampler_rng_next(struct sampler_rng *r);
// Uniform in [0, 1).
double sampler_rng_uniform(struct sampler_rng *r);

// Softmax, then draws one candidate with probability p. Returns its id.
int32_t sampler_dist(struct sampler_cands *c, struct sampler_rng *r);
// sampler_dist with the uniform draw u in [0, 1) given: the first candidate
// (in descending order) whose cumulative probability, summed in double,
// exceeds u; the last one when rounding leaves the total at or below u.
int32_t sampler_dist_u(struct sampler_cands *c, double u);

// The chain after the penalties over one row of candidates, with the draw u
// in [0, 1) given instead of taken from an RNG: temp <= 0 is greedy (the
// largest logit, the first candidate on ties; u unused), else
// top_k -> top_p -> min_p -> temp -> dist(u). Modifies c. sampler_sample is
// the penalties followed by this with u from its RNG; a backend's sample op
// (host/ops/backend.h) must pick what this picks, row by row.
int32_t sampler_chain(struct sampler_cands *c, float temp, int top_k, float top_p, float min_p,
                      double u);

struct sampler;

// The bias entries against a vocabulary of n_vocab: at most SAMPLER_MAX_BIAS,
// each token in [0, n_vocab), each bias finite or -INFINITY (VERR_RANGE
// naming the entry otherwise). sampler_create checks them; a caller that
// creates its sampler later (the engine, at a request's start) checks first.
int sampler_check_bias(const struct sampler_bias *b, int n, int n_vocab, struct verr *err);
// VERR_RANGE: repeat_last_n < 0 (the caller passes n_ctx for -1), more than
// SAMPLER_MAX_BIAS bias entries, a bias entry's token outside [0, n_vocab)
// or its bias neither finite nor -INFINITY, a grammar without a
// grammar_vocab or with one of another size than n_vocab.
int sampler_create(struct sampler **out, const struct sampler_params *p, int n_vocab,
                   struct verr *err);
void sampler_free(struct sampler *s);
// The seed actually used (the random one when SAMPLER_SEED_RANDOM was asked for).
uint32_t sampler_seed(const struct sampler *s);
// A generated token: adds it to the penalty history and advances the
// grammar past it. Returns 0, or (only with a grammar) VERR_RANGE when the
// grammar does not allow the token here (the history takes it, the grammar
// state stays as it was) or VERR_FULL when the grammar grew past its limits.
int sampler_accept(struct sampler *s, int32_t token);
// sampler_accept with the grammar's message in err.
int sampler_accept_checked(struct sampler *s, int32_t token, struct verr *err);
// A prompt token: the penalty history only (llama.cpp adds prompt tokens to
// the history too; the grammar constrains generated text alone).
void sampler_accept_prompt(struct sampler *s, int32_t token);
// Clears the history, re-seeds the RNG with the same seed and puts the
// grammar back at its start.
void sampler_reset(struct sampler *s);
// Samples the next token from logits [n_vocab] (not modified). With a
// grammar: a token the grammar allows (an end-of-generation token only where
// the grammar can end); -1 when the grammar allows no token at all (a dead
// end: sampler_sample_checked says why).
int32_t sampler_sample(struct sampler *s, const float *logits);
// sampler_sample with an error instead of -1: VERR_RANGE when the grammar
// allows no token (it has ended and the vocabulary has no end-of-generation
// token, or its remaining characters are in no token), VERR_FULL when it
// grew past its limits. *token is set on success only.
int sampler_sample_checked(struct sampler *s, const float *logits, int32_t *token,
                           struct verr *err);
// The sampler's grammar state (NULL without a grammar): where the generated
// text stands, e.g. grammar_state_can_end to tell a finished output.
const struct grammar_state *sampler_grammar_state(const struct sampler *s);

// Sampling on the backend (ops->sample, host/ops/backend.h) takes the chain's
// parameters and one draw per row; the penalties stay on the host.
struct sample_params;
// True when s applies no penalty, no logit bias and no grammar (the next
// token then depends only on the logits and one draw), so its rows may be
// sampled by ops->sample.
bool sampler_penalties_off(const struct sampler *s);
// Fills *out with s's chain parameters and, unless greedy, takes the next
// draw of its RNG into out->u (the draw sampler_sample would take; greedy
// takes none and sets u = 0), so mixing sampler_sample and ops->sample steps
// keeps one random sequence. Call sampler_accept with the token picked.
void sampler_next_params(struct sampler *s, struct sample_params *out);
// "penalties(last_n=64, repeat=1.000, ...) -> top_k(40) -> ..." for --verbose.
void sampler_describe(const struct sampler *s, char *buf, size_t cap);

#endif
