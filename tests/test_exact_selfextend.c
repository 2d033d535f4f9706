// Exact self-extend (host/ops/selfextend.h) and the unrotated cache mode on
// the CPU backend, whole model, against an independent float64
// implementation of the rule written here (the weights of tests/tiny_model.h,
// its float64 RoPE, nothing of the backend's): tiny llama (normal RoPE) and
// qwen2 (NeoX) models with n_ctx_train 64, prompts of 1.5x to 4x that, several
// (G, W), batches of 1 to 64 tokens, F32 and F16 caches, several sequences in
// one cache, two pipeline stages (--devices cpu,cpu), the KV policy.
// Invariants: G = 1 and
// W >= the prompt are ordinary attention bit for bit; a context shift in the
// unrotated mode leaves K untouched and equals a fresh evaluation of the kept
// tokens; bad G / W are refused.
//
// Tolerances (relative RMS over all logits, sqrt(sum (got-ref)^2 / sum ref^2)):
// - F32 cache: 1e-5. Everything is float32 with float32 accumulation over at
//   most a few hundred terms; the float64 reference differs by rounding only
//   (worst seen ~5e-7). A wrong rule (a far key rotated at j, the query at
//   i, W off by one) gives errors of 1e-2 and more.
// - F16 cache: 2e-3. K and V are rounded to 11 significant bits (4.9e-4
//   relative) before attention (worst seen ~4e-4).
// - Context shift vs a fresh evaluation: 1e-6 for both caches: the K/V rows
//   are the same bits (batches of one token; K never rewritten), only the
//   order of the attention sums differs (the new token lands in the freed
//   gap, not after the kept cells).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "host/forward/forward.h"
#include "host/model/model.h"
#include "host/ops/backend.h"
#include "host/split/context.h"
#include "host/split/pipeline.h"
#include "kv/kv.h"
#include "kv/policy.h"
#include "tests/pipeline_helpers.h"
#include "tiny_model.h"

#define TOL_F32 1e-5
#define TOL_F16 2e-3
#define TOL_SHIFT 1e-6

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
    tiny_temp_path(fx->path, sizeof fx->path, "se");
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

static void small_cfg(struct tiny_cfg *c, const char *arch) {
    tiny_cfg_default(c, arch);
    c->n_ctx_train = 64;
}

// The reference's RoPE from the tiny config, as llama.cpp resolves a model's
// metadata without overrides.
static struct tiny_rope ref_rope(const struct fixture *fx) {
    const struct tiny_cfg *c = &fx->cfg;
    struct tiny_rope r = {0};
    r.neox = !strcmp(c->arch, "qwen2");
    r.n_rot = c->n_rot;
    r.n_ctx_orig = c->orig_ctx ? c->orig_ctx : c->n_ctx_train;
    r.freq_base = c->freq_base;
    const bool yarn = c->scaling_type && !strcmp(c->scaling_type, "yarn");
    r.freq_scale = c->scaling_factor != 0 ? 1.0 / c->scaling_factor : 1.0;
    r.ext_factor = yarn ? 1.0 : 0.0;
    r.attn_factor = 1.0;
    r.beta_fast = 32;
    r.beta_slow = 1;
    r.freq_factors = fx->w.rope_freqs;
    return r;
}

// --- the float64 reference of the rule -----------------------------------------

// One layer's attention of a sequence (tokens in position order) under exact
// self-extend: near (i - j < W) q at i . k at j, far q at i/G + W - W/G .
// k at j/G, one softmax. Q, K, V [n][H*D] / [n][HK*D] unrotated.
static void ref_attention(const struct tiny_cfg *c, const struct tiny_rope *r, const double *Q,
                          const double *K, const double *V, const int32_t *pos, int n, int G, int W,
                          double *att /* [n][H*D] */) {
    const int H = c->n_head, HK = c->n_head_kv, D = c->head_dim;
    double *qn = malloc(sizeof(double) * D), *qf = malloc(sizeof(double) * D);
    double *kk = malloc(sizeof(double) * D), *sc = malloc(sizeof(double) * n);
    for (int t = 0; t < n; t++) {
        const int i = pos[t];
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / HK);
            memcpy(qn, Q + ((size_t)t * H + h) * D, sizeof(double) * D);
            memcpy(qf, qn, sizeof(double) * D);
            tiny_rope_head(qn, i, r);
            tiny_rope_head(qf, i / G + W - W / G, r);
            double mx = -INFINITY;
            for (int s = 0; s < n; s++) {
                sc[s] = -INFINITY;
                const int j = pos[s];
                if (j > i)
                    continue;
                const bool near = i - j < W;
                memcpy(kk, K + ((size_t)s * HK + hk) * D, sizeof(double) * D);
                tiny_rope_head(kk, near ? j : j / G, r);
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (near ? qn[e] : qf[e]) * kk[e];
                sc[s] = d / sqrt((double)D);
                mx = fmax(mx, sc[s]);
            }
            double sum = 0;
            for (int s = 0; s < n; s++) {
                sc[s] = sc[s] == -INFINITY ? 0 : exp(sc[s] - mx);
                sum += sc[s];
            }
            for (int e = 0; e < D; e++) {
                double acc = 0;
                for (int s = 0; s < n; s++)
                    acc += sc[s] * V[((size_t)s * HK + hk) * D + e];
                att[((size_t)t * H + h) * D + e] = acc / sum;
            }
        }
    }
    free(qn);
    free(qf);
    free(kk);
    free(sc);
}

