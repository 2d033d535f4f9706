// Models with experts (issue #32), beyond what every architecture gets in
// test_model_arch (tables, loading, missing and mis-shaped tensors) and
// test_llamacpp_agree (logits against llama.cpp, batches of 32 and of 1):
// - the expert hyperparameters of a bad file are refused by key: k >
//   n_expert, k = 0, experts on an architecture without them, none on one
//   that needs them, expert groups;
// - the router's ties and k = n_expert through the whole forward pass: a
//   Mixtral file whose router is zero (every logit equal) must choose
//   experts 0..k-1 with weight 1/k each, which is what a dense llama file
//   computes whose feed-forward is those k experts side by side (gate and
//   up rows stacked, down's columns scaled by 1/k): both files' logits
//   agree, for k = 2 and for k = n_expert = 8;
// - vela quantize gives expert files llama-quantize's types (the stacks
//   quantized, ffn_down_exps by its layer, the routers kept F32, Mixtral's
//   8-expert rules), and the result loads;
// - a model with experts split by layers over CPU stages (each stage holds
//   its layers' experts) gives the single model's logits bit for bit,
//   through sequence ops, a K shift, context shift and self-extend;
// - a backend without the moe ops refuses such a model by name.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "tests/arch_models.h"
#include "tests/file_helpers.h"
#include "tests/pipeline_helpers.h"
#include "tools/mkmodel/ftype.h"
#include "tools/mkmodel/mkmodel.h"
#include "tools/quantize.h"

#define MOE_EMBD 64
#define MOE_FF 32 // each expert's width (llama: --n-ff)
#define MOE_EXPERTS 8

TEST_SUITE_WITH_TMPDIR(moe, "vela_moe");

// An F32 model of architecture `arch` with n_expert experts, k used (of
// n_layer blocks, rows of n_embd; 0: the small defaults).
static void write_moe_shape(enum model_arch arch, int n_expert, int k, int n_layer, int n_embd,
                            const char *path) {
    struct mkmodel_config c;
    arch_test_moe_config(&c, arch, n_embd ? n_embd : MOE_EMBD, n_layer ? n_layer : 2,
                         n_embd ? n_embd : MOE_FF, n_expert, k, GGML_TYPE_F32);
    c.n_ctx = 64;
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(&c, path, &err), 0, "%s", err.msg);
}

static void write_moe(enum model_arch arch, int n_expert, int k, const char *path) {
    write_moe_shape(arch, n_expert, k, 0, 0, path);
}

// The tensors and keys of a derived file; each may be NULL.
struct edit {
    const char *key;  // a u32 key to set (or add)
    uint32_t value;   //   its value
    const char *drop; // a key to leave out
    const char *zero; // tensors whose name contains this are written as zeros
    bool dense;       // experts -> a dense feed-forward of the first k experts (see the top)
    int k;            //   k
};

// One layer's dense gate/up ([k * n_ff][n_embd], the first k experts' rows)
// or down ([n_embd][k * n_ff]: row o is expert j's row o at columns j * n_ff,
// scaled by 1/k) from the expert stack t (F32).
static float *dense_from_stack(const struct gguf_tensor_info *t, bool down, int k) {
    const int64_t n_in = t->ne[0], n_out = t->ne[1];
    const float *src = (const float *)t->data; // [n_expert][n_out][n_in]
    float *d = malloc(sizeof(float) * (size_t)(k * n_in * n_out));
    cr_assert_not_null(d);
    if (!down) {
        memcpy(d, src, sizeof(float) * (size_t)(k * n_in * n_out));
        return d;
    }
    for (int64_t o = 0; o < n_out; o++)
        for (int j = 0; j < k; j++)
            for (int64_t i = 0; i < n_in; i++)
                d[(o * k + j) * n_in + i] = src[(j * n_out + o) * n_in + i] / (float)k;
    return d;
}

// Adds tensor t of the source to w as the edit says (data kept in *keep).
static void edit_tensor(struct gguf_writer *w, const struct gguf_tensor_info *t,
                        const struct edit *e, void **keep) {
    struct verr err = {0};
    int64_t ne[GGUF_MAX_DIMS];
    memcpy(ne, t->ne, sizeof ne);
    const void *data = t->data;
    char name[96];
    snprintf(name, sizeof name, "%s", t->name);
    if (e->zero && strstr(t->name, e->zero))
        data = *keep = calloc(1, t->nbytes);
    if (e->dense && strstr(t->name, "ffn_gate_inp"))
        return;
    if (e->dense && strstr(t->name, "_exps.weight")) {
        const bool down = strstr(t->name, "ffn_down_exps") != NULL;
        data = *keep = dense_from_stack(t, down, e->k);
        char *x = strstr(name, "_exps");
        memmove(x, x + 5, strlen(x + 5) + 1);
        if (down)
            ne[0] *= e->k;
        else
            ne[1] *= e->k;
        ne[2] = 1;
    }
    const uint32_t n_dims = ne[2] > 1 ? 3 : t->n_dims > 2 ? 2 : t->n_dims;
    cr_assert_eq(gguf_writer_add_tensor(w, name, t->type, n_dims, ne, data, &err), 0, "%s",
                 err.msg);
}

