// Attention sinks (struct attn_args.sinks, gpt-oss) on the CPU backend
// against a float64 formula written here: per query head h,
//   m = max(sink[h], max over the visible cells of s_c = scale q.k_c),
//   out = sum_c exp(s_c - m) v_c / (exp(sink[h] - m) + sum_c exp(s_c - m)),
// zeros for a row that sees no cell. The mask (positions, sequence sets,
// sliding windows) and exact self-extend (host/ops/selfextend.h, RoPE in
// float64 from tests/tiny_model.h) are written out again here, and K/V are
// read as the cache holds them (F16 widened, quantized rows dequantized).
// Cases: GQA, sinks from -30 to +20 (one head's sink outweighs its cells,
// one is zero), windows smaller than the cells, rows with no visible cell,
// F32 / F16 / Q8_0 / Q4_0 caches, exact self-extend with per-token (G, W),
// batches of 1 token (the decode path) and of many (the item path). Both
// paths, and the AVX2 and the plain kernels, must also agree to the bit.
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "host/backend/cpu_attention.h"
#include "host/ops/backend.h"
#include "host/ops/selfextend.h"
#include "tiny_model.h"

// Outputs are convex combinations (times a factor <= 1) of V rows with
// |v| <= 1. Float32 scores are dots of 64 products with |q k| <= 3 (about
// 8 roundings of 2^-24 each, relative, after the 1/8 scale: |ds| ~ 1e-7
// absolute), RoPE in float32 from float32 cos/sin moves q and k by a few
// 1e-7 relative, attn_exp is within 2 ulp, and the float sums over <= 400
// cells add a random walk of roundings: each output moves by well under
// 1e-6 (worst seen 6.4e-7, under self-extend). A sink ignored, counted twice or
// taken from another head moves outputs by 1e-2 and more.
#define SINK_TOL 2e-6

struct sk_case {
    const char *note;
    int n_tok, n_kv, n_head, n_head_kv, head_dim;
    enum ggml_type tk, tv;
    int window;
    int n_seq; // random layout over sequences 0 .. n_seq - 1, empty cells
    bool se;   // exact self-extend: RoPE inside, per-token (G, W)
};

static const struct sk_case cases[] = {
    {"decode f32 gqa4", 1, 300, 8, 2, 64, GGML_TYPE_F32, GGML_TYPE_F32, 0, 2, false},
    {"batch f32 gqa4", 40, 300, 8, 2, 64, GGML_TYPE_F32, GGML_TYPE_F32, 0, 2, false},
    {"decode f16 window", 3, 400, 8, 4, 64, GGML_TYPE_F16, GGML_TYPE_F16, 25, 3, false},
    {"batch f16 window", 33, 400, 8, 4, 64, GGML_TYPE_F16, GGML_TYPE_F16, 25, 3, false},
    {"decode q8_0/q4_0", 2, 260, 8, 2, 64, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 0, 2, false},
    {"batch q8_0/q4_0 window", 24, 260, 8, 2, 64, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 40, 2, false},
    {"decode self-extend", 4, 300, 8, 2, 64, GGML_TYPE_F32, GGML_TYPE_F32, 0, 2, true},
    {"batch self-extend f16", 30, 300, 8, 2, 64, GGML_TYPE_F16, GGML_TYPE_F16, 0, 2, true},
    {"batch self-extend q8_0", 30, 300, 8, 2, 64, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 0, 2, true},
};

// One sink per query head: one far above any score (its row is almost all
// sink), ones near the log of the visible cells' weight sum, zero, and ones
// far below (no effect).
static const float sink_values[8] = {20.0f, 5.0f, 2.0f, 0.0f, -1.5f, -5.0f, -30.0f, 3.25f};

static const struct tiny_rope ref_rp = {.neox = 1,
                                        .n_rot = 48,
                                        .n_ctx_orig = 64,
                                        .freq_base = 10000,
                                        .freq_scale = 1,
                                        .attn_factor = 1,
                                        .beta_fast = 32,
                                        .beta_slow = 1};
// The same RoPE as the op's params.
static struct rope_params sk_op_rope(void) {
    return (struct rope_params){.mode = ref_rp.neox ? ROPE_MODE_NEOX : ROPE_MODE_NORMAL,
                                .n_rot = ref_rp.n_rot,
                                .n_ctx_orig = ref_rp.n_ctx_orig,
                                .freq_base = (float)ref_rp.freq_base,
                                .freq_scale = (float)ref_rp.freq_scale,
                                .attn_factor = (float)ref_rp.attn_factor,
                                .beta_fast = (float)ref_rp.beta_fast,
                                .beta_slow = (float)ref_rp.beta_slow};
}

