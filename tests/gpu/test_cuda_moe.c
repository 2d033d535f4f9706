// The mixture-of-experts ops of the CUDA backend (cuda/moe.cu and the
// expert modes of the mat-vec and tensor-core kernels) against the CPU
// backend's (host/backend/cpu_moe.c), through the op table: moe_route
// (all three gatings) and moe_ffn with n_expert 8 and 128, k 2 and 8, k =
// n_expert, equal router logits (every token in the same k groups),
// swiglu_oai and per-expert biases (gpt-oss), decode batches (the expert
// mat-vecs) and prompt batches (grouped by expert on the device, the
// grouped tensor-core GEMM), F32/F16/Q8_0/Q4_0/Q4_K stacks (and a Q6_K down
// stack under Q4_K gate/up, as Q4_K_M files have), MXFP4 stacks (gpt-oss's:
// the expert mat-vecs at every batch size), act_q8 on and off.
// Besides the CPU comparison (stated tolerances, worst error logged):
// moe_ffn equals the dense CUDA ops composed expert by expert bit for bit,
// and a token's output does not depend on what else is in its batch
// (bit for bit within the decode shapes and within the prompt shapes), and
// zero biases (the unfused path) give the fused path's bits.
// add_sigmoid_scaled against its formula in double.
// Without a CUDA device every test skips itself.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/matvec.h" // CUDA_MATVEC_MAX_TOK: which path moe_ffn takes
#include "gguf/quant.h"
#include "gguf/types.h"
#include "host/ops/backend.h"
#include "tests/gate_ref.h"
#include "tests/gpu/gpu_fixture.h"
#include "tests/gpu/host_arrays.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

TestSuite(cuda_moe, .init = setup, .fini = teardown, .timeout = 900);

static void *dl(struct backend *be, const void *src, size_t bytes) {
    void *h = malloc(bytes + 1);
    cr_assert_not_null(h);
    OK(be, be->ops->sync(be));
    OK(be, be->ops->download(be, h, src, bytes));
    OK(be, be->ops->sync(be));
    return h;
}

// ---------------------------------------------------------------------------
// moe_route

// Random logits (sigma 2), or all equal (every p equal: the k lowest ids).
static void run_route_case(int n_tok, int n_expert, int k, enum moe_gating gating, bool equal) {
    float *logits = nrand_array((size_t)n_tok * n_expert, 2.0f);
    if (equal)
        for (size_t i = 0; i < (size_t)n_tok * n_expert; i++)
            logits[i] = 0.375f;
    struct dbuf bl = dbuf_new(logits, (size_t)n_tok * n_expert * sizeof(float));
    struct dbuf bi = dbuf_new(NULL, (size_t)n_tok * k * sizeof(int32_t));
    struct dbuf bw = dbuf_new(NULL, (size_t)n_tok * k * sizeof(float));
    OK(cpu, cpu->ops->moe_route(cpu, bi.c, bw.c, bl.c, n_tok, n_expert, k, gating));
    OK(gpu, gpu->ops->moe_route(gpu, bi.g, bw.g, bl.g, n_tok, n_expert, k, gating));
    int32_t *ic = dl(cpu, bi.c, bi.bytes), *ig = dl(gpu, bi.g, bi.bytes);
    float *wc = dl(cpu, bw.c, bw.bytes), *wg = dl(gpu, bw.g, bw.bytes);
    // ids: equal. Random logits leave gaps between neighbouring p far above
    // the few ulps by which the two sides' p differ, and equal p are ordered
    // by index on both.
    // weights: CUDA's expf is within 2 ulp of the correctly rounded value
    // (CUDA C Programming Guide, maximum ulp errors), glibc's within 1; the
    // double sums (different order) give the same float 1/sum but for a
    // last-bit tie; the float product and, with renorm, the float sum of k
    // terms and the division add a rounding each: 16 ulp (2^-20 relative)
    // covers them with margin.
    double worst = 0.0;
    int id_fail = 0, w_fail = 0;
    for (int i = 0; i < n_tok * k; i++) {
        if (ic[i] != ig[i] && id_fail++ < 5)
            cr_log_error("route %d x %d k %d: pair %d: cuda id %d, cpu id %d", n_tok, n_expert, k,
                         i, ig[i], ic[i]);
        const double e = fabs((double)wg[i] - wc[i]), t = fabs((double)wc[i]) / 1048576.0;
        worst = e > worst ? e : worst;
        if (e > t && w_fail++ < 5)
            cr_log_error("route %d x %d k %d: pair %d: cuda weight %.9g, cpu %.9g", n_tok, n_expert,
                         k, i, wg[i], wc[i]);
        if (equal)
            cr_expect_eq(ig[i], i % k, "equal logits: pair %d has expert %d", i, ig[i]);
    }
    cr_log_info("route %d tokens x %d experts, k %d, gating %d%s: ids equal %s, worst |weight "
                "err| %.3g",
                n_tok, n_expert, k, (int)gating, equal ? ", equal logits" : "",
                id_fail ? "NO" : "yes", worst);
    cr_expect_eq(id_fail, 0, "route: %d ids differ", id_fail);
    cr_expect_eq(w_fail, 0, "route: %d weights outside the tolerance", w_fail);
    free(ic);
    free(ig);
    free(wc);
    free(wg);
    free(logits);
    dbuf_free(&bl);
    dbuf_free(&bi);
    dbuf_free(&bw);
}

