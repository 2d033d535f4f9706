// The forward pass on the CPU backend against a naive float64 transformer
// (tests/tiny_model.h) on tiny llama / qwen2 models written by the test:
// GQA, partial rotation, YaRN + rope_freqs, tied output, quantized weights,
// batch split invariance and several sequences in one batch.
//
// Tolerances, relative to the largest |logit| of the reference (logits here
// are a few units):
// - F32 KV cache: 1e-5. Everything is float32 with float32 accumulation over
//   at most a few hundred terms; the worst seen is ~4e-7. The margin covers
//   libm cos/sin/exp differences against the float64 reference and other
//   summation orders in a future CPU backend.
// - F16 KV cache: 3e-3. K and V are rounded to 11 significant bits
//   (4.9e-4 relative) before attention and everything after inherits that;
//   the worst seen is ~5e-4.
// A wrong RoPE (NeoX vs normal, YaRN off) gives errors of ~0.4, so both
// tolerances still catch real mistakes.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "tests/context_helpers.h"
#include "tiny_model.h"

#define TOL_F32 1e-5
#define TOL_F16 3e-3

struct fixture {
    struct tiny_cfg cfg;
    struct tiny_weights w;
    char path[128];
    struct backend *be;
    struct model *m;
};

static void fixture_open(struct fixture *fx, const struct tiny_cfg *cfg) {
    memset(fx, 0, sizeof *fx);
    fx->cfg = *cfg;
    struct verr err = {0};
    tiny_temp_path(fx->path, sizeof fx->path, "fwd");
    cr_assert_eq(tiny_write(cfg, fx->path, &fx->w, &err), 0, "tiny_write: %s", err.msg);
    cr_assert_eq(backend_cpu_create(&fx->be, 2, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&fx->m, fx->path, fx->be, &err), 0, "model_load: %s", err.msg);
}

static void fixture_close(struct fixture *fx) {
    model_free(fx->m);
    backend_destroy(fx->be);
    tiny_weights_free(&fx->w);
    unlink(fx->path);
}

// The reference's rope, resolved from the tiny config as llama.cpp resolves
// a model's metadata with no command-line overrides.
static struct tiny_rope ref_rope(const struct fixture *fx) {
    const struct tiny_cfg *c = &fx->cfg;
    struct tiny_rope r = {0};
    r.neox = !strcmp(c->arch, "qwen2");
    r.n_rot = c->n_rot;
    r.n_ctx_orig = c->orig_ctx ? c->orig_ctx : c->n_ctx_train;
    r.freq_base = c->freq_base;
    bool none = c->scaling_type && !strcmp(c->scaling_type, "none");
    bool yarn = c->scaling_type && !strcmp(c->scaling_type, "yarn");
    r.freq_scale = (c->scaling_factor != 0 && !none) ? 1.0 / c->scaling_factor : 1.0;
    r.ext_factor = yarn ? 1.0 : 0.0;
    r.attn_factor = c->md_attn_factor != 0 ? c->md_attn_factor : 1.0;
    r.beta_fast = 32;
    r.beta_slow = 1;
    r.freq_factors = fx->w.rope_freqs;
    return r;
}

// Runs tokens (positions p0..p0+n-1, seq 0) through a fresh context in chunks
// of n_batch, all logits wanted; fills out [n][n_vocab].
static void run_forward(struct fixture *fx, const int32_t *tokens, int n, int p0, int n_batch,
                        enum ggml_type kv_type, const struct rope_overrides *ro, float *out) {
    struct forward_config fc_cfg;
    forward_config_default(&fc_cfg);
    fc_cfg.n_ctx = 256;
    fc_cfg.n_batch = n_batch;
    fc_cfg.type_k = fc_cfg.type_v = kv_type;
    if (ro)
        fc_cfg.rope = *ro;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, fx->m, &fc_cfg, &err), 0, "context: %s", err.msg);
    const int V = fx->m->hp.n_vocab;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    int8_t *want = malloc((size_t)n);
    for (int t = 0; t < n; t++) {
        pos[t] = p0 + t;
        want[t] = 1;
    }
    for (int i = 0; i < n; i += n_batch) {
        int nb = n - i < n_batch ? n - i : n_batch;
        struct forward_batch b = {nb, tokens + i, pos + i, seq + i, want + i, NULL};
        struct context_result res;
        cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "context_decode_logits: %s",
                     err.msg);
        cr_assert_eq(res.n_rows, nb);
        for (int r = 0; r < nb; r++)
            memcpy(out + (size_t)(i + r) * V, context_row_logits(&res, r),
                   sizeof(float) * (size_t)V);
    }
    free(pos);
    free(seq);
    free(want);
    context_free(c);
}

