// mkmodel: synthetic models read back with the GGUF reader (metadata keys,
// tensor names / shapes / types as llama.cpp names them), weight statistics
// after dequantization (both weight paths), determinism, llama.cpp's Q4_K_M mix and type
// fallbacks, the vocabulary copy, a naive forward pass (activations finite,
// greedy generation not constant), error cases, and the `vela mkmodel` tool.
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "host/model/model.h"
#include "tools/mkmodel/mkmodel.h"
#include "tools/mkmodel/mkmodel_vocab.h"

// --- helpers -------------------------------------------------------------------

static char tmpdir[256];

static void setup_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/vela_test_mkmodel_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp");
}

static void teardown_tmp(void) {
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char p[600];
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(tmpdir);
}

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

// A small llama that writes in milliseconds: 64 x 2 layers, 4/2 heads.
static void small_cfg(struct mkmodel_config *c) {
    mkmodel_config_default(c);
    c->n_embd = 64;
    c->n_layer = 2;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->n_ff = 128;
    c->n_threads = 2;
}

// Rows of 256 (a whole K-quant block), 2/1 heads.
static void cfg_256(struct mkmodel_config *c, int n_layer, int n_ff) {
    small_cfg(c);
    c->n_embd = 256;
    c->n_layer = n_layer;
    c->n_head = 2;
    c->n_head_kv = 1;
    c->n_ff = n_ff;
}

static struct gguf_file *write_and_open(const struct mkmodel_config *c, const char *name) {
    struct verr err = {0};
    const char *path = tmp_path(name);
    int rc = mkmodel_write(c, path, &err);
    cr_assert_eq(rc, 0, "mkmodel_write: %s", err.msg);
    struct gguf_file *f = NULL;
    rc = gguf_open(&f, path, &err);
    cr_assert_eq(rc, 0, "gguf_open: %s", err.msg);
    return f;
}

// write_and_open as "<prefix>_<type>.gguf".
static struct gguf_file *write_and_open_typed(const struct mkmodel_config *c, const char *prefix,
                                              enum ggml_type t) {
    char name[64];
    snprintf(name, sizeof name, "%s_%s.gguf", prefix, ggml_type_name(t));
    return write_and_open(c, name);
}

// mkmodel_write into the temporary directory, which must succeed.
static void write_ok(const struct mkmodel_config *c, const char *name) {
    struct verr err = {0};
    cr_assert_eq(mkmodel_write(c, tmp_path(name), &err), 0, "%s", err.msg);
}

// Per-layer tensors: "blk.<l>.<suffix>" of shape ne0 x ne1 (0: a vector) and type.
struct layer_tensor {
    const char *suffix;
    int64_t ne0, ne1;
    enum ggml_type type;
};

static uint32_t get_u32(const struct gguf_file *f, const char *key) {
    uint32_t v = 0;
    struct verr err = {0};
    cr_assert_eq(gguf_get_u32(f, key, &v, &err), 0, "%s: %s", key, err.msg);
    return v;
}

static float get_f32(const struct gguf_file *f, const char *key) {
    float v = 0;
    struct verr err = {0};
    cr_assert_eq(gguf_get_f32(f, key, &v, &err), 0, "%s: %s", key, err.msg);
    return v;
}

static void expect_str(const struct gguf_file *f, const char *key, const char *want) {
    char *s = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_get_str(f, key, &s, &err), 0, "%s: %s", key, err.msg);
    cr_expect_str_eq(s, want, "%s", key);
    free(s);
}

static const struct gguf_tensor_info *expect_tensor(const struct gguf_file *f, const char *name,
                                                    int64_t ne0, int64_t ne1, enum ggml_type type) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    cr_assert_not_null(t, "tensor %s missing", name);
    cr_expect_eq(t->n_dims, ne1 > 0 ? 2u : 1u, "%s n_dims %u", name, t->n_dims);
    cr_expect_eq(t->ne[0], ne0, "%s ne0 %lld, want %lld", name, (long long)t->ne[0],
                 (long long)ne0);
    if (ne1 > 0)
        cr_expect_eq(t->ne[1], ne1, "%s ne1 %lld, want %lld", name, (long long)t->ne[1],
                     (long long)ne1);
    cr_expect_eq(t->type, type, "%s type %s, want %s", name, ggml_type_name(t->type),
                 ggml_type_name(type));
    return t;
}

static void expect_layer(const struct gguf_file *f, int l, const struct layer_tensor *want,
                         size_t n) {
    char nm[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(nm, sizeof nm, "blk.%d.%s", l, want[i].suffix);
        expect_tensor(f, nm, want[i].ne0, want[i].ne1, want[i].type);
    }
}

// Whole tensor as float32 (malloc'd); every value must be finite.
static float *tensor_f32(const struct gguf_tensor_info *t) {
    int64_t n = t->ne[0] * t->ne[1];
    float *out = malloc(sizeof(float) * (size_t)n);
    cr_assert_not_null(out);
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    struct verr err = {0};
    for (int64_t r = 0; r < t->ne[1]; r++) {
        int rc = quant_dequantize_row(t->type, (const uint8_t *)t->data + r * rb,
                                      out + r * t->ne[0], t->ne[0], &err);
        cr_assert_eq(rc, 0, "%s row %lld: %s", t->name, (long long)r, err.msg);
    }
    for (int64_t i = 0; i < n; i++)
        cr_assert(isfinite(out[i]), "%s element %lld is %g", t->name, (long long)i, out[i]);
    return out;
}

static void tensor_stats(const struct gguf_tensor_info *t, double *mean, double *std) {
    float *x = tensor_f32(t);
    int64_t n = t->ne[0] * t->ne[1];
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *mean = s / n;
    *std = sqrt(fmax(0, s2 / n - *mean * *mean));
    free(x);
}

static bool files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb);
    bool eq = true;
    int ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb)
            eq = false;
    } while (eq && ca != EOF);
    fclose(fa);
    fclose(fb);
    return eq;
}

// Writes a.gguf with 1 thread and b.gguf with 5 (same seed: same bytes), then
// c.gguf with seed 43 (other bytes); c's seed is restored, n_threads left at 5.
static void expect_seed_determines_bytes(struct mkmodel_config *c, const char *what) {
    c->n_threads = 1;
    write_ok(c, "a.gguf");
    c->n_threads = 5; // other thread counts, same bytes
    write_ok(c, "b.gguf");
    cr_expect(files_equal(tmp_path("a.gguf"), tmp_path("b.gguf")),
              "%s: same seed, same bytes (1 vs 5 threads)", what);
    uint64_t seed = c->seed;
    c->seed = 43;
    write_ok(c, "c.gguf");
    cr_expect(!files_equal(tmp_path("a.gguf"), tmp_path("c.gguf")), "%s: another seed", what);
    c->seed = seed;
}

// --- metadata and tensors --------------------------------------------------------

