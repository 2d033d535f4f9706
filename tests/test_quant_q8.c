// gguf/quant_q8.c: the q8_1 activation quantizer on hand-computed blocks and
// its round-trip bound, and the integer dot product of every supported weight
// type against float dots (the dequantized row with the dequantized
// activations: equal to float rounding; with the original activations: the
// error of 8-bit activation rounding, measured and bounded).
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"
#include "gguf/types.h"
#include "tests/rand_blocks.h"
#include "tests/rng_splitmix.h"

static uint16_t f16_at(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void quantize_ok(const float *x, int64_t n, uint8_t *out) {
    struct verr err = {0};
    cr_assert_eq(quant_q8_1_row(x, n, out, &err), 0, "%s", err.msg);
}

// ---------------------------------------------------------------------------
// quantizer

// amax = 127 gives d = 1 exactly and id = 1, so q = roundf(x): ties go away
// from zero; the largest magnitude is negative.
Test(quant_q8, block_unit_scale_ties_negative_max) {
    float x[32] = {0};
    const float in[] = {-127.0f, 2.5f,   -2.5f, 0.5f,  -0.5f, 1.49f,
                        -1.51f,  126.5f, 0.0f,  -0.0f, 3.5f};
    const int want[] = {-127, 3, -3, 1, -1, 1, -2, 127, 0, 0, 4};
    memcpy(x, in, sizeof in);
    uint8_t b[36];
    quantize_ok(x, 32, b);
    cr_assert_eq(f16_at(b), 0x3c00, "d = 1.0 (f16 0x3c00), got 0x%04x", f16_at(b));
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const int q = (int8_t)b[4 + j];
        const int w = j < (int)(sizeof want / sizeof want[0]) ? want[j] : 0;
        cr_expect_eq(q, w, "x[%d] = %g: q %d, want %d", j, (double)x[j], q, w);
        sum += q;
    }
    cr_assert_eq(sum, -127 + 3 - 3 + 1 - 1 + 1 - 2 + 127 + 4);
    cr_assert_eq(f16_at(b + 2), quant_f32_to_fp16((float)sum), "s = d * sum(q) = %d", sum);
}

// amax = 254: d = 2, id = 0.5; 5 -> 2.5 -> 3, -5 -> -3, 3 -> 1.5 -> 2, 1 -> 1.
Test(quant_q8, block_scale_two) {
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)((j % 7) - 3); // -3..3: x/2 = -1.5 .. 1.5
    x[0] = 254.0f;
    x[1] = 5.0f;
    x[2] = -5.0f;
    uint8_t b[36];
    quantize_ok(x, 32, b);
    cr_assert_eq(f16_at(b), 0x4000, "d = 2.0");
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const float v = x[j] / 2.0f;
        const int want = (int)(v < 0 ? -floorf(-v + 0.5f) : floorf(v + 0.5f)); // half away
        cr_expect_eq((int8_t)b[4 + j], want, "x[%d] = %g", j, (double)x[j]);
        sum += want;
    }
    cr_assert_eq((int8_t)b[5], 3);
    cr_assert_eq((int8_t)b[6], -3);
    cr_assert_eq(f16_at(b + 2), quant_f32_to_fp16(2.0f * (float)sum));
}

// A block of zeros and a block whose f16 d underflows to 0 are all zeros; the
// next block is unaffected.
Test(quant_q8, zero_and_underflow_blocks) {
    float x[96];
    for (int j = 0; j < 32; j++) {
        x[j] = 0.0f;
        x[32 + j] = (j & 1 ? -1e-6f : 1e-6f) * (float)(j + 1) / 32.0f; // amax 1e-6: d16 = 0
        x[64 + j] = (float)j - 15.5f;
    }
    uint8_t b[3 * 36];
    memset(b, 0x5a, sizeof b);
    quantize_ok(x, 96, b);
    for (int k = 0; k < 72; k++)
        cr_assert_eq(b[k], 0, "byte %d of the zero blocks is %d", k, b[k]);
    cr_assert_neq(f16_at(b + 72), 0);
    cr_assert_eq((int8_t)b[72 + 4 + 31], 127, "largest element maps to 127");
    cr_assert_eq((int8_t)b[72 + 4 + 0], -127, "-15.5 of amax 15.5 maps to -127");
}