Test(cuda_moe, route) {
    REQUIRE_GPU();
    rng_seed(3201);
    static const int shapes[][3] = {{8, 2, 1},    {8, 8, 5},  {128, 8, 1}, {128, 2, 37},
                                    {128, 8, 40}, {64, 6, 3}, {1, 1, 2},   {300, 4, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int gating = MOE_GATING_SOFTMAX; gating <= MOE_GATING_SOFTMAX_WEIGHT; gating++)
            run_route_case(shapes[i][2], shapes[i][0], shapes[i][1], (enum moe_gating)gating,
                           false);
    run_route_case(3, 8, 2, MOE_GATING_SOFTMAX_RENORM, true);
    run_route_case(2, 128, 8, MOE_GATING_SOFTMAX, true);
    run_route_case(1, 8, 8, MOE_GATING_SOFTMAX_RENORM, true);
    run_route_case(3, 8, 2, MOE_GATING_SOFTMAX_WEIGHT, true);
    run_route_case(1, 8, 8, MOE_GATING_SOFTMAX_WEIGHT, true);
    run_route_case(2, 4096, 4, MOE_GATING_SOFTMAX_WEIGHT, false);
}

// SOFTMAX_WEIGHT with -inf and NaN logits: the same ids on both (-inf
// taken before NaN, NaN last, the lower index first), and an unknown gating
// refused.
Test(cuda_moe, route_weight_inf_nan) {
    REQUIRE_GPU();
    const float l[2][6] = {{-INFINITY, NAN, 1.0f, -INFINITY, NAN, 0.5f},
                           {NAN, -INFINITY, NAN, -INFINITY, -INFINITY, NAN}};
    struct dbuf bl = dbuf_new(l, sizeof l);
    struct dbuf bi = dbuf_new(NULL, 2 * 6 * sizeof(int32_t));
    struct dbuf bw = dbuf_new(NULL, 2 * 6 * sizeof(float));
    OK(cpu, cpu->ops->moe_route(cpu, bi.c, bw.c, bl.c, 2, 6, 6, MOE_GATING_SOFTMAX_WEIGHT));
    OK(gpu, gpu->ops->moe_route(gpu, bi.g, bw.g, bl.g, 2, 6, 6, MOE_GATING_SOFTMAX_WEIGHT));
    int32_t *ic = dl(cpu, bi.c, bi.bytes), *ig = dl(gpu, bi.g, bi.bytes);
    const int want[2][6] = {{2, 5, 0, 3, 1, 4}, {1, 3, 4, 0, 2, 5}};
    for (int i = 0; i < 12; i++) {
        cr_expect_eq(ic[i], want[i / 6][i % 6], "cpu: pair %d expert %d", i, ic[i]);
        cr_expect_eq(ig[i], want[i / 6][i % 6], "cuda: pair %d expert %d", i, ig[i]);
    }
    cr_expect_eq(gpu->ops->moe_route(gpu, bi.g, bw.g, bl.g, 2, 6, 6, (enum moe_gating)3),
                 VERR_RANGE);
    cr_expect(strstr(gpu->err.msg, "gating 3") != NULL, "message: %s", gpu->err.msg);
    free(ic);
    free(ig);
    dbuf_free(&bl);
    dbuf_free(&bi);
    dbuf_free(&bw);
}

// ---------------------------------------------------------------------------
// moe_ffn

struct moe_case {
    enum ggml_type t_gu, t_down;
    int n_embd, n_ff, n_expert, k, n_tok;
    bool equal; // equal router logits: every token routed to experts 0..k-1
    bool act_q8;
};

// One case's inputs on both backends: stacks, x, the CPU router's ids and
// weights (uploaded to both, so the FFN comparison does not depend on the
// router's).
struct moe_in {
    const struct moe_case *c;
    void *wg, *wu, *wd; // host copies of the stacks
    float *x;
    int32_t *ids;
    float *weights;
    struct dbuf bg, bu, bd, bx, bi, bw;
    // gpt-oss's extensions (moe_in_oai): act, and the per-expert biases
    // (gb, ub [n_expert][n_ff], db [n_expert][n_embd]) or NULL.
    enum moe_act act;
    float *gb, *ub, *db;
    struct dbuf bgb, bub, bdb;
};

#define OAI_ALPHA 1.702f // gpt-oss's
#define OAI_LIMIT 0.5f   // below gpt-oss's 7: a limit the test's values cross

static void moe_in_make(struct moe_in *in, const struct moe_case *c) {
    memset(in, 0, sizeof *in);
    in->c = c;
    const int64_t n_gu = (int64_t)c->n_expert * c->n_ff, n_dn = (int64_t)c->n_expert * c->n_embd;
    const size_t rb_gu = ggml_row_bytes(c->t_gu, c->n_embd),
                 rb_dn = ggml_row_bytes(c->t_down, c->n_ff);
    in->wg = rand_blocks(c->t_gu, c->n_embd, n_gu, RAND_MAGNITUDE_FIRST);
    in->wu = rand_blocks(c->t_gu, c->n_embd, n_gu, RAND_MAGNITUDE_FIRST);
    in->wd = rand_blocks(c->t_down, c->n_ff, n_dn, RAND_MAGNITUDE_FIRST);
    in->x = nrand_array((size_t)c->n_tok * c->n_embd, 1.0f);
    in->bg = dbuf_new(in->wg, rb_gu * n_gu);
    in->bu = dbuf_new(in->wu, rb_gu * n_gu);
    in->bd = dbuf_new(in->wd, rb_dn * n_dn);
    in->bx = dbuf_new(in->x, (size_t)c->n_tok * c->n_embd * sizeof(float));
    float *logits = nrand_array((size_t)c->n_tok * c->n_expert, 2.0f);
    if (c->equal)
        for (size_t i = 0; i < (size_t)c->n_tok * c->n_expert; i++)
            logits[i] = -1.5f;
    struct dbuf bl = dbuf_new(logits, (size_t)c->n_tok * c->n_expert * sizeof(float));
    struct dbuf bi = dbuf_new(NULL, (size_t)c->n_tok * c->k * sizeof(int32_t));
    struct dbuf bw = dbuf_new(NULL, (size_t)c->n_tok * c->k * sizeof(float));
    OK(cpu, cpu->ops->moe_route(cpu, bi.c, bw.c, bl.c, c->n_tok, c->n_expert, c->k,
                                MOE_GATING_SOFTMAX_RENORM));
    in->ids = dl(cpu, bi.c, bi.bytes);
    in->weights = dl(cpu, bw.c, bw.bytes);
    OK(gpu, gpu->ops->upload(gpu, bi.g, in->ids, bi.bytes));
    OK(gpu, gpu->ops->upload(gpu, bw.g, in->weights, bw.bytes));
    in->bi = bi;
    in->bw = bw;
    dbuf_free(&bl);
    free(logits);
}

// gpt-oss's values: rows of normal floats of sigma amp, or zeros (amp 0).
static float *bias_array(size_t n, float amp) {
    float *v = amp > 0.0f ? nrand_array(n, amp) : calloc(n, sizeof(float));
    cr_assert_not_null(v);
    return v;
}

// Switches a case's inputs to swiglu_oai (oai) and per-expert biases of
// sigma bias_amp (0: zeros; negative: none).
static void moe_in_oai(struct moe_in *in, bool oai, float bias_amp) {
    const struct moe_case *c = in->c;
    in->act = oai ? MOE_ACT_SWIGLU_OAI : MOE_ACT_SWIGLU;
    if (bias_amp < 0.0f)
        return;
    const size_t n_gu = (size_t)c->n_expert * c->n_ff, n_dn = (size_t)c->n_expert * c->n_embd;
    in->gb = bias_array(n_gu, bias_amp);
    in->ub = bias_array(n_gu, bias_amp);
    in->db = bias_array(n_dn, bias_amp);
    in->bgb = dbuf_new(in->gb, n_gu * sizeof(float));
    in->bub = dbuf_new(in->ub, n_gu * sizeof(float));
    in->bdb = dbuf_new(in->db, n_dn * sizeof(float));
}

static void moe_in_free(struct moe_in *in) {
    dbuf_free(&in->bg);
    dbuf_free(&in->bu);
    dbuf_free(&in->bd);
    dbuf_free(&in->bx);
    dbuf_free(&in->bi);
    dbuf_free(&in->bw);
    free(in->wg);
    free(in->wu);
    free(in->wd);
    free(in->x);
    free(in->ids);
    free(in->weights);
    if (in->gb) {
        dbuf_free(&in->bgb);
        dbuf_free(&in->bub);
        dbuf_free(&in->bdb);
        free(in->gb);
        free(in->ub);
        free(in->db);
    }
}

// moe_ffn on one backend over n_tok tokens starting at token t0 of the
// case's inputs; returns the output downloaded.
static float *moe_run(struct backend *be, const struct moe_in *in, int t0, int n_tok) {
    const struct moe_case *c = in->c;
    const bool g = be == gpu;
    const struct backend_weight wg = {g ? in->bg.g : in->bg.c, c->t_gu, c->n_embd,
                                      (int64_t)c->n_expert * c->n_ff};
    const struct backend_weight wu = {g ? in->bu.g : in->bu.c, c->t_gu, c->n_embd,
                                      (int64_t)c->n_expert * c->n_ff};
    const struct backend_weight wd = {g ? in->bd.g : in->bd.c, c->t_down, c->n_ff,
                                      (int64_t)c->n_expert * c->n_embd};
    float *out = NULL, *tmp = NULL;
    const size_t out_bytes = (size_t)n_tok * c->n_embd * sizeof(float);
    OK(be, be->ops->alloc(be, out_bytes, (void **)&out));
    OK(be, be->ops->alloc(be, BACKEND_MOE_TMP(n_tok, c->k, c->n_embd, c->n_ff) * sizeof(float),
                          (void **)&tmp));
    struct moe_args a = {
        .out = out,
        .x = (const float *)(g ? in->bx.g : in->bx.c) + (size_t)t0 * c->n_embd,
        .ids = (const int32_t *)(g ? in->bi.g : in->bi.c) + (size_t)t0 * c->k,
        .weights = (const float *)(g ? in->bw.g : in->bw.c) + (size_t)t0 * c->k,
        .gate = &wg,
        .up = &wu,
        .down = &wd,
        .n_expert = c->n_expert,
        .k = c->k,
        .n_tok = n_tok,
        .tmp = tmp,
        .act = in->act,
        .alpha = OAI_ALPHA,
        .limit = OAI_LIMIT,
    };
    if (in->gb) {
        a.gate_b = g ? in->bgb.g : in->bgb.c;
        a.up_b = g ? in->bub.g : in->bub.c;
        a.down_b = g ? in->bdb.g : in->bdb.c;
    }
    OK(be, be->ops->moe_ffn(be, &a));
    float *h = dl(be, out, out_bytes);
    be->ops->free(be, out);
    be->ops->free(be, tmp);
    return h;
}

static double silu(double g) {
    return g / (1.0 + exp(-g));
}

// Largest |v| of the 32-element block holding element i (the q8_1 scale).
static double amax32(const float *v, int64_t i) {
    double m = 0.0;
    for (int64_t j = i / 32 * 32; j < i / 32 * 32 + 32; j++)
        m = fabs(v[j]) > m ? fabs(v[j]) : m;
    return m;
}

// The activation h = act(g, u) and its slopes dh/dg, dh/du, for g and u
// known within eg and eu. swiglu_oai: a value cut by a limit with a margin
// above its error has slope 0; one within its error of a limit the slope on
// the inner side (the larger). *clamped counts the values a limit cut.
static double act_slopes(enum moe_act act, double g, double u, double eg, double eu, double *dg,
                         double *du, int *clamped) {
    if (act == MOE_ACT_SWIGLU) {
        const double sg = 1.0 / (1.0 + exp(-g));
        *dg = sg * (1.0 + g * (1.0 - sg)) * u;
        *du = silu(g);
        return silu(g) * u;
    }
    const double a = OAI_ALPHA, l = OAI_LIMIT;
    const double x = g < l ? g : l, y = u < -l ? -l : u > l ? l : u;
    *clamped += (g > l) + (y != u);
    const double s = 1.0 / (1.0 + exp(-a * x));
    *dg = g < l + eg ? (s + a * x * s * (1.0 - s)) * (y + 1.0) : 0.0;
    *du = fabs(u) < l + eu ? x * s : 0.0;
    return x * s * (y + 1.0);
}

// Per output: the condition M (sum over slots of |w| times the absolute
// down-projection dot and bias, plus the first-order effect of |gate| and
// |up| dot and bias magnitudes through the activation) and Q, the same sum
// with each matmul's magnitudes replaced by the worst q8_1 rounding of its
// activations (half a step, amax/254, per element, all aligned). Returns the
// number of values swiglu_oai's limits cut.
static int moe_bounds(const struct moe_in *in, const float *gd, const float *ud, const float *dd,
                      double *M, double *Q) {
    const struct moe_case *c = in->c;
    const int E = c->n_embd, F = c->n_ff;
    double *h = malloc(sizeof(double) * F), *hm = malloc(sizeof(double) * F),
           *hq = malloc(sizeof(double) * F);
    float *hf = malloc(sizeof(float) * ((size_t)F + 32));
    double *xa = malloc(sizeof(double) * E), *ha = malloc(sizeof(double) * F);
    int clamped = 0;
    for (int t = 0; t < c->n_tok; t++) {
        const float *x = in->x + (size_t)t * E;
        for (int i = 0; i < E; i++)
            xa[i] = E % 32 ? 0.0 : amax32(x, i) / 254.0;
        for (int i = 0; i < E; i++)
            M[(size_t)t * E + i] = Q[(size_t)t * E + i] = 0.0;
        for (int j = 0; j < c->k; j++) {
            const int e = in->ids[t * c->k + j];
            const double w = fabs(in->weights[t * c->k + j]);
            for (int f = 0; f < F; f++) {
                const float *gr = gd + ((size_t)e * F + f) * E, *ur = ud + ((size_t)e * F + f) * E;
                double gs = in->gb ? in->gb[(size_t)e * F + f] : 0.0;
                double us = in->ub ? in->ub[(size_t)e * F + f] : 0.0;
                double gm = fabs(gs), um = fabs(us), gq = 0, uq = 0;
                for (int i = 0; i < E; i++) {
                    gs += (double)gr[i] * x[i];
                    us += (double)ur[i] * x[i];
                    gm += fabs((double)gr[i] * x[i]);
                    um += fabs((double)ur[i] * x[i]);
                    gq += fabs((double)gr[i]) * xa[i];
                    uq += fabs((double)ur[i]) * xa[i];
                }
                double dg, du;
                // g and u within f16 rounding (the grouped GEMM) and 4x
                // the q8_1 bound of their dots
                h[f] = act_slopes(in->act, gs, us, 2e-3 * gm + 4.0 * gq, 2e-3 * um + 4.0 * uq, &dg,
                                  &du, &clamped);
                hf[f] = (float)h[f];
                hm[f] = fabs(dg) * gm + fabs(du) * um + fabs(h[f]);
                hq[f] = fabs(dg) * gq + fabs(du) * uq;
            }
            for (int f = 0; f < F; f++)
                ha[f] = F % 32 ? 0.0 : amax32(hf, f) / 254.0;
            for (int o = 0; o < E; o++) {
                const float *dr = dd + ((size_t)e * E + o) * F;
                double m = in->db ? fabs(in->db[(size_t)e * E + o]) : 0.0, q = 0;
                for (int f = 0; f < F; f++) {
                    m += fabs((double)dr[f]) * hm[f];
                    q += fabs((double)dr[f]) * (hq[f] + ha[f]);
                }
                M[(size_t)t * E + o] += w * m;
                Q[(size_t)t * E + o] += w * q;
            }
        }
    }
    free(h);
    free(hm);
    free(hq);
    free(hf);
    free(xa);
    free(ha);
    return clamped;
}

static bool q8_type(enum ggml_type t) {
    return t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16;
}

// One case against the CPU, with swiglu_oai (oai) and biases of sigma
// bias_amp (negative: none).
static void run_ffn_case_oai(const struct moe_case *c, bool oai, float bias_amp) {
    struct moe_in in;
    moe_in_make(&in, c);
    moe_in_oai(&in, oai, bias_amp);
    cpu->act_q8 = gpu->act_q8 = c->act_q8;
    float *rc = moe_run(cpu, &in, 0, c->n_tok);
    float *rg = moe_run(gpu, &in, 0, c->n_tok);
    const size_t n = (size_t)c->n_tok * c->n_embd;
    double *M = malloc(n * sizeof *M), *Q = malloc(n * sizeof *Q);
    float *gd = dequant_all(c->t_gu, in.wg, c->n_embd, (int64_t)c->n_expert * c->n_ff);
    float *ud = dequant_all(c->t_gu, in.wu, c->n_embd, (int64_t)c->n_expert * c->n_ff);
    float *dd = dequant_all(c->t_down, in.wd, c->n_ff, (int64_t)c->n_expert * c->n_embd);
    const int clamped = moe_bounds(&in, gd, ud, dd, M, Q);
    // Tolerance per output, tol = rel * M + q * Q:
    //  - f32 accumulation on both sides in different orders (the two mat-vec
    //    chains, the slot sum): a random walk of ~sqrt(n) roundings of
    //    2^-24 relative to M; 16 sqrt(n) 2^-24 (8 sigma, doubled for the two
    //    chained matmuls);
    //  - prompt batches with quantized stacks: the grouped GEMM rounds
    //    activations and weights to f16 (2^-11 each, relative per product):
    //    2^-10 M on top, as the dense GEMM's test allows;
    //  - q8_1 activations on either side (the CPU's matmuls under act_q8,
    //    the CUDA mat-vecs under act_q8): each element within half a step
    //    of its block's scale; Q adds those bounds aligned (real errors are
    //    a random walk well below it). Where both sides quantize the same
    //    values (decode, act_q8) only elements of h whose f32 values differ
    //    across a rounding boundary differ: Q covers that too.
    // A wrong expert, row, slot or weight changes outputs by O(M).
    const bool grouped =
        c->n_tok > CUDA_MATVEC_MAX_TOK && q8_type(c->t_gu) && q8_type(c->t_down); // quantized
    const bool q8 = c->act_q8 && (q8_type(c->t_gu) || q8_type(c->t_down));
    const int nmax = c->n_embd > c->n_ff ? c->n_embd : c->n_ff;
    const double rel = 16.0 * sqrt((double)nmax) / 16777216.0 + (grouped ? 1.0 / 1024 : 0.0);
    double worst = 0.0, worst_ratio = 0.0;
    int fails = 0;
    for (size_t i = 0; i < n; i++) {
        const double tol = rel * M[i] + (q8 || grouped ? Q[i] : 0.0) + 1e-6;
        const double e = isfinite(rg[i]) ? fabs((double)rg[i] - rc[i]) : INFINITY;
        worst = e > worst ? e : worst;
        worst_ratio = e / tol > worst_ratio ? e / tol : worst_ratio;
        if (e > tol && fails++ < 5)
            cr_log_error("moe_ffn: element %zu: cuda %.9g, cpu %.9g, tol %.3g", i, rg[i], rc[i],
                         tol);
    }
    char what[200];
    snprintf(what, sizeof what,
             "moe_ffn %s/%s n_embd %d n_ff %d, %d experts, k %d, %d tokens%s%s%s%s (%s)",
             ggml_type_name(c->t_gu), ggml_type_name(c->t_down), c->n_embd, c->n_ff, c->n_expert,
             c->k, c->n_tok, c->equal ? ", equal logits" : "", c->act_q8 ? ", act_q8" : "",
             oai ? ", swiglu_oai" : "", in.gb ? ", biases" : "",
             c->n_tok <= CUDA_MATVEC_MAX_TOK ? "expert mat-vec"
             : grouped                       ? "grouped GEMM"
                                             : "mat-vec over pairs");
    cr_log_info("%s: worst |err| %.3g, worst err/tol %.3g, %d values clamped", what, worst,
                worst_ratio, clamped);
    cr_expect_eq(fails, 0, "%s: %d of %zu outside the tolerance", what, fails, n);
    if (oai)
        cr_expect_gt(clamped, 0, "%s: no value reached the limit", what);

    // Batch invariance: a token's output is the same bits in a batch of
    // another size (the same path: decode shapes stay decode, prompt shapes
    // stay prompt) and position: tokens [1, 1 + m) alone.
    const int m =
        c->n_tok <= CUDA_MATVEC_MAX_TOK ? (c->n_tok > 1 ? 1 : 0) : CUDA_MATVEC_MAX_TOK + 1;
    if (m > 0 && c->n_tok > m) {
        float *sub = moe_run(gpu, &in, 1, m);
        cr_expect_eq(memcmp(sub, rg + c->n_embd, (size_t)m * c->n_embd * sizeof(float)), 0,
                     "%s: tokens 1..%d alone differ from the same tokens in the batch", what, m);
        free(sub);
    }
    cpu->act_q8 = gpu->act_q8 = false;
    free(gd);
    free(ud);
    free(dd);
    free(M);
    free(Q);
    free(rc);
    free(rg);
    moe_in_free(&in);
}

static void run_ffn_case(const struct moe_case *c) {
    run_ffn_case_oai(c, false, -1.0f);
}

#define F32 GGML_TYPE_F32
#define F16 GGML_TYPE_F16
#define Q80 GGML_TYPE_Q8_0
#define Q40 GGML_TYPE_Q4_0
#define Q4K GGML_TYPE_Q4_K
#define Q6K GGML_TYPE_Q6_K
#define MX GGML_TYPE_MXFP4

Test(cuda_moe, ffn_decode) {
    REQUIRE_GPU();
    rng_seed(3202);
    static const struct moe_case cases[] = {
        {F32, F32, 64, 96, 8, 2, 1, false, false},  {F16, F16, 64, 32, 8, 8, 3, false, false},
        {Q80, Q80, 64, 96, 8, 2, 5, false, true},   {Q40, Q40, 64, 64, 128, 8, 1, false, true},
        {Q40, Q40, 96, 64, 8, 8, 2, true, true},    {Q4K, Q4K, 256, 256, 128, 8, 1, false, true},
        {Q4K, Q6K, 256, 256, 8, 2, 8, false, true}, {Q4K, Q4K, 256, 256, 8, 2, 2, false, false},
        {Q80, Q80, 64, 32, 128, 2, 8, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_ffn_case(&cases[i]);
}

Test(cuda_moe, ffn_prompt) {
    REQUIRE_GPU();
    rng_seed(3203);
    static const struct moe_case cases[] = {
        {Q40, Q40, 64, 96, 8, 2, 40, false, true},     {Q80, Q80, 64, 64, 8, 8, 12, false, false},
        {Q4K, Q6K, 256, 256, 128, 8, 20, false, true}, {Q40, Q40, 64, 32, 8, 2, 33, true, true},
        {F32, F32, 64, 96, 8, 2, 10, false, false},    {F16, F16, 32, 64, 128, 8, 9, false, false},
        {Q4K, Q4K, 256, 256, 8, 8, 17, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_ffn_case(&cases[i]);
}

// MXFP4 stacks (gpt-oss's experts; rows of 3 and 5 blocks are 51 and 85
// bytes, so odd addresses) on the expert mat-vecs of decode batches and the
// grouped GEMM of prompt batches, f32 and q8_1 activations, plain and with
// swiglu_oai and biases.
Test(cuda_moe, ffn_mxfp4) {
    REQUIRE_GPU();
    rng_seed(3208);
    static const struct moe_case cases[] = {
        {MX, MX, 64, 96, 8, 2, 1, false, true},   {MX, MX, 96, 64, 8, 4, 3, false, false},
        {MX, MX, 96, 160, 32, 4, 8, false, true}, {MX, MX, 64, 96, 8, 2, 20, false, true},
        {MX, MX, 96, 64, 8, 4, 12, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_ffn_case(&cases[i]);
        run_ffn_case_oai(&cases[i], true, 0.5f);
    }
}

// gpt-oss's experts: per-expert biases and swiglu_oai, each alone and
// together, on every path (expert mat-vec, grouped GEMM, mat-vec over
// pairs), k = n_expert among them.
Test(cuda_moe, ffn_oai_biases) {
    REQUIRE_GPU();
    rng_seed(3206);
    static const struct moe_case cases[] = {
        {F32, F32, 64, 96, 8, 2, 3, false, false},  {Q80, Q80, 64, 96, 8, 4, 2, false, true},
        {Q40, Q40, 64, 64, 4, 4, 1, false, false},  {Q4K, Q6K, 256, 256, 8, 2, 5, false, true},
        {Q40, Q40, 64, 96, 8, 2, 20, false, true},  {Q80, Q80, 64, 64, 8, 8, 12, false, false},
        {F16, F16, 32, 64, 8, 2, 10, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_ffn_case_oai(&cases[i], true, -1.0f);
        run_ffn_case_oai(&cases[i], false, 0.5f);
        run_ffn_case_oai(&cases[i], true, 0.5f);
    }
}

// Zero biases take the unfused path (gate and up stored, then the
// activation kernel; the down bias in the combine) and give the bits of the
// fused path without biases, decode and prompt.
Test(cuda_moe, ffn_zero_biases_are_the_fused_path) {
    REQUIRE_GPU();
    rng_seed(3207);
    static const struct moe_case cases[] = {
        {Q80, Q80, 64, 96, 8, 2, 3, false, true},
        {Q4K, Q6K, 256, 256, 8, 2, 2, false, false},
        {Q40, Q40, 64, 96, 8, 2, 20, false, true},
        {F32, F32, 64, 32, 8, 2, 12, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct moe_case *c = &cases[i];
        struct moe_in in;
        moe_in_make(&in, c);
        gpu->act_q8 = c->act_q8;
        float *fused = moe_run(gpu, &in, 0, c->n_tok);
        moe_in_oai(&in, false, 0.0f);
        float *split = moe_run(gpu, &in, 0, c->n_tok);
        int diff = 0;
        for (size_t j = 0; j < (size_t)c->n_tok * c->n_embd; j++)
            diff += memcmp(&fused[j], &split[j], sizeof(float)) != 0;
        cr_log_info("moe_ffn %s, %d tokens: zero biases vs none: %d elements differ",
                    ggml_type_name(c->t_gu), c->n_tok, diff);
        cr_expect_eq(diff, 0, "%s, %d tokens: zero biases change %d elements",
                     ggml_type_name(c->t_gu), c->n_tok, diff);
        gpu->act_q8 = false;
        free(fused);
        free(split);
        moe_in_free(&in);
    }
}

// Expert e's matrix of a stack as a dense weight.
static struct backend_weight expert_w(void *stack, enum ggml_type type, int64_t n_in, int64_t rows,
                                      int e) {
    const struct backend_weight w = {
        (const char *)stack + (size_t)e * rows * ggml_row_bytes(type, n_in), type, n_in, rows};
    return w;
}

// moe_ffn against the dense CUDA ops composed, bit for bit: per slot j,
// matmul_swiglu and matmul on expert e's matrices over the tokens routed
// there (decode: one token at a time, the mat-vec with n_tok = 1 the expert
// mat-vec runs per pair; prompt: equal logits put every token in the
// groups of experts 0..k-1, and the dense GEMM of those n_tok tokens is the
// grouped GEMM's arithmetic), then scale by the slot's weight and add in
// slot order (the combine's roundings).
static void run_dense_case(const struct moe_case *c) {
    struct moe_in in;
    moe_in_make(&in, c);
    gpu->act_q8 = c->act_q8;
    float *rg = moe_run(gpu, &in, 0, c->n_tok);
    const int E = c->n_embd, F = c->n_ff;
    const int per = c->equal ? c->n_tok : 1; // tokens per dense call
    float *h = NULL, *up = NULL, *y = NULL, *acc = NULL;
    OK(gpu, gpu->ops->alloc(gpu, (size_t)per * F * sizeof(float), (void **)&h));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)per * F * sizeof(float), (void **)&up));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)per * E * sizeof(float), (void **)&y));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)per * E * sizeof(float), (void **)&acc));
    float *ref = malloc((size_t)c->n_tok * E * sizeof(float));
    for (int t0 = 0; t0 < c->n_tok; t0 += per) {
        const float *x = (const float *)in.bx.g + (size_t)t0 * E;
        for (int j = 0; j < c->k; j++) {
            const int e = in.ids[t0 * c->k + j];
            const float w = in.weights[t0 * c->k + j];
            for (int t = t0; t < t0 + per; t++)
                cr_assert(in.ids[t * c->k + j] == e && in.weights[t * c->k + j] == w);
            const struct backend_weight wg = expert_w(in.bg.g, c->t_gu, E, F, e);
            const struct backend_weight wu = expert_w(in.bu.g, c->t_gu, E, F, e);
            const struct backend_weight wd = expert_w(in.bd.g, c->t_down, F, E, e);
            OK(gpu, gpu->ops->matmul_swiglu(gpu, h, up, &wg, &wu, x, per));
            OK(gpu, gpu->ops->matmul(gpu, j ? y : acc, &wd, h, NULL, per));
            OK(gpu, gpu->ops->scale(gpu, j ? y : acc, w, (int64_t)per * E));
            if (j)
                OK(gpu, gpu->ops->add(gpu, acc, y, (int64_t)per * E));
        }
        float *r = dl(gpu, acc, (size_t)per * E * sizeof(float));
        memcpy(ref + (size_t)t0 * E, r, (size_t)per * E * sizeof(float));
        free(r);
    }
    int diff = 0;
    for (size_t i = 0; i < (size_t)c->n_tok * E; i++)
        if (memcmp(&ref[i], &rg[i], sizeof(float)) && diff++ < 5)
            cr_log_error("moe_ffn vs dense: element %zu: moe %.9g, dense %.9g", i, rg[i], ref[i]);
    cr_log_info("moe_ffn %s/%s, %d experts, k %d, %d tokens%s vs the dense ops: %d elements differ",
                ggml_type_name(c->t_gu), ggml_type_name(c->t_down), c->n_expert, c->k, c->n_tok,
                c->act_q8 ? ", act_q8" : "", diff);
    cr_expect_eq(diff, 0, "moe_ffn differs from the dense ops composed");
    gpu->act_q8 = false;
    gpu->ops->free(gpu, h);
    gpu->ops->free(gpu, up);
    gpu->ops->free(gpu, y);
    gpu->ops->free(gpu, acc);
    free(ref);
    free(rg);
    moe_in_free(&in);
}

