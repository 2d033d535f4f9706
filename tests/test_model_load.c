// Loading weights (host/model/model.c, model_load_ex) on the CPU:
// - every tensor on the backend is byte-identical to the file (vectors: the
//   file's F32, or its F16 values converted), each at a 256-byte aligned
//   offset of one allocation; through the direct path (the CPU backend's
//   ops->upload) and through the pinned staging ring, run here on a stub
//   backend whose async copies happen only when waited for, so a staging
//   buffer refilled before its copy was waited for shows up as wrong bytes;
// - progress: byte counts that never go down and end at the total
//   (model_load_bytes), for one load and for the stages of a split model;
// - memory: a load that does not fit in what ops->mem_info reports is
//   refused before anything is allocated, with the numbers in the message,
//   and the budget (pipeline_load_budget, host/split/plan.c's accounting) covers
//   what forward_init then allocates.
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/split/pipeline.h"
#include "tests/arch_models.h"
#include "tiny_model.h"
#include "tools/args.h"
#include "tools/mkmodel/mkmodel.h"

// --- the stub backend: the CPU backend with async uploads that are lazy -----

#define MAX_PENDING 64

struct stub {
    const struct backend_ops *cpu;
    struct backend_ops ops;
    size_t free_bytes; // what mem_info says
    int n_alloc;
    size_t alloc_bytes;
    int pinned_live, pinned_max;
    int n_async;
    size_t async_bytes;
    struct {
        void *dst;
        const void *src;
        size_t n;
    } q[BACKEND_UPLOAD_SLOTS][MAX_PENDING];
    int nq[BACKEND_UPLOAD_SLOTS];
};
static struct stub S;

static int stub_alloc(struct backend *be, size_t bytes, void **out) {
    S.n_alloc++;
    S.alloc_bytes += bytes;
    return S.cpu->alloc(be, bytes, out);
}

static int stub_mem_info(struct backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = S.free_bytes;
    *total_bytes = S.free_bytes;
    return 0;
}

static int stub_alloc_pinned(struct backend *be, size_t bytes, void **out) {
    *out = malloc(bytes);
    S.pinned_live++;
    if (S.pinned_live > S.pinned_max)
        S.pinned_max = S.pinned_live;
    return *out ? 0 : VERR_NOMEM;
}

static void stub_flush(int slot) {
    for (int i = 0; i < S.nq[slot]; i++)
        memcpy(S.q[slot][i].dst, S.q[slot][i].src, S.q[slot][i].n);
    S.nq[slot] = 0;
}

static void stub_free_pinned(struct backend *be, void *p) {
    for (int k = 0; k < BACKEND_UPLOAD_SLOTS; k++)
        for (int i = 0; i < S.nq[k]; i++)
            cr_assert_neq(S.q[k][i].src, p,
                          "a staging buffer freed before its copy was waited for");
    S.pinned_live--;
    free(p);
}

// Copies nothing yet: the copy reads src when upload_wait(slot) comes.
static int stub_upload_async(struct backend *be, void *dst, const void *src, size_t n, int slot) {
    cr_assert(slot >= 0 && slot < BACKEND_UPLOAD_SLOTS);
    cr_assert_lt(S.nq[slot], MAX_PENDING);
    S.q[slot][S.nq[slot]].dst = dst;
    S.q[slot][S.nq[slot]].src = src;
    S.q[slot][S.nq[slot]].n = n;
    S.nq[slot]++;
    S.n_async++;
    S.async_bytes += n;
    return 0;
}

static int stub_upload_wait(struct backend *be, int slot) {
    stub_flush(slot);
    return 0;
}

static int stub_sync(struct backend *be) {
    for (int k = 0; k < BACKEND_UPLOAD_SLOTS; k++)
        stub_flush(k);
    return S.cpu->sync(be);
}

// A CPU backend with the stub's table; async: with the pinned ring.
static struct backend *stub_create(bool async, size_t free_bytes) {
    struct backend *be = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    memset(&S, 0, sizeof S);
    S.cpu = be->ops;
    S.ops = *be->ops;
    S.ops.alloc = stub_alloc;
    S.ops.sync = stub_sync;
    S.ops.mem_info = stub_mem_info;
    if (async) {
        S.ops.alloc_host_pinned = stub_alloc_pinned;
        S.ops.free_host_pinned = stub_free_pinned;
        S.ops.upload_async = stub_upload_async;
        S.ops.upload_wait = stub_upload_wait;
    }
    S.free_bytes = free_bytes;
    be->ops = &S.ops;
    return be;
}

