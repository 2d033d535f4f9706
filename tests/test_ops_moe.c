// The CPU backend's mixture-of-experts ops (host/backend/cpu_moe.c) against
// their contracts in host/ops/backend.h: moe_route against softmax and top-k
// computed here in double for the three gatings (hand cases, ties, k =
// n_expert, -inf and NaN logits for softmax_weight, an unknown gating
// refused); moe_ffn against a float64 reference on F32 weights (SwiGLU and
// swiglu_oai, with and without per-expert biases, k = n_expert, an unknown
// act refused), and, on quantized weights, against the
// dense ops composed token by token (which it must equal bit for bit), with
// batch and thread-count invariance; add_sigmoid_scaled (the qwen2moe shared
// expert's gate) against its formula in double.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/types.h"
#include "host/ops/backend.h"
#include "tests/cpu_op_helpers.h"
#include "tests/gate_ref.h"

static void softmax_d(double *p, const float *l, int n) {
    double mx = -INFINITY, s = 0.0;
    for (int i = 0; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++)
        s += (p[i] = exp((double)l[i] - mx));
    for (int i = 0; i < n; i++)
        p[i] /= s;
}

Test(moe, route_hand) {
    struct backend *be = mk_backend(1);
    const float logits[2][4] = {{1.0f, 3.0f, 2.0f, 0.0f}, {-1.0f, -1.0f, 5.0f, 4.5f}};
    for (int renorm = 0; renorm < 2; renorm++) {
        int32_t ids[2][2];
        float w[2][2];
        const enum moe_gating gating = renorm ? MOE_GATING_SOFTMAX_RENORM : MOE_GATING_SOFTMAX;
        cr_assert_eq(be->ops->moe_route(be, &ids[0][0], &w[0][0], &logits[0][0], 2, 4, 2, gating),
                     0, "%s", be->err.msg);
        const int want[2][2] = {{1, 2}, {2, 3}};
        double worst = 0.0;
        for (int t = 0; t < 2; t++) {
            double p[4];
            softmax_d(p, logits[t], 4);
            const double s = renorm ? p[want[t][0]] + p[want[t][1]] : 1.0;
            for (int j = 0; j < 2; j++) {
                cr_expect_eq(ids[t][j], want[t][j], "token %d slot %d: expert %d, want %d", t, j,
                             ids[t][j], want[t][j]);
                const double e = fabs(w[t][j] - p[want[t][j]] / s);
                worst = e > worst ? e : worst;
            }
        }
        // float exps and one float scale: a few ulps of 1
        cr_expect_lt(worst, 1e-6, "renorm %d: worst weight error %g", renorm, worst);
    }
    backend_destroy(be);
}

Test(moe, route_ties_and_all_experts) {
    struct backend *be = mk_backend(1);
    float eq[8];
    for (int i = 0; i < 8; i++)
        eq[i] = 0.25f;
    int32_t ids[8];
    float w[8];
    cr_assert_eq(be->ops->moe_route(be, ids, w, eq, 1, 8, 3, MOE_GATING_SOFTMAX), 0, "%s",
                 be->err.msg);
    for (int j = 0; j < 3; j++) {
        cr_expect_eq(ids[j], j, "equal logits: slot %d got expert %d, want the lower index", j,
                     ids[j]);
        cr_expect_float_eq(w[j], 0.125f, 1e-7f, "slot %d weight %g", j, w[j]);
    }
    cr_assert_eq(be->ops->moe_route(be, ids, w, eq, 1, 8, 3, MOE_GATING_SOFTMAX_RENORM), 0);
    for (int j = 0; j < 3; j++)
        cr_expect_float_eq(w[j], 1.0f / 3.0f, 1e-7f, "renormalised slot %d weight %g", j, w[j]);
    // k = n_expert: every expert, by descending probability; renormalised,
    // the weights are the softmax itself.
    const float l[8] = {0.5f, -2.0f, 3.0f, 0.5f, 1.0f, -0.25f, 2.0f, 0.0f};
    const int order[8] = {2, 6, 4, 0, 3, 7, 5, 1};
    cr_assert_eq(be->ops->moe_route(be, ids, w, l, 1, 8, 8, MOE_GATING_SOFTMAX_RENORM), 0);
    double p[8];
    softmax_d(p, l, 8);
    for (int j = 0; j < 8; j++) {
        cr_expect_eq(ids[j], order[j], "k = n: slot %d expert %d, want %d", j, ids[j], order[j]);
        cr_expect_lt(fabs(w[j] - p[order[j]]), 1e-6, "slot %d weight %g vs %g", j, w[j],
                     p[order[j]]);
    }
    backend_destroy(be);
}

