// Quantized weight formats (gguf/quant.c): fp16/bf16 conversion, block
// decoders against hand-built blocks and against golden data from llama.cpp's
// ggml, the bit-exact legacy quantizers, the K-quant round-trip error bounds,
// quant_dot_row against dequantize + dot, and the error paths.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_q8.h"

// ---------------------------------------------------------------------------
// helpers shared with the golden-data generator (same PRNG, same inputs)

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s; }
static uint32_t rng_next(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 32);
}
// Uniform in [-1, 1), every value exact in float.
static float rng_unit(void) { return (float)((int32_t)(rng_next() >> 8) - 8388608) * 0x1p-23f; }
static float rng_gauss(void) {
    double u1 = ((double)(rng_next() >> 8) + 1.0) / 16777217.0, u2 = (double)(rng_next() >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint64_t fnv_init(void) { return 0xcbf29ce484222325ULL; }
static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
static uint64_t fnv_u32(uint64_t h, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return fnv_bytes(h, b, 4);
}
static uint64_t fnv_u16(uint64_t h, uint16_t v) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    return fnv_bytes(h, b, 2);
}
static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float ffrom(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static const struct ggml_type_info *info(enum ggml_type t) { return ggml_type_get((uint32_t)t); }

static float *dequant(enum ggml_type t, const void *src, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    cr_assert_not_null(y);
    struct verr err = {0};
    int rc = quant_dequantize_row(t, src, y, n, &err);
    cr_assert_eq(rc, 0, "dequantize %s: %s", ggml_type_name(t), err.msg);
    return y;
}

// ---------------------------------------------------------------------------
// fp16 / bf16

Test(fp16, edge_cases) {
    static const struct { float f; uint16_t h; } want[] = {
        {0.0f, 0x0000},      {-0.0f, 0x8000},       {1.0f, 0x3c00},       {-2.0f, 0xc000},
        {0.5f, 0x3800},      {65504.0f, 0x7bff},    // largest finite half
        {65519.99f, 0x7bff}, {65520.0f, 0x7c00},    // halfway to 2^16: ties to even = inf
        {1e9f, 0x7c00},      {-1e9f, 0xfc00},       {INFINITY, 0x7c00},   {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400},  // smallest normal
        {0x1p-24f, 0x0001},  // smallest subnormal
        {0x1p-25f, 0x0000},  // exactly half of it: tie to even (0)
        {0x1.000002p-25f, 0x0001}, // just above the tie
        {0x3p-25f, 0x0002},  // 1.5 units: tie to even (2)
        {0x5p-25f, 0x0002},  // 2.5 units: tie to even (2)
        {0x3ffp-24f, 0x03ff}, // largest subnormal
        {0x7ffp-25f, 0x0400}, // 1023.5 units: ties to even carry into the smallest normal
        {1.0f + 0x1p-11f, 0x3c00},        // tie between 1 and 1+2^-10: even (1)
        {1.0f + 0x3p-11f, 0x3c02},        // tie between 1+2^-10 and 1+2^-9: even (1+2^-9)
        {0x1.002002p+0f, 0x3c01},         // 1 + 2^-11 + 2^-23: just above the tie
        // In [1024, 2048) halves are 1 apart: 2047.5 ties between 2047 (odd
        // mantissa) and 2048 (even), 2046.5 between 2046 (even) and 2047.
        {2047.5f, 0x6800}, {2046.5f, 0x67fe},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(quant_f32_to_fp16(want[i].f), want[i].h, "fp16(%a) = 0x%04x, want 0x%04x",
                     (double)want[i].f, quant_f32_to_fp16(want[i].f), want[i].h);

    cr_expect_eq(quant_fp16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(quant_fp16_to_f32(0x03ff), 0x3ffp-24f);
    cr_expect_eq(quant_fp16_to_f32(0x0400), 0x1p-14f);
    cr_expect_eq(quant_fp16_to_f32(0x7bff), 65504.0f);
    cr_expect_eq(quant_fp16_to_f32(0xc000), -2.0f);
    cr_expect_eq(fbits(quant_fp16_to_f32(0x8000)), 0x80000000u, "-0 keeps its sign");
    cr_expect(isinf(quant_fp16_to_f32(0x7c00)) && quant_fp16_to_f32(0x7c00) > 0);
    cr_expect(isinf(quant_fp16_to_f32(0xfc00)) && quant_fp16_to_f32(0xfc00) < 0);
    // NaN: quiet NaN out, payload kept; quiet NaN back.
    cr_expect(isnan(quant_fp16_to_f32(0x7e00)));
    cr_expect_eq(fbits(quant_fp16_to_f32(0x7c01)), 0x7fc02000u, "signalling NaN is quieted");
    cr_expect(isnan(quant_fp16_to_f32(0xfe00)));
    uint16_t hn = quant_f32_to_fp16(NAN);
    cr_expect((hn & 0x7c00) == 0x7c00 && (hn & 0x03ff) != 0, "NaN -> 0x%04x", hn);
    cr_expect_eq(quant_f32_to_fp16(ffrom(0x7f800001u)) & 0x7e00, 0x7e00, "sNaN stays NaN, quiet");
}

// Every half converts to float and back to itself (NaN to some NaN).
Test(fp16, exhaustive_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_fp16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_fp16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff)) {
            cr_assert(isnan(f), "0x%04x is a NaN", h);
            cr_assert((back & 0x7c00) == 0x7c00 && (back & 0x03ff), "0x%04x: NaN back", h);
            continue;
        }
        cr_assert_eq(back, h, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
}

// The float sweep used by the golden hashes: random bit patterns, half of
// them moved next to an f16 rounding boundary (low 13 bits near 0x1000).
static uint32_t sweep_bits(uint32_t i) {
    uint32_t u = rng_next();
    if (i & 1)
        u = (u & 0xffffe000u) | ((0x1000u + (u >> 29) - 4) & 0x1fff);
    return u;
}

#ifdef __FLT16_MANT_DIG__
// An independent oracle: the compiler's _Float16 conversion (IEEE RNE).
Test(fp16, matches_compiler_float16) {
    rng_seed(11);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < (1u << 20); i++) {
        float f = ffrom(sweep_bits(i));
        if (isnan(f))
            continue;
        _Float16 g = (_Float16)f;
        uint16_t want;
        memcpy(&want, &g, 2);
        if (quant_f32_to_fp16(f) != want && bad++ < 5)
            cr_log_error("fp16(%a) = 0x%04x, _Float16 0x%04x", (double)f, quant_f32_to_fp16(f), want);
    }
    cr_expect_eq(bad, 0, "%u mismatches against _Float16", bad);
}
#endif

Test(bf16, edge_cases) {
    cr_expect_eq(quant_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(quant_f32_to_bf16(-2.0f), 0xc000);
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x3f808000u)), 0x3f80, "tie: even mantissa stays");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x3f818000u)), 0x3f82, "tie: odd mantissa rounds up");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x3f808001u)), 0x3f81, "above the tie");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x7f7fffffu)), 0x7f80, "FLT_MAX rounds to inf");
    cr_expect_eq(quant_f32_to_bf16(INFINITY), 0x7f80);
    cr_expect_eq(quant_f32_to_bf16(-INFINITY), 0xff80);
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x00018000u)), 0x0002, "subnormals round, not flushed");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x7f800001u)), 0x7fc0, "sNaN: NaN, quiet");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0xffc12345u)), 0xffc1, "qNaN keeps sign and payload top");
    cr_expect_eq(quant_f32_to_bf16(ffrom(0x7fffffffu)), 0x7fff, "NaN never rounds into inf");
    cr_expect_eq(fbits(quant_bf16_to_f32(0x3f81)), 0x3f810000u);
    cr_expect(isnan(quant_bf16_to_f32(0x7fc0)));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        cr_assert_eq(quant_f32_to_bf16(f), h, "bf16 0x%04x round trip", h);
    }
}

// ---------------------------------------------------------------------------
// golden data from llama.cpp's ggml
//
// Generated by a small C program (kept out of the repo) linked against
// ggml-org/ggml commit d99724f2b141fed9e1a9f402213506c081433465,
// src/ggml-quants.c and ggml-impl.h, compiled with gcc 12 -O2 without -march
// (as ggml-base is built, so no FMA contraction). Its inputs are regenerated
// here with the same PRNG (rng_*), its outputs are 64-bit FNV-1a hashes of the
// bytes or float bit patterns it produced, plus a few raw values. NaN inputs
// to f32->f16 are left out: ggml canonicalises them to 0x7e00, vela keeps the
// payload as F16C does.

Test(golden, fp16_bf16_conversions) {
    uint64_t h16 = fnv_init(), hb16 = fnv_init(), h16b = fnv_init(), hbb = fnv_init();
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        h16b = fnv_u32(h16b, fbits(quant_fp16_to_f32((uint16_t)h)));
        hbb = fnv_u32(hbb, fbits(quant_bf16_to_f32((uint16_t)h)));
    }
    rng_seed(7);
    for (uint32_t i = 0; i < (1u << 20); i++) {
        float f = ffrom(sweep_bits(i));
        hb16 = fnv_u16(hb16, quant_f32_to_bf16(f));
        if (isnan(f))
            continue;
        h16 = fnv_u16(h16, quant_f32_to_fp16(f));
    }
    cr_expect_eq(h16, 0x5853be351a742cdeULL, "f32->f16 sweep differs from ggml");
    cr_expect_eq(h16b, 0xa7a575fd4882f925ULL, "f16->f32 differs from ggml");
    cr_expect_eq(hb16, 0x75364629a8960eccULL, "f32->bf16 sweep differs from ggml");
    cr_expect_eq(hbb, 0x8c2e898e6a5096e5ULL, "bf16->f32 differs from ggml");
}

#define GOLD_N 2048 // 64 blocks of 32

// 64 blocks of uniform data, block b scaled by 2^((b % 9) - 4), every 5th
// block with one element times 8 (an outlier that sets the scale).
static void gold_random(float *x) {
    rng_seed(1);
    for (int i = 0; i < GOLD_N; i++) {
        int b = i / 32;
        x[i] = rng_unit() * ldexpf(1.0f, (b % 9) - 4);
        if (b % 5 == 0 && i % 32 == b % 32)
            x[i] *= 8.0f;
    }
}

