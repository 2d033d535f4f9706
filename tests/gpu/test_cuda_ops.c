// The CUDA backend against the CPU reference, op by op, through the op table
// of host/ops/backend.h: the same random inputs are uploaded to both backends,
// the op runs on both, the results are downloaded and compared with a stated
// tolerance; the worst error of every comparison is logged (cr_log_info).
// Without a usable CUDA device every test skips itself (never passes).
//
// Shapes include odd sizes: plain types with n_in not a multiple of 32, rows
// not a multiple of the kernels' tiles, head dims 64..256 including 80 and
// 96, key and value head dims that differ, GQA groups of 1..8.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention.h"    // cuda_attention_scratch_bytes: the split-K plan
#include "cuda/backend_cuda.h" // the variants under test
#include "cuda/matvec.h"       // CUDA_MATVEC_MAX_TOK: which path a matmul takes
#include "gguf/quant.h"
#include "gguf/types.h"
#include "host/ops/backend.h"
#include "tests/gpu/gpu_fixture.h"
#include "tests/gpu/host_arrays.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

// ---------------------------------------------------------------------------
// fixture and helpers

TestSuite(cuda, .init = setup, .fini = teardown, .timeout = 600);

// Waits for both backends and downloads b into fresh host arrays.
static void dbuf_get(const struct dbuf *b, void **hc, void **hg) {
    OK(cpu, cpu->ops->sync(cpu));
    OK(gpu, gpu->ops->sync(gpu));
    *hc = malloc(b->bytes + 1);
    *hg = malloc(b->bytes + 1);
    cr_assert(*hc && *hg);
    OK(cpu, cpu->ops->download(cpu, *hc, b->c, b->bytes));
    OK(gpu, gpu->ops->download(gpu, *hg, b->g, b->bytes));
    OK(gpu, gpu->ops->sync(gpu));
}

// |got - ref| <= tol[i] (tol != NULL) or atol + rtol * |ref|, NaN only where
// the reference is NaN. Logs the worst error; returns the number of failures.
static int check_close(const char *what, const float *ref, const float *got, size_t n,
                       const float *tol, double atol, double rtol) {
    double worst = 0.0, worst_ratio = 0.0;
    size_t worst_i = 0;
    int fails = 0;
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], g = got[i];
        const double t = tol ? (double)tol[i] : atol + rtol * fabs(r);
        double e;
        if (isnan(r) || isnan(g))
            e = isnan(r) && isnan(g) ? 0.0 : INFINITY;
        else if (isinf(r) || isinf(g))
            e = r == g ? 0.0 : INFINITY;
        else
            e = fabs(g - r);
        if (e > worst) {
            worst = e;
            worst_i = i;
        }
        if (t > 0 && e / t > worst_ratio)
            worst_ratio = e / t;
        if (e > t) {
            if (fails < 5)
                cr_log_error("%s: element %zu: cuda %.9g, cpu %.9g, |err| %.3g > tol %.3g", what, i,
                             g, r, e, t);
            fails++;
        }
    }
    cr_log_info("%s: worst |err| %.3g at %zu (cpu %.9g, cuda %.9g), worst err/tol %.3g", what,
                worst, worst_i, n ? ref[worst_i] : 0.0, n ? got[worst_i] : 0.0, worst_ratio);
    cr_expect_eq(fails, 0, "%s: %d of %zu elements outside the tolerance", what, fails, n);
    return fails;
}

// ---------------------------------------------------------------------------
// random weights of every type (tests/rand_blocks.h)

static void *make_weight(enum ggml_type type, int64_t n_in, int64_t n_out) {
    const size_t rb = ggml_row_bytes(type, n_in);
    cr_assert_gt(rb, 0, "%s n_in %lld", ggml_type_name(type), (long long)n_in);
    return rand_blocks(type, n_in, n_out, RAND_MAGNITUDE_FIRST);
}

static const enum ggml_type all_weight_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,   GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
};
#define N_WEIGHT_TYPES (sizeof all_weight_types / sizeof all_weight_types[0])

// ---------------------------------------------------------------------------
// memory

Test(cuda, memory_roundtrip) {
    REQUIRE_GPU();
    cr_expect_str_eq(gpu->ops->name, "cuda");
    const size_t sizes[] = {0, 1, 3, 255, 4097, (size_t)3 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        void *p = NULL;
        OK(gpu, gpu->ops->alloc(gpu, n, &p));
        cr_assert_not_null(p, "alloc(%zu) gave NULL", n);
        if (n) {
            uint8_t *src = malloc(n), *back = malloc(n);
            for (size_t i = 0; i < n; i++)
                src[i] = (uint8_t)(i * 131 + 7);
            OK(gpu, gpu->ops->upload(gpu, p, src, n));
            memset(src, 0xee, n); // upload must have read src when it returned
            OK(gpu, gpu->ops->download(gpu, back, p, n));
            OK(gpu, gpu->ops->sync(gpu));
            for (size_t i = 0; i < n; i++)
                if (back[i] != (uint8_t)(i * 131 + 7)) {
                    cr_expect_fail("alloc(%zu): byte %zu came back %u", n, i, back[i]);
                    break;
                }
            OK(gpu, gpu->ops->memset_zero(gpu, p, n));
            OK(gpu, gpu->ops->download(gpu, back, p, n));
            OK(gpu, gpu->ops->sync(gpu));
            for (size_t i = 0; i < n; i++)
                if (back[i]) {
                    cr_expect_fail("memset_zero(%zu): byte %zu is %u", n, i, back[i]);
                    break;
                }
            free(src);
            free(back);
        }
        gpu->ops->free(gpu, p);
    }
    cr_expect_gt(backend_cuda_device_count(), 0);
    struct backend *none = NULL;
    struct verr err = {0};
    cr_expect_eq(backend_cuda_create(&none, 1 << 20, &err), VERR_NOTFOUND);
    cr_expect_null(none);
}

// ---------------------------------------------------------------------------
// embed: the decoders must be bit-identical to gguf/quant.c

Test(cuda, embed_all_types_bit_exact) {
    REQUIRE_GPU();
    rng_seed(1);
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const enum ggml_type type = all_weight_types[ti];
        const int bs = (int)ggml_type_get(type)->block_size;
        const int64_t n_ins_plain[] = {1, 37, 4099};
        const int64_t n_ins_q32[] = {32, 4096 + 32};
        const int64_t n_ins_k[] = {256, 2560};
        const int64_t *n_ins = bs == 1 ? n_ins_plain : bs == 32 ? n_ins_q32 : n_ins_k;
        const int n_cases = bs == 1 ? 3 : 2;
        for (int ci = 0; ci < n_cases; ci++) {
            const int64_t n_in = n_ins[ci], n_rows = 50;
            const int n_tok = 13;
            void *w = make_weight(type, n_in, n_rows);
            int32_t tokens[13];
            for (int t = 0; t < n_tok; t++)
                tokens[t] = irand(0, (int)n_rows - 1);
            tokens[0] = 0;
            tokens[1] = (int32_t)n_rows - 1;
            tokens[2] = tokens[3]; // a repeat
            struct dbuf bw = dbuf_new(w, ggml_row_bytes(type, n_in) * n_rows);
            struct dbuf bt = dbuf_new(tokens, sizeof tokens);
            struct dbuf bo = dbuf_new(NULL, (size_t)n_tok * n_in * sizeof(float));
            const struct backend_weight wc = {bw.c, type, n_in, n_rows};
            const struct backend_weight wg = {bw.g, type, n_in, n_rows};
            OK(cpu, cpu->ops->embed(cpu, bo.c, &wc, bt.c, n_tok));
            OK(gpu, gpu->ops->embed(gpu, bo.g, &wg, bt.g, n_tok));
            float *rc, *rg;
            dbuf_get(&bo, (void **)&rc, (void **)&rg);
            char what[96];
            snprintf(what, sizeof what, "embed %s n_in %lld", ggml_type_name(type),
                     (long long)n_in);
            // Tolerance 0: both sides evaluate the same float expressions with
            // the same roundings (no FMA contraction, exact f16/bf16 widening).
            check_close(what, rc, rg, (size_t)n_tok * n_in, NULL, 0.0, 0.0);
            free(rc);
            free(rg);
            dbuf_free(&bw);
            dbuf_free(&bt);
            dbuf_free(&bo);
            free(w);
        }
    }
}

// ---------------------------------------------------------------------------
// matmul: mat-vec path (n_tok <= CUDA_MATVEC_MAX_TOK) and GEMM path

struct mm_case {
    int64_t n_in, n_out;
    int n_tok;
    bool bias;
    bool x_offset; // x one float past an aligned address (unvectorized mat-vec)
};

static void run_matmul_case(enum ggml_type type, const struct mm_case *mc) {
    const int64_t n_in = mc->n_in, n_out = mc->n_out;
    const int n_tok = mc->n_tok;
    const size_t rb = ggml_row_bytes(type, n_in);
    void *w = make_weight(type, n_in, n_out);
    float *x = nrand_array((size_t)n_tok * n_in + 1, 1.0f);
    float *bias = nrand_array((size_t)n_out, 1.0f);
    struct dbuf bw = dbuf_new(w, rb * n_out);
    struct dbuf bx = dbuf_new(x, ((size_t)n_tok * n_in + 1) * sizeof(float));
    struct dbuf bb = dbuf_new(bias, (size_t)n_out * sizeof(float));
    struct dbuf bo = dbuf_new(NULL, (size_t)n_tok * n_out * sizeof(float));
    const int xo = mc->x_offset ? 1 : 0;
    const struct backend_weight wc = {bw.c, type, n_in, n_out};
    const struct backend_weight wg = {bw.g, type, n_in, n_out};
    OK(cpu,
       cpu->ops->matmul(cpu, bo.c, &wc, (const float *)bx.c + xo, mc->bias ? bb.c : NULL, n_tok));
    OK(gpu,
       gpu->ops->matmul(gpu, bo.g, &wg, (const float *)bx.g + xo, mc->bias ? bb.g : NULL, n_tok));
    float *rc, *rg;
    dbuf_get(&bo, (void **)&rc, (void **)&rg);

    // Tolerance per output, relative to mag = sum_i |W[o][i] x[t][i]| (the
    // condition of the dot product):
    //  - f32 accumulation on both sides in different orders: rounding errors
    //    behave as a random walk of ~sqrt(n) steps of 2^-24 relative to mag;
    //    8 sigma: 8 sqrt(n_in) 2^-24 mag;
    //  - GEMM with f16 operands (quantized weights decoded to f16, F16 weights
    //    as stored; activations rounded to f16): each product is off by at most
    //    2^-11 (activation) + 2^-11 (weight) relative: 2^-10 mag on top;
    //  - GEMM with bf16 activations (BF16 weights): 2^-9 per product, 2^-8 mag
    //    with a factor 2 margin.
    // A decoding or layout error changes outputs by O(mag / sqrt(n_in)) or
    // more, far above these bounds; bit-level decoding is checked exactly by
    // embed_all_types_bit_exact.
    const bool gemm = n_tok > CUDA_MATVEC_MAX_TOK;
    double rel = 0.0;
    if (gemm && type == GGML_TYPE_BF16)
        rel = 1.0 / 256;
    else if (gemm && type != GGML_TYPE_F32)
        rel = 1.0 / 1024;
    float *wd = dequant_all(type, w, n_in, n_out);
    float *tol = malloc((size_t)n_tok * n_out * sizeof *tol);
    const double walk = 8.0 * sqrt((double)n_in) / 16777216.0;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + xo + (size_t)t * n_in;
        for (int64_t o = 0; o < n_out; o++) {
            const float *wr = wd + (size_t)o * n_in;
            double mag = 0.0;
            for (int64_t i = 0; i < n_in; i++)
                mag += fabs((double)wr[i] * xt[i]);
            if (mc->bias)
                mag += fabs(bias[o]);
            tol[(size_t)t * n_out + o] = (float)((walk + rel) * mag + 1e-6);
        }
    }
    char what[160];
    snprintf(what, sizeof what, "matmul %s %s n_in %lld n_out %lld n_tok %d%s%s",
             gemm ? "gemm" : "matvec", ggml_type_name(type), (long long)n_in, (long long)n_out,
             n_tok, mc->bias ? " +bias" : "", mc->x_offset ? " x+1" : "");
    check_close(what, rc, rg, (size_t)n_tok * n_out, tol, 0, 0);
    free(tol);
    free(wd);
    free(rc);
    free(rg);
    dbuf_free(&bw);
    dbuf_free(&bx);
    dbuf_free(&bb);
    dbuf_free(&bo);
    free(w);
    free(x);
    free(bias);
}

static void run_matmul_type(enum ggml_type type) {
    const int bs = (int)ggml_type_get(type)->block_size;
    static const struct mm_case plain[] = {
        {1, 3, 1, false, false},      {37, 5, 1, true, false},     {37, 67, 3, false, true},
        {1000, 300, 8, true, false},  {1000, 300, 9, true, false}, {130, 513, 33, false, false},
        {4099, 65, 1, false, false},  {4099, 65, 40, true, false}, {64, 1, 77, false, false},
        {4096, 257, 2, false, false}, {1004, 33, 5, true, false},  {36, 9, 1, false, false},
    };
    static const struct mm_case q32[] = {
        {32, 1, 1, false, false},      {96, 67, 1, true, false},     {96, 67, 5, false, true},
        {4096, 130, 1, false, false},  {4096, 130, 8, true, false},  {4096, 130, 9, true, false},
        {1056, 300, 33, false, false}, {1184, 513, 77, true, false}, {11008, 40, 1, false, false},
    };
    static const struct mm_case qk[] = {
        {256, 1, 1, false, false},    {768, 67, 1, true, false},    {768, 67, 7, false, true},
        {4352, 130, 1, false, false}, {4352, 130, 9, true, false},  {2816, 300, 33, false, false},
        {512, 1025, 64, true, false}, {14336, 20, 2, false, false},
    };
    const struct mm_case *cases = bs == 1 ? plain : bs == 32 ? q32 : qk;
    const size_t n = bs == 1    ? sizeof plain / sizeof plain[0]
                     : bs == 32 ? sizeof q32 / sizeof q32[0]
                                : sizeof qk / sizeof qk[0];
    for (size_t i = 0; i < n; i++)
        run_matmul_case(type, &cases[i]);
}