// Writes src with the edit applied to dst.
static void derive(const char *src, const char *dst, const struct edit *e) {
    struct verr err = {0};
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, src, &err), 0, "%s", err.msg);
    struct gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const char *key = f->kv[i].key;
        if ((e->drop && strstr(key, e->drop)) || (e->key && !strcmp(key, e->key)))
            continue;
        cr_assert_eq(gguf_writer_set_value(w, key, &f->kv[i].val), 0);
    }
    if (e->key)
        cr_assert_eq(gguf_writer_set_u32(w, e->key, e->value), 0);
    void **keep = calloc(f->n_tensors, sizeof *keep);
    cr_assert_not_null(keep);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        edit_tensor(w, &f->tensors[i], e, &keep[i]);
    cr_assert_eq(gguf_writer_save(w, dst, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        free(keep[i]);
    free(keep);
    gguf_close(f);
}

static void expect_refused(const char *src, const struct edit *e, int code, const char *says) {
    char dst[300];
    derive(src, tmp_path(dst, sizeof dst, "bad.gguf"), e);
    struct verr err = {0};
    cr_expect_eq(arch_test_try_load(dst, &err), code, "%s: status, message '%s'", says, err.msg);
    cr_expect(strstr(err.msg, says), "'%s' does not say '%s'", err.msg, says);
}

Test(moe, bad_expert_hyperparameters_are_refused_by_key) {
    char q3[300], mx[300], dense[300];
    write_moe(MODEL_ARCH_QWEN3MOE, MOE_EXPERTS, 2, tmp_path(q3, sizeof q3, "q3.gguf"));
    write_moe(MODEL_ARCH_LLAMA, MOE_EXPERTS, 2, tmp_path(mx, sizeof mx, "mx.gguf"));
    write_moe(MODEL_ARCH_QWEN3, 0, 0, tmp_path(dense, sizeof dense, "dense.gguf"));
    struct verr err = {0};
    cr_assert_eq(arch_test_try_load(q3, &err), 0, "%s", err.msg);
    cr_assert_eq(arch_test_try_load(mx, &err), 0, "%s", err.msg);

    expect_refused(q3, &(struct edit){.key = "qwen3moe.expert_used_count", .value = 9}, VERR_RANGE,
                   "qwen3moe.expert_used_count = 9 must be in [1, expert_count = 8]");
    expect_refused(mx, &(struct edit){.key = "llama.expert_used_count", .value = 0}, VERR_RANGE,
                   "llama.expert_used_count = 0 must be in [1, expert_count = 8]");
    expect_refused(q3, &(struct edit){.drop = "qwen3moe.expert_count"}, VERR_RANGE,
                   "qwen3moe needs experts: key 'qwen3moe.expert_count' is missing or 0");
    expect_refused(dense, &(struct edit){.key = "qwen3.expert_count", .value = 8}, VERR_UNSUPPORTED,
                   "qwen3.expert_count = 8: vela runs no qwen3 blocks with experts");
    expect_refused(mx, &(struct edit){.key = "llama.expert_group_count", .value = 2},
                   VERR_UNSUPPORTED, "routing by expert groups is not supported");
    // A llama file whose expert_count says 8 but whose stacks hold 4.
    write_moe(MODEL_ARCH_LLAMA, 4, 2, tmp_path(mx, sizeof mx, "mx4.gguf"));
    expect_refused(mx, &(struct edit){.key = "llama.expert_count", .value = 8}, VERR_FORMAT,
                   "blk.0.ffn_gate_inp.weight: expected shape [64, 8], found [64, 4]");
}

// The logits of every position of `path` for a fixed prompt (CPU, F32 cache).
static float *eval_logits(const char *path, int n_tok, int *n_vocab) {
    struct verr err = {0};
    struct backend *be;
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    struct model *m = NULL;
    cr_assert_eq(model_load_file(&m, path, be, &err), 0, "%s: %s", path, err.msg);
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = n_tok;
    cfg.type_k = cfg.type_v = GGML_TYPE_F32;
    struct forward_ctx fc;
    cr_assert_eq(forward_init(&fc, m, &cfg, &err), 0, "%s", err.msg);
    int32_t tok[64], pos[64], seq[64];
    int8_t want[64];
    for (int t = 0; t < n_tok; t++) {
        tok[t] = (int32_t)((37 * t + 5) % m->hp.n_vocab);
        pos[t] = t;
        seq[t] = 0;
        want[t] = 1;
    }
    const struct forward_batch b = {n_tok, tok, pos, seq, want, NULL};
    int n_out = 0;
    cr_assert_eq(forward_batch_begin(&fc, &b, &n_out, &err), 0, "%s", err.msg);
    cr_assert_eq(forward_stage_upload(&fc, &b, fc.h_cells, fc.h_rows, n_out, &err), 0, "%s",
                 err.msg);
    const struct forward_part pt = {0, n_tok, 0, n_out, true, true};
    cr_assert_eq(forward_stage_run(&fc, &pt, NULL, NULL, &err), 0, "%s", err.msg);
    const int V = m->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n_out * V);
    cr_assert_not_null(out);
    cr_assert_eq(forward_stage_download(&fc, n_out, NULL, out, NULL, &err), 0, "%s", err.msg);
    forward_free(&fc);
    model_free(m);
    backend_destroy(be);
    *n_vocab = V;
    return out;
}

