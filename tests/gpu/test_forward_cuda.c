// The whole forward pass on the CUDA backend against the CPU backend (and the
// float64 reference of tests/tiny_model.h) on tiny llama / qwen2 models:
// the same file is loaded on both backends and the same tokens run through
// both, as one prompt batch (GEMM path, > CUDA_MATVEC_MAX_TOK tokens) and
// token by token (mat-vec path). Skips itself without a CUDA device.
//
// Tolerances, relative to the largest |logit| of the CPU result:
// - F32 weights: 1e-4. Both sides accumulate in float32, in other orders
//   (warp reductions, cuBLAS tiles); ~1e-6 per dot product, through two
//   layers and an f32 or f16 KV cache that both backends round the same way.
// - F16 / BF16 / quantized weights: 2e-2 for the 20-token batch: batches
//   above CUDA_MATVEC_MAX_TOK round activations to f16 (bf16 for BF16
//   weights: 8 bits of mantissa, ~4e-3 relative per element) before the
//   GEMM. Batches of 1 and 3 tokens run the mat-vec kernels, which accumulate
//   in f32 like the CPU: 1e-4, as for F32 weights.
// - act_q8 (backend.h) set on both backends: both round a decode batch's
//   activations to q8_1 the same way and add the same integer-exact
//   sub-block terms, in other orders (each CUDA q8 mat-vec of these runs
//   equals quant_dot_q8_1 on its own inputs to ~7e-8 of sum|wx|); a float
//   difference upstream (the order of a sum; with an F16 cache, a K or V
//   element rounded to the other f16) can move an activation across a
//   rounding boundary: one q step, 1/127 of its block's max. Most runs stay
//   within 1e-4, but such a step moved one token's logits by up to 6.8e-3
//   (IQ4_XS with an F16 cache; Q2_K, Q3_K and Q4_K with other token
//   sequences, never more than one token of the 20). So a decode batch may
//   have one token beyond 1e-4, within the prompt batch's 2e-2.
// - With an F16 KV cache the 20-token prompt batch runs attention on tensor
//   cores (cuda/attention.cu, attn_tc_kernel), which rounds q * scale and
//   the softmax weights to f16: ~1e-3 of max|v| per attention output (the
//   tolerance of tests/gpu/test_cuda_ops.c), which two layers carry to the
//   logits as ~3e-4 (observed under emulation); that batch gets 1e-3.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/backend/sampler.h"
#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "tests/context_helpers.h"
#include "tests/tiny_model.h"

static void run_tokens(struct model *m, int n_batch, enum ggml_type tk, enum ggml_type tv,
                       const int32_t *tok, int n, bool argmax, float *out, int32_t *amax) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = n_batch;
    cfg.type_k = tk;
    cfg.type_v = tv;
    struct context *c;
    struct verr err = {0};
    cr_assert_eq(test_ctx_wrap(&c, m, &cfg, &err), 0, "%s: %s", m->be->ops->name, err.msg);
    const int V = m->hp.n_vocab;
    int32_t pos[64], seq[64] = {0};
    int8_t want[64];
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        want[t] = 1;
    }
    for (int i = 0; i < n; i += n_batch) {
        int nb = n - i < n_batch ? n - i : n_batch;
        struct forward_batch b = {nb, tok + i, pos + i, seq + i, want + i, NULL};
        struct context_result res;
        int rc = test_ctx_decode_all(c, &b, argmax ? FORWARD_ROW_ARGMAX : FORWARD_ROW_LOGITS, NULL,
                                     &res, &err);
        cr_assert_eq(rc, 0, "%s: %s", m->be->ops->name, err.msg);
        cr_assert_eq(res.n_rows, nb);
        for (int r = 0; r < nb; r++) {
            if (argmax)
                amax[i + r] = res.ids[r];
            else
                memcpy(out + (size_t)(i + r) * V, context_row_logits(&res, r), sizeof(float) * V);
        }
    }
    context_free(c);
}

// The tiny model of cfg written to a file and loaded on both backends.
struct fwd_pair {
    char path[128];
    struct tiny_weights w;
    struct backend *cpu, *gpu;
    struct model *mc, *mg;
};

