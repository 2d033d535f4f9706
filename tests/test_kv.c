// The KV cache bookkeeping against llama.cpp's semantics: slot search, n_kv,
// every sequence op, error cases leaving the cache unchanged, kv_prepare's
// calls into the backend, the context shift, and the self-extend driver
// replaying the debugger walkthroughs of shared/seeds/000_*.
//
// Most tests run on a fake backend whose "device" memory is host memory, so
// the mirrors and the kv_shift call can be inspected directly.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "kv/selfextend.h"

// ---- a fake backend --------------------------------------------------------

struct fake {
    int n_alloc;         // successful allocations so far
    int live;            // allocations not freed yet
    int fail_alloc_at;   // the allocation with this index fails (-1: never)
    int fail_upload;     // uploads fail when set
    int n_upload;
    int n_shift;         // kv_shift calls
    int32_t *shift_delta;// copy of the deltas of the last kv_shift call [n_ctx]
    int shift_n_layer, shift_n_ctx, shift_n_head_kv, shift_head_dim;
    enum ggml_type shift_type;
    const void *shift_k;
    const struct rope_params *shift_rp;
};

static struct fake *fake_of(struct backend *be) {
    return be->impl;
}

static int fake_alloc(struct backend *be, size_t bytes, void **out) {
    struct fake *f = fake_of(be);
    if (f->n_alloc == f->fail_alloc_at) {
        be->err.code = VERR_NOMEM;
        snprintf(be->err.msg, sizeof be->err.msg, "fake: allocation %d refused", f->n_alloc);
        return VERR_NOMEM;
    }
    *out = malloc(bytes ? bytes : 1);
    // Garbage, so that a test notices memory kv forgot to initialise.
    memset(*out, 0xA5, bytes);
    f->n_alloc++;
    f->live++;
    return 0;
}

static void fake_free(struct backend *be, void *p) {
    fake_of(be)->live--;
    free(p);
}

static int fake_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct fake *f = fake_of(be);
    if (f->fail_upload) {
        be->err.code = VERR_BACKEND;
        snprintf(be->err.msg, sizeof be->err.msg, "fake: upload refused");
        return VERR_BACKEND;
    }
    f->n_upload++;
    memcpy(dst, src, bytes);
    return 0;
}

static int fake_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return 0;
}

static int fake_memset_zero(struct backend *be, void *dst, size_t bytes) {
    memset(dst, 0, bytes);
    return 0;
}

static int fake_sync(struct backend *be) {
    return 0;
}

static int fake_kv_shift(struct backend *be, void *k_cache, enum ggml_type type_k,
                         const int32_t *delta, int n_layer, int n_ctx, int n_head_kv,
                         int head_dim, const struct rope_params *rp, int rot_block) {
    struct fake *f = fake_of(be);
    f->n_shift++;
    free(f->shift_delta);
    f->shift_delta = malloc((size_t)n_ctx * sizeof(int32_t));
    memcpy(f->shift_delta, delta, (size_t)n_ctx * sizeof(int32_t));
    f->shift_n_layer = n_layer;
    f->shift_n_ctx = n_ctx;
    f->shift_n_head_kv = n_head_kv;
    f->shift_head_dim = head_dim;
    f->shift_type = type_k;
    f->shift_k = k_cache;
    f->shift_rp = rp;
    return 0;
}

static const struct backend_ops fake_ops = {
    .name = "fake",
    .alloc = fake_alloc,
    .free = fake_free,
    .upload = fake_upload,
    .download = fake_download,
    .memset_zero = fake_memset_zero,
    .sync = fake_sync,
    .kv_shift = fake_kv_shift,
};

static struct fake g_fake;
static struct backend g_be;

static struct backend *fake_backend(void) {
    free(g_fake.shift_delta);
    memset(&g_fake, 0, sizeof g_fake);
    g_fake.fail_alloc_at = -1;
    memset(&g_be, 0, sizeof g_be);
    g_be.ops = &fake_ops;
    g_be.impl = &g_fake;
    return &g_be;
}

// ---- helpers ---------------------------------------------------------------

static const struct rope_params g_rope = {
    .mode = ROPE_MODE_NORMAL, .n_rot = 4, .n_ctx_orig = 4096, .freq_base = 10000.0f,
    .freq_scale = 1.0f, .attn_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
};

static struct kv_config small_cfg(int n_ctx) {
    return (struct kv_config){.n_ctx = n_ctx, .n_layer = 2, .n_head_kv = 2, .head_dim = 4,
                              .head_dim_v = 3, .type_k = GGML_TYPE_F32,
                              .type_v = GGML_TYPE_F16, .n_seq_max = 0};
}

// A cache of n_ctx cells on the fake backend.
static void make(struct kv_cache *kv, int n_ctx) {
    struct verr err = {0};
    struct kv_config cfg = small_cfg(n_ctx);
    int rc = kv_init(kv, &cfg, fake_backend(), &err);
    cr_assert_eq(rc, 0, "kv_init: %s", err.msg);
}

// Claims n cells for seq at positions p0, p0+1, ... in one batch; returns the first cell.
static int fill(struct kv_cache *kv, int seq, int p0, int n) {
    int32_t *pos = malloc(n * sizeof *pos), *sq = malloc(n * sizeof *sq),
            *cells = malloc(n * sizeof *cells);
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        sq[i] = seq;
    }
    struct verr err = {0};
    int rc = kv_find_slot(kv, pos, sq, n, cells, &err);
    cr_assert_eq(rc, 0, "kv_find_slot(%d tokens): %s", n, err.msg);
    for (int i = 1; i < n; i++)
        cr_assert_eq(cells[i], cells[0] + i, "a slot is contiguous");
    int first = cells[0];
    free(pos);
    free(sq);
    free(cells);
    return first;
}

static void expect_cell(const struct kv_cache *kv, int c, int32_t pos, int32_t delta,
                        const char *where) {
    cr_expect_eq(kv_cell_pos(kv, c), pos, "%s: cell %d pos %d, want %d", where, c,
                 kv_cell_pos(kv, c), pos);
    cr_expect_eq(kv_cell_delta(kv, c), delta, "%s: cell %d delta %d, want %d", where, c,
                 kv_cell_delta(kv, c), delta);
}

static int count_used(const struct kv_cache *kv) {
    int n = 0;
    for (int i = 0; i < kv->cfg.n_ctx; i++)
        n += kv->pos[i] >= 0;
    return n;
}

// Checks the invariant of kv.h on every cell.
static void expect_invariant(const struct kv_cache *kv) {
    for (int c = 0; c < kv->cfg.n_ctx; c++) {
        bool any = false;
        for (int s = 0; s < kv->cfg.n_seq_max; s++)
            any |= kv_cell_has_seq(kv, c, s);
        cr_expect_eq(kv->pos[c] >= 0, any, "cell %d: pos %d but sequence set %s", c, kv->pos[c],
                     any ? "non-empty" : "empty");
        cr_expect(kv->pos[c] >= -1, "cell %d pos %d", c, kv->pos[c]);
        if (kv->pos[c] < 0)
            cr_expect_eq(kv->delta[c], 0, "empty cell %d has delta %d", c, kv->delta[c]);
    }
    cr_expect_eq(kv->used, count_used(kv), "used %d, %d cells non-empty", kv->used,
                 count_used(kv));
    cr_expect(kv->head >= 0 && kv->head < kv->cfg.n_ctx, "head %d", kv->head);
}

// A copy of everything a failed call must leave alone.
struct snap {
    int n_ctx, words;
    int32_t *pos, *delta;
    uint64_t *seq;
    int head, used, dirty_lo, dirty_hi;
    bool has_shift;
};

static struct snap snap_take(const struct kv_cache *kv) {
    struct snap s = {.n_ctx = kv->cfg.n_ctx, .words = kv->seq_words, .head = kv->head,
                     .used = kv->used, .dirty_lo = kv->dirty_lo, .dirty_hi = kv->dirty_hi,
                     .has_shift = kv->has_shift};
    size_t n = (size_t)s.n_ctx;
    s.pos = malloc(n * sizeof *s.pos);
    s.delta = malloc(n * sizeof *s.delta);
    s.seq = malloc(n * s.words * sizeof *s.seq);
    memcpy(s.pos, kv->pos, n * sizeof *s.pos);
    memcpy(s.delta, kv->delta, n * sizeof *s.delta);
    memcpy(s.seq, kv->seq, n * s.words * sizeof *s.seq);
    return s;
}

static void snap_expect_same(const struct snap *s, const struct kv_cache *kv, const char *what) {
    size_t n = (size_t)s->n_ctx;
    cr_expect(!memcmp(s->pos, kv->pos, n * sizeof *s->pos), "%s changed positions", what);
    cr_expect(!memcmp(s->delta, kv->delta, n * sizeof *s->delta), "%s changed deltas", what);
    cr_expect(!memcmp(s->seq, kv->seq, n * s->words * sizeof *s->seq), "%s changed sequences",
              what);
    cr_expect_eq(s->head, kv->head, "%s changed head %d -> %d", what, s->head, kv->head);
    cr_expect_eq(s->used, kv->used, "%s changed used", what);
    cr_expect_eq(s->has_shift, kv->has_shift, "%s changed has_shift", what);
    cr_expect(s->dirty_lo == kv->dirty_lo && s->dirty_hi == kv->dirty_hi,
              "%s changed the dirty range", what);
}

static void snap_free(struct snap *s) {
    free(s->pos);
    free(s->delta);
    free(s->seq);
}

// ---- init / free -----------------------------------------------------------