// --- models ---------------------------------------------------------------------

static char *write_model(struct tiny_cfg *cfg, const char *tag) {
    char *path = malloc(128);
    tiny_temp_path(path, 128, tag);
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(cfg, path, &w, &err), 0, "tiny_write: %s", err.msg);
    tiny_weights_free(&w);
    return path;
}

// f32 matrices, F16 norms, rope_freqs, separate output; qwen2 with Q/K/V
// biases, q4_0 matrices, tied output; q8_0.
static char *model_variant(int v) {
    struct tiny_cfg cfg;
    if (v == 0) {
        tiny_cfg_default(&cfg, "llama");
        cfg.f16_norms = true;
        cfg.rope_freqs = true;
        cfg.n_layer = 3;
    } else if (v == 1) {
        tiny_cfg_default(&cfg, "qwen2");
        cfg.wtype = GGML_TYPE_Q4_0;
        cfg.tied = true;
    } else {
        tiny_cfg_default(&cfg, "llama");
        cfg.wtype = GGML_TYPE_Q8_0;
        cfg.n_vocab = 200;
    }
    return write_model(&cfg, "mload");
}

// A qwen2moe model (8 experts, 2 used, the shared expert; mkmodel): the
// scratch of blocks with experts.
static char *model_moe(void) {
    struct mkmodel_config c;
    arch_test_moe_config(&c, MODEL_ARCH_QWEN2MOE, 64, 2, 96, 8, 2, GGML_TYPE_F32);
    char *path = malloc(128);
    tiny_temp_path(path, 128, "mload_moe");
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, path, &err), 0, "%s", err.msg);
    return path;
}

// model_variant(v) (v == 3: model_moe), opened; close_variant gives both back.
static struct gguf_file *open_variant(int v, char **path) {
    *path = v == 3 ? model_moe() : model_variant(v);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, *path, &err), 0, "%s", err.msg);
    return f;
}

static void close_variant(struct gguf_file *f, char *path) {
    gguf_close(f);
    unlink(path);
    free(path);
}

// Command-line settings for the model at path: n_ctx cells, batches of 8.
static void variant_args(struct args_model *a, const char *path, int n_ctx) {
    args_model_default(a);
    a->model_path = path;
    a->n_ctx = n_ctx;
    a->n_batch = 8;
}

static int n_mismatch;

static void expect_matrix(const struct gguf_file *f, const char *name,
                          const struct backend_weight *w) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    cr_assert(t, "%s", name);
    cr_assert(w->data, "%s: no data", name);
    size_t bytes = ggml_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
    if (memcmp(w->data, t->data, bytes)) {
        n_mismatch++;
        cr_expect(0, "%s: backend bytes differ from the file", name);
    }
}

static void expect_vector(const struct gguf_file *f, const char *name, const float *v) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    if (!t) {
        cr_assert_null(v, "%s: absent from the file but loaded", name);
        return;
    }
    cr_assert(v, "%s: not loaded", name);
    for (int64_t i = 0; i < t->ne[0]; i++) {
        float want;
        const uint8_t *s = t->data;
        if (t->type == GGML_TYPE_F32) {
            memcpy(&want, s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            want = t->type == GGML_TYPE_F16 ? quant_fp16_to_f32(h) : quant_bf16_to_f32(h);
        }
        if (memcmp(&v[i], &want, 4)) {
            n_mismatch++;
            cr_expect(0, "%s[%lld]: %g on the backend, %g in the file", name, (long long)i, v[i],
                      want);
            return;
        }
    }
}

static void expect_aligned(const struct model *m, const void *p, const char *what) {
    if (!p)
        return;
    cr_assert_eq(((const uint8_t *)p - (const uint8_t *)m->allocs[0]) % 256, 0,
                 "%s: offset not a multiple of 256", what);
}

