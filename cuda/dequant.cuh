// Device-side decoding of ggml weight blocks, shared by matvec.cu (dot in
// registers), matmul.cu (dequantize to f16 for cuBLAS) and elementwise.cu
// (embed). The layouts are llama.cpp's (see the table at the top of
// gguf/quant.c, the host reference). Each value is computed with the same
// float expression and roundings as gguf/quant.c's decoders: products and
// sums go through mul_rn / add_rn / sub_rn (__fmul_rn etc. on the device), so
// nvcc cannot fuse them into an FMA, which makes the decoded values
// bit-identical to the host's. The decoders are __host__ __device__ so that
// they can also be checked against gguf/quant.c on a machine without a GPU.
//
// Unit of work: a "sub-block" of 32 consecutive elements of a row. Every
// quantized type supported here is a whole number of sub-blocks per block
// (32-element blocks: one; 256-element blocks: eight).
//
// Alignment contract (checked by the launchers): the weight base pointer is
// 16-byte aligned. Then every block field read below with a 4-byte load is
// 4-byte aligned (block sizes 20, 24, 84, 136, 144, 176 are multiples of 4)
// and every 2-byte load is 2-byte aligned (block sizes 18, 22, 34, 110, 210
// are even). MXFP4's 17-byte blocks are read a byte at a time.
#ifndef VELA_CUDA_DEQUANT_CUH
#define VELA_CUDA_DEQUANT_CUH

#include <type_traits>

#include "cuda/cuda_common.cuh"

// #pragma unroll for code that is also compiled for the host (where the host
// compiler would warn about an unknown pragma).
#ifdef __CUDA_ARCH__
#define VELA_UNROLL _Pragma("unroll")
#else
#define VELA_UNROLL
#endif

// Products and sums that must not be fused into an FMA. On the host side
// (only used by checks that compile these decoders for the CPU) a plain
// expression is used; host C++ is not contracted across statements here.
static __host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}

static __host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}

static __host__ __device__ __forceinline__ float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    volatile float r = a - b;
    return r;
#endif
}

static __host__ __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return *(const uint16_t *)p;
}

static __host__ __device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    return *(const uint32_t *)p;
}

// NW little-endian words of 4 bytes from a 2-byte aligned address.
template <int NW>
static __host__ __device__ __forceinline__ void ld_words_a2(const uint8_t *p, uint32_t *w) {
VELA_UNROLL
    for (int k = 0; k < NW; k++)
        w[k] = ld_u16(p + 4 * k) | (ld_u16(p + 4 * k + 2) << 16);
}

template <int NW>
static __host__ __device__ __forceinline__ void ld_words_a4(const uint8_t *p, uint32_t *w) {
VELA_UNROLL
    for (int k = 0; k < NW; k++)
        w[k] = ld_u32(p + 4 * k);
}

// Byte k of a little-endian word array (k a compile-time constant after unrolling).
static __host__ __device__ __forceinline__ int byte_at(const uint32_t *w, int k) {
    return (int)((w[k >> 2] >> (8 * (k & 3))) & 0xffu);
}

// 6-bit scale and min j (0..7) of a Q4_K / Q5_K scales[12] field.
static __host__ __device__ __forceinline__ void k4_scale_min(const uint32_t *s /* 3 words */, int j,
                                                             int *sc, int *mn) {
    if (j < 4) {
        *sc = byte_at(s, j) & 63;
        *mn = byte_at(s, j + 4) & 63;
    } else {
        *sc = (byte_at(s, j + 4) & 0x0f) | ((byte_at(s, j - 4) >> 6) << 4);
        *mn = (byte_at(s, j + 4) >> 4) | ((byte_at(s, j) >> 6) << 4);
    }
}

// Signed 6-bit scale g (0..15) of a Q3_K scales[12] field (gguf/quant.h,
// quant_q3_k_scale): low nibble in byte g % 8 (high nibble for g >= 8), top
// 2 bits at bit 2(g/4) of byte 8 + g % 4, stored + 32.
static __host__ __device__ __forceinline__ int q3k_scale(const uint8_t *s, int g) {
    const int lo = g < 8 ? s[g] & 0x0f : s[g - 8] >> 4;
    const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Bytes of two little-endian words {y, x} picked by selector s:
// CUDA's __byte_perm (byte i of the result is byte (s >> 4i) & 7 of the 8;
// only the low 16 bits of s are used), and the same on the host.
static __host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
#endif
}

