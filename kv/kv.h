// The KV cache: cells with positions, deltas and sequence sets; llama.cpp's
// slot search and sequence ops; the pending shift applied on the backend
// (see shared/seeds/004_* and 000_*).
//
// Bookkeeping (pos, delta, sequence sets, head, used) lives on the host. K/V
// tensors and the mirrors of cell_pos / cell_seq / delta live in backend
// memory; kv uploads only what changed, in kv_prepare.
//
// Invariant (every function keeps it): a cell is empty iff pos == -1 iff its
// sequence set is empty; an empty cell has delta 0; `used` counts the
// non-empty cells.
//
// Order of calls for one decode (the forward pass):
//   [self-extend / context shift / seq ops]  -- change positions, set deltas
//   kv_find_slot(batch)                      -- claims cells for the batch
//   kv_prepare(rope)                         -- K shift on the backend, mirrors
//   n_kv = kv_n_kv(); forward: rope_kv_store into cells[], attention over
//   kv_layer_k/v with d_cell_pos / d_cell_seq / seq_words.
// Not thread-safe: one thread drives one cache.
#ifndef VELA_KV_H
#define VELA_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "host/ops/backend.h"

#define KV_SEQ_MAX_DEFAULT 64  // used when kv_config.n_seq_max <= 0
#define KV_SEQ_MAX_LIMIT 65536 // larger n_seq_max values are refused
#define KV_PAD 32              // n_kv is rounded up to a multiple of this

struct kv_config {
    int n_ctx;   // number of cells, >= 1
    int n_layer; // the dims below are checked only when a backend is given
    int n_head_kv;
    int head_dim;          // K
    int head_dim_v;        // V
    enum ggml_type type_k; // F16, F32, or a quantized type the backend runs
    enum ggml_type type_v; // (backend_supports_cache_type)
    int n_seq_max;         // sequence ids are 0..n_seq_max-1; <= 0 means KV_SEQ_MAX_DEFAULT
    // K is stored Hadamard-rotated after RoPE with this block (the attention
    // rotation, backend_ops.hadamard; backend_attn_rot_block), so the K
    // shift rotates back around RoPE; 0: K is not rotated.
    int rot_k;
};

struct kv_cache {
    struct kv_config cfg; // as given, with n_seq_max resolved
    struct backend *be;   // NULL: bookkeeping only (no K/V, no mirrors)

    // host bookkeeping
    int32_t *pos;           // [n_ctx] position of each cell, -1 when empty
    int32_t *delta;         // [n_ctx] shift accumulated since the last kv_prepare
    uint64_t *seq;          // [n_ctx][seq_words] bit s of cell c: c holds sequence s
    int seq_words;          // ceil(n_seq_max / 64)
    int head;               // where the next slot search starts, in [0, n_ctx)
    int used;               // non-empty cells
    bool has_shift;         // a seq_add / seq_div moved a cell since the last kv_prepare
    int dirty_lo, dirty_hi; // cells [dirty_lo, dirty_hi) changed since the last
                            // upload of the mirrors; empty when lo >= hi
    uint64_t n_clears;      // kv_clear calls since kv_init: the other stages of a
                            // split model clear their K/V when the front's changes

    // backend memory (NULL when be is NULL)
    size_t k_row_bytes;   // one cell of one layer: n_head_kv*head_dim of type_k
    size_t v_row_bytes;   // one cell of one layer: n_head_kv*head_dim_v of type_v
    void *k;              // [n_layer][n_ctx][n_head_kv][head_dim] of type_k
    void *v;              // [n_layer][n_ctx][n_head_kv][head_dim_v] of type_v
    int32_t *d_cell_pos;  // [n_ctx] mirror of pos, current after kv_prepare
    uint64_t *d_cell_seq; // [n_ctx][seq_words] mirror of seq, current after kv_prepare
    int32_t *d_delta;     // [n_ctx] staging for the kv_shift op
};

// Allocates the host bookkeeping and, when be is not NULL, K, V (zeroed, so
// cells never hold NaN garbage) and the mirrors through be->ops. All cells
// empty, head 0. On failure *kv is left zeroed (kv_free is still safe).
// Errors: VERR_RANGE (a bad dimension), VERR_UNSUPPORTED (a cache type the
// backend does not run, or a block type whose block size does not divide
// head_dim / head_dim_v), VERR_NOMEM, or the backend's error.
int kv_init(struct kv_cache *kv, const struct kv_config *cfg, struct backend *be, struct verr *err);
// Frees everything kv_init allocated; safe on a zeroed or already freed cache.
void kv_free(struct kv_cache *kv);
// Empties every cell (head 0, used 0, no pending shift) and zeroes K and V on
// the backend, as llama.cpp's clear. Only a backend error can fail it; the
// bookkeeping is cleared either way. On the front cache of a split model
// (host/split/) the other stages' caches are cleared too, K and V
// included, before the next decode runs on them (they follow n_clears).
int kv_clear(struct kv_cache *kv, struct verr *err);

// One layer's K / V in backend memory, or NULL (no backend, layer out of range).
void *kv_layer_k(const struct kv_cache *kv, int layer); // [n_ctx][n_head_kv][head_dim]
void *kv_layer_v(const struct kv_cache *kv, int layer); // [n_ctx][n_head_kv][head_dim_v]

