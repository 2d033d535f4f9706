// Test helper (header-only, included by test_forward.c, test_model.c,
// test_cli.c): writes a tiny llama / qwen2 model with the GGUF writer and
// evaluates the same transformer naively in float64 (plain loops, direct
// RoPE / attention / softmax) as the reference the forward pass is checked
// against. Needs no other tool than the GGUF writer and the quantizers.
#ifndef VELA_TESTS_TINY_MODEL_H
#define VELA_TESTS_TINY_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"

struct tiny_cfg {
    const char *arch; // "llama" or "qwen2" (or anything, for error tests)
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot, n_ff, n_vocab, n_ctx_train;
    float norm_eps;
    float freq_base;
    const char *scaling_type; // rope.scaling.type; NULL: absent
    float scaling_factor;     // rope.scaling.factor; 0: absent
    int orig_ctx;             // rope.scaling.original_context_length; 0: absent
    float md_attn_factor;     // rope.scaling.attn_factor; 0: absent
    bool rope_freqs;          // write rope_freqs.weight
    bool tied;                // no output.weight
    bool biases;              // Q/K/V biases (qwen2 needs them)
    bool f16_norms;           // store norm weights as F16 (the loader converts)
    enum ggml_type wtype;     // every matrix (token_embd too)
    uint64_t seed;
    bool vocab;              // SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, pieces
    const char *skip_tensor; // error tests: leave this tensor out
    const char *bad_tensor;  // error tests: write this 2-D tensor with ne1 = bad_ne1
    int64_t bad_ne1;
};

static inline void tiny_cfg_default(struct tiny_cfg *c, const char *arch) {
    memset(c, 0, sizeof *c);
    c->arch = arch;
    c->n_embd = 64;
    c->n_layer = 2;
    c->n_head = 4;
    c->n_head_kv = 2;
    c->head_dim = 16;
    c->n_rot = 16;
    c->n_ff = 96;
    c->n_vocab = 64;
    c->n_ctx_train = 128;
    c->norm_eps = 1e-5f;
    c->freq_base = 10000.0f;
    c->biases = !strcmp(arch, "qwen2");
    c->wtype = GGML_TYPE_F32;
    c->seed = 1234;
}

// K-quants need rows of 256: qwen2 with n_embd 256, n_ff 256, 4 heads of 64
// dims (all rotated) over 1 KV head, one layer, every matrix of type wtype.
static inline void tiny_cfg_kquant(struct tiny_cfg *c, enum ggml_type wtype) {
    tiny_cfg_default(c, "qwen2");
    c->n_embd = 256;
    c->n_ff = 256;
    c->n_head = 4;
    c->n_head_kv = 1;
    c->head_dim = 64;
    c->n_rot = 64;
    c->n_layer = 1;
    c->wtype = wtype;
}

struct tiny_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *ffn_norm, *wg, *wu, *wd;
};

// The weights as the model sees them (after quantize -> dequantize), row-major
// [n_out][n_in] like the file.
struct tiny_weights {
    float *tok_embd; // [n_vocab][n_embd]
    float *output;   // [n_vocab][n_embd]
    float *output_norm;
    float *rope_freqs; // [n_rot/2] or NULL
    struct tiny_layer *L;
    int n_layer;
    // blobs handed to the writer (freed after save)
    void **blobs;
    int n_blobs;
};

static inline double tiny_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0; // [-1, 1)
}

static inline float *tiny_fill(uint64_t *s, int64_t n, double center, double amp) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(center + amp * tiny_rand(s));
    return p;
}

static inline void tiny_keep(struct tiny_weights *w, void *p) {
    w->blobs = realloc(w->blobs, (size_t)(w->n_blobs + 1) * sizeof *w->blobs);
    w->blobs[w->n_blobs++] = p;
}