Test(cuda, matmul_f32) {
    REQUIRE_GPU();
    rng_seed(10);
    run_matmul_type(GGML_TYPE_F32);
}
Test(cuda, matmul_f16) {
    REQUIRE_GPU();
    rng_seed(11);
    run_matmul_type(GGML_TYPE_F16);
}
Test(cuda, matmul_bf16) {
    REQUIRE_GPU();
    rng_seed(12);
    run_matmul_type(GGML_TYPE_BF16);
}
Test(cuda, matmul_q8_0) {
    REQUIRE_GPU();
    rng_seed(13);
    run_matmul_type(GGML_TYPE_Q8_0);
}
Test(cuda, matmul_q4_0) {
    REQUIRE_GPU();
    rng_seed(14);
    run_matmul_type(GGML_TYPE_Q4_0);
}
Test(cuda, matmul_q4_1) {
    REQUIRE_GPU();
    rng_seed(15);
    run_matmul_type(GGML_TYPE_Q4_1);
}
Test(cuda, matmul_q5_0) {
    REQUIRE_GPU();
    rng_seed(16);
    run_matmul_type(GGML_TYPE_Q5_0);
}
Test(cuda, matmul_q5_1) {
    REQUIRE_GPU();
    rng_seed(17);
    run_matmul_type(GGML_TYPE_Q5_1);
}
Test(cuda, matmul_q4_k) {
    REQUIRE_GPU();
    rng_seed(18);
    run_matmul_type(GGML_TYPE_Q4_K);
}
Test(cuda, matmul_q5_k) {
    REQUIRE_GPU();
    rng_seed(19);
    run_matmul_type(GGML_TYPE_Q5_K);
}
Test(cuda, matmul_q6_k) {
    REQUIRE_GPU();
    rng_seed(20);
    run_matmul_type(GGML_TYPE_Q6_K);
}
Test(cuda, matmul_q2_k) {
    REQUIRE_GPU();
    rng_seed(22);
    run_matmul_type(GGML_TYPE_Q2_K);
}
Test(cuda, matmul_q3_k) {
    REQUIRE_GPU();
    rng_seed(23);
    run_matmul_type(GGML_TYPE_Q3_K);
}
Test(cuda, matmul_iq4_nl) {
    REQUIRE_GPU();
    rng_seed(24);
    run_matmul_type(GGML_TYPE_IQ4_NL);
}
Test(cuda, matmul_iq4_xs) {
    REQUIRE_GPU();
    rng_seed(25);
    run_matmul_type(GGML_TYPE_IQ4_XS);
}
// MXFP4 (17-byte blocks: rows of an odd number of blocks, 96 and 1184, start
// at odd addresses): the f32 mat-vec and the decode + cuBLAS GEMM path.
Test(cuda, matmul_mxfp4) {
    REQUIRE_GPU();
    rng_seed(26);
    run_matmul_type(GGML_TYPE_MXFP4);
}

// More rows than one decoded f16 slice of the GEMM path holds (64 Mi
// elements): the second GEMM writes the columns after the first slice.
Test(cuda, matmul_gemm_several_slices) {
    REQUIRE_GPU();
    rng_seed(21);
    const struct mm_case mc = {4096, 16500, 9, true, false};
    run_matmul_case(GGML_TYPE_Q4_0, &mc);
}

Test(cuda, matmul_rejects_what_it_cannot_do) {
    REQUIRE_GPU();
    void *p = NULL;
    OK(gpu, gpu->ops->alloc(gpu, 1 << 16, &p));
    const struct backend_weight iq3 = {p, GGML_TYPE_IQ3_S, 256, 4};
    cr_expect_eq(gpu->ops->matmul(gpu, (float *)p, &iq3, (const float *)p + 1024, NULL, 1),
                 VERR_UNSUPPORTED);
    cr_log_info("IQ3_S: %s", gpu->err.msg);
    const struct backend_weight odd = {p, GGML_TYPE_Q4_0, 33, 4};
    cr_expect_eq(gpu->ops->matmul(gpu, (float *)p, &odd, (const float *)p + 1024, NULL, 1),
                 VERR_RANGE);
    // MXFP4 tables have no embed decoder (llama.cpp's MXFP4_MOE keeps
    // token_embd in Q8_0); refused by name before anything is launched.
    const struct backend_weight mx = {p, GGML_TYPE_MXFP4, 32, 4};
    cr_expect_eq(gpu->ops->embed(gpu, (float *)p + 1024, &mx, (const int32_t *)p + 2048, 1),
                 VERR_UNSUPPORTED);
    cr_expect(strstr(gpu->err.msg, "mxfp4") != NULL, "%s", gpu->err.msg);
    gpu->ops->free(gpu, p);
}

// ---------------------------------------------------------------------------
// fused matmuls (matmul_multi, matmul_add, matmul_swiglu)
//
// backend.h promises each is element by element its composition. The
// unfused ops are checked against the CPU above, so the fused ones are
// compared with the same ops run unfused on the GPU: bit-identical for decode
// batches (the mat-vec kernel does the same arithmetic per output, whatever
// the number of segments or the epilogue), and for GEMM batches bit-identical
// too except matmul_add, whose residual add happens in cuBLAS's epilogue
// (beta = 1): alpha*acc + beta*y may round once more than acc then y + p,
// so its bound is 2 ulps of |y| + |Wx| (2^-22 relative).

static float *gpu_fetch(const void *g, size_t n) {
    OK(gpu, gpu->ops->sync(gpu));
    float *h = malloc(n * sizeof *h + 1);
    cr_assert_not_null(h);
    OK(gpu, gpu->ops->download(gpu, h, g, n * sizeof *h));
    OK(gpu, gpu->ops->sync(gpu));
    return h;
}

static void *gpu_put(const void *h, size_t bytes) {
    void *g = NULL;
    OK(gpu, gpu->ops->alloc(gpu, bytes, &g));
    OK(gpu, gpu->ops->upload(gpu, g, h, bytes));
    return g;
}

static int count_bit_diffs(const char *what, const float *a, const float *b, size_t n) {
    int diffs = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && diffs++ < 3)
            cr_log_error("%s: element %zu: fused %.9g, unfused %.9g", what, i, a[i], b[i]);
    cr_expect_eq(diffs, 0, "%s: %d of %zu elements differ", what, diffs, n);
    return diffs;
}

struct fused_case {
    enum ggml_type tq, tk, tv;    // Q/K/V types (equal: one launch for decode)
    enum ggml_type tg, tu, td;    // gate/up/down
    int64_t n_in, n_q, n_k, n_ff; // n_in = n_embd
    int n_tok;
};

static void run_fused_case(const struct fused_case *fc) {
    const int64_t n_in = fc->n_in, n_tok = fc->n_tok;
    const enum ggml_type tys[3] = {fc->tq, fc->tk, fc->tv};
    const int64_t outs[3] = {fc->n_q, fc->n_k, fc->n_k};
    char what[200];
    snprintf(
        what, sizeof what, "fused %s/%s/%s %s/%s/%s n_in %lld n_q %lld n_k %lld n_ff %lld n_tok %d",
        ggml_type_name(fc->tq), ggml_type_name(fc->tk), ggml_type_name(fc->tv),
        ggml_type_name(fc->tg), ggml_type_name(fc->tu), ggml_type_name(fc->td), (long long)n_in,
        (long long)fc->n_q, (long long)fc->n_k, (long long)fc->n_ff, fc->n_tok);
    float *x = nrand_array((size_t)n_tok * n_in, 1.0f);
    void *xg = gpu_put(x, (size_t)n_tok * n_in * sizeof(float));

    // matmul_multi (Q, K, V with biases on Q and V) vs three matmuls.
    void *wh[3], *wgp[3], *bg[3] = {NULL, NULL, NULL}, *fo[3], *uo[3];
    struct backend_weight bw[3];
    struct backend_mm mm[3];
    for (int i = 0; i < 3; i++) {
        wh[i] = make_weight(tys[i], n_in, outs[i]);
        wgp[i] = gpu_put(wh[i], ggml_row_bytes(tys[i], n_in) * outs[i]);
        bw[i] = (struct backend_weight){wgp[i], tys[i], n_in, outs[i]};
        if (i != 1) {
            float *b = nrand_array((size_t)outs[i], 1.0f);
            bg[i] = gpu_put(b, (size_t)outs[i] * sizeof(float));
            free(b);
        }
        OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * outs[i] * sizeof(float), &fo[i]));
        OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * outs[i] * sizeof(float), &uo[i]));
        mm[i] = (struct backend_mm){fo[i], &bw[i], bg[i]};
        OK(gpu, gpu->ops->matmul(gpu, uo[i], &bw[i], xg, bg[i], (int)n_tok));
    }
    OK(gpu, gpu->ops->matmul_multi(gpu, mm, 3, xg, (int)n_tok));
    for (int i = 0; i < 3; i++) {
        float *a = gpu_fetch(fo[i], (size_t)n_tok * outs[i]);
        float *b = gpu_fetch(uo[i], (size_t)n_tok * outs[i]);
        char w2[240];
        snprintf(w2, sizeof w2, "%s: matmul_multi matrix %d", what, i);
        count_bit_diffs(w2, a, b, (size_t)n_tok * outs[i]);
        free(a);
        free(b);
    }

    // matmul_swiglu vs matmul(gate), matmul(up), swiglu.
    const enum ggml_type tgu[2] = {fc->tg, fc->tu};
    void *gu[2];
    struct backend_weight bgu[2];
    for (int i = 0; i < 2; i++) {
        void *h = make_weight(tgu[i], n_in, fc->n_ff);
        gu[i] = gpu_put(h, ggml_row_bytes(tgu[i], n_in) * fc->n_ff);
        bgu[i] = (struct backend_weight){gu[i], tgu[i], n_in, fc->n_ff};
        free(h);
    }
    const size_t nf = (size_t)n_tok * fc->n_ff;
    void *f_out, *f_up, *u_gate, *u_up;
    OK(gpu, gpu->ops->alloc(gpu, nf * sizeof(float), &f_out));
    OK(gpu, gpu->ops->alloc(gpu, nf * sizeof(float), &f_up));
    OK(gpu, gpu->ops->alloc(gpu, nf * sizeof(float), &u_gate));
    OK(gpu, gpu->ops->alloc(gpu, nf * sizeof(float), &u_up));
    OK(gpu, gpu->ops->matmul_swiglu(gpu, f_out, f_up, &bgu[0], &bgu[1], xg, (int)n_tok));
    OK(gpu, gpu->ops->matmul(gpu, u_gate, &bgu[0], xg, NULL, (int)n_tok));
    OK(gpu, gpu->ops->matmul(gpu, u_up, &bgu[1], xg, NULL, (int)n_tok));
    OK(gpu, gpu->ops->swiglu(gpu, u_gate, u_gate, u_up, (int64_t)nf));
    {
        float *a = gpu_fetch(f_out, nf), *b = gpu_fetch(u_gate, nf);
        char w2[240];
        snprintf(w2, sizeof w2, "%s: matmul_swiglu", what);
        count_bit_diffs(w2, a, b, nf);
        free(a);
        free(b);
    }

    // matmul_add (down projection of the swiglu output into a residual y)
    // vs matmul then add.
    void *dh = make_weight(fc->td, fc->n_ff, n_in);
    void *dg = gpu_put(dh, ggml_row_bytes(fc->td, fc->n_ff) * n_in);
    const struct backend_weight bd = {dg, fc->td, fc->n_ff, n_in};
    float *y = nrand_array((size_t)n_tok * n_in, 4.0f);
    void *yf = gpu_put(y, (size_t)n_tok * n_in * sizeof(float));
    void *yu = gpu_put(y, (size_t)n_tok * n_in * sizeof(float));
    void *p;
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n_in * sizeof(float), &p));
    OK(gpu, gpu->ops->matmul_add(gpu, yf, &bd, u_gate, (int)n_tok));
    OK(gpu, gpu->ops->matmul(gpu, p, &bd, u_gate, NULL, (int)n_tok));
    OK(gpu, gpu->ops->add(gpu, yu, p, (int64_t)n_tok * n_in));
    {
        const size_t ny = (size_t)n_tok * n_in;
        float *a = gpu_fetch(yf, ny), *b = gpu_fetch(yu, ny), *pp = gpu_fetch(p, ny);
        char w2[240];
        snprintf(w2, sizeof w2, "%s: matmul_add", what);
        if (n_tok <= CUDA_MATVEC_MAX_TOK) {
            count_bit_diffs(w2, a, b, ny);
        } else {
            float *tol = malloc(ny * sizeof *tol);
            for (size_t i = 0; i < ny; i++)
                tol[i] = (fabsf(y[i]) + fabsf(pp[i])) * (float)(1.0 / 4194304.0);
            check_close(w2, b, a, ny, tol, 0, 0);
            free(tol);
        }
        free(a);
        free(b);
        free(pp);
    }

    void *gfree[] = {xg, f_out, f_up, u_gate, u_up, dg, yf, yu, p, gu[0], gu[1]};
    for (size_t i = 0; i < sizeof gfree / sizeof gfree[0]; i++)
        gpu->ops->free(gpu, gfree[i]);
    for (int i = 0; i < 3; i++) {
        gpu->ops->free(gpu, wgp[i]);
        gpu->ops->free(gpu, fo[i]);
        gpu->ops->free(gpu, uo[i]);
        if (bg[i])
            gpu->ops->free(gpu, bg[i]);
        free(wh[i]);
    }
    free(dh);
    free(y);
    free(x);
}

