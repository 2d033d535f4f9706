// The KV cache: cells with positions, deltas and sequence sets; llama.cpp's
// slot search and sequence ops; the pending shift applied on the backend
// (see shared/seeds/004_* and 000_*).
//
// Bookkeeping (cells, head, used) lives on the host. K/V tensors and the
// mirrors of cell_pos / cell_seq / delta live in backend memory; kv uploads
// only what changed before a decode (kv_prepare).
#ifndef VELA_KV_H
#define VELA_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/types.h"
#include "gguf/verr.h"
#include "host/backend.h"

#define KV_SEQ_MAX_DEFAULT 64
#define KV_PAD 32 // n_kv is rounded up to a multiple of this

struct kv_config {
    int n_ctx;          // number of cells
    int n_layer;
    int n_head_kv;
    int head_dim;       // K
    int head_dim_v;     // V
    enum ggml_type type_k; // F16 or F32
    enum ggml_type type_v; // F16 or F32
    int n_seq_max;      // sequences ids are 0..n_seq_max-1
};

struct kv_cell {
    int32_t pos;        // -1: empty
    int32_t delta;      // accumulated shift since the last kv_prepare
};

struct kv_cache {
    struct kv_config cfg;
    struct backend *be;
    struct kv_cell *cells;   // [n_ctx]
    uint64_t *seq;           // [n_ctx][seq_words] sequence sets, host side
    int seq_words;           // ceil(n_seq_max / 64)
    int head;                // where the slot search starts
    int used;                // cells holding at least one sequence
    bool has_shift;          // some delta != 0
    bool dirty;              // host cells changed since the last upload

    // backend memory
    void *k;                 // [n_layer][n_ctx][n_head_kv][head_dim] of type_k
    void *v;                 // [n_layer][n_ctx][n_head_kv][head_dim_v] of type_v
    int32_t *d_cell_pos;     // [n_ctx]
    uint64_t *d_cell_seq;    // [n_ctx][seq_words]
    int32_t *d_delta;        // [n_ctx]
};

int kv_init(struct kv_cache *kv, const struct kv_config *cfg, struct backend *be,
            struct verr *err);
void kv_free(struct kv_cache *kv);
void kv_clear(struct kv_cache *kv);

// Pointers to one layer's K / V in backend memory.
void *kv_layer_k(const struct kv_cache *kv, int layer);
void *kv_layer_v(const struct kv_cache *kv, int layer);

// Finds cells for n_tok new tokens (a contiguous run of empty cells from
// head, wrapping, as llama.cpp's find_slot), writes their indices to cells[]
// and claims them with pos[t] and seq[t]. On failure (cache full, seq id out
// of range, n_tok > n_ctx) nothing changes.
int kv_find_slot(struct kv_cache *kv, const int32_t *pos /* [n_tok] */,
                 const int32_t *seq /* [n_tok] */, int n_tok, int32_t *cells /* [n_tok] */,
                 struct verr *err);

// The attention window: highest used cell + 1 rounded up to KV_PAD, <= n_ctx.
int kv_n_kv(const struct kv_cache *kv);

// Sequence ops with llama.cpp's semantics; p0 < 0 means 0, p1 < 0 means
// infinity; ranges are [p0, p1). seq < 0 in seq_rm means every sequence.
int kv_seq_rm(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, struct verr *err);
int kv_seq_cp(struct kv_cache *kv, int src, int dst, int32_t p0, int32_t p1, struct verr *err);
int kv_seq_keep(struct kv_cache *kv, int seq, struct verr *err);
int kv_seq_add(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int32_t delta,
               struct verr *err);
int kv_seq_div(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int d, struct verr *err);
// Largest position of seq, or -1 when it holds none.
int32_t kv_seq_pos_max(const struct kv_cache *kv, int seq);

// Before a decode: applies a pending shift to every layer's K on the backend
// (one kv_shift op), clears deltas, and uploads cell positions / sequence
// sets if they changed.
int kv_prepare(struct kv_cache *kv, const struct rope_params *rp, struct verr *err);

#endif
