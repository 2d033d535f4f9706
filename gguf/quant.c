// Quantized weight formats: fp16/bf16 conversion, per-type block decoders,
// the legacy quantizers (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), which reproduce ggml's
// reference quantizers bit for bit, the K-quant quantizers (Q2_K .. Q6_K,
// our own least-squares search), and the row entry points (dequantize,
// quantize, validate, dot). Written from the format descriptions in
// llama.cpp's ggml-common.h / ggml-quants.c; no code is taken from there.
//
// Block layouts (byte offsets inside one block; every f16 is little-endian and
// may sit at an odd address, so all multi-byte fields are assembled from bytes):
//   Q4_0   18 B / 32:  d@0, qs[16]@2            x = (nibble - 8) * d
//   Q4_1   20 B / 32:  d@0, m@2, qs[16]@4       x = nibble * d + m
//   Q5_0   22 B / 32:  d@0, qh[4]@2, qs[16]@6   x = ((nibble | hbit << 4) - 16) * d
//   Q5_1   24 B / 32:  d@0, m@2, qh[4]@4, qs[16]@8
//   Q8_0   34 B / 32:  d@0, i8 qs[32]@2         x = q * d
//   IQ4_NL 18 B / 32:  d@0, qs[16]@2            x = d * table[nibble]
//   MXFP4  17 B / 32:  e@0 (E8M0), qs[16]@1     x = 2^(e-128) * level[nibble] (quant.h)
//   IQ4_XS 136 B / 256: d@0, scales_h@2 (u16), scales_l[4]@4, qs[128]@8:
//                      8 groups of 32 like IQ4_NL's, x = d * (ls - 32) * table[nibble]
//                      with ls 6 bits (nibble of scales_l, 2 bits of scales_h)
//   Q2_K   84 B / 256: scales[16]@0, qs[64]@16, d@80, dmin@82
//   Q3_K  110 B / 256: hmask[32]@0, qs[64]@32, scales[12]@96, d@108
//   Q4_K  144 B / 256: d@0, dmin@2, scales[12]@4, qs[128]@16
//   Q5_K  176 B / 256: d@0, dmin@2, scales[12]@4, qh[32]@16, qs[128]@48
//   Q6_K  210 B / 256: ql[128]@0, qh[64]@128, i8 scales[16]@192, d@208
// In the 32-element formats byte j of qs holds element j in its low nibble and
// element j + 16 in its high nibble; qh bit j is the fifth bit of element j.
//
// Bit-exactness: every decoder evaluates the same float expression, in the
// same order and with the same roundings, as ggml's dequantize_row_* (e.g.
// Q6_K is (d * scale) * q, Q4_K is (d * sc) * q - dmin * m). That only holds
// if the compiler does not fuse a*b + c into one FMA: GCC in ISO C mode
// (-std=c11) never does; clang would on FMA targets, hence the pragma.
#include "gguf/quant.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

// ---------------------------------------------------------------------------
// fp16 / bf16

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Written as selects so loops over f16 rows vectorize. Normal halves: move
// exponent and mantissa up 13 bits and rebias the exponent (+112). Subnormal
// halves are mantissa * 2^-24, computed from the integer (no arithmetic on
// float denormals, so a DAZ/FTZ mode set elsewhere cannot flush them).
// inf/NaN keep their payload; NaN comes back quiet, as F16C's vcvtph2ps does.
float quant_fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = h & 0x7c00u, mant = h & 0x03ffu;
    const uint32_t normal = (((uint32_t)h & 0x7fffu) << 13) + 0x38000000u;
    const uint32_t sub = bits_of((float)mant * 0x1p-24f);
    const uint32_t special = 0x7f800000u | (mant << 13) | ((uint32_t)(mant != 0) << 22);
    // Masks instead of branches: GCC then vectorizes a loop of these.
    const uint32_t is_sub = 0u - (uint32_t)(exp == 0), is_special = 0u - (uint32_t)(exp == 0x7c00u);
    const uint32_t body =
        (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special));
    return float_of(sign | body);
}

// Round to nearest, ties to even, on the integer bits: overflow goes to inf
// (anything >= 65520), results below the smallest normal become subnormals
// with the same rounding, NaN stays NaN (quieted, top payload bits kept).
uint16_t quant_f32_to_fp16(float f) {
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x03ffu));
    if (x >= 0x477ff000u) // 65520 and up (and inf) round to inf
        return (uint16_t)(sign | 0x7c00u);
    int e = (int)(x >> 23) - 127; // unbiased exponent of the float
    uint32_t m = (x & 0x007fffffu) | 0x00800000u;
    if (x < 0x00800000u) // float subnormal or zero: far below half's range
        return sign;
    uint32_t shift, base;
    if (e >= -14) { // half normal: keep 10 of the 23 mantissa bits
        shift = 13;
        base = ((uint32_t)(e + 15) << 10) | ((m >> 13) & 0x03ffu);
    } else { // half subnormal: value / 2^-24 = m * 2^(e + 1)
        shift = (uint32_t)(-(e + 1));
        if (shift > 24)
            return sign; // below 2^-25: rounds to zero
        base = m >> shift;
    }
    uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (base & 1u)))
        base++; // a carry out of the mantissa correctly bumps the exponent
    return (uint16_t)(sign | base);
}

float quant_bf16_to_f32(uint16_t h) {
    return float_of((uint32_t)h << 16);
}

uint16_t quant_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) // NaN: truncate and force quiet
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

// ---------------------------------------------------------------------------
// small helpers

static inline uint16_t rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline float rd_f16(const uint8_t *p) {
    return quant_fp16_to_f32(rd_u16(p));
}
static inline void wr_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

// IQ4_NL's 16 non-uniform levels (the values llama.cpp's format defines).
const int8_t quant_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

// 6-bit scale j (0..7) and min j of a Q4_K/Q5_K scales[12] field: entries 0..3
// are the low 6 bits of bytes 0..3 (scale) and 4..7 (min); entries 4..7 keep
// their low 4 bits in a nibble of bytes 8..11 and their top 2 bits in the top
// bits of bytes 0..3 (scale) and 4..7 (min).
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// ---------------------------------------------------------------------------
// decoders: nb blocks from src to y[nb * block_size]

// src and y never overlap; restrict lets the compiler vectorize although
// a uint8_t pointer could otherwise alias the float output.
typedef void (*dequant_fn)(const uint8_t *restrict src, float *restrict y, int64_t nb);

