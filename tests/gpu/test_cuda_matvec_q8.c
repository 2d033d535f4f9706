// cuda/matvec_q8.cu against its CPU reference gguf/quant_q8.c:
// cuda_quantize_q8_1 byte for byte with quant_q8_1_row, and
// cuda_matvec_q8_segs with quant_dot_q8_1 for every weight type, n_tok 1, 2,
// 3 and 8, one to three segments of odd n_out, rows from one block to a few
// thousand elements (16-byte aligned rows and rows only 2-byte aligned), every
// epilogue with and without bias; the pipelined kernel (struct
// cuda_mvq_plan) bit for bit with the one-pass kernel on every case it
// takes; the streaming kernel against the reference, and bit for bit with
// itself under every plan (grids of one to many row pairs per warp, rows
// not a multiple of the warp count, shared memory limits that fit 8 tokens
// of 14336 or make it fall back); invalid arguments are refused. The worst error of every
// comparison is logged. Without a CUDA device every test skips itself. The emulator runs the same
// shapes (about 9 s on 2 cores).
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/matvec_q8.h"
#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "gguf/types.h"
#include "tests/gpu/raw_cuda.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

static void setup(void) {
    have_gpu = raw_cuda_probe();
}

TestSuite(matvec_q8, .init = setup, .timeout = 600);

// Activations: normal with the block scale varying over 1e-3 .. 1e2, an
// occasional all-zero block and an occasional block of exact ties (amax 127,
// so d = 1 and x * id = k + 0.5).
static void make_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const uint64_t kind = rng_u64() % 13;
        const float s = powf(10.0f, frand(-3.0f, 2.0f));
        for (int j = 0; j < 32; j++) {
            if (kind == 0)
                x[i + j] = 0.0f;
            else if (kind == 1)
                x[i + j] = j == 0 ? -127.0f : (float)irand(-126, 125) + 0.5f;
            else
                x[i + j] = s * nrand();
        }
    }
}

// ---------------------------------------------------------------------------
// quantize

static void check_quantize(int n_tok, int64_t n_in) {
    const size_t nx = (size_t)n_tok * (size_t)n_in, qb = (size_t)quant_q8_1_row_bytes(n_in);
    float *x = malloc(nx * sizeof *x);
    uint8_t *ref = malloc(qb * n_tok), *got = malloc(qb * n_tok);
    cr_assert(x && ref && got);
    make_x(x, (int64_t)nx);
    struct verr err = {0};
    for (int t = 0; t < n_tok; t++)
        cr_assert_eq(quant_q8_1_row(x + (size_t)t * n_in, n_in, ref + qb * t, &err), 0, "%s",
                     err.msg);
    float *dx = dev_upload(x, nx * sizeof *x);
    void *dq = dev_upload(NULL, qb * n_tok);
    for (int pdl = 0; pdl < 2; pdl++) { // launched without and with PDL (cuda/launch.cuh)
        cr_assert_eq(cudaMemset(dq, 0, qb * n_tok), cudaSuccess);
        cr_assert_eq(cuda_quantize_q8_1(dq, dx, n_tok, n_in, pdl, 0, &err), 0, "%s", err.msg);
        dev_download(got, dq, qb * n_tok);
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < qb * n_tok; i++)
            if (ref[i] != got[i] && diff++ == 0)
                first = i;
        cr_expect_eq(diff, 0,
                     "n_tok %d n_in %lld pdl %d: %zu bytes differ, first at %zu (block %zu byte "
                     "%zu)",
                     n_tok, (long long)n_in, pdl, diff, first, first / 36, first % 36);
    }
    cudaFree(dx);
    cudaFree(dq);
    free(x);
    free(ref);
    free(got);
}