Test(mkmodel, llama_default_layout, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    mkmodel_config_default(&c); // the tiny shape: 256 x 4, 8/4 heads, ff 768
    struct gguf_file *f = write_and_open(&c, "llama.gguf");
    int nv = mkmodel_vocab_base_size();
    cr_assert_gt(nv, 256 + 100, "generated vocabulary has merges (%d tokens)", nv);

    expect_str(f, "general.architecture", "llama");
    expect_str(f, "general.name", "vela-synthetic-llama");
    cr_expect_eq(get_u32(f, "general.file_type"), 0, "all F32");
    cr_expect_null(gguf_get(f, "general.quantization_version"), "no quantized tensor");
    cr_expect_eq(get_u32(f, "llama.context_length"), 2048);
    cr_expect_eq(get_u32(f, "llama.embedding_length"), 256);
    cr_expect_eq(get_u32(f, "llama.block_count"), 4);
    cr_expect_eq(get_u32(f, "llama.feed_forward_length"), 768);
    cr_expect_eq(get_u32(f, "llama.attention.head_count"), 8);
    cr_expect_eq(get_u32(f, "llama.attention.head_count_kv"), 4);
    cr_expect_null(gguf_get(f, "llama.attention.key_length"), "head_dim = n_embd / n_head");
    cr_expect_float_eq(get_f32(f, "llama.attention.layer_norm_rms_epsilon"), 1e-5f, 1e-12);
    cr_expect_eq(get_u32(f, "llama.rope.dimension_count"), 32);
    cr_expect_float_eq(get_f32(f, "llama.rope.freq_base"), 10000.0f, 1e-3);
    cr_expect_null(gguf_get(f, "llama.rope.scaling.type"));

    expect_str(f, "tokenizer.ggml.model", "gpt2");
    expect_str(f, "tokenizer.ggml.pre", "default");
    const struct gguf_array *toks, *types, *merges;
    struct verr err = {0};
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_INT32, &types, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_VT_STRING, &merges, &err), 0, "%s",
                 err.msg);
    cr_expect_eq(toks->n, (uint64_t)nv);
    cr_expect_eq(types->n, (uint64_t)nv);
    cr_expect_gt(merges->n, 100);
    uint32_t bos = get_u32(f, "tokenizer.ggml.bos_token_id"),
             eos = get_u32(f, "tokenizer.ggml.eos_token_id");
    cr_assert_lt(bos, (uint32_t)nv);
    cr_assert_lt(eos, (uint32_t)nv);
    cr_expect_eq(toks->strs[bos].len, strlen("<|begin_of_text|>"));
    cr_expect_eq(memcmp(toks->strs[bos].data, "<|begin_of_text|>", toks->strs[bos].len), 0);
    cr_expect_eq(memcmp(toks->strs[eos].data, "<|end_of_text|>", toks->strs[eos].len), 0);
    cr_expect_eq(gguf_arr_get_i64(types, bos), MKVOCAB_TOKEN_CONTROL);
    cr_expect_eq(gguf_arr_get_i64(types, 'a'), MKVOCAB_TOKEN_NORMAL);

    cr_expect_eq(f->n_tensors, 1 + 4 * 9 + 2, "token_embd, 9 per layer, output_norm, output");
    expect_tensor(f, "token_embd.weight", 256, nv, GGML_TYPE_F32);
    expect_tensor(f, "output_norm.weight", 256, 0, GGML_TYPE_F32);
    expect_tensor(f, "output.weight", 256, nv, GGML_TYPE_F32);
    cr_expect_null(gguf_find_tensor(f, "rope_freqs.weight"));
    static const struct layer_tensor llama_layer[] = {
        {"attn_norm.weight", 256, 0, GGML_TYPE_F32},     {"attn_q.weight", 256, 256, GGML_TYPE_F32},
        {"attn_k.weight", 256, 128, GGML_TYPE_F32},      {"attn_v.weight", 256, 128, GGML_TYPE_F32},
        {"attn_output.weight", 256, 256, GGML_TYPE_F32}, {"ffn_norm.weight", 256, 0, GGML_TYPE_F32},
        {"ffn_gate.weight", 256, 768, GGML_TYPE_F32},    {"ffn_up.weight", 256, 768, GGML_TYPE_F32},
        {"ffn_down.weight", 768, 256, GGML_TYPE_F32},
    };
    for (int l = 0; l < 4; l++) {
        expect_layer(f, l, llama_layer, sizeof llama_layer / sizeof llama_layer[0]);
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
        cr_expect_null(gguf_find_tensor(f, nm), "llama has no biases");
    }

    // The scales the header promises (tolerances: a few percent of sampling
    // noise over >= 32k values, plus the Irwin-Hall approximation).
    double m, s;
    tensor_stats(gguf_find_tensor(f, "token_embd.weight"), &m, &s);
    cr_expect(fabs(m) < 0.02 && fabs(s - 1.0) < 0.03, "token_embd mean %g std %g", m, s);
    tensor_stats(gguf_find_tensor(f, "blk.0.attn_q.weight"), &m, &s);
    cr_expect(fabs(s - 1.0 / 16) < 0.003, "attn_q std %g, want 1/sqrt(256)", s);
    tensor_stats(gguf_find_tensor(f, "blk.0.ffn_down.weight"), &m, &s);
    cr_expect(fabs(s - 1.0 / sqrt(768)) < 0.002, "ffn_down std %g, want 1/sqrt(768)", s);
    tensor_stats(gguf_find_tensor(f, "output.weight"), &m, &s);
    cr_expect(fabs(s - 2.0 / 16) < 0.005, "output std %g, want 2/sqrt(256)", s);
    tensor_stats(gguf_find_tensor(f, "blk.3.ffn_norm.weight"), &m, &s);
    cr_expect(fabs(m - 1.0) < 0.03 && s > 0.05 && s < 0.15, "norm mean %g std %g", m, s);

    // vela's own loader reads the same hyperparameters.
    struct model_hparams hp;
    cr_assert_eq(model_read_hparams(f, &hp, &err), 0, "model_read_hparams: %s", err.msg);
    cr_expect_eq(hp.arch, MODEL_ARCH_LLAMA);
    cr_expect_eq(hp.n_embd, 256);
    cr_expect_eq(hp.n_head_kv, 4);
    cr_expect_eq(hp.head_dim, 32);
    cr_expect_eq(hp.n_vocab, nv);
    cr_expect_eq(hp.rope_mode, ROPE_MODE_NORMAL);
    gguf_close(f);
}

Test(mkmodel, qwen2_biases_head_dim, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    small_cfg(&c);
    c.arch = MKMODEL_ARCH_QWEN2;
    c.n_head = 6;
    c.n_head_kv = 2;
    c.head_dim = 16; // 6 * 16 = 96 != 64: key_length / value_length written
    c.n_rot = 8;
    c.n_ctx = 512;
    c.tied = true;
    struct gguf_file *f = write_and_open(&c, "qwen2.gguf");
    int nv = mkmodel_vocab_base_size();
    expect_str(f, "general.architecture", "qwen2");
    cr_expect_eq(get_u32(f, "qwen2.context_length"), 512);
    cr_expect_eq(get_u32(f, "qwen2.attention.key_length"), 16);
    cr_expect_eq(get_u32(f, "qwen2.attention.value_length"), 16);
    cr_expect_eq(get_u32(f, "qwen2.rope.dimension_count"), 8);
    cr_expect_float_eq(get_f32(f, "qwen2.attention.layer_norm_rms_epsilon"), 1e-6f, 1e-13);
    cr_expect_float_eq(get_f32(f, "qwen2.rope.freq_base"), 1e6f, 1);
    cr_expect_null(gguf_find_tensor(f, "output.weight"), "tied");
    cr_expect_eq(f->n_tensors, 1 + 2 * 12 + 1);
    expect_tensor(f, "token_embd.weight", 64, nv, GGML_TYPE_F32);
    static const struct layer_tensor qwen2_layer[] = {
        {"attn_q.weight", 64, 96, GGML_TYPE_F32},      {"attn_q.bias", 96, 0, GGML_TYPE_F32},
        {"attn_k.weight", 64, 32, GGML_TYPE_F32},      {"attn_k.bias", 32, 0, GGML_TYPE_F32},
        {"attn_v.weight", 64, 32, GGML_TYPE_F32},      {"attn_v.bias", 32, 0, GGML_TYPE_F32},
        {"attn_output.weight", 96, 64, GGML_TYPE_F32},
    };
    for (int l = 0; l < 2; l++)
        expect_layer(f, l, qwen2_layer, sizeof qwen2_layer / sizeof qwen2_layer[0]);
    double m, s;
    tensor_stats(gguf_find_tensor(f, "token_embd.weight"), &m, &s);
    cr_expect(fabs(s - 1) < 0.03, "tied token_embd std %g", s);
    // Tied: the final norm's weights have both signs (see mkmodel.h); 64
    // values, so a loose tolerance.
    tensor_stats(gguf_find_tensor(f, "output_norm.weight"), &m, &s);
    cr_expect(fabs(m) < 0.12 && fabs(s - 2.0 / 8) < 0.08, "tied output_norm mean %g std %g", m, s);
    struct model_hparams hp;
    struct verr err = {0};
    cr_assert_eq(model_read_hparams(f, &hp, &err), 0, "model_read_hparams: %s", err.msg);
    cr_expect_eq(hp.arch, MODEL_ARCH_QWEN2);
    cr_expect_eq(hp.head_dim, 16);
    cr_expect_eq(hp.n_rot, 8);
    cr_expect_eq(hp.rope_mode, ROPE_MODE_NEOX);
    cr_expect(hp.has_bias_qkv);
    gguf_close(f);
}