// fixture_open of the default tiny llama and a context on it of n_ctx cells
// and n_batch tokens a decode (0: forward_config_default's, capped at n_ctx).
static struct context *open_llama_ctx(struct fixture *fx, int n_ctx, int n_batch) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    fixture_open(fx, &c);
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = n_ctx;
    if (n_batch)
        cfg.n_batch = n_batch;
    struct verr err = {0};
    struct context *ctx;
    cr_assert_eq(test_ctx_wrap(&ctx, fx->m, &cfg, &err), 0, "%s", err.msg);
    return ctx;
}

// Worst |got - ref| / max(1, max |ref|) over all logits.
static double compare(const float *got, const double *ref, size_t n, double *worst_abs) {
    double scale = 1, w = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        w = fmax(w, fabs((double)got[i] - ref[i]));
    if (worst_abs)
        *worst_abs = w;
    return w / scale;
}

static void check_against_reference(const struct tiny_cfg *cfg, int n, int p0, int n_batch,
                                    const char *label) {
    struct fixture fx;
    fixture_open(&fx, cfg);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) {
        tok[t] = (t * 7 + 3) % cfg->n_vocab;
        pos[t] = p0 + t;
    }
    const size_t nl = (size_t)n * cfg->n_vocab;
    double *ref = malloc(sizeof(double) * nl);
    float *got = malloc(sizeof(float) * nl);
    struct tiny_rope r = ref_rope(&fx);
    tiny_reference(cfg, &fx.w, &r, tok, pos, n, ref);

    static const struct {
        enum ggml_type kv;
        double tol;
    } caches[2] = {{GGML_TYPE_F32, TOL_F32}, {GGML_TYPE_F16, TOL_F16}};
    double e[2];
    for (int k = 0; k < 2; k++) {
        const char *kv = ggml_type_name(caches[k].kv);
        double wa;
        run_forward(&fx, tok, n, p0, n_batch, caches[k].kv, NULL, got);
        e[k] = compare(got, ref, nl, &wa);
        cr_log_info("%s: %s KV: worst relative logit error %.3g (abs %.3g)", label, kv, e[k], wa);
        cr_expect_lt(e[k], caches[k].tol, "%s: %s KV cache: worst relative error %g", label, kv,
                     e[k]);
    }
    printf("%-28s worst relative logit error: f32 KV %.3g, f16 KV %.3g\n", label, e[0], e[1]);

    free(tok);
    free(pos);
    free(ref);
    free(got);
    fixture_close(&fx);
}

Test(forward, llama_gqa) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    check_against_reference(&c, 12, 0, 512, "llama gqa");
}

Test(forward, llama_mha_tied_f16_norms) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.n_head_kv = 4;
    c.tied = true;
    c.f16_norms = true;
    check_against_reference(&c, 9, 0, 512, "llama mha tied");
}

Test(forward, qwen2_biases_neox) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    check_against_reference(&c, 12, 0, 512, "qwen2 gqa bias");
}

Test(forward, partial_rotation) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.n_rot = 8; // half of head_dim 16 rotates
    check_against_reference(&c, 10, 0, 4, "llama n_rot 8");
    tiny_cfg_default(&c, "qwen2");
    c.n_rot = 8;
    check_against_reference(&c, 10, 0, 4, "qwen2 n_rot 8");
}

Test(forward, head_dim_not_embd_over_heads) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.head_dim = 8; // key_length / value_length in the metadata
    c.n_rot = 8;
    check_against_reference(&c, 8, 0, 512, "qwen2 head_dim 8");
}

Test(forward, yarn_and_rope_freqs) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.scaling_type = "yarn";
    c.scaling_factor = 4;
    c.orig_ctx = 32;
    c.md_attn_factor = 1.1f;
    c.rope_freqs = true;
    // positions 40..55: past the original context, where YaRN matters
    check_against_reference(&c, 16, 40, 5, "llama yarn+freqs");
    tiny_cfg_default(&c, "qwen2");
    c.scaling_type = "yarn";
    c.scaling_factor = 2;
    c.orig_ctx = 16;
    c.n_rot = 12;
    check_against_reference(&c, 16, 20, 512, "qwen2 yarn n_rot 12");
}