// Logits [n][n_vocab] of one sequence under exact self-extend (G, W).
static void ref_logits(const struct fixture *fx, const int32_t *tok, const int32_t *pos, int n,
                       int G, int W, double *logits) {
    const struct tiny_cfg *c = &fx->cfg;
    const struct tiny_weights *w = &fx->w;
    const struct tiny_rope r = ref_rope(fx);
    const int E = c->n_embd, F = c->n_ff, nq = c->n_head * c->head_dim;
    const int nk = c->n_head_kv * c->head_dim;
    double *x = calloc((size_t)n * E, sizeof *x), *xn = malloc(sizeof(double) * E);
    double *Q = malloc(sizeof(double) * (size_t)n * nq), *att = malloc(sizeof(double) * n * nq);
    double *K = malloc(sizeof(double) * (size_t)n * nk), *V = malloc(sizeof(double) * n * nk);
    double *o = malloc(sizeof(double) * E), *g = malloc(sizeof(double) * F);
    double *u = malloc(sizeof(double) * F);
    for (int t = 0; t < n; t++)
        for (int e = 0; e < E; e++)
            x[(size_t)t * E + e] = w->tok_embd[(size_t)tok[t] * E + e];
    for (int l = 0; l < c->n_layer; l++) {
        const struct tiny_layer *L = &w->L[l];
        for (int t = 0; t < n; t++) {
            tiny_rmsnorm(xn, x + (size_t)t * E, L->attn_norm, E, c->norm_eps);
            tiny_matvec(Q + (size_t)t * nq, L->wq, xn, E, nq, L->bq);
            tiny_matvec(K + (size_t)t * nk, L->wk, xn, E, nk, L->bk);
            tiny_matvec(V + (size_t)t * nk, L->wv, xn, E, nk, L->bv);
        }
        ref_attention(c, &r, Q, K, V, pos, n, G, W, att);
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E;
            tiny_matvec(o, L->wo, att + (size_t)t * nq, nq, E, NULL);
            for (int e = 0; e < E; e++)
                xt[e] += o[e];
            tiny_ffn_residual(c, L, xt, xn, g, u, o);
        }
    }
    tiny_head_logits(c, w, x, n, xn, logits);
    free(x);
    free(xn);
    free(Q);
    free(att);
    free(K);
    free(V);
    free(o);
    free(g);
    free(u);
}

// --- the engine under test ------------------------------------------------------

struct se_run {
    int G, W;    // G 0: the default rotated-K cache; G >= 1: the unrotated mode
    int n_batch; // tokens per decode
    int n_ctx;   // cells
    enum ggml_type kv_type;
};

// A context of sr over fx's backend and model (borrowed: a pipeline of one
// stage that leaves them to the fixture).
static struct context *ctx_open(struct fixture *fx, const struct se_run *sr, int n_seq) {
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = sr->n_ctx;
    cfg.n_batch = sr->n_batch;
    cfg.n_seq_max = n_seq;
    cfg.type_k = cfg.type_v = sr->kv_type;
    cfg.k_unrotated = sr->G >= 1;
    cfg.se_g = sr->G;
    cfg.se_w = sr->W;
    struct verr err = {0};
    struct pipeline *p;
    cr_assert_eq(pipeline_wrap(&p, fx->be, fx->m, false, &err), 0, "pipeline_wrap: %s", err.msg);
    struct context *c;
    cr_assert_eq(context_create(&c, p, &cfg, true, &err), 0, "context_create: %s", err.msg);
    return c;
}

// Decodes tokens at positions p0.. of seq 0 in chunks of n_batch, every row
// wanting logits, on an open context; out [n][n_vocab].
static void decode_all(struct context *c, const int32_t *tok, int n, int p0, int n_batch,
                       float *out) {
    const int V = context_model(c)->hp.n_vocab;
    int32_t *pos = malloc(sizeof(int32_t) * n), *seq = calloc(n, sizeof(int32_t));
    int8_t *want = malloc(n);
    for (int t = 0; t < n; t++) {
        pos[t] = p0 + t;
        want[t] = 1;
    }
    struct verr err = {0};
    for (int i = 0; i < n; i += n_batch) {
        const int nb = n - i < n_batch ? n - i : n_batch;
        struct forward_batch b = {nb, tok + i, pos + i, seq + i, want + i, NULL};
        struct context_result res;
        cr_assert_eq(context_decode_logits(c, &b, &res, &err), 0, "context_decode: %s", err.msg);
        cr_assert_eq(res.n_rows, nb);
        memcpy(out + (size_t)i * V, res.logits, sizeof(float) * (size_t)nb * V);
    }
    free(pos);
    free(seq);
    free(want);
}

static float *run_prompt(struct fixture *fx, const struct se_run *sr, const int32_t *tok, int n) {
    struct context *c = ctx_open(fx, sr, 1);
    float *out = malloc(sizeof(float) * (size_t)n * fx->cfg.n_vocab);
    decode_all(c, tok, n, 0, sr->n_batch, out);
    context_free(c);
    return out;
}

static double rel_rms(const float *got, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / fmax(den, 1e-300));
}

static double rel_rms_f(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / fmax(den, 1e-300));
}

static int32_t *make_tokens(int n, int n_vocab, int salt) {
    int32_t *t = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++)
        t[i] = (i * 7 + 3 + salt * (i / 5)) % n_vocab;
    return t;
}

// --- whole-model logits against the reference ------------------------------------

struct se_case {
    int G, W, n, n_batch;
};