struct notes {
    int n;
    char last[512];
};

static void collect_note(void *ctx, const char *msg) {
    struct notes *ns = ctx;
    ns->n++;
    snprintf(ns->last, sizeof ns->last, "%s", msg);
}

// llama.cpp cannot load some shapes vela writes; each gets a note.
Test(mkmodel, llamacpp_notes, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    struct notes ns;
    struct {
        enum mkmodel_arch arch;
        int n_head, head_dim, n_rot;
        const char *want; // in the note; NULL: no note
    } cases[] = {
        {MKMODEL_ARCH_LLAMA, 4, 0, 8, "--n-rot 8"},
        {MKMODEL_ARCH_QWEN2, 4, 0, 8, "--n-rot 8"},
        {MKMODEL_ARCH_QWEN2, 4, 32, 0, "--head-dim 32"},
        {MKMODEL_ARCH_LLAMA, 4, 32, 0, NULL}, // llama.cpp reads key_length for llama
        {MKMODEL_ARCH_QWEN2, 4, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        small_cfg(&c);
        c.arch = cases[i].arch;
        c.n_head = cases[i].n_head;
        c.head_dim = cases[i].head_dim;
        c.n_rot = cases[i].n_rot;
        memset(&ns, 0, sizeof ns);
        c.log = collect_note;
        c.cb_ctx = &ns;
        struct gguf_file *f = write_and_open(&c, "notes.gguf");
        gguf_close(f);
        if (cases[i].want) {
            cr_expect_eq(ns.n, 1, "case %zu: %d notes", i, ns.n);
            cr_expect(strstr(ns.last, cases[i].want) && strstr(ns.last, "llama.cpp"),
                      "case %zu: note '%s'", i, ns.last);
        } else {
            cr_expect_eq(ns.n, 0, "case %zu: note '%s'", i, ns.last);
        }
    }
}

// --- weight types ------------------------------------------------------------------

Test(mkmodel, every_type_dequantizes, .init = setup_tmp, .fini = teardown_tmp) {
    static const struct {
        enum ggml_type type;
        int file_type; // llama.cpp's LLAMA_FTYPE
    } types[] = {
        {GGML_TYPE_F32, 0},   {GGML_TYPE_F16, 1},   {GGML_TYPE_BF16, 32}, {GGML_TYPE_Q8_0, 7},
        {GGML_TYPE_Q4_0, 2},  {GGML_TYPE_Q4_1, 3},  {GGML_TYPE_Q5_0, 8},  {GGML_TYPE_Q5_1, 9},
        {GGML_TYPE_Q2_K, 10}, {GGML_TYPE_Q3_K, 11}, {GGML_TYPE_Q4_K, 14}, {GGML_TYPE_Q5_K, 16},
        {GGML_TYPE_Q6_K, 18},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        enum ggml_type t = types[i].type;
        if (!quant_can_quantize(t)) {
            cr_log_warn("skipping %s: no quantizer", ggml_type_name(t));
            continue;
        }
        struct mkmodel_config c;
        cfg_256(&c, 1, 256); // a whole K-quant block per row
        c.type = t;
        struct gguf_file *f = write_and_open_typed(&c, "type", t);
        cr_expect_eq(get_u32(f, "general.file_type"), (uint32_t)types[i].file_type, "%s",
                     ggml_type_name(t));
        bool quantized = ggml_type_get(t)->quantized;
        cr_expect_eq(gguf_get(f, "general.quantization_version") != NULL, quantized, "%s",
                     ggml_type_name(t));
        int nv = mkmodel_vocab_base_size();
        expect_tensor(f, "token_embd.weight", 256, nv, t);
        expect_tensor(f, "output.weight", 256, nv, t);
        expect_tensor(f, "blk.0.attn_q.weight", 256, 256, t);
        expect_tensor(f, "blk.0.attn_k.weight", 256, 128, t);
        expect_tensor(f, "blk.0.ffn_down.weight", 256, 256, t);
        expect_tensor(f, "blk.0.attn_norm.weight", 256, 0, GGML_TYPE_F32);
        // Quantization noise of a 4-bit type adds ~3% to the std of N(0, s^2)
        // values, sampling noise over 65k values ~0.5%: 8% tolerance.
        double m, s;
        tensor_stats(gguf_find_tensor(f, "blk.0.attn_q.weight"), &m, &s);
        cr_expect(fabs(s / (1.0 / 16) - 1) < 0.08, "%s attn_q std %g, want %g", ggml_type_name(t),
                  s, 1.0 / 16);
        cr_expect(fabs(m) < 0.005, "%s attn_q mean %g", ggml_type_name(t), m);
        tensor_stats(gguf_find_tensor(f, "token_embd.weight"), &m, &s);
        cr_expect(fabs(s - 1) < 0.08, "%s token_embd std %g", ggml_type_name(t), s);
        tensor_stats(gguf_find_tensor(f, "blk.0.ffn_up.weight"), &m, &s);
        tensor_stats(gguf_find_tensor(f, "blk.0.attn_output.weight"), &m, &s);
        gguf_close(f);
    }
}

Test(mkmodel, class_overrides, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    small_cfg(&c);
    c.type = GGML_TYPE_Q8_0;
    c.type_embd = GGML_TYPE_F16;
    c.type_output = GGML_TYPE_Q4_0;
    c.type_attn = GGML_TYPE_Q5_0;
    c.type_ffn = GGML_TYPE_Q4_1;
    struct gguf_file *f = write_and_open(&c, "override.gguf");
    int nv = mkmodel_vocab_base_size();
    cr_expect_eq(get_u32(f, "general.file_type"), 7, "mostly Q8_0");
    expect_tensor(f, "token_embd.weight", 64, nv, GGML_TYPE_F16);
    expect_tensor(f, "output.weight", 64, nv, GGML_TYPE_Q4_0);
    expect_tensor(f, "blk.1.attn_v.weight", 64, 32, GGML_TYPE_Q5_0);
    expect_tensor(f, "blk.1.attn_output.weight", 64, 64, GGML_TYPE_Q5_0);
    expect_tensor(f, "blk.1.ffn_down.weight", 128, 64, GGML_TYPE_Q4_1);
    expect_tensor(f, "blk.1.ffn_norm.weight", 64, 0, GGML_TYPE_F32);
    gguf_close(f);
}

Test(mkmodel, fallback_types, .init = setup_tmp, .fini = teardown_tmp) {
    // Rows of 320: Q4_K's 256 does not divide them, Q5_0's 32 does (llama.cpp's
    // fallback); rows of 256 (ffn_down) keep Q4_K.
    struct mkmodel_config c;
    small_cfg(&c);
    c.n_embd = 320;
    c.n_head = 5;
    c.n_head_kv = 1;
    c.n_ff = 256;
    c.n_layer = 1;
    c.type = GGML_TYPE_Q4_K;
    struct notes ns = {0};
    c.log = collect_note;
    c.cb_ctx = &ns;
    if (!quant_can_quantize(GGML_TYPE_Q4_K))
        cr_skip_test("no Q4_K quantizer");
    struct gguf_file *f = write_and_open(&c, "fallback.gguf");
    expect_tensor(f, "blk.0.attn_q.weight", 320, 320, GGML_TYPE_Q5_0);
    expect_tensor(f, "blk.0.ffn_down.weight", 256, 320, GGML_TYPE_Q4_K);
    expect_tensor(f, "token_embd.weight", 320, mkmodel_vocab_base_size(), GGML_TYPE_Q5_0);
    cr_expect_gt(ns.n, 0, "the fallback is reported");
    cr_expect(strstr(ns.last, "q5_0") != NULL, "note: %s", ns.last);
    gguf_close(f);

    // Rows of 48: not even a 32-block fits, so Q8_0 falls back to F16.
    small_cfg(&c);
    c.n_embd = 48;
    c.n_head = 3;
    c.n_head_kv = 1;
    c.n_ff = 64;
    c.type = GGML_TYPE_Q8_0;
    f = write_and_open(&c, "fallback_f16.gguf");
    expect_tensor(f, "blk.0.attn_q.weight", 48, 48, GGML_TYPE_F16);
    expect_tensor(f, "blk.0.ffn_down.weight", 64, 48, GGML_TYPE_Q8_0);
    gguf_close(f);
}

// llama.cpp's use_more_bits for 8 layers: i < 1, i >= 7, (i - 1) % 3 == 2.
static const bool more_bits_8[8] = {true, false, false, true, false, false, true, true};

Test(mkmodel, mix_q4_k_m, .init = setup_tmp, .fini = teardown_tmp) {
    if (!quant_can_quantize(GGML_TYPE_Q4_K) || !quant_can_quantize(GGML_TYPE_Q6_K))
        cr_skip_test("no K-quant quantizers");
    struct mkmodel_config c;
    cfg_256(&c, 8, 256);
    c.mix = MKMODEL_MIX_Q4_K_M;
    c.type = GGML_TYPE_F32; // ignored: the mix sets the base
    struct gguf_file *f = write_and_open(&c, "q4_k_m.gguf");
    int nv = mkmodel_vocab_base_size();
    cr_expect_eq(get_u32(f, "general.file_type"), 15, "LLAMA_FTYPE_MOSTLY_Q4_K_M");
    expect_tensor(f, "token_embd.weight", 256, nv, GGML_TYPE_Q4_K);
    expect_tensor(f, "output.weight", 256, nv, GGML_TYPE_Q6_K);
    for (int l = 0; l < 8; l++) {
        enum ggml_type hi = more_bits_8[l] ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        const struct layer_tensor mix_layer[] = {
            {"attn_q.weight", 256, 256, GGML_TYPE_Q4_K},
            {"attn_k.weight", 256, 128, GGML_TYPE_Q4_K},
            {"attn_v.weight", 256, 128, hi},
            {"attn_output.weight", 256, 256, GGML_TYPE_Q4_K},
            {"ffn_gate.weight", 256, 256, GGML_TYPE_Q4_K},
            {"ffn_up.weight", 256, 256, GGML_TYPE_Q4_K},
            {"ffn_down.weight", 256, 256, hi},
        };
        expect_layer(f, l, mix_layer, sizeof mix_layer / sizeof mix_layer[0]);
    }
    double m, s;
    tensor_stats(gguf_find_tensor(f, "blk.3.ffn_down.weight"), &m, &s);
    cr_expect(fabs(s / (1.0 / 16) - 1) < 0.08, "Q6_K ffn_down std %g", s);
    gguf_close(f);

    // Tied: token_embd doubles as the head and gets the head's Q6_K.
    c.n_layer = 1;
    c.tied = true;
    f = write_and_open(&c, "q4_k_m_tied.gguf");
    expect_tensor(f, "token_embd.weight", 256, nv, GGML_TYPE_Q6_K);
    cr_expect_null(gguf_find_tensor(f, "output.weight"));
    gguf_close(f);
}

// --- fast weights ------------------------------------------------------------------

// Every type the fast path writes.
static const enum ggml_type fast_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,   GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
};