// Multiples of 1/4 and 1/2 that put x * (1/d) exactly on .5 boundaries, so the
// rounding rule of every quantizer shows (roundf's away-from-zero, +0.5 and
// truncate, ...).
static void gold_ties(float *x) {
    for (int i = 0; i < GOLD_N; i++) {
        int b = i / 32;
        if (b < 32)
            x[i] = (float)((i * 7 + b * 3) % 17 - 8) * 0.25f;
        else
            x[i] = (float)((i * 5 + b) % 16) * 0.5f - 4.0f;
    }
}

static const uint8_t gold_q8_0_random_block0[34] = {
    0xf4, 0x10, 0x81, 0x02, 0x1f, 0xe8, 0x3d, 0x00, 0x0b, 0xa6, 0x46, 0xc2,
    0x33, 0x07, 0x3b, 0xda, 0xcb, 0x34, 0xf0, 0x0f, 0x19, 0xc3, 0x4c, 0x63,
    0x0a, 0x19, 0xe9, 0x3c, 0x13, 0xa4, 0x60, 0x50, 0xd3, 0x1d,
};
static const uint8_t gold_q8_0_ties_block0[34] = {
    0x08, 0x24, 0x81, 0xf0, 0x5f, 0xc0, 0x30, 0x91, 0x00, 0x6f, 0xd0, 0x40,
    0xa1, 0x10, 0x7f, 0xe0, 0x4f, 0xb1, 0x20, 0x81, 0xf0, 0x5f, 0xc0, 0x30,
    0x91, 0x00, 0x6f, 0xd0, 0x40, 0xa1, 0x10, 0x7f, 0xe0, 0x4f,
};
static const uint8_t gold_q4_0_random_block0[18] = {
    0xea, 0x20, 0x70, 0x98, 0xaa, 0x46, 0xdc, 0xe8, 0x99, 0xa2, 0x7c, 0xc4,
    0x9b, 0x28, 0xec, 0xd6, 0x55, 0xab,
};
static const uint8_t gold_q4_0_ties_block0[18] = {
    0x00, 0x34, 0xa0, 0x07, 0x7e, 0xe4, 0x4b, 0xb1, 0x18, 0x8f, 0xf5, 0x5c,
    0xc2, 0x29, 0x9f, 0xf6, 0x6d, 0xd3,
};
static const uint8_t gold_q4_1_random_block0[20] = {
    0xab, 0x20, 0xea, 0xac, 0x70, 0x99, 0xaa, 0x47, 0xdc, 0xf8, 0x99, 0xa2,
    0x7d, 0xc4, 0xac, 0x29, 0xfc, 0xe6, 0x55, 0xac,
};
static const uint8_t gold_q4_1_ties_block0[20] = {
    0x44, 0x34, 0x00, 0xc0, 0x90, 0x07, 0x7d, 0xd4, 0x4a, 0xa1, 0x17, 0x7e,
    0xe5, 0x5b, 0xb2, 0x28, 0x8f, 0xf6, 0x6c, 0xc3,
};
static const uint8_t gold_q5_0_random_block0[22] = {
    0xea, 0x1c, 0x76, 0x9d, 0xf6, 0xb6, 0xe0, 0x20, 0x34, 0x8d, 0xa8, 0xc0,
    0x11, 0x35, 0xd9, 0x88, 0x26, 0x41, 0xc7, 0xab, 0xa9, 0x47,
};
static const uint8_t gold_q5_0_ties_block0[22] = {
    0x00, 0x30, 0xd4, 0x5a, 0xa9, 0xb5, 0x40, 0x0e, 0xec, 0xc8, 0x86, 0x62,
    0x20, 0x0e, 0xea, 0xa8, 0x84, 0x42, 0x2f, 0xfc, 0xca, 0xa6,
};
static const uint8_t gold_q5_1_random_block0[24] = {
    0x84, 0x1c, 0xea, 0xac, 0x76, 0x9d, 0xf6, 0xb6, 0xf0, 0x32, 0x56, 0x9e,
    0xca, 0xf1, 0x33, 0x55, 0xeb, 0xa9, 0x48, 0x52, 0xf9, 0xcc, 0xba, 0x58,
};
static const uint8_t gold_q5_1_ties_block0[24] = {
    0x21, 0x30, 0x00, 0xc0, 0xd4, 0x5a, 0xa9, 0xb5, 0x30, 0x0e, 0xeb, 0xb8,
    0x85, 0x52, 0x20, 0x0d, 0xda, 0xa7, 0x74, 0x41, 0x1f, 0xfc, 0xc9, 0x96,
};

static const struct {
    enum ggml_type type;
    uint64_t hash_random, hash_ties; // over all 64 blocks
    const uint8_t *block0_random, *block0_ties;
} gold_quant[] = {
    {GGML_TYPE_Q8_0, 0x69b9341c5c14a017ULL, 0x43abe175244f0a53ULL, gold_q8_0_random_block0,
     gold_q8_0_ties_block0},
    {GGML_TYPE_Q4_0, 0xc1a61d83adf1b1cdULL, 0xf013ef20474d6a46ULL, gold_q4_0_random_block0,
     gold_q4_0_ties_block0},
    {GGML_TYPE_Q4_1, 0x18ef47e7f7197d89ULL, 0x2179056589d6b27bULL, gold_q4_1_random_block0,
     gold_q4_1_ties_block0},
    {GGML_TYPE_Q5_0, 0xe6289c7cb2c09824ULL, 0xec49524949c46660ULL, gold_q5_0_random_block0,
     gold_q5_0_ties_block0},
    {GGML_TYPE_Q5_1, 0x5ccf959e915772a3ULL, 0x4cdc5b7709166a0fULL, gold_q5_1_random_block0,
     gold_q5_1_ties_block0},
};

Test(golden, legacy_quantizers_bit_exact) {
    static float xr[GOLD_N], xt[GOLD_N];
    static uint8_t out[GOLD_N * 2];
    gold_random(xr);
    gold_ties(xt);
    for (size_t t = 0; t < sizeof gold_quant / sizeof gold_quant[0]; t++) {
        const struct ggml_type_info *ti = info(gold_quant[t].type);
        const size_t bytes = ggml_row_bytes(gold_quant[t].type, GOLD_N);
        for (int which = 0; which < 2; which++) {
            struct verr err = {0};
            int rc = quant_quantize_row(gold_quant[t].type, which ? xt : xr, out, GOLD_N, &err);
            cr_assert_eq(rc, 0, "%s: %s", ti->name, err.msg);
            const uint8_t *b0 = which ? gold_quant[t].block0_ties : gold_quant[t].block0_random;
            for (uint32_t k = 0; k < ti->block_bytes; k++)
                cr_expect_eq(out[k], b0[k], "%s %s block 0 byte %u: 0x%02x, ggml 0x%02x", ti->name,
                             which ? "ties" : "random", k, out[k], b0[k]);
            uint64_t h = fnv_bytes(fnv_init(), out, bytes);
            cr_expect_eq(h, which ? gold_quant[t].hash_ties : gold_quant[t].hash_random,
                         "%s %s: 64 blocks differ from ggml's quantize_row_%s_ref", ti->name,
                         which ? "ties" : "random", ti->name);
        }
    }
}

// Random blocks (random bytes, f16 fields replaced by finite halves between
// 2^-10 and 2^5 with random sign), decoded by ggml's dequantize_row_*.
static const struct {
    enum ggml_type type;
    int f16_off[2]; // byte offsets of the f16 fields in a block, -1: none
    uint64_t hash;
    uint32_t first, at17, last; // bit patterns of y[0], y[17], y[n-1]
} gold_dequant[] = {
    {GGML_TYPE_Q4_0, {0, -1}, 0x3a22bbe755398e25ULL, 0x00000000, 0x3a982000, 0xc1918c00},
    {GGML_TYPE_Q4_1, {0, 2}, 0x75ab532f77e9511dULL, 0xc1368000, 0xc113d000, 0x41587c00},
    {GGML_TYPE_Q5_0, {0, -1}, 0x8f32759c04782cf2ULL, 0x3dba4400, 0xbd925a00, 0xc130d600},
    {GGML_TYPE_Q5_1, {0, 2}, 0x056502adf1b92b19ULL, 0x4448284b, 0x43b4c696, 0x4124ad80},
    {GGML_TYPE_Q8_0, {0, -1}, 0x0f88845c7e3b2dbcULL, 0xc409d000, 0x44781000, 0x3ed27a00},
    {GGML_TYPE_Q2_K, {80, 82}, 0x7956b78fc7dd51feULL, 0x40018f80, 0x410fae60, 0x407cf000},
    {GGML_TYPE_Q3_K, {108, -1}, 0x14963d200fc22a9eULL, 0x80000000, 0xc0418000, 0x3d456700},
    {GGML_TYPE_Q4_K, {0, 2}, 0x93b2ad7a3f032e2cULL, 0xbd6e5000, 0x3e42b800, 0xbf88e430},
    {GGML_TYPE_Q5_K, {0, 2}, 0x6fc38c425067894dULL, 0xc3e6a80c, 0xc3ecca20, 0xc355d7fe},
    {GGML_TYPE_Q6_K, {208, -1}, 0x52bbb3642f6e275cULL, 0x40dbcc00, 0x41f12a80, 0x44508ed0},
    {GGML_TYPE_IQ4_NL, {0, -1}, 0xa37a61e8c61576c2ULL, 0xc2cc0400, 0xc2cc0400, 0x4046a800},
    // Added with vela's IQ4_XS, from the libggml-base of llama.cpp 0c1e570
    // (its format is unchanged since the commit above; the same program gives
    // the IQ4_NL row above again).
    {GGML_TYPE_IQ4_XS, {0, -1}, 0xfc61629347700514ULL, 0xc5a6e500, 0xc6948940, 0x45dd1a68},
};