// IQ4_NL / IQ4_XS: the int8 levels (gguf/quant.h, quant_iq4_levels) of the 8
// nibbles of a word q of qs bytes, as two words of 4 signed bytes: lo holds
// the levels of the low nibbles of q's bytes 0..3, hi those of the high
// nibbles. The 16 levels are 4 immediate words (registers on the device, no
// table in local or constant memory); llama.cpp's get_int_from_table_16:
// nibble n picks level n & 7 from each half of the table (__byte_perm uses 3
// bits of a selector nibble), and its bit 3 which of the two.
static __host__ __device__ __forceinline__ void iq4_levels8(uint32_t q, uint32_t *lo,
                                                            uint32_t *hi) {
    // -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113
    const uint32_t t0 = 0xbfad9881u, t1 = 0xf6eaddcfu, t2 = 0x26190d01u, t3 = 0x71594535u;
    // Per nibble i of q: byte i % 4 of the low half's pick (0..3) or of the
    // high half's (4..7).
    const uint32_t sel = 0x32103210u | ((q & 0x88888888u) >> 1);
    // a: the levels of nibbles 0..3 of q (byte 0 low, byte 0 high, byte 1
    // low, byte 1 high); b: those of nibbles 4..7 (bytes 2 and 3).
    const uint32_t a = byte_perm(byte_perm(t0, t1, q), byte_perm(t2, t3, q), sel);
    const uint32_t b = byte_perm(byte_perm(t0, t1, q >> 16), byte_perm(t2, t3, q >> 16), sel >> 16);
    *lo = byte_perm(a, b, 0x6420u);
    *hi = byte_perm(a, b, 0x7531u);
}

// IQ4_XS group g's (0..7) signed scale (gguf/quant.h, quant_iq4_xs_scale)
// from the block's u16 scales_h and sl, its byte scales_l[g / 2] in the low
// bits: low 4 bits in nibble g % 2 of sl, top 2 bits at bit 2g of scales_h,
// stored + 32.
static __host__ __device__ __forceinline__ int iq4xs_scale(uint32_t scales_h, uint32_t sl, int g) {
    return (int)(((sl >> (4 * (g & 1))) & 0x0fu) | (((scales_h >> (2 * g)) & 3u) << 4)) - 32;
}

// Block geometry of the quantized types.
template <int T> struct qtype;
template <> struct qtype<GGML_TYPE_Q4_0> { static constexpr int block = 32, bytes = 18; };
template <> struct qtype<GGML_TYPE_Q4_1> { static constexpr int block = 32, bytes = 20; };
template <> struct qtype<GGML_TYPE_Q5_0> { static constexpr int block = 32, bytes = 22; };
template <> struct qtype<GGML_TYPE_Q5_1> { static constexpr int block = 32, bytes = 24; };
template <> struct qtype<GGML_TYPE_Q8_0> { static constexpr int block = 32, bytes = 34; };
template <> struct qtype<GGML_TYPE_Q2_K> { static constexpr int block = 256, bytes = 84; };
template <> struct qtype<GGML_TYPE_Q3_K> { static constexpr int block = 256, bytes = 110; };
template <> struct qtype<GGML_TYPE_Q4_K> { static constexpr int block = 256, bytes = 144; };
template <> struct qtype<GGML_TYPE_Q5_K> { static constexpr int block = 256, bytes = 176; };
template <> struct qtype<GGML_TYPE_Q6_K> { static constexpr int block = 256, bytes = 210; };
template <> struct qtype<GGML_TYPE_IQ4_NL> { static constexpr int block = 32, bytes = 18; };
template <> struct qtype<GGML_TYPE_IQ4_XS> { static constexpr int block = 256, bytes = 136; };
template <> struct qtype<GGML_TYPE_MXFP4> { static constexpr int block = 32, bytes = 17; };

// Decodes sub-block sb (elements 32*sb .. 32*sb+31) of a row into v[32].
template <int T>
static __host__ __device__ __forceinline__ void dequant_sub32(const uint8_t *row, int64_t sb,
                                                              float *v);