// Tensor std within `band` (relative) of want, mean within 2% of want, every
// row valid (quant_validate_row: finite scales) and every value finite.
static void expect_fast_stats(const struct gguf_file *f, const char *name, double want, double band,
                              enum ggml_type type) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    cr_assert_not_null(t, "%s", name);
    cr_assert_eq(t->type, type, "%s is %s", name, ggml_type_name(t->type));
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    struct verr err = {0};
    for (int64_t r = 0; r < t->ne[1]; r++)
        cr_assert_eq(quant_validate_row(t->type, (const uint8_t *)t->data + r * rb, t->ne[0], &err),
                     0, "%s %s row %lld: %s", ggml_type_name(type), name, (long long)r, err.msg);
    double m, s;
    tensor_stats(t, &m, &s); // dequantizes with quant_dequantize_row, checks finiteness
    cr_expect(fabs(s / want - 1) < band, "%s %s: std %g, want %g +- %g%%", ggml_type_name(type),
              name, s, want, 100 * band);
    cr_expect(fabs(m) < 0.02 * want, "%s %s: mean %g (std %g)", ggml_type_name(type), name, m,
              want);
}

Test(mkmodel, fast_weights_std, .init = setup_tmp, .fini = teardown_tmp) {
    // Every type, written by the fast path and read back through
    // quant_dequantize_row: the std of each matrix within 4% of what the
    // exact path targets (measured: < 1.5%; sampling noise of the per-block
    // gains and K-quant sub-block scales over >= 65k values is ~1%), mean
    // within 2% of the std. ffn_down's rows of 4096 (std 1/64) put the
    // K-quant block scales among the f16 subnormals, as in a 7B model.
    for (size_t i = 0; i < sizeof fast_types / sizeof fast_types[0]; i++) {
        enum ggml_type t = fast_types[i];
        struct mkmodel_config c;
        cfg_256(&c, 1, 4096);
        c.type = t;
        c.weights = MKMODEL_WEIGHTS_FAST;
        struct gguf_file *f = write_and_open_typed(&c, "fast", t);
        const double band = 0.04;
        expect_fast_stats(f, "token_embd.weight", 1.0, band, t);
        expect_fast_stats(f, "blk.0.attn_q.weight", 1.0 / 16, band, t);
        expect_fast_stats(f, "blk.0.attn_output.weight", 1.0 / 16, band, t);
        expect_fast_stats(f, "blk.0.ffn_up.weight", 1.0 / 16, band, t);
        expect_fast_stats(f, "blk.0.ffn_down.weight", 1.0 / 64, band, t);
        expect_fast_stats(f, "output.weight", 2.0 / 16, band, t);
        // Vectors keep the exact path: N(1, 0.1^2) norms.
        double m, s;
        tensor_stats(gguf_find_tensor(f, "blk.0.attn_norm.weight"), &m, &s);
        cr_expect(fabs(m - 1) < 0.05 && s > 0.05 && s < 0.15, "attn_norm mean %g std %g", m, s);
        gguf_close(f);
    }
}