// 16 random blocks as the generator made them for table row t.
static uint8_t *gold_blocks(size_t t, int64_t *n_out) {
    const struct ggml_type_info *ti = info(gold_dequant[t].type);
    const int nb = 16;
    uint8_t *raw = malloc((size_t)nb * ti->block_bytes);
    cr_assert_not_null(raw);
    rng_seed(100 + t);
    for (uint32_t i = 0; i < nb * ti->block_bytes; i++)
        raw[i] = (uint8_t)(rng_next() >> 24);
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < 2; k++)
            if (gold_dequant[t].f16_off[k] >= 0) {
                uint32_t r = rng_next();
                uint16_t h = (uint16_t)(((r >> 31) << 15) | ((5 + (r >> 8) % 16) << 10) | (r & 0x3ff));
                put16(raw + b * ti->block_bytes + gold_dequant[t].f16_off[k], h);
            }
    *n_out = (int64_t)nb * ti->block_size;
    return raw;
}

Test(golden, dequantizers_bit_exact) {
    for (size_t t = 0; t < sizeof gold_dequant / sizeof gold_dequant[0]; t++) {
        int64_t n;
        uint8_t *raw = gold_blocks(t, &n);
        float *y = dequant(gold_dequant[t].type, raw, n);
        uint64_t h = fnv_init();
        for (int64_t i = 0; i < n; i++)
            h = fnv_u32(h, fbits(y[i]));
        const char *name = ggml_type_name(gold_dequant[t].type);
        cr_expect_eq(fbits(y[0]), gold_dequant[t].first, "%s y[0] = %a", name, (double)y[0]);
        cr_expect_eq(fbits(y[17]), gold_dequant[t].at17, "%s y[17] = %a", name, (double)y[17]);
        cr_expect_eq(fbits(y[n - 1]), gold_dequant[t].last, "%s y[n-1] = %a", name, (double)y[n - 1]);
        cr_expect_eq(h, gold_dequant[t].hash, "%s: %lld floats differ from ggml's dequantize_row",
                     name, (long long)n);
        free(y);
        free(raw);
    }
}

// ---------------------------------------------------------------------------
// hand-built blocks, expected values computed in the test from the layout

Test(dequant, f32_f16_bf16_rows) {
    const float x[4] = {1.5f, -0.25f, 65504.0f, 0x1p-24f};
    float y[4];
    cr_assert_eq(quant_dequantize_row(GGML_TYPE_F32, x, y, 4, NULL), 0);
    cr_expect_arr_eq(x, y, sizeof x);
    uint8_t h[8];
    put16(h + 0, 0x3e00); put16(h + 2, 0xb400); put16(h + 4, 0x7bff); put16(h + 6, 0x0001);
    // Odd address: f16 fields must be read without alignment assumptions.
    uint8_t hu[9];
    memcpy(hu + 1, h, 8);
    cr_assert_eq(quant_dequantize_row(GGML_TYPE_F16, hu + 1, y, 4, NULL), 0);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(y[i], x[i], "f16 %d: %a", i, (double)y[i]);
    put16(hu + 1, 0x3fc0); put16(hu + 3, 0xbe80); put16(hu + 5, 0x4780); put16(hu + 7, 0x0001);
    cr_assert_eq(quant_dequantize_row(GGML_TYPE_BF16, hu + 1, y, 4, NULL), 0);
    cr_expect_eq(y[0], 1.5f);
    cr_expect_eq(y[1], -0.25f);
    cr_expect_eq(y[2], 65536.0f);
    cr_expect_eq(fbits(y[3]), 0x00010000u);
}

Test(dequant, q4_0_hand) {
    // d = 0.5 (0x3800); byte j holds nibble j (element j) and 15 - j (element j+16).
    uint8_t b[1 + 18]; // +1: start at an odd address
    uint8_t *blk = b + 1;
    put16(blk, 0x3800);
    for (int j = 0; j < 16; j++)
        blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float *y = dequant(GGML_TYPE_Q4_0, blk, 32);
    cr_expect_eq(y[0], -4.0f);  // (0 - 8) * 0.5
    cr_expect_eq(y[8], 0.0f);   // (8 - 8) * 0.5
    cr_expect_eq(y[15], 3.5f);  // (15 - 8) * 0.5
    cr_expect_eq(y[16], 3.5f);  // high nibble of byte 0 is 15
    cr_expect_eq(y[31], -4.0f); // high nibble of byte 15 is 0
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(y[j], (float)(j - 8) * 0.5f);
        cr_expect_eq(y[j + 16], (float)(7 - j) * 0.5f);
    }
    free(y);
}

Test(dequant, q4_1_hand) {
    uint8_t blk[20];
    put16(blk, 0x3400);     // d = 0.25
    put16(blk + 2, 0xbc00); // m = -1
    for (int j = 0; j < 16; j++)
        blk[4 + j] = (uint8_t)((j * 3 % 16) | ((j * 5 % 16) << 4));
    float *y = dequant(GGML_TYPE_Q4_1, blk, 32);
    cr_expect_eq(y[0], -1.0f);
    cr_expect_eq(y[1], -0.25f);     // 3 * 0.25 - 1
    cr_expect_eq(y[16 + 3], 2.75f); // nibble 15: 15 * 0.25 - 1
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(y[j], (float)(j * 3 % 16) * 0.25f - 1.0f);
        cr_expect_eq(y[j + 16], (float)(j * 5 % 16) * 0.25f - 1.0f);
    }
    free(y);
}