Test(matvec_q8, quantize_bit_identical) {
    REQUIRE_GPU();
    rng_seed(1);
    check_quantize(1, 32);
    check_quantize(3, 96);
    check_quantize(8, 4128);
    check_quantize(5, 14336);
    check_quantize(2, 32 * 70001); // more blocks than one grid pass
    cr_log_info("cuda_quantize_q8_1: bit-identical to quant_q8_1_row on every shape");
}

Test(matvec_q8, quantize_rejects) {
    REQUIRE_GPU();
    float *dx = dev_upload(NULL, 1024);
    uint8_t *dq = dev_upload(NULL, 1024);
    struct verr err = {0};
    cr_expect_eq(cuda_quantize_q8_1(dq, dx, 1, 48, false, 0, &err), VERR_RANGE);
    cr_log_info("n_in 48: %s", err.msg);
    cr_expect_eq(cuda_quantize_q8_1(dq, dx, -1, 32, false, 0, &err), VERR_RANGE);
    cr_expect_eq(cuda_quantize_q8_1(dq + 2, dx, 1, 32, false, 0, &err), VERR_RANGE);
    cr_log_info("misaligned xq: %s", err.msg);
    cr_expect_eq(cuda_quantize_q8_1(dq, (float *)((uint8_t *)dx + 2), 1, 32, false, 0, &err),
                 VERR_RANGE);
    cr_expect_eq(cuda_quantize_q8_1(dq, dx, 0, 32, false, 0, &err), VERR_OK);
    cudaFree(dx);
    cudaFree(dq);
}

// ---------------------------------------------------------------------------
// mat-vec

struct mv_case {
    int n_tok;
    int n_seg;
    int64_t n_out[CUDA_MV_MAX_SEGS];
    int bias_mask; // bit s: segment s has a bias
    enum cuda_mv_epilogue epi;
    int in_kind; // 0: one block, 1: a few blocks, 2: large
};

// n_in per kind and variant: legacy types: one block; 3 or 33 blocks (rows
// only 2-byte aligned for Q4_0/Q5_0/Q8_0, several warps, a partial step);
// 129 blocks (not 16-byte aligned) or 128 (16-byte aligned rows: the 16-byte
// copy path). K-quants: 1, 3 or 5 super-blocks; 4096 and 14336 (7B/8B sizes).
static int64_t case_n_in(enum ggml_type type, int kind, int variant) {
    const bool k = ggml_type_get(type)->block_size == 256;
    static const int64_t legacy[3][2] = {{32, 32}, {96, 1056}, {4128, 4096}};
    static const int64_t kq[3][2] = {{256, 256}, {768, 1280}, {4096, 14336}};
    return k ? kq[kind][variant] : legacy[kind][variant];
}

static const struct mv_case mv_cases[] = {
    {1, 1, {131}, 1, CUDA_MV_STORE, 2},      {1, 3, {1, 7, 33}, 2, CUDA_MV_STORE, 0},
    {2, 3, {1, 7, 33}, 5, CUDA_MV_STORE, 1}, {3, 2, {7, 33}, 3, CUDA_MV_ADD, 1},
    {8, 2, {33, 33}, 0, CUDA_MV_SWIGLU, 1},  {2, 2, {7, 7}, 0, CUDA_MV_SWIGLU, 2},
    {8, 1, {7}, 0, CUDA_MV_ADD, 2},          {3, 1, {131}, 0, CUDA_MV_STORE, 0},
};
#define N_MV_CASES (sizeof mv_cases / sizeof mv_cases[0])

// Tolerance: every sub-block term is the reference's bit for bit; the
// kernel adds them in float in another order (lanes, butterfly, 4 warps) while
// the reference adds them in double. That is at most ~log2(n_sub) + 3
// roundings of partial sums, each <= 2^-24 of a partial |sum| <= sum |term|;
// sum |term| <= sum |w_i x_i| plus the cancelled parts of the min terms
// (about 2x for these rows). 1e-5 of sum |w_i x_i| over dequantized w and x
// covers that with room; measured (emulator) worst 1.4e-7 (Q4_1), 0.013 of
// the tolerance; logged per type.
#define MV_REL_TOL 1e-5