Test(cuda_moe, ffn_equals_dense) {
    REQUIRE_GPU();
    rng_seed(3204);
    static const struct moe_case cases[] = {
        {Q4K, Q6K, 256, 256, 8, 2, 3, false, true},
        {Q40, Q40, 64, 96, 128, 8, 2, false, true},
        {F16, F32, 64, 32, 8, 2, 2, false, false},
        {Q40, Q40, 64, 96, 8, 2, 12, true, true},
        {Q4K, Q4K, 256, 256, 8, 8, 9, true, false},
        // MXFP4 decode: the q8_1 expert mat-vec equals the dense one
        // (test_cuda_matvec_q8 holds that one to the CPU's q8_1 dot)
        {MX, MX, 96, 64, 8, 2, 3, false, true},
        {MX, MX, 64, 160, 32, 4, 5, false, true},
        // MXFP4 prompt: the grouped GEMM equals the dense tensor-core GEMM
        {MX, MX, 96, 64, 8, 2, 12, true, true},
        {MX, MX, 64, 160, 8, 4, 20, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_dense_case(&cases[i]);
}

// ---------------------------------------------------------------------------
// add_sigmoid_scaled (the qwen2moe shared expert's gate)

// Against its formula in double (tests/gate_ref.h: the gate values and the
// bound, as the CPU is held to in tests/test_ops_moe.c); the CPU's result
// is compared too (logged: expf may differ by an ulp or two).
Test(cuda_moe, add_sigmoid_scaled) {
    REQUIRE_GPU();
    rng_seed(3205);
    enum { N_TOK = GATE_REF_N_FIXED + 30, N = 300 };
    float g[N_TOK];
    for (int t = 0; t < N_TOK; t++)
        g[t] = t < GATE_REF_N_FIXED ? gate_ref_g[t] : 4.0f * nrand();
    float *y0 = nrand_array((size_t)N_TOK * N, 3.0f), *s = nrand_array((size_t)N_TOK * N, 3.0f);
    const size_t bytes = (size_t)N_TOK * N * sizeof(float);
    struct dbuf by = dbuf_new(y0, bytes), bs = dbuf_new(s, bytes), bg = dbuf_new(g, sizeof g);
    OK(cpu, cpu->ops->add_sigmoid_scaled(cpu, by.c, bs.c, bg.c, N_TOK, N));
    OK(gpu, gpu->ops->add_sigmoid_scaled(gpu, by.g, bs.g, bg.g, N_TOK, N));
    float *yc = dl(cpu, by.c, bytes), *yg = dl(gpu, by.g, bytes);
    const int fails = gate_ref_check("cuda", yg, y0, s, g, N_TOK, N);
    cr_expect_eq(fails, 0, "add_sigmoid_scaled: %d values outside the bound", fails);
    double worst_cpu = 0.0;
    for (size_t k = 0; k < (size_t)N_TOK * N; k++)
        worst_cpu = fmax(worst_cpu, fabs((double)yg[k] - yc[k]));
    cr_log_info("add_sigmoid_scaled: worst |cuda - cpu| %.3g", worst_cpu);
    // s overlapping y is refused on the host
    cr_expect_eq(gpu->ops->add_sigmoid_scaled(gpu, by.g, (float *)by.g + 1, bg.g, 2, N),
                 VERR_RANGE);
    free(yc);
    free(yg);
    free(y0);
    free(s);
    dbuf_free(&by);
    dbuf_free(&bs);
    dbuf_free(&bg);
}
