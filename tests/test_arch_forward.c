// qwen3 and gemma3 on the CPU reference, beyond llama.cpp's agreement
// (tests/test_llamacpp_agree.c): the sliding window acts exactly where it
// should, a window no query reaches past changes nothing (bit for bit), and
// what gemma3 cannot do is refused with a message while qwen3 keeps it.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "tests/arch_models.h"
#include "tools/mkmodel/mkmodel.h"

#define AF_N_TOK 24

// qwen3 or gemma3 (window on layer 0), 96 wide, 4 heads of 32: the local
// layers' base equals the global one, so a window no query reaches past must
// change nothing at all.
static void af_config(struct mkmodel_config *c, enum model_arch arch, int window) {
    arch_test_config(c, arch, 96, 32, GGML_TYPE_F32, window, 1000000.0f);
}

struct af_model {
    char path[64];
    struct backend *be;
    struct model *m;
};

static void af_load(struct af_model *a, const struct mkmodel_config *c) {
    arch_test_write(c, a->path);
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&a->be, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&a->m, a->path, a->be, &err), 0, "%s", err.msg);
}

static void af_free(struct af_model *a) {
    model_free(a->m);
    backend_destroy(a->be);
    unlink(a->path);
}

// A context of cfg over a's backend and model (a pipeline of one stage that
// borrows them).
static struct context *af_context(struct af_model *a, const struct forward_config *cfg) {
    struct verr err = {0};
    struct pipeline *p;
    cr_assert_eq(pipeline_wrap(&p, a->be, a->m, false, &err), 0, "%s", err.msg);
    struct context *c;
    cr_assert_eq(context_create(&c, p, cfg, true, &err), 0, "%s", err.msg);
    return c;
}

static struct context *af_init(struct af_model *a) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = AF_N_TOK;
    cfg.type_k = cfg.type_v = GGML_TYPE_F32;
    return af_context(a, &cfg);
}

// n tokens at positions p0.. of sequence 0; every row's logits into out.
static int af_decode(struct context *c, int p0, int n, float *out, struct verr *err) {
    int32_t tok[AF_N_TOK], pos[AF_N_TOK], seq[AF_N_TOK] = {0};
    int8_t want[AF_N_TOK];
    const int n_vocab = context_model(c)->hp.n_vocab;
    for (int t = 0; t < n; t++) {
        tok[t] = (31 * (p0 + t) + 7) % n_vocab;
        pos[t] = p0 + t;
        want[t] = 1;
    }
    const struct forward_batch b = {n, tok, pos, seq, want, NULL};
    struct context_result res;
    int rc = context_decode_logits(c, &b, &res, err);
    cr_assert(rc || res.n_rows == n);
    const size_t V = (size_t)n_vocab;
    for (int r = 0; !rc && out && r < n; r++)
        memcpy(out + (size_t)r * V, context_row_logits(&res, r), V * sizeof(float));
    return rc;
}

static void af_logits(const struct mkmodel_config *c, float *out) {
    struct af_model a;
    af_load(&a, c);
    struct context *ctx = af_init(&a);
    struct verr err = {0};
    cr_assert_eq(af_decode(ctx, 0, AF_N_TOK, out, &err), 0, "%s", err.msg);
    context_free(ctx);
    af_free(&a);
}

// Rows 0..window-1 see the same cells with and without a window; later rows
// lose cells on the local layer. A window of AF_N_TOK hides nothing.
Test(arch_forward, gemma3_window_acts_where_it_should) {
    const int V = 596, W = 6;
    float *none = malloc(sizeof(float) * AF_N_TOK * V),
          *wide = malloc(sizeof(float) * AF_N_TOK * V);
    float *narrow = malloc(sizeof(float) * AF_N_TOK * V);
    struct mkmodel_config c;
    af_config(&c, MODEL_ARCH_GEMMA3, 0);
    af_logits(&c, none);
    af_config(&c, MODEL_ARCH_GEMMA3, AF_N_TOK);
    af_logits(&c, wide);
    af_config(&c, MODEL_ARCH_GEMMA3, W);
    af_logits(&c, narrow);
    cr_expect_eq(memcmp(none, wide, sizeof(float) * AF_N_TOK * V), 0,
                 "a window of %d over %d tokens changed the logits", AF_N_TOK, AF_N_TOK);
    for (int t = 0; t < AF_N_TOK; t++) {
        double d = 0, s = 0;
        for (int v = 0; v < V; v++) {
            d = fmax(d, fabs((double)narrow[t * V + v] - none[t * V + v]));
            s = fmax(s, fabs((double)none[t * V + v]));
        }
        if (t < W)
            cr_expect_eq(d, 0.0, "row %d sees every cell through window %d: differs by %g", t, W,
                         d);
        else // a whole cell's share of attention gone: O(0.1) of the logits
            cr_expect_gt(d / s, 1e-3, "row %d: window %d changed logits by only %g", t, W, d / s);
    }
    free(none);
    free(wide);
    free(narrow);
}