// Cell accessors (c must be in [0, n_ctx); s out of range reads as absent).
static inline int32_t kv_cell_pos(const struct kv_cache *kv, int c) {
    return kv->pos[c];
}
static inline int32_t kv_cell_delta(const struct kv_cache *kv, int c) {
    return kv->delta[c];
}
static inline bool kv_cell_has_seq(const struct kv_cache *kv, int c, int s) {
    if (s < 0 || s >= kv->cfg.n_seq_max)
        return false;
    return (kv->seq[(size_t)c * kv->seq_words + s / 64] >> (s % 64)) & 1u;
}

// Finds cells for n_tok new tokens: a contiguous run of empty cells starting
// the search at head and wrapping to 0 once (llama.cpp's find_slot). Writes
// the run's indices to cells[] (cells[t] = first + t) and claims them: cell
// first+t gets position pos[t] in sequence seq[t], delta 0. Then head moves
// past the run (to 0 at the end of the cache), as llama.cpp's ring-buffer
// advance after a decode. n_tok == 0 does nothing.
// Errors, with nothing changed: VERR_RANGE (n_tok < 0, pos[t] < 0, seq[t]
// outside [0, n_seq_max)), VERR_FULL (n_tok > n_ctx, or no run of n_tok empty
// cells).
int kv_find_slot(struct kv_cache *kv, const int32_t *pos /* [n_tok] */,
                 const int32_t *seq /* [n_tok] */, int n_tok, int32_t *cells /* [n_tok] */,
                 struct verr *err);

// The attention window: cells 0..n_kv-1 hold every non-empty cell.
// n_kv = min(n_ctx, max(KV_PAD, round_up(last non-empty cell + 1, KV_PAD))),
// llama.cpp's rule: an empty cache still gives min(n_ctx, KV_PAD).
int kv_n_kv(const struct kv_cache *kv);

// Sequence ops with llama.cpp's semantics. Ranges are [p0, p1) over cell
// positions; p0 < 0 means 0 and p1 < 0 means no upper bound. An empty range
// (p0 >= p1 after that) does nothing. Sequence ids must be in [0, n_seq_max)
// (VERR_RANGE otherwise, nothing changed), except seq_rm's seq < 0 = every
// sequence.

// Removes seq from the cells in range; a cell left with no sequence is freed.
// head moves back to the first freed cell when that is below it.
int kv_seq_rm(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, struct verr *err);
// Adds dst to every cell of src in range (the cells are shared, not copied);
// head goes to 0. src == dst does nothing.
int kv_seq_cp(struct kv_cache *kv, int src, int dst, int32_t p0, int32_t p1, struct verr *err);
// Frees every cell not holding seq and leaves seq alone in the others. head
// moves back to the first freed cell when that is below it.
int kv_seq_keep(struct kv_cache *kv, int seq, struct verr *err);
// pos += delta and delta accumulates for seq's cells in range (a cell shared
// with other sequences moves for all of them). A cell whose pos falls below 0
// is freed. head goes to the first freed cell, or to 0 when none was freed.
// delta == 0 does nothing. VERR_RANGE (nothing changed) when a position or an
// accumulated delta would overflow int32.
int kv_seq_add(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int32_t delta,
               struct verr *err);
// pos = pos / d (integer division) for seq's cells in range; delta += new -
// old. d == 1 does nothing; d < 1 is VERR_RANGE. head is unchanged.
int kv_seq_div(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int d, struct verr *err);
// Largest position of seq, or -1 when it holds none (or seq is out of range).
int32_t kv_seq_pos_max(const struct kv_cache *kv, int seq);

// Before a decode (after kv_find_slot): when a shift is pending and some
// delta is non-zero, uploads delta[] and calls be->ops->kv_shift once over
// every layer's K (a pure rotation by delta with rp's frequencies); then
// clears the deltas and has_shift. Then uploads the changed range of pos /
// seq to d_cell_pos / d_cell_seq. rp == NULL means the model has no rotary
// embedding: deltas are dropped without touching K. Without a backend only
// the bookkeeping is cleared. On a backend error the pending shift and the
// dirty range are kept, so a later call retries.
// Assumes be->ops->upload has read src when it returns (kv reuses its arrays).
int kv_prepare(struct kv_cache *kv, const struct rope_params *rp, struct verr *err);

// llama-cli's context shift for seq at n_past: keeps positions [0, n_keep),
// discards n_discard = (n_past - n_keep) / 2 positions after them and moves
// the rest down by n_discard (seq_rm then seq_add). The caller subtracts
// *n_discard_out from its n_past. VERR_RANGE (nothing changed) unless
// 0 <= n_keep <= n_past and seq is in range.
int kv_context_shift(struct kv_cache *kv, int seq, int32_t n_keep, int32_t n_past,
                     int32_t *n_discard_out, struct verr *err);

// --- a cache that follows another's bookkeeping (the stages of a split model:
// one cache decides, the others hold the same cells for their own layers).

// Brings dst's bookkeeping to src's for the cells src changed since its last
// kv_prepare (and every cell after a clear); dst's K / V are untouched.
void kv_follow(struct kv_cache *dst, const struct kv_cache *src);
// The same from arrays: cells [lo, hi) of pos, delta [hi-lo] and seq
// [hi-lo][seq_words], then head, used and the pending-shift flag.
void kv_follow_range(struct kv_cache *dst, int lo, int hi, const int32_t *pos, const int32_t *delta,
                     const uint64_t *seq, int head, int used, bool has_shift);

#endif
