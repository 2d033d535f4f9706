// cuda/matmul_tc.cu (the fused tensor-core GEMM of quantized weights) through
// cuda_matmul_apply, against a CPU reference of its exact arithmetic and
// against the dequant + cuBLAS path of the same call:
//   - every type it takes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL,
//     IQ4_XS, MXFP4: rows of 17-byte blocks start at any byte);
//   - odd shapes: n_out 1, 17, 130, 300 (partial row tiles), n_tok 9, 16, 33,
//     77 (partial token tiles; 16, 64 and 128 tokens per block), n_in from
//     one block to 4352 (32-element types with a last K tile shorter than
//     256; rows whose bytes are only 2-byte aligned), with bias, with
//     accumulate (out += W x), without either;
//   - more than 128 tokens (blockIdx.y token chunks), a matrix tall enough for
//     64-row blocks, and the threshold (the default / the setter);
//   - what the entry point refuses.
// Without a CUDA device every test skips itself. The emulator runs the same
// shapes (about 32 s on 2 cores).
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda/matmul.h"
#include "cuda/matmul_tc.h"
#include "gguf/quant.h"
#include "gguf/types.h"
#include "tests/gpu/raw_cuda.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

static cublasHandle_t cublas;

static void setup(void) {
    have_gpu = raw_cuda_probe();
    if (have_gpu && cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS)
        have_gpu = 0;
}

static void teardown(void) {
    if (have_gpu)
        cublasDestroy(cublas);
    cuda_matmul_tc_set_max_tok(-1);
}

TestSuite(matmul_tc, .init = setup, .fini = teardown, .timeout = 600);

// Random blocks with sensible scales (tests/rand_blocks.h): weights of
// O(0.1..1), far inside the f16 range of the decoded tile.
static uint8_t *make_weight(enum ggml_type type, int64_t n_in, int64_t n_out) {
    cr_assert_gt(ggml_row_bytes(type, n_in), 0, "%s n_in %lld", ggml_type_name(type),
                 (long long)n_in);
    return rand_blocks(type, n_in, n_out, RAND_MAGNITUDE_FIRST);
}

static float round_f16(float v) {
    return quant_fp16_to_f32(quant_f32_to_fp16(v));
}

struct tc_case {
    int64_t n_in, n_out;
    int n_tok;
    int bias, accumulate;
};

// |got - ref| <= tol[i]; logs the worst error and the worst err/tol.
static int check(const char *what, const float *ref, const float *got, const double *tol,
                 size_t n) {
    double worst = 0.0, worst_ratio = 0.0;
    size_t wi = 0;
    int fails = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = isfinite(got[i]) ? fabs((double)got[i] - (double)ref[i]) : INFINITY;
        if (e > worst) {
            worst = e;
            wi = i;
        }
        if (e / tol[i] > worst_ratio)
            worst_ratio = e / tol[i];
        if (!(e <= tol[i]) && fails++ < 5)
            cr_log_error("%s: element %zu: got %.9g, want %.9g, |err| %.3g > tol %.3g", what, i,
                         got[i], ref[i], e, tol[i]);
    }
    cr_log_info("%s: worst |err| %.3g at %zu (want %.9g), worst err/tol %.3g", what, worst, wi,
                n ? ref[wi] : 0.0, worst_ratio);
    cr_expect_eq(fails, 0, "%s: %d of %zu outputs outside the tolerance", what, fails, n);
    return fails;
}

// One cuda_matmul_apply call with the threshold at max_tok; returns out.
static float *run_apply(enum ggml_type type, const struct tc_case *c, const void *dw,
                        const float *dx, const float *db, const float *out0, int max_tok) {
    cuda_matmul_tc_set_max_tok(max_tok);
    const size_t n_o = (size_t)c->n_tok * c->n_out;
    float *dout = dev_upload(out0, n_o * sizeof(float));
    const size_t sb = cuda_matmul_scratch_bytes(type, c->n_in, c->n_out, c->n_tok);
    void *scratch = dev_upload(NULL, sb);
    struct verr err = {0};
    const int rc = cuda_matmul_apply(cublas, dout, dw, type, c->n_in, c->n_out, dx, db, c->n_tok,
                                     c->accumulate, scratch, sb, 0, &err);
    cr_assert_eq(rc, 0, "cuda_matmul_apply: %s", err.msg);
    float *h = malloc(n_o * sizeof *h + 1);
    cr_assert_not_null(h);
    dev_download(h, dout, n_o * sizeof(float));
    CU(cudaFree(dout));
    CU(cudaFree(scratch));
    return h;
}