Test(dequant, q5_0_and_q5_1_hand) {
    // qh = 0xa5a5f00f: element j's fifth bit is bit j.
    const uint32_t qh = 0xa5a5f00fu;
    uint8_t b0[22], b1[24];
    put16(b0, 0x3c00); // d = 1
    put16(b1, 0x3800); // d = 0.5
    put16(b1 + 2, 0x4000); // m = 2
    for (int k = 0; k < 4; k++)
        b0[2 + k] = b1[4 + k] = (uint8_t)(qh >> (8 * k));
    for (int j = 0; j < 16; j++)
        b0[6 + j] = b1[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    float *y0 = dequant(GGML_TYPE_Q5_0, b0, 32), *y1 = dequant(GGML_TYPE_Q5_1, b1, 32);
    // element 0: nibble 0, bit 0 of qh set -> 16 -> Q5_0 0, Q5_1 16 * 0.5 + 2 = 10
    cr_expect_eq(y0[0], 0.0f);
    cr_expect_eq(y1[0], 10.0f);
    // element 4: nibble 4, bit 4 clear -> 4 -> Q5_0 -12, Q5_1 4
    cr_expect_eq(y0[4], -12.0f);
    cr_expect_eq(y1[4], 4.0f);
    // element 31: nibble 0 (15 - 15), bit 31 set -> 16
    cr_expect_eq(y0[31], 0.0f);
    for (int e = 0; e < 32; e++) {
        int nib = e < 16 ? e : 15 - (e - 16);
        int q = nib | (int)(((qh >> e) & 1) << 4);
        cr_expect_eq(y0[e], (float)(q - 16), "q5_0 %d", e);
        cr_expect_eq(y1[e], (float)q * 0.5f + 2.0f, "q5_1 %d", e);
    }
    free(y0);
    free(y1);
}

Test(dequant, q8_0_and_iq4_nl_hand) {
    uint8_t b[34], n[18];
    put16(b, 0x3000); // d = 0.125
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float *y = dequant(GGML_TYPE_Q8_0, b, 32);
    cr_expect_eq(y[0], -16.0f);
    cr_expect_eq(y[31], 15.0f); // (248 - 128) * 0.125
    for (int j = 0; j < 32; j++)
        cr_expect_eq(y[j], (float)(j * 8 - 128) * 0.125f);
    free(y);
    // IQ4_NL levels, from llama.cpp's kvalues_iq4nl.
    static const int8_t lv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
    put16(n, 0x4000); // d = 2
    for (int j = 0; j < 16; j++)
        n[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    y = dequant(GGML_TYPE_IQ4_NL, n, 32);
    cr_expect_eq(y[0], -254.0f);
    cr_expect_eq(y[16], 226.0f);
    for (int j = 0; j < 16; j++) {
        cr_expect_eq(y[j], 2.0f * lv[j]);
        cr_expect_eq(y[j + 16], 2.0f * lv[15 - j]);
    }
    free(y);
}

// Q2_K: element e lives in qs[32 * (e / 128) + e % 32] at bits 2 * ((e % 128) / 32);
// group e / 16 has scale byte (min << 4 | scale).
Test(dequant, q2_k_hand) {
    uint8_t b[84];
    for (int g = 0; g < 16; g++)
        b[g] = (uint8_t)((g % 16) | ((15 - g) << 4)); // scale g, min 15 - g
    for (int k = 0; k < 64; k++)
        b[16 + k] = (uint8_t)(k * 37 + 11);
    put16(b + 80, 0x3800); // d = 0.5
    put16(b + 82, 0x3400); // dmin = 0.25
    float *y = dequant(GGML_TYPE_Q2_K, b, 256);
    // element 0: qs[0] = 11 = 0b00001011 -> q = 3; group 0: scale 0, min 15
    cr_expect_eq(y[0], 0.0f * 3 - 0.25f * 15);
    // element 200: qs[32 + 8] = (40*37+11) & 255 = 1491 & 255 = 211 = 0b11010011,
    // bits 2*((200 % 128)/32) = 4..5 -> 1; group 12: scale 12, min 3 -> 6 - 0.75
    cr_expect_eq(y[200], 5.25f);
    for (int e = 0; e < 256; e++) {
        int q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        int g = e / 16;
        cr_expect_eq(y[e], 0.5f * (float)(b[g] & 15) * (float)q - 0.25f * (float)(b[g] >> 4), "e %d", e);
    }
    free(y);
}

// Q3_K: scale g (6 bits, signed + 32) has its low nibble in scales[g % 8]
// (low nibble for g < 8) and top 2 bits at bit 2 * (g / 4) of scales[8 + g % 4];
// the third quant bit of element e is hmask[e % 32] bit (e / 32), clear = -4.
Test(dequant, q3_k_hand) {
    uint8_t b[110];
    memset(b, 0, sizeof b);
    int sc[16];
    for (int g = 0; g < 16; g++) {
        sc[g] = (g * 5) % 64 - 32; // -32 .. 31
        int u = sc[g] + 32;
        b[96 + g % 8] |= (uint8_t)((u & 15) << (g < 8 ? 0 : 4));
        b[96 + 8 + g % 4] |= (uint8_t)((u >> 4) << (2 * (g / 4)));
    }
    for (int k = 0; k < 32; k++)
        b[k] = (uint8_t)(k * 73 + 5);       // hmask
    for (int k = 0; k < 64; k++)
        b[32 + k] = (uint8_t)(k * 29 + 3);  // low 2 bits
    put16(b + 108, 0x3400);                 // d = 0.25
    // Packed scale bytes for this pattern, by hand: scales 0..7 = -32,-27,-22,-17,
    // -12,-7,-2,3 (stored 0,5,10,15,20,25,30,35), 8..15 = 8,13,18,23,28,-31,-26,-21
    // (stored 40,45,50,55,60,1,6,11). Bytes 0..7: low nibbles of stored 0..7,
    // high nibbles of stored 8..15. Byte 8 + k: top 2 bits of stored k, k+4,
    // k+8, k+12 at bits 0, 2, 4, 6: byte 8 = 0 | 1<<2 | 2<<4 | 3<<6 = 0xe4,
    // byte 9 = 0 | 1<<2 | 2<<4 | 0 = 0x24, byte 10 = 0 | 1<<2 | 3<<4 = 0x34,
    // byte 11 = 0 | 2<<2 | 3<<4 = 0x38.
    static const uint8_t packed[12] = {0x80, 0xd5, 0x2a, 0x7f, 0xc4, 0x19, 0x6e, 0xb3,
                                       0xe4, 0x24, 0x34, 0x38};
    cr_expect_arr_eq(b + 96, packed, 12, "scale packing of the test itself");
    float *y = dequant(GGML_TYPE_Q3_K, b, 256);
    for (int e = 0; e < 256; e++) {
        int low = (b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        int hbit = (b[e % 32] >> (e / 32)) & 1;
        float want = 0.25f * (float)sc[e / 16] * (float)(low - (hbit ? 0 : 4));
        cr_expect_eq(y[e], want, "e %d: %g want %g", e, (double)y[e], (double)want);
    }
    free(y);
}

// Q4_K / Q5_K share the 12-byte scale/min packing. Codes chosen to hit every
// bit: scales {1,2,3,63,17,32,48,5}, mins {0,1,63,7,16,33,2,60}; packed by hand:
//   bytes 0..3  = sc[j] | (sc[j+4] >> 4) << 6  = 0x41 0x82 0xc3 0x3f
//   bytes 4..7  = mn[j] | (mn[j+4] >> 4) << 6  = 0x40 0x81 0x3f 0xc7
//   bytes 8..11 = (sc[j+4] & 15) | (mn[j+4] & 15) << 4 = 0x01 0x10 0x20 0xc5
static const int k_sc[8] = {1, 2, 3, 63, 17, 32, 48, 5};
static const int k_mn[8] = {0, 1, 63, 7, 16, 33, 2, 60};
static const uint8_t k_packed[12] = {0x41, 0x82, 0xc3, 0x3f, 0x40, 0x81, 0x3f, 0xc7,
                                     0x01, 0x10, 0x20, 0xc5};

Test(dequant, q4_k_hand) {
    uint8_t b[144];
    put16(b, 0x3000);     // d = 0.125
    put16(b + 2, 0x2c00); // dmin = 0.0625
    memcpy(b + 4, k_packed, 12);
    for (int k = 0; k < 128; k++)
        b[16 + k] = (uint8_t)(k * 151 + 7);
    float *y = dequant(GGML_TYPE_Q4_K, b, 256);
    // element 0: qs[0] = 7, low nibble 7; group 0: 0.125 * 1 * 7 - 0 = 0.875
    cr_expect_eq(y[0], 0.875f);
    // element 100: chunk 1, high nibble of qs[32 + 4] = (36*151+7) & 255 = 5443 & 255 = 67 = 0x43 -> 4;
    // group 3: 0.125 * 63 * 4 - 0.0625 * 7 = 31.5 - 0.4375
    cr_expect_eq(y[100], 31.0625f);
    for (int e = 0; e < 256; e++) {
        int c = e / 64, r = e % 64, g = e / 32;
        int q = r < 32 ? b[16 + 32 * c + r] & 15 : b[16 + 32 * c + r - 32] >> 4;
        float want = 0.125f * (float)k_sc[g] * (float)q - 0.0625f * (float)k_mn[g];
        cr_expect_eq(y[e], want, "e %d", e);
    }
    free(y);
}

Test(dequant, q5_k_hand) {
    uint8_t b[176];
    put16(b, 0x3800);     // d = 0.5
    put16(b + 2, 0x3c00); // dmin = 1
    memcpy(b + 4, k_packed, 12);
    for (int k = 0; k < 32; k++)
        b[16 + k] = (uint8_t)(k * 97 + 1); // qh
    for (int k = 0; k < 128; k++)
        b[48 + k] = (uint8_t)(k * 151 + 7);
    float *y = dequant(GGML_TYPE_Q5_K, b, 256);
    // element 0: low nibble 7, qh[0] = 1 bit 0 set -> 23; 0.5 * 1 * 23 - 0 = 11.5
    cr_expect_eq(y[0], 11.5f);
    for (int e = 0; e < 256; e++) {
        int c = e / 64, r = e % 64, g = e / 32;
        int low = r < 32 ? b[48 + 32 * c + r] & 15 : b[48 + 32 * c + r - 32] >> 4;
        int hbit = (b[16 + r % 32] >> g) & 1; // group g uses qh bit g
        float want = 0.5f * (float)k_sc[g] * (float)(low | hbit << 4) - 1.0f * (float)k_mn[g];
        cr_expect_eq(y[e], want, "e %d", e);
    }
    free(y);
}

// Q6_K: element e = 128h + 32s + l: low 4 bits in ql[64h + l + 32 * (s & 1)]
// (high nibble when s >= 2), top 2 bits at bit 2s of qh[32h + l], group e / 16.
Test(dequant, q6_k_hand) {
    uint8_t b[210];
    for (int k = 0; k < 128; k++)
        b[k] = (uint8_t)(k * 45 + 9);
    for (int k = 0; k < 64; k++)
        b[128 + k] = (uint8_t)(k * 201 + 77);
    static const int8_t sc[16] = {-128, 127, -1, 1, 0, 64, -64, 33, -33, 5, 7, 100, -100, 2, -2, 90};
    memcpy(b + 192, sc, 16);
    put16(b + 208, 0x2400); // d = 2^-6
    float *y = dequant(GGML_TYPE_Q6_K, b, 256);
    // element 0: ql[0] = 9 low nibble 9, qh[0] = 77 = 0b01001101 bits 0..1 = 1
    // -> (9 | 16) - 32 = -7; group 0: 2^-6 * -128 * -7 = 14
    cr_expect_eq(y[0], 14.0f);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, s = (e % 128) / 32, l = e % 32;
        int low = (b[64 * h + l + 32 * (s & 1)] >> (4 * (s / 2))) & 15;
        int high = (b[128 + 32 * h + l] >> (2 * s)) & 3;
        float want = 0x1p-6f * (float)sc[e / 16] * (float)((low | high << 4) - 32);
        cr_expect_eq(y[e], want, "e %d", e);
    }
    free(y);
}

// ---------------------------------------------------------------------------
// legacy quantizers by hand

Test(quantize, q4_0_and_q8_0_hand) {
    // x[j] = (j % 16 - 8) / 2: the first largest magnitude is x[0] = -4, so
    // d = -4 / -8 = 0.5, 1/d = 2, and x * 2 + 8.5 = j % 16 + 0.5 truncates to
    // j % 16: every byte is j | j << 4.
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j % 16 - 8) * 0.5f;
    uint8_t b[34];
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q4_0, x, b, 32, NULL), 0);
    cr_expect_eq(b[0] | b[1] << 8, 0x3800);
    for (int j = 0; j < 16; j++)
        cr_expect_eq(b[2 + j], (uint8_t)(j | j << 4), "byte %d", j);

    // Q8_0 of x[j] = j - 16: amax 16, d = 16/127 = 0.12598425 -> f16 0x3008
    // (0.125 + 8 * 2^-13); 1/d = 7.9375 exactly, so x[j] * 7.9375 is exact:
    // j = 0 -> -127, j = 31 -> 119.0625 -> 119, j = 12 -> -31.75 -> -32,
    // j = 14 -> -15.875 -> -16, and j = 24 -> 63.5: a tie, roundf -> 64.
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16);
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q8_0, x, b, 32, NULL), 0);
    cr_expect_eq(b[0] | b[1] << 8, 0x3008);
    cr_expect_eq((int8_t)b[2 + 0], -127);
    cr_expect_eq((int8_t)b[2 + 31], 119);
    cr_expect_eq((int8_t)b[2 + 12], -32);
    cr_expect_eq((int8_t)b[2 + 14], -16);
    cr_expect_eq((int8_t)b[2 + 24], 64, "ties round away from zero");
    cr_expect_eq((int8_t)b[2 + 8], -64, "-63.5 rounds away from zero");
    cr_expect_eq((int8_t)b[2 + 16], 0);

    // All-zero block: d = 0 / -8 = -0 (f16 0x8000, as ggml stores it), every
    // quant at the zero point.
    memset(x, 0, sizeof x);
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q4_0, x, b, 32, NULL), 0);
    cr_expect_eq(b[0] | b[1] << 8, 0x8000);
    for (int j = 0; j < 16; j++)
        cr_expect_eq(b[2 + j], 0x88);
}

// ---------------------------------------------------------------------------
// round trips on seeded random data

#define RT_N (256 * 64)

// Error bound for element i of a block: x points at the block's inputs (the
// whole row for plain types, where i is the row index), blk at the block's
// stored bytes (to read the f16 scales actually used).
typedef float (*bound_fn)(const float *x, const uint8_t *blk, int64_t i);

static float blk_f16(const uint8_t *p) { return quant_fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static float absmax(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++)
        a = fmaxf(a, fabsf(x[i]));
    return a;
}

