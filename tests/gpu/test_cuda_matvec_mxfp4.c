// cuda/matvec.cu's f32-activation mat-vec on MXFP4 weights, called
// directly: plain segments (STORE, ADD with a bias, fused SwiGLU) for 1, 3
// and 8 tokens, and the expert mode, against a float64 dot of the weights
// gguf/quant.c decodes.
//
// Bound: the kernel sums n_in float products in its own order, so each
// output is within n_in * 2^-24 * sum |w_i x_i| of the exact dot (the gamma_n
// bound; the decoded weights are exact, see test_cuda_decode.c); asserted
// with a factor 2 for the bias add and the epilogue's rounding. The worst
// error is printed in units of that bound.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

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

TestSuite(matvec_mxfp4, .init = setup, .timeout = 600);

// One STORE segment, an ADD segment with a bias, or a SwiGLU pair.
static double run_plain(enum cuda_mv_epilogue epi, int n_tok, int64_t n_in, int64_t n_out) {
    const int n_seg = epi == CUDA_MV_SWIGLU ? 2 : 1;
    const size_t rb = ggml_row_bytes(GGML_TYPE_MXFP4, n_in);
    uint8_t *w[2];
    float *wd[2];
    void *dw[2];
    for (int s = 0; s < n_seg; s++) {
        w[s] = rand_blocks(GGML_TYPE_MXFP4, n_in, n_out, RAND_SIGN_FIRST);
        wd[s] = malloc((size_t)(n_in * n_out) * sizeof(float));
        cr_assert_not_null(wd[s]);
        cr_assert_eq(quant_dequantize_row(GGML_TYPE_MXFP4, w[s], wd[s], n_in * n_out, NULL), 0);
        dw[s] = dev_upload(w[s], rb * (size_t)n_out);
    }
    float *x = rand_vec((size_t)(n_tok * n_in)), *bias = rand_vec((size_t)n_out);
    float *out0 = rand_vec((size_t)(n_tok * n_out)), *got = malloc((size_t)(n_tok * n_out) * 4);
    cr_assert_not_null(got);
    float *dx = dev_upload(x, (size_t)(n_tok * n_in) * 4),
          *db = dev_upload(bias, (size_t)n_out * 4);
    float *dout = dev_upload(out0, (size_t)(n_tok * n_out) * 4);
    struct cuda_mv_seg segs[2] = {
        {.out = dout, .w = dw[0], .bias = epi == CUDA_MV_ADD ? db : NULL, .n_out = n_out},
        {.out = dout, .w = n_seg == 2 ? dw[1] : NULL, .bias = NULL, .n_out = n_out}};
    struct verr err = {0};
    cr_assert_eq(
        cuda_matvec_segs(segs, n_seg, GGML_TYPE_MXFP4, n_in, dx, n_tok, epi, false, 0, &err), 0,
        "%s", err.msg);
    dev_download(got, dout, (size_t)(n_tok * n_out) * 4);
    double worst = 0.0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out; o++) {
            const float *xt = x + (size_t)t * n_in;
            double mag, mag1;
            double want = dot64(wd[0] + o * n_in, xt, n_in, &mag);
            if (epi == CUDA_MV_ADD) {
                want += (double)bias[o] + out0[t * n_out + o];
                mag += fabs(bias[o]) + fabs(out0[t * n_out + o]);
            } else if (epi == CUDA_MV_SWIGLU) {
                // silu(g) * u: compare g and u through the product's
                // sensitivity, |d(silu(g) u)| <= (|u| |silu'(g)| dg + |silu(g)| du)
                const double g = want, u = dot64(wd[1] + o * n_in, xt, n_in, &mag1);
                const double sg = g / (1.0 + exp(-g));
                const double dsg =
                    fabs(1.0 / (1.0 + exp(-g)) * (1.0 + g * (1.0 - 1.0 / (1.0 + exp(-g)))));
                want = sg * u;
                mag = dsg * fabs(u) * mag + fabs(sg) * mag1 + 4.0 * fabs(want) / (double)n_in;
            }
            worst = fmax(worst, check_out(got[t * n_out + o], want, mag, n_in,
                                          epi == CUDA_MV_SWIGLU ? "swiglu"
                                          : epi == CUDA_MV_ADD  ? "add"
                                                                : "store",
                                          t, o));
        }
    for (int s = 0; s < n_seg; s++) {
        cudaFree(dw[s]);
        free(w[s]);
        free(wd[s]);
    }
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dout);
    free(x);
    free(bias);
    free(out0);
    free(got);
    return worst;
}