Test(kv, init_empty) {
    struct kv_cache kv;
    make(&kv, 64);
    cr_expect_eq(kv.cfg.n_seq_max, KV_SEQ_MAX_DEFAULT);
    cr_expect_eq(kv.seq_words, 1);
    cr_expect_eq(kv.head, 0);
    cr_expect_eq(kv.used, 0);
    cr_expect(!kv.has_shift);
    for (int c = 0; c < 64; c++)
        expect_cell(&kv, c, -1, 0, "init");
    expect_invariant(&kv);
    cr_expect_eq(kv_n_kv(&kv), 32, "llama.cpp: an empty cache still attends KV_PAD cells");
    for (int s = 0; s < 64; s++)
        cr_expect_eq(kv_seq_pos_max(&kv, s), -1);

    // Buffers: K is [n_layer][n_ctx][2 heads][4] f32, V [n_layer][n_ctx][2][3] f16.
    cr_expect_eq(kv.k_row_bytes, 2 * 4 * 4);
    cr_expect_eq(kv.v_row_bytes, 2 * 3 * 2);
    cr_expect_eq(kv_layer_k(&kv, 0), kv.k);
    cr_expect_eq((char *)kv_layer_k(&kv, 1), (char *)kv.k + 64 * 32);
    cr_expect_eq((char *)kv_layer_v(&kv, 1), (char *)kv.v + 64 * 12);
    cr_expect_null(kv_layer_k(&kv, 2));
    cr_expect_null(kv_layer_v(&kv, -1));
    // K and V zeroed (the fake fills allocations with 0xA5).
    const unsigned char *k = kv.k, *v = kv.v;
    for (size_t i = 0; i < 2 * 64 * kv.k_row_bytes; i++)
        cr_assert_eq(k[i], 0, "K byte %zu not zeroed", i);
    for (size_t i = 0; i < 2 * 64 * kv.v_row_bytes; i++)
        cr_assert_eq(v[i], 0, "V byte %zu not zeroed", i);

    // The first kv_prepare tells the device that every cell is empty.
    struct verr err = {0};
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0, "%s", err.msg);
    for (int c = 0; c < 64; c++)
        cr_expect_eq(kv.d_cell_pos[c], -1, "mirror of cell %d", c);
    for (int c = 0; c < 64; c++)
        cr_expect_eq(kv.d_cell_seq[c], 0, "mirror of cell %d's set", c);
    cr_expect_eq(g_fake.n_shift, 0);

    kv_free(&kv);
    cr_expect_eq(g_fake.live, 0, "every backend buffer freed");
    kv_free(&kv); // twice is harmless
}

Test(kv, init_seq_words) {
    struct verr err = {0};
    struct kv_config cfg = small_cfg(16);
    struct kv_cache kv;
    cfg.n_seq_max = 65;
    cr_assert_eq(kv_init(&kv, &cfg, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.seq_words, 2);
    cr_expect_null(kv.k, "no backend, no K");
    cr_expect_null(kv_layer_k(&kv, 0));
    kv_free(&kv);
    cfg.n_seq_max = 128;
    cr_assert_eq(kv_init(&kv, &cfg, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.seq_words, 2);
    kv_free(&kv);
    cfg.n_seq_max = 4;
    cr_assert_eq(kv_init(&kv, &cfg, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.seq_words, 1);
    cr_expect_eq(kv.cfg.n_seq_max, 4);
    kv_free(&kv);
}

Test(kv, init_errors) {
    struct verr err = {0};
    struct kv_cache kv;
    struct kv_config cfg = small_cfg(0);
    cr_expect_eq(kv_init(&kv, &cfg, fake_backend(), &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "n_ctx"), "message names n_ctx: %s", err.msg);
    cr_expect_eq(g_fake.live, 0);

    cfg = small_cfg(16);
    cfg.type_k = GGML_TYPE_Q4_0;
    cr_expect_eq(kv_init(&kv, &cfg, fake_backend(), &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "q4_0"), "message names the type: %s", err.msg);

    cfg = small_cfg(16);
    cfg.n_layer = 0;
    cr_expect_eq(kv_init(&kv, &cfg, fake_backend(), &err), VERR_RANGE);
    cfg.n_seq_max = KV_SEQ_MAX_LIMIT + 1;
    cfg.n_layer = 2;
    cr_expect_eq(kv_init(&kv, &cfg, fake_backend(), &err), VERR_RANGE);
    cr_expect_eq(kv_init(&kv, NULL, fake_backend(), &err), VERR_RANGE);

    // Each of the five backend allocations failing: the error comes back,
    // nothing leaks, the cache is left zeroed and kv_free is harmless.
    for (int at = 0; at < 5; at++) {
        cfg = small_cfg(16);
        fake_backend()->impl = &g_fake;
        g_fake.fail_alloc_at = at;
        memset(&err, 0, sizeof err);
        cr_expect_eq(kv_init(&kv, &cfg, &g_be, &err), VERR_NOMEM, "allocation %d", at);
        cr_expect(strstr(err.msg, "refused"), "backend message passed on: %s", err.msg);
        cr_expect_eq(g_fake.live, 0, "allocation %d failing leaks %d buffers", at, g_fake.live);
        cr_expect_null(kv.pos);
        kv_free(&kv);
    }
}

// ---- find_slot -------------------------------------------------------------

// seeds/004: a 6-token prompt in a 1024-cell cache takes cells 0..5 and
// attends n_kv = 32 cells.
Test(kv, find_slot_prompt) {
    struct kv_cache kv;
    make(&kv, 1024);
    int32_t pos[6] = {0, 1, 2, 3, 4, 5}, seq[6] = {0}, cells[6];
    struct verr err = {0};
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 6, cells, &err), 0, "%s", err.msg);
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(cells[i], i);
        expect_cell(&kv, i, i, 0, "prompt");
        cr_expect(kv_cell_has_seq(&kv, i, 0));
        cr_expect(!kv_cell_has_seq(&kv, i, 1));
    }
    cr_expect_eq(kv.used, 6);
    cr_expect_eq(kv.head, 6, "head moves past the slot (llama.cpp's ring-buffer advance)");
    cr_expect_eq(kv_n_kv(&kv), 32);
    cr_expect_eq(kv_seq_pos_max(&kv, 0), 5);
    cr_expect(kv.dirty_lo == 0 && kv.dirty_hi >= 6, "claimed cells are dirty");

    // the next token goes to cell 6
    int32_t p = 6, s = 0, c;
    cr_assert_eq(kv_find_slot(&kv, &p, &s, 1, &c, &err), 0, "%s", err.msg);
    cr_expect_eq(c, 6);
    cr_expect_eq(kv.used, 7);
    // n_tok == 0 does nothing
    struct snap sn = snap_take(&kv);
    cr_expect_eq(kv_find_slot(&kv, NULL, NULL, 0, NULL, &err), 0);
    snap_expect_same(&sn, &kv, "an empty batch");
    snap_free(&sn);
    expect_invariant(&kv);
    kv_free(&kv);
}

// The search starts at head, skips past busy cells and wraps to 0 when the
// run would pass the end (llama.cpp's find_slot).
Test(kv, find_slot_wraps) {
    struct kv_cache kv;
    make(&kv, 8);
    struct verr err = {0};
    fill(&kv, 0, 0, 8); // cells 0..7 hold positions 0..7
    cr_expect_eq(kv.head, 0, "head wraps to 0 at the end of the cache");
    cr_expect_eq(kv.used, 8);
    cr_assert_eq(kv_seq_rm(&kv, 0, 0, 4, &err), 0, "%s", err.msg); // frees cells 0..3
    cr_expect_eq(kv.used, 4);
    cr_expect_eq(kv.head, 0, "freed cell 0 is not below head 0");

    // head at 6: cells 6, 7 are busy, 6 + 3 > 8 -> wraps and finds cells 0..2.
    kv.head = 6;
    int32_t pos[3] = {100, 101, 102}, seq[3] = {1, 1, 1}, cells[3];
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 3, cells, &err), 0, "%s", err.msg);
    cr_expect(cells[0] == 0 && cells[1] == 1 && cells[2] == 2, "slot at %d", cells[0]);
    cr_expect_eq(kv.head, 3);
    cr_expect_eq(kv.used, 7);

    // one free cell (3): a 1-token batch from head 3 takes it; then full.
    int32_t p = 7, s = 1, c;
    cr_assert_eq(kv_find_slot(&kv, &p, &s, 1, &c, &err), 0, "%s", err.msg);
    cr_expect_eq(c, 3);
    cr_expect_eq(kv.used, 8);
    struct snap sn = snap_take(&kv);
    cr_expect_eq(kv_find_slot(&kv, &p, &s, 1, &c, &err), VERR_FULL);
    cr_expect(strstr(err.msg, "full"), "%s", err.msg);
    snap_expect_same(&sn, &kv, "a find_slot on a full cache");
    snap_free(&sn);
    expect_invariant(&kv);
    kv_free(&kv);
}

// A run may end exactly at the last cell but never pass it.
Test(kv, find_slot_run_at_the_end) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 8);
    fill(&kv, 0, 0, 6);
    cr_assert_eq(kv_seq_rm(&kv, 0, 0, 3, &err), 0); // cells 3..5 busy, 0..2 and 6..7 free
    kv.head = 6;
    int32_t pos[3] = {10, 11, 12}, seq[3] = {0, 0, 0}, cells[3];
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 3, cells, &err), 0, "%s", err.msg);
    cr_expect_eq(cells[0], 0, "3 cells from 6 would pass the end: wrap to 0");
    cr_expect_eq(kv.head, 3);
    kv.head = 6;
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 2, cells, &err), 0, "%s", err.msg);
    cr_expect(cells[0] == 6 && cells[1] == 7, "2 cells fit at 6..7, got %d", cells[0]);
    cr_expect_eq(kv.head, 0, "head wraps after the last cell");
    expect_invariant(&kv);
    kv_free(&kv);
}