// Every tensor the model holds equals the file's and sits aligned in its one allocation.
static void expect_identical(const struct model *m, const struct gguf_file *f) {
    n_mismatch = 0;
    cr_assert_eq(m->n_allocs, 1, "one backend allocation for every weight");
    const bool first = m->layer_begin == 0, last = m->layer_end == m->hp.n_layer;
    if (first || (last && m->output_tied)) {
        expect_matrix(f, "token_embd.weight", &m->tok_embd);
        expect_aligned(m, m->tok_embd.data, "token_embd");
    }
    if (last) {
        expect_matrix(f, m->output_tied ? "token_embd.weight" : "output.weight", &m->output);
        expect_vector(f, "output_norm.weight", m->output_norm);
        expect_aligned(m, m->output.data, "output");
        expect_aligned(m, m->output_norm, "output_norm");
    }
    expect_vector(f, "rope_freqs.weight", m->rope_freqs);
    char name[96];
    for (int il = m->layer_begin; il < m->layer_end; il++) {
        const struct model_layer *L = &m->layers[il];
        const struct {
            const char *suffix;
            const struct backend_weight *w;
        } mats[] = {{"attn_q.weight", &L->wq},       {"attn_k.weight", &L->wk},
                    {"attn_v.weight", &L->wv},       {"attn_output.weight", &L->wo},
                    {"ffn_gate.weight", &L->w_gate}, {"ffn_up.weight", &L->w_up},
                    {"ffn_down.weight", &L->w_down}};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", il, mats[i].suffix);
            expect_matrix(f, name, mats[i].w);
            expect_aligned(m, mats[i].w->data, name);
        }
        const struct {
            const char *suffix;
            const float *v;
        } vecs[] = {{"attn_norm.weight", L->attn_norm},
                    {"ffn_norm.weight", L->ffn_norm},
                    {"attn_q.bias", L->bq},
                    {"attn_k.bias", L->bk},
                    {"attn_v.bias", L->bv}};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", il, vecs[i].suffix);
            expect_vector(f, name, vecs[i].v);
            expect_aligned(m, vecs[i].v, name);
        }
    }
    cr_assert_eq(n_mismatch, 0);
}

// --- progress --------------------------------------------------------------------

#define MAX_CALLS 100000

struct calls {
    int n;
    uint64_t done[MAX_CALLS], total[MAX_CALLS];
};

static void record(void *user, uint64_t done, uint64_t total) {
    struct calls *c = user;
    cr_assert_lt(c->n, MAX_CALLS);
    c->done[c->n] = done;
    c->total[c->n] = total;
    c->n++;
}

static void expect_progress(const struct calls *c, uint64_t total, int min_calls) {
    cr_assert_geq(c->n, min_calls, "%d progress calls", c->n);
    for (int i = 0; i < c->n; i++) {
        cr_assert_eq(c->total[i], total, "call %d: total %llu, expected %llu", i,
                     (unsigned long long)c->total[i], (unsigned long long)total);
        cr_assert_leq(c->done[i], total);
        if (i)
            cr_assert_geq(c->done[i], c->done[i - 1], "call %d: %llu after %llu", i,
                          (unsigned long long)c->done[i], (unsigned long long)c->done[i - 1]);
    }
    cr_assert_eq(c->done[c->n - 1], total, "the last call reports the total");
}

// --- tests -----------------------------------------------------------------------

static void load_and_check(int variant, bool async, size_t staging) {
    char *path;
    struct gguf_file *f = open_variant(variant, &path);
    struct verr err = {0};
    size_t total = 0;
    cr_assert_eq(model_load_bytes(f, 0, -1, &total, &err), 0, "%s", err.msg);
    struct backend *be = stub_create(async, SIZE_MAX);
    struct calls *c = calloc(1, sizeof *c);
    struct model_load_params p;
    model_load_params_default(&p);
    p.staging_bytes = staging;
    p.progress = record;
    p.progress_user = c;
    struct model *m = NULL;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), 0, "%s", err.msg);
    expect_identical(m, f);
    cr_assert_eq(S.n_alloc, 1, "one allocation, %d made", S.n_alloc);
    cr_assert_eq(S.alloc_bytes, total, "the allocation is model_load_bytes' figure");
    const size_t chunk = staging ? (staging + 255) / 256 * 256 : (size_t)64 << 20;
    const size_t chunks = (total + chunk - 1) / chunk;
    if (async) {
        cr_assert_eq(S.pinned_max, 2, "two staging buffers");
        cr_assert_eq(S.pinned_live, 0, "staging freed");
        cr_assert_eq((size_t)S.n_async, chunks, "one copy per chunk");
        cr_assert_eq(S.async_bytes, total);
    } else {
        cr_assert_eq(S.n_async, 0);
    }
    // Progress: once at 0, then per chunk (ring) or per piece (direct).
    expect_progress(c, total, staging ? (int)chunks : 2);
    cr_assert_eq(c->done[0], 0);
    model_free(m);
    backend_destroy(be);
    close_variant(f, path);
    free(c);
}