Test(moe, route_refuses_bad_k_and_gating) {
    struct backend *be = mk_backend(1);
    float l[4] = {0};
    int32_t ids[8];
    float w[8];
    cr_expect_eq(be->ops->moe_route(be, ids, w, l, 1, 4, 5, MOE_GATING_SOFTMAX), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "k 5") != NULL, "message: %s", be->err.msg);
    cr_expect_eq(be->ops->moe_route(be, ids, w, l, 1, 4, 0, MOE_GATING_SOFTMAX), VERR_RANGE);
    cr_expect_eq(be->ops->moe_route(be, ids, w, l, 1, 4, 2, (enum moe_gating)3), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "gating 3") != NULL, "message: %s", be->err.msg);
    cr_expect_eq(be->ops->moe_route(be, ids, w, l, 1, 4, 2, (enum moe_gating) - 1), VERR_RANGE);
    backend_destroy(be);
}

// SOFTMAX_WEIGHT: the k largest logits (ties to the lower index, NaN
// last), then a softmax over those k computed here in double.
static void expect_weight_route(struct backend *be, const float *l, int n, int k, const int *want) {
    int32_t ids[16];
    float w[16];
    cr_assert_eq(be->ops->moe_route(be, ids, w, l, 1, n, k, MOE_GATING_SOFTMAX_WEIGHT), 0, "%s",
                 be->err.msg);
    float chosen[16];
    double p[16], worst = 0.0;
    for (int j = 0; j < k; j++) {
        cr_expect_eq(ids[j], want[j], "softmax_weight %d of %d: slot %d expert %d, want %d", k, n,
                     j, ids[j], want[j]);
        chosen[j] = l[want[j]];
    }
    softmax_d(p, chosen, k);
    for (int j = 0; j < k; j++) {
        const double e = fabs(w[j] - p[j]);
        worst = e > worst ? e : worst;
    }
    // float exps and one float scale: a few ulps of 1
    cr_expect_lt(worst, 1e-6, "softmax_weight %d of %d: worst weight error %g", k, n, worst);
}

Test(moe, route_softmax_weight) {
    struct backend *be = mk_backend(1);
    const float l[8] = {0.5f, -2.0f, 3.0f, 0.5f, 1.0f, -0.25f, 2.0f, 0.0f};
    expect_weight_route(be, l, 8, 2, (const int[]){2, 6});
    expect_weight_route(be, l, 8, 4, (const int[]){2, 6, 4, 0});             // 0 and 3 tie: 0 first
    expect_weight_route(be, l, 8, 8, (const int[]){2, 6, 4, 0, 3, 7, 5, 1}); // k = n_expert
    float eq[8];
    for (int i = 0; i < 8; i++)
        eq[i] = -3.5f;
    expect_weight_route(be, eq, 8, 3, (const int[]){0, 1, 2}); // each 1/3
    const float inf[4] = {-INFINITY, NAN, 1.0f, -INFINITY};
    int32_t ids[4];
    float w[4];
    cr_assert_eq(be->ops->moe_route(be, ids, w, inf, 1, 4, 4, MOE_GATING_SOFTMAX_WEIGHT), 0);
    const int want[4] = {2, 0, 3, 1}; // -inf before NaN, NaN last
    for (int j = 0; j < 4; j++)
        cr_expect_eq(ids[j], want[j], "-inf and NaN logits: slot %d expert %d, want %d", j, ids[j],
                     want[j]);
    cr_expect(isnan(w[0]), "a NaN among the chosen logits makes every weight NaN (got %g)", w[0]);
    // The weights do not depend on the other logits: hand values of
    // softmax({1, 0}) = {e / (e + 1), 1 / (e + 1)}.
    const float two[5] = {-9.0f, 1.0f, -7.0f, 0.0f, -8.0f};
    cr_assert_eq(be->ops->moe_route(be, ids, w, two, 1, 5, 2, MOE_GATING_SOFTMAX_WEIGHT), 0);
    cr_expect(ids[0] == 1 && ids[1] == 3, "ids %d %d, want 1 3", ids[0], ids[1]);
    cr_expect_lt(fabs(w[0] - 0.7310585786300049), 1e-7, "weight 0: %.9g", w[0]);
    cr_expect_lt(fabs(w[1] - 0.2689414213699951), 1e-7, "weight 1: %.9g", w[1]);
    backend_destroy(be);
}