// Free cells exist but no run is long enough: VERR_FULL, head as it was.
Test(kv, find_slot_fragmented) {
    struct kv_cache kv;
    make(&kv, 8);
    struct verr err = {0};
    fill(&kv, 0, 0, 8);
    for (int p = 0; p < 8; p += 2)
        cr_assert_eq(kv_seq_rm(&kv, 0, p, p + 1, &err), 0); // cells 0,2,4,6 free
    cr_expect_eq(kv.used, 4);
    kv.head = 5;
    struct snap sn = snap_take(&kv);
    int32_t pos[2] = {8, 9}, seq[2] = {0, 0}, cells[2];
    cr_expect_eq(kv_find_slot(&kv, pos, seq, 2, cells, &err), VERR_FULL);
    cr_expect(strstr(err.msg, "contiguous"), "%s", err.msg);
    snap_expect_same(&sn, &kv, "a failed search");
    snap_free(&sn);
    // a single token still fits: from head 5 the first empty cell is 6
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 1, cells, &err), 0, "%s", err.msg);
    cr_expect_eq(cells[0], 6);
    kv_free(&kv);
}

Test(kv, find_slot_bad_input) {
    struct kv_cache kv;
    make(&kv, 8);
    struct verr err = {0};
    fill(&kv, 0, 0, 3);
    struct snap sn = snap_take(&kv);
    int32_t pos[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11}, seq[9] = {0}, cells[9];

    cr_expect_eq(kv_find_slot(&kv, pos, seq, 9, cells, &err), VERR_FULL, "batch > n_ctx");
    cr_expect(strstr(err.msg, "9 tokens") && strstr(err.msg, "8 cells"), "%s", err.msg);
    snap_expect_same(&sn, &kv, "a batch larger than the cache");
    cr_expect_eq(kv_find_slot(&kv, pos, seq, 6, cells, &err), VERR_FULL, "6 > 5 free");
    snap_expect_same(&sn, &kv, "a batch larger than the free cells");

    seq[1] = 64; // n_seq_max is 64
    cr_expect_eq(kv_find_slot(&kv, pos, seq, 2, cells, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "64"), "%s", err.msg);
    snap_expect_same(&sn, &kv, "a sequence id out of range");
    seq[1] = -1;
    cr_expect_eq(kv_find_slot(&kv, pos, seq, 2, cells, &err), VERR_RANGE);
    seq[1] = 0;
    pos[1] = -1;
    cr_expect_eq(kv_find_slot(&kv, pos, seq, 2, cells, &err), VERR_RANGE);
    cr_expect_eq(kv_find_slot(&kv, pos, seq, -1, cells, &err), VERR_RANGE);
    snap_expect_same(&sn, &kv, "a negative position / count");
    snap_free(&sn);
    kv_free(&kv);
}

// ---- n_kv ------------------------------------------------------------------

Test(kv, n_kv) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 100);
    fill(&kv, 0, 0, 32);
    cr_expect_eq(kv_n_kv(&kv), 32, "cells 0..31");
    fill(&kv, 0, 32, 1);
    cr_expect_eq(kv_n_kv(&kv), 64, "cell 32 -> 64");
    fill(&kv, 0, 33, 60);
    cr_expect_eq(kv_n_kv(&kv), 96, "cells up to 92 -> 96");
    fill(&kv, 0, 93, 4);
    cr_expect_eq(kv_n_kv(&kv), 100, "cell 96 -> 128, capped at n_ctx 100");
    // window shrinks as the tail is freed; holes below the last cell count
    cr_assert_eq(kv_seq_rm(&kv, 0, 40, -1, &err), 0);
    cr_expect_eq(kv_n_kv(&kv), 64, "last used cell 39");
    cr_assert_eq(kv_seq_rm(&kv, 0, 0, 39, &err), 0);
    cr_expect_eq(kv_n_kv(&kv), 64, "only cell 39 left");
    cr_assert_eq(kv_seq_rm(&kv, -1, -1, -1, &err), 0);
    cr_expect_eq(kv_n_kv(&kv), 32);
    kv_free(&kv);

    make(&kv, 16);
    cr_expect_eq(kv_n_kv(&kv), 16, "KV_PAD capped at a small n_ctx");
    kv_free(&kv);
}

// ---- sequence ops ----------------------------------------------------------

Test(kv, seq_rm) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 10);  // cells 0..9: seq 0, pos 0..9
    fill(&kv, 1, 0, 10);  // cells 10..19: seq 1, pos 0..9
    cr_expect_eq(kv.head, 20);

    cr_assert_eq(kv_seq_rm(&kv, 0, 3, 6, &err), 0, "%s", err.msg);
    for (int c = 0; c < 10; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), c >= 3 && c < 6 ? -1 : c, "cell %d", c);
    for (int c = 10; c < 20; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), c - 10, "seq 1 untouched");
    cr_expect_eq(kv.used, 17);
    cr_expect_eq(kv.head, 3, "head moves back to the first freed cell");
    cr_expect_eq(kv_seq_pos_max(&kv, 0), 9);

    // open end: [7, inf) of seq 1
    cr_assert_eq(kv_seq_rm(&kv, 1, 7, -1, &err), 0);
    cr_expect_eq(kv_seq_pos_max(&kv, 1), 6);
    cr_expect_eq(kv.used, 14);
    cr_expect_eq(kv.head, 3, "freed cells 17.. are above head");

    // open start: [0, 2) of seq 0
    cr_assert_eq(kv_seq_rm(&kv, 0, -1, 2, &err), 0);
    cr_expect_eq(kv_cell_pos(&kv, 0), -1);
    cr_expect_eq(kv_cell_pos(&kv, 1), -1);
    cr_expect_eq(kv.head, 0);
    cr_expect_eq(kv.used, 12);

    // an empty range and a sequence with no cells are no-ops
    struct snap sn = snap_take(&kv);
    cr_assert_eq(kv_seq_rm(&kv, 0, 8, 8, &err), 0);
    cr_assert_eq(kv_seq_rm(&kv, 0, 9, 2, &err), 0);
    cr_assert_eq(kv_seq_rm(&kv, 5, -1, -1, &err), 0);
    snap_expect_same(&sn, &kv, "an empty rm");
    snap_free(&sn);

    // seq < 0: every sequence, in range [6, 9)
    kv.head = 20;
    cr_assert_eq(kv_seq_rm(&kv, -1, 6, 9, &err), 0);
    for (int c = 0; c < 20; c++) {
        int p = c < 10 ? c : c - 10;
        if (p >= 6 && p < 9)
            cr_expect_eq(kv_cell_pos(&kv, c), -1, "cell %d freed", c);
    }
    cr_expect_eq(kv.head, 6, "first freed cell 6 < head 20");
    expect_invariant(&kv);

    // everything
    cr_assert_eq(kv_seq_rm(&kv, -1, -1, -1, &err), 0);
    cr_expect_eq(kv.used, 0);
    for (int s = 0; s < 2; s++)
        cr_expect_eq(kv_seq_pos_max(&kv, s), -1);
    expect_invariant(&kv);
    kv_free(&kv);
}

// Cells shared through seq_cp stay until the last sequence leaves them.
Test(kv, seq_cp_shares_cells) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 8); // cells 0..7
    cr_expect_eq(kv.head, 8);
    cr_assert_eq(kv_seq_cp(&kv, 0, 1, -1, -1, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.head, 0, "llama.cpp's seq_cp restarts the search at 0");
    cr_expect_eq(kv.used, 8, "shared, not copied");
    for (int c = 0; c < 8; c++)
        cr_expect(kv_cell_has_seq(&kv, c, 0) && kv_cell_has_seq(&kv, c, 1), "cell %d", c);
    cr_expect_eq(kv_seq_pos_max(&kv, 1), 7);

    // a partial copy to the last sequence id
    cr_assert_eq(kv_seq_cp(&kv, 0, 63, 2, 5, &err), 0);
    for (int c = 0; c < 8; c++)
        cr_expect_eq(kv_cell_has_seq(&kv, c, 63), c >= 2 && c < 5, "cell %d", c);
    cr_expect_eq(kv_seq_pos_max(&kv, 63), 4);

    // removing seq 0 keeps the cells (seq 1 still holds them)
    kv.head = 8;
    cr_assert_eq(kv_seq_rm(&kv, 0, -1, -1, &err), 0);
    cr_expect_eq(kv.used, 8);
    cr_expect_eq(kv.head, 8, "nothing freed");
    cr_expect_eq(kv_seq_pos_max(&kv, 0), -1);
    for (int c = 0; c < 8; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), c);
    // removing seq 1 frees those not held by 63
    cr_assert_eq(kv_seq_rm(&kv, 1, -1, -1, &err), 0);
    cr_expect_eq(kv.used, 3);
    cr_expect_eq(kv.head, 0);
    for (int c = 0; c < 8; c++)
        cr_expect_eq(kv_cell_pos(&kv, c), c >= 2 && c < 5 ? c : -1, "cell %d", c);
    expect_invariant(&kv);

    // src == dst and empty ranges do nothing
    struct snap sn = snap_take(&kv);
    cr_assert_eq(kv_seq_cp(&kv, 63, 63, -1, -1, &err), 0);
    cr_assert_eq(kv_seq_cp(&kv, 63, 2, 3, 3, &err), 0);
    snap_expect_same(&sn, &kv, "a no-op seq_cp");
    snap_free(&sn);
    kv_free(&kv);
}