Test(model_load, direct_upload_is_byte_identical) {
    for (int v = 0; v < 3; v++) {
        load_and_check(v, false, 0);
        load_and_check(v, false, 1000); // pieces inside tensors
    }
}

Test(model_load, pinned_ring_is_byte_identical) {
    // 4 KiB chunks: tensors cross chunk bounds, vectors are converted in
    // pieces, and each buffer is refilled many times.
    for (int v = 0; v < 3; v++) {
        load_and_check(v, true, 4096);
        load_and_check(v, true, 256);
        load_and_check(v, true, 0); // one chunk
    }
}

Test(model_load, layers_of_a_stage_are_byte_identical) {
    char *path;
    struct gguf_file *f = open_variant(0, &path);
    struct verr err = {0};
    for (int l0 = 0; l0 < 3; l0++) {
        struct backend *be = stub_create(true, SIZE_MAX);
        struct model_load_params p;
        model_load_params_default(&p);
        p.l0 = l0;
        p.l1 = l0 + 1;
        p.staging_bytes = 2048;
        struct model *m = NULL;
        cr_assert_eq(model_load_ex(&m, f, be, &p, &err), 0, "%s", err.msg);
        expect_identical(m, f);
        size_t b = 0;
        cr_assert_eq(model_load_bytes(f, l0, l0 + 1, &b, &err), 0);
        cr_assert_eq(S.alloc_bytes, b);
        model_free(m);
        backend_destroy(be);
    }
    close_variant(f, path);
}

Test(model_load, progress_of_a_split_model_is_one_total) {
    char *path;
    struct gguf_file *f = open_variant(0, &path);
    struct verr err = {0};
    struct args_model a;
    variant_args(&a, path, 64);
    a.n_threads = 2;
    a.devices = "cpu,cpu";
    struct calls *c = calloc(1, sizeof *c);
    struct load_config lc;
    struct forward_config lcfg;
    args_load_config(&a, &lc);
    args_ctx_config(&a, &lcfg);
    struct pipeline *pipe = NULL;
    cr_assert_eq(pipeline_load_ex(&lc, &lcfg, f, record, c, &pipe, &err), 0, "%s", err.msg);
    cr_assert(pipe && pipe->n_stages == 2);
    cr_assert(pipe->stage[0].be && pipe->stage[0].m, "stage 0 is loaded in this process");
    size_t total = 0;
    for (int s = 0; s < 2; s++) {
        size_t b = 0;
        cr_assert_eq(model_load_bytes(f, pipe->stage[s].l0, pipe->stage[s].l1, &b, &err), 0);
        total += b;
        expect_identical(pipe->stage[s].m, f);
    }
    expect_progress(c, total, 4);
    pipeline_free(pipe); // every stage, stage 0's be and m included
    close_variant(f, path);
    free(c);
}