// A random expert stack of n_expert matrices [rows][n_in] of type t.
struct stack {
    struct backend_weight w;
    float *f; // [n_expert * rows][n_in]: the values the stored rows dequantize to
};

static void stack_make(struct stack *s, enum ggml_type t, int n_expert, int rows, int n_in,
                       float amp) {
    const int64_t n_out = (int64_t)n_expert * rows;
    const size_t rb = ggml_row_bytes(t, n_in);
    float *src = malloc((size_t)n_in * sizeof(float));
    char *data = malloc(rb * (size_t)n_out);
    s->f = malloc((size_t)n_out * n_in * sizeof(float));
    cr_assert(src && data && s->f);
    for (int64_t o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            src[i] = amp * frand();
        cr_assert_eq(quant_quantize_row(t, src, data + o * rb, n_in, NULL), 0);
        cr_assert_eq(quant_dequantize_row(t, data + o * rb, s->f + o * n_in, n_in, NULL), 0);
    }
    free(src);
    s->w = (struct backend_weight){.data = data, .type = t, .n_in = n_in, .n_out = n_out};
}

static void stack_free(struct stack *s) {
    free((void *)s->w.data);
    free(s->f);
}

struct ffn_case {
    int n_expert, k, n_embd, n_ff, n_tok;
    struct stack gate, up, down;
    float *x;       // [n_tok][n_embd]
    int32_t *ids;   // [n_tok][k]
    float *weights; // [n_tok][k]
};

static void case_make(struct ffn_case *c, enum ggml_type t, int n_expert, int k, int n_embd,
                      int n_ff, int n_tok) {
    memset(c, 0, sizeof *c);
    c->n_expert = n_expert, c->k = k, c->n_embd = n_embd, c->n_ff = n_ff, c->n_tok = n_tok;
    stack_make(&c->gate, t, n_expert, n_ff, n_embd, 0.2f);
    stack_make(&c->up, t, n_expert, n_ff, n_embd, 0.2f);
    stack_make(&c->down, t, n_expert, n_embd, n_ff, 0.2f);
    c->x = malloc((size_t)n_tok * n_embd * sizeof(float));
    c->ids = malloc((size_t)n_tok * k * sizeof(int32_t));
    c->weights = malloc((size_t)n_tok * k * sizeof(float));
    float *logits = malloc((size_t)n_tok * n_expert * sizeof(float));
    cr_assert(c->x && c->ids && c->weights && logits);
    for (int i = 0; i < n_tok * n_embd; i++)
        c->x[i] = frand();
    for (int i = 0; i < n_tok * n_expert; i++)
        logits[i] = 2.0f * frand();
    struct backend *be = mk_backend(1);
    cr_assert_eq(be->ops->moe_route(be, c->ids, c->weights, logits, n_tok, n_expert, k,
                                    MOE_GATING_SOFTMAX_RENORM),
                 0);
    backend_destroy(be);
    free(logits);
}

static void case_free(struct ffn_case *c) {
    stack_free(&c->gate);
    stack_free(&c->up);
    stack_free(&c->down);
    free(c->x);
    free(c->ids);
    free(c->weights);
}

// The op's arguments for tokens [t0, t0 + n) of the case.
static struct moe_args args_of(const struct ffn_case *c, int t0, int n, float *out, float *tmp) {
    return (struct moe_args){.out = out,
                             .x = c->x + (size_t)t0 * c->n_embd,
                             .ids = c->ids + (size_t)t0 * c->k,
                             .weights = c->weights + (size_t)t0 * c->k,
                             .gate = &c->gate.w,
                             .up = &c->up.w,
                             .down = &c->down.w,
                             .n_expert = c->n_expert,
                             .k = c->k,
                             .n_tok = n,
                             .tmp = tmp};
}