template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q4_0>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + sb * 18;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b));
    uint32_t q[4];
    ld_words_a2<4>(b + 2, q);
VELA_UNROLL
    for (int j = 0; j < 16; j++) {
        const int x = byte_at(q, j);
        v[j] = mul_rn((float)((x & 0x0f) - 8), d);
        v[j + 16] = mul_rn((float)((x >> 4) - 8), d);
    }
}

template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q4_1>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + sb * 20;
    const uint32_t dm = ld_u32(b);
    const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
    const float m = f16_bits_to_f32((uint16_t)(dm >> 16));
    uint32_t q[4];
    ld_words_a4<4>(b + 4, q);
VELA_UNROLL
    for (int j = 0; j < 16; j++) {
        const int x = byte_at(q, j);
        v[j] = add_rn(mul_rn((float)(x & 0x0f), d), m);
        v[j + 16] = add_rn(mul_rn((float)(x >> 4), d), m);
    }
}

template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q5_0>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + sb * 22;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b));
    const uint32_t qh = ld_u16(b + 2) | (ld_u16(b + 4) << 16);
    uint32_t q[4];
    ld_words_a2<4>(b + 6, q);
VELA_UNROLL
    for (int j = 0; j < 16; j++) {
        const int x = byte_at(q, j);
        const int lo = (x & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (x >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        v[j] = mul_rn((float)(lo - 16), d);
        v[j + 16] = mul_rn((float)(hi - 16), d);
    }
}

template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q5_1>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + sb * 24;
    const uint32_t dm = ld_u32(b);
    const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
    const float m = f16_bits_to_f32((uint16_t)(dm >> 16));
    const uint32_t qh = ld_u32(b + 4);
    uint32_t q[4];
    ld_words_a4<4>(b + 8, q);
VELA_UNROLL
    for (int j = 0; j < 16; j++) {
        const int x = byte_at(q, j);
        const int lo = (x & 0x0f) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (x >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        v[j] = add_rn(mul_rn((float)lo, d), m);
        v[j + 16] = add_rn(mul_rn((float)hi, d), m);
    }
}

template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q8_0>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + sb * 34;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b));
    uint32_t q[8];
    ld_words_a2<8>(b + 2, q);
VELA_UNROLL
    for (int j = 0; j < 32; j++)
        v[j] = mul_rn((float)(int8_t)byte_at(q, j), d);
}

// Q2_K / Q3_K sub-block j of a super-block: half h = j/4, plane s = j%4;
// element l (< 32) is bits 2s..2s+1 of qs[32h + l], in groups of 16 (group
// 2j for l < 16, 2j + 1 after).
// Q2_K: group g's byte scales[g] holds a 4-bit scale (low) and min (high);
// x = (d * sc) * q - dmin * m.
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q2_K>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 84;
    const int j = (int)(sb & 7), h = j >> 2, s = j & 3;
    const uint32_t dm = ld_u32(b + 80);
    const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
    const float dmin = f16_bits_to_f32((uint16_t)(dm >> 16));
    const uint32_t sc2 = ld_u16(b + 2 * j); // the scale bytes of groups 2j, 2j + 1
    const float d0 = mul_rn(d, (float)(sc2 & 0x0fu)), m0 = mul_rn(dmin, (float)((sc2 >> 4) & 0x0fu));
    const float d1 = mul_rn(d, (float)((sc2 >> 8) & 0x0fu)), m1 = mul_rn(dmin, (float)(sc2 >> 12));
    uint32_t q[8];
    ld_words_a4<8>(b + 16 + 32 * h, q);
VELA_UNROLL
    for (int l = 0; l < 32; l++) {
        const int x = (byte_at(q, l) >> (2 * s)) & 3;
        v[l] = l < 16 ? sub_rn(mul_rn(d0, (float)x), m0) : sub_rn(mul_rn(d1, (float)x), m1);
    }
}

