// The CUDA weight decoders (cuda/dequant.cuh), compiled for the host through
// cuda_dequant_row_host, against the host reference gguf/quant.c: bit for
// bit, on random blocks where every quant bit pattern and sub-scale occurs.
// Needs no GPU: the decoders are the same source the kernels run, so a
// layout mistake shows up here on any machine (the GPU itself is covered by
// test_cuda_ops.c's embed and matmul tests).
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/dequant_host.h"
#include "gguf/quant.h"
#include "gguf/types.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_u64(void) { // xorshift64
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// Byte offsets of the f16 scale fields of one block (-1: none).
static void f16_fields(enum ggml_type t, int off[2]) {
    off[0] = off[1] = -1;
    switch (t) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS:
        off[0] = 0;
        break;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
        off[0] = 0;
        off[1] = 2;
        break;
    case GGML_TYPE_Q6_K:
        off[0] = 208;
        break;
    case GGML_TYPE_Q2_K:
        off[0] = 80;
        off[1] = 82;
        break;
    case GGML_TYPE_Q3_K:
        off[0] = 108;
        break;
    default:
        break;
    }
}

static void check_type(enum ggml_type type, int64_t n, int rows) {
    const struct ggml_type_info *ti = ggml_type_get(type);
    const size_t rb = ggml_row_bytes(type, n);
    cr_assert_gt(rb, 0);
    uint8_t *w = aligned_alloc(16, (rb * rows + 15) / 16 * 16);
    float *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
    cr_assert(w && ref && got);
    int off[2];
    f16_fields(type, off);
    int64_t mismatches = 0;
    for (int r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        for (size_t i = 0; i < rb; i++)
            row[i] = (uint8_t)rng_u64();
        // Finite block scales (an inf/NaN scale is refused by the loader);
        // plain F16/BF16/F32 rows keep every bit pattern, NaN included.
        if (ti->quantized)
            for (size_t b = 0; b < rb / ti->block_bytes; b++)
                for (int k = 0; k < 2; k++)
                    if (off[k] >= 0 && (row[b * ti->block_bytes + off[k] + 1] & 0x7c) == 0x7c)
                        row[b * ti->block_bytes + off[k] + 1] &= 0x83;
        struct verr err = {0};
        cr_assert_eq(quant_dequantize_row(type, row, ref, n, &err), 0, "%s", err.msg);
        cr_assert_eq(cuda_dequant_row_host(type, row, n, got, &err), 0, "%s", err.msg);
        for (int64_t i = 0; i < n; i++) {
            const bool same = memcmp(&ref[i], &got[i], sizeof(float)) == 0 ||
                              (isnan(ref[i]) && isnan(got[i]));
            if (!same && mismatches++ < 5)
                cr_log_error("%s n %lld row %d element %lld: cuda decoder %.9g, quant.c %.9g",
                             ti->name, (long long)n, r, (long long)i, got[i], ref[i]);
        }
    }
    cr_log_info("%s n %lld x %d rows: %lld mismatches", ti->name, (long long)n, rows,
                (long long)mismatches);
    cr_expect_eq(mismatches, 0, "%s: %lld elements differ from gguf/quant.c", ti->name,
                 (long long)mismatches);
    free(w);
    free(ref);
    free(got);
}

Test(cuda_decode, block_types_bit_exact) {
    // MXFP4: every E8M0 byte, 255 and the overflowing products (inf) included.
    const enum ggml_type q32[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                  GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof q32 / sizeof q32[0]; i++) {
        check_type(q32[i], 32, 64);
        check_type(q32[i], 4096 + 32, 16);
    }
    const enum ggml_type qk[] = {GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                 GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof qk / sizeof qk[0]; i++) {
        check_type(qk[i], 256, 64);
        check_type(qk[i], 4352, 16);
    }
}

Test(cuda_decode, plain_types_bit_exact) {
    const enum ggml_type plain[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        check_type(plain[i], 1, 8);
        check_type(plain[i], 37, 8);
        check_type(plain[i], 4099, 4);
    }
}

Test(cuda_decode, refuses_unsupported) {
    float out[256];
    uint8_t row[256] __attribute__((aligned(16))) = {0};
    struct verr err = {0};
    cr_expect_eq(cuda_dequant_row_host(GGML_TYPE_IQ3_S, row, 256, out, &err), VERR_UNSUPPORTED);
    cr_expect_eq(cuda_dequant_row_host(GGML_TYPE_Q4_0, row, 33, out, &err), VERR_RANGE);
}