Test(forward, linear_scaling) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.scaling_type = "linear";
    c.scaling_factor = 2;
    c.freq_base = 500000;
    check_against_reference(&c, 8, 3, 512, "llama linear x2");
}

Test(forward, quantized_weights) {
    // n_embd 64 and n_ff 96 are multiples of 32: the 32-blocks fit.
    static const enum ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                           GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                           GGML_TYPE_Q5_1};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_default(&c, "llama");
        c.wtype = types[i];
        char label[64];
        snprintf(label, sizeof label, "llama %s", ggml_type_name(types[i]));
        check_against_reference(&c, 6, 0, 512, label);
    }
}

Test(forward, k_quants) {
    // K-quants need rows of 256: n_embd 256, n_ff 256.
    static const enum ggml_type types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_kquant(&c, types[i]);
        char label[64];
        snprintf(label, sizeof label, "qwen2 %s", ggml_type_name(types[i]));
        check_against_reference(&c, 5, 0, 512, label);
    }
}

Test(forward, batch_split_invariance) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    struct fixture fx;
    fixture_open(&fx, &c);
    const int n = 11, V = c.n_vocab;
    int32_t tok[11];
    for (int t = 0; t < n; t++)
        tok[t] = (t * 5 + 1) % V;
    float *a = malloc(sizeof(float) * n * V), *b = malloc(sizeof(float) * n * V);
    for (int kv = 0; kv < 2; kv++) {
        enum ggml_type kt = kv ? GGML_TYPE_F16 : GGML_TYPE_F32;
        run_forward(&fx, tok, n, 0, 512, kt, NULL, a);
        run_forward(&fx, tok, n, 0, 3, kt, NULL, b);
        double worst = 0;
        for (int i = 0; i < n * V; i++)
            worst = fmax(worst, fabs((double)a[i] - b[i]));
        // Every row is computed by the same code whatever the batch holds, so
        // the CPU reference gives identical logits.
        cr_expect_eq(worst, 0.0, "%s KV: 1 batch vs chunks of 3 differ by %g", ggml_type_name(kt),
                     worst);
    }
    free(a);
    free(b);
    fixture_close(&fx);
}

Test(forward, two_sequences_one_batch) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    struct fixture fx;
    fixture_open(&fx, &c);
    const int V = c.n_vocab, na = 7, nb = 5;
    int32_t ta[7] = {3, 9, 27, 17, 51, 25, 11}, tb[5] = {60, 2, 2, 33, 8};
    float *alone_a = malloc(sizeof(float) * na * V), *alone_b = malloc(sizeof(float) * nb * V);
    run_forward(&fx, ta, na, 0, 512, GGML_TYPE_F32, NULL, alone_a);
    run_forward(&fx, tb, nb, 0, 512, GGML_TYPE_F32, NULL, alone_b);

    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = 16;
    cfg.n_seq_max = 2;
    cfg.type_k = cfg.type_v = GGML_TYPE_F32;
    struct context *ctx;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&ctx, fx.m, &cfg, &err), 0, "%s", err.msg);
    // interleaved: a0 b0 a1 b1 ... then the rest of a
    int32_t tok[12], pos[12], seq[12];
    int8_t want[12];
    int n = 0, ia = 0, ib = 0;
    while (ia < na || ib < nb) {
        if (ia < na) {
            tok[n] = ta[ia];
            pos[n] = ia++;
            seq[n] = 0;
            want[n++] = 1;
        }
        if (ib < nb) {
            tok[n] = tb[ib];
            pos[n] = ib++;
            seq[n] = 1;
            want[n++] = 1;
        }
    }
    // Two decodes (8 + 4 tokens) so that the second one also attends to
    // cells of both sequences written earlier.
    double worst = 0;
    for (int start = 0; start < n; start += 8) {
        int cnt = n - start < 8 ? n - start : 8;
        struct forward_batch b = {cnt, tok + start, pos + start, seq + start, want + start, NULL};
        struct context_result res;
        cr_assert_eq(context_decode_logits(ctx, &b, &res, &err), 0, "%s", err.msg);
        cr_assert_eq(res.n_rows, cnt);
        for (int r = 0; r < cnt; r++) {
            int i = start + r;
            const float *alone =
                seq[i] == 0 ? alone_a + (size_t)pos[i] * V : alone_b + (size_t)pos[i] * V;
            const float *got = context_row_logits(&res, r);
            for (int v = 0; v < V; v++)
                worst = fmax(worst, fabs((double)got[v] - alone[v]));
        }
    }
    // Same rows, same cells visible: only the summation order over masked
    // cells could differ, and masked cells contribute exact zeros.
    cr_expect_lt(worst, 1e-6, "two sequences in one batch vs each alone: worst %g", worst);
    printf("two sequences in one batch vs alone: worst abs logit difference %.3g\n", worst);
    context_free(ctx);
    free(alone_a);
    free(alone_b);
    fixture_close(&fx);
}