// Equal router logits: experts 0..k-1, each 1/k (renormalised), as the
// dense file of those experts computes (see the top).
static void check_tied_router(int k) {
    char src[300], moe[300], dense[300];
    write_moe(MODEL_ARCH_LLAMA, MOE_EXPERTS, k, tmp_path(src, sizeof src, "src.gguf"));
    derive(src, tmp_path(moe, sizeof moe, "zero.gguf"), &(struct edit){.zero = "ffn_gate_inp"});
    derive(src, tmp_path(dense, sizeof dense, "dense.gguf"),
           &(struct edit){.drop = "llama.expert_",
                          .key = "llama.feed_forward_length",
                          .value = (uint32_t)(k * MOE_FF),
                          .dense = true,
                          .k = k});
    enum { N = 12 };
    int V = 0, V2 = 0;
    float *a = eval_logits(moe, N, &V), *b = eval_logits(dense, N, &V2);
    cr_assert_eq(V, V2);
    double max_d = 0, scale = 0, far = 0;
    for (size_t i = 0; i < (size_t)N * V; i++) {
        max_d = fmax(max_d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    // For scale: the same router-less model choosing experts 1..k instead.
    float *c = eval_logits(src, N, &V2);
    for (size_t i = 0; i < (size_t)N * V; i++)
        far = fmax(far, fabs((double)c[i] - b[i]));
    cr_log_info("k = %d: tied router vs the dense file: worst %.2e of max |logit| %.2f (the "
                "routed model: %.2e)",
                k, max_d / scale, scale, far / scale);
    // Float32 both ways; only the order of the sums differs (the dense
    // down projection sums k * n_ff products in one row, the experts k
    // rows of n_ff then their weighted sum): a few ulps of the logits.
    cr_expect_leq(max_d / scale, 1e-5, "k = %d: worst |moe - dense| %.3e of max |logit| %.2f", k,
                  max_d, scale);
    cr_expect_gt(far / scale, 1e-2, "k = %d: the routed model should differ", k);
    free(a);
    free(b);
    free(c);
}

Test(moe, tied_router_picks_the_first_k_experts) {
    check_tied_router(2);
}

Test(moe, k_equal_to_n_expert_uses_them_all) {
    check_tied_router(MOE_EXPERTS);
}

Test(moe, backend_without_moe_ops_is_refused) {
    char path[300];
    write_moe(MODEL_ARCH_QWEN2MOE, MOE_EXPERTS, 2, tmp_path(path, sizeof path, "q2.gguf"));
    struct verr err = {0};
    struct backend *be;
    cr_assert_eq(backend_cpu_create(&be, 1, &err), 0, "%s", err.msg);
    struct model *m = NULL;
    cr_assert_eq(model_load_file(&m, path, be, &err), 0, "%s", err.msg);
    struct backend_ops ops = *be->ops;
    ops.moe_ffn = NULL;
    const struct backend_ops *saved = be->ops;
    be->ops = &ops;
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 32;
    cfg.n_batch = 8;
    struct forward_ctx fc;
    cr_expect_eq(forward_init(&fc, m, &cfg, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "qwen2moe has 8 experts per block, and the cpu backend has no "
                              "mixture-of-experts ops"),
              "%s", err.msg);
    be->ops = saved;
    model_free(m);
    backend_destroy(be);
}

// The type llama-quantize's rules give tensor `name` of the Q4_K_M files
// below (llama.cpp's llama_tensor_get_type, read for these cases): 4
// layers, so use_more_bits picks layers 2 and 3 (i >= 7n/8 = 3, and
// (i - n/8) % 3 == 2) for ffn_down (every stack of the layer its name says)
// and the attn_v counter; 8 experts (Mixtral): attn_v and attn_k Q8_0,
// attn_output Q5_K.
static enum ggml_type q4_k_m_type(const char *name, int n_expert) {
    int il = -1;
    sscanf(name, "blk.%d.", &il);
    const bool more = il == 2 || il == 3;
    if (strstr(name, "norm") || strstr(name, "ffn_gate_inp"))
        return GGML_TYPE_F32;
    if (!strcmp(name, "output.weight"))
        return GGML_TYPE_Q6_K;
    if (strstr(name, "attn_v.weight"))
        return n_expert == 8 ? GGML_TYPE_Q8_0 : more ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    if (strstr(name, "attn_k.weight") && n_expert == 8)
        return GGML_TYPE_Q8_0;
    if (strstr(name, "attn_output.weight") && n_expert == 8)
        return GGML_TYPE_Q5_K;
    if (strstr(name, "ffn_down"))
        return more ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    return GGML_TYPE_Q4_K;
}

static void check_quantize(enum model_arch arch, int n_expert) {
    char src[300], dst[300];
    write_moe_shape(arch, n_expert, 2, 4, 256, tmp_path(src, sizeof src, "f32.gguf"));
    struct quantize_opts o = {.in = src,
                              .out = tmp_path(dst, sizeof dst, "q4_k_m.gguf"),
                              .ftype = ftype_find("Q4_K_M"),
                              .type_embd = -1,
                              .type_output = -1,
                              .n_threads = 2};
    struct quantize_stats st;
    struct verr err = {0};
    cr_assert_eq(quantize_file(&o, &st, &err), 0, "%s", err.msg);
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, dst, &err), 0, "%s", err.msg);
    int n_stacks = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor_info *t = &f->tensors[i];
        const enum ggml_type want = q4_k_m_type(t->name, n_expert);
        cr_expect_eq(t->type, want, "%s (%d experts): %s, llama-quantize gives %s", t->name,
                     n_expert, ggml_type_name(t->type), ggml_type_name(want));
        n_stacks += t->n_dims == 3;
    }
    cr_expect_eq(n_stacks, 4 * 3, "the stacks stay 3-D");
    gguf_close(f);
    cr_expect_eq(arch_test_try_load(dst, &err), 0, "%s", err.msg);
}