Test(model_load, too_little_memory_is_refused_before_allocating) {
    char *path;
    struct gguf_file *f = open_variant(2, &path);
    struct verr err = {0};
    size_t w = 0;
    cr_assert_eq(model_load_bytes(f, 0, -1, &w, &err), 0);
    struct model_load_params p;
    model_load_params_default(&p);
    p.kv_bytes = (size_t)3 << 20;
    p.scratch_bytes = (size_t)2 << 20;
    const size_t need = w + p.kv_bytes + p.scratch_bytes;

    // One byte short: refused, nothing allocated, the numbers in the message.
    struct backend *be = stub_create(true, need - 1);
    S.ops.name = "cuda";
    be->device = 3;
    struct model *m = NULL;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), VERR_NOMEM);
    cr_assert_null(m);
    cr_assert_eq(S.n_alloc, 0, "%d allocations before the refusal", S.n_alloc);
    cr_assert_eq(S.pinned_max, 0, "staging allocated before the refusal");
    char want[256];
    snprintf(want, sizeof want,
             "model needs %.1f MiB on device cuda:3 (weights %.1f MiB, KV cache 3.0 MiB, "
             "scratch 2.0 MiB) but only %.1f MiB is free",
             need / 1048576.0, w / 1048576.0, (need - 1) / 1048576.0);
    cr_assert(strstr(err.msg, want), "message: %s\nexpected: %s", err.msg, want);
    S.ops.name = "cpu";
    backend_destroy(be);

    // The reserve counts too, and is named.
    be = stub_create(false, need);
    p.reserve_bytes = (size_t)1 << 20;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), VERR_NOMEM);
    cr_assert(strstr(err.msg, "on the cpu backend") && strstr(err.msg, "reserve 1.0 MiB"), "%s",
              err.msg);
    cr_assert_eq(S.n_alloc, 0);
    // skip_memory_check: a plan checked already.
    p.skip_memory_check = true;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), 0, "%s", err.msg);
    model_free(m);
    backend_destroy(be);

    // Exactly enough: loads.
    be = stub_create(true, need);
    p.reserve_bytes = 0;
    p.skip_memory_check = false;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), 0, "%s", err.msg);
    expect_identical(m, f);
    model_free(m);
    backend_destroy(be);
    close_variant(f, path);
}

// The budget of variant v (see open_variant) covers what forward_init
// allocates, and not twice over.
static void check_budget(int v) {
    char *path;
    struct gguf_file *f = open_variant(v, &path);
    struct verr err = {0};
    struct args_model a;
    variant_args(&a, path, 96);
    const int n_out = 4;
    const struct backend_device cpu = {BACKEND_DEVICE_CPU, 0};
    struct model_load_params p;
    model_load_params_default(&p);
    struct load_config lc;
    struct forward_config bcfg;
    args_load_config(&a, &lc);
    args_ctx_config(&a, &bcfg);
    bcfg.n_outputs_max = n_out;
    cr_assert_eq(pipeline_load_budget(&lc, &bcfg, f, &cpu, &p, &err), 0, "%s", err.msg);
    // tiny llama: 3 layers, 2 KV heads of 16 dims, f16 cache.
    if (v == 0)
        cr_assert_eq(p.kv_bytes, (size_t)96 * 3 * (2 * 32 + 2 * 32));
    cr_assert_eq(p.reserve_bytes, 0);

    struct backend *be = stub_create(false, SIZE_MAX);
    struct model *m = NULL;
    cr_assert_eq(model_load_ex(&m, f, be, &p, &err), 0, "%s", err.msg);
    const size_t weights = S.alloc_bytes;
    struct forward_config fcfg;
    args_ctx_config(&a, &fcfg);
    forward_config_resolve(&fcfg, &m->hp);
    fcfg.n_seq_max = 1;
    fcfg.n_outputs_max = n_out;
    struct forward_ctx fc;
    cr_assert_eq(forward_init(&fc, m, &fcfg, &err), 0, "%s", err.msg);
    const size_t ctx = S.alloc_bytes - weights;
    cr_assert_leq(ctx, p.kv_bytes + p.scratch_bytes,
                  "the context allocated %zu bytes, the budget says %zu + %zu", ctx, p.kv_bytes,
                  p.scratch_bytes);
    // ... and not wildly more: the check must not refuse what fits.
    cr_assert_geq(ctx * 2, p.kv_bytes + p.scratch_bytes, "%zu allocated, %zu budgeted", ctx,
                  p.kv_bytes + p.scratch_bytes);
    forward_free(&fc);
    model_free(m);
    backend_destroy(be);
    close_variant(f, path);
}

Test(model_load, budget_covers_what_the_context_allocates) {
    check_budget(0);
    check_budget(3); // experts: routing scratch, gate/up as wide as the shared expert
}