Test(kv, seq_cp_wide_bitset) {
    struct verr err = {0};
    struct kv_config cfg = small_cfg(16);
    cfg.n_seq_max = 200;
    struct kv_cache kv;
    cr_assert_eq(kv_init(&kv, &cfg, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.seq_words, 4);
    fill(&kv, 199, 0, 4);
    cr_assert_eq(kv_seq_cp(&kv, 199, 130, -1, -1, &err), 0);
    cr_assert_eq(kv_seq_cp(&kv, 130, 64, 1, -1, &err), 0);
    cr_expect_eq(kv_seq_pos_max(&kv, 64), 3);
    cr_expect(!kv_cell_has_seq(&kv, 0, 64));
    cr_assert_eq(kv_seq_keep(&kv, 64, &err), 0);
    cr_expect_eq(kv.used, 3);
    for (int c = 1; c < 4; c++)
        cr_expect(kv_cell_has_seq(&kv, c, 64) && !kv_cell_has_seq(&kv, c, 130) &&
                      !kv_cell_has_seq(&kv, c, 199),
                  "cell %d holds only 64", c);
    cr_expect_eq(kv_seq_cp(&kv, 64, 200, -1, -1, &err), VERR_RANGE);
    expect_invariant(&kv);
    kv_free(&kv);
}

Test(kv, seq_keep) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 4);  // cells 0..3
    fill(&kv, 1, 0, 4);  // cells 4..7
    fill(&kv, 2, 0, 4);  // cells 8..11
    cr_assert_eq(kv_seq_cp(&kv, 0, 2, 0, 2, &err), 0); // cells 0, 1 shared by 0 and 2
    kv.head = 12;
    cr_assert_eq(kv_seq_keep(&kv, 2, &err), 0, "%s", err.msg);
    for (int c = 0; c < 12; c++) {
        bool kept = c < 2 || c >= 8;
        cr_expect_eq(kv_cell_pos(&kv, c) >= 0, kept, "cell %d", c);
        if (kept)
            cr_expect(kv_cell_has_seq(&kv, c, 2) && !kv_cell_has_seq(&kv, c, 0),
                      "cell %d holds seq 2 alone", c);
    }
    cr_expect_eq(kv.used, 6);
    cr_expect_eq(kv.head, 2, "first freed cell");
    cr_expect_eq(kv_seq_pos_max(&kv, 0), -1);
    cr_expect_eq(kv_seq_pos_max(&kv, 1), -1);
    cr_expect_eq(kv_seq_pos_max(&kv, 2), 3);
    expect_invariant(&kv);
    kv_free(&kv);
}

Test(kv, seq_add) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 10); // cells 0..9
    fill(&kv, 1, 0, 10); // cells 10..19
    cr_assert_eq(kv_seq_cp(&kv, 0, 2, 8, -1, &err), 0); // cells 8, 9 shared with seq 2
    kv.head = 20;

    cr_assert_eq(kv_seq_add(&kv, 0, 5, -1, 3, &err), 0, "%s", err.msg);
    for (int c = 0; c < 10; c++)
        expect_cell(&kv, c, c < 5 ? c : c + 3, c < 5 ? 0 : 3, "add +3");
    for (int c = 10; c < 20; c++)
        expect_cell(&kv, c, c - 10, 0, "seq 1 untouched");
    cr_expect(kv.has_shift);
    cr_expect_eq(kv.head, 0, "nothing freed: the next search starts at 0");
    cr_expect_eq(kv_seq_pos_max(&kv, 2), 12, "a shared cell moves for every sequence in it");

    // -4 over [0, 6): cells 0..3 fall below 0 and are freed; 4 -> 0; cell 5
    // is now at 8, outside the range.
    kv.head = 20;
    cr_assert_eq(kv_seq_add(&kv, 0, -1, 6, -4, &err), 0);
    for (int c = 0; c < 4; c++)
        expect_cell(&kv, c, -1, 0, "freed");
    expect_cell(&kv, 4, 0, -4, "add -4");
    expect_cell(&kv, 5, 8, 3, "out of range");
    cr_expect_eq(kv.used, 16);
    cr_expect_eq(kv.head, 0, "first freed cell");

    // no-ops: delta 0, p0 == p1
    kv.head = 7;
    struct snap sn = snap_take(&kv);
    cr_assert_eq(kv_seq_add(&kv, 1, -1, -1, 0, &err), 0);
    cr_assert_eq(kv_seq_add(&kv, 1, 4, 4, 5, &err), 0);
    snap_expect_same(&sn, &kv, "a no-op seq_add");
    snap_free(&sn);

    // overflow is refused before anything moves
    sn = snap_take(&kv);
    cr_expect_eq(kv_seq_add(&kv, 1, -1, -1, INT32_MAX - 5, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "overflow"), "%s", err.msg);
    snap_expect_same(&sn, &kv, "an overflowing seq_add");
    snap_free(&sn);
    expect_invariant(&kv);
    kv_free(&kv);
}

// llama.cpp: with nothing freed, seq_add sends head to 0; when it frees, to
// the first freed cell even above head.
Test(kv, seq_add_head) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 16);
    fill(&kv, 0, 0, 4);   // cells 0..3, pos 0..3
    fill(&kv, 1, 0, 4);   // cells 4..7, pos 0..3
    kv.head = 2;
    cr_assert_eq(kv_seq_add(&kv, 1, -1, -1, -2, &err), 0); // frees cells 4, 5
    cr_expect_eq(kv.head, 4);
    cr_expect_eq(kv.used, 6);
    expect_cell(&kv, 6, 0, -2, "moved");
    expect_invariant(&kv);
    kv_free(&kv);
}

Test(kv, seq_div) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 12);
    kv.head = 5;
    cr_assert_eq(kv_seq_div(&kv, 0, 2, 10, 3, &err), 0, "%s", err.msg);
    static const int32_t want[12] = {0, 1, 0, 1, 1, 1, 2, 2, 2, 3, 10, 11};
    for (int c = 0; c < 12; c++)
        expect_cell(&kv, c, want[c], want[c] - c, "div 3");
    cr_expect(kv.has_shift);
    cr_expect_eq(kv.head, 5, "seq_div leaves head alone");
    cr_expect_eq(kv.used, 12);

    struct snap sn = snap_take(&kv);
    cr_assert_eq(kv_seq_div(&kv, 0, -1, -1, 1, &err), 0, "d == 1");
    cr_assert_eq(kv_seq_div(&kv, 0, 3, 3, 2, &err), 0, "p0 == p1");
    snap_expect_same(&sn, &kv, "a no-op seq_div");
    cr_expect_eq(kv_seq_div(&kv, 0, -1, -1, 0, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "divisor"), "%s", err.msg);
    cr_expect_eq(kv_seq_div(&kv, 0, -1, -1, -2, &err), VERR_RANGE);
    snap_expect_same(&sn, &kv, "a bad divisor");
    snap_free(&sn);

    // open ends, accumulating onto the deltas above
    cr_assert_eq(kv_seq_div(&kv, 0, -1, -1, 2, &err), 0);
    for (int c = 0; c < 12; c++)
        expect_cell(&kv, c, want[c] / 2, want[c] / 2 - c, "div 2 over div 3");
    expect_invariant(&kv);
    kv_free(&kv);
}

// Every op refuses a sequence id out of range and leaves the cache as it was.
Test(kv, bad_seq_ids_leave_cache_unchanged) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 16);
    fill(&kv, 0, 0, 5);
    cr_assert_eq(kv_seq_add(&kv, 0, 2, -1, 1, &err), 0);
    struct snap sn = snap_take(&kv);
    const int bad[] = {64, 1000, -1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int s = bad[i];
        memset(&err, 0, sizeof err);
        if (s >= 0) {
            cr_expect_eq(kv_seq_rm(&kv, s, -1, -1, &err), VERR_RANGE, "rm %d", s);
            cr_expect(strstr(err.msg, "[0, 64)"), "%s", err.msg);
        }
        cr_expect_eq(kv_seq_cp(&kv, s, 1, -1, -1, &err), VERR_RANGE, "cp from %d", s);
        cr_expect_eq(kv_seq_cp(&kv, 0, s, -1, -1, &err), VERR_RANGE, "cp to %d", s);
        cr_expect_eq(kv_seq_keep(&kv, s, &err), VERR_RANGE, "keep %d", s);
        cr_expect_eq(kv_seq_add(&kv, s, -1, -1, 3, &err), VERR_RANGE, "add %d", s);
        cr_expect_eq(kv_seq_div(&kv, s, -1, -1, 2, &err), VERR_RANGE, "div %d", s);
        cr_expect_eq(kv_seq_pos_max(&kv, s), -1);
        int32_t nd = 77;
        cr_expect_eq(kv_context_shift(&kv, s, 0, 4, &nd, &err), VERR_RANGE);
        cr_expect_eq(nd, 77);
        snap_expect_same(&sn, &kv, "a bad sequence id");
    }
    snap_free(&sn);
    kv_free(&kv);
}

// ---- kv_prepare ------------------------------------------------------------