// out = moe_ffn over tokens [t0, t0 + n) of the case.
static void run_ffn(struct backend *be, const struct ffn_case *c, int t0, int n, float *out) {
    float *tmp = malloc(BACKEND_MOE_TMP(n, c->k, c->n_embd, c->n_ff) * sizeof(float));
    cr_assert_not_null(tmp);
    const struct moe_args a = args_of(c, t0, n, out, tmp);
    cr_assert_eq(be->ops->moe_ffn(be, &a), 0, "%s", be->err.msg);
    free(tmp);
}

// Per-expert biases for a case (moe_args.gate_b, up_b, down_b): random,
// of the size of the matmuls' outputs.
struct biases {
    float *g, *u, *d;
};

static struct biases biases_make(const struct ffn_case *c) {
    struct biases b = {malloc((size_t)c->n_expert * c->n_ff * sizeof(float)),
                       malloc((size_t)c->n_expert * c->n_ff * sizeof(float)),
                       malloc((size_t)c->n_expert * c->n_embd * sizeof(float))};
    cr_assert(b.g && b.u && b.d);
    for (int i = 0; i < c->n_expert * c->n_ff; i++) {
        b.g[i] = 0.5f * frand();
        b.u[i] = 0.5f * frand();
    }
    for (int i = 0; i < c->n_expert * c->n_embd; i++)
        b.d[i] = 0.5f * frand();
    return b;
}

// swiglu_oai in double (its float steps: tests/test_ops_moe.c's callers
// bound the difference).
static double swiglu_oai_d(double g, double u, double alpha, double limit, int *clamped) {
    const double x = g < limit ? g : limit;
    const double y = u < -limit ? -limit : u > limit ? limit : u;
    *clamped += (g > limit) + (u != y);
    return x / (1.0 + exp(-alpha * x)) * (y + 1.0);
}

// moe_ffn on F32 weights against the formula in double: with act, and with
// the biases when b.
static void expect_ffn_vs_float64(enum moe_act act, bool b, int k) {
    rng_seed(11);
    struct ffn_case c;
    case_make(&c, GGML_TYPE_F32, 8, k, 64, 96, 5);
    struct backend *be = mk_backend(0);
    const float alpha = 1.702f, limit = 0.4f; // gpt-oss's alpha; a limit the values cross
    float *out = malloc((size_t)c.n_tok * c.n_embd * sizeof(float));
    float *tmp = malloc(BACKEND_MOE_TMP(c.n_tok, c.k, c.n_embd, c.n_ff) * sizeof(float));
    struct moe_args a = args_of(&c, 0, c.n_tok, out, tmp);
    a.act = act, a.alpha = alpha, a.limit = limit;
    struct biases bb = {0};
    if (b) {
        bb = biases_make(&c);
        a.gate_b = bb.g, a.up_b = bb.u, a.down_b = bb.d;
    }
    cr_assert_eq(be->ops->moe_ffn(be, &a), 0, "%s", be->err.msg);
    double worst = 0.0, h[96], ha[96];
    int clamped = 0;
    for (int t = 0; t < c.n_tok; t++) {
        const float *x = c.x + (size_t)t * c.n_embd;
        for (int i = 0; i < c.n_embd; i++) {
            double ref = 0.0, scale = 0.0;
            for (int j = 0; j < c.k; j++) {
                const int e = c.ids[t * c.k + j];
                for (int f = 0; f < c.n_ff; f++) {
                    double g = b ? bb.g[e * c.n_ff + f] : 0.0, u = b ? bb.u[e * c.n_ff + f] : 0.0;
                    double ga = fabs(g) + fabs(u);
                    const float *gr = c.gate.f + ((size_t)e * c.n_ff + f) * c.n_embd;
                    const float *ur = c.up.f + ((size_t)e * c.n_ff + f) * c.n_embd;
                    for (int d = 0; d < c.n_embd; d++) {
                        g += (double)gr[d] * x[d];
                        u += (double)ur[d] * x[d];
                        ga += fabs((double)gr[d] * x[d]) + fabs((double)ur[d] * x[d]);
                    }
                    h[f] = act == MOE_ACT_SWIGLU_OAI ? swiglu_oai_d(g, u, alpha, limit, &clamped)
                                                     : g / (1.0 + exp(-g)) * u;
                    ha[f] = fabs(h[f]) + ga; // the gate's and up's rounding reach h
                }
                const float *dr = c.down.f + ((size_t)e * c.n_embd + i) * c.n_ff;
                double y = b ? bb.d[e * c.n_embd + i] : 0.0, ya = fabs(y);
                for (int f = 0; f < c.n_ff; f++) {
                    y += (double)dr[f] * h[f];
                    ya += fabs((double)dr[f]) * ha[f];
                }
                ref += y * c.weights[t * c.k + j];
                scale += ya * c.weights[t * c.k + j];
            }
            const double e = fabs(out[t * c.n_embd + i] - ref) / (scale + 1e-6);
            worst = e > worst ? e : worst;
        }
    }
    if (act == MOE_ACT_SWIGLU_OAI) // both clamps ran
        cr_expect_gt(clamped, 0, "no value reached the limit %g", limit);
    // float32 dots of 64 and 96 terms: ~1e-6 of the sum of magnitudes
    cr_expect_lt(worst, 1e-5,
                 "act %d, biases %d, k %d: worst error relative to the terms' "
                 "magnitudes: %g",
                 act, b, k, worst);
    cr_log_info("moe_ffn F32 act %d biases %d k %d vs float64: worst %.3g (%d clamped)", act, b, k,
                worst, clamped);
    if (b)
        free(bb.g), free(bb.u), free(bb.d);
    free(out);
    free(tmp);
    backend_destroy(be);
    case_free(&c);
}