struct worst {
    double rel;    // worst |err| / sum|wx| (STORE and ADD outputs)
    double ratio;  // worst |err| / tol
    int pipelined; // calls that ran the pipelined kernel
    int runs;      // calls with a pipelined plan
    int streamed;  // calls that ran the streaming kernel
    int s_runs;    // calls with a streaming plan
};

// Plans every case runs (cuda_mvq_plan): the one-pass kernel (the reference
// for the pipelined plans: they must match it bit for bit); the pipelined
// kernel with 3 row pairs per block (a block's pairs cross segments; the last
// block has fewer); with the grid made from 2 multiprocessors at 1 block each
// (many pairs per block: the slots wrap around several times); and 8 blocks
// asked of 3 multiprocessors whose 30 KB of shared memory hold one block (or
// none) each: 3 blocks. Then the streaming kernel (the first plan that runs
// it is the reference of the others), with its defaults (one multiprocessor,
// 96 KiB); one row pair per warp on 200 multiprocessors (many blocks, the
// last one's warps partly idle); 2 multiprocessors at 1 block (16 warps,
// the ring runs on across many pairs); 227 KiB a block (8 tokens of 14336
// fit); and 20 KB a block (most shapes fall back to the other kernels).
// Launched with PDL (cuda/launch.cuh): the one-pass kernel (must match the
// reference bit for bit), one pipelined and one streaming plan.
#define PIPE_PLAN(...)                                                                             \
    &(const struct cuda_mvq_plan) {                                                                \
        .kernel = CUDA_MVQ_PIPE, __VA_ARGS__                                                       \
    }
#define STREAM_PLAN(...)                                                                           \
    &(const struct cuda_mvq_plan) {                                                                \
        .kernel = CUDA_MVQ_STREAM, __VA_ARGS__                                                     \
    }
static const struct cuda_mvq_plan *const mv_plans[] = {
    NULL,
    &(const struct cuda_mvq_plan){.kernel = CUDA_MVQ_PASS, .pdl = true},
    PIPE_PLAN(.pairs_per_block = 3),
    PIPE_PLAN(.sm_count = 2, .blocks_per_sm = 1, .pdl = true),
    PIPE_PLAN(.sm_count = 3, .smem_per_sm = 30000, .blocks_per_sm = 8),
    STREAM_PLAN(.sm_count = 0),
    STREAM_PLAN(.sm_count = 200, .pairs_per_block = 1, .pdl = true),
    STREAM_PLAN(.sm_count = 2, .blocks_per_sm = 1),
    STREAM_PLAN(.sm_count = 4, .smem_per_sm = 233472, .smem_per_block = 232448),
    STREAM_PLAN(.sm_count = 3, .smem_per_block = 20000),
};
#define N_PLANS (int)(sizeof mv_plans / sizeof mv_plans[0])