static void dq_f32(const uint8_t *restrict src, float *restrict y, int64_t n) {
    memcpy(y, src, (size_t)n * 4);
}

static void dq_f16(const uint8_t *restrict src, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = rd_f16(src + 2 * i);
}

static void dq_bf16(const uint8_t *restrict src, float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = quant_bf16_to_f32(rd_u16(src + 2 * i));
}

static void dq_q4_0(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 0x0f) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

// The fifth bit of element e is bit e % 8 of qh byte e / 8; testing it
// against a constant mask per lane (rather than shifting by e) vectorizes.
static const uint8_t q5_bitmask[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};

static void dq_q5_0(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = rd_f16(b);
        const uint8_t *qh = b + 2, *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0f) | ((qh[j >> 3] & q5_bitmask[j]) ? 16 : 0);
            int hi = (qs[j] >> 4) | ((qh[2 + (j >> 3)] & q5_bitmask[j]) ? 16 : 0);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

static void dq_q5_1(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qh = b + 4, *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0f) | ((qh[j >> 3] & q5_bitmask[j]) ? 16 : 0);
            int hi = (qs[j] >> 4) | ((qh[2 + (j >> 3)] & q5_bitmask[j]) ? 16 : 0);
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        }
    }
}

static void dq_q8_0(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = rd_f16(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

static void dq_iq4_nl(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)quant_iq4_levels[qs[j] & 0x0f];
            y[j + 16] = d * (float)quant_iq4_levels[qs[j] >> 4];
        }
    }
}

// MXFP4: E2M1 values doubled so they are integers; 2^(e-128) (the E8M0
// scale 2^(e-127) halved) undoes the doubling.
const int8_t quant_mxfp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void dq_mxfp4(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 17, y += 32) {
        const float d = quant_e8m0_half_to_f32(b[0]);
        const uint8_t *qs = b + 1;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)quant_mxfp4_levels[qs[j] & 0x0f] * d;
            y[j + 16] = (float)quant_mxfp4_levels[qs[j] >> 4] * d;
        }
    }
}

void quant_iq4_xs_pack_scales(uint8_t *b, const int sc[8]) {
    uint16_t sh = 0;
    memset(b + 4, 0, 4);
    for (int g = 0; g < 8; g++) {
        const int ls = sc[g] + 32;
        b[4 + g / 2] |= (uint8_t)((ls & 0x0f) << 4 * (g % 2));
        sh |= (uint16_t)((ls >> 4) << 2 * g);
    }
    wr_u16(b + 2, sh);
}

static void dq_iq4_xs(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 136) {
        const float d = rd_f16(b);
        for (int g = 0; g < 8; g++, y += 32) {
            const float dl = d * (float)quant_iq4_xs_scale(b, g);
            const uint8_t *qs = b + 8 + 16 * g;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quant_iq4_levels[qs[j] & 0x0f];
                y[j + 16] = dl * (float)quant_iq4_levels[qs[j] >> 4];
            }
        }
    }
}

// Q2_K: 16 groups of 16; group g's byte scales[g] holds a 4-bit scale (low)
// and a 4-bit min (high). Each 128-element half reads 32 bytes of qs four
// times, two bits deeper each time: element 128h + 32s + l (l < 32) is bits
// 2s..2s+1 of qs[32h + l].
static void dq_q2_k(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 84) {
        const uint8_t *scales = b, *qs = b + 16;
        const float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = qs + 32 * h;
            for (int s = 0; s < 4; s++) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = scales[8 * h + 2 * s + half];
                    const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        y[l] = dl * (float)((q[16 * half + l] >> (2 * s)) & 3) - ml;
                    y += 16;
                }
            }
        }
    }
}

// Q3_K: 16 groups of 16 with signed 6-bit scales (stored + 32): low 4 bits of
// scale g in a nibble of scales[g % 8] (low nibble for g < 8), top 2 bits at
// bit 2*(g/4) of scales[8 + g % 4]. The 2 low bits of each 3-bit quant are laid
// out as in Q2_K; its third bit is hmask[l] bit (4h + s), and a clear bit
// means "subtract 4".
int quant_q3_k_scale(const uint8_t s[12], int g) {
    const int lo = g < 8 ? s[g] & 0x0f : s[g - 8] >> 4;
    const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

void quant_q3_k_pack_scales(uint8_t s[12], const int sc[16]) {
    memset(s, 0, 12);
    for (int g = 0; g < 16; g++) {
        const int c = sc[g] + 32;
        s[g % 8] |= (uint8_t)((c & 0x0f) << (g < 8 ? 0 : 4));
        s[8 + g % 4] |= (uint8_t)((c >> 4) << (2 * (g / 4)));
    }
}

static void dq_q3_k(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 110) {
        const uint8_t *hmask = b, *qs = b + 32, *sraw = b + 96;
        const float d = rd_f16(b + 108);
        int sc[16];
        for (int g = 0; g < 16; g++)
            sc[g] = quant_q3_k_scale(sraw, g);
        for (int h = 0; h < 2; h++) {
            const uint8_t *q = qs + 32 * h;
            for (int s = 0; s < 4; s++) {
                const uint8_t bit = (uint8_t)(1u << (4 * h + s));
                for (int half = 0; half < 2; half++) {
                    const float dl = d * (float)sc[8 * h + 2 * s + half];
                    for (int l = 0; l < 16; l++) {
                        int k = 16 * half + l;
                        int v = ((q[k] >> (2 * s)) & 3) - ((hmask[k] & bit) ? 0 : 4);
                        y[l] = dl * (float)v;
                    }
                    y += 16;
                }
            }
        }
    }
}

// Q4_K: 8 groups of 32; each 64-element chunk c reads qs[32c..32c+31]: low
// nibbles are group 2c, high nibbles group 2c+1.
static void dq_q4_k(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        const float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        for (int c = 0; c < 4; c++, q += 32) {
            int sc0, m0, sc1, m1;
            k4_scale_min(scales, 2 * c, &sc0, &m0);
            k4_scale_min(scales, 2 * c + 1, &sc1, &m1);
            const float d0 = d * (float)sc0, n0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, n1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++)
                y[l] = d0 * (float)(q[l] & 0x0f) - n0;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d1 * (float)(q[l] >> 4) - n1;
            y += 64;
        }
    }
}

