// host/backend/cpu_q8*.c: the CPU's SIMD q8_1 matmul against the reference
// dot (gguf/quant_q8.c's quant_dot_q8_1), for every weight type it takes,
// with both kernel variants this CPU can run (AVX2, AVX-VNNI).
//
// The kernels evaluate the reference's terms exactly and only add them in
// another order, so the bound is float summation error: with nb terms, each
// at most sum|w x| of its block, the difference is below
// 2 * nb * 2^-24 * sum_i |w_i x_i| (dequantized values). The tests print the
// worst difference in units of that scale.
//
// Also: batch invariance (a token's outputs are bit-identical alone and in a
// batch that spans several tiles), bias and accumulate, and the same through
// the CPU backend's matmul op with act_q8 on.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "host/backend/cpu_q8.h"
#include "host/ops/backend.h"
#include "tests/rand_blocks.h"

static const enum ggml_type q8_types[] = {
    GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,  GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
    GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,  GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
    GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
};
#define N_TYPES (sizeof q8_types / sizeof q8_types[0])

// Activations with a spread of block magnitudes (and one all-zero block).
static float *rand_x(int64_t n_in, int n_tok) {
    float *x = malloc(sizeof(float) * (size_t)(n_in * n_tok));
    cr_assert_not_null(x);
    for (int64_t i = 0; i < n_in * n_tok; i++)
        x[i] = nrand() * (1.0f + (float)((i / 32) % 5));
    if (n_in >= 64)
        memset(x + 32, 0, 32 * sizeof(float));
    return x;
}

struct prepared {
    struct cpu_q8_x x;
    void *buf;
};

// isa NONE: through quant_q8_1_row (the reference blocks); else the SIMD fill.
static void prepare(struct prepared *p, const float *x, int64_t n_in, int n_tok,
                    enum cpu_q8_isa isa) {
    const size_t bytes = cpu_q8_x_bytes(n_in, n_tok);
    cr_assert_gt(bytes, 0);
    p->buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    void *tmp = malloc((size_t)quant_q8_1_row_bytes(n_in));
    cr_assert(p->buf && tmp);
    memset(p->buf, 0, bytes); // the alignment gaps between the arrays too
    cpu_q8_x_init(&p->x, p->buf, n_in, n_tok);
    struct verr err = {0};
    for (int t = 0; t < n_tok; t++)
        cr_assert_eq(cpu_q8_x_fill(isa, &p->x, t, x + t * n_in, n_in, tmp, &err), 0, "%s", err.msg);
    free(tmp);
}

// sum_i |w_i x_i| of the dequantized weight row and q8_1 activations.
static double abs_dot(enum ggml_type t, const uint8_t *row, const uint8_t *xq, int64_t n) {
    float *w = malloc(sizeof(float) * (size_t)n), *xd = malloc(sizeof(float) * (size_t)n);
    cr_assert(w && xd);
    cr_assert_eq(quant_dequantize_row(t, row, w, n, NULL), 0);
    cr_assert_eq(quant_q8_1_dequantize_row(xq, n, xd, NULL), 0);
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)w[i] * (double)xd[i]);
    free(w);
    free(xd);
    return s;
}

typedef void (*rows_fn)(const struct cpu_q8_job *j, int64_t o0, int64_t o1);

