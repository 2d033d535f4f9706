// Test helper (header-only, included by test_quant_q8.c, gpu/test_cuda_ops.c
// and gpu/test_cuda_matvec_q8.c, after or instead of tests/rng_splitmix.h):
// random weight rows of every type the kernels read, drawn from the seeded
// splitmix64 stream of tests/rng_splitmix.h, so a test that seeds the stream
// gets the same weights on every run.
//
// Quantized blocks are random bytes (every quant and sub-scale bit pattern
// occurs) whose f16 scale fields are then overwritten with finite values of a
// sensible size, so that dequantized weights are O(0.1..1): within f16 range
// for the GEMM path and far from overflow. F32, F16 and BF16 elements are
// 0.5 N(0, 1).
//
// A signed scale takes two draws, a sign and a magnitude; the including files
// were written with either order (enum rand_sign_order), and each keeps its
// own so that its seeded cases see the same weights as before.
#ifndef VELA_TESTS_RAND_BLOCKS_H
#define VELA_TESTS_RAND_BLOCKS_H

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/types.h"
#include "tests/rng_splitmix.h"

static inline float frand(float lo, float hi) { // [lo, hi)
    return lo + (hi - lo) * (float)urand();
}

enum rand_sign_order {
    RAND_SIGN_FIRST,      // the sign bit, then the magnitude
    RAND_MAGNITUDE_FIRST, // the magnitude, then the sign bit
};

// A magnitude in [lo, hi) with a random sign.
static inline float signed_in(float lo, float hi, enum rand_sign_order order) {
    if (order == RAND_SIGN_FIRST)
        return (rng_u64() & 1) ? -frand(lo, hi) : frand(lo, hi);
    const float m = frand(lo, hi);
    return (rng_u64() & 1) ? -m : m;
}

static inline void put_f16(uint8_t *p, float v) { // little-endian
    const uint16_t h = quant_f32_to_fp16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

// Overwrites the scale fields of the block of `type` at p (or, for a plain
// type, the element). False for a type without a generator here.
static inline bool rand_block_fix(enum ggml_type type, uint8_t *p, enum rand_sign_order order) {
    switch (type) {
    case GGML_TYPE_F32: {
        const float v = 0.5f * nrand();
        memcpy(p, &v, 4);
        return true;
    }
    case GGML_TYPE_F16:
        put_f16(p, 0.5f * nrand());
        return true;
    case GGML_TYPE_BF16: {
        const uint16_t h = quant_f32_to_bf16(0.5f * nrand());
        p[0] = (uint8_t)(h & 0xff);
        p[1] = (uint8_t)(h >> 8);
        return true;
    }
    case GGML_TYPE_Q4_0:
        put_f16(p, signed_in(0.01f, 0.1f, order));
        return true;
    case GGML_TYPE_Q5_0:
        put_f16(p, signed_in(0.005f, 0.05f, order));
        return true;
    case GGML_TYPE_Q8_0:
        put_f16(p, signed_in(0.0005f, 0.005f, order));
        return true;
    case GGML_TYPE_Q4_1:
        put_f16(p, signed_in(0.01f, 0.1f, order));
        put_f16(p + 2, frand(-0.5f, 0.5f));
        return true;
    case GGML_TYPE_Q5_1:
        put_f16(p, signed_in(0.005f, 0.05f, order));
        put_f16(p + 2, frand(-0.5f, 0.5f));
        return true;
    case GGML_TYPE_Q2_K: // x = (d sc) q - dmin m, sc and m up to 15, q up to 3
        put_f16(p + 80, frand(0.005f, 0.02f));
        put_f16(p + 82, frand(0.005f, 0.02f));
        return true;
    case GGML_TYPE_Q3_K: // x = (d sc) q, sc in [-32, 31], q in [-4, 3]
        put_f16(p + 108, signed_in(0.001f, 0.005f, order));
        return true;
    case GGML_TYPE_Q4_K:
        put_f16(p, frand(0.0005f, 0.002f));
        put_f16(p + 2, frand(0.0005f, 0.002f));
        return true;
    case GGML_TYPE_Q5_K:
        put_f16(p, frand(0.0002f, 0.001f));
        put_f16(p + 2, frand(0.0002f, 0.001f));
        return true;
    case GGML_TYPE_Q6_K:
        put_f16(p + 208, signed_in(0.00005f, 0.0002f, order));
        return true;
    case GGML_TYPE_IQ4_NL: // x = d level, level in [-127, 113]
        put_f16(p, signed_in(0.0005f, 0.005f, order));
        return true;
    case GGML_TYPE_IQ4_XS: // x = (d sc) level, sc in [-32, 31]
        put_f16(p, signed_in(0.00002f, 0.0002f, order));
        return true;
    case GGML_TYPE_MXFP4: // x = 2^(e-128) level, level in [-12, 12]: e of 2^-7 .. 2^-3
        p[0] = (uint8_t)(121 + rng_u64() % 5);
        return true;
    default:
        return false;
    }
}

// n_out rows of n_in weights of `type` (malloc'd, with 16 bytes of slack
// after the last row): every byte drawn, then every block fixed up in order.
static inline uint8_t *rand_blocks(enum ggml_type type, int64_t n_in, int64_t n_out,
                                   enum rand_sign_order order) {
    const struct ggml_type_info *ti = ggml_type_get(type);
    const size_t total = ggml_row_bytes(type, n_in) * (size_t)n_out;
    uint8_t *w = malloc(total + 16);
    cr_assert_not_null(w);
    for (size_t i = 0; i < total; i++)
        w[i] = (uint8_t)rng_u64();
    for (size_t b = 0; b < total / ti->block_bytes; b++)
        if (!rand_block_fix(type, w + b * ti->block_bytes, order))
            cr_assert_fail("no generator for %s", ggml_type_name(type));
    return w;
}

#endif