// Q5_K: Q4_K plus a fifth bit: for chunk c, qh[l] bit 2c belongs to the low
// nibble group, bit 2c+1 to the high nibble group.
static void dq_q5_k(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *q = b + 48;
        for (int c = 0; c < 4; c++, q += 32) {
            int sc0, m0, sc1, m1;
            k4_scale_min(scales, 2 * c, &sc0, &m0);
            k4_scale_min(scales, 2 * c + 1, &sc1, &m1);
            const float d0 = d * (float)sc0, n0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, n1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
                y[l] = d0 * (float)v - n0;
            }
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                y[32 + l] = d1 * (float)v - n1;
            }
            y += 64;
        }
    }
}

// Q6_K: 16 groups of 16 with int8 scales. Per 128-element half h: element
// 128h + 32s + l (s = 0..3, l < 32) has its low 4 bits in ql[64h + l + 32*(s&1)]
// (low nibble for s < 2, high nibble for s >= 2) and its top 2 bits at bit 2s
// of qh[32h + l]; its group is 8h + 2s + l/16. Values are stored + 32.
static void dq_q6_k(const uint8_t *restrict b, float *restrict y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = rd_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            for (int s = 0; s < 4; s++) {
                const uint8_t *qls = ql + 32 * (s & 1);
                const int lshift = 4 * (s >> 1), hshift = 2 * s;
                for (int half = 0; half < 2; half++) {
                    const float ds = d * (float)sc[8 * h + 2 * s + half];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int v = (((qls[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4)) - 32;
                        y[32 * s + l] = ds * (float)v;
                    }
                }
            }
            y += 128;
        }
    }
}

// ---------------------------------------------------------------------------
// legacy quantizers, bit-exact with ggml's quantize_row_*_ref
//
// Each scale is computed in float32 from the block's extreme values; the quant
// index is computed with the unrounded scale (its reciprocal) while the f16
// that is stored is the rounded one, exactly as the reference does. Index
// computations clamp in float before converting to int: for finite inputs this
// is the same as the reference's MIN(top, (int8_t)v) (v is never negative),
// and it keeps the conversion defined for any input.

typedef void (*quant_fn)(const float *x, uint8_t *dst, int64_t nb);

// Inputs are finite here (quant_quantize_row checks), so plain comparisons
// clamp correctly and the int conversion is always defined; fminf/fmaxf/roundf
// would be library calls on baseline x86-64.
static inline float clampf(float v, float lo, float hi) {
    v = v < lo ? lo : v; // two plain selects: GCC if-converts (and vectorizes) these
    return v > hi ? hi : v;
}
static inline int trunc_clamp(float v, float top) {
    return (int)clampf(v, 0.0f, top);
}
// roundf (half away from zero) for |v| < 2^23: v - trunc(v) is exact there.
static inline int round_half_away(float v) {
    int t = (int)v;
    float frac = v - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

static void qz_q8_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_u16(b, quant_f32_to_fp16(d));
        for (int j = 0; j < 32; j++)
            b[2 + j] = (uint8_t)(int8_t)round_half_away(clampf(x[j] * id, -127.0f, 127.0f));
    }
}

// The element of largest magnitude (the first one on ties), with its sign.
static inline float signed_absmax(const float *x, int n) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            vmax = x[j];
        }
    }
    return vmax;
}

static void qz_q4_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 18) {
        // The extreme maps to index 0 (value -8 d), so that side gets all 8 levels.
        const float d = signed_absmax(x, 32) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_u16(b, quant_f32_to_fp16(d));
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(x[j] * id + 8.5f, 15.0f);
            int hi = trunc_clamp(x[j + 16] * id + 8.5f, 15.0f);
            b[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static inline void minmax(const float *x, int n, float *lo, float *hi) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < mn)
            mn = x[j];
        if (x[j] > mx)
            mx = x[j];
    }
    *lo = mn;
    *hi = mx;
}

static void qz_q4_1(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 20) {
        float mn, mx;
        minmax(x, 32, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_u16(b, quant_f32_to_fp16(d));
        wr_u16(b + 2, quant_f32_to_fp16(mn));
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((x[j] - mn) * id + 0.5f, 15.0f);
            int hi = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 15.0f);
            b[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void qz_q5_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 22) {
        const float d = signed_absmax(x, 32) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_u16(b, quant_f32_to_fp16(d));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(x[j] * id + 16.5f, 31.0f);
            int hi = trunc_clamp(x[j + 16] * id + 16.5f, 31.0f);
            b[6 + j] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        put_u32(b + 2, qh);
    }
}

static void qz_q5_1(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 24) {
        float mn, mx;
        minmax(x, 32, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_u16(b, quant_f32_to_fp16(d));
        wr_u16(b + 2, quant_f32_to_fp16(mn));
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((x[j] - mn) * id + 0.5f, 31.0f);
            int hi = trunc_clamp((x[j + 16] - mn) * id + 0.5f, 31.0f);
            b[8 + j] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        put_u32(b + 4, qh);
    }
}

static void qz_f32(const float *x, uint8_t *dst, int64_t n) {
    memcpy(dst, x, (size_t)n * 4);
}

static void qz_f16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        wr_u16(dst + 2 * i, quant_f32_to_fp16(x[i]));
}

static void qz_bf16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        wr_u16(dst + 2 * i, quant_f32_to_bf16(x[i]));
}

// ---------------------------------------------------------------------------
// IQ4_NL / IQ4_XS quantizers (our own search).
//
// The 16 levels are fixed and non-uniform, so for a group of 32 only the
// scale is free: x_j ~ d * level[k_j]. iq4_group_scale tries 15 inverse
// scales that put the group's extreme on levels -134 .. -120 (the first
// level is -127: the extreme takes the side with the most levels), takes the
// least-squares d of each assignment, and keeps the d whose own nearest-level
// assignment has the lowest error. IQ4_XS then writes each group's d as a
// signed 6-bit multiple of one f16 super-scale (the largest |d| maps to -32),
// trying the code on either side of the rounded one.
// The error is weighted by x^2, as llama.cpp's quantize_iq4_nl/xs weight it
// without an importance matrix: large weights matter more to a layer's
// output. On SmolLM2-135M requantized to IQ4_XS this gave a mean KL from the
// source model of 0.206 over 702 tokens, against 0.215 for the plain squared
// error and 0.213 for llama-quantize's file; the plain RMSE of the weights
// stays below llama.cpp's (tests/test_quant.c).