// Context shift (seq_rm + seq_add, a K shift): qwen3 runs it; gemma3 with
// local layers refuses, naming why, and leaves the context usable only
// after the caller clears it.
Test(arch_forward, context_shift_qwen3_runs_gemma3_refuses) {
    for (int arch = 0; arch < 2; arch++) {
        struct mkmodel_config c;
        af_config(&c, arch ? MODEL_ARCH_GEMMA3 : MODEL_ARCH_QWEN3, 8);
        struct af_model a;
        af_load(&a, &c);
        struct context *ctx = af_init(&a);
        struct verr err = {0};
        cr_assert_eq(af_decode(ctx, 0, 16, NULL, &err), 0, "%s", err.msg);
        // llama-cli's context shift (kv_context_shift) with n_keep 4 at n_past 16
        const int32_t n_discard = (16 - 4) / 2;
        cr_assert_eq(context_seq_rm(ctx, 0, 4, 4 + n_discard, &err), 0, "%s", err.msg);
        cr_assert_eq(context_seq_add(ctx, 0, 4 + n_discard, 16, -n_discard, &err), 0, "%s",
                     err.msg);
        const int rc = af_decode(ctx, 16 - n_discard, 1, NULL, &err);
        if (arch) {
            cr_expect_eq(rc, VERR_UNSUPPORTED, "gemma3 context shift: rc %d", rc);
            cr_expect(strstr(err.msg, "RoPE bases") != NULL, "message: %s", err.msg);
            cr_log_info("gemma3: %s", err.msg);
        } else {
            cr_expect_eq(rc, 0, "qwen3 context shift: %s", err.msg);
        }
        context_free(ctx);
        af_free(&a);
    }
}

Test(arch_forward, gemma3_self_extend_refused) {
    struct mkmodel_config c;
    af_config(&c, MODEL_ARCH_GEMMA3, 8);
    struct af_model a;
    af_load(&a, &c);
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.se_g = 2;
    cfg.se_w = 16;
    struct forward_ctx fc;
    struct verr err = {0};
    cr_expect_eq(forward_init(&fc, a.m, &cfg, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "self-extend") != NULL, "message: %s", err.msg);
    cr_log_info("gemma3: %s", err.msg);
    af_free(&a);
}

// Exact self-extend (the unrotated cache: attention rotates q and K with
// the layer's RoPE) runs on qwen3 past its window W, and on a gemma3 file
// without a sliding window.
Test(arch_forward, self_extend_runs_without_window) {
    for (int arch = 0; arch < 2; arch++) {
        struct mkmodel_config c;
        af_config(&c, arch ? MODEL_ARCH_GEMMA3 : MODEL_ARCH_QWEN3, 0);
        struct af_model a;
        af_load(&a, &c);
        struct forward_config cfg;
        forward_config_default(&cfg);
        cfg.n_ctx = 64;
        cfg.n_batch = AF_N_TOK;
        cfg.se_g = 2;
        cfg.se_w = 8;
        struct context *ctx = af_context(&a, &cfg);
        struct verr err = {0};
        float *l = malloc(sizeof(float) * AF_N_TOK * a.m->hp.n_vocab);
        cr_expect_eq(af_decode(ctx, 0, AF_N_TOK, l, &err), 0, "%s", err.msg);
        for (int i = 0; i < AF_N_TOK * a.m->hp.n_vocab; i++)
            if (!isfinite(l[i])) {
                cr_expect_fail("%s: logit %d is %g", model_arch_name(a.m->hp.arch), i, l[i]);
                break;
            }
        free(l);
        context_free(ctx);
        af_free(&a);
    }
}

// The hyperparameters as llama.cpp's gemma3 loader reads them.
Test(arch_forward, gemma3_hparams) {
    struct mkmodel_config c;
    af_config(&c, MODEL_ARCH_GEMMA3, 8);
    c.swa_pattern = 0; // not written: the defaults, 6 and 10000
    c.rope_freq_base_swa = 0;
    c.n_layer = 7;
    struct af_model a;
    af_load(&a, &c);
    const struct model_hparams *hp = &a.m->hp;
    cr_expect_eq(hp->sliding_window, 8);
    cr_expect_eq(hp->swa_pattern, 6);
    cr_expect_eq(hp->rope_freq_base_swa, 10000.0f);
    for (int il = 0; il < 7; il++)
        cr_expect_eq(model_layer_is_swa(hp, il), il != 5, "layer %d", il);
    af_free(&a);
}
