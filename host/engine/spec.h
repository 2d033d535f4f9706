// Speculative decoding: what a request asks for and the drafters that
// propose tokens for the step to verify (step.h). A speculating request's
// step entry is its next token and k draft tokens (k + 1 rows, in the same
// target batch as the other requests' rows); its sampler then draws the
// rows in order and keeps a draft while the drawn token equals it, so the
// output is what the request gives without speculation: token for token
// when greedy, and in distribution (the same draws) when sampling. With a
// drafter whose proposal is one token (q one-hot: n-gram), this is the
// standard rejection rule: accept x with probability min(1, p(x) / q(x)) =
// p(x), else draw from normalize(max(0, p - q)) = p without x.
#ifndef VELA_HOST_ENGINE_SPEC_H
#define VELA_HOST_ENGINE_SPEC_H

#include <stdint.h>

#include "gguf/verr.h"

// The most draft tokens a request may ask for per step.
#define ENGINE_SPEC_MAX 64

enum engine_spec_type {
    ENGINE_SPEC_NONE,  // no speculation
    ENGINE_SPEC_NGRAM, // prompt lookup: what followed the last n-gram's latest earlier occurrence
    ENGINE_SPEC_DRAFT, // a draft model's argmax (draft.h), the engine's draft model
};

struct engine_spec {
    enum engine_spec_type type;
    int n_max;   // --draft-max: draft tokens per step, 1 .. ENGINE_SPEC_MAX (and below n_batch)
    int n_min;   // --draft-min: a proposal shorter than this is not verified (0 .. n_max)
    float p_min; // --draft-p-min: a draft model stops below this probability (0 .. 1)
    int ngram_n; // n-gram: the longest suffix looked up (tries n_gram_n down to 2), 2 .. 16
};

// Off; n_max 16, n_min 0, p_min 0.75 (llama.cpp's defaults), ngram_n 3.
void engine_spec_default(struct engine_spec *s);

// The values of a request that speculates, checked; type NONE always passes.
int engine_spec_check(const struct engine_spec *s, int n_batch, struct verr *err);

// "none", "ngram", "draft"; NULL for another value.
const char *engine_spec_type_name(enum engine_spec_type t);
// The type named (as --spec-type takes it); -1 for an unknown name.
int engine_spec_type_parse(const char *name);

// Prompt lookup over the tokens so far t[0..n): for m = ngram_n down to 2,
// the latest earlier occurrence of the last m tokens; what followed it (at
// most n_max tokens, never past the end of t) goes to out. Returns the
// number of tokens proposed (0: no occurrence).
int spec_ngram_draft(const int32_t *t, int n, int ngram_n, int32_t *out, int n_max);

#endif
