// The KV cache bookkeeping and its backend buffers. Semantics follow
// llama.cpp's llama_kv_cache (find_slot, seq_rm/cp/keep/add/div, K shift);
// see kv.h for the contract of each function.
#include "kv/kv.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

// ---- small helpers -------------------------------------------------------

static uint64_t *cell_seq(const struct kv_cache *kv, int c) {
    return kv->seq + (size_t)c * kv->seq_words;
}

static bool cell_has(const struct kv_cache *kv, int c, int s) {
    return (cell_seq(kv, c)[s / 64] >> (s % 64)) & 1u;
}

static bool cell_is_empty(const struct kv_cache *kv, int c) {
    const uint64_t *w = cell_seq(kv, c);
    for (int i = 0; i < kv->seq_words; i++)
        if (w[i])
            return false;
    return true;
}

static void mark_dirty(struct kv_cache *kv, int c) {
    if (kv->dirty_lo >= kv->dirty_hi) {
        kv->dirty_lo = c;
        kv->dirty_hi = c + 1;
        return;
    }
    if (c < kv->dirty_lo)
        kv->dirty_lo = c;
    if (c + 1 > kv->dirty_hi)
        kv->dirty_hi = c + 1;
}

// Empties a non-empty cell; keeps the invariant of kv.h (delta 0 when empty:
// a freed cell must not carry a stale shift into its next token).
static void cell_free(struct kv_cache *kv, int c) {
    memset(cell_seq(kv, c), 0, (size_t)kv->seq_words * sizeof(uint64_t));
    kv->pos[c] = -1;
    kv->delta[c] = 0;
    kv->used--;
    mark_dirty(kv, c);
}

// Opens the ends of [p0, p1): negative p0 is 0, negative p1 is no bound.
static void range_open(int32_t *p0, int32_t *p1) {
    if (*p0 < 0)
        *p0 = 0;
    if (*p1 < 0)
        *p1 = INT32_MAX;
}

static bool in_range(int32_t pos, int32_t p0, int32_t p1) {
    return pos >= p0 && pos < p1;
}

static int check_seq(const struct kv_cache *kv, const char *fn, const char *what, int s,
                     struct verr *err) {
    if (s < 0 || s >= kv->cfg.n_seq_max)
        return verr_set(err, VERR_RANGE, "%s: %s id %d outside [0, %d)", fn, what, s,
                        kv->cfg.n_seq_max);
    return 0;
}

// ---- lifetime ------------------------------------------------------------

static int backend_fail(struct backend *be, struct verr *err, const char *what) {
    int code = be->err.code ? be->err.code : VERR_BACKEND;
    return verr_set(err, code, "kv: %s: %s", what, be->err.msg[0] ? be->err.msg : "backend error");
}

static int alloc_zeroed(struct backend *be, size_t bytes, void **out, const char *what,
                        struct verr *err) {
    *out = NULL;
    if (be->ops->alloc(be, bytes, out) != 0 || !*out) {
        *out = NULL;
        return backend_fail(be, err, what);
    }
    if (be->ops->memset_zero(be, *out, bytes) != 0)
        return backend_fail(be, err, what);
    return 0;
}

// bytes = a * b * c, or 0 on overflow.
static size_t mul3(size_t a, size_t b, size_t c) {
    if (a && b > SIZE_MAX / a)
        return 0;
    size_t ab = a * b;
    if (ab && c > SIZE_MAX / ab)
        return 0;
    return ab * c;
}

// A cache type be runs, whose blocks tile each head (backend_cache_type_quantized).
static int kv_check_type(struct backend *be, const char *which, enum ggml_type t, int head_dim,
                         struct verr *err) {
    if (!backend_supports_cache_type(be, t))
        return verr_set(err, VERR_UNSUPPORTED,
                        "kv_init: %s cache type %s is not supported by the %s backend (%s)", which,
                        ggml_type_name(t), be->ops->name,
                        backend_cache_type_quantized(t) ? "it supports f16/f32 caches only"
                                                        : "a cache type is f32, f16, bf16, q8_0, "
                                                          "q4_0, q4_1, q5_0, q5_1 or iq4_nl");
    const struct ggml_type_info *ti = ggml_type_get(t);
    if (!ti || head_dim % (int)ti->block_size != 0)
        return verr_set(err, VERR_UNSUPPORTED,
                        "kv_init: %s cache type %s stores blocks of %u values: the head dim %d "
                        "is not a multiple of it (use f16 or a type whose block divides it)",
                        which, ggml_type_name(t), ti ? ti->block_size : 0, head_dim);
    return 0;
}