Test(cuda, matmul_fused_equal_unfused) {
    REQUIRE_GPU();
    rng_seed(31);
    const enum ggml_type F32 = GGML_TYPE_F32, F16 = GGML_TYPE_F16, BF = GGML_TYPE_BF16,
                         Q40 = GGML_TYPE_Q4_0, Q80 = GGML_TYPE_Q8_0, Q51 = GGML_TYPE_Q5_1,
                         Q4K = GGML_TYPE_Q4_K, Q6K = GGML_TYPE_Q6_K, MX = GGML_TYPE_MXFP4;
    const struct fused_case cases[] = {
        // one launch each (shared types), decode batches of 1, 3 and 8
        {Q40, Q40, Q40, Q40, Q40, Q40, 256, 96, 33, 160, 1},
        {Q80, Q80, Q80, Q80, Q80, Q80, 512, 131, 7, 96, 3},
        {Q4K, Q4K, Q4K, Q4K, Q4K, Q4K, 512, 67, 33, 256, 8},
        {F16, F16, F16, F16, F16, F16, 202, 65, 9, 130, 2},
        {F32, F32, F32, BF, BF, BF, 37, 5, 3, 41, 1},
        // mixed types (Q4_K_M-like: V and down in Q6_K): separate launches
        {Q4K, Q4K, Q6K, Q4K, Q6K, Q6K, 256, 64, 16, 256, 1},
        {Q51, Q40, Q40, Q40, Q51, Q40, 96, 17, 5, 64, 5},
        // GEMM batches
        {Q40, Q40, Q40, Q40, Q40, Q40, 256, 96, 33, 160, 9},
        {F16, F16, F16, F16, F16, F16, 128, 64, 32, 96, 20},
        // MXFP4 (odd rows of 3 and 5 blocks) beside Q8_0, decode and GEMM
        {Q80, MX, MX, MX, MX, MX, 96, 64, 32, 160, 3},
        {MX, Q80, MX, MX, MX, MX, 96, 64, 32, 160, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_fused_case(&cases[i]);
}

// act_q8 (backend.h) on both backends: the decode matmuls of every supported
// type through q8_1 activations on both sides (CPU: gguf/quant_q8.c, CUDA:
// cuda/matvec_q8.cu), with the f32 tolerance above (the integer sub-block
// terms are equal; only the order of the float additions differs), and the
// fused ops equal to the unfused ones bit for bit on that path too.
Test(cuda, matmul_act_q8) {
    REQUIRE_GPU();
    rng_seed(41);
    cpu->act_q8 = gpu->act_q8 = true;
    static const enum ggml_type types[] = {GGML_TYPE_Q8_0,   GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                           GGML_TYPE_Q5_0,   GGML_TYPE_Q5_1, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                           GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bool k = ggml_type_get(types[ti])->block_size == 256;
        const struct mm_case cases[] = {
            {k ? 256 : 32, 1, 1, false, false},
            {k ? 768 : 96, 67, 3, true, false},
            {k ? 4352 : 4128, 130, 8, true, false},
        };
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            run_matmul_case(types[ti], &cases[ci]);
    }
    const enum ggml_type Q40 = GGML_TYPE_Q4_0, Q4K = GGML_TYPE_Q4_K, Q6K = GGML_TYPE_Q6_K,
                         Q80 = GGML_TYPE_Q8_0, MX = GGML_TYPE_MXFP4;
    const struct fused_case fcs[] = {
        {Q40, Q40, Q40, Q40, Q40, Q40, 256, 96, 33, 160, 1},
        {Q4K, Q4K, Q6K, Q4K, Q6K, Q6K, 256, 64, 16, 256, 3},
        {Q80, MX, MX, MX, MX, MX, 96, 64, 32, 160, 5},
    };
    for (size_t i = 0; i < sizeof fcs / sizeof fcs[0]; i++)
        run_fused_case(&fcs[i]);
    cpu->act_q8 = gpu->act_q8 = false;
}

// backend_cuda_set_matvec_q8 picks the dp4a mat-vec's kernel of a CUDA
// backend (a variant under test, cuda/backend_cuda.h); values it cannot
// take are refused, and refused on the CPU backend. With the pipelined
// kernel (1 block per SM: few blocks, several row pairs each) the act_q8
// decode matmuls and fused ops match the CPU as the default kernel does (test_cuda_matvec_q8 checks
// the pipelined kernel bit for bit with the one-pass kernel).
Test(cuda, matvec_q8_variant) {
    REQUIRE_GPU();
    struct backend *piped = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cuda_create(&piped, 0, &err), 0, "%s", err.msg);
    const int bad[][2] = {{1, -1}, {1, 65}, {0, 4}, {2, 65}, {3, 0}, {-1, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(backend_cuda_set_matvec_q8(piped, bad[i][0], bad[i][1], &err), VERR_RANGE,
                     "kernel %d, %d blocks per SM accepted", bad[i][0], bad[i][1]);
    cr_expect_eq(backend_cuda_set_matvec_q8(cpu, 1, 4, &err), VERR_RANGE, "the CPU backend");
    cr_assert_eq(backend_cuda_set_matvec_q8(piped, 1, 1, &err), 0, "%s", err.msg);
    struct backend *const saved = gpu;
    gpu = piped;
    rng_seed(43);
    cpu->act_q8 = gpu->act_q8 = true;
    static const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bool k = ggml_type_get(types[ti])->block_size == 256;
        const struct mm_case cases[] = {
            {k ? 768 : 96, 67, 3, true, false},
            {k ? 4352 : 4128, 130, 1, true, false},
        };
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            run_matmul_case(types[ti], &cases[ci]);
    }
    const enum ggml_type Q4K = GGML_TYPE_Q4_K, Q6K = GGML_TYPE_Q6_K;
    const struct fused_case fc = {Q4K, Q4K, Q6K, Q4K, Q6K, Q6K, 256, 64, 16, 256, 3};
    run_fused_case(&fc);
    cpu->act_q8 = false;
    gpu = saved;
    backend_destroy(piped);
}

// backend_cuda_set_matvec_f16 picks the F16/BF16 mat-vec's kernel of a CUDA
// backend (a variant under test, cuda/backend_cuda.h); values it cannot take
// are refused, and refused on the CPU backend. With the streaming kernel the
// decode matmuls (1, 2, 3 and 8 tokens, rows not a multiple of a block's
// warps, a bias, n_in with partial 16-byte items; widths it does not take,
// odd or not a multiple of 8, and x off 16-byte alignment, fall back) match
// the CPU within the tolerance above, and the fused ops (Q/K/V segments,
// add, swiglu) equal the unfused ones bit for bit, as with the default
// kernel (test_cuda_matvec_f16 checks the kernel itself against float64).
Test(cuda, matvec_f16_variant) {
    REQUIRE_GPU();
    struct backend *streamed = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cuda_create(&streamed, 0, &err), 0, "%s", err.msg);
    const int bad[][2] = {{1, -1}, {1, 65}, {0, 4}, {2, 0}, {-1, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(backend_cuda_set_matvec_f16(streamed, bad[i][0], bad[i][1], &err), VERR_RANGE,
                     "kernel %d, %d blocks per SM accepted", bad[i][0], bad[i][1]);
    cr_expect_eq(backend_cuda_set_matvec_f16(cpu, 1, 4, &err), VERR_RANGE, "the CPU backend");
    cr_assert_eq(backend_cuda_set_matvec_f16(streamed, 1, 2, &err), 0, "%s", err.msg);
    struct backend *const saved = gpu;
    gpu = streamed;
    rng_seed(44);
    static const struct mm_case cases[] = {
        {8, 3, 1, false, false},     {200, 67, 2, true, false},   {200, 67, 3, false, true},
        {1000, 300, 8, true, false}, {2056, 65, 1, false, false}, {4096, 257, 2, false, false},
        {4096, 131, 8, true, false}, {4099, 65, 1, false, false}, {1004, 33, 5, true, false},
        {37, 5, 1, true, false},
    };
    const enum ggml_type types[] = {GGML_TYPE_F16, GGML_TYPE_BF16};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            run_matmul_case(types[ti], &cases[ci]);
    const enum ggml_type F16 = GGML_TYPE_F16, BF = GGML_TYPE_BF16;
    const struct fused_case fcs[] = {
        {F16, F16, F16, F16, F16, F16, 200, 65, 9, 136, 2},
        {BF, BF, BF, BF, BF, BF, 256, 33, 17, 96, 8},
        {F16, F16, F16, F16, F16, F16, 512, 131, 7, 96, 1},
    };
    for (size_t i = 0; i < sizeof fcs / sizeof fcs[0]; i++)
        run_fused_case(&fcs[i]);
    gpu = saved;
    backend_destroy(streamed);
}

// act_q8: rms_norm_q8 of a decode batch also writes its output as q8_1, and
// the mat-vec right after it reads those blocks instead of quantizing again.
// Its results must equal those of the same mat-vec after a plain rms_norm
// (which makes it quantize x itself), bit for bit, for every batch size;
// any other op right after rms_norm_q8 is refused.
Test(cuda, rms_norm_q8_feeds_the_next_matvec) {
    REQUIRE_GPU();
    rng_seed(43);
    gpu->act_q8 = true;
    const int n = 256, n_out = 67;
    for (int n_tok = 1; n_tok <= CUDA_MATVEC_MAX_TOK; n_tok += 3) {
        for (int ti = 0; ti < 2; ti++) {
            const enum ggml_type type = ti ? GGML_TYPE_Q4_K : GGML_TYPE_Q4_0;
            void *wh = make_weight(type, n, n_out);
            void *wg = gpu_put(wh, ggml_row_bytes(type, n) * n_out);
            const struct backend_weight bw = {wg, type, n, n_out};
            float *x = nrand_array((size_t)n_tok * n, 3.0f), *nw = nrand_array((size_t)n, 1.0f);
            void *xg = gpu_put(x, (size_t)n_tok * n * sizeof(float));
            void *nwg = gpu_put(nw, (size_t)n * sizeof(float));
            void *xn, *o1, *o2, *dummy;
            OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n * sizeof(float), &xn));
            OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n_out * sizeof(float), &o1));
            OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n_out * sizeof(float), &o2));
            OK(gpu, gpu->ops->alloc(gpu, 64, &dummy));
            OK(gpu, gpu->ops->memset_zero(gpu, dummy, 64)); // the add reads it (initcheck)
            OK(gpu, gpu->ops->rms_norm_q8(gpu, xn, xg, nwg, n_tok, n, 1e-5f));
            OK(gpu, gpu->ops->matmul(gpu, o1, &bw, xn, NULL, n_tok)); // the q8 copy
            OK(gpu, gpu->ops->rms_norm(gpu, xn, xg, nwg, n_tok, n, 1e-5f));
            OK(gpu, gpu->ops->matmul(gpu, o2, &bw, xn, NULL, n_tok)); // quantizes xn itself
            OK(gpu, gpu->ops->rms_norm_q8(gpu, xn, xg, nwg, n_tok, n, 1e-5f));
            cr_expect_eq(gpu->ops->add(gpu, dummy, dummy, 4), VERR_RANGE,
                         "an op between rms_norm_q8 and its mat-vec");
            OK(gpu, gpu->ops->rms_norm_q8(gpu, xn, xg, nwg, n_tok, n, 1e-5f));
            cr_expect_eq(gpu->ops->matmul(gpu, o2, &bw, xg, NULL, n_tok), VERR_RANGE,
                         "a mat-vec of another x right after rms_norm_q8");
            OK(gpu, gpu->ops->add(gpu, dummy, dummy, 4)); // the refusal left nothing pending
            float *a = gpu_fetch(o1, (size_t)n_tok * n_out),
                  *b = gpu_fetch(o2, (size_t)n_tok * n_out);
            char what[96];
            snprintf(what, sizeof what, "rms_norm q8 -> matmul %s n_tok %d", ggml_type_name(type),
                     n_tok);
            count_bit_diffs(what, a, b, (size_t)n_tok * n_out);
            free(a);
            free(b);
            void *gf[] = {wg, xg, nwg, xn, o1, o2, dummy};
            for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++)
                gpu->ops->free(gpu, gf[i]);
            free(wh);
            free(x);
            free(nw);
        }
    }
    gpu->act_q8 = false;
}

// hadamard_q8 (the attention output's rotation back before the output
// projection) on rms_norm_q8's terms: x rotated to the hadamard op's bits,
// and the mat-vec after it gives, bit for bit, what it gives after a plain
// hadamard (which makes it quantize x itself); an op between them is
// refused. Batches past the mat-vec's (no copy) run too.
Test(cuda, hadamard_q8_feeds_the_next_matvec) {
    REQUIRE_GPU();
    rng_seed(44);
    gpu->act_q8 = true;
    const int n = 512, n_out = 67;
    const int blocks[2] = {64, 128};
    for (int n_tok = 1; n_tok <= CUDA_MATVEC_MAX_TOK + 1; n_tok += 4) {
        for (int bi = 0; bi < 2; bi++) {
            const enum ggml_type type = bi ? GGML_TYPE_Q4_K : GGML_TYPE_Q8_0;
            void *wh = make_weight(type, n, n_out);
            void *wg = gpu_put(wh, ggml_row_bytes(type, n) * n_out);
            const struct backend_weight bw = {wg, type, n, n_out};
            const size_t xb = (size_t)n_tok * n * sizeof(float);
            float *x = nrand_array((size_t)n_tok * n, 3.0f);
            void *x1 = gpu_put(x, xb), *x2 = gpu_put(x, xb), *o1, *o2, *dummy;
            OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n_out * sizeof(float), &o1));
            OK(gpu, gpu->ops->alloc(gpu, (size_t)n_tok * n_out * sizeof(float), &o2));
            OK(gpu, gpu->ops->alloc(gpu, 64, &dummy));
            OK(gpu, gpu->ops->memset_zero(gpu, dummy, 64)); // the add reads it (initcheck)
            OK(gpu, gpu->ops->hadamard_q8(gpu, x1, n_tok, n, blocks[bi]));
            OK(gpu, gpu->ops->matmul(gpu, o1, &bw, x1, NULL, n_tok)); // the q8 copy
            OK(gpu, gpu->ops->hadamard(gpu, x2, n_tok, n, blocks[bi]));
            OK(gpu, gpu->ops->matmul(gpu, o2, &bw, x2, NULL, n_tok)); // quantizes x itself
            float *r1 = gpu_fetch(x1, (size_t)n_tok * n), *r2 = gpu_fetch(x2, (size_t)n_tok * n);
            cr_expect_eq(memcmp(r1, r2, xb), 0,
                         "hadamard_q8 n_tok %d block %d: x is not hadamard's", n_tok, blocks[bi]);
            OK(gpu, gpu->ops->hadamard_q8(gpu, x1, n_tok, n, blocks[bi]));
            cr_expect_eq(gpu->ops->add(gpu, dummy, dummy, 4), VERR_RANGE,
                         "an op between hadamard_q8 and its mat-vec");
            cr_expect(strstr(gpu->err.msg, "hadamard_q8"), "%s", gpu->err.msg);
            OK(gpu, gpu->ops->add(gpu, dummy, dummy, 4)); // the refusal left nothing pending
            float *a = gpu_fetch(o1, (size_t)n_tok * n_out),
                  *b = gpu_fetch(o2, (size_t)n_tok * n_out);
            char what[96];
            snprintf(what, sizeof what, "hadamard q8 -> matmul %s n_tok %d block %d",
                     ggml_type_name(type), n_tok, blocks[bi]);
            count_bit_diffs(what, a, b, (size_t)n_tok * n_out);
            free(a), free(b), free(r1), free(r2);
            void *gf[] = {wg, x1, x2, o1, o2, dummy};
            for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++)
                gpu->ops->free(gpu, gf[i]);
            free(wh);
            free(x);
        }
    }
    gpu->act_q8 = false;
}

Test(cuda, matmul_fused_rejects_bad_shapes) {
    REQUIRE_GPU();
    void *p = NULL;
    OK(gpu, gpu->ops->alloc(gpu, 1 << 16, &p));
    const struct backend_weight a = {p, GGML_TYPE_F32, 32, 4}, b = {p, GGML_TYPE_F32, 64, 4};
    float *out = (float *)p + 4096, *x = (float *)p + 8192;
    const struct backend_mm mm[2] = {{out, &a, NULL}, {out + 64, &b, NULL}};
    cr_expect_eq(gpu->ops->matmul_multi(gpu, mm, 2, x, 1), VERR_RANGE);
    cr_log_info("matmul_multi n_in mismatch: %s", gpu->err.msg);
    cr_expect_eq(gpu->ops->matmul_multi(gpu, mm, 0, x, 1), VERR_RANGE);
    cr_expect_eq(gpu->ops->matmul_swiglu(gpu, out, out + 256, &a, &b, x, 1), VERR_RANGE);
    cr_log_info("matmul_swiglu shape mismatch: %s", gpu->err.msg);
    cr_expect_eq(gpu->ops->matmul_add(gpu, x, &a, x, 1), VERR_RANGE);
    cr_log_info("matmul_add aliasing: %s", gpu->err.msg);
    gpu->ops->free(gpu, p);
}

// ---------------------------------------------------------------------------
// rms_norm

Test(cuda, rms_norm) {
    REQUIRE_GPU();
    rng_seed(30);
    const struct {
        int rows, n;
        float eps;
        bool alias;
    } cases[] = {
        {1, 1, 1e-5f, false},    {3, 37, 1e-6f, false},   {5, 4096, 1e-5f, true},
        {2, 5120, 1e-6f, false}, {7, 8191, 1e-5f, false}, {64, 896, 1e-6f, true},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int rows = cases[ci].rows, n = cases[ci].n;
        float *x = nrand_array((size_t)rows * n, 2.0f);
        float *w = nrand_array((size_t)n, 1.0f);
        struct dbuf bx = dbuf_new(x, (size_t)rows * n * sizeof(float));
        struct dbuf bw = dbuf_new(w, (size_t)n * sizeof(float));
        struct dbuf bo = dbuf_new(NULL, (size_t)rows * n * sizeof(float));
        struct dbuf *out = cases[ci].alias ? &bx : &bo;
        OK(cpu, cpu->ops->rms_norm(cpu, out->c, bx.c, bw.c, rows, n, cases[ci].eps));
        OK(gpu, gpu->ops->rms_norm(gpu, out->g, bx.g, bw.g, rows, n, cases[ci].eps));
        float *rc, *rg;
        dbuf_get(out, (void **)&rc, (void **)&rg);
        char what[96];
        snprintf(what, sizeof what, "rms_norm %d x %d%s", rows, n,
                 cases[ci].alias ? " in place" : "");
        // The sum of squares: double on the CPU, an f32 tree (n/256 sequential
        // terms per thread, then 8 levels) on the GPU: relative error below
        // (n/256 + 8) 2^-24, halved by the square root, plus 2 ulps for the
        // products: 1e-5 relative covers n up to ~40000 with margin.
        check_close(what, rc, rg, (size_t)rows * n, NULL, 1e-30, 1e-5);
        free(rc);
        free(rg);
        dbuf_free(&bx);
        dbuf_free(&bw);
        dbuf_free(&bo);
        free(x);
        free(w);
    }
}