Test(mkmodel, fast_weights_deterministic, .init = setup_tmp, .fini = teardown_tmp) {
    // Q4_K_M (Q4_K and Q6_K) with F16 embeddings and Q5_0 / Q8_0 matrices:
    // same bytes for 1 and 5 threads, other bytes for another seed or the
    // exact path.
    struct mkmodel_config c;
    cfg_256(&c, 3, 512);
    c.mix = MKMODEL_MIX_Q4_K_M;
    c.type_embd = GGML_TYPE_F16;
    c.type_attn = GGML_TYPE_Q5_0;
    c.weights = MKMODEL_WEIGHTS_FAST;
    expect_seed_determines_bytes(&c, "fast");
    c.n_threads = 2;
    write_ok(&c, "b.gguf");
    cr_expect(files_equal(tmp_path("a.gguf"), tmp_path("b.gguf")), "1 vs 2 threads");
    c.weights = MKMODEL_WEIGHTS_EXACT;
    write_ok(&c, "d.gguf");
    cr_expect(!files_equal(tmp_path("a.gguf"), tmp_path("d.gguf")), "exact path");
}

Test(mkmodel, fast_weights_default) {
    // AUTO: exact up to 1e9 parameters (small models keep their bytes), fast above.
    struct verr err = {0};
    struct mkmodel_config c, r;
    mkmodel_config_default(&c);
    cr_expect_eq(c.weights, MKMODEL_WEIGHTS_AUTO);
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s", err.msg);
    cr_expect_eq(r.weights, MKMODEL_WEIGHTS_EXACT, "tiny");
    const char *exact[] = {"cpu-100m", "qwen2-0.5b"}, *fast[] = {"llama2-7b", "llama3-8b"};
    for (int i = 0; i < 2; i++) {
        mkmodel_config_default(&c);
        cr_assert_eq(mkmodel_preset(&c, exact[i], &err), 0);
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s", err.msg);
        cr_expect_eq(r.weights, MKMODEL_WEIGHTS_EXACT, "%s", exact[i]);
        mkmodel_config_default(&c);
        cr_assert_eq(mkmodel_preset(&c, fast[i], &err), 0);
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s", err.msg);
        cr_expect_eq(r.weights, MKMODEL_WEIGHTS_FAST, "%s", fast[i]);
        c.weights = MKMODEL_WEIGHTS_EXACT; // forced either way
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s", err.msg);
        cr_expect_eq(r.weights, MKMODEL_WEIGHTS_EXACT, "%s --exact-weights", fast[i]);
    }
    mkmodel_config_default(&c);
    c.weights = MKMODEL_WEIGHTS_FAST;
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s", err.msg);
    cr_expect_eq(r.weights, MKMODEL_WEIGHTS_FAST, "tiny --fast-weights");
    c.weights = (enum mkmodel_weights)7;
    cr_expect_neq(mkmodel_resolve(&c, &r, &err), 0);
    cr_expect(strstr(err.msg, "--fast-weights") != NULL, "%s", err.msg);
}

// --- rope metadata ---------------------------------------------------------------------

Test(mkmodel, rope_metadata_and_freqs, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    small_cfg(&c);
    c.rope_freq_base = 500000.0f;
    c.rope_scaling = MKMODEL_ROPE_SCALING_YARN;
    c.rope_scale = 4.0f;
    c.yarn_orig_ctx = 1024;
    c.n_ctx = 4096;
    c.rope_freqs = true;
    struct gguf_file *f = write_and_open(&c, "rope.gguf");
    cr_expect_float_eq(get_f32(f, "llama.rope.freq_base"), 500000.0f, 1e-1);
    expect_str(f, "llama.rope.scaling.type", "yarn");
    cr_expect_float_eq(get_f32(f, "llama.rope.scaling.factor"), 4.0f, 1e-6);
    cr_expect_eq(get_u32(f, "llama.rope.scaling.original_context_length"), 1024);
    const struct gguf_tensor_info *t = expect_tensor(f, "rope_freqs.weight", 8, 0, GGML_TYPE_F32);
    float *x = tensor_f32(t);
    // Llama 3.1: factor 1 for short wavelengths (dim 0: 2*pi), the full factor
    // 8 for long ones (dim 7: 2*pi*500000^(14/16) ~ 6e5 > 8192), never decreasing.
    cr_expect_float_eq(x[0], 1.0f, 1e-6);
    cr_expect_float_eq(x[7], 8.0f, 1e-6);
    for (int i = 1; i < 8; i++)
        cr_expect_geq(x[i], x[i - 1]);
    free(x);
    gguf_close(f);

    small_cfg(&c);
    c.rope_scaling = MKMODEL_ROPE_SCALING_LINEAR;
    c.rope_scale = 2.0f;
    f = write_and_open(&c, "rope_linear.gguf");
    expect_str(f, "llama.rope.scaling.type", "linear");
    cr_expect_float_eq(get_f32(f, "llama.rope.scaling.factor"), 2.0f, 1e-6);
    cr_expect_null(gguf_get(f, "llama.rope.scaling.original_context_length"));
    gguf_close(f);
}

// --- determinism ----------------------------------------------------------------------

Test(mkmodel, deterministic_for_a_seed, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    small_cfg(&c);
    c.type = GGML_TYPE_Q4_0;
    expect_seed_determines_bytes(&c, "q4_0");
}

// --- vocabulary --------------------------------------------------------------------------

Test(mkmodel, generated_vocab_is_consistent) {
    struct mkvocab v;
    cr_assert_eq(mkvocab_generate(&v, 5000), 0);
    cr_expect_eq(v.n_tokens, 5000, "padded");
    // Every merge joins two tokens that exist into one that exists.
    for (int i = 0; i < v.n_merges; i++) {
        const char *sp = strchr(v.merges[i], ' ');
        cr_assert_not_null(sp, "merge %d '%s'", i, v.merges[i]);
        char left[128], joined[256];
        snprintf(left, sizeof left, "%.*s", (int)(sp - v.merges[i]), v.merges[i]);
        snprintf(joined, sizeof joined, "%s%s", left, sp + 1);
        bool have_l = false, have_r = false, have_j = false;
        for (int t = 0; t < v.n_tokens; t++) {
            have_l |= !strcmp(v.tokens[t], left);
            have_r |= !strcmp(v.tokens[t], sp + 1);
            have_j |= !strcmp(v.tokens[t], joined);
        }
        cr_expect(have_l && have_r && have_j, "merge '%s'", v.merges[i]);
    }
    // Token texts are unique; common words became single tokens.
    bool have_the = false;
    for (int a = 0; a < v.n_tokens; a++) {
        have_the |= !strcmp(v.tokens[a], "\xc4\xa0the"); // "Ġthe"
        for (int b = a + 1; b < v.n_tokens && b < a + 600; b++)
            cr_assert(strcmp(v.tokens[a], v.tokens[b]) != 0, "token %d == %d '%s'", a, b,
                      v.tokens[a]);
    }
    cr_expect(have_the, "' the' is one token");
    cr_expect_str_eq(v.tokens[' '], "\xc4\xa0", "space is GPT-2's U+0120");
    cr_expect_str_eq(v.tokens['A'], "A");
    cr_expect_str_eq(v.tokens[v.bos_id], "<|begin_of_text|>");
    cr_expect_eq(v.token_type[v.n_tokens - 1], MKVOCAB_TOKEN_NORMAL);
    mkvocab_free(&v);
}