// Index of the level nearest to v (the lower one on a tie). lo, the last
// level <= v, is counted without branches (a binary search mispredicted on
// every step; this is the quantizer's inner loop).
static inline int iq4_nearest(float v) {
    if (!(v > (float)quant_iq4_levels[0]))
        return 0; // also NaN
    if (v >= (float)quant_iq4_levels[15])
        return 15;
    int lo = 0;
    for (int k = 1; k < 15; k++)
        lo += v >= (float)quant_iq4_levels[k];
    return v - (float)quant_iq4_levels[lo] <= (float)quant_iq4_levels[lo + 1] - v ? lo : lo + 1;
}

// Error of x[0..n) stored with scale d, each on its nearest level: the sum
// of x_j^2 (x_j - d level_j)^2.
static double iq4_error(const float *x, int n, float d) {
    double e = 0.0;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) {
        const double r = (double)x[j] - (double)d * quant_iq4_levels[iq4_nearest(x[j] * id)];
        e += (double)x[j] * x[j] * r * r;
    }
    return e;
}

static float iq4_group_scale(const float *x, int n) {
    const float vmax = signed_absmax(x, n);
    if (vmax == 0.0f)
        return 0.0f;
    float best_d = vmax / (float)quant_iq4_levels[0];
    double best_e = iq4_error(x, n, best_d);
    for (int t = -7; t <= 7; t++) {
        const float id = (float)(quant_iq4_levels[0] + t) / vmax;
        double sqx = 0.0, sq2 = 0.0;
        for (int j = 0; j < n; j++) {
            const double q = quant_iq4_levels[iq4_nearest(x[j] * id)], w = (double)x[j] * x[j];
            sqx += w * q * x[j];
            sq2 += w * q * q;
        }
        if (sq2 <= 0.0)
            continue;
        const float d = (float)(sqx / sq2);
        const double e = iq4_error(x, n, d);
        if (e < best_e) {
            best_e = e;
            best_d = d;
        }
    }
    return best_d;
}

// Nibbles of a group of 32 stored with scale d (as decoded: the f16 value).
static void iq4_pack(const float *x, float d, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(iq4_nearest(x[j] * id) | iq4_nearest(x[j + 16] * id) << 4);
}

static void qz_iq4_nl(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 18) {
        const uint16_t d16 = quant_f32_to_fp16(iq4_group_scale(x, 32));
        wr_u16(b, d16);
        iq4_pack(x, quant_fp16_to_f32(d16), b + 2);
    }
}

static void qz_iq4_xs(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 136) {
        float sc[8], smax = 0.0f;
        for (int g = 0; g < 8; g++) {
            sc[g] = iq4_group_scale(x + 32 * g, 32);
            if (fabsf(sc[g]) > fabsf(smax))
                smax = sc[g];
        }
        const uint16_t d16 = quant_f32_to_fp16(smax / -32.0f);
        const float d = quant_fp16_to_f32(d16);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int code[8];
        wr_u16(b, d16);
        for (int g = 0; g < 8; g++) {
            const float *xg = x + 32 * g;
            const int l0 = (int)lrintf(clampf(sc[g] * id, -32.0f, 31.0f));
            int best = l0;
            double best_e = iq4_error(xg, 32, d * (float)l0);
            for (int l = l0 - 1; l <= l0 + 1; l += 2) {
                if (l < -32 || l > 31)
                    continue;
                const double e = iq4_error(xg, 32, d * (float)l);
                if (e < best_e) {
                    best_e = e;
                    best = l;
                }
            }
            code[g] = best;
            iq4_pack(xg, d * (float)best, b + 8 + 16 * g);
        }
        quant_iq4_xs_pack_scales(b, code);
    }
}

// ---------------------------------------------------------------------------
// MXFP4 quantizer: ggml's quantize_row_mxfp4_ref, bit for bit.
//
// e = floor(log2(amax)) - 2 + 127 puts amax in [4, 8) times 2^(e-127), the
// E2M1 range's top (6) near it; 0 for an all-zero block. Each element takes
// the first level (in nibble order) of least |level * d - x|, so a tie goes
// to the lower nibble: +0 over -0, the smaller magnitude between two levels.
// ggml converts a negative e (amax < 2^-125) to uint8_t, which C leaves
// undefined; here it is 0, the scale nearest to such a block.

static int mxfp4_nearest(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)quant_mxfp4_levels[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)quant_mxfp4_levels[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

static void qz_mxfp4(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, b += 17) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float ef = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        const uint8_t e = ef > 0.0f ? (uint8_t)ef : 0;
        const float d = quant_e8m0_half_to_f32(e);
        b[0] = e;
        for (int j = 0; j < 16; j++)
            b[1 + j] = (uint8_t)(mxfp4_nearest(x[j], d) | (mxfp4_nearest(x[j + 16], d) << 4));
    }
}

// ---------------------------------------------------------------------------
// K-quant quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
//
// Not bit-exact with llama.cpp's quantizer (the formats do not require it);
// the algorithm is ours:
//  1. Per group (32 elements for Q4_K/Q5_K, 16 for Q2_K/Q3_K/Q6_K), find the
//     scale (and for Q2_K/Q4_K/Q5_K the offset) minimising the unweighted
//     squared error of the reconstruction: start from the plain range fit,
//     try 21 candidate step sizes around it (the range spread over nmax-1 ..
//     nmax+1 levels, which trades clipping one extreme for finer steps), and
//     for each candidate round every element to its level and solve the
//     least-squares problem for scale (and offset) given those levels; then a
//     few alternations of "re-round to nearest level / re-solve" (Lloyd
//     iterations). A candidate is kept only if its error, measured after
//     re-rounding, is lower, so the result is never worse than the range fit.
//  2. Quantize the group scales (and mins) against the super-block's largest
//     one: unsigned 6-bit (Q4_K/Q5_K, super-scale = max/63) or 4-bit (Q2_K,
//     max/15), or signed 8-bit (Q6_K, super-scale = max/-128 so the largest
//     gets all 128 steps) or 6-bit (Q3_K, max/-32). For each group the
//     rounded code and its neighbours (+-1, and for the offset types every
//     scale/min pair of them) are tried with the f16-rounded super-scales,
//     keeping the pair with the least error.
//  3. Round every element to the nearest level of its final, stored scale.
// Q6_K and Q3_K try both ends for their largest magnitude (level -32 or +31,
// -4 or +3).
// Error: step 1 never does worse than the range fit in total squared error
// (per element, clipping an extreme can cost up to about one step); step 2
// adds the error of rounding the group scale to its code: the top level
// moves by at most nmax * 1.5 super-scales. On Gaussian test data the result
// has a lower RMSE than llama.cpp's quantize_row_q*_K_ref (tests/test_quant.c).