Test(moe, ffn_f32_vs_float64) {
    expect_ffn_vs_float64(MOE_ACT_SWIGLU, false, 2);
}
Test(moe, ffn_f32_biases_vs_float64) {
    expect_ffn_vs_float64(MOE_ACT_SWIGLU, true, 2);
}
Test(moe, ffn_f32_swiglu_oai_vs_float64) {
    expect_ffn_vs_float64(MOE_ACT_SWIGLU_OAI, false, 2);
    expect_ffn_vs_float64(MOE_ACT_SWIGLU_OAI, true, 2);
    expect_ffn_vs_float64(MOE_ACT_SWIGLU_OAI, true, 8); // k = n_expert
}

// On quantized weights the op is the dense ops composed expert by expert:
// token by token through matmul_swiglu / matmul on each chosen expert's
// rows, then weighted and summed in slot order, gives the same bits.
static void expect_composition(enum ggml_type t) {
    rng_seed(100 + t);
    struct ffn_case c;
    const int dim = t == GGML_TYPE_Q4_K ? 256 : 64; // K-quants: rows of 256
    case_make(&c, t, 16, 4, dim, 2 * dim, 9);
    struct backend *be = mk_backend(3), *be1 = mk_backend(1);
    const size_t n_val = (size_t)c.n_tok * c.n_embd;
    float *out = malloc(n_val * sizeof(float)), *one = malloc(n_val * sizeof(float));
    float *ref = malloc(n_val * sizeof(float)), *h = malloc(c.n_ff * 2 * sizeof(float));
    float *y = malloc(c.n_embd * sizeof(float));
    run_ffn(be, &c, 0, c.n_tok, out);
    for (int tk = 0; tk < c.n_tok; tk++) {
        run_ffn(be1, &c, tk, 1, one + (size_t)tk * c.n_embd); // alone, one thread
        float *o = ref + (size_t)tk * c.n_embd;
        for (int j = 0; j < c.k; j++) {
            const int e = c.ids[tk * c.k + j];
            struct backend_weight g = c.gate.w, u = c.up.w, d = c.down.w;
            g.n_out = u.n_out = c.n_ff;
            d.n_out = c.n_embd;
            g.data = (const char *)g.data + (size_t)e * c.n_ff * ggml_row_bytes(t, c.n_embd);
            u.data = (const char *)u.data + (size_t)e * c.n_ff * ggml_row_bytes(t, c.n_embd);
            d.data = (const char *)d.data + (size_t)e * c.n_embd * ggml_row_bytes(t, c.n_ff);
            cr_assert_eq(
                be->ops->matmul_swiglu(be, h, h + c.n_ff, &g, &u, c.x + (size_t)tk * c.n_embd, 1),
                0);
            cr_assert_eq(be->ops->matmul(be, y, &d, h, NULL, 1), 0);
            const float w = c.weights[tk * c.k + j];
            for (int i = 0; i < c.n_embd; i++)
                o[i] = j == 0 ? y[i] * w : o[i] + y[i] * w;
        }
    }
    int bad = 0, bad_one = 0;
    for (size_t i = 0; i < n_val; i++) {
        bad += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
        bad_one += memcmp(&out[i], &one[i], sizeof(float)) != 0;
    }
    cr_expect_eq(bad, 0, "%s: %d of %zu values differ from the dense ops composed",
                 ggml_type_name(t), bad, n_val);
    cr_expect_eq(bad_one, 0,
                 "%s: %d of %zu values differ between the batch of %d on 3 threads and each "
                 "token alone on 1",
                 ggml_type_name(t), bad_one, n_val, c.n_tok);
    free(out), free(one), free(ref), free(h), free(y);
    backend_destroy(be);
    backend_destroy(be1);
    case_free(&c);
}