// Q3_K: the 2 low bits as Q2_K's, the third at bit j of hmask[l] (clear:
// subtract 4); signed 6-bit scales (stored + 32) with their low nibble in
// scales[g % 8] (low nibble for g < 8) and top 2 bits at bit 2(g/4) of
// scales[8 + g % 4]; x = (d * sc) * q.
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q3_K>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 110;
    const int j = (int)(sb & 7), h = j >> 2, s = j & 3;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b + 108));
    const float dg[2] = {mul_rn(d, (float)q3k_scale(b + 96, 2 * j)),
                         mul_rn(d, (float)q3k_scale(b + 96, 2 * j + 1))};
    uint32_t q[8], hm[8];
    ld_words_a2<8>(b + 32 + 32 * h, q);
    ld_words_a2<8>(b, hm);
VELA_UNROLL
    for (int l = 0; l < 32; l++) {
        const int x = ((byte_at(q, l) >> (2 * s)) & 3) - (((byte_at(hm, l) >> j) & 1) ? 0 : 4);
        v[l] = mul_rn(l < 16 ? dg[0] : dg[1], (float)x);
    }
}

// Q4_K sub-block j of a super-block: group j; qs[32*(j/2) + l], low nibble
// for even j, high for odd.
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q4_K>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 144;
    const int j = (int)(sb & 7);
    const uint32_t dm = ld_u32(b);
    const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
    const float dmin = f16_bits_to_f32((uint16_t)(dm >> 16));
    uint32_t s[3];
    ld_words_a4<3>(b + 4, s);
    int sc, mn;
    k4_scale_min(s, j, &sc, &mn);
    const float d1 = mul_rn(d, (float)sc), m1 = mul_rn(dmin, (float)mn);
    uint32_t q[8];
    ld_words_a4<8>(b + 16 + 32 * (j >> 1), q);
    const int shift = 4 * (j & 1);
VELA_UNROLL
    for (int l = 0; l < 32; l++)
        v[l] = sub_rn(mul_rn(d1, (float)((byte_at(q, l) >> shift) & 0x0f)), m1);
}

// Q5_K: Q4_K plus qh[l] bit j as the fifth bit of element l of group j.
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q5_K>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 176;
    const int j = (int)(sb & 7);
    const uint32_t dm = ld_u32(b);
    const float d = f16_bits_to_f32((uint16_t)(dm & 0xffffu));
    const float dmin = f16_bits_to_f32((uint16_t)(dm >> 16));
    uint32_t s[3];
    ld_words_a4<3>(b + 4, s);
    int sc, mn;
    k4_scale_min(s, j, &sc, &mn);
    const float d1 = mul_rn(d, (float)sc), m1 = mul_rn(dmin, (float)mn);
    uint32_t h[8], q[8];
    ld_words_a4<8>(b + 16, h);
    ld_words_a4<8>(b + 48 + 32 * (j >> 1), q);
    const int shift = 4 * (j & 1);
VELA_UNROLL
    for (int l = 0; l < 32; l++) {
        const int x = ((byte_at(q, l) >> shift) & 0x0f) | (((byte_at(h, l) >> j) & 1) << 4);
        v[l] = sub_rn(mul_rn(d1, (float)x), m1);
    }
}

// Q6_K sub-block j: half n = j/4, quarter s = j%4: element l has its low 4
// bits in ql[64n + 32(s&1) + l] (nibble s/2) and its top 2 bits at bit 2s of
// qh[32n + l]; its int8 scale is scales[8n + 2s + l/16]; stored + 32.
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_Q6_K>(const uint8_t *row,
                                                                       int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 210;
    const int j = (int)(sb & 7);
    const int n = j >> 2, s = j & 3;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b + 208));
    const uint32_t sc2 = ld_u16(b + 192 + 8 * n + 2 * s);
    const float d_lo = mul_rn(d, (float)(int8_t)(sc2 & 0xffu));
    const float d_hi = mul_rn(d, (float)(int8_t)(sc2 >> 8));
    uint32_t ql[8], qh[8];
    ld_words_a2<8>(b + 64 * n + 32 * (s & 1), ql);
    ld_words_a2<8>(b + 128 + 32 * n, qh);
    const int shift = 4 * (s >> 1);
VELA_UNROLL
    for (int l = 0; l < 32; l++) {
        const int lo = (byte_at(ql, l) >> shift) & 0x0f;
        const int x = (lo | (((byte_at(qh, l) >> (2 * s)) & 3) << 4)) - 32;
        v[l] = mul_rn(l < 16 ? d_lo : d_hi, (float)x);
    }
}