static const struct se_case cases[] = {
    {2, 16, 96, 1},   // 1.5x the trained context, one token a decode
    {4, 24, 256, 64}, // 4x, 64-token batches
    {3, 40, 160, 13}, // W near the trained context, ragged batches
    {8, 8, 200, 7},   // large groups, small window
    {2, 1, 128, 32},  // W = 1: only the diagonal is near
};

static void check_model(const struct tiny_cfg *c, const char *label) {
    struct fixture fx;
    fixture_open(&fx, c);
    const int V = c->n_vocab;
    double worst[2] = {0, 0};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const struct se_case *sc = &cases[k];
        int32_t *tok = make_tokens(sc->n, V, (int)k);
        int32_t *pos = malloc(sizeof(int32_t) * sc->n);
        for (int t = 0; t < sc->n; t++)
            pos[t] = t;
        double *ref = malloc(sizeof(double) * (size_t)sc->n * V);
        ref_logits(&fx, tok, pos, sc->n, sc->G, sc->W, ref);
        for (int f16 = 0; f16 < 2; f16++) {
            struct se_run sr = {sc->G, sc->W, sc->n_batch, 256,
                                f16 ? GGML_TYPE_F16 : GGML_TYPE_F32};
            float *got = run_prompt(&fx, &sr, tok, sc->n);
            const double e = rel_rms(got, ref, (size_t)sc->n * V);
            const double tol = f16 ? TOL_F16 : TOL_F32;
            worst[f16] = fmax(worst[f16], e);
            cr_assert_leq(e, tol, "%s G %d W %d n %d batch %d %s cache: rel RMS %.3g > %.1g", label,
                          sc->G, sc->W, sc->n, sc->n_batch, f16 ? "f16" : "f32", e, tol);
            free(got);
        }
        free(tok);
        free(pos);
        free(ref);
    }
    cr_log_info("%s: worst rel RMS vs float64: f32 cache %.3g, f16 cache %.3g\n", label, worst[0],
                worst[1]);
    fixture_close(&fx);
}

Test(exact_selfextend, llama_logits_match_the_formula) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    check_model(&c, "llama");
}

Test(exact_selfextend, qwen2_logits_match_the_formula) {
    struct tiny_cfg c;
    small_cfg(&c, "qwen2");
    check_model(&c, "qwen2");
}

// YaRN (ramp + mscale on q and k), linear scaling, frequency factors and
// partial rotation apply to both rotations.
Test(exact_selfextend, yarn_freq_factors_partial_rotation) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    c.scaling_type = "yarn";
    c.scaling_factor = 4;
    c.orig_ctx = 32;
    c.rope_freqs = true;
    c.n_rot = 8; // half of head_dim 16 rotates
    check_model(&c, "llama yarn");
}

// --- invariants --------------------------------------------------------------------

// G = 1 in the unrotated mode, and any G with W >= the prompt, are ordinary
// attention: on an F32 cache the very bits of the rotated-K cache (the same
// rotations, dots and sums; K rotated in attention instead of at the store).
Test(exact_selfextend, g1_and_wide_window_are_ordinary_attention_bit_for_bit) {
    const char *archs[] = {"llama", "qwen2"};
    for (int a = 0; a < 2; a++) {
        struct tiny_cfg c;
        small_cfg(&c, archs[a]);
        struct fixture fx;
        fixture_open(&fx, &c);
        const int n = 60, V = c.n_vocab;
        int32_t *tok = make_tokens(n, V, 1);
        const size_t bytes = sizeof(float) * (size_t)n * V;
        for (int f16 = 0; f16 < 2; f16++) {
            const enum ggml_type t = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            struct se_run base = {f16 ? 1 : 0, 0, 9, 128, t}; // f16: compare in the unrotated mode
            struct se_run g1 = {1, 0, 9, 128, t}, wide = {4, 63, 9, 128, t};
            float *want = run_prompt(&fx, &base, tok, n);
            float *got1 = run_prompt(&fx, &g1, tok, n);
            float *gotw = run_prompt(&fx, &wide, tok, n);
            cr_assert_eq(memcmp(want, got1, bytes), 0, "%s %s: G = 1 is not bit-identical",
                         archs[a], ggml_type_name(t));
            cr_assert_eq(memcmp(want, gotw, bytes), 0, "%s %s: W >= prompt not bit-identical",
                         archs[a], ggml_type_name(t));
            free(want);
            free(got1);
            free(gotw);
        }
        free(tok);
        fixture_close(&fx);
    }
}