Test(mkmodel, vocab_copied_from_file, .init = setup_tmp, .fini = teardown_tmp) {
    const char *shared = getenv("VELA_SHARED_DIR");
    if (!shared)
        cr_skip_test("VELA_SHARED_DIR not set");
    char src[512];
    snprintf(src, sizeof src, "%s/vocab/ggml-vocab-llama-spm.gguf", shared);
    if (access(src, R_OK) != 0)
        cr_skip_test("%s not found", src);
    struct gguf_file *v = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&v, src, &err), 0, "%s", err.msg);

    struct mkmodel_config c;
    small_cfg(&c);
    c.n_layer = 1;
    c.n_vocab = 1000; // replaced by the file's size
    c.vocab_path = src;
    struct gguf_file *f = write_and_open(&c, "spm.gguf");
    const struct gguf_array *toks;
    cr_assert_eq(gguf_get_arr(v, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, &err), 0);
    expect_tensor(f, "token_embd.weight", 64, (int64_t)toks->n, GGML_TYPE_F32);
    expect_tensor(f, "output.weight", 64, (int64_t)toks->n, GGML_TYPE_F32);
    cr_expect_eq(get_u32(f, "llama.vocab_size"), (uint32_t)toks->n);
    int copied = 0;
    for (uint64_t i = 0; i < v->n_kv; i++) {
        const struct gguf_kv *kv = &v->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0)
            continue;
        const struct gguf_value *got = gguf_get(f, kv->key);
        cr_assert_not_null(got, "%s not copied", kv->key);
        cr_expect_eq(got->type, kv->val.type, "%s type", kv->key);
        if (kv->val.type == GGUF_VT_ARRAY) {
            cr_expect_eq(got->arr.type, kv->val.arr.type, "%s element type", kv->key);
            cr_assert_eq(got->arr.n, kv->val.arr.n, "%s length", kv->key);
            if (kv->val.arr.type == GGUF_VT_STRING) {
                for (uint64_t k = 0; k < got->arr.n; k++)
                    cr_assert(got->arr.strs[k].len == kv->val.arr.strs[k].len &&
                                  !memcmp(got->arr.strs[k].data, kv->val.arr.strs[k].data,
                                          got->arr.strs[k].len),
                              "%s[%llu]", kv->key, (unsigned long long)k);
            } else {
                size_t es = gguf_vtype_size(kv->val.arr.type);
                cr_expect(!memcmp(got->arr.data, kv->val.arr.data, es * got->arr.n), "%s", kv->key);
            }
        } else if (kv->val.type == GGUF_VT_STRING) {
            cr_expect(got->str.len == kv->val.str.len &&
                          !memcmp(got->str.data, kv->val.str.data, got->str.len),
                      "%s", kv->key);
        } else {
            cr_expect(!memcmp(&got->u64, &kv->val.u64, gguf_vtype_size(kv->val.type)), "%s",
                      kv->key);
        }
        copied++;
    }
    cr_expect_gt(copied, 3);
    cr_expect_null(gguf_get(f, "tokenizer.ggml.merges"), "an SPM vocabulary has no merges");
    gguf_close(f);
    gguf_close(v);
}

// --- a naive forward pass -------------------------------------------------------------------

struct fwd_model {
    int E, L, H, HKV, D, F, V, n_rot;
    float eps, base;
    float *embd, *out_norm, *output; // output == embd when tied
    float **attn_norm, **wq, **wk, **wv, **wo, **ffn_norm, **wg, **wu, **wd;
};

static float *load(const struct gguf_file *f, const char *name) {
    const struct gguf_tensor_info *t = gguf_find_tensor(f, name);
    cr_assert_not_null(t, "%s", name);
    return tensor_f32(t);
}

static void fwd_load(struct fwd_model *m, const struct gguf_file *f) {
    m->E = (int)get_u32(f, "llama.embedding_length");
    m->L = (int)get_u32(f, "llama.block_count");
    m->H = (int)get_u32(f, "llama.attention.head_count");
    m->HKV = (int)get_u32(f, "llama.attention.head_count_kv");
    m->D = m->E / m->H;
    m->F = (int)get_u32(f, "llama.feed_forward_length");
    m->n_rot = (int)get_u32(f, "llama.rope.dimension_count");
    m->eps = get_f32(f, "llama.attention.layer_norm_rms_epsilon");
    m->base = get_f32(f, "llama.rope.freq_base");
    m->embd = load(f, "token_embd.weight");
    m->V = (int)gguf_find_tensor(f, "token_embd.weight")->ne[1];
    m->out_norm = load(f, "output_norm.weight");
    m->output = gguf_find_tensor(f, "output.weight") ? load(f, "output.weight") : m->embd;
    float ***lists[] = {&m->attn_norm, &m->wq, &m->wk, &m->wv, &m->wo,
                        &m->ffn_norm,  &m->wg, &m->wu, &m->wd};
    const char *names[] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                           "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    for (int k = 0; k < 9; k++) {
        *lists[k] = calloc((size_t)m->L, sizeof(float *));
        for (int l = 0; l < m->L; l++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[k]);
            (*lists[k])[l] = load(f, nm);
        }
    }
}

static void fwd_free(struct fwd_model *m) {
    if (m->output != m->embd)
        free(m->output);
    free(m->embd);
    free(m->out_norm);
    float **lists[] = {m->attn_norm, m->wq, m->wk, m->wv, m->wo, m->ffn_norm, m->wg, m->wu, m->wd};
    for (int k = 0; k < 9; k++) {
        for (int l = 0; l < m->L; l++)
            free(lists[k][l]);
        free(lists[k]);
    }
}

// y[n_out] = W[n_out][n_in] x
static void matvec(float *y, const float *W, const float *x, int n_in, int n_out) {
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++)
            s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = (float)s;
    }
}

static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(s / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = x[i] * r * w[i];
}