// ---------------------------------------------------------------------------
// rope, rope_kv_store, kv_shift

struct rope_case {
    enum rope_mode mode;
    int head_dim, n_rot, n_head, n_tok;
    bool yarn, factors;
};

static const struct rope_case rope_cases[] = {
    {ROPE_MODE_NORMAL, 64, 64, 1, 1, false, false},
    {ROPE_MODE_NORMAL, 128, 128, 32, 7, false, false},
    {ROPE_MODE_NEOX, 128, 128, 5, 33, false, false},
    {ROPE_MODE_NORMAL, 128, 128, 8, 9, true, false},
    {ROPE_MODE_NEOX, 64, 64, 14, 17, true, true},
    {ROPE_MODE_NEOX, 80, 64, 3, 5, false, false}, // partial rotation: dims 64..79 copied
    {ROPE_MODE_NORMAL, 96, 32, 6, 4, true, true},
    {ROPE_MODE_NEOX, 256, 256, 4, 3, true, false},
    {ROPE_MODE_NORMAL, 256, 128, 2, 40, false, true},
};

static struct rope_params rope_params_for(const struct rope_case *rc, const float *factors) {
    struct rope_params rp = {
        .mode = rc->mode,
        .n_rot = rc->n_rot,
        .n_ctx_orig = 4096,
        .freq_base = 10000.0f,
        .freq_scale = 1.0f,
        .ext_factor = 0.0f,
        .attn_factor = 1.0f,
        .beta_fast = 32.0f,
        .beta_slow = 1.0f,
        .freq_factors = factors,
    };
    if (rc->yarn) {
        rp.freq_base = 1000000.0f;
        rp.freq_scale = 0.25f;
        rp.ext_factor = 1.0f;
        rp.attn_factor = 1.3f;
    }
    return rp;
}

static float rope_mscale(const struct rope_params *rp) {
    return rp->ext_factor != 0.0f ? rp->attn_factor * (1.0f + 0.1f * logf(1.0f / rp->freq_scale))
                                  : rp->attn_factor;
}

// Tolerance of a rotated element. The angles are bit-identical (the same
// running product pos * theta_scale^i, no FMA, constants from the same host
// arithmetic); only cosf/sinf differ: CUDA's are within 2 ulp, glibc's within
// 1, so each of cos, sin is off by at most 3 * 2^-24 absolute (|cos|, |sin| <=
// 1) times mscale. Then y = x0 cos - x1 sin is off by that times |x0| + |x1|
// plus 2 ulps of the products: 2^-20 (|x0| + |x1|) mscale + 2^-22 |y|.
static void rope_tolerance(float *tol, const float *x_before, const float *ref, int n_rows,
                           int head_dim, int n_rot, enum rope_mode mode, float mscale) {
    const int n_pairs = n_rot / 2;
    for (int r = 0; r < n_rows; r++) {
        const float *x = x_before + (size_t)r * head_dim;
        float *t = tol + (size_t)r * head_dim;
        for (int d = 0; d < head_dim; d++)
            t[d] = 0.0f; // copied dims: exact
        for (int i = 0; i < n_pairs; i++) {
            const int e0 = mode == ROPE_MODE_NEOX ? i : 2 * i;
            const int e1 = mode == ROPE_MODE_NEOX ? i + n_pairs : 2 * i + 1;
            const float m = (fabsf(x[e0]) + fabsf(x[e1])) * fmaxf(mscale, 1.0f) / 1048576.0f;
            t[e0] = m + fabsf(ref[(size_t)r * head_dim + e0]) / 4194304.0f;
            t[e1] = m + fabsf(ref[(size_t)r * head_dim + e1]) / 4194304.0f;
        }
    }
}

static float *make_factors(int n) {
    float *f = malloc((size_t)n * sizeof *f);
    for (int i = 0; i < n; i++)
        f[i] = frand(1.0f, 8.0f);
    return f;
}

Test(cuda, rope) {
    REQUIRE_GPU();
    rng_seed(40);
    for (size_t ci = 0; ci < sizeof rope_cases / sizeof rope_cases[0]; ci++) {
        const struct rope_case *c = &rope_cases[ci];
        const size_t n = (size_t)c->n_tok * c->n_head * c->head_dim;
        float *x = nrand_array(n, 1.0f);
        int32_t *pos = malloc((size_t)c->n_tok * sizeof *pos);
        for (int t = 0; t < c->n_tok; t++)
            pos[t] = t == 0 ? 0 : irand(0, 8191); // 0: the identity rotation
        float *ff = make_factors(c->n_rot / 2);
        struct dbuf bx = dbuf_new(x, n * sizeof(float));
        struct dbuf bp = dbuf_new(pos, (size_t)c->n_tok * sizeof(int32_t));
        struct dbuf bf = dbuf_new(ff, (size_t)(c->n_rot / 2) * sizeof(float));
        const struct rope_params rpc = rope_params_for(c, c->factors ? bf.c : NULL);
        const struct rope_params rpg = rope_params_for(c, c->factors ? bf.g : NULL);
        OK(cpu, cpu->ops->rope(cpu, bx.c, bp.c, c->n_tok, c->n_head, c->head_dim, &rpc));
        OK(gpu, gpu->ops->rope(gpu, bx.g, bp.g, c->n_tok, c->n_head, c->head_dim, &rpg));
        float *rc, *rg;
        dbuf_get(&bx, (void **)&rc, (void **)&rg);
        float *tol = malloc(n * sizeof *tol);
        rope_tolerance(tol, x, rc, c->n_tok * c->n_head, c->head_dim, c->n_rot, c->mode,
                       rope_mscale(&rpc));
        char what[128];
        snprintf(what, sizeof what, "rope %s hd %d n_rot %d heads %d toks %d%s%s",
                 c->mode == ROPE_MODE_NEOX ? "neox" : "normal", c->head_dim, c->n_rot, c->n_head,
                 c->n_tok, c->yarn ? " yarn" : "", c->factors ? " factors" : "");
        check_close(what, rc, rg, n, tol, 0, 0);
        free(tol);
        free(rc);
        free(rg);
        dbuf_free(&bx);
        dbuf_free(&bp);
        dbuf_free(&bf);
        free(x);
        free(pos);
        free(ff);
    }
}

// F16 cache contents as floats.
static float *cache_as_f32(const void *data, enum ggml_type t, size_t n) {
    float *f = malloc(n * sizeof *f + 4);
    for (size_t i = 0; i < n; i++)
        f[i] = t == GGML_TYPE_F32 ? ((const float *)data)[i]
                                  : quant_fp16_to_f32(((const uint16_t *)data)[i]);
    return f;
}

// An f16 store may round to the neighbouring f16 when the f32 values differ
// by a few ulps: one f16 ulp (2^-10 relative, 2^-24 absolute for subnormals)
// on top of the f32 tolerance.
static void widen_tol_f16(float *tol, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++)
        tol[i] += fabsf(ref[i]) / 1024.0f + 1.0f / 16777216.0f;
}

Test(cuda, rope_kv_store) {
    REQUIRE_GPU();
    rng_seed(50);
    const enum ggml_type types[][2] = {{GGML_TYPE_F16, GGML_TYPE_F16},
                                       {GGML_TYPE_F32, GGML_TYPE_F32},
                                       {GGML_TYPE_F16, GGML_TYPE_F32}};
    for (size_t ci = 0; ci < sizeof rope_cases / sizeof rope_cases[0]; ci++) {
        for (size_t ti = 0; ti < 3; ti++) {
            const struct rope_case *c = &rope_cases[ci];
            const enum ggml_type tk = types[ti][0], tv = types[ti][1];
            const int n_kv_heads = c->n_head, hd = c->head_dim;
            const int hdv = ti == 2 ? hd / 2 + 8 : hd; // V head dim differs in one case
            const int n_tok = c->n_tok, n_ctx = n_tok + 11;
            const size_t nk = (size_t)n_tok * n_kv_heads * hd,
                         nv = (size_t)n_tok * n_kv_heads * hdv;
            float *k = nrand_array(nk, 1.0f), *v = nrand_array(nv, 1.0f);
            // Q with twice the heads (GQA) rides in the same launch
            const size_t nq = 2 * nk;
            float *q = nrand_array(nq, 1.0f);
            int32_t *pos = malloc((size_t)n_tok * sizeof *pos);
            int32_t *cells = malloc((size_t)n_ctx * sizeof *cells);
            for (int i = 0; i < n_ctx; i++)
                cells[i] = i;
            for (int i = n_ctx - 1; i > 0; i--) { // distinct cells in random order
                const int j = irand(0, i);
                const int32_t s = cells[i];
                cells[i] = cells[j];
                cells[j] = s;
            }
            for (int t = 0; t < n_tok; t++)
                pos[t] = irand(0, 5000);
            float *ff = make_factors(c->n_rot / 2);
            const size_t ek = tk == GGML_TYPE_F16 ? 2 : 4, ev = tv == GGML_TYPE_F16 ? 2 : 4;
            const size_t kc_n = (size_t)n_ctx * n_kv_heads * hd,
                         vc_n = (size_t)n_ctx * n_kv_heads * hdv;
            struct dbuf bk = dbuf_new(k, nk * sizeof(float));
            struct dbuf bq = dbuf_new(q, nq * sizeof(float));
            struct dbuf bv = dbuf_new(v, nv * sizeof(float));
            struct dbuf bp = dbuf_new(pos, (size_t)n_tok * sizeof(int32_t));
            struct dbuf bc = dbuf_new(cells, (size_t)n_tok * sizeof(int32_t));
            struct dbuf bf = dbuf_new(ff, (size_t)(c->n_rot / 2) * sizeof(float));
            struct dbuf bkc = dbuf_new(NULL, kc_n * ek);
            struct dbuf bvc = dbuf_new(NULL, vc_n * ev);
            const struct rope_params rpc = rope_params_for(c, c->factors ? bf.c : NULL);
            const struct rope_params rpg = rope_params_for(c, c->factors ? bf.g : NULL);
            OK(cpu, cpu->ops->rope_kv_store(cpu, bq.c, 2 * n_kv_heads, bk.c, bv.c, bkc.c, tk, bvc.c,
                                            tv, bp.c, bc.c, n_tok, n_kv_heads, hd, hdv, &rpc));
            OK(gpu, gpu->ops->rope_kv_store(gpu, bq.g, 2 * n_kv_heads, bk.g, bv.g, bkc.g, tk, bvc.g,
                                            tv, bp.g, bc.g, n_tok, n_kv_heads, hd, hdv, &rpg));
            char what[160];
            const char *tag = ti == 0 ? "f16/f16" : ti == 1 ? "f32/f32" : "f16/f32 hdv";
            float *rc, *rg;
            // Q rotated in place, the rope op's tolerance.
            {
                float *qc, *qg;
                dbuf_get(&bq, (void **)&qc, (void **)&qg);
                float *qtol = malloc(nq * sizeof *qtol);
                rope_tolerance(qtol, q, qc, n_tok * 2 * n_kv_heads, hd, c->n_rot, c->mode,
                               rope_mscale(&rpc));
                snprintf(what, sizeof what, "rope_kv_store q case %zu %s", ci, tag);
                check_close(what, qc, qg, nq, qtol, 0, 0);
                free(qtol);
                free(qc);
                free(qg);
                dbuf_free(&bq);
                free(q);
            }
            // K rotated in place (f32).
            dbuf_get(&bk, (void **)&rc, (void **)&rg);
            float *tol = malloc(nk * sizeof *tol);
            rope_tolerance(tol, k, rc, n_tok * n_kv_heads, hd, c->n_rot, c->mode,
                           rope_mscale(&rpc));
            snprintf(what, sizeof what, "rope_kv_store k case %zu %s", ci, tag);
            check_close(what, rc, rg, nk, tol, 0, 0);
            // The K cache: per cell, the tolerance of the token stored there.
            void *kcc, *kcg;
            dbuf_get(&bkc, &kcc, &kcg);
            float *kfc = cache_as_f32(kcc, tk, kc_n), *kfg = cache_as_f32(kcg, tk, kc_n);
            float *ktol = calloc(kc_n, sizeof *ktol);
            const size_t row = (size_t)n_kv_heads * hd;
            for (int t = 0; t < n_tok; t++)
                memcpy(ktol + (size_t)cells[t] * row, tol + (size_t)t * row, row * sizeof(float));
            if (tk == GGML_TYPE_F16)
                widen_tol_f16(ktol, kfc, kc_n);
            snprintf(what, sizeof what, "rope_kv_store k_cache case %zu %s", ci, tag);
            check_close(what, kfc, kfg, kc_n, ktol, 0, 0);
            // The V cache: a plain conversion, exact.
            void *vcc, *vcg;
            dbuf_get(&bvc, &vcc, &vcg);
            float *vfc = cache_as_f32(vcc, tv, vc_n), *vfg = cache_as_f32(vcg, tv, vc_n);
            snprintf(what, sizeof what, "rope_kv_store v_cache case %zu %s", ci, tag);
            check_close(what, vfc, vfg, vc_n, NULL, 0.0, 0.0);
            free(ktol);
            free(kfc);
            free(kfg);
            free(vfc);
            free(vfg);
            free(kcc);
            free(kcg);
            free(vcc);
            free(vcg);
            free(tol);
            free(rc);
            free(rg);
            dbuf_free(&bk);
            dbuf_free(&bv);
            dbuf_free(&bp);
            dbuf_free(&bc);
            dbuf_free(&bf);
            dbuf_free(&bkc);
            dbuf_free(&bvc);
            free(k);
            free(v);
            free(pos);
            free(cells);
            free(ff);
        }
    }
}