static void run_case(enum ggml_type type, const struct mv_case *c, int variant, struct worst *wo) {
    const int64_t n_in = case_n_in(type, c->in_kind, variant);
    const size_t rb = ggml_row_bytes(type, n_in), qb = (size_t)quant_q8_1_row_bytes(n_in);
    const int n_tok = c->n_tok;
    float *x = malloc((size_t)n_tok * n_in * sizeof *x), *xd = malloc((size_t)n_tok * n_in * 4),
          *wd = malloc((size_t)n_in * 4);
    uint8_t *xq = malloc(qb * n_tok), *xq_dev = malloc(qb * n_tok);
    cr_assert(x && xd && wd && xq && xq_dev);
    make_x(x, (int64_t)n_tok * n_in);
    struct verr err = {0};
    for (int t = 0; t < n_tok; t++) {
        cr_assert_eq(quant_q8_1_row(x + (size_t)t * n_in, n_in, xq + qb * t, &err), 0);
        cr_assert_eq(quant_q8_1_dequantize_row(xq + qb * t, n_in, xd + (size_t)t * n_in, &err), 0);
    }
    float *dx = dev_upload(x, (size_t)n_tok * n_in * 4);
    void *dxq = dev_upload(NULL, qb * n_tok);
    cr_assert_eq(cuda_quantize_q8_1(dxq, dx, n_tok, n_in, false, 0, &err), 0, "%s", err.msg);
    dev_download(xq_dev, dxq, qb * n_tok);
    cr_assert_eq(memcmp(xq, xq_dev, qb * n_tok), 0, "device q8_1 activations differ");

    struct cuda_mv_seg segs[CUDA_MV_MAX_SEGS];
    uint8_t *w[CUDA_MV_MAX_SEGS];
    float *bias[CUDA_MV_MAX_SEGS], *out0[CUDA_MV_MAX_SEGS], *dots[CUDA_MV_MAX_SEGS],
        *mags[CUDA_MV_MAX_SEGS];
    for (int s = 0; s < c->n_seg; s++) {
        const int64_t no = c->n_out[s];
        w[s] = rand_blocks(type, n_in, no, RAND_SIGN_FIRST);
        bias[s] = NULL;
        if (c->bias_mask >> s & 1) {
            bias[s] = malloc(no * 4);
            for (int64_t o = 0; o < no; o++)
                bias[s][o] = nrand();
        }
        out0[s] = malloc((size_t)n_tok * no * 4);
        dots[s] = malloc((size_t)n_tok * no * 4);
        mags[s] = malloc((size_t)n_tok * no * 4);
        for (int64_t i = 0; i < n_tok * no; i++)
            out0[s][i] = nrand(); // what ADD adds to; STORE must overwrite it
        for (int64_t o = 0; o < no; o++) {
            const uint8_t *row = w[s] + (size_t)o * rb;
            cr_assert_eq(quant_dequantize_row(type, row, wd, n_in, &err), 0);
            for (int t = 0; t < n_tok; t++) {
                float d;
                cr_assert_eq(quant_dot_q8_1(type, row, xq + qb * t, n_in, &d, &err), 0, "%s",
                             err.msg);
                double m = 0.0;
                for (int64_t i = 0; i < n_in; i++)
                    m += fabs((double)wd[i] * xd[(size_t)t * n_in + i]);
                dots[s][t * no + o] = d;
                mags[s][t * no + o] = (float)m;
            }
        }
        segs[s].w = dev_upload(w[s], rb * no);
        segs[s].bias = bias[s] ? dev_upload(bias[s], no * 4) : NULL;
        segs[s].out = dev_upload(out0[s], (size_t)n_tok * no * 4);
        segs[s].n_out = no;
    }
    const int n_check = c->epi == CUDA_MV_SWIGLU ? 1 : c->n_seg;
    float *got[N_PLANS][CUDA_MV_MAX_SEGS];
    int kern[N_PLANS], p_stream = -1; // the kernel each plan ran; the first streaming one
    for (int p = 0; p < N_PLANS; p++) {
        for (int s = 0; s < c->n_seg; s++)
            if (p > 0) // ADD adds into the output: start each plan from out0
                CU(cudaMemcpy(segs[s].out, out0[s], (size_t)n_tok * c->n_out[s] * 4,
                              cudaMemcpyHostToDevice));
        cr_assert_eq(cuda_matvec_q8_segs(segs, c->n_seg, type, n_in, dxq, n_tok, c->epi,
                                         mv_plans[p], 0, &err),
                     0, "%s n_in %lld plan %d: %s", ggml_type_name(type), (long long)n_in, p,
                     err.msg);
        kern[p] = cuda_matvec_q8_kernel(type, n_in, n_tok, mv_plans[p]);
        if (p > 0 && mv_plans[p]->kernel == CUDA_MVQ_PIPE) {
            wo->pipelined += kern[p] == CUDA_MVQ_PIPE;
            wo->runs++;
        } else if (p > 0 && mv_plans[p]->kernel == CUDA_MVQ_STREAM) {
            wo->streamed += kern[p] == CUDA_MVQ_STREAM;
            wo->s_runs++;
        }
        if (kern[p] == CUDA_MVQ_STREAM && p_stream < 0)
            p_stream = p;
        for (int s = 0; s < n_check; s++) {
            got[p][s] = malloc((size_t)n_tok * c->n_out[s] * 4);
            dev_download(got[p][s], segs[s].out, (size_t)n_tok * c->n_out[s] * 4);
        }
    }
    for (int s = 0; s < n_check; s++) {
        const int64_t no = c->n_out[s];
        // The pipelined kernel adds the same terms in the same order as the
        // one-pass kernel; the streaming kernel its own order, under every plan.
        for (int p = 1; p < N_PLANS; p++) {
            const int q = kern[p] == CUDA_MVQ_STREAM ? p_stream : 0;
            for (int64_t i = 0; i < n_tok * no; i++)
                if (memcmp(&got[p][s][i], &got[q][s][i], 4) != 0) {
                    cr_expect_fail("%s n_tok %d n_in %lld seg %d plan %d (kernel %d): out[%lld] "
                                   "%.9g, plan %d %.9g (must be bit-identical)",
                                   ggml_type_name(type), n_tok, (long long)n_in, s, p, kern[p],
                                   (long long)i, got[p][s][i], q, got[q][s][i]);
                    break;
                }
        }
        // Both orders against the reference: the one-pass kernel's and the
        // streaming kernel's (where a plan ran it).
        for (int pass = 0; pass < (p_stream > 0 ? 2 : 1); pass++) {
            const float *gv = got[pass ? p_stream : 0][s];
            int fails = 0;
            for (int t = 0; t < n_tok; t++) {
                for (int64_t o = 0; o < no; o++) {
                    const int64_t i = t * no + o;
                    double ref, tol;
                    if (c->epi == CUDA_MV_SWIGLU) {
                        const float g = dots[0][i], u = dots[1][i];
                        ref = g / (1.0f + expf(-g)) * u;
                        const double sg = fabs(g / (1.0 + exp(-g)));
                        // d silu / dg <= 1.1; plus an ulp or two of expf and the products
                        tol = MV_REL_TOL * (1.1 * mags[0][i] * fabs(u) + mags[1][i] * sg) +
                              4e-7 * fabs(ref);
                    } else {
                        const float b = bias[s] ? bias[s][o] : 0.0f;
                        const float v = bias[s] ? dots[s][i] + b : dots[s][i];
                        ref = c->epi == CUDA_MV_ADD ? out0[s][i] + v : v;
                        tol = MV_REL_TOL * mags[s][i] +
                              2.4e-7 * (fabs(ref) + fabs(b) +
                                        fabs(out0[s][i]) * (c->epi == CUDA_MV_ADD));
                    }
                    const double e = fabs(gv[i] - ref);
                    // |err| / sum|wx| of the dot itself (not meaningful after silu * u)
                    if (c->epi != CUDA_MV_SWIGLU && mags[s][i] > 0 && e / mags[s][i] > wo->rel)
                        wo->rel = e / mags[s][i];
                    if (tol > 0 && e / tol > wo->ratio)
                        wo->ratio = e / tol;
                    if (!(e <= tol) && fails++ < 5)
                        cr_log_error("%s n_tok %d n_in %lld seg %d epi %d: out[%d][%lld] cuda %.9g "
                                     "ref %.9g |err| %.3g > tol %.3g",
                                     ggml_type_name(type), n_tok, (long long)n_in, s, (int)c->epi,
                                     t, (long long)o, gv[i], ref, e, tol);
                }
            }
            cr_expect_eq(
                fails, 0,
                "%s n_tok %d n_in %lld seg %d (%s kernel): %d outputs outside the tolerance",
                ggml_type_name(type), n_tok, (long long)n_in, s, pass ? "streaming" : "one-pass",
                fails);
        }
        for (int p = 0; p < N_PLANS; p++)
            free(got[p][s]);
    }
    for (int s = 0; s < c->n_seg; s++) {
        cudaFree((void *)segs[s].w);
        cudaFree((void *)segs[s].bias);
        cudaFree(segs[s].out);
        free(w[s]);
        free(bias[s]);
        free(out0[s]);
        free(dots[s]);
        free(mags[s]);
    }
    cudaFree(dx);
    cudaFree(dxq);
    free(x);
    free(xd);
    free(wd);
    free(xq);
    free(xq_dev);
}

