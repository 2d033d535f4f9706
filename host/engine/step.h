// The step API: requests submitted at any time, decoded together one batch
// per step (continuous batching, as llama-server and vLLM do).
//
// The engine keeps n_slots sequences in its one KV cache; each slot may use
// n_ctx / n_slots cells (llama-server's per-slot context), so what a request
// generates does not depend on what the others do: it is what the request
// gives alone in a context of n_ctx / n_slots cells (greedy and seeded
// sampling alike). Requests beyond the slots wait in a bounded queue and take
// a slot, in order, at the start of the step after one frees.
//
// One step decodes one batch: the next token of every generating request and
// chunks of the prompts being read, under a token budget (n_step_tokens):
// generated tokens first, then prompt chunks in slot order, each at most
// n_batch tokens. Requests that start in the same step with the same prompt
// share its cells (seq_cp) when no shift can ever move them. Then every
// request whose row came out samples its next token with its own sampler.
//
// Contract: not thread-safe; one thread submits, steps and cancels (a server
// funnels its HTTP threads' work to it). engine_step never blocks on I/O and
// never prints: text and events go to each request's callback, called from
// inside engine_step / engine_cancel. A callback may call engine_cancel (the
// request ends after the current step's work on it), not engine_step or
// engine_submit.
#ifndef VELA_HOST_ENGINE_STEP_H
#define VELA_HOST_ENGINE_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "host/backend/sampler.h"
#include "host/engine/core.h"
#include "host/engine/spec.h"

// One request's numbers; times are engine_now_ms() values or durations in ms.
struct engine_req_stats {
    int n_prompt;        // prompt tokens
    int n_prompt_eval;   // of those, decoded for it (0 when it shared another's cells)
    int n_prompt_reused; // of those, found in its slot's kept cells (reuse_cells): not decoded
    int n_gen;           // tokens sampled
    int n_gen_backend;   // of those, picked on the backend (argmax or sample op)
    int n_ctx_shifts;
    int n_drafted;  // draft tokens verified (speculative decoding)
    int n_accepted; // of those, kept
    uint32_t seed;  // the sampler seed (the random one picked, once it started)
    double t_submit_ms;
    double t_start_ms; // when it took a slot (0: still queued)
    double t_first_ms; // when its first token was sampled (0: none yet)
    double t_last_ms;  // when its last token was sampled
    double ttft_ms;    // time to first token: t_first - t_submit (-1: none)
    double tpot_ms;    // time per output token after the first:
                       // (t_last - t_first) / (n_gen - 1) (0 below 2 tokens)
};

// What a request's callback receives. ENGINE_EV_TOKEN: a sampled token and
// its printable piece (maybe empty; token -1: text the detokenizer held back,
// flushed at the end). ENGINE_EV_DONE: the request ended, text says why:
// "eog", "stop token", "n_predict", "context full", "stopped" (its callback
// returned non-zero), "cancelled", "error" (a step failed); token: its last
// token (-1: none); it is the last event of the request, and its id is
// unknown to the engine afterwards. ENGINE_EV_NOTE / ENGINE_EV_SHIFT as in
// engine.h.
struct engine_req_event {
    enum engine_event ev;
    uint64_t id;
    int32_t token;
    const char *text;
    size_t len;
    const struct engine_req_stats *stats; // the request's numbers so far (final at DONE)
};

// The return of a TOKEN event: non-zero ends the request ("stopped") once
// its token is handled (unless it ends for another reason with that token);
// other events' returns are ignored.
typedef int (*engine_req_fn)(void *user, const struct engine_req_event *ev);
// Optional: the logits row the next token is drawn from, before sampling
// (pos: the position of the token that produced it). Setting it makes every
// step this request samples in bring rows to the host (no backend argmax or
// sample op). Non-zero ends the request ("stopped") after this token.
typedef int (*engine_req_logits_fn)(void *user, uint64_t id, int32_t pos, const float *logits);

// Optional: every prompt token's logits, rows [n][n_vocab] of its prompt
// tokens [first, first + n), after each decode. Non-zero ends the request
// ("stopped") after the step.
typedef int (*engine_req_rows_fn)(void *user, uint64_t id, int first, int n, const float *logits);

#define ENGINE_MAX_STOP_TOKENS 64