Test(cuda, kv_shift) {
    REQUIRE_GPU();
    rng_seed(60);
    for (size_t ci = 0; ci < sizeof rope_cases / sizeof rope_cases[0]; ci++) {
        for (int f16 = 0; f16 < 2; f16++) {
            const struct rope_case *c = &rope_cases[ci];
            const enum ggml_type tk = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            const int n_layer = 3, n_ctx = 37 + (int)ci, n_kv_heads = c->n_head, hd = c->head_dim;
            const size_t n = (size_t)n_layer * n_ctx * n_kv_heads * hd;
            float *kf = nrand_array(n, 1.0f);
            void *kraw = malloc(n * 4);
            for (size_t i = 0; i < n; i++) {
                if (f16)
                    ((uint16_t *)kraw)[i] = quant_f32_to_fp16(kf[i]);
                else
                    ((float *)kraw)[i] = kf[i];
            }
            float *before = cache_as_f32(kraw, tk, n);
            int32_t *delta = malloc((size_t)n_ctx * sizeof *delta);
            for (int i = 0; i < n_ctx; i++)
                delta[i] = (rng_u64() % 3 == 0) ? 0 : irand(-2000, 2000);
            float *ff = make_factors(c->n_rot / 2);
            struct dbuf bk = dbuf_new(kraw, n * (f16 ? 2 : 4));
            struct dbuf bd = dbuf_new(delta, (size_t)n_ctx * sizeof(int32_t));
            struct dbuf bf = dbuf_new(ff, (size_t)(c->n_rot / 2) * sizeof(float));
            const struct rope_params rpc = rope_params_for(c, c->factors ? bf.c : NULL);
            const struct rope_params rpg = rope_params_for(c, c->factors ? bf.g : NULL);
            OK(cpu,
               cpu->ops->kv_shift(cpu, bk.c, tk, bd.c, n_layer, n_ctx, n_kv_heads, hd, &rpc, 0));
            OK(gpu,
               gpu->ops->kv_shift(gpu, bk.g, tk, bd.g, n_layer, n_ctx, n_kv_heads, hd, &rpg, 0));
            void *rc, *rg;
            dbuf_get(&bk, &rc, &rg);
            float *fc = cache_as_f32(rc, tk, n), *fg = cache_as_f32(rg, tk, n);
            // A pure rotation (mscale 1): the rope tolerance with mscale 1,
            // widened by one f16 ulp for an F16 cache; cells with delta 0 and
            // the unrotated dims are exact.
            float *tol = malloc(n * sizeof *tol);
            rope_tolerance(tol, before, fc, n_layer * n_ctx * n_kv_heads, hd, c->n_rot, c->mode,
                           1.0f);
            if (f16)
                widen_tol_f16(tol, fc, n);
            for (int l = 0; l < n_layer; l++)
                for (int cell = 0; cell < n_ctx; cell++)
                    if (delta[cell] == 0)
                        for (size_t i = 0; i < (size_t)n_kv_heads * hd; i++)
                            tol[((size_t)l * n_ctx + cell) * n_kv_heads * hd + i] = 0.0f;
            char what[128];
            snprintf(what, sizeof what, "kv_shift case %zu %s", ci, f16 ? "f16" : "f32");
            check_close(what, fc, fg, n, tol, 0, 0);
            // Independent of the CPU: a rotation keeps each pair's norm (the
            // shift must not apply attn_factor / YaRN mscale, here 1.3+).
            if (!f16) {
                const int np = c->n_rot / 2;
                double worst = 0.0;
                for (size_t r = 0; r < n / hd; r++)
                    for (int i = 0; i < np; i++) {
                        const int e0 = c->mode == ROPE_MODE_NEOX ? i : 2 * i;
                        const int e1 = c->mode == ROPE_MODE_NEOX ? i + np : 2 * i + 1;
                        const float *b = before + r * hd, *a = fg + r * hd;
                        const double nb = hypot(b[e0], b[e1]), na = hypot(a[e0], a[e1]);
                        const double e = fabs(na - nb) / (nb + 1e-6);
                        if (e > worst)
                            worst = e;
                    }
                cr_log_info("%s: worst relative change of a pair's norm %.3g", what, worst);
                cr_expect_lt(worst, 1e-5, "%s: the shift changed magnitudes (%.3g)", what, worst);
            }
            free(tol);
            free(fc);
            free(fg);
            free(rc);
            free(rg);
            free(before);
            dbuf_free(&bk);
            dbuf_free(&bd);
            dbuf_free(&bf);
            free(kf);
            free(kraw);
            free(delta);
            free(ff);
        }
    }
}

// ---------------------------------------------------------------------------
// attention

struct attn_case {
    int n_tok, n_kv, n_head, n_head_kv, head_dim, head_dim_v;
    enum ggml_type tk, tv;
    bool causal; // cell c holds pos c of sequence 0; queries are the last n_tok positions
    int n_seq;   // random layout: sequences 0..n_seq-1 (seq_words = ceil(n_seq/64))
    const char *note;
    int window; // sliding window (attn_args.window); 0: none
};

// Sinks of attn_check_sinks' calls (head h takes [h % 8]): one far above any
// score (the row is almost all sink), ones near the log of a row's weight
// sum, zero, ones far below.
static const float attn_sink_logits[8] = {6.0f, 2.0f, 0.0f, -1.5f, -30.0f, 20.0f, 3.25f, 1.0f};

// Added to the f32 tolerance for cases that run on tensor cores (see
// attn_check_case), relative to max|v|.
#define ATTN_TC_REL_TOL 2e-3

static const struct attn_case attn_cases[] = {
    {1, 1, 8, 8, 64, 64, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "one cell", 0},
    {1, 100, 32, 8, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "decode gqa4", 0},
    {1, 5000, 8, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "decode split-k", 0},
    {1, 3000, 4, 4, 256, 256, GGML_TYPE_F32, GGML_TYPE_F16, true, 1, "decode hd256 split-k", 0},
    {2, 2000, 14, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, false, 3, "decode gqa7 multi-seq", 0},
    {3, 777, 6, 3, 80, 80, GGML_TYPE_F32, GGML_TYPE_F32, false, 2, "hd80", 0},
    {33, 33, 8, 4, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "prefill causal", 0},
    {64, 200, 12, 4, 96, 96, GGML_TYPE_F32, GGML_TYPE_F16, true, 1, "prefill hd96", 0},
    {17, 300, 4, 1, 192, 128, GGML_TYPE_F16, GGML_TYPE_F16, false, 5, "mqa dk192 dv128", 0},
    {128, 1500, 8, 8, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "prefill long", 0},
    {40, 600, 16, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F32, false, 100, "seq ids >= 64", 0},
    {5, 0, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "empty cache", 0},
    // head dims that are not whole 16-byte vectors: element-wise tile loads
    {2, 300, 4, 2, 36, 36, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "hd36 scalar tile loads", 0},
    {1, 700, 4, 4, 66, 66, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "hd66 f32 scalar tile loads", 0},
    // attn_kernel's dynamic shared memory is exactly 48 KiB here; with its
    // static int that is over the default limit, so the launcher must raise
    // it (hardware only: the emulator counts dynamic shared memory alone)
    {2, 300, 4, 2, 128, 190, GGML_TYPE_F16, GGML_TYPE_F32, false, 2, "dk128 dv190 48 KiB smem", 0},
    // sliding windows (gemma3's local layers): split-K decode whose early
    // splits see nothing, prefill rows whose windows end inside a tile, and
    // random layouts (positions up to 2 n_kv)
    {1, 5000, 8, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "decode split-k window", 700},
    {2, 3000, 4, 4, 256, 256, GGML_TYPE_F32, GGML_TYPE_F16, true, 1, "decode hd256 window 1", 1},
    {20, 200, 4, 2, 64, 64, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "prefill f32 window", 7},
    {33, 300, 8, 4, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "prefill tc window", 50},
    {3, 777, 6, 3, 80, 80, GGML_TYPE_F32, GGML_TYPE_F32, false, 2, "random window", 300},
};

static void *cache_from(const float *f, enum ggml_type t, size_t n) {
    void *d = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        if (t == GGML_TYPE_F16)
            ((uint16_t *)d)[i] = quant_f32_to_fp16(f[i]);
        else
            ((float *)d)[i] = f[i];
    }
    return d;
}

// The CUDA backend runs F16/F16 caches with >= 16 tokens and head dims that
// are multiples of 16 on tensor cores (cuda/attention.cu, attn_tc_kernel):
// q * scale and the softmax weights P are rounded to f16 there.
static bool attn_case_on_tensor_cores(const struct attn_case *c) {
    return c->tk == GGML_TYPE_F16 && c->tv == GGML_TYPE_F16 && c->n_tok >= 16 &&
           c->head_dim % 16 == 0 && c->head_dim_v % 16 == 0;
}

// act_q8 (q8_follow, decode cases with head_dim_v % 32 == 0): attention with
// out_q8 also writes its output as q8_1 for the mat-vec right after it (the
// output projection); that mat-vec must equal the same one after attention
// without out_q8 (which quantizes the output itself), bit for bit, split-K
// combine included; any other op right after it is refused.
static void attn_q8_follow(const struct attn_case *c, const struct attn_args *ag_in) {
    struct attn_args q8 = *ag_in, plain = *ag_in;
    q8.out_q8 = true;
    plain.out_q8 = false;
    const struct attn_args *ag = &q8;
    const int64_t n_in = (int64_t)c->n_head * c->head_dim_v, n_out = 37;
    void *wh = make_weight(GGML_TYPE_Q4_0, n_in, n_out);
    void *wg = gpu_put(wh, ggml_row_bytes(GGML_TYPE_Q4_0, n_in) * n_out);
    const struct backend_weight bw = {wg, GGML_TYPE_Q4_0, n_in, n_out};
    void *o1, *o2, *dummy;
    OK(gpu, gpu->ops->alloc(gpu, (size_t)c->n_tok * n_out * sizeof(float), &o1));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)c->n_tok * n_out * sizeof(float), &o2));
    OK(gpu, gpu->ops->alloc(gpu, 64, &dummy));
    OK(gpu, gpu->ops->memset_zero(gpu, dummy, 64)); // the add reads it (initcheck)
    gpu->act_q8 = true;
    OK(gpu, gpu->ops->attention(gpu, ag));
    OK(gpu, gpu->ops->matmul(gpu, o1, &bw, ag->out, NULL, c->n_tok)); // the q8 copy
    OK(gpu, gpu->ops->attention(gpu, &plain));
    OK(gpu, gpu->ops->matmul(gpu, o2, &bw, ag->out, NULL, c->n_tok)); // quantizes out itself
    OK(gpu, gpu->ops->attention(gpu, ag));
    cr_expect_eq(gpu->ops->add(gpu, dummy, dummy, 4), VERR_RANGE,
                 "%s: an op between attention (out_q8) and its mat-vec", c->note);
    OK(gpu, gpu->ops->add(gpu, dummy, dummy, 4)); // the refusal left nothing pending
    gpu->act_q8 = false;
    float *a = gpu_fetch(o1, (size_t)c->n_tok * n_out),
          *b = gpu_fetch(o2, (size_t)c->n_tok * n_out);
    char what[160];
    snprintf(what, sizeof what, "attention %s q8 -> matmul", c->note);
    count_bit_diffs(what, a, b, (size_t)c->n_tok * n_out);
    free(a);
    free(b);
    void *gf[] = {wg, o1, o2, dummy};
    for (size_t i = 0; i < sizeof gf / sizeof gf[0]; i++)
        gpu->ops->free(gpu, gf[i]);
    free(wh);
}

// Runs one case on both backends and checks the outputs; returns the worst
// error relative to max|v|. q8_follow: also attn_q8_follow where it applies;
// with_sinks: the calls take attn_sink_logits as their sinks.
static double attn_check_sinks(const struct attn_case *c, bool q8_follow, bool with_sinks) {
    {
        const int n_tok = c->n_tok, n_kv = c->n_kv;
        const int seq_words = (c->n_seq + 63) / 64;
        const size_t nq = (size_t)n_tok * c->n_head * c->head_dim;
        const size_t nk = (size_t)(n_kv > 0 ? n_kv : 1) * c->n_head_kv * c->head_dim;
        const size_t nv = (size_t)(n_kv > 0 ? n_kv : 1) * c->n_head_kv * c->head_dim_v;
        float *q = nrand_array(nq, 1.0f), *kf = nrand_array(nk, 1.0f), *vf = nrand_array(nv, 1.0f);
        void *k = cache_from(kf, c->tk, nk), *v = cache_from(vf, c->tv, nv);
        const int nc = n_kv > 0 ? n_kv : 1;
        int32_t *cell_pos = malloc((size_t)nc * sizeof *cell_pos);
        uint64_t *cell_seq = calloc((size_t)nc * seq_words, sizeof *cell_seq);
        int32_t *q_pos = malloc((size_t)n_tok * sizeof *q_pos);
        int32_t *q_seq = malloc((size_t)n_tok * sizeof *q_seq);
        if (c->causal) {
            for (int i = 0; i < n_kv; i++) {
                cell_pos[i] = i;
                cell_seq[(size_t)i * seq_words] = 1;
            }
            for (int t = 0; t < n_tok; t++) {
                q_pos[t] = n_kv - n_tok + t; // may be negative: such rows see nothing
                q_seq[t] = 0;
            }
        } else {
            for (int i = 0; i < n_kv; i++) {
                cell_pos[i] = (rng_u64() % 10 == 0) ? -1 : irand(0, 2 * n_kv);
                if (cell_pos[i] < 0)
                    continue;
                const int s = irand(0, c->n_seq - 1);
                cell_seq[(size_t)i * seq_words + s / 64] |= 1ull << (s % 64);
                if (rng_u64() % 4 == 0) { // shared by a second sequence
                    const int s2 = irand(0, c->n_seq - 1);
                    cell_seq[(size_t)i * seq_words + s2 / 64] |= 1ull << (s2 % 64);
                }
            }
            for (int t = 0; t < n_tok; t++) {
                q_pos[t] = irand(0, 2 * n_kv);
                q_seq[t] = irand(0, c->n_seq - 1);
            }
            // Rows that see nothing: a position before every cell, and (when
            // the sequence ids allow) a sequence no cell holds.
            q_pos[0] = -1;
            if (n_tok > 2 && c->n_seq < 64 * seq_words)
                q_seq[2] = c->n_seq;
        }
        struct dbuf bq = dbuf_new(q, nq * sizeof(float));
        struct dbuf bk = dbuf_new(k, nk * (c->tk == GGML_TYPE_F16 ? 2 : 4));
        struct dbuf bv = dbuf_new(v, nv * (c->tv == GGML_TYPE_F16 ? 2 : 4));
        struct dbuf bcp = dbuf_new(cell_pos, (size_t)nc * sizeof(int32_t));
        struct dbuf bcs = dbuf_new(cell_seq, (size_t)nc * seq_words * sizeof(uint64_t));
        struct dbuf bqp = dbuf_new(q_pos, (size_t)n_tok * sizeof(int32_t));
        struct dbuf bqs = dbuf_new(q_seq, (size_t)n_tok * sizeof(int32_t));
        const size_t no = (size_t)n_tok * c->n_head * c->head_dim_v;
        struct dbuf bo = dbuf_new(NULL, no * sizeof(float));
        float *sinks = malloc((size_t)c->n_head * sizeof *sinks);
        for (int h = 0; h < c->n_head; h++)
            sinks[h] = attn_sink_logits[h % 8];
        struct dbuf bsk = dbuf_new(sinks, (size_t)c->n_head * sizeof *sinks);
        struct attn_args ac = {
            .out = bo.c,
            .q = bq.c,
            .k = bk.c,
            .v = bv.c,
            .type_k = c->tk,
            .type_v = c->tv,
            .cell_pos = bcp.c,
            .cell_seq = bcs.c,
            .seq_words = seq_words,
            .q_pos = bqp.c,
            .q_seq = bqs.c,
            .n_tok = n_tok,
            .n_kv = n_kv,
            .n_head = c->n_head,
            .n_head_kv = c->n_head_kv,
            .head_dim = c->head_dim,
            .head_dim_v = c->head_dim_v,
            .scale = 1.0f / sqrtf((float)c->head_dim),
            .window = c->window,
            .sinks = with_sinks ? bsk.c : NULL,
        };
        struct attn_args ag = ac;
        ag.sinks = with_sinks ? bsk.g : NULL;
        ag.out = bo.g;
        ag.q = bq.g;
        ag.k = bk.g;
        ag.v = bv.g;
        ag.cell_pos = bcp.g;
        ag.cell_seq = bcs.g;
        ag.q_pos = bqp.g;
        ag.q_seq = bqs.g;
        // Poison the GPU output: every element must be written.
        float *nan = malloc(no * sizeof *nan + 4);
        for (size_t i = 0; i < no; i++)
            nan[i] = NAN;
        OK(gpu, gpu->ops->upload(gpu, bo.g, nan, no * sizeof(float)));
        OK(cpu, cpu->ops->attention(cpu, &ac));
        OK(gpu, gpu->ops->attention(gpu, &ag));
        float *rc, *rg;
        dbuf_get(&bo, (void **)&rc, (void **)&rg);
        // Both sides see the same f32 values (f16 caches widen exactly). The
        // output is a convex combination of V rows, and moving one score s_c
        // by delta moves it by at most 2 delta max|v|. Scores differ by up to
        // ~1e-5 (dot products of <= 256 terms summed in other orders with
        // |s| ~ 1..10, q pre-scaled instead of the dot, expf within 2 ulp):
        // 3e-5 max|v|. The n_kv-term sums of weights and of weighted V rows
        // add a random walk of sqrt(n_kv) roundings: 8 sqrt(n_kv) 2^-24 max|v|.
        // A mask, GQA or split-merge error moves outputs by O(max|v| / #vis).
        // With sinks the output is that combination times a factor <= 1 (the
        // sink's share of the denominator taken out), the same bounds; a sink
        // missed, joined once per split or of another head moves it by far
        // more where the sink is near the log of the row's weight sum.
        float vmax = 0.0f;
        for (size_t i = 0; i < nv; i++) {
            const float a = c->tv == GGML_TYPE_F16 ? fabsf(quant_fp16_to_f32(((uint16_t *)v)[i]))
                                                   : fabsf(vf[i]);
            if (a > vmax)
                vmax = a;
        }
        double atol = (3e-5 + 8.0 * sqrt((double)n_kv) / 16777216.0) * vmax;
        // Tensor cores: P rounded to f16 changes each weight by <= 2^-11
        // relative, and l sums the rounded weights, so the output stays a
        // convex combination, moved by <= 2 * 2^-11 max|v| ~ 1e-3 max|v| if
        // every weight rounded the same way (independent roundings: ~1e-4).
        // q * scale rounded to f16 (|dq| <= 2^-11 |q|) moves a score by
        // about 2^-11 / sqrt(3) * sqrt(sum_d (q_d k_d scale)^2) ~ 3e-4 for
        // unit normal q, k at any head dim (scale = 1/sqrt(D)); the output
        // moves by <= 2 max|ds| max|v| only if a row's scores all move
        // together, and by ~|ds| / sqrt(#vis) max|v| typically. Tolerance
        // 2e-3 max|v| (observed worst under emulation: 1.7e-4 max|v|); a
        // wrong mask moves outputs by O(max|v| / #vis), far more for the
        // causal first rows and the sparse rows of the random layouts.
        if (attn_case_on_tensor_cores(c))
            atol += ATTN_TC_REL_TOL * vmax;
        char what[160];
        snprintf(
            what, sizeof what, "attention %s: toks %d kv %d heads %d/%d hd %d/%d %s/%s window %d%s",
            c->note, n_tok, n_kv, c->n_head, c->n_head_kv, c->head_dim, c->head_dim_v,
            ggml_type_name(c->tk), ggml_type_name(c->tv), c->window, with_sinks ? " sinks" : "");
        check_close(what, rc, rg, no, NULL, atol, 0.0);
        if (q8_follow && n_tok <= CUDA_MATVEC_MAX_TOK && c->head_dim_v % 32 == 0)
            attn_q8_follow(c, &ag);
        double worst = 0.0;
        for (size_t i = 0; i < no; i++)
            if (fabs((double)rc[i] - rg[i]) > worst)
                worst = fabs((double)rc[i] - rg[i]);
        worst = vmax > 0.0f ? worst / vmax : worst;
        free(nan);
        free(rc);
        free(rg);
        dbuf_free(&bq);
        dbuf_free(&bk);
        dbuf_free(&bv);
        dbuf_free(&bcp);
        dbuf_free(&bcs);
        dbuf_free(&bqp);
        dbuf_free(&bqs);
        dbuf_free(&bo);
        dbuf_free(&bsk);
        free(sinks);
        free(q);
        free(kf);
        free(vf);
        free(k);
        free(v);
        free(cell_pos);
        free(cell_seq);
        free(q_pos);
        free(q_seq);
        return worst;
    }
}