int kv_init(struct kv_cache *kv, const struct kv_config *cfg, struct backend *be,
            struct verr *err) {
    memset(kv, 0, sizeof *kv);
    if (!cfg)
        return verr_set(err, VERR_RANGE, "kv_init: no configuration");
    struct kv_config c = *cfg;
    if (c.n_seq_max <= 0)
        c.n_seq_max = KV_SEQ_MAX_DEFAULT;
    if (c.n_ctx < 1)
        return verr_set(err, VERR_RANGE, "kv_init: n_ctx %d must be >= 1", c.n_ctx);
    if (c.n_seq_max > KV_SEQ_MAX_LIMIT)
        return verr_set(err, VERR_RANGE, "kv_init: n_seq_max %d above the limit %d", c.n_seq_max,
                        KV_SEQ_MAX_LIMIT);
    if (be) {
        if (!be->ops || !be->ops->alloc || !be->ops->free || !be->ops->upload ||
            !be->ops->memset_zero || !be->ops->kv_shift)
            return verr_set(err, VERR_UNSUPPORTED,
                            "kv_init: backend lacks alloc/free/upload/memset_zero/kv_shift");
        if (c.n_layer < 1 || c.n_head_kv < 1 || c.head_dim < 1 || c.head_dim_v < 1)
            return verr_set(err, VERR_RANGE,
                            "kv_init: n_layer %d, n_head_kv %d, head_dim %d, head_dim_v %d must "
                            "all be >= 1",
                            c.n_layer, c.n_head_kv, c.head_dim, c.head_dim_v);
        int rc = kv_check_type(be, "K", c.type_k, c.head_dim, err);
        if (rc || (rc = kv_check_type(be, "V", c.type_v, c.head_dim_v, err)))
            return rc;
        if (c.rot_k &&
            (!backend_hadamard_block_ok(c.head_dim, c.rot_k) || backend_cache_type_ok(c.type_k)))
            return verr_set(err, VERR_RANGE,
                            "kv_init: K rotation block %d with a %s K of head dim %d (a "
                            "quantized K and a power of two in [2, %d] dividing the head dim)",
                            c.rot_k, ggml_type_name(c.type_k), c.head_dim, BACKEND_HADAMARD_MAX);
    }

    int w = (c.n_seq_max + 63) / 64;
    size_t n = (size_t)c.n_ctx;
    kv->pos = malloc(n * sizeof *kv->pos);
    kv->delta = calloc(n, sizeof *kv->delta);
    kv->seq = calloc(n * (size_t)w, sizeof *kv->seq);
    if (!kv->pos || !kv->delta || !kv->seq) {
        kv_free(kv);
        return verr_set(err, VERR_NOMEM, "kv_init: no host memory for %d cells", c.n_ctx);
    }
    for (size_t i = 0; i < n; i++)
        kv->pos[i] = -1;
    kv->cfg = c;
    kv->seq_words = w;

    if (be) {
        kv->be = be;
        kv->k_row_bytes = ggml_row_bytes(c.type_k, (int64_t)c.n_head_kv * c.head_dim);
        kv->v_row_bytes = ggml_row_bytes(c.type_v, (int64_t)c.n_head_kv * c.head_dim_v);
        size_t kb = mul3(kv->k_row_bytes, n, (size_t)c.n_layer);
        size_t vb = mul3(kv->v_row_bytes, n, (size_t)c.n_layer);
        if (!kb || !vb) {
            kv_free(kv);
            return verr_set(err, VERR_RANGE, "kv_init: K/V size overflows");
        }
        int rc;
        if ((rc = alloc_zeroed(be, kb, &kv->k, "allocating K", err)) ||
            (rc = alloc_zeroed(be, vb, &kv->v, "allocating V", err)) ||
            (rc = alloc_zeroed(be, n * sizeof(int32_t), (void **)&kv->d_cell_pos,
                               "allocating cell positions", err)) ||
            (rc = alloc_zeroed(be, n * (size_t)w * sizeof(uint64_t), (void **)&kv->d_cell_seq,
                               "allocating cell sequences", err)) ||
            (rc = alloc_zeroed(be, n * sizeof(int32_t), (void **)&kv->d_delta, "allocating deltas",
                               err))) {
            kv_free(kv);
            return rc;
        }
        // The position mirror must say "empty" (-1), not 0, before the first
        // decode: mark every cell dirty so kv_prepare uploads them all.
        kv->dirty_lo = 0;
        kv->dirty_hi = c.n_ctx;
    }
    return 0;
}