// A half rounded to nearest is off by at most half an ulp: 2^-11 of the value
// for normals, and half the subnormal spacing, 2^-25, below 2^-14 (the
// smallest weights here, 2^-6 sigma, reach that range).
static float bound_f16(const float *x, const uint8_t *b, int64_t i) {
    return fmaxf(fabsf(x[i]) * 0x1p-11f, 0x1p-25f);
}
// bf16 keeps 8 significant bits: half an ulp is 2^-8 of the value.
static float bound_bf16(const float *x, const uint8_t *b, int64_t i) { return fabsf(x[i]) * 0x1p-8f; }
// Q8_0: rounding to the nearest multiple of d = amax/127 costs d/2; storing d
// as f16 moves it by up to 2^-11 d, i.e. 127 * 2^-11 d at the largest code.
// 1e-6 relative slack for the float arithmetic of x / d.
static float bound_q8_0(const float *x, const uint8_t *b, int64_t i) {
    float d = absmax(x, 32) / 127.0f;
    return d * (0.5f + 127.0f / 2048.0f) * 1.0001f;
}
// Q4_0 / Q5_0: the extreme maps to -8 (-16) steps; the opposite extreme may
// need +8 (+16) steps but only 7 (15) exist, so clamping costs one full step
// d = amax/8 (amax/16). Elsewhere the cost is d/2. f16 rounding of d: at most
// 8 (16) codes * 2^-11 d.
static float bound_q4_0(const float *x, const uint8_t *b, int64_t i) {
    return absmax(x, 32) / 8.0f * (1.0f + 8.0f / 2048.0f) * 1.0001f;
}
static float bound_q5_0(const float *x, const uint8_t *b, int64_t i) {
    return absmax(x, 32) / 16.0f * (1.0f + 16.0f / 2048.0f) * 1.0001f;
}
// Q4_1 / Q5_1: nearest of 16 (32) levels spanning [min, max]: d/2 with
// d = (max - min)/15 (/31); f16 rounding of d costs 15 (31) * 2^-11 d and of
// the min 2^-11 |min|.
static float bound_q41(const float *x, int nmax) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    float d = (mx - mn) / (float)nmax;
    return (d * (0.5f + (float)nmax / 2048.0f) + fabsf(mn) / 2048.0f) * 1.0001f;
}
static float bound_q4_1(const float *x, const uint8_t *b, int64_t i) { return bound_q41(x, 15); }
static float bound_q5_1(const float *x, const uint8_t *b, int64_t i) { return bound_q41(x, 31); }
// Q4_K / Q5_K, per group of 32 with range r = max - min(0, min) and step
// s = r / nmax: the least-squares fit keeps its step within r/(nmax +- 1) of
// the range fit, so rounding plus clipping one extreme costs at most ~one
// step; rounding the group scale to a 6-bit multiple of d (d = largest scale/63)
// moves the top level by nmax * d/2, and the chosen code may be a neighbour
// (+-1), so allow nmax * 1.5 d; the min is a 6-bit multiple of dmin: 1.5 dmin.
// Q2_K likewise per group of 16 with 4-bit codes of d, dmin (d at byte 80).
static float bound_kasym(const float *x, int gs, int nmax, float d, float dmin) {
    float mn = 0.0f, mx = x[0];
    for (int j = 0; j < gs; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    float s = (mx - mn) / (float)nmax;
    return s + (float)nmax * 1.5f * d + 1.5f * dmin;
}
static float bound_q2_k(const float *x, const uint8_t *b, int64_t i) {
    return bound_kasym(x + 16 * (i / 16), 16, 3, blk_f16(b + 80), blk_f16(b + 82));
}
static float bound_q4_k(const float *x, const uint8_t *b, int64_t i) {
    return bound_kasym(x + 32 * (i / 32), 32, 15, blk_f16(b), blk_f16(b + 2));
}
static float bound_q5_k(const float *x, const uint8_t *b, int64_t i) {
    return bound_kasym(x + 32 * (i / 32), 32, 31, blk_f16(b), blk_f16(b + 2));
}
// Q6_K, per group of 16: step s = amax / 32 at best, one step for rounding and
// clipping (as above); the 8-bit group scale is a multiple of |d| (d = largest
// scale / -128), so the largest code (32) moves by up to 32 * 1.5 |d|.
static float bound_q6_k(const float *x, const uint8_t *b, int64_t i) {
    const float *g = x + 16 * (i / 16);
    return absmax(g, 16) / 31.0f + 32.0f * 1.5f * fabsf(blk_f16(b + 208));
}
// Q3_K, the same with levels [-4, 3] (step amax / 3 at worst) and 6-bit group
// scales (d = largest / -32, at byte 108): the largest code (4) moves by up
// to 4 * 1.5 |d|.
static float bound_q3_k(const float *x, const uint8_t *b, int64_t i) {
    const float *g = x + 16 * (i / 16);
    return absmax(g, 16) / 3.0f + 4.0f * 1.5f * fabsf(blk_f16(b + 108));
}

// IQ4_NL / IQ4_XS: x ~ dl * level with 16 fixed levels (llama.cpp's
// kvalues_iq4nl: -127 .. 113, gaps of at most 24), dl the stored scale of the
// element's group of 32 (IQ4_NL: its f16 d; IQ4_XS: the f16 super-scale at
// byte 0 times the group's 6-bit code). Whatever scale the search picks, each
// element is on its nearest level of that scale, so its error is at most
// half the widest gap, 12 |dl|, or, past the outermost levels, amax - 113 |dl|
// (amax the group's largest |x|). Bound: the larger of the two (amax when
// dl is 0), with float slack.
static float bound_iq4(const float *g, float dl) {
    const float amax = absmax(g, 32), a = fabsf(dl);
    return fmaxf(12.0f * a, amax - 113.0f * a) * 1.0001f + 1e-30f;
}
static float bound_iq4_nl(const float *x, const uint8_t *b, int64_t i) {
    return bound_iq4(x, blk_f16(b));
}
static float bound_iq4_xs(const float *x, const uint8_t *b, int64_t i) {
    const int g = (int)(i / 32);
    return bound_iq4(x + 32 * g, blk_f16(b) * (float)quant_iq4_xs_scale(b, g));
}

static void round_trip(enum ggml_type t, bound_fn bound, float want_rmse) {
    const struct ggml_type_info *ti = info(t);
    float *x = malloc(RT_N * sizeof *x);
    uint8_t *q = malloc(ggml_row_bytes(t, RT_N));
    cr_assert(x && q);
    rng_seed(1234 + t);
    // Gaussian weights with a per-256 scale between 2^-6 and 2^2 (real layers
    // differ by orders of magnitude) and a few outliers at 8 sigma.
    for (int i = 0; i < RT_N; i++) {
        float scale = ldexpf(1.0f, (i / 256) % 9 - 6);
        x[i] = rng_gauss() * scale;
        if (rng_next() % 97 == 0)
            x[i] *= 8.0f;
    }
    struct verr err = {0};
    cr_assert_eq(quant_quantize_row(t, x, q, RT_N, &err), 0, "%s: %s", ti->name, err.msg);
    float *y = dequant(t, q, RT_N);
    double worst_ratio = 0.0, worst_abs = 0.0, se = 0.0, sx = 0.0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < RT_N; i++) {
        int64_t blk = i / ti->block_size;
        const float *xb = x + blk * ti->block_size;
        float bd = bound(ti->block_size == 1 ? x : xb, q + blk * ti->block_bytes,
                         ti->block_size == 1 ? i : i % ti->block_size);
        double e = fabs((double)y[i] - (double)x[i]);
        se += e * e;
        sx += (double)x[i] * x[i];
        double r = bd > 0 ? e / bd : (e > 0 ? INFINITY : 0.0);
        if (r > worst_ratio) {
            worst_ratio = r;
            worst_i = i;
        }
        if (e > worst_abs)
            worst_abs = e;
    }
    double rel_rmse = sqrt(se / sx);
    cr_log_info("%-5s worst |err| %.3g, worst err/bound %.3f (element %lld), rmse/rms %.4g",
                ti->name, worst_abs, worst_ratio, (long long)worst_i, rel_rmse);
    cr_expect_leq(worst_ratio, 1.0, "%s: element %lld: x %g y %g exceeds its bound", ti->name,
                  (long long)worst_i, (double)x[worst_i], (double)y[worst_i]);

    cr_expect_leq(rel_rmse, want_rmse, "%s: relative rmse %g", ti->name, rel_rmse);
    free(x);
    free(q);
    free(y);
}

// Relative RMSE limits. F16/BF16: every relative error is below half an ulp
// (2^-11, 2^-8), so is their RMS. The others are what llama.cpp's own
// reference quantizers reach on exactly this data (measured with the ggml
// build described at the golden data, same PRNG and Gaussian transform): the
// legacy types are bit-exact with them, so they must land on the same value
// (1% slack for a libm whose log/cos differ in the last bit); the K-quants use
// our own search, which must be at least as good as llama.cpp's
// quantize_row_q*_K_ref (ggml minimises an error weighted by |x| + rms, we
// minimise the plain squared error, so ours should come out a little lower).
// Q2_K and Q3_K were measured later with the libggml-base of llama.cpp
// 0c1e570 (a CPU build; the same program gave Q6_K's 0.024891 again):
// 0.31115 and 0.183699; ours reach 0.2682 and 0.1747. IQ4_NL and IQ4_XS
// likewise, against llama.cpp's quantize_iq4_nl / quantize_iq4_xs without an
// importance matrix: 0.108249 and 0.112745; ours reach 0.1071 and 0.1117
// (both weight each element's error by x^2 while searching).
Test(round_trip, f16) { round_trip(GGML_TYPE_F16, bound_f16, 0x1p-11); }
Test(round_trip, bf16) { round_trip(GGML_TYPE_BF16, bound_bf16, 0x1p-8); }
Test(round_trip, q8_0) { round_trip(GGML_TYPE_Q8_0, bound_q8_0, 0.0083431 * 1.01); }
Test(round_trip, q4_0) { round_trip(GGML_TYPE_Q4_0, bound_q4_0, 0.14813 * 1.01); }
Test(round_trip, q4_1) { round_trip(GGML_TYPE_Q4_1, bound_q4_1, 0.098425 * 1.01); }
Test(round_trip, q5_0) { round_trip(GGML_TYPE_Q5_0, bound_q5_0, 0.065354 * 1.01); }
Test(round_trip, q5_1) { round_trip(GGML_TYPE_Q5_1, bound_q5_1, 0.047996 * 1.01); }
Test(round_trip, q2_k) { round_trip(GGML_TYPE_Q2_K, bound_q2_k, 0.31115); }
Test(round_trip, q3_k) { round_trip(GGML_TYPE_Q3_K, bound_q3_k, 0.183699); }
Test(round_trip, q4_k) { round_trip(GGML_TYPE_Q4_K, bound_q4_k, 0.091362); }
Test(round_trip, q5_k) { round_trip(GGML_TYPE_Q5_K, bound_q5_k, 0.043995); }
Test(round_trip, q6_k) { round_trip(GGML_TYPE_Q6_K, bound_q6_k, 0.024891); }
Test(round_trip, iq4_nl) { round_trip(GGML_TYPE_IQ4_NL, bound_iq4_nl, 0.108249); }
Test(round_trip, iq4_xs) { round_trip(GGML_TYPE_IQ4_XS, bound_iq4_xs, 0.112745); }