// A context shift in the unrotated mode moves positions only: K is not
// rewritten, and the next token's logits equal a fresh evaluation of the
// kept tokens. One layer, so that the kept tokens' K/V depend on the token
// alone (with more layers they depend on the discarded tokens, and a fresh
// evaluation differs by design, in every engine).
Test(exact_selfextend, context_shift_equals_fresh_evaluation) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    c.n_layer = 1;
    struct fixture fx;
    fixture_open(&fx, &c);
    const int n = 40, n_keep = 4, V = c.n_vocab;
    int32_t *tok = make_tokens(n + 1, V, 2);
    const int gs[2][2] = {{1, 0}, {2, 8}};
    for (int f16 = 0; f16 < 2; f16++) {
        for (int gi = 0; gi < 2; gi++) {
            const enum ggml_type t = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            struct se_run sr = {gs[gi][0], gs[gi][1], 1, 64, t};
            struct context *ctx = ctx_open(&fx, &sr, 1);
            const struct kv_cache *kv = &context_stage(ctx, 0)->kv;
            float *scratch = malloc(sizeof(float) * (size_t)n * V);
            decode_all(ctx, tok, n, 0, 1, scratch);
            const size_t kbytes = kv->k_row_bytes * (size_t)kv->cfg.n_ctx;
            void *k_before = malloc(kbytes);
            memcpy(k_before, kv_layer_k(kv, 0), kbytes);
            // llama-cli's context shift (kv_context_shift) through the context:
            // half of the positions after n_keep go, the rest move down.
            const int32_t nd = (n - n_keep) / 2;
            struct verr err = {0};
            cr_assert_eq(context_seq_rm(ctx, 0, n_keep, n_keep + nd, &err), 0, "%s", err.msg);
            cr_assert_eq(context_seq_add(ctx, 0, n_keep + nd, n, -nd, &err), 0, "%s", err.msg);
            cr_assert_gt(nd, 0);
            float *after = malloc(sizeof(float) * V);
            decode_all(ctx, tok + n, 1, n - nd, 1, after);
            // Every kept cell's K is as stored; the new token went to a freed cell.
            const size_t row = kv->k_row_bytes;
            for (int cell = 0; cell < n; cell++)
                if (kv_cell_pos(kv, cell) >= 0 && kv_cell_pos(kv, cell) != n - nd)
                    cr_assert_eq(memcmp((char *)k_before + cell * row,
                                        (char *)kv_layer_k(kv, 0) + cell * row, row),
                                 0, "cell %d: K was rewritten by the shift", cell);
            context_free(ctx);

            // Fresh: the kept tokens at positions 0.., then the new token.
            int32_t *kept = malloc(sizeof(int32_t) * (n - nd + 1));
            int m = 0;
            for (int i = 0; i < n; i++)
                if (i < n_keep || i >= n_keep + nd)
                    kept[m++] = tok[i];
            kept[m++] = tok[n];
            cr_assert_eq(m, n - nd + 1);
            float *fresh = run_prompt(&fx, &sr, kept, m);
            const double e = rel_rms_f(after, fresh + (size_t)(m - 1) * V, V);
            cr_log_info("context shift (G %d W %d, %s cache): rel RMS vs fresh %.3g\n", sr.G, sr.W,
                        ggml_type_name(t), e);
            cr_assert_leq(e, TOL_SHIFT, "G %d %s: shift vs fresh rel RMS %.3g", sr.G,
                          ggml_type_name(t), e);
            free(kept);
            free(fresh);
            free(after);
            free(k_before);
            free(scratch);
        }
    }
    free(tok);
    fixture_close(&fx);
}

// The tiny model of fx loaded as vela's commands load it (run_load: one
// backend, or a stage per device with devices "cpu,cpu"), 8-token batches,
// 384 cells, kv_type caches; exact self-extend (G, W) for the whole context
// (G 0: none), K cached unrotated when unrot or G > 1.
static void open_run(const struct fixture *fx, const char *devices, enum ggml_type kv_type, int G,
                     int W, bool unrot, struct run *r) {
    struct args_model a;
    args_model_default(&a);
    a.backend = LOAD_BACKEND_CPU;
    a.n_threads = 2;
    a.devices = devices;
    a.n_ctx = 384;
    a.n_batch = 8;
    a.type_k = a.type_v = kv_type;
    a.se_g = G;
    a.se_w = W;
    a.k_unrotated = unrot;
    struct verr err = {0};
    cr_assert_eq(run_load(r, &a, fx->path, &err), 0, "%s", err.msg);
    cr_assert(!devices || r->p->n_stages == 2, "not split");
}

// Decodes n_seq sequences (tok[s][0..len[s])) interleaved, `per` tokens of
// each in a batch (every row wanting logits, at most 8), through r; se[s] =
// (G, W) of sequence s goes in forward_batch.se (se NULL: the context's).
// got[s]: the logits [len[s]][n_vocab] of sequence s.
static void decode_interleaved(struct run *r, int32_t *const *tok, const int *len, int n_seq,
                               int per, const int (*se)[2], float **got) {
    const int V = r->m->hp.n_vocab;
    int done[4] = {0};
    int32_t bt[8], bp[8], bs[8], bse[16];
    int8_t want[8];
    memset(want, 1, sizeof want);
    for (;;) {
        int nb = 0;
        for (int s = 0; s < n_seq; s++)
            for (int k = 0; k < per && done[s] < len[s] && nb < 8; k++, nb++) {
                bt[nb] = tok[s][done[s]];
                bp[nb] = done[s]++;
                bs[nb] = s;
                bse[2 * nb] = se ? se[s][0] : 0;
                bse[2 * nb + 1] = se ? se[s][1] : 0;
            }
        if (nb == 0)
            break;
        struct forward_batch b = {nb, bt, bp, bs, want, se ? bse : NULL};
        struct verr err = {0};
        struct context_result res;
        cr_assert_eq(context_decode_logits(r->c, &b, &res, &err), 0, "%s", err.msg);
        cr_assert_eq(res.n_rows, nb);
        for (int i = 0; i < nb; i++)
            memcpy(got[bs[i]] + (size_t)bp[i] * V, context_row_logits(&res, i), sizeof(float) * V);
    }
}

// Relative RMS of one sequence's logits got [n][n_vocab] against the
// float64 rule with (G, W) over its tokens at positions 0..n-1.
static double seq_rel_rms(const struct fixture *fx, const int32_t *tok, int n, int G, int W,
                          const float *got) {
    const size_t nv = (size_t)n * fx->cfg.n_vocab;
    int32_t *pos = malloc(sizeof(int32_t) * n);
    double *ref = malloc(sizeof(double) * nv);
    for (int t = 0; t < n; t++)
        pos[t] = t;
    ref_logits(fx, tok, pos, n, G, W, ref);
    const double e = rel_rms(got, ref, nv);
    free(pos);
    free(ref);
    return e;
}