Test(kv, prepare_shift_calls_backend_once) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 64);
    fill(&kv, 0, 0, 10);
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0, "%s", err.msg);
    cr_expect_eq(g_fake.n_shift, 0, "nothing pending");
    for (int c = 0; c < 64; c++)
        cr_expect_eq(kv.d_cell_pos[c], c < 10 ? c : -1, "mirror of cell %d", c);
    cr_expect(kv.dirty_lo >= kv.dirty_hi, "clean after prepare");

    cr_assert_eq(kv_seq_div(&kv, 0, 0, 4, 2, &err), 0);
    cr_assert_eq(kv_seq_add(&kv, 0, 4, -1, -2, &err), 0);
    int32_t want[64];
    memcpy(want, kv.delta, sizeof want);
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0, "%s", err.msg);
    cr_expect_eq(g_fake.n_shift, 1, "one kv_shift over every layer");
    cr_expect_eq(g_fake.shift_n_layer, 2);
    cr_expect_eq(g_fake.shift_n_ctx, 64);
    cr_expect_eq(g_fake.shift_n_head_kv, 2);
    cr_expect_eq(g_fake.shift_head_dim, 4);
    cr_expect_eq(g_fake.shift_type, GGML_TYPE_F32);
    cr_expect_eq(g_fake.shift_k, kv.k);
    cr_expect_eq(g_fake.shift_rp, &g_rope);
    cr_expect(!memcmp(g_fake.shift_delta, want, sizeof want), "the deltas reach the op");
    cr_expect_eq(g_fake.shift_delta[1], -1);
    cr_expect_eq(g_fake.shift_delta[9], -2);
    for (int c = 0; c < 64; c++)
        cr_expect_eq(kv.delta[c], 0, "delta of cell %d cleared", c);
    cr_expect(!kv.has_shift);
    for (int c = 0; c < 10; c++)
        cr_expect_eq(kv.d_cell_pos[c], kv.pos[c], "mirror follows the shift, cell %d", c);

    // nothing pending: no second call, no upload
    int uploads = g_fake.n_upload;
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
    cr_expect_eq(g_fake.n_shift, 1);
    cr_expect_eq(g_fake.n_upload, uploads, "nothing dirty, nothing uploaded");

    // shifts that cancel out: has_shift but every delta 0 -> no op call
    cr_assert_eq(kv_seq_add(&kv, 0, -1, -1, 5, &err), 0);
    cr_assert_eq(kv_seq_add(&kv, 0, -1, -1, -5, &err), 0);
    cr_expect(kv.has_shift);
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
    cr_expect_eq(g_fake.n_shift, 1, "zero deltas need no rotation");
    cr_expect(!kv.has_shift);

    // no rope (rp NULL): deltas dropped, K untouched
    cr_assert_eq(kv_seq_add(&kv, 0, -1, -1, 3, &err), 0);
    cr_assert_eq(kv_prepare(&kv, NULL, &err), 0);
    cr_expect_eq(g_fake.n_shift, 1);
    cr_expect(!kv.has_shift);
    cr_expect_eq(kv.delta[0], 0);
    kv_free(&kv);
}

// Only the changed cells travel; sequence sets follow too.
Test(kv, prepare_uploads_mirrors) {
    struct kv_cache kv;
    struct verr err = {0};
    struct kv_config cfg = small_cfg(64);
    cfg.n_seq_max = 100;
    cr_assert_eq(kv_init(&kv, &cfg, fake_backend(), &err), 0, "%s", err.msg);
    fill(&kv, 0, 0, 20);
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
    cr_assert_eq(kv_seq_cp(&kv, 0, 70, 5, 8, &err), 0);
    cr_expect_eq(kv.dirty_lo, 5);
    cr_expect_eq(kv.dirty_hi, 8);
    // poison the mirror outside the dirty range: it must not be rewritten
    kv.d_cell_pos[0] = 1234;
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
    cr_expect_eq(kv.d_cell_pos[0], 1234, "clean cells are not uploaded again");
    for (int c = 0; c < 20; c++) {
        uint64_t w1 = kv.d_cell_seq[c * 2 + 1];
        cr_expect_eq(kv.d_cell_seq[c * 2], 1u, "cell %d word 0", c);
        cr_expect_eq(w1, c >= 5 && c < 8 ? (uint64_t)1 << 6 : 0, "cell %d word 1", c);
    }
    kv_free(&kv);
}

Test(kv, prepare_backend_error_keeps_pending) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 4);
    cr_assert_eq(kv_seq_add(&kv, 0, -1, -1, 2, &err), 0);
    g_fake.fail_upload = 1;
    cr_expect_eq(kv_prepare(&kv, &g_rope, &err), VERR_BACKEND);
    cr_expect(strstr(err.msg, "upload refused"), "%s", err.msg);
    cr_expect(kv.has_shift, "still pending");
    cr_expect_eq(kv.delta[0], 2);
    cr_expect(kv.dirty_lo < kv.dirty_hi);
    g_fake.fail_upload = 0;
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0, "%s", err.msg);
    cr_expect_eq(g_fake.n_shift, 1);
    cr_expect_eq(g_fake.shift_delta[3], 2);
    kv_free(&kv);
}

Test(kv, clear) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 3, 0, 10);
    cr_assert_eq(kv_seq_add(&kv, 3, 2, -1, 5, &err), 0);
    memset(kv.k, 0x7f, 10 * kv.k_row_bytes);
    cr_assert_eq(kv_clear(&kv, &err), 0, "%s", err.msg);
    cr_expect_eq(kv.used, 0);
    cr_expect_eq(kv.head, 0);
    cr_expect(!kv.has_shift);
    expect_invariant(&kv);
    for (size_t i = 0; i < 10 * kv.k_row_bytes; i++)
        cr_assert_eq(((unsigned char *)kv.k)[i], 0, "K zeroed");
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
    cr_expect_eq(g_fake.n_shift, 0);
    for (int c = 0; c < 32; c++)
        cr_expect_eq(kv.d_cell_pos[c], -1);
    kv_free(&kv);
}

// ---- context shift ---------------------------------------------------------

// llama-cli at n_past 20 with n_keep 4: discards (20-4)/2 = 8 positions
// [4, 12) and moves [12, 20) down by 8.
Test(kv, context_shift) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 32);
    fill(&kv, 0, 0, 20);
    fill(&kv, 1, 0, 5); // another sequence, untouched
    int32_t n_discard = -1;
    cr_assert_eq(kv_context_shift(&kv, 0, 4, 20, &n_discard, &err), 0, "%s", err.msg);
    cr_expect_eq(n_discard, 8);
    for (int c = 0; c < 4; c++)
        expect_cell(&kv, c, c, 0, "kept");
    for (int c = 4; c < 12; c++)
        expect_cell(&kv, c, -1, 0, "discarded");
    for (int c = 12; c < 20; c++)
        expect_cell(&kv, c, c - 8, -8, "moved down");
    for (int c = 20; c < 25; c++)
        expect_cell(&kv, c, c - 20, 0, "seq 1");
    cr_expect_eq(kv.used, 17);
    cr_expect_eq(kv_seq_pos_max(&kv, 0), 11, "the next token goes at n_past - n_discard = 12");
    cr_expect_eq(kv.head, 0, "llama.cpp: a seq_add that frees nothing restarts the search at 0");
    cr_expect(kv.has_shift);
    expect_invariant(&kv);

    // the freed run takes the next batch
    int first = fill(&kv, 0, 12, 8);
    cr_expect_eq(first, 4);

    struct snap sn = snap_take(&kv);
    cr_expect_eq(kv_context_shift(&kv, 0, 21, 20, &n_discard, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "n_keep"), "%s", err.msg);
    cr_expect_eq(kv_context_shift(&kv, 0, -1, 20, &n_discard, &err), VERR_RANGE);
    snap_expect_same(&sn, &kv, "a bad context shift");
    snap_free(&sn);
    // n_keep == n_past: nothing to discard
    cr_assert_eq(kv_context_shift(&kv, 0, 20, 20, &n_discard, &err), 0);
    cr_expect_eq(n_discard, 0);
    kv_free(&kv);
}

// ---- self-extend: the walkthroughs of seeds/000_* ---------------------------

// Records every log line and, at each, a copy of the cells: the driver logs
// each op's line right before running the op, so the copy at line k+1 is the
// state after op k.
#define MAX_LINES 64
struct trace {
    struct kv_cache *kv;
    int n;
    char lines[MAX_LINES][96];
    int32_t *pos[MAX_LINES], *delta[MAX_LINES];
};

static void trace_log(void *user, const char *line) {
    struct trace *t = user;
    cr_assert_lt(t->n, MAX_LINES);
    snprintf(t->lines[t->n], sizeof t->lines[0], "%s", line);
    size_t bytes = (size_t)t->kv->cfg.n_ctx * sizeof(int32_t);
    t->pos[t->n] = malloc(bytes);
    t->delta[t->n] = malloc(bytes);
    memcpy(t->pos[t->n], t->kv->pos, bytes);
    memcpy(t->delta[t->n], t->kv->delta, bytes);
    t->n++;
}

static void trace_reset(struct trace *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->pos[i]);
        free(t->delta[i]);
    }
    t->n = 0;
}

static void expect_traced(const struct trace *t, int line, int c, int32_t pos, int32_t delta,
                          const char *where) {
    cr_expect_eq(t->pos[line][c], pos, "%s: cell %d pos %d, want %d", where, c, t->pos[line][c],
                 pos);
    cr_expect_eq(t->delta[line][c], delta, "%s: cell %d delta %d, want %d", where, c,
                 t->delta[line][c], delta);
}

static void expect_lines(const struct trace *t, int from, const char *const *want, int n) {
    for (int i = 0; i < n; i++)
        cr_expect_str_eq(t->lines[from + i], want[i], "log line %d", from + i);
}

// expect_cell / expect_traced over cells 0..n-1 (pos[c], delta[c]), or over
// a table of {cell, pos, delta}; line < 0: the cache now, else the trace.
struct cell_want {
    int c, pos, delta;
};

static void expect_run(const struct kv_cache *kv, const struct trace *t, int line,
                       const int32_t *pos, const int32_t *delta, int n, const char *where) {
    for (int c = 0; c < n; c++)
        if (line < 0)
            expect_cell(kv, c, pos[c], delta[c], where);
        else
            expect_traced(t, line, c, pos[c], delta[c], where);
}

static void expect_table(const struct kv_cache *kv, const struct trace *t, int line,
                         const struct cell_want *w, size_t n, const char *where) {
    for (size_t i = 0; i < n; i++)
        if (line < 0)
            expect_cell(kv, w[i].c, w[i].pos, w[i].delta, where);
        else
            expect_traced(t, line, w[i].c, w[i].pos, w[i].delta, where);
}