Test(forward, argmax_matches_logits) {
    struct fixture fx;
    struct verr err = {0};
    struct context *c = open_llama_ctx(&fx, 32, 8);
    int32_t tok[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 2, 3}, seq[4] = {0};
    struct forward_batch b = {4, tok, pos, seq, NULL, NULL};
    struct context_result res;
    cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.n_rows, 1, "NULL logits flags: the last row only");
    cr_assert_eq(res.batch_idx[0], 3);
    const float *l = context_row_logits(&res, 0);
    int best = 0;
    for (int v = 1; v < fx.cfg.n_vocab; v++)
        if (l[v] > l[best])
            best = v;
    // Same tokens again in a fresh cache: argmax on the backend.
    cr_assert_eq(context_clear(c, &err), 0, "%s", err.msg);
    const uint8_t how[1] = {FORWARD_ROW_ARGMAX};
    const struct context_plan plan = {.batch = b, .how = how};
    cr_assert_eq(context_decode(c, &plan, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.n_rows, 1);
    cr_expect_eq(res.ids[0], best);
    context_free(c);
    fixture_close(&fx);
}

Test(forward, bad_batches) {
    struct fixture fx;
    struct verr err = {0};
    struct context *c = open_llama_ctx(&fx, 8, 4);
    int32_t tok[5] = {1, 64, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, seq[5] = {0};
    struct forward_batch b = {2, tok, pos, seq, NULL, NULL};
    cr_expect_eq(context_decode_logits(c, &b, NULL, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "token id 64") != NULL, "%s", err.msg);
    b.n_tok = 5;
    tok[1] = 2;
    cr_expect_eq(context_decode_logits(c, &b, NULL, &err), VERR_RANGE, "batch above n_batch");
    // fill the 8 cells, then one more is VERR_FULL and leaves the cache as it was
    b.n_tok = 4;
    cr_assert_eq(context_decode_logits(c, &b, NULL, &err), 0, "%s", err.msg);
    int32_t pos2[4] = {4, 5, 6, 7};
    b.pos = pos2;
    cr_assert_eq(context_decode_logits(c, &b, NULL, &err), 0, "%s", err.msg);
    int32_t pos3[1] = {8};
    struct forward_batch one = {1, tok, pos3, seq, NULL, NULL};
    cr_expect_eq(context_decode_logits(c, &one, NULL, &err), VERR_FULL, "%s", err.msg);
    cr_expect_eq(context_seq_pos_max(c, 0), 7);
    cr_expect_eq(context_cells_used(c), 8);
    context_free(c);
    fixture_close(&fx);
}

// The CPU backend has no graph ops: every step runs op by op, as before
// graphs existed, and no graph is ever recorded.
Test(forward, cpu_has_no_graphs) {
    struct fixture fx;
    struct verr err = {0};
    struct context *c = open_llama_ctx(&fx, 32, 0);
    cr_assert_null(fx.m->be->ops->graph_begin);
    cr_assert_eq(context_pipeline(c)->n_stages, 1);
    cr_expect(!context_stage(c, 0)->graphs_on);
    int32_t tok = 5, pos = 0, seq = 0;
    struct forward_batch b = {1, &tok, &pos, &seq, NULL, NULL};
    struct context_result res;
    cr_assert_eq(test_ctx_decode_all(c, &b, FORWARD_ROW_ARGMAX, NULL, &res, &err), 0, "%s",
                 err.msg);
    const struct forward_graph_stats st = context_graph_stats(c);
    cr_expect_eq(st.recorded, 0);
    cr_expect_eq(st.replays, 0);
    context_free(c);
    fixture_close(&fx);
}