// Three sequences of different lengths, interleaved in shared batches of one
// cache with the context's G and W, each against the reference of its own
// tokens.
Test(exact_selfextend, several_sequences_in_one_cache) {
    struct tiny_cfg c;
    small_cfg(&c, "qwen2");
    struct fixture fx;
    fixture_open(&fx, &c);
    const int V = c.n_vocab, G = 3, W = 12;
    const int len[3] = {100, 150, 70};
    int32_t *tok[3];
    float *got[3];
    for (int s = 0; s < 3; s++) {
        tok[s] = make_tokens(len[s], V, 10 + s);
        got[s] = malloc(sizeof(float) * (size_t)len[s] * V);
    }
    for (int f16 = 0; f16 < 2; f16++) {
        struct run r;
        open_run(&fx, NULL, f16 ? GGML_TYPE_F16 : GGML_TYPE_F32, G, W, false, &r);
        decode_interleaved(&r, tok, len, 3, 1 + 2 * f16, NULL, got);
        close_run(&r);
        for (int s = 0; s < 3; s++) {
            const double e = seq_rel_rms(&fx, tok[s], len[s], G, W, got[s]);
            const double tol = f16 ? TOL_F16 : TOL_F32;
            cr_assert_leq(e, tol, "seq %d (%s cache): rel RMS %.3g > %.1g", s, f16 ? "f16" : "f32",
                          e, tol);
        }
    }
    for (int s = 0; s < 3; s++) {
        free(tok[s]);
        free(got[s]);
    }
    fixture_close(&fx);
}

// G and W chosen per sequence (forward_batch.se) in one cache and in the
// same batches: (3, 12), (2, 20) and none (G 1). Each sequence matches the
// float64 rule with its own values, equals bit for bit a run of it alone in
// a context whose G and W are its values, and two CPU stages give the same
// bits as one.
Test(exact_selfextend, each_sequence_its_own_g_and_w) {
    struct tiny_cfg c;
    small_cfg(&c, "qwen2");
    c.n_layer = 4;
    struct fixture fx;
    fixture_open(&fx, &c);
    const int V = c.n_vocab, n_seq = 3;
    const int se[3][2] = {{3, 12}, {2, 20}, {1, 0}};
    const int len[3] = {150, 110, 60};
    int32_t *tok[3];
    float *got[2][3];
    for (int s = 0; s < n_seq; s++) {
        tok[s] = make_tokens(len[s], V, 20 + s);
        for (int d = 0; d < 2; d++)
            got[d][s] = malloc(sizeof(float) * (size_t)len[s] * V);
    }
    for (int d = 0; d < 2; d++) { // one stage, then --devices cpu,cpu
        struct run r;
        open_run(&fx, d ? "cpu,cpu" : NULL, GGML_TYPE_F32, 0, 0, true, &r);
        decode_interleaved(&r, tok, len, n_seq, 3, se, got[d]);
        close_run(&r);
    }
    double worst = 0;
    for (int s = 0; s < n_seq; s++) {
        const size_t n = (size_t)len[s] * V;
        cr_assert_eq(memcmp(got[0][s], got[1][s], sizeof(float) * n), 0,
                     "seq %d: --devices cpu,cpu differs from one stage", s);
        const double e = seq_rel_rms(&fx, tok[s], len[s], se[s][0], se[s][1], got[0][s]);
        worst = fmax(worst, e);
        cr_assert_leq(e, TOL_F32, "seq %d (G %d W %d): rel RMS %.3g > %.1g", s, se[s][0], se[s][1],
                      e, TOL_F32);
        struct se_run sr = {se[s][0], se[s][1], 8, 384, GGML_TYPE_F32};
        float *alone = run_prompt(&fx, &sr, tok[s], len[s]);
        cr_assert_eq(memcmp(got[0][s], alone, sizeof(float) * n), 0,
                     "seq %d (G %d W %d) differs from a run alone with its values", s, se[s][0],
                     se[s][1]);
        free(alone);
        free(got[0][s]);
        free(got[1][s]);
        free(tok[s]);
    }
    cr_log_info("own G/W per sequence: worst rel RMS vs float64 %.3g\n", worst);
    fixture_close(&fx);
}

// Two pipeline stages on the CPU (--devices cpu,cpu) give the one-stage
// logits bit for bit, and both match the reference.
Test(exact_selfextend, two_cpu_stages_bit_for_bit) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    c.n_layer = 4;
    struct fixture fx;
    fixture_open(&fx, &c);
    const int n = 130, V = c.n_vocab;
    float *logits[2];
    for (int d = 0; d < 2; d++) {
        struct args_model a;
        args_model_default(&a);
        a.backend = LOAD_BACKEND_CPU;
        a.n_threads = 2;
        a.devices = d ? "cpu,cpu" : NULL;
        a.n_ctx = 160;
        a.n_batch = 8;
        a.type_k = a.type_v = GGML_TYPE_F32;
        a.se_g = 4;
        a.se_w = 20;
        struct run r;
        struct verr err = {0};
        cr_assert_eq(run_load(&r, &a, fx.path, &err), 0, "%s", err.msg);
        cr_assert(d == 0 || r.p->n_stages == 2, "not split");
        cr_assert(context_config(r.c)->k_unrotated);
        logits[d] = decode_seq(&r, 0, 0, n, 8, 0);
        close_run(&r);
    }
    cr_assert_eq(memcmp(logits[0], logits[1], sizeof(float) * (size_t)n * V), 0,
                 "--devices cpu,cpu differs from one stage");
    int32_t *tok = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) {
        tok[t] = (t * 37 + 5) % V; // decode_seq's pattern
        pos[t] = t;
    }
    double *ref = malloc(sizeof(double) * (size_t)n * V);
    ref_logits(&fx, tok, pos, n, 4, 20, ref);
    const double e = rel_rms(logits[0], ref, (size_t)n * V);
    cr_assert_leq(e, TOL_F32, "rel RMS %.3g", e);
    free(tok);
    free(pos);
    free(ref);
    free(logits[0]);
    free(logits[1]);
    fixture_close(&fx);
}