// Every output of one (type, n_in, n_out, n_tok) case against the reference;
// returns the worst |diff| / (2 nb 2^-24 sum|w x|).
static double check_case(rows_fn rows, enum ggml_type t, int64_t n_in, int64_t n_out, int n_tok) {
    uint8_t *w = rand_blocks(t, n_in, n_out, RAND_SIGN_FIRST);
    float *x = rand_x(n_in, n_tok);
    float *bias = malloc(sizeof(float) * (size_t)n_out);
    float *out = malloc(sizeof(float) * (size_t)(n_out * n_tok));
    const size_t xr = (size_t)quant_q8_1_row_bytes(n_in);
    uint8_t *xq = malloc(xr * (size_t)n_tok);
    cr_assert(bias && out && xq);
    for (int64_t o = 0; o < n_out; o++)
        bias[o] = nrand();
    for (int tk = 0; tk < n_tok; tk++)
        cr_assert_eq(quant_q8_1_row(x + tk * n_in, n_in, xq + tk * xr, NULL), 0);
    struct prepared p;
    prepare(&p, x, n_in, n_tok, CPU_Q8_ISA_NONE);
    const size_t rb = ggml_row_bytes(t, n_in);
    struct cpu_q8_job j = {.w = w,
                           .wtype = t,
                           .row_bytes = rb,
                           .n_in = n_in,
                           .n_out = n_out,
                           .x = &p.x,
                           .out = out,
                           .bias = bias};
    rows(&j, 0, n_out / 2); // two row ranges, as two threads would split them
    rows(&j, n_out / 2, n_out);
    const double nb = (double)(n_in / 32);
    double worst = 0.0;
    for (int tk = 0; tk < n_tok; tk++)
        for (int64_t o = 0; o < n_out; o++) {
            float ref = 0.0f;
            cr_assert_eq(quant_dot_q8_1(t, w + o * rb, xq + tk * xr, n_in, &ref, NULL), 0);
            const double scale = 2.0 * nb * ldexp(1.0, -24) *
                                 (abs_dot(t, w + o * rb, xq + tk * xr, n_in) + fabs(bias[o]));
            const double got = out[tk * n_out + o], want = (double)ref + (double)bias[o];
            const double e = fabs(got - want) / (scale > 0 ? scale : 1e-30);
            cr_expect(e <= 1.0, "%s n_in %lld token %d row %lld: %.9g, reference %.9g (%.2f units)",
                      ggml_type_name(t), (long long)n_in, tk, (long long)o, got, want, e);
            worst = e > worst ? e : worst;
        }
    free(p.buf);
    free(w);
    free(x);
    free(bias);
    free(out);
    free(xq);
    return worst;
}

static void check_all_types(rows_fn rows, const char *isa) {
    for (size_t i = 0; i < N_TYPES; i++) {
        const enum ggml_type t = q8_types[i];
        const int bs = (int)ggml_type_get(t)->block_size;
        // n_in: one group; several groups; (legacy types) a last group of 2,
        // 3 or 7 sub-blocks (padded to 8)
        const int64_t sizes[] = {256, 1024, bs == 32 ? 576 : 512, bs == 32 ? 96 : 768,
                                 bs == 32 ? 224 : 1280};
        double worst = 0.0;
        for (size_t k = 0; k < 5; k++)
            for (int n_tok = 1; n_tok <= 2 * CPU_Q8_TILE + 3; n_tok += 17) {
                const double e = check_case(rows, t, sizes[k], 19, n_tok);
                worst = e > worst ? e : worst;
            }
        cr_log_info("%s %s: worst difference %.3f of the summation bound", isa, ggml_type_name(t),
                    worst);
    }
}

Test(cpu_q8, avx2_matches_reference_every_type) {
    if (cpu_q8_isa() == CPU_Q8_ISA_NONE)
        cr_skip_test("this CPU has no AVX2: the fast path is off, nothing to compare");
    rng_seed(101);
    check_all_types(cpu_q8_rows_avx2, "avx2");
}

Test(cpu_q8, avxvnni_matches_reference_every_type) {
    if (cpu_q8_isa() != CPU_Q8_ISA_AVXVNNI)
        cr_skip_test("this CPU (or compiler) has no AVX-VNNI");
    rng_seed(102);
    check_all_types(cpu_q8_rows_avxvnni, "avx-vnni");
}

// The SIMD fill writes exactly the reference's layout, on values that test
// every rule of the quantizer: ties (x * id = k + 0.5 both signs), NaN and
// infinities, all-zero blocks, blocks whose scale rounds to f16 zero or is
// subnormal, and ordinary random values.
static void fill_matches(enum cpu_q8_isa isa) {
    const int64_t n_in = 576; // two groups and a partial one
    const int n_tok = 6;
    float *x = rand_x(n_in, n_tok);
    for (int j = 0; j < 32; j++) {
        x[64 + j] = (float)(j - 16) + 0.5f; // amax 16.5: ties after scaling? exact halves
        x[n_in + j] = 127.0f * ((j % 2) ? -1.0f : 1.0f) * (float)(j % 5) / 4.0f + 0.5f;
        x[2 * n_in + j] = 1e-7f * (float)(j - 16);      // d rounds to f16 zero: a zero block
        x[2 * n_in + 32 + j] = 1e-3f * (float)(j - 16); // d is an f16 subnormal
    }
    x[3 * n_in + 5] = NAN;
    x[3 * n_in + 40] = INFINITY;
    x[3 * n_in + 41] = -INFINITY;
    for (int j = 0; j < 32; j++) // amax = 127: d = 1, q = roundf(x): ties
        x[4 * n_in + j] = j == 0 ? -127.0f : (float)(j - 16) * 2.5f + ((j % 3) ? 0.5f : 0.0f);
    struct prepared ref, simd;
    prepare(&ref, x, n_in, n_tok, CPU_Q8_ISA_NONE);
    prepare(&simd, x, n_in, n_tok, isa);
    const size_t bytes = cpu_q8_x_bytes(n_in, n_tok);
    for (size_t i = 0; i < bytes; i++) // same layout, so compare the buffers
        cr_assert_eq(((uint8_t *)ref.buf)[i], ((uint8_t *)simd.buf)[i],
                     "%s fill: byte %zu differs from the reference", cpu_q8_isa_name(isa), i);
    free(ref.buf);
    free(simd.buf);
    free(x);
}