#define KQ_CANDIDATES 10 // candidate step sizes on each side of the range fit
#define KQ_LLOYD 4       // round / refit alternations

// The search kernels below are branch-free loops over a group (n is 16 or 32,
// a multiple of 8) with 8 fixed partial sums, so GCC vectorizes them.

// l[i] = the level nearest to x[i] for x ~ s*l + o (inv = 1/s), in [lmin, lmax].
static inline void kq_levels(const float *restrict x, int n, float inv, float o, float lmin,
                             float lmax, int32_t *restrict l) {
    for (int i = 0; i < n; i++)
        l[i] = round_half_away(clampf((x[i] - o) * inv, lmin, lmax));
}

static inline float sum8(const float a[8]) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// Squared error of x ~ s*l + o for the given levels.
static inline float kq_error(const float *restrict x, int n, float s, float o,
                             const int32_t *restrict l) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) {
            float r = s * (float)l[i + k] + o - x[i + k];
            acc[k] += r * r;
        }
    return sum8(acc);
}

// Error of x ~ s*l + o with every element at its nearest level (l: scratch,
// left holding those levels).
static float kq_round_error(const float *x, int n, float s, float o, float lmin, float lmax,
                            int32_t *l) {
    kq_levels(x, n, s != 0.0f ? 1.0f / s : 0.0f, o, lmin, lmax, l);
    return kq_error(x, n, s, o, l);
}

struct kq_sums {
    int32_t sl, sll; // integer sums stay exact
    float sx, slx;
};

static struct kq_sums kq_sum(const float *restrict x, int n, const int32_t *restrict l) {
    int32_t sl[8] = {0}, sll[8] = {0};
    float sx[8] = {0}, slx[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) {
            sl[k] += l[i + k];
            sll[k] += l[i + k] * l[i + k];
            sx[k] += x[i + k];
            slx[k] += (float)l[i + k] * x[i + k];
        }
    struct kq_sums r = {0, 0, sum8(sx), sum8(slx)};
    for (int k = 0; k < 8; k++) {
        r.sl += sl[k];
        r.sll += sll[k];
    }
    return r;
}

// Least-squares (s, o) for given levels l in [0, nmax], with o <= 0 (the
// format subtracts a non-negative min). False when the levels cannot define
// a step or the fit degenerated (a step larger than the whole range).
static bool asym_solve(const float *x, const int32_t *l, int n, float range, float *s, float *o) {
    const struct kq_sums t = kq_sum(x, n, l);
    const float det = (float)n * (float)t.sll - (float)t.sl * (float)t.sl;
    if (det <= 0.0f)
        return false;
    float ss = ((float)n * t.slx - (float)t.sl * t.sx) / det;
    float oo = (t.sx - ss * (float)t.sl) / (float)n;
    if (oo > 0.0f) {
        oo = 0.0f;
        ss = t.slx / (float)t.sll;
    }
    if (!(ss > 0.0f) || ss > range)
        return false;
    *s = ss;
    *o = oo;
    return true;
}

// Step 1 for Q4_K/Q5_K: x ~ s*l - m with s >= 0, m >= 0, l in [0, nmax].
static void fit_asym(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    const float range = hi - lo, top = (float)nmax;
    if (!(range > 0.0f)) { // every element equals lo <= 0
        *s_out = 0.0f;
        *m_out = -lo;
        return;
    }
    int32_t l[32];
    float best_s = range / top, best_o = lo;
    float best_e = kq_round_error(x, n, best_s, best_o, 0.0f, top, l);
    for (int k = -KQ_CANDIDATES; k <= KQ_CANDIDATES; k++) {
        kq_levels(x, n, (top + 0.1f * (float)k) / range, lo, 0.0f, top, l);
        float s, o;
        if (!asym_solve(x, l, n, range, &s, &o))
            continue;
        float e = kq_round_error(x, n, s, o, 0.0f, top, l);
        if (e < best_e) {
            best_e = e;
            best_s = s;
            best_o = o;
        }
    }
    for (int it = 0; it < KQ_LLOYD; it++) {
        float s, o;
        kq_levels(x, n, 1.0f / best_s, best_o, 0.0f, top, l);
        if (!asym_solve(x, l, n, range, &s, &o))
            break;
        float e = kq_round_error(x, n, s, o, 0.0f, top, l);
        if (!(e < best_e))
            break;
        best_e = e;
        best_s = s;
        best_o = o;
    }
    *s_out = best_s;
    *m_out = -best_o;
}

// Steps 2 and 3 for the asymmetric K-quants, one super-block of 256: groups
// of gs elements (Q4_K/Q5_K: 32, Q2_K: 16) with levels [0, nmax] and
// scale/min codes in [0, cmax] (6 bits: 63; Q2_K 4 bits: 15) of the f16
// super-scales *d16, *m16. Fills the codes sc[], mn[] (256 / gs each) and
// the levels q[256].
static void kquant_asym_codes(const float *x, int gs, int nmax, int cmax, uint16_t *d16,
                              uint16_t *m16, int *sc, int *mn, uint8_t q[256]) {
    const int ng = 256 / gs;
    const float cm = (float)cmax;
    float s[16], m[16], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < ng; j++) {
        fit_asym(x + gs * j, gs, nmax, &s[j], &m[j]);
        smax = s[j] > smax ? s[j] : smax;
        mmax = m[j] > mmax ? m[j] : mmax;
    }
    *d16 = quant_f32_to_fp16(smax / cm);
    *m16 = quant_f32_to_fp16(mmax / cm);
    const float d = quant_fp16_to_f32(*d16), dmin = quant_fp16_to_f32(*m16), top = (float)nmax;
    int32_t l[32];
    for (int j = 0; j < ng; j++) {
        const float *xj = x + gs * j;
        int rs = d > 0.0f ? round_half_away(clampf(s[j] / d, 0.0f, cm)) : 0;
        int rm = dmin > 0.0f ? round_half_away(clampf(m[j] / dmin, 0.0f, cm)) : 0;
        float best_e = INFINITY;
        sc[j] = rs;
        mn[j] = rm;
        for (int cs = rs - 1; cs <= rs + 1; cs++) {
            for (int cmn = rm - 1; cmn <= rm + 1; cmn++) {
                if (cs < 0 || cs > cmax || cmn < 0 || cmn > cmax)
                    continue;
                // The decoders' own expressions: (d * sc) * q - dmin * m.
                float e = kq_round_error(xj, gs, d * (float)cs, -(dmin * (float)cmn), 0.0f, top, l);
                if (e < best_e) {
                    best_e = e;
                    sc[j] = cs;
                    mn[j] = cmn;
                }
            }
        }
        kq_round_error(xj, gs, d * (float)sc[j], -(dmin * (float)mn[j]), 0.0f, top, l);
        for (int i = 0; i < gs; i++)
            q[gs * j + i] = (uint8_t)l[i];
    }
}