// seeds/000: ga_n = 2, ga_w = 4 on a 5-token prompt, then three decoded
// tokens and the second round.
Test(selfextend, seed_gan2_gaw4_prompt5) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 64);
    struct kv_selfextend se;
    cr_assert_eq(kv_selfextend_init(&se, &kv, 2, 4, 0, &err), 0, "%s", err.msg);
    struct trace t = {.kv = &kv};
    se.log = trace_log;
    se.log_user = &t;

    int32_t n_past = 0;
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0);
    cr_expect_eq(t.n, 0, "nothing to do before the prompt");
    fill(&kv, 0, 0, 5);
    n_past = 5;
    cr_expect_eq(kv.used, 5);

    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n, 3, "one round, three lines");
    static const char *const round1[] = {
        "shift: [     0,      5] +      0 -> [     0,      5]",
        "div:   [     0,      4] /      2 -> [     0,      2]",
        "shift: [     4,      5] +     -2 -> [     2,      3]",
    };
    expect_lines(&t, 0, round1, 3);
    // after seq_add(0, 0, 5, 0): delta 0, a no-op
    for (int c = 0; c < 5; c++)
        expect_traced(&t, 1, c, c, 0, "after the first shift");
    // after seq_div(0, 0, 4, 2)
    static const int32_t div_pos[5] = {0, 0, 1, 1, 4}, div_delta[5] = {0, -1, -1, -2, 0};
    expect_run(&kv, &t, 2, div_pos, div_delta, 5, "after the div");
    // after seq_add(0, 4, 5, -2): positions 0,0,1,1,2
    static const int32_t fin_pos[5] = {0, 0, 1, 1, 2}, fin_delta[5] = {0, -1, -1, -2, -2};
    expect_run(&kv, NULL, -1, fin_pos, fin_delta, 5, "after round 1");
    expect_cell(&kv, 5, -1, 0, "empty");
    cr_expect_eq(n_past, 3);
    cr_expect_eq(se.ga_i, 2);
    cr_expect(kv.has_shift);

    // decode: the pending shift goes to K, deltas clear
    cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0, "%s", err.msg);
    cr_expect_eq(g_fake.n_shift, 1);
    for (int c = 0; c < 5; c++)
        cr_expect_eq(g_fake.shift_delta[c], fin_delta[c], "shift of cell %d", c);
    trace_reset(&t);

    // three single-token decodes at positions 3, 4, 5; the loop stays idle
    // until n_past reaches ga_i + ga_w = 6
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0);
        cr_expect_eq(t.n, 0, "n_past %d < 6", n_past);
        fill(&kv, 0, n_past, 1);
        cr_assert_eq(kv_prepare(&kv, &g_rope, &err), 0);
        n_past++;
    }
    cr_expect_eq(n_past, 6);
    static const int32_t before2[8] = {0, 0, 1, 1, 2, 3, 4, 5};
    for (int c = 0; c < 8; c++)
        expect_cell(&kv, c, before2[c], 0, "before round 2");

    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n, 3);
    static const char *const round2[] = {
        "shift: [     2,      6] +      2 -> [     4,      8]",
        "div:   [     4,      8] /      2 -> [     2,      4]",
        "shift: [     8,      8] +     -4 -> [     4,      4]",
    };
    expect_lines(&t, 0, round2, 3);
    // after seq_add(0, 2, 6, 2): cells 4..7 at 4..7 with delta 2
    for (int c = 0; c < 4; c++)
        expect_traced(&t, 1, c, before2[c], 0, "first shift, untouched");
    for (int c = 4; c < 8; c++)
        expect_traced(&t, 1, c, c, 2, "after the first shift");
    // after seq_div(0, 4, 8, 2); the last shift ([8, 8)) is empty
    static const int32_t fin2_pos[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    static const int32_t fin2_delta[8] = {0, 0, 0, 0, 0, -1, -1, -2};
    expect_run(&kv, &t, 2, fin2_pos, fin2_delta, 8, "after the div");
    expect_run(&kv, NULL, -1, fin2_pos, fin2_delta, 8, "after round 2");
    cr_expect_eq(n_past, 4);
    cr_expect_eq(se.ga_i, 4);
    expect_invariant(&kv);
    trace_reset(&t);
    kv_free(&kv);
}

// A 2048-token batch in a bookkeeping-only cache of n_ctx cells.
static void prompt_2048(struct kv_cache *kv, int n_ctx) {
    struct verr err = {0};
    struct kv_config cfg = small_cfg(n_ctx);
    cr_assert_eq(kv_init(kv, &cfg, NULL, &err), 0, "%s", err.msg);
    fill(kv, 0, 0, 2048);
}

// The seeds' 2048-token start: prompt_2048 in 8192 cells, self-extend
// (ga_n, ga_w) on sequence 0 logging into *t, and the first apply at n_past
// 2048.
static void seed_2048(struct kv_cache *kv, struct kv_selfextend *se, struct trace *t, int ga_n,
                      int ga_w, int32_t *n_past) {
    struct verr err = {0};
    prompt_2048(kv, 8192);
    cr_assert_eq(kv_selfextend_init(se, kv, ga_n, ga_w, 0, &err), 0, "%s", err.msg);
    *t = (struct trace){.kv = kv};
    se->log = trace_log;
    se->log_user = t;
    *n_past = 2048;
    cr_assert_eq(kv_selfextend_apply(se, kv, n_past, &err), 0, "%s", err.msg);
}

// seeds/000: ga_n = 2, ga_w = 2048 after a 2048-token batch.
Test(selfextend, seed_gan2_gaw2048) {
    struct kv_cache kv;
    struct kv_selfextend se;
    struct trace t;
    int32_t n_past;
    seed_2048(&kv, &se, &t, 2, 2048, &n_past);
    static const char *const lines[] = {
        "shift: [     0,   2048] +      0 -> [     0,   2048]",
        "div:   [     0,   2048] /      2 -> [     0,   1024]",
        "shift: [  2048,   2048] +  -1024 -> [  1024,   1024]",
    };
    cr_assert_eq(t.n, 3);
    expect_lines(&t, 0, lines, 3);
    static const struct cell_want want[] = {
        {0, 0, 0},           {1, 0, -1},          {2, 1, -1},          {3, 1, -2},
        {4, 2, -2},          {5, 2, -3},          {2044, 1022, -1022}, {2045, 1022, -1023},
        {2046, 1023, -1023}, {2047, 1023, -1024},
    };
    expect_table(&kv, NULL, -1, want, sizeof want / sizeof want[0], "ga_n 2 ga_w 2048");
    cr_expect_eq(n_past, 1024);
    cr_expect_eq(se.ga_i, 1024);
    cr_expect_eq(kv_seq_pos_max(&kv, 0), 1023);
    trace_reset(&t);
    kv_free(&kv);
}

// seeds/000: ga_n = 4, ga_w = 2048 after a 2048-token batch.
Test(selfextend, seed_gan4_gaw2048) {
    struct kv_cache kv;
    struct kv_selfextend se;
    struct trace t;
    int32_t n_past;
    seed_2048(&kv, &se, &t, 4, 2048, &n_past);
    static const char *const lines[] = {
        "shift: [     0,   2048] +      0 -> [     0,   2048]",
        "div:   [     0,   2048] /      4 -> [     0,    512]",
        "shift: [  2048,   2048] +  -1536 -> [   512,    512]",
    };
    cr_assert_eq(t.n, 3);
    expect_lines(&t, 0, lines, 3);
    static const int32_t pos[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const int32_t delta[8] = {0, -1, -2, -3, -3, -4, -5, -6};
    expect_run(&kv, NULL, -1, pos, delta, 8, "ga_n 4 ga_w 2048");
    expect_cell(&kv, 2047, 511, 511 - 2047, "last cell");
    cr_expect_eq(n_past, 512);
    cr_expect_eq(se.ga_i, 512);
    trace_reset(&t);
    kv_free(&kv);
}

// seeds/000: ga_n = 4, ga_w = 256 after a 2048-token batch: the first round
// leaves cell 255 at 63 (delta -192) and n_past 1856, and the loop goes on.
Test(selfextend, seed_gan4_gaw256) {
    struct kv_cache kv;
    struct kv_selfextend se;
    struct trace t;
    int32_t n_past;
    seed_2048(&kv, &se, &t, 4, 256, &n_past);

    static const char *const round1[] = {
        "shift: [     0,   2048] +      0 -> [     0,   2048]",
        "div:   [     0,    256] /      4 -> [     0,     64]",
        "shift: [   256,   2048] +   -192 -> [    64,   1856]",
    };
    expect_lines(&t, 0, round1, 3);
    // after the div (state at line 2)
    expect_traced(&t, 2, 255, 63, -192, "after the div");
    expect_traced(&t, 2, 256, 256, 0, "after the div, not yet shifted");
    // after the last shift of round 1 (state at line 3, the next round's first)
    expect_traced(&t, 3, 256, 64, -192, "after round 1");
    expect_traced(&t, 3, 2047, 1855, -192, "after round 1");
    // round 2 (ga_i 64, n_past 1856): ib 1, bd 192, dd -384
    static const char *const round2[] = {
        "shift: [    64,   1856] +    192 -> [   256,   2048]",
        "div:   [   256,    512] /      4 -> [    64,    128]",
        "shift: [   512,   2048] +   -384 -> [   128,   1664]",
    };
    expect_lines(&t, 3, round2, 3);
    // After round 2's first seq_add(64, 1856, +192). The seed's gdb stop
    // inside that loop showed cell 256 at {256, -192} (pos already moved,
    // delta not yet) and cell 257 still at 65 (not reached yet); once the
    // op is complete both are back at their original positions, delta 0.
    expect_traced(&t, 4, 256, 256, 0, "after round 2's first shift");
    expect_traced(&t, 4, 257, 257, 0, "after round 2's first shift");
    expect_traced(&t, 4, 255, 63, -192, "below the range");
    // after round 2's div: the window 256..511 grouped by 4
    expect_traced(&t, 5, 256, 64, -192, "after round 2's div");
    expect_traced(&t, 5, 511, 127, -384, "after round 2's div");
    expect_traced(&t, 5, 512, 512, 0, "after round 2's div, not yet shifted");

    // The loop goes on while n_past >= ga_i + 256: 8 rounds in all, n_past
    // 2048 - 8*192 = 512, ga_i 8*64 = 512; every cell ends at c / 4.
    cr_expect_eq(t.n, 24, "8 rounds");
    cr_expect_eq(n_past, 512);
    cr_expect_eq(se.ga_i, 512);
    for (int c = 0; c < 2048; c++) {
        cr_assert_eq(kv_cell_pos(&kv, c), c / 4, "cell %d", c);
        cr_assert_eq(kv_cell_delta(&kv, c), c / 4 - c, "cell %d", c);
    }
    static const char *const last[] = {
        "shift: [   448,    704] +   1344 -> [  1792,   2048]",
        "div:   [  1792,   2048] /      4 -> [   448,    512]",
        "shift: [  2048,   2048] +  -1536 -> [   512,    512]",
    };
    expect_lines(&t, 21, last, 3);
    // another call does nothing until n_past reaches 768
    trace_reset(&t);
    struct verr err = {0};
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0);
    cr_expect_eq(t.n, 0);
    cr_expect_eq(n_past, 512);
    kv_free(&kv);
}