Test(moe, quantize_follows_llama_quantize) {
    check_quantize(MODEL_ARCH_LLAMA, 8);
    check_quantize(MODEL_ARCH_QWEN3MOE, 4);
}

// The presets of real models have their published parameter counts
// (Qwen3-30B-A3B: 30.5B; Mixtral-8x7B: 46.7B; gpt-oss-20b: 20.91B), to 1%
// (the published figures' rounding), and the tiny presets resolve.
Test(moe, presets_have_the_published_sizes) {
    static const struct {
        const char *name;
        double params;
    } real[] = {{"qwen3-30b-a3b", 30.5e9}, {"mixtral-8x7b", 46.7e9}, {"gpt-oss-20b", 20.91e9}};
    struct verr err = {0};
    struct mkmodel_config c, r;
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        mkmodel_config_default(&c);
        cr_assert_eq(mkmodel_preset(&c, real[i].name, &err), 0, "%s", err.msg);
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s: %s", real[i].name, err.msg);
        const double p = (double)mkmodel_count_params(&r);
        cr_expect(fabs(p / real[i].params - 1) < 0.01, "%s: %.3gB parameters, published %.3gB",
                  real[i].name, p / 1e9, real[i].params / 1e9);
        cr_expect_eq(r.weights, MKMODEL_WEIGHTS_FAST, "%s", real[i].name);
    }
    const char *tiny[] = {"tiny-qwen3moe", "tiny-qwen2moe", "tiny-mixtral", "tiny-gpt-oss"};
    for (int i = 0; i < 4; i++) {
        mkmodel_config_default(&c);
        cr_assert_eq(mkmodel_preset(&c, tiny[i], &err), 0, "%s", err.msg);
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s: %s", tiny[i], err.msg);
        cr_expect_eq(r.n_expert, 8, "%s", tiny[i]);
        cr_expect_eq(r.n_expert_used, 2, "%s", tiny[i]);
    }
}

