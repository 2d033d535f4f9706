// KV policies: what a sequence does with its cells when its share of the
// cache fills up, and before each of its batches. The engine holds one
// policy per sequence and calls it; it never tests which one it is.
//
// Policies today:
// - stop (KV_POLICY_STOP): nothing moves; a full share ends the sequence;
// - context shift (KV_POLICY_SHIFT, llama-cli's --keep): when n_past + 1
//   reaches the share, the first n_keep positions stay, half of the rest is
//   removed and the remainder moved down (kv_context_shift);
// - self-extend (KV_POLICY_SELFEXTEND, llama-cli's --grp-attn-n/-w, see
//   kv/selfextend.h): before each batch the positions past the window are
//   regrouped; positions stay low, so the share is full when its cells are.
// - exact self-extend (KV_POLICY_EXACT_SE, --self-extend G W; the rule is
//   host/ops/selfextend.h): attention groups far positions itself, so
//   nothing moves: positions grow past the trained context up to the
//   extended one and the share is full when its cells are. It needs the
//   forward context in the unrotated cache mode, and the sequence's tokens
//   decoded with the same G and W (forward_batch.se, or the context's
//   forward_config.se_g / se_w); the policy only carries them.
// Bounded-cache eviction policies are meant to plug in the same way.
#ifndef VELA_KV_POLICY_H
#define VELA_KV_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/verr.h"
#include "kv/kv.h"
#include "kv/selfextend.h"

enum kv_policy_kind {
    KV_POLICY_STOP = 0,
    KV_POLICY_SHIFT = 1,
    KV_POLICY_SELFEXTEND = 2,
    KV_POLICY_EXACT_SE = 3,
};

// What a request asks for; kv_policy_init picks the policy: exact
// self-extend when se_g > 1, self-extend when ga_n != 1 (not both), else
// the context shift when ctx_shift, else stop.
struct kv_policy_params {
    bool ctx_shift; // shift when full (llama-cli's default: on)
    int n_keep;     // positions the shift keeps (resolved: BOS and prompt rules are the caller's)
    int ga_n;       // self-extend group factor (1: off)
    int ga_w;       // self-extend width, a multiple of ga_n, <= the cache's cells
    int se_g;       // exact self-extend group size G (0 or 1: off)
    int se_w;       // exact self-extend neighbor window W >= 1
};

void kv_policy_params_default(struct kv_policy_params *p);

struct kv_policy {
    enum kv_policy_kind kind;
    int seq;                 // the sequence it manages
    int n_ctx;               // the sequence's share of the cache (cells)
    int n_keep;              // KV_POLICY_SHIFT
    struct kv_selfextend se; // KV_POLICY_SELFEXTEND
    int se_g, se_w;          // KV_POLICY_EXACT_SE
};

// Checks p against kv (self-extend values as kv_selfextend_init; exact
// self-extend: G >= 1, W >= 1, W below the share; n_keep >= 0)
// and fills *pol for sequence seq owning n_ctx cells of kv. VERR_RANGE with a
// message, *pol untouched, otherwise.
int kv_policy_init(struct kv_policy *pol, const struct kv_policy_params *p,
                   const struct kv_cache *kv, int seq, int n_ctx, struct verr *err);

// Before the sequence's next batch, whose first token would sit at *n_past:
// self-extend regroups the positions due and lowers *n_past; the others do
// nothing.
int kv_policy_before_batch(struct kv_policy *pol, struct kv_cache *kv, int32_t *n_past,
                           struct verr *err);

// Whether the sequence can take one more token: with positions up to
// *n_past - 1 in n_cells cells. When its share is full, the policy makes
// room if it can (the shift: *n_past and *n_cells go down by *n_discard).
// Returns 0 when the token fits (*n_discard: what was discarded, 0 if
// nothing), 1 when the sequence must end ("context full"), or a negative
// error.
int kv_policy_make_room(struct kv_policy *pol, struct kv_cache *kv, int32_t *n_past, int *n_cells,
                        int32_t *n_discard, struct verr *err);

// Whether positions of the sequence may ever move when it holds at most
// n_positions positions: cells shared with another sequence (kv_seq_cp)
// would move for both, so only a sequence whose cells never move shares.
bool kv_policy_may_move(const struct kv_policy *pol, int64_t n_positions);

// "stop", "context shift", "self-extend", "exact self-extend".
const char *kv_policy_name(enum kv_policy_kind k);

#endif