static void run_case(enum ggml_type type, const struct tc_case *c) {
    const int64_t n_in = c->n_in, n_out = c->n_out;
    const int n_tok = c->n_tok;
    const size_t rb = ggml_row_bytes(type, n_in), n_o = (size_t)n_tok * n_out;
    uint8_t *w = make_weight(type, n_in, n_out);
    float *x = malloc((size_t)n_tok * n_in * sizeof *x), *bias = malloc(n_out * sizeof *bias);
    float *out0 = malloc(n_o * sizeof *out0);
    cr_assert(x && bias && out0);
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        x[i] = nrand();
    for (int64_t o = 0; o < n_out; o++)
        bias[o] = nrand();
    for (size_t i = 0; i < n_o; i++)
        out0[i] = 4.0f * nrand();

    // Reference: the kernel's operands exactly (weights decoded by the host
    // decoder then rounded to f16, activations rounded to f16), products and
    // sums in double; then the epilogue's single f32 rounding of acc + bias
    // or out + acc.
    float *wd = malloc((size_t)n_in * n_out * sizeof *wd), *xr = malloc((size_t)n_tok * n_in * 4);
    cr_assert(wd && xr);
    struct verr err = {0};
    for (int64_t o = 0; o < n_out; o++)
        cr_assert_eq(
            quant_dequantize_row(type, w + (size_t)o * rb, wd + (size_t)o * n_in, n_in, &err), 0,
            "%s", err.msg);
    for (size_t i = 0; i < (size_t)n_in * n_out; i++)
        wd[i] = round_f16(wd[i]);
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        xr[i] = round_f16(x[i]);
    float *ref = malloc(n_o * sizeof *ref);
    double *tol = malloc(n_o * sizeof *tol), *tol_paths = malloc(n_o * sizeof *tol_paths);
    cr_assert(ref && tol && tol_paths);
    // f32 accumulation in an order unknown to the reference: rounding errors
    // walk ~sqrt(n_in) steps of 2^-24 relative to mag = sum |w x| (f16
    // operands, products exact in f32); 8 sigma. The two paths compute the
    // same f16 products, so they agree within the bound the rest of the
    // engine assumes of the GEMM (2^-10 mag: one f16 rounding of each
    // operand), checked as such.
    const double walk = 8.0 * sqrt((double)n_in) / 16777216.0;
    for (int t = 0; t < n_tok; t++) {
        for (int64_t o = 0; o < n_out; o++) {
            const float *wr = wd + (size_t)o * n_in, *xt = xr + (size_t)t * n_in;
            double acc = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n_in; i++) {
                const double p = (double)wr[i] * (double)xt[i];
                acc += p;
                mag += fabs(p);
            }
            const size_t k = (size_t)t * n_out + o;
            double extra = 0.0;
            if (c->bias) {
                ref[k] = (float)acc + bias[o];
                extra = fabs(bias[o]);
            } else if (c->accumulate) {
                ref[k] = out0[k] + (float)acc;
                extra = fabs(out0[k]);
            } else {
                ref[k] = (float)acc;
            }
            // + 2 ulps of the result for the epilogue's and the reference's
            // final roundings.
            tol[k] = walk * mag + 2.0 * (fabs(acc) + extra) / 8388608.0 + 1e-30;
            tol_paths[k] = (mag + extra) / 1024.0 + 1e-30;
        }
    }

    void *dw = dev_upload(w, rb * n_out);
    float *dx = dev_upload(x, (size_t)n_tok * n_in * sizeof(float));
    float *db = c->bias ? dev_upload(bias, n_out * sizeof(float)) : NULL;
    cuda_matmul_tc_set_max_tok(1 << 20);
    cr_assert(cuda_matmul_tc_takes(type, n_tok), "the fused path takes %s", ggml_type_name(type));
    float *fused = run_apply(type, c, dw, dx, db, out0, 1 << 20);
    float *blas = run_apply(type, c, dw, dx, db, out0, 0);

    char what[200];
    snprintf(what, sizeof what, "%s n_in %lld n_out %lld n_tok %d%s%s", ggml_type_name(type),
             (long long)n_in, (long long)n_out, n_tok, c->bias ? " +bias" : "",
             c->accumulate ? " accumulate" : "");
    char w2[240];
    snprintf(w2, sizeof w2, "fused vs reference: %s", what);
    check(w2, ref, fused, tol, n_o);
    snprintf(w2, sizeof w2, "cuBLAS vs reference: %s", what);
    check(w2, ref, blas, tol, n_o);
    snprintf(w2, sizeof w2, "fused vs cuBLAS: %s", what);
    check(w2, blas, fused, tol_paths, n_o);

    cuda_matmul_tc_set_max_tok(-1);
    CU(cudaFree(dw));
    CU(cudaFree(dx));
    if (db)
        CU(cudaFree(db));
    free(fused);
    free(blas);
    free(ref);
    free(tol);
    free(tol_paths);
    free(wd);
    free(xr);
    free(w);
    free(x);
    free(bias);
    free(out0);
}