// Adds a matrix [n_out][n_in] of type t; replaces *vals with what the model
// will see (dequantized).
static inline int tiny_add_matrix(struct gguf_writer *wr, struct tiny_weights *w,
                                  const struct tiny_cfg *c, const char *name, enum ggml_type t,
                                  int64_t n_in, int64_t n_out, float *vals, struct verr *err) {
    if (c->skip_tensor && !strcmp(c->skip_tensor, name))
        return 0;
    int64_t ne[2] = {n_in, n_out};
    if (c->bad_tensor && !strcmp(c->bad_tensor, name))
        ne[1] = c->bad_ne1;
    size_t row = ggml_row_bytes(t, n_in);
    size_t nrows = (size_t)(ne[1] > n_out ? ne[1] : n_out);
    uint8_t *blob = calloc(nrows, row);
    for (int64_t r = 0; r < n_out; r++) {
        if (t == GGML_TYPE_F32) {
            memcpy(blob + r * row, vals + r * n_in, row);
        } else if (t == GGML_TYPE_F16) {
            uint16_t *h = (uint16_t *)(blob + r * row);
            for (int64_t i = 0; i < n_in; i++) {
                h[i] = quant_f32_to_fp16(vals[r * n_in + i]);
                vals[r * n_in + i] = quant_fp16_to_f32(h[i]);
            }
        } else {
            if (quant_quantize_row(t, vals + r * n_in, blob + r * row, n_in, err))
                return -1;
            if (quant_dequantize_row(t, blob + r * row, vals + r * n_in, n_in, err))
                return -1;
        }
    }
    tiny_keep(w, blob);
    return gguf_writer_add_tensor(wr, name, t, 2, ne, blob, err);
}

static inline int tiny_add_vector(struct gguf_writer *wr, struct tiny_weights *w,
                                  const struct tiny_cfg *c, const char *name, int64_t n,
                                  float *vals, bool f16, struct verr *err) {
    if (c->skip_tensor && !strcmp(c->skip_tensor, name))
        return 0;
    int64_t ne[1] = {n};
    if (c->bad_tensor && !strcmp(c->bad_tensor, name))
        ne[0] = c->bad_ne1;
    if (f16) {
        uint16_t *h = calloc((size_t)(ne[0] > n ? ne[0] : n), 2);
        for (int64_t i = 0; i < n; i++) {
            h[i] = quant_f32_to_fp16(vals[i]);
            vals[i] = quant_fp16_to_f32(h[i]);
        }
        tiny_keep(w, h);
        return gguf_writer_add_tensor(wr, name, GGML_TYPE_F16, 1, ne, h, err);
    }
    float *copy = calloc((size_t)(ne[0] > n ? ne[0] : n), sizeof *copy);
    memcpy(copy, vals, (size_t)n * sizeof *copy);
    tiny_keep(w, copy);
    return gguf_writer_add_tensor(wr, name, GGML_TYPE_F32, 1, ne, copy, err);
}

static inline void tiny_weights_free(struct tiny_weights *w) {
    for (int i = 0; i < w->n_blobs; i++)
        free(w->blobs[i]);
    free(w->blobs);
    for (int l = 0; l < w->n_layer; l++) {
        struct tiny_layer *L = &w->L[l];
        float *ps[] = {L->attn_norm, L->wq, L->wk,       L->wv, L->wo, L->bq,
                       L->bk,        L->bv, L->ffn_norm, L->wg, L->wu, L->wd};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            free(ps[i]);
    }
    free(w->L);
    if (w->output != w->tok_embd)
        free(w->output);
    free(w->tok_embd);
    free(w->output_norm);
    free(w->rope_freqs);
    memset(w, 0, sizeof *w);
}