// Edge inputs for the K-quant and IQ4 searches: constant groups, all-negative groups,
// a single spike, groups many orders of magnitude apart inside one
// super-block, and zeros. Each must stay within the error bound of its type.
Test(round_trip, k_quant_edge_blocks) {
    static const enum ggml_type types[] = {GGML_TYPE_Q2_K,  GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                                           GGML_TYPE_Q5_K,  GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                           GGML_TYPE_IQ4_XS};
    static const bound_fn bounds[] = {bound_q2_k, bound_q3_k,   bound_q4_k,  bound_q5_k,
                                      bound_q6_k, bound_iq4_nl, bound_iq4_xs};
    float x[256 * 6];
    for (int i = 0; i < 256; i++) {
        x[i] = 0.0f;                                   // all zero
        x[256 + i] = 0.75f;                            // constant positive
        x[512 + i] = -3.0f - (float)(i % 32) * 0.01f;  // all negative
        x[768 + i] = i == 77 ? 100.0f : 0.001f;        // one spike
        x[1024 + i] = ldexpf((float)(i % 7) - 3.0f, (i / 32) * 3 - 20); // 2^-20 .. 2^1 groups
        x[1280 + i] = (i % 2 ? 1.0f : -1.0f) * (float)(i % 5);
    }
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct ggml_type_info *ti = info(types[t]);
        uint8_t q[6 * 210];
        struct verr err = {0};
        cr_assert_eq(quant_quantize_row(types[t], x, q, 256 * 6, &err), 0, "%s", err.msg);
        float *y = dequant(types[t], q, 256 * 6);
        double worst = 0.0;
        for (int i = 0; i < 256 * 6; i++) {
            const int bs = (int)ti->block_size;
            float bd = bounds[t](x + bs * (i / bs), q + (i / bs) * ti->block_bytes, i % bs);
            double e = fabs((double)y[i] - x[i]);
            cr_expect(e <= bd, "%s element %d: x %g y %g bound %g", ti->name, i, (double)x[i],
                      (double)y[i], (double)bd);
            worst = fmax(worst, e);
        }
        for (int i = 0; i < 256; i++)
            cr_expect_eq(y[i], 0.0f, "%s: zeros stay zero", ti->name);
        cr_log_info("%-5s edge blocks: worst |err| %.3g", ti->name, worst);
        free(y);
    }
}

// ---------------------------------------------------------------------------
// MXFP4: hand-built blocks against the OCP definition, golden data from ggml,
// and the quantizer's rules

// The OCP MX E2M1 values of the 16 codes (sign bit 3; 0.5 steps below 2,
// then 3, 4, 6), not ggml's doubled integer table.
static const double e2m1_value[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// One block per listed E8M0 byte, holding every code in both nibbles (element
// j: code j; element j + 16: code 15 - j). Expected: e2m1 * 2^(e - 127) in
// double, rounded to float (overflow to inf, as ggml's float product does;
// e = 255 is E8M0's NaN code, which ggml decodes as 2^127 all the same).
Test(dequant, mxfp4_every_code_extreme_scales) {
    static const int es[] = {0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 252, 253, 254, 255};
    const int nb = (int)(sizeof es / sizeof es[0]);
    uint8_t *b = calloc((size_t)nb, 17);
    cr_assert_not_null(b);
    for (int k = 0; k < nb; k++) {
        b[17 * k] = (uint8_t)es[k];
        for (int j = 0; j < 16; j++)
            b[17 * k + 1 + j] = (uint8_t)(j | ((15 - j) << 4));
    }
    float *y = dequant(GGML_TYPE_MXFP4, b, 32 * nb);
    int n_inf = 0;
    for (int k = 0; k < nb; k++)
        for (int j = 0; j < 32; j++) {
            const int code = j < 16 ? j : 31 - j;
            const float want = (float)ldexp(e2m1_value[code], es[k] - 127);
            const float got = y[32 * k + j];
            n_inf += isinf(want) ? 1 : 0;
            // -0 decodes to +0 in ggml (level 0 times the scale)
            cr_expect(fbits(got) == fbits(want) || (want == 0.0f && fbits(got) == 0),
                      "e %d code %d: %a, want %a", es[k], code, (double)got, (double)want);
        }
    cr_expect_gt(n_inf, 0, "the largest scales overflow some codes to inf");
    cr_expect_eq(fbits(y[1]), fbits(0x1p-128f), "e 0: 0.5 * 2^-127, a float subnormal");
    free(y);
    free(b);
}

// Decoded by ggml's dequantize_row_mxfp4 (libggml-base of llama.cpp 0c1e570,
// the build of the IQ4_XS row above): 256 blocks, block e with E8M0 byte e
// and the codes of the test above, hashed as gold_dequant; and 16 blocks of
// random bytes (gold_blocks' generator, seed 200, no field replaced).
Test(golden, mxfp4_dequantize_bit_exact) {
    uint8_t b[256 * 17];
    for (int e = 0; e < 256; e++) {
        b[17 * e] = (uint8_t)e;
        for (int j = 0; j < 16; j++)
            b[17 * e + 1 + j] = (uint8_t)(j | ((15 - j) << 4));
    }
    float *y = dequant(GGML_TYPE_MXFP4, b, 256 * 32);
    uint64_t h = fnv_init();
    for (int i = 0; i < 256 * 32; i++)
        h = fnv_u32(h, fbits(y[i]));
    cr_expect_eq(h, 0xd88b58dbc6f418a5ULL, "every E8M0 byte and code: differs from ggml");
    free(y);
    rng_seed(200);
    for (int i = 0; i < 16 * 17; i++)
        b[i] = (uint8_t)(rng_next() >> 24);
    y = dequant(GGML_TYPE_MXFP4, b, 16 * 32);
    h = fnv_init();
    for (int i = 0; i < 16 * 32; i++)
        h = fnv_u32(h, fbits(y[i]));
    cr_expect_eq(fbits(y[0]), 0x0a800000u, "y[0] = %a", (double)y[0]);
    cr_expect_eq(fbits(y[17]), 0x0a400000u, "y[17] = %a", (double)y[17]);
    cr_expect_eq(fbits(y[511]), 0xeb400000u, "y[511] = %a", (double)y[511]);
    cr_expect_eq(h, 0x343789c670d12b2bULL, "random blocks: differ from ggml");
    free(y);
}

// The q8 dot (gguf/quant_q8.h) against ggml's ggml_vec_dot_mxfp4_q8_0 (the
// generic C of ggml-cpu/quants.c, same llama.cpp tree, with libggml-base's
// quantize_row_q8_0_ref for the activations): one block per dot, so the sum
// is a single term, (dx * d) * sumi, and must match to the bit. Weights: the
// MXFP4 blocks of gold_random; activations: gold_ties rotated by 7 blocks,
// element i times 1 + i % 3.
Test(golden, mxfp4_q8_dot_bit_exact) {
    static float xr[GOLD_N], xt[GOLD_N], xa[GOLD_N];
    static uint8_t w[GOLD_N / 32 * 17], xq[GOLD_N / 32 * QUANT_Q8_1_BLOCK_BYTES];
    gold_random(xr);
    gold_ties(xt);
    for (int i = 0; i < GOLD_N; i++)
        xa[i] = xt[(i + 7 * 32) % GOLD_N] * (1.0f + (float)(i % 3));
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, xr, w, GOLD_N, NULL), 0);
    cr_assert_eq(quant_q8_1_row(xa, GOLD_N, xq, NULL), 0);
    uint64_t h = fnv_init();
    for (int b = 0; b < GOLD_N / 32; b++) {
        float s = NAN;
        cr_assert_eq(quant_dot_q8_1(GGML_TYPE_MXFP4, w + 17 * b, xq + QUANT_Q8_1_BLOCK_BYTES * b,
                                    32, &s, NULL),
                     0);
        if (b == 0)
            cr_expect_eq(fbits(s), 0x3d94e780u, "block 0: %a, ggml 0x1.29cfp-4", (double)s);
        h = fnv_u32(h, fbits(s));
    }
    cr_expect_eq(h, 0x0a4a419b15a66d37ULL, "64 one-block dots differ from ggml's");
}

// MXFP4 only: block b of uniform values scaled by 2^(4b - 123), b = 0..62
// (E8M0 bytes 1 .. 249), block 63 up to FLT_MAX (byte 252, the largest a
// finite input gives).
static void gold_wide(float *x) {
    rng_seed(3);
    for (int i = 0; i < GOLD_N; i++) {
        int b = i / 32;
        x[i] = b < 63 ? rng_unit() * ldexpf(1.0f, 4 * b - 123) : rng_unit() * 0x1.fffffep127f;
    }
}