// forward_batch.se: refused on a rotated cache and with bad values (the
// message names the token), nothing claimed.
Test(exact_selfextend, bad_per_token_values_are_refused) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    struct fixture fx;
    fixture_open(&fx, &c);
    for (int unrot = 0; unrot < 2; unrot++) {
        struct se_run sr = {unrot ? 1 : 0, 0, 8, 128, GGML_TYPE_F32};
        struct context *ctx = ctx_open(&fx, &sr, 1);
        const int bad[][2] = {{2, 0}, {0, 8}, {-2, 8}, {4, 64}, {4, 100}};
        for (size_t k = 0; k < (unrot ? sizeof bad / sizeof bad[0] : 1); k++) {
            int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, seq[2] = {0, 0};
            int32_t se[4] = {1, 0, bad[k][0], bad[k][1]};
            struct forward_batch b = {2, tok, pos, seq, NULL, se};
            struct verr err = {0};
            const int rc = context_decode_logits(ctx, &b, NULL, &err);
            cr_assert(rc == VERR_RANGE || rc == VERR_UNSUPPORTED, "G %d W %d accepted (rc %d)",
                      bad[k][0], bad[k][1], rc);
            cr_assert(strstr(err.msg, unrot ? "token 1" : "unrotated"), "message: %s", err.msg);
            cr_assert_eq(context_cells_used(ctx), 0, "cells were claimed");
        }
        context_free(ctx);
    }
    fixture_close(&fx);
}

// Bad G / W are refused by forward_init with a message, nothing opened.
Test(exact_selfextend, bad_values_are_refused) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    struct fixture fx;
    fixture_open(&fx, &c);
    const int bad[][2] = {{2, 0}, {2, -3}, {-1, 8}, {2, 64}, {4, 100}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        struct forward_config cfg;
        forward_config_default(&cfg);
        cfg.n_ctx = 128;
        cfg.se_g = bad[k][0];
        cfg.se_w = bad[k][1];
        struct forward_ctx fc;
        struct verr err = {0};
        cr_assert_eq(forward_init(&fc, fx.m, &cfg, &err), VERR_RANGE, "G %d W %d accepted",
                     bad[k][0], bad[k][1]);
        cr_assert(strstr(err.msg, "self-extend"), "message: %s", err.msg);
    }
    int ext = 0;
    struct verr err = {0};
    cr_assert_eq(forward_selfextend_ctx(&fx.m->hp, 4, 16, &ext, &err), 0, "%s", err.msg);
    cr_assert_eq(ext, (64 - 16) * 4 + 16);
    // n_ctx 0 sizes the cache for the extended context.
    struct forward_config cfg;
    forward_config_default(&cfg);
    cfg.n_ctx = 0;
    cfg.se_g = 4;
    cfg.se_w = 16;
    forward_config_resolve(&cfg, &fx.m->hp);
    cr_assert_eq(cfg.n_ctx, ext);
    fixture_close(&fx);
}

// The policy (kv/policy.h): nothing moves before a batch, the share is full
// by cells (positions run past it), cells may be shared; bad values refused
// with the policy untouched.
Test(exact_selfextend, policy_moves_nothing_and_fills_by_cells) {
    struct kv_config kc = {.n_ctx = 64, .n_seq_max = 2};
    struct kv_cache kv;
    struct verr err = {0};
    cr_assert_eq(kv_init(&kv, &kc, NULL, &err), 0, "%s", err.msg);
    int32_t pos[40], seq[40], cells[40];
    for (int t = 0; t < 40; t++) {
        pos[t] = t;
        seq[t] = 0;
    }
    cr_assert_eq(kv_find_slot(&kv, pos, seq, 40, cells, &err), 0, "%s", err.msg);
    struct kv_policy_params pp;
    kv_policy_params_default(&pp);
    pp.se_g = 4;
    pp.se_w = 16;
    struct kv_policy pol;
    cr_assert_eq(kv_policy_init(&pol, &pp, &kv, 0, 40, &err), 0, "%s", err.msg);
    cr_assert_eq(pol.kind, KV_POLICY_EXACT_SE);
    cr_assert_str_eq(kv_policy_name(pol.kind), "exact self-extend");
    int32_t n_past = 40;
    cr_assert_eq(kv_policy_before_batch(&pol, &kv, &n_past, &err), 0, "%s", err.msg);
    cr_assert_eq(n_past, 40);
    for (int c = 0; c < 40; c++)
        cr_assert_eq(kv_cell_pos(&kv, c), c, "cell %d moved", c);
    cr_assert_not(kv.has_shift);
    int n_cells = 39;
    int32_t nd = -1;
    n_past = 1000; // positions past the share do not fill it
    cr_assert_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 0);
    cr_assert_eq(nd, 0);
    n_cells = 40;
    cr_assert_eq(kv_policy_make_room(&pol, &kv, &n_past, &n_cells, &nd, &err), 1);
    cr_assert_not(kv_policy_may_move(&pol, 1 << 20));

    const int bad[][3] = {{2, 0, 1}, {-2, 8, 1}, {4, 40, 1}, {4, 16, 2}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        struct kv_policy_params b = pp;
        b.se_g = bad[k][0];
        b.se_w = bad[k][1];
        b.ga_n = bad[k][2];
        b.ga_w = 16;
        struct kv_policy keep = pol;
        cr_assert_eq(kv_policy_init(&pol, &b, &kv, 0, 40, &err), VERR_RANGE, "case %zu", k);
        cr_assert(strstr(err.msg, "exact self-extend"), "%s", err.msg);
        cr_assert_eq(memcmp(&keep, &pol, sizeof pol), 0);
    }
    kv_free(&kv);
}