static inline int tiny_write_vocab(struct gguf_writer *wr, int n_vocab) {
    char **toks = calloc((size_t)n_vocab, sizeof *toks);
    float *scores = calloc((size_t)n_vocab, sizeof *scores);
    int32_t *types = calloc((size_t)n_vocab, sizeof *types);
    for (int i = 0; i < n_vocab; i++) {
        char buf[32];
        if (i == 0) {
            snprintf(buf, sizeof buf, "<unk>");
            types[i] = 2;
        } else if (i == 1 || i == 2) {
            snprintf(buf, sizeof buf, i == 1 ? "<s>" : "</s>");
            types[i] = 3;
        } else if (i < 3 + 256) {
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
            types[i] = 6;
        } else {
            // "\xe2\x96\x81" is U+2581, SentencePiece's space
            int k = i - 259;
            snprintf(buf, sizeof buf, "\xe2\x96\x81%c%c", 'a' + k % 26, 'a' + (k / 26) % 26);
            types[i] = 1;
            scores[i] = -(float)k;
        }
        toks[i] = strdup(buf);
    }
    int rc = gguf_writer_set_str(wr, "tokenizer.ggml.model", "llama");
    rc |= gguf_writer_set_arr_str(wr, "tokenizer.ggml.tokens", (const char *const *)toks,
                                  (uint64_t)n_vocab);
    rc |= gguf_writer_set_arr(wr, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores,
                              (uint64_t)n_vocab);
    rc |= gguf_writer_set_arr(wr, "tokenizer.ggml.token_type", GGUF_VT_INT32, types,
                              (uint64_t)n_vocab);
    rc |= gguf_writer_set_u32(wr, "tokenizer.ggml.bos_token_id", 1);
    rc |= gguf_writer_set_u32(wr, "tokenizer.ggml.eos_token_id", 2);
    rc |= gguf_writer_set_u32(wr, "tokenizer.ggml.unknown_token_id", 0);
    for (int i = 0; i < n_vocab; i++)
        free(toks[i]);
    free(toks);
    free(scores);
    free(types);
    return rc;
}