// A group of 32 of IQ4_NL's layout, its 16 quant bytes in q[4]: element l
// (< 16) is dl * level[byte l & 15], element l + 16 dl * level[byte l >> 4].
static __host__ __device__ __forceinline__ void iq4_sub32(const uint32_t q[4], float dl,
                                                          float *v) {
VELA_UNROLL
    for (int k = 0; k < 4; k++) {
        uint32_t lo, hi;
        iq4_levels8(q[k], &lo, &hi);
VELA_UNROLL
        for (int i = 0; i < 4; i++) {
            v[4 * k + i] = mul_rn(dl, (float)(int8_t)(lo >> (8 * i)));
            v[4 * k + i + 16] = mul_rn(dl, (float)(int8_t)(hi >> (8 * i)));
        }
    }
}

// IQ4_NL: d@0, qs[16]@2; element l (< 16) is d * level[qs[l] & 15],
// element l + 16 d * level[qs[l] >> 4].
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_IQ4_NL>(const uint8_t *row,
                                                                         int64_t sb, float *v) {
    const uint8_t *b = row + sb * 18;
    const float d = f16_bits_to_f32((uint16_t)ld_u16(b));
    uint32_t q[4];
    ld_words_a2<4>(b + 2, q);
    iq4_sub32(q, d, v);
}

// IQ4_XS sub-block j of a super-block (d@0, scales_h@2, scales_l[4]@4,
// qs[128]@8): group j, IQ4_NL's layout in qs[16j..16j+15] with the scale
// dl = d * sc_j (rounded to float first, as ggml's decoder does).
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_IQ4_XS>(const uint8_t *row,
                                                                         int64_t sb, float *v) {
    const uint8_t *b = row + (sb >> 3) * 136;
    const int j = (int)(sb & 7);
    const uint32_t dh = ld_u32(b); // d, scales_h
    const float dl = mul_rn(f16_bits_to_f32((uint16_t)(dh & 0xffffu)),
                            (float)iq4xs_scale(dh >> 16, b[4 + (j >> 1)], j));
    uint32_t q[4];
    ld_words_a4<4>(b + 8 + 16 * j, q);
    iq4_sub32(q, dl, v);
}