static void rope_normal(float *x, int pos, int n_rot, float base) {
    for (int i = 0; i < n_rot / 2; i++) {
        double th = pos * pow(base, -2.0 * i / n_rot);
        float c = (float)cos(th), s = (float)sin(th);
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

// Greedy generation of n_gen tokens after the prompt; fills out[] and the
// largest |residual| and the mean logit std seen.
static void fwd_generate(const struct fwd_model *m, const int *prompt, int n_prompt, int n_gen,
                         int *out, double *max_resid, double *mean_logit_std) {
    const int T = n_prompt + n_gen, E = m->E, D = m->D, KD = m->HKV * D;
    float *kc = calloc((size_t)m->L * T * KD, sizeof(float));
    float *vc = calloc((size_t)m->L * T * KD, sizeof(float));
    float *x = malloc(sizeof(float) * E), *xn = malloc(sizeof(float) * E);
    float *q = malloc(sizeof(float) * E), *att = malloc(sizeof(float) * E);
    float *tmp = malloc(sizeof(float) * (m->F > E ? m->F : E));
    float *g = malloc(sizeof(float) * m->F), *u = malloc(sizeof(float) * m->F);
    float *sc = malloc(sizeof(float) * T), *logits = malloc(sizeof(float) * m->V);
    *max_resid = 0;
    double std_sum = 0;
    int n_std = 0, tok = prompt[0];
    for (int p = 0; p < T - 1; p++) {
        memcpy(x, m->embd + (size_t)tok * E, sizeof(float) * E);
        for (int l = 0; l < m->L; l++) {
            float *K = kc + (size_t)l * T * KD, *Vv = vc + (size_t)l * T * KD;
            rmsnorm(xn, x, m->attn_norm[l], E, m->eps);
            matvec(q, m->wq[l], xn, E, E);
            matvec(K + (size_t)p * KD, m->wk[l], xn, E, KD);
            matvec(Vv + (size_t)p * KD, m->wv[l], xn, E, KD);
            for (int h = 0; h < m->H; h++)
                rope_normal(q + h * D, p, m->n_rot, m->base);
            for (int h = 0; h < m->HKV; h++)
                rope_normal(K + (size_t)p * KD + h * D, p, m->n_rot, m->base);
            for (int h = 0; h < m->H; h++) {
                int hk = h / (m->H / m->HKV);
                float mx = -INFINITY;
                for (int t = 0; t <= p; t++) {
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += (double)q[h * D + d] * K[(size_t)t * KD + hk * D + d];
                    sc[t] = (float)(s / sqrt(D));
                    mx = fmaxf(mx, sc[t]);
                }
                double z = 0;
                for (int t = 0; t <= p; t++)
                    z += (sc[t] = expf(sc[t] - mx));
                for (int d = 0; d < D; d++) {
                    double s = 0;
                    for (int t = 0; t <= p; t++)
                        s += sc[t] * Vv[(size_t)t * KD + hk * D + d];
                    att[h * D + d] = (float)(s / z);
                }
            }
            matvec(tmp, m->wo[l], att, E, E);
            for (int i = 0; i < E; i++)
                x[i] += tmp[i];
            rmsnorm(xn, x, m->ffn_norm[l], E, m->eps);
            matvec(g, m->wg[l], xn, E, m->F);
            matvec(u, m->wu[l], xn, E, m->F);
            for (int i = 0; i < m->F; i++)
                g[i] = g[i] / (1 + expf(-g[i])) * u[i];
            matvec(tmp, m->wd[l], g, m->F, E);
            for (int i = 0; i < E; i++) {
                x[i] += tmp[i];
                *max_resid = fmax(*max_resid, fabs(x[i]));
            }
        }
        if (p + 1 < n_prompt) {
            tok = prompt[p + 1];
            continue;
        }
        rmsnorm(xn, x, m->out_norm, E, m->eps);
        matvec(logits, m->output, xn, E, m->V);
        int best = 0;
        double s = 0, s2 = 0;
        for (int v = 0; v < m->V; v++) {
            cr_assert(isfinite(logits[v]), "logit %d at pos %d is %g", v, p, logits[v]);
            if (logits[v] > logits[best])
                best = v;
            s += logits[v];
            s2 += (double)logits[v] * logits[v];
        }
        std_sum += sqrt(s2 / m->V - (s / m->V) * (s / m->V));
        n_std++;
        out[p + 1 - n_prompt] = tok = best;
    }
    *mean_logit_std = std_sum / n_std;
    free(kc), free(vc), free(x), free(xn), free(q), free(att), free(tmp), free(g), free(u);
    free(sc), free(logits);
}

static void check_generation(const struct mkmodel_config *c, const char *name) {
    struct gguf_file *f = write_and_open(c, name);
    struct fwd_model m;
    fwd_load(&m, f);
    int bos = (int)get_u32(f, "tokenizer.ggml.bos_token_id");
    const int prompt[] = {bos, 'H', 'e', 'l', 'l', 'o'};
    enum { N_GEN = 24 };
    int out[N_GEN];
    double max_resid, logit_std;
    fwd_generate(&m, prompt, 6, N_GEN, out, &max_resid, &logit_std);
    int distinct = 0;
    for (int i = 0; i < N_GEN; i++) {
        bool seen = false;
        for (int k = 0; k < i; k++)
            seen |= out[k] == out[i];
        distinct += !seen;
    }
    // Residual growth is ~sqrt(layers); logits ~N(0, 2^2) by construction.
    cr_expect(max_resid < 100, "%s: residual reached %g", name, max_resid);
    cr_expect(logit_std > 0.5 && logit_std < 8, "%s: logit std %g", name, logit_std);
    cr_expect_geq(distinct, 4, "%s: greedy generation is (nearly) constant: %d distinct", name,
                  distinct);
    fwd_free(&m);
    gguf_close(f);
}

Test(mkmodel, forward_pass_is_sane, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    mkmodel_config_default(&c); // tiny
    check_generation(&c, "fwd_tiny.gguf");
    c.tied = true;
    check_generation(&c, "fwd_tied.gguf");
    // Deep and narrow: activations must stay finite through many layers.
    small_cfg(&c);
    c.n_layer = 32;
    c.type = GGML_TYPE_Q4_0;
    check_generation(&c, "fwd_deep.gguf");
    // The same through the fast path, and a deep K-quant mix.
    c.weights = MKMODEL_WEIGHTS_FAST;
    check_generation(&c, "fwd_deep_fast.gguf");
    small_cfg(&c);
    c.n_embd = 256;
    c.n_ff = 512;
    c.n_layer = 16;
    c.mix = MKMODEL_MIX_Q4_K_M;
    c.weights = MKMODEL_WEIGHTS_FAST;
    check_generation(&c, "fwd_q4_k_m_fast.gguf");
}

// --- presets and errors ----------------------------------------------------------------------

Test(mkmodel, presets) {
    struct verr err = {0};
    struct mkmodel_config c, r;
    int n = 0;
    for (const struct mkmodel_preset_info *p = mkmodel_presets(); p->name; p++, n++) {
        mkmodel_config_default(&c);
        cr_assert_eq(mkmodel_preset(&c, p->name, &err), 0, "%s: %s", p->name, err.msg);
        cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0, "%s: %s", p->name, err.msg);
    }
    cr_expect_geq(n, 5);

    mkmodel_config_default(&c);
    cr_assert_eq(mkmodel_preset(&c, "llama3-8b", &err), 0);
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0);
    cr_expect_eq(r.n_embd, 4096);
    cr_expect_eq(r.n_layer, 32);
    cr_expect_eq(r.n_head_kv, 8);
    cr_expect_eq(r.n_ff, 14336);
    cr_expect_eq(r.n_vocab, 128256);
    cr_expect_eq(r.n_ctx, 8192);
    cr_expect_float_eq(r.rope_freq_base, 500000.0f, 1e-3);
    cr_expect_eq(r.head_dim, 128);
    cr_expect_eq(r.n_rot, 128);

    cr_assert_eq(mkmodel_preset(&c, "llama2-7b", &err), 0);
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0);
    double p7 = (double)mkmodel_count_params(&r);
    cr_expect(p7 > 6.7e9 && p7 < 6.8e9, "llama2-7b has %g params", p7);

    cr_assert_eq(mkmodel_preset(&c, "cpu-100m", &err), 0);
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0);
    double p100 = (double)mkmodel_count_params(&r);
    cr_expect(p100 > 90e6 && p100 < 110e6, "cpu-100m has %g params", p100);
    cr_expect_eq(r.type, GGML_TYPE_F32);

    cr_assert_eq(mkmodel_preset(&c, "qwen2-0.5b", &err), 0);
    cr_assert_eq(mkmodel_resolve(&c, &r, &err), 0);
    cr_expect_eq(r.arch, MKMODEL_ARCH_QWEN2);
    cr_expect(r.tied);
    cr_expect_eq(r.head_dim, 64);

    cr_expect_eq(mkmodel_preset(&c, "gpt-5", &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "--preset") && strstr(err.msg, "tiny"), "%s", err.msg);
}