// Q4_K (nmax 15) and Q5_K (nmax 31): d, dmin and the 6-bit codes into the
// block header, the levels into q[256].
static void kquant_asym_block(const float *x, int nmax, uint8_t *b, uint8_t q[256]) {
    uint16_t d16, m16;
    int sc[8], mn[8];
    kquant_asym_codes(x, 32, nmax, 63, &d16, &m16, sc, mn, q);
    wr_u16(b, d16);
    wr_u16(b + 2, m16);
    uint8_t *scales = b + 4; // packing: the inverse of k4_scale_min
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

// The 2-bit planes of Q2_K and Q3_K: element 128h + 32s + l (l < 32) at bits
// 2s..2s+1 of qs[32h + l] (the inverse of dq_q2_k's loop).
static void kquant_pack_2bit(const uint8_t q[256], uint8_t qs[64]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            uint8_t v = 0;
            for (int s = 0; s < 4; s++)
                v |= (uint8_t)((q[128 * h + 32 * s + l] & 3) << (2 * s));
            qs[32 * h + l] = v;
        }
}

static void qz_q2_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 84) {
        uint8_t q[256];
        uint16_t d16, m16;
        int sc[16], mn[16];
        kquant_asym_codes(x, 16, 3, 15, &d16, &m16, sc, mn, q);
        for (int g = 0; g < 16; g++)
            b[g] = (uint8_t)(sc[g] | (mn[g] << 4));
        kquant_pack_2bit(q, b + 16);
        wr_u16(b + 80, d16);
        wr_u16(b + 82, m16);
    }
}

static void qz_q4_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 144) {
        uint8_t q[256];
        kquant_asym_block(x, 15, b, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

static void qz_q5_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 176) {
        uint8_t q[256];
        kquant_asym_block(x, 31, b, q);
        uint8_t *qh = b + 16, *qs = b + 48;
        memset(qh, 0, 32);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                qs[32 * c + l] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
                qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
        }
    }
}

// Least-squares s for x ~ s*l (levels given); false if all levels are 0.
static bool sym_solve(const float *x, const int32_t *l, int n, float *s) {
    const struct kq_sums t = kq_sum(x, n, l);
    if (t.sll == 0)
        return false;
    *s = t.slx / (float)t.sll;
    return *s != 0.0f;
}

// Step 1 for the symmetric K-quants: x ~ s*l, l in [lmin, lmax] = [-2^(k-1),
// 2^(k-1) - 1] (Q6_K: [-32, 31], Q3_K: [-4, 3]); s may be negative so that
// the largest magnitude can use the lmin end. Groups of 16.
static float fit_sym(const float *x, int n, int lmin, int lmax) {
    const float vmax = signed_absmax(x, n);
    if (vmax == 0.0f)
        return 0.0f;
    const float lo = (float)lmin, hi = (float)lmax;
    int32_t l[16];
    float best_s = vmax / lo;
    float best_e = kq_round_error(x, n, best_s, 0.0f, lo, hi, l);
    for (int side = 0; side < 2; side++) {
        for (int k = -KQ_CANDIDATES; k <= KQ_CANDIDATES; k++) {
            const float iscale =
                side == 0 ? -(-lo + 0.1f * (float)k) / vmax : (hi + 0.1f * (float)k) / vmax;
            kq_levels(x, n, iscale, 0.0f, lo, hi, l);
            float s;
            if (!sym_solve(x, l, n, &s))
                continue;
            float e = kq_round_error(x, n, s, 0.0f, lo, hi, l);
            if (e < best_e) {
                best_e = e;
                best_s = s;
            }
        }
    }
    for (int it = 0; it < KQ_LLOYD; it++) {
        float s;
        kq_levels(x, n, 1.0f / best_s, 0.0f, lo, hi, l);
        if (!sym_solve(x, l, n, &s))
            break;
        float e = kq_round_error(x, n, s, 0.0f, lo, hi, l);
        if (!(e < best_e))
            break;
        best_e = e;
        best_s = s;
    }
    return best_s;
}

// Steps 2 and 3 for the symmetric K-quants, one super-block: 16 groups of
// 16 with levels [lmin, lmax] and signed scale codes in [cmin, -cmin - 1]
// (Q6_K 8 bits: -128; Q3_K 6 bits: -32) of the f16 super-scale *d16 =
// (largest group scale) / cmin, so that the largest gets every step. Fills
// the codes sc[16] and the levels q[256] (signed).
static void kquant_sym_codes(const float *x, int lmin, int lmax, int cmin, uint16_t *d16,
                             int sc[16], int32_t q[256]) {
    float s[16], smax = 0.0f;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_sym(x + 16 * j, 16, lmin, lmax);
        if (fabsf(s[j]) > fabsf(smax))
            smax = s[j];
    }
    const float clo = (float)cmin, chi = (float)(-cmin - 1);
    *d16 = quant_f32_to_fp16(smax / clo);
    const float d = quant_fp16_to_f32(*d16), lo = (float)lmin, hi = (float)lmax;
    for (int j = 0; j < 16; j++) {
        const float *xj = x + 16 * j;
        int r = d != 0.0f ? round_half_away(clampf(s[j] / d, clo, chi)) : 0;
        int best = r;
        float best_e = INFINITY;
        for (int c = r - 1; c <= r + 1; c++) {
            if (c < cmin || c > -cmin - 1)
                continue;
            // The decoders' own expression: (d * sc) * q.
            float e = kq_round_error(xj, 16, d * (float)c, 0.0f, lo, hi, q + 16 * j);
            if (e < best_e) {
                best_e = e;
                best = c;
            }
        }
        sc[j] = best;
        kq_round_error(xj, 16, d * (float)best, 0.0f, lo, hi, q + 16 * j);
    }
}