// seeds/000: ga_n = 2, ga_w = 1024 takes two rounds within one call.
Test(selfextend, seed_gan2_gaw1024) {
    struct kv_cache kv;
    struct kv_selfextend se;
    struct trace t;
    int32_t n_past;
    seed_2048(&kv, &se, &t, 2, 1024, &n_past);
    cr_assert_eq(t.n, 6, "two rounds");
    static const char *const lines[] = {
        "shift: [     0,   2048] +      0 -> [     0,   2048]",
        "div:   [     0,   1024] /      2 -> [     0,    512]",
        "shift: [  1024,   2048] +   -512 -> [   512,   1536]",
        "shift: [   512,   1536] +    512 -> [  1024,   2048]",
        "div:   [  1024,   2048] /      2 -> [   512,   1024]",
        "shift: [  2048,   2048] +  -1024 -> [  1024,   1024]",
    };
    expect_lines(&t, 0, lines, 6);

    // after round 1 (state at line 3): "n_past_old = 2048, n_past = 1536, ga_i = 512"
    static const struct cell_want r1[] = {
        {0, 0, 0},  {1, 0, -1},        {2, 1, -1},        {3, 1, -2},        {4, 2, -2},
        {5, 2, -3}, {1022, 511, -511}, {1023, 511, -512}, {1024, 512, -512}, {1025, 513, -512},
    };
    expect_table(&kv, &t, 3, r1, sizeof r1 / sizeof r1[0], "after round 1");
    // after round 1's div only, cells 1024.. still at their positions
    expect_traced(&t, 2, 1024, 1024, 0, "after round 1's div");
    expect_traced(&t, 2, 1025, 1025, 0, "after round 1's div");

    // after round 2, as the seed's gdb shows (deltas accumulate across rounds:
    // no kv_prepare ran in between)
    static const struct cell_want r2[] = {
        {1024, 512, -512}, {1025, 512, -513}, {1026, 513, -513},
        {1027, 513, -514}, {1028, 514, -514}, {1029, 514, -515},
    };
    expect_table(&kv, NULL, -1, r2, sizeof r2 / sizeof r2[0], "after round 2");
    cr_expect_eq(n_past, 1024);
    cr_expect_eq(se.ga_i, 1024);
    for (int c = 0; c < 2048; c++)
        cr_assert_eq(kv_cell_pos(&kv, c), c / 2, "the same grouping as ga_w 2048, cell %d", c);
    trace_reset(&t);
    kv_free(&kv);
}

Test(selfextend, validation) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 64);
    struct kv_selfextend se = {.ga_n = 99};
    cr_expect_eq(kv_selfextend_init(&se, &kv, 0, 4, 0, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "ga_n"), "%s", err.msg);
    cr_expect_eq(se.ga_n, 99, "untouched on error");
    cr_expect_eq(kv_selfextend_init(&se, &kv, 3, 4, 0, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "multiple"), "%s", err.msg);
    cr_expect_eq(kv_selfextend_init(&se, &kv, 2, 128, 0, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "n_ctx"), "%s", err.msg);
    cr_expect_eq(kv_selfextend_init(&se, &kv, 2, 0, 0, &err), VERR_RANGE);
    cr_expect_eq(kv_selfextend_init(&se, &kv, 2, 4, 64, &err), VERR_RANGE);
    cr_expect_eq(kv_selfextend_init(&se, &kv, 2, 4, -1, &err), VERR_RANGE);
    cr_expect_eq(kv_selfextend_init(&se, &kv, 2, 64, 0, &err), 0, "ga_w == n_ctx is fine");

    // a hand-filled struct is checked by apply too, before anything moves
    fill(&kv, 0, 0, 10);
    struct snap sn = snap_take(&kv);
    int32_t n_past = 10;
    se = (struct kv_selfextend){.ga_n = 3, .ga_w = 4};
    cr_expect_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), VERR_RANGE);
    cr_expect_eq(n_past, 10);
    snap_expect_same(&sn, &kv, "a bad self-extend");
    snap_free(&sn);

    // ga_n == 1 disables it
    cr_assert_eq(kv_selfextend_init(&se, &kv, 1, 4, 0, &err), 0);
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0);
    cr_expect_eq(n_past, 10);
    cr_expect_eq(se.ga_i, 0);
    cr_expect(!kv.has_shift);
    kv_free(&kv);
}

// The driver moves only its own sequence.
Test(selfextend, other_sequence) {
    struct kv_cache kv;
    struct verr err = {0};
    make(&kv, 64);
    fill(&kv, 0, 0, 5);  // cells 0..4
    fill(&kv, 3, 0, 5);  // cells 5..9
    struct kv_selfextend se;
    cr_assert_eq(kv_selfextend_init(&se, &kv, 2, 4, 3, &err), 0, "%s", err.msg);
    int32_t n_past = 5;
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0, "%s", err.msg);
    static const int32_t pos[5] = {0, 0, 1, 1, 2};
    for (int c = 0; c < 5; c++) {
        expect_cell(&kv, c, c, 0, "seq 0 untouched");
        cr_expect_eq(kv_cell_pos(&kv, 5 + c), pos[c], "seq 3 cell %d", 5 + c);
    }
    cr_expect_eq(n_past, 3);
    kv_free(&kv);
}

// ---- the shift on the CPU backend -------------------------------------------

#include <math.h>

#include "gguf/quant.h"

// Deterministic values in [-1, 1).
static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 23) - 1.0f;
}

struct shift_case {
    enum ggml_type type_k;
    enum rope_mode mode;
    bool freq_factors;
    float tol; // largest |actual - expected| allowed; K values are within ~1.94
};

#define SH_CTX 96
#define SH_LAYERS 2
#define SH_HEADS 2
#define SH_DIM 8  // head_dim; n_rot 6 leaves dims 6, 7 unrotated
#define SH_ROW (SH_HEADS * SH_DIM)

// Stores raw K (and V) of n tokens at positions pos[] through the backend's
// rope_kv_store, as the forward pass does, into the cells kv_find_slot gives.
static void store_tokens(struct backend *be, struct kv_cache *kv, const struct rope_params *rp,
                         const float *raw_k /* [SH_LAYERS][n][SH_ROW] */, const int32_t *pos,
                         int n, int32_t *cells) {
    struct verr err = {0};
    int32_t seq[SH_CTX] = {0};
    cr_assert_eq(kv_find_slot(kv, pos, seq, n, cells, &err), 0, "%s", err.msg);
    // The forward pass's order: find_slot, kv_prepare (pending shift), store.
    cr_assert_eq(kv_prepare(kv, rp, &err), 0, "%s", err.msg);
    void *dk, *dv, *dpos, *dcells;
    size_t kb = (size_t)n * SH_ROW * sizeof(float);
    cr_assert_eq(be->ops->alloc(be, kb, &dk), 0);
    cr_assert_eq(be->ops->alloc(be, kb, &dv), 0);
    cr_assert_eq(be->ops->alloc(be, (size_t)n * 4, &dpos), 0);
    cr_assert_eq(be->ops->alloc(be, (size_t)n * 4, &dcells), 0);
    cr_assert_eq(be->ops->upload(be, dpos, pos, (size_t)n * 4), 0);
    cr_assert_eq(be->ops->upload(be, dcells, cells, (size_t)n * 4), 0);
    for (int l = 0; l < SH_LAYERS; l++) {
        cr_assert_eq(be->ops->upload(be, dk, raw_k + (size_t)l * n * SH_ROW, kb), 0);
        cr_assert_eq(be->ops->upload(be, dv, raw_k + (size_t)l * n * SH_ROW, kb), 0);
        int rc = be->ops->rope_kv_store(be, NULL, 0, dk, dv, kv_layer_k(kv, l), kv->cfg.type_k,
                                        kv_layer_v(kv, l), kv->cfg.type_v, dpos, dcells, n,
                                        SH_HEADS, SH_DIM, SH_DIM, rp);
        cr_assert_eq(rc, 0, "rope_kv_store: %s", be->err.msg);
    }
    cr_assert_eq(be->ops->sync(be), 0);
    be->ops->free(be, dk);
    be->ops->free(be, dv);
    be->ops->free(be, dpos);
    be->ops->free(be, dcells);
}