Test(matvec_mxfp4, segments_against_float64) {
    REQUIRE_GPU();
    rng_seed(39);
    // 32: one block, rows of 17 bytes (every other row at an odd address);
    // 2880: gpt-oss-20b's width, rows of 1530 bytes (2 mod 4); 4096.
    const int64_t n_ins[] = {32, 2880, 4096};
    const int n_toks[] = {1, 3, 8};
    const enum cuda_mv_epilogue epis[] = {CUDA_MV_STORE, CUDA_MV_ADD, CUDA_MV_SWIGLU};
    double worst = 0.0;
    for (size_t i = 0; i < 3; i++)
        for (size_t t = 0; t < 3; t++)
            for (size_t e = 0; e < 3; e++)
                worst = fmax(worst, run_plain(epis[e], n_toks[t], n_ins[i], 37));
    cr_log_info("mxfp4 matvec: worst error %.3g of the bound", worst);
}

// Expert mode: a stack of 4 experts' matrices, 5 (token, slot) pairs each
// reading its own row of x (x_div 1).
Test(matvec_mxfp4, experts_against_float64) {
    REQUIRE_GPU();
    rng_seed(40);
    const int n_expert = 4, n_pairs = 5;
    const int64_t n_in = 2880, n_out = 19;
    const size_t rb = ggml_row_bytes(GGML_TYPE_MXFP4, n_in);
    uint8_t *w = rand_blocks(GGML_TYPE_MXFP4, n_in, n_out * n_expert, RAND_SIGN_FIRST);
    float *wd = malloc((size_t)(n_in * n_out * n_expert) * sizeof(float));
    cr_assert_not_null(wd);
    cr_assert_eq(quant_dequantize_row(GGML_TYPE_MXFP4, w, wd, n_in * n_out * n_expert, NULL), 0);
    const int32_t ids[5] = {2, 0, 3, 3, 1};
    float *x = rand_vec((size_t)(n_pairs * n_in)), *got = malloc((size_t)(n_pairs * n_out) * 4);
    cr_assert_not_null(got);
    void *dw = dev_upload(w, rb * (size_t)(n_out * n_expert));
    float *dx = dev_upload(x, (size_t)(n_pairs * n_in) * 4);
    float *dout = dev_upload(NULL, (size_t)(n_pairs * n_out) * 4);
    int32_t *dids = dev_upload(ids, sizeof ids);
    const struct cuda_mv_seg seg = {.out = dout, .w = dw, .bias = NULL, .n_out = n_out};
    const struct cuda_mv_experts ex = {
        .ids = dids, .n_pairs = n_pairs, .n_expert = n_expert, .x_div = 1};
    struct verr err = {0};
    cr_assert_eq(
        cuda_matvec_experts(&seg, 1, GGML_TYPE_MXFP4, n_in, dx, &ex, CUDA_MV_STORE, 0, &err), 0,
        "%s", err.msg);
    dev_download(got, dout, (size_t)(n_pairs * n_out) * 4);
    double worst = 0.0;
    for (int p = 0; p < n_pairs; p++)
        for (int64_t o = 0; o < n_out; o++) {
            double mag;
            const double want =
                dot64(wd + (ids[p] * n_out + o) * n_in, x + (size_t)p * n_in, n_in, &mag);
            worst = fmax(worst, check_out(got[p * n_out + o], want, mag, n_in, "experts", p, o));
        }
    cr_log_info("mxfp4 expert matvec: worst error %.3g of the bound", worst);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(dids);
    free(w);
    free(wd);
    free(x);
    free(got);
}