static void fwd_pair_open(struct fwd_pair *p, const struct tiny_cfg *cfg, bool act_q8) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    tiny_temp_path(p->path, sizeof p->path, "fwdcuda");
    struct verr err = {0};
    cr_assert_eq(tiny_write(cfg, p->path, &p->w, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cpu_create(&p->cpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&p->gpu, 0, &err), 0, "%s", err.msg);
    p->cpu->act_q8 = p->gpu->act_q8 = act_q8;
    cr_assert_eq(model_load_file(&p->mc, p->path, p->cpu, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load_file(&p->mg, p->path, p->gpu, &err), 0, "%s", err.msg);
}

static void fwd_pair_close(struct fwd_pair *p) {
    model_free(p->mc);
    model_free(p->mg);
    backend_destroy(p->cpu);
    backend_destroy(p->gpu);
    tiny_weights_free(&p->w);
    unlink(p->path);
}

// tol: the 20-token batch (GEMM path); tol_dec: batches of 1 and 3 tokens
// (mat-vec path); act_q8 on both backends or neither.
static void compare_backends(const struct tiny_cfg *cfg, double tol, double tol_dec, bool act_q8,
                             const char *label) {
    struct fwd_pair fp;
    fwd_pair_open(&fp, cfg, act_q8);
    struct backend *cpu = fp.cpu;
    struct model *mc = fp.mc, *mg = fp.mg;

    const int n = 20, V = cfg->n_vocab;
    int32_t tok[20];
    for (int t = 0; t < n; t++)
        tok[t] = (t * 11 + 2) % V;
    float *lc = malloc(sizeof(float) * n * V), *lg = malloc(sizeof(float) * n * V);
    int32_t ac[20], ag[20];
    static const int batches[] = {512, 1, 3};
    for (int kv = 0; kv < 2; kv++) {
        enum ggml_type kt = kv ? GGML_TYPE_F16 : GGML_TYPE_F32;
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            // CUDA's act_q8 covers decode batches only (its GEMM takes f32
            // activations); the CPU's SIMD kernels take every batch, so the
            // CPU reference of a larger batch runs with f32 activations.
            cpu->act_q8 = act_q8 && batches[bi] <= BACKEND_ACT_Q8_MAX_TOK;
            run_tokens(mc, batches[bi], kt, kt, tok, n, false, lc, NULL);
            cpu->act_q8 = act_q8;
            run_tokens(mg, batches[bi], kt, kt, tok, n, false, lg, NULL);
            double scale = 1, worst = 0;
            for (int i = 0; i < n * V; i++)
                scale = fmax(scale, fabs(lc[i]));
            const double tol_b = batches[bi] < n       ? tol_dec
                                 : kt == GGML_TYPE_F16 ? fmax(tol, 1e-3) // tensor cores
                                                       : tol;
            int n_over = 0, t_over = -1; // tokens beyond tol_b, the first of them
            for (int t = 0; t < n; t++) {
                double wt = 0;
                for (int v = 0; v < V; v++)
                    wt = fmax(wt, fabs((double)lg[t * V + v] - lc[t * V + v]));
                worst = fmax(worst, wt);
                if (!(wt / scale < tol_b) && n_over++ == 0)
                    t_over = t;
            }
            cr_log_info("%s%s: %s KV, batch %d: cuda vs cpu worst relative logit error %.3g (%d "
                        "tokens beyond %.0e)",
                        label, act_q8 ? " act_q8" : "", ggml_type_name(kt), batches[bi],
                        worst / scale, n_over, tol_b);
            if (act_q8 && batches[bi] < n) { // one q8_1 rounding step (see the top)
                cr_expect_leq(n_over, 1, "%s: %s KV, batch %d: %d tokens beyond %g", label,
                              ggml_type_name(kt), batches[bi], n_over, tol_b);
                cr_expect_lt(worst / scale, tol,
                             "%s: %s KV, batch %d: token %d's relative error %g", label,
                             ggml_type_name(kt), batches[bi], t_over, worst / scale);
            } else {
                cr_expect_lt(worst / scale, tol_b, "%s: %s KV, batch %d: worst relative error %g",
                             label, ggml_type_name(kt), batches[bi], worst / scale);
            }
        }
        // argmax on the device agrees with the CPU wherever the top two
        // logits are not within the tolerance of each other
        run_tokens(mc, 4, kt, kt, tok, n, true, NULL, ac);
        run_tokens(mg, 4, kt, kt, tok, n, true, NULL, ag);
        run_tokens(mc, 4, kt, kt, tok, n, false, lc, NULL);
        for (int t = 0; t < n; t++) {
            const float *row = lc + (size_t)t * V;
            float gap = INFINITY;
            for (int v = 0; v < V; v++)
                if (v != ac[t])
                    gap = fminf(gap, row[ac[t]] - row[v]);
            if (gap > 1e-3f)
                cr_expect_eq(ag[t], ac[t], "%s: argmax of row %d", label, t);
        }
    }
    free(lc);
    free(lg);
    fwd_pair_close(&fp);
}