static void check_type(enum ggml_type type) {
    rng_seed(100 + (uint64_t)type);
    struct worst wo = {0, 0, 0, 0, 0, 0};
    for (size_t k = 0; k < N_MV_CASES; k++)
        for (int variant = 0; variant < 2; variant++)
            if (variant == 0 || mv_cases[k].in_kind > 0)
                run_case(type, &mv_cases[k], variant, &wo);
    cr_log_info("%-5s matvec q8: worst |err| %.3g of sum|wx|, worst err/tol %.3g (tol %.0e of "
                "sum|wx|); pipelined kernel bit-identical in %d of %d plan runs (the rest too "
                "large for it: the one-pass kernel); streaming kernel in %d of %d",
                ggml_type_name(type), wo.rel, wo.ratio, MV_REL_TOL, wo.pipelined, wo.runs,
                wo.streamed, wo.s_runs);
    // Most shapes fit the pipelined kernel (8 tokens of 14336 do not).
    cr_expect_gt(2 * wo.pipelined, wo.runs, "%s: the pipelined kernel ran in only %d of %d",
                 ggml_type_name(type), wo.pipelined, wo.runs);
    cr_expect_gt(2 * wo.streamed, wo.s_runs, "%s: the streaming kernel ran in only %d of %d",
                 ggml_type_name(type), wo.streamed, wo.s_runs);
}