// A qwen2moe model of 4 layers (experts, the shared expert) on one CPU
// backend or split as `devices` says, -ub 2.
static void moe_run(struct run *r, const char *path, const char *devices) {
    struct args_model a;
    args_model_default(&a);
    a.backend = LOAD_BACKEND_CPU;
    a.n_threads = 2;
    a.devices = devices;
    a.n_ubatch = devices ? 2 : 0;
    a.n_ctx = 64;
    a.n_batch = 8;
    a.type_k = a.type_v = GGML_TYPE_F32;
    struct verr err = {0};
    cr_assert_eq(run_load(r, &a, path, &err), 0, "%s: %s", devices ? devices : "one", err.msg);
}

Test(moe, split_stages_hold_their_experts_and_agree) {
    char path[300];
    write_moe_shape(MODEL_ARCH_QWEN2MOE, MOE_EXPERTS, 2, 4, 0,
                    tmp_path(path, sizeof path, "q2.gguf"));
    struct run ref, r;
    float *w1, *w2, *g1, *g2;
    moe_run(&ref, path, NULL);
    const int V = ref.m->hp.n_vocab;
    double lb[4], lp;
    for (int il = 0; il < 4; il++)
        model_layer_size(&ref.m->hp, &ref.m->layers[il], &lb[il], &lp);
    kv_script(&ref, &w1, &w2);
    close_run(&ref);
    moe_run(&r, path, "cpu,cpu,cpu");
    cr_assert_eq(r.p->n_stages, 3);
    // Each stage loaded its own layers' experts and nothing else's.
    for (int s = 0; s < r.p->n_stages; s++) {
        const struct model *m = r.p->stage[s].m;
        for (int il = 0; il < m->hp.n_layer; il++) {
            const bool here = il >= m->layer_begin && il < m->layer_end;
            cr_expect_eq(m->layers[il].ffn_down_exps.data != NULL, here, "stage %d, layer %d", s,
                         il);
            cr_expect_eq(m->layers[il].ffn_up_shexp.data != NULL, here, "stage %d, layer %d", s,
                         il);
            double b = 0;
            model_layer_size(&m->hp, &m->layers[il], &b, &lp);
            if (here)
                cr_expect_eq(b, lb[il], "stage %d, layer %d: bytes with its experts", s, il);
        }
    }
    kv_script(&r, &g1, &g2);
    close_run(&r);
    for (size_t i = 0; i < (size_t)10 * V; i++)
        cr_assert_eq(g1[i], w1[i], "after seq cp / rm / add / div: logit %zu", i);
    for (size_t i = 0; i < (size_t)27 * V; i++)
        cr_assert_eq(g2[i], w2[i], "context shift and self-extend: logit %zu", i);
    free(w1);
    free(w2);
    free(g1);
    free(g2);
}

// What a forward pass reads of a layer with experts (vela bench's bytes):
// k of the n_expert matrices of each stack for one token, nearly all of
// them for a prompt batch, everything else in full.
Test(moe, bytes_read_count_the_experts_used) {
    char path[300];
    write_moe(MODEL_ARCH_QWEN3MOE, MOE_EXPERTS, 2, tmp_path(path, sizeof path, "q3.gguf"));
    struct verr err = {0};
    struct backend *be;
    cr_assert_eq(backend_cpu_create(&be, 1, &err), 0, "%s", err.msg);
    struct model *m = NULL;
    cr_assert_eq(model_load_file(&m, path, be, &err), 0, "%s", err.msg);
    const struct model_layer *L = &m->layers[1];
    double all, params;
    model_layer_size(&m->hp, L, &all, &params);
    double stacks = 0;
    const struct backend_weight *w[3] = {&L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps};
    for (int i = 0; i < 3; i++)
        stacks += (double)ggml_row_bytes(w[i]->type, w[i]->n_in) * (double)w[i]->n_out;
    const double one = model_layer_bytes_read(&m->hp, L, 1);
    cr_expect(fabs(one - (all - stacks * (1.0 - 2.0 / MOE_EXPERTS))) < 1e-6 * all,
              "one token: %.0f bytes of %.0f (stacks %.0f)", one, all, stacks);
    cr_expect_gt(model_layer_bytes_read(&m->hp, L, 512), all * (1 - 1e-9), "a prompt batch");
    model_free(m);
    backend_destroy(be);
}