// ggml's quantize_row_mxfp4_ref (same build) on the golden inputs.
Test(golden, mxfp4_quantizer_bit_exact) {
    static const uint8_t block0[3][17] = {
        {0x79, 0x9e, 0x10, 0x22, 0xca, 0x54, 0x60, 0x11, 0x2d, 0xa5, 0x4c, 0x14, 0xe1, 0x64, 0x5b,
         0xbc, 0x24},
        {0x7e, 0x2e, 0xe9, 0x95, 0x5c, 0xc3, 0x3d, 0xd0, 0x05, 0x5b, 0xb4, 0x4d, 0xd1, 0x16, 0x6a,
         0xa4, 0x4c},
        {0x01, 0xef, 0x6d, 0xa6, 0x6c, 0xe4, 0xac, 0x70, 0x09, 0xe2, 0x95, 0xb7, 0xd7, 0x6e, 0x96,
         0xe7, 0x77},
    };
    static const uint64_t hash[3] = {0x4a8f55de6f1b5cfeULL, 0x0e99347c3dee8e7cULL,
                                     0x5d6aeac589ae75bdULL};
    static const char *const what[3] = {"random", "ties", "wide"};
    static float x[GOLD_N];
    static uint8_t q[GOLD_N / 32 * 17];
    for (int c = 0; c < 3; c++) {
        if (c == 0)
            gold_random(x);
        else if (c == 1)
            gold_ties(x);
        else
            gold_wide(x);
        struct verr err = {0};
        cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, q, GOLD_N, &err), 0, "%s", err.msg);
        for (int k = 0; k < 17; k++)
            cr_expect_eq(q[k], block0[c][k], "%s block 0 byte %d: 0x%02x, ggml 0x%02x", what[c], k,
                         q[k], block0[c][k]);
        cr_expect_eq(fnv_bytes(fnv_init(), q, sizeof q), hash[c],
                     "%s: 64 blocks differ from ggml's quantize_row_mxfp4_ref", what[c]);
        if (c == 2)
            cr_expect_eq(q[63 * 17], 252, "FLT_MAX's block: E8M0 byte %d", q[63 * 17]);
    }
}

// Quantizes the block x into b and checks its E8M0 byte and the codes of
// elements 0..7.
static void expect_mxfp4_codes(const float *x, uint8_t *b, int e, const int want[8]) {
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, b, 32, NULL), 0);
    cr_expect_eq(b[0], e, "E8M0 byte %d, want %d", b[0], e);
    for (int j = 0; j < 8; j++)
        cr_expect_eq(b[1 + j] & 0x0f, want[j], "element %d (%g): code %d, want %d", j,
                     (double)x[j], b[1 + j] & 0x0f, want[j]);
}

// The quantizer's rules on hand-made blocks: the scale byte, the nearest
// level, ties to the lower code (the smaller magnitude), zero and tiny blocks.
Test(quantize, mxfp4_rules) {
    float x[32];
    uint8_t b[17];
    // amax 7: e = floor(log2 7) - 2 + 127 = 127, so the values are level *
    // 2^-1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
    memset(x, 0, sizeof x);
    x[0] = 6.0f;   // code 7
    x[1] = 0.25f;  // tie of 0 and 0.5: code 0
    x[2] = 0.75f;  // tie of 0.5 and 1: code 1
    x[3] = -0.75f; // tie of -0.5 and -1: code 9
    x[4] = 5.0f;   // tie of 4 and 6: code 6
    x[5] = 2.5f;   // tie of 2 and 3: code 4
    x[6] = -7.0f;  // beyond -6: code 15
    x[7] = -0.0f;  // code 0, not 8
    x[16] = -3.4f; // nearest -3: code 13
    static const int want_a[8] = {7, 0, 1, 9, 6, 4, 15, 0};
    expect_mxfp4_codes(x, b, 127, want_a);
    cr_expect_eq(b[1] >> 4, 13, "element 16 (-3.4): code %d, want 13", b[1] >> 4);
    // amax 10: e = 128, the values are the levels 0, 1, 2, 3, 4, 6, 8, 12.
    memset(x, 0, sizeof x);
    x[0] = 8.0f;   // code 6
    x[1] = 0.5f;   // tie of 0 and 1: code 0
    x[2] = 2.5f;   // tie of 2 and 3: code 2
    x[3] = 5.0f;   // tie of 4 and 6: code 4
    x[4] = 7.0f;   // tie of 6 and 8: code 5
    x[5] = -2.5f;  // tie of -2 and -3: code 10
    x[6] = -10.0f; // tie of -8 and -12: code 14
    x[7] = 1e-30f; // code 0
    static const int want_b[8] = {6, 0, 2, 4, 5, 10, 14, 0};
    expect_mxfp4_codes(x, b, 128, want_b);
    // All zero: byte 0 and every code 0.
    memset(x, 0, sizeof x);
    memset(b, 0xaa, sizeof b);
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, b, 32, NULL), 0);
    for (int k = 0; k < 17; k++)
        cr_expect_eq(b[k], 0, "zero block byte %d: 0x%02x", k, b[k]);
    // amax 2^-126: ggml's byte would be -1 (undefined in C); vela stores 0,
    // whose values (multiples of 2^-128 up to 1.5 * 2^-125) hold the block.
    x[0] = 0x1p-126f;  // 4 * 2^-128: code 4
    x[1] = -0x1p-149f; // nearest 0: code 0
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, b, 32, NULL), 0);
    cr_expect_eq(b[0], 0, "amax 2^-126: E8M0 byte %d", b[0]);
    cr_expect_eq(b[1] & 0x0f, 4);
    cr_expect_eq(b[2] & 0x0f, 0);
    x[0] = 0x1p-125f; // the smallest amax ggml defines, byte 0; 8 * 2^-128: code 6
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, b, 32, NULL), 0);
    cr_expect_eq(b[0], 0);
    cr_expect_eq(b[1] & 0x0f, 6);
    // Non-finite input is refused, naming the element.
    x[9] = INFINITY;
    struct verr err = {0};
    cr_expect_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, b, 32, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "element 9") != NULL, "%s", err.msg);
}

// Every element is on a nearest level of its block's scale (checked against
// all 16 in double), and the scale byte is ggml's: amax in [4, 8) * 2^(e-127).
Test(round_trip, mxfp4) {
    float *x = malloc(RT_N * sizeof *x);
    uint8_t *q = malloc(ggml_row_bytes(GGML_TYPE_MXFP4, RT_N));
    cr_assert(x && q);
    rng_seed(1234 + GGML_TYPE_MXFP4);
    for (int i = 0; i < RT_N; i++) {
        x[i] = rng_gauss() * ldexpf(1.0f, (i / 256) % 9 - 6);
        if (rng_next() % 97 == 0)
            x[i] *= 8.0f;
    }
    cr_assert_eq(quant_quantize_row(GGML_TYPE_MXFP4, x, q, RT_N, NULL), 0);
    float *y = dequant(GGML_TYPE_MXFP4, q, RT_N);
    double se = 0.0, sx = 0.0;
    for (int blk = 0; blk < RT_N / 32; blk++) {
        const uint8_t e = q[17 * blk];
        const double scale = ldexp(1.0, e - 127);
        const double amax = absmax(x + 32 * blk, 32);
        cr_expect(amax >= 4.0 * scale && amax < 8.0 * scale, "block %d: amax %g, e %d", blk, amax,
                  e);
        for (int j = 0; j < 32; j++) {
            const int i = 32 * blk + j;
            const double err = fabs((double)y[i] - x[i]);
            double best = INFINITY;
            for (int c = 0; c < 16; c++)
                best = fmin(best, fabs(e2m1_value[c] * scale - x[i]));
            cr_expect_eq(err, best, "element %d: x %g decoded %g is not on a nearest level", i,
                         (double)x[i], (double)y[i]);
            se += err * err;
            sx += (double)x[i] * x[i];
        }
    }
    // ggml's quantize_row_mxfp4_ref + dequantize_row_mxfp4 on these inputs
    // (same PRNG, the build of the golden data): relative rmse 0.148018;
    // 1% slack for a libm whose log/cos differ in the last bit, as above.
    const double rel = sqrt(se / sx);
    cr_log_info("mxfp4 rmse/rms %.6g", rel);
    cr_expect_leq(rel, 0.148018 * 1.01, "relative rmse %g", rel);
    free(x);
    free(q);
    free(y);
}

Test(errors, validate_mxfp4_scale) {
    uint8_t b[3 * 17] = {0};
    struct verr err = {0};
    b[0] = 0;
    b[17] = 254;
    b[34] = 127;
    cr_expect_eq(quant_validate_row(GGML_TYPE_MXFP4, b, 96, &err), 0, "%s", err.msg);
    b[34] = 255;
    cr_expect_eq(quant_validate_row(GGML_TYPE_MXFP4, b, 96, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "block 2") && strstr(err.msg, "255"), "%s", err.msg);
    cr_expect_eq(quant_validate_row(GGML_TYPE_MXFP4, b, 95, &err), VERR_RANGE, "not whole blocks");
}

// ---------------------------------------------------------------------------
// quant_dot_row

static const enum ggml_type all_dequant[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,    GGML_TYPE_BF16,   GGML_TYPE_Q8_0,
    GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,   GGML_TYPE_Q5_1,
    GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,   GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
};

// A random stored row: random bytes with every f16 field (and every F16/BF16
// element) replaced by a finite value of moderate size.
static uint8_t *random_row(enum ggml_type t, int64_t n) {
    const struct ggml_type_info *ti = info(t);
    size_t bytes = ggml_row_bytes(t, n);
    uint8_t *p = malloc(bytes);
    cr_assert_not_null(p);
    if (t == GGML_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            float v = rng_unit() * 4.0f;
            memcpy(p + 4 * i, &v, 4);
        }
        return p;
    }
    if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = rng_unit() * 4.0f;
            put16(p + 2 * i, t == GGML_TYPE_F16 ? quant_f32_to_fp16(v) : quant_f32_to_bf16(v));
        }
        return p;
    }
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)(rng_next() >> 24);
    int off[2] = {0, -1};
    switch (t) {
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        off[1] = 2;
        break;
    case GGML_TYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case GGML_TYPE_Q3_K: off[0] = 108; break;
    case GGML_TYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
    for (int64_t b = 0; b < n / ti->block_size; b++) {
        if (t == GGML_TYPE_MXFP4) { // E8M0 scale byte: 2^-9 .. 2^-5
            p[b * ti->block_bytes] = (uint8_t)(119 + rng_next() % 5);
            continue;
        }
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0)
                put16(p + b * ti->block_bytes + off[k], quant_f32_to_fp16(rng_unit() * 0.05f));
    }
    return p;
}