Test(cpu_q8, fill_is_the_reference_quantizer_bit_for_bit) {
    const enum cpu_q8_isa isa = cpu_q8_isa();
    if (isa == CPU_Q8_ISA_NONE)
        cr_skip_test("no AVX2");
    rng_seed(105);
    fill_matches(CPU_Q8_ISA_AVX2);
    if (isa == CPU_Q8_ISA_AVXVNNI)
        fill_matches(CPU_Q8_ISA_AVXVNNI);
}

// A token's outputs alone equal its outputs in a batch of 2 tiles + 5, bit
// for bit, and accumulate adds exactly the same values.
Test(cpu_q8, batch_invariant_and_accumulate) {
    const enum cpu_q8_isa isa = cpu_q8_isa();
    if (isa == CPU_Q8_ISA_NONE)
        cr_skip_test("no AVX2");
    rng_seed(103);
    const int64_t n_in = 576, n_out = 23;
    const int n_tok = 2 * CPU_Q8_TILE + 5;
    for (size_t i = 0; i < N_TYPES; i++) {
        const enum ggml_type t = q8_types[i];
        const int64_t n = ggml_type_get(t)->block_size == 32 ? n_in : 512;
        uint8_t *w = rand_blocks(t, n, n_out, RAND_SIGN_FIRST);
        float *x = rand_x(n, n_tok);
        float *batch = malloc(sizeof(float) * (size_t)(n_out * n_tok)), one[23], acc[23];
        cr_assert_not_null(batch);
        struct prepared pb;
        prepare(&pb, x, n, n_tok, isa);
        const size_t rb = ggml_row_bytes(t, n);
        struct cpu_q8_job j = {.w = w,
                               .wtype = t,
                               .row_bytes = rb,
                               .n_in = n,
                               .n_out = n_out,
                               .x = &pb.x,
                               .out = batch};
        cpu_q8_rows(isa, &j, 0, n_out);
        for (int tk = 0; tk < n_tok; tk += 7) {
            struct prepared p1;
            prepare(&p1, x + tk * n, n, 1, isa);
            j.x = &p1.x;
            j.out = one;
            j.accumulate = false;
            cpu_q8_rows(isa, &j, 0, n_out);
            cr_assert_eq(memcmp(one, batch + tk * n_out, sizeof one), 0,
                         "%s token %d: alone differs from in the batch", ggml_type_name(t), tk);
            for (int o = 0; o < n_out; o++)
                acc[o] = 0.25f * (float)o;
            j.out = acc;
            j.accumulate = true;
            cpu_q8_rows(isa, &j, 0, n_out);
            for (int o = 0; o < n_out; o++)
                cr_assert_eq(acc[o], 0.25f * (float)o + one[o], "%s accumulate row %d",
                             ggml_type_name(t), o);
            free(p1.buf);
        }
        free(pb.buf);
        free(w);
        free(x);
        free(batch);
    }
}