// A case's inputs: the cache as stored and as the reference reads it.
struct sk_data {
    float *q, *kf, *vf; // kf, vf: the cache's values as float
    void *k, *v;
    int32_t *cell_pos, *q_pos, *q_seq, *q_se;
    uint64_t *cell_seq;
    float sinks[8];
};

// A cache of n cells of type t from x (whose values become the decoded ones).
static void *sk_cache(float *x, enum ggml_type t, int n, int64_t row) {
    const size_t rb = ggml_row_bytes(t, row);
    char *d = malloc(rb * (size_t)n);
    for (int c = 0; c < n; c++) {
        float *xr = x + (size_t)c * row;
        cr_assert_eq(quant_quantize_row(t, xr, d + rb * c, row, NULL), 0, "quantize %s",
                     ggml_type_name(t));
        cr_assert_eq(quant_dequantize_row(t, d + rb * c, xr, row, NULL), 0, "dequantize");
    }
    return d;
}

static void sk_make(const struct sk_case *c, struct sk_data *d, uint64_t *s) {
    const int H = c->n_head, HK = c->n_head_kv, D = c->head_dim;
    const size_t nq = (size_t)c->n_tok * H * D, nk = (size_t)c->n_kv * HK * D;
    d->q = malloc(nq * sizeof(float));
    d->kf = malloc(nk * sizeof(float));
    d->vf = malloc(nk * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        d->q[i] = (float)(3.0 * tiny_rand(s));
    for (size_t i = 0; i < nk; i++) {
        d->kf[i] = (float)tiny_rand(s);
        d->vf[i] = (float)tiny_rand(s);
    }
    d->k = sk_cache(d->kf, c->tk, c->n_kv, (int64_t)HK * D);
    d->v = sk_cache(d->vf, c->tv, c->n_kv, (int64_t)HK * D);
    d->cell_pos = malloc((size_t)c->n_kv * sizeof(int32_t));
    d->cell_seq = calloc((size_t)c->n_kv, sizeof(uint64_t));
    for (int i = 0; i < c->n_kv; i++) {
        const double u = (tiny_rand(s) + 1) / 2;
        d->cell_pos[i] = u < 0.1 ? -1 : (int32_t)(u * c->n_kv);
        const int sq = (int)((tiny_rand(s) + 1) / 2 * c->n_seq) % c->n_seq;
        d->cell_seq[i] = d->cell_pos[i] < 0 ? 0 : 1ull << sq;
        if (d->cell_pos[i] >= 0 && tiny_rand(s) > 0.6) // shared with another sequence
            d->cell_seq[i] |= 1ull << ((sq + 1) % c->n_seq);
    }
    d->q_pos = malloc((size_t)c->n_tok * sizeof(int32_t));
    d->q_seq = malloc((size_t)c->n_tok * sizeof(int32_t));
    d->q_se = malloc((size_t)c->n_tok * 2 * sizeof(int32_t));
    const int gw[4][2] = {{1, 1}, {4, 16}, {3, 100}, {2, 8}};
    for (int t = 0; t < c->n_tok; t++) {
        d->q_pos[t] = (int32_t)((tiny_rand(s) + 1) / 2 * c->n_kv * 1.1);
        d->q_seq[t] = t % c->n_seq;
        d->q_se[2 * t] = gw[t % 4][0];
        d->q_se[2 * t + 1] = gw[t % 4][1];
    }
    // rows that see nothing (in batches of several tokens): a position
    // before every cell, and a sequence no cell holds
    if (c->n_tok > 1)
        d->q_pos[0] = -1;
    if (c->n_tok > 2)
        d->q_seq[2] = c->n_seq;
    memcpy(d->sinks, sink_values, sizeof d->sinks);
}

static void sk_free(struct sk_data *d) {
    free(d->q);
    free(d->kf);
    free(d->vf);
    free(d->k);
    free(d->v);
    free(d->cell_pos);
    free(d->cell_seq);
    free(d->q_pos);
    free(d->q_seq);
    free(d->q_se);
}

static struct attn_args sk_args(const struct sk_case *c, const struct sk_data *d, float *out,
                                const float *sinks) {
    static struct rope_params op_rp;
    op_rp = sk_op_rope();
    return (struct attn_args){
        .out = out,
        .q = d->q,
        .k = d->k,
        .v = d->v,
        .type_k = c->tk,
        .type_v = c->tv,
        .cell_pos = d->cell_pos,
        .cell_seq = d->cell_seq,
        .seq_words = 1,
        .q_pos = d->q_pos,
        .q_seq = d->q_seq,
        .n_tok = c->n_tok,
        .n_kv = c->n_kv,
        .window = c->window,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .head_dim = c->head_dim,
        .head_dim_v = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .rope = c->se ? &op_rp : NULL,
        .se_g = 1,
        .se_w = 1,
        .q_se = c->se ? d->q_se : NULL,
        .sinks = sinks,
    };
}

// The score of query row (t, h) against cell cc in float64: the plain dot,
// or under self-extend the near or far rotations of q and k.
static double sk_ref_score(const struct sk_case *c, const struct sk_data *d, int t, int h, int cc) {
    const int H = c->n_head, HK = c->n_head_kv, D = c->head_dim, hk = h / (H / HK);
    double q[256], k[256];
    for (int e = 0; e < D; e++) {
        q[e] = d->q[((size_t)t * H + h) * D + e];
        k[e] = d->kf[((size_t)cc * HK + hk) * D + e];
    }
    if (c->se) {
        const int32_t i = d->q_pos[t], j = d->cell_pos[cc];
        const int G = d->q_se[2 * t], W = d->q_se[2 * t + 1];
        const bool near = se_is_near(i, j, W);
        tiny_rope_head(q, near ? i : se_q_pos_far(i, G, W), &ref_rp);
        tiny_rope_head(k, near ? j : se_k_pos_far(j, G), &ref_rp);
    }
    double dot = 0;
    for (int e = 0; e < D; e++)
        dot += q[e] * k[e];
    return dot / sqrt((double)D);
}

static bool sk_ref_visible(const struct sk_case *c, const struct sk_data *d, int t, int cc) {
    const int32_t p = d->cell_pos[cc], qp = d->q_pos[t];
    return p >= 0 && p <= qp && ((d->cell_seq[cc] >> d->q_seq[t]) & 1) &&
           (c->window <= 0 || qp - p < c->window);
}

// out [n_tok][n_head][head_dim], in float64.
static void sk_reference(const struct sk_case *c, const struct sk_data *d, const float *sinks,
                         double *out) {
    const int H = c->n_head, HK = c->n_head_kv, D = c->head_dim;
    double *sc = malloc((size_t)c->n_kv * sizeof(double));
    for (int t = 0; t < c->n_tok; t++)
        for (int h = 0; h < H; h++) {
            double *o = out + ((size_t)t * H + h) * D;
            double mx = -INFINITY;
            int n_vis = 0;
            for (int cc = 0; cc < c->n_kv; cc++) {
                sc[cc] = -INFINITY;
                if (sk_ref_visible(c, d, t, cc)) {
                    sc[cc] = sk_ref_score(c, d, t, h, cc);
                    mx = fmax(mx, sc[cc]);
                    n_vis++;
                }
            }
            memset(o, 0, (size_t)D * sizeof(double));
            if (n_vis == 0)
                continue;
            if (sinks)
                mx = fmax(mx, sinks[h]);
            double sum = sinks ? exp(sinks[h] - mx) : 0.0;
            for (int cc = 0; cc < c->n_kv; cc++) {
                if (sc[cc] == -INFINITY)
                    continue;
                const double w = exp(sc[cc] - mx);
                sum += w;
                for (int e = 0; e < D; e++)
                    o[e] += w * d->vf[((size_t)cc * HK + h / (H / HK)) * D + e];
            }
            for (int e = 0; e < D; e++)
                o[e] /= sum;
        }
    free(sc);
}

static struct backend *sk_backend(bool plain) {
    cpu_attention_pin_plain(plain); // for the attention state the backend creates
    struct backend *be = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    return be;
}

// Runs case c with sinks and checks it against the formula; returns the worst
// absolute error. Also: the sinks change the output (by more than 1e-2), each
// token alone gives the very bits of the batch (decode path vs item path),
// and the plain kernels the bits of the AVX2 ones.
static double sk_check(const struct sk_case *c, struct backend *be, struct backend *plain) {
    uint64_t s = 1234 + (uint64_t)c->n_tok * 7 + (uint64_t)c->n_kv;
    struct sk_data d;
    sk_make(c, &d, &s);
    const size_t row = (size_t)c->n_head * c->head_dim, n = (size_t)c->n_tok * row;
    float *out = malloc(n * sizeof(float)), *out0 = malloc(n * sizeof(float));
    float *one = malloc(row * sizeof(float)), *outp = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    struct attn_args a = sk_args(c, &d, out, d.sinks);
    cr_assert_eq(be->ops->attention(be, &a), 0, "%s: %s", c->note, be->err.msg);
    struct attn_args a0 = sk_args(c, &d, out0, NULL);
    cr_assert_eq(be->ops->attention(be, &a0), 0, "%s: %s", c->note, be->err.msg);
    sk_reference(c, &d, d.sinks, ref);
    double worst = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs(out[i] - ref[i]);
        worst = fmax(worst, e);
        moved = fmax(moved, fabs((double)out[i] - out0[i]));
        cr_expect_leq(e, SINK_TOL, "%s: token %zu head %zu dim %zu: %.9g, want %.9g", c->note,
                      i / row, i % row / c->head_dim, i % c->head_dim, out[i], ref[i]);
    }
    cr_expect_gt(moved, 1e-2, "%s: the sinks moved the outputs by %g only", c->note, moved);
    // rows that see nothing are zeros, sinks or not
    for (size_t i = 0; i < row && c->n_tok > 1; i++)
        cr_expect_eq(out[i], 0.0f, "%s: token 0 sees nothing: [%zu] = %g", c->note, i, out[i]);
    struct attn_args ap = sk_args(c, &d, outp, d.sinks);
    cr_assert_eq(plain->ops->attention(plain, &ap), 0, "%s: %s", c->note, plain->err.msg);
    cr_expect_eq(memcmp(out, outp, n * sizeof(float)), 0, "%s: plain kernels != AVX2", c->note);
    for (int t = 0; t < c->n_tok && c->n_tok > 1; t++) {
        struct attn_args a1 = sk_args(c, &d, one, d.sinks);
        a1.n_tok = 1;
        a1.q = d.q + (size_t)t * row;
        a1.q_pos = d.q_pos + t;
        a1.q_seq = d.q_seq + t;
        a1.q_se = c->se ? d.q_se + 2 * t : NULL;
        cr_assert_eq(be->ops->attention(be, &a1), 0, "%s: %s", c->note, be->err.msg);
        cr_expect_eq(memcmp(one, out + (size_t)t * row, row * sizeof(float)), 0,
                     "%s: token %d alone != in the batch", c->note, t);
    }
    free(out);
    free(out0);
    free(one);
    free(outp);
    free(ref);
    sk_free(&d);
    return worst;
}