// Float rounding of a dot of n terms, whatever the order of additions: each
// result is within n * 2^-24 * sum |a_i x_i| of the exact one (the classic
// gamma_n bound), so two orders differ by at most twice that.
Test(dot, matches_dequantize_then_dot) {
    // 4352 = 17 * 256: not a multiple of the dot's 256-element chunk count
    // pattern beyond one, so the last chunk of the 32-blocks is exercised too;
    // 96 = three 32-blocks, shorter than one chunk.
    static const int64_t lens[] = {4352, 96, 256};
    rng_seed(99);
    double worst = 0.0;
    const char *worst_name = "";
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (size_t t = 0; t < sizeof all_dequant / sizeof all_dequant[0]; t++) {
            const enum ggml_type type = all_dequant[t];
            const int64_t n = lens[li];
            if (n % info(type)->block_size)
                continue;
            uint8_t *row = random_row(type, n);
            float *x = malloc((size_t)n * sizeof *x);
            cr_assert_not_null(x);
            for (int64_t i = 0; i < n; i++)
                x[i] = rng_unit();
            float *w = dequant(type, row, n);
            float ref = 0.0f;
            double mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                ref += w[i] * x[i];
                mag += fabs((double)w[i] * x[i]);
            }
            float got = quant_dot_row(type, row, x, n);
            double tol = 2.0 * (double)n * 0x1p-24 * mag;
            double diff = fabs((double)got - ref);
            cr_expect(diff <= tol, "%s n=%lld: dot %.9g, dequantize+dot %.9g (tol %.3g)",
                      ggml_type_name(type), (long long)n, (double)got, (double)ref, tol);
            if (mag > 0 && diff / mag > worst) {
                worst = diff / mag;
                worst_name = ggml_type_name(type);
            }
            free(row);
            free(x);
            free(w);
        }
    }
    cr_log_info("dot: worst |dot - dequantize+dot| / sum|w x| = %.3g (%s)", worst, worst_name);
}

Test(dot, exact_small_cases) {
    // Q8_0 with d = 1 and q = 1..32 against x = 1: 528 exactly.
    uint8_t b[34];
    put16(b, 0x3c00);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(j + 1);
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = 1.0f;
    cr_expect_eq(quant_dot_row(GGML_TYPE_Q8_0, b, x, 32), 528.0f);
    cr_expect_eq(quant_dot_row(GGML_TYPE_Q8_0, b, x, 0), 0.0f, "empty row");
    cr_expect(isnan(quant_dot_row(GGML_TYPE_Q8_0, b, x, 31)), "n not a multiple: NaN");
    cr_expect(isnan(quant_dot_row(GGML_TYPE_IQ2_XXS, b, x, 256)), "unsupported type: NaN");
    cr_expect(isnan(quant_dot_row((enum ggml_type)77, b, x, 32)), "unknown type: NaN");
}

// ---------------------------------------------------------------------------
// capabilities and errors

Test(errors, capabilities) {
    for (size_t t = 0; t < sizeof all_dequant / sizeof all_dequant[0]; t++)
        cr_expect(quant_can_dequantize(all_dequant[t]), "%s", ggml_type_name(all_dequant[t]));
    static const enum ggml_type enc[] = {
        GGML_TYPE_F32,  GGML_TYPE_F16,    GGML_TYPE_BF16,   GGML_TYPE_Q8_0,
        GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,   GGML_TYPE_Q5_1,
        GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,   GGML_TYPE_Q5_K,
        GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
    for (size_t t = 0; t < sizeof enc / sizeof enc[0]; t++)
        cr_expect(quant_can_quantize(enc[t]), "%s", ggml_type_name(enc[t]));
    cr_expect_not(quant_can_quantize(GGML_TYPE_IQ3_S));
    cr_expect_not(quant_can_dequantize(GGML_TYPE_Q8_1));
    cr_expect_not(quant_can_dequantize(GGML_TYPE_IQ2_XXS));
    cr_expect_not(quant_can_dequantize((enum ggml_type)4));
    cr_expect_not(quant_can_dequantize((enum ggml_type)-1));
    cr_expect_not(quant_can_quantize(GGML_TYPE_COUNT));
}

Test(errors, bad_arguments) {
    float x[64] = {0}, y[64];
    uint8_t b[256] = {0};
    struct verr err = {0};
    cr_expect_eq(quant_dequantize_row(GGML_TYPE_IQ2_XXS, b, y, 256, &err), VERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "iq2_xxs") != NULL, "message names the type: %s", err.msg);
    cr_expect_eq(quant_quantize_row(GGML_TYPE_IQ3_S, x, b, 256, &err), VERR_UNSUPPORTED);
    cr_expect_eq(quant_quantize_row((enum ggml_type)99, x, b, 32, &err), VERR_UNSUPPORTED);
    cr_expect_eq(quant_dequantize_row(GGML_TYPE_Q4_0, b, y, 33, &err), VERR_RANGE);
    cr_expect(strstr(err.msg, "33") != NULL, "%s", err.msg);
    cr_expect_eq(quant_dequantize_row(GGML_TYPE_Q4_0, b, y, -32, &err), VERR_RANGE);
    cr_expect_eq(quant_quantize_row(GGML_TYPE_Q4_K, x, b, 64, &err), VERR_RANGE);
    cr_expect_eq(quant_dequantize_row(GGML_TYPE_Q4_0, NULL, y, 32, &err), VERR_RANGE);
    cr_expect_eq(quant_quantize_row(GGML_TYPE_Q4_0, x, NULL, 32, NULL), VERR_RANGE, "NULL err is fine");
    cr_expect_eq(quant_dequantize_row(GGML_TYPE_Q4_0, NULL, NULL, 0, &err), 0, "empty row");
}

Test(errors, unrepresentable_input) {
    float x[256];
    uint8_t b[256];
    struct verr err = {0};
    static const enum ggml_type q[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                                       GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (size_t t = 0; t < sizeof q / sizeof q[0]; t++) {
        const int64_t n = info(q[t])->block_size;
        for (int i = 0; i < 256; i++)
            x[i] = 0.5f;
        x[5] = NAN;
        cr_expect_eq(quant_quantize_row(q[t], x, b, n, &err), VERR_RANGE, "%s NaN", ggml_type_name(q[t]));
        cr_expect(strstr(err.msg, "element 5") != NULL, "%s", err.msg);
        x[5] = -INFINITY;
        cr_expect_eq(quant_quantize_row(q[t], x, b, n, &err), VERR_RANGE, "%s inf", ggml_type_name(q[t]));
        x[5] = 3e38f; // its f16 scale would be inf
        cr_expect_eq(quant_quantize_row(q[t], x, b, n, &err), VERR_RANGE, "%s huge", ggml_type_name(q[t]));
        x[5] = 60000.0f; // fits every type's scale
        cr_expect_eq(quant_quantize_row(q[t], x, b, n, &err), 0, "%s 60000: %s", ggml_type_name(q[t]), err.msg);
        float *y = dequant(q[t], b, n);
        for (int64_t i = 0; i < n; i++)
            cr_expect(isfinite(y[i]), "%s 60000: element %lld finite", ggml_type_name(q[t]), (long long)i);
        cr_expect(fabsf(y[5] - 60000.0f) <= 60000.0f * 0.07f, "%s: %g", ggml_type_name(q[t]), (double)y[5]);
        free(y);
    }
    // Plain float types store what they get.
    x[0] = NAN;
    x[1] = 1e6f;
    cr_expect_eq(quant_quantize_row(GGML_TYPE_F16, x, b, 2, &err), 0);
    cr_expect((b[1] & 0x7c) == 0x7c && (b[0] | (b[1] & 3)), "NaN stored as NaN");
    cr_expect_eq(b[2] | b[3] << 8, 0x7c00, "f16 overflow is inf");
}

Test(errors, validate_row) {
    struct verr err = {0};
    uint8_t b[2 * 210];
    float x[512];
    rng_seed(5);
    for (int i = 0; i < 512; i++)
        x[i] = rng_unit();
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q6_K, x, b, 512, NULL), 0);
    cr_expect_eq(quant_validate_row(GGML_TYPE_Q6_K, b, 512, &err), 0, "%s", err.msg);
    put16(b + 210 + 208, 0x7c00); // block 1's d = inf
    cr_expect_eq(quant_validate_row(GGML_TYPE_Q6_K, b, 512, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "block 1") && strstr(err.msg, "inf"), "%s", err.msg);
    cr_assert_eq(quant_quantize_row(GGML_TYPE_Q4_1, x, b, 64, NULL), 0);
    cr_expect_eq(quant_validate_row(GGML_TYPE_Q4_1, b, 64, &err), 0);
    put16(b + 20 + 2, 0x7e00); // block 1's m = NaN
    cr_expect_eq(quant_validate_row(GGML_TYPE_Q4_1, b, 64, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "NaN") != NULL, "%s", err.msg);
    x[3] = INFINITY;
    cr_expect_eq(quant_validate_row(GGML_TYPE_F32, x, 8, &err), VERR_FORMAT);
    cr_expect(strstr(err.msg, "element 3") != NULL, "%s", err.msg);
    put16(b, 0x3c00);
    put16(b + 2, 0xfc00);
    cr_expect_eq(quant_validate_row(GGML_TYPE_F16, b, 2, &err), VERR_FORMAT);
    put16(b + 2, 0x7fc1);
    cr_expect_eq(quant_validate_row(GGML_TYPE_BF16, b, 2, &err), VERR_FORMAT);
    cr_expect_eq(quant_validate_row(GGML_TYPE_IQ1_S, b, 256, &err), VERR_UNSUPPORTED);
}