Test(quant_q8, rejects_bad_rows) {
    float x[33] = {0};
    uint8_t b[72];
    struct verr err = {0};
    cr_assert_eq(quant_q8_1_row(x, 33, b, &err), VERR_RANGE);
    cr_assert_eq(quant_q8_1_row(x, -32, b, &err), VERR_RANGE);
    cr_assert_eq(quant_q8_1_row(NULL, 32, b, &err), VERR_RANGE);
    cr_assert_eq(quant_q8_1_row(x, 0, NULL, &err), VERR_OK);
    cr_assert_eq(quant_q8_1_row_bytes(64), 72);
    cr_assert_eq(quant_q8_1_row_bytes(65), 0);
    float out;
    cr_assert_eq(quant_dot_q8_1(GGML_TYPE_F32, x, b, 32, &out, &err), VERR_UNSUPPORTED);
    cr_assert_eq(quant_dot_q8_1(GGML_TYPE_IQ3_S, x, b, 256, &out, &err), VERR_UNSUPPORTED);
    cr_assert_eq(quant_dot_q8_1(GGML_TYPE_Q4_K, x, b, 32, &out, &err), VERR_RANGE);
    cr_log_info("refusal message: %s", err.msg);
}

// |q D - x| <= d/2 (rounding to the grid of the unrounded d = amax/127) +
// 127 |D - d| (D = the stored f16 d; at most 2^-11 d when D is a normal f16,
// so 0.5621 d; blocks with amax < 7.8e-3 have a subnormal D, coarser).
static double q8_err_bound(const float *x, const uint8_t *blk) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const double d = amax / 127.0, dd = quant_fp16_to_f32(f16_at(blk));
    return (d / 2 + 127.0 * fabs(dd - d)) * (1 + 1e-6);
}

Test(quant_q8, round_trip_bound) {
    rng_seed(11);
    enum { N = 32 * 512 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *b = malloc(N / 32 * 36);
    cr_assert(x && y && b);
    for (int i = 0; i < N; i++)
        x[i] = nrand() * powf(10.0f, (float)((i / 32) % 9) - 4.0f); // 1e-4 .. 1e4 scales
    quantize_ok(x, N, b);
    struct verr err = {0};
    cr_assert_eq(quant_q8_1_dequantize_row(b, N, y, &err), 0, "%s", err.msg);
    double worst = 0.0, worst_normal = 0.0;
    for (int i = 0; i < N; i += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[i + j]));
        const double d = amax / 127.0, bound = q8_err_bound(x + i, b + i / 32 * 36);
        for (int j = 0; j < 32; j++) {
            const double e = fabs((double)y[i + j] - x[i + j]);
            worst = fmax(worst, e / bound);
            if (amax >= 7.8e-3f)
                worst_normal = fmax(worst_normal, e / d);
            cr_assert_leq(e, bound, "element %d: |err| %.4g > bound %.4g", i + j, e, bound);
        }
    }
    cr_assert_leq(worst_normal, 0.5 + 127.0 / 2048.0 + 1e-6);
    cr_log_info("q8_1 round trip: worst |err| = %.4f d where D is a normal f16 (bound 0.5621 d); "
                "%.3f of the per-block bound overall",
                worst_normal, worst);
    free(x);
    free(y);
    free(b);
}

// ---------------------------------------------------------------------------
// dot products

// Activations: normal, with the block scale varying over 1e-2 .. 1e2 and an
// occasional all-zero block.
static void make_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const float s = (rng_u64() % 17 == 0) ? 0.0f : powf(10.0f, frand(-2.0f, 2.0f));
        for (int j = 0; j < 32; j++)
            x[i + j] = s * nrand();
    }
}