void kv_free(struct kv_cache *kv) {
    if (!kv)
        return;
    struct backend *be = kv->be;
    if (be && be->ops && be->ops->free) {
        void *bufs[] = {kv->k, kv->v, kv->d_cell_pos, kv->d_cell_seq, kv->d_delta};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i])
                be->ops->free(be, bufs[i]);
    }
    free(kv->pos);
    free(kv->delta);
    free(kv->seq);
    memset(kv, 0, sizeof *kv);
}

int kv_clear(struct kv_cache *kv, struct verr *err) {
    if (!kv->pos)
        return 0; // never initialised, or freed
    kv->n_clears++;
    int n = kv->cfg.n_ctx;
    for (int i = 0; i < n; i++)
        kv->pos[i] = -1;
    memset(kv->delta, 0, (size_t)n * sizeof *kv->delta);
    memset(kv->seq, 0, (size_t)n * kv->seq_words * sizeof *kv->seq);
    kv->head = 0;
    kv->used = 0;
    kv->has_shift = false;
    kv->dirty_lo = 0;
    kv->dirty_hi = n;
    struct backend *be = kv->be;
    if (!be)
        return 0;
    size_t kb = kv->k_row_bytes * (size_t)n * (size_t)kv->cfg.n_layer;
    size_t vb = kv->v_row_bytes * (size_t)n * (size_t)kv->cfg.n_layer;
    if (be->ops->memset_zero(be, kv->k, kb) != 0 || be->ops->memset_zero(be, kv->v, vb) != 0)
        return backend_fail(be, err, "kv_clear: zeroing K/V");
    return 0;
}

void *kv_layer_k(const struct kv_cache *kv, int layer) {
    if (!kv->k || layer < 0 || layer >= kv->cfg.n_layer)
        return NULL;
    return (char *)kv->k + (size_t)layer * (size_t)kv->cfg.n_ctx * kv->k_row_bytes;
}

void *kv_layer_v(const struct kv_cache *kv, int layer) {
    if (!kv->v || layer < 0 || layer >= kv->cfg.n_layer)
        return NULL;
    return (char *)kv->v + (size_t)layer * (size_t)kv->cfg.n_ctx * kv->v_row_bytes;
}

// ---- slots ---------------------------------------------------------------

int kv_find_slot(struct kv_cache *kv, const int32_t *pos, const int32_t *seq, int n_tok,
                 int32_t *cells, struct verr *err) {
    const int n_ctx = kv->cfg.n_ctx;
    if (n_tok < 0)
        return verr_set(err, VERR_RANGE, "kv_find_slot: n_tok %d is negative", n_tok);
    if (n_tok == 0)
        return 0;
    for (int t = 0; t < n_tok; t++) {
        if (pos[t] < 0)
            return verr_set(err, VERR_RANGE, "kv_find_slot: token %d has position %d (< 0)", t,
                            pos[t]);
        if (seq[t] < 0 || seq[t] >= kv->cfg.n_seq_max)
            return verr_set(err, VERR_RANGE,
                            "kv_find_slot: token %d has sequence id %d outside [0, %d)", t, seq[t],
                            kv->cfg.n_seq_max);
    }
    if (n_tok > n_ctx)
        return verr_set(err, VERR_FULL,
                        "kv_find_slot: a batch of %d tokens does not fit a cache of %d cells",
                        n_tok, n_ctx);
    if (n_tok > n_ctx - kv->used)
        return verr_set(err, VERR_FULL, "kv_find_slot: cache full: %d tokens, %d of %d cells free",
                        n_tok, n_ctx - kv->used, n_ctx);

    // The search of llama.cpp's find_slot, on a local head so that a failed
    // search leaves the cache as it was. `tested` counts the candidate starts
    // ruled out; once it covers the cache no run exists.
    int h = kv->head, tested = 0;
    for (;;) {
        if (h + n_tok > n_ctx) {
            tested += n_ctx - h;
            h = 0;
            if (tested >= n_ctx)
                break;
            continue;
        }
        int busy = -1;
        for (int i = 0; i < n_tok; i++) {
            if (kv->pos[h + i] >= 0) {
                busy = i;
                break;
            }
        }
        if (busy < 0)
            goto found;
        h += busy + 1;
        tested += busy + 1;
        if (tested >= n_ctx)
            break;
    }
    return verr_set(err, VERR_FULL,
                    "kv_find_slot: no run of %d contiguous empty cells (%d of %d cells free, "
                    "fragmented)",
                    n_tok, n_ctx - kv->used, n_ctx);

found:
    for (int t = 0; t < n_tok; t++) {
        int c = h + t;
        kv->pos[c] = pos[t];
        kv->delta[c] = 0;
        cell_seq(kv, c)[seq[t] / 64] |= (uint64_t)1 << (seq[t] % 64);
        cells[t] = c;
        mark_dirty(kv, c);
    }
    kv->used += n_tok;
    kv->head = h + n_tok >= n_ctx ? 0 : h + n_tok;
    return 0;
}