static void qz_q6_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 210) {
        uint16_t d16;
        int sc[16];
        int32_t q[256];
        kquant_sym_codes(x, -32, 31, -128, &d16, sc, q);
        for (int j = 0; j < 16; j++)
            b[192 + j] = (uint8_t)(int8_t)sc[j];
        wr_u16(b + 208, d16);
        // Packing: the inverse of dq_q6_k's layout.
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            for (int l = 0; l < 32; l++) {
                int v[4];
                for (int k = 0; k < 4; k++)
                    v[k] = q[128 * h + 32 * k + l] + 32;
                ql[l] = (uint8_t)((v[0] & 0x0f) | ((v[2] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((v[1] & 0x0f) | ((v[3] & 0x0f) << 4));
                qh[l] = (uint8_t)((v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) |
                                  ((v[3] >> 4) << 6));
            }
        }
    }
}

// Q3_K: levels [-4, 3] stored as u = level + 4: the low 2 bits in the planes
// of Q2_K, the third in hmask (bit 4h + s of hmask[l] for element
// 128h + 32s + l); 6-bit scale codes stored + 32 (the inverse of dq_q3_k).
static void qz_q3_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256, b += 110) {
        uint16_t d16;
        int sc[16];
        int32_t q[256];
        kquant_sym_codes(x, -4, 3, -32, &d16, sc, q);
        uint8_t u[256], *hmask = b;
        memset(hmask, 0, 32);
        for (int e = 0; e < 256; e++) {
            u[e] = (uint8_t)(q[e] + 4);
            hmask[e % 32] |= (uint8_t)((u[e] >> 2) << (e / 32));
        }
        kquant_pack_2bit(u, b + 32);
        quant_q3_k_pack_scales(b + 96, sc);
        wr_u16(b + 108, d16);
    }
}

// ---------------------------------------------------------------------------
// the type table of this file

struct quant_ops {
    dequant_fn dequant; // NULL: cannot decode
    quant_fn quant;     // NULL: cannot encode
    // Scale bound for quantizing: the largest |x| a block may hold so that its
    // f16 scale fields stay finite (0: no bound, the type has no scale field).
    float max_abs;
};

static const struct quant_ops *ops_get(enum ggml_type type) {
    // max_abs: 65504 (largest finite f16) times the divisor of the stored
    // scale: Q8_0's d is amax/127, Q4_0's max/8, Q5_0's max/16; Q4_1/Q5_1 store
    // the min itself, so |x| <= 65504. K-quants: their scales are a fraction of
    // the block's range, |x| <= 65504 keeps every f16 field finite. IQ4_NL's d
    // is about amax/113 at most (the extreme on a level of -120 .. -134 or
    // on +113), IQ4_XS's a 32nd of that. MXFP4's E8M0 scale covers every
    // finite float (e <= 252 for |x| <= FLT_MAX).
    static const struct quant_ops table[GGML_TYPE_COUNT] = {
        [GGML_TYPE_F32] = {dq_f32, qz_f32, 0.0f},
        [GGML_TYPE_F16] = {dq_f16, qz_f16, 0.0f},
        [GGML_TYPE_BF16] = {dq_bf16, qz_bf16, 0.0f},
        [GGML_TYPE_Q8_0] = {dq_q8_0, qz_q8_0, 65504.0f * 127.0f},
        [GGML_TYPE_Q4_0] = {dq_q4_0, qz_q4_0, 65504.0f * 8.0f},
        [GGML_TYPE_Q4_1] = {dq_q4_1, qz_q4_1, 65504.0f},
        [GGML_TYPE_Q5_0] = {dq_q5_0, qz_q5_0, 65504.0f * 16.0f},
        [GGML_TYPE_Q5_1] = {dq_q5_1, qz_q5_1, 65504.0f},
        [GGML_TYPE_Q2_K] = {dq_q2_k, qz_q2_k, 65504.0f},
        [GGML_TYPE_Q3_K] = {dq_q3_k, qz_q3_k, 65504.0f},
        [GGML_TYPE_Q4_K] = {dq_q4_k, qz_q4_k, 65504.0f},
        [GGML_TYPE_Q5_K] = {dq_q5_k, qz_q5_k, 65504.0f},
        [GGML_TYPE_Q6_K] = {dq_q6_k, qz_q6_k, 65504.0f},
        [GGML_TYPE_IQ4_NL] = {dq_iq4_nl, qz_iq4_nl, 65504.0f * 100.0f},
        [GGML_TYPE_IQ4_XS] = {dq_iq4_xs, qz_iq4_xs, 65504.0f * 100.0f},
        [GGML_TYPE_MXFP4] = {dq_mxfp4, qz_mxfp4, 0.0f},
    };
    if ((unsigned)type >= GGML_TYPE_COUNT)
        return NULL;
    return &table[type];
}

bool quant_can_dequantize(enum ggml_type type) {
    const struct quant_ops *o = ops_get(type);
    return o && o->dequant;
}

bool quant_can_quantize(enum ggml_type type) {
    const struct quant_ops *o = ops_get(type);
    return o && o->quant;
}