// `vela eval --self-extend G W` end to end (VELA_BIN, set by ctest): -v says
// what the extension is, a prompt longer than the extended context and a
// window not below the trained context are refused with an exit status.
static int run_vela(const char *args, char *errs, size_t cap) {
    const char *bin = getenv("VELA_BIN");
    char e[64], cmd[8192];
    tiny_temp_path(e, sizeof e, "se_err");
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin ? bin : "./vela", args, e);
    const int st = system(cmd);
    FILE *f = fopen(e, "rb");
    size_t n = f ? fread(errs, 1, cap - 1, f) : 0;
    errs[n] = '\0';
    if (f)
        fclose(f);
    unlink(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(exact_selfextend, cli_flags_and_errors) {
    struct tiny_cfg c;
    small_cfg(&c, "llama");
    struct fixture fx;
    fixture_open(&fx, &c);
    char toks[2048] = "", args[4096];
    static char errs[1 << 16];
    for (int t = 0; t < 120; t++) // (64 - 16) * 2 + 16 = 112 < 120
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", t ? "," : "", t % 50);
    snprintf(args, sizeof args, "eval -m %s --backend cpu --no-progress --tokens %s -se 2 16",
             fx.path, toks);
    cr_assert_neq(run_vela(args, errs, sizeof errs), 0);
    cr_assert(strstr(errs, "more than the extended context"), "%s", errs);
    toks[strlen(toks) - 30] = '\0'; // fewer tokens
    *strrchr(toks, ',') = '\0';
    snprintf(args, sizeof args,
             "eval -m %s --backend cpu --no-progress --tokens %s --self-extend 2 16 -v", fx.path,
             toks);
    cr_assert_eq(run_vela(args, errs, sizeof errs), 0, "%s", errs);
    cr_assert(strstr(errs, "usable context (n_ctx_train 64 - W) * G + W = 112"), "%s", errs);
    snprintf(args, sizeof args, "eval -m %s --backend cpu --no-progress --tokens 1,2 -se 2 64",
             fx.path);
    cr_assert_neq(run_vela(args, errs, sizeof errs), 0);
    cr_assert(strstr(errs, "below the trained context 64"), "%s", errs);
    snprintf(args, sizeof args, "eval -m %s --backend cpu --tokens 1,2 -se 2 0", fx.path);
    cr_assert_eq(run_vela(args, errs, sizeof errs), 2);
    cr_assert(strstr(errs, "W (neighbor window) = '0'"), "%s", errs);
    fixture_close(&fx);
}

// --- the attention op with (G, W) per query token (struct attn_args.q_se) ----

// One mixed call of the CPU attention op against ref_attention, token by
// token: sequences 0, 1 and 5 of 120, 70 and 30 cells shuffled through the
// cache (with empty cells), 16 query tokens of the three interleaved, each
// with its own (G, W): G = 1, (4, 16), (3, 100: wider than two of the
// sequences) and (2, 8). NeoX RoPE on 24 of 32 dims; F32 and F16 caches (the
// reference reads the cache's values, F16 ones decoded).
// Tolerance 2e-6 absolute on outputs bounded by max |v| = 1: q and K are
// rotated in float32 from float32 cos/sin (errors of a few 1e-7 relative),
// scores are dots of 32 float products (|q k| <= 1, ~6 roundings, scaled by
// 1/sqrt(32)), which moves each softmax weight by a few 1e-7 relative, and
// the float sums over <= 120 cells add about as much (worst seen ~1e-7); a
// wrong rule (a token given another token's G or W) moves outputs by 1e-2
// and more.
Test(exact_selfextend, op_per_token_g_w_matches_the_formula) {
    enum { H = 6, HK = 2, D = 32, NKV = 240, NT = 16 };
    struct tiny_cfg c;
    tiny_cfg_default(&c, "qwen2");
    c.n_head = H;
    c.n_head_kv = HK;
    c.head_dim = D;
    const struct tiny_rope r = {.neox = 1,
                                .n_rot = 24,
                                .n_ctx_orig = 64,
                                .freq_base = 10000,
                                .freq_scale = 1,
                                .attn_factor = 1,
                                .beta_fast = 32,
                                .beta_slow = 1};
    const struct rope_params rp = {.mode = ROPE_MODE_NEOX,
                                   .n_rot = 24,
                                   .n_ctx_orig = 64,
                                   .freq_base = 10000,
                                   .freq_scale = 1,
                                   .attn_factor = 1,
                                   .beta_fast = 32,
                                   .beta_slow = 1};
    const int seqs[3] = {0, 1, 5}, len[3] = {120, 70, 30};
    const int gw[4][2] = {{1, 1}, {4, 16}, {3, 100}, {2, 8}};
    struct backend *be;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    uint64_t s = 77;
    // per sequence: Q, K, V rows [len][...] at positions 0 .. len-1 (double)
    double *Q[3], *K[3], *Vv[3];
    for (int q = 0; q < 3; q++) {
        Q[q] = malloc(sizeof(double) * len[q] * H * D);
        K[q] = malloc(sizeof(double) * len[q] * HK * D);
        Vv[q] = malloc(sizeof(double) * len[q] * HK * D);
        for (int i = 0; i < len[q] * H * D; i++)
            Q[q][i] = (float)tiny_rand(&s);
    }
    int32_t cell_pos[NKV], cell_sq[NKV];
    for (int c0 = 0, q = 0; q < 3; q++)
        for (int p = 0; p < len[q]; p++, c0++) {
            cell_pos[c0] = p;
            cell_sq[c0] = q;
        }
    for (int c0 = 220; c0 < NKV; c0++)
        cell_pos[c0] = cell_sq[c0] = -1;
    for (int i = NKV - 1; i > 0; i--) { // shuffle
        const int k = (int)((tiny_rand(&s) + 1) * 0.5 * (i + 1)) % (i + 1);
        int32_t x = cell_pos[i];
        cell_pos[i] = cell_pos[k];
        cell_pos[k] = x;
        x = cell_sq[i];
        cell_sq[i] = cell_sq[k];
        cell_sq[k] = x;
    }
    uint64_t cell_seq[NKV];
    for (int c0 = 0; c0 < NKV; c0++)
        cell_seq[c0] = cell_sq[c0] < 0 ? 0 : 1ull << seqs[cell_sq[c0]];
    // tokens: sequence t % 3, positions spread over it, (G, W) t % 4 (so the
    // pairs rotate over the sequences)
    int32_t q_pos[NT], q_seq[NT], q_se[2 * NT], q_sq[NT];
    float q[NT * H * D], out[NT * H * D];
    for (int t = 0; t < NT; t++) {
        q_sq[t] = t % 3;
        q_seq[t] = seqs[q_sq[t]];
        q_pos[t] = len[q_sq[t]] - 1 - (t / 3) * len[q_sq[t]] / 6;
        q_se[2 * t] = gw[t % 4][0];
        q_se[2 * t + 1] = gw[t % 4][1];
        for (int i = 0; i < H * D; i++)
            q[t * H * D + i] = (float)Q[q_sq[t]][(size_t)q_pos[t] * H * D + i];
    }
    float kf[NKV * HK * D], vf[NKV * HK * D];
    uint16_t kh[NKV * HK * D], vh[NKV * HK * D];
    double *att = malloc(sizeof(double) * 120 * H * D), worst[2] = {0, 0};
    for (int f16 = 0; f16 < 2; f16++) {
        for (int i = 0; i < NKV * HK * D; i++) {
            kf[i] = (float)tiny_rand(&s);
            vf[i] = (float)tiny_rand(&s);
            kh[i] = quant_f32_to_fp16(kf[i]);
            vh[i] = quant_f32_to_fp16(vf[i]);
        }
        for (int c0 = 0; c0 < NKV; c0++) // the reference's rows: the cache's values
            for (int i = 0; cell_sq[c0] >= 0 && i < HK * D; i++) {
                const size_t e = (size_t)c0 * HK * D + i, o = (size_t)cell_pos[c0] * HK * D + i;
                K[cell_sq[c0]][o] = f16 ? quant_fp16_to_f32(kh[e]) : kf[e];
                Vv[cell_sq[c0]][o] = f16 ? quant_fp16_to_f32(vh[e]) : vf[e];
            }
        const enum ggml_type ty = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
        struct attn_args a = {
            .out = out,
            .q = q,
            .k = f16 ? (const void *)kh : kf,
            .v = f16 ? (const void *)vh : vf,
            .type_k = ty,
            .type_v = ty,
            .cell_pos = cell_pos,
            .cell_seq = cell_seq,
            .seq_words = 1,
            .q_pos = q_pos,
            .q_seq = q_seq,
            .n_tok = NT,
            .n_kv = NKV,
            .n_head = H,
            .n_head_kv = HK,
            .head_dim = D,
            .head_dim_v = D,
            .scale = 1.0f / sqrtf((float)D),
            .rope = &rp,
            .se_g = 1,
            .se_w = 1,
            .q_se = q_se,
        };
        cr_assert_eq(be->ops->attention(be, &a), 0, "%s", be->err.msg);
        int32_t pos[120];
        for (int p = 0; p < 120; p++)
            pos[p] = p;
        for (int t = 0; t < NT; t++) {
            const int sq = q_sq[t];
            ref_attention(&c, &r, Q[sq], K[sq], Vv[sq], pos, len[sq], q_se[2 * t], q_se[2 * t + 1],
                          att);
            for (int i = 0; i < H * D; i++) {
                const double e = fabs(out[t * H * D + i] - att[(size_t)q_pos[t] * H * D + i]);
                worst[f16] = fmax(worst[f16], e);
                cr_expect_leq(e, 2e-6, "%s cache, token %d (seq %d pos %d G %d W %d) [%d]: %g",
                              f16 ? "f16" : "f32", t, q_seq[t], q_pos[t], q_se[2 * t],
                              q_se[2 * t + 1], i, e);
            }
        }
    }
    cr_log_info("op with (G, W) per token vs float64: worst |error| f32 cache %.3g, f16 cache "
                "%.3g (tol 2e-6)\n",
                worst[0], worst[1]);
    for (int k = 0; k < 3; k++) {
        free(Q[k]);
        free(K[k]);
        free(Vv[k]);
    }
    free(att);
    backend_destroy(be);
}