// Writes the model to path and fills w with the weights the model sees.
static inline int tiny_write(const struct tiny_cfg *c, const char *path, struct tiny_weights *w,
                             struct verr *err) {
    memset(w, 0, sizeof *w);
    uint64_t s = c->seed;
    struct gguf_writer *wr = gguf_writer_new();
    char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, c->arch), key)
    int rc = gguf_writer_set_str(wr, "general.architecture", c->arch);
    rc |= gguf_writer_set_str(wr, "general.name", "tiny-test");
    rc |= gguf_writer_set_u32(wr, K("context_length"), (uint32_t)c->n_ctx_train);
    rc |= gguf_writer_set_u32(wr, K("embedding_length"), (uint32_t)c->n_embd);
    rc |= gguf_writer_set_u32(wr, K("block_count"), (uint32_t)c->n_layer);
    rc |= gguf_writer_set_u32(wr, K("feed_forward_length"), (uint32_t)c->n_ff);
    rc |= gguf_writer_set_u32(wr, K("attention.head_count"), (uint32_t)c->n_head);
    rc |= gguf_writer_set_u32(wr, K("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    if (c->head_dim * c->n_head != c->n_embd) {
        rc |= gguf_writer_set_u32(wr, K("attention.key_length"), (uint32_t)c->head_dim);
        rc |= gguf_writer_set_u32(wr, K("attention.value_length"), (uint32_t)c->head_dim);
    }
    rc |= gguf_writer_set_u32(wr, K("rope.dimension_count"), (uint32_t)c->n_rot);
    rc |= gguf_writer_set_f32(wr, K("rope.freq_base"), c->freq_base);
    rc |= gguf_writer_set_f32(wr, K("attention.layer_norm_rms_epsilon"), c->norm_eps);
    if (c->scaling_type)
        rc |= gguf_writer_set_str(wr, K("rope.scaling.type"), c->scaling_type);
    if (c->scaling_factor != 0)
        rc |= gguf_writer_set_f32(wr, K("rope.scaling.factor"), c->scaling_factor);
    if (c->orig_ctx)
        rc |= gguf_writer_set_u32(wr, K("rope.scaling.original_context_length"),
                                  (uint32_t)c->orig_ctx);
    if (c->md_attn_factor != 0)
        rc |= gguf_writer_set_f32(wr, K("rope.scaling.attn_factor"), c->md_attn_factor);
    if (c->vocab)
        rc |= tiny_write_vocab(wr, c->n_vocab);
#undef K
    if (rc) {
        gguf_writer_free(wr);
        return verr_set(err, VERR_IO, "tiny_write: setting metadata failed");
    }

    const int64_t E = c->n_embd, V = c->n_vocab, F = c->n_ff;
    const int64_t nq = (int64_t)c->n_head * c->head_dim, nk = (int64_t)c->n_head_kv * c->head_dim;
    w->n_layer = c->n_layer;
    w->L = calloc((size_t)c->n_layer, sizeof *w->L);
    w->tok_embd = tiny_fill(&s, V * E, 0, 1.0);
    if ((rc = tiny_add_matrix(wr, w, c, "token_embd.weight", c->wtype, E, V, w->tok_embd, err)))
        goto out;
    w->output_norm = tiny_fill(&s, E, 1.0, 0.1);
    if ((rc =
             tiny_add_vector(wr, w, c, "output_norm.weight", E, w->output_norm, c->f16_norms, err)))
        goto out;
    if (c->tied) {
        w->output = w->tok_embd;
    } else {
        w->output = tiny_fill(&s, V * E, 0, 2.0 * sqrt(3.0 / (double)E));
        if ((rc = tiny_add_matrix(wr, w, c, "output.weight", c->wtype, E, V, w->output, err)))
            goto out;
    }
    if (c->rope_freqs) {
        w->rope_freqs = malloc((size_t)(c->n_rot / 2) * sizeof(float));
        // Llama 3.1-like: high frequencies 1, low ones divided by up to 8.
        for (int i = 0; i < c->n_rot / 2; i++)
            w->rope_freqs[i] = 1.0f + 7.0f * (float)i / (float)(c->n_rot / 2);
        if ((rc = tiny_add_vector(wr, w, c, "rope_freqs.weight", c->n_rot / 2, w->rope_freqs, false,
                                  err)))
            goto out;
    }
    for (int l = 0; l < c->n_layer; l++) {
        struct tiny_layer *L = &w->L[l];
        char nm[96];
        const double a_in = sqrt(3.0 / (double)E), a_o = sqrt(3.0 / (double)nq),
                     a_f = sqrt(3.0 / (double)F);
#define N(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, l), nm)
        L->attn_norm = tiny_fill(&s, E, 1.0, 0.1);
        L->wq = tiny_fill(&s, nq * E, 0, a_in);
        L->wk = tiny_fill(&s, nk * E, 0, a_in);
        L->wv = tiny_fill(&s, nk * E, 0, a_in);
        L->wo = tiny_fill(&s, E * nq, 0, a_o);
        L->ffn_norm = tiny_fill(&s, E, 1.0, 0.1);
        L->wg = tiny_fill(&s, F * E, 0, a_in);
        L->wu = tiny_fill(&s, F * E, 0, a_in);
        L->wd = tiny_fill(&s, E * F, 0, a_f);
        if ((rc = tiny_add_vector(wr, w, c, N("attn_norm.weight"), E, L->attn_norm, c->f16_norms,
                                  err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("attn_q.weight"), c->wtype, E, nq, L->wq, err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("attn_k.weight"), c->wtype, E, nk, L->wk, err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("attn_v.weight"), c->wtype, E, nk, L->wv, err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("attn_output.weight"), c->wtype, nq, E, L->wo, err)))
            goto out;
        if (c->biases) {
            L->bq = tiny_fill(&s, nq, 0, 0.5);
            L->bk = tiny_fill(&s, nk, 0, 0.5);
            L->bv = tiny_fill(&s, nk, 0, 0.5);
            if ((rc = tiny_add_vector(wr, w, c, N("attn_q.bias"), nq, L->bq, false, err)) ||
                (rc = tiny_add_vector(wr, w, c, N("attn_k.bias"), nk, L->bk, false, err)) ||
                (rc = tiny_add_vector(wr, w, c, N("attn_v.bias"), nk, L->bv, false, err)))
                goto out;
        }
        if ((rc = tiny_add_vector(wr, w, c, N("ffn_norm.weight"), E, L->ffn_norm, c->f16_norms,
                                  err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("ffn_gate.weight"), c->wtype, E, F, L->wg, err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("ffn_up.weight"), c->wtype, E, F, L->wu, err)) ||
            (rc = tiny_add_matrix(wr, w, c, N("ffn_down.weight"), c->wtype, F, E, L->wd, err)))
            goto out;
#undef N
    }
    rc = gguf_writer_save(wr, path, err);
out:
    gguf_writer_free(wr);
    for (int i = 0; i < w->n_blobs; i++)
        free(w->blobs[i]);
    free(w->blobs);
    w->blobs = NULL;
    w->n_blobs = 0;
    return rc;
}