int kv_n_kv(const struct kv_cache *kv) {
    const int n_ctx = kv->cfg.n_ctx;
    int last = 0; // one past the last non-empty cell
    for (int i = n_ctx - 1; i >= 0; i--) {
        if (kv->pos[i] >= 0) {
            last = i + 1;
            break;
        }
    }
    long n = ((long)last + KV_PAD - 1) / KV_PAD * KV_PAD;
    if (n < KV_PAD)
        n = KV_PAD;
    return n > n_ctx ? n_ctx : (int)n;
}

// ---- sequence ops --------------------------------------------------------

int kv_seq_rm(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, struct verr *err) {
    if (seq >= kv->cfg.n_seq_max)
        return verr_set(err, VERR_RANGE, "kv_seq_rm: sequence id %d outside [0, %d)", seq,
                        kv->cfg.n_seq_max);
    range_open(&p0, &p1);
    if (p0 >= p1)
        return 0;
    const int n_ctx = kv->cfg.n_ctx;
    int first_freed = -1;
    for (int i = 0; i < n_ctx; i++) {
        if (!in_range(kv->pos[i], p0, p1))
            continue; // empty cells have pos -1 and never match
        if (seq < 0) {
            cell_free(kv, i);
        } else if (cell_has(kv, i, seq)) {
            cell_seq(kv, i)[seq / 64] &= ~((uint64_t)1 << (seq % 64));
            mark_dirty(kv, i);
            if (!cell_is_empty(kv, i))
                continue;
            // the last sequence left: free the cell (the bits are already 0)
            cell_free(kv, i);
        } else {
            continue;
        }
        if (first_freed < 0)
            first_freed = i;
    }
    if (first_freed >= 0 && first_freed < kv->head)
        kv->head = first_freed;
    return 0;
}

int kv_seq_cp(struct kv_cache *kv, int src, int dst, int32_t p0, int32_t p1, struct verr *err) {
    int rc;
    if ((rc = check_seq(kv, "kv_seq_cp", "source sequence", src, err)) ||
        (rc = check_seq(kv, "kv_seq_cp", "destination sequence", dst, err)))
        return rc;
    range_open(&p0, &p1);
    if (src == dst || p0 >= p1)
        return 0;
    kv->head = 0;
    const int n_ctx = kv->cfg.n_ctx;
    for (int i = 0; i < n_ctx; i++) {
        if (in_range(kv->pos[i], p0, p1) && cell_has(kv, i, src) && !cell_has(kv, i, dst)) {
            cell_seq(kv, i)[dst / 64] |= (uint64_t)1 << (dst % 64);
            mark_dirty(kv, i);
        }
    }
    return 0;
}

