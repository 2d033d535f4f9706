// cuda/matvec.cu's streaming mat-vec of F16/BF16 weights (cuda_mv_plan,
// CUDA_MV_STREAM), called directly: three STORE segments (one with a bias),
// ADD with a bias, SwiGLU and GeGLU, for 1, 2, 3 and 8 tokens, rows not a
// multiple of a block's warps, widths with partial items, under plans that
// give a warp one row or many, and the expert mode; against a float64 dot
// of the weights gguf/quant.c decodes. The gated epilogues must equal, bit
// for bit, the kernel's own STORE outputs put through cuda_swiglu_apply /
// cuda_geglu_apply (cuda/matvec.h: fused and unfused are the same
// arithmetic). Calls the kernel does not apply to (n_in not a multiple of 8,
// x not 16-byte aligned, activations over the plan's shared memory) run the
// one-warp-per-row kernel and must be right too; bad plans are refused.
//
// Bound: each output sums n_in float products in some order, so it is
// within n_in * 2^-24 * sum |w_i x_i| of the exact dot (the gamma_n bound;
// F16/BF16 widen exactly); asserted with a factor 2 for the bias and
// residual adds. The worst error is printed in units of that bound.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/elementwise.h"
#include "cuda/matvec.h"
#include "gguf/quant.h"
#include "gguf/types.h"
#include "tests/gpu/dot64_check.h"
#include "tests/gpu/raw_cuda.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

static void setup(void) {
    have_gpu = raw_cuda_probe();
}

TestSuite(matvec_f16, .init = setup, .timeout = 900);

static const struct cuda_mv_plan one_block = {
    .kernel = CUDA_MV_STREAM, .sm_count = 1, .smem_per_block = 232448, .blocks_per_sm = 1};
static const struct cuda_mv_plan h200 = {
    .kernel = CUDA_MV_STREAM, .sm_count = 132, .smem_per_sm = 233472, .smem_per_block = 232448};
static const struct cuda_mv_plan three_sms = {
    .kernel = CUDA_MV_STREAM, .sm_count = 3, .smem_per_block = 232448, .blocks_per_sm = 2};

// Weights of n_out rows, decoded.
struct mat {
    uint8_t *w;
    float *wd;
    void *dw;
};

static struct mat mat_new(enum ggml_type type, int64_t n_in, int64_t n_out) {
    struct mat m;
    m.w = rand_blocks(type, n_in, n_out, RAND_SIGN_FIRST);
    m.wd = malloc((size_t)(n_in * n_out) * sizeof(float) + 4);
    cr_assert_not_null(m.wd);
    cr_assert_eq(quant_dequantize_row(type, m.w, m.wd, n_in * n_out, NULL), 0);
    m.dw = dev_upload(m.w, ggml_row_bytes(type, n_in) * (size_t)n_out);
    return m;
}

static void mat_free(struct mat *m) {
    cudaFree(m->dw);
    free(m->w);
    free(m->wd);
}