static const enum ggml_type q8_types[] = {
    GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
    GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
    GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
#define N_Q8_TYPES (sizeof q8_types / sizeof q8_types[0])

// Against the exact (double) dot of the dequantized weights (gguf/quant.c)
// with the dequantized activations: the integer sums are exact, so the
// difference is float rounding only: of each sub-block term (2-3 float
// products and a sum: a few 2^-24 of the term's parts) and of each dequantized
// weight (quant.c rounds d*q - m per element), summed with random signs.
// Measured over these rows (n = 256..4096, 24 rows each): worst 3.8e-8 of
// sum |w_i x_i| (all types 1.4e-8 .. 3.8e-8). Asserted: 1e-6, which leaves
// room for unlucky cancellation without hiding a bookkeeping error (a wrong
// scale, min or fifth bit moves the result by percents).
// Against the dot with the original f32 activations: the error of 8-bit
// rounding, |e_i| <= d/2 + 127 |D - d| per element (round_trip_bound; 0.5621 d
// for a normal D), so |err| <= sum_i |w_i| bound_i exactly; relative to
// sum |w_i x_i| that bound is ~0.56 amax / (127 mean|x|) ~ 1.2e-2 for normal
// x (amax of 32 ~ 2.2 sigma, mean |x| = 0.8 sigma). Random signs cancel most
// of it: measured worst 3.9e-3 of sum |w_i x_i| (Q4_K; 1.6e-3 .. 3.9e-3
// over the types), at most 0.36 of the per-row bound. Asserted: the
// per-row bound, and 1e-2 of sum |w_i x_i|.
#define DEQ_REL_TOL 1e-6
#define ACT_REL_TOL 1e-2

Test(quant_q8, dot_every_type_vs_float) {
    rng_seed(7);
    const int64_t sizes[] = {256, 512, 1024, 4096};
    for (size_t ti = 0; ti < N_Q8_TYPES; ti++) {
        const enum ggml_type type = q8_types[ti];
        double worst_deq = 0.0, worst_act = 0.0, worst_act_bound = 0.0;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const int64_t n = sizes[si];
            float *x = malloc(n * sizeof *x), *xd = malloc(n * sizeof *xd),
                  *wd = malloc(n * sizeof *wd);
            uint8_t *xq = malloc(n / 32 * 36);
            cr_assert(x && xd && wd && xq);
            for (int rep = 0; rep < 24; rep++) {
                uint8_t *w = rand_blocks(type, n, 1, RAND_SIGN_FIRST);
                make_x(x, n);
                struct verr err = {0};
                quantize_ok(x, n, xq);
                cr_assert_eq(quant_q8_1_dequantize_row(xq, n, xd, &err), 0);
                cr_assert_eq(quant_dequantize_row(type, w, wd, n, &err), 0, "%s", err.msg);
                float got;
                cr_assert_eq(quant_dot_q8_1(type, w, xq, n, &got, &err), 0, "%s", err.msg);
                double ref_deq = 0.0, ref_act = 0.0, mag = 0.0, bound = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    ref_deq += (double)wd[i] * xd[i];
                    ref_act += (double)wd[i] * x[i];
                    mag += fabs((double)wd[i] * x[i]);
                }
                for (int64_t i = 0; i < n; i += 32) {
                    const double eb = q8_err_bound(x + i, xq + i / 32 * 36);
                    for (int j = 0; j < 32; j++)
                        bound += fabs((double)wd[i + j]) * eb;
                }
                if (mag == 0.0)
                    continue;
                const double e_deq = fabs(got - ref_deq) / mag, e_act = fabs(got - ref_act);
                worst_deq = fmax(worst_deq, e_deq);
                worst_act = fmax(worst_act, e_act / mag);
                worst_act_bound = fmax(worst_act_bound, e_act / (bound * (1 + 1e-5) + 1e-30));
                cr_expect_leq(e_deq, DEQ_REL_TOL,
                              "%s n %lld rep %d: %.9g vs dequantized %.9g (%.3g)",
                              ggml_type_name(type), (long long)n, rep, got, ref_deq, e_deq);
                cr_expect_leq(e_act, bound * (1 + 1e-5) + 1e-6 * mag,
                              "%s n %lld rep %d: %.9g vs f32 %.9g beyond the rounding bound %.3g",
                              ggml_type_name(type), (long long)n, rep, got, ref_act, bound);
                cr_expect_leq(e_act / mag, ACT_REL_TOL, "%s n %lld rep %d", ggml_type_name(type),
                              (long long)n, rep);
                free(w);
            }
            free(x);
            free(xd);
            free(wd);
            free(xq);
        }
        cr_log_info("%-5s q8_1 dot: vs dequantized-x dot worst %.3g of sum|wx|; vs f32-x dot "
                    "worst %.3g of sum|wx| (%.2f of the rounding bound)",
                    ggml_type_name(type), worst_deq, worst_act, worst_act_bound);
    }
}

// Legacy types on rows of one and three blocks, and a zero activation row.
Test(quant_q8, dot_short_rows_and_zero_x) {
    rng_seed(3);
    const enum ggml_type legacy[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                     GGML_TYPE_Q8_0};
    for (size_t k = 0; k < sizeof legacy / sizeof legacy[0]; k++) {
        for (int64_t n = 32; n <= 96; n += 64) {
            uint8_t *w = rand_blocks(legacy[k], n, 1, RAND_SIGN_FIRST), xq[3 * 36];
            float x[96], xd[96], wd[96], got;
            struct verr err = {0};
            make_x(x, n);
            quantize_ok(x, n, xq);
            cr_assert_eq(quant_q8_1_dequantize_row(xq, n, xd, &err), 0);
            cr_assert_eq(quant_dequantize_row(legacy[k], w, wd, n, &err), 0);
            cr_assert_eq(quant_dot_q8_1(legacy[k], w, xq, n, &got, &err), 0);
            double ref = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                ref += (double)wd[i] * xd[i];
                mag += fabs((double)wd[i] * xd[i]);
            }
            cr_expect_leq(fabs(got - ref), DEQ_REL_TOL * mag, "%s n %lld",
                          ggml_type_name(legacy[k]), (long long)n);
            memset(x, 0, sizeof x);
            quantize_ok(x, n, xq);
            cr_assert_eq(quant_dot_q8_1(legacy[k], w, xq, n, &got, &err), 0);
            cr_expect_eq(got, 0.0f);
            free(w);
        }
    }
}