struct engine_request {
    const int32_t *tokens;      // [n_tokens] the prompt (copied by engine_submit)
    int n_tokens;               // 1 .. per-slot context - 4 (llama-cli's room for a few tokens)
    struct sampler_params sp;   // its sampler; seed SAMPLER_SEED_RANDOM picks one when it starts;
                                // repeat_last_n -1: the per-slot context
    int n_predict;              // tokens to generate; -1: until a stop (forever with context
                                // shift); -2: until a stop or the context is full
    bool ignore_eos;            // end-of-generation tokens do not end it
    const int32_t *stop_tokens; // [n_stop_tokens] more tokens that end it (copied), after
                                // being reported
    int n_stop_tokens;          // <= ENGINE_MAX_STOP_TOKENS
    // Policy when its context is full (engine.h: context shift, self-extend).
    bool ctx_shift; // default on; off: it ends with "context full"
    int n_keep;     // tokens kept on a context shift (-1: the prompt; BOS kept on top)
    int ga_n;       // self-extend group factor (1: off); excludes the context shift
    int ga_w;       // self-extend width
    // Exact self-extend (host/ops/selfextend.h) for this request: se_g 0:
    // the context's (forward_config se_g / se_w); 1: off; > 1: group size G
    // with neighbor window se_w (1 <= W < n_ctx_train and below the per-slot
    // context), which needs a context that caches K unrotated
    // (forward_config k_unrotated or se_g > 1). Not with ga_n > 1.
    int se_g, se_w;
    engine_req_fn cb;               // optional
    engine_req_logits_fn on_logits; // optional
    // Optional (engine_eval): with it the request only reads its prompt
    // (n_predict must be 0), which may then fill the per-slot context; the
    // context must keep n_batch logits rows.
    engine_req_rows_fn on_rows;
    void *user;      // for the three
    bool keep_cells; // its cells stay in the cache when it ends (engine_eval's
                     // callers read them); the next request in its slot removes them
    // The cells its slot kept from the previous request (keep_cells) are
    // reused for the longest prefix its prompt shares with that request's
    // tokens (prompt and generated), when no policy moved their positions;
    // only the rest is decoded (a conversation's history: vela chat; a
    // server's prompt cache). It takes the free slot whose kept tokens share
    // the longest prefix with its prompt (engine_sched_config.slot_similarity).
    // Not with llama.cpp's self-extend (ga_n > 1: its regrouping depends on
    // where chunks start); exact self-extend reuses (its positions never move).
    // The reused K/V were computed in other batches than a fresh run would use,
    // so results may differ from the request alone by float rounding (the CPU
    // backend computes a row the same way whatever the batch: none there).
    bool reuse_cells;
    // Speculative decoding (spec.h): k draft tokens verified per step, the
    // output unchanged. Not with on_logits, on_rows or llama.cpp's
    // self-extend (ga_n > 1). A step drafts no more than the context, the
    // tokens left (n_predict), the budget (n_step_tokens) and the logits
    // rows the context keeps (n_outputs_max: k + 1 per speculating request)
    // allow.
    struct engine_spec spec;
};

// n_predict -1, ctx_shift on, n_keep 0, ga_n 1, ga_w 512, default sampler, no
// speculation (engine_spec_default).
void engine_request_default(struct engine_request *r);

struct engine_sched_config {
    int n_slots;       // sequences decoded together (0: the context's n_seq_max)
    int n_queue_max;   // requests waiting for a slot (0: 256)
    int n_step_tokens; // token budget of a step (0: the context's n_batch; -1: none, every
                       // prompt being read adds a chunk of n_batch: llama.cpp's parallel
                       // example, what engine_generate_batch uses)
    // Which free slot a queued request takes (llama-server's
    // --slot-prompt-similarity): a reuse_cells request takes the one whose
    // kept tokens share the longest prefix with its prompt, when that prefix
    // is more than this fraction of the slot's kept tokens (0: any common
    // prefix; llama-server's default is 0.5); otherwise, and for every other
    // request, the free slot holding no kept cells with the lowest index, else
    // the one used least recently (its kept cells are dropped).
    float slot_similarity;
};

// Sets the slots, queue and budget; only while no request is active or
// queued (VERR_RANGE otherwise, nothing changed). The first engine_submit
// without it uses the defaults. Resets the engine-wide statistics.
int engine_sched_configure(struct engine *e, const struct engine_sched_config *c, struct verr *err);

// Queues a request; *id (never 0) names it in its events and engine_cancel.
// Refused with nothing changed: VERR_RANGE (empty prompt, a token outside
// the vocabulary, "prompt is too long (N tokens, max M)" for the per-slot
// context, bad n_predict / self-extend / sampler values, too many stop
// tokens), VERR_FULL (the queue is full).
int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id, struct verr *err);

// Decodes one batch across the active requests, starting queued ones in free
// slots first, and samples. Returns 1 when work remains (active or queued
// requests), 0 when none, or a negative VERR_* code: then every active
// request has ended with "error" (cells freed) and the queue is kept.
int engine_step(struct engine *e, struct verr *err);

// Ends a request at once: its cells are freed (kv_seq_rm), its slot is
// taken at the next step, and its callback gets ENGINE_EV_DONE "cancelled".
// Called from a callback during a step, it ends after that step's work.
// VERR_NOTFOUND when no active or queued request has that id.
int engine_cancel(struct engine *e, uint64_t id, struct verr *err);

// Frees the step API's state (engine_close and engine_reopen call it; NULL: nothing).
void engine_sched_free(struct engine_sched *s);

// Requests in slots and in the queue.
int engine_n_active(const struct engine *e);
int engine_n_queued(const struct engine *e);
// A request's numbers so far; VERR_NOTFOUND once it ended (its DONE event has them).
int engine_req_stats_get(const struct engine *e, uint64_t id, struct engine_req_stats *out);
// What slot i does now (free for an index outside the slots).
enum engine_slot_state { ENGINE_SLOT_FREE, ENGINE_SLOT_PROMPT, ENGINE_SLOT_GEN };
enum engine_slot_state engine_slot_state(const struct engine *e, int slot);

// The slots, queue and budget as resolved (zeros before the first configure).
void engine_sched_config_get(const struct engine *e, struct engine_sched_config *out);

// For the loops over the step API (engine_generate_batch, engine_eval):
// the current step samples no further request (called from a callback).
void engine_sched_halt(struct engine *e);
// Ends every active request with `why` in slot order and frees the queued
// ones without an event.
int engine_end_all(struct engine *e, const char *why, struct verr *err);

// Engine-wide numbers since the last engine_sched_configure (n_seq: requests ended;
// t_total_ms and seed unused).
const struct engine_stats *engine_sched_stats(const struct engine *e);

#endif