// Three STORE segments (the second with a bias) in one launch, then ADD
// with a bias into a random residual, then SwiGLU and GeGLU of segments 0
// and 3 (equal n_out) against the STORE outputs through the elementwise
// ops. want_kernel: the kernel cuda_matvec_kernel must name (x aligned).
static double run_case(enum ggml_type type, int64_t n_in, int n_tok,
                       const struct cuda_mv_plan *plan, int want_kernel, bool x_offset) {
    const int64_t n_out[4] = {37, 5, 19, 37};
    struct mat m[4];
    for (int s = 0; s < 4; s++)
        m[s] = mat_new(type, n_in, n_out[s]);
    const int xo = x_offset ? 1 : 0;
    float *x = rand_vec((size_t)(n_tok * n_in) + 1), *bias = rand_vec(64);
    float *y0 = rand_vec((size_t)(n_tok * n_out[0]));
    float *dx = dev_upload(x, ((size_t)(n_tok * n_in) + 1) * 4), *db = dev_upload(bias, 64 * 4);
    float *dout[4], *got[4];
    for (int s = 0; s < 4; s++) {
        dout[s] = dev_upload(NULL, (size_t)(n_tok * n_out[s]) * 4);
        got[s] = malloc((size_t)(n_tok * n_out[s]) * 4);
        cr_assert_not_null(got[s]);
    }
    float *dy = dev_upload(y0, (size_t)(n_tok * n_out[0]) * 4);
    float *dglu = dev_upload(NULL, (size_t)(n_tok * n_out[0]) * 4);
    float *dref = dev_upload(NULL, (size_t)(n_tok * n_out[0]) * 4);
    float *glu = malloc((size_t)(n_tok * n_out[0]) * 4),
          *ref = malloc((size_t)(n_tok * n_out[0]) * 4);
    cr_assert(glu && ref);
    cr_expect_eq(cuda_matvec_kernel(type, n_in, n_tok, plan), want_kernel,
                 "%s n_in %lld n_tok %d: kernel", ggml_type_name(type), (long long)n_in, n_tok);

    struct verr err = {0};
    const float *xg = dx + xo;
    const struct cuda_mv_seg segs[3] = {
        {.out = dout[0], .w = m[0].dw, .n_out = n_out[0]},
        {.out = dout[1], .w = m[1].dw, .bias = db, .n_out = n_out[1]},
        {.out = dout[2], .w = m[2].dw, .n_out = n_out[2]}};
    cr_assert_eq(
        cuda_matvec_plan_segs(segs, 3, type, n_in, xg, n_tok, CUDA_MV_STORE, plan, false, 0, &err),
        0, "%s", err.msg);
    const struct cuda_mv_seg add = {.out = dy, .w = m[0].dw, .bias = db, .n_out = n_out[0]};
    cr_assert_eq(
        cuda_matvec_plan_segs(&add, 1, type, n_in, xg, n_tok, CUDA_MV_ADD, plan, false, 0, &err), 0,
        "%s", err.msg);
    const struct cuda_mv_seg up = {.out = dout[3], .w = m[3].dw, .n_out = n_out[3]};
    cr_assert_eq(
        cuda_matvec_plan_segs(&up, 1, type, n_in, xg, n_tok, CUDA_MV_STORE, plan, false, 0, &err),
        0, "%s", err.msg);
    for (int s = 0; s < 4; s++)
        dev_download(got[s], dout[s], (size_t)(n_tok * n_out[s]) * 4);

    double worst = 0.0;
    char what[96];
    for (int s = 0; s < 3; s++) {
        snprintf(what, sizeof what, "%s segment %d", ggml_type_name(type), s);
        for (int t = 0; t < n_tok; t++)
            for (int64_t o = 0; o < n_out[s]; o++) {
                double mag;
                double want = dot64(m[s].wd + o * n_in, x + xo + (size_t)t * n_in, n_in, &mag);
                if (s == 1) {
                    want += bias[o];
                    mag += fabs(bias[o]);
                }
                worst =
                    fmax(worst, check_out(got[s][t * n_out[s] + o], want, mag, n_in, what, t, o));
            }
    }
    float *yg = malloc((size_t)(n_tok * n_out[0]) * 4);
    cr_assert_not_null(yg);
    dev_download(yg, dy, (size_t)(n_tok * n_out[0]) * 4);
    snprintf(what, sizeof what, "%s add", ggml_type_name(type));
    for (int t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out[0]; o++) {
            double mag;
            const double want = dot64(m[0].wd + o * n_in, x + xo + (size_t)t * n_in, n_in, &mag) +
                                bias[o] + y0[t * n_out[0] + o];
            mag += fabs(bias[o]) + fabs(y0[t * n_out[0] + o]);
            worst = fmax(worst, check_out(yg[t * n_out[0] + o], want, mag, n_in, what, t, o));
        }

    // gated: equal, bit for bit, to the STORE outputs through the elementwise op
    for (int geglu = 0; geglu < 2; geglu++) {
        const enum cuda_mv_epilogue epi = geglu ? CUDA_MV_GEGLU : CUDA_MV_SWIGLU;
        const struct cuda_mv_seg gu[2] = {{.out = dglu, .w = m[0].dw, .n_out = n_out[0]},
                                          {.out = dglu, .w = m[3].dw, .n_out = n_out[0]}};
        cr_assert_eq(cuda_matvec_plan_segs(gu, 2, type, n_in, xg, n_tok, epi, plan, false, 0, &err),
                     0, "%s", err.msg);
        const int64_t n = (int64_t)n_tok * n_out[0];
        cr_assert_eq(geglu ? cuda_geglu_apply(dref, dout[0], dout[3], n, 0, &err)
                           : cuda_swiglu_apply(dref, dout[0], dout[3], n, 0, &err),
                     0, "%s", err.msg);
        dev_download(glu, dglu, (size_t)n * 4);
        dev_download(ref, dref, (size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            cr_expect(memcmp(&glu[i], &ref[i], 4) == 0,
                      "%s %s n_in %lld n_tok %d element %lld: fused %.9g, unfused %.9g",
                      ggml_type_name(type), geglu ? "geglu" : "swiglu", (long long)n_in, n_tok,
                      (long long)i, glu[i], ref[i]);
    }

    for (int s = 0; s < 4; s++) {
        mat_free(&m[s]);
        cudaFree(dout[s]);
        free(got[s]);
    }
    void *dfree[] = {dx, db, dy, dglu, dref};
    for (size_t i = 0; i < sizeof dfree / sizeof dfree[0]; i++)
        cudaFree(dfree[i]);
    free(x);
    free(bias);
    free(y0);
    free(yg);
    free(glu);
    free(ref);
    return worst;
}

// 8: one 16-byte unit per row; 200: 25 units (a partial item); 2056: 257
// units (whole items and one unit more); 4096: Llama's width.
Test(matvec_f16, streaming_against_float64) {
    REQUIRE_GPU();
    rng_seed(51);
    const enum ggml_type types[] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    const int64_t n_ins[] = {8, 200, 2056, 4096};
    const int n_toks[] = {1, 2, 3, 8};
    const struct cuda_mv_plan *plans[] = {&one_block, &h200, &three_sms};
    double worst = 0.0;
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t i = 0; i < 4; i++)
            for (size_t t = 0; t < 4; t++) {
                // every plan on the small widths, one (cycling) on the large ones
                for (size_t p = 0; p < 3; p++)
                    if (n_ins[i] <= 200 || p == (i + t) % 3)
                        worst = fmax(worst, run_case(types[ti], n_ins[i], n_toks[t], plans[p],
                                                     CUDA_MV_STREAM, false));
            }
    cr_log_info("streaming f16/bf16 matvec: worst error %.3g of the bound", worst);
}

// Calls the streaming kernel does not apply to run the other kernel, right.
Test(matvec_f16, falls_back_where_it_does_not_apply) {
    REQUIRE_GPU();
    rng_seed(52);
    const struct cuda_mv_plan small = {
        .kernel = CUDA_MV_STREAM, .sm_count = 4, .smem_per_block = 4096};
    double worst = 0.0;
    // n_in 36: rows not whole 16-byte units
    worst = fmax(worst, run_case(GGML_TYPE_F16, 36, 3, &h200, CUDA_MV_PASS, false));
    // x one float past 16-byte alignment (the kernel query assumes aligned x)
    worst = fmax(worst, run_case(GGML_TYPE_BF16, 64, 2, &h200, CUDA_MV_STREAM, true));
    // 8 tokens of 256 floats: 8 KiB over a 4 KiB limit; 1 token fits
    worst = fmax(worst, run_case(GGML_TYPE_F16, 256, 8, &small, CUDA_MV_PASS, false));
    worst = fmax(worst, run_case(GGML_TYPE_F16, 256, 1, &small, CUDA_MV_STREAM, false));
    // F32 weights: the other kernel
    cr_expect_eq(cuda_matvec_kernel(GGML_TYPE_F32, 256, 1, &h200), CUDA_MV_PASS);
    cr_expect_eq(cuda_matvec_kernel(GGML_TYPE_F16, 256, 1, NULL), CUDA_MV_PASS);
    cr_log_info("fallback: worst error %.3g of the bound", worst);
}

// Expert mode: a stack of 4 experts' matrices, 5 (token, slot) pairs, x
// rows per pair (x_div 1) and per token of 2 slots (x_div 2), STORE and
// SwiGLU (against the STORE outputs through cuda_swiglu_apply).
Test(matvec_f16, experts_against_float64) {
    REQUIRE_GPU();
    rng_seed(53);
    const int n_expert = 4, n_pairs = 5;
    const int64_t n_in = 264, n_out = 19;
    const int32_t ids[5] = {2, 0, 3, 3, 1};
    const enum ggml_type types[] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    double worst = 0.0;
    for (size_t ti = 0; ti < 2; ti++)
        for (int x_div = 1; x_div <= 2; x_div++) {
            const enum ggml_type type = types[ti];
            struct mat g = mat_new(type, n_in, n_out * n_expert),
                       u = mat_new(type, n_in, n_out * n_expert);
            float *x = rand_vec((size_t)(n_pairs * n_in));
            float *got = malloc((size_t)(n_pairs * n_out) * 4),
                  *gu = malloc((size_t)(n_pairs * n_out) * 4),
                  *ref = malloc((size_t)(n_pairs * n_out) * 4);
            cr_assert(got && gu && ref);
            float *dx = dev_upload(x, (size_t)(n_pairs * n_in) * 4);
            float *dg = dev_upload(NULL, (size_t)(n_pairs * n_out) * 4),
                  *du = dev_upload(NULL, (size_t)(n_pairs * n_out) * 4),
                  *dgu = dev_upload(NULL, (size_t)(n_pairs * n_out) * 4),
                  *dref = dev_upload(NULL, (size_t)(n_pairs * n_out) * 4);
            int32_t *dids = dev_upload(ids, sizeof ids);
            const struct cuda_mv_experts ex = {
                .ids = dids, .n_pairs = n_pairs, .n_expert = n_expert, .x_div = x_div};
            struct verr err = {0};
            const struct cuda_mv_seg sg = {.out = dg, .w = g.dw, .n_out = n_out},
                                     su = {.out = du, .w = u.dw, .n_out = n_out};
            const struct cuda_mv_seg pair[2] = {{.out = dgu, .w = g.dw, .n_out = n_out},
                                                {.out = dgu, .w = u.dw, .n_out = n_out}};
            cr_assert_eq(cuda_matvec_plan_experts(&sg, 1, type, n_in, dx, &ex, CUDA_MV_STORE,
                                                  &three_sms, 0, &err),
                         0, "%s", err.msg);
            cr_assert_eq(cuda_matvec_plan_experts(&su, 1, type, n_in, dx, &ex, CUDA_MV_STORE,
                                                  &three_sms, 0, &err),
                         0, "%s", err.msg);
            cr_assert_eq(cuda_matvec_plan_experts(pair, 2, type, n_in, dx, &ex, CUDA_MV_SWIGLU,
                                                  &three_sms, 0, &err),
                         0, "%s", err.msg);
            cr_assert_eq(cuda_swiglu_apply(dref, dg, du, n_pairs * n_out, 0, &err), 0, "%s",
                         err.msg);
            dev_download(got, dg, (size_t)(n_pairs * n_out) * 4);
            dev_download(gu, dgu, (size_t)(n_pairs * n_out) * 4);
            dev_download(ref, dref, (size_t)(n_pairs * n_out) * 4);
            for (int p = 0; p < n_pairs; p++)
                for (int64_t o = 0; o < n_out; o++) {
                    double mag;
                    const double want = dot64(g.wd + (ids[p] * n_out + o) * n_in,
                                              x + (size_t)(p / x_div) * n_in, n_in, &mag);
                    worst = fmax(worst,
                                 check_out(got[p * n_out + o], want, mag, n_in, "experts", p, o));
                    cr_expect(memcmp(&gu[p * n_out + o], &ref[p * n_out + o], 4) == 0,
                              "experts swiglu pair %d row %lld: fused %.9g, unfused %.9g", p,
                              (long long)o, gu[p * n_out + o], ref[p * n_out + o]);
                }
            mat_free(&g);
            mat_free(&u);
            void *dfree[] = {dx, dg, du, dgu, dref, dids};
            for (size_t i = 0; i < sizeof dfree / sizeof dfree[0]; i++)
                cudaFree(dfree[i]);
            free(x);
            free(got);
            free(gu);
            free(ref);
        }
    cr_log_info("streaming f16/bf16 expert matvec: worst error %.3g of the bound", worst);
}

Test(matvec_f16, rejects_bad_plans) {
    REQUIRE_GPU();
    void *p = dev_upload(NULL, 1 << 16);
    const struct cuda_mv_seg seg = {.out = (float *)p, .w = p, .n_out = 4};
    const struct cuda_mv_plan bad[] = {{.kernel = 2},
                                       {.kernel = -1},
                                       {.kernel = 1, .sm_count = -1},
                                       {.kernel = 1, .smem_per_sm = -1},
                                       {.kernel = 1, .smem_per_block = -1},
                                       {.kernel = 1, .blocks_per_sm = -1}};
    struct verr err = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(cuda_matvec_plan_segs(&seg, 1, GGML_TYPE_F16, 256, (const float *)p + 4096, 1,
                                           CUDA_MV_STORE, &bad[i], false, 0, &err),
                     VERR_RANGE, "plan %zu accepted", i);
        cr_log_info("plan %zu: %s", i, err.msg);
    }
    cudaFree(p);
}
