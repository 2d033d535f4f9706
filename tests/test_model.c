// Model loading: hparams and their defaults, and the refusals (unknown
// architecture, missing or mis-shaped tensor, missing key) with the
// messages users see.
#include <criterion/criterion.h>
#include <string.h>

#include "host/ops/backend.h"
#include "host/model/model.h"
#include "tiny_model.h"

// Writes cfg, tries to load it, returns the status; err gets the message.
static int try_load(const struct tiny_cfg *cfg, struct model_hparams *hp, struct verr *err) {
    char path[128];
    tiny_temp_path(path, sizeof path, "model");
    struct tiny_weights w;
    struct verr werr = {0};
    cr_assert_eq(tiny_write(cfg, path, &w, &werr), 0, "tiny_write: %s", werr.msg);
    struct backend *be;
    cr_assert_eq(backend_cpu_create(&be, 1, &werr), 0, "%s", werr.msg);
    struct model *m = NULL;
    int rc = model_load_file(&m, path, be, err);
    if (rc == 0) {
        if (hp)
            *hp = m->hp;
        cr_expect_gt(m->n_bytes, 0);
    } else {
        cr_expect_null(m);
    }
    model_free(m);
    backend_destroy(be);
    tiny_weights_free(&w);
    unlink(path);
    return rc;
}

Test(model, hparams_llama_defaults) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    struct model_hparams hp;
    struct verr err = {0};
    cr_assert_eq(try_load(&c, &hp, &err), 0, "%s", err.msg);
    cr_expect_eq(hp.arch, MODEL_ARCH_LLAMA);
    cr_expect_eq(hp.rope_mode, ROPE_MODE_NORMAL);
    cr_expect_eq(hp.n_embd, 64);
    cr_expect_eq(hp.n_layer, 2);
    cr_expect_eq(hp.n_head, 4);
    cr_expect_eq(hp.n_head_kv, 2);
    cr_expect_eq(hp.head_dim, 16, "default key_length = n_embd / n_head");
    cr_expect_eq(hp.head_dim_v, 16);
    cr_expect_eq(hp.n_rot, 16);
    cr_expect_eq(hp.n_vocab, 64, "from token_embd's shape");
    cr_expect_eq(hp.n_ctx_train, 128);
    cr_expect_eq(hp.n_ctx_orig_yarn, 128, "defaults to the context length");
    cr_expect_eq(hp.rope_scaling, ROPE_SCALING_LINEAR, "llama.cpp's default type");
    cr_expect_float_eq(hp.rope_freq_scale, 1.0f, 0, "no factor: no scaling");
    cr_expect_float_eq(hp.rope_attn_factor, 1.0f, 0);
    cr_expect_not(hp.has_bias_qkv);
}

Test(model, hparams_qwen2_yarn) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.scaling_type = "yarn";
    c.scaling_factor = 4;
    c.orig_ctx = 32;
    c.md_attn_factor = 1.5f;
    c.freq_base = 1e6f;
    struct model_hparams hp;
    struct verr err = {0};
    cr_assert_eq(try_load(&c, &hp, &err), 0, "%s", err.msg);
    cr_expect_eq(hp.arch, MODEL_ARCH_QWEN2);
    cr_expect_eq(hp.rope_mode, ROPE_MODE_NEOX);
    cr_expect(hp.has_bias_qkv);
    cr_expect_eq(hp.rope_scaling, ROPE_SCALING_YARN);
    cr_expect_float_eq(hp.rope_freq_scale, 0.25f, 1e-7);
    cr_expect_eq(hp.n_ctx_orig_yarn, 32);
    cr_expect_float_eq(hp.rope_attn_factor, 1.5f, 0);
    cr_expect_float_eq(hp.rope_freq_base, 1e6f, 0);
}

Test(model, unknown_architecture) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "gpt2");
    struct verr err = {0};
    cr_expect_eq(try_load(&c, NULL, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "unknown model architecture: 'gpt2'") != NULL, "%s", err.msg);
}

Test(model, missing_tensor) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.skip_tensor = "blk.1.ffn_down.weight";
    struct verr err = {0};
    cr_expect_eq(try_load(&c, NULL, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "missing tensor 'blk.1.ffn_down.weight' (expected shape [96, 64])"),
              "%s", err.msg);
}

Test(model, missing_qwen2_bias) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.skip_tensor = "blk.0.attn_k.bias";
    struct verr err = {0};
    cr_expect_eq(try_load(&c, NULL, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "missing tensor 'blk.0.attn_k.bias' (expected shape [32])"), "%s",
              err.msg);
}

Test(model, wrong_shape) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.bad_tensor = "blk.1.attn_k.weight";
    c.bad_ne1 = 64; // n_head*head_dim instead of n_head_kv*head_dim = 32
    struct verr err = {0};
    cr_expect_eq(try_load(&c, NULL, &err), VERR_FORMAT);
    cr_expect_str_eq(err.msg, "blk.1.attn_k.weight: expected shape [64, 32], found [64, 64]");
}

Test(model, wrong_shape_vector) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.bad_tensor = "output_norm.weight";
    c.bad_ne1 = 65;
    struct verr err = {0};
    cr_expect_eq(try_load(&c, NULL, &err), VERR_FORMAT);
    cr_expect_str_eq(err.msg, "output_norm.weight: expected shape [64], found [65]");
}

Test(model, missing_required_key) {
    // A file with an architecture but nothing else.
    char path[128];
    tiny_temp_path(path, sizeof path, "nokey");
    struct gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", 128);
    struct verr err = {0};
    cr_assert_eq(gguf_writer_save(w, path, &err), 0, "%s", err.msg);
    gguf_writer_free(w);
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    struct model_hparams hp;
    cr_expect_eq(model_read_hparams(f, &hp, &err), VERR_NOTFOUND);
    cr_expect(strstr(err.msg, "missing key 'llama.embedding_length'"), "%s", err.msg);
    gguf_close(f);
    unlink(path);
}

Test(model, bad_head_count_kv) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.n_head_kv = 3;
    char path[128];
    tiny_temp_path(path, sizeof path, "hkv");
    struct tiny_weights w;
    struct verr err = {0};
    // 3 kv heads of 16: the tensors are written with that shape, the hparams
    // check refuses before looking at them.
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    struct gguf_file *f;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    struct model_hparams hp;
    cr_expect_eq(model_read_hparams(f, &hp, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "head_count_kv = 3 must divide head_count = 4"), "%s", err.msg);
    gguf_close(f);
    tiny_weights_free(&w);
    unlink(path);
}