int kv_seq_keep(struct kv_cache *kv, int seq, struct verr *err) {
    int rc = check_seq(kv, "kv_seq_keep", "sequence", seq, err);
    if (rc)
        return rc;
    const int n_ctx = kv->cfg.n_ctx, w = kv->seq_words;
    int first_freed = -1;
    for (int i = 0; i < n_ctx; i++) {
        if (kv->pos[i] < 0)
            continue;
        if (!cell_has(kv, i, seq)) {
            cell_free(kv, i);
            if (first_freed < 0)
                first_freed = i;
            continue;
        }
        uint64_t *bits = cell_seq(kv, i);
        bool other = false;
        for (int j = 0; j < w; j++) {
            uint64_t keep = j == seq / 64 ? (uint64_t)1 << (seq % 64) : 0;
            if (bits[j] != keep) {
                bits[j] = keep;
                other = true;
            }
        }
        if (other)
            mark_dirty(kv, i);
    }
    if (first_freed >= 0 && first_freed < kv->head)
        kv->head = first_freed;
    return 0;
}

int kv_seq_add(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int32_t delta,
               struct verr *err) {
    int rc = check_seq(kv, "kv_seq_add", "sequence", seq, err);
    if (rc)
        return rc;
    range_open(&p0, &p1);
    if (delta == 0 || p0 >= p1)
        return 0;
    const int n_ctx = kv->cfg.n_ctx;
    // A first pass refuses overflow before anything changes.
    for (int i = 0; i < n_ctx; i++) {
        if (!in_range(kv->pos[i], p0, p1) || !cell_has(kv, i, seq))
            continue;
        int64_t np = (int64_t)kv->pos[i] + delta, nd = (int64_t)kv->delta[i] + delta;
        if (np > INT32_MAX || nd > INT32_MAX || nd < INT32_MIN)
            return verr_set(err, VERR_RANGE,
                            "kv_seq_add: cell %d: position %d + %d or its accumulated delta %d "
                            "overflows",
                            i, kv->pos[i], delta, kv->delta[i]);
    }
    int first_freed = -1;
    for (int i = 0; i < n_ctx; i++) {
        if (!in_range(kv->pos[i], p0, p1) || !cell_has(kv, i, seq))
            continue;
        kv->has_shift = true;
        kv->pos[i] += delta;
        kv->delta[i] += delta;
        mark_dirty(kv, i);
        if (kv->pos[i] < 0) {
            cell_free(kv, i);
            if (first_freed < 0)
                first_freed = i;
        }
    }
    // llama.cpp: start the next search at the first freed cell, else at 0.
    kv->head = first_freed >= 0 ? first_freed : 0;
    return 0;
}

int kv_seq_div(struct kv_cache *kv, int seq, int32_t p0, int32_t p1, int d, struct verr *err) {
    int rc = check_seq(kv, "kv_seq_div", "sequence", seq, err);
    if (rc)
        return rc;
    if (d < 1)
        return verr_set(err, VERR_RANGE, "kv_seq_div: divisor %d must be >= 1", d);
    range_open(&p0, &p1);
    if (d == 1 || p0 >= p1)
        return 0;
    const int n_ctx = kv->cfg.n_ctx;
    for (int i = 0; i < n_ctx; i++) {
        if (!in_range(kv->pos[i], p0, p1) || !cell_has(kv, i, seq))
            continue;
        int64_t nd = (int64_t)kv->delta[i] + kv->pos[i] / d - kv->pos[i];
        if (nd < INT32_MIN)
            return verr_set(err, VERR_RANGE, "kv_seq_div: cell %d: accumulated delta %d overflows",
                            i, kv->delta[i]);
    }
    for (int i = 0; i < n_ctx; i++) {
        if (!in_range(kv->pos[i], p0, p1) || !cell_has(kv, i, seq))
            continue;
        int32_t old = kv->pos[i];
        kv->has_shift = true;
        kv->pos[i] = old / d;
        kv->delta[i] += kv->pos[i] - old;
        mark_dirty(kv, i);
    }
    return 0;
}

int32_t kv_seq_pos_max(const struct kv_cache *kv, int seq) {
    if (seq < 0 || seq >= kv->cfg.n_seq_max)
        return -1;
    int32_t m = -1;
    for (int i = 0; i < kv->cfg.n_ctx; i++)
        if (kv->pos[i] > m && cell_has(kv, i, seq))
            m = kv->pos[i];
    return m;
}

// ---- backend sync --------------------------------------------------------