static double attn_check_case(const struct attn_case *c, bool q8_follow) {
    return attn_check_sinks(c, q8_follow, false);
}

Test(cuda, attention) {
    REQUIRE_GPU();
    rng_seed(70);
    for (size_t ci = 0; ci < sizeof attn_cases / sizeof attn_cases[0]; ci++)
        attn_check_case(&attn_cases[ci], false);
}

// Prefill on tensor cores: odd token counts 16..200, n_kv to ~600, GQA and
// MHA, causal and random two-sequence layouts (empty cells, cells shared by
// both sequences, rows that see nothing), every supported head dim (the
// kernel's KV tile is 64 cells for head dims <= 96, 32 above).
static const struct attn_case attn_tc_cases[] = {
    {16, 16, 4, 4, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "tc hd64 smallest", 0},
    {77, 333, 8, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "tc hd64 gqa4 2 seqs", 0},
    {200, 600, 4, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "tc hd64 causal", 0},
    {31, 129, 6, 6, 80, 80, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "tc hd80", 0},
    {45, 250, 4, 1, 96, 96, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "tc hd96 mqa 2 seqs", 0},
    {65, 200, 8, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "tc hd128 gqa4 causal", 0},
    {101, 555, 4, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "tc hd128 2 seqs", 0},
    {19, 97, 2, 1, 256, 256, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "tc hd256 2 seqs", 0},
    {37, 150, 2, 2, 256, 256, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "tc hd256 causal", 0},
};

Test(cuda, attention_q8_feeds_the_next_matvec) {
    REQUIRE_GPU();
    rng_seed(71);
    int n = 0;
    for (size_t ci = 0; ci < sizeof attn_cases / sizeof attn_cases[0]; ci++) {
        const struct attn_case *c = &attn_cases[ci];
        if (c->n_tok <= CUDA_MATVEC_MAX_TOK && c->head_dim_v % 32 == 0 && c->n_kv > 0) {
            attn_check_case(c, true);
            n++;
        }
    }
    cr_expect_geq(n, 4, "decode cases with a q8_1 copy: %d", n);
}

Test(cuda, attention_prefill_tensor_cores) {
    REQUIRE_GPU();
    rng_seed(71);
    double worst = 0.0;
    for (size_t ci = 0; ci < sizeof attn_tc_cases / sizeof attn_tc_cases[0]; ci++) {
        const double w = attn_check_case(&attn_tc_cases[ci], false);
        cr_log_info("%s: worst |cuda - cpu| = %.3g max|v|", attn_tc_cases[ci].note, w);
        if (w > worst)
            worst = w;
    }
    cr_log_info("tensor-core prefill: worst %.3g max|v| (tolerance %.3g)", worst, ATTN_TC_REL_TOL);
}

// Decode attention's split-K plan (cuda/attention.cu, attn_make_plan): the
// number of splits, read back from the scratch a call asks for (per (token,
// head) and split: 128 accumulators and (m, l), 520 bytes), against the rule
// worked by hand for 132 multiprocessors: ns = ceil(per_sm * 132 / blocks),
// at most n_kv_plan / min_cells and 64, then chunk = ceil(n_kv_plan / ns)
// rounded up to 32 cells and n_split = ceil(n_kv / chunk); no split below
// 512 cells (n_kv rounded up to 256).
static int attn_plan_splits(int n_head, int n_head_kv, int n_kv, int per_sm, int min_cells) {
    const struct cuda_attn a = {.n_tok = 1,
                                .n_kv = n_kv,
                                .n_head = n_head,
                                .n_head_kv = n_head_kv,
                                .head_dim = 128,
                                .head_dim_v = 128,
                                .split_blocks_per_sm = per_sm,
                                .split_min_cells = min_cells,
                                .decode = CUDA_ATTN_DECODE_SPLITK};
    const size_t b = cuda_attention_scratch_bytes(&a, 132);
    cr_assert_eq(b % ((size_t)n_head * 520), 0, "scratch %zu bytes", b);
    return b ? (int)(b / ((size_t)n_head * 520)) : 1;
}

Test(cuda, attention_split_plan) {
    const struct {
        int n_head, n_head_kv, n_kv, per_sm, min_cells, splits;
    } cases[] = {
        // llama3-8b, 4k keys: 8 blocks; default 2x256: 264 / 8 = 33 -> 16
        // (4096 / 256); 4x64: 528 / 8 = 66 -> 64 (64 cells each)
        {32, 8, 4096, 0, 0, 16},
        {32, 8, 4096, 4, 64, 64},
        // llama2-7b: 32 blocks; 2x256: 9, chunk 456 -> 480: ceil(4096 / 480)
        // = 9; 4x64: ceil(528 / 32) = 17, chunk 241 -> 256: 16
        {32, 32, 4096, 0, 0, 9},
        {32, 32, 4096, 2, 256, 9},
        {32, 32, 4096, 4, 64, 16},
        // 500 keys plan as 512: 2 splits of 256 (8 of 64); 200 keys: none
        {32, 8, 500, 0, 0, 2},
        {32, 8, 500, 4, 64, 8},
        {32, 8, 200, 4, 64, 1},
        // 64k keys, MHA, 4x64: ceil(65536 / 17) = 3856 -> 3872 cells: 17
        {32, 32, 65536, 4, 64, 17},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = attn_plan_splits(cases[i].n_head, cases[i].n_head_kv, cases[i].n_kv,
                                         cases[i].per_sm, cases[i].min_cells);
        cr_expect_eq(got, cases[i].splits, "heads %d/%d, %d keys, plan %dx%d: %d splits, want %d",
                     cases[i].n_head, cases[i].n_head_kv, cases[i].n_kv, cases[i].per_sm,
                     cases[i].min_cells, got, cases[i].splits);
    }
}

// attn_dec_kernel's plan (cuda/attention_decode.cu, attn_dec_make_plan):
// ns = ceil(per_sm * 132 / blocks), blocks = tokens x row chunks x KV heads,
// at most n_kv_plan / min_cells (default 2 x 8) and 64; chunk =
// ceil(n_kv_plan / ns) rounded up to 8 cells; n_split = ceil(n_kv / chunk).
Test(cuda, attention_decode_plan) {
    const struct {
        int n_head, n_head_kv, n_kv, splits, sync;
    } cases[] = {
        {32, 8, 256, 32, 8},    // 33 -> 256 / 8 = 32 splits of 8 cells
        {32, 8, 200, 25, 8},    // the same plan (chunk 8), 25 splits reach a cell
        {32, 8, 4096, 32, 8},   // chunk ceil(4096 / 33) = 125 -> 128
        {32, 8, 32768, 33, 8},  // chunk 993 -> 1000
        {32, 32, 256, 8, 32},   // MHA: 32 blocks, ceil(264 / 32) = 9, chunk 29 -> 32: 8 splits
        {128, 8, 4096, 17, 16}, // GQA 16: two chunks of 8 rows, 16 blocks: 17, 241 -> 248
        {8, 8, 1, 1, 0},        // 1 cell: one split, no counters
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct cuda_attn a = {.n_tok = 1,
                                    .n_kv = cases[i].n_kv,
                                    .n_head = cases[i].n_head,
                                    .n_head_kv = cases[i].n_head_kv,
                                    .head_dim = 128,
                                    .head_dim_v = 128,
                                    .type_k = GGML_TYPE_F16,
                                    .type_v = GGML_TYPE_F16};
        const size_t b = cuda_attention_scratch_bytes(&a, 132);
        const size_t per = (size_t)cases[i].n_head * 520;
        const int got = b ? (int)(b / per) : 1;
        cr_expect_eq(b % per, 0, "scratch %zu bytes", b);
        cr_expect_eq(got, cases[i].splits, "heads %d/%d, %d keys: %d splits, want %d",
                     cases[i].n_head, cases[i].n_head_kv, cases[i].n_kv, got, cases[i].splits);
        cr_expect_eq(cuda_attention_sync_count(&a, 132), cases[i].sync, "counters");
    }
}

// backend_cuda_set_attn_split sets the split-K plan of a CUDA backend (a
// variant under test, cuda/backend_cuda.h); plans the kernel cannot take are
// refused. A plan of many splits (4x64) matches the CPU as the default does.
Test(cuda, attention_split_variant) {
    REQUIRE_GPU();
    struct backend *many = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cuda_create(&many, 0, &err), 0, "%s", err.msg);
    const int bad[][2] = {{4, 65}, {0, 64}, {65, 64}, {4, 0}, {4, 12}, {4, 65568}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(backend_cuda_set_attn_split(many, bad[i][0], bad[i][1], &err), VERR_RANGE,
                     "plan %dx%d accepted", bad[i][0], bad[i][1]);
    cr_expect_eq(backend_cuda_set_attn_split(cpu, 4, 64, &err), VERR_RANGE, "the CPU backend");
    cr_assert_eq(backend_cuda_set_attn_split(many, 4, 64, &err), 0, "%s", err.msg);
    many->act_q8 = false;
    struct backend *const saved = gpu;
    gpu = many;
    rng_seed(72);
    for (size_t ci = 0; ci < sizeof attn_cases / sizeof attn_cases[0]; ci++)
        if (attn_cases[ci].n_tok <= 2 && attn_cases[ci].n_kv >= 2000)
            attn_check_case(&attn_cases[ci], false); // the split-K decode cases
    gpu = saved;
    backend_destroy(many);
}

// attn_dec_kernel (cuda/attention_decode.cu), the default decode kernel,
// at its edges: one cell, cell counts that are not multiples of its step (8
// cells a warp for F16 head dim 128) or of the plan's 256, row blocks of 1,
// 4 and 8 query heads (GQA 1, 2, 4, 7, 8, 16: two row chunks), head dims
// 64/128/256, F16 and F32, several sequences with empty and shared cells,
// 8 tokens, windows. Each against the CPU through both kernels (the
// variant switch), and through the default with a q8_1 copy.
static const struct attn_case attn_dec_cases[] = {
    {1, 1, 32, 8, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "dec one cell gqa4", 0},
    {1, 37, 32, 4, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "dec gqa8 37 cells", 0},
    {1, 300, 8, 8, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "dec mha hd64 2 seqs", 0},
    {2, 1000, 8, 2, 256, 256, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "dec hd256 gqa4", 0},
    {4, 700, 8, 4, 128, 128, GGML_TYPE_F32, GGML_TYPE_F32, false, 3, "dec f32 gqa2 3 seqs", 0},
    {3, 500, 16, 1, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "dec gqa16 row chunks", 0},
    {8, 900, 32, 8, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, false, 5, "dec 8 tok 5 seqs window",
     300},
    {1, 4099, 32, 8, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "dec 4099 cells window",
     1000},
    {1, 257, 4, 1, 256, 256, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "dec f32 hd256 mqa", 0},
    {2, 70, 14, 2, 64, 64, GGML_TYPE_F32, GGML_TYPE_F32, false, 70, "dec gqa7 seq ids >= 64", 0},
};

Test(cuda, attention_decode_kernels) {
    REQUIRE_GPU();
    struct verr err = {0};
    cr_expect_eq(backend_cuda_set_attn_decode(gpu, 3, &err), VERR_RANGE, "kernel 3 accepted");
    cr_expect_eq(backend_cuda_set_attn_decode(cpu, 1, &err), VERR_RANGE, "the CPU backend");
    const int kernels[] = {CUDA_ATTN_DECODE_DEC, CUDA_ATTN_DECODE_SPLITK, CUDA_ATTN_DECODE_AUTO};
    for (size_t ki = 0; ki < sizeof kernels / sizeof kernels[0]; ki++) {
        cr_assert_eq(backend_cuda_set_attn_decode(gpu, kernels[ki], &err), 0, "%s", err.msg);
        rng_seed(73);
        for (size_t ci = 0; ci < sizeof attn_dec_cases / sizeof attn_dec_cases[0]; ci++)
            attn_check_case(&attn_dec_cases[ci], false);
        for (size_t ci = 0; ci < sizeof attn_cases / sizeof attn_cases[0]; ci++)
            if (attn_cases[ci].n_tok <= CUDA_ATTN_DEC_MAX_TOK)
                attn_check_case(&attn_cases[ci], false);
    }
    gpu->act_q8 = true;
    for (size_t ci = 0; ci < sizeof attn_dec_cases / sizeof attn_dec_cases[0]; ci++)
        attn_check_case(&attn_dec_cases[ci], true);
    gpu->act_q8 = false;
}