// Through the backend op table: matmul with act_q8 on, a prefill-sized batch,
// against quant_dot_q8_1 (+ bias) per output, and decode (one token) equal to
// that token's row of the batch. Without AVX2 (or with cpu_q8_pin(CPU_Q8_ISA_NONE)) the
// backend takes quant_dot_q8_1 itself, for every batch too: error 0.
Test(cpu_q8, backend_matmul_uses_it_for_every_batch) {
    rng_seed(104);
    struct backend *be = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    be->act_q8 = true;
    const enum ggml_type t = GGML_TYPE_Q4_1;
    const int64_t n_in = 576, n_out = 70;
    const int n_tok = 40;
    uint8_t *w = rand_blocks(t, n_in, n_out, RAND_SIGN_FIRST);
    float *x = rand_x(n_in, n_tok);
    float *out = malloc(sizeof(float) * (size_t)(n_out * n_tok)), one[70];
    cr_assert_not_null(out);
    const struct backend_weight bw = {.data = w, .type = t, .n_in = n_in, .n_out = n_out};
    cr_assert_eq(be->ops->matmul(be, out, &bw, x, NULL, n_tok), 0, "%s", be->err.msg);
    const size_t xr = (size_t)quant_q8_1_row_bytes(n_in), rb = ggml_row_bytes(t, n_in);
    uint8_t *xq = malloc(xr);
    double worst = 0.0;
    for (int tk = 0; tk < n_tok; tk++) {
        cr_assert_eq(quant_q8_1_row(x + tk * n_in, n_in, xq, NULL), 0);
        for (int64_t o = 0; o < n_out; o++) {
            float ref;
            cr_assert_eq(quant_dot_q8_1(t, w + o * rb, xq, n_in, &ref, NULL), 0);
            const double scale = 2.0 * 18 * ldexp(1.0, -24) * abs_dot(t, w + o * rb, xq, n_in);
            const double e = fabs((double)out[tk * n_out + o] - ref) / scale;
            cr_expect(e <= 1.0, "token %d row %lld: %.9g vs %.9g", tk, (long long)o,
                      (double)out[tk * n_out + o], (double)ref);
            worst = e > worst ? e : worst;
        }
    }
    cr_log_info("backend matmul (q8 kernels: %s): worst %.3f of the bound",
                cpu_q8_isa_name(cpu_q8_isa()), worst);
    cr_assert_eq(be->ops->matmul(be, one, &bw, x + 13 * n_in, NULL, 1), 0);
    cr_assert_eq(memcmp(one, out + 13 * n_out, sizeof one), 0, "decode differs from the batch");
    be->ops->destroy(be);
    free(w);
    free(x);
    free(out);
    free(xq);
}

// matmul_multi quantizes x once for its q8 matrices. When its first matrix
// takes another path (F16 here), nothing of an earlier call may be reused:
// two calls with the same x buffer holding different values must each match
// separate matmuls of their own x, bit for bit.
Test(cpu_q8, matmul_multi_never_reuses_an_earlier_calls_x) {
    if (cpu_q8_isa() == CPU_Q8_ISA_NONE)
        cr_skip_test("no AVX2");
    rng_seed(106);
    struct backend *be = NULL;
    struct verr err = {0};
    cr_assert_eq(backend_cpu_create(&be, 2, &err), 0, "%s", err.msg);
    be->act_q8 = true;
    const int64_t n_in = 256, n_out = 24;
    const int n_tok = 3;
    uint8_t *w16 = rand_blocks(GGML_TYPE_F16, n_in, n_out, RAND_SIGN_FIRST);
    uint8_t *wq = rand_blocks(GGML_TYPE_Q4_0, n_in, n_out, RAND_SIGN_FIRST);
    const struct backend_weight b16 = {
        .data = w16, .type = GGML_TYPE_F16, .n_in = n_in, .n_out = n_out};
    const struct backend_weight bq = {
        .data = wq, .type = GGML_TYPE_Q4_0, .n_in = n_in, .n_out = n_out};
    float *x = rand_x(n_in, n_tok), *x2 = rand_x(n_in, n_tok);
    float o0[3 * 24], o1[3 * 24], ref[3 * 24];
    const struct backend_mm mm[2] = {{.out = o0, .w = &b16}, {.out = o1, .w = &bq}};
    cr_assert_eq(be->ops->matmul_multi(be, mm, 2, x, n_tok), 0, "%s", be->err.msg);
    memcpy(x, x2, sizeof(float) * (size_t)(n_in * n_tok)); // same buffer, new values
    cr_assert_eq(be->ops->matmul_multi(be, mm, 2, x, n_tok), 0, "%s", be->err.msg);
    cr_assert_eq(be->ops->matmul(be, ref, &bq, x2, NULL, n_tok), 0, "%s", be->err.msg);
    cr_assert_eq(memcmp(o1, ref, sizeof ref), 0,
                 "the second matmul_multi used the first call's quantized x");
    be->ops->destroy(be);
    free(w16);
    free(wq);
    free(x);
    free(x2);
}