Test(forward_cuda, llama_gqa_f32) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    compare_backends(&c, 1e-4, 1e-4, false, "llama f32");
}

Test(forward_cuda, qwen2_bias_partial_rot) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.n_rot = 8;
    compare_backends(&c, 1e-4, 1e-4, false, "qwen2 n_rot 8");
}

Test(forward_cuda, yarn_rope_freqs) {
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    c.scaling_type = "yarn";
    c.scaling_factor = 4;
    c.orig_ctx = 8;
    c.rope_freqs = true;
    compare_backends(&c, 1e-4, 1e-4, false, "llama yarn");
}

Test(forward_cuda, weight_types) {
    static const enum ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_BF16,  GGML_TYPE_Q8_0,
                                           GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,  GGML_TYPE_Q5_0,
                                           GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_default(&c, "llama");
        c.wtype = types[i];
        compare_backends(&c, 2e-2, 1e-4, false, ggml_type_name(types[i]));
    }
}

Test(forward_cuda, k_quants) {
    static const enum ggml_type types[] = {GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        tiny_cfg_kquant(&c, types[i]);
        compare_backends(&c, 2e-2, 1e-4, false, ggml_type_name(types[i]));
    }
}

// The 8-bit activation path (the CUDA default) against the CPU doing the same.
Test(forward_cuda, act_q8) {
    static const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q5_1,
                                           GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        struct tiny_cfg c;
        if (ggml_type_get(types[i])->block_size == 256)
            tiny_cfg_kquant(&c, types[i]);
        else {
            tiny_cfg_default(&c, "llama");
            c.wtype = types[i];
        }
        compare_backends(&c, 2e-2, 1e-4, true, ggml_type_name(types[i]));
    }
}

// --- loading through the pinned ring, sampling in the head -------------------

// Appends the byte range of the backend copy of one tensor: [off, off + n)
// of the model's one weight allocation.
struct ranges {
    size_t off[256], n[256];
    int count;
};

static void add_range(struct ranges *r, const struct model *m, const void *p, size_t n) {
    if (!p)
        return;
    cr_assert_lt(r->count, 256);
    r->off[r->count] = (size_t)((const uint8_t *)p - (const uint8_t *)m->allocs[0]);
    r->n[r->count++] = n;
}

static size_t wbytes(const struct backend_weight *w) {
    return ggml_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
}

static void model_ranges(const struct model *m, struct ranges *r) {
    const struct model_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd * 4;
    r->count = 0;
    add_range(r, m, m->tok_embd.data, wbytes(&m->tok_embd));
    if (!m->output_tied)
        add_range(r, m, m->output.data, wbytes(&m->output));
    add_range(r, m, m->output_norm, E);
    add_range(r, m, m->rope_freqs, (size_t)hp->n_rot / 2 * 4);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        add_range(r, m, L->attn_norm, E);
        add_range(r, m, L->ffn_norm, E);
        add_range(r, m, L->bq, (size_t)hp->n_head * hp->head_dim * 4);
        add_range(r, m, L->bk, (size_t)hp->n_head_kv * hp->head_dim * 4);
        add_range(r, m, L->bv, (size_t)hp->n_head_kv * hp->head_dim_v * 4);
        const struct backend_weight *ws[] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                             &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            add_range(r, m, ws[i]->data, wbytes(ws[i]));
    }
}

static uint64_t last_done, last_total;
static int n_progress;
static void on_progress(void *user, uint64_t done, uint64_t total) {
    cr_assert_geq(done, last_done, "progress went back");
    last_done = done;
    last_total = total;
    n_progress++;
}