// Attention sinks (attn_args.sinks) on every kernel: attn_dec_kernel
// unsplit and split (its fused combine), attn_kernel unsplit, split (its
// combine kernel) and in prefill, attn_tc_kernel; GQA and MHA, windows,
// rows that see nothing (the random layouts), against the CPU backend
// (itself checked against a float64 formula in tests/test_attention_sinks.c)
// through each decode kernel (the variant switch).
static const struct attn_case attn_sink_cases[] = {
    {1, 1, 8, 8, 64, 64, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "sinks one cell", 0},
    {1, 100, 32, 8, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "sinks decode gqa4", 0},
    {1, 3000, 8, 2, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "sinks decode split window",
     700},
    {2, 2000, 14, 2, 64, 64, GGML_TYPE_F16, GGML_TYPE_F16, false, 3, "sinks decode gqa7 3 seqs", 0},
    {3, 777, 6, 3, 80, 80, GGML_TYPE_F32, GGML_TYPE_F32, false, 2, "sinks hd80 (attn_kernel)", 0},
    {20, 200, 4, 2, 64, 64, GGML_TYPE_F32, GGML_TYPE_F32, true, 1, "sinks prefill f32 window", 7},
    {33, 300, 8, 4, 128, 128, GGML_TYPE_F16, GGML_TYPE_F16, true, 1, "sinks prefill tc window", 50},
    {45, 250, 4, 1, 96, 96, GGML_TYPE_F16, GGML_TYPE_F16, false, 2, "sinks tc mqa 2 seqs", 0},
};

Test(cuda, attention_sinks) {
    REQUIRE_GPU();
    struct verr err = {0};
    const int kernels[] = {CUDA_ATTN_DECODE_DEC, CUDA_ATTN_DECODE_SPLITK};
    for (size_t ki = 0; ki < sizeof kernels / sizeof kernels[0]; ki++) {
        cr_assert_eq(backend_cuda_set_attn_decode(gpu, kernels[ki], &err), 0, "%s", err.msg);
        rng_seed(74);
        double worst = 0.0;
        for (size_t ci = 0; ci < sizeof attn_sink_cases / sizeof attn_sink_cases[0]; ci++) {
            if (ki > 0 && attn_sink_cases[ci].n_tok > CUDA_ATTN_DEC_MAX_TOK)
                continue; // the switch changes decode calls only
            const double w = attn_check_sinks(&attn_sink_cases[ci], false, true);
            worst = w > worst ? w : worst;
        }
        cr_log_info("attention sinks, decode kernel %d: worst |cuda - cpu| = %.3g max|v|",
                    kernels[ki], worst);
    }
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_AUTO, &err), 0, "%s", err.msg);
    gpu->act_q8 = true; // the q8_1 copy of a decode output with sinks
    for (size_t ci = 0; ci < sizeof attn_sink_cases / sizeof attn_sink_cases[0]; ci++)
        if (attn_sink_cases[ci].n_tok <= 2 && attn_sink_cases[ci].n_kv > 1)
            attn_check_sinks(&attn_sink_cases[ci], true, true);
    gpu->act_q8 = false;
}

// Decode output of the 32/8-head, head dim 128, F16 call below over n_kv
// cells of which the first n_used hold positions 0.. of sequence 0 and the
// rest are empty. how: 0 through the backend (counters: one launch); 1 and
// 2 a direct cuda_attention_apply without counters (a second launch merges
// the splits) and with fresh ones. sinks: NULL or [32] (attn_args.sinks).
static float *attn_dec_run(const float *q, const uint16_t *k, const uint16_t *v, int n_used,
                           int n_kv, int how, const float *sinks) {
    const int n_head = 32, n_head_kv = 8, D = 128;
    int32_t *cell_pos = malloc((size_t)n_kv * sizeof *cell_pos);
    uint64_t *cell_seq = calloc((size_t)n_kv, sizeof *cell_seq);
    for (int i = 0; i < n_kv; i++) {
        cell_pos[i] = i < n_used ? i : -1;
        cell_seq[i] = i < n_used ? 1 : 0;
    }
    const int32_t q_pos = n_used - 1, q_seq = 0;
    void *bq, *bk, *bv, *bcp, *bcs, *bqp, *bqs, *bo, *bsk = NULL;
    const size_t nkv = (size_t)n_kv * n_head_kv * D;
    if (sinks) {
        OK(gpu, gpu->ops->alloc(gpu, (size_t)n_head * 4, &bsk));
        OK(gpu, gpu->ops->upload(gpu, bsk, sinks, (size_t)n_head * 4));
    }
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_head * D * 4, &bq));
    OK(gpu, gpu->ops->alloc(gpu, nkv * 2, &bk));
    OK(gpu, gpu->ops->alloc(gpu, nkv * 2, &bv));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_kv * 4, &bcp));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_kv * 8, &bcs));
    OK(gpu, gpu->ops->alloc(gpu, 4, &bqp));
    OK(gpu, gpu->ops->alloc(gpu, 4, &bqs));
    OK(gpu, gpu->ops->alloc(gpu, (size_t)n_head * D * 4, &bo));
    OK(gpu, gpu->ops->upload(gpu, bq, q, (size_t)n_head * D * 4));
    OK(gpu, gpu->ops->upload(gpu, bk, k, nkv * 2));
    OK(gpu, gpu->ops->upload(gpu, bv, v, nkv * 2));
    OK(gpu, gpu->ops->upload(gpu, bcp, cell_pos, (size_t)n_kv * 4));
    OK(gpu, gpu->ops->upload(gpu, bcs, cell_seq, (size_t)n_kv * 8));
    OK(gpu, gpu->ops->upload(gpu, bqp, &q_pos, 4));
    OK(gpu, gpu->ops->upload(gpu, bqs, &q_seq, 4));
    const float scale = 1.0f / sqrtf((float)D);
    if (how == 0) {
        struct attn_args ag = {.out = bo,
                               .q = bq,
                               .k = bk,
                               .v = bv,
                               .type_k = GGML_TYPE_F16,
                               .type_v = GGML_TYPE_F16,
                               .cell_pos = bcp,
                               .cell_seq = bcs,
                               .seq_words = 1,
                               .q_pos = bqp,
                               .q_seq = bqs,
                               .n_tok = 1,
                               .n_kv = n_kv,
                               .n_head = n_head,
                               .n_head_kv = n_head_kv,
                               .head_dim = D,
                               .head_dim_v = D,
                               .scale = scale,
                               .sinks = bsk};
        OK(gpu, gpu->ops->attention(gpu, &ag));
    } else {
        struct cuda_attn ca = {.out = bo,
                               .q = bq,
                               .k = bk,
                               .v = bv,
                               .type_k = GGML_TYPE_F16,
                               .type_v = GGML_TYPE_F16,
                               .cell_pos = bcp,
                               .cell_seq = bcs,
                               .seq_words = 1,
                               .q_pos = bqp,
                               .q_seq = bqs,
                               .n_tok = 1,
                               .n_kv = n_kv,
                               .n_head = n_head,
                               .n_head_kv = n_head_kv,
                               .head_dim = D,
                               .head_dim_v = D,
                               .scale = scale,
                               .decode = CUDA_ATTN_DECODE_DEC};
        int sm = 0;
        cr_assert_eq(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, gpu->device), 0);
        const size_t sb = cuda_attention_scratch_bytes(&ca, sm);
        void *scratch = NULL, *sync = NULL;
        if (sb)
            OK(gpu, gpu->ops->alloc(gpu, sb, &scratch));
        if (how == 2) {
            ca.sync_n = cuda_attention_sync_count(&ca, sm);
            cr_assert_gt(ca.sync_n, 0, "a split call");
            OK(gpu, gpu->ops->alloc(gpu, (size_t)ca.sync_n * 4, &sync));
            OK(gpu, gpu->ops->memset_zero(gpu, sync, (size_t)ca.sync_n * 4));
            ca.sync = sync;
        }
        OK(gpu, gpu->ops->sync(gpu));
        struct verr err = {0};
        cr_assert_eq(cuda_attention_apply(&ca, bsk, sm, scratch, sb, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(cudaDeviceSynchronize(), 0);
        if (scratch)
            gpu->ops->free(gpu, scratch);
        if (sync)
            gpu->ops->free(gpu, sync);
    }
    float *out = malloc((size_t)n_head * D * 4);
    OK(gpu, gpu->ops->download(gpu, out, bo, (size_t)n_head * D * 4));
    OK(gpu, gpu->ops->sync(gpu));
    void *bufs[] = {bq, bk, bv, bcp, bcs, bqp, bqs, bo};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        gpu->ops->free(gpu, bufs[i]);
    if (bsk)
        gpu->ops->free(gpu, bsk);
    free(cell_pos);
    free(cell_seq);
    return out;
}

// The determinism rule (BACKEND_KV_BUCKET): attn_dec_kernel's output does
// not change when n_kv grows inside its 256-cell bucket with empty cells
// (1 cell: one split written directly, against 256: the combine of 32), nor
// between its one-launch combine (counters) and the two-launch one; with
// sinks (sinks: NULL or [32]) as without.
static void attn_dec_bits(const float *sinks) {
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_DEC, &gpu->err), 0);
    rng_seed(74);
    const int n_max = 512, n_head = 32, n_head_kv = 8, D = 128;
    float *q = nrand_array((size_t)n_head * D, 1.0f);
    float *kf = nrand_array((size_t)n_max * n_head_kv * D, 1.0f);
    float *vf = nrand_array((size_t)n_max * n_head_kv * D, 1.0f);
    uint16_t *k = cache_from(kf, GGML_TYPE_F16, (size_t)n_max * n_head_kv * D);
    uint16_t *v = cache_from(vf, GGML_TYPE_F16, (size_t)n_max * n_head_kv * D);
    const struct {
        int n_used, n_a, n_b;
    } pairs[] = {{1, 1, 256}, {300, 300, 512}, {200, 201, 256}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        float *a = attn_dec_run(q, k, v, pairs[i].n_used, pairs[i].n_a, 0, sinks);
        float *b = attn_dec_run(q, k, v, pairs[i].n_used, pairs[i].n_b, 0, sinks);
        cr_expect_eq(memcmp(a, b, (size_t)n_head * D * 4), 0,
                     "%d used cells: n_kv %d and %d differ%s", pairs[i].n_used, pairs[i].n_a,
                     pairs[i].n_b, sinks ? " (sinks)" : "");
        free(a);
        free(b);
    }
    float *a = attn_dec_run(q, k, v, 450, 500, 0, sinks);
    float *b = attn_dec_run(q, k, v, 450, 500, 1, sinks);
    float *c = attn_dec_run(q, k, v, 450, 500, 2, sinks);
    cr_expect_eq(memcmp(a, b, (size_t)n_head * D * 4), 0, "one launch and two launches differ%s",
                 sinks ? " (sinks)" : "");
    cr_expect_eq(memcmp(a, c, (size_t)n_head * D * 4), 0, "backend and direct call differ%s",
                 sinks ? " (sinks)" : "");
    free(a);
    free(b);
    free(c);
    free(q);
    free(kf);
    free(vf);
    free(k);
    free(v);
    cr_assert_eq(backend_cuda_set_attn_decode(gpu, CUDA_ATTN_DECODE_AUTO, &gpu->err), 0);
}

Test(cuda, attention_decode_bits) {
    REQUIRE_GPU();
    attn_dec_bits(NULL);
}

// The same with sinks: the standalone attn_dec_combine_kernel joins them as
// the fused combine does (attention_sinks checks the values).
Test(cuda, attention_decode_bits_sinks) {
    REQUIRE_GPU();
    float sinks[32];
    for (int h = 0; h < 32; h++)
        sinks[h] = attn_sink_logits[h % 8];
    attn_dec_bits(sinks);
}

Test(cuda, attention_rejects_large_heads) {
    REQUIRE_GPU();
    struct attn_args a = {.n_tok = 1,
                          .n_kv = 1,
                          .n_head = 1,
                          .n_head_kv = 1,
                          .head_dim = CUDA_ATTN_MAX_HEAD_DIM + 64,
                          .head_dim_v = 64,
                          .type_k = GGML_TYPE_F16,
                          .type_v = GGML_TYPE_F16,
                          .seq_words = 1};
    cr_expect_eq(gpu->ops->attention(gpu, &a), VERR_UNSUPPORTED);
    cr_log_info("head_dim %d: %s", a.head_dim, gpu->err.msg);
}

// ---------------------------------------------------------------------------
// elementwise, get_rows, argmax

// swiglu (geglu: geglu) of gate g and up u on both backends, the output in
// a buffer of its own (alias 0), in the gate's (1) or in the up's (2);
// downloads the results into fresh arrays *rc (CPU) and *rg (CUDA).
static void glu_run(bool geglu, const float *g, const float *u, int64_t n, int alias, float **rc,
                    float **rg) {
    struct dbuf bg = dbuf_new(g, (size_t)n * sizeof(float));
    struct dbuf bu = dbuf_new(u, (size_t)n * sizeof(float));
    struct dbuf bo = dbuf_new(NULL, (size_t)n * sizeof(float));
    struct dbuf *out = alias == 0 ? &bo : alias == 1 ? &bg : &bu;
    if (geglu) {
        OK(cpu, cpu->ops->geglu(cpu, out->c, bg.c, bu.c, n));
        OK(gpu, gpu->ops->geglu(gpu, out->g, bg.g, bu.g, n));
    } else {
        OK(cpu, cpu->ops->swiglu(cpu, out->c, bg.c, bu.c, n));
        OK(gpu, gpu->ops->swiglu(gpu, out->g, bg.g, bu.g, n));
    }
    dbuf_get(out, (void **)rc, (void **)rg);
    dbuf_free(&bg);
    dbuf_free(&bu);
    dbuf_free(&bo);
}

Test(cuda, swiglu_add) {
    REQUIRE_GPU();
    rng_seed(80);
    const int64_t sizes[] = {1, 37, 14336, (1 << 20) + 3};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int alias = 0; alias < 3; alias++) { // out separate, out = gate, out = up
            const int64_t n = sizes[si];
            float *g = nrand_array((size_t)n, 4.0f), *u = nrand_array((size_t)n, 1.0f);
            if (n > 2) {
                g[0] = -100.0f; // expf(100) is finite; silu ~ -0
                g[1] = 100.0f;
            }
            float *rc, *rg;
            glu_run(false, g, u, n, alias, &rc, &rg);
            char what[64];
            snprintf(what, sizeof what, "swiglu n %lld alias %d", (long long)n, alias);
            // The same expression g / (1 + expf(-g)) * u; CUDA's expf is within
            // 2 ulp, glibc's within 1: with the division and product, under
            // 8 ulps: 2^-20 relative.
            check_close(what, rc, rg, (size_t)n, NULL, 1e-30, 1.0 / 1048576);
            free(rc);
            free(rg);
            free(g);
            free(u);
        }
        const int64_t n = sizes[si];
        float *x = nrand_array((size_t)n, 1.0f), *y = nrand_array((size_t)n, 1.0f);
        struct dbuf bx = dbuf_new(x, (size_t)n * sizeof(float));
        struct dbuf by = dbuf_new(y, (size_t)n * sizeof(float));
        OK(cpu, cpu->ops->add(cpu, bx.c, by.c, n));
        OK(gpu, gpu->ops->add(gpu, bx.g, by.g, n));
        float *rc, *rg;
        dbuf_get(&bx, (void **)&rc, (void **)&rg);
        char what[64];
        snprintf(what, sizeof what, "add n %lld", (long long)n);
        check_close(what, rc, rg, (size_t)n, NULL, 0.0, 0.0); // one rounding, the same
        free(rc);
        free(rg);
        dbuf_free(&bx);
        dbuf_free(&by);
        free(x);
        free(y);
    }
}

