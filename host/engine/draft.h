// The draft model of speculative decoding (spec.h): a second engine whose
// context holds one sequence per slot of the target's step API. One draft
// step makes the drafts of every speculating slot: a batch that brings
// each sequence's cache up to the slot's tokens (what the last verification
// kept), then one batch per draft token with a row per sequence still
// drafting. Drafts are the draft model's argmax (its proposal q is one
// hot), as long as its probability is at least p_min.
#ifndef VELA_HOST_ENGINE_DRAFT_H
#define VELA_HOST_ENGINE_DRAFT_H

#include <stdint.h>

#include "gguf/verr.h"
#include "host/engine/core.h"

// Attaches d as e's draft model (e owns it from then on, engine_close
// frees it) when its vocabulary is e's: the same number of tokens, the same
// text for each and the same BOS / EOS. VERR_FORMAT otherwise, naming the
// first difference, VERR_RANGE when e has one already (d is then not
// attached; the caller closes it).
int engine_draft_attach(struct engine *e, struct engine *d, struct verr *err);

// What one sequence asks of a draft step.
struct draft_req {
    int seq;             // its sequence (the slot) in the draft's context
    const int32_t *seen; // [n_seen] its tokens so far, prompt and sampled
    int n_seen;          // >= 1
    int max;             // drafts wanted, 1 .. ENGINE_SPEC_MAX
    float p_min;         // stop below this probability of the argmax
    int32_t *out;        // [max] the drafts
    int n_out;           // out: how many
};

// The draft state for n_seq sequences over d's context (its cells split
// evenly between them). VERR_RANGE when d's context was opened for fewer
// sequences or logits rows.
struct draft_state;
int draft_state_new(struct draft_state **out, struct engine *d, int n_seq, struct verr *err);
void draft_state_free(struct draft_state *st);

// One draft step for reqs[0..n) (distinct sequences); on error the
// sequences' caches are dropped and rebuilt at the next step.
int draft_step(struct draft_state *st, struct draft_req *reqs, int n, struct verr *err);

#endif