Test(matvec_q8, q4_0) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q4_0);
}
Test(matvec_q8, q4_1) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q4_1);
}
Test(matvec_q8, q5_0) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q5_0);
}
Test(matvec_q8, q5_1) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q5_1);
}
Test(matvec_q8, q8_0) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q8_0);
}
Test(matvec_q8, q4_k) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q4_K);
}
Test(matvec_q8, q5_k) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q5_K);
}
Test(matvec_q8, q6_k) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q6_K);
}

Test(matvec_q8, q2_k) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q2_K);
}

Test(matvec_q8, q3_k) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_Q3_K);
}

Test(matvec_q8, iq4_nl) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_IQ4_NL);
}

Test(matvec_q8, iq4_xs) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_IQ4_XS);
}

// MXFP4: 17-byte blocks, so rows of an odd number of blocks start at odd
// addresses (the byte copy) and the rest only 2-byte aligned.
Test(matvec_q8, mxfp4) {
    REQUIRE_GPU();
    check_type(GGML_TYPE_MXFP4);
}

Test(matvec_q8, rejects_what_it_cannot_do) {
    REQUIRE_GPU();
    uint8_t *dw = dev_upload(NULL, 4096);
    float *dout = dev_upload(NULL, 4096);
    uint8_t *dxq = dev_upload(NULL, 4096);
    struct cuda_mv_seg segs[3] = {{dout, dw, NULL, 4}, {dout, dw, NULL, 4}, {dout, dw, NULL, 4}};
    struct verr err = {0};
#define EXPECT_RC(rc, call, what)                                                                  \
    do {                                                                                           \
        err.msg[0] = 0;                                                                            \
        cr_expect_eq((call), (rc), "%s", what);                                                    \
        cr_log_info("%s: %s", what, err.msg);                                                      \
    } while (0)
    const enum ggml_type q4 = GGML_TYPE_Q4_0;
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 64, dxq, 0, CUDA_MV_STORE, NULL, 0, &err),
              "n_tok 0");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 64, dxq, 9, CUDA_MV_STORE, NULL, 0, &err),
              "n_tok 9");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 0, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "0 segments");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 4, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "4 segments");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 64, dxq, 1, (enum cuda_mv_epilogue)7, NULL, 0, &err),
              "epilogue 7");
    EXPECT_RC(VERR_UNSUPPORTED,
              cuda_matvec_q8_segs(segs, 1, GGML_TYPE_F16, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "f16 weights");
    EXPECT_RC(
        VERR_UNSUPPORTED,
        cuda_matvec_q8_segs(segs, 1, GGML_TYPE_IQ3_S, 256, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
        "iq3_s weights");
    EXPECT_RC(
        VERR_RANGE,
        cuda_matvec_q8_segs(segs, 1, GGML_TYPE_Q4_K, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
        "q4_K row of 64");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 48, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "q4_0 row of 48");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 64, dxq + 2, 1, CUDA_MV_STORE, NULL, 0, &err),
              "misaligned xq");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 1, q4, 64, NULL, 1, CUDA_MV_STORE, NULL, 0, &err),
              "NULL xq");
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(segs, 3, q4, 64, dxq, 1, CUDA_MV_SWIGLU, NULL, 0, &err),
              "swiglu with 3 segments");
    struct cuda_mv_seg bad[2] = {segs[0], segs[1]};
    bad[1].n_out = 5;
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_SWIGLU, NULL, 0, &err),
              "swiglu with unequal n_out");
    bad[1] = segs[1];
    bad[1].bias = dout;
    EXPECT_RC(VERR_RANGE,
              cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_SWIGLU, NULL, 0, &err),
              "swiglu with a bias");
    bad[1] = segs[1];
    bad[1].w = dw + 2;
    EXPECT_RC(VERR_RANGE, cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "misaligned weights");
    bad[1] = segs[1];
    bad[1].out = (float *)((uint8_t *)dout + 2);
    EXPECT_RC(VERR_RANGE, cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "misaligned output");
    bad[1].out = NULL;
    EXPECT_RC(VERR_RANGE, cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_ADD, NULL, 0, &err),
              "NULL output");
    bad[1] = segs[1];
    bad[1].n_out = -1;
    EXPECT_RC(VERR_RANGE, cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "negative n_out");
    const struct cuda_mvq_plan bad_plans[] = {{.kernel = 3},
                                              {.kernel = -1},
                                              {.kernel = CUDA_MVQ_PIPE, .pairs_per_block = -1},
                                              {.kernel = CUDA_MVQ_PIPE, .sm_count = -4},
                                              {.kernel = CUDA_MVQ_PIPE, .smem_per_sm = -1},
                                              {.kernel = CUDA_MVQ_STREAM, .smem_per_block = -1},
                                              {.kernel = CUDA_MVQ_STREAM, .blocks_per_sm = -2}};
    for (size_t k = 0; k < sizeof bad_plans / sizeof bad_plans[0]; k++)
        EXPECT_RC(
            VERR_RANGE,
            cuda_matvec_q8_segs(segs, 1, q4, 64, dxq, 1, CUDA_MV_STORE, &bad_plans[k], 0, &err),
            "bad plan");
    bad[0].n_out = bad[1].n_out = 0;
    EXPECT_RC(VERR_OK, cuda_matvec_q8_segs(bad, 2, q4, 64, dxq, 1, CUDA_MV_STORE, NULL, 0, &err),
              "empty segments");
    CU(cudaDeviceSynchronize());
    cudaFree(dw);
    cudaFree(dout);
    cudaFree(dxq);
}