// The weights on the GPU (pinned staging, async copies, several chunks per
// buffer) are byte for byte the CPU backend's (which test_model_load checks
// against the file), at the same offsets.
Test(forward_cuda, pinned_load_matches_cpu) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.wtype = GGML_TYPE_Q4_0;
    c.f16_norms = true;
    c.rope_freqs = true;
    char path[128];
    tiny_temp_path(path, sizeof path, "fwdcudaload");
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    struct gguf_file *f = NULL;
    cr_assert_eq(gguf_open(&f, path, &err), 0, "%s", err.msg);
    struct backend *cpu, *gpu;
    cr_assert_eq(backend_cpu_create(&cpu, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    struct model *mc;
    cr_assert_eq(model_load(&mc, f, cpu, &err), 0, "%s", err.msg);
    size_t total = 0;
    cr_assert_eq(model_load_bytes(f, 0, -1, &total, &err), 0, "%s", err.msg);
    static const size_t staging[] = {4096, 256, 0};
    for (size_t si = 0; si < 3; si++) {
        struct model_load_params p;
        model_load_params_default(&p);
        p.staging_bytes = staging[si];
        p.progress = on_progress;
        last_done = 0;
        n_progress = 0;
        struct model *mg;
        cr_assert_eq(model_load_ex(&mg, f, gpu, &p, &err), 0, "%s", err.msg);
        cr_assert_eq(last_done, total);
        cr_assert_eq(last_total, total);
        uint8_t *img = malloc(total);
        cr_assert_eq(gpu->ops->download(gpu, img, mg->allocs[0], total), 0);
        cr_assert_eq(gpu->ops->sync(gpu), 0);
        struct ranges rc, rg;
        model_ranges(mc, &rc);
        model_ranges(mg, &rg);
        cr_assert_eq(rc.count, rg.count);
        for (int i = 0; i < rc.count; i++) {
            cr_assert_eq(rc.off[i], rg.off[i]);
            cr_assert_eq(rc.off[i] % 256, 0);
            cr_assert(!memcmp(img + rg.off[i], (const uint8_t *)mc->allocs[0] + rc.off[i], rc.n[i]),
                      "staging %zu: tensor %d at offset %zu differs", staging[si], i, rg.off[i]);
        }
        free(img);
        model_free(mg);
    }
    model_free(mc);
    backend_destroy(cpu);
    backend_destroy(gpu);
    gguf_close(f);
    tiny_weights_free(&w);
    unlink(path);
}

// FORWARD_ROW_SAMPLE rows on the GPU pick what the host chain picks from the
// GPU's own logits (same batch, fresh context) with the same rows.
Test(forward_cuda, decode_sample_matches_host_chain) {
    if (backend_cuda_device_count() == 0)
        cr_skip_test("no CUDA device present");
    struct tiny_cfg c;
    tiny_cfg_default(&c, "llama");
    char path[128];
    tiny_temp_path(path, sizeof path, "fwdcudasample");
    struct tiny_weights w;
    struct verr err = {0};
    cr_assert_eq(tiny_write(&c, path, &w, &err), 0, "%s", err.msg);
    struct backend *gpu;
    cr_assert_eq(backend_cuda_create(&gpu, 0, &err), 0, "%s", err.msg);
    struct model *m;
    cr_assert_eq(model_load_file(&m, path, gpu, &err), 0, "%s", err.msg);
    const int n = 12, V = c.n_vocab;
    int32_t tok[12], pos[12], seq[12] = {0};
    int8_t want[12];
    struct sample_params sp[12];
    for (int t = 0; t < n; t++) {
        tok[t] = (t * 7 + 3) % V;
        pos[t] = t;
        want[t] = 1;
        sp[t] = (struct sample_params){.temp = 0.5f + 0.1f * t,
                                       .top_k = t % 3 ? 40 : 0,
                                       .top_p = t % 2 ? 0.9f : 1.0f,
                                       .min_p = t % 4 ? 0.05f : 0.0f,
                                       .u = (t * 0.618) - (int)(t * 0.618)};
    }
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 64;
    cfg.n_batch = n;
    struct forward_batch b = {n, tok, pos, seq, want, NULL};
    struct context *ctx;
    struct context_result res;
    cr_assert_eq(test_ctx_wrap(&ctx, m, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(context_decode_logits(ctx, &b, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.n_rows, n);
    float *logits = malloc(sizeof(float) * n * V);
    memcpy(logits, res.logits, sizeof(float) * n * V);
    context_free(ctx);
    cr_assert_eq(test_ctx_wrap(&ctx, m, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(test_ctx_decode_all(ctx, &b, FORWARD_ROW_SAMPLE, sp, &res, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(res.n_rows, n);
    struct sampler_cand *cands = malloc(sizeof *cands * V);
    for (int r = 0; r < n; r++) {
        for (int v = 0; v < V; v++)
            cands[v] = (struct sampler_cand){v, logits[(size_t)r * V + v], 0};
        struct sampler_cands cc = {cands, (size_t)V, false};
        int32_t want_tok =
            sampler_chain(&cc, sp[r].temp, sp[r].top_k, sp[r].top_p, sp[r].min_p, sp[r].u);
        cr_expect_eq(res.ids[r], want_tok, "row %d: %d on the GPU, %d on the host", r, res.ids[r],
                     want_tok);
    }
    context_free(ctx);
    free(cands);
    free(logits);
    model_free(m);
    backend_destroy(gpu);
    tiny_weights_free(&w);
    unlink(path);
}

// Quantized and bf16 KV caches (docs/kv-cache.md) through the whole engine:
// qwen2 with head dim 64 (decode on attn_dec_kernel's any-cache instance,
// the 20-token batch on tensor cores), F32 weights, K and V types each on
// its own, against the CPU with the same cache types. Both backends store
// with the same quantizer and decode to the same floats. Batches of 1 and 3
// tokens (mat-vec projections, SIMT attention): 1e-4 of max|logit|, as for
// an F32 cache. The 20-token batch: its K and V come from the GEMM, which
// sums in another order than the CPU (~1e-6 relative), so a value near a
// rounding boundary of its block lands on the neighbouring level (a whole
// quantization step: up to 24 d for iq4_nl) on one side only; the op tests
// (test_cuda_kv_quant.c) show the kernels themselves within 3e-4 there. So
// that batch is held to 1e-3 (tensor cores, as an F16 cache) plus half of
// the type's own error on the CPU (its logits against an F32 cache's): a
// flipped level costs a fraction of what the quantization costs, a kernel
// that misreads the cache costs all of it.
Test(forward_cuda, quantized_kv_caches) {
    static const enum ggml_type kv[][2] = {{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
                                           {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1},
                                           {GGML_TYPE_Q5_0, GGML_TYPE_Q5_1},
                                           {GGML_TYPE_IQ4_NL, GGML_TYPE_BF16},
                                           {GGML_TYPE_F16, GGML_TYPE_Q8_0}};
    struct tiny_cfg cfg;
    tiny_cfg_kquant(&cfg, GGML_TYPE_F32);
    cfg.n_layer = 2;
    struct fwd_pair fp;
    fwd_pair_open(&fp, &cfg, false);
    struct model *mc = fp.mc, *mg = fp.mg;
    const int n = 20, V = cfg.n_vocab;
    int32_t tok[20];
    for (int t = 0; t < n; t++)
        tok[t] = (t * 11 + 2) % V;
    float *lc = malloc(sizeof(float) * n * V), *lg = malloc(sizeof(float) * n * V);
    float *lf = malloc(sizeof(float) * n * V); // the CPU with an F32 cache
    run_tokens(mc, 512, GGML_TYPE_F32, GGML_TYPE_F32, tok, n, false, lf, NULL);
    static const int batches[] = {512, 1, 3};
    for (size_t ki = 0; ki < sizeof kv / sizeof kv[0]; ki++) {
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            run_tokens(mc, batches[bi], kv[ki][0], kv[ki][1], tok, n, false, lc, NULL);
            run_tokens(mg, batches[bi], kv[ki][0], kv[ki][1], tok, n, false, lg, NULL);
            double scale = 1, worst = 0, qerr = 0;
            for (int i = 0; i < n * V; i++) {
                scale = fmax(scale, fabs(lc[i]));
                worst = fmax(worst, fabs((double)lg[i] - lc[i]));
                qerr = fmax(qerr, fabs((double)lf[i] - lc[i]));
            }
            const double tol = batches[bi] < n ? 1e-4 : 1e-3 + 0.5 * qerr / scale;
            cr_log_info("%s/%s KV, batch %d: cuda vs cpu worst relative logit error %.3g (tol "
                        "%.3g; the type's own error on the cpu %.3g)",
                        ggml_type_name(kv[ki][0]), ggml_type_name(kv[ki][1]), batches[bi],
                        worst / scale, tol, qerr / scale);
            cr_expect_lt(worst / scale, tol, "%s/%s KV, batch %d: %g", ggml_type_name(kv[ki][0]),
                         ggml_type_name(kv[ki][1]), batches[bi], worst / scale);
        }
    }
    free(lf);
    free(lc);
    free(lg);
    fwd_pair_close(&fp);
}