Test(cuda, get_rows) {
    REQUIRE_GPU();
    rng_seed(90);
    const struct {
        int n_src, n_out, n;
    } cases[] = {{1, 1, 1}, {40, 7, 37}, {512, 33, 4096}, {9, 20, 5121}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n_src = cases[ci].n_src, n_out = cases[ci].n_out, n = cases[ci].n;
        float *x = nrand_array((size_t)n_src * n, 1.0f);
        int32_t *rows = malloc((size_t)n_out * sizeof *rows);
        for (int r = 0; r < n_out; r++)
            rows[r] = irand(0, n_src - 1); // repeats allowed
        rows[0] = n_src - 1;
        struct dbuf bx = dbuf_new(x, (size_t)n_src * n * sizeof(float));
        struct dbuf br = dbuf_new(rows, (size_t)n_out * sizeof(int32_t));
        struct dbuf bo = dbuf_new(NULL, (size_t)n_out * n * sizeof(float));
        OK(cpu, cpu->ops->get_rows(cpu, bo.c, bx.c, br.c, n_out, n));
        OK(gpu, gpu->ops->get_rows(gpu, bo.g, bx.g, br.g, n_out, n));
        float *rc, *rg;
        dbuf_get(&bo, (void **)&rc, (void **)&rg);
        char what[64];
        snprintf(what, sizeof what, "get_rows %d of %d x %d", n_out, n_src, n);
        check_close(what, rc, rg, (size_t)n_out * n, NULL, 0.0, 0.0); // a copy: exact
        free(rc);
        free(rg);
        dbuf_free(&bx);
        dbuf_free(&br);
        dbuf_free(&bo);
        free(x);
        free(rows);
    }
}

Test(cuda, argmax) {
    REQUIRE_GPU();
    rng_seed(100);
    const struct {
        int rows, vocab;
    } cases[] = {{1, 1}, {3, 7}, {1, 32000}, {4, 151936}, {9, 50257}, {2, 255}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int rows = cases[ci].rows, vocab = cases[ci].vocab;
        float *l = nrand_array((size_t)rows * vocab, 3.0f);
        for (int r = 0; r < rows; r++) {
            float *lr = l + (size_t)r * vocab;
            const int kind = r % 4;
            if (kind == 1) { // ties: the lowest index must win
                const float top = 50.0f;
                for (int k = 0; k < 5; k++)
                    lr[irand(0, vocab - 1)] = top;
            } else if (kind == 2) { // NaN never wins
                for (int k = 0; k < 3; k++)
                    lr[irand(0, vocab - 1)] = NAN;
            } else if (kind == 3) { // all -inf: index 0
                for (int i = 0; i < vocab; i++)
                    lr[i] = -INFINITY;
            }
        }
        struct dbuf bl = dbuf_new(l, (size_t)rows * vocab * sizeof(float));
        struct dbuf bo = dbuf_new(NULL, (size_t)rows * sizeof(int32_t));
        OK(cpu, cpu->ops->argmax(cpu, bo.c, bl.c, rows, vocab));
        OK(gpu, gpu->ops->argmax(gpu, bo.g, bl.g, rows, vocab));
        int32_t *rc, *rg;
        dbuf_get(&bo, (void **)&rc, (void **)&rg);
        int fails = 0;
        for (int r = 0; r < rows; r++)
            if (rc[r] != rg[r] && fails++ < 5)
                cr_log_error("argmax %d x %d row %d: cuda %d, cpu %d", rows, vocab, r, rg[r],
                             rc[r]);
        cr_log_info("argmax %d x %d: %d of %d rows differ", rows, vocab, fails, rows);
        cr_expect_eq(fails, 0, "argmax %d x %d: %d rows differ", rows, vocab, fails);
        free(rc);
        free(rg);
        dbuf_free(&bl);
        dbuf_free(&bo);
        free(l);
    }
}

// ---------------------------------------------------------------------------
// gemma3's ops: geglu, matmul_geglu, scale

// The geglu op on both backends rounds gelu(g) to f16 (host/ops/backend.h), so
// a 1-2 ulp difference of tanhf (glibc vs CUDA) or of the gate (a matmul's
// summation order) flips that rounding for a few elements: one f16 step,
// 2^-11 relative. Elements must agree to `tight` relative (the f32 rounding
// of the product and of the gate) except at most 2% of them, which may
// differ by up to 1e-3 relative (one f16 step plus the product's rounding).
// An f32 GELU without the f16 rounding would move most elements by ~1e-4.
//
// When the two backends' gates differ (a matmul's summation order), the f16
// rounding of the gate itself can flip by one step, and gelu's slope below
// g = -1 multiplies that step's relative size (2^-11) by up to ~10 (gelu
// falls off like the normal tail there). `alt`, when given, holds the CPU's
// products at the gate one f16 step down and up: an element off by more
// than 1e-3 from `ref` passes if it is within 1e-3 of one of those.
static void check_geglu_close(const char *what, const float *ref, const float *got, size_t n,
                              const float *scale, double tight, const float *const alt[2]) {
    size_t loose = 0, fails = 0, flips = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double s = scale ? fabs((double)scale[i]) : fabs((double)ref[i]);
        const double d = s > 1e-30 ? s : 1e-30;
        const double e = fabs((double)got[i] - ref[i]) / d;
        bool flip = false;
        for (int k = 0; alt && k < 2 && !(e <= 1e-3); k++)
            flip = flip || fabs((double)got[i] - alt[k][i]) / d <= 1e-3;
        if (!(e <= 1e-3) && !flip) {
            if (fails++ < 5)
                cr_log_error("%s: element %zu: cuda %.9g, cpu %.9g", what, i, got[i], ref[i]);
        } else if (e > tight) {
            loose++;
        }
        flips += flip;
        if (e > worst)
            worst = e;
    }
    cr_log_info("%s: worst relative error %.3g, %zu of %zu past %.1g (%zu of them the gate's f16 "
                "rounding one step apart)",
                what, worst, loose, n, tight, flips);
    cr_expect_eq(fails, 0, "%s: %zu elements off by more than 1e-3 relative", what, fails);
    cr_expect_leq(loose, n / 50 + 1, "%s: %zu of %zu elements past %.1g relative", what, loose, n,
                  tight);
}

Test(cuda, geglu_scale) {
    REQUIRE_GPU();
    rng_seed(81);
    const int64_t sizes[] = {1, 37, 14336, (1 << 16) + 3};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int alias = 0; alias < 3; alias++) { // out separate, out = gate, out = up
            const int64_t n = sizes[si];
            float *g = nrand_array((size_t)n, 4.0f), *u = nrand_array((size_t)n, 1.0f);
            if (n > 6) { // the table's edges: 0 at <= -10, the identity at >= 10
                g[0] = -100.0f;
                g[1] = 100.0f;
                g[2] = -10.0f;
                g[3] = 10.0f;
                g[4] = -9.99f;
                g[5] = 9.99f;
            }
            float *rc, *rg;
            glu_run(true, g, u, n, alias, &rc, &rg);
            char what[64];
            snprintf(what, sizeof what, "geglu n %lld alias %d", (long long)n, alias);
            // Same f16 factor times u: one f32 rounding, 2^-24.
            check_geglu_close(what, rc, rg, (size_t)n, NULL, 1.0 / 8388608, NULL);
            if (n > 6) {
                cr_expect(rc[0] == 0.0f && rg[0] == 0.0f, "geglu(-100) = 0");
                cr_expect(rc[1] == 100.0f * u[1] && rg[1] == 100.0f * u[1], "geglu(100) = 100 u");
            }
            free(rc);
            free(rg);
            free(g);
            free(u);
        }
        const int64_t n = sizes[si];
        float *x = nrand_array((size_t)n, 3.0f);
        struct dbuf bx = dbuf_new(x, (size_t)n * sizeof(float));
        OK(cpu, cpu->ops->scale(cpu, bx.c, 25.298221f, n));
        OK(gpu, gpu->ops->scale(gpu, bx.g, 25.298221f, n));
        float *rc, *rg;
        dbuf_get(&bx, (void **)&rc, (void **)&rg);
        char what[64];
        snprintf(what, sizeof what, "scale n %lld", (long long)n);
        check_close(what, rc, rg, (size_t)n, NULL, 0.0, 0.0); // one rounding, the same
        free(rc);
        free(rg);
        dbuf_free(&bx);
        free(x);
    }
}

// The CPU's geglu products with its gate moved one f16 step down (alt[0])
// and up (alt[1]): what the CUDA side computes when its gate, summed in
// another order, rounds to the neighbouring f16 (check_geglu_close).
// Every gate is already an f16 value, so gelu's own rounding keeps it.
static void cpu_geglu_f16_neighbours(float *alt[2], const struct backend_weight *wg,
                                     const struct backend_weight *wu, const float *x, int n_tok) {
    const size_t nf = (size_t)n_tok * wg->n_out, bytes = nf * sizeof(float);
    void *g = NULL, *u = NULL;
    OK(cpu, cpu->ops->alloc(cpu, bytes, &g));
    OK(cpu, cpu->ops->alloc(cpu, bytes, &u));
    OK(cpu, cpu->ops->matmul(cpu, g, wg, x, NULL, n_tok));
    OK(cpu, cpu->ops->matmul(cpu, u, wu, x, NULL, n_tok));
    float *gate = malloc(bytes), *moved = malloc(bytes);
    cr_assert(gate && moved);
    OK(cpu, cpu->ops->download(cpu, gate, g, bytes));
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < nf; i++) {
            // f16 bits are sign-magnitude: +-1 on the magnitude steps away
            // from or towards zero; "down" is towards -inf either way.
            const uint16_t h = quant_f32_to_fp16(gate[i]);
            const bool neg = h & 0x8000, towards_zero = (k == 0) != neg;
            const uint16_t m = h & 0x7fff;
            const uint16_t step =
                towards_zero ? (m ? (uint16_t)(h - 1) : (uint16_t)(h ^ 0x8001)) : (uint16_t)(h + 1);
            moved[i] = quant_fp16_to_f32(step);
        }
        OK(cpu, cpu->ops->upload(cpu, g, moved, bytes));
        void *o = NULL;
        OK(cpu, cpu->ops->alloc(cpu, bytes, &o));
        OK(cpu, cpu->ops->geglu(cpu, o, g, u, (int64_t)nf));
        alt[k] = malloc(bytes);
        cr_assert_not_null(alt[k]);
        OK(cpu, cpu->ops->download(cpu, alt[k], o, bytes));
        cpu->ops->free(cpu, o);
    }
    cpu->ops->free(cpu, g);
    cpu->ops->free(cpu, u);
    free(gate);
    free(moved);
}

// matmul_geglu: on CUDA the fused decode mat-vec (f32 and q8_1 activations)
// equals matmul + matmul + geglu bit for bit, and every path agrees with the
// CPU's as check_geglu_close allows (the gate differs by the matmul's
// summation order, ~1e-6 relative; 1e-5 leaves room for cancellation).
// Batches past CUDA_MATVEC_MAX_TOK take the GEMM path, here with F32
// weights only: with quantized weights it rounds activations to f16
// (tests/gpu/test_forward_cuda.c states that tolerance).
Test(cuda, matmul_geglu) {
    REQUIRE_GPU();
    rng_seed(82);
    const struct {
        enum ggml_type t;
        int64_t n_in, n_ff;
        int n_tok;
        bool act_q8;
    } cases[] = {
        {GGML_TYPE_F32, 96, 160, 1, false},  {GGML_TYPE_F16, 128, 130, 3, false},
        {GGML_TYPE_Q4_0, 256, 96, 8, false}, {GGML_TYPE_Q4_0, 256, 96, 2, true},
        {GGML_TYPE_Q4_K, 256, 64, 1, true},  {GGML_TYPE_F32, 64, 96, 20, false},
        {GGML_TYPE_F32, 128, 64, 9, false},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t n_in = cases[ci].n_in, n_ff = cases[ci].n_ff;
        const int n_tok = cases[ci].n_tok;
        const enum ggml_type t = cases[ci].t;
        cpu->act_q8 = gpu->act_q8 = cases[ci].act_q8;
        float *x = nrand_array((size_t)n_tok * n_in, 1.0f);
        void *wg = make_weight(t, n_in, n_ff), *wu = make_weight(t, n_in, n_ff);
        const size_t wb = ggml_row_bytes(t, n_in) * n_ff, nf = (size_t)n_tok * n_ff;
        struct dbuf bx = dbuf_new(x, (size_t)n_tok * n_in * sizeof(float));
        struct dbuf bwg = dbuf_new(wg, wb), bwu = dbuf_new(wu, wb);
        struct dbuf bo = dbuf_new(NULL, nf * sizeof(float)),
                    bt = dbuf_new(NULL, nf * sizeof(float));
        struct dbuf ug = dbuf_new(NULL, nf * sizeof(float)),
                    uu = dbuf_new(NULL, nf * sizeof(float));
        const struct backend_weight cg = {bwg.c, t, n_in, n_ff}, cu = {bwu.c, t, n_in, n_ff};
        const struct backend_weight gg = {bwg.g, t, n_in, n_ff}, gu = {bwu.g, t, n_in, n_ff};
        OK(cpu, cpu->ops->matmul_geglu(cpu, bo.c, bt.c, &cg, &cu, bx.c, n_tok));
        OK(gpu, gpu->ops->matmul_geglu(gpu, bo.g, bt.g, &gg, &gu, bx.g, n_tok));
        OK(gpu, gpu->ops->matmul(gpu, ug.g, &gg, bx.g, NULL, n_tok));
        OK(gpu, gpu->ops->matmul(gpu, uu.g, &gu, bx.g, NULL, n_tok));
        OK(gpu, gpu->ops->geglu(gpu, ug.g, ug.g, uu.g, (int64_t)nf));
        float *rc, *rg;
        dbuf_get(&bo, (void **)&rc, (void **)&rg);
        float *unf = gpu_fetch(ug.g, nf), *up = gpu_fetch(uu.g, nf);
        char what[160];
        snprintf(what, sizeof what, "matmul_geglu %s n_in %lld n_ff %lld n_tok %d%s",
                 ggml_type_name(t), (long long)n_in, (long long)n_ff, n_tok,
                 cases[ci].act_q8 ? " act_q8" : "");
        count_bit_diffs(what, rg, unf, nf);
        // relative to |gelu factor * up|'s scale: the up projection's magnitude
        float *sc = malloc(nf * sizeof *sc);
        for (size_t i = 0; i < nf; i++)
            sc[i] = fmaxf(fabsf(rc[i]), 1e-3f * fabsf(up[i]));
        float *alt[2];
        cpu_geglu_f16_neighbours(alt, &cg, &cu, bx.c, n_tok);
        check_geglu_close(what, rc, rg, nf, sc, 1e-5, (const float *const *)alt);
        free(alt[0]);
        free(alt[1]);
        free(sc);
        free(rc);
        free(rg);
        free(unf);
        free(up);
        struct dbuf *bufs[] = {&bx, &bwg, &bwu, &bo, &bt, &ug, &uu};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            dbuf_free(bufs[i]);
        free(x);
        free(wg);
        free(wu);
    }
    cpu->act_q8 = gpu->act_q8 = false;
}