// n tokens of random raw K (and V) at positions p0.. stored as above; each
// token's raw K is recorded under the cell it landed in.
static void store_random(struct backend *be, struct kv_cache *kv, const struct rope_params *rp,
                         uint32_t *s, int32_t p0, int n,
                         float raw_by_cell[SH_LAYERS][SH_CTX][SH_ROW]) {
    static float raw[SH_LAYERS * SH_CTX * SH_ROW];
    int32_t cells[SH_CTX], pos[SH_CTX];
    for (int i = 0; i < SH_LAYERS * n * SH_ROW; i++)
        raw[i] = rnd(s);
    for (int t = 0; t < n; t++)
        pos[t] = p0 + t;
    store_tokens(be, kv, rp, raw, pos, n, cells);
    for (int l = 0; l < SH_LAYERS; l++)
        for (int t = 0; t < n; t++)
            memcpy(raw_by_cell[l][cells[t]], raw + ((size_t)l * n + t) * SH_ROW,
                   sizeof raw_by_cell[0][0]);
}

// After self-extend and a context shift, kv_prepare's rotation by delta must
// leave every cell's K equal to its un-rotated K rotated once, directly, to
// the cell's final position by the backend's rope op (which applies the YaRN
// magnitude once: the shift must be a pure rotation).
static void check_shift(const struct shift_case *sc) {
    struct backend *be = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    struct kv_config cfg = {.n_ctx = SH_CTX, .n_layer = SH_LAYERS, .n_head_kv = SH_HEADS,
                            .head_dim = SH_DIM, .head_dim_v = SH_DIM, .type_k = sc->type_k,
                            .type_v = sc->type_k, .n_seq_max = 4};
    struct kv_cache kv;
    cr_assert_eq(kv_init(&kv, &cfg, be, &err), 0, "%s", err.msg);

    // YaRN on, attn_factor != 1: mscale ~ 1.2 * (1 + 0.1 ln 4) ~ 1.37, so a
    // shift that re-applied the magnitude would be off by 37 %.
    struct rope_params rp = {.mode = sc->mode, .n_rot = 6, .n_ctx_orig = 32,
                             .freq_base = 10000.0f, .freq_scale = 0.25f, .ext_factor = 1.0f,
                             .attn_factor = 1.2f, .beta_fast = 32.0f, .beta_slow = 1.0f};
    void *dff = NULL;
    if (sc->freq_factors) {
        const float ff[3] = {1.0f, 1.5f, 4.0f};
        cr_assert_eq(be->ops->alloc(be, sizeof ff, &dff), 0);
        cr_assert_eq(be->ops->upload(be, dff, ff, sizeof ff), 0);
        rp.freq_factors = dff;
    }

    // raw (un-rotated) K of every token ever stored, by the cell it landed in
    static float raw_by_cell[SH_LAYERS][SH_CTX][SH_ROW];
    uint32_t s = 12345u + (uint32_t)sc->type_k * 7u + (uint32_t)sc->mode;

    // a 48-token prompt
    store_random(be, &kv, &rp, &s, 0, 48, raw_by_cell);

    // self-extend: ga_n 4, ga_w 16 -> rounds at n_past 48
    struct kv_selfextend se;
    cr_assert_eq(kv_selfextend_init(&se, &kv, 4, 16, 0, &err), 0, "%s", err.msg);
    int32_t n_past = 48;
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0, "%s", err.msg);
    cr_assert_lt(n_past, 48, "self-extend ran");

    // 8 more tokens (stored after the pending shift is applied), another
    // self-extend pass, then a context shift on top
    store_random(be, &kv, &rp, &s, n_past, 8, raw_by_cell);
    n_past += 8;
    cr_assert_eq(kv_selfextend_apply(&se, &kv, &n_past, &err), 0, "%s", err.msg);
    int32_t n_discard;
    cr_assert_eq(kv_context_shift(&kv, 0, 3, n_past, &n_discard, &err), 0, "%s", err.msg);
    cr_assert_gt(n_discard, 0);
    cr_assert(kv.has_shift);
    int32_t moved = 0;
    for (int c = 0; c < SH_CTX; c++)
        moved += kv.delta[c] != 0;
    cr_assert_gt(moved, 10, "a real shift is pending (%d cells)", moved);

    cr_assert_eq(kv_prepare(&kv, &rp, &err), 0, "%s", err.msg);
    cr_assert_eq(be->ops->sync(be), 0);

    // expected: raw K of each non-empty cell, rotated by the rope op to its
    // final position, stored in the cache type
    int n_cells = 0;
    static float want[SH_LAYERS][SH_CTX][SH_ROW];
    int32_t fpos[SH_CTX], fcell[SH_CTX];
    for (int c = 0; c < SH_CTX; c++)
        if (kv.pos[c] >= 0) {
            fcell[n_cells] = c;
            fpos[n_cells++] = kv.pos[c];
        }
    cr_assert_gt(n_cells, 20);
    void *dx, *dp;
    size_t xb = (size_t)n_cells * SH_ROW * sizeof(float);
    cr_assert_eq(be->ops->alloc(be, xb, &dx), 0);
    cr_assert_eq(be->ops->alloc(be, (size_t)n_cells * 4, &dp), 0);
    cr_assert_eq(be->ops->upload(be, dp, fpos, (size_t)n_cells * 4), 0);
    static float x[SH_CTX * SH_ROW];
    for (int l = 0; l < SH_LAYERS; l++) {
        for (int i = 0; i < n_cells; i++)
            memcpy(x + (size_t)i * SH_ROW, raw_by_cell[l][fcell[i]], sizeof raw_by_cell[0][0]);
        cr_assert_eq(be->ops->upload(be, dx, x, xb), 0);
        cr_assert_eq(be->ops->rope(be, dx, dp, n_cells, SH_HEADS, SH_DIM, &rp), 0, "%s",
                     be->err.msg);
        cr_assert_eq(be->ops->download(be, x, dx, xb), 0);
        for (int i = 0; i < n_cells; i++)
            memcpy(want[l][fcell[i]], x + (size_t)i * SH_ROW, sizeof want[0][0]);
    }

    size_t esz = sc->type_k == GGML_TYPE_F16 ? 2 : 4;
    size_t kbytes = (size_t)SH_LAYERS * SH_CTX * SH_ROW * esz;
    unsigned char *got = malloc(kbytes);
    cr_assert_eq(be->ops->download(be, got, kv.k, kbytes), 0);
    float worst = 0.0f, worst_unrot = 0.0f;
    int worst_c = -1;
    for (int l = 0; l < SH_LAYERS; l++)
        for (int i = 0; i < n_cells; i++) {
            int c = fcell[i];
            for (int e = 0; e < SH_ROW; e++) {
                size_t idx = ((size_t)l * SH_CTX + c) * SH_ROW + e;
                float g = esz == 2 ? quant_fp16_to_f32(((uint16_t *)got)[idx])
                                   : ((float *)got)[idx];
                float w = want[l][c][e];
                if (esz == 2)
                    w = quant_fp16_to_f32(quant_f32_to_fp16(w));
                float d = fabsf(g - w);
                if (d > worst) {
                    worst = d;
                    worst_c = c;
                }
                // dims n_rot.. are never rotated nor scaled: exact up to storage
                if (e % SH_DIM >= rp.n_rot && d > worst_unrot)
                    worst_unrot = d;
            }
        }
    cr_log_info("%s %s%s: worst |K - K_direct| %.3g at cell %d over %d cells",
                ggml_type_name(sc->type_k), sc->mode == ROPE_MODE_NEOX ? "neox" : "normal",
                sc->freq_factors ? " +freq_factors" : "", worst, worst_c, n_cells);
    cr_expect_leq(worst, sc->tol, "worst |K - K_direct| %g at cell %d (pos %d) > %g", worst,
                  worst_c, worst_c >= 0 ? kv.pos[worst_c] : -1, sc->tol);
    cr_expect_eq(worst_unrot, 0.0f, "unrotated dims changed by %g", worst_unrot);
    free(got);
    be->ops->free(be, dx);
    be->ops->free(be, dp);
    if (dff)
        be->ops->free(be, dff);
    kv_free(&kv);
    backend_destroy(be);
}

// F32: two rotations (to the stored position, then by delta) against one.
// Stored positions stay below 56, so angles stay below ~56 rad, where float
// cos/sin and the angle products carry a few 1e-6 absolute error, times
// |K| <= ~1.94 (|raw| < 1 times mscale ~1.37, a pair's norm). 5e-5 covers
// that with room; a wrong angle or a re-applied magnitude is off by > 0.1.
Test(kv_shift, f32_normal_matches_direct_rope) {
    check_shift(&(struct shift_case){GGML_TYPE_F32, ROPE_MODE_NORMAL, false, 5e-5f});
}

Test(kv_shift, f32_neox_freq_factors_matches_direct_rope) {
    check_shift(&(struct shift_case){GGML_TYPE_F32, ROPE_MODE_NEOX, true, 5e-5f});
}

// F16: the cache holds K rounded to half at the store and again after the
// shift; the expectation is rounded once. Each rounding is at most half an
// ulp (2^-11 for values in [1, 2), |K| <= ~1.94) and the rotation mixes the
// pair's two store errors: <= (sqrt(2) + 2) * 4.9e-4 ~ 1.7e-3. 3e-3 allows that.
Test(kv_shift, f16_normal_matches_direct_rope) {
    check_shift(&(struct shift_case){GGML_TYPE_F16, ROPE_MODE_NORMAL, false, 3e-3f});
}

Test(kv_shift, f16_neox_freq_factors_matches_direct_rope) {
    check_shift(&(struct shift_case){GGML_TYPE_F16, ROPE_MODE_NEOX, true, 3e-3f});
}