Test(attention_sinks, cpu_matches_the_formula) {
    struct backend *be = sk_backend(false), *plain = sk_backend(true);
    cpu_attention_pin_plain(false);
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double w = sk_check(&cases[i], be, plain);
        cr_log_info("%s: worst |out - ref| = %.3g", cases[i].note, w);
        worst = fmax(worst, w);
    }
    cr_log_info("attention sinks: worst |out - ref| = %.3g (tolerance %.3g)", worst, SINK_TOL);
    backend_destroy(be);
    backend_destroy(plain);
}

// Without sinks the formula is the plain softmax: the reference above agrees
// with the op there too (so it is the sink term, not the reference, that the
// test above checks).
Test(attention_sinks, reference_without_sinks) {
    struct backend *be = sk_backend(false);
    const struct sk_case *c = &cases[1];
    uint64_t s = 99;
    struct sk_data d;
    sk_make(c, &d, &s);
    const size_t n = (size_t)c->n_tok * c->n_head * c->head_dim;
    float *out = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double)), worst = 0;
    struct attn_args a = sk_args(c, &d, out, NULL);
    cr_assert_eq(be->ops->attention(be, &a), 0, "%s", be->err.msg);
    sk_reference(c, &d, NULL, ref);
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(out[i] - ref[i]));
    cr_expect_leq(worst, SINK_TOL, "no sinks: worst %g", worst);
    free(out);
    free(ref);
    sk_free(&d);
    backend_destroy(be);
}
