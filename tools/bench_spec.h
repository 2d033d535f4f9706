// vela bench --draft: speculative decoding on real text (spec.h). For each
// --parallel N, N sequences read built-in prompts (code, a list, a story,
// an instruction; sequence i reads prompt i mod 4) and generate -n tokens
// greedy (end-of-generation ignored), once plain and once speculating as
// the flags say (--spec-type, -md, --draft-*; ngram when none is given),
// -r times each. A table row per N: generated tokens per second of
// generation time (decode + sampling + the draft step), the speedup, drafts
// verified and accepted, and whether every sequence's tokens are the same
// in both runs (they must be: greedy speculation changes no token).
#ifndef VELA_TOOLS_BENCH_SPEC_H
#define VELA_TOOLS_BENCH_SPEC_H

#include "tools/args.h"

// Returns the exit status (1: the model or a run failed; printed).
int bench_spec_run(struct cli *c);

#endif