// Shapes per type: n_out 1, 17, 130, 300 against n_tok 9, 16, 33, 77, n_in
// from one block to ~4352 (the emulator: to ~1.3k), rotating bias /
// accumulate / neither.
static void run_type(enum ggml_type type) {
    const int k = ggml_type_get(type)->block_size == 256;
    const int64_t big = k ? 4352 : 4128, mid = k ? 1536 : 1056;
    const int64_t one = k ? 256 : 32;
    const struct tc_case cases[] = {
        {one, 17, 9, 1, 0},   {big, 130, 16, 0, 0}, {mid, 300, 33, 0, 1}, {mid, 1, 77, 1, 0},
        {one, 300, 77, 0, 1}, {big, 17, 33, 1, 0},  {big, 300, 77, 1, 0}, {mid, 130, 9, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(type, &cases[i]);
}

Test(matmul_tc, q4_0) {
    REQUIRE_GPU();
    rng_seed(101);
    run_type(GGML_TYPE_Q4_0);
}
Test(matmul_tc, q4_1) {
    REQUIRE_GPU();
    rng_seed(102);
    run_type(GGML_TYPE_Q4_1);
}
Test(matmul_tc, q5_0) {
    REQUIRE_GPU();
    rng_seed(103);
    run_type(GGML_TYPE_Q5_0);
}
Test(matmul_tc, q5_1) {
    REQUIRE_GPU();
    rng_seed(104);
    run_type(GGML_TYPE_Q5_1);
}
Test(matmul_tc, q8_0) {
    REQUIRE_GPU();
    rng_seed(105);
    run_type(GGML_TYPE_Q8_0);
}
Test(matmul_tc, q4_k) {
    REQUIRE_GPU();
    rng_seed(106);
    run_type(GGML_TYPE_Q4_K);
}
Test(matmul_tc, q5_k) {
    REQUIRE_GPU();
    rng_seed(107);
    run_type(GGML_TYPE_Q5_K);
}
Test(matmul_tc, q6_k) {
    REQUIRE_GPU();
    rng_seed(108);
    run_type(GGML_TYPE_Q6_K);
}
Test(matmul_tc, q2_k) {
    REQUIRE_GPU();
    rng_seed(110);
    run_type(GGML_TYPE_Q2_K);
}
Test(matmul_tc, q3_k) {
    REQUIRE_GPU();
    rng_seed(111);
    run_type(GGML_TYPE_Q3_K);
}
Test(matmul_tc, iq4_nl) {
    REQUIRE_GPU();
    rng_seed(112);
    run_type(GGML_TYPE_IQ4_NL);
}
Test(matmul_tc, iq4_xs) {
    REQUIRE_GPU();
    rng_seed(113);
    run_type(GGML_TYPE_IQ4_XS);
}
Test(matmul_tc, mxfp4) {
    REQUIRE_GPU();
    rng_seed(114);
    run_type(GGML_TYPE_MXFP4);
}

// More than 128 tokens: blockIdx.y walks token chunks (the last partial),
// each re-reading the weights; and a matrix tall enough that the launcher
// takes 64-row blocks (ceil(n_out / 64) >= the SM count), its last block
// partial.
Test(matmul_tc, token_chunks_and_tall_matrices) {
    REQUIRE_GPU();
    rng_seed(109);
    const struct tc_case chunks = {96, 37, 150, 1, 0};
    run_case(GGML_TYPE_Q8_0, &chunks);
    const struct tc_case acc = {256, 20, 131, 0, 1};
    run_case(GGML_TYPE_Q6_K, &acc);
    int dev = 0, sms = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const struct tc_case tall = {64, (int64_t)sms * 64 + 52, 20, 1, 0};
    run_case(GGML_TYPE_Q4_0, &tall);
}

// The threshold: the setter wins, 0 disables, n_tok above it goes to cuBLAS
// (and needs the weight-slice scratch again).
Test(matmul_tc, threshold) {
    REQUIRE_GPU();
    cuda_matmul_tc_set_max_tok(-1);
    const int def = cuda_matmul_tc_max_tok();
    cr_expect_eq(def, CUDA_MATMUL_TC_MAX_TOK);
    cuda_matmul_tc_set_max_tok(64);
    cr_expect_eq(cuda_matmul_tc_max_tok(), 64);
    cr_expect(cuda_matmul_tc_takes(GGML_TYPE_Q4_K, 64));
    cr_expect(!cuda_matmul_tc_takes(GGML_TYPE_Q4_K, 65));
    cr_expect(cuda_matmul_tc_takes(GGML_TYPE_MXFP4, 64));
    cr_expect(!cuda_matmul_tc_takes(GGML_TYPE_F16, 32));
    cr_expect(!cuda_matmul_tc_takes(GGML_TYPE_IQ3_S, 32));
    const size_t act = ((size_t)64 * 4096 * 2 + 255) & ~(size_t)255;
    cr_expect_eq(cuda_matmul_scratch_bytes(GGML_TYPE_Q4_0, 4096, 4096, 64), act,
                 "the fused path needs the f16 activations only");
    cr_expect_gt(cuda_matmul_scratch_bytes(GGML_TYPE_Q4_0, 4096, 4096, 65),
                 cuda_matmul_scratch_bytes(GGML_TYPE_Q4_0, 4096, 4096, 64));
    cuda_matmul_tc_set_max_tok(0);
    cr_expect(!cuda_matmul_tc_takes(GGML_TYPE_Q4_0, 9));
    cuda_matmul_tc_set_max_tok(-1);
    cr_expect_eq(cuda_matmul_tc_max_tok(), def);
}

Test(matmul_tc, rejects_what_it_cannot_do) {
    REQUIRE_GPU();
    void *p = dev_upload(NULL, 1 << 16);
    float *out = (float *)p + 8192;
    const uint16_t *xh = (const uint16_t *)p;
    struct verr err = {0};
    cr_expect_eq(cuda_matmul_q_tc(out, p, GGML_TYPE_IQ3_S, 256, 4, xh, NULL, 9, 0, 0, &err),
                 VERR_UNSUPPORTED);
    cr_log_info("IQ3_S: %s", err.msg);
    cr_expect_eq(cuda_matmul_q_tc(out, p, GGML_TYPE_Q4_0, 33, 4, xh, NULL, 9, 0, 0, &err),
                 VERR_RANGE);
    cr_expect_eq(
        cuda_matmul_q_tc(out, (char *)p + 2, GGML_TYPE_Q4_0, 32, 4, xh, NULL, 9, 0, 0, &err),
        VERR_RANGE);
    cr_log_info("misaligned weights: %s", err.msg);
    cr_expect_eq(cuda_matmul_q_tc(out, p, GGML_TYPE_Q4_0, 32, 4, xh + 1, NULL, 9, 0, 0, &err),
                 VERR_RANGE);
    cr_expect_eq(
        cuda_matmul_q_tc(out, p, GGML_TYPE_Q4_0, 32, 4, xh, (const float *)p, 9, 1, 0, &err),
        VERR_RANGE);
    CU(cudaDeviceSynchronize());
    CU(cudaFree(p));
}