static void expect_invalid(const struct mkmodel_config *c, const char *flag) {
    struct verr err = {0};
    struct mkmodel_config r;
    int rc = mkmodel_resolve(c, &r, &err);
    cr_expect_neq(rc, 0, "expected an error naming %s", flag);
    cr_expect(strstr(err.msg, flag) != NULL, "message '%s' should name %s", err.msg, flag);
    // mkmodel_write refuses the same config and leaves no file behind.
    char path[512];
    snprintf(path, sizeof path, "%s/invalid.gguf", tmpdir);
    cr_expect_neq(mkmodel_write(c, path, &err), 0);
    cr_expect_neq(access(path, F_OK), 0, "no file written");
}

Test(mkmodel, invalid_configs, .init = setup_tmp, .fini = teardown_tmp) {
    struct mkmodel_config c;
    small_cfg(&c);
    c.n_head = 6; // 64 % 6 != 0
    c.n_head_kv = 2;
    expect_invalid(&c, "--n-head");
    small_cfg(&c);
    c.n_head_kv = 3;
    expect_invalid(&c, "--n-head-kv");
    small_cfg(&c);
    c.n_rot = 7;
    expect_invalid(&c, "--n-rot");
    small_cfg(&c);
    c.n_rot = 32; // head dim 16
    expect_invalid(&c, "--n-rot");
    small_cfg(&c);
    c.n_vocab = 100;
    expect_invalid(&c, "--n-vocab");
    small_cfg(&c);
    c.n_embd = 0;
    expect_invalid(&c, "--n-embd");
    small_cfg(&c);
    c.n_layer = -1;
    expect_invalid(&c, "--n-layer");
    small_cfg(&c);
    c.type = GGML_TYPE_IQ2_XXS;
    expect_invalid(&c, "--type");
    small_cfg(&c);
    c.type_ffn = GGML_TYPE_Q8_1;
    expect_invalid(&c, "--type-ffn");
    small_cfg(&c);
    c.rope_scaling = MKMODEL_ROPE_SCALING_LINEAR;
    c.rope_scale = 0;
    expect_invalid(&c, "--rope-scale");
    small_cfg(&c);
    c.vocab_path = "/nonexistent/vocab.gguf";
    expect_invalid(&c, "--vocab");

    struct verr err = {0};
    small_cfg(&c);
    cr_expect_eq(mkmodel_write(&c, "/nonexistent/dir/x.gguf", &err), VERR_IO, "%s", err.msg);
}

// --- the tool ---------------------------------------------------------------------------------

// Runs `$VELA_BIN mkmodel ARGS`, returns the exit status and the start of
// stdout+stderr in out.
static int run_tool(const char *args, char *out, size_t cap) {
    const char *bin = getenv("VELA_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s mkmodel %s 2>&1", bin, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(mkmodel, tool_flags, .init = setup_tmp, .fini = teardown_tmp) {
    const char *bin = getenv("VELA_BIN");
    if (!bin || access(bin, X_OK) != 0)
        cr_skip_test("VELA_BIN not set");
    static char out[32768];
    cr_expect_eq(run_tool("--help", out, sizeof out), 0);
    static const char *flags[] = {"--output",
                                  "--preset",
                                  "--name",
                                  "--seed",
                                  "--threads",
                                  "--quiet",
                                  "--arch",
                                  "--n-embd",
                                  "--n-layer",
                                  "--n-head",
                                  "--n-head-kv",
                                  "--n-ff",
                                  "--n-vocab",
                                  "--ctx",
                                  "--head-dim",
                                  "--n-rot",
                                  "--norm-eps",
                                  "--tied",
                                  "--untied",
                                  "--type",
                                  "--type-embd",
                                  "--type-output",
                                  "--type-attn",
                                  "--type-ffn",
                                  "--mix",
                                  "--rope-freq-base",
                                  "--rope-scaling",
                                  "--rope-scale",
                                  "--yarn-orig-ctx",
                                  "--rope-freqs",
                                  "--rope-freqs-factor",
                                  "--rope-freqs-orig-ctx",
                                  "--vocab",
                                  "--fast-weights",
                                  "--exact-weights",
                                  "tiny",
                                  "cpu-100m",
                                  "qwen2-0.5b",
                                  "llama2-7b",
                                  "llama3-8b"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_expect(strstr(out, flags[i]) != NULL, "--help does not mention %s", flags[i]);

    char args[1024];
    cr_expect_eq(run_tool("--bogus -o /dev/null", out, sizeof out), 2);
    cr_expect(strstr(out, "--bogus") != NULL, "%s", out);
    cr_expect_eq(run_tool("--n-embd abc -o x.gguf", out, sizeof out), 2);
    cr_expect(strstr(out, "--n-embd") != NULL, "%s", out);
    cr_expect_eq(run_tool("--type q9_9 -o x.gguf", out, sizeof out), 2);
    cr_expect_eq(run_tool("--preset nope -o x.gguf", out, sizeof out), 2);
    cr_expect_eq(run_tool("--n-embd 64", out, sizeof out), 2, "no -o");
    cr_expect_eq(run_tool("--mix q4_k_m --type q8_0 -o x.gguf", out, sizeof out), 2);
    cr_expect_eq(run_tool("--rope-scale 4 -o x.gguf", out, sizeof out), 2, "needs --rope-scaling");
    cr_expect_eq(run_tool("--threads 999 -o x.gguf", out, sizeof out), 2);
    cr_expect_eq(run_tool("--tied=1 -o x.gguf", out, sizeof out), 2);
    cr_expect_eq(run_tool("-o", out, sizeof out), 2, "missing value");
    static const struct {
        const char *args, *named; // a shape mkmodel refuses, and the flag it names
    } bad_shapes[] = {
        {"--n-head 7", "--n-head"}, {"--n-head-kv 3", "--n-head-kv"}, {"--n-rot 9", "--n-rot"}};
    for (size_t i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; i++) {
        snprintf(args, sizeof args, "%s -o %s", bad_shapes[i].args, tmp_path("t.gguf"));
        cr_expect_eq(run_tool(args, out, sizeof out), 2, "%s", args);
        cr_expect(strstr(out, bad_shapes[i].named) != NULL, "%s", out);
    }
    cr_expect_neq(access(tmp_path("t.gguf"), F_OK), 0, "no file after errors");

    // Flags after (and before) the preset override it; --name=VALUE works.
    snprintf(args, sizeof args,
             "--n-layer 2 --preset tiny --n-embd 128 --name=hello --type q8_0 --arch qwen2 "
             "--tied -q -o %s",
             tmp_path("ok.gguf"));
    cr_expect_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    struct gguf_file *f = NULL;
    struct verr err = {0};
    cr_assert_eq(gguf_open(&f, tmp_path("ok.gguf"), &err), 0, "%s", err.msg);
    expect_str(f, "general.name", "hello");
    expect_str(f, "general.architecture", "qwen2");
    cr_expect_eq(get_u32(f, "qwen2.block_count"), 2);
    cr_expect_eq(get_u32(f, "qwen2.embedding_length"), 128);
    cr_expect_eq(get_u32(f, "general.file_type"), 7);
    expect_tensor(f, "blk.0.attn_q.bias", 128, 0, GGML_TYPE_F32);
    cr_expect_null(gguf_find_tensor(f, "output.weight"));
    gguf_close(f);

    // The summary names the weight path; the flags force it either way and
    // take no value.
    snprintf(args, sizeof args, "--fast-weights --type q4_k -o %s", tmp_path("fast.gguf"));
    cr_expect_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "fast weights") != NULL, "%s", out);
    snprintf(args, sizeof args, "--fast-weights --exact-weights --type q4_0 -o %s",
             tmp_path("exact.gguf"));
    cr_expect_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "exact weights") != NULL, "%s", out);
    cr_expect_eq(run_tool("--fast-weights=1 -o x.gguf", out, sizeof out), 2);
}
