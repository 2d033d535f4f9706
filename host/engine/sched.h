// The step API's state (host/engine/step.h): slots, queue, the step batch.
// Internal to host/engine/: engine_generate_batch (generate.c) drives it
// with the few hooks below.
#ifndef VELA_HOST_ENGINE_SCHED_H
#define VELA_HOST_ENGINE_SCHED_H

#include "host/engine/step.h"
#include "kv/policy.h"

// A submitted request: the caller's description with owned copies.
struct sched_req {
    uint64_t id;
    struct engine_request p; // p.tokens / p.stop_tokens point at the copies below
    int32_t *tokens;         // [n_tokens]
    int32_t *stop;           // [n_stop_tokens]
    struct engine_req_stats st;
};

enum slot_state { SLOT_FREE, SLOT_PROMPT, SLOT_GEN };

// One sequence being decoded. Its sequence id in the cache is its slot index.
struct slot {
    enum slot_state state;
    struct sched_req *rq; // NULL when free
    int n_consumed;       // prompt tokens decoded (or shared)
    int32_t n_past;       // position of the next token
    int n_cells;          // cells holding this sequence
    int32_t next;         // the sampled token waiting to be decoded; -1: none yet
    int out_row;          // index in this step's batch of the row it samples from; -1: none
    int32_t out_pos;
    int share_from; // slot whose prompt cells it will share; -1: none
    bool can_share; // no shift can ever move this sequence's prompt cells
    bool started_now;
    const char *end_why;    // set during a step (engine_cancel from a callback, on_rows):
                            // it ends after the step with this reason
    int chunk_b0, chunk_c0; // its prompt chunk in this step: batch index, prompt index
    int32_t amax;           // the token the backend picked from its row (argmax or sample op)
    float *last;            // [n_vocab] its row (sampling on the host); kept across requests
    // The tokens of this slot's cells, positions 0..n_hist-1, while no
    // policy moved them (hist_ok): what a request with reuse_cells compares
    // its prompt against. Kept across requests, as `last`.
    int32_t *hist;
    int n_hist, cap_hist;
    bool hist_ok;
    uint64_t last_used; // the engine's tick when its last request ended (0: never)
    struct sampler *smp;
    struct tokenizer_stream *stream;
    struct kv_policy pol; // context shift, self-extend, ... (kv/policy.h)
    // The exact self-extend G and W (G 1: off) its request's tokens attend
    // with, and the ones its kept cells (hist) were computed with: K/V of
    // later layers come from earlier layers' attention, so a request with
    // other values reuses only cells no far key reached (se_shared_prefix).
    int se_g, se_w;
};

struct engine_sched {
    struct engine_sched_config cfg; // as resolved (n_slots, n_queue_max >= 1)
    int n_ctx_seq;                  // cells per slot
    struct slot *slots;             // [cfg.n_slots]
    struct sched_req **queue;       // [cfg.n_queue_max] ring
    int q_head, q_len;
    struct sample_params *rows; // [n_slots] this step's sample rows, in batch order
    int cap;                    // the step batch: n_slots * n_batch entries
    int32_t *tok, *pos, *seq;
    int32_t *se; // [cap][2] each entry's exact self-extend G, W (the slot's)
    int8_t *want;
    uint64_t next_id;
    uint64_t tick; // counts requests ending (slot.last_used)
    struct engine_stats st;
    bool in_step;
    // Set by a hook (engine_generate_batch's stop): the step samples no
    // further slot.
    bool halt;
};

// Ends every active request with `why` in slot order and frees the queued
// ones without an event (engine_generate_batch's stop and error paths).
int sched_end_all(struct engine *e, const char *why, struct verr *err);

#endif