Test(moe, ffn_q8_0_is_the_composition) {
    expect_composition(GGML_TYPE_Q8_0);
}
Test(moe, ffn_q4_0_is_the_composition) {
    expect_composition(GGML_TYPE_Q4_0);
}
Test(moe, ffn_q4_k_is_the_composition) {
    expect_composition(GGML_TYPE_Q4_K);
}
Test(moe, ffn_f16_is_the_composition) {
    expect_composition(GGML_TYPE_F16);
}

Test(moe, ffn_refuses_bad_ids_and_shapes) {
    rng_seed(3);
    struct ffn_case c;
    case_make(&c, GGML_TYPE_F32, 4, 2, 32, 32, 2);
    struct backend *be = mk_backend(1);
    float out[64], tmp[BACKEND_MOE_TMP(2, 2, 32, 32)];
    c.ids[3] = 4;
    struct moe_args a = args_of(&c, 0, 2, out, tmp);
    cr_expect_eq(be->ops->moe_ffn(be, &a), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "token 1 slot 1: expert 4 of 4") != NULL, "message: %s",
              be->err.msg);
    c.ids[3] = 0;
    a.n_expert = 3; // 32 * 4 rows do not split into 3 experts
    cr_expect_eq(be->ops->moe_ffn(be, &a), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "do not fit 3 experts") != NULL, "message: %s", be->err.msg);
    a.n_expert = 4;
    a.act = (enum moe_act)2;
    cr_expect_eq(be->ops->moe_ffn(be, &a), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "act 2") != NULL, "message: %s", be->err.msg);
    backend_destroy(be);
    case_free(&c);
}

// add_sigmoid_scaled against its formula in double (tests/gate_ref.h: the
// gate values and the bound), then its refusals.
Test(moe, add_sigmoid_scaled_vs_float64) {
    rng_seed(32);
    enum { N_TOK = GATE_REF_N_FIXED + 14, N = 67 };
    float g[N_TOK], y[N_TOK * N], s[N_TOK * N], y0[N_TOK * N];
    for (int t = 0; t < N_TOK; t++)
        g[t] = t < GATE_REF_N_FIXED ? gate_ref_g[t] : 4.0f * frand();
    for (int i = 0; i < N_TOK * N; i++) {
        y0[i] = y[i] = 3.0f * frand();
        s[i] = 3.0f * frand();
    }
    struct backend *be = mk_backend(1);
    cr_assert_eq(be->ops->add_sigmoid_scaled(be, y, s, g, N_TOK, N), 0, "%s", be->err.msg);
    const int fails = gate_ref_check("cpu", y, y0, s, g, N_TOK, N);
    cr_expect_eq(fails, 0, "add_sigmoid_scaled: %d values outside the bound", fails);
    cr_expect_eq(be->ops->add_sigmoid_scaled(be, y, y + 5, g, 2, N), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "s overlaps y") != NULL, "message: %s", be->err.msg);
    cr_expect_eq(be->ops->add_sigmoid_scaled(be, y, s, g, -1, N), VERR_RANGE);
    cr_expect(strstr(be->err.msg, "shape -1 x 67") != NULL, "message: %s", be->err.msg);
    backend_destroy(be);
}