// A fresh temp path (the file is created empty; tiny_write replaces it).
static inline void tiny_temp_path(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/vela_test_%s_XXXXXX", tag);
    int fd = mkstemp(buf);
    if (fd >= 0)
        close(fd);
}

// ---------------------------------------------------------------------------
// The float64 reference

// RoPE settings of the reference, already resolved (what the model + flags mean).
struct tiny_rope {
    int neox; // 0 normal, 1 NeoX
    int n_rot;
    int n_ctx_orig;
    double freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    const float *freq_factors; // [n_rot/2] or NULL
};

static inline double tiny_corr_dim(int n_rot, int n_ctx_orig, double beta, double base) {
    return n_rot * log(n_ctx_orig / (beta * 2 * M_PI)) / (2 * log(base));
}

// Rotates the first n_rot dims of one head x[head_dim] to position pos.
static inline void tiny_rope_head(double *x, int pos, const struct tiny_rope *r) {
    double lo = floor(tiny_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->freq_base));
    double hi = ceil(tiny_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->freq_base));
    if (lo < 0)
        lo = 0;
    if (hi > r->n_rot - 1)
        hi = r->n_rot - 1;
    double mscale = r->attn_factor;
    if (r->ext_factor != 0)
        mscale *= 1 + 0.1 * log(1 / r->freq_scale);
    for (int i = 0; i < r->n_rot / 2; i++) {
        double theta_ex = pos * pow(r->freq_base, -2.0 * i / r->n_rot);
        if (r->freq_factors)
            theta_ex /= r->freq_factors[i];
        double theta_in = r->freq_scale * theta_ex, theta = theta_in;
        if (r->ext_factor != 0) {
            double y = (i - lo) / fmax(0.001, hi - lo);
            double ramp = 1 - fmin(1, fmax(0, y));
            double mix = ramp * r->ext_factor;
            theta = theta_in * (1 - mix) + theta_ex * mix;
        }
        double cs = cos(theta) * mscale, sn = sin(theta) * mscale;
        int a = r->neox ? i : 2 * i, b = r->neox ? i + r->n_rot / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * cs - x1 * sn;
        x[b] = x0 * sn + x1 * cs;
    }
}

static inline void tiny_matvec(double *out, const float *W, const double *x, int n_in, int n_out,
                               const float *bias) {
    for (int o = 0; o < n_out; o++) {
        double acc = bias ? bias[o] : 0;
        for (int i = 0; i < n_in; i++)
            acc += (double)W[(size_t)o * n_in + i] * x[i];
        out[o] = acc;
    }
}

static inline void tiny_rmsnorm(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * s * w[i];
}