int kv_prepare(struct kv_cache *kv, const struct rope_params *rp, struct verr *err) {
    struct backend *be = kv->be;
    const int n_ctx = kv->cfg.n_ctx;
    if (kv->has_shift) {
        bool any = false;
        for (int i = 0; i < n_ctx && !any; i++)
            any = kv->delta[i] != 0;
        if (any && be && rp) {
            const struct kv_config *c = &kv->cfg;
            if (be->ops->upload(be, kv->d_delta, kv->delta, (size_t)n_ctx * sizeof(int32_t)))
                return backend_fail(be, err, "kv_prepare: uploading deltas");
            if (be->ops->kv_shift(be, kv->k, c->type_k, kv->d_delta, c->n_layer, n_ctx,
                                  c->n_head_kv, c->head_dim, rp, c->rot_k))
                return backend_fail(be, err, "kv_prepare: K shift");
        }
        memset(kv->delta, 0, (size_t)n_ctx * sizeof *kv->delta);
        kv->has_shift = false;
    }
    if (kv->dirty_lo < kv->dirty_hi) {
        if (be) {
            size_t lo = (size_t)kv->dirty_lo, cnt = (size_t)(kv->dirty_hi - kv->dirty_lo);
            size_t w = (size_t)kv->seq_words;
            if (be->ops->upload(be, kv->d_cell_pos + lo, kv->pos + lo, cnt * sizeof(int32_t)))
                return backend_fail(be, err, "kv_prepare: uploading cell positions");
            if (be->ops->upload(be, kv->d_cell_seq + lo * w, kv->seq + lo * w,
                                cnt * w * sizeof(uint64_t)))
                return backend_fail(be, err, "kv_prepare: uploading cell sequences");
        }
        kv->dirty_lo = kv->dirty_hi = 0;
    }
    return 0;
}

// ---- context shift -------------------------------------------------------

int kv_context_shift(struct kv_cache *kv, int seq, int32_t n_keep, int32_t n_past,
                     int32_t *n_discard_out, struct verr *err) {
    int rc = check_seq(kv, "kv_context_shift", "sequence", seq, err);
    if (rc)
        return rc;
    if (n_keep < 0 || n_keep > n_past)
        return verr_set(err, VERR_RANGE, "kv_context_shift: n_keep %d must be in [0, n_past = %d]",
                        n_keep, n_past);
    int32_t n_discard = (n_past - n_keep) / 2;
    // Both ranges are within [0, n_past] and seq is valid: neither op can
    // fail (the add only lowers positions).
    if ((rc = kv_seq_rm(kv, seq, n_keep, n_keep + n_discard, err)) ||
        (rc = kv_seq_add(kv, seq, n_keep + n_discard, n_past, -n_discard, err)))
        return rc;
    if (n_discard_out)
        *n_discard_out = n_discard;
    return 0;
}

// --- following another cache ---------------------------------------------------

void kv_follow_range(struct kv_cache *dst, int lo, int hi, const int32_t *pos, const int32_t *delta,
                     const uint64_t *seq, int head, int used, bool has_shift) {
    if (lo < hi) {
        const size_t n = (size_t)(hi - lo), w = (size_t)dst->seq_words;
        memcpy(dst->pos + lo, pos, n * sizeof *pos);
        memcpy(dst->delta + lo, delta, n * sizeof *delta);
        memcpy(dst->seq + (size_t)lo * w, seq, n * w * sizeof *seq);
        if (dst->dirty_lo >= dst->dirty_hi) {
            dst->dirty_lo = lo;
            dst->dirty_hi = hi;
        } else {
            if (lo < dst->dirty_lo)
                dst->dirty_lo = lo;
            if (hi > dst->dirty_hi)
                dst->dirty_hi = hi;
        }
    }
    dst->head = head;
    dst->used = used;
    dst->has_shift = dst->has_shift || has_shift;
}

// Every change to a cell (claim, free, move, sequence set) marks it dirty
// until the next kv_prepare, and deltas are non-zero only on such cells, so
// the dirty range is everything that changed since the last decode.
void kv_follow(struct kv_cache *dst, const struct kv_cache *src) {
    const int lo = src->dirty_lo, hi = src->dirty_hi;
    const size_t w = (size_t)src->seq_words;
    kv_follow_range(dst, lo, hi, src->pos + (lo < hi ? lo : 0), src->delta + (lo < hi ? lo : 0),
                    src->seq + (lo < hi ? (size_t)lo * w : 0), src->head, src->used,
                    src->has_shift);
}