bool quant_type_supported(enum ggml_type t) {
    switch (t) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
    case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS:
    case GGML_TYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

// Checks type/n/pointers shared by the row entry points; on success sets *bs.
// `what` names the operation in messages.
static int check_row(enum ggml_type type, bool encode, const char *what, const void *a,
                     const void *b, int64_t n, uint32_t *bs, struct verr *err) {
    const struct ggml_type_info *t = ggml_type_get((uint32_t)type);
    const struct quant_ops *o = ops_get(type);
    if (!t || !o || !(encode ? o->quant != NULL : o->dequant != NULL))
        return verr_set(err, VERR_UNSUPPORTED, "%s: type %s (%d) is not supported", what,
                        ggml_type_name((uint32_t)type), (int)type);
    if (n < 0 || n % t->block_size != 0)
        return verr_set(err, VERR_RANGE,
                        "%s %s: row of %lld elements is not a multiple of the block size %u", what,
                        t->name, (long long)n, t->block_size);
    if (n > 0 && (!a || !b))
        return verr_set(err, VERR_RANGE, "%s %s: NULL buffer for a row of %lld elements", what,
                        t->name, (long long)n);
    *bs = t->block_size;
    return VERR_OK;
}

int quant_dequantize_row(enum ggml_type type, const void *src, float *dst, int64_t n,
                         struct verr *err) {
    uint32_t bs = 1;
    int rc = check_row(type, false, "dequantize", src, dst, n, &bs, err);
    if (rc)
        return rc;
    if (n > 0)
        ops_get(type)->dequant(src, dst, bs == 1 ? n : n / bs);
    return VERR_OK;
}

int quant_quantize_row(enum ggml_type type, const float *src, void *dst, int64_t n,
                       struct verr *err) {
    uint32_t bs = 1;
    int rc = check_row(type, true, "quantize", src, dst, n, &bs, err);
    if (rc)
        return rc;
    const struct quant_ops *o = ops_get(type);
    const struct ggml_type_info *t = ggml_type_get((uint32_t)type);
    // Plain float types store inf/NaN as they are (and F16 overflows to inf, as
    // ggml's converter does); a block type has no faithful encoding for them.
    if (t->quantized) {
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(src[i]))
                return verr_set(err, VERR_RANGE, "quantize %s: element %lld is not finite (%g)",
                                t->name, (long long)i, (double)src[i]);
            if (o->max_abs > 0.0f && fabsf(src[i]) > o->max_abs)
                return verr_set(err, VERR_RANGE,
                                "quantize %s: element %lld = %g is too large: the block scale "
                                "would overflow f16 (|x| <= %g)",
                                t->name, (long long)i, (double)src[i], (double)o->max_abs);
        }
    }
    if (n == 0)
        return VERR_OK;
    o->quant(src, dst, bs == 1 ? n : n / bs);
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// validation

static bool f16_finite(const uint8_t *p) {
    return (rd_u16(p) & 0x7c00u) != 0x7c00u;
}

// MXFP4's E8M0 byte 255 is NaN in the OCP format; ggml_validate_row_data
// refuses it (its decoder would read it as 2^127).
static int validate_e8m0(const uint8_t *p, int64_t nb, struct verr *err) {
    for (int64_t blk = 0; blk < nb; blk++)
        if (p[(size_t)blk * 17] == 0xff)
            return verr_set(err, VERR_FORMAT,
                            "mxfp4 block %lld: E8M0 scale byte is 255 (NaN), expected 0..254",
                            (long long)blk);
    return VERR_OK;
}

int quant_validate_row(enum ggml_type type, const void *src, int64_t n, struct verr *err) {
    uint32_t bs = 1;
    int rc = check_row(type, false, "validate", src, src, n, &bs, err);
    if (rc)
        return rc;
    const uint8_t *p = src;
    const struct ggml_type_info *t = ggml_type_get((uint32_t)type);
    // Byte offsets of the f16 scale fields inside one block.
    int off[2] = {-1, -1};
    switch (type) {
    case GGML_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + 4 * i, 4);
            if (!isfinite(v))
                return verr_set(err, VERR_FORMAT, "f32 element %lld is not finite", (long long)i);
        }
        return VERR_OK;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            if (!f16_finite(p + 2 * i))
                return verr_set(err, VERR_FORMAT, "f16 element %lld is not finite", (long long)i);
        return VERR_OK;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            if ((rd_u16(p + 2 * i) & 0x7f80u) == 0x7f80u)
                return verr_set(err, VERR_FORMAT, "bf16 element %lld is not finite", (long long)i);
        return VERR_OK;
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
    case GGML_TYPE_Q2_K:
        off[0] = 80;
        off[1] = 82;
        break;
    case GGML_TYPE_Q3_K:
        off[0] = 108;
        break;
    case GGML_TYPE_Q6_K:
        off[0] = 208;
        break;
    case GGML_TYPE_MXFP4:
        return validate_e8m0(p, n / bs, err);
    default:
        break;
    }
    for (int64_t blk = 0; blk < n / bs; blk++) {
        const uint8_t *q = p + (size_t)blk * t->block_bytes;
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0 && !f16_finite(q + off[k]))
                return verr_set(err, VERR_FORMAT, "%s block %lld: f16 scale at byte %d is %s",
                                t->name, (long long)blk, off[k],
                                (rd_u16(q + off[k]) & 0x03ffu) ? "NaN" : "inf");
    }
    return VERR_OK;
}

// ---------------------------------------------------------------------------
// dot

// 16 independent partial sums: the compiler keeps them in vector registers
// and the order of additions is fixed, so the result does not depend on it.
static float dot_f32(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            acc[k] += a[i + k] * b[i + k];
    for (; i < n; i++)
        acc[i & 15] += a[i] * b[i];
    for (int k = 0; k < 8; k++)
        acc[k] += acc[k + 8];
    for (int k = 0; k < 4; k++)
        acc[k] += acc[k + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// Decodes QUANT_DOT_CHUNK elements at a time into a stack buffer and dots
// them; the per-chunk sums are added in double so long rows lose nothing
// beyond the float rounding of each chunk.
#define QUANT_DOT_CHUNK 256

float quant_dot_row(enum ggml_type type, const void *row, const float *x, int64_t n) {
    const struct ggml_type_info *t = ggml_type_get((uint32_t)type);
    const struct quant_ops *o = ops_get(type);
    if (!t || !o || !o->dequant || n < 0 || n % t->block_size != 0)
        return NAN;
    if (type == GGML_TYPE_F32) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i += QUANT_DOT_CHUNK) {
            int64_t m = n - i < QUANT_DOT_CHUNK ? n - i : QUANT_DOT_CHUNK;
            float a[QUANT_DOT_CHUNK];
            memcpy(a, (const float *)row + i, (size_t)m * sizeof(float));
            sum += dot_f32(a, x + i, m);
        }
        return (float)sum;
    }
    float buf[QUANT_DOT_CHUNK];
    const uint8_t *p = row;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += QUANT_DOT_CHUNK) {
        int64_t m = n - i < QUANT_DOT_CHUNK ? n - i : QUANT_DOT_CHUNK;
        int64_t blocks = m / t->block_size;
        o->dequant(p, buf, t->block_size == 1 ? m : blocks);
        p += (size_t)blocks * t->block_bytes;
        sum += dot_f32(buf, x + i, m);
    }
    return (float)sum;
}