// One token's feed-forward block added to its residual row xt [n_embd]:
// rms_norm, SwiGLU(gate, up), down. Scratch: xn, o [n_embd], g, u [n_ff].
static inline void tiny_ffn_residual(const struct tiny_cfg *c, const struct tiny_layer *L,
                                     double *xt, double *xn, double *g, double *u, double *o) {
    const int E = c->n_embd, F = c->n_ff;
    tiny_rmsnorm(xn, xt, L->ffn_norm, E, c->norm_eps);
    tiny_matvec(g, L->wg, xn, E, F, NULL);
    tiny_matvec(u, L->wu, xn, E, F, NULL);
    for (int i = 0; i < F; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    tiny_matvec(o, L->wd, g, F, E, NULL);
    for (int i = 0; i < E; i++)
        xt[i] += o[i];
}

// Final norm and LM head: logits [n][n_vocab] of residual rows x [n][n_embd]
// (scratch xn [n_embd]).
static inline void tiny_head_logits(const struct tiny_cfg *c, const struct tiny_weights *w,
                                    const double *x, int n, double *xn, double *logits) {
    for (int t = 0; t < n; t++) {
        tiny_rmsnorm(xn, x + (size_t)t * c->n_embd, w->output_norm, c->n_embd, c->norm_eps);
        tiny_matvec(logits + (size_t)t * c->n_vocab, w->output, xn, c->n_embd, c->n_vocab, NULL);
    }
}

// Logits [n][n_vocab] of one sequence of tokens at positions pos[0..n)
// (each token attends to the tokens before it in the list with pos <= its own).
static inline void tiny_reference(const struct tiny_cfg *c, const struct tiny_weights *w,
                                  const struct tiny_rope *r, const int32_t *tokens,
                                  const int32_t *pos, int n, double *logits) {
    const int E = c->n_embd, F = c->n_ff, H = c->n_head, HK = c->n_head_kv, D = c->head_dim;
    const int nq = H * D, nk = HK * D;
    double *x = calloc((size_t)n * E, sizeof *x);
    double *xn = malloc(sizeof(double) * E), *q = malloc(sizeof(double) * nq);
    double *K = malloc(sizeof(double) * (size_t)n * nk),
           *Vv = malloc(sizeof(double) * (size_t)n * nk);
    double *att = malloc(sizeof(double) * nq), *o = malloc(sizeof(double) * E);
    double *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F);
    double *sc = malloc(sizeof(double) * n);
    double *Q = malloc(sizeof(double) * (size_t)n * nq);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++)
            x[(size_t)t * E + i] = w->tok_embd[(size_t)tokens[t] * E + i];
    for (int l = 0; l < c->n_layer; l++) {
        const struct tiny_layer *L = &w->L[l];
        for (int t = 0; t < n; t++) {
            tiny_rmsnorm(xn, x + (size_t)t * E, L->attn_norm, E, c->norm_eps);
            tiny_matvec(Q + (size_t)t * nq, L->wq, xn, E, nq, L->bq);
            tiny_matvec(K + (size_t)t * nk, L->wk, xn, E, nk, L->bk);
            tiny_matvec(Vv + (size_t)t * nk, L->wv, xn, E, nk, L->bv);
            for (int h = 0; h < H; h++)
                tiny_rope_head(Q + (size_t)t * nq + h * D, pos[t], r);
            for (int h = 0; h < HK; h++)
                tiny_rope_head(K + (size_t)t * nk + h * D, pos[t], r);
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < H; h++) {
                int hk = h / (H / HK);
                const double *qh = Q + (size_t)t * nq + h * D;
                double mx = -INFINITY;
                for (int j = 0; j < n; j++) {
                    sc[j] = -INFINITY;
                    if (pos[j] > pos[t])
                        continue;
                    double d = 0;
                    for (int e = 0; e < D; e++)
                        d += qh[e] * K[(size_t)j * nk + hk * D + e];
                    sc[j] = d / sqrt((double)D);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                double sum = 0;
                for (int j = 0; j < n; j++) {
                    sc[j] = sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (int e = 0; e < D; e++) {
                    double acc = 0;
                    for (int j = 0; j < n; j++)
                        acc += sc[j] * Vv[(size_t)j * nk + hk * D + e];
                    att[h * D + e] = acc / sum;
                }
            }
            tiny_matvec(o, L->wo, att, nq, E, NULL);
            for (int i = 0; i < E; i++)
                x[(size_t)t * E + i] += o[i];
        }
        for (int t = 0; t < n; t++)
            tiny_ffn_residual(c, L, x + (size_t)t * E, xn, g, u, o);
    }
    tiny_head_logits(c, w, x, n, xn, logits);
    free(x);
    free(xn);
    free(q);
    free(K);
    free(Vv);
    free(att);
    free(o);
    free(g);
    free(u);
    free(sc);
    free(Q);
}

#endif