// MXFP4's scale, 2^(e-128) for its E8M0 byte e: gguf/quant.h's
// quant_e8m0_half_to_f32, bit for bit.
static __host__ __device__ __forceinline__ float e8m0_half_to_f32(uint32_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

// The doubled E2M1 value of MXFP4 code c (gguf/quant.h's quant_mxfp4_levels)
// without a table: magnitudes 0, 1, 2, 3, then 4, 6, 8, 12 (2 or 3 shifted
// by 1 or 2), negative when bit 3 is set.
static __host__ __device__ __forceinline__ int mxfp4_level(uint32_t c) {
    const int m = (int)(c & 7u);
    const int mag = m < 4 ? m : (2 + (m & 1)) << ((m >> 1) - 1);
    return (c & 8u) ? -mag : mag;
}

// MXFP4's mxfp4_level of the 8 nibbles of a word q of qs bytes, as
// iq4_levels8 gives IQ4_NL's (lo: the low nibbles of q's bytes 0..3, hi the
// high ones; the same byte permutes), from its own table: kept apart so that
// iq4_levels8's users compile as they did.
static __host__ __device__ __forceinline__ void mxfp4_levels8(uint32_t q, uint32_t *lo,
                                                              uint32_t *hi) {
    // 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 | -4 -6 -8 -12
    const uint32_t t0 = 0x03020100u, t1 = 0x0c080604u, t2 = 0xfdfeff00u, t3 = 0xf4f8fafcu;
    const uint32_t sel = 0x32103210u | ((q & 0x88888888u) >> 1);
    const uint32_t a = byte_perm(byte_perm(t0, t1, q), byte_perm(t2, t3, q), sel);
    const uint32_t b = byte_perm(byte_perm(t0, t1, q >> 16), byte_perm(t2, t3, q >> 16), sel >> 16);
    *lo = byte_perm(a, b, 0x6420u);
    *hi = byte_perm(a, b, 0x7531u);
}

// MXFP4: e@0, qs[16]@1; element l (< 16) is level[qs[l] & 15] * 2^(e-128),
// element l + 16 level[qs[l] >> 4] * 2^(e-128).
template <>
__host__ __device__ __forceinline__ void dequant_sub32<GGML_TYPE_MXFP4>(const uint8_t *row,
                                                                        int64_t sb, float *v) {
    const uint8_t *b = row + sb * 17;
    const float d = e8m0_half_to_f32(b[0]);
VELA_UNROLL
    for (int j = 0; j < 16; j++) {
        const uint32_t x = b[1 + j];
        v[j] = mul_rn((float)mxfp4_level(x & 0x0fu), d);
        v[j + 16] = mul_rn((float)mxfp4_level(x >> 4), d);
    }
}

// Plain (unblocked) types: element i of a row.
template <int T>
static __host__ __device__ __forceinline__ float load_plain(const void *row, int64_t i);

template <>
__host__ __device__ __forceinline__ float load_plain<GGML_TYPE_F32>(const void *row, int64_t i) {
    return ((const float *)row)[i];
}

template <>
__host__ __device__ __forceinline__ float load_plain<GGML_TYPE_F16>(const void *row, int64_t i) {
    return f16_bits_to_f32(((const uint16_t *)row)[i]);
}

template <>
__host__ __device__ __forceinline__ float load_plain<GGML_TYPE_BF16>(const void *row, int64_t i) {
    return bf16_bits_to_f32(((const uint16_t *)row)[i]);
}

// Calls F (a generic lambda returning int, taking std::integral_constant<int, T>)
// with the compile-time type matching `type`; evaluates to F's result, or to
// `unsupported` for a type that is not decoded here.
#define VELA_DISPATCH_QTYPE(type, F, unsupported)                                                  \
    ([&]() -> int {                                                                                \
        switch (type) {                                                                            \
        case GGML_TYPE_Q4_0:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q4_0>());                               \
        case GGML_TYPE_Q4_1:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q4_1>());                               \
        case GGML_TYPE_Q5_0:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q5_0>());                               \
        case GGML_TYPE_Q5_1:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q5_1>());                               \
        case GGML_TYPE_Q8_0:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q8_0>());                               \
        case GGML_TYPE_Q2_K:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q2_K>());                               \
        case GGML_TYPE_Q3_K:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q3_K>());                               \
        case GGML_TYPE_Q4_K:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q4_K>());                               \
        case GGML_TYPE_Q5_K:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q5_K>());                               \
        case GGML_TYPE_Q6_K:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_Q6_K>());                               \
        case GGML_TYPE_IQ4_NL:                                                                     \
            return F(std::integral_constant<int, GGML_TYPE_IQ4_NL>());                             \
        case GGML_TYPE_IQ4_XS:                                                                     \
            return F(std::integral_constant<int, GGML_TYPE_IQ4_XS>());                             \
        default:                                                                                   \
            return (unsupported);                                                                  \
        }                                                                                          \
    }())

// VELA_DISPATCH_QTYPE's types and MXFP4, for the callers whose kernels decode
// MXFP4 (VELA_DISPATCH_QTYPE leaves it out: every kernel instantiates its
// types).
#define VELA_DISPATCH_QTYPE_MX(type, F, unsupported)                                               \
    ((type) == GGML_TYPE_MXFP4 ? F(std::integral_constant<int, GGML_TYPE_MXFP4>())                 \
                               : VELA_DISPATCH_QTYPE(type, F, unsupported))

#define VELA_DISPATCH_PLAIN(type, F, unsupported)                                                  \
    ([&]() -> int {                                                                                \
        switch (type) {                                                                            \
        case GGML_TYPE_F32:                                                                        \
            return F(std::integral_constant<int, GGML_TYPE_F32>());                                \
        case GGML_TYPE_F16:                                                                        \
            return F(std::integral_constant<int, GGML_TYPE_F16>());                                \
        case GGML_TYPE_BF16:                                                                       \
            return F(std::integral_constant<int, GGML_TYPE_BF16>());                               \
        default:                                                                                   \
            return (unsupported);                                                                  \
        }                                                                                          \
    }())

static inline bool vela_is_plain(enum ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
}

#endif
